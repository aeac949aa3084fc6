#pragma once
// `image_folder(dir, options)`: the images of `dir/<class>/<file>.{png,jpg,jpeg}`, labelled by the
// index of their class folder in sorted order (as Keras image_dataset_from_directory does). Files are
// listed once, in sorted order; each is read and decoded when a pass reaches it, by a map
// (image_decoder) over the file list (image_files), so a prefetch directly above decodes on its
// threads.
//
// Without `resize` every image must have the size of the first file (in sorted order); one that
// differs is an error naming it. With `resize` each image is resized first; then `random_crop` cuts
// a window at a random place and `random_flip` mirrors half the images left-right, both drawn from
// (seed, epoch, file), so a pass is reproducible and each epoch differs.

#include <distribute/data/dataset.hpp>
#include <distribute/data/detail/read_file.hpp>
#include <distribute/data/error.hpp>
#include <distribute/data/image.hpp>
#include <distribute/data/limits.hpp>
#include <distribute/data/map.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::data {

struct image_size {
  std::size_t height = 0, width = 0;
};

struct image_folder_options {
  int channels = 3;  // 1 grayscale, 3 RGB, 4 RGBA; 0 keeps each file's own count
  std::optional<image_size> resize{};
  std::optional<image_size> random_crop{};
  bool random_flip = false;
  std::uint64_t seed = 0;
  input_limits limits{};  // per file and per decoded or resized image (data/limits.hpp)
};

namespace detail {
struct image_listing {
  std::string dir;
  std::vector<std::string> class_names;
  std::vector<std::filesystem::path> files;
  std::vector<std::int32_t> labels;
  image_size first_size;  // of files[0] of the whole folder: the size every image must have without resize
};
}  // namespace detail

// One file of an image folder in one pass: what image_files yields and image_decoder decodes.
struct image_file {
  std::size_t index;    // into the folder's sorted file list
  std::uint64_t epoch;  // of the pass, for the random crop and flip
};

// The folder's files (this worker's, after shard_files), one image_file per file.
class image_files : public dataset_base<image_files> {
 public:
  using element_type = image_file;

  image_files(std::shared_ptr<const detail::image_listing> l, std::shared_ptr<const std::vector<std::size_t>> selected)
      : listing_(std::move(l)), selected_(std::move(selected)) {}

  class cursor_type {
   public:
    cursor_type(std::shared_ptr<const std::vector<std::size_t>> sel, std::uint64_t epoch)
        : sel_(std::move(sel)), epoch_(epoch) {}
    std::optional<image_file> next() {
      if (pos_ >= sel_->size()) return std::nullopt;
      return image_file{(*sel_)[pos_++], epoch_};
    }

   private:
    std::shared_ptr<const std::vector<std::size_t>> sel_;
    std::uint64_t epoch_;
    std::size_t pos_ = 0;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {selected_, epoch}; }
  std::int64_t cardinality() const { return static_cast<std::int64_t>(selected_->size()); }

  std::size_t file_count() const noexcept { return selected_->size(); }
  image_files shard_files(std::size_t index, std::size_t count) const {
    if (count == 0 || index >= count)
      throw std::invalid_argument("distribute::data: shard_files(" + std::to_string(index) + ", " +
                                  std::to_string(count) + ")");
    if (selected_->size() < count)
      throw std::invalid_argument("distribute::data: " + listing_->dir + " has " + std::to_string(selected_->size()) +
                                  " files, fewer than the " + std::to_string(count) + " workers that shard it by file");
    std::vector<std::size_t> mine;
    for (std::size_t k = index; k < selected_->size(); k += count) mine.push_back((*selected_)[k]);
    return {listing_, std::make_shared<const std::vector<std::size_t>>(std::move(mine))};
  }

  const detail::image_listing& listing() const noexcept { return *listing_; }
  const std::vector<std::size_t>& selected() const noexcept { return *selected_; }

 private:
  std::shared_ptr<const detail::image_listing> listing_;
  std::shared_ptr<const std::vector<std::size_t>> selected_;
};

// Reads, decodes, resizes, crops and flips one file: the map of an image folder. A pure function of
// its argument, safe to call from several threads at once.
struct image_decoder {
  std::shared_ptr<const detail::image_listing> listing;
  image_folder_options options;

  example<std::uint8_t> operator()(const image_file& f) const {
    const auto& l = *listing;
    const auto& o = options;
    const auto& file = l.files[f.index];
    example<std::uint8_t> e;
    e.image = read_image_file(file, o.channels, o.limits);
    e.label = l.labels[f.index];
    if (o.resize) {
      e.image = resize_image(e.image, o.resize->height, o.resize->width, o.limits);
    } else if (e.image.shape[0] != l.first_size.height || e.image.shape[1] != l.first_size.width) {
      throw input_error(file.string(), "image is " + std::to_string(e.image.shape[0]) + "x" +
                                           std::to_string(e.image.shape[1]) + " (height x width), but " +
                                           l.files[0].string() + " is " + std::to_string(l.first_size.height) + "x" +
                                           std::to_string(l.first_size.width) +
                                           "; images of one folder must have one size, or pass resize");
    }
    if (o.random_crop || o.random_flip) {
      detail::rng r{detail::mix(o.seed, detail::mix(f.epoch, f.index))};
      if (o.random_crop) {
        const auto& c = *o.random_crop;
        const std::size_t top = r.below(e.image.shape[0] - c.height + 1);
        const std::size_t left = r.below(e.image.shape[1] - c.width + 1);
        e.image = crop_image(e.image, top, left, c.height, c.width);
      }
      if (o.random_flip && (r.next() >> 63)) flip_left_right(e.image);
    }
    return e;
  }
};

// image_files mapped through image_decoder, with the folder's class names. Like any map, the
// decoding runs on the prefetch threads when a prefetch sits directly above
// (`image_folder(dir).prefetch(16, 4).shuffle(...)` decodes on 4 threads), and a map on top fuses
// with it.
class image_folder_dataset : public dataset_base<image_folder_dataset> {
  using impl = map_dataset<image_files, image_decoder>;

 public:
  using element_type = example<std::uint8_t>;
  using input_type = image_files;
  using function_type = image_decoder;
  using cursor_type = typename impl::cursor_type;

  image_folder_dataset(const std::filesystem::path& dir, image_folder_options options) : impl_(make(dir, options)) {}

  cursor_type cursor(std::uint64_t epoch) const { return impl_.cursor(epoch); }
  std::int64_t cardinality() const { return impl_.cardinality(); }

  template <class G>
  auto map(G g) const {
    return impl_.map(std::move(g));
  }
  const image_files& input() const noexcept { return impl_.input(); }
  const image_decoder& function() const noexcept { return impl_.function(); }

  const std::vector<std::string>& class_names() const noexcept { return input().listing().class_names; }
  // The files this dataset reads, in order (after shard_files, this worker's files).
  std::vector<std::filesystem::path> files() const {
    std::vector<std::filesystem::path> out;
    for (auto i : input().selected()) out.push_back(input().listing().files[i]);
    return out;
  }

  std::size_t file_count() const noexcept { return input().file_count(); }
  image_folder_dataset shard_files(std::size_t index, std::size_t count) const {
    return image_folder_dataset(impl(input().shard_files(index, count), function()));
  }

 private:
  explicit image_folder_dataset(impl i) : impl_(std::move(i)) {}

  static impl make(const std::filesystem::path& dir, const image_folder_options& options) {
    const std::string name = dir.string();
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) throw input_error(name, "no such directory");
    detail::image_listing l;
    l.dir = name;
    std::vector<std::filesystem::path> classes;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.is_directory()) classes.push_back(entry.path());
    std::sort(classes.begin(), classes.end());
    for (std::size_t k = 0; k < classes.size(); ++k) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(classes[k])) {
        if (!entry.is_regular_file()) continue;
        std::string ext = entry.path().extension().string();
        std::transform(ext.begin(), ext.end(), ext.begin(),
                       [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
        if (ext == ".png" || ext == ".jpg" || ext == ".jpeg") files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
      for (auto& f : files) {
        l.files.push_back(std::move(f));
        l.labels.push_back(static_cast<std::int32_t>(k));
      }
      l.class_names.push_back(classes[k].filename().string());
    }
    if (classes.empty()) throw input_error(name, "has no class sub-folders (expected dir/<class>/<image>)");
    if (l.files.empty()) throw input_error(name, "has no .png, .jpg or .jpeg files in its class sub-folders");
    if (options.channels < 0 || options.channels > 4)
      throw std::invalid_argument("distribute::data: image_folder: channels must be 0 to 4");
    if (options.resize && (options.resize->height == 0 || options.resize->width == 0 ||
                           static_cast<std::uint64_t>(options.resize->height) * options.resize->width *
                                   static_cast<std::uint64_t>(options.channels ? options.channels : 4) >
                               options.limits.max_image_bytes))
      throw std::invalid_argument("distribute::data: image_folder: resize to " +
                                  std::to_string(options.resize->height) + "x" + std::to_string(options.resize->width) +
                                  " is empty or larger than the limit of " +
                                  detail::mib(options.limits.max_image_bytes) + " (input_limits::max_image_bytes)");
    if (options.random_crop && !options.resize)
      throw std::invalid_argument("distribute::data: image_folder: random_crop needs resize (the size to crop from)");
    if (options.random_crop &&
        (options.random_crop->height > options.resize->height || options.random_crop->width > options.resize->width))
      throw std::invalid_argument("distribute::data: image_folder: random_crop is larger than resize");
    if (!options.resize) {
      const auto first = read_image_file(l.files[0], options.channels, options.limits);
      l.first_size = {first.shape[0], first.shape[1]};
    }
    std::vector<std::size_t> all(l.files.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    auto listing = std::make_shared<const detail::image_listing>(std::move(l));
    return impl(image_files(listing, std::make_shared<const std::vector<std::size_t>>(std::move(all))),
                image_decoder{listing, options});
  }

  impl impl_;
};

inline image_folder_dataset image_folder(const std::filesystem::path& dir, image_folder_options options = {}) {
  return {dir, options};
}

}  // namespace distribute::data
