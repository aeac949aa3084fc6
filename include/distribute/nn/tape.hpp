#pragma once
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
#include <distribute/nn/detail/tensor_op_kernels.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/broadcasting.hpp>
#include <distribute/nn/tensor_ops.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
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
        [this, a, b, y, ca] {
          auto [ga, gb] = nn::split(r_, at(y.id_).grad, ca);
          accumulate(a, std::move(ga));
          accumulate(b, std::move(gb));
        },
        y);
    return y;
  }
  // The first `channels` channels of x and the rest (nn::split).
  std::pair<variable, variable> split(variable x, std::int64_t channels) {
    check_mine(x, "split");
    auto [first, second] = nn::split(r_, x.value(), channels);
    const shape s1 = first.shape(), s2 = second.shape();
    const variable a = result(std::move(first), wants(x)), b = result(std::move(second), wants(x));
    record(
        [this, x, a, b, s1, s2] {
          if (!wants(x)) return;
          const tensor_type& ga = at(a.id_).grad;
          const tensor_type& gb = at(b.id_).grad;
          if (ga.empty() && gb.empty()) return;
          // A part no gradient reached contributes zeros.
          accumulate(x, nn::concat(r_, ga.empty() ? tensor_type{s1, r_.device()} : ga,
                                   gb.empty() ? tensor_type{s2, r_.device()} : gb));
        },
        a, b);
    return {a, b};
  }
  // a + b (nn::add; broadcasting, nn/broadcasting.hpp).
  variable add(variable a, variable b) {
    check_mine(a, "add");
    check_mine(b, "add");
    if (a.shape() != b.shape()) return broadcast_op<detail::kernels::add_op>("add", a, b);
    const variable y = result(nn::add(r_, a.value(), b.value()), wants(a) || wants(b));
    record(
        [this, a, b, y] {
          const tensor_type& g = at(y.id_).grad;
          if (wants(a)) accumulate(a, tensor_type{g});
          if (wants(b)) accumulate(b, tensor_type{g});
        },
        y);
    return y;
  }
  // a - b, a / b (nn::sub, nn::div; broadcasting).
  variable sub(variable a, variable b) { return broadcast_op<detail::kernels::sub_op>("sub", a, b); }
  variable div(variable a, variable b) { return broadcast_op<detail::kernels::div_op>("div", a, b); }
  // k x (nn::scale).
  variable scale(variable x, T k) {
    check_mine(x, "scale");
    const variable y = result(nn::scale(r_, x.value(), k), wants(x));
    record([this, x, y, k] { accumulate(x, nn::scale(r_, at(y.id_).grad, k)); }, y);
    return y;
  }
  // a * b element by element (nn::mul; broadcasting).
  variable mul(variable a, variable b) {
    check_mine(a, "mul");
    check_mine(b, "mul");
    if (a.shape() != b.shape()) return broadcast_op<detail::kernels::mul_op>("mul", a, b);
    const variable y = result(nn::mul(r_, a.value(), b.value()), wants(a) || wants(b));
    record(
        [this, a, b, y] {
          const tensor_type& g = at(y.id_).grad;
          if (wants(a)) accumulate(a, nn::mul(r_, g, b.value()));
          if (wants(b)) accumulate(b, nn::mul(r_, g, a.value()));
        },
        y);
    return y;
  }

  // An operation of the caller's (nn/tape_ops.hpp records the library's so): `y` computed from x,
  // and `dx_of(dy)` returning dL/dx from dL/dy when the backward reaches y (not called where no
  // gradient flows into x).
  template <class F>
  variable record_operation(tensor_type y, variable x, F dx_of) {
    check_mine(x, "record_operation");
    check_open("an operation");
    const variable out = result(std::move(y), wants(x));
    record(
        [this, x, out, f = std::move(dx_of)] {
          if (wants(x)) accumulate(x, f(at(out.id_).grad));
        },
        out);
    return out;
  }
  // The same of two inputs: `grads_of(dy, want_a, want_b)` returns the pair (dL/da, dL/db), either
  // left empty where not wanted.
  template <class F>
  variable record_operation(tensor_type y, variable a, variable b, F grads_of) {
    check_mine(a, "record_operation");
    check_mine(b, "record_operation");
    check_open("an operation");
    const variable out = result(std::move(y), wants(a) || wants(b));
    record(
        [this, a, b, out, f = std::move(grads_of)] {
          auto [ga, gb] = f(at(out.id_).grad, wants(a), wants(b));
          if (wants(a)) accumulate(a, std::move(ga));
          if (wants(b)) accumulate(b, std::move(gb));
        },
        out);
    return out;
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

 private:
  struct entry {
    tensor_type value;
    tensor_type grad;
    bool requires_grad = false;
    bool input = false;  // made by watch, constant or stop_gradient
  };
  // One recorded backward; `remaining`: each layer's calls whose backward has not run yet.
  struct node {
    virtual ~node() = default;
    virtual void run(std::unordered_map<const void*, std::size_t>& remaining) = 0;
  };
  template <class F>
  struct op_node final : node {
    explicit op_node(F f) : f{std::move(f)} {}
    void run(std::unordered_map<const void*, std::size_t>&) override { f(); }
    F f;
  };
  template <class F>
  struct layer_node final : node {
    explicit layer_node(F f) : f{std::move(f)} {}
    void run(std::unordered_map<const void*, std::size_t>& remaining) override { f(remaining); }
    F f;
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
  // An operation's backward, run always...
  template <class F>
  void record(F f) {
    check_open("an operation");
    nodes_.push_back(std::make_unique<op_node<F>>(std::move(f)));
    ends_.push_back(entries_.size());
  }
  // ... where a gradient reached one of its outputs.
  template <class F, class... V>
  void record(F f, V... outputs) {
    check_open("an operation");
    auto g = [this, f = std::move(f), outputs...] {
      if ((!at(outputs.id_).grad.empty() || ...)) f();
    };
    nodes_.push_back(std::make_unique<op_node<decltype(g)>>(std::move(g)));
    ends_.push_back(entries_.size());
  }

  template <template <class> class Op>
  variable broadcast_op(const char* name, variable a, variable b) {
    check_mine(a, name);
    check_mine(b, name);
    tensor_type y = detail::broadcast_apply<Op>(r_, name, a.value(), b.value());
    return record_operation(std::move(y), a, b, [this, name, a, b](const tensor_type& dy, bool wa, bool wb) {
      return detail::broadcast_gradients<Op>(r_, name, a.value(), b.value(), dy, wa, wb);
    });
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
    ++calls_[key];
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
    auto f = [this, &layer, x, y, freeze, key,
              state = std::move(state)](std::unordered_map<const void*, std::size_t>& remaining) mutable {
      // A frozen call writes the gradients too (and puts them back): they are final after it as well.
      const bool last = --remaining[key] == 0;
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
    };
    nodes_.push_back(std::make_unique<layer_node<decltype(f)>>(std::move(f)));
    ends_.push_back(entries_.size());
    return y;
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

  // The states of finished calls, kept for the next calls of the same layer on this thread: a new
  // state allocates its buffers anew at every step (fresh pages, a fault for each), where the
  // stateful pair reuses its own; measured, that tripled the cost of a small U-Net's step. A forward
  // overwrites every field it reads back, so a state left by a layer since destroyed is only memory.
  // CPU only: device memory comes from a caching pool already, and is freed on a stream, which a
  // state kept past its strategy would outlive.
  static constexpr bool reuses_states = std::is_same_v<device_type, cpu>;
  template <class S>
  static std::vector<std::unique_ptr<S>>& spare_states(const void* layer) {
    thread_local std::unordered_map<const void*, std::vector<std::unique_ptr<S>>> spares;
    if (spares.size() > 256 && !spares.contains(layer)) spares.clear();
    return spares[layer];
  }

  // A frozen call's parameter gradients, copied aside by the engine before its backward.
  template <class L>
  std::vector<tensor_type> set_aside(L& layer) {
    std::vector<tensor_type> kept;
    auto& e = detail::engine_of<device_type>(r_);
    layer.for_each_parameter([&](std::span<T>, std::span<T> grad) {
      tensor_type& k = kept.emplace_back(shape{static_cast<std::int64_t>(grad.size())}, r_.device(), uninitialized);
      e.for_each(static_cast<std::int64_t>(grad.size()), detail::kernels::copy<T>{grad.data(), k.data()});
    });
    return kept;
  }
  template <class L>
  void put_back(L& layer, const std::vector<tensor_type>& kept) {
    auto& e = detail::engine_of<device_type>(r_);
    std::size_t i = 0;
    layer.for_each_parameter([&](std::span<T>, std::span<T> grad) {
      e.for_each(static_cast<std::int64_t>(grad.size()), detail::kernels::copy<T>{kept[i++].data(), grad.data()});
    });
  }

  R& r_;
  std::deque<entry> entries_;
  std::vector<std::unique_ptr<node>> nodes_;
  std::vector<std::size_t> ends_;                       // per node: the entries recorded up to it, its outputs the last
  std::unordered_map<const void*, std::size_t> calls_;  // calls per layer
  std::unordered_map<const void*, bool> applied_;       // layers without a state_type, called once
  int frozen_depth_ = 0;                                // inside a frozen call of a model written for a tape
  bool done_ = false;
};

template <class R>
tape(R&) -> tape<R, float>;

}  // namespace distribute::nn
