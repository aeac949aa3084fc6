#pragma once
// The error type of the files that carry a model to other frameworks (nn/safetensors.hpp,
// nn/onnx.hpp): a file that is not what it claims, one that does not fit the model, a layer that has
// no equivalent. The message names the file, and the tensor or layer, and what is wrong.

#include <stdexcept>

namespace distribute::nn {

struct interop_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace distribute::nn
