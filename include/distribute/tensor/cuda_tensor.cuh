#pragma once
// Kept for existing includes: the header is <distribute/cuda/tensor/tensor.cuh>.
#include <distribute/cuda/tensor/tensor.cuh>
