// The GPU test binary. Without a CUDA device (or without an NVIDIA driver) it reports "skipped"
// (exit code 77) instead of running, unless DISTRIBUTE_REQUIRE_GPU=1; a driver that cannot be used
// is a failure.
//
// Suites here: `host` (what runs without a GPU: the replicas' host-side meeting, and the errors of a
// machine without a device), `device` (the cuda device, its tensor and pinned staging) and `collectives` (every
// collective, op and element type over cuda_peer with 1-4 logical replicas on one GPU, and over NCCL
// with one rank, or every GPU where there are several). The strategies' suites are in
// strategy_test.cu.
#define BOOST_TEST_MODULE distribute_gpu
#define BOOST_TEST_NO_MAIN
#ifndef BOOST_TEST_DYN_LINK
#define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>

#include "gpu_test_support.cuh"

#include <distribute/data/to_tensor.hpp>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace dist = distribute;
namespace dt = distribute::test;

int main(int argc, char* argv[]) {
  // A driver that is there but unusable (one too old for this CUDA runtime) is a failure, never a
  // skip: a GPU run must not quietly test nothing.
  int gpus = 0;
  try {
    gpus = dist::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distribute_gpu_tests: %s\n", e.what());
    return 1;
  }
  // The `host` suite (the replicas' host-side meeting, behaviour without a device) needs no GPU.
  bool host_only = false;
  for (int i = 1; i < argc; ++i) host_only = host_only || std::string_view(argv[i]) == "--run_test=host";
  if (gpus == 0 && !host_only) {
    // On the machine that is meant to test the GPU code, no GPU is a failure.
    if (const char* v = std::getenv("DISTRIBUTE_REQUIRE_GPU"); v != nullptr && std::string_view(v) == "1") {
      std::fprintf(stderr, "distribute_gpu_tests: no CUDA device is visible, and DISTRIBUTE_REQUIRE_GPU=1\n");
      return 1;
    }
    std::fprintf(stderr, "distribute_gpu_tests: no CUDA device is visible; skipped\n");
    return 77;
  }
  // Under mpiexec (the multi-worker test), each worker takes a GPU of its own.
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var); v != nullptr && std::atoi(v) > gpus) {
      std::fprintf(stderr, "distribute_gpu_tests: %s workers on this node but %d GPU(s); skipped\n", v, gpus);
      return 77;
    }
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}

namespace {

// Runs one all-reduce per replica of `s` on values_for(rank), in device memory (a tensor's span) or
// in host memory (staged), and returns what each replica holds afterwards.
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
  for (int r = 0; r < replicas; ++r) {
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) in.push_back(dt::half_values_for<T>(r, n, op));
    else in.push_back(dt::values_for<T>(r, n, op));
  }
  return in;
}

template <class T>
bool equal_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Every op, a spread of sizes (empty, one element, odd tails, several slices), device and host
// buffers: each replica must hold exactly the serial reduction.
template <class T, class M>
void check_all_reduce_exact() {
  auto s = M::make();
  for (const auto op : dt::all_ops)
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65539}})
      for (const bool on_device : {true, false}) {
        const auto in = inputs_for<T>(M::replicas, n, op);
        const auto expected = dt::serial_reduce(op, in);
        const auto got = reduce_on<T>(s, op, n, on_device, in);
        constexpr bool half = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
        if (half && op == dist::reduce_op::mean) {
          // The one inexact step: a half-precision division, which the device and the host reference
          // may round differently in the last place.
          const auto want = dt::as_floats(expected);
          for (const auto& g : got) {
            const auto have = dt::as_floats(g);
            for (std::size_t i = 0; i < want.size(); ++i) BOOST_TEST(have[i] == want[i], boost::test_tools::tolerance(1e-2f));
          }
          continue;
        }
        for (int r = 0; r < M::replicas; ++r)
          BOOST_TEST(equal_bits(got[static_cast<std::size_t>(r)], expected),
                     M::name << " x" << M::replicas << ": " << dist::to_string(dist::dtype_of<T>) << " " << op << " of " << n
                             << (on_device ? " in device memory" : " in host memory") << " differs on replica " << r);
      }
}

using float_and_integer_types = dt::element_types;
using half_types = boost::mpl::list<__half, __nv_bfloat16>;

}  // namespace

BOOST_AUTO_TEST_SUITE(device)

BOOST_AUTO_TEST_CASE(devices_are_small_values_with_streams) {
  const dist::cuda d{1};
  BOOST_TEST(d.name() == "cuda:1");
  BOOST_TEST(d.index() == 1);
  BOOST_TEST((d.stream() == nullptr));
  cudaStream_t fake = reinterpret_cast<cudaStream_t>(0x10);
  BOOST_TEST((d.on(fake).stream() == fake));
  BOOST_TEST((d.on(fake) != d));
  BOOST_TEST((d.on(fake).index() == 1));
  const auto logical = dist::cuda_replicas(3);
  BOOST_TEST(logical.size() == 3u);
  for (const auto& l : logical) BOOST_TEST(l.index() == 0);
  BOOST_CHECK_THROW(dist::cuda_replicas(0), std::invalid_argument);
  BOOST_TEST(dist::all_cuda_devices().size() == static_cast<std::size_t>(dist::cuda_device_count()));
}

BOOST_AUTO_TEST_CASE(cuda_errors_name_the_call_and_device) {
  const dist::cuda missing{dist::cuda_device_count() + 7};
  try {
    missing.make_current();
    BOOST_FAIL("no exception");
  } catch (const dist::cuda_error& e) {
    BOOST_TEST(dt::contains(e.what(), "cudaSetDevice on " + missing.name()), e.what());
    BOOST_TEST((e.code() == cudaErrorInvalidDevice));
  }
  // The failure does not linger as the thread's last error.
  BOOST_TEST((cudaGetLastError() == cudaSuccess));
  BOOST_CHECK_THROW(dist::one_device_strategy<dist::cuda>{missing}, std::invalid_argument);
  BOOST_CHECK_THROW(dist::mirrored_strategy<dist::cuda>{{missing}}, std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(tensors_round_trip_and_keep_their_device) {
  const dist::cuda d{0};
  dist::tensor<float, dist::cuda> zeros(dist::shape::nchw(2, 3, 4, 5), d);
  BOOST_TEST(zeros.size() == 120u);
  BOOST_TEST((zeros.shape() == dist::shape::nchw(2, 3, 4, 5)));
  BOOST_TEST(zeros.to_vector() == std::vector<float>(120, 0.0f));

  dist::tensor<float, dist::cpu> host(dist::shape{2, 3});
  std::iota(host.begin(), host.end(), 1.0f);
  auto t = dist::tensor<float, dist::cuda>::from_host(host, d);
  BOOST_TEST((t.to_host() == host));
  BOOST_TEST((dist::detail::locate(t.data()).on_device));
  BOOST_TEST((!dist::detail::locate(host.data()).on_device));

  auto copy = t;  // a device copy, not a shared buffer
  BOOST_TEST((copy.data() != t.data()));
  BOOST_TEST((copy.to_host() == host));
  dist::tensor<float, dist::cuda> assigned(dist::shape{6}, d);
  const float* storage = assigned.data();
  assigned = t;  // same element count: the storage is kept
  BOOST_TEST((assigned.data() == storage));
  BOOST_TEST(assigned.to_vector() == std::vector<float>(host.begin(), host.end()));
  BOOST_TEST((assigned.state_digest() == t.state_digest()));
  assigned.reshape(dist::shape{3, 2});
  BOOST_TEST((assigned.state_digest() != t.state_digest()));  // the shape is part of the state

  BOOST_CHECK_THROW(t.reshape(dist::shape{7}), std::invalid_argument);
  std::vector<float> wrong(5);
  BOOST_CHECK_THROW(t.copy_from_host(wrong), std::invalid_argument);
  BOOST_CHECK_THROW(t.copy_to_host(wrong), std::invalid_argument);

  dist::tensor<float, dist::cuda> empty;
  BOOST_TEST(empty.empty());
  BOOST_TEST(empty.size() == 0u);
  {
    // Copies of an empty tensor read nothing (a model never run, copied or assigned: its kept inputs
    // are default-made) and are empty; so is a full tensor assigned an empty one.
    const dist::tensor<float, dist::cuda> copy_of_empty{empty};
    BOOST_TEST(copy_of_empty.empty());
    dist::tensor<float, dist::cuda> full(dist::shape{4}, d);
    full = empty;
    BOOST_TEST(full.empty());
    BOOST_CHECK_THROW(empty.reshape(dist::shape{1}), std::invalid_argument);
    dist::tensor<float, dist::cuda> grown;
    grown.resize(dist::shape{1});
    BOOST_TEST(grown.size() == 1u);
    BOOST_TEST((grown.data() != nullptr));
  }
  empty = t;  // a default-constructed tensor takes the source's device
  BOOST_TEST((empty.device() == t.device()));
  BOOST_TEST((empty.to_host() == host));

  // A range fill (an optimiser's learning rate between captured steps): that range alone, queued on
  // the tensor's stream; a range past the end refused before anything is queued.
  dist::tensor<float, dist::cuda> ranged(dist::shape{10}, d);
  ranged.fill(1.0f);
  ranged.fill(5.0f, 3, 2);
  BOOST_TEST(ranged.to_vector() == (std::vector<float>{1, 1, 1, 5, 5, 1, 1, 1, 1, 1}));
  BOOST_CHECK_THROW(ranged.fill(0.0f, 8, 3), std::out_of_range);
  BOOST_TEST(ranged.to_vector() == (std::vector<float>{1, 1, 1, 5, 5, 1, 1, 1, 1, 1}));
  // Not into a graph being captured (it would replay the captured value): refused, and nothing
  // written.
  cudaStream_t side = nullptr;
  BOOST_TEST_REQUIRE((cudaStreamCreate(&side) == cudaSuccess));
  {
    dist::tensor<float, dist::cuda> on_side(dist::shape{4}, d.on(side));
    dist::detail::cuda_graph graph;
    const std::string why = graph.capture(d.index(), side, [&] { on_side.fill(2.0f, 1, 1); });
    BOOST_TEST(dt::contains(why, "range fill on cuda:0 while its stream is being captured"), why);
    BOOST_TEST(!graph);
    BOOST_TEST(on_side.to_vector() == std::vector<float>(4, 0.0f));
  }
  BOOST_TEST((cudaStreamDestroy(side) == cudaSuccess));
}

// The library's memory pool: what tensors allocate is counted; memory a tensor frees stays with the
// pool across synchronisations (the device's default pool would give it back to the driver there)
// and serves the next allocation without taking more; `cuda_release_cached_memory` gives back what
// is not in use; the peaks start again when reset.
BOOST_AUTO_TEST_CASE(the_librarys_pool_keeps_freed_memory_until_asked_to_release_it) {
  const dist::detail::device_guard on(0);
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  constexpr std::uint64_t mib = 1u << 20;
  const auto elements = [](std::uint64_t bytes) { return dist::shape{static_cast<std::int64_t>(bytes / sizeof(float))}; };
  BOOST_TEST_REQUIRE((cudaDeviceSynchronize() == cudaSuccess));
  const auto before = dist::cuda_memory_usage(0);
  {
    dist::tensor<float, dist::cuda> t(elements(64 * mib), d, dist::uninitialized);
    d.synchronize();
    const auto held = dist::cuda_memory_usage(0);
    BOOST_TEST(held.in_use >= before.in_use + 64 * mib);
    BOOST_TEST(held.reserved >= held.in_use);
    BOOST_TEST(held.peak_in_use >= held.in_use);
    BOOST_TEST(held.peak_reserved >= held.reserved);
  }
  BOOST_TEST_REQUIRE((cudaDeviceSynchronize() == cudaSuccess));
  const auto cached = dist::cuda_memory_usage(0);
  BOOST_TEST(cached.in_use == before.in_use);
  BOOST_TEST(cached.reserved >= cached.in_use + 64 * mib, "the freed 64 MiB stayed with the pool across a synchronisation");
  {
    dist::tensor<float, dist::cuda> again(elements(64 * mib), d, dist::uninitialized);
    d.synchronize();
    BOOST_TEST(dist::cuda_memory_usage(0).reserved == cached.reserved, "the second allocation reused the cached memory");
  }
  dist::cuda_release_cached_memory(0);
  const auto released = dist::cuda_memory_usage(0);
  BOOST_TEST(released.reserved + 64 * mib <= cached.reserved, "the unused memory went back to the driver");
  BOOST_TEST(released.reserved >= released.in_use);

  dist::cuda_reset_memory_peaks(0);
  dist::tensor<float, dist::cuda> small(elements(8 * mib), d, dist::uninitialized);
  d.synchronize();
  const auto now = dist::cuda_memory_usage(0);
  BOOST_TEST(now.peak_in_use >= 8 * mib);
  BOOST_TEST(now.peak_in_use <= now.in_use, "the peak counts from the reset on, not the earlier 64 MiB");
  BOOST_TEST(now.peak_in_use < before.in_use + 64 * mib);

  // A device that is not there is a clear error, not an index out of bounds.
  BOOST_CHECK_THROW(dist::cuda_memory_usage(-1), std::invalid_argument);
  BOOST_CHECK_THROW(dist::cuda_memory_usage(1000), std::invalid_argument);
}

// A buffer kept between calls (a convolution's workspace, 16-bit copies): growing frees the old one
// unless a CUDA graph captured it; then it is kept, as the graph replays its address.
BOOST_AUTO_TEST_CASE(a_scratch_buffer_keeps_the_memory_a_graph_captured) {
  const dist::detail::device_guard on(0);
  dist::detail::owned_stream stream(0);
  constexpr std::size_t mib = std::size_t{1} << 20;
  dist::detail::scratch_buffer b;
  void* first = b.get(0, mib, stream.get());
  BOOST_TEST(first != nullptr);
  BOOST_TEST(b.get(0, mib / 2, stream.get()) == first, "a smaller request gets the same memory");
  b.get(0, 2 * mib + 256, stream.get());
  BOOST_TEST(b.bytes() == 2 * mib + 256, "grown to the size asked for");
  BOOST_TEST(b.retired_bytes() == 0u, "no capture used the first buffer: freed, not kept");

  cudaGraph_t graph = nullptr;
  BOOST_TEST_REQUIRE((cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal) == cudaSuccess));
  void* captured = b.get(0, mib, stream.get());
  BOOST_TEST_REQUIRE((cudaMemsetAsync(captured, 1, mib, stream.get()) == cudaSuccess));
  BOOST_TEST_REQUIRE((cudaStreamEndCapture(stream.get(), &graph) == cudaSuccess));
  cudaGraphExec_t exec = nullptr;
  BOOST_TEST_REQUIRE((cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess));

  void* grown = b.get(0, 3 * mib, stream.get());
  BOOST_TEST(grown != captured);
  BOOST_TEST(b.retired_bytes() == 2 * mib + 256, "the captured buffer is kept");
  BOOST_TEST(b.bytes() == 2 * (2 * mib + 256), "and its successor is twice its size");
  {
    // Memory asked for now cannot be the captured buffer, which the graph still writes.
    const dist::detail::device_allocation other(0, 2 * mib + 256, stream.get());
    BOOST_TEST(other.get() != captured);
    BOOST_TEST((cudaGraphLaunch(exec, stream.get()) == cudaSuccess));
    BOOST_TEST((cudaStreamSynchronize(stream.get()) == cudaSuccess));
  }
  BOOST_TEST((cudaGraphExecDestroy(exec) == cudaSuccess));
  BOOST_TEST((cudaGraphDestroy(graph) == cudaSuccess));
}

// A zero-filled tensor on a stream of its own is written in that stream's order, without waiting
// for the device; on the default stream it waits (so that any stream may use it).
BOOST_AUTO_TEST_CASE(zero_filled_tensors_wait_for_the_device_only_on_the_default_stream) {
  const dist::detail::device_guard on(0);
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dt::spin(stream.get(), std::chrono::milliseconds(500));
  dist::tensor<float, dist::cuda> queued(dist::shape{1 << 16}, d);
  BOOST_TEST(!dist::detail::stream_idle(stream.get(), 0), "the constructor returned while the stream was still busy");
  BOOST_TEST(queued.to_vector() == std::vector<float>(1 << 16, 0.0f));

  dt::spin(nullptr, std::chrono::milliseconds(200));
  dist::tensor<float, dist::cuda> waited(dist::shape{1 << 16}, dist::cuda{0});
  BOOST_TEST(dist::detail::stream_idle(nullptr, 0), "on the default stream the constructor waited for the zeros");
  BOOST_TEST(waited.to_vector() == std::vector<float>(1 << 16, 0.0f));
}

// An input batch (NHWC bytes) to an NCHW tensor on the GPU in one call: the same values as on the CPU.
BOOST_AUTO_TEST_CASE(batches_become_tensors_on_the_gpu) {
  const dist::cuda d{0};
  dist::data::tensor<std::uint8_t> images;
  images.shape = {2, 2, 3, 2};  // [n, h, w, c]
  for (int i = 0; i < 24; ++i) images.values.push_back(static_cast<std::uint8_t>(i * 10));
  const auto on_gpu = dist::data::to_tensor<float, dist::cuda>(images, dist::data::pixels::symmetric, d);
  const auto on_cpu = dist::data::to_tensor<float>(images, dist::data::pixels::symmetric);
  BOOST_TEST((on_gpu.shape() == dist::shape::nchw(2, 2, 2, 3)));
  BOOST_TEST((on_gpu.to_host() == on_cpu));
}

BOOST_AUTO_TEST_CASE(pinned_staging_overlaps_and_lands_every_batch) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::pinned_staging<float> staging(d);
  std::vector<dist::tensor<float, dist::cuda>> batches;
  for (int i = 0; i < 5; ++i) batches.emplace_back(dist::shape{1000 + i}, d);
  std::vector<std::vector<float>> host;
  for (int i = 0; i < 5; ++i) {
    host.emplace_back(static_cast<std::size_t>(1000 + i));
    std::iota(host.back().begin(), host.back().end(), static_cast<float>(i * 10000));
    staging.upload(host.back(), batches[static_cast<std::size_t>(i)]);
    // The host batch may be reused at once: upload copied it.
  }
  staging.wait();
  for (int i = 0; i < 5; ++i) BOOST_TEST(batches[static_cast<std::size_t>(i)].to_vector() == host[static_cast<std::size_t>(i)]);
  std::vector<float> wrong(3);
  BOOST_CHECK_THROW(staging.upload(wrong, batches[0]), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_AUTO_TEST_CASE_TEMPLATE(cuda_peer_all_reduce_is_exact_for_1_to_4_replicas, T, float_and_integer_types) {
  check_all_reduce_exact<T, dt::peer_n<1>>();
  check_all_reduce_exact<T, dt::peer_n<2>>();
  check_all_reduce_exact<T, dt::peer_n<3>>();
  check_all_reduce_exact<T, dt::peer_n<4>>();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(cuda_peer_all_reduce_of_half_precision, T, half_types) {
  check_all_reduce_exact<T, dt::peer_n<1>>();
  check_all_reduce_exact<T, dt::peer_n<2>>();
  check_all_reduce_exact<T, dt::peer_n<3>>();
  check_all_reduce_exact<T, dt::peer_n<4>>();
}

#if DISTRIBUTE_HAS_NCCL
BOOST_AUTO_TEST_CASE_TEMPLATE(nccl_one_rank_all_reduce_every_op, T, float_and_integer_types) {
  check_all_reduce_exact<T, dt::nccl_1>();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(nccl_one_rank_half_precision, T, half_types) { check_all_reduce_exact<T, dt::nccl_1>(); }

BOOST_TEST_DECORATOR(*boost::unit_test::precondition(dt::at_least_two_gpus))
BOOST_AUTO_TEST_CASE(nccl_over_every_gpu_matches_the_serial_reduction) {
  // Several ranks: NCCL's summation order is its own, so floats agree within rounding; integers exactly.
  dist::mirrored_strategy<dist::cuda> s;
  BOOST_TEST((s.engine() == dist::cuda_engine::nccl));
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
  BOOST_CHECK_THROW(s.run([&](auto& r) { r.all_reduce(dist::reduce_op::sum, on_gpu1.values()); }), std::invalid_argument);
}
#endif

// A list of buffers, some in device memory and some on the host, reduces as one collective.
BOOST_AUTO_TEST_CASE_TEMPLATE(fused_buffers_mix_device_and_host_memory, M, dt::mirrored_gpu_strategies) {
  auto s = M::make();
  auto sums = s.run([](dist::replica auto& r) {
    const float k = static_cast<float>(r.replica_id() + 1);
    auto a = dist::tensor<float, dist::cuda>::from_host(dist::shape{3}, std::vector<float>{k, 2 * k, 3 * k}, r.device());
    std::vector<float> b(1001, k);
    auto c = dist::tensor<float, dist::cuda>::from_host(dist::shape{5}, std::vector<float>(5, -k), r.device());
    std::vector<std::span<float>> all{a.values(), std::span<float>(b), c.values()};
    r.all_reduce(dist::reduce_op::sum, all);
    auto av = a.to_vector(), cv = c.to_vector();
    return std::vector<float>{av[0], av[2], b[0], b[1000], cv[4]};
  });
  const float total = static_cast<float>(M::replicas * (M::replicas + 1) / 2);
  for (const auto& v : sums) BOOST_TEST(v == (std::vector<float>{total, 3 * total, total, total, -total}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gather_scatter_broadcast_and_barrier, M, dt::mirrored_gpu_strategies) {
  auto s = M::make();
  const int n = M::replicas;
  const std::size_t m = 1003;
  auto results = s.run([&](dist::replica auto& r) {
    const int id = r.replica_id();
    // all_gather: device in, host out.
    std::vector<double> mine(m);
    std::iota(mine.begin(), mine.end(), 10000.0 * id);
    auto din = dist::tensor<double, dist::cuda>::from_host(dist::shape{static_cast<std::int64_t>(m)}, mine, r.device());
    std::vector<double> gathered(m * static_cast<std::size_t>(n));
    r.all_gather(din.values(), gathered);
    // reduce_scatter (mean): host in, device out.
    std::vector<std::int32_t> blocks(m * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::int32_t>(i % 97) * (id + 1);
    dist::tensor<std::int32_t, dist::cuda> mean_block(dist::shape{static_cast<std::int64_t>(m)}, r.device());
    r.reduce_scatter(dist::reduce_op::mean, blocks, mean_block.values());
    // broadcast from the last replica, in device memory.
    auto b = dist::tensor<float, dist::cuda>::from_host(dist::shape{4}, std::vector<float>(4, static_cast<float>(id)), r.device());
    r.broadcast(b.values(), n - 1);
    r.barrier();
    return std::tuple{gathered, mean_block.to_vector(), b.to_vector()};
  });
  for (int id = 0; id < n; ++id) {
    const auto& [gathered, mean_block, b] = results[static_cast<std::size_t>(id)];
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < m; i += 101) BOOST_TEST(gathered[static_cast<std::size_t>(q) * m + i] == 10000.0 * q + static_cast<double>(i));
    const int weight = n * (n + 1) / 2;
    for (std::size_t i = 0; i < m; i += 7) {
      const std::size_t global = static_cast<std::size_t>(id) * m + i;
      BOOST_TEST(mean_block[i] == static_cast<std::int32_t>(global % 97) * weight / n);
    }
    BOOST_TEST(b == std::vector<float>(4, static_cast<float>(n - 1)), boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(wrong_sizes_are_rejected_before_meeting) {
  auto s = dt::peer_n<2>::make();
  BOOST_CHECK_THROW(s.run([](auto& r) {
                      std::vector<float> in(10), out(7);
                      r.all_gather(in, out);
                    }),
                    std::invalid_argument);
  BOOST_CHECK_THROW(s.run([](auto& r) {
                      std::vector<float> buf(4);
                      r.broadcast(buf, 5);
                    }),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(cuda_peer_groups_are_bounded) {
  BOOST_CHECK_THROW(dist::comm::cuda_peer_group(dist::cuda_replicas(dist::comm::detail::max_peer_replicas + 1)),
                    std::invalid_argument);
  BOOST_CHECK_THROW(dist::comm::cuda_peer_group(std::vector<dist::cuda>{}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(host)

namespace {
using dist::comm::detail::collective_kind;
using dist::comm::detail::descriptor;

// Runs `body(rank)` on `n` threads and returns what each threw ("" for nothing).
template <class F>
std::vector<std::string> on_threads(int n, F body) {
  std::vector<std::string> what(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        what[static_cast<std::size_t>(r)] = std::string(typeid(e).name()) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return what;
}

descriptor all_reduce_of(std::size_t count, dist::reduce_op op = dist::reduce_op::sum) {
  return descriptor{.kind = collective_kind::all_reduce, .type = dist::dtype::float32, .op = op, .count = count};
}
}  // namespace

BOOST_AUTO_TEST_CASE(matching_replicas_meet_and_number_their_collectives) {
  dist::comm::detail::gpu_meeting m(3, {});
  std::vector<std::uint64_t> seqs(6);
  const auto errors = on_threads(3, [&](int r) {
    for (int k = 0; k < 2; ++k) {
      seqs[static_cast<std::size_t>(r * 2 + k)] = m.meet(r, all_reduce_of(10));
      m.meet_again();
    }
    m.depart(r);
  });
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
  BOOST_TEST(seqs == (std::vector<std::uint64_t>{0, 1, 0, 1, 0, 1}), boost::test_tools::per_element());
  BOOST_TEST(!m.first_failure());
}

BOOST_AUTO_TEST_CASE(a_mismatch_names_every_replica_and_call) {
  dist::comm::detail::gpu_meeting m(3, {}, /*first_replica=*/4);
  const auto errors = on_threads(3, [&](int r) { m.meet(r, all_reduce_of(r == 1 ? 1000 : 1024)); });
  for (const auto& e : errors) {
    BOOST_TEST(dt::contains(e, "collective_mismatch"), e);
    BOOST_TEST(dt::contains(e, "replicas 4, 6 called all_reduce(sum) of 1024 float32"), e);
    BOOST_TEST(dt::contains(e, "replica 5 called all_reduce(sum) of 1000 float32"), e);
  }
}

BOOST_AUTO_TEST_CASE(a_replica_that_never_joins_times_out) {
  using namespace std::chrono_literals;
  dist::comm::detail::gpu_meeting m(2, {.timeout = 150ms});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_threads(2, [&](int r) {
    if (r == 0) m.meet(r, all_reduce_of(8));
    else std::this_thread::sleep_for(400ms);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start >= 150ms));
  BOOST_TEST(dt::contains(errors[0], "collective_timeout"), errors[0]);
  BOOST_TEST(dt::contains(errors[0], "timed out after 150 ms (waited "), errors[0]);
  BOOST_TEST(dt::contains(errors[0], " ms): replica 1 never joined it"), errors[0]);
  BOOST_TEST(m.aborted());
  // Joining late: the group has failed, so this fails at once instead of waiting.
  BOOST_CHECK_THROW(m.meet(1, all_reduce_of(8)), dist::collective_aborted);
  m.reset();
  BOOST_TEST(!m.aborted());
}

BOOST_AUTO_TEST_CASE(a_replica_that_left_the_step_is_reported_at_once) {
  using namespace std::chrono_literals;
  dist::comm::detail::gpu_meeting m(2, {.timeout = 60s});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_threads(2, [&](int r) {
    if (r == 0) m.meet(r, all_reduce_of(8));
    else m.depart(r);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));
  BOOST_TEST(dt::contains(errors[0], "replica 1 finished the step without joining it"), errors[0]);
}

BOOST_AUTO_TEST_CASE(a_failing_replica_releases_the_waiting_ones_with_its_reason) {
  using namespace std::chrono_literals;
  dist::comm::detail::gpu_meeting m(3, {.timeout = 60s});
  const auto errors = on_threads(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(50ms);
      m.fail(r, std::make_exception_ptr(std::runtime_error("out of memory on purpose")));
      return;
    }
    m.meet(r, descriptor{.kind = collective_kind::barrier});
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(dt::contains(errors[static_cast<std::size_t>(r)], "collective_aborted"), errors[static_cast<std::size_t>(r)]);
    BOOST_TEST(dt::contains(errors[static_cast<std::size_t>(r)], "replica 2 failed: out of memory on purpose"),
               errors[static_cast<std::size_t>(r)]);
  }
  BOOST_TEST(static_cast<bool>(m.first_failure()));
}

BOOST_AUTO_TEST_CASE(without_a_gpu_the_strategies_say_so) {
  if (dist::cuda_device_count() != 0) return;  // only meaningful on a machine without a device
  BOOST_CHECK_THROW(dist::all_cuda_devices(), std::runtime_error);
  try {
    dist::one_device_strategy<dist::cuda> s;
    BOOST_FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(dt::contains(e.what(), "cuda:0, but 0 CUDA device(s) are visible"), e.what());
  }
  BOOST_CHECK_THROW(dist::mirrored_strategy<dist::cuda>{}, std::runtime_error);
  BOOST_CHECK_THROW(dist::mirrored_strategy<dist::cuda>{dist::cuda_replicas(2)}, std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
