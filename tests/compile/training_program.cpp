// The fast-path check's program: a small classifier (conv, relu, flatten, linear) trained by Adam,
// mirrored over two CPU replicas. Built twice, plainly and with the precompiled unit and the
// precompiled umbrella header; the two builds must print the same bits.
#include <distribute/distribute.hpp>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;

int main() {
  dist::mirrored_strategy<dist::cpu> strategy{dist::cpu_replicas(2)};
  constexpr int global_batch = 16, side = 8;
  std::vector<float> pixels(global_batch * side * side);
  std::vector<std::int32_t> labels(global_batch);
  for (int i = 0; i < global_batch; ++i) {
    labels[i] = i % 2;
    for (int p = 0; p < side * side; ++p)
      pixels[i * side * side + p] = (p % side < side / 2) == (i % 2 == 0) ? 1.0f : 0.0f;
  }
  const auto xs = strategy.scatter(pixels, side * side);
  const auto ys = strategy.scatter(labels);
  auto nets = strategy.mirror([](auto&) {
    return nn::sequential{
        nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1}, 1},
        nn::relu<float>{}, nn::flatten<float>{}, nn::linear<float>{{.in_features = 4 * 4 * 4, .out_features = 2}, 2}};
  });
  using net_type = std::decay_t<decltype(nets[0])>;
  auto opts = strategy.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  float loss = 0;
  std::int64_t correct = 0;
  for (int step = 0; step < 20; ++step) {
    const auto results = strategy.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<std::int32_t>& yl, net_type& net,
            optim::adam<float>& opt) {
          const dist::tensor<float> x{dist::shape::nchw(static_cast<std::int64_t>(yl.size()), 1, side, side), xl};
          net.zero_grad();
          const auto logits = net.forward(r, x);
          const auto l = nn::softmax_cross_entropy(r, logits, yl, global_batch);
          net.backward(r, l.grad, nn::no_input_gradient);
          r.all_reduce_gradients(net);
          opt.step(r, net);
          return std::pair{l.value, nn::accuracy(r, logits, yl)};
        },
        xs, ys, nets, opts);
    loss = 0;
    correct = 0;
    for (const auto& [l, c] : results) {
      loss += l;
      correct += c;
    }
  }
  std::printf("loss %a accuracy %lld/%d\n", static_cast<double>(loss), static_cast<long long>(correct), global_batch);
  return correct == global_batch ? 0 : 1;
}
