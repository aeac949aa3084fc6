#pragma once
// Kept for existing includes: the header is <distribute/cuda/strategy/one_device_strategy.cuh>.
#include <distribute/cuda/strategy/one_device_strategy.cuh>
