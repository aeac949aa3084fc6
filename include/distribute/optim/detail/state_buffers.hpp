#pragma once
// Where an optimiser's per-parameter state (Adam's moments, SGD's velocity) lives: with the model's
// parameters, so that the engine updating them can reach it.
//
//   - Stepped by a host engine (`engine<cpu>`, or the calling thread's serial engine), the state is
//     one host vector per parameter, as the buffers of state_io.hpp: no copies, no indirection.
//   - Stepped by the engine of another device (a GPU replica's), it is one `tensor<T, D>` per
//     parameter on that engine's device and stream. Host state (a fresh optimiser, or one just
//     loaded) is uploaded at the first such step; state held by another device, or by the same GPU
//     under another stream, moves there through the host. A host engine first brings device state
//     back to the host.
//   - Reading it (`with_host`: save, digests) copies device state down; `assign_host` (load) replaces
//     everything with host state.
//   - A copy is deep and made through the host: it holds host state and moves to the device of the
//     model it steps next. It never shares the source's memory, device or stream (the strategies
//     broadcast mirrored optimisers by copy-assigning one replica's into the others'). Moves are cheap.
//
// The device part is a template on the device D, type-erased behind a small virtual base so the
// optimisers stay one type whatever they step; nothing here names CUDA. `tensor<T, D>` for a device
// other than the CPU is complete only where that device's tensor header is included (for CUDA,
// cuda/tensor/tensor.cuh), which is where its engine's steps are instantiated. What a device's tensor
// must offer here: a zero-filled `tensor(shape, D)`, `from_host(shape, span<const T>, D)`, `size()`,
// `data()` (memory that D's engine's kernels address), `to_vector()` (a host copy, returning once
// the values are there; it must follow the work queued on the tensor's stream) and
// `copy_from_host(span<const T>)` (in place, in stream order).

#include <distribute/concepts/device.hpp>
#include <distribute/optim/detail/state_io.hpp>
#include <distribute/tensor/shape.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::optim::detail {

// Whether an engine computes on host memory: one without a device (the serial engine), or a CPU's.
template <class E>
concept host_engine = !requires { typename std::remove_cvref_t<E>::device_type; } ||
                      device_traits<typename std::remove_cvref_t<E>::device_type>::host_memory;

// The state on a device, whatever the device: the part of state_buffers that is not host vectors.
template <class T>
class device_state {
 public:
  virtual ~device_state() = default;
  // A host copy of every buffer, in order (waits for the device's queued work).
  virtual std::vector<std::vector<T>> to_host() const = 0;
  virtual std::size_t count() const noexcept = 0;
  // Copies `host` into the buffers in place (their addresses stay, for CUDA graphs that captured
  // them) and returns true; returns false, changing nothing, if the counts or sizes differ.
  virtual bool overwrite(const std::vector<std::vector<T>>& host) = 0;
  // Element `at` of buffer `b` set to `v` in place, in the order of the device's queue and without
  // waiting for it; false, changing nothing, where there is no such element.
  virtual bool set(std::size_t b, std::size_t at, T v) = 0;

 protected:
  device_state() = default;
  device_state(const device_state&) = default;
  device_state& operator=(const device_state&) = default;
};

// One tensor<T, D> per parameter, on one device (and stream).
template <class T, device D>
class device_state_on final : public device_state<T> {
 public:
  // The host buffers `host`, uploaded to `d`.
  device_state_on(const D& d, const std::vector<std::vector<T>>& host) : device_{d} {
    buffers_.reserve(host.size());
    for (const auto& b : host)
      buffers_.push_back(tensor<T, D>::from_host(extent(b.size()), std::span<const T>(b.data(), b.size()), device_));
  }

  const D& device() const noexcept { return device_; }
  std::size_t count() const noexcept override { return buffers_.size(); }
  std::vector<std::vector<T>> to_host() const override {
    std::vector<std::vector<T>> out;
    out.reserve(buffers_.size());
    for (const auto& b : buffers_) out.push_back(b.to_vector());
    return out;
  }

  bool overwrite(const std::vector<std::vector<T>>& host) override {
    if (host.size() != buffers_.size()) return false;
    for (std::size_t i = 0; i < host.size(); ++i)
      if (host[i].size() != buffers_[i].size()) return false;
    for (std::size_t i = 0; i < host.size(); ++i)
      buffers_[i].copy_from_host(std::span<const T>(host[i].data(), host[i].size()));
    return true;
  }

  bool set(std::size_t b, std::size_t at, T v) override {
    if (b >= buffers_.size() || at >= buffers_[b].size()) return false;
    buffers_[b].fill(v, at, 1);
    return true;
  }

  // Parameter `index`'s buffer (made zero-filled on first use), as buffer_for in state_io.hpp.
  T* buffer_for(std::size_t index, std::size_t size) {
    if (index == buffers_.size()) buffers_.emplace_back(extent(size), device_);
    if (index > buffers_.size() || buffers_[index].size() != size) throw_state_mismatch(index, size);
    return buffers_[index].data();
  }

 private:
  static distribute::shape extent(std::size_t n) { return distribute::shape{static_cast<std::int64_t>(n)}; }

  D device_;
  std::vector<tensor<T, D>> buffers_;
};

template <class T>
class state_buffers {
 public:
  state_buffers() = default;
  // Deep, through the host: the copy is not tied to the source's device or stream.
  state_buffers(const state_buffers& o) : host_{o.host_copy()} {}
  state_buffers& operator=(const state_buffers& o) {
    if (this != &o) assign_host(o.host_copy());
    return *this;
  }
  state_buffers(state_buffers&&) noexcept = default;
  state_buffers& operator=(state_buffers&&) noexcept = default;
  ~state_buffers() = default;

  // Parameter `index`'s buffer of `size` elements, in memory that engine `e` computes on: moves the
  // state there first if it is elsewhere. Buffers are created zero-filled on the first step, one per
  // parameter in enumeration order; a later step must see the same parameters (else
  // std::invalid_argument, "optimiser state does not match the model").
  template <class E>
  T* buffer_for(E& e, std::size_t index, std::size_t size) {
    if constexpr (host_engine<E>) {
      if (device_) to_host_memory();
      return detail::buffer_for(host_, index, size).data();
    } else {
      return on_device(e.device()).buffer_for(index, size);
    }
  }

  // Calls f(const std::vector<std::vector<T>>&) with the state as host buffers (copied down from a
  // device, where it is on one).
  template <class F>
  decltype(auto) with_host(F&& f) const {
    if (!device_) return std::forward<F>(f)(host_);
    const auto host = device_->to_host();
    return std::forward<F>(f)(host);
  }
  std::vector<std::vector<T>> host_copy() const { return device_ ? device_->to_host() : host_; }

  // Replaces the whole state with host buffers (a loaded one). State on a device with the same
  // buffer sizes is overwritten in place: its memory stays where CUDA graphs captured it.
  void assign_host(std::vector<std::vector<T>> host) {
    if (device_ && device_->overwrite(host)) return;
    device_.reset();
    host_ = std::move(host);
  }

  // Element `at` of buffer `b` set to `v` where the state is, in place (on a device without waiting
  // for it); false, changing nothing, where there is no such element.
  bool set(std::size_t b, std::size_t at, T v) {
    if (device_) return device_->set(b, at, v);
    if (b >= host_.size() || at >= host_[b].size()) return false;
    host_[b][at] = v;
    return true;
  }

  std::size_t count() const noexcept { return device_ ? device_->count() : host_.size(); }
  // Whether the state is host memory now (a fresh, loaded or copied state, or one a host engine stepped).
  bool on_host() const noexcept { return !device_; }

 private:
  void to_host_memory() {
    auto host = device_->to_host();
    device_.reset();
    host_ = std::move(host);
  }

  template <device D>
  device_state_on<T, D>& on_device(const D& d) {
    if (auto* held = dynamic_cast<device_state_on<T, D>*>(device_.get()); held != nullptr && held->device() == d)
      return *held;
    // Uploaded from the host (a device-to-device move goes through it too); the old state is kept
    // until the new one is in place.
    auto moved = device_ ? std::make_unique<device_state_on<T, D>>(d, device_->to_host())
                         : std::make_unique<device_state_on<T, D>>(d, host_);
    auto& held = *moved;
    device_ = std::move(moved);
    host_ = {};
    return held;
  }

  std::vector<std::vector<T>> host_;         // the state, when device_ is empty
  std::unique_ptr<device_state<T>> device_;  // the state, when it is on a device
};

}  // namespace distribute::optim::detail
