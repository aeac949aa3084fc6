// libFuzzer target: nn::load_safetensors on arbitrary bytes, into the state of a convolution and a
// batch norm (F32 parameters, F64 running statistics). It must either load, or throw
// interop_error and leave the model as it was; anything else (a crash, a sanitizer report, another
// exception, an allocation beyond the input's size) is a bug. A file that loads is saved again and
// must load again to the same state.

#include <distribute/nn/parameter.hpp>
#include <distribute/nn/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

namespace nn = distribute::nn;

namespace {

// The state of conv2d(1 -> 2, 3x3) and batch_norm(2), named as PyTorch names them; written out here so
// that the target depends on the file format alone, not on the layers.
struct model {
  using scalar_type = float;
  nn::parameter<float> weight{distribute::shape{2, 1, 3, 3}, nn::init::normal, 1},
      bias{distribute::shape{2}, nn::init::zero, 0};
  nn::parameter<float> gamma{distribute::shape{2}, nn::init::scale, 2}, beta{distribute::shape{2}, nn::init::zero, 0};
  std::vector<double> running_mean = std::vector<double>(2, 0.0), running_var = std::vector<double>(2, 1.0);

  template <class F>
  void for_each_parameter(F&& f) {
    weight.visit(f);
    bias.visit(f);
    gamma.visit(f);
    beta.visit(f);
  }
  template <class F>
  void for_each_buffer(F&& f) {
    f(std::span<double>(running_mean));
    f(std::span<double>(running_var));
  }
  template <class S>
  void name_state(S& s) {
    s.parameter("0.weight", weight);
    s.parameter("0.bias", bias);
    s.parameter("1.weight", gamma);
    s.parameter("1.bias", beta);
    s.buffer("1.running_mean", running_mean);
    s.buffer("1.running_var", running_var);
  }
};

std::vector<std::byte> state(model& m) { return nn::safetensors_bytes(m); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static model m;
  static const std::vector<std::byte> initial = state(m);
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    nn::load_safetensors(m, bytes, "fuzz-input");
  } catch (const nn::interop_error&) {
    if (state(m) != initial) std::abort();  // a refused file changed the model
    return 0;
  }
  const auto saved = state(m);
  model again;
  nn::load_safetensors(again, std::span<const std::byte>(saved), "resaved");
  if (state(again) != saved) std::abort();
  nn::load_safetensors(m, std::span<const std::byte>(initial), "initial");
  return 0;
}
