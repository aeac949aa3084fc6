#pragma once
// --export DIR of the example programs: a trained network as DIR/<name>.safetensors (its weights
// under PyTorch's state_dict names: the PyTorch port in benchmarks/peer loads them) and
// DIR/<name>.onnx (its inference graph; onnxruntime runs it). docs/interop.md shows both read back.

#include <distribute/nn/onnx.hpp>
#include <distribute/nn/safetensors.hpp>
#include <distribute/tensor/shape.hpp>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace cyclegan {

// A build without nlohmann's JSON library has no safetensors files: --export says so before training.
inline void check_export_available(const std::filesystem::path& dir) {
  if (!dir.empty() && !DISTRIBUTE_HAS_SAFETENSORS)
    throw std::invalid_argument("--export " + dir.string() +
                                ": this build has no safetensors files (it needs nlohmann's JSON library; on Debian: "
                                "apt-get install nlohmann-json3-dev, then configure again)");
}

// Writes `net` as DIR/<name>.safetensors and DIR/<name>.onnx, the graph for inputs of `input`'s
// shape (its batch extent is left free). Returns the files written.
template <class M>
std::vector<std::filesystem::path> export_network(M& net, const std::string& name, const distribute::shape& input,
                                                  const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::filesystem::path> written;
#if DISTRIBUTE_HAS_SAFETENSORS
  written.push_back(dir / (name + ".safetensors"));
  distribute::nn::save_safetensors(net, written.back());
#endif
  written.push_back(dir / (name + ".onnx"));
  distribute::nn::export_onnx(net, input, written.back());
  return written;
}

}  // namespace cyclegan
