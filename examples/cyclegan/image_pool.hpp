#pragma once
// CycleGAN's history of generated images (Shrivastava et al.): the discriminator sees, for each new
// fake, either that fake or, half of the time once the pool is full, an older one that the new fake
// replaces. The pool lives on the primary and sees the GLOBAL batch of fakes, so that its draws, and
// so the training, do not depend on how many replicas made the fakes. Its random engine is part of
// the checkpoint.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

namespace cyclegan {

class image_pool {
 public:
  image_pool(std::size_t capacity, std::size_t image_size, std::uint64_t seed)
      : capacity_{capacity}, image_size_{image_size}, rng_{seed} {}

  // `fakes` holds whole images of image_size() values; returns as many images for the discriminator.
  std::vector<float> query(std::span<const float> fakes) {
    if (fakes.size() % image_size_ != 0) throw std::invalid_argument("image_pool: not a whole number of images");
    if (capacity_ == 0) return {fakes.begin(), fakes.end()};
    std::vector<float> out(fakes.begin(), fakes.end());
    for (std::size_t i = 0; i < fakes.size() / image_size_; ++i) {
      const auto img = fakes.subspan(i * image_size_, image_size_);
      if (count() < capacity_) {
        stored_.insert(stored_.end(), img.begin(), img.end());
        continue;
      }
      // The engine's raw bits, not a distribution: std::uniform_*_distribution differ between
      // standard libraries, and a resumed run must draw exactly what the uninterrupted one drew.
      if ((rng_() >> 63) == 1) {
        const std::size_t k = static_cast<std::size_t>(rng_() % capacity_);
        auto old = stored_.begin() + static_cast<std::ptrdiff_t>(k * image_size_);
        std::copy(old, old + static_cast<std::ptrdiff_t>(image_size_),
                  out.begin() + static_cast<std::ptrdiff_t>(i * image_size_));
        std::copy(img.begin(), img.end(), old);
      }
    }
    return out;
  }

  std::size_t count() const noexcept { return stored_.size() / image_size_; }
  std::size_t image_size() const noexcept { return image_size_; }
  // Checkpoint state: the stored images and the engine.
  const std::vector<float>& stored() const noexcept { return stored_; }
  void set_stored(std::vector<float> v) {
    if (v.size() % image_size_ != 0 || v.size() / image_size_ > capacity_)
      throw std::invalid_argument("image_pool: saved pool does not fit this pool's image size and capacity");
    stored_ = std::move(v);
  }
  std::mt19937_64& engine() noexcept { return rng_; }
  const std::mt19937_64& engine() const noexcept { return rng_; }

 private:
  std::size_t capacity_, image_size_;
  std::mt19937_64 rng_;
  std::vector<float> stored_;
};

}  // namespace cyclegan
