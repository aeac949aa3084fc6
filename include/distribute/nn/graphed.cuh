#pragma once
// Kept for existing includes: the header is <distribute/cuda/nn/graphed.cuh>.
#include <distribute/cuda/nn/graphed.cuh>
