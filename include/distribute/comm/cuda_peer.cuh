#pragma once
// Kept for existing includes: the header is <distribute/cuda/comm/cuda_peer.cuh>.
#include <distribute/cuda/comm/cuda_peer.cuh>
