#pragma once
// Kept for existing includes: the header is <distribute/cuda/device/graph.cuh>.
#include <distribute/cuda/device/graph.cuh>
