#pragma once
// Fashion-MNIST (and MNIST, which has the same files): the images and labels of a split, read once
// into memory and shared by every copy of the dataset. Elements are example<std::uint8_t> of shape
// [28, 28, 1] with labels 0-9; map them to floats in the pipeline (data::to_float) so that the
// conversion runs on prefetch threads.
//
// The default directory is where Debian's dataset-fashion-mnist package installs the files.

#include <distribute/data/dataset.hpp>
#include <distribute/data/error.hpp>
#include <distribute/data/from_memory.hpp>
#include <distribute/data/idx.hpp>
#include <distribute/data/limits.hpp>
#include <distribute/data/tensor.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <span>
#include <string_view>
#include <utility>

namespace distribute::data {

enum class split { train, test };

inline constexpr std::string_view fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";

inline constexpr std::array<std::string_view, 10> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

// An image IDX file and its label IDX file, checked against each other: the examples of a tensor
// [n, rows, cols, 1], read as `from_tensor_slices` reads any tensor. With `classes` > 0 every label
// must be below it (mnist and fashion_mnist ask for 10): a label file that does not fit the classes
// is refused here, naming the file and the first bad label, instead of indexing past a classifier's
// outputs later.
class idx_dataset : public dataset_base<idx_dataset> {
  using slices = tensor_slices_dataset<std::uint8_t>;

 public:
  using element_type = example<std::uint8_t>;
  using cursor_type = slices::cursor_type;

  idx_dataset(const std::filesystem::path& images_file, const std::filesystem::path& labels_file,
              std::int32_t classes = 0, const input_limits& limits = {})
      : slices_{load(images_file, labels_file, classes, limits)}, images_file_{images_file.string()} {}

  cursor_type cursor(std::uint64_t epoch) const { return slices_.cursor(epoch); }
  std::int64_t cardinality() const { return slices_.cardinality(); }

  std::size_t size() const noexcept { return slices_.values().shape[0]; }
  std::size_t rows() const noexcept { return slices_.values().shape[1]; }
  std::size_t cols() const noexcept { return slices_.values().shape[2]; }
  // All labels and pixels, in file order, for code that wants the raw arrays.
  std::span<const std::int32_t> labels() const noexcept { return slices_.labels(); }
  std::span<const std::uint8_t> pixels() const noexcept { return slices_.values().values; }

  // One image file: sharding by file gives it to one worker only, so workers > 1 shard by data.
  std::size_t file_count() const noexcept { return 1; }
  idx_dataset shard_files(std::size_t index, std::size_t count) const {
    if (count != 1 || index != 0)
      throw std::invalid_argument("distribute::data: " + images_file_ +
                                  " is one file; it cannot be sharded by file among " + std::to_string(count) +
                                  " workers");
    return *this;
  }

 private:
  static slices load(const std::filesystem::path& images_file, const std::filesystem::path& labels_file,
                     std::int32_t classes, const input_limits& limits) {
    if (classes < 0) throw std::invalid_argument("distribute::data: idx_dataset: classes must not be negative");
    auto images = read_idx(images_file, idx_images_magic, limits);
    auto labels = read_idx(labels_file, idx_labels_magic, limits);
    if (classes > 0)
      for (std::size_t i = 0; i < labels.values.size(); ++i)
        if (labels.values[i] >= classes)
          throw input_error(labels_file.string(), "label " + std::to_string(i) + " is " +
                                                      std::to_string(labels.values[i]) + "; labels must be 0 to " +
                                                      std::to_string(classes - 1));
    if (labels.shape[0] != images.shape[0])
      throw input_error(labels_file.string(), "holds " + std::to_string(labels.shape[0]) + " labels, but " +
                                                  images_file.string() + " holds " + std::to_string(images.shape[0]) +
                                                  " images");
    tensor<std::uint8_t> pixels;
    pixels.shape = {images.shape[0], images.shape[1], images.shape[2], 1};
    pixels.values = std::move(images.values);
    return slices(std::move(pixels), std::vector<std::int32_t>(labels.values.begin(), labels.values.end()));
  }

  slices slices_;
  std::string images_file_;
};

namespace detail {
// `base` with ".gz" if that file exists, else without (an unpacked copy).
inline std::filesystem::path idx_file(const std::filesystem::path& dir, const std::string& base) {
  const auto gz = dir / (base + ".gz");
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  const auto plain = dir / base;
  if (std::filesystem::exists(plain, ec)) return plain;
  return gz;  // read_file names it as missing
}
}  // namespace detail

// MNIST-format files `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` in `dir`.
// Labels must be 0 to 9.
inline idx_dataset mnist(split s, const std::filesystem::path& dir, const input_limits& limits = {}) {
  const std::string prefix = s == split::train ? "train" : "t10k";
  return idx_dataset(detail::idx_file(dir, prefix + "-images-idx3-ubyte"),
                     detail::idx_file(dir, prefix + "-labels-idx1-ubyte"), 10, limits);
}

inline idx_dataset fashion_mnist(split s,
                                 const std::filesystem::path& dir = std::filesystem::path(fashion_mnist_default_dir),
                                 const input_limits& limits = {}) {
  return mnist(s, dir, limits);
}

// A map function: uint8 pixels to floats, x * scale + offset (the defaults give [-1, 1], what a tanh
// generator produces). Works on examples and on batches, so it can run before or after `batch`.
struct to_float {
  float scale = 2.0f / 255.0f;
  float offset = -1.0f;

  tensor<float> operator()(const tensor<std::uint8_t>& t) const {
    tensor<float> out;
    out.shape = t.shape;
    out.values.resize(t.values.size());
    for (std::size_t i = 0; i < t.values.size(); ++i) out.values[i] = static_cast<float>(t.values[i]) * scale + offset;
    return out;
  }
  example<float> operator()(const example<std::uint8_t>& e) const { return {(*this)(e.image), e.label}; }
  batch<float> operator()(const batch<std::uint8_t>& b) const { return {(*this)(b.images), b.labels, b.global_size}; }
};

}  // namespace distribute::data
