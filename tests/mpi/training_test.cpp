// Data-parallel equivalence across workers: the nn equivalence test's model (sync_batch_norm
// included) trained by 2 replicas per worker reaches one device's parameters.

#include "mpi_test_support.hpp"
#include "training.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace dist = distribute;

namespace {

template <class S>
std::vector<float> train(S& s, int steps, const dist::test::step_reduction& how = {}) {
  auto nets = s.mirror([](auto&) { return dist::test::make_net(1234); });
  auto opts = s.mirror([](auto&) { return dist::optim::adam<float>{{.lr = 1e-2}}; });
  for (int step = 0; step < steps; ++step) BOOST_TEST(std::isfinite(dist::test::train_step(s, nets, opts, step, how)));
  s.verify_mirrored(nets);
  return dist::test::parameters_of(nets[0]);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(equivalence)

BOOST_AUTO_TEST_CASE(two_replicas_per_worker_match_one_device) {
  dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{
      {.local_replicas = 2, .mpi = dist::test::test_mpi_options()}};
  BOOST_TEST(s.num_replicas_in_sync() == 2 * s.num_workers());
  dist::one_device_strategy<> one;
  const auto reference = train(one, 5);
  const auto initial = dist::test::parameters_of(*std::make_unique<dist::test::net_type>(dist::test::make_net(1234)));
  BOOST_TEST(dist::test::relative_error_of<float>(reference, initial) > 1e-2, "training moved the parameters");
  const auto ours = train(s, 5);
  const double err = dist::test::relative_error_of<float>(ours, reference);
  BOOST_TEST(err < 1e-4, s.num_workers() << " workers x 2 replicas differ from one device by " << err);
  BOOST_TEST_MESSAGE(s.num_workers() << " workers x 2 replicas: relative parameter difference " << err);
  // The same job twice gives the same bits.
  BOOST_TEST((train(s, 5) == ours));
}

BOOST_AUTO_TEST_CASE(overlapped_gradient_all_reduce_has_the_bits_of_the_blocking_one) {
  // Buckets small enough that the net's gradients take several, each started on a thread of its
  // replica while backward goes on; one and two replicas per worker (the second through the
  // hierarchical engine: shared memory in the worker, then MPI).
  const dist::gradient_reduction small{.bucket_bytes = 300, .first_bucket_bytes = 64};
  for (const int local : {1, 2}) {
    dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{
        {.local_replicas = local, .mpi = dist::test::test_mpi_options()}};
    const auto blocking = train(s, 4, {.overlap = false, .buckets = small});
    const auto overlapped = train(s, 4, {.overlap = true, .buckets = small});
    BOOST_TEST((overlapped == blocking), s.num_workers() << " workers x " << local << " replicas");
    BOOST_TEST((train(s, 4, {.overlap = true}) == train(s, 4, {.overlap = false})), "default buckets");
  }
}

BOOST_AUTO_TEST_CASE(bfloat16_gradients_between_workers) {
  // Gradients all-reduced as bfloat16 across workers (MPI's ring; with 2 replicas per worker shared
  // memory first): every copy the same (train verifies), overlapped = blocking bit for bit, not the
  // float run's bits, close to them.
  dist::gradient_reduction small{
      .bucket_bytes = 300, .first_bucket_bytes = 64, .compression = dist::gradient_compression::bfloat16};
  for (const int local : {1, 2}) {
    dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{
        {.local_replicas = local, .mpi = dist::test::test_mpi_options()}};
    const auto blocking = train(s, 4, {.overlap = false, .buckets = small});
    const auto overlapped = train(s, 4, {.overlap = true, .buckets = small});
    BOOST_TEST((overlapped == blocking), s.num_workers() << " workers x " << local << " replicas");
    dist::gradient_reduction plain = small;
    plain.compression = dist::gradient_compression::none;
    const auto reference = train(s, 4, {.overlap = false, .buckets = plain});
    BOOST_TEST(!(blocking == reference));
    const double err = dist::test::relative_error_of<float>(blocking, reference);
    BOOST_TEST(err < 2e-2, s.num_workers()
                               << " workers x " << local << " replicas: bfloat16 gradients differ by " << err);
    BOOST_TEST_MESSAGE(
        s.num_workers() << " workers x " << local
                        << " replicas, 4 steps: bfloat16 gradients' parameters differ from float ones by " << err);
  }
}

BOOST_AUTO_TEST_CASE(a_loss_scaler_skips_on_every_worker_when_one_replica_sees_an_inf) {
  // At step 1 the last replica of the last worker finds an inf in its gradient after the all-reduce
  // (no other replica's sums hold it): every replica of every worker skips, the scales halve together,
  // and models, optimisers and scalers stay mirrored; the other steps step everywhere.
  dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{
      {.local_replicas = 2, .mpi = dist::test::test_mpi_options()}};
  auto nets = s.mirror([](auto&) { return dist::test::make_net(1234); });
  auto opts = s.mirror([](auto&) { return dist::optim::adam<float>{{.lr = 1e-2}}; });
  auto scalers = s.mirror([](auto&) { return dist::optim::loss_scaler{}; });
  const int last = s.num_replicas_in_sync() - 1;
  std::vector<double> scales;
  for (int step = 0; step < 3; ++step) {
    const auto data = dist::test::batch_for_step(step);
    auto xs = s.scatter(data.x, dist::test::in_size);
    auto ys = s.scatter(data.y, dist::test::out_size);
    auto stepped = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl,
            dist::test::net_type& net, dist::optim::adam<float>& opt, dist::optim::loss_scaler& scaler) {
          const auto n = static_cast<std::int64_t>(xl.size()) / dist::test::in_size;
          const dist::tensor<float> x{dist::shape::nchw(n, 1, 6, 6), xl}, y{dist::shape::nchw(n, 2, 3, 3), yl};
          net.zero_grad();
          auto loss = dist::nn::mse(r, net.forward(r, x), y, dist::test::global_batch);
          scaler.scale_loss_gradient(r, loss);
          net.backward(r, loss.grad);
          r.all_reduce_gradients(net);
          if (step == 1 && r.replica_id() == last)
            net.for_each_parameter(
                [](std::span<float>, std::span<float> g) { g[0] = std::numeric_limits<float>::infinity(); });
          return scaler.step(r, opt, net) ? 1 : 0;
        },
        xs, ys, nets, opts, scalers);
    const int all = s.reduce(dist::reduce_op::min, stepped), any = s.reduce(dist::reduce_op::max, stepped);
    BOOST_TEST(all == any, "step " << step << ": the replicas disagreed");
    BOOST_TEST(all == (step == 1 ? 0 : 1), "step " << step);
    s.verify_mirrored(nets);
    s.verify_mirrored(opts);
    s.verify_mirrored(scalers);
    scales.push_back(scalers[0].scale());
  }
  BOOST_TEST(scales == (std::vector<double>{65536.0, 32768.0, 32768.0}));
}

BOOST_AUTO_TEST_SUITE_END()
