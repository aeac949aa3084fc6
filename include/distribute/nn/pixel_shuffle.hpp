#pragma once
// Sub-pixel rearrangement (PyTorch's nn.PixelShuffle(upscale_factor), TensorFlow's depth_to_space
// in PyTorch's channel order): [N, C*r*r, H, W] -> [N, C, H*r, W*r], output [n, c, h*r + a, w*r + b]
// = input [n, c*r*r + a*r + b, h, w]. Backward is the inverse permutation (PyTorch's
// nn.PixelUnshuffle). No parameters and no arithmetic: every element moves once, one call per element.

#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/resampling_kernels.hpp>
#include <distribute/nn/layer.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace distribute::nn {

// PyTorch's nn.PixelShuffle has no default factor; here it is 2.
struct pixel_shuffle_options {
  std::int64_t upscale_factor = 2;
};

template <class T = float, device D = cpu>
class pixel_shuffle : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    shape in_shape{};
  };
  static constexpr const char* layer_name = "pixel_shuffle";

  explicit pixel_shuffle(pixel_shuffle_options o = {}) : o_{check(o)} {}

  const pixel_shuffle_options& options() const noexcept { return o_; }

  shape output_shape(const shape& in) const {
    const std::int64_t rr = o_.upscale_factor * o_.upscale_factor;
    if (in.rank() != 4 || in.c() % rr != 0)
      throw std::invalid_argument("distribute: pixel_shuffle " + describe() + " got a tensor of shape " +
                                  in.to_string() + "; it takes [N, C*" + std::to_string(rr) +
                                  ", H, W] (channels a multiple of upscale_factor squared)");
    return shape::nchw(in.n(), in.c() / rr, in.h() * o_.upscale_factor, in.w() * o_.upscale_factor);
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    const shape out = output_shape(x.shape());
    tensor_type y{out, x.device(), uninitialized};
    e.for_each(out.numel(), detail::kernels::pixel_shuffle_pass<T, false>{x.data(), y.data(), geometry(x.shape())});
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
      throw std::invalid_argument("distribute: pixel_shuffle " + describe() + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + out.to_string());
    tensor_type dx{in, dy.device(), uninitialized};
    e.for_each(in.numel(), detail::kernels::pixel_shuffle_pass<T, true>{dy.data(), dx.data(), geometry(in)});
    return dx;
  }
  // The backward recorded on a tape (nn::create_graph): the shuffle's inverse, and the shuffle for
  // that gradient's backward (a permutation both ways).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool) {
    const shape in = s.in_shape, out = output_shape(in);
    const auto g = geometry(in);
    auto& r = t.replica();
    return t.linear_map(
        "pixel_shuffle's gradient", dy,
        [&r, in, g](const tensor_type& d) {
          tensor_type dx{in, d.device(), uninitialized};
          detail::engine_of<D>(r).for_each(in.numel(),
                                           detail::kernels::pixel_shuffle_pass<T, true>{d.data(), dx.data(), g});
          return dx;
        },
        [&r, out, g](const tensor_type& x) {
          tensor_type y{out, x.device(), uninitialized};
          detail::engine_of<D>(r).for_each(out.numel(),
                                           detail::kernels::pixel_shuffle_pass<T, false>{x.data(), y.data(), g});
          return y;
        });
  }

  // ONNX: DepthToSpace in mode CRD, PyTorch's channel order.
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    return g.node("DepthToSpace", {x.name}, output_shape(x.shape),
                  {{"blocksize", o_.upscale_factor}, {"mode", std::string("CRD")}});
  }

 private:
  std::string describe() const { return "{upscale_factor " + std::to_string(o_.upscale_factor) + "}"; }
  detail::kernels::pixel_shuffle_geometry geometry(const shape& in) const {
    const std::int64_t r = o_.upscale_factor;
    return {in.c() / (r * r), in.h(), in.w(), r};
  }
  static pixel_shuffle_options check(pixel_shuffle_options o) {
    const detail::option_check c("pixel_shuffle", "{upscale_factor " + std::to_string(o.upscale_factor) + "}");
    c.at_least("upscale_factor", o.upscale_factor, pixel_shuffle_options{}.upscale_factor, 1);
    return o;
  }

  pixel_shuffle_options o_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
