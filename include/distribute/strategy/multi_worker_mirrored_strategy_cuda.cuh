#pragma once
// Kept for existing includes: the header is <distribute/cuda/strategy/multi_worker_mirrored_strategy.cuh>.
#include <distribute/cuda/strategy/multi_worker_mirrored_strategy.cuh>
