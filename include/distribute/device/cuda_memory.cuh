#pragma once
// Kept for existing includes: the header is <distribute/cuda/device/memory.cuh>.
#include <distribute/cuda/device/memory.cuh>
