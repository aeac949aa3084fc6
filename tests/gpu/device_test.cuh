#pragma once
// The suite `device` of the GPU tests (main.cu): the cuda device and its errors, device tensors,
// the library's memory pool and scratch buffers, zero-filled tensors and the streams they wait for,
// input batches made tensors on the GPU, and pinned staging.

#include "gpu_test_support.cuh"

#include <distribute/data/to_tensor.hpp>

#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace dt = distribute::test;

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
  const auto elements = [](std::uint64_t bytes) {
    return dist::shape{static_cast<std::int64_t>(bytes / sizeof(float))};
  };
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
  BOOST_TEST(cached.reserved >= cached.in_use + 64 * mib,
             "the freed 64 MiB stayed with the pool across a synchronisation");
  {
    dist::tensor<float, dist::cuda> again(elements(64 * mib), d, dist::uninitialized);
    d.synchronize();
    BOOST_TEST(dist::cuda_memory_usage(0).reserved == cached.reserved,
               "the second allocation reused the cached memory");
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
  for (int i = 0; i < 5; ++i)
    BOOST_TEST(batches[static_cast<std::size_t>(i)].to_vector() == host[static_cast<std::size_t>(i)]);
  std::vector<float> wrong(3);
  BOOST_CHECK_THROW(staging.upload(wrong, batches[0]), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
