// Gradient accumulation (nn::compute_gradients): a batch in micro-batches, then one all-reduce, gives
// the whole batch's gradients bit for bit under the split-independent engine, on one device and
// under a mirrored strategy; accumulating over calls without the all-reduce (no_sync) does too.

#include "nn_test_support.hpp"

#include <distribute/nn/gradients.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/tensor/micro_batches.hpp>

#include <boost/test/unit_test.hpp>

#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;

namespace {

auto make_model() {
  return nn::sequential{
      nn::conv2d<float>({.in_channels = 2, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1, .bias = false},
                        11),
      nn::instance_norm<float>({.channels = 4, .affine = true}, 12), nn::leaky_relu<float>(),
      nn::conv2d<float>({.in_channels = 4, .out_channels = 2, .kernel = 3, .stride = 1, .padding = 1}, 13)};
}

struct mse_loss {
  template <class R>
  nn::loss_result<float> operator()(R& r, const dist::tensor<float>& y, const dist::tensor<float>& t,
                                    std::int64_t n) const {
    return nn::mse(r, y, t, n);
  }
};

constexpr std::int64_t global_batch = 8;
const dist::compute_options exact{.threads = 1, .split_independent = true, .reference = true};

std::vector<float> parameters_of(auto& model) {
  std::vector<float> v;
  model.for_each_parameter([&](std::span<float> p, std::span<float>) { v.insert(v.end(), p.begin(), p.end()); });
  return v;
}

// `replicas` replicas, each on its share of a global batch of 8, 3 Adam steps; `calls` > 1 splits
// each replica's share over that many compute_gradients calls, all-reducing on the last only.
std::vector<float> train(int replicas, int micro_batches, int calls = 1) {
  dist::mirrored_strategy<> s(dist::cpu_replicas(replicas));
  s.set_compute_options(exact);
  auto models = s.mirror([](auto&) { return make_model(); });
  auto opts = s.values_from_function([](int) { return dist::optim::adam<>({.lr = 1e-2}); });
  for (int t = 0; t < 3; ++t) {
    const auto x = dist::test::random_tensor<float>(dist::shape::nchw(global_batch, 2, 5, 5), 100 + t);
    const auto y = dist::test::random_tensor<float>(dist::shape::nchw(global_batch, 2, 5, 5), 200 + t);
    s.run(
        [&](auto& r, auto& model, dist::optim::adam<>& opt) {
          const std::int64_t lo = global_batch * r.replica_id() / replicas,
                             hi = global_batch * (r.replica_id() + 1) / replicas;
          model.zero_grad();
          for (int c = 0; c < calls; ++c) {
            const std::int64_t a = lo + (hi - lo) * c / calls, b = lo + (hi - lo) * (c + 1) / calls;
            nn::compute_gradients(r, model, dist::batch_slice(x, a, b - a), dist::batch_slice(y, a, b - a), mse_loss{},
                                  global_batch, {.micro_batches = micro_batches, .all_reduce = c + 1 == calls});
          }
          opt.step(r, model);
        },
        models, opts);
  }
  return parameters_of(models[0]);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(accumulation)

BOOST_AUTO_TEST_CASE(micro_batches_give_the_whole_batch_bit_for_bit) {
  for (int replicas : {1, 2}) {
    const auto whole = train(replicas, 1);
    for (int m : {2, 3, 8})
      BOOST_TEST(bit_equal(train(replicas, m), whole), replicas << " replicas, " << m << " micro-batches");
  }
}

BOOST_AUTO_TEST_CASE(accumulating_over_calls_without_the_all_reduce_is_the_same) {
  const auto whole = train(2, 1);
  BOOST_TEST(bit_equal(train(2, 1, /*calls=*/2), whole));
  BOOST_TEST(bit_equal(train(2, 2, /*calls=*/2), whole));
}

BOOST_AUTO_TEST_CASE(the_loss_is_the_share_of_the_mean_and_errors_are_named) {
  auto model = make_model();
  auto r = nn::local();
  const auto x = dist::test::random_tensor<float>(dist::shape::nchw(5, 2, 5, 5), 1);
  const auto y = dist::test::random_tensor<float>(dist::shape::nchw(5, 2, 5, 5), 2);
  model.zero_grad();
  const double whole = nn::compute_gradients(r, model, x, y, mse_loss{}, 5);
  model.zero_grad();
  const double parts = nn::compute_gradients(r, model, x, y, mse_loss{}, 5, {.micro_batches = 3});
  BOOST_TEST(parts == whole, boost::test_tools::tolerance(1e-6));
  const auto y4 = dist::test::random_tensor<float>(dist::shape::nchw(4, 2, 5, 5), 2);
  try {
    nn::compute_gradients(r, model, x, y4, mse_loss{}, 5);
    BOOST_FAIL("no error");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("got 5 inputs and 4 targets") != std::string::npos, e.what());
  }
  BOOST_CHECK_THROW(nn::compute_gradients(r, model, x, y, mse_loss{}, 5, {.micro_batches = 0}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
