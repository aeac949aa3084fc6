#pragma once
// The model and training loop of the nn equivalence test (tests/nn/training_test.cpp): a small conv
// net with sync_batch_norm trained with Adam on a fixed global batch of 12, written once against
// the strategy concept, so that one_device, 2 workers x 2 replicas and a resumed job run the same code.

#include "../nn/nn_test_support.hpp"

#include <distribute/checkpoint.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace distribute::test {

inline constexpr std::int64_t global_batch = 12, in_size = 1 * 6 * 6, out_size = 2 * 3 * 3;

inline auto make_net(std::uint64_t seed) {
  return nn::sequential{
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1, .bias = false},
                        seed},
      nn::sync_batch_norm<float>{{.channels = 4}, seed + 1}, nn::relu<float>{},
      nn::conv2d<float>{{.in_channels = 4,
                         .out_channels = 2,
                         .kernel = 3,
                         .stride = 2,
                         .padding = 1,
                         .pad_mode = nn::padding_mode::reflect},
                        seed + 2},
      nn::tanh<float>{}};
}
using net_type = decltype(make_net(0));

// The global batch of step `step`: a different batch every step, so that a lost or repeated step
// changes the result.
struct global_batch_data {
  std::vector<float> x, y;
};
inline global_batch_data batch_for_step(std::int64_t step) {
  const auto seed = static_cast<std::uint32_t>(71 + 2 * step);
  const auto x = random_tensor<float>(shape::nchw(global_batch, 1, 6, 6), seed, -1.0, 2.0);
  const auto y = random_tensor<float>(shape::nchw(global_batch, 2, 3, 3), seed + 1, -0.5, 0.5);
  return {{x.begin(), x.end()}, {y.begin(), y.end()}};
}

// How a step combines the gradients: blocking after backward, or overlapped with it.
struct step_reduction {
  bool overlap = false;
  gradient_reduction buckets{};
};

// One training step of every replica on its share of the global batch; returns the global loss.
template <class S, class Nets, class Opts>
float train_step(S& s, Nets& nets, Opts& opts, std::int64_t step, const step_reduction& how = {}) {
  const auto data = batch_for_step(step);
  auto xs = s.scatter(data.x, in_size);
  auto ys = s.scatter(data.y, out_size);
  auto losses = s.run(
      [&](replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, net_type& net,
          optim::adam<float>& opt) {
        const auto n = static_cast<std::int64_t>(xl.size()) / in_size;
        const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
        net.zero_grad();
        const auto out = net.forward(r, x);
        const auto loss = nn::mse(out, y, global_batch);  // a share of the mean over the GLOBAL batch
        if (how.overlap) {
          auto sync = r.overlap_gradients(how.buckets);
          sync.add(net);
          net.backward(r, loss.grad);
          sync.wait();
        } else {
          net.backward(r, loss.grad);
          r.all_reduce_gradients(net, how.buckets);
        }
        opt.step(net);
        return loss.value;
      },
      xs, ys, nets, opts);
  return s.reduce(reduce_op::sum, losses);
}

inline std::vector<float> parameters_of(net_type& net) {
  std::vector<float> p;
  net.for_each_parameter([&](std::span<float> v, std::span<float>) { p.insert(p.end(), v.begin(), v.end()); });
  return p;
}

}  // namespace distribute::test
