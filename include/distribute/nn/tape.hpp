#pragma once
// This header is over 600 lines for one class, and stays one: the recorded calls, the first-order
// backward and the create_graph walk all read and append to the one list of entries and nodes the
// tape owns, and each operation is recorded with both its backward and its recorded backward. What
// needs neither lives apart: the call checks (detail/tape_calls.hpp), the layer states' reuse and a
// frozen call's set-aside gradients (detail/tape_layer_state.hpp), and the operations between
// layers (tape_ops.hpp).
//
// A gradient tape (tf.GradientTape; PyTorch's autograd, opt-in): it records the layer calls and tensor
// operations of a forward on one replica, and runs their backward passes in reverse, adding the
// gradients where a tensor feeds several consumers (a U-Net's skips, an image given to two
// networks). It only routes: every layer's hand-written backward does the arithmetic, and the sums
// are the engine's, so a taped model computes what the same model wired by hand computes, with the
// same bits where the additions come in the same order.
//
//   nn::tape t{r};                                    // inside strategy.run, one per replica and step
//   auto x = t.constant(noisy);                       // data: no gradient flows into it
//   auto fake = t(gen, x);                            // a layer call (its forward's state kept here)
//   auto l1 = t.loss(fake, [&](auto& y) { return nn::l1(r, y, clean, n); }, 100.0);
//   auto score = t(disc, t.concat(x, fake), nn::frozen);   // D's parameters untouched
//   auto gan = t.loss(score, [&](auto& s) { return nn::mse(r, s, ones, n); });
//   t.backward();                                     // G's gradients, through D
//   r.all_reduce_gradients(gen);
//
// What it records: layer calls (`t(layer, x)`), models written for a tape, of one input or several
// (`t(model, x, y)`, `t(model, x, y, nn::frozen)`), `concat`/`split` along the channels, the
// broadcasting `add`, `sub`, `mul`, `div`, `scale`, `stop_gradient` (PyTorch's detach: the value,
// through which nothing flows back), the operations of nn/tape_ops.hpp (reshape, reductions,
// element-wise functions), an operation of the caller's (`record_operation`), and losses
// (`loss(prediction, f, weight)`: f returns an nn::loss_result, whose weighted gradient starts the
// backward there). `backward()` runs once (`backward(loss)` from a one-element loss built on the
// tape); `gradient(x)` then gives the gradient of a `watch`ed input (empty if none reached it).
//
// A layer applied several times (a discriminator on fake and on real) keeps one forward state per
// call where its state is a value (layer.hpp's `state_type`, every layer of the library); a layer
// that keeps its state inside (a user's own forward/backward pair) can be recorded once per tape, and
// a second call is an error naming it. A call with `nn::frozen` leaves the layer's parameter
// gradients as they were (they are set aside and put back), so G's gradient through D is one call.
//
// Replicas and overlap: a tape belongs to one replica and uses its engine, so it runs on every device
// and under every strategy; collectives inside layers (sync_batch_norm) run in the reverse order of
// the calls, the same on every replica. After a layer's last backward of the tape (its first call,
// frozen or not: a frozen call writes the gradients before it puts them back), the replica is told its
// gradients are final (`r.gradients_ready`), and not before: an open gradient overlap
// (replica_context::overlap_gradients) to which the models were added before `backward()` starts each
// bucket as soon as it can.

#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/detail/tape_calls.hpp>
#include <distribute/nn/detail/tape_layer_state.hpp>
#include <distribute/nn/detail/tensor_op_kernels.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/broadcasting.hpp>
#include <distribute/nn/tensor_ops.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <span>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace distribute::nn {

// Asks a tape to leave a layer call's parameter gradients untouched: gradients flow through the
// layer to its input only (a frozen network; Keras's `trainable = False` for one call).
struct frozen_t {
  explicit constexpr frozen_t() = default;
};
inline constexpr frozen_t frozen{};

// Asks tape::gradient for a gradient recorded on the tape as operations of it (PyTorch's
// `autograd.grad(..., create_graph=True)`, TensorFlow's nested GradientTape): a loss built from it
// (a gradient penalty) backpropagates into the parameters and inputs through the gradient itself.
struct create_graph_t {
  explicit constexpr create_graph_t() = default;
};
inline constexpr create_graph_t create_graph{};

// A gradient taken with nn::create_graph reached an operation or layer that has no recorded backward.
struct missing_rule_error : std::logic_error {
  using std::logic_error::logic_error;
};

template <class R, class T = float>
class tape {
 public:
  using replica_type = R;
  using scalar_type = T;
  using device_type = typename R::device_type;
  using tensor_type = tensor<T, device_type>;

  // A tensor recorded on a tape: a handle that stays valid while its tape lives.
  class variable {
   public:
    variable() = default;
    const tensor_type& value() const { return tape_->at(id_).value; }
    const distribute::shape& shape() const { return value().shape(); }
    // Whether a gradient can flow back through it (false for constants and stop_gradient).
    bool requires_grad() const { return tape_->at(id_).requires_grad; }

   private:
    friend class tape;
    variable(const tape* t, std::size_t id) : tape_{t}, id_{id} {}
    const tape* tape_ = nullptr;
    std::size_t id_ = 0;
  };

  explicit tape(R& r) : r_{r} {}
  tape(const tape&) = delete;
  tape& operator=(const tape&) = delete;

  // An input whose gradient `gradient(v)` gives after backward (tf's `tape.watch`).
  variable watch(tensor_type x) { return leaf(std::move(x), true); }
  // Data: no gradient flows into it, and layers called on it skip their input's gradient.
  variable constant(tensor_type x) { return leaf(std::move(x), false); }
  // Marks an operation recorded without a recorded backward (record_operation's last argument).
  struct no_rule {};

  // A layer's parameter as a variable, for a recorded backward written with the tape's operations
  // (layer_norm's): the gradient backward gives it is added to the parameter's gradient, unless
  // `frozen` (then it is a constant). The parameter must outlive the tape's backward.
  variable parameter(nn::parameter<T, device_type>& p, bool frozen = false) {
    const variable v = leaf(p.value, !frozen);
    if (!frozen)
      // Recorded before anything that uses v, so it runs after all of them.
      record([this, v, &p] {
        const tensor_type& g = at(v.id_).grad;
        if (!g.empty())
          detail::engine_of<device_type>(r_).for_each(static_cast<std::int64_t>(g.size()),
                                                      distribute::detail::kernels::add_to<T>{p.grad.data(), g.data()});
      });
    return v;
  }
  // x's value, through which no gradient flows back (PyTorch's detach, tf.stop_gradient).
  variable stop_gradient(variable x) { return leaf(value_of(x), false); }

  // A call of `layer` on x: layer.forward now, layer.backward in the tape's backward. A model written
  // for a tape (`model(tape, x)` records its own calls) is called so.
  template <class L>
  variable operator()(L& layer, variable x) {
    if constexpr (requires {
                    { layer(*this, x) } -> std::same_as<variable>;
                  })
      return layer(*this, x);
    else return call(layer, x, false);
  }
  // The same, leaving the parameter gradients of the layer (of every layer the model calls) as they were.
  template <class L>
  variable operator()(L& layer, variable x, frozen_t) {
    if constexpr (requires {
                    { layer(*this, x) } -> std::same_as<variable>;
                  }) {
      ++frozen_depth_;
      struct thaw {
        int& depth;
        ~thaw() { --depth; }
      } scope{frozen_depth_};
      return layer(*this, x);
    } else {
      return call(layer, x, true);
    }
  }
  // A model of several inputs, written for a tape (`model(tape, x, y, ...)` records its own calls),
  // and the same with `nn::frozen` last: every layer it calls leaves its parameter gradients as they were.
  template <class L, class... A>
    requires(sizeof...(A) > 0 && !(sizeof...(A) == 1 && (std::same_as<A, frozen_t> && ...)) &&
             ((std::same_as<A, variable> || std::same_as<A, frozen_t>) && ...))
  variable operator()(L& model, variable x, A... rest) {
    constexpr bool freeze = std::same_as<detail::last_of_t<A...>, frozen_t>;
    if constexpr (freeze) {
      ++frozen_depth_;
      struct thaw {
        int& depth;
        ~thaw() { --depth; }
      } scope{frozen_depth_};
      return call_without_last(model, x, std::make_index_sequence<sizeof...(A) - 1>{}, rest...);
    } else {
      static_assert(detail::records_itself<L, tape, variable, A...>,
                    "distribute: a model called on a tape with several inputs needs a call operator "
                    "`variable operator()(nn::tape<R, T>& t, variable x, variable y, ...)` that records its own "
                    "layer calls (t(layer, x), ...); layers of one input are called as t(layer, x)");
      return model(*this, x, rest...);
    }
  }

  // [a | b] along the channels (nn::concat).
  variable concat(variable a, variable b) {
    check_mine(a, "concat");
    check_mine(b, "concat");
    const std::int64_t ca = a.shape()[1];
    const variable y = result(nn::concat(r_, a.value(), b.value()), wants(a) || wants(b));
    record(
        "concat",
        [this, a, b, y, ca] {
          auto [ga, gb] = nn::split(r_, at(y.id_).grad, ca);
          accumulate(a, std::move(ga));
          accumulate(b, std::move(gb));
        },
        [this, ca](const var_pair& dy, std::array<bool, 2>) {
          auto [ga, gb] = split(dy[0], ca);
          return var_pair{ga, gb};
        },
        {a, b}, {y});
    return y;
  }
  // The first `channels` channels of x and the rest (nn::split).
  std::pair<variable, variable> split(variable x, std::int64_t channels) {
    check_mine(x, "split");
    auto [first, second] = nn::split(r_, x.value(), channels);
    const shape s1 = first.shape(), s2 = second.shape();
    const variable a = result(std::move(first), wants(x)), b = result(std::move(second), wants(x));
    record(
        "split",
        [this, x, a, b, s1, s2] {
          if (!wants(x)) return;
          const tensor_type& ga = at(a.id_).grad;
          const tensor_type& gb = at(b.id_).grad;
          if (ga.empty() && gb.empty()) return;
          // A part no gradient reached contributes zeros.
          accumulate(x, nn::concat(r_, ga.empty() ? tensor_type{s1, r_.device()} : ga,
                                   gb.empty() ? tensor_type{s2, r_.device()} : gb));
        },
        [this, s1, s2](const var_pair& dy, std::array<bool, 2>) {
          return var_pair{concat(dy[0].tape_ ? dy[0] : constant(tensor_type{s1, r_.device()}),
                                 dy[1].tape_ ? dy[1] : constant(tensor_type{s2, r_.device()}))};
        },
        {x}, {a, b});
    return {a, b};
  }
  // a + b (nn::add; broadcasting, nn/broadcasting.hpp).
  variable add(variable a, variable b) {
    check_mine(a, "add");
    check_mine(b, "add");
    if (a.shape() != b.shape()) return broadcast_op<detail::kernels::add_op>("add", a, b);
    const variable y = result(nn::add(r_, a.value(), b.value()), wants(a) || wants(b));
    record(
        "add",
        [this, a, b, y] {
          const tensor_type& g = at(y.id_).grad;
          if (wants(a)) accumulate(a, tensor_type{g});
          if (wants(b)) accumulate(b, tensor_type{g});
        },
        [](const var_pair& dy, std::array<bool, 2>) { return var_pair{dy[0], dy[0]}; }, {a, b}, {y});
    return y;
  }
  // a - b, a / b (nn::sub, nn::div; broadcasting).
  variable sub(variable a, variable b) { return broadcast_op<detail::kernels::sub_op>("sub", a, b); }
  variable div(variable a, variable b) { return broadcast_op<detail::kernels::div_op>("div", a, b); }
  // k x (nn::scale).
  variable scale(variable x, T k) {
    check_mine(x, "scale");
    const auto by_k = [this, k](const tensor_type& v) { return nn::scale(r_, v, k); };
    return linear_map("scale", x, by_k, by_k);
  }
  // a * b element by element (nn::mul; broadcasting).
  variable mul(variable a, variable b) {
    check_mine(a, "mul");
    check_mine(b, "mul");
    if (a.shape() != b.shape()) return broadcast_op<detail::kernels::mul_op>("mul", a, b);
    const variable y = result(nn::mul(r_, a.value(), b.value()), wants(a) || wants(b));
    record(
        "mul",
        [this, a, b, y] {
          const tensor_type& g = at(y.id_).grad;
          if (wants(a)) accumulate(a, nn::mul(r_, g, b.value()));
          if (wants(b)) accumulate(b, nn::mul(r_, g, a.value()));
        },
        [this, a, b](const var_pair& dy, std::array<bool, 2> want) {
          return var_pair{want[0] ? mul(dy[0], b) : variable{}, want[1] ? mul(dy[0], a) : variable{}};
        },
        {a, b}, {y});
    return y;
  }
  // x's values under another shape of as many elements (nn::reshape with the shape spelled out).
  variable reshape(variable x, const distribute::shape& to) {
    check_mine(x, "reshape");
    const distribute::shape from = x.shape();
    if (from == to) return x;
    return linear_map(
        "reshape", x, [to](const tensor_type& v) { return v.reshaped(to); },
        [from](const tensor_type& g) { return g.reshaped(from); });
  }
  // x repeated along its axes of extent 1 (nn::broadcast_to), and its adjoint, g summed down to a
  // shape it broadcasts from (nn::sum_to): each the other's gradient.
  variable broadcast_to(variable x, const distribute::shape& to) {
    check_mine(x, "broadcast_to");
    const distribute::shape from = x.shape();
    if (from == to) return x;
    return linear_map(
        "broadcast_to", x, [this, to](const tensor_type& v) { return nn::broadcast_to(r_, v, to); },
        [this, from](const tensor_type& g) { return nn::sum_to(r_, g, from); });
  }
  variable sum_to(variable x, const distribute::shape& to) {
    check_mine(x, "sum_to");
    const distribute::shape from = x.shape();
    if (from == to) return x;
    return linear_map(
        "sum_to", x, [this, to](const tensor_type& v) { return nn::sum_to(r_, v, to); },
        [this, from](const tensor_type& g) { return nn::broadcast_to(r_, g, from); });
  }

  // An operation of the caller's (nn/tape_ops.hpp records the library's so): `y` computed from x,
  // and `dx_of(dy)` returning dL/dx from dL/dy when the backward reaches y (not called where no
  // gradient flows into x). A gradient taken with nn::create_graph cannot pass through it (an error
  // says so); the forms below can.
  template <class F>
  variable record_operation(tensor_type y, variable x, F dx_of) {
    return record_operation(std::move(y), x, std::move(dx_of), no_rule{});
  }
  // The same with its backward recorded too: `graph_dx_of(dy)` returns dL/dx as a variable of this
  // tape, computed from the variable dy by operations recorded on it (what nn::create_graph runs).
  template <class F, class G>
  variable record_operation(tensor_type y, variable x, F dx_of, G graph_dx_of) {
    return record_operation("an operation recorded with record_operation", std::move(y), x, std::move(dx_of),
                            std::move(graph_dx_of));
  }
  // The same named (the name an error about a missing recorded backward gives); `graph_dx_of` may be
  // `no_rule{}` (nn::tape_ops records its functions' derivatives so: a third order has no rule).
  template <class F, class G>
  variable record_operation(const char* name, tensor_type y, variable x, F dx_of, G graph_dx_of) {
    check_mine(x, "record_operation");
    check_open("an operation");
    const variable out = result(std::move(y), wants(x));
    record(
        name,
        [this, x, out, f = std::move(dx_of)] {
          if (wants(x)) accumulate(x, f(at(out.id_).grad));
        },
        [&] {
          if constexpr (std::is_same_v<G, no_rule>) {
            return no_rule{};
          } else {
            return [g = std::move(graph_dx_of)](const var_pair& dy, std::array<bool, 2>) {
              return var_pair{g(dy[0]), variable{}};
            };
          }
        }(),
        {x}, {out});
    return out;
  }
  // The same of two inputs: `grads_of(dy, want_a, want_b)` returns the pair (dL/da, dL/db), either
  // left empty where not wanted; `graph_grads_of(dy, want_a, want_b)` the same as variables.
  template <class F>
  variable record_operation(tensor_type y, variable a, variable b, F grads_of) {
    return record_operation(std::move(y), a, b, std::move(grads_of), no_rule{});
  }
  template <class F, class G>
  variable record_operation(tensor_type y, variable a, variable b, F grads_of, G graph_grads_of) {
    check_mine(a, "record_operation");
    check_mine(b, "record_operation");
    check_open("an operation");
    const variable out = result(std::move(y), wants(a) || wants(b));
    auto rule = [&] {
      if constexpr (std::is_same_v<G, no_rule>) {
        return no_rule{};
      } else {
        return [g = std::move(graph_grads_of)](const var_pair& dy, std::array<bool, 2> want) {
          auto [da, db] = g(dy[0], want[0], want[1]);
          return var_pair{da, db};
        };
      }
    }();
    record("an operation recorded with record_operation",
           [this, a, b, out, f = std::move(grads_of)] {
             auto [ga, gb] = f(at(out.id_).grad, wants(a), wants(b));
             if (wants(a)) accumulate(a, std::move(ga));
             if (wants(b)) accumulate(b, std::move(gb));
           },
           std::move(rule), {a, b}, {out});
    return out;
  }
  // An operation linear in x: y = apply(x), and `adjoint` its transpose (dL/dx = adjoint(dL/dy)).
  // Its recorded backward is the same pair swapped, so nn::create_graph passes through it to any order.
  template <class F, class A>
  variable linear_map(const char* name, variable x, F apply, A adjoint) {
    check_mine(x, name);
    check_open("an operation");
    const variable out = result(apply(x.value()), wants(x));
    record(
        name, [this, x, out, adjoint] { accumulate(x, adjoint(at(out.id_).grad)); },
        [this, name, apply, adjoint](const var_pair& dy, std::array<bool, 2>) {
          return var_pair{linear_map(name, dy[0], adjoint, apply), variable{}};
        },
        {x}, {out});
    return out;
  }
  // An operation that writes parameter gradients (a layer's recorded backward): `backward(dy, want_x)`
  // adds its parameters' gradients and returns dL/dx (empty where !want_x). Its output always takes a
  // gradient. Under nn::create_graph it has no rule of its own (a third order is not supported).
  template <class F>
  variable record_parameter_operation(const char* name, tensor_type y, variable x, F backward) {
    check_mine(x, name);
    check_open("an operation");
    const variable out = result(std::move(y), true);
    record(name,
           [this, x, out, f = std::move(backward)] {
             tensor_type dx = f(at(out.id_).grad, wants(x));
             if (wants(x)) accumulate(x, std::move(dx));
           },
           no_rule{}, {x}, {out});
    return out;
  }
  // A composite layer's recorded backward (sequential's): `parts(x)` calls its parts again on the tape
  // from x (a second forward; these calls announce no gradients as final: the composite's own call
  // does), and the result is the recorded gradient of their output at dy. `frozen`: the parts are
  // called frozen.
  template <class F>
  variable recorded_through_parts(variable x, variable dy, bool frozen, F parts) {
    struct scope {
      tape& t;
      bool frozen;
      scope(tape& t, bool frozen) : t{t}, frozen{frozen} {
        ++t.quiet_depth_;
        if (frozen) ++t.frozen_depth_;
      }
      ~scope() {
        --t.quiet_depth_;
        if (frozen) --t.frozen_depth_;
      }
    } parts_called{*this, frozen};
    const variable y = parts(x);
    check_mine(y, "recorded_through_parts");
    return graph_gradient(y, dy, x);
  }
  // The replica the tape computes on.
  R& replica() const { return r_; }

  // A loss of `prediction`: `f(prediction's value)` returns an nn::loss_result (or device_loss_result)
  // whose gradient, times `weight`, starts the backward at `prediction`. Returns f's result as f gave
  // it (its value not weighted).
  template <class F>
  auto loss(variable prediction, F&& f, T weight = T(1)) {
    check_mine(prediction, "loss");
    auto result = std::forward<F>(f)(prediction.value());
    if (result.grad.shape() != prediction.shape())
      throw std::invalid_argument("distribute: a loss recorded on a tape returned a gradient of shape " +
                                  result.grad.shape().to_string() + " for a prediction of shape " +
                                  prediction.shape().to_string());
    seed(prediction, weight == T(1) ? tensor_type{result.grad} : nn::scale(r_, result.grad, weight));
    return result;
  }
  // dL/dy given by the caller (a loss computed outside the tape): it starts the backward at y.
  void seed(variable y, tensor_type dy) {
    check_mine(y, "seed");
    if (dy.shape() != y.shape())
      throw std::invalid_argument("distribute: a tape's gradient of shape " + dy.shape().to_string() +
                                  " for a tensor of shape " + y.shape().to_string());
    auto g = std::make_shared<tensor_type>(std::move(dy));
    record([this, y, g] { accumulate(y, std::move(*g)); });
  }

  // Every recorded backward, in reverse order. Once per tape.
  void backward() {
    if (done_)
      throw std::logic_error("distribute: a tape's backward ran a second time; record a new tape for each step");
    done_ = true;
    std::unordered_map<const void*, std::size_t> remaining = calls_;
    for (std::size_t i = nodes_.size(); i-- > 0;) {
      nodes_[i]->run(remaining);
      nodes_[i].reset();  // its states and saved tensors are no longer needed
      // Nothing adds to the gradients of its outputs any more: only the inputs' are kept.
      for (std::size_t id = i ? ends_[i - 1] : 0; id < ends_[i]; ++id)
        if (!entries_[id].input) entries_[id].grad = tensor_type{};
    }
  }
  // seed(y, dy), then backward().
  void backward(variable y, tensor_type dy) {
    seed(y, std::move(dy));
    backward();
  }
  // From a loss of one element built on the tape (nn::mean(t, ...)): dL/dL = 1, as PyTorch's
  // loss.backward().
  void backward(variable loss) {
    check_mine(loss, "backward");
    if (loss.shape().numel() != 1)
      throw std::invalid_argument("distribute: a tape's backward from a tensor of shape " + loss.shape().to_string() +
                                  " without its gradient: only a loss of one element starts alone (reduce it with "
                                  "nn::sum or nn::mean, or give dL/dy)");
    tensor_type one{loss.shape(), r_.device(), uninitialized};
    one.fill(T(1), 0, 1);
    backward(loss, std::move(one));
  }

  // The gradient backward gave `v`, an input (`watch`; empty if none reached it). Those of the
  // tensors in between are dropped as the backward passes them.
  const tensor_type& gradient(variable v) const {
    check_mine(v, "gradient");
    return at(v.id_).grad;
  }

  // dy/dx recorded on the tape (PyTorch's `torch.autograd.grad(y, x, create_graph=True)`): y of one
  // element, x a tensor y depends on. The gradient's own computation is recorded as operations of
  // this tape, so a loss built from it (an R1 penalty: the squared norm of dD(x)/dx) backpropagates
  // into the parameters and inputs when `backward` runs. Parameter gradients are not written here:
  // only `backward` writes them. Every operation and layer between x and y needs a recorded
  // backward (the library's have one; docs/nn.md, "Gradient penalties"); one without throws
  // nn::missing_rule_error naming it. Called before backward, as often as needed.
  variable gradient(variable y, variable x, create_graph_t) {
    check_mine(y, "gradient");
    if (y.shape().numel() != 1)
      throw std::invalid_argument("distribute: tape::gradient(y, x, nn::create_graph) of a y of shape " +
                                  y.shape().to_string() +
                                  ": y must have one element (reduce it with nn::sum or nn::mean, or give dy: "
                                  "gradient(y, dy, x, nn::create_graph))");
    tensor_type one{y.shape(), r_.device(), uninitialized};
    one.fill(T(1), 0, 1);
    return graph_gradient(y, constant(std::move(one)), x);
  }
  // The same for a y of any shape and dL/dy given as a variable `dy` of y's shape (PyTorch's
  // grad_outputs): the vector-Jacobian product dy^T dy/dx.
  variable gradient(variable y, variable dy, variable x, create_graph_t) {
    check_mine(y, "gradient");
    check_mine(dy, "gradient");
    if (dy.shape() != y.shape())
      throw std::invalid_argument("distribute: tape::gradient got dy of shape " + dy.shape().to_string() +
                                  " for a y of shape " + y.shape().to_string());
    return graph_gradient(y, dy, x);
  }

 private:
  struct entry {
    tensor_type value;
    tensor_type grad;
    bool requires_grad = false;
    bool input = false;  // made by watch, constant or stop_gradient
  };
  using var_pair = std::array<variable, 2>;

  // One recorded backward; `remaining`: each layer's calls whose backward has not run yet. Its inputs
  // and outputs (up to two each) are the entries a gradient taken with nn::create_graph walks;
  // `graph` records the inputs' gradients as variables from the outputs' (a default-made variable
  // where none reached), for the inputs `want` marks.
  struct node {
    virtual ~node() = default;
    virtual void run(std::unordered_map<const void*, std::size_t>& remaining) = 0;
    virtual var_pair graph(const var_pair& dy, std::array<bool, 2> want) = 0;
    std::array<std::size_t, 2> in{}, out{};
    std::uint8_t ins = 0, outs = 0;
  };
  template <class F, class G>
  struct op_node final : node {
    op_node(const char* name, F f, G g) : name{name}, f{std::move(f)}, g{std::move(g)} {}
    void run(std::unordered_map<const void*, std::size_t>&) override { f(); }
    var_pair graph(const var_pair& dy, std::array<bool, 2> want) override {
      if constexpr (std::is_same_v<G, no_rule>) {
        (void)dy;
        (void)want;
        throw missing_rule_error(std::string("distribute: ") + name +
                                 " has no recorded backward, and a gradient taken with nn::create_graph passes "
                                 "through it; record it with a rule (record_operation(y, x, dx_of, graph_dx_of), "
                                 "docs/nn.md \"Gradient penalties\")");
      } else {
        return g(dy, want);
      }
    }
    const char* name;
    F f;
    G g;
  };
  // Holds the replica's gradient announcements for a scope where `on` (replica_context).
  class hold {
   public:
    hold(R& r, bool on) : r_{r}, on_{on} {
      if constexpr (requires { r.hold_gradient_announcements(on); })
        if (on_) saved_ = r.hold_gradient_announcements(true);
    }
    ~hold() {
      if constexpr (requires { r_.hold_gradient_announcements(saved_); })
        if (on_) r_.hold_gradient_announcements(saved_);
    }
    hold(const hold&) = delete;
    hold& operator=(const hold&) = delete;

   private:
    R& r_;
    bool on_;
    bool saved_ = false;
  };

  entry& at(std::size_t id) { return entries_[id]; }
  const entry& at(std::size_t id) const { return entries_[id]; }
  bool wants(variable v) const { return at(v.id_).requires_grad; }
  const tensor_type& value_of(variable v) const {
    check_mine(v, "stop_gradient");
    return v.value();
  }

  void check_mine(variable v, const char* op) const {
    if (v.tape_ != this)
      throw std::invalid_argument(std::string("distribute: tape::") + op + " got a tensor " +
                                  (v.tape_ ? "of another tape" : "that no tape recorded (a default-made variable)"));
  }
  void check_open(const char* what) const {
    if (done_)
      throw std::logic_error(std::string("distribute: ") + what + " recorded on a tape whose backward already ran");
  }

  variable leaf(tensor_type x, bool requires_grad) {
    check_open("an input");
    entries_.push_back(entry{std::move(x), {}, requires_grad, true});
    return {this, entries_.size() - 1};
  }
  variable result(tensor_type y, bool requires_grad) {
    entries_.push_back(entry{std::move(y), {}, requires_grad});
    return {this, entries_.size() - 1};
  }
  // An operation's backward, run always (a seed: no inputs or outputs)...
  template <class F>
  void record(F f) {
    check_open("an operation");
    nodes_.push_back(std::make_unique<op_node<F, no_rule>>("a seed", std::move(f), no_rule{}));
    ends_.push_back(entries_.size());
  }
  // ... or where a gradient reached one of its outputs; `rule`: its recorded backward (or no_rule).
  template <class F, class G>
  void record(const char* name, F f, G rule, std::initializer_list<variable> inputs,
              std::initializer_list<variable> outputs) {
    check_open("an operation");
    std::array<std::size_t, 2> out{};
    std::uint8_t outs = 0;
    for (const variable& v : outputs) out[outs++] = v.id_;
    auto g = [this, f = std::move(f), out, outs] {
      for (std::uint8_t k = 0; k < outs; ++k)
        if (!at(out[k]).grad.empty()) return f();
    };
    auto n = std::make_unique<op_node<decltype(g), G>>(name, std::move(g), std::move(rule));
    n->out = out;
    n->outs = outs;
    for (const variable& v : inputs) n->in[n->ins++] = v.id_;
    nodes_.push_back(std::move(n));
    ends_.push_back(entries_.size());
  }

  template <template <class> class Op>
  variable broadcast_op(const char* name, variable a, variable b) {
    check_mine(a, name);
    check_mine(b, name);
    const variable y = result(detail::broadcast_apply<Op>(r_, name, a.value(), b.value()), wants(a) || wants(b));
    record(
        name,
        [this, name, a, b, y] {
          auto [ga, gb] =
              detail::broadcast_gradients<Op>(r_, name, a.value(), b.value(), at(y.id_).grad, wants(a), wants(b));
          if (wants(a)) accumulate(a, std::move(ga));
          if (wants(b)) accumulate(b, std::move(gb));
        },
        [this, a, b](const var_pair& dy, std::array<bool, 2> want) {
          const variable g = dy[0];
          const shape sa = a.shape(), sb = b.shape();
          var_pair d{};
          using op = Op<T>;
          if constexpr (std::is_same_v<op, detail::kernels::add_op<T>>) {
            if (want[0]) d[0] = sum_to(g, sa);
            if (want[1]) d[1] = sum_to(g, sb);
          } else if constexpr (std::is_same_v<op, detail::kernels::sub_op<T>>) {
            if (want[0]) d[0] = sum_to(g, sa);
            if (want[1]) d[1] = scale(sum_to(g, sb), T(-1));
          } else if constexpr (std::is_same_v<op, detail::kernels::mul_op<T>>) {
            if (want[0]) d[0] = sum_to(mul(g, b), sa);
            if (want[1]) d[1] = sum_to(mul(g, a), sb);
          } else {
            static_assert(std::is_same_v<op, detail::kernels::div_op<T>>);
            if (want[0]) d[0] = sum_to(div(g, b), sa);
            if (want[1]) d[1] = scale(sum_to(div(mul(g, a), mul(b, b)), sb), T(-1));
          }
          return d;
        },
        {a, b}, {y});
    return y;
  }
  // The gradient walk of nn::create_graph: from `seed` at y back to x over the nodes recorded so far,
  // each node's recorded backward adding operations to the tape (appended, so none is walked twice).
  variable graph_gradient(variable y, variable seed, variable x) {
    check_mine(x, "gradient");
    check_open("a gradient");
    const std::size_t entries = entries_.size(), nodes = nodes_.size();
    std::vector<char> reaches(entries, 0);  // depends on x
    reaches[x.id_] = 1;
    for (std::size_t i = 0; i < nodes; ++i) {
      const node& n = *nodes_[i];
      bool any = false;
      for (std::uint8_t k = 0; k < n.ins; ++k) any = any || reaches[n.in[k]];
      if (any)
        for (std::uint8_t k = 0; k < n.outs; ++k) reaches[n.out[k]] = 1;
    }
    if (!reaches[y.id_])
      throw std::invalid_argument(
          "distribute: tape::gradient(y, x, nn::create_graph): y does not depend on x "
          "through the operations recorded on the tape (x came after y, or only through "
          "stop_gradient)");
    std::vector<variable> g(entries);
    g[y.id_] = seed;
    for (std::size_t i = nodes; i-- > 0;) {
      node& n = *nodes_[i];
      var_pair dy{};
      bool reached = false, wanted = false;
      for (std::uint8_t k = 0; k < n.outs; ++k)
        if (g[n.out[k]].tape_) {
          dy[k] = g[n.out[k]];
          reached = true;
        }
      std::array<bool, 2> want{};
      for (std::uint8_t k = 0; k < n.ins; ++k) wanted = (want[k] = reaches[n.in[k]] != 0) || wanted;
      if (!reached || !wanted) continue;
      const var_pair dx = n.graph(dy, want);
      for (std::uint8_t k = 0; k < n.ins; ++k) {
        if (!want[k] || !dx[k].tape_) continue;
        variable& sum = g[n.in[k]];
        sum = sum.tape_ ? add(sum, dx[k]) : dx[k];
      }
    }
    if (g[x.id_].tape_) return g[x.id_];
    return constant(tensor_type{x.shape(), r_.device()});  // every path was cut by a recorded zero
  }
  template <class L, std::size_t... I, class... A>
  variable call_without_last(L& model, variable x, std::index_sequence<I...>, A... rest) {
    const std::tuple<A...> args{rest...};
    static_assert(detail::records_itself<L, tape, variable, std::tuple_element_t<I, std::tuple<A...>>...>,
                  "distribute: a model called on a tape with several inputs and nn::frozen needs a call operator "
                  "`variable operator()(nn::tape<R, T>& t, variable x, variable y, ...)` that records its own "
                  "layer calls");
    return model(*this, x, std::get<I>(args)...);
  }

  // Adds g to v's gradient: the first one is moved in, the next ones are summed by the engine.
  void accumulate(variable v, tensor_type g) {
    entry& e = at(v.id_);
    if (!e.requires_grad || g.empty()) return;
    if (e.grad.empty()) {
      e.grad = std::move(g);
      return;
    }
    if (g.shape() != e.grad.shape())
      throw std::logic_error("distribute: a tape got a gradient of shape " + g.shape().to_string() +
                             " for a tensor of shape " + e.grad.shape().to_string());
    detail::engine_of<device_type>(r_).for_each(static_cast<std::int64_t>(g.size()),
                                                distribute::detail::kernels::add_to<T>{e.grad.data(), g.data()});
  }

  template <class L>
  variable call(L& layer, variable x, bool freeze) {
    freeze = freeze || frozen_depth_ > 0;
    static_assert(detail::forward_through<L, R, tensor_type> || records_state<L>,
                  "distribute: t(model, x) takes a layer (forward and backward, nn/layer.hpp) or a model written "
                  "for a tape (`variable operator()(nn::tape<R, T>& t, variable x)`); a model of several inputs is "
                  "called t(model, x, y, ...), and t(model, x, y, nn::frozen) to freeze it");
    static_assert(std::is_same_v<typename L::scalar_type, T>,
                  "distribute: a tape records layers of its own scalar type");
    static_assert(std::is_same_v<layer_device_t<L>, device_type>,
                  "distribute: a tape records layers on its replica's device");
    check_open("a layer call");
    check_mine(x, "operator()");
    constexpr bool with_state = records_state<L>;
    const void* key = &layer;
    const bool quiet = quiet_depth_ > 0;
    if (!quiet) ++calls_[key];
    if constexpr (!with_state) {
      if (!applied_.emplace(key, true).second)
        throw forward_state_error("distribute: " + detail::layer_name<L>() +
                                  " was called twice on one tape, and it keeps its forward's state inside (it has no "
                                  "state_type, layer.hpp): its first call's state would be lost; give it a state_type, "
                                  "or call it once per tape");
    }
    using state_holder = std::conditional_t<with_state, std::unique_ptr<state_of<L, with_state>>, int>;
    state_holder state{};
    tensor_type out;
    if constexpr (with_state) {
      if constexpr (reuses_states) {
        auto& spares = spare_states<state_of<L, with_state>>(key);
        if (!spares.empty()) {
          state = std::move(spares.back());
          spares.pop_back();
        }
      }
      if (!state) state = std::make_unique<state_of<L, with_state>>();
      out = layer.forward(r_, x.value(), *state);
    } else {
      out = layer.forward(r_, x.value());
    }
    const variable y = result(std::move(out), wants(x) || !freeze);
    auto n = std::make_unique<layer_node<L, state_holder>>(*this, layer, x, y, freeze, quiet, std::move(state));
    n->in[0] = x.id_;
    n->out[0] = y.id_;
    n->ins = n->outs = 1;
    nodes_.push_back(std::move(n));
    ends_.push_back(entries_.size());
    return y;
  }

  // A layer call's backward: its state (a unique_ptr to the layer's state_type, or an int for a layer
  // that keeps it inside) is used here and by `graph`.
  template <class L, class S>
  struct layer_node final : node {
    layer_node(tape& t, L& layer, variable x, variable y, bool freeze, bool quiet, S state)
        : t{t}, layer{layer}, x{x}, y{y}, freeze{freeze}, quiet{quiet}, state{std::move(state)} {}
    void run(std::unordered_map<const void*, std::size_t>& remaining) override {
      t.run_layer(layer, x, y, freeze, quiet, state, remaining);
    }
    var_pair graph(const var_pair& dy, std::array<bool, 2>) override {
      return {t.graph_layer(layer, x, y, freeze, state, dy[0]), variable{}};
    }
    tape& t;
    L& layer;
    variable x, y;
    bool freeze;
    bool quiet;  // called again by a composite's recorded backward: announces nothing
    S state;
  };

  template <class L, class S>
  void run_layer(L& layer, variable x, variable y, bool freeze, bool quiet, S& state,
                 std::unordered_map<const void*, std::size_t>& remaining) {
    constexpr bool with_state = records_state<L>;
    const void* key = &layer;
    // A frozen call writes the gradients too (and puts them back): they are final after it as well.
    const bool last = !quiet && --remaining[key] == 0;
    const tensor_type& dy = at(y.id_).grad;
    if (!dy.empty()) {
      const hold held{r_, !last || freeze};
      std::vector<tensor_type> kept;
      if (freeze) kept = set_aside(layer);
      tensor_type dx = [&] {
        const bool input = wants(x);
        if constexpr (with_state) {
          if (!input)
            if constexpr (requires { layer.backward(r_, *state, dy, no_input_gradient); })
              return layer.backward(r_, *state, dy, no_input_gradient);
          return layer.backward(r_, *state, dy);
        } else {
          if (!input)
            if constexpr (requires { layer.backward(r_, dy, no_input_gradient); })
              return layer.backward(r_, dy, no_input_gradient);
          return layer.backward(r_, dy);
        }
      }();
      if (freeze) put_back(layer, kept);
      if (wants(x)) accumulate(x, std::move(dx));
    }
    if (last) detail::gradients_ready(r_, layer);
    if constexpr (with_state && reuses_states) spare_states<state_of<L, with_state>>(key).push_back(std::move(state));
  }

  // A layer call's backward recorded on the tape (nn::create_graph): the layer's `recorded_backward`.
  template <class L, class S>
  variable graph_layer(L& layer, variable x, variable y, bool freeze, S& state, variable dy) {
    if constexpr (records_state<L> && detail::records_backward<L, tape, variable>) {
      return layer.recorded_backward(*this, *state, x, y, dy, freeze);
    } else {
      (void)layer, (void)x, (void)y, (void)freeze, (void)state, (void)dy;
      throw missing_rule_error("distribute: " + detail::layer_name<L>() +
                               " has no recorded backward, and a gradient taken with nn::create_graph passes "
                               "through it: call the layers it is made of on the tape instead, or give it a member "
                               "`recorded_backward(tape, state, x, y, dy, frozen)` (docs/nn.md, \"Gradient "
                               "penalties\")");
    }
  }

  template <class L>
  static constexpr bool records_state = detail::forward_state_value<L, R, tensor_type>;
  template <class L, bool With>
  struct state_holder_type {
    using type = int;
  };
  template <class L>
  struct state_holder_type<L, true> {
    using type = typename L::state_type;
  };
  template <class L, bool With>
  using state_of = typename state_holder_type<L, With>::type;

  // The states of finished calls are kept for the next calls of the same layer (CPU only:
  // detail::spare_states says why).
  static constexpr bool reuses_states = std::is_same_v<device_type, cpu>;
  template <class S>
  static std::vector<std::unique_ptr<S>>& spare_states(const void* layer) {
    return detail::spare_states<S>(layer);
  }
  template <class L>
  std::vector<tensor_type> set_aside(L& layer) {
    return detail::set_aside_gradients<T>(detail::engine_of<device_type>(r_), layer, r_.device());
  }
  template <class L>
  void put_back(L& layer, const std::vector<tensor_type>& kept) {
    detail::put_back_gradients<T>(detail::engine_of<device_type>(r_), layer, kept);
  }

  R& r_;
  std::deque<entry> entries_;
  std::vector<std::unique_ptr<node>> nodes_;
  std::vector<std::size_t> ends_;                       // per node: the entries recorded up to it, its outputs the last
  std::unordered_map<const void*, std::size_t> calls_;  // calls per layer
  std::unordered_map<const void*, bool> applied_;       // layers without a state_type, called once
  int frozen_depth_ = 0;                                // inside a frozen call of a model written for a tape
  int quiet_depth_ = 0;                                 // inside recorded_through_parts
  bool done_ = false;
};

template <class R>
tape(R&) -> tape<R, float>;

}  // namespace distribute::nn
