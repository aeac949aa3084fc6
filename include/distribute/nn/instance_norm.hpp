#pragma once
// Instance normalisation (CycleGAN's norm): every (example, channel) plane is normalised by its own
// mean and biased variance, so no statistic crosses examples and nothing crosses replicas. Affine
// (gamma N(1, 0.02), beta 0) is optional; CycleGAN's reference uses none.

#include <distribute/nn/detail/batch_stats.hpp>
#include <distribute/nn/layer.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::nn {

struct instance_norm_options {
  std::int64_t channels = 1;
  double eps = 1e-5;
  bool affine = false;
};

template <class T = float>
class instance_norm {
 public:
  using scalar_type = T;

  instance_norm(instance_norm_options o, std::uint64_t seed)
      : o_{o},
        gamma_{shape{o.affine ? o.channels : 0}, init::scale, detail::sub_seed(seed, 0)},
        beta_{shape{o.affine ? o.channels : 0}, init::zero, 0} {
    if (o.channels < 1) throw std::invalid_argument("distribute: instance norm needs at least one channel");
  }

  parameter<T>& gamma() noexcept { return gamma_; }
  parameter<T>& beta() noexcept { return beta_; }

  template <class R>
  tensor<T> forward(R&, const tensor<T>& x) {
    const shape& s = x.shape();
    if (s.rank() != 4 || s.c() != o_.channels)
      throw std::invalid_argument("distribute: instance norm over " + std::to_string(o_.channels) +
                                  " channels got a tensor of shape " + s.to_string());
    const std::int64_t C = o_.channels, plane = s.h() * s.w();
    xhat_ = tensor<T>{s};
    invstd_.assign(static_cast<std::size_t>(s.n() * C), 0.0);
    tensor<T> y{s};
    for (std::int64_t e = 0; e < s.n(); ++e)
      for (std::int64_t c = 0; c < C; ++c) {
        // One plane is channel 0 of a batch of one example with one channel.
        const std::int64_t off = (e * C + c) * plane;
        const detail::moments m = detail::channel_moments(x.data() + off, 1, 1, plane, 0);
        const double is = 1.0 / std::sqrt(m.m2 / m.count + o_.eps);
        invstd_[static_cast<std::size_t>(e * C + c)] = is;
        const T g = o_.affine ? gamma_.value[static_cast<std::size_t>(c)] : T(1);
        const T b = o_.affine ? beta_.value[static_cast<std::size_t>(c)] : T(0);
        for (std::int64_t i = 0; i < plane; ++i) {
          const auto j = static_cast<std::size_t>(off + i);
          const T xh = static_cast<T>((static_cast<double>(x[j]) - m.mean) * is);
          xhat_[j] = xh;
          y[j] = g * xh + b;
        }
      }
    has_input_ = true;
    return y;
  }

  template <class R>
  tensor<T> backward(R&, const tensor<T>& dy) {
    if (!has_input_) detail::backward_before_forward("instance_norm");
    const shape& s = xhat_.shape();
    if (dy.shape() != s)
      throw std::invalid_argument("distribute: instance norm backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + s.to_string());
    const std::int64_t C = o_.channels, plane = s.h() * s.w();
    tensor<T> dx{s};
    for (std::int64_t e = 0; e < s.n(); ++e)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t off = (e * C + c) * plane;
        double sd = 0, sdx = 0;
        for (std::int64_t i = 0; i < plane; ++i) {
          const auto j = static_cast<std::size_t>(off + i);
          sd += static_cast<double>(dy[j]);
          sdx += static_cast<double>(dy[j]) * static_cast<double>(xhat_[j]);
        }
        const double g = o_.affine ? static_cast<double>(gamma_.value[static_cast<std::size_t>(c)]) : 1.0;
        if (o_.affine) {
          gamma_.grad[static_cast<std::size_t>(c)] += static_cast<T>(sdx);
          beta_.grad[static_cast<std::size_t>(c)] += static_cast<T>(sd);
        }
        const T k = static_cast<T>(g * invstd_[static_cast<std::size_t>(e * C + c)]);
        const T mean_dy = static_cast<T>(sd / static_cast<double>(plane));
        const T mean_dyx = static_cast<T>(sdx / static_cast<double>(plane));
        detail::normalized_input_gradient(dx, dy, xhat_, off, plane, k, mean_dy, mean_dyx);
      }
    return dx;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    if (!o_.affine) return;
    gamma_.visit(f);
    beta_.visit(f);
  }
  void zero_grad() {
    gamma_.zero_grad();
    beta_.zero_grad();
  }
  void set_training(bool) {}

 private:
  instance_norm_options o_;
  parameter<T> gamma_, beta_;
  std::vector<double> invstd_;
  tensor<T> xhat_;
  bool has_input_ = false;
};

}  // namespace distribute::nn
