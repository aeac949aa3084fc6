#pragma once
// A model's weights in the safetensors format, named as PyTorch names them (nn/state_dict.hpp), so a
// network trained here loads into its PyTorch port with `load_state_dict(safetensors.torch.load_file(
// path))`, and weights trained there load here:
//
//   nn::save_safetensors(generator, "g_ab.safetensors");
//   nn::load_safetensors(generator, "g_ab.safetensors");
//
// Parameters are written in the model's scalar type (F32 for float, F64 for double); the running
// statistics of batch norms, which layers here keep in double, as F64, so a round trip is bit-exact.
// Loading accepts F32 statistics too (PyTorch's), widened exactly, and ignores PyTorch's
// `<layer>.num_batches_tracked` beside a running_mean (a counter these layers do not keep). Every
// other tensor must match the model's by name, dtype and shape, and the first that does not is named;
// nothing is written into the model until the whole file has been checked and read. A model on a GPU
// is read and written through the host.
//
// Saving is atomic (checkpoint/atomic_write.hpp): a crash leaves the old file or the new one.
//
// Needs nlohmann's JSON library (Debian: nlohmann-json3-dev) to read the header; without it these
// functions do not exist and DISTRIBUTE_HAS_SAFETENSORS is 0.

#if __has_include(<nlohmann/json.hpp>)
#  define DISTRIBUTE_HAS_SAFETENSORS 1

#  include <distribute/checkpoint/atomic_write.hpp>
#  include <distribute/device/cpu.hpp>
#  include <distribute/nn/detail/host_copy.hpp>
#  include <distribute/nn/detail/safetensors_format.hpp>
#  include <distribute/nn/interop_error.hpp>
#  include <distribute/nn/state_dict.hpp>

#  include <cstddef>
#  include <cstdint>
#  include <cstring>
#  include <filesystem>
#  include <functional>
#  include <set>
#  include <span>
#  include <string>
#  include <string_view>
#  include <type_traits>
#  include <vector>

namespace distribute::nn {

namespace detail {

template <class T>
constexpr std::string_view safetensors_dtype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "distribute: safetensors files hold float (F32) and double (F64) models");
  return std::is_same_v<T, float> ? "F32" : "F64";
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  const auto b = std::as_bytes(std::span<const T>(v));
  return std::vector<std::byte>(b.begin(), b.end());
}

// What a model's named state expects of a file, and how to put the checked bytes in.
struct expected_tensor {
  std::string name;
  std::string_view dtype;  // the one written
  std::vector<std::uint64_t> shape;
  bool is_buffer = false;
  std::function<void(std::span<const std::byte>, std::string_view dtype)> assign;
};

struct expected_collector {
  std::vector<expected_tensor>* out;
  template <class T, class D>
  void parameter(const std::string& name, nn::parameter<T, D>& p) {
    std::vector<std::uint64_t> shape;
    for (std::size_t i = 0; i < p.value.shape().rank(); ++i)
      shape.push_back(static_cast<std::uint64_t>(p.value.shape()[i]));
    auto* value = &p.value;
    out->push_back({name, safetensors_dtype<T>(), std::move(shape), false,
                    [value](std::span<const std::byte> b, std::string_view) {
                      std::vector<T> staged(b.size() / sizeof(T));  // aligned for T
                      std::memcpy(staged.data(), b.data(), b.size());
                      assign_from_host(*value, std::span<const T>(staged));
                    }});
  }
  void buffer(const std::string& name, std::span<double> b) {
    out->push_back({name,
                    "F64",
                    {static_cast<std::uint64_t>(b.size())},
                    true,
                    [b](std::span<const std::byte> bytes, std::string_view dtype) {
                      if (dtype == "F64") {
                        std::memcpy(b.data(), bytes.data(), bytes.size());
                      } else {  // F32: widened exactly
                        for (std::size_t i = 0; i < b.size(); ++i) {
                          float f;
                          std::memcpy(&f, bytes.data() + i * sizeof f, sizeof f);
                          b[i] = f;
                        }
                      }
                    }});
  }
};

template <class M>
std::vector<expected_tensor> expected_tensors(M& model) {
  std::vector<expected_tensor> out;
  for_each_named_state(model, expected_collector{&out});
  std::set<std::string_view> seen;
  for (const auto& e : out)
    if (!seen.insert(e.name).second)
      throw std::invalid_argument("distribute: two tensors of the model are both named '" + e.name +
                                  "' (check its name_state members)");
  return out;
}

struct write_collector {
  std::vector<safetensors::tensor_to_write>* out;
  template <class T, class D>
  void parameter(const std::string& name, nn::parameter<T, D>& p) {
    std::vector<std::uint64_t> shape;
    for (std::size_t i = 0; i < p.value.shape().rank(); ++i)
      shape.push_back(static_cast<std::uint64_t>(p.value.shape()[i]));
    out->push_back({name, std::string(safetensors_dtype<T>()), std::move(shape), bytes_of(host_copy(p.value))});
  }
  void buffer(const std::string& name, std::span<double> b) {
    out->push_back(
        {name, "F64", {static_cast<std::uint64_t>(b.size())}, bytes_of(std::vector<double>(b.begin(), b.end()))});
  }
};

// Checks the whole file against the model, reads every tensor, and only then writes them in.
template <class M, class Source>
void load_safetensors_from(M& model, const Source& src) {
  const auto ix = safetensors::read_index(src);
  const auto expected = expected_tensors(model);
  const auto& origin = src.origin();
  std::set<std::string_view> wanted;
  for (const auto& e : expected) wanted.insert(e.name);
  auto shape_text = [](const std::vector<std::uint64_t>& s) {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  for (const auto& t : ix.tensors) {
    if (wanted.contains(t.name)) continue;
    constexpr std::string_view counter = "num_batches_tracked";
    if (t.name.ends_with(counter) && wanted.contains(t.name.substr(0, t.name.size() - counter.size()) + "running_mean"))
      continue;
    safetensors::fail(origin, "tensor '" + t.name + "' of the file is not in the model");
  }
  std::vector<std::vector<std::byte>> staged;
  staged.reserve(expected.size());
  for (const auto& e : expected) {
    const auto* t = ix.find(e.name);
    if (!t)
      safetensors::fail(origin, "the file has no tensor '" + e.name + "' (the model's " + std::string(e.dtype) + " " +
                                    shape_text(e.shape) + ")");
    const bool dtype_ok = t->dtype == e.dtype || (e.is_buffer && t->dtype == "F32");
    if (!dtype_ok)
      safetensors::fail(origin, "tensor '" + e.name + "' is " + t->dtype + "; the model's is " + std::string(e.dtype) +
                                    (e.is_buffer ? " (or F32)" : ""));
    if (t->shape != e.shape)
      safetensors::fail(
          origin, "tensor '" + e.name + "' has shape " + t->shape_text() + "; the model's has " + shape_text(e.shape));
  }
  for (const auto& e : expected) {
    const auto* t = ix.find(e.name);
    staged.emplace_back(static_cast<std::size_t>(t->end - t->begin));
    src.read(ix.data_start + t->begin, staged.back());
  }
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i].assign(staged[i], ix.find(expected[i].name)->dtype);
}

}  // namespace detail

// The file's bytes for `model` (save_safetensors writes them).
template <class M>
std::vector<std::byte> safetensors_bytes(M& model) {
  std::vector<detail::safetensors::tensor_to_write> tensors;
  for_each_named_state(model, detail::write_collector{&tensors});
  std::set<std::string_view> seen;
  for (const auto& t : tensors)
    if (!seen.insert(t.name).second)
      throw std::invalid_argument("distribute: two tensors of the model are both named '" + t.name +
                                  "' (check its name_state members)");
  return detail::safetensors::encode(tensors);
}

template <class M>
void save_safetensors(M& model, const std::filesystem::path& path) {
  checkpoint::write_atomically(path, safetensors_bytes(model));
}

// Throws interop_error naming the file and the tensor that does not fit; the model is unchanged then.
template <class M>
void load_safetensors(M& model, const std::filesystem::path& path) {
  detail::load_safetensors_from(model, detail::safetensors::file_source{path});
}

// The same from bytes in memory; `origin` names them in errors.
template <class M>
void load_safetensors(M& model, std::span<const std::byte> bytes, std::string origin = "safetensors bytes") {
  detail::load_safetensors_from(model, detail::safetensors::memory_source{bytes, std::move(origin)});
}

}  // namespace distribute::nn

#else
#  define DISTRIBUTE_HAS_SAFETENSORS 0
#endif
