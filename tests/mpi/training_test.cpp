// Data-parallel equivalence across workers: the nn equivalence test's model (sync_batch_norm
// included) trained by 2 replicas per worker reaches one device's parameters.

#include "mpi_test_support.hpp"
#include "training.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
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
  dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{{.local_replicas = 2, .mpi = dist::test::test_mpi_options()}};
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
    dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{{.local_replicas = local, .mpi = dist::test::test_mpi_options()}};
    const auto blocking = train(s, 4, {.overlap = false, .buckets = small});
    const auto overlapped = train(s, 4, {.overlap = true, .buckets = small});
    BOOST_TEST((overlapped == blocking), s.num_workers() << " workers x " << local << " replicas");
    BOOST_TEST((train(s, 4, {.overlap = true}) == train(s, 4, {.overlap = false})), "default buckets");
  }
}

BOOST_AUTO_TEST_SUITE_END()
