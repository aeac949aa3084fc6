// Correctness of every collective, op and element type, through the replica context of the mirrored
// strategy (shared-memory engine) and of one device (local engine).

#include "test_support.hpp"

#include <distribute/comm/detail/peer_reduction.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <span>
#include <vector>

namespace dist = distribute;
using dist::test::all_ops;
using dist::test::bit_equal;
using dist::test::serial_reduce;
using dist::test::values_for;

namespace {

constexpr int replica_counts[] = {1, 2, 3, 4, 8};
// Zero, smaller than the replica count, not divisible by it, one chunk plus a bit, many chunks.
constexpr std::size_t sizes[] = {0, 1, 5, 17, 1000, 4099, 70001};

template <class T>
void check_all_reduce(dist::mirrored_strategy<>& s, dist::reduce_op op, std::size_t n) {
  const int replicas = s.num_replicas_in_sync();
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < replicas; ++r) inputs.push_back(values_for<T>(r, n, op));
  const auto expected = serial_reduce(op, inputs);
  auto data = s.values_from_function([&](int r) { return inputs[static_cast<std::size_t>(r)]; });
  s.run([&](dist::replica auto& r, std::vector<T>& mine) { r.all_reduce(op, mine); }, data);
  for (int r = 0; r < replicas; ++r)
    BOOST_TEST_REQUIRE(bit_equal(data[static_cast<std::size_t>(r)], expected),
                       "all_reduce(" << dist::to_string(op) << ") of " << n << " elements, replica " << r << " of "
                                     << replicas);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(collectives)

// The GPU replicas' own all-reduce (comm/cuda_peer.cuh) modelled on the CPU with its own slice split
// and combine order: sub-spans of a larger buffer at element offsets that break every alignment,
// several segments flattened, 1 to 8 replicas. Each replica reduces its slice, every slice is written
// to every copy, and the result must be the CPU engine's bits.
template <class T>
std::vector<std::vector<T>> modelled_peer_all_reduce(dist::reduce_op op, const std::vector<std::vector<T>>& inputs,
                                                     const std::vector<std::size_t>& segment_sizes) {
  namespace cd = dist::comm::detail;
  const int n = static_cast<int>(inputs.size());
  const std::size_t total = inputs.front().size();
  std::vector<std::vector<T>> out = inputs;
  std::size_t covered = 0;
  for (int rank = 0; rank < n; ++rank) {
    const auto [lo, hi] = cd::slice_of(total, rank, n);
    BOOST_TEST_REQUIRE(lo == covered, "slice of replica " << rank << " of " << n << " starts at " << lo);
    BOOST_TEST_REQUIRE((lo % cd::peer_slice_unit == 0 || lo == total));
    covered = std::max(covered, hi);
    // Segment by segment, as the kernel launches go.
    std::size_t offset = 0;
    for (std::size_t s = 0; s < segment_sizes.size() && offset < hi; offset += segment_sizes[s], ++s) {
      const std::size_t b = std::max(lo, offset), e = std::min(hi, offset + segment_sizes[s]);
      for (std::size_t i = b; i < e; ++i) {
        T acc = cd::tree_combine<T>([&](int r) { return inputs[static_cast<std::size_t>(r)][i]; }, n,
                                    [&](T x, T y) { return dist::detail::combine(op, x, y); });
        acc = dist::detail::finish(op, acc, n);
        for (auto& copy : out) copy[i] = acc;
      }
    }
  }
  BOOST_TEST_REQUIRE(covered == total);
  return out;
}

BOOST_AUTO_TEST_CASE(the_gpu_replicas_reduction_is_the_cpu_engines_tree) {
  for (const int replicas : {1, 2, 3, 4, 5, 7, 8}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{65539}}) {
      for (const auto op : {dist::reduce_op::sum, dist::reduce_op::mean}) {
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < replicas; ++r) inputs.push_back(values_for<float>(r, n, op));
        const auto expected = serial_reduce(op, inputs);
        // One segment, and the same elements as three uneven segments (a fused gradient buffer).
        for (const auto& segments : {std::vector<std::size_t>{n}, std::vector<std::size_t>{n / 3, n / 2, n - n / 3 - n / 2}}) {
          const auto got = modelled_peer_all_reduce(op, inputs, segments);
          for (int r = 0; r < replicas; ++r)
            BOOST_TEST_REQUIRE(bit_equal(got[static_cast<std::size_t>(r)], expected),
                               replicas << " replicas, " << n << " elements, " << dist::to_string(op) << ", "
                                        << segments.size() << " segment(s)");
        }
      }
    }
  }
  // Why the order matters: at four replicas a left-to-right fold gives other bits than the tree for
  // some of these values, so a kernel that folded would fail the model above.
  std::vector<std::vector<float>> four;
  for (int r = 0; r < 4; ++r) four.push_back(values_for<float>(r, 1000, dist::reduce_op::sum));
  const auto tree = serial_reduce(dist::reduce_op::sum, four);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 1000; ++i) differ += ((four[0][i] + four[1][i]) + four[2][i]) + four[3][i] != tree[i];
  BOOST_TEST(differ > 0u);
}

BOOST_AUTO_TEST_CASE(slices_of_the_gpu_replicas_partition_the_buffers_in_aligned_units) {
  namespace cd = dist::comm::detail;
  for (const int n : {1, 2, 3, 4, 7, 32})
    for (const std::size_t total : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{257},
                                    std::size_t{1000}, std::size_t{65539}, std::size_t{5'000'003}}) {
      std::size_t next = 0;
      for (int r = 0; r < n; ++r) {
        const auto s = cd::slice_of(total, r, n);
        BOOST_TEST_REQUIRE(s.begin == next);
        BOOST_TEST_REQUIRE(s.begin <= s.end);
        BOOST_TEST_REQUIRE((s.begin % cd::peer_slice_unit == 0 || s.begin == total));
        next = s.end;
      }
      BOOST_TEST_REQUIRE(next == total, n << " replicas, " << total << " elements");
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(all_reduce_every_op_count_and_size, T, dist::test::element_types) {
  for (int replicas : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (auto op : all_ops)
      for (auto n : sizes) check_all_reduce<T>(s, op, n);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(all_reduce_is_bit_identical_across_runs, T, dist::test::element_types) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  const std::size_t n = 10007;
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < 4; ++r) inputs.push_back(values_for<T>(r, n, dist::reduce_op::sum, 11));
  std::vector<T> first;
  for (int run = 0; run < 100; ++run) {
    auto data = s.values_from_function([&](int r) { return inputs[static_cast<std::size_t>(r)]; });
    s.run([](auto& r, std::vector<T>& mine) { r.all_reduce(dist::reduce_op::sum, mine); }, data);
    if (run == 0) first = data[0];
    for (const auto& v : data) BOOST_TEST_REQUIRE(bit_equal(v, first), "run " << run);
  }
  BOOST_TEST(bit_equal(first, serial_reduce(dist::reduce_op::sum, inputs)));
}

BOOST_AUTO_TEST_CASE(fused_buffers_reduce_as_one_collective) {
  // Buffers of different lengths, one of them empty, reduced in one call: the same result as
  // reducing each alone.
  const std::vector<std::size_t> lengths = {3, 0, 1000, 17, 4096};
  for (int replicas : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (auto op : all_ops) {
      auto bufs = s.values_from_function([&](int r) {
        std::vector<std::vector<double>> b;
        for (std::size_t i = 0; i < lengths.size(); ++i) b.push_back(values_for<double>(r, lengths[i], op, 100 + static_cast<std::uint32_t>(i)));
        return b;
      });
      auto expected_of = [&](std::size_t i) {
        std::vector<std::vector<double>> in;
        for (int r = 0; r < replicas; ++r) in.push_back(bufs[static_cast<std::size_t>(r)][i]);
        return serial_reduce(op, in);
      };
      std::vector<std::vector<double>> expected;
      for (std::size_t i = 0; i < lengths.size(); ++i) expected.push_back(expected_of(i));
      s.run([&](auto& r, std::vector<std::vector<double>>& mine) { r.all_reduce(op, mine); }, bufs);
      for (const auto& b : bufs)
        for (std::size_t i = 0; i < lengths.size(); ++i) BOOST_TEST_REQUIRE(bit_equal(b[i], expected[i]));
    }
  }
}

BOOST_AUTO_TEST_CASE(variadic_buffers_and_scalars) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto out = s.run([](auto& r) {
    std::vector<float> a(5, 1.0f);
    std::array<float, 2> b{2.0f, float(r.replica_id())};
    r.all_reduce(dist::reduce_op::sum, a, b);
    const float m = r.all_reduce(dist::reduce_op::max, float(r.replica_id()));
    const auto i = r.all_reduce(dist::reduce_op::sum, std::int64_t{r.replica_id() + 1});
    return std::vector<double>{a[4], b[0], b[1], m, double(i)};
  });
  for (const auto& v : out) BOOST_TEST(v == (std::vector<double>{3, 6, 3, 2, 6}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(integer_types_map_by_width) {
  // `long` and `long long` are both 64-bit here, only one of them is std::int64_t; both must work.
  static_assert(dist::dtype_of<long long> == dist::dtype::int64);
  static_assert(dist::dtype_of<long> == dist::dtype::int64);
  static_assert(dist::dtype_of<int> == dist::dtype::int32);
  static_assert(!dist::element<unsigned>);
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto out = s.run([](auto& r) {
    std::vector<long long> v{1LL << 40, r.replica_id()};
    r.all_reduce(dist::reduce_op::sum, v);
    return v;
  });
  BOOST_TEST(out[1] == (std::vector<long long>{1LL << 41, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(all_gather_orders_blocks_by_replica, T, dist::test::element_types) {
  for (int replicas : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{33}}) {
      auto out = s.run([&](auto& r) {
        const auto mine = values_for<T>(r.replica_id(), n, dist::reduce_op::sum);
        std::vector<T> all(n * static_cast<std::size_t>(r.num_replicas()));
        r.all_gather(mine, all);
        return all;
      });
      std::vector<T> expected;
      for (int r = 0; r < replicas; ++r) {
        const auto v = values_for<T>(r, n, dist::reduce_op::sum);
        expected.insert(expected.end(), v.begin(), v.end());
      }
      for (const auto& v : out) BOOST_TEST_REQUIRE(bit_equal(v, expected));
    }
  }
}

BOOST_AUTO_TEST_CASE(all_gather_of_scalars) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  auto out = s.run([](auto& r) { return r.all_gather(10 * r.replica_id()); });
  for (const auto& v : out) BOOST_TEST(v == (std::vector<int>{0, 10, 20, 30}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_scatter_gives_each_replica_its_reduced_block, T, dist::test::element_types) {
  for (int replicas : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (auto op : all_ops) {
      const std::size_t block = 9;
      const std::size_t whole = block * static_cast<std::size_t>(replicas);
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < replicas; ++r) inputs.push_back(values_for<T>(r, whole, op));
      const auto reduced = serial_reduce(op, inputs);
      auto out = s.run([&](auto& r) {
        std::vector<T> mine(block);
        r.reduce_scatter(op, inputs[static_cast<std::size_t>(r.replica_id())], mine);
        return mine;
      });
      for (int r = 0; r < replicas; ++r) {
        const std::vector<T> expected(reduced.begin() + r * static_cast<std::ptrdiff_t>(block),
                                      reduced.begin() + (r + 1) * static_cast<std::ptrdiff_t>(block));
        BOOST_TEST_REQUIRE(bit_equal(out[static_cast<std::size_t>(r)], expected));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(broadcast_from_every_root, T, dist::test::element_types) {
  for (int replicas : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (int root = 0; root < replicas; ++root) {
      auto out = s.run([&](auto& r) {
        auto mine = values_for<T>(r.replica_id(), 1001, dist::reduce_op::sum);
        r.broadcast(mine, root);
        const T scalar = r.broadcast(static_cast<T>(r.replica_id()), root);
        return std::pair{mine, scalar};
      });
      for (const auto& [v, scalar] : out) {
        BOOST_TEST_REQUIRE(bit_equal(v, values_for<T>(root, 1001, dist::reduce_op::sum)));
        BOOST_TEST_REQUIRE(scalar == static_cast<T>(root));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(barrier_orders_writes_before_reads) {
  // Every replica writes its slot, meets the others, then must see every slot written.
  for (int replicas : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (int round = 0; round < 50; ++round) {
      std::vector<std::atomic<int>> slots(static_cast<std::size_t>(replicas));
      auto seen = s.run([&](auto& r) {
        slots[static_cast<std::size_t>(r.replica_id())].store(round + 1, std::memory_order_relaxed);
        r.barrier();
        int count = 0;
        for (auto& x : slots) count += x.load(std::memory_order_relaxed) == round + 1;
        return count;
      });
      for (int c : seen) BOOST_TEST_REQUIRE(c == replicas);
    }
  }
}

BOOST_AUTO_TEST_CASE(many_collectives_in_one_step) {
  // Alternating kinds keeps both description slots (even and odd collectives) in use.
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  auto out = s.run([](auto& r) {
    long total = 0;
    for (int i = 0; i < 2000; ++i) {
      total += r.all_reduce(dist::reduce_op::sum, r.replica_id() + i);
      if (i % 3 == 0) r.barrier();
      if (i % 5 == 0) total += r.broadcast(i, i % r.num_replicas());
    }
    return total;
  });
  long expected = 0;
  for (int i = 0; i < 2000; ++i) expected += 6 + 4 * i + (i % 5 == 0 ? i : 0);
  for (long v : out) BOOST_TEST(v == expected);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(local_communicator_is_the_identity, T, dist::test::element_types) {
  dist::one_device_strategy<> s;
  for (auto op : all_ops) {
    const auto in = values_for<T>(0, 100, op);
    auto out = s.run([&](auto& r) {
      auto v = in;
      r.all_reduce(op, v);
      std::vector<T> gathered(v.size());
      r.all_gather(v, gathered);
      r.broadcast(gathered, 0);
      std::vector<T> scattered(v.size());
      r.reduce_scatter(op, gathered, scattered);
      r.barrier();
      return scattered;
    });
    BOOST_TEST(bit_equal(out[0], in));
  }
}

BOOST_AUTO_TEST_CASE(wrong_buffer_sizes_are_rejected_before_meeting) {
  dist::comm::local local;
  std::vector<float> in(4), out(5);
  BOOST_CHECK_THROW(local.all_gather(std::span<const float>(in), std::span<float>(out)), std::invalid_argument);
  BOOST_CHECK_THROW(local.broadcast(std::span<float>(in), 1), std::invalid_argument);
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  BOOST_CHECK_THROW(s.run([](auto& r) {
                      std::vector<float> a(3), b(5);
                      r.all_gather(a, b);
                    }),
                    std::invalid_argument);
  BOOST_CHECK_THROW(s.run([](auto& r) {
                      std::vector<float> a(3);
                      r.broadcast(a, 2);
                    }),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
