#pragma once
// Average pooling of NCHW tensors (PyTorch's AvgPool2d without padding, Keras's AveragePooling2D with
// padding "valid"): each output element is the mean of a kernel x kernel window of its plane, the
// windows moved by `stride`. Output size: Ho = floor((H - kernel) / stride) + 1 (likewise Wo).
// No parameters; forward keeps only the input's shape (its state_type, layer.hpp). Means are summed in double, in window order.

#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/pooling_kernels.hpp>
#include <distribute/nn/layer.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace distribute::nn {

// Defaults: a 2x2 window moved by its own size (PyTorch's AvgPool2d(2)).
struct avg_pool2d_options {
  std::int64_t kernel = 2;
  std::int64_t stride = 0;  // 0: the kernel size (PyTorch's stride=None)
};

namespace detail {
inline std::string describe(const avg_pool2d_options& o) {
  return "{kernel " + std::to_string(o.kernel) + ", stride " + std::to_string(o.stride) +
         (o.stride == 0 ? " (the kernel size)" : "") + "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class avg_pool2d : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    shape in_shape{};
  };

  explicit avg_pool2d(avg_pool2d_options o = {}) : o_{check(o)} {}

  const avg_pool2d_options& options() const noexcept { return o_; }
  std::int64_t stride() const noexcept { return o_.stride > 0 ? o_.stride : o_.kernel; }

  // The output shape for an input of `in`.
  shape output_shape(const shape& in) const {
    if (in.rank() != 4)
      throw std::invalid_argument("distribute: avg_pool2d " + detail::describe(o_) + " got a tensor of shape " +
                                  in.to_string() + "; it takes [N, C, H, W]");
    if (in.h() < o_.kernel || in.w() < o_.kernel)
      throw std::invalid_argument("distribute: avg_pool2d " + detail::describe(o_) +
                                  ": kernel larger than the planes of " + in.to_string());
    return shape::nchw(in.n(), in.c(), (in.h() - o_.kernel) / stride() + 1, (in.w() - o_.kernel) / stride() + 1);
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
    e.for_each_in_segments(out.n() * out.c(), out.h() * out.w(),
                           detail::kernels::avg_pool_forward<T>{x.data(), y.data(), geometry(x.shape(), out)});
    s.in_shape = x.shape();
    kept_.stamp(s, this);
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, "avg_pool2d"), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, "avg_pool2d");
    auto& e = detail::engine_of<D>(r);
    const shape& in_shape_ = s.in_shape;
    const shape out = output_shape(in_shape_);
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: avg_pool2d " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + out.to_string());
    return spread(e, dy, in_shape_);
  }
  // The backward recorded on a tape (nn::create_graph): the pooling is linear, so its gradient is too,
  // with the pooling itself for that gradient's backward.
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool) {
    const shape in = s.in_shape;
    return t.linear_map(
        "avg_pool2d's gradient", dy,
        [this, &t, in](const tensor_type& g) { return spread(detail::engine_of<D>(t.replica()), g, in); },
        [this, &t, in](const tensor_type& g) { return pooled(detail::engine_of<D>(t.replica()), g, in); });
  }

 private:
  static avg_pool2d_options check(avg_pool2d_options o) {
    const detail::option_check c("avg_pool2d", detail::describe(o));
    const avg_pool2d_options defaults;
    c.at_least("kernel", o.kernel, defaults.kernel, 1);
    c.require(o.stride >= 0, "stride", o.stride, defaults.stride, "must be at least 1 (or 0: the kernel size)");
    return o;
  }
  template <class E>
  tensor_type spread(E& e, const tensor_type& dy, const shape& in) const {
    tensor_type dx{in, dy.device(), uninitialized};
    e.for_each_in_segments(in.n() * in.c(), in.h() * in.w(),
                           detail::kernels::avg_pool_backward<T>{dy.data(), dx.data(), geometry(in, dy.shape())});
    return dx;
  }
  template <class E>
  tensor_type pooled(E& e, const tensor_type& x, const shape& in) const {
    const shape out = output_shape(in);
    tensor_type y{out, x.device(), uninitialized};
    e.for_each_in_segments(out.n() * out.c(), out.h() * out.w(),
                           detail::kernels::avg_pool_forward<T>{x.data(), y.data(), geometry(in, out)});
    return y;
  }
  detail::kernels::pool_geometry geometry(const shape& in, const shape& out) const {
    return {in.h(), in.w(), out.h(), out.w(), o_.kernel, stride()};
  }

  avg_pool2d_options o_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
