#pragma once
// The suite `collectives` of the GPU tests (main.cu): every collective, op and element type (with
// float16 and bfloat16 for all-reduce) over the GPU replicas of mirrored_strategy<cuda>, in device
// and in host memory, through the cases every communicator shares (tests/comm/collective_cases.hpp):
// on the cuda_peer kernels with 1-4 logical replicas on one GPU, held to the CPU engine's bits, and
// on NCCL with one rank. Here besides: NCCL over every GPU where there are several, and the bounds of
// a cuda_peer group.

#include "gpu_test_support.cuh"
#include "../comm/replica_groups.hpp"

#include <boost/test/unit_test.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::test {

// A replica's buffer: a tensor on its GPU, in its stream's order, or host memory, which the
// communicator stages through the device.
template <class T>
class gpu_buffer {
 public:
  // `values` go to one of the two: the tensor reads them before host_ could take them.
  gpu_buffer(const cuda& device, std::vector<T> values, bool on_device)
      : on_device_{on_device},
        device_{on_device ? tensor<T, cuda>::from_host(shape{static_cast<std::int64_t>(values.size())}, values, device)
                          : tensor<T, cuda>{}},
        host_{on_device ? std::vector<T>{} : std::move(values)} {}

  std::span<T> span() { return on_device_ ? device_.values() : std::span<T>(host_); }
  std::vector<T> values() const { return on_device_ ? device_.to_vector() : host_; }

 private:
  bool on_device_;
  tensor<T, cuda> device_;
  std::vector<T> host_;
};

struct gpu_memory {
  static constexpr int kinds = 2;
  static const char* name(int kind) noexcept { return kind == 0 ? "device memory" : "host memory"; }
  template <class T>
  static gpu_buffer<T> buffer(const cuda& device, std::vector<T> values, int kind) {
    return gpu_buffer<T>(device, std::move(values), kind == 0);
  }
};

template <class T>
inline constexpr bool is_half = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// The CPU engine's bits, and for float16 and bfloat16 values whose sums and products stay exact
// (gpu_test_support.cuh); their mean is the one inexact step, a half-precision division that the
// device and the host may round differently in the last place.
struct gpu_reference : serial_reference {
  using all_reduce_types =
      communicator_cases::concat<element_types, communicator_cases::type_list<__half, __nv_bfloat16>>::type;

  template <class T>
  static std::vector<T> values(int rank, std::size_t n, reduce_op op, std::uint32_t seed) {
    if constexpr (is_half<T>) return half_values_for<T>(rank, n, op, seed);
    else return serial_reference::values<T>(rank, n, op, seed);
  }
  template <class T>
  static bool same(reduce_op op, const std::vector<T>& got, const std::vector<T>& want) {
    if constexpr (is_half<T>) {
      if (op == reduce_op::mean) {
        if (got.size() != want.size()) return false;
        const auto a = as_floats(got), b = as_floats(want);
        for (std::size_t i = 0; i < a.size(); ++i)
          if (a[i] != b[i] && std::abs(a[i] - b[i]) > 1e-2f * std::min(std::abs(a[i]), std::abs(b[i]))) return false;
        return true;
      }
    }
    return serial_reference::same<T>(op, got, want);
  }
};

using gpu_group = strategy_group<mirrored_strategy<cuda>, gpu_memory>;

// The replicas of mirrored_strategy<cuda>: 1-4 logical replicas of cuda:0 on the cuda_peer kernels,
// and cuda:0 alone on NCCL (a group of one rank). One Groups for both engines, whose replicas have
// the same communicator type: the cases are compiled once for the two (an nvcc translation unit
// costs minutes on a small CI machine), and their messages name the engine.
struct gpu_replica_groups {
  using communicator = gpu_group::communicator;
  using reference = gpu_reference;
  static constexpr int memories = gpu_memory::kinds;
  static constexpr bool names_mismatches = true;
  static constexpr bool names_message_mismatches = false;
  static constexpr const char* rank_name = "replica";

  template <class F>
  static void for_each(F&& f) {
    with<peer_n<1>>(f);
    with<peer_n<2>>(f);
    with<peer_n<3>>(f);
    with<peer_n<4>>(f);
#if DISTRIBUTE_HAS_NCCL
    with<nccl_1>(f);
#endif
  }

 private:
  template <class M, class F>
  static void with(F& f) {
    gpu_group g(std::string(M::name) + ", " + std::to_string(M::replicas) + " replica(s)", [] { return M::make(); });
    communicator_cases::each_on_its_own(g, f);  // one replica count's failure hides no other's
  }
};

using collective_groups = communicator_cases::type_list<gpu_replica_groups>;

}  // namespace distribute::test

#include "../comm/collective_cases.hpp"

namespace dist = distribute;
namespace dt = distribute::test;

namespace {

// Runs one all-reduce per replica of `s` on `inputs`, in device memory (a tensor's span) or in host
// memory (staged), and returns what each replica holds afterwards.
template <class T, class S>
std::vector<std::vector<T>> reduce_on(S& s, dist::reduce_op op, std::size_t n, bool on_device,
                                      const std::vector<std::vector<T>>& inputs) {
  auto out = s.run([&](dist::replica auto& r) {
    std::vector<T> v = inputs[static_cast<std::size_t>(r.replica_id())];
    if (on_device) {
      auto t = dist::tensor<T, dist::cuda>::from_host(dist::shape{static_cast<std::int64_t>(n)}, v, r.device());
      r.all_reduce(op, t.values());
      return t.to_vector();
    }
    r.all_reduce(op, v);
    return v;
  });
  return std::vector<std::vector<T>>(out.begin(), out.end());
}

template <class T>
std::vector<std::vector<T>> inputs_for(int replicas, std::size_t n, dist::reduce_op op) {
  std::vector<std::vector<T>> in;
  for (int r = 0; r < replicas; ++r) in.push_back(dt::values_for<T>(r, n, op));
  return in;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(collectives)

#if DISTRIBUTE_HAS_NCCL
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(dt::at_least_two_gpus))
BOOST_AUTO_TEST_CASE(nccl_over_every_gpu_matches_the_serial_reduction) {
  // Several ranks: NCCL's summation order is its own, so floats agree within rounding; integers exactly.
  dist::mirrored_strategy<dist::cuda> s;
  BOOST_TEST((s.collective_engine() == dist::cuda_collective_engine::nccl));
  const int n = s.num_replicas_in_sync();
  for (const auto op : dt::all_ops) {
    const auto fin = inputs_for<float>(n, 4099, op);
    const auto fexp = dt::serial_reduce(op, fin);
    const auto fgot = reduce_on<float>(s, op, 4099, true, fin);
    for (const auto& g : fgot)
      for (std::size_t i = 0; i < g.size(); ++i) BOOST_TEST(g[i] == fexp[i], boost::test_tools::tolerance(1e-4f));
    const auto iin = inputs_for<std::int64_t>(n, 4099, op);
    const auto iexp = dt::serial_reduce(op, iin);
    for (const auto& g : reduce_on<std::int64_t>(s, op, 4099, false, iin)) BOOST_TEST(g == iexp);
  }
}

BOOST_TEST_DECORATOR(*boost::unit_test::precondition(dt::at_least_two_gpus))
BOOST_AUTO_TEST_CASE(nccl_rejects_a_buffer_on_another_gpu) {
  dist::mirrored_strategy<dist::cuda> s{{dist::cuda{0}, dist::cuda{1}}};
  dist::tensor<float, dist::cuda> on_gpu1(dist::shape{8}, dist::cuda{1});
  BOOST_CHECK_THROW(s.run([&](auto& r) { r.all_reduce(dist::reduce_op::sum, on_gpu1.values()); }),
                    std::invalid_argument);
}
#endif

BOOST_AUTO_TEST_CASE(cuda_peer_groups_are_bounded) {
  BOOST_CHECK_THROW(dist::comm::cuda_peer_group(dist::cuda_replicas(dist::comm::detail::max_peer_replicas + 1)),
                    std::invalid_argument);
  BOOST_CHECK_THROW(dist::comm::cuda_peer_group(std::vector<dist::cuda>{}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
