#pragma once
// Batch normalisation over (N, H, W) per channel, in two flavours that share one implementation:
//
// - `batch_norm`: statistics of the replica's own examples. Under several replicas each normalises
//   with different statistics, so training differs from one device on the global batch.
// - `sync_batch_norm`: statistics of the GLOBAL batch. Forward: every replica's per-channel
//   (count, mean, M2) is all-gathered and merged in replica order by Chan's formula, exact for uneven
//   counts and empty replicas. Backward: (sum dy, sum dy*x_hat) per channel, 2C values, are summed in
//   ONE all-reduce (sum dy*x_hat is PyTorch's sum_dy_xmu times invstd). gamma and beta gradients stay
//   local sums and travel with the other gradients in `all_reduce_gradients`.
//   Under one device (the `local` communicator) no collective is compiled in: it is `batch_norm`.
//
// Training mode normalises with the batch's biased variance and updates running statistics
// (momentum 0.1, unbiased variance, PyTorch's convention); eval mode normalises with the running
// statistics and communicates nothing. gamma starts N(1, 0.02), beta at zero.

#include <distribute/comm/local.hpp>
#include <distribute/nn/detail/batch_stats.hpp>
#include <distribute/nn/layer.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::nn {

struct batch_norm_options {
  std::int64_t channels = 1;
  double eps = 1e-5;
  double momentum = 0.1;
};

namespace detail {

template <class R>
inline constexpr bool communicates = !std::is_same_v<typename R::communicator_type, comm::local>;

template <class T, bool Sync>
class basic_batch_norm {
 public:
  using scalar_type = T;

  basic_batch_norm(batch_norm_options o, std::uint64_t seed)
      : o_{o},
        gamma_{shape{o.channels}, init::scale, sub_seed(seed, 0)},
        beta_{shape{o.channels}, init::zero, 0},
        running_mean_(static_cast<std::size_t>(o.channels), 0.0),
        running_var_(static_cast<std::size_t>(o.channels), 1.0) {
    if (o.channels < 1) throw std::invalid_argument("distribute: batch norm needs at least one channel");
  }

  parameter<T>& gamma() noexcept { return gamma_; }
  parameter<T>& beta() noexcept { return beta_; }
  const std::vector<double>& running_mean() const noexcept { return running_mean_; }
  const std::vector<double>& running_var() const noexcept { return running_var_; }
  bool training() const noexcept { return training_; }
  void set_training(bool on) noexcept { training_ = on; }

  template <class R>
  tensor<T> forward(R& r, const tensor<T>& x) {
    const shape& s = x.shape();
    if (s.rank() != 4 || s.c() != o_.channels)
      throw std::invalid_argument("distribute: batch norm over " + std::to_string(o_.channels) +
                                  " channels got a tensor of shape " + s.to_string());
    const std::int64_t C = o_.channels, plane = s.h() * s.w();
    invstd_.assign(static_cast<std::size_t>(C), 0.0);
    mean_.assign(static_cast<std::size_t>(C), 0.0);
    if (training_) {
      std::vector<moments> m(static_cast<std::size_t>(C));
      for (std::int64_t c = 0; c < C; ++c) m[static_cast<std::size_t>(c)] = channel_moments(x.data(), s.n(), C, plane, c);
      if constexpr (Sync && communicates<R>) merge_across_replicas(r, m);
      total_count_ = m[0].count;
      if (total_count_ == 0)
        throw std::invalid_argument("distribute: batch norm in training mode over a batch of no examples");
      for (std::size_t c = 0; c < m.size(); ++c) {
        const double var = m[c].m2 / m[c].count;
        mean_[c] = m[c].mean;
        invstd_[c] = 1.0 / std::sqrt(var + o_.eps);
        const double unbiased = m[c].count > 1 ? m[c].m2 / (m[c].count - 1) : var;
        running_mean_[c] = (1 - o_.momentum) * running_mean_[c] + o_.momentum * m[c].mean;
        running_var_[c] = (1 - o_.momentum) * running_var_[c] + o_.momentum * unbiased;
      }
    } else {
      for (std::size_t c = 0; c < mean_.size(); ++c) {
        mean_[c] = running_mean_[c];
        invstd_[c] = 1.0 / std::sqrt(running_var_[c] + o_.eps);
      }
    }
    forward_training_ = training_;
    xhat_ = tensor<T>{s};
    tensor<T> y{s};
    for (std::int64_t e = 0; e < s.n(); ++e)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t off = (e * C + c) * plane;
        const T mu = static_cast<T>(mean_[static_cast<std::size_t>(c)]);
        const T is = static_cast<T>(invstd_[static_cast<std::size_t>(c)]);
        const T g = gamma_.value[static_cast<std::size_t>(c)], b = beta_.value[static_cast<std::size_t>(c)];
        for (std::int64_t i = 0; i < plane; ++i) {
          const T xh = (x[static_cast<std::size_t>(off + i)] - mu) * is;
          xhat_[static_cast<std::size_t>(off + i)] = xh;
          y[static_cast<std::size_t>(off + i)] = g * xh + b;
        }
      }
    has_input_ = true;
    return y;
  }

  template <class R>
  tensor<T> backward(R& r, const tensor<T>& dy) {
    if (!has_input_) backward_before_forward(Sync ? "sync_batch_norm" : "batch_norm");
    const shape& s = xhat_.shape();
    if (dy.shape() != s)
      throw std::invalid_argument("distribute: batch norm backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + s.to_string());
    const std::int64_t C = o_.channels, plane = s.h() * s.w();
    const auto uc = static_cast<std::size_t>(C);
    // [sum dy per channel | sum dy*x_hat per channel]: one buffer, so one collective.
    std::vector<double> sums(2 * uc, 0.0);
    for (std::int64_t e = 0; e < s.n(); ++e)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t off = (e * C + c) * plane;
        double sd = 0, sdx = 0;
        for (std::int64_t i = 0; i < plane; ++i) {
          const double d = static_cast<double>(dy[static_cast<std::size_t>(off + i)]);
          sd += d;
          sdx += d * static_cast<double>(xhat_[static_cast<std::size_t>(off + i)]);
        }
        sums[static_cast<std::size_t>(c)] += sd;
        sums[uc + static_cast<std::size_t>(c)] += sdx;
      }
    // gamma and beta: this replica's share; all_reduce_gradients combines them.
    for (std::size_t c = 0; c < uc; ++c) {
      beta_.grad[c] += static_cast<T>(sums[c]);
      gamma_.grad[c] += static_cast<T>(sums[uc + c]);
    }
    tensor<T> dx{s};
    if (!forward_training_) {
      // Eval mode: an affine map per channel.
      for (std::int64_t e = 0; e < s.n(); ++e)
        for (std::int64_t c = 0; c < C; ++c) {
          const std::int64_t off = (e * C + c) * plane;
          const T k = gamma_.value[static_cast<std::size_t>(c)] * static_cast<T>(invstd_[static_cast<std::size_t>(c)]);
          for (std::int64_t i = 0; i < plane; ++i) dx[static_cast<std::size_t>(off + i)] = k * dy[static_cast<std::size_t>(off + i)];
        }
      return dx;
    }
    if constexpr (Sync && communicates<R>) r.all_reduce(reduce_op::sum, sums);
    const double m = total_count_;
    for (std::int64_t e = 0; e < s.n(); ++e)
      for (std::int64_t c = 0; c < C; ++c) {
        const auto uc_ = static_cast<std::size_t>(c);
        const std::int64_t off = (e * C + c) * plane;
        const T k = static_cast<T>(static_cast<double>(gamma_.value[uc_]) * invstd_[uc_]);
        const T mean_dy = static_cast<T>(sums[uc_] / m), mean_dyx = static_cast<T>(sums[uc + uc_] / m);
        detail::normalized_input_gradient(dx, dy, xhat_, off, plane, k, mean_dy, mean_dyx);
      }
    return dx;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    gamma_.visit(f);
    beta_.visit(f);
  }
  void zero_grad() {
    gamma_.zero_grad();
    beta_.zero_grad();
  }
  // The running statistics: state that is not trained but must be saved (checkpoints).
  template <class F>
  void for_each_buffer(F&& f) {
    f(std::span<double>(running_mean_));
    f(std::span<double>(running_var_));
  }

 private:
  // Every replica gets every replica's moments and merges them in replica order: the same bits on
  // every replica, and the same result as one device up to rounding.
  template <class R>
  void merge_across_replicas(R& r, std::vector<moments>& m) {
    const std::size_t C = m.size();
    std::vector<double> mine(3 * C), all(3 * C * static_cast<std::size_t>(r.num_replicas()));
    for (std::size_t c = 0; c < C; ++c) {
      mine[c] = m[c].count;
      mine[C + c] = m[c].mean;
      mine[2 * C + c] = m[c].m2;
    }
    r.all_gather(mine, all);
    for (std::size_t c = 0; c < C; ++c) {
      moments acc{};
      for (int q = 0; q < r.num_replicas(); ++q) {
        const double* p = all.data() + static_cast<std::size_t>(q) * 3 * C;
        acc = merge(acc, moments{p[c], p[C + c], p[2 * C + c]});
      }
      m[c] = acc;
    }
  }

  batch_norm_options o_;
  parameter<T> gamma_, beta_;
  std::vector<double> running_mean_, running_var_;
  bool training_ = true;
  bool forward_training_ = true;
  bool has_input_ = false;
  double total_count_ = 0;
  std::vector<double> mean_, invstd_;
  tensor<T> xhat_;
};

}  // namespace detail

template <class T = float>
class batch_norm : public detail::basic_batch_norm<T, false> {
  using detail::basic_batch_norm<T, false>::basic_batch_norm;
};

template <class T = float>
class sync_batch_norm : public detail::basic_batch_norm<T, true> {
  using detail::basic_batch_norm<T, true>::basic_batch_norm;
};

}  // namespace distribute::nn
