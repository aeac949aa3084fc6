#pragma once
// Kept for existing includes: the header is <distribute/cuda/strategy/mirrored_strategy.cuh>.
#include <distribute/cuda/strategy/mirrored_strategy.cuh>
