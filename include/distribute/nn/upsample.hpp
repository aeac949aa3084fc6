#pragma once
// Up-sampling of NCHW tensors by an integer factor (PyTorch's nn.Upsample(scale_factor=s, mode=...),
// Keras's UpSampling2D): [N, C, H, W] -> [N, C, H*s, W*s].
//
//   mode nearest   output (oh, ow) copies input (oh / s, ow / s) (PyTorch's default mode)
//   mode bilinear  align_corners=false, PyTorch's default for mode="bilinear": output o samples the
//                  input at (o + 0.5) / s - 0.5, clamped to the edge
//
// No parameters; forward keeps the input's shape (its state_type, layer.hpp). Backward sums, for each
// input element, the output gradients it fed, in a fixed order and in double (a gather per input
// element, kernels::upsample_*_backward), so the bits do not depend on the device or thread count.

#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/resampling_kernels.hpp>
#include <distribute/nn/layer.hpp>

#include <cstdint>
#include <stdexcept>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace distribute::nn {

enum class upsample_mode : std::uint8_t { nearest, bilinear };

// Defaults: PyTorch's nn.Upsample(scale_factor=2) (mode "nearest").
struct upsample_options {
  std::int64_t scale_factor = 2;
  upsample_mode mode = upsample_mode::nearest;
};

namespace detail {
inline std::string describe(const upsample_options& o) {
  return "{scale_factor " + std::to_string(o.scale_factor) + ", mode " +
         (o.mode == upsample_mode::nearest ? "nearest" : "bilinear (align_corners false)") + "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class upsample : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    shape in_shape{};
  };
  static constexpr const char* layer_name = "upsample";

  explicit upsample(upsample_options o = {}) : o_{check(o)} {}

  const upsample_options& options() const noexcept { return o_; }

  shape output_shape(const shape& in) const {
    if (in.rank() != 4)
      throw std::invalid_argument("distribute: upsample " + detail::describe(o_) + " got a tensor of shape " +
                                  in.to_string() + "; it takes [N, C, H, W]");
    return shape::nchw(in.n(), in.c(), in.h() * o_.scale_factor, in.w() * o_.scale_factor);
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    const shape out = output_shape(x.shape());
    tensor_type y = resampled(e, x, out);
    s.in_shape = x.shape();
    kept_.stamp(s, this);
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, layer_name), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const shape& in = s.in_shape;
    const shape out = output_shape(in);
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: upsample " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + out.to_string());
    return gathered(e, dy, in);
  }
  // The backward recorded on a tape (nn::create_graph): the resampling is linear, so its gradient is
  // too, with the resampling itself for that gradient's backward.
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool) {
    const shape in = s.in_shape, out = output_shape(in);
    auto& r = t.replica();
    return t.linear_map(
        "upsample's gradient", dy,
        [this, &r, in](const tensor_type& g) { return gathered(detail::engine_of<D>(r), g, in); },
        [this, &r, out](const tensor_type& g) { return resampled(detail::engine_of<D>(r), g, out); });
  }

  // ONNX: Resize with scales [1, 1, s, s]; nearest as PyTorch exports it (asymmetric coordinates,
  // floor), bilinear as "linear" with half-pixel coordinates (align_corners=false).
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    const std::vector<float> scales{1.0f, 1.0f, static_cast<float>(o_.scale_factor),
                                    static_cast<float>(o_.scale_factor)};
    const std::string sc = g.template initializer<float>("scales", {4}, std::span<const float>(scales));
    const bool nearest = o_.mode == upsample_mode::nearest;
    std::vector<typename G::attribute> a;
    a.push_back({"mode", std::string(nearest ? "nearest" : "linear")});
    a.push_back({"coordinate_transformation_mode", std::string(nearest ? "asymmetric" : "pytorch_half_pixel")});
    if (nearest) a.push_back({"nearest_mode", std::string("floor")});
    return g.node("Resize", {x.name, std::string(), sc}, output_shape(x.shape), std::move(a));
  }

 private:
  template <class E>
  tensor_type resampled(E& e, const tensor_type& x, const shape& out) const {
    tensor_type y{out, x.device(), uninitialized};
    const auto g = geometry(x.shape());
    const std::int64_t planes = out.n() * out.c(), plane = out.h() * out.w();
    if (o_.mode == upsample_mode::nearest)
      e.for_each_in_segments(planes, plane, detail::kernels::upsample_nearest_forward<T>{x.data(), y.data(), g});
    else e.for_each_in_segments(planes, plane, detail::kernels::upsample_bilinear_forward<T>{x.data(), y.data(), g});
    return y;
  }
  template <class E>
  tensor_type gathered(E& e, const tensor_type& dy, const shape& in) const {
    tensor_type dx{in, dy.device(), uninitialized};
    const auto g = geometry(in);
    const std::int64_t planes = in.n() * in.c(), plane = in.h() * in.w();
    if (o_.mode == upsample_mode::nearest)
      e.for_each_in_segments(planes, plane, detail::kernels::upsample_nearest_backward<T>{dy.data(), dx.data(), g});
    else e.for_each_in_segments(planes, plane, detail::kernels::upsample_bilinear_backward<T>{dy.data(), dx.data(), g});
    return dx;
  }
  detail::kernels::upsample_geometry geometry(const shape& in) const { return {in.h(), in.w(), o_.scale_factor}; }
  static upsample_options check(upsample_options o) {
    const detail::option_check c("upsample", detail::describe(o));
    c.at_least("scale_factor", o.scale_factor, upsample_options{}.scale_factor, 1);
    return o;
  }

  upsample_options o_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
