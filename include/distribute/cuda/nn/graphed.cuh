#pragma once
// A model whose forward and backward on a GPU replica are CUDA graphs: each pass is captured once for
// an input shape and then replayed with one launch, instead of one launch per kernel (a GAN's step at
// a small batch is bound by those launches). PyTorch's torch.cuda.make_graphed_callables does the
// same for a module.
//
//   auto disc = strategy.mirror([](auto& device) { return nn::graphed{make_discriminator(device)}; });
//   ...
//   const auto y = disc.forward(r, x);          // eager, captured, or replayed (below)
//   auto loss = nn::mse(r, y, target, batch);   // the loss, the all-reduce and the optimiser stay eager
//   disc.backward(r, loss.grad);
//   r.all_reduce_gradients(disc);
//   opt.step(r, disc);
//
// For each input shape (and training mode): the first `warmup_passes` forward+backward pairs run
// eagerly (they build what a capture cannot: cuDNN plans, cuBLAS workspaces, the memory pool's
// growth); the next forward is captured into a graph and launched, and so is the next backward (one
// graph with the input's gradient, one without: `backward(r, dy, nn::no_input_gradient)`); from then
// on each pass copies its input into the graph's own input buffer, launches, and returns a copy of
// the graph's output. The graphs compute what the eager passes compute, kernel for kernel, so replays
// give the eager results bit for bit. Gradients accumulate into the model's own gradient buffers, so
// zero_grad, the all-reduce (announced after the backward's launch, for an open overlap), the
// optimiser and checkpoints see one model whichever way it ran. A pass with another shape or mode
// drops the graphs and starts over with it.
//
// A model that a graph cannot hold runs eagerly for good, and `eager_reason()` says why. The capture
// fails, and the pass is run again eagerly at once (its result is the eager one), when the model
// reads device values on the host (batch_norm does, for its statistics; `engine<cuda>::to_host` and a
// tensor's host copies refuse inside a capture), calls a collective (sync_batch_norm; the replica
// refuses collectives while capturing), or does anything else that waits for the device. Host state
// a layer keeps per call (dropout's random stream) is captured as it was, so a graphed dropout
// replays one mask: do not graph models with dropout.
//
// Rules, as for every layer: forward and backward alternate. Backward of a replayed forward must
// follow that forward (the graphs share the saved activations). The model must be made on its
// replica's device (the device `strategy.mirror` hands out, with the replica's stream), as every GPU
// model: what its layers allocate is then queued on the stream being captured.

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/nn/detail/model_wrapper.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/replica_context.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace distribute::nn {

struct graph_options {
  // false: every pass runs eagerly (the model itself, for a program that chooses at run time).
  bool enabled = true;
  // Eager forward+backward pairs with an input shape before that shape's passes are captured (at
  // least 1: the eager pass also replaces what the model kept from an earlier shape's graphs).
  int warmup_passes = 1;
};

namespace detail {

inline graph_options check_graph_options(graph_options o, const char* who) {
  if (o.warmup_passes < 1)
    throw std::invalid_argument(std::string("distribute: ") + who +
                                " needs warmup_passes >= 1 (an eager pass builds what a "
                                "capture cannot), got " +
                                std::to_string(o.warmup_passes));
  return o;
}

// Marks replica `r` as capturing for the scope (replica_context::set_graph_capture), in `mode`
// (passes: its collectives refuse; step: they go into the graph where they can), and restores the
// mode it found.
template <class R>
class graph_capture_scope {
 public:
  graph_capture_scope(R& r, graph_capture mode) noexcept : r_{r} {
    if constexpr (settable) before_ = r_.set_graph_capture(mode);
  }
  ~graph_capture_scope() {
    if constexpr (settable) r_.set_graph_capture(before_);
  }
  graph_capture_scope(const graph_capture_scope&) = delete;
  graph_capture_scope& operator=(const graph_capture_scope&) = delete;

 private:
  static constexpr bool settable = requires(R& r) { r.set_graph_capture(graph_capture::none); };
  R& r_;
  graph_capture before_ = graph_capture::none;
};

// A copy of `t` in a new buffer on replica `r`'s stream, whichever stream made `t` (the assignment
// waits where the streams differ): the buffers a graph reads its inputs from.
template <class T, class R>
tensor<T, cuda> on_replica_stream(R& r, const tensor<T, cuda>& t) {
  tensor<T, cuda> buffer(t.shape(), r.device(), uninitialized);
  buffer = t;
  return buffer;
}

}  // namespace detail

template <class M>
  requires std::is_same_v<layer_device_t<M>, cuda>
class graphed : public detail::model_wrapper<M> {
 public:
  using scalar_type = typename M::scalar_type;
  using device_type = cuda;
  using tensor_type = tensor<scalar_type, cuda>;

  explicit graphed(M model, graph_options options = {})
      : detail::model_wrapper<M>{std::move(model)}, options_{detail::check_graph_options(options, "nn::graphed")} {}

  // A copy is the model's copy: graphs belong to the buffers they were captured over, and the copy
  // captures its own.
  graphed(const graphed& o) : detail::model_wrapper<M>{o}, options_{o.options_}, reason_{o.reason_} {}
  graphed& operator=(const graphed& o) {
    if (this != &o) {
      drop();
      model_ = o.model_;
      options_ = o.options_;
      reason_ = o.reason_;
      key_ = key{};  // the next pass warms up again before anything is captured
      eager_pairs_ = 0;
    }
    return *this;
  }
  graphed(graphed&&) noexcept = default;
  graphed& operator=(graphed&&) noexcept = default;

  // Whether the passes of the current shape are replayed graphs (each backward variant is captured at
  // its first call after a replayed forward).
  bool replaying() const noexcept { return static_cast<bool>(forward_graph_); }
  // How many forward graphs were captured so far (one per shape and mode met after its warm-up).
  std::size_t captures() const noexcept { return captures_; }
  // Why the model runs eagerly for good; empty while graphs are allowed.
  const std::string& eager_reason() const noexcept { return reason_; }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    if (!options_.enabled || !reason_.empty()) {
      last_ = pass::eager;
      return model_.forward(r, x);
    }
    const key k{x.shape(), training_};
    if (!(k == key_)) {
      drop();
      key_ = k;
      eager_pairs_ = 0;
    }
    last_ = pass::eager;  // after drop(), so that this pass's backward counts as a warm-up pair
    if (forward_graph_) {
      input_ = x;  // same size: copied into the graph's input buffer, on the stream
      forward_graph_.launch(r.device().stream());
      last_ = pass::replayed;
      return output_;
    }
    if (eager_pairs_ < options_.warmup_passes) return model_.forward(r, x);
    input_ = detail::on_replica_stream(r, x);
    output_ = tensor_type{};  // an earlier graph's memory is freed here, not inside the capture
    const auto failure = forward_graph_.capture(r.device().index(), r.device().stream(), [&] {
      const detail::graph_capture_scope capturing{r, graph_capture::passes};
      output_ = model_.forward(r, input_);
    });
    if (!failure.empty()) return give_up("forward", failure, [&] { return model_.forward(r, x); });
    ++captures_;
    forward_graph_.launch(r.device().stream());
    last_ = pass::replayed;
    return output_;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward_pass(r, dy, /*input_gradient=*/true);
  }
  // Without the input's gradient (an empty tensor is returned), where the model can skip it: a graph
  // of its own.
  template <class R>
    requires requires(M& m, R& r, const tensor_type& dy) { m.backward(r, dy, no_input_gradient); }
  tensor_type backward(R& r, const tensor_type& dy, no_input_gradient_t) {
    return backward_pass(r, dy, /*input_gradient=*/false);
  }

  void set_training(bool on) {
    training_ = on;
    model_.set_training(on);
  }

 private:
  enum class pass { none, eager, replayed };
  struct key {
    distribute::shape input{};
    bool training = true;
    bool operator==(const key& o) const { return input == o.input && training == o.training; }
  };

  template <class R>
  tensor_type backward_pass(R& r, const tensor_type& dy, bool input_gradient) {
    auto run = [&](const tensor_type& g) -> tensor_type {
      if constexpr (requires { model_.backward(r, g, no_input_gradient); }) {
        if (!input_gradient) return model_.backward(r, g, no_input_gradient);
      }
      return model_.backward(r, g);
    };
    const pass last = std::exchange(last_, pass::none);
    if (last != pass::replayed) {
      auto dx = run(dy);
      if (last == pass::eager && reason_.empty()) ++eager_pairs_;
      return dx;
    }
    const std::size_t v = input_gradient ? 1 : 0;
    auto& graph = backward_graphs_[v];
    if (!graph) {
      grad_output_[v] = detail::on_replica_stream(r, dy);
      grad_input_[v] = tensor_type{};
      const auto failure = graph.capture(r.device().index(), r.device().stream(), [&] {
        const detail::graph_capture_scope capturing{r, graph_capture::passes};
        grad_input_[v] = run(grad_output_[v]);
      });
      // The saved activations are the replayed forward's: the eager backward continues from them.
      if (!failure.empty()) {
        auto dx = give_up("backward", failure, [&] { return run(dy); });
        last_ = pass::none;
        return dx;
      }
    } else {
      grad_output_[v] = dy;
    }
    graph.launch(r.device().stream());
    nn::detail::gradients_ready(r, model_);
    return grad_input_[v];
  }

  // The capture failed: the model runs eagerly from now on, starting with this pass.
  template <class Eager>
  tensor_type give_up(const char* which, const std::string& failure, Eager&& eager) {
    reason_ = std::string("capturing the ") + which + " pass failed: " + failure;
    drop();
    last_ = pass::eager;
    return eager();
  }

  void drop() noexcept {
    forward_graph_.reset();
    for (auto& g : backward_graphs_) g.reset();
    last_ = pass::none;
  }

  using detail::model_wrapper<M>::model_;
  graph_options options_;
  std::string reason_;
  bool training_ = true;
  key key_{};
  int eager_pairs_ = 0;
  std::size_t captures_ = 0;
  pass last_ = pass::none;
  // The forward graph, and the backward graphs without and with the input's gradient.
  distribute::detail::cuda_graph forward_graph_, backward_graphs_[2];
  // The graphs' own buffers: the input and output gradient copied in, the output and input gradients
  // the replays write.
  tensor_type input_, output_, grad_output_[2], grad_input_[2];
};

}  // namespace distribute::nn
