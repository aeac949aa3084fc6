// The collectives of comm::local (one_device_strategy) and comm::shared_memory (mirrored_strategy's
// replicas, 1 to 8): every collective, op and element type, through the cases every communicator
// shares (tests/comm/collective_cases.hpp). Here besides: the model of the GPU replicas'
// reduction, and what the replica context adds to the communicator (scalars, several buffers in
// one call, integer types by width, many collectives in one step).

#include "test_support.hpp"
#include "../comm/replica_groups.hpp"

#include <distribute/comm/detail/peer_reduction.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace distribute::test {

using collective_groups = communicator_cases::type_list<local_groups, shared_memory_groups<1, 2, 3, 4, 8>>;

}  // namespace distribute::test

#include "../comm/collective_cases.hpp"

namespace dist = distribute;
using dist::test::bit_equal;
using dist::test::serial_reduce;
using dist::test::values_for;

BOOST_AUTO_TEST_SUITE(collectives)

// The GPU replicas' own all-reduce (cuda/comm/cuda_peer.cuh) modelled on the CPU with its own slice split
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
        for (const auto& segments :
             {std::vector<std::size_t>{n}, std::vector<std::size_t>{n / 3, n / 2, n - n / 3 - n / 2}}) {
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
    for (const std::size_t total : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256},
                                    std::size_t{257}, std::size_t{1000}, std::size_t{65539}, std::size_t{5'000'003}}) {
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

BOOST_AUTO_TEST_CASE(all_gather_of_scalars) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  auto out = s.run([](auto& r) { return r.all_gather(10 * r.replica_id()); });
  for (const auto& v : out) BOOST_TEST(v == (std::vector<int>{0, 10, 20, 30}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_scalar_is_broadcast_from_every_root, T, dist::test::element_types) {
  for (const int replicas : {1, 2, 3, 4, 8}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    for (int root = 0; root < replicas; ++root) {
      auto out = s.run([&](auto& r) { return r.broadcast(static_cast<T>(r.replica_id()), root); });
      for (const T v : out) BOOST_TEST_REQUIRE(v == static_cast<T>(root), replicas << " replicas, root " << root);
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

BOOST_AUTO_TEST_SUITE_END()
