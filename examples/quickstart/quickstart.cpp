// Least-squares linear regression, y = X w + b, trained by full-batch gradient descent.
//
// The training function is written once against the `strategy` concept and run twice: on two CPU
// replicas (threads of this process) and on one device. Data-parallel training must not change the
// result, so the two runs must learn the same weights.
#include <distribute/distribute.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace dist = distribute;

constexpr int features = 4;
constexpr int examples = 256;  // the global batch: every step sees the whole data set
constexpr int steps = 200;
constexpr float learning_rate = 0.1f;
constexpr std::array<float, features> true_w{2.0f, -3.0f, 0.5f, 1.5f};
constexpr float true_b = 0.25f;

struct data_set {
  std::vector<float> x;  // examples x features, row-major
  std::vector<float> y;
};

data_set make_data() {
  std::mt19937 gen(42);  // fixed seed: both runs, and every run of the program, see the same data
  std::normal_distribution<float> normal(0.0f, 1.0f);
  data_set d;
  for (int i = 0; i < examples; ++i) {
    float y = true_b + 0.01f * normal(gen);  // a little noise, so the fit is not exact
    for (int j = 0; j < features; ++j) {
      const float xj = normal(gen);
      d.x.push_back(xj);
      y += true_w[j] * xj;
    }
    d.y.push_back(y);
  }
  return d;
}

// Returns the learned parameters: w[0..features-1], then b.
template <dist::strategy S>
std::vector<float> train(S& strategy, const data_set& data) {
  // Each replica gets its slice of the global batch (rows of X, and the matching targets).
  auto x = strategy.scatter(data.x, features);
  auto y = strategy.scatter(data.y);
  // One copy of the parameters per replica. The factory is deterministic, so the copies start equal.
  auto params = strategy.mirror([](auto& /*device*/) { return std::vector<float>(features + 1, 0.0f); });
  const auto global_batch = static_cast<float>(data.y.size());

  float loss = 0.0f;
  for (int step = 0; step < steps; ++step) {
    auto losses = strategy.run(
        [&](dist::replica auto& r, std::vector<float>& p, const std::vector<float>& xs, const std::vector<float>& ys) {
          std::vector<float> grad(features + 1, 0.0f);
          float local_loss = 0.0f;
          for (std::size_t i = 0; i < ys.size(); ++i) {
            const float* row = &xs[i * features];
            float err = p[features] - ys[i];
            for (int j = 0; j < features; ++j) err += p[j] * row[j];
            // Divide by the GLOBAL batch, not this replica's share: summed over replicas, the loss
            // and the gradient are then exactly the means over the whole batch, however it was split.
            local_loss += 0.5f * err * err / global_batch;
            for (int j = 0; j < features; ++j) grad[j] += err * row[j] / global_batch;
            grad[features] += err / global_batch;
          }
          // Every replica receives the same summed gradient, so every copy takes the same step and
          // the parameters stay mirrored.
          r.all_reduce(dist::reduce_op::sum, grad);
          for (int k = 0; k <= features; ++k) p[k] -= learning_rate * grad[k];
          return local_loss;
        },
        params, x, y);
    loss = strategy.reduce(dist::reduce_op::sum, losses);  // the mean loss over the global batch
  }

  strategy.verify_mirrored(params);  // throws mirrored_divergence if the copies drifted apart
  std::printf("  %d replica(s): final loss %.6g, w =", strategy.num_replicas_in_sync(), loss);
  for (int j = 0; j < features; ++j) std::printf(" %.6f", params.primary()[j]);
  std::printf(", b = %.6f\n", params.primary()[features]);
  return params.primary();
}

int main() {
  const data_set data = make_data();
  std::printf("true: w = %.6f %.6f %.6f %.6f, b = %.6f\n", true_w[0], true_w[1], true_w[2], true_w[3], true_b);

  // The only difference between the two runs is the strategy's type.
  dist::mirrored_strategy<dist::cpu> mirrored{dist::cpu_replicas(2)};
  dist::one_device_strategy<dist::cpu> one_device;
  const std::vector<float> a = train(mirrored, data);
  const std::vector<float> b = train(one_device, data);

  // The replicas add up partial gradients in a different grouping than one device does, so the
  // results may differ in the last bits: compare with a tolerance.
  float max_diff = 0.0f;
  for (std::size_t k = 0; k < a.size(); ++k) max_diff = std::max(max_diff, std::abs(a[k] - b[k]));
  std::printf("max |difference| between the runs: %.3g\n", max_diff);
  if (!(max_diff <= 1e-5f)) {
    std::printf("ERROR: the two strategies disagree (tolerance 1e-5)\n");
    return 1;
  }
  std::printf("the two strategies agree (within 1e-5)\n");
  return 0;
}
