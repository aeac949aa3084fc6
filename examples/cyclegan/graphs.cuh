#pragma once
// The networks of GPU replicas held in nn::graphed (trainer.hpp's network_holder): with --graphs on,
// each network's forward and backward are captured as CUDA graphs once the step's shapes are known,
// and replayed with one launch each; with it off, nn::graphed passes every call to the network.
// Included by the CUDA units (cuda_run.cu, the benchmark's) before they instantiate the trainer.
#include "trainer.hpp"

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/nn/graphed.cuh>

#include <utility>

namespace cyclegan {

template <class M>
struct network_holder<distribute::cuda, M> {
  using type = distribute::nn::graphed<M>;
  static type hold(M m, bool graphs) { return type{std::move(m), {.enabled = graphs}}; }
};

}  // namespace cyclegan
