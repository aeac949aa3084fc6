#pragma once
// Kept for existing includes: the header is <distribute/cuda/comm/nccl.cuh>.
#include <distribute/cuda/comm/nccl.cuh>
