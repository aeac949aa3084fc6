#pragma once
// What a replica sees inside `strategy.run`: who it is, where it runs, its own copy of replicated
// values, and the collectives of its group. One template serves every strategy; the communicator
// decides what the collectives cost (nothing at all for the `local` communicator of one device).

#include <distribute/comm/gradient_buckets.hpp>
#include <distribute/comm/gradient_overlap.hpp>
#include <distribute/concepts/communicator.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/detail/activity.hpp>
#include <distribute/dtype.hpp>
#include <distribute/engine/engine_slot.hpp>
#include <distribute/errors.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/reduce_op.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

namespace comm {
class local;
}

// A contiguous buffer of collective elements: std::vector<float>, std::span<double>, std::array, ...
template <class B>
concept element_buffer =
    std::ranges::contiguous_range<B> && std::ranges::sized_range<B> && element<std::ranges::range_value_t<B>>;

// A list of buffers, for fusing many tensors into one collective: std::vector<std::span<float>>, ...
template <class L>
concept element_buffer_list =
    std::ranges::contiguous_range<L> && std::ranges::sized_range<L> && element_buffer<std::ranges::range_value_t<L>>;

namespace detail {
template <class B>
auto as_span(B&& b) {
  return std::span(std::ranges::data(b), std::ranges::size(b));
}
template <class B>
using buffer_element_t = std::remove_reference_t<std::ranges::range_reference_t<B>>;
}  // namespace detail

// What a replica allows while work of its stream is being captured into a CUDA graph.
enum class graph_capture : std::uint8_t {
  none,    // nothing is captured
  passes,  // a model's passes (nn::graphed): collectives refuse, gradient announcements are held back
  step,    // a whole step (nn::graphed_step): collectives go into the graph where the communicator can
           // capture them (NCCL's, detail::capturing_communicator; a group of one's, which do
           // nothing), and refuse elsewhere; gradient announcements are held back (the overlap's
           // buckets are all-reduced in its wait)
};

namespace detail {
// A communicator whose collectives can be queued into a CUDA graph being captured, and replayed with
// it: comm::nccl.
template <class C>
concept capturing_communicator = requires(C& c) {
  { c.take_captured() } -> std::same_as<std::size_t>;
};
}  // namespace detail

template <device D, communicator C>
class replica_context {
 public:
  using device_type = D;
  using communicator_type = C;

  // `slot`: where the strategy keeps this replica's compute engine; without one, the replica computes
  // with the calling thread's default engine (every core). `meter`: where the replica's time inside
  // collectives adds up (the strategy's `timings()`); without one it is not measured.
  replica_context(D device, C comm, engine_slot<D>* slot = nullptr, detail::collective_meter* meter = nullptr)
      : device_{std::move(device)}, comm_{std::move(comm)}, engine_{slot} {
    if constexpr (measured) meter_ = meter;
  }

  // This replica's position among all replicas in sync, 0 .. num_replicas()-1.
  int replica_id() const noexcept { return comm_.rank(); }
  int num_replicas() const noexcept { return comm_.size(); }
  const D& device() const noexcept { return device_; }
  C& communicator() noexcept { return comm_; }
  // Where this replica's time in collectives adds up, for code that calls `communicator()` directly
  // (null when not measured).
  detail::collective_meter* collective_meter() const noexcept {
    if constexpr (measured) return meter_;
    else return nullptr;
  }
  // The compute engine the layers run on (engine/cpu.hpp for the CPU): this replica's, with its share
  // of the cores and its own scratch and cached primitives. Made on first use.
  template <class E = distribute::engine<D>>
  E& engine() const {
    if (engine_) return engine_->get(device_);
    if constexpr (requires { E::thread_default(device_); }) return E::thread_default(device_);
    else return E::thread_default();
  }

  // This replica's element of a per-replica or mirrored value.
  template <class T, std::size_t E>
  T& local(per_replica<T, E>& v) const {
    return v[index()];
  }
  template <class T, std::size_t E>
  const T& local(const per_replica<T, E>& v) const {
    return v[index()];
  }
  template <class T, std::size_t E>
  T& local(mirrored<T, E>& v) const {
    return v[index()];
  }
  template <class T, std::size_t E>
  const T& local(const mirrored<T, E>& v) const {
    return v[index()];
  }

  // In place, across replicas. Several buffers of one element type are fused into one collective.
  template <element_buffer B, element_buffer... More>
    requires(std::is_same_v<detail::buffer_element_t<B>, detail::buffer_element_t<More>> && ...) &&
            (!std::is_const_v<detail::buffer_element_t<B>>)
  void all_reduce(reduce_op op, B&& first, More&&... more) {
    if constexpr (sizeof...(More) == 0) {
      communicate("all_reduce", [&] { comm_.all_reduce(op, detail::as_span(first)); });
    } else {
      using T = detail::buffer_element_t<B>;
      const std::array<std::span<T>, 1 + sizeof...(More)> bufs{detail::as_span(first), detail::as_span(more)...};
      communicate("all_reduce", [&] { comm_.all_reduce(op, std::span<const std::span<T>>(bufs)); });
    }
  }
  // A run-time list of buffers (for example every gradient of a model), fused into one collective.
  template <element_buffer_list L>
  void all_reduce(reduce_op op, L&& buffers) {
    using T = detail::buffer_element_t<std::ranges::range_value_t<L>>;
    std::vector<std::span<T>> bufs;
    bufs.reserve(std::ranges::size(buffers));
    for (auto&& b : buffers) bufs.push_back(detail::as_span(b));
    communicate("all_reduce", [&] { comm_.all_reduce(op, std::span<const std::span<T>>(bufs)); });
  }
  // One value per replica in, the reduction out.
  template <element T>
  T all_reduce(reduce_op op, T value) {
    communicate("all_reduce", [&] { comm_.all_reduce(op, std::span<T>(&value, 1)); });
    return value;
  }

  // `out` receives every replica's `in`, in replica order: out.size() == num_replicas() * in.size().
  template <element_buffer In, element_buffer Out>
  void all_gather(const In& in, Out&& out) {
    using T = std::remove_const_t<detail::buffer_element_t<In>>;
    communicate("all_gather", [&] {
      comm_.all_gather(std::span<const T>(std::ranges::data(in), std::ranges::size(in)), detail::as_span(out));
    });
  }
  // One value per replica in, all of them out, in replica order.
  template <element T>
  std::vector<T> all_gather(T value) {
    std::vector<T> out(static_cast<std::size_t>(num_replicas()));
    communicate("all_gather", [&] { comm_.all_gather(std::span<const T>(&value, 1), std::span<T>(out)); });
    return out;
  }

  // Reduces each replica's block of `in` (num_replicas() blocks of out.size()) into `out`.
  template <element_buffer In, element_buffer Out>
  void reduce_scatter(reduce_op op, const In& in, Out&& out) {
    using T = std::remove_const_t<detail::buffer_element_t<In>>;
    communicate("reduce_scatter", [&] {
      comm_.reduce_scatter(op, std::span<const T>(std::ranges::data(in), std::ranges::size(in)), detail::as_span(out));
    });
  }

  // Every replica's `buf` becomes `root`'s.
  template <element_buffer B>
  void broadcast(B&& buf, int root = 0) {
    communicate("broadcast", [&] { comm_.broadcast(detail::as_span(buf), root); });
  }
  template <element T>
  T broadcast(T value, int root = 0) {
    communicate("broadcast", [&] { comm_.broadcast(std::span<T>(&value, 1), root); });
    return value;
  }

  void barrier() {
    communicate("barrier", [&] { comm_.barrier(); });
  }

  // Point-to-point, where the communicator has it (concepts/communicator.hpp): `buf` to replica
  // `dst`, matched by `tag`; and the message replica `src` sent with `tag`, into `buf` (the same
  // element type and length). Within one process, `dst` and `src` are replica ids.
  template <element_buffer B>
    requires point_to_point_communicator<C>
  void send(const B& buf, int dst, int tag) {
    using T = std::remove_const_t<detail::buffer_element_t<const B>>;
    communicate("send",
                [&] { comm_.send(std::span<const T>(std::ranges::data(buf), std::ranges::size(buf)), dst, tag); });
  }
  template <element_buffer B>
    requires point_to_point_communicator<C>
  void recv(B&& buf, int src, int tag) {
    communicate("recv", [&] { comm_.recv(detail::as_span(buf), src, tag); });
  }

  // Combines every gradient of `model` across replicas, in fused buckets (one collective per bucket,
  // not per tensor). A sum by default: see `gradient_reduction` for why. Returns the number of
  // collectives; under one device nothing happens and it returns 0.
  template <gradient_enumerable M>
  std::size_t all_reduce_gradients(M& model, const gradient_reduction& options = {}) {
    std::size_t collectives = 0;
    communicate("all_reduce_gradients", [&] { collectives = comm::all_reduce_gradients(comm_, model, options); });
    return collectives;
  }

  // The same all-reduce overlapped with backward (comm/gradient_overlap.hpp): `add` a model
  // just before its last backward of the step, `wait` before its optimiser step. Until `wait`, this
  // replica's collectives go through the overlap, in order.
  gradient_overlap<C> overlap_gradients(const gradient_reduction& options = {}) {
    if constexpr (measured) return gradient_overlap<C>{comm_, &overlap_, host_memory_v<D>, options, meter_};
    else return gradient_overlap<C>{comm_, nullptr, false, options, nullptr};
  }

  // While work of this replica's stream is captured into a CUDA graph (nn::graphed and
  // nn::graphed_step set it around their captures; see graph_capture). Returns the mode it replaces.
  graph_capture set_graph_capture(graph_capture mode) noexcept {
    if constexpr (measured) return std::exchange(capturing_, mode);
    else {
      (void)mode;
      return graph_capture::none;
    }
  }
  graph_capture graph_capture_mode() const noexcept {
    if constexpr (measured) return capturing_;
    else return graph_capture::none;
  }
  // While on, `gradients_ready` announces nothing: nn::tape sets it around a backward that is not its
  // layer's last of the step (a layer applied twice) and around a frozen network's. Returns the
  // setting it replaces.
  bool hold_gradient_announcements(bool on) noexcept {
    if constexpr (measured) return std::exchange(holding_, on);
    else return (void)on, false;
  }

  // Says that the gradients of `layer`'s parameters are final for this step (sequential models call
  // it after each layer's backward): an open overlap starts the buckets they complete. Nothing
  // otherwise.
  template <class L>
  void gradients_ready(L& layer) {
    if constexpr (measured && requires { typename L::scalar_type; }) {
      if (!overlap_ || capturing_ != graph_capture::none || holding_) return;
      using T = typename L::scalar_type;
      layer.for_each_parameter([&](std::span<T>, std::span<T> gradient) {
        if (!gradient.empty()) overlap_->ready(gradient.data());
      });
      overlap_->announced();
    }
  }

 private:
  std::size_t index() const noexcept { return static_cast<std::size_t>(comm_.rank()); }

  // Every collective of this replica: timed on its meter, and through the open overlap if any.
  template <class F>
  void communicate(const char* what, F&& collective) {
    const detail::collective_stopwatch timed{collective_meter()};
    if constexpr (measured) {
      if (capturing_ == graph_capture::passes)
        throw graph_capture_error(std::string("distribute: replica ") + std::to_string(replica_id()) + " called " +
                                  what +
                                  " while its passes were being captured into a CUDA graph; a collective waits for its "
                                  "partners, which a graph being captured cannot do");
      if (capturing_ == graph_capture::step && !collectives_capturable())
        throw graph_capture_error(std::string("distribute: replica ") + std::to_string(replica_id()) + " called " +
                                  what +
                                  " while its step was being captured into a CUDA graph, and the collectives of its "
                                  "communicator cannot be captured (NCCL's can: one GPU per replica)");
      if (overlap_) {
        overlap_->communicate(std::function<void()>(std::ref(collective)));
        return;
      }
    }
    collective();
  }

  // Whether this replica's collectives can go into a CUDA graph: those of a group of one (nothing to
  // wait for) and those of a capturing communicator (NCCL; one choosing its engine at run time says
  // with `captures()`).
  bool collectives_capturable() const {
    if (comm_.size() == 1) return true;
    if constexpr (detail::capturing_communicator<C>) {
      if constexpr (requires { comm_.captures(); }) return comm_.captures();
      else return true;
    } else {
      return false;
    }
  }

  // The collectives of a group of one cost nothing and are not measured: the one-device replica
  // stays its device and its engine pointer.
  static constexpr bool measured = !std::is_same_v<C, comm::local>;
  struct no_meter {};

  D device_;
  [[no_unique_address]] C comm_;
  engine_slot<D>* engine_ = nullptr;
  [[no_unique_address]] std::conditional_t<measured, detail::collective_meter*, no_meter> meter_{};
  struct no_overlap {};
  [[no_unique_address]] std::conditional_t<measured, comm::overlap_hook*, no_overlap> overlap_{};
  struct no_capture {};
  [[no_unique_address]] std::conditional_t<measured, graph_capture, no_capture> capturing_{};
  struct no_hold {};
  [[no_unique_address]] std::conditional_t<measured, bool, no_hold> holding_{};
};

}  // namespace distribute
