#pragma once
// Errors raised by collectives and strategies. Every failure of a collective is a `collective_error`,
// so a training loop can catch one type; the derived types say what went wrong.

#include <stdexcept>
#include <string>

namespace distribute {

struct collective_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A collective that some replica never joined within the configured time, or that a replica left the
// step without joining.
struct collective_timeout : collective_error {
  using collective_error::collective_error;
};

// Replicas called different collectives, or the same one with different sizes, ops, dtypes or roots.
struct collective_mismatch : collective_error {
  using collective_error::collective_error;
};

// Another replica failed while this one was waiting; the strategy rethrows that failure's cause.
struct collective_aborted : collective_error {
  using collective_error::collective_error;
};

// The copies of a mirrored value differ where they must be identical.
// Something was asked of a stream being captured into a CUDA graph that a graph cannot hold: a
// wait for the device, a value read on the host, a collective (nn::graphed, cuda/device/graph.cuh).
struct graph_capture_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct mirrored_divergence : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace distribute
