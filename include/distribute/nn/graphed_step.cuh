#pragma once
// Kept for existing includes: the header is <distribute/cuda/nn/graphed_step.cuh>.
#include <distribute/cuda/nn/graphed_step.cuh>
