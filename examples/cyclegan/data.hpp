#pragma once
// The two unpaired domains. Fashion-MNIST sneakers (A, class 7) and ankle boots (B, class 9) by
// default, or any horse2zebra-style folder (trainA/, trainB/, and optionally testA/, testB/). Both
// are read once into memory as examples, so that one pipeline type serves both sources:
// zip(A.shuffle, B.shuffle).batch(GLOBAL batch) -> float. The shuffle is a pure function of
// (seed, epoch), which is what lets a resumed run read exactly the batches it would have read.

#include "models.hpp"

#include <distribute/data.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cyclegan {

namespace data = distribute::data;
using example = data::example<std::uint8_t>;

inline constexpr std::int32_t sneaker = 7, ankle_boot = 9;

struct domains {
  std::vector<example> a, b;  // training images
  std::vector<example> test_a, test_b;
  int channels = 1, height = 28, width = 28;
  std::string name_a = "sneaker", name_b = "ankle boot";
};

inline std::vector<example> with_label(const data::idx_dataset& ds, std::int32_t label) {
  std::vector<example> out;
  for (auto&& e : ds.epoch(0))
    if (e.label == label) out.push_back(std::move(e));
  return out;
}

inline domains load_fashion_mnist(const std::filesystem::path& dir) {
  domains d;
  const auto train = data::fashion_mnist(data::split::train, dir);
  const auto test = data::fashion_mnist(data::split::test, dir);
  d.a = with_label(train, sneaker);
  d.b = with_label(train, ankle_boot);
  d.test_a = with_label(test, sneaker);
  d.test_b = with_label(test, ankle_boot);
  return d;
}

// `dir`/trainA, trainB (and testA, testB when present), resized to `size` x `size`.
inline domains load_folders(const std::filesystem::path& dir, int channels, int size) {
  domains d;
  d.channels = channels;
  d.height = d.width = size;
  d.name_a = "A";
  d.name_b = "B";
  const auto ds = data::image_folder(
      dir, {.channels = channels,
            .resize = data::image_size{static_cast<std::size_t>(size), static_cast<std::size_t>(size)}});
  const auto& names = ds.class_names();
  auto index = [&](const std::string& n) {
    const auto it = std::find(names.begin(), names.end(), n);
    return it == names.end() ? -1 : static_cast<std::int32_t>(it - names.begin());
  };
  const std::int32_t ta = index("trainA"), tb = index("trainB"), sa = index("testA"), sb = index("testB");
  if (ta < 0 || tb < 0)
    throw std::invalid_argument("--data-dir " + dir.string() + " needs the sub-folders trainA and trainB");
  for (auto&& e : ds.epoch(0)) {
    const auto label = e.label;
    if (label == ta) d.a.push_back(std::move(e));
    else if (label == tb) d.b.push_back(std::move(e));
    else if (label == sa) d.test_a.push_back(std::move(e));
    else if (label == sb) d.test_b.push_back(std::move(e));
  }
  if (d.a.empty() || d.b.empty())
    throw std::invalid_argument("--data-dir " + dir.string() + ": trainA or trainB holds no images");
  if (d.test_a.empty()) d.test_a = d.a;
  if (d.test_b.empty()) d.test_b = d.b;
  return d;
}

// [n, h, w, c] uint8 or float images in [-1, 1] -> an NCHW tensor.
template <class T>
tensor to_nchw(const data::tensor<T>& images, int channels) {
  const auto n = static_cast<std::int64_t>(images.shape[0]), h = static_cast<std::int64_t>(images.shape[1]),
             w = static_cast<std::int64_t>(images.shape[2]);
  tensor t{dist::shape::nchw(n, channels, h, w)};
  for (std::int64_t e = 0; e < n; ++e)
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x)
        for (std::int64_t c = 0; c < channels; ++c) {
          const auto v = images.values[static_cast<std::size_t>(((e * h + y) * w + x) * channels + c)];
          if constexpr (std::is_same_v<T, float>) t(e, c, y, x) = v;
          else t(e, c, y, x) = static_cast<float>(v) * (2.0f / 255.0f) - 1.0f;
        }
  return t;
}

// Examples [first, first + n) of `v` as one NCHW tensor.
inline tensor stack(const std::vector<example>& v, std::size_t first, std::size_t n, int channels) {
  data::tensor<std::uint8_t> images;
  if (n == 0) return tensor{dist::shape::nchw(0, channels, 1, 1)};
  images.shape = {n, v[first].image.shape[0], v[first].image.shape[1], static_cast<std::size_t>(channels)};
  for (std::size_t i = first; i < first + n; ++i)
    images.values.insert(images.values.end(), v[i].image.values.begin(), v[i].image.values.end());
  return to_nchw(images, channels);
}

// Global batches of (A, B) pairs: a new pairing and order each epoch.
inline auto make_pipeline(const domains& d, std::size_t global_batch, std::uint64_t seed) {
  auto a = data::from_vector(d.a).shuffle(d.a.size(), seed);
  auto b = data::from_vector(d.b).shuffle(d.b.size(), seed ^ 0x9e3779b97f4a7c15ull);
  return data::zip(std::move(a), std::move(b)).batch(global_batch, data::drop_remainder);
}

}  // namespace cyclegan
