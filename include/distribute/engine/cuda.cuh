#pragma once
// Kept for existing includes: the header is <distribute/cuda/engine/cuda.cuh>.
#include <distribute/cuda/engine/cuda.cuh>
