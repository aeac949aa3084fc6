// Checkpoints of real models: a run saved after some steps and resumed in a fresh strategy reaches the
// same bits as the run that never stopped, parameters, running statistics and optimiser state alike.

#include "nn_test_support.hpp"

#include <distribute/checkpoint.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
namespace ckpt = distribute::checkpoint;
using dist::shape;
using dist::tensor;

namespace {

auto make_bn_net(std::uint64_t seed) {
  return nn::sequential{
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 3, .kernel = 3, .stride = 1, .padding = 1, .bias = false},
                        seed},
      nn::sync_batch_norm<float>{{.channels = 3}, seed + 1}, nn::leaky_relu<float>{0.2f},
      nn::conv2d<float>{{.in_channels = 3, .out_channels = 1, .kernel = 3, .stride = 2, .padding = 1}, seed + 2}};
}
using bn_net = decltype(make_bn_net(0));

struct run_state {
  std::vector<std::vector<float>> parameters;
  std::vector<std::vector<double>> buffers;
  std::uint64_t optimiser_digest = 0;
  bool operator==(const run_state&) const = default;
};

// Trains steps [first, last) of a fixed schedule (the batch of step k is seeded by k) under a
// 2-replica mirrored strategy, starting from `resume_from` if given; saves a checkpoint after the
// last step into `save_to` if given.
run_state train(int first, int last, const std::filesystem::path* resume_from, const std::filesystem::path* save_to) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  auto nets = s.mirror([](auto&) { return make_bn_net(77); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2, .beta1 = 0.5}}; });
  if (resume_from) {
    const auto a = ckpt::load(*resume_from);
    BOOST_TEST_REQUIRE(a.get<std::int32_t>("step") == first);
    for (auto& net : nets) a.get_model("net", net);
    for (auto& opt : opts) a.get_state("opt", opt);
  }
  constexpr std::int64_t batch = 8;
  for (int step = first; step < last; ++step) {
    const auto x =
        dist::test::random_tensor<float>(shape::nchw(batch, 1, 6, 6), 1000u + static_cast<std::uint32_t>(step));
    const auto y =
        dist::test::random_tensor<float>(shape::nchw(batch, 1, 3, 3), 2000u + static_cast<std::uint32_t>(step));
    auto xs = s.scatter(std::vector<float>(x.begin(), x.end()), 36);
    auto ys = s.scatter(std::vector<float>(y.begin(), y.end()), 9);
    s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, bn_net& net,
            optim::adam<float>& opt) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 36;
          net.zero_grad();
          const auto out = net.forward(r, tensor<float>{shape::nchw(n, 1, 6, 6), xl});
          const auto loss = nn::mse(out, tensor<float>{shape::nchw(n, 1, 3, 3), yl}, batch);
          net.backward(r, loss.grad);
          r.all_reduce_gradients(net);
          opt.step(net);
        },
        xs, ys, nets, opts);
  }
  s.verify_mirrored(nets);
  auto& net = *nets.begin();
  auto& opt = *opts.begin();
  if (save_to) {
    ckpt::archive a;
    a.put("step", std::int32_t{last});
    a.put_model("net", net);
    a.put_state("opt", opt);
    ckpt::save(*save_to, a);
  }
  run_state st;
  net.for_each_parameter([&](std::span<float> v, std::span<float>) { st.parameters.emplace_back(v.begin(), v.end()); });
  net.for_each_buffer([&](std::span<double> b) { st.buffers.emplace_back(b.begin(), b.end()); });
  st.optimiser_digest = opt.state_digest();
  return st;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint)

BOOST_AUTO_TEST_CASE(resumed_training_equals_uninterrupted_bit_for_bit) {
  const auto file =
      std::filesystem::temp_directory_path() / ("distribute-nn-ckpt-" + std::to_string(::getpid()) + ".dck");
  const auto uninterrupted = train(0, 6, nullptr, nullptr);
  train(0, 3, nullptr, &file);
  const auto resumed = train(3, 6, &file, nullptr);
  std::filesystem::remove(file);
  BOOST_TEST(resumed.parameters.size() == 5u);  // conv w, bn gamma + beta, conv w + b
  BOOST_TEST(resumed.buffers.size() == 2u);     // bn running mean and variance
  BOOST_TEST((resumed == uninterrupted));
  // And the checkpoint mattered: a fresh start of the last three steps lands elsewhere.
  BOOST_TEST(!(train(3, 6, nullptr, nullptr) == uninterrupted));
}

BOOST_AUTO_TEST_CASE(a_checkpoint_of_another_architecture_is_refused) {
  auto net = make_bn_net(1);
  ckpt::archive a;
  a.put_model("net", net);
  auto other = nn::sequential{nn::conv2d<float>{{.in_channels = 1, .out_channels = 3, .kernel = 3, .bias = false}, 1}};
  BOOST_CHECK_THROW(a.get_model("net", other), ckpt::checkpoint_error);
  optim::adam<float> adam;
  a.put_state("sgd", optim::sgd<float>{});
  BOOST_CHECK_THROW(a.get_state("sgd", adam), ckpt::checkpoint_error);
}

BOOST_AUTO_TEST_SUITE_END()
