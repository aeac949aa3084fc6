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

#include <distribute/collective_origin.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/detail/batch_stats.hpp>
#include <distribute/nn/detail/norm_kernels.hpp>
#include <distribute/nn/detail/plane_statistics.hpp>
#include <distribute/nn/detail/recorded_norm.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/layer.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
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

template <class T, device D, bool Sync>
class basic_batch_norm {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  // What a forward keeps for its backward (layer.hpp): x_hat and the statistics it was made with.
  struct state_type {
    state_stamp stamp;
    tensor_type xhat;
    std::vector<double> invstd;
    double total_count = 0;
    bool training = true;
  };
  static constexpr const char* layer_name = Sync ? "sync_batch_norm" : "batch_norm";

  basic_batch_norm(batch_norm_options o, std::uint64_t seed, const D& device = {})
      : o_{check(o)},
        device_{device},
        gamma_{shape{o.channels}, init::scale, sub_seed(seed, 0), device},
        beta_{shape{o.channels}, init::zero, 0, device},
        running_mean_(static_cast<std::size_t>(o.channels), 0.0),
        running_var_(static_cast<std::size_t>(o.channels), 1.0) {}

  static batch_norm_options check(batch_norm_options o) {
    const batch_norm_options d{};
    const nn::detail::option_check c("batch_norm", "{channels " + std::to_string(o.channels) + ", eps " +
                                                       nn::detail::short_number(o.eps) + ", momentum " +
                                                       nn::detail::short_number(o.momentum) + "}");
    c.at_least("channels", o.channels, d.channels, 1);
    c.positive("eps", o.eps, d.eps);
    c.within("momentum", o.momentum, d.momentum, 0.0, 1.0);
    return o;
  }

  const batch_norm_options& options() const noexcept { return o_; }
  parameter<T, D>& gamma() noexcept { return gamma_; }
  parameter<T, D>& beta() noexcept { return beta_; }
  // The backward recorded on a tape (nn::create_graph). In training, written with the tape's
  // operations from x over the batch's statistics (detail::recorded_norm_backward over N, H, W); in
  // evaluation, dy * gamma * invstd with the running statistics' constant invstd. sync_batch_norm
  // across replicas has none (its statistics are another replica's too).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable x, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    if constexpr (Sync && communicates<typename Tape::replica_type>)
      throw missing_rule_error(
          "distribute: sync_batch_norm has no recorded backward across replicas (its statistics "
          "come from every replica); use batch_norm or instance_norm under a gradient penalty");
    const auto gamma = channel_parameter(t, gamma_, frozen);
    if (s.training) return recorded_norm_backward(t, x, dy, dims{0, 2, 3}, std::optional{gamma}, o_.eps);
    const std::vector<T> invstd(s.invstd.begin(), s.invstd.end());
    auto k = tensor_type::from_host(shape{o_.channels, 1, 1}, std::span<const T>(invstd), device_);
    return t.mul(dy, t.mul(gamma, t.constant(std::move(k))));
  }

  const std::vector<double>& running_mean() const noexcept { return running_mean_; }
  const std::vector<double>& running_var() const noexcept { return running_var_; }
  bool training() const noexcept { return training_; }
  void set_training(bool on) noexcept { training_ = on; }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& state) {
    auto& e = engine_of<D>(r);
    const shape& s = x.shape();
    std::vector<double>& invstd_ = state.invstd;
    double& total_count_ = state.total_count;
    if (s.rank() != 4 || s.c() != o_.channels)
      throw std::invalid_argument("distribute: batch norm over " + std::to_string(o_.channels) +
                                  " channels got a tensor of shape " + s.to_string());
    const std::int64_t C = o_.channels, plane = s.h() * s.w();
    invstd_.assign(static_cast<std::size_t>(C), 0.0);
    mean_.assign(static_cast<std::size_t>(C), 0.0);
    if (training_) {
      // Each plane's moments, merged per channel in example order.
      const auto planes = plane_moments(e, x, s.n() * C, plane);
      std::vector<moments> m(static_cast<std::size_t>(C));
      for (std::int64_t n = 0; n < s.n(); ++n)
        for (std::int64_t c = 0; c < C; ++c)
          m[static_cast<std::size_t>(c)] =
              merge(m[static_cast<std::size_t>(c)], planes[static_cast<std::size_t>(n * C + c)]);
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
    state.training = training_;
    const auto mean_d = on_device_of(x, mean_), invstd_d = on_device_of(x, invstd_);
    state.xhat = tensor_type{s, device_, uninitialized};
    tensor_type y{s, device_, uninitialized};
    e.for_each_in_segments(s.n() * C, plane,
                           kernels::normalize<T>{x.data(), y.data(), state.xhat.data(), mean_d.data(), invstd_d.data(),
                                                 gamma_.value.data(), beta_.value.data(), C, plane, true});
    kept_.stamp(state, this);
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, layer_name), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& state, const tensor_type& dy) {
    claim(r, state.stamp, this, layer_name);
    auto& e = engine_of<D>(r);
    const tensor_type& xhat_ = state.xhat;
    const std::vector<double>& invstd_ = state.invstd;
    const bool forward_training_ = state.training;
    const double total_count_ = state.total_count;
    const shape& s = xhat_.shape();
    if (dy.shape() != s)
      throw std::invalid_argument("distribute: batch norm backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + s.to_string());
    const std::int64_t C = o_.channels, plane = s.h() * s.w();
    const auto uc = static_cast<std::size_t>(C);
    // [sum dy per channel | sum dy*x_hat per channel]: one buffer, so one collective.
    const auto per_plane = plane_gradient_sums(e, dy, xhat_, s.n() * C, plane);
    const std::size_t np = static_cast<std::size_t>(s.n()) * uc;
    std::vector<double> sums(2 * uc, 0.0);
    for (std::int64_t n = 0; n < s.n(); ++n)
      for (std::size_t c = 0; c < uc; ++c) {
        sums[c] += per_plane[static_cast<std::size_t>(n) * uc + c];
        sums[uc + c] += per_plane[np + static_cast<std::size_t>(n) * uc + c];
      }
    // gamma and beta: this replica's share; all_reduce_gradients combines them.
    std::vector<T> dgamma(uc), dbeta(uc), gamma(uc);
    for (std::size_t c = 0; c < uc; ++c) {
      dbeta[c] = static_cast<T>(sums[c]);
      dgamma[c] = static_cast<T>(sums[uc + c]);
    }
    const auto dg = on_device_of(dy, dgamma), db = on_device_of(dy, dbeta);
    e.for_each(C, distribute::detail::kernels::add_to<T>{gamma_.grad.data(), dg.data()});
    e.for_each(C, distribute::detail::kernels::add_to<T>{beta_.grad.data(), db.data()});
    e.to_host(gamma_.value.data(), uc, gamma.data());
    std::vector<T> coef(3 * uc, T(0));
    if (forward_training_) {
      // Eval mode needs no statistics of dy: an affine map per channel (the means stay zero).
      if constexpr (Sync && communicates<R>) {
        const collective_label label("sync_batch_norm backward");
        r.all_reduce(reduce_op::sum, sums);
      }
    }
    const double m = total_count_;
    for (std::size_t c = 0; c < uc; ++c) {
      coef[3 * c] = static_cast<T>(static_cast<double>(gamma[c]) * invstd_[c]);
      if (forward_training_) {
        coef[3 * c + 1] = static_cast<T>(sums[c] / m);
        coef[3 * c + 2] = static_cast<T>(sums[uc + c] / m);
      }
    }
    const auto coef_d = on_device_of(dy, coef);
    tensor_type dx{s, device_, uninitialized};
    e.for_each_in_segments(
        s.n() * C, plane,
        kernels::normalized_input_gradient<T>{dy.data(), xhat_.data(), dx.data(), coef_d.data(), C, plane, true});
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
    {
      const collective_label label("sync_batch_norm forward");
      r.all_gather(mine, all);
    }
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
  D device_;
  parameter<T, D> gamma_, beta_;
  std::vector<double> running_mean_, running_var_;
  bool training_ = true;
  std::vector<double> mean_;  // scratch of forward
  kept_state<state_type> kept_;
};

}  // namespace detail

template <class T = float, device D = cpu>
class batch_norm : public detail::basic_batch_norm<T, D, false> {
  using detail::basic_batch_norm<T, D, false>::basic_batch_norm;
};

template <class T = float, device D = cpu>
class sync_batch_norm : public detail::basic_batch_norm<T, D, true> {
  using detail::basic_batch_norm<T, D, true>::basic_batch_norm;
};

}  // namespace distribute::nn
