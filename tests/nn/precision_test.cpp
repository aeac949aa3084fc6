// Mixed precision on the CPU (nn::with_precision, compute_precision): float32 and tf32 are the
// model itself, bit for bit; bfloat16 and float16 are refused with the reason, leaving the engine as
// it was; the engine's precision comes back after a pass that throws.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::compute_precision;
using dist::shape;
using dist::tensor;

namespace {

auto make_net() {
  return nn::sequential{nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .padding = 1}, 5}, nn::relu<float>{},
                        nn::flatten<float>{}, nn::linear<float>({.in_features = 4 * 6 * 6, .out_features = 3}, 6)};
}

// Three Adam steps of `net` over 2 CPU replicas; replica 0's parameters after them.
template <class Net>
std::vector<float> train(Net prototype) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto nets = s.mirror([&](auto&) { return prototype; });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  const auto x = dist::test::random_tensor<float>(shape::nchw(4, 1, 6, 6), 3);
  const auto y = dist::test::random_tensor<float>(shape{4, 3}, 4);
  auto xs = s.scatter(std::vector<float>(x.begin(), x.end()), 36);
  auto ys = s.scatter(std::vector<float>(y.begin(), y.end()), 3);
  for (int step = 0; step < 3; ++step)
    s.run([&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, Net& net, optim::adam<float>& opt) {
      const auto n = static_cast<std::int64_t>(xl.size()) / 36;
      net.zero_grad();
      const auto loss = nn::mse(r, net.forward(r, tensor<float>{shape::nchw(n, 1, 6, 6), xl}), tensor<float>{shape{n, 3}, yl}, 4);
      net.backward(r, loss.grad);
      r.all_reduce_gradients(net);
      opt.step(r, net);
    }, xs, ys, nets, opts);
  s.verify_mirrored(nets);
  std::vector<float> p;
  nets[0].for_each_parameter([&](std::span<float> v, std::span<float>) { p.insert(p.end(), v.begin(), v.end()); });
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(precision)

BOOST_AUTO_TEST_CASE(names_and_the_engine_default) {
  BOOST_TEST(dist::to_string(compute_precision::bfloat16) == "bfloat16");
  BOOST_TEST(dist::to_string(compute_precision::float16) == "float16");
  BOOST_TEST(dist::is_half(compute_precision::float16));
  BOOST_TEST(!dist::is_half(compute_precision::tf32));
  BOOST_TEST((dist::default_precision({}) == compute_precision::float32));
  BOOST_TEST((dist::default_precision({.tf32 = true}) == compute_precision::tf32));
  BOOST_TEST((dist::default_precision({.precision = compute_precision::bfloat16}) == compute_precision::bfloat16));
}

BOOST_AUTO_TEST_CASE(float32_and_tf32_are_the_model_itself_bit_for_bit) {
  const auto plain = train(make_net());
  BOOST_TEST((train(nn::with_precision{make_net(), compute_precision::float32}) == plain));
  BOOST_TEST((train(nn::with_precision{make_net(), compute_precision::tf32}) == plain));  // nothing to round on a CPU
  auto initial = make_net();
  std::vector<float> p0;
  initial.for_each_parameter([&](std::span<float> v, std::span<float>) { p0.insert(p0.end(), v.begin(), v.end()); });
  BOOST_TEST(dist::test::relative_error_of<float>(plain, p0) > 1e-3);  // the steps moved the parameters
}

BOOST_AUTO_TEST_CASE(half_precision_on_the_cpu_is_refused_with_the_reason) {
  for (const auto p : {compute_precision::bfloat16, compute_precision::float16}) {
    auto net = nn::with_precision{make_net(), p};
    auto r = nn::local();
    const auto x = dist::test::random_tensor<float>(shape::nchw(1, 1, 6, 6), 3);
    const std::string said = dist::test::error_of([&] { net.forward(r, x); });
    BOOST_TEST(said.find("computes in float32 only, not " + std::string(dist::to_string(p))) != std::string::npos, said);
    BOOST_TEST(said.find("bf16 units") != std::string::npos, said);
    BOOST_TEST((r.engine().precision() == compute_precision::float32));  // unchanged
  }
  // Asked of the engine directly, the same.
  dist::engine<dist::cpu> e;
  BOOST_CHECK_THROW(e.use_precision(compute_precision::bfloat16), std::invalid_argument);
  BOOST_TEST((e.precision() == compute_precision::float32));
}

BOOST_AUTO_TEST_CASE(the_engine_precision_comes_back_after_a_pass_that_throws) {
  auto net = nn::with_precision{make_net(), compute_precision::tf32};
  auto r = nn::local();
  const auto wrong = dist::test::random_tensor<float>(shape::nchw(1, 2, 6, 6), 3);  // 2 channels for a 1-channel conv
  BOOST_CHECK_THROW(net.forward(r, wrong), std::invalid_argument);
  BOOST_TEST((r.engine().precision() == compute_precision::float32));
  const auto right = dist::test::random_tensor<float>(shape::nchw(1, 1, 6, 6), 3);
  {
    const dist::precision_scope scope{r.engine(), compute_precision::tf32};
    BOOST_TEST((r.engine().precision() == compute_precision::tf32));
    net.forward(r, right);
    BOOST_TEST((r.engine().precision() == compute_precision::tf32));  // the wrapper restored the outer scope's
  }
  BOOST_TEST((r.engine().precision() == compute_precision::float32));
}

BOOST_AUTO_TEST_SUITE_END()
