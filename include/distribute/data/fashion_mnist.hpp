#pragma once
// Fashion-MNIST (and MNIST, which has the same files): the images and labels of a split, read once
// into memory and shared by every copy of the dataset. Elements are example<std::uint8_t> of shape
// [28, 28, 1] with labels 0-9; map them to floats in the pipeline (data::to_float) so that the
// conversion runs on prefetch threads.
//
// The default directory is where Debian's dataset-fashion-mnist package installs the files.

#include <distribute/data/dataset.hpp>
#include <distribute/data/error.hpp>
#include <distribute/data/idx.hpp>
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

// An image IDX file and its label IDX file, checked against each other.
class idx_dataset : public dataset_base<idx_dataset> {
  struct held {
    std::size_t count = 0;
    std::vector<std::size_t> image_shape;
    std::vector<std::uint8_t> pixels;
    std::vector<std::int32_t> labels;
    std::array<std::string, 2> files;
  };

 public:
  using element_type = example<std::uint8_t>;

  idx_dataset(const std::filesystem::path& images_file, const std::filesystem::path& labels_file) {
    auto images = read_idx(images_file, idx_images_magic);
    auto labels = read_idx(labels_file, idx_labels_magic);
    if (labels.shape[0] != images.shape[0])
      throw input_error(labels_file.string(), "holds " + std::to_string(labels.shape[0]) + " labels, but " +
                                                  images_file.string() + " holds " + std::to_string(images.shape[0]) +
                                                  " images");
    held h;
    h.count = images.shape[0];
    h.image_shape = {images.shape[1], images.shape[2], 1};
    h.pixels = std::move(images.values);
    h.labels.reserve(labels.values.size());
    for (auto l : labels.values) h.labels.push_back(static_cast<std::int32_t>(l));
    h.files = {images_file.string(), labels_file.string()};
    data_ = std::make_shared<const held>(std::move(h));
  }

  class cursor_type {
   public:
    explicit cursor_type(std::shared_ptr<const held> h) : h_(std::move(h)) {}
    std::optional<element_type> next() {
      if (index_ >= h_->count) return std::nullopt;
      element_type e;
      e.image.shape = h_->image_shape;
      const std::size_t row = h_->image_shape[0] * h_->image_shape[1];
      const auto first = h_->pixels.begin() + static_cast<std::ptrdiff_t>(index_ * row);
      e.image.values.assign(first, first + static_cast<std::ptrdiff_t>(row));
      e.label = h_->labels[index_++];
      return e;
    }

   private:
    std::shared_ptr<const held> h_;
    std::size_t index_ = 0;
  };

  cursor_type cursor(std::uint64_t /*epoch*/) const { return cursor_type(data_); }
  std::int64_t cardinality() const { return static_cast<std::int64_t>(data_->count); }

  std::size_t size() const noexcept { return data_->count; }
  std::size_t rows() const noexcept { return data_->image_shape[0]; }
  std::size_t cols() const noexcept { return data_->image_shape[1]; }
  // All labels and pixels, in file order, for code that wants the raw arrays.
  std::span<const std::int32_t> labels() const noexcept { return data_->labels; }
  std::span<const std::uint8_t> pixels() const noexcept { return data_->pixels; }

  // One image file: sharding by file gives it to one worker only, so workers > 1 shard by data.
  std::size_t file_count() const noexcept { return 1; }
  idx_dataset shard_files(std::size_t index, std::size_t count) const {
    if (count != 1 || index != 0)
      throw std::invalid_argument("distribute::data: " + data_->files[0] + " is one file; it cannot be sharded by file among " +
                                  std::to_string(count) + " workers");
    return *this;
  }

 private:
  std::shared_ptr<const held> data_;
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
inline idx_dataset mnist(split s, const std::filesystem::path& dir) {
  const std::string prefix = s == split::train ? "train" : "t10k";
  return idx_dataset(detail::idx_file(dir, prefix + "-images-idx3-ubyte"), detail::idx_file(dir, prefix + "-labels-idx1-ubyte"));
}

inline idx_dataset fashion_mnist(split s, const std::filesystem::path& dir = std::filesystem::path(fashion_mnist_default_dir)) {
  return mnist(s, dir);
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
