// multi_worker_mirrored_strategy<cpu, mpi> across the processes of the job, with workers holding
// different numbers of replicas (1, 2, 1, ...): the replicas' collectives (hierarchical), and the
// strategy's cross-replica operations.

#include "mpi_test_support.hpp"

#include <distribute/data.hpp>
#include <distribute/nn.hpp>
#include <distribute/optim/adam.hpp>

#include <boost/test/unit_test.hpp>

#include <memory>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dist = distribute;
using dist::reduce_op;
using strategy_type = dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi>;

static_assert(dist::strategy<strategy_type>);
static_assert(dist::replica<strategy_type::replica_type>);
static_assert(dist::communicator<dist::comm::hierarchical<dist::mpi>>);

namespace {

// Worker w holds 1 + w % 2 replicas, or `uniform` replicas each.
strategy_type& uneven() {
  static strategy_type s{{.local_replicas = 1 + dist::test::world_rank() % 2, .mpi = dist::test::test_mpi_options()}};
  return s;
}
// The same, with each of the two ways a worker's replicas take part in a cross-worker all-reduce.
strategy_type& uneven_with(dist::comm::local_reduction how) {
  auto make = [](dist::comm::local_reduction h) {
    return std::make_unique<strategy_type>(
        dist::multi_worker_options{.local_replicas = 1 + dist::test::world_rank() % 2,
                                   .mpi = dist::test::test_mpi_options(),
                                   .local_reduction = h});
  };
  // Made in the same order on every worker.
  static const auto first = make(dist::comm::local_reduction::first_replica);
  static const auto parallel = make(dist::comm::local_reduction::parallel);
  return how == dist::comm::local_reduction::first_replica ? *first : *parallel;
}
constexpr dist::comm::local_reduction both_local_reductions[] = {dist::comm::local_reduction::first_replica,
                                                                 dist::comm::local_reduction::parallel};
const char* name_of(dist::comm::local_reduction how) {
  return how == dist::comm::local_reduction::first_replica ? "first_replica" : "parallel";
}

strategy_type& two_each() {
  static strategy_type s{{.local_replicas = 2, .mpi = dist::test::test_mpi_options()}};
  return s;
}

int expected_total(int workers) {
  int total = 0;
  for (int w = 0; w < workers; ++w) total += 1 + w % 2;
  return total;
}

template <class T>
struct flat_model {
  using scalar_type = T;
  std::vector<std::vector<T>> values, grads;
  explicit flat_model(std::vector<std::size_t> sizes) {
    for (auto n : sizes) {
      values.emplace_back(n, T(0));
      grads.emplace_back(n, T(0));
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t i = 0; i < values.size(); ++i) f(std::span<T>(values[i]), std::span<T>(grads[i]));
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(strategy)

BOOST_AUTO_TEST_CASE(replicas_are_numbered_across_workers) {
  auto& s = uneven();
  BOOST_TEST(s.num_workers() >= 2);
  BOOST_TEST(s.worker_index() == dist::test::world_rank());
  BOOST_TEST(s.is_chief() == (s.worker_index() == 0));
  BOOST_TEST(s.num_local_replicas() == 1 + s.worker_index() % 2);
  BOOST_TEST(s.num_replicas_in_sync() == expected_total(s.num_workers()));
  BOOST_TEST(s.first_replica_id() == expected_total(s.worker_index()));
  BOOST_TEST(s.devices().size() == static_cast<std::size_t>(s.num_local_replicas()));
  // Replica functions run on threads of their own: they return what the test checks.
  const auto ids = s.run([](strategy_type::replica_type& r) {
    return std::vector<int>{r.replica_id(), r.local_replica_id(), r.worker_index(), r.num_replicas()};
  });
  for (std::size_t l = 0; l < ids.size(); ++l) {
    BOOST_TEST(ids[l][3] == s.num_replicas_in_sync());
    BOOST_TEST(ids[l][0] == s.first_replica_id() + static_cast<int>(l));
    BOOST_TEST(ids[l][1] == static_cast<int>(l));
    BOOST_TEST(ids[l][2] == s.worker_index());
  }
  std::vector<int> all(static_cast<std::size_t>(s.num_replicas_in_sync()));
  std::iota(all.begin(), all.end(), 0);
  BOOST_TEST(s.gather(s.values_from_function([](int id) { return id; })) == all, boost::test_tools::per_element());
}

// The last worker reaches the all-reduce 60 ms late: every other worker's replicas wait for it
// there, so their mean collective time is above 40 ms; the late worker's shows as compute.
BOOST_AUTO_TEST_CASE(timings_count_the_wait_for_a_late_worker_as_collective_time) {
  auto& s = uneven();
  const bool late = s.worker_index() == s.num_workers() - 1;
  s.run([](strategy_type::replica_type& r) { r.barrier(); });  // every worker starts the step together
  const auto before = s.timings();
  s.run([&](strategy_type::replica_type& r) {
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(60));
    std::vector<float> g(4096, 1.0f);
    r.all_reduce(dist::reduce_op::sum, g);
  });
  const dist::step_timings t = s.timings() - before;
  BOOST_TEST(t.runs == 1);
  if (late) BOOST_TEST(t.compute >= 0.060);
  else BOOST_TEST(t.collective >= 0.040, "worker " << s.worker_index() << ": " << t.collective << " s in collectives");
  BOOST_TEST(t.compute + t.collective <= t.wall + 1e-3);
}

BOOST_AUTO_TEST_CASE(replica_engines_share_the_cores_without_oversubscribing) {
  // Workers on one machine that nothing binds divide its cores among every replica of the job; a
  // bound worker divides its own. Either way no worker's engines ask for more threads than it has.
  auto& s = uneven();
  const int mine = static_cast<int>(std::max(1u, dist::detail::usable_hardware_threads()));
  const auto threads = s.run([](strategy_type::replica_type& r) {
    return std::vector<std::uintptr_t>{static_cast<std::uintptr_t>(r.engine().threads()),
                                       reinterpret_cast<std::uintptr_t>(&r.engine())};
  });
  int sum = 0;
  for (const auto& t : threads) {
    BOOST_TEST(t[0] >= 1u);
    sum += static_cast<int>(t[0]);
  }
  BOOST_TEST(sum <= std::max(mine, s.num_local_replicas()),
             "worker " << s.worker_index() << ": engines with " << sum << " threads in all on " << mine << " cores");
  if (threads.size() == 2) BOOST_TEST(threads[0][1] != threads[1][1]);  // each replica its own engine
  s.run_on_primary([&](auto& r) { BOOST_TEST(r.engine().threads() <= mine); });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(replica_all_reduce_gives_every_op, T, dist::test::element_types) {
  for (const auto how : both_local_reductions) {
    auto& s = uneven_with(how);
    const int n = s.num_replicas_in_sync();
    for (const auto op : dist::test::all_ops) {
      const auto wrong = s.run([&](dist::replica auto& r) {
        std::size_t bad = 0;
        for (const std::size_t size : {std::size_t{1}, std::size_t{5}, std::size_t{4099}}) {
          std::vector<T> a(size), b(size / 2 + 1);
          for (std::size_t i = 0; i < a.size(); ++i) a[i] = dist::test::value_for<T>(r.replica_id(), i, op);
          for (std::size_t i = 0; i < b.size(); ++i) b[i] = dist::test::value_for<T>(r.replica_id(), size + i, op);
          r.all_reduce(op, a);
          for (std::size_t i = 0; i < a.size(); ++i) bad += a[i] != dist::test::expected_for<T>(n, i, op);
          for (std::size_t i = 0; i < a.size(); ++i) a[i] = dist::test::value_for<T>(r.replica_id(), i, op);
          r.all_reduce(op, a, b);  // fused
          for (std::size_t i = 0; i < a.size(); ++i) bad += a[i] != dist::test::expected_for<T>(n, i, op);
          for (std::size_t i = 0; i < b.size(); ++i) bad += b[i] != dist::test::expected_for<T>(n, size + i, op);
        }
        const T one = r.all_reduce(op, dist::test::value_for<T>(r.replica_id(), 0, op));
        bad += one != dist::test::expected_for<T>(n, 0, op);
        return bad;
      });
      for (auto bad : wrong)
        BOOST_TEST(bad == 0u, dist::to_string(op) << " " << dist::dtype_of<T> << ", local reduction " << name_of(how));
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(replica_gather_broadcast_scatter, T, dist::test::element_types) {
  auto& s = uneven();
  const int n = s.num_replicas_in_sync();
  const auto wrong = s.run([&](dist::replica auto& r) {
    std::size_t bad = 0;
    const auto ids = r.all_gather(static_cast<T>(r.replica_id()));
    for (int q = 0; q < n; ++q) bad += ids[static_cast<std::size_t>(q)] != static_cast<T>(q);
    std::vector<T> in(3, static_cast<T>(r.replica_id() * 10)), out(3 * static_cast<std::size_t>(n));
    r.all_gather(in, out);
    for (std::size_t i = 0; i < out.size(); ++i) bad += out[i] != static_cast<T>(static_cast<int>(i / 3) * 10);
    for (int root = 0; root < n; ++root) {
      std::vector<T> buf(257, static_cast<T>(r.replica_id() == root ? 7 + root : -1));
      r.broadcast(buf, root);
      bad += static_cast<std::size_t>(
          std::count_if(buf.begin(), buf.end(), [&](T x) { return x != static_cast<T>(7 + root); }));
    }
    bad += r.broadcast(static_cast<T>(r.replica_id()), n - 1) != static_cast<T>(n - 1);
    std::vector<T> blocks(2 * static_cast<std::size_t>(n)), mine(2);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      blocks[i] = dist::test::value_for<T>(r.replica_id(), i, reduce_op::sum);
    r.reduce_scatter(reduce_op::sum, blocks, mine);
    for (std::size_t i = 0; i < 2; ++i)
      bad +=
          mine[i] != dist::test::expected_for<T>(n, 2 * static_cast<std::size_t>(r.replica_id()) + i, reduce_op::sum);
    for (int i = 0; i < 3; ++i) r.barrier();
    return bad;
  });
  for (auto bad : wrong) BOOST_TEST(bad == 0u, dist::dtype_of<T>);
}

BOOST_AUTO_TEST_CASE(gradients_are_summed_in_fused_buckets) {
  for (const auto how : both_local_reductions) {
    auto& s = uneven_with(how);
    const int n = s.num_replicas_in_sync();
    const std::vector<std::size_t> sizes{1000, 10, 3000, 0, 500};
    auto models = s.mirror([&](auto&) { return flat_model<float>(sizes); });
    const auto counts = s.run(
        [&](dist::replica auto& r, flat_model<float>& m) {
          for (std::size_t p = 0; p < m.grads.size(); ++p)
            for (std::size_t i = 0; i < m.grads[p].size(); ++i)
              m.grads[p][i] =
                  static_cast<float>((r.replica_id() + 1) * static_cast<int>(p + 1)) + static_cast<float>(i % 7);
          return r.all_reduce_gradients(m, {.bucket_bytes = 16000});
        },
        models);
    for (auto c : counts) BOOST_TEST(c == 2u);
    const float ids = static_cast<float>(n * (n + 1) / 2);
    std::size_t wrong = 0;
    for (const auto& m : models)
      for (std::size_t p = 0; p < sizes.size(); ++p)
        for (std::size_t i = 0; i < sizes[p]; ++i)
          wrong += m.grads[p][i] != ids * static_cast<float>(p + 1) + static_cast<float>(n) * static_cast<float>(i % 7);
    BOOST_TEST(wrong == 0u, "local reduction " << name_of(how));
  }
}

BOOST_AUTO_TEST_CASE(reduce_and_gather_span_every_worker) {
  auto& s = uneven();
  const int n = s.num_replicas_in_sync();
  const auto ids = s.values_from_function([](int id) { return static_cast<double>(id + 1); });
  BOOST_TEST(s.reduce(reduce_op::sum, ids) == n * (n + 1) / 2.0);
  BOOST_TEST(s.reduce(reduce_op::mean, ids) == (n + 1) / 2.0);
  BOOST_TEST(s.reduce(reduce_op::min, ids) == 1.0);
  BOOST_TEST(s.reduce(reduce_op::max, ids) == static_cast<double>(n));
  const auto ints = s.values_from_function([](int id) { return static_cast<unsigned>(id + 1); });
  BOOST_TEST(s.reduce(reduce_op::prod, ints) == [&] {
    unsigned p = 1;
    for (int i = 1; i <= n; ++i) p *= static_cast<unsigned>(i);
    return p;
  }());
  // Sequences: element-wise.
  const auto seqs = s.values_from_function([](int id) { return std::vector<int>{id, 2 * id}; });
  const auto sums = s.reduce(reduce_op::sum, seqs);
  BOOST_TEST(sums == (std::vector<int>{n * (n - 1) / 2, n * (n - 1)}), boost::test_tools::per_element());
  // Sequences of different lengths, concatenated in replica order.
  const auto ragged = s.values_from_function(
      [](int id) { return std::vector<float>(static_cast<std::size_t>(id), static_cast<float>(id)); });
  std::vector<float> want;
  for (int q = 0; q < n; ++q) want.insert(want.end(), static_cast<std::size_t>(q), static_cast<float>(q));
  BOOST_TEST(s.gather(ragged) == want, boost::test_tools::per_element());
  BOOST_TEST(s.local_results(ids).size() == static_cast<std::size_t>(s.num_local_replicas()));
}

BOOST_AUTO_TEST_CASE(scatter_gives_each_replica_its_share_of_the_global_batch) {
  auto& s = uneven();
  const int n = s.num_replicas_in_sync();
  std::vector<int> global(static_cast<std::size_t>(3 * n + 1) * 2);  // 3n + 1 examples of 2 elements
  std::iota(global.begin(), global.end(), 0);
  const auto parts = s.scatter(global, 2);
  // Put back together across workers, the shares are the global batch, in order.
  BOOST_TEST(s.gather(parts) == global, boost::test_tools::per_element());
  for (std::size_t l = 0; l < parts.size(); ++l) {
    const int id = s.first_replica_id() + static_cast<int>(l);
    BOOST_TEST(parts[l].size() == (id == 0 ? 8u : 6u));
  }
}

BOOST_AUTO_TEST_CASE(mirror_and_broadcast_copy_the_chiefs_state) {
  auto& s = uneven();
  const int n = s.num_replicas_in_sync();
  // A factory that differs from worker to worker: mirror still gives every copy the chief's.
  auto values =
      s.mirror([&](auto& device) { return std::vector<double>(5, s.worker_index() * 100.0 + device.index()); });
  for (const auto& v : values) BOOST_TEST(v == std::vector<double>(5, 0.0), boost::test_tools::per_element());
  s.verify_mirrored(values);
  // An update on the last replica only, then a broadcast from it.
  const bool owner = s.first_replica_id() + s.num_local_replicas() == n;
  if (owner) values[values.size() - 1][2] = 42.0;
  BOOST_CHECK_THROW(s.verify_mirrored(values), dist::mirrored_divergence);
  s.broadcast(values, n - 1);
  for (const auto& v : values) BOOST_TEST(v[2] == 42.0);
  s.verify_mirrored(values);
  // Trivially copyable values and objects with save/load travel too.
  auto counters = s.mirror([&](auto&) { return s.worker_index() + 1; });
  for (int c : counters) BOOST_TEST(c == 1);
  auto opts = s.mirror([&](auto&) { return dist::optim::adam<float>{{.lr = 1e-3}}; });
  s.verify_mirrored(opts);
}

BOOST_AUTO_TEST_CASE(mirror_broadcast_and_verify_mirrored_cover_running_statistics) {
  namespace nn = dist::nn;
  auto& s = uneven();
  const int n = s.num_replicas_in_sync();
  // A batch of 2 examples of 2 channels whose values depend on `k`.
  auto batch = [](int k) {
    std::vector<float> v(2 * 2 * 3 * 3);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>((1 + k) * std::sin(0.37 * static_cast<double>(i) + k));
    return dist::tensor<float>{dist::shape::nchw(2, 2, 3, 3), v};
  };
  // Plain batch norm that saw worker-dependent data before `mirror`: running statistics that differ
  // from worker to worker, and parameters that do not.
  auto make = [&](int worker) {
    nn::batch_norm<float> bn{{.channels = 2}, 17};
    auto r = nn::local();
    (void)bn.forward(r, batch(100 + worker));
    return bn;
  };
  auto norms = s.mirror([&](auto&) { return make(s.worker_index()); });
  const auto chiefs = make(0);
  for (const auto& bn : norms) {
    BOOST_TEST(bn.running_mean() == chiefs.running_mean(), boost::test_tools::per_element());
    BOOST_TEST(bn.running_var() == chiefs.running_var(), boost::test_tools::per_element());
  }
  s.verify_mirrored(norms);
  // Every replica normalises its own batch in training mode: its running statistics move its way.
  s.run([&](dist::replica auto& r, nn::batch_norm<float>& bn) { (void)bn.forward(r, batch(r.replica_id())); }, norms);
  try {
    s.verify_mirrored(norms);
    BOOST_FAIL("verify_mirrored missed diverged running statistics");
  } catch (const dist::mirrored_divergence& e) {
    std::string differ;
    for (int q = 1; q < n; ++q) differ += (differ.empty() ? "" : ", ") + std::to_string(q);
    const std::string what = e.what();
    BOOST_TEST(what.find("on replica(s) " + differ +
                         "; buffers (such as batch norm's running statistics) differ on "
                         "replica(s) " +
                         differ) != std::string::npos,
               what);
    BOOST_TEST(what.find("parameters differ") == std::string::npos, what);
  }
  // broadcast sends the buffers with the parameters, to every worker.
  s.broadcast(norms, n - 1);
  s.verify_mirrored(norms);
  auto last = make(0);
  auto r = nn::local();
  (void)last.forward(r, batch(n - 1));
  for (const auto& bn : norms)
    BOOST_TEST(bn.running_mean() == last.running_mean(), boost::test_tools::tolerance(1e-12)
                                                             << boost::test_tools::per_element());
}

// Workers of 2^k replicas each sum exactly what one process of all those replicas sums: every stage
// combines in the same tree over replica order (comm/detail/reduce_kernel.hpp), whichever way a
// worker's replicas take part (and above the window's small-buffer size as below it).
BOOST_AUTO_TEST_CASE(workers_of_two_replicas_sum_the_bits_of_one_process) {
  for (const auto how : both_local_reductions) {
    auto make = [](dist::comm::local_reduction h) {
      return std::make_unique<strategy_type>(
          dist::multi_worker_options{.local_replicas = 2, .mpi = dist::test::test_mpi_options(), .local_reduction = h});
    };
    static const auto first = make(dist::comm::local_reduction::first_replica);
    static const auto parallel = make(dist::comm::local_reduction::parallel);
    auto& s = how == dist::comm::local_reduction::first_replica ? *first : *parallel;
    const int n = s.num_replicas_in_sync();
    for (const std::size_t size : {std::size_t{1000}, std::size_t{300000}}) {
      auto input = [&](int replica) {
        std::vector<float> v(size);
        std::uint32_t x = 12345u + static_cast<std::uint32_t>(replica) * 7919u;
        for (auto& e : v) {
          x = x * 1664525u + 1013904223u;
          e = static_cast<float>(x >> 8) * 1e-5f - 83.0f;  // values whose sums round
        }
        return v;
      };
      // The tree over replicas [lo, hi): split at the largest power of two below the count.
      auto tree = [&](auto&& self, int lo, int hi) -> std::vector<float> {
        if (hi - lo == 1) return input(lo);
        int half = 1;
        while (half * 2 < hi - lo) half *= 2;
        auto left = self(self, lo, lo + half);
        const auto right = self(self, lo + half, hi);
        for (std::size_t i = 0; i < left.size(); ++i) left[i] += right[i];
        return left;
      };
      const auto want = tree(tree, 0, n);
      const auto same = s.run([&](dist::replica auto& r) {
        auto v = input(r.replica_id());
        r.all_reduce(dist::reduce_op::sum, v);
        return static_cast<int>(std::memcmp(v.data(), want.data(), v.size() * sizeof(float)) == 0);
      });
      for (int ok : same) BOOST_TEST(ok == 1, name_of(how) << ", " << size << " floats: not the bits of one process");
    }
  }
}

BOOST_AUTO_TEST_CASE(distribute_shards_the_global_batch_over_workers) {
  auto& s = two_each();
  const auto workers = static_cast<std::size_t>(s.num_workers());
  const std::size_t global = 4 * workers, examples = 3 * global + 2;
  dist::data::tensor<float> t{{examples, 1}, {}};
  for (std::size_t i = 0; i < examples; ++i) t.values.push_back(static_cast<float>(i));
  auto ds = dist::data::from_tensor_slices(std::move(t), std::vector<std::int32_t>(examples, 0)).batch(global);
  auto inputs = s.distribute(ds, {.policy = dist::data::shard_policy::data});
  std::vector<float> seen;
  std::size_t steps = 0;
  for (auto& per : inputs) {
    ++steps;
    BOOST_TEST_REQUIRE(per.size() == 2u);
    for (auto& part : per)
      for (std::size_t i = 0; i < part.size(); ++i) seen.push_back(part[i][0]);
  }
  BOOST_TEST(steps == 4u);  // every worker the same count, the last batch short
  // Across workers, every example exactly once.
  std::vector<std::uint64_t> counts(workers);
  const std::uint64_t mine = seen.size();
  s.communicator().all_gather(std::span<const std::uint64_t>(&mine, 1), std::span<std::uint64_t>(counts));
  std::vector<std::size_t> sizes(counts.begin(), counts.end());
  std::vector<float> all(std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}));
  s.communicator().all_gather(std::span<const float>(seen), std::span<float>(all), std::span<const std::size_t>(sizes));
  std::sort(all.begin(), all.end());
  std::vector<float> want(examples);
  std::iota(want.begin(), want.end(), 0.0f);
  BOOST_TEST(all == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(distribute_gives_uneven_workers_one_share_per_replica) {
  auto& s = uneven();
  const auto n = static_cast<std::size_t>(s.num_replicas_in_sync());
  const std::size_t global = 2 * n, examples = 3 * global + 1;
  dist::data::tensor<float> t{{examples, 1}, {}};
  for (std::size_t i = 0; i < examples; ++i) t.values.push_back(static_cast<float>(i));
  auto ds = dist::data::from_tensor_slices(std::move(t), std::vector<std::int32_t>(examples, 0)).batch(global);
  std::size_t steps = 0;
  for (auto& per : s.distribute(ds)) {
    BOOST_TEST_REQUIRE(per.size() == static_cast<std::size_t>(s.num_local_replicas()));
    std::vector<float> step_values;
    for (auto& part : per)
      for (std::size_t i = 0; i < part.size(); ++i) step_values.push_back(part[i][0]);
    // Replica q of the job holds examples 2q, 2q + 1 of the step's global batch (full steps).
    if (steps < 3)
      for (std::size_t i = 0; i < step_values.size(); ++i)
        BOOST_TEST(step_values[i] ==
                   static_cast<float>(steps * global + 2 * static_cast<std::size_t>(s.first_replica_id()) + i));
    ++steps;
  }
  BOOST_TEST(steps == 4u);  // the same on every worker: the short last step gives empty shares
  BOOST_CHECK_THROW(s.distribute(ds, {.policy = dist::data::shard_policy::file}), std::invalid_argument);
  BOOST_CHECK_THROW(s.distribute_from_function([&](const dist::data::input_context&) { return ds; }),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
