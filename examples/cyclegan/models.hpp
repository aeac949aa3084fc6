#pragma once
// CycleGAN's networks, written as user code against the library's layers: a ResNet generator
// (c7s1-f, d2f, d4f, R4f x blocks, u2f, uf, c7s1-C, tanh; reflection padding, instance norm) and a
// PatchGAN discriminator (4x4 convolutions, LeakyReLU 0.2, LSGAN output per patch). Both are scaled
// by their options; with the reference's 64 filters, 9 blocks and 3 layers they are the reference's
// networks. Every network is a template on the device D of its replica and every member that computes
// a template on the replica, so the same model runs under any strategy on any device with an engine.

#include <distribute/nn.hpp>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace cyclegan {

namespace dist = distribute;
namespace nn = distribute::nn;
using tensor = dist::tensor<float>;

// A host tensor on replica r's device: the tensor itself on a CPU replica, an upload through pinned
// memory on a GPU one (queued on the replica's stream, ahead of the work that reads it).
template <class R>
decltype(auto) on_replica(R& r, const tensor& host) {
  using D = typename R::device_type;
  if constexpr (std::is_same_v<D, dist::cpu>) {
    return (host);
  } else {
    return dist::tensor<float, D>::staged_from_host(host, r.device());
  }
}
// A replica's tensor on the host (a copy down from a GPU).
template <class T>
tensor on_host(const T& t) {
  if constexpr (std::is_same_v<T, tensor>) {
    return t;
  } else {
    return t.to_host();
  }
}
// Its values, in a host vector.
template <class T>
std::vector<float> host_values(const T& t) {
  if constexpr (std::is_same_v<T, tensor>) {
    return std::vector<float>(t.begin(), t.end());
  } else {
    return t.to_vector();
  }
}

// A run-time count of identical blocks (residual blocks, discriminator stages): the layer list of
// nn::sequential is a type, the count of these comes from the command line.
//
// Every network here keeps its forward's state as a value too (`state_type`, nn/layer.hpp: its
// layers' states), so a network can be applied several times before its backwards: recorded on an
// nn::tape, a generator translates, reconstructs and maps to itself in one forward.
//
// The networks' bookkeeping (parameters, buffers, zero_grad, set_training, state-dict names) comes
// from nn::module and the one list of members each names.
template <class Block>
class repeated : public nn::module<repeated<Block>, float, nn::layer_device_t<Block>> {
 public:
  using scalar_type = float;
  using device_type = nn::layer_device_t<Block>;
  using tensor_type = dist::tensor<float, device_type>;
  using state_type = std::vector<typename Block::state_type>;  // one per block

  repeated() = default;
  explicit repeated(std::vector<Block> blocks) : blocks_(std::move(blocks)) {}

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    tensor_type y = x;
    for (auto& b : blocks_) y = b.forward(r, y);
    return y;
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    tensor_type d = dy;
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
      d = it->backward(r, d);
      r.gradients_ready(*it);  // its gradients are final: an open gradient overlap may send them
    }
    return d;
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    s.resize(blocks_.size());
    if (blocks_.empty()) return x;
    tensor_type y = blocks_[0].forward(r, x, s[0]);
    for (std::size_t i = 1; i < blocks_.size(); ++i) y = blocks_[i].forward(r, y, s[i]);
    return y;
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    if (s.size() != blocks_.size())
      throw nn::forward_state_error("repeated::backward got a state of " + std::to_string(s.size()) +
                                    " blocks, it has " + std::to_string(blocks_.size()));
    if (blocks_.empty()) return dy;
    tensor_type d = blocks_.back().backward(r, s.back(), dy);
    r.gradients_ready(blocks_.back());
    for (std::size_t i = blocks_.size() - 1; i-- > 0;) {
      d = blocks_[i].backward(r, s[i], d);
      r.gradients_ready(blocks_[i]);
    }
    return d;
  }
  // The PyTorch port (benchmarks/peer) puts the blocks in the enclosing nn.Sequential, one position
  // each: safetensors names follow it (nn/state_dict.hpp).
  static constexpr bool unpacks_into_sequential = true;
  auto members() { return nn::members("blocks", blocks_); }
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    typename G::value y = x;
    for (std::size_t i = 0; i < blocks_.size(); ++i) y = g.layer(blocks_[i], y, "block" + std::to_string(i));
    return y;
  }

 private:
  std::vector<Block> blocks_;
};

// The discriminator's normalisation, chosen on the command line: instance norm (the reference's),
// batch norm (each replica's own statistics) or SyncBatchNorm (the global batch's statistics).
enum class norm_kind { instance, batch, sync_batch };

inline norm_kind parse_norm(const std::string& s) {
  if (s == "instance") return norm_kind::instance;
  if (s == "batch") return norm_kind::batch;
  if (s == "sync_batch") return norm_kind::sync_batch;
  throw std::invalid_argument("--norm must be instance, batch or sync_batch, not '" + s + "'");
}
inline const char* name_of(norm_kind k) {
  return k == norm_kind::instance ? "instance" : k == norm_kind::batch ? "batch" : "sync_batch";
}

template <class D = dist::cpu>
class norm_layer {
 public:
  using scalar_type = float;
  using device_type = D;
  using tensor_type = dist::tensor<float, D>;

  norm_layer(norm_kind kind, std::int64_t channels, std::uint64_t seed, const D& device = {})
      : v_{make(kind, channels, seed, device)} {}

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return std::visit([&](auto& n) { return n.forward(r, x); }, v_);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return std::visit([&](auto& n) { return n.backward(r, dy); }, v_);
  }
  // The state of the norm it is (std::variant in the same order).
  using state_type =
      std::variant<typename nn::instance_norm<float, D>::state_type, typename nn::batch_norm<float, D>::state_type,
                   typename nn::sync_batch_norm<float, D>::state_type>;
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    return std::visit(
        [&](auto& n) {
          using S = typename std::remove_reference_t<decltype(n)>::state_type;
          if (!std::holds_alternative<S>(s)) s.template emplace<S>();
          return n.forward(r, x, std::get<S>(s));
        },
        v_);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    return std::visit(
        [&](auto& n) {
          using S = typename std::remove_reference_t<decltype(n)>::state_type;
          if (!std::holds_alternative<S>(s))
            throw nn::forward_state_error("norm_layer::backward got another norm's state");
          return n.backward(r, std::get<S>(s), dy);
        },
        v_);
  }
  template <class F>
  void for_each_parameter(F&& f) {
    std::visit([&](auto& n) { n.for_each_parameter(f); }, v_);
  }
  template <class F>
  void for_each_buffer(F&& f) {
    std::visit(
        [&](auto& n) {
          if constexpr (requires { n.for_each_buffer(f); }) n.for_each_buffer(f);
        },
        v_);
  }
  void zero_grad() {
    std::visit([](auto& n) { n.zero_grad(); }, v_);
  }
  void set_training(bool on) {
    std::visit([on](auto& n) { n.set_training(on); }, v_);
  }
  template <class S>
  void name_state(S& s) {
    std::visit([&](auto& n) { s.same(n); }, v_);
  }
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    return std::visit([&](auto& n) { return g.layer(n, x); }, v_);
  }

 private:
  using variant = std::variant<nn::instance_norm<float, D>, nn::batch_norm<float, D>, nn::sync_batch_norm<float, D>>;
  static variant make(norm_kind kind, std::int64_t channels, std::uint64_t seed, const D& device) {
    switch (kind) {
      case norm_kind::instance: return nn::instance_norm<float, D>{{.channels = channels}, seed, device};
      case norm_kind::batch: return nn::batch_norm<float, D>{{.channels = channels}, seed, device};
      case norm_kind::sync_batch: return nn::sync_batch_norm<float, D>{{.channels = channels}, seed, device};
    }
    throw std::invalid_argument("unknown norm kind");
  }
  variant v_;
};

// Seeds of the sub-layers are derived from one seed, so a network is a pure function of its seed.
inline std::uint64_t sub(std::uint64_t seed, std::uint64_t i) { return nn::detail::sub_seed(seed, i); }

// CycleGAN's residual block, x + IN(conv3x3(relu(IN(conv3x3(x))))) with reflection padding, but
// without the convolutions' biases: the instance norm right after each convolution subtracts the
// plane's mean, so a bias there has no effect and a gradient that is zero up to rounding (which Adam,
// dividing by its own running magnitude, would turn into full-size random steps).
template <class D = dist::cpu>
class residual : public nn::module<residual<D>, float, D> {
  using body_type = nn::sequential<nn::conv2d<float, D>, nn::instance_norm<float, D>, nn::relu<float, D>,
                                   nn::conv2d<float, D>, nn::instance_norm<float, D>>;

 public:
  using scalar_type = float;
  using device_type = D;
  using tensor_type = dist::tensor<float, D>;

  residual(std::int64_t channels, std::uint64_t seed, const D& device = {})
      : body_{nn::conv2d<float, D>{conv(channels), sub(seed, 0), device},
              nn::instance_norm<float, D>{{.channels = channels}, sub(seed, 1), device}, nn::relu<float, D>{},
              nn::conv2d<float, D>{conv(channels), sub(seed, 2), device},
              nn::instance_norm<float, D>{{.channels = channels}, sub(seed, 3), device}} {}

  // The skip connection: the body's plus_input, added in its last norm's output pass.
  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return body_.forward(r, x, nn::plus_input);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return body_.backward(r, dy, nn::plus_input);
  }
  using state_type = typename body_type::state_type;
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    return body_.forward(r, x, s, nn::plus_input);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    return body_.backward(r, s, dy, nn::plus_input);
  }
  auto members() { return nn::members("body", body_); }  // the port's Residual.body
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    return g.add(x, this->onnx_member(g, body_, x));
  }

 private:
  static nn::conv2d_options conv(std::int64_t c) {
    return {.in_channels = c,
            .out_channels = c,
            .kernel = 3,
            .stride = 1,
            .padding = 1,
            .pad_mode = nn::padding_mode::reflect,
            .bias = false};
  }
  body_type body_;
};

struct generator_options {
  std::int64_t channels = 1;  // image channels
  std::int64_t filters = 16;  // the reference's 64
  int blocks = 3;             // the reference's 9
};

// Every convolution that a normalisation follows has no bias (see `residual`); the last one has.
template <class D = dist::cpu>
auto make_generator(const generator_options& o, std::uint64_t seed, const D& device = {}) {
  using conv2d = nn::conv2d<float, D>;
  using conv_transpose2d = nn::conv_transpose2d<float, D>;
  using relu = nn::relu<float, D>;
  using nn::padding_mode;
  const std::int64_t f = o.filters, c = o.channels;
  std::vector<residual<D>> blocks;
  for (int i = 0; i < o.blocks; ++i) blocks.emplace_back(4 * f, sub(seed, 100 + static_cast<std::uint64_t>(i)), device);
  auto in = [&](std::int64_t ch, std::uint64_t i) {
    return nn::instance_norm<float, D>{{.channels = ch}, sub(seed, i), device};
  };
  return nn::sequential{
      conv2d{{.in_channels = c,
              .out_channels = f,
              .kernel = 7,
              .stride = 1,
              .padding = 3,
              .pad_mode = padding_mode::reflect,
              .bias = false},
             sub(seed, 1),
             device},
      in(f, 2),
      relu{},
      conv2d{{.in_channels = f, .out_channels = 2 * f, .kernel = 3, .stride = 2, .padding = 1, .bias = false},
             sub(seed, 3),
             device},
      in(2 * f, 4),
      relu{},
      conv2d{{.in_channels = 2 * f, .out_channels = 4 * f, .kernel = 3, .stride = 2, .padding = 1, .bias = false},
             sub(seed, 5),
             device},
      in(4 * f, 6),
      relu{},
      repeated<residual<D>>{std::move(blocks)},
      conv_transpose2d{{.in_channels = 4 * f,
                        .out_channels = 2 * f,
                        .kernel = 3,
                        .stride = 2,
                        .padding = 1,
                        .output_padding = 1,
                        .bias = false},
                       sub(seed, 7),
                       device},
      in(2 * f, 8),
      relu{},
      conv_transpose2d{{.in_channels = 2 * f,
                        .out_channels = f,
                        .kernel = 3,
                        .stride = 2,
                        .padding = 1,
                        .output_padding = 1,
                        .bias = false},
                       sub(seed, 9),
                       device},
      in(f, 10),
      relu{},
      conv2d{{.in_channels = f,
              .out_channels = c,
              .kernel = 7,
              .stride = 1,
              .padding = 3,
              .pad_mode = padding_mode::reflect},
             sub(seed, 11),
             device},
      nn::tanh<float, D>{}};
}
template <class D = dist::cpu>
using generator_on = decltype(make_generator<D>(generator_options{}, 0));
using generator = generator_on<dist::cpu>;

struct discriminator_options {
  std::int64_t channels = 1;
  std::int64_t filters = 16;  // the reference's 64
  int layers = 2;             // stride-2 layers; the reference's 3 collapses 28x28 to 1x1
  norm_kind norm = norm_kind::instance;
};

// conv 4x4 -> norm -> LeakyReLU(0.2), one stage of the PatchGAN; no bias before the norm.
template <class D = dist::cpu>
class patch_stage : public nn::module<patch_stage<D>, float, D> {
 public:
  using scalar_type = float;
  using device_type = D;
  using tensor_type = dist::tensor<float, D>;

  patch_stage(std::int64_t in, std::int64_t out, std::int64_t stride, norm_kind norm, std::uint64_t seed,
              const D& device = {})
      : conv_{{.in_channels = in, .out_channels = out, .kernel = 4, .stride = stride, .padding = 1, .bias = false},
              sub(seed, 0),
              device},
        norm_{norm, out, sub(seed, 1), device} {}

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return act_.forward(r, norm_.forward(r, conv_.forward(r, x)));
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return conv_.backward(r, norm_.backward(r, act_.backward(r, dy)));
  }
  struct state_type {
    typename nn::conv2d<float, D>::state_type conv;
    typename norm_layer<D>::state_type norm;
    typename nn::leaky_relu<float, D>::state_type act;
  };
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    return act_.forward(r, norm_.forward(r, conv_.forward(r, x, s.conv), s.norm), s.act);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    return conv_.backward(r, s.conv, norm_.backward(r, s.norm, act_.backward(r, s.act, dy)));
  }
  // The port writes a stage as three entries of the discriminator's nn.Sequential.
  static constexpr bool unpacks_into_sequential = true;
  auto members() { return nn::members("conv", conv_, "norm", norm_, "act", act_); }
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    return this->onnx_member(g, act_, this->onnx_member(g, norm_, this->onnx_member(g, conv_, x)));
  }

 private:
  nn::conv2d<float, D> conv_;
  norm_layer<D> norm_;
  nn::leaky_relu<float, D> act_{0.2f};
};

template <class D = dist::cpu>
auto make_discriminator(const discriminator_options& o, std::uint64_t seed, const D& device = {}) {
  if (o.layers < 1) throw std::invalid_argument("--d-layers must be at least 1");
  std::vector<patch_stage<D>> stages;
  std::int64_t ch = o.filters;
  // The first layer has no normalisation (the reference's); then stride-2 stages, then one stride-1.
  for (int i = 1; i < o.layers; ++i) {
    const std::int64_t next = o.filters * (std::int64_t{1} << std::min(i, 3));
    stages.emplace_back(ch, next, 2, o.norm, sub(seed, 10 + static_cast<std::uint64_t>(i)), device);
    ch = next;
  }
  const std::int64_t last = o.filters * (std::int64_t{1} << std::min(o.layers, 3));
  stages.emplace_back(ch, last, 1, o.norm, sub(seed, 9), device);
  return nn::sequential{
      nn::conv2d<float, D>{
          {.in_channels = o.channels, .out_channels = o.filters, .kernel = 4, .stride = 2, .padding = 1},
          sub(seed, 1),
          device},
      nn::leaky_relu<float, D>{0.2f}, repeated<patch_stage<D>>{std::move(stages)},
      nn::conv2d<float, D>{
          {.in_channels = last, .out_channels = 1, .kernel = 4, .stride = 1, .padding = 1}, sub(seed, 2), device}};
}
template <class D = dist::cpu>
using discriminator_on = decltype(make_discriminator<D>(discriminator_options{}, 0));
using discriminator = discriminator_on<dist::cpu>;

template <class M>
std::int64_t parameter_count(M& m) {
  std::int64_t n = 0;
  m.for_each_parameter([&](auto v, auto) { n += static_cast<std::int64_t>(v.size()); });
  return n;
}

}  // namespace cyclegan
