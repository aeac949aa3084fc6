#pragma once
// Spectral normalisation of a linear or conv2d layer's weight (PyTorch's
// torch.nn.utils.spectral_norm(module), the form that names its state weight_orig, weight_u and
// weight_v): the layer computes with W / sigma(W), sigma the largest singular value of W seen as a
// [out, in * k * k] matrix, estimated by power iteration:
//
//   in training, n_power_iterations times:  v = normalize(W^T u),  u = normalize(W v)
//   always:                                 sigma = u^T W v,   W_sn = W / sigma
//
// normalize(a) = a / max(||a||, eps). u and v start as normalised N(0, 1) draws from the seed, as
// PyTorch's do; in evaluation (set_training(false)) they are used as they are. The gradient is
// PyTorch's: u and v are constants, so dL/dW = (dL/dW_sn - <dL/dW_sn, W_sn> u v^T) / sigma.
//
//   nn::spectral_norm sn{nn::conv2d<float>{{.in_channels = 3, .out_channels = 64, .kernel = 4}, seed}};
//
// State dict names (PyTorch's): "weight_orig" (the trained weight, a parameter), "bias" (the
// layer's), "weight_u" [out] and "weight_v" [in * k * k] (buffers, kept on the host in double as
// batch norm's running statistics are; a checkpoint and verify_mirrored cover them). A PyTorch file
// saved without its spectral-norm metadata loads into PyTorch as it is (its load hook takes a state
// dict with all three tensors and no "weight" as current).
//
// Each forward keeps W_sn, u, v and sigma in its state, so the layer can be applied several times
// before the backwards, each backward using its own forward's values (a training forward moves u and
// v). The power iteration and the division are the replica engine's passes (`gemm`, segmented sums
// over one segment, element-wise functors: kernels/spectral_norm_kernels.hpp); u and v cross to the
// host once per training forward (a few hundred values).

#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/detail/host_copy.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/plane_sum_kernels.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/nn/detail/spectral_norm_kernels.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/linear.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::nn {

// Defaults: PyTorch's spectral_norm(module) (n_power_iterations 1, eps 1e-12, name "weight", dim 0).
struct spectral_norm_options {
  std::int64_t n_power_iterations = 1;
  double eps = 1e-12;
};

namespace detail {
template <class L>
struct spectral_normable : std::false_type {};
template <class T, class D>
struct spectral_normable<linear<T, D>> : std::true_type {};
template <class T, class D>
struct spectral_normable<conv2d<T, D>> : std::true_type {};

// Swaps two tensors for a scope, and back at its end (also when the layer inside throws).
template <class Tensor>
class swapped {
 public:
  swapped(Tensor& a, Tensor& b) noexcept : a_{a}, b_{b} { std::swap(a_, b_); }
  ~swapped() { std::swap(a_, b_); }
  swapped(const swapped&) = delete;
  swapped& operator=(const swapped&) = delete;

 private:
  Tensor& a_;
  Tensor& b_;
};
}  // namespace detail

template <class L>
class spectral_norm : public detail::optional_input_gradient<spectral_norm<L>> {
  static_assert(detail::spectral_normable<L>::value,
                "distribute: spectral_norm wraps nn::linear or nn::conv2d (the layers whose weight PyTorch's "
                "spectral_norm reshapes along dim 0)");

 public:
  using scalar_type = typename L::scalar_type;
  using device_type = layer_device_t<L>;
  using T = scalar_type;
  using D = device_type;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    typename L::state_type inner;
    tensor_type weight;  // W / sigma
    tensor_type u, v;
    tensor<double, D> sigma;
  };
  static constexpr const char* layer_name = "spectral_norm";

  // `seed` draws u and v; the layer keeps its own weights (they become weight_orig).
  explicit spectral_norm(L layer, spectral_norm_options o = {}, std::uint64_t seed = 0)
      : o_{check(o)}, layer_{std::move(layer)} {
    auto& w = layer_.weight();
    weight_orig_.value = w.value;
    weight_orig_.grad = tensor_type{w.value.shape(), w.value.device()};
    rows_ = w.value.shape()[0];
    columns_ = w.value.shape().numel() / rows_;
    u_ = normalized_draw(rows_, detail::sub_seed(seed, 1));
    v_ = normalized_draw(columns_, detail::sub_seed(seed, 2));
  }

  const spectral_norm_options& options() const noexcept { return o_; }
  L& layer() noexcept { return layer_; }
  parameter<T, D>& weight_orig() noexcept { return weight_orig_; }
  std::span<double> weight_u() noexcept { return u_; }
  std::span<double> weight_v() noexcept { return v_; }
  bool training() const noexcept { return training_; }
  auto output_shape(const shape& in) const { return layer_.output_shape(in); }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    const D device = weight_orig_.value.device();
    const T* w = weight_orig_.value.data();
    s.u = upload(u_, device);
    s.v = upload(v_, device);
    if (training_ && o_.n_power_iterations > 0) {
      tensor<double, D> squared{shape{1}, device, uninitialized};
      for (std::int64_t k = 0; k < o_.n_power_iterations; ++k) {
        // v = normalize(W^T u) as the row u^T W; u = normalize(W v) as the row v^T W^T.
        e.gemm(gemm_geometry{.m = 1, .n = columns_, .k = rows_}, s.u.data(), w, s.v.data());
        normalize(e, s.v, columns_, squared);
        e.gemm(gemm_geometry{.m = 1, .n = rows_, .k = columns_, .transpose_b = true}, s.v.data(), w, s.u.data());
        normalize(e, s.u, rows_, squared);
      }
      download(e, s.u, u_);
      download(e, s.v, v_);
    }
    tensor_type wv{shape{rows_}, device, uninitialized};
    e.gemm(gemm_geometry{.m = 1, .n = rows_, .k = columns_, .transpose_b = true}, s.v.data(), w, wv.data());
    s.sigma = tensor<double, D>{shape{1}, device, uninitialized};
    e.segmented_sum(1, rows_, detail::kernels::product_of<T>{s.u.data(), wv.data(), rows_}, s.sigma.data());
    s.weight = tensor_type{weight_orig_.value.shape(), device, uninitialized};
    e.for_each(rows_ * columns_, detail::kernels::divide_by_sigma<T>{w, s.sigma.data(), s.weight.data()});
    tensor_type y;
    {
      const detail::swapped<tensor_type> in_place{layer_.weight().value, s.weight};
      y = layer_.forward(r, x, s.inner);
    }
    kept_.stamp(s, this);
    return y;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    weight_orig_.visit(f);
    if (!layer_.bias().value.empty()) layer_.bias().visit(f);
  }
  template <class F>
  void for_each_buffer(F&& f) {
    f(std::span<double>(u_));
    f(std::span<double>(v_));
  }
  void zero_grad() {
    weight_orig_.zero_grad();
    layer_.zero_grad();
  }
  void set_training(bool on) {
    training_ = on;
    layer_.set_training(on);
  }
  template <class S>
  void name_state(S& s) {
    s.parameter("weight_orig", weight_orig_);
    s.parameter("bias", layer_.bias());
    s.buffer("weight_u", std::span<double>(u_));
    s.buffer("weight_v", std::span<double>(v_));
  }
  // The backward recorded on a tape (nn::create_graph): the layer's, with W / sigma for its weights
  // and its weight gradient carried to weight_orig as backward carries it (u, v and sigma constants).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    if (frozen) return layer_.recorded_backward_with(t, s.inner, dy, s.weight, nullptr);
    state_type* kept = &s;
    return layer_.recorded_backward_with(t, s.inner, dy, s.weight, [this, &t, kept](const tensor_type& dwn) {
      add_weight_orig_gradient(detail::engine_of<D>(t.replica()), dwn, *kept);
    });
  }
  // ONNX: the layer with W / sigma for its weight, sigma from the stored u and v (the inference form).
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    const std::vector<T> w = detail::host_copy(weight_orig_.value);
    double sigma = 0;
    for (std::int64_t i = 0; i < rows_; ++i) {
      double row = 0;
      for (std::int64_t j = 0; j < columns_; ++j)
        row += static_cast<double>(w[static_cast<std::size_t>(i * columns_ + j)]) *
               static_cast<double>(static_cast<T>(v_[static_cast<std::size_t>(j)]));
      sigma += static_cast<double>(static_cast<T>(u_[static_cast<std::size_t>(i)])) *
               static_cast<double>(static_cast<T>(row));
    }
    std::vector<T> normalized(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) normalized[i] = w[i] / static_cast<T>(sigma);
    tensor_type scaled = weight_orig_.value;
    detail::assign_from_host(scaled, std::span<const T>(normalized));
    const detail::swapped<tensor_type> in_place{layer_.weight().value, scaled};
    return g.layer(layer_, x);
  }

 private:
  friend class detail::optional_input_gradient<spectral_norm>;
  template <class R>
  tensor_type backward_pass(R& r, state_type& s, const tensor_type& dy, bool input_gradient) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const D device = weight_orig_.value.device();
    // The layer's backward with W / sigma in place, its weight gradient (dL/dW_sn) caught apart.
    tensor_type dwn{weight_orig_.value.shape(), device};
    tensor_type dx;
    {
      const detail::swapped<tensor_type> weight{layer_.weight().value, s.weight};
      const detail::swapped<tensor_type> grad{layer_.weight().grad, dwn};
      dx = input_gradient ? layer_.backward(r, s.inner, dy) : layer_.backward(r, s.inner, dy, no_input_gradient);
    }
    add_weight_orig_gradient(e, dwn, s);
    return dx;
  }
  // weight_orig's gradient += dL/dW from dL/dW_sn (`dwn`), with the state's u, v and sigma.
  template <class E>
  void add_weight_orig_gradient(E& e, const tensor_type& dwn, const state_type& s) {
    const std::int64_t n = rows_ * columns_;
    tensor<double, D> dot{shape{1}, dwn.device(), uninitialized};
    e.segmented_sum(1, n, detail::kernels::product_of<T>{dwn.data(), weight_orig_.value.data(), n}, dot.data());
    e.for_each(n, detail::kernels::spectral_norm_weight_gradient<T>{dwn.data(), s.u.data(), s.v.data(), s.sigma.data(),
                                                                    dot.data(), weight_orig_.grad.data(), columns_});
  }

  template <class E>
  void normalize(E& e, tensor_type& a, std::int64_t n, tensor<double, D>& squared) const {
    e.segmented_sum(1, n, detail::kernels::product_of<T>{a.data(), a.data(), n}, squared.data());
    e.for_each(n, detail::kernels::divide_by_norm<T>{a.data(), squared.data(), o_.eps});
  }
  static tensor_type upload(const std::vector<double>& host, const D& device) {
    const std::vector<T> values(host.begin(), host.end());
    return tensor_type::from_host(shape{static_cast<std::int64_t>(values.size())}, std::span<const T>(values), device);
  }
  template <class E>
  static void download(E& e, const tensor_type& a, std::vector<double>& host) {
    std::vector<T> values(host.size());
    e.to_host(a.data(), values.size(), values.data());
    host.assign(values.begin(), values.end());
  }
  std::vector<double> normalized_draw(std::int64_t n, std::uint64_t seed) const {
    std::vector<double> v(static_cast<std::size_t>(n));
    detail::fill_normal(std::span<double>(v), seed, 0.0, 1.0);
    double norm = 0;
    for (const double a : v) norm += a * a;
    norm = std::sqrt(norm);
    for (double& a : v) a = static_cast<double>(static_cast<T>(a / (norm > o_.eps ? norm : o_.eps)));
    return v;
  }
  static spectral_norm_options check(spectral_norm_options o) {
    const detail::option_check c("spectral_norm", "{n_power_iterations " + std::to_string(o.n_power_iterations) +
                                                      ", eps " + detail::short_number(o.eps) + "}");
    const spectral_norm_options defaults;
    c.at_least("n_power_iterations", o.n_power_iterations, defaults.n_power_iterations, 0);
    c.positive("eps", o.eps, defaults.eps);
    return o;
  }

  spectral_norm_options o_;
  L layer_;
  parameter<T, D> weight_orig_;
  std::int64_t rows_ = 1, columns_ = 1;
  std::vector<double> u_, v_;
  bool training_ = true;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
