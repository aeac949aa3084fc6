#pragma once
// A small convolutional model cut into stages, run pipelined and on one device, with faults that a
// test can switch on.

#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/pipeline.hpp>
#include <distribute/tensor/micro_batches.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::pipeline_test {

namespace nn = distribute::nn;

inline constexpr std::int64_t channels = 3, side = 6;
inline constexpr std::size_t micro_batch_input_bytes = channels * side * side * sizeof(float);

// What a test makes a stage do on the forward pass of one micro-batch.
struct fault {
  enum kind_t { none, throws, stalls };
  int stage = -1;
  int micro_batch = 0;
  kind_t kind = none;
  std::chrono::milliseconds stall{0};
};

using inner_stage = nn::sequential<nn::conv2d<float>, nn::instance_norm<float>, nn::leaky_relu<float>>;

// Stage k: a reflection-padded 3x3 convolution (no bias: instance norm removes it), instance norm,
// leaky relu; channels in = out. The
// fault, when set, fires on the forward pass of its micro-batch (forwards are counted from the
// step's start, which zeroes the gradients).
class test_stage {
 public:
  using scalar_type = float;
  using device_type = cpu;
  using tensor_type = tensor<float>;

  test_stage(int index, const fault* f = nullptr)
      : index_{index},
        fault_{f},
        inner_{
            nn::conv2d<float>({.in_channels = channels,
                               .out_channels = channels,
                               .kernel = 3,
                               .stride = 1,
                               .padding = 1,
                               .pad_mode = nn::padding_mode::reflect,
                               .bias = false},
                              1000 + static_cast<std::uint64_t>(index)),
            nn::instance_norm<float>({.channels = channels, .affine = true}, 2000 + static_cast<std::uint64_t>(index)),
            nn::leaky_relu<float>()} {}

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    if (fault_ && fault_->stage == index_ && forwards_ == fault_->micro_batch) {
      if (fault_->kind == fault::throws)
        throw std::runtime_error("stage " + std::to_string(index_) + " failed on micro-batch " +
                                 std::to_string(fault_->micro_batch));
      if (fault_->kind == fault::stalls) std::this_thread::sleep_for(fault_->stall);
    }
    ++forwards_;
    return inner_.forward(r, x);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return inner_.backward(r, dy);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy, nn::no_input_gradient_t) {
    return inner_.backward(r, dy, nn::no_input_gradient);
  }
  template <class F>
  void for_each_parameter(F&& f) {
    inner_.for_each_parameter(f);
  }
  void zero_grad() {
    forwards_ = 0;
    inner_.zero_grad();
  }
  void set_training(bool on) { inner_.set_training(on); }

 private:
  int index_;
  const fault* fault_;
  int forwards_ = 0;
  inner_stage inner_;
};

struct mse_loss {
  template <class R>
  nn::loss_result<float> operator()(R& r, const tensor<float>& y, const tensor<float>& t, std::int64_t global) const {
    return nn::mse(r, y, t, global);
  }
};

inline tensor<float> inputs(std::int64_t n, int step, std::int64_t first = 0) {
  tensor<float> t{shape::nchw(n, channels, side, side)};
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<float>(std::sin(
        0.37 * static_cast<double>(i + static_cast<std::size_t>(first) * t.size() / std::max<std::int64_t>(n, 1)) +
        static_cast<double>(step)));
  return t;
}
inline tensor<float> targets(std::int64_t n, int step) {
  tensor<float> t{shape::nchw(n, channels, side, side)};
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<float>(0.5 * std::cos(0.11 * static_cast<double>(i) - step));
  return t;
}

inline compute_options reference_engine(bool reference = true) {
  return {.threads = 1, .split_independent = reference, .reference = reference};
}

inline mirrored_strategy<> reference_strategy(int n, std::chrono::milliseconds timeout = std::chrono::minutes(1),
                                              bool reference = true) {
  mirrored_strategy<> s(cpu_replicas(n), collective_options{.timeout = timeout});
  s.set_compute_options(reference_engine(reference));
  return s;
}

// f(std::integral_constant<int, N>{}) for a run-time stage count.
template <class F>
decltype(auto) with_stages(int stages, F&& f) {
  switch (stages) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: throw std::invalid_argument("test: stage counts 1 to 4");
  }
}

template <std::size_t>
using stage_type = test_stage;

template <class S, std::size_t... I>
auto make_pipeline_of(S& s, pipeline_options o, const fault* f, std::index_sequence<I...>) {
  return pipeline(s, o, [f](const cpu&) { return stage_type<I>(static_cast<int>(I), f); }...);
}
template <int N, class S>
auto make_pipeline(S& s, pipeline_options o = {}, const fault* f = nullptr) {
  return make_pipeline_of(s, o, f, std::make_index_sequence<N>{});
}

inline bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}
inline double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst,
                     std::abs(static_cast<double>(a[i]) - b[i]) / std::max(1e-3, std::abs(static_cast<double>(b[i]))));
  return worst;
}

template <class M>
std::vector<float> parameters_of(M&& model) {
  std::vector<float> out;
  model.for_each_parameter([&](std::span<float> v, std::span<float>) { out.insert(out.end(), v.begin(), v.end()); });
  return out;
}

template <class M>
std::vector<float> gradients_of(M&& model) {
  std::vector<float> out;
  model.for_each_parameter([&](std::span<float>, std::span<float> g) { out.insert(out.end(), g.begin(), g.end()); });
  return out;
}

struct run_result {
  std::vector<std::vector<float>> parameters;  // per stage
  std::vector<double> losses;                  // per step
  bool copies_agree = true;
};

constexpr double learning_rate = 1e-2;

// Every stage on one device, the whole batch in one forward and backward, Adam per stage.
inline run_result one_device_run(int stages, std::int64_t batch, int steps, bool reference = true) {
  one_device_strategy<> s;
  s.set_compute_options(reference_engine(reference));
  std::vector<test_stage> model;
  for (int k = 0; k < stages; ++k) model.emplace_back(k);
  std::vector<optim::adam<>> opts(static_cast<std::size_t>(stages), optim::adam<>({.lr = learning_rate}));
  run_result out;
  for (int t = 0; t < steps; ++t) {
    const auto x = inputs(batch, t), y = targets(batch, t);
    auto loss = s.run([&](auto& r) {
      for (auto& m : model) m.zero_grad();
      tensor<float> a = x;
      for (auto& m : model) a = m.forward(r, a);
      auto l = nn::mse(r, a, y, batch);
      tensor<float> d = l.grad;
      for (int k = stages - 1; k > 0; --k) d = model[static_cast<std::size_t>(k)].backward(r, d);
      model[0].backward(r, d, nn::no_input_gradient);
      for (int k = 0; k < stages; ++k) opts[static_cast<std::size_t>(k)].step(r, model[static_cast<std::size_t>(k)]);
      return static_cast<double>(l.value);
    });
    out.losses.push_back(loss[0]);
  }
  for (auto& m : model) out.parameters.push_back(parameters_of(m));
  return out;
}

inline tensor<float> one_device_forward(int stages, const tensor<float>& x) {
  one_device_strategy<> s;
  s.set_compute_options(reference_engine());
  std::vector<test_stage> model;
  for (int k = 0; k < stages; ++k) model.emplace_back(k);
  return s.run([&](auto& r) {
    tensor<float> a = x;
    for (auto& m : model) a = m.forward(r, a);
    return a;
  })[0];
}

// The pipeline over stages x copies replicas (copies replicas holding every stage when `one_position`).
// Copy c trains on its share of each step's batch.
inline run_result pipelined_run(int stages, int copies, std::int64_t batch, int steps, pipeline_options o,
                                bool one_position = false, bool reference = true) {
  return with_stages(stages, [&](auto n) {
    constexpr int N = decltype(n)::value;
    const int positions = one_position ? 1 : N;
    auto s = reference_strategy(positions * copies, std::chrono::minutes(1), reference);
    o.copies = copies;
    auto model = make_pipeline<N>(s, o);
    std::vector<optim::adam<>> opts(static_cast<std::size_t>(positions * copies), optim::adam<>({.lr = learning_rate}));
    run_result out;
    for (int t = 0; t < steps; ++t) {
      const auto x = inputs(batch, t), y = targets(batch, t);
      auto losses = s.run([&](auto& r) {
        const int c = model.copy_of(r.replica_id());
        const std::int64_t lo = batch * c / copies, hi = batch * (c + 1) / copies;
        auto result = model.train_step(r, batch_slice(x, lo, hi - lo), batch_slice(y, lo, hi - lo), mse_loss{}, batch);
        opts[static_cast<std::size_t>(r.replica_id())].step(r, model.local(r));
        return result.loss;
      });
      out.losses.push_back(s.reduce(reduce_op::sum, losses));
    }
    // Parameters by stage, from copy 0; every copy must hold the same bits.
    auto params = s.run([&](auto& r) { return parameters_of(model.local(r)); });
    for (int k = 0; k < positions; ++k) {
      out.parameters.push_back(params[static_cast<std::size_t>(k)]);
      for (int c = 1; c < copies; ++c)
        out.copies_agree = out.copies_agree && bit_equal(params[static_cast<std::size_t>(c * positions + k)],
                                                         params[static_cast<std::size_t>(k)]);
    }
    if (one_position) {  // one replica holds every stage: cut its parameters by stage
      std::vector<std::vector<float>> by_stage;
      std::size_t at = 0;
      for (int k = 0; k < N; ++k) {
        const auto size = parameters_of(test_stage(k)).size();
        by_stage.emplace_back(out.parameters[0].begin() + static_cast<std::ptrdiff_t>(at),
                              out.parameters[0].begin() + static_cast<std::ptrdiff_t>(at + size));
        at += size;
      }
      out.parameters = std::move(by_stage);
    }
    return out;
  });
}

// The pipeline under one_device_strategy: every stage on the one replica.
inline run_result one_device_pipelined_run(int stages, std::int64_t batch, int steps, pipeline_options o) {
  return with_stages(stages, [&](auto n) {
    constexpr int N = decltype(n)::value;
    one_device_strategy<> s;
    s.set_compute_options(reference_engine());
    auto model = make_pipeline<N>(s, o);
    optim::adam<> opt({.lr = learning_rate});
    run_result out;
    for (int t = 0; t < steps; ++t) {
      const auto x = inputs(batch, t), y = targets(batch, t);
      out.losses.push_back(s.run([&](auto& r) {
        auto result = model.train_step(r, x, y, mse_loss{}, batch);
        opt.step(r, model.local(r));
        return result.loss;
      })[0]);
    }
    std::size_t at = 0;
    const auto all = s.run([&](auto& r) { return parameters_of(model.local(r)); })[0];
    for (int k = 0; k < N; ++k) {
      const auto size = parameters_of(test_stage(k)).size();
      out.parameters.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                                  all.begin() + static_cast<std::ptrdiff_t>(at + size));
      at += size;
    }
    return out;
  });
}

}  // namespace distribute::pipeline_test
