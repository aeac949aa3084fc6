#pragma once
// Kept for existing includes: the header is <distribute/cuda/device/cuda.cuh>.
#include <distribute/cuda/device/cuda.cuh>
