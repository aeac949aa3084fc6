// The GPU strategies under the core semantic checks (tests/core/strategy_test.cpp): run, reduce,
// gather, scatter, mirror and broadcast of device state, data-parallel equivalence; and the failure
// cases every device shares (tests/core/failure_cases.hpp: a throwing replica, a collective never
// joined, mismatched collectives, each a clear error and never a hang, with the strategy usable
// afterwards), plus the GPU's own (a CUDA error in a replica, NCCL point-to-point).

#include "gpu_test_support.cuh"

#include <boost/test/unit_test.hpp>

#include <bit>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace dist = distribute;
namespace dt = distribute::test;
using namespace std::chrono_literals;

namespace {

// The core tests' least-squares model, with the weights in device memory and the batch uploaded per
// replica: the mean squared error over the GLOBAL batch, gradients summed across replicas.
template <dist::strategy S>
std::vector<double> train_linear(S& s, int steps) {
  const int features = 3, batch = 12;
  std::vector<double> x(static_cast<std::size_t>(batch * features)), y(static_cast<std::size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    for (int f = 0; f < features; ++f)
      x[static_cast<std::size_t>(i * features + f)] = std::sin(1.0 + i * 0.7 + f * 1.3);
    y[static_cast<std::size_t>(i)] =
        2.0 * x[static_cast<std::size_t>(i * features)] - x[static_cast<std::size_t>(i * features + 2)] + 0.5;
  }
  auto xs = s.scatter(x, features);
  auto ys = s.scatter(y);
  auto w = s.mirror([&](auto& d) { return dist::tensor<double, dist::cuda>(dist::shape{features + 1}, d); });
  for (int step = 0; step < steps; ++step) {
    s.run(
        [&](dist::replica auto& r, const std::vector<double>& xl, const std::vector<double>& yl,
            dist::tensor<double, dist::cuda>& wt) {
          const auto wl = wt.to_vector();
          std::vector<double> grad(features + 1, 0.0);
          for (std::size_t i = 0; i < yl.size(); ++i) {
            double pred = wl[features];
            for (int f = 0; f < features; ++f)
              pred += wl[static_cast<std::size_t>(f)] * xl[i * features + static_cast<std::size_t>(f)];
            const double err = (pred - yl[i]) * 2.0 / batch;
            for (int f = 0; f < features; ++f)
              grad[static_cast<std::size_t>(f)] += err * xl[i * features + static_cast<std::size_t>(f)];
            grad[features] += err;
          }
          auto g = dist::tensor<double, dist::cuda>::from_host(dist::shape{features + 1}, grad, r.device());
          r.all_reduce(dist::reduce_op::sum, g.values());
          const auto gs = g.to_vector();
          std::vector<double> next(wl);
          for (std::size_t k = 0; k < next.size(); ++k) next[k] -= 0.1 * gs[k];
          wt.copy_from_host(next);
        },
        xs, ys, w);
  }
  s.verify_mirrored(w);
  return w[0].to_vector();
}

}  // namespace

// A model of float gradients in device memory (for all_reduce_gradients, which needs no layers).
struct device_gradients {
  using scalar_type = float;
  std::vector<dist::tensor<float, dist::cuda>> values, gradients;
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t i = 0; i < values.size(); ++i) f(values[i].values(), gradients[i].values());
  }
};

// Replica r's gradient element i: irregular, of several magnitudes.
float device_gradient_value(int r, std::size_t i) {
  return static_cast<float>(
      std::ldexp(std::sin(0.41 * static_cast<double>(i) + 1.7 * r), static_cast<int>(i % 19) - 12));
}

BOOST_AUTO_TEST_SUITE(strategy)

BOOST_AUTO_TEST_CASE(the_gpu_strategies_model_the_concepts) {
  static_assert(dist::strategy<dist::one_device_strategy<dist::cuda>>);
  static_assert(dist::strategy<dist::mirrored_strategy<dist::cuda>>);
  static_assert(dist::replica<dist::mirrored_strategy<dist::cuda>::replica_type>);
  static_assert(dist::communicator<dist::comm::cuda_peer>);
  static_assert(dist::communicator<dist::comm::cuda_solo>);
  static_assert(dist::communicator<dist::comm::cuda_replica>);
#if DISTRIBUTE_HAS_NCCL
  static_assert(dist::communicator<dist::comm::nccl>);
#endif
  static_assert(dist::element<__half> && dist::element<__nv_bfloat16>);
  BOOST_TEST(true);
}

BOOST_AUTO_TEST_CASE(engines_follow_the_device_list) {
  BOOST_TEST((dist::mirrored_strategy<dist::cuda>{dist::cuda_replicas(2)}.collective_engine() ==
              dist::cuda_collective_engine::cuda_peer));
  BOOST_CHECK_THROW(
      (dist::mirrored_strategy<dist::cuda>{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::nccl}),
      std::invalid_argument);
  BOOST_CHECK_THROW(dist::mirrored_strategy<dist::cuda>{std::vector<dist::cuda>{}}, std::invalid_argument);
  // One replica talks to nobody: cuda_peer, unless NCCL is asked for by name.
  BOOST_TEST((dist::mirrored_strategy<dist::cuda>{dist::cuda_replicas(1)}.collective_engine() ==
              dist::cuda_collective_engine::cuda_peer));
#if DISTRIBUTE_HAS_NCCL
  BOOST_TEST((dist::mirrored_strategy<dist::cuda>{{dist::cuda{0}}, {}, dist::cuda_collective_engine::nccl}
                  .collective_engine() == dist::cuda_collective_engine::nccl));
  dist::mirrored_strategy<dist::cuda> all;
  BOOST_TEST((all.collective_engine() == (dist::cuda_device_count() >= 2 ? dist::cuda_collective_engine::nccl
                                                                         : dist::cuda_collective_engine::cuda_peer)));
  BOOST_TEST(all.num_replicas_in_sync() == dist::cuda_device_count());
#endif
  // Every replica gets a stream of its own.
  dist::mirrored_strategy<dist::cuda> s{dist::cuda_replicas(3)};
  BOOST_TEST((s.devices()[0].stream() != s.devices()[1].stream()));
  BOOST_TEST((s.devices()[0].stream() != nullptr));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(run_returns_one_result_per_replica_in_order, M, dt::gpu_strategies) {
  auto s = M::make();
  BOOST_TEST(s.num_replicas_in_sync() == M::replicas);
  auto seen = s.run([](dist::replica auto& r) {
    int current = -1;
    (void)cudaGetDevice(&current);
    return std::tuple{r.replica_id(), r.num_replicas(), r.device().index(), current};
  });
  BOOST_TEST(seen.size() == static_cast<std::size_t>(M::replicas));
  for (int i = 0; i < M::replicas; ++i) {
    const auto [id, n, ordinal, current] = seen[static_cast<std::size_t>(i)];
    BOOST_TEST(id == i);
    BOOST_TEST(n == M::replicas);
    BOOST_TEST(current == ordinal);  // the replica's device is current on its thread
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(run_unwraps_per_replica_and_shares_other_arguments, M, dt::gpu_strategies) {
  auto s = M::make();
  auto parts = s.values_from_function([](int id) { return id * 100; });
  const int shared = 7;
  auto out = s.run([](auto&, int part, const int& common) { return part + common; }, parts, shared);
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(out[static_cast<std::size_t>(i)] == i * 100 + 7);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_gather_and_scatter, M, dt::gpu_strategies) {
  auto s = M::make();
  auto vals = s.run([](dist::replica auto& r) { return static_cast<float>(r.replica_id() + 1); });
  const float n = static_cast<float>(M::replicas);
  BOOST_TEST(s.reduce(dist::reduce_op::sum, vals) == n * (n + 1) / 2);
  BOOST_TEST(s.reduce(dist::reduce_op::mean, vals) == (n + 1) / 2);
  BOOST_TEST(s.reduce(dist::reduce_op::max, vals) == n);
  const auto g = s.gather(vals);
  BOOST_TEST(g.size() == static_cast<std::size_t>(M::replicas));
  std::vector<int> batch(10);
  std::iota(batch.begin(), batch.end(), 0);
  const auto parts = s.scatter(batch);
  BOOST_TEST(s.gather(parts) == batch);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mirrored_device_state_and_broadcast, M, dt::gpu_strategies) {
  auto s = M::make();
  auto w = s.mirror([](auto& d) {
    return dist::tensor<float, dist::cuda>::from_host(dist::shape{2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6}, d);
  });
  for (std::size_t r = 0; r < w.size(); ++r) BOOST_TEST((w[r].device() == s.devices()[r]));
  s.verify_mirrored(w);
  // An update on the primary only, then broadcast: the copies are identical again, each still on
  // its own replica's device.
  s.run_on_primary([](auto&, dist::tensor<float, dist::cuda>& t) { t.copy_from_host(std::vector<float>(6, 9.0f)); }, w);
  if (M::replicas > 1) BOOST_CHECK_THROW(s.verify_mirrored(w), dist::mirrored_divergence);
  s.broadcast(w, 0);
  s.verify_mirrored(w);
  for (std::size_t r = 0; r < w.size(); ++r) {
    BOOST_TEST((w[r].device() == s.devices()[r]));
    BOOST_TEST(w[r].to_vector() == std::vector<float>(6, 9.0f), boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(data_parallel_training_matches_one_device, M, dt::gpu_strategies) {
  dist::one_device_strategy<dist::cuda> one;
  const auto reference = train_linear(one, 25);
  auto s = M::make();
  const auto w = train_linear(s, 25);
  for (std::size_t k = 0; k < w.size(); ++k) BOOST_TEST(w[k] == reference[k], boost::test_tools::tolerance(1e-9));
}

BOOST_AUTO_TEST_CASE(reductions_are_bit_identical_run_to_run) {
  auto s = dt::peer_n<3>::make();
  auto once = [&] {
    auto out = s.run([](dist::replica auto& r) {
      auto v = dt::values_for<float>(r.replica_id(), 70001, dist::reduce_op::sum);
      r.all_reduce(dist::reduce_op::sum, v);
      return v;
    });
    return out[1];
  };
  const auto first = once();
  for (int i = 0; i < 5; ++i) BOOST_TEST(dt::bit_equal(once(), first));
}

// Gradients all-reduced as bfloat16 between GPU replicas (gradient_reduction::compression): narrowed
// and widened on the replica's stream (Thrust, CUDA's conversions), reduced in bfloat16 by the
// engine. With two replicas every one holds bfloat16(bfloat16(a) + bfloat16(b)) widened, which the
// CPU computes here with the library's bfloat16; blocking and overlapped alike. cuda_peer (logical
// replicas on cuda:0) always; NCCL where there are two GPUs (NCCL takes one rank per GPU).
BOOST_AUTO_TEST_CASE(gradients_all_reduced_as_bfloat16_on_gpu_replicas) {
  const std::vector<std::size_t> sizes = {5, 3000, 1, 700};
  auto check = [&](dist::mirrored_strategy<dist::cuda>& s, const char* engine) {
    for (const bool overlap : {false, true}) {
      auto models = s.mirror([&](auto& device) {
        device_gradients m;
        for (const auto n : sizes) {
          m.values.emplace_back(dist::shape{static_cast<std::int64_t>(n)}, device);
          m.gradients.emplace_back(dist::shape{static_cast<std::int64_t>(n)}, device);
        }
        return m;
      });
      // Each replica writes its own gradients in the step.
      s.run(
          [&](dist::replica auto& r, device_gradients& m) {
            std::size_t at = 0;
            for (auto& g : m.gradients) {
              std::vector<float> mine(static_cast<std::size_t>(g.size()));
              for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = device_gradient_value(r.replica_id(), at + i);
              g.copy_from_host(mine);
              at += mine.size();
            }
            const dist::gradient_reduction how{
                .bucket_bytes = 4096, .first_bucket_bytes = 64, .compression = dist::gradient_compression::bfloat16};
            if (overlap) {
              auto sync = r.overlap_gradients(how);
              sync.add(m);
              sync.wait();
            } else {
              r.all_reduce_gradients(m, how);
            }
          },
          models);
      for (int r = 0; r < 2; ++r) {
        std::size_t at = 0, wrong = 0;
        for (const auto& g : models[static_cast<std::size_t>(r)].gradients) {
          const auto got = g.to_vector();
          for (std::size_t i = 0; i < got.size(); ++i, ++at) {
            const auto want =
                dist::bfloat16(device_gradient_value(0, at)) + dist::bfloat16(device_gradient_value(1, at));
            wrong += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(static_cast<float>(want));
          }
        }
        BOOST_TEST(wrong == 0u, engine << (overlap ? ", overlapped" : ", blocking") << ", replica " << r);
      }
    }
  };
  dist::mirrored_strategy<dist::cuda> peer{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::cuda_peer};
  check(peer, "cuda_peer");
#if DISTRIBUTE_HAS_NCCL
  if (dist::cuda_device_count() >= 2) {
    auto devices = dist::all_cuda_devices();
    devices.resize(2);
    dist::mirrored_strategy<dist::cuda> nccl{devices, {}, dist::cuda_collective_engine::nccl};
    check(nccl, "NCCL");
  } else {
    BOOST_TEST_MESSAGE("NCCL's bfloat16 gradient all-reduce needs two GPUs; this machine has one");
  }
#endif
}

BOOST_AUTO_TEST_SUITE_END()

// The failure semantics every strategy shares (tests/core/failure_cases.hpp), for GPU replicas: on
// the cuda_peer kernels (logical replicas on cuda:0), and on NCCL (one replica per GPU, so the cases
// that need more replicas than this machine has GPUs say so and pass).
namespace distribute::test {

struct gpu_peer {
  static mirrored_strategy<cuda> make(int replicas, collective_options o = {}) {
    mirrored_strategy<cuda> s{cuda_replicas(replicas), o, cuda_collective_engine::cuda_peer};
    BOOST_REQUIRE(s.collective_engine() == cuda_collective_engine::cuda_peer);
    return s;
  }
  static int max_replicas() noexcept { return 8; }
  static one_device_strategy<cuda> one_device() { return one_device_strategy<cuda>{cuda{0}}; }
};

#if DISTRIBUTE_HAS_NCCL
struct gpu_nccl {
  static mirrored_strategy<cuda> make(int replicas, collective_options o = {}) {
    auto devices = all_cuda_devices();
    devices.resize(static_cast<std::size_t>(replicas));
    return mirrored_strategy<cuda>{devices, o, cuda_collective_engine::nccl};
  }
  static int max_replicas() { return cuda_device_count(); }
  static one_device_strategy<cuda> one_device() { return one_device_strategy<cuda>{cuda{0}}; }
};
using failure_makers = boost::mpl::list<gpu_peer, gpu_nccl>;
#else
using failure_makers = boost::mpl::list<gpu_peer>;
#endif

}  // namespace distribute::test

#include "../core/failure_cases.hpp"

BOOST_AUTO_TEST_SUITE(failure)

using distribute::test::failure_cases::check_usable;

#if DISTRIBUTE_HAS_NCCL
// Point-to-point over NCCL between two GPUs' replica threads: both send before receiving, host and
// device buffers, an empty message, and a message with the wrong tag named on both ends.
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(dt::at_least_two_gpus))
BOOST_AUTO_TEST_CASE(nccl_point_to_point_between_two_gpus) {
  auto devices = dist::all_cuda_devices();
  devices.resize(2);
  dist::comm::nccl_group group(devices, {.timeout = 5s});
  std::string errors[2];
  auto replica = [&](int me) {
    try {
      auto c = group.endpoint(me);
      const int other = 1 - me;
      const std::size_t n = std::size_t{3} << 20;
      std::vector<float> out(n, static_cast<float>(me + 1)), in(n);
      c.send(std::span<const float>(out), other, 1);
      out.assign(n, -1.0f);  // the send took a copy
      c.recv(std::span<float>(in), other, 1);
      if (in[n - 1] != static_cast<float>(other + 1)) errors[me] += "wrong host values; ";
      dist::detail::device_allocation dev(c.device().index(), 5 * sizeof(std::int32_t));
      const std::vector<std::int32_t> small(5, me);
      c.send(std::span<const std::int32_t>(small), other, 2);
      c.recv(std::span<std::int32_t>(static_cast<std::int32_t*>(dev.get()), 5), other, 2);
      std::vector<std::int32_t> back(5);
      dist::detail::cuda_check(cudaMemcpy(back.data(), dev.get(), 5 * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
                               "cudaMemcpy", c.device().index());
      if (back[4] != other) errors[me] += "wrong device values; ";
      std::vector<double> none;
      c.send(std::span<const double>(none), other, 3);
      c.recv(std::span<double>(none), other, 3);
      c.barrier();
    } catch (const std::exception& e) {
      errors[me] += e.what();
    }
  };
  std::thread t0(replica, 0), t1(replica, 1);
  t0.join();
  t1.join();
  BOOST_TEST(errors[0] == "");
  BOOST_TEST(errors[1] == "");
}
#endif

BOOST_AUTO_TEST_CASE(a_cuda_error_in_a_replica_is_a_clear_exception) {
  auto s = dt::peer_n<2>::make({.timeout = 60s});
  try {
    s.run([](auto& r) {
      if (r.replica_id() == 0) dist::cuda{dist::cuda_device_count() + 3}.make_current();
      r.barrier();
    });
    BOOST_FAIL("no exception");
  } catch (const dist::cuda_error& e) {
    BOOST_TEST(dt::contains(e.what(), "cudaSetDevice"), e.what());
  }
  check_usable(s);
}

BOOST_AUTO_TEST_SUITE_END()

#if DISTRIBUTE_HAS_MPI && DISTRIBUTE_HAS_NCCL
// One worker per process, one GPU per worker (node-local rank k on cuda:k). Run plainly it is a job of
// one worker; ctest also runs it under mpiexec with two workers where there are two GPUs.
BOOST_AUTO_TEST_SUITE(multi_worker)

using mw = dist::multi_worker_mirrored_strategy<dist::cuda, dist::comm::nccl>;

BOOST_AUTO_TEST_CASE(collectives_and_cross_replica_operations_span_the_job) {
  mw s{dist::multi_worker_cuda_options{.collectives = {.timeout = 60s}}};
  const int n = s.num_replicas_in_sync();
  BOOST_TEST(n == s.num_workers() * s.num_local_replicas());
  BOOST_TEST(s.first_replica_id() == s.worker_index());
  auto sums = s.run([](dist::replica auto& r) {
    auto t = dist::tensor<float, dist::cuda>::from_host(
        dist::shape{1000}, std::vector<float>(1000, static_cast<float>(r.replica_id() + 1)), r.device());
    r.all_reduce(dist::reduce_op::sum, t.values());
    std::vector<double> mean(3, static_cast<double>(r.replica_id()));
    r.all_reduce(dist::reduce_op::mean, mean);
    return std::pair{t.to_vector()[999], mean[2]};
  });
  BOOST_TEST(sums[0].first == static_cast<float>(n * (n + 1) / 2));
  BOOST_TEST(sums[0].second == (n - 1) / 2.0);

  const auto ids = s.values_from_function([](int id) { return id; });
  BOOST_TEST(ids[0] == s.first_replica_id());
  BOOST_TEST(s.reduce(dist::reduce_op::sum, ids) == n * (n - 1) / 2);
  std::vector<int> everyone(static_cast<std::size_t>(n));
  std::iota(everyone.begin(), everyone.end(), 0);
  BOOST_TEST(s.gather(ids) == everyone);

  std::vector<int> batch(10);
  std::iota(batch.begin(), batch.end(), 0);
  const auto mine = s.scatter(batch);
  BOOST_TEST(s.gather(mine) == batch);

  // Worker-dependent initial values: mirror makes them replica 0's everywhere.
  auto w = s.mirror([&](auto& d) {
    return dist::tensor<float, dist::cuda>::from_host(dist::shape{4},
                                                      std::vector<float>(4, static_cast<float>(s.worker_index())), d);
  });
  s.verify_mirrored(w);
  BOOST_TEST(w[0].to_vector() == std::vector<float>(4, 0.0f), boost::test_tools::per_element());
  s.run_on_primary([&](auto&, dist::tensor<float, dist::cuda>& t) { t.copy_from_host(std::vector<float>(4, 5.0f)); },
                   w);
  s.broadcast(w, n - 1);
  s.verify_mirrored(w);
  BOOST_TEST(w[0].to_vector() == std::vector<float>(4, 5.0f), boost::test_tools::per_element());

  // A dataset of global batches of 8 integers: each worker gets its replicas' shares of each batch.
  std::size_t seen = 0;
  for (auto&& batch : s.distribute(dist::data::range(8 * 3 * s.num_workers()).batch(8 * s.num_workers()))) {
    BOOST_TEST(batch.size() == 1u);
    seen += batch[0].size();
  }
  BOOST_TEST(seen == 24u);

  auto host_state = s.mirror([&](auto&) { return std::vector<double>(3, 1.0 + s.worker_index()); });
  s.verify_mirrored(host_state);
  BOOST_TEST(host_state[0] == std::vector<double>(3, 1.0), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_throwing_replica_leaves_a_single_worker_usable) {
  mw s{dist::multi_worker_cuda_options{.collectives = {.timeout = 60s}}};
  if (s.num_workers() > 1) return;  // several workers: a failed step ends the job by design
  BOOST_CHECK_THROW(s.run([](auto& r) {
    if (r.replica_id() == 0) throw std::runtime_error("replica 0 gave up");
  }),
                    std::runtime_error);
  auto v = s.run([](auto& r) { return r.all_reduce(dist::reduce_op::sum, 2.0f); });
  BOOST_TEST(v[0] == 2.0f);
}

// Last in the suite: with several workers a failed step ends the strategy's use on every worker.
// NCCL does not tell a rank that another process gave up: the failing worker's notice over MPI
// releases its partner's NCCL wait at once, long before the partner's own deadline.
BOOST_AUTO_TEST_CASE(a_failing_worker_releases_its_partners_at_once) {
  mw s{dist::multi_worker_cuda_options{.collectives = {.timeout = 120s}}};
  if (s.num_workers() < 2) return;  // needs a partner (ctest's gpu.multi_worker_2_processes)
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  bool aborted = false, own = false;
  try {
    s.run([&](dist::replica auto& r) {
      if (s.worker_index() == 1) throw std::runtime_error("worker 1 gave up on purpose");
      dist::tensor<float, dist::cuda> t(dist::shape{1024}, r.device());
      r.all_reduce(dist::reduce_op::sum, t.values());
    });
  } catch (const dist::collective_aborted& e) {
    aborted = true;
    what = e.what();
  } catch (const std::runtime_error& e) {
    own = true;
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  if (s.worker_index() == 1) {
    BOOST_TEST(own, what);
  } else {
    BOOST_TEST(aborted, what);
    BOOST_TEST(dt::contains(what, "worker 1 failed: worker 1 gave up on purpose"), what);
    BOOST_TEST((took < 30s),
               "released after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  }
  BOOST_CHECK_THROW(s.run([](auto&) {}), dist::collective_aborted);
}

BOOST_AUTO_TEST_SUITE_END()
#endif
