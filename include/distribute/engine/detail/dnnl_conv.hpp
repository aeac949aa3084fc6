#pragma once
// Convolutions through oneDNN: forward, data gradient and weight gradient of float32 NCHW tensors,
// computed in float32 or, with `half`, on bfloat16 copies of the two inputs with float32
// accumulation and float32 results (mixed precision on a CPU with bf16 units: AVX512-BF16, AMX).
//
// Each distinct (pass, geometry, bias) gets a plan once: oneDNN picks the layouts its fastest kernel
// wants (blocked channels, `format_tag::any`), and the plan holds the primitive, the reorders between
// the caller's NCHW and those layouts, and the memory objects they run on. A call points the memory
// objects at the caller's tensors and at arena scratch, reorders in, runs, and reorders out: no
// descriptor is built and nothing is allocated in steady state. oneDNN's workspace also comes from
// the arena (user scratchpad mode). In bfloat16 the reorders in are also the conversions (rounding
// to nearest even); a pass oneDNN has no bfloat16 kernel for returns false, and the engine computes
// it another way. `backward` runs a convolution's two gradients for one dy, and where their
// primitives read dy in the same layout (they do wherever both are blocked) reorders it once.
//
// With `winograd` a pass is computed with Winograd's minimal filtering F(4x4, 3x3) where the oneDNN
// build has that kernel (2.x on AVX-512: `jit_wino_4x3:avx512_core`; 3.x has none on x86 and falls
// back to direct convolution): fewer multiplications for 3x3 windows at stride 1, 2.5-3x faster than
// the direct kernels for the wide convolutions of a residual block (256 channels at 64x64: 8.2
// against 20.5 ms forward on two Zen 4 cores, docs/benchmarks.md), at the cost of more roundings
// (about 2e-5 of the output's largest magnitude, against about 1e-6 for direct). `winograd_pays`
// says where the engine asks for it.
//
// The data gradient of a 3x3 convolution without padding spans a plane two rows and two columns
// larger than dy's; where Winograd's 4x4 output tiles cover that plane with one more row and column
// of tiles than dy's plane (`splits_border`: 66x66 takes 17x17 tiles, 64x64 16x16), it is computed in
// two parts. The inside, all but the outermost row and column on each side, is the data gradient of
// the same convolution with padding 1 over dy's plane, one Winograd pass over 16x16 tiles written
// straight into place; the four edges are each three matrix products (oneDNN's sgemm, one thread
// each: the same bits whatever the thread count) of a row or column of dy with one row or column of
// the window. On two Zen 4 cores a residual block's data gradient (256 channels, 64x64) takes about
// 9 ms this way against 12.6 in one pass (docs/benchmarks.md); the sums run in another order, so
// the bits differ from the one-pass result's, deterministically.
//
// With `round` (Winograd in bfloat16: the engine's float32 arithmetic on bfloat16 values) a pass's two
// inputs are rounded to bfloat16 (nearest, ties to even) on their way into the primitive's layout.
// Where that layout is channels in blocks of 16 (nChw16c, the activations of every Winograd pass)
// one pass over the tensor both rounds and reorders (oneDNN's reorders copy float32 exactly and
// cannot round); elsewhere (the weights) a rounded copy is reordered.
//
// Narrow outputs. A convolution with few output channels from many (a generator's last layer, 64 -> 3
// at 7x7; a discriminator's, 512 -> 1) is a poor fit for oneDNN's direct kernels where those channels
// are the side a pass writes or reads in blocks: they pad them to a block of 8 or 16 and compute
// mostly padding. Its two gradients (`swaps_sides`: stride 1, fewer than 8 channels out, at least 16
// in) are computed as passes of its swapped convolution instead (`swapped`): from the output plane
// back to the input plane, the channel counts exchanged, the window turned half a turn and transposed
// (w'[i][o][a][b] = w[o][i][k-1-a][k-1-b]) and the padding k-1-p, whose forward is the data gradient
// and whose weight gradient (with dy as its input and x as its output's gradient) is the weight
// gradient turned back. There the few channels are the input side, which oneDNN's kernels take as they
// are (as for an image's three channels in a first layer). On two Zen 4 cores (oneDNN 2.6.3, 64 -> 3 at
// 7x7 over 262x262, one pass on both threads): data gradient 14.5 -> 3.8 ms in bfloat16 and 29.0 -> 5.6
// ms in float32, weight gradient 38.6 -> 7.7 ms in float32; in a bfloat16 CycleGAN step at the paper's
// size the layer's passes take 202 ms of oneDNN's time against 393 (docs/benchmarks.md). In bfloat16
// the swapped weight gradient runs in float32 on copies rounded to bfloat16 (`round`: the same
// values), since oneDNN's bfloat16 kernel for it is gemm-based and copies the window's columns again
// for each piece (14.8 ms a piece against 7.6). The forward pass stays direct (its swapped form is no
// faster with the kernels oneDNN picks), and the bias gradient, which the swapped convolution does
// not see, is summed from dy (rounded in bfloat16) in a fixed order (detail::fixed_order_sum per
// example plane, the examples in order), one channel per thread.
//
// Written against oneDNN's C API: its C++ API is header code that every program including the
// layers would compile (measured: +7.8 CPU-seconds on the CycleGAN trainer's translation unit).
// Builds with oneDNN 2.x and 3.x. The two differ in two places, each under DNNL_VERSION_MAJOR: a
// memory descriptor (a value in 2.x, a handle oneDNN allocates in 3.x; `memory_desc` below owns
// either) and how a convolution's primitive descriptor is made (from an operation descriptor in 2.x,
// directly in 3.x; `primitive_desc`).
//
// Threads: oneDNN is built on OpenMP here (both Debian's and the one scripts/setup.sh fetches) and
// runs each primitive with the calling thread's OpenMP thread count, which the engine sets to the
// count in use before every call.
//
// Weight gradients in pieces. A oneDNN weight gradient sums over the batch and the plane, and splits
// that sum between its threads: its last bits depend on how many threads run it. Made with `pieces`
// above one (the engine's thread count, a fixed part of its configuration), a weight gradient is
// instead computed as a fixed grid of pieces: a block of output channels times a block of input
// channels (whole blocks of 16) for a run of examples, each piece by a primitive made for one thread,
// over the whole run where the channels are not split and one example at a time where they are. The
// pieces run on however many threads are in use now (the engine's count may follow the machine's load,
// engine_options::adapt_threads), and each piece's bits are the same on any of them: the grid, and so
// the result, depends on the geometry and `pieces` alone. The pieces of one block of channels add into
// the caller's gradient through oneDNN's reorder (sum post-op); with more than one run of examples
// each run sums into its own buffer and the runs are added in order. The pieces read x and dy in the
// layouts oneDNN chose for the whole pass, where an example's block of 16 channels is contiguous
// (plain nchw, or channels in blocks of 8 or 16); in channels-last layouts the grid splits only the
// examples. Where oneDNN chose another layout, where the grid has fewer pieces than the configured
// count of threads, or where oneDNN would compute a piece with its reference kernel but not the whole
// pass, the weight gradient stays one primitive, and its rule (below) is to run on the configured
// count of threads always.
//
// Which passes keep their bits on any count of threads (`thread_rule`, per plan, from the kernel
// oneDNN reports). Not the kernel a CPU happens to pick: a pass runs on the count in use only where
// its kernel is one whose sums are known to be split by output and not by thread (oneDNN's direct
// `jit:` kernels on AVX2 and AVX-512, `jit_bf16`, Winograd, and the reference kernels: each output is
// one thread's fixed loop over channels and window), or where it is a weight gradient in one-thread
// pieces. Every other kernel runs on the configured count whatever the count in use
// (`fixed_count`): oneDNN's weight gradients unsliced (their threads split the batch and add their
// partial sums: jit_avx512_core_amx_convolution_bwd_weights_t and brgemm's bwd_w balance the batch
// over the threads the primitive was made for, then accumulate thread by thread), the kernels built
// on sgemm (`gemm:`; its driver may split the sum dimension between threads), the AMX and brgemm
// kernels (`amx`, `brg`: their blockings are chosen for the thread count, as 3.x's strided data
// gradient is measured to do), the data gradients of oneDNN 3.x, and any kernel not named here. On a
// CPU with AMX that keeps the bits of a configuration fixed at the price of not shedding threads on
// those passes when the machine is busy (engine_options::adapt_threads).

#include <distribute/bfloat16.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/openmp.hpp>
#include <distribute/engine/detail/serial.hpp>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_version.h>
#if defined(_OPENMP)
#  include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::detail {

class dnnl_conv {
 public:
  enum class pass : std::uint8_t { forward, backward_data, backward_weights };

  // oneDNN 3.x's data-gradient kernels for strided convolutions (brgconv_strided) choose their
  // blocking, and with it the order of their sums, by the thread count they are made for (measured on
  // 3.2: 3 threads differ from 1, 2 and 4); 2.x's give each value of dx one thread. Where this is
  // true, the CPU engine runs data gradients on its configured count of threads whatever the count in
  // use, so that their bits do not follow the load.
  static constexpr bool data_gradient_follows_thread_count = DNNL_VERSION_MAJOR >= 3;

  // How a pass keeps its bits whatever the count of threads in use (above).
  enum class thread_rule : std::uint8_t {
    per_output,   // its kernel sums each output on one thread in a fixed order: any count in use
    pieces,       // a weight gradient in one-thread pieces: any count in use
    fixed_count,  // its kernel's sums may follow the thread count: the configured count always
  };
  // The rule for a pass by the kernel oneDNN chose for it (`impl`, its implementation name) and
  // whether it is a weight gradient in pieces.
  static thread_rule rule_for(pass which, const std::string& impl, bool in_pieces) noexcept {
    if (in_pieces) return thread_rule::pieces;
    if (which == pass::backward_weights) return thread_rule::fixed_count;
    if (which == pass::backward_data && data_gradient_follows_thread_count) return thread_rule::fixed_count;
    const auto has = [&](const char* part) { return impl.find(part) != std::string::npos; };
    if (has("amx") || has("brg") || has("gemm")) return thread_rule::fixed_count;
    if (has("ref") || impl.rfind("jit:", 0) == 0 || impl.rfind("jit_bf16:", 0) == 0 || impl.rfind("jit_wino", 0) == 0)
      return thread_rule::per_output;
    return thread_rule::fixed_count;
  }
  static const char* to_string(thread_rule r) noexcept {
    switch (r) {
      case thread_rule::per_output: return "one thread per output";
      case thread_rule::pieces: return "one-thread pieces";
      case thread_rule::fixed_count: return "the configured count";
    }
    return "?";
  }
  // The ISA oneDNN dispatches to on this CPU, for logs and tests: "avx512_core_amx", "avx512_core_bf16", ...
  static std::string isa() {
    switch (dnnl_get_effective_cpu_isa()) {
      case dnnl_cpu_isa_sse41: return "sse41";
      case dnnl_cpu_isa_avx: return "avx";
      case dnnl_cpu_isa_avx2: return "avx2";
      case dnnl_cpu_isa_avx512_core: return "avx512_core";
      case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
      case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
      case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
      default: return "isa " + std::to_string(static_cast<int>(dnnl_get_effective_cpu_isa()));
    }
  }

  // `pieces`: the weight gradients' grid (above); 1 computes each as one primitive on the calling
  // thread's OpenMP threads.
  explicit dnnl_conv(int pieces = 1) : pieces_{std::max(1, pieces)} {
    check(dnnl_engine_create(&engine_raw_, dnnl_cpu, 0), "dnnl_engine_create");
    engine_.reset(engine_raw_);
    dnnl_stream_t s = nullptr;
    check(dnnl_stream_create(&s, engine_raw_, dnnl_stream_default_flags), "dnnl_stream_create");
    stream_.reset(s);
  }

  // oneDNN needs right padding that gives exactly the output extents; where the window leaves input
  // rows unused at the far edge that padding is negative, which not every oneDNN kernel accepts.
  static bool supports(const conv_geometry& g) noexcept {
    return right_pad(g.in_height, g.out_height, g) >= 0 && right_pad(g.in_width, g.out_width, g) >= 0;
  }

  // Where Winograd's kernel is faster than the direct one (measured on two Zen 4 cores, one and two
  // threads, oneDNN 2.6.3): a 3x3 window at stride 1 with at least 32 channels in and out, over at
  // least 1024 output pixels an example (32x32); smaller planes or fewer channels leave its
  // transforms more costly than the multiplications they save. The rule reads no batch size, so an
  // example computes alike however a batch is split between replicas.
  static bool winograd_pays(const conv_geometry& g) noexcept {
    return g.kernel == 3 && g.stride == 1 && g.in_channels >= 32 && g.out_channels >= 32 && g.out_height * g.out_width >= 1024;
  }

  // Where a Winograd data gradient is computed as its inside and its edges (above): a 3x3 window at
  // stride 1 without padding, whose input plane takes one more row or column of 4x4 tiles than its
  // output plane (the output's extent is 0 or 3 modulo 4).
  static bool splits_border(const conv_geometry& g) noexcept {
    const auto tiles = [](std::int64_t n) { return (n + 3) / 4; };
    return g.kernel == 3 && g.stride == 1 && g.pad == 0 && g.batch > 0 &&
           (tiles(g.in_height) > tiles(g.out_height) || tiles(g.in_width) > tiles(g.out_width));
  }

  // Where a convolution's gradients are computed as passes of its swapped convolution (above): stride
  // 1, fewer than 8 output channels from at least 16 input channels, and the same padding on both
  // sides of each dimension (every stride-1 geometry conv_geometry::of makes).
  static bool swaps_sides(const conv_geometry& g) noexcept {
    return g.stride == 1 && g.out_channels < 8 && g.in_channels >= 16 && g.pad < g.kernel &&
           right_pad(g.in_height, g.out_height, g) == g.pad && right_pad(g.in_width, g.out_width, g) == g.pad;
  }
  // The swapped convolution of g (above): g's output plane in, g's input plane out, padding k-1-p.
  static conv_geometry swapped(const conv_geometry& g) noexcept {
    return {g.batch, g.out_channels, g.out_height, g.out_width, g.in_channels, g.kernel, 1, g.kernel - 1 - g.pad,
            g.in_height, g.in_width};
  }

  // y = conv(x, w) + bias (bias may be null). False (nothing done) where `half` has no kernel.
  // With `round`, on x and w rounded to bfloat16 (above).
  bool forward(const conv_geometry& g, const float* x, const float* w, const float* bias, float* y, arena& a, bool half = false,
               bool winograd = false, bool round = false) {
    plan* found = plan_for(pass::forward, g, bias != nullptr, half, winograd);
    if (!found) return false;
    plan& p = *found;
    dnnl_memory_t src = p.a.in(stream(), x, a, arena::src, round, arena::rounded_a);
    dnnl_memory_t wei = p.b.in(stream(), w, a, arena::weights, round, arena::rounded_c);
    dnnl_memory_t dst = p.c.out(y, a, arena::dst);
    std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias) args.push_back({DNNL_ARG_BIAS, p.bias.point(bias)});
    run(p, args, a);
    p.c.back(stream(), y);
    check(dnnl_stream_wait(stream()), "dnnl_stream_wait");
    return true;
  }

  // dx = the data gradient of conv for dy (overwritten). False where `half` has no kernel.
  bool backward_data(const conv_geometry& g, const float* dy, const float* w, float* dx, arena& a, bool half = false,
                     bool winograd = false, bool round = false) {
    if (swaps_sides(g)) {
      float* turned = a.get<float>(arena::swapped, static_cast<std::size_t>(g.weight_size()));
      turn_window(g.out_channels, g.in_channels, g.kernel, w, turned);
      if (!forward(swapped(g), dy, turned, nullptr, dx, a, half, false, round)) return false;
      ++swapped_passes_;
      return true;
    }
    plan* found = data_plan_for(g, half, winograd);
    if (!found) return false;
    plan& p = *found;
    run_backward_data(p, g, p.a.in(stream(), dy, a, arena::dst, round, arena::rounded_b), dy, w, dx, a, round);
    return true;
  }

  // dw += the weight gradient for (x, dy); db += the sum of dy per channel (db may be null). False
  // where `half` has no kernel.
  bool backward_weights(const conv_geometry& g, const float* x, const float* dy, float* dw, float* db, arena& a,
                        bool half = false, bool winograd = false, bool round = false) {
    if (swaps_sides(g)) {
      // In bfloat16 on float32 copies rounded to bfloat16 (above; plan_of picks the float32 plan).
      plan* found = plan_of(pass::backward_weights, g, false, half, winograd);
      if (!found) return false;
      const conv_geometry s = swapped(g);
      const auto n = static_cast<std::size_t>(g.weight_size());
      float* turned = a.get<float>(arena::swapped, n);
      std::fill_n(turned, n, 0.0f);
      run_backward_weights(*found, s, dy, x, turned, nullptr, a, round || half);
      // turn_window(in, out) takes the swapped window [in][out] back to g's [out][in], added to dw.
      turn_window(g.in_channels, g.out_channels, g.kernel, turned, dw, true);
      if (db) bias_gradient(g, dy, db, half || round);
      ++swapped_passes_;
      return true;
    }
    plan* found = plan_for(pass::backward_weights, g, db != nullptr, half, winograd);
    if (!found) return false;
    run_backward_weights(*found, g, x, dy, dw, db, a, round);
    return true;
  }

  // Both gradients of one convolution for the same dy: dw += the weight gradient (db += the sum of
  // dy per channel, db may be null) and, where dx is not null, dx = the data gradient (overwritten).
  // Where the two primitives read dy in the same layout, dy is reordered into it once for both (the
  // weight gradient runs first and the data gradient reads its copy). False (nothing done) where
  // `half` has no kernel for either pass, and for a convolution whose gradients are its swapped
  // convolution's passes (swaps_sides); the caller then runs them one by one.
  bool backward(const conv_geometry& g, const float* x, const float* dy, const float* w, float* dx, float* dw, float* db,
                arena& a, bool half = false, bool winograd = false, bool round = false) {
    // The swapped convolution's passes read dy in different roles: the caller runs them one by one.
    if (swaps_sides(g)) return false;
    plan* weights_plan = plan_for(pass::backward_weights, g, db != nullptr, half, winograd);
    plan* data_plan = dx ? data_plan_for(g, half, winograd) : nullptr;
    if (!weights_plan || (dx && !data_plan)) return false;
    const bool shared = data_plan && operand::same_layout(weights_plan->b, data_plan->a);
    run_backward_weights(*weights_plan, g, x, dy, dw, db, a, round);
    if (!data_plan) return true;
    plan& p = *data_plan;
    dnnl_memory_t ddst = shared ? p.a.reordered(a, arena::dst) : p.a.in(stream(), dy, a, arena::dst, round, arena::rounded_b);
    run_backward_data(p, g, ddst, dy, w, dx, a, round);
    return true;
  }

  // The implementation oneDNN chose for a pass (for example "jit:avx2", "jit_bf16:avx512_core_bf16",
  // "jit_wino_4x3:avx512_core"), for logs and benchmarks; "" where `half` has no kernel.
  // The gradients of a convolution that swaps_sides name the swapped convolution's kernels.
  std::string implementation(pass which, const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    const plan* p = pass_plan(which, g, bias, half, winograd);
    return p ? p->impl : std::string();
  }
  // The rule by which a pass keeps its bits on any count of threads in use (above), for the plan the
  // pass runs on (made here if it is not yet); per_output where `half` has no kernel (the caller
  // computes the pass another way). The swapped convolution's data gradient is its forward; a data
  // gradient split at its border is its inside's Winograd pass and edges of one thread each.
  thread_rule rule(pass which, const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    const plan* p = pass_plan(which, g, bias, half, winograd);
    return p ? p->rule : thread_rule::per_output;
  }
  std::size_t plans() const noexcept { return plans_.size(); }
  // The reorders run so far (into and out of the primitives' layouts), for tests and logs.
  std::size_t reorders() const noexcept { return reorders_; }
  // The data gradients computed as their inside and their edges so far (splits_border), for tests.
  std::size_t border_splits() const noexcept { return border_splits_; }
  // The grid of pieces a weight gradient of g is computed in (above): output-channel blocks, input-channel
  // blocks and runs of examples; all 1 where it is one primitive. For tests and logs.
  struct grid {
    std::int64_t out_blocks = 1, in_blocks = 1, runs = 1;
    std::int64_t count() const noexcept { return out_blocks * in_blocks * runs; }
  };
  // Where g swaps_sides, the swapped convolution's grid in g's terms (its output blocks are g's input blocks).
  grid weight_grid(const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    const plan* p = plan_of(pass::backward_weights, g, bias, half, winograd);
    if (!p || !p->sliced) return grid{};
    grid shape = p->sliced->shape;
    if (swaps_sides(g)) std::swap(shape.out_blocks, shape.in_blocks);
    return shape;
  }
  // Whether a weight gradient of g is computed in pieces (above), for tests and logs.
  bool in_pieces(const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    const plan* p = plan_of(pass::backward_weights, g, bias, half, winograd);
    return p && p->sliced;
  }
  // The passes computed through a swapped convolution so far (swaps_sides), for tests.
  std::size_t swapped_passes() const noexcept { return swapped_passes_; }

  // Whether the oneDNN loaded has a Winograd kernel for this CPU (asked once, with a convolution
  // winograd_pays accepts).
  static bool has_winograd() {
    static const bool has = [] {
      dnnl_conv probe;
      const conv_geometry g = conv_geometry::of(1, 32, 32, 32, 32, 3, 1, 1);
      return probe.implementation(pass::forward, g, false, false, true).find("wino") != std::string::npos;
    }();
    return has;
  }

  // The oneDNN this program runs on, for logs: "oneDNN 3.2.0" (the library loaded, which is the one
  // the build found unless the loader was pointed elsewhere).
  static std::string library() {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }

 private:
  static void check(dnnl_status_t s, const char* what) {
    if (s != dnnl_success)
      throw std::runtime_error(std::string("distribute: oneDNN's ") + what + " failed with status " + std::to_string(static_cast<int>(s)));
  }
  template <class T, dnnl_status_t (*Destroy)(T)>
  struct deleter {
    void operator()(T p) const noexcept {
      if (p) Destroy(p);
    }
  };
  template <class T, dnnl_status_t (*Destroy)(T)>
  using handle = std::unique_ptr<std::remove_pointer_t<T>, deleter<T, Destroy>>;
  using memory_handle = handle<dnnl_memory_t, dnnl_memory_destroy>;
  using primitive_handle = handle<dnnl_primitive_t, dnnl_primitive_destroy>;
  using desc_handle = handle<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy>;

  static std::int64_t right_pad(std::int64_t in, std::int64_t out, const conv_geometry& g) noexcept {
    return (out - 1) * g.stride + g.kernel - in - g.pad;
  }

#if DNNL_VERSION_MAJOR >= 3
  using md_ptr = const_dnnl_memory_desc_t;  // what oneDNN's functions take and its queries return
  using md_handle = handle<dnnl_memory_desc_t, dnnl_memory_desc_destroy>;
  // A memory descriptor: a handle oneDNN allocates, destroyed with this object.
  class memory_desc {
   public:
    memory_desc(const std::vector<dnnl_dim_t>& dims, dnnl_format_tag_t tag, dnnl_data_type_t type) {
      dnnl_memory_desc_t raw = nullptr;
      check(dnnl_memory_desc_create_with_tag(&raw, static_cast<int>(dims.size()), dims.data(), type, tag),
            "dnnl_memory_desc_create_with_tag");
      d_.reset(raw);
    }
    memory_desc(const std::vector<dnnl_dim_t>& dims, const std::vector<dnnl_dim_t>& strides, dnnl_data_type_t type) {
      dnnl_memory_desc_t raw = nullptr;
      check(dnnl_memory_desc_create_with_strides(&raw, static_cast<int>(dims.size()), dims.data(), type, strides.data()),
            "dnnl_memory_desc_create_with_strides");
      d_.reset(raw);
    }
    md_ptr get() const noexcept { return d_.get(); }

   private:
    md_handle d_;
  };
#else
  using md_ptr = const dnnl_memory_desc_t*;
  // A memory descriptor: a plain struct in oneDNN 2.x.
  class memory_desc {
   public:
    memory_desc(const std::vector<dnnl_dim_t>& dims, dnnl_format_tag_t tag, dnnl_data_type_t type) {
      check(dnnl_memory_desc_init_by_tag(&d_, static_cast<int>(dims.size()), dims.data(), type, tag),
            "dnnl_memory_desc_init_by_tag");
    }
    memory_desc(const std::vector<dnnl_dim_t>& dims, const std::vector<dnnl_dim_t>& strides, dnnl_data_type_t type) {
      check(dnnl_memory_desc_init_by_strides(&d_, static_cast<int>(dims.size()), dims.data(), type, strides.data()),
            "dnnl_memory_desc_init_by_strides");
    }
    md_ptr get() const noexcept { return &d_; }

   private:
    dnnl_memory_desc_t d_{};
  };
#endif
  static memory_desc md(const std::vector<dnnl_dim_t>& dims, dnnl_format_tag_t tag, dnnl_data_type_t type = dnnl_f32) {
    return memory_desc(dims, tag, type);
  }
  // An operand's descriptor in a primitive descriptor; valid while that primitive descriptor lives.
  static md_ptr query(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    md_ptr d = dnnl_primitive_desc_query_md(pd, what, 0);
    if (!d) throw std::runtime_error("distribute: oneDNN returned no memory descriptor for a convolution operand");
    return d;
  }

  // A memory object of a fixed descriptor, pointed at new data on each call.
  struct memory {
    memory_handle m;
    void make(dnnl_engine_t e, md_ptr d) {
      dnnl_memory_t raw = nullptr;
      check(dnnl_memory_create(&raw, d, e, DNNL_MEMORY_NONE), "dnnl_memory_create");
      m.reset(raw);
    }
    dnnl_memory_t point(const void* data) const {
      check(dnnl_memory_set_data_handle(m.get(), const_cast<void*>(data)), "dnnl_memory_set_data_handle");
      return m.get();
    }
  };

  // One operand: the caller's layout, the primitive's, and the reorder between them when they differ.
  struct operand {
    memory user, lib;
    std::size_t lib_bytes = 0;  // the size of the primitive's layout
    std::int64_t count = 0;     // the values, in the caller's layout
    bool same = true;
    // An activation [n, c, h, w] whose primitive layout is nChw16c with whole blocks of channels:
    // in() with rounding writes that layout itself.
    bool blocked16 = false;
    std::int64_t n = 0, c = 0, hw = 0;
    primitive_handle reorder;
    std::size_t* reorders = nullptr;  // the reorders run (dnnl_conv::reorders_)

    // With `accumulate` (an output), the reorder back adds to the caller's values instead of
    // overwriting them (oneDNN's sum post-op: dst = src + dst, one rounding, as `+=`).
    // `dims`: an activation's [n, c, h, w] (empty for weights).
    void set(dnnl_engine_t e, md_ptr u, md_ptr l, bool input, std::size_t& counter, bool accumulate = false,
             const std::vector<dnnl_dim_t>& dims = {}) {
      reorders = &counter;
      lib_bytes = dnnl_memory_desc_get_size(l);
      count = static_cast<std::int64_t>(dnnl_memory_desc_get_size(u) / sizeof(float));
      same = dnnl_memory_desc_equal(u, l) != 0;
      if (dims.size() == 4 && dims[1] % 16 == 0) {
        n = dims[0], c = dims[1], hw = dims[2] * dims[3];
        blocked16 = dnnl_memory_desc_equal(l, md(dims, dnnl_nChw16c).get()) != 0;
      }
      user.make(e, u);
      if (same) return;
      lib.make(e, l);
      reorder = input ? make_reorder(e, u, l, false) : make_reorder(e, l, u, accumulate);
    }
    // The operand as the primitive reads it: the caller's memory, or a reordered copy in scratch slot
    // `slot`. With `round`, its values rounded to bfloat16: written in the primitive's layout at once
    // where that is blocked16, else a rounded copy in slot `plain` (reordered where it has to be).
    dnnl_memory_t in(dnnl_stream_t s, const float* data, arena& a, arena::slot slot, bool round = false,
                     arena::slot plain = arena::rounded_a) const {
      if (round && blocked16) {
        float* blocks = a.get<float>(slot, lib_bytes / sizeof(float));
        round_into_blocks(data, blocks, n, c, hw);
        return lib.point(blocks);
      }
      if (round) {
        float* copy = a.get<float>(plain, static_cast<std::size_t>(count));
        round_copy(data, copy, count);
        data = copy;
      }
      dnnl_memory_t um = user.point(data);
      if (same) return um;
      dnnl_memory_t lm = lib.point(a.get<std::byte>(slot, lib_bytes));
      const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, lm}};
      check(dnnl_primitive_execute(reorder.get(), s, 2, args), "reorder");
      ++*reorders;
      return lm;
    }
    // The copy in the primitive's layout that `in` left in scratch slot `slot` (nothing else may have
    // used the slot since).
    dnnl_memory_t reordered(arena& a, arena::slot slot) const { return lib.point(a.get<std::byte>(slot, lib_bytes)); }
    // Whether two operands are reordered into the same layout (so one copy serves both).
    static bool same_layout(const operand& x, const operand& y) {
      if (x.same || y.same) return false;
      return dnnl_memory_desc_equal(x.lib_desc(), y.lib_desc()) != 0;
    }
    md_ptr lib_desc() const {
      md_ptr d = nullptr;
      check(dnnl_memory_get_memory_desc(lib.m.get(), &d), "dnnl_memory_get_memory_desc");
      return d;
    }
    // Where the primitive writes: the caller's memory, or scratch to reorder back from.
    dnnl_memory_t out(float* data, arena& a, arena::slot slot) const {
      if (same) return user.point(data);
      return lib.point(a.get<std::byte>(slot, lib_bytes));
    }
    void back(dnnl_stream_t s, float* data) const {
      if (same) return;
      const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, lib.m.get()}, {DNNL_ARG_TO, user.point(data)}};
      check(dnnl_primitive_execute(reorder.get(), s, 2, args), "reorder");
      ++*reorders;
    }
  };

  // The primitive of `pd`; `what` names it in the error.
  static primitive_handle make_primitive(const_dnnl_primitive_desc_t pd, const char* what) {
    dnnl_primitive_t raw = nullptr;
    check(dnnl_primitive_create(&raw, pd), what);
    return primitive_handle{raw};
  }
  // The implementation oneDNN chose for `pd` ("jit:avx512_core", ...; "" where it does not say).
  static std::string impl_of(const_dnnl_primitive_desc_t pd) {
    const char* impl = nullptr;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl ? std::string(impl)
                                                                                                    : std::string();
  }
  // A reorder from layout `from` to `to`; with `accumulate` it adds to what `to` holds (oneDNN's sum
  // post-op: dst = src + dst, one rounding, as `+=`).
  static primitive_handle make_reorder(dnnl_engine_t e, md_ptr from, md_ptr to, bool accumulate) {
    handle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy> attr;
    if (accumulate) {
      dnnl_primitive_attr_t raw_attr = nullptr;
      check(dnnl_primitive_attr_create(&raw_attr), "dnnl_primitive_attr_create");
      attr.reset(raw_attr);
      dnnl_post_ops_t raw_ops = nullptr;
      check(dnnl_post_ops_create(&raw_ops), "dnnl_post_ops_create");
      const handle<dnnl_post_ops_t, dnnl_post_ops_destroy> ops{raw_ops};
#if DNNL_VERSION_MAJOR >= 3
      check(dnnl_post_ops_append_sum(raw_ops, 1.0f, 0, dnnl_data_type_undef), "dnnl_post_ops_append_sum");
#else
      check(dnnl_post_ops_append_sum(raw_ops, 1.0f), "dnnl_post_ops_append_sum");
#endif
      check(dnnl_primitive_attr_set_post_ops(raw_attr, raw_ops), "dnnl_primitive_attr_set_post_ops");
    }
    dnnl_primitive_desc_t rpd = nullptr;
    check(dnnl_reorder_primitive_desc_create(&rpd, from, e, to, e, attr.get()), "dnnl_reorder_primitive_desc_create");
    const desc_handle owned{rpd};
    return make_primitive(rpd, "dnnl_primitive_create (reorder)");
  }

  // A value rounded to bfloat16 (distribute::bfloat16's rounding), kept in float.
  static float to_bfloat16(float v) noexcept { return static_cast<float>(bfloat16(v)); }
  // to[i] = from[i] rounded, for i < count, on the calling thread's OpenMP threads.
  static void round_copy(const float* from, float* to, std::int64_t count) noexcept {
#if defined(_OPENMP)
#  pragma omp parallel for simd schedule(static)
#endif
    for (std::int64_t i = 0; i < count; ++i) to[i] = to_bfloat16(from[i]);
  }
  // An [n, c, hw] tensor rounded into nChw16c (c a multiple of 16): block b's position p holds its 16
  // channels' values at p. One pass in place of a rounded copy and oneDNN's reorder of it.
  static void round_into_blocks(const float* from, float* to, std::int64_t n, std::int64_t c, std::int64_t hw) noexcept {
    constexpr std::int64_t run = 64;  // positions per work item: 16 rows of 256 contiguous bytes read
    const std::int64_t blocks = n * (c / 16), runs = (hw + run - 1) / run;
#if defined(_OPENMP)
#  pragma omp parallel for schedule(static)
#endif
    for (std::int64_t item = 0; item < blocks * runs; ++item) {
      const std::int64_t b = item / runs, start = item % runs * run, end = std::min(start + run, hw);
      const float* src = from + b * 16 * hw;
      float* dst = to + b * 16 * hw;
      for (std::int64_t q = start; q < end; ++q) {
#if defined(_OPENMP)
#  pragma omp simd
#endif
        for (std::int64_t k = 0; k < 16; ++k) dst[q * 16 + k] = to_bfloat16(src[k * hw + q]);
      }
    }
  }

  struct pieces;
  struct plan {
    primitive_handle prim;
    std::string impl;
    thread_rule rule = thread_rule::fixed_count;
    std::size_t scratchpad_bytes = 0;
    memory scratchpad, bias;
    operand a, b, c;  // forward: src, weights, dst; data gradient: diff_dst, weights, diff_src;
                      // weight gradient: src, diff_dst, diff_weights
    operand window;   // a data gradient's inside (splits_border): the weights as [kh][kw][in][out]
    std::unique_ptr<pieces> sliced;  // a weight gradient in pieces (a, b: x and dy; no c)
  };
  using key = std::array<std::int64_t, 15>;

  // A weight gradient's pieces (above): one-thread primitives over one example's block of channels.
  struct pieces {
    grid shape;
    std::int64_t out_channels = 0, in_channels = 0;  // of one piece
    std::int64_t examples = 1;                        // of one primitive call: a whole run, or one
    // The layouts of x and dy as a piece reads them: channels (padded to blocks of 16 where blocked)
    // and plane size, and the bytes of a value, to find an example's block in the whole tensor.
    std::int64_t x_channels = 0, x_plane = 0, dy_channels = 0, dy_plane = 0;
    std::size_t value_bytes = 4;
    primitive_handle plain, with_bias;  // the piece's primitive without and with the bias gradient
    primitive_handle back;              // its gradient's layout -> the caller's [out][in][k][k] block, added
    std::size_t scratchpad_bytes = 0, gradient_bytes = 0;
    struct thread_state {  // what one thread points at the data: memory objects and its stream
      handle<dnnl_stream_t, dnnl_stream_destroy> stream;
      memory src, ddst, dwei, bias, scratchpad, block;
    };
    std::vector<thread_state> threads;
  };

  dnnl_stream_t stream() const noexcept { return stream_.get(); }

  void run(plan& p, std::vector<dnnl_exec_arg_t>& args, arena& a) {
    if (p.scratchpad_bytes > 0)
      args.push_back({DNNL_ARG_SCRATCHPAD, p.scratchpad.point(a.get<std::byte>(arena::workspace, p.scratchpad_bytes))});
    check(dnnl_primitive_execute(p.prim.get(), stream(), static_cast<int>(args.size()), args.data()), "convolution");
  }

  // The plan of geometry g's data gradient: its inside's where splits_border applies and oneDNN has
  // the Winograd kernel for it, the whole pass's otherwise.
  plan* data_plan_for(const conv_geometry& g, bool half, bool winograd) {
    if (winograd && !half && splits_border(g))
      if (plan* inside = plan_for(pass::backward_data, g, false, half, winograd, true)) return inside;
    return plan_for(pass::backward_data, g, false, half, winograd);
  }

  // The data gradient of geometry g by plan `p` (g's own, or its inside's) from `ddst` (dy as the
  // primitive reads it) into dx.
  void run_backward_data(plan& p, const conv_geometry& g, dnnl_memory_t ddst, const float* dy, const float* w, float* dx,
                         arena& a, bool round) {
    const bool inside = p.window.lib_bytes > 0;
    float* written = inside ? dx + g.in_width + 1 : dx;  // the inside starts at row 1, column 1
    dnnl_memory_t wei = p.b.in(stream(), w, a, arena::weights, round, arena::rounded_c);
    dnnl_memory_t dsrc = p.c.out(written, a, arena::src);
    std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}};
    run(p, args, a);
    p.c.back(stream(), written);
    check(dnnl_stream_wait(stream()), "dnnl_stream_wait");
    // Rounded, the edges read the weights' rounded copy (in() left it in rounded_c: the weights are
    // never blocked16) and round dy's rows and columns as they gather them.
    if (inside) edges(p, g, dy, round ? a.get<float>(arena::rounded_c, static_cast<std::size_t>(g.weight_size())) : w, dx, a, round);
  }

  // The outermost rows and columns of a split data gradient (splits_border) into dx: row 0 of the
  // input plane is reached only by the window's row 0 over dy's row 0 (dx[c][0][j] = sum over o and
  // kw of dy[o][0][j - kw] w[o][c][0][kw]), its last row by window row 2 over dy's last row, and
  // likewise the outermost columns; each is three products of the window's [in][out] slices with
  // dy's row or column, one per window column (row), added at its offset. The rows take the corners.
  // With `round`, w is already rounded to bfloat16 and dy's rows and columns are as they are gathered.
  void edges(plan& p, const conv_geometry& g, const float* dy, const float* w, float* dx, arena& a, bool round) {
    ++border_splits_;
    const std::int64_t n_ex = g.batch, C = g.in_channels, K = g.out_channels, H = g.out_height, W = g.out_width;
    const std::int64_t P = g.in_height, Q = g.in_width, L = std::max(H, W);
    p.window.in(stream(), w, a, arena::weights);
    check(dnnl_stream_wait(stream()), "dnnl_stream_wait");
    const float* window = a.get<float>(arena::weights, static_cast<std::size_t>(g.weight_size()));
    // dy's first and last rows and columns, contiguous: [n][edge][o][L].
    float* lines = a.get<float>(arena::columns, static_cast<std::size_t>(n_ex * 4 * K * L));
    // The column edges land here first ([n][side][c][r], all P rows), then in dx without the corners.
    float* side = a.get<float>(arena::gradient, static_cast<std::size_t>(n_ex * 2 * C * P));
    const std::int64_t items = n_ex * 4;
    parallel_items(items, openmp_threads(), [&](std::int64_t item) {
      const std::int64_t n = item / 4, edge = item % 4;  // 0 top, 1 bottom, 2 left, 3 right
      const float* dyn = dy + n * K * H * W;
      float* dxn = dx + n * C * P * Q;
      float* line = lines + item * K * L;
      const bool row_edge = edge < 2;
      const std::int64_t length = row_edge ? W : H, at = edge % 2 == 0 ? 0 : (row_edge ? H - 1 : W - 1);
      for (std::int64_t o = 0; o < K; ++o)
        for (std::int64_t i = 0; i < length; ++i) {
          const float v = row_edge ? dyn[(o * H + at) * W + i] : dyn[(o * H + i) * W + at];
          line[o * L + i] = round ? to_bfloat16(v) : v;
        }
      if (row_edge) {
        // A row of the input plane: C x Q with rows P*Q apart.
        float* row = dxn + (edge == 0 ? 0 : (P - 1) * Q);
        for (std::int64_t c = 0; c < C; ++c) std::fill(row + c * P * Q, row + c * P * Q + Q, 0.0f);
        const std::int64_t kh = edge == 0 ? 0 : 2;
        for (std::int64_t kw = 0; kw < 3; ++kw)
          check(dnnl_sgemm('N', 'N', C, W, K, 1.0f, window + (kh * 3 + kw) * C * K, K, line, L, 1.0f, row + kw, P * Q),
                "dnnl_sgemm");
      } else {
        float* out = side + (n * 2 + edge - 2) * C * P;
        std::fill(out, out + C * P, 0.0f);
        const std::int64_t kw = edge == 2 ? 0 : 2;
        for (std::int64_t kh = 0; kh < 3; ++kh)
          check(dnnl_sgemm('N', 'N', C, H, K, 1.0f, window + (kh * 3 + kw) * C * K, K, line, L, 1.0f, out + kh, P), "dnnl_sgemm");
        const std::int64_t x = edge == 2 ? 0 : Q - 1;
        for (std::int64_t c = 0; c < C; ++c)
          for (std::int64_t i = 1; i < P - 1; ++i) dxn[(c * P + i) * Q + x] = out[c * P + i];
      }
    });
  }
  // The weight gradient of plan `p`, added to dw (and db where not null). dy's copy in the
  // primitive's layout, where it needs one, is left in the arena's `dst` slot (backward reads it).
  void run_backward_weights(plan& p, const conv_geometry& g, const float* x, const float* dy, float* dw, float* db, arena& a,
                            bool round) {
    dnnl_memory_t src = p.a.in(stream(), x, a, arena::src, round, arena::rounded_a);
    dnnl_memory_t ddst = p.b.in(stream(), dy, a, arena::dst, round, arena::rounded_b);
    if (p.sliced) {
      check(dnnl_stream_wait(stream()), "dnnl_stream_wait");
      run_pieces(*p.sliced, g, data_of(src), data_of(ddst), dw, db, a);
      return;
    }
    // oneDNN overwrites the gradient: it lands in its layout in scratch and the reorder back adds it
    // to dw; where that layout is the caller's, in scratch too, added below.
    float* dw_user = p.c.same ? a.get<float>(arena::gradient, static_cast<std::size_t>(g.weight_size())) : dw;
    dnnl_memory_t dwei = p.c.out(dw_user, a, arena::weights);
    std::vector<dnnl_exec_arg_t> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}};
    float* db_user = nullptr;
    if (db) {
      db_user = a.get<float>(arena::bias_gradient, static_cast<std::size_t>(g.out_channels));
      args.push_back({DNNL_ARG_DIFF_BIAS, p.bias.point(db_user)});
    }
    run(p, args, a);
    p.c.back(stream(), dw);
    check(dnnl_stream_wait(stream()), "dnnl_stream_wait");
    if (p.c.same)
      for (std::int64_t i = 0; i < g.weight_size(); ++i) dw[i] += dw_user[i];
    if (db)
      for (std::int64_t i = 0; i < g.out_channels; ++i) db[i] += db_user[i];
  }

  static const std::byte* data_of(dnnl_memory_t m) {
    void* d = nullptr;
    check(dnnl_memory_get_data_handle(m, &d), "dnnl_memory_get_data_handle");
    return static_cast<const std::byte*>(d);
  }

  // A weight gradient in pieces (above), added to dw (and db where not null) from x and dy in the
  // pieces' layouts (`xs`, `dys`), on the calling thread's OpenMP threads (at most one per piece).
  void run_pieces(pieces& q, const conv_geometry& g, const std::byte* xs, const std::byte* dys, float* dw, float* db, arena& a) {
    const grid shape = q.shape;
    const std::int64_t items = shape.count(), weights = g.weight_size(), window = g.kernel * g.kernel;
    // With more than one run of examples each run sums into its own [weights, bias] buffer.
    const std::int64_t run_size = weights + g.out_channels;
    float* sums = shape.runs > 1 ? a.get<float>(arena::gradient, static_cast<std::size_t>(shape.runs * run_size)) : nullptr;
    if (sums) std::fill(sums, sums + shape.runs * run_size, 0.0f);
    const int team = static_cast<int>(std::min<std::int64_t>({openmp_threads(), static_cast<std::int64_t>(q.threads.size()), items}));
    const auto aligned = [](std::size_t bytes) { return (bytes + 63) / 64 * 64; };
    const std::size_t scratch_step = aligned(q.scratchpad_bytes), gradient_step = aligned(q.gradient_bytes),
                      bias_step = aligned(static_cast<std::size_t>(q.out_channels) * sizeof(float));
    std::byte* scratch = a.get<std::byte>(arena::workspace, std::max<std::size_t>(scratch_step, 64) * static_cast<std::size_t>(team));
    std::byte* gradients = a.get<std::byte>(arena::weights, gradient_step * static_cast<std::size_t>(team));
    std::byte* biases = a.get<std::byte>(arena::bias_gradient, bias_step * static_cast<std::size_t>(team));
    parallel_items(items, team, [&](std::int64_t item) {
#if defined(_OPENMP)
      const int t = omp_get_thread_num();
#else
      const int t = 0;
#endif
      auto& ts = q.threads[static_cast<std::size_t>(t)];
      const std::int64_t run = item / (shape.out_blocks * shape.in_blocks), o = item / shape.in_blocks % shape.out_blocks,
                         i = item % shape.in_blocks;
      float* to = sums ? sums + run * run_size : dw;
      float* to_bias = sums ? sums + run * run_size + weights : db;
      const bool bias = db && i == 0;
      float* bias_out = reinterpret_cast<float*>(biases + bias_step * static_cast<std::size_t>(t));
      dnnl_memory_t gradient = ts.dwei.point(gradients + gradient_step * static_cast<std::size_t>(t));
      dnnl_memory_t block = ts.block.point(to + (o * q.out_channels * g.in_channels + i * q.in_channels) * window);
      const std::int64_t first = run * g.batch / shape.runs, last = (run + 1) * g.batch / shape.runs;
      for (std::int64_t n = first; n < last; n += q.examples) {
        std::array<dnnl_exec_arg_t, 5> args{
            {{DNNL_ARG_SRC,
              ts.src.point(xs + static_cast<std::size_t>((n * q.x_channels + i * q.in_channels) * q.x_plane) * q.value_bytes)},
             {DNNL_ARG_DIFF_DST,
              ts.ddst.point(dys + static_cast<std::size_t>((n * q.dy_channels + o * q.out_channels) * q.dy_plane) * q.value_bytes)},
             {DNNL_ARG_DIFF_WEIGHTS, gradient}}};
        int used = 3;
        if (bias) args[static_cast<std::size_t>(used++)] = {DNNL_ARG_DIFF_BIAS, ts.bias.point(bias_out)};
        if (q.scratchpad_bytes > 0)
          args[static_cast<std::size_t>(used++)] = {DNNL_ARG_SCRATCHPAD, ts.scratchpad.point(scratch + scratch_step * static_cast<std::size_t>(t))};
        check(dnnl_primitive_execute((bias ? q.with_bias : q.plain).get(), ts.stream.get(), used, args.data()),
              "convolution (a weight gradient's piece)");
        const dnnl_exec_arg_t back[2] = {{DNNL_ARG_FROM, gradient}, {DNNL_ARG_TO, block}};
        check(dnnl_primitive_execute(q.back.get(), ts.stream.get(), 2, back), "reorder");
        check(dnnl_stream_wait(ts.stream.get()), "dnnl_stream_wait");
        if (bias)
          for (std::int64_t j = 0; j < q.out_channels; ++j) to_bias[o * q.out_channels + j] += bias_out[j];
      }
    });
    if (!sums) return;
    // The runs in order, then into the caller's gradient (one rounding more than a single run).
    const std::int64_t total = db ? run_size : weights;
#if defined(_OPENMP)
#  pragma omp parallel for num_threads(team) schedule(static)
#endif
    for (std::int64_t j = 0; j < total; ++j) {
      float sum = sums[j];
      for (std::int64_t r = 1; r < shape.runs; ++r) sum += sums[r * run_size + j];
      if (j < weights) dw[j] += sum;
      else db[j - weights] += sum;
    }
  }

  // The plan a pass of g runs on as forward, backward_data and backward_weights run it: plan_of, and
  // for a data gradient split at its border (data_plan_for) its inside's.
  plan* pass_plan(pass which, const conv_geometry& g, bool bias, bool half, bool winograd) {
    if (which == pass::backward_data && !swaps_sides(g)) return data_plan_for(g, half, winograd);
    return plan_of(which, g, bias, half, winograd);
  }

  // The plan a pass of g runs on: for the gradients of a convolution that swaps_sides, the swapped
  // convolution's forward (the data gradient) or weight gradient (without bias: db is summed apart).
  plan* plan_of(pass which, const conv_geometry& g, bool bias, bool half, bool winograd) {
    if (which == pass::forward || !swaps_sides(g)) return plan_for(which, g, bias, half, winograd);
    if (which == pass::backward_data) return plan_for(pass::forward, swapped(g), false, half, false);
    return plan_for(which, swapped(g), false, false, false);  // (on rounded float32 copies in bfloat16: backward_weights)
  }

  // A window [outs][ins][k][k] turned half a turn and transposed into [ins][outs][k][k]: to[i][o][a][b]
  // = from[o][i][k-1-a][k-1-b], or with `add` to[...] += from[...]. Turning a turned window back is
  // turn_window(ins, outs, ...).
  static void turn_window(std::int64_t outs, std::int64_t ins, std::int64_t k, const float* from, float* to, bool add = false) noexcept {
    const std::int64_t k2 = k * k;
    for (std::int64_t o = 0; o < outs; ++o)
      for (std::int64_t i = 0; i < ins; ++i) {
        const float* f = from + (o * ins + i) * k2;
        float* t = to + (i * outs + o) * k2 + k2 - 1;
        for (std::int64_t q = 0; q < k2; ++q) {
          if (add)
            t[-q] += f[q];
          else
            t[-q] = f[q];
        }
      }
  }

  // db[c] += the sum of dy's channel c over the batch: each example's plane by fixed_order_sum, the
  // examples added in order, in double; a channel per thread, so the bits follow no thread count.
  // With `rounded` (bfloat16, and Winograd's `round`), of dy's values rounded to bfloat16, as the
  // passes read them.
  static void bias_gradient(const conv_geometry& g, const float* dy, float* db, bool rounded) {
    const std::int64_t plane = g.out_height * g.out_width;
    parallel_items(g.out_channels, openmp_threads(), [&](std::int64_t c) {
      double total = 0;
      for (std::int64_t n = 0; n < g.batch; ++n) {
        const float* p = dy + (n * g.out_channels + c) * plane;
        total += rounded ? fixed_order_sum([p](std::int64_t, std::int64_t i) { return to_bfloat16(p[i]); }, 0, plane)
                         : fixed_order_sum([p](std::int64_t, std::int64_t i) { return p[i]; }, 0, plane);
      }
      db[c] += static_cast<float>(total);
    });
  }

  // The plan of a pass, made on first use; null where `half` has no kernel (remembered too). Asked
  // for `winograd` where oneDNN has no such kernel (or not for this geometry), the plan is direct.
  // With `inside`, the plan of a split data gradient's inside (splits_border): Winograd only, null
  // where oneDNN has no such kernel.
  plan* plan_for(pass which, const conv_geometry& g, bool bias, bool half, bool winograd, bool inside = false) {
    const key k{static_cast<std::int64_t>(which), bias, half, winograd, inside, g.batch, g.in_channels, g.in_height,
                g.in_width, g.out_channels, g.kernel, g.stride, g.pad, g.out_height, g.out_width};
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second.get();
    std::unique_ptr<plan> made = winograd ? make_plan(which, g, bias, half, dnnl_convolution_winograd, inside) : nullptr;
    if (!made && !inside) made = make_plan(which, g, bias, half, dnnl_convolution_direct);
    return plans_.emplace(k, std::move(made)).first->second.get();
  }

  // Strides and the padding on either side, per spatial dimension.
  struct window {
    dnnl_dims_t strides, pad_l, pad_r;
  };

  // Null where oneDNN has no kernel for `half` or for `algorithm` (any other failure throws).
  // With `inside` (a data gradient, splits_border): the plan of its inside, the same convolution with
  // padding 1 over the output's plane, writing into the input plane from row 1, column 1; and the
  // window's reorder for the edges.
  std::unique_ptr<plan> make_plan(pass which, const conv_geometry& whole, bool bias, bool half, dnnl_alg_kind_t algorithm,
                                  bool inside = false) {
    const conv_geometry g = inside ? conv_geometry::of(whole.batch, whole.in_channels, whole.out_height, whole.out_width,
                                                       whole.out_channels, 3, 1, 1)
                                   : whole;
    const bool may_lack = half || algorithm != dnnl_convolution_direct;
    // A weight gradient in pieces reads x and dy in the layouts oneDNN chooses for the whole pass,
    // which may follow the thread count it is chosen for: chosen for the configured count (`pieces_`),
    // whatever the count in use, so that every count's plan cuts the same grid in the same layouts.
    std::optional<openmp_thread_count> configured;
    if (which == pass::backward_weights && pieces_ > 1) configured.emplace(pieces_);
    const std::vector<dnnl_dim_t> src{g.batch, g.in_channels, g.in_height, g.in_width};
    const std::vector<dnnl_dim_t> wei{g.out_channels, g.in_channels, g.kernel, g.kernel};
    const std::vector<dnnl_dim_t> dst{g.batch, g.out_channels, g.out_height, g.out_width};
    const window win{{g.stride, g.stride}, {g.pad, g.pad},
                     {right_pad(g.in_height, g.out_height, g), right_pad(g.in_width, g.out_width, g)}};
    // What each operand is in: the pass's two inputs in bfloat16 with `half`, everything else float32.
    const dnnl_data_type_t in_type = half ? dnnl_bf16 : dnnl_f32;
    const bool src_in = which != pass::backward_data, wei_in = which != pass::backward_weights, dst_in = which != pass::forward;
    const memory_desc src_any = md(src, dnnl_format_tag_any, src_in ? in_type : dnnl_f32),
                      wei_any = md(wei, dnnl_format_tag_any, wei_in ? in_type : dnnl_f32),
                      dst_any = md(dst, dnnl_format_tag_any, dst_in ? in_type : dnnl_f32);
    const memory_desc src_user = md(src, dnnl_nchw), wei_user = md(wei, dnnl_oihw), dst_user = md(dst, dnnl_nchw);
    // The plain layouts the data gradient may ask for (below), in the pass's types.
    const memory_desc src_plain = md(src, dnnl_nchw, src_in ? in_type : dnnl_f32),
                      wei_plain = md(wei, dnnl_oihw, wei_in ? in_type : dnnl_f32),
                      dst_plain = md(dst, dnnl_nchw, dst_in ? in_type : dnnl_f32);
    const memory_desc bias_md = md({g.out_channels}, dnnl_x);

    dnnl_primitive_attr_t attr_raw = nullptr;
    check(dnnl_primitive_attr_create(&attr_raw), "dnnl_primitive_attr_create");
    const handle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy> attr{attr_raw};
    check(dnnl_primitive_attr_set_scratchpad_mode(attr_raw, dnnl_scratchpad_mode_user), "set_scratchpad_mode");

    // The forward descriptor is also the hint the two backward passes are built from (in bfloat16:
    // bfloat16 inputs, a float32 output, as the forward pass itself).
    const memory_desc fwd_src = md(src, dnnl_format_tag_any, in_type), fwd_wei = md(wei, dnnl_format_tag_any, in_type);
    const memory_desc fwd_dst = md(dst, dnnl_format_tag_any);
    const md_ptr bias_or_null = bias ? bias_md.get() : nullptr;
    desc_handle fwd = primitive_desc(pass::forward, algorithm, fwd_src.get(), fwd_wei.get(), bias_or_null, fwd_dst.get(), win,
                                     attr_raw, nullptr, may_lack);
    if (!fwd) return nullptr;
    auto p = std::make_unique<plan>();
    p->bias.make(engine_raw_, bias_md.get());
    desc_handle bwd;
    const_dnnl_primitive_desc_t pd = fwd.get();
    switch (which) {
      case pass::forward:
        p->a.set(engine_raw_, src_user.get(), query(pd, dnnl_query_src_md), true, reorders_, false, src);
        p->b.set(engine_raw_, wei_user.get(), query(pd, dnnl_query_weights_md), true, reorders_);
        p->c.set(engine_raw_, dst_user.get(), query(pd, dnnl_query_dst_md), false, reorders_);
        break;
      case pass::backward_data: {
        // With fewer than 8 input channels (an image's) the blocked kernels' data gradient runs at a
        // third of the GEMM-based one that plain layouts select (measured 8 vs 25 GFLOP/s, 1 -> 16
        // channels, 7x7, on AVX2).
        const bool plain = g.in_channels < 8;
        bwd = primitive_desc(pass::backward_data, algorithm, (plain ? src_plain : src_any).get(),
                             (plain ? wei_plain : wei_any).get(), nullptr, (plain ? dst_plain : dst_any).get(), win, attr_raw,
                             fwd.get(), may_lack);
        if (!bwd) return nullptr;
        pd = bwd.get();
        p->a.set(engine_raw_, dst_user.get(), query(pd, dnnl_query_diff_dst_md), true, reorders_, false, dst);
        p->b.set(engine_raw_, wei_user.get(), query(pd, dnnl_query_weights_md), true, reorders_);
        if (!inside) {
          p->c.set(engine_raw_, src_user.get(), query(pd, dnnl_query_diff_src_md), false, reorders_);
          break;
        }
        // The inside of the whole input plane: rows and columns 1 to its extent - 2.
        const memory_desc in_place(src, {whole.in_channels * whole.in_height * whole.in_width, whole.in_height * whole.in_width,
                                         whole.in_width, 1},
                                   dnnl_f32);
        p->c.set(engine_raw_, in_place.get(), query(pd, dnnl_query_diff_src_md), false, reorders_);
        const memory_desc hwio = md(wei, dnnl_hwio);
        p->window.set(engine_raw_, wei_user.get(), hwio.get(), true, reorders_);
        break;
      }
      case pass::backward_weights:
        bwd = primitive_desc(pass::backward_weights, algorithm, src_any.get(), wei_any.get(), bias_or_null, dst_any.get(), win,
                             attr_raw, fwd.get(), may_lack);
        if (!bwd) return nullptr;
        pd = bwd.get();
        if (pieces_ > 1 && make_pieces(*p, g, bias, half, algorithm, pd, attr_raw, win)) return p;
        p->a.set(engine_raw_, src_user.get(), query(pd, dnnl_query_src_md), true, reorders_, false, src);
        p->b.set(engine_raw_, dst_user.get(), query(pd, dnnl_query_diff_dst_md), true, reorders_, false, dst);
        p->c.set(engine_raw_, wei_user.get(), query(pd, dnnl_query_diff_weights_md), false, reorders_, true);
        break;
    }
    const md_ptr scratchpad = query(pd, dnnl_query_scratchpad_md);
    p->scratchpad_bytes = dnnl_memory_desc_get_size(scratchpad);
    p->scratchpad.make(engine_raw_, scratchpad);
    p->impl = impl_of(pd);
    p->rule = rule_for(which, p->impl, false);
    p->prim = make_primitive(pd, "dnnl_primitive_create (convolution)");
    return p;
  }

  // A weight gradient's pieces (above) into p: p.a and p.b reorder x and dy into the layouts the
  // whole pass `whole` chose, where those are plain or blocks of 16 channels, and p.sliced holds the
  // grid and the one-thread primitives. False (p untouched) where the layouts are others, or where
  // oneDNN has no kernel for a piece as good as the whole pass's.
  bool make_pieces(plan& p, const conv_geometry& g, bool bias, bool half, dnnl_alg_kind_t algorithm,
                   const_dnnl_primitive_desc_t whole, const_dnnl_primitive_attr_t attr, const window& win) {
#if defined(_OPENMP)
    const dnnl_data_type_t in_type = half ? dnnl_bf16 : dnnl_f32;
    const std::vector<dnnl_dim_t> src{g.batch, g.in_channels, g.in_height, g.in_width};
    const std::vector<dnnl_dim_t> dst{g.batch, g.out_channels, g.out_height, g.out_width};
    // The layouts the whole pass chose, where an example's channels in blocks of 16 are contiguous
    // (plain, or blocks of 8 or 16 channels) or at least the example is (channels last; one block).
    struct chosen {
      dnnl_format_tag_t tag = dnnl_format_tag_undef;
      std::int64_t block = 1;  // channels a layout block holds (0: the channels cannot be split)
    };
    const auto layout = [&](md_ptr d, const std::vector<dnnl_dim_t>& dims) {
      for (const chosen c : {chosen{dnnl_nchw, 1}, chosen{dnnl_nChw8c, 8}, chosen{dnnl_nChw16c, 16}, chosen{dnnl_nhwc, 0}})
        if (dnnl_memory_desc_equal(d, md(dims, c.tag, in_type).get())) return c;
      return chosen{};
    };
    const chosen x_layout = layout(query(whole, dnnl_query_src_md), src), dy_layout = layout(query(whole, dnnl_query_diff_dst_md), dst);
    if (x_layout.tag == dnnl_format_tag_undef || dy_layout.tag == dnnl_format_tag_undef) return false;
    const dnnl_format_tag_t x_tag = x_layout.tag, dy_tag = dy_layout.tag;
    auto q = std::make_unique<pieces>();
    q->shape = pieces_grid(g, pieces_, x_layout.block > 0, dy_layout.block > 0);
    // Fewer pieces than configured threads would leave threads idle on an idle machine (a batch of
    // one in channels-last layouts, which oneDNN's AMX kernels take, is one piece): the whole pass on
    // the configured count is faster there.
    if (q->shape.count() < pieces_) return false;
    q->out_channels = g.out_channels / q->shape.out_blocks;
    q->in_channels = g.in_channels / q->shape.in_blocks;
    const auto padded = [](std::int64_t c, const chosen& l) { return l.block > 1 ? (c + l.block - 1) / l.block * l.block : c; };
    q->x_channels = padded(g.in_channels, x_layout);
    q->dy_channels = padded(g.out_channels, dy_layout);
    q->x_plane = g.in_height * g.in_width;
    q->dy_plane = g.out_height * g.out_width;
    q->value_bytes = half ? 2 : 4;
    // A run of examples whose channels are whole is one primitive over the run (its examples are
    // contiguous in any of the layouts above); split channels are not, and go one example at a time.
    q->examples = q->shape.in_blocks == 1 && q->shape.out_blocks == 1 && g.batch % q->shape.runs == 0 ? g.batch / q->shape.runs : 1;
    const std::vector<dnnl_dim_t> piece_src{q->examples, q->in_channels, g.in_height, g.in_width};
    const std::vector<dnnl_dim_t> piece_dst{q->examples, q->out_channels, g.out_height, g.out_width};
    const std::vector<dnnl_dim_t> piece_wei{q->out_channels, q->in_channels, g.kernel, g.kernel};
    const memory_desc x_md = md(piece_src, x_tag, in_type), dy_md = md(piece_dst, dy_tag, in_type);
    const memory_desc wei_any = md(piece_wei, dnnl_format_tag_any, in_type), dwei_any = md(piece_wei, dnnl_format_tag_any);
    const memory_desc bias_md = md({q->out_channels}, dnnl_x);
    const memory_desc fwd_dst = md(piece_dst, dnnl_format_tag_any);
    // Made for one thread: oneDNN fixes a primitive's thread count (and the split of its sums) here.
    const one_openmp_thread alone;
    const bool may_lack = true;
    desc_handle fwd = primitive_desc(pass::forward, algorithm, x_md.get(), wei_any.get(), bias ? bias_md.get() : nullptr, fwd_dst.get(),
                                     win, attr, nullptr, may_lack);
    if (!fwd) return false;
    desc_handle plain = primitive_desc(pass::backward_weights, algorithm, x_md.get(), dwei_any.get(), nullptr, dy_md.get(), win, attr,
                                       fwd.get(), may_lack);
    desc_handle with_bias = bias ? primitive_desc(pass::backward_weights, algorithm, x_md.get(), dwei_any.get(), bias_md.get(),
                                                  dy_md.get(), win, attr, fwd.get(), may_lack)
                                 : desc_handle{};
    if (!plain || (bias && !with_bias)) return false;
    const std::string whole_impl = impl_of(whole), piece_impl = impl_of(plain.get());
    const auto reference = [](const std::string& impl) { return impl.find("ref") != std::string::npos; };
    if (reference(piece_impl) && !reference(whole_impl)) return false;
    const md_ptr gradient = query(plain.get(), dnnl_query_diff_weights_md);
    if (with_bias && !dnnl_memory_desc_equal(gradient, query(with_bias.get(), dnnl_query_diff_weights_md))) return false;
    q->gradient_bytes = dnnl_memory_desc_get_size(gradient);
    const md_ptr scratch_plain = query(plain.get(), dnnl_query_scratchpad_md);
    q->scratchpad_bytes = dnnl_memory_desc_get_size(scratch_plain);
    if (with_bias) q->scratchpad_bytes = std::max(q->scratchpad_bytes, dnnl_memory_desc_get_size(query(with_bias.get(), dnnl_query_scratchpad_md)));
    // The piece's gradient added into its block of the caller's [out][in][k][k] weights.
    // (A kernel with plain weights, oneDNN's gemm-based ones, writes the block's own layout where the
    // input channels are whole: the reorder then only adds.)
    const memory_desc block(piece_wei, {g.in_channels * g.kernel * g.kernel, g.kernel * g.kernel, g.kernel, 1}, dnnl_f32);
    q->plain = make_primitive(plain.get(), "dnnl_primitive_create (a weight gradient's piece)");
    if (with_bias) q->with_bias = make_primitive(with_bias.get(), "dnnl_primitive_create (a weight gradient's piece)");
    q->back = make_reorder(engine_raw_, gradient, block.get(), true);
    const memory_desc scratch_md = md({static_cast<dnnl_dim_t>(std::max<std::size_t>(q->scratchpad_bytes, 1))}, dnnl_x, dnnl_u8);
    q->threads.resize(static_cast<std::size_t>(pieces_));
    for (auto& ts : q->threads) {
      dnnl_stream_t raw = nullptr;
      check(dnnl_stream_create(&raw, engine_raw_, dnnl_stream_default_flags), "dnnl_stream_create");
      ts.stream.reset(raw);
      ts.src.make(engine_raw_, x_md.get());
      ts.ddst.make(engine_raw_, dy_md.get());
      ts.dwei.make(engine_raw_, gradient);
      ts.bias.make(engine_raw_, bias_md.get());
      ts.scratchpad.make(engine_raw_, scratch_md.get());
      ts.block.make(engine_raw_, block.get());
    }
    const memory_desc src_user = md(src, dnnl_nchw), dst_user = md(dst, dnnl_nchw);
    p.a.set(engine_raw_, src_user.get(), md(src, x_tag, in_type).get(), true, reorders_, false, src);
    p.b.set(engine_raw_, dst_user.get(), md(dst, dy_tag, in_type).get(), true, reorders_, false, dst);
    p.impl = piece_impl;
    p.rule = thread_rule::pieces;
    p.sliced = std::move(q);
    return true;
#else
    (void)p, (void)g, (void)bias, (void)half, (void)algorithm, (void)whole, (void)attr, (void)win;
    return false;
#endif
  }

  // The grid of a weight gradient in `count` pieces (above): as many runs of examples as the batch
  // allows up to `count`, then the input channels' blocks of 16, then the output channels', each
  // split into equal parts (where their layouts let them be split); together at least `count`
  // pieces where the geometry has them.
  static grid pieces_grid(const conv_geometry& g, int count, bool split_in = true, bool split_out = true) {
    const auto largest_divisor = [](std::int64_t n, std::int64_t at_most) {
      for (std::int64_t d = std::min(n, std::max<std::int64_t>(at_most, 1)); d > 1; --d)
        if (n % d == 0) return d;
      return std::int64_t{1};
    };
    grid shape;
    shape.runs = std::max<std::int64_t>(1, std::min<std::int64_t>(g.batch, count));
    std::int64_t rest = (count + shape.runs - 1) / shape.runs;
    shape.in_blocks = largest_divisor(split_in && g.in_channels % 16 == 0 ? g.in_channels / 16 : 1, rest);
    rest = (rest + shape.in_blocks - 1) / shape.in_blocks;
    shape.out_blocks = largest_divisor(split_out && g.out_channels % 16 == 0 ? g.out_channels / 16 : 1, rest);
    return shape;
  }

  // The primitive descriptor of one pass over the operands (in the order of forward: src, weights,
  // bias or null, dst; in the backward passes the gradients of those), built from the forward one
  // (`hint`) for the backward passes. Null where `may_lack` and oneDNN has no kernel for it
  // (bfloat16 on some CPUs and geometries, Winograd on most); any other failure throws.
  desc_handle primitive_desc(pass which, dnnl_alg_kind_t algorithm, md_ptr src, md_ptr wei, md_ptr bias, md_ptr dst,
                             const window& w, const_dnnl_primitive_attr_t attr, const_dnnl_primitive_desc_t hint,
                             bool may_lack) {
    dnnl_primitive_desc_t raw = nullptr;
    dnnl_status_t s = dnnl_success;
#if DNNL_VERSION_MAJOR >= 3
    const dnnl_dims_t no_dilation{0, 0};
    switch (which) {
      case pass::forward:
        s = dnnl_convolution_forward_primitive_desc_create(&raw, engine_raw_, dnnl_forward_training, algorithm, src,
                                                           wei, bias, dst, w.strides, no_dilation, w.pad_l, w.pad_r, attr);
        break;
      case pass::backward_data:
        s = dnnl_convolution_backward_data_primitive_desc_create(&raw, engine_raw_, algorithm, src, wei, dst,
                                                                 w.strides, no_dilation, w.pad_l, w.pad_r, hint, attr);
        break;
      case pass::backward_weights:
        s = dnnl_convolution_backward_weights_primitive_desc_create(&raw, engine_raw_, algorithm, src, wei, bias,
                                                                    dst, w.strides, no_dilation, w.pad_l, w.pad_r, hint, attr);
        break;
    }
#else
    dnnl_convolution_desc_t op;
    switch (which) {
      case pass::forward:
        check(dnnl_convolution_forward_desc_init(&op, dnnl_forward_training, algorithm, src, wei, bias, dst,
                                                 w.strides, w.pad_l, w.pad_r),
              "dnnl_convolution_forward_desc_init");
        break;
      case pass::backward_data:
        check(dnnl_convolution_backward_data_desc_init(&op, algorithm, src, wei, dst, w.strides, w.pad_l, w.pad_r),
              "dnnl_convolution_backward_data_desc_init");
        break;
      case pass::backward_weights:
        check(dnnl_convolution_backward_weights_desc_init(&op, algorithm, src, wei, bias, dst, w.strides, w.pad_l,
                                                          w.pad_r),
              "dnnl_convolution_backward_weights_desc_init");
        break;
    }
    s = dnnl_primitive_desc_create(&raw, &op, attr, engine_raw_, hint);
#endif
    if (s == dnnl_unimplemented && may_lack) return desc_handle{};
    check(s, "creating a convolution's primitive descriptor");
    return desc_handle{raw};
  }

  dnnl_engine_t engine_raw_ = nullptr;
  handle<dnnl_engine_t, dnnl_engine_destroy> engine_;
  handle<dnnl_stream_t, dnnl_stream_destroy> stream_;
  std::map<key, std::unique_ptr<plan>> plans_;  // destroyed before the stream and the engine
  std::size_t reorders_ = 0;
  std::size_t border_splits_ = 0;
  std::size_t swapped_passes_ = 0;
  int pieces_ = 1;
};

}  // namespace distribute::detail
