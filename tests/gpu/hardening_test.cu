// The GPU backend's failure modes that only show on a real device, and the arithmetic behind them
// that can be checked without one.
//
// `host` (no GPU needed; it joins the suite of that name in main.cu): how a failed device count is
// read, the meeting's own copy of the posted buffers, when NCCL's average is the sum divided, and
// where the cuda_peer kernel's vector loads start.
//
// `hardening` (a GPU): a collective polling a busy stream leaves no error behind for the program's
// next cudaGetLastError; an NCCL collective queued behind a kernel longer than the timeout times out,
// aborts, and the next run rebuilds the communicator; a 1 GiB all-reduce of device memory allocates
// no staging memory, and one of host memory keeps no more than the retained limit; sizes beyond one
// pass of the kernels' grid-stride loops; device sub-spans off a 16-byte boundary; pinned uploads
// into a tensor bound to another stream; a device_guard on a fresh thread creating no context on
// the device it leaves.

#include "gpu_test_support.cuh"

#include <distribute/cuda/comm/detail/cuda_kernels.cuh>
#if DISTRIBUTE_HAS_NCCL
#  include <distribute/cuda/comm/nccl.cuh>
#endif

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace dist = distribute;
namespace dt = distribute::test;
using namespace std::chrono_literals;

namespace {

using dt::noop_kernel;
using dt::spin;
using dt::spin_then_fill;

std::size_t free_device_memory() {
  dist::detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::size_t free = 0, total = 0;
  dist::detail::cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

// Each replica all-reduces `op` over values_for(rank) in `n` device elements, placed `offset`
// elements into a tensor of n + offset + 5 (a sub-span off any alignment the tensor has); returns
// whether every replica's span holds the serial reduction bit for bit and the elements around it are
// untouched.
template <class T, class S>
bool sub_span_reduces_exactly(S& s, dist::reduce_op op, std::size_t n, std::size_t offset) {
  const int replicas = s.num_replicas_in_sync();
  std::vector<std::vector<T>> in;
  for (int r = 0; r < replicas; ++r) in.push_back(dt::values_for<T>(r, n, op));
  const auto expected = dt::serial_reduce(op, in);
  auto ok = s.run([&](dist::replica auto& r) {
    const auto id = static_cast<std::size_t>(r.replica_id());
    std::vector<T> whole(n + offset + 5, static_cast<T>(7));
    std::copy(in[id].begin(), in[id].end(), whole.begin() + static_cast<std::ptrdiff_t>(offset));
    auto t =
        dist::tensor<T, dist::cuda>::from_host(dist::shape{static_cast<std::int64_t>(whole.size())}, whole, r.device());
    r.all_reduce(op, t.values().subspan(offset, n));
    const auto got = t.to_vector();
    int good = std::memcmp(got.data() + offset, expected.data(), n * sizeof(T)) == 0;
    for (std::size_t i = 0; i < offset; ++i) good = good && got[i] == static_cast<T>(7);
    for (std::size_t i = offset + n; i < got.size(); ++i) good = good && got[i] == static_cast<T>(7);
    return good;
  });
  for (int g : ok)
    if (!g) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host)

BOOST_AUTO_TEST_CASE(a_failed_device_count_is_a_skip_only_without_a_gpu_or_a_driver) {
  using dist::detail::means_no_gpu;
  BOOST_TEST(means_no_gpu(cudaErrorNoDevice, true));
  BOOST_TEST(means_no_gpu(cudaErrorNoDevice, false));
  BOOST_TEST(means_no_gpu(cudaErrorStubLibrary, true));
  // No driver library at all: a machine without a GPU. A driver that is there but too old: an error.
  BOOST_TEST(means_no_gpu(cudaErrorInsufficientDriver, false));
  BOOST_TEST(!means_no_gpu(cudaErrorInsufficientDriver, true));
  BOOST_TEST(!means_no_gpu(cudaErrorInitializationError, true));
  BOOST_TEST(!means_no_gpu(cudaErrorInitializationError, false));
  BOOST_TEST(!means_no_gpu(cudaErrorSystemDriverMismatch, true));
  // This machine: a count, or the reason it has none that can be used (which fails this test).
  BOOST_CHECK_NO_THROW((void)dist::cuda_device_count());
}

BOOST_AUTO_TEST_CASE(posted_buffers_are_the_meetings_own_copy) {
  using dist::comm::detail::collective_kind;
  using dist::comm::detail::descriptor;
  using dist::comm::detail::segment;
  dist::comm::detail::gpu_meeting m(2, {});
  int a = 0, b = 0;
  std::vector<std::uint64_t> seqs(2);
  bool copied[2] = {false, false};
  std::vector<std::thread> threads;
  // Boost.Test's assertions are not thread-safe: the replica threads record, the test thread checks.
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      // The caller's list dies, and its memory is reused, as soon as its collective returns.
      auto segs = std::make_unique<std::vector<segment>>(std::vector<segment>{{r == 0 ? &a : &b, 3}, {nullptr, 5}});
      const descriptor d{.kind = collective_kind::all_reduce,
                         .type = dist::dtype::float32,
                         .count = 8,
                         .segs = segs->data(),
                         .n_segs = 2};
      seqs[static_cast<std::size_t>(r)] = m.meet(r, d);
      copied[r] = m.posted(r, seqs[static_cast<std::size_t>(r)]).segs != segs->data();
      segs->assign(2, segment{nullptr, 99});
      segs.reset();
      m.meet_again();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(copied[r]);
    const auto& p = m.posted(r, seqs[static_cast<std::size_t>(r)]);
    BOOST_TEST(p.n_segs == 2u);
    BOOST_TEST(p.segs[0].data == static_cast<void*>(r == 0 ? &a : &b));
    BOOST_TEST(p.segs[0].size == 3u);
    BOOST_TEST(p.segs[1].size == 5u);
  }
}

#if DISTRIBUTE_HAS_NCCL
// NCCL's ncclAvg for floating point multiplies each input by 1/n (held in the element type) and sums
// in NCCL's order. Where the collectives use it, that must be the sum divided by n bit for bit, in
// any order of summation: checked here for float and double, two summation orders, and values over
// the whole normal range, as NCCL's premultiplied sum would compute them.
template <class T>
void check_scaled_sum_is_the_divided_sum(int n) {
  std::mt19937_64 gen(20261122u + static_cast<unsigned>(n));
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-120, 120);  // scaled by 1/16, still normal in float
  const T scale = static_cast<T>(1) / static_cast<T>(n);
  int differing = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<T> x(static_cast<std::size_t>(n));
    for (auto& v : x) v = static_cast<T>(std::ldexp(mantissa(gen), exponent(gen)));
    for (const bool reversed : {false, true}) {
      T sum = 0, scaled = 0;
      for (int i = 0; i < n; ++i) {
        const T v = x[static_cast<std::size_t>(reversed ? n - 1 - i : i)];
        sum = static_cast<T>(sum + v);
        scaled = static_cast<T>(scaled + static_cast<T>(v * scale));
      }
      const T divided = static_cast<T>(sum / static_cast<T>(n));
      differing += std::memcmp(&divided, &scaled, sizeof(T)) != 0;
    }
  }
  if (dist::comm::detail::nccl_average_is_exact<T>(n))
    BOOST_TEST(differing == 0, n << " ranks: " << differing << " differ");
  else BOOST_TEST(differing > 0, n << " ranks: NCCL's average would have been exact after all");
}

BOOST_AUTO_TEST_CASE(nccl_average_is_used_only_where_it_is_the_divided_sum) {
  for (int n : {1, 2, 4, 8, 16}) {
    check_scaled_sum_is_the_divided_sum<float>(n);
    check_scaled_sum_is_the_divided_sum<double>(n);
  }
  for (int n : {3, 5, 6, 7}) {
    check_scaled_sum_is_the_divided_sum<float>(n);
    check_scaled_sum_is_the_divided_sum<double>(n);
  }
  using dist::comm::detail::divide_after_nccl;
  using dist::comm::detail::nccl_op;
  static_assert(nccl_op<float>(dist::reduce_op::mean, 4) == ncclAvg);
  static_assert(nccl_op<__nv_bfloat16>(dist::reduce_op::mean, 2) == ncclAvg);
  static_assert(nccl_op<float>(dist::reduce_op::mean, 3) == ncclSum &&
                divide_after_nccl<float>(dist::reduce_op::mean, 3));
  static_assert(nccl_op<__half>(dist::reduce_op::mean, 4) == ncclSum &&
                divide_after_nccl<__half>(dist::reduce_op::mean, 4));
  static_assert(nccl_op<std::int32_t>(dist::reduce_op::mean, 4) == ncclSum &&
                divide_after_nccl<std::int32_t>(dist::reduce_op::mean, 4));
  static_assert(!divide_after_nccl<float>(dist::reduce_op::mean, 1) &&
                !divide_after_nccl<double>(dist::reduce_op::sum, 3));
}
#endif

BOOST_AUTO_TEST_CASE(vector_loads_start_at_the_first_common_16_byte_boundary) {
  using dist::comm::detail::vector_head;
  const std::uintptr_t aligned[] = {0x1000, 0x2000, 0x3000};
  BOOST_TEST(vector_head<float>(aligned, 3, 100) == 0u);
  const std::uintptr_t one_float_in[] = {0x1004, 0x2004};
  BOOST_TEST(vector_head<float>(one_float_in, 2, 100) == 3u);  // 12 bytes to the boundary
  BOOST_TEST(vector_head<float>(one_float_in, 2, 2) == 2u);    // fewer elements than that
  const std::uintptr_t one_double_in[] = {0x1008, 0x2008};
  BOOST_TEST(vector_head<double>(one_double_in, 2, 100) == 1u);
  const std::uintptr_t different[] = {0x1004, 0x2008};
  BOOST_TEST(vector_head<float>(different, 2, 100) == 101u);  // no common boundary: not vectorised
  const std::uintptr_t odd[] = {0x1002, 0x2002};
  BOOST_TEST(vector_head<float>(odd, 2, 100) == 101u);  // not a whole number of elements from one
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hardening)

#if DISTRIBUTE_HAS_NCCL
BOOST_AUTO_TEST_CASE(polling_a_busy_stream_leaves_no_error_for_the_program) {
  auto s = dt::nccl_1::make();
  auto ok = s.run([](dist::replica auto& r) {
    dist::tensor<float, dist::cuda> t(dist::shape{1024}, r.device());
    spin(r.device().stream(), 200ms);  // the collective's waits see a busy stream many times
    r.all_reduce(dist::reduce_op::mean, t.values());
    noop_kernel<<<1, 1, 0, r.device().stream()>>>();
    return static_cast<int>(cudaGetLastError());
  });
  BOOST_TEST(ok[0] == static_cast<int>(cudaSuccess),
             "the program's next cudaGetLastError reported " << cudaGetErrorName(static_cast<cudaError_t>(ok[0])));
}

BOOST_AUTO_TEST_CASE(an_nccl_collective_behind_a_long_kernel_times_out_and_the_next_run_rebuilds) {
  auto s = dt::nccl_1::make({.timeout = 300ms});
  const auto start = std::chrono::steady_clock::now();
  try {
    s.run([](dist::replica auto& r) {
      dist::tensor<float, dist::cuda> t(dist::shape{256}, r.device());
      spin(r.device().stream(), 2000ms);
      r.all_reduce(dist::reduce_op::sum, t.values());
    });
    BOOST_FAIL("no exception");
  } catch (const dist::collective_timeout& e) {
    BOOST_TEST(dt::contains(e.what(), "the NCCL communicator was aborted"), e.what());
  }
  // run returned only once the replica's stream had finished the step's work (the long kernel).
  BOOST_TEST((std::chrono::steady_clock::now() - start >= 1900ms));
  auto v = s.run([](dist::replica auto& r) {
    auto t = dist::tensor<float, dist::cuda>::from_host(dist::shape{3}, std::vector<float>{1, 2, 3}, r.device());
    r.all_reduce(dist::reduce_op::sum, t.values());
    return t.to_vector();
  });
  BOOST_TEST(v[0] == (std::vector<float>{1, 2, 3}), boost::test_tools::per_element());
}
#endif

BOOST_AUTO_TEST_CASE_TEMPLATE(a_large_device_all_reduce_takes_no_staging_memory, M, dt::mirrored_gpu_strategies) {
  constexpr std::size_t gib = std::size_t{1} << 30, mib = std::size_t{1} << 20;
  auto s = M::make({.timeout = 120s});
  const std::size_t n = gib / sizeof(float) / static_cast<std::size_t>(M::replicas);
  auto bufs = s.mirror(
      [&](dist::cuda& d) { return dist::tensor<float, dist::cuda>(dist::shape{static_cast<std::int64_t>(n)}, d); });
  // Warm-up: the engines' own set-up (NCCL's buffers, the first kernels) is not what is measured.
  s.run([](dist::replica auto& r) {
    std::vector<float> small(1000, 1.0f);
    r.all_reduce(dist::reduce_op::sum, small);
  });
  // What the library holds is read from its memory pool: memory it frees stays cached in the pool
  // (cuda/device/memory.cuh), so the device's free memory does not come back when a buffer is freed.
  // The device's free memory is checked too, for what the engine (NCCL) might take for itself.
  const std::size_t before = free_device_memory();
  const auto held_before = dist::cuda_memory_usage(0);
  dist::cuda_reset_memory_peaks(0);
  s.run(
      [](dist::replica auto& r, dist::tensor<float, dist::cuda>& t) { r.all_reduce(dist::reduce_op::sum, t.values()); },
      bufs);
  const std::size_t after = free_device_memory();
  BOOST_TEST(after + 64 * mib >= before, M::name << " x" << M::replicas << ": a device all-reduce of 1 GiB took "
                                                 << (before - after) / mib << " MiB more device memory");
  const auto held_after = dist::cuda_memory_usage(0);
  BOOST_TEST(held_after.peak_in_use <= held_before.in_use + mib,
             M::name << " x" << M::replicas << ": a device all-reduce of 1 GiB allocated "
                     << (held_after.peak_in_use - held_before.in_use) / mib << " MiB from the library's pool");

  // Host memory is staged, but no more than the retained limit stays allocated afterwards.
  const std::size_t host_n = 256 * mib / sizeof(float) / static_cast<std::size_t>(M::replicas);
  s.run([&](dist::replica auto& r) {
    std::vector<float> v(host_n, 1.0f);
    r.all_reduce(dist::reduce_op::sum, v);
  });
  const auto kept = dist::cuda_memory_usage(0);
  BOOST_TEST(kept.peak_in_use >= held_before.in_use + 256 * mib - mib,
             M::name << " x" << M::replicas << ": 256 MiB of host memory was not staged through the device");
  BOOST_TEST(kept.in_use <= held_before.in_use + dist::comm::detail::host_staging::retained_limit * M::replicas,
             M::name << " x" << M::replicas << ": staging 256 MiB of host memory left "
                     << (kept.in_use - held_before.in_use) / mib << " MiB in use");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sizes_beyond_one_pass_of_the_grid_are_reduced_exactly, M, dt::mirrored_gpu_strategies) {
  auto s = M::make({.timeout = 60s});
  // More elements than one pass of any grid the kernels launch (at most 8 blocks of 256 threads per
  // SM, four floats a thread: about a million floats on an H100), with an odd tail.
  const std::size_t n = 5'000'003;
  for (const auto op : {dist::reduce_op::sum, dist::reduce_op::mean, dist::reduce_op::max}) {
    BOOST_TEST(sub_span_reduces_exactly<float>(s, op, n, 0), M::name << " x" << M::replicas << " " << op);
    BOOST_TEST(sub_span_reduces_exactly<double>(s, op, n, 0), M::name << " x" << M::replicas << " " << op);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(misaligned_device_sub_spans_are_reduced_in_place, M, dt::mirrored_gpu_strategies) {
  auto s = M::make();
  for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{65539}})
    for (const std::size_t offset : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5}}) {
      BOOST_TEST(sub_span_reduces_exactly<float>(s, dist::reduce_op::sum, n, offset),
                 M::name << " x" << M::replicas << ": float, " << n << " elements at offset " << offset);
      BOOST_TEST(sub_span_reduces_exactly<double>(s, dist::reduce_op::mean, n, offset),
                 M::name << " x" << M::replicas << ": double, " << n << " elements at offset " << offset);
      BOOST_TEST(sub_span_reduces_exactly<std::int32_t>(s, dist::reduce_op::max, n, offset),
                 M::name << " x" << M::replicas << ": int32, " << n << " elements at offset " << offset);
    }
}

BOOST_AUTO_TEST_CASE(pinned_uploads_are_ordered_with_the_tensors_own_stream) {
  const dist::detail::device_guard on(0);
  dist::detail::owned_stream staging_stream(0), tensor_stream(0);
  dist::pinned_staging<float> staging(dist::cuda{0}.on(staging_stream.get()));
  const std::size_t n = 1 << 20;
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 1000);
  dist::tensor<float, dist::cuda> t(dist::shape{static_cast<std::int64_t>(n)}, dist::cuda{0}.on(tensor_stream.get()));

  // Work still queued on the tensor's stream writes it: the upload must land after that work.
  spin_then_fill<<<64, 256, 0, tensor_stream.get()>>>(t.data(), n, 7.0f, 300'000'000ull);
  dist::detail::cuda_check(cudaGetLastError(), "launching spin_then_fill");
  staging.upload(values, t);
  BOOST_TEST((t.to_vector() == values));  // read on the tensor's stream

  // The staging's stream is busy: work queued afterwards on the tensor's stream must still see the
  // upload's data.
  spin(staging_stream.get(), 300ms);
  std::vector<float> next(values.rbegin(), values.rend());
  staging.upload(next, t);
  BOOST_TEST((t.to_vector() == next));
  staging.wait();
}

// Run by the next test in a process of its own (a fresh process is the only place with no context
// on cuda:0): makes the last GPU current on a fresh thread through a device_guard, and checks that
// this created no context on cuda:0, the device the thread reported before.
BOOST_AUTO_TEST_CASE(guard_probe) {
  if (std::getenv("DISTRIBUTE_TEST_GUARD_PROBE") == nullptr) return;
  const int last = dist::cuda_device_count() - 1;
  BOOST_REQUIRE(last >= 1);
  BOOST_REQUIRE(!dist::detail::primary_context_active(0));
  std::thread([last] {
    {
      const dist::detail::device_guard g(last);
      dist::cuda{last}.synchronize();
    }
    int now = -1;
    (void)cudaGetDevice(&now);
    BOOST_TEST(now == last);  // kept: the device it "had" has no context
  }).join();
  BOOST_TEST(!dist::detail::primary_context_active(0));
  BOOST_TEST(dist::detail::primary_context_active(last));
}

BOOST_AUTO_TEST_CASE(a_device_guard_creates_no_context_on_the_device_it_leaves,
                     *boost::unit_test::precondition(dt::at_least_two_gpus)) {
  const std::string self = boost::unit_test::framework::master_test_suite().argv[0];
  const std::string command = "DISTRIBUTE_TEST_GUARD_PROBE=1 '" + self + "' --run_test=hardening/guard_probe";
  BOOST_TEST(std::system(command.c_str()) == 0, command);
  // Here, where cuda:0 has a context, the guard restores it.
  dist::cuda{0}.synchronize();
  std::thread([] {
    { const dist::detail::device_guard g(1); }
    int now = -1;
    (void)cudaGetDevice(&now);
    BOOST_TEST(now == 0);
  }).join();
}

BOOST_AUTO_TEST_SUITE_END()
