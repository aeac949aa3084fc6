#pragma once
// The CPU engine. Convolutions go to oneDNN where the build has it (DISTRIBUTE_USE_DNNL, set by the
// CMake target when oneDNN is found; float32 only) and to the portable im2col + Eigen GEMM reference
// otherwise, or when `compute_options::reference` asks for it. Dense matrix products (linear layers)
// are Eigen's, on the engine's threads. Element-wise work and per-plane sums run on the engine's
// threads through OpenMP where the program is built with it, on the calling thread otherwise.
//
// This header is over 600 lines for one class, which stays one: every pass, the choice between
// Winograd and the direct kernel, the rounding to bfloat16 and the adaptation of the thread count
// work on the same threads, scratch arena and oneDNN plans of the engine. What needs none of them
// lives apart: detail/dnnl_conv.hpp, detail/eigen_gemm.hpp, detail/reference_conv.hpp,
// detail/segmented_sum_plan.hpp and detail/thread_governor.hpp.
//
// Threads: a replica's engine uses its share of the cores (compute_options::threads, or the share its
// strategy gives it), never more: N replica threads with N engines of cores/N threads each fill the
// machine once. With compute_options::adapt_threads (the default) it runs fewer (down to one) while
// other processes keep the cores busy and goes back up when they are free
// (detail/thread_governor.hpp): each parallel region of oneDNN, Eigen and the engine's passes gets the
// count in use, active_threads().
//
// No result depends on the count in use. The engine's passes sum in a fixed order of their own;
// a oneDNN pass runs on the count in use only where its kernel gives each output one thread, or where
// it is a weight gradient cut into one-thread pieces fixed by the geometry and the configured count,
// and the configured count would get the same kernel; every other oneDNN pass (weight gradients oneDNN
// would not cut, the AMX, brgemm and sgemm-based kernels, any kernel not known to keep its order, the
// data gradients of oneDNN 3.x) runs on the configured count always (dnnl_conv's thread_rule, by the
// kernel oneDNN reports on this CPU). Matrix products run as parts of one thread each, fixed the same
// way (detail/eigen_gemm.hpp). A configuration (replicas, threads()) gives the same bits from run to
// run whatever the machine's load did.

#include <distribute/bfloat16.hpp>
#include <distribute/detail/hardware.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/engine/conv_choices.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/eigen_gemm.hpp>
#include <distribute/engine/detail/reference_conv.hpp>
#include <distribute/engine/detail/segmented_sum_plan.hpp>
#include <distribute/engine/serial.hpp>
#include <distribute/engine/detail/thread_governor.hpp>
#include <distribute/engine/engine.hpp>
#include <distribute/engine/gemm_geometry.hpp>
#include <distribute/engine/pass_observer.hpp>

// nvcc's front end cannot parse oneDNN's C++ API: in CUDA translation units the CPU engine computes
// with the reference (a GPU program's layers run on the GPU engine). The engine's layout is the same
// in both, so C++ and CUDA translation units of one program can share it.
#if defined(DISTRIBUTE_USE_DNNL) && DISTRIBUTE_USE_DNNL && !defined(__CUDACC__)
#  include <distribute/engine/detail/dnnl_conv.hpp>
#  define DISTRIBUTE_HAS_DNNL 1
#else
#  define DISTRIBUTE_HAS_DNNL 0
#endif
#if defined(_OPENMP)
#  include <omp.h>
// Iterations that are independent by contract may run in SIMD lanes.
#  define DISTRIBUTE_OMP_SIMD _Pragma("omp simd")
#else
#  define DISTRIBUTE_OMP_SIMD
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

#if DISTRIBUTE_HAS_DNNL
namespace detail {
// The name under which the choices file keeps this machine's choices: its CPU, and the ISA and
// version of the oneDNN it runs (another of either times again). Made once for the process: the
// engine asks at every pass that has a choice, and reading /proc/cpuinfo takes tens of microseconds
// (more with more cores).
inline const std::string& conv_choices_machine() {
  static const std::string name = [] {
    std::string model = "unknown CPU";
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);)
      if (line.starts_with("model name")) {
        if (const auto colon = line.find(':'); colon != std::string::npos)
          model = line.substr(line.find_first_not_of(' ', colon + 1));
        break;
      }
    std::replace(model.begin(), model.end(), '\t', ' ');
    // (Where the Winograd candidate is the engine's own, the name says so: choices timed against oneDNN's
    // kernel, or before the engine had its own, are not this machine's.)
    return model + ", " + dnnl_conv::isa() + ", " + dnnl_conv::library() +
           (dnnl_conv::library_has_winograd() ? "" : ", own Winograd F(4x4, 3x3)") + ", " +
           std::to_string(usable_hardware_threads()) + " threads";
  }();
  return name;
}
}  // namespace detail
#endif

template <>
class engine<cpu> {
 public:
  using device_type = cpu;
  // Whether convolutions can use oneDNN in this build.
  static constexpr bool has_dnnl = DISTRIBUTE_HAS_DNNL;

  // `share`: the threads this engine gets when options.threads is 0 (its replica's share of the
  // cores; 0 means every core this process may run on).
  explicit engine(compute_options options = {}, int share = 0) : options_{options} {
    const int cores = static_cast<int>(std::max(1u, detail::usable_hardware_threads()));
    threads_ = options.threads > 0 ? options.threads : (share > 0 ? share : cores);
    active_ = threads_;
    dnnl_.resize(static_cast<std::size_t>(threads_) + 1);
#if defined(_OPENMP)
    if (threads_ > 1 && detail::team_run_delay::available()) {
      if (options.adapt_threads) governor_.emplace(threads_);
      else watching_ = true;
    }
#endif
    use_precision(default_precision(options));  // refused here, with the reason, where this CPU cannot
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // The device it computes on: the host.
  cpu device() const noexcept { return {}; }
  // The most threads this engine runs (its share, or compute_options::threads).
  int threads() const noexcept { return threads_; }
  // The threads its parallel regions get now: threads(), or with adapt_threads fewer while the
  // machine is busy.
  int active_threads() const noexcept { return active_; }
  // Runs n of threads() (at least one) from now on, as adapt_threads does on a busy machine; with
  // adapt_threads its next decision may change the count again. The results have the same bits for
  // any count in use (the Determinism section of docs/nn.md): for tests and tools that want to see so.
  void set_active_threads(int n) noexcept { active_ = std::clamp(n, 1, threads_); }
  // Without adapt_threads: whether this engine's threads found the cores crowded (they waited for a
  // CPU more than a quarter of the time over two windows of a second in a row) and it said so on
  // stderr (once per process, whichever engine saw it first), naming adapt_threads.
  bool saw_crowding() const noexcept { return crowded_; }
  const compute_options& options() const noexcept { return options_; }

  // Mixed precision (engine.hpp). `tf32` is float32 here (a GPU's rounding of product inputs;
  // nothing to round on a CPU). `bfloat16` on a CPU with bf16 units (AVX512-BF16, AMX-BF16): each
  // convolution runs on bfloat16 copies of its two inputs with float32 accumulation and a float32
  // result, through oneDNN's bf16 kernels; a convolution oneDNN takes no bfloat16 for (or every one,
  // with `reference`) and each matrix product compute on float32 copies of their inputs rounded to
  // bfloat16, which is bfloat16's arithmetic (a product of two bfloat16 values is exact in float32)
  // at float32's speed. Refused with the reason: bfloat16 on a CPU without bf16 units (it would be
  // emulated, slower than float32), and float16 (no CPU float16 path).
  compute_precision precision() const noexcept { return precision_; }
  void use_precision(compute_precision p) {
    if (p == compute_precision::float16)
      throw std::invalid_argument(
          "distribute: the CPU engine computes in float32 or bfloat16, not float16; use bfloat16 on "
          "a CPU with bf16 units, float16 on GPU replicas");
    if (p == compute_precision::bfloat16 && !detail::cpu_has_bf16_units())
      throw std::invalid_argument(
          "distribute: the CPU engine computes in bfloat16 only on a CPU with bf16 units (AVX512-BF16, "
          "AMX-BF16); this CPU has none: half precision would be emulated, slower than float32; "
          "keep float32 models on CPU replicas");
    precision_ = p;
  }
  // What computes the convolutions, for logs: "oneDNN 2.6.3 (Winograd for wide 3x3 convolutions)" (the
  // version loaded, and whether it has Winograd's kernel and the options allow it), "oneDNN 3.2.0", or
  // "reference (im2col + Eigen)".
  std::string name() const {
    std::string convolutions = "reference (im2col + Eigen)";
#if DISTRIBUTE_HAS_DNNL
    if (uses_dnnl<float>()) {
      convolutions = detail::dnnl_conv::library();
      if (options_.conv_winograd)
        convolutions += (detail::dnnl_conv::library_has_winograd() ? " (Winograd" : " (own Winograd F(4x4, 3x3)") +
                        std::string(options_.cpu_conv_choice == conv_choice::rule
                                        ? " for wide 3x3 convolutions)"
                                        : " for wide 3x3 convolutions where timed faster; narrow outputs' forward "
                                          "swapped where timed faster)");
    }
#endif
    return convolutions + ", " + std::to_string(threads_) + (threads_ == 1 ? " thread" : " threads") +
#if defined(_OPENMP)
           "";
#else
           " asked for, one used (built without OpenMP)";
#endif
  }
  // The choices between oneDNN's direct kernel and an alternative (Winograd, or a narrow forward's
  // swapped form) this process made by timing (compute_options::cpu_conv_choice), with the times, in
  // the order they were made: those of every engine of the process (one table), or of this engine
  // alone where set_conv_timer was called.
  std::vector<conv_choice_record> conv_choices() const {
    return conv_timer_ ? own_choices_.all() : detail::shared_conv_choices().all();
  }
  // For tests: `timer(record, alternative)` gives the seconds each candidate (record.alternative, or
  // the direct kernel) takes in place of running it, and this engine keeps its choices apart from the
  // process's.
  void set_conv_timer(std::function<double(const conv_choice_record&, bool alternative)> timer) {
    conv_timer_ = std::move(timer);
  }

  // Scratch memory held, in bytes.
  std::size_t scratch_bytes() const noexcept { return arena_.bytes(); }
  detail::arena& scratch() noexcept { return arena_; }

  // --- convolutions (conv_geometry.hpp); x, y: NCHW; w: [out, in, k, k] ------------------------

  // y = conv(x, w) + bias; `bias` may be null.
  template <class T>
  void conv_forward(const conv_geometry& g, const T* x, const T* w, const T* bias, T* y) {
    per_example(g, [&](const conv_geometry& e, std::int64_t n) {
      const T* xn = x + n * per_input(g);
      T* yn = y + n * per_output(g);
#if DISTRIBUTE_HAS_DNNL
      if constexpr (std::is_same_v<T, float>)
        if (use_dnnl(e) &&
            (swapped_forward(e, xn, w, bias, yn) ||
             through_dnnl(e, xn, w, detail::dnnl_conv::pass::forward, bias != nullptr,
                          [&](detail::dnnl_conv& d, const float* a, const float* b, bool h, bool wino, bool round) {
                            return d.forward(e, a, b, bias, yn, arena_, h, wino, round);
                          })))
          return;
#endif
      enter_openmp();
      detail::reference_conv<T>::forward(e, input(xn, e.input_size(), detail::arena::src),
                                         input(w, e.weight_size(), detail::arena::weights), bias, yn, columns<T>(e),
                                         threads_, active_);
    });
  }
  // dx = the data gradient of the convolution for dy (overwritten).
  template <class T>
  void conv_backward_data(const conv_geometry& g, const T* dy, const T* w, T* dx) {
    per_example(g, [&](const conv_geometry& e, std::int64_t n) {
      backward_data_of(e, dy + n * per_output(g), w, dx + n * per_input(g));
    });
  }
  // dw += the weight gradient for (x, dy); db += the sum of dy per output channel (db may be null).
  template <class T>
  void conv_backward_weights(const conv_geometry& g, const T* x, const T* dy, T* dw, T* db) {
    per_example(g, [&](const conv_geometry& e, std::int64_t n) {
      backward_weights_of(e, x + n * per_input(g), dy + n * per_output(g), dw, db);
    });
  }
  // Both gradients of a convolution for one dy: conv_backward_weights(g, x, dy, dw, db), then, where
  // dx is not null, conv_backward_data(g, dy, w, dx), with the same results. oneDNN's two primitives
  // read dy in the same blocked layout, so it is reordered (and in bfloat16 rounded) once for both.
  template <class T>
  void conv_backward(const conv_geometry& g, const T* x, const T* dy, const T* w, T* dx, T* dw, T* db) {
    per_example(g, [&](const conv_geometry& e, std::int64_t n) {
      const T* xn = x + n * per_input(g);
      const T* dyn = dy + n * per_output(g);
      T* dxn = dx ? dx + n * per_input(g) : nullptr;
#if DISTRIBUTE_HAS_DNNL
      if constexpr (std::is_same_v<T, float>)
        if (use_dnnl(e) && both_through_dnnl(e, xn, dyn, w, dxn, dw, db)) return;
#endif
      backward_weights_of(e, xn, dyn, dw, db);
      if (dxn) backward_data_of(e, dyn, w, dxn);
    });
  }

  // --- dense matrix products (gemm_geometry.hpp); row-major; c overlaps neither a nor b -----------

  // c = op(a) op(b), or c += op(a) op(b) when g.accumulate: one Eigen product on the engine's threads,
  // over 64-byte aligned operands (copied to scratch unless they already are), so that the bits depend
  // on the sizes and the thread count only. With split_independent, every row of c is a product of
  // its own (its row of op(a) times op(b)): a row's bits are those of a one-row product, whatever m
  // is and wherever the row lies (a linear layer's example, under any split of the batch).
  template <class T>
  void gemm(const gemm_geometry& g, const T* a, const T* b, T* c) {
    g.check();
    if (g.m == 0 || g.n == 0) return;
    // The operands first: in bfloat16 their rounding is a pass of its own, which may change the
    // thread count in use (adapt_threads); Eigen then runs with the count that follows it.
    const T* bs = aligned_operand(b, g.b_size(), detail::arena::weights);
    if (!options_.split_independent || g.m == 1) {
      const T* as = aligned_operand(a, g.a_size(), detail::arena::src);
      T* cs =
          !g.accumulate && is_aligned(c) ? c : arena_.get<T>(detail::arena::dst, static_cast<std::size_t>(g.c_size()));
      gemm_geometry plain = g;
      plain.accumulate = false;
      enter_openmp();
      detail::gemm_in_parts(plain, as, bs, cs, detail::gemm_parts(plain, threads_), active_);
      if (cs != c) store(cs, c, g.c_size(), g.accumulate);
      return;
    }
    gemm_geometry row = g;
    row.m = 1;
    row.transpose_a = false;
    row.accumulate = false;  // (store adds)
    T* as = arena_.get<T>(detail::arena::src, static_cast<std::size_t>(g.k));
    T* cs = arena_.get<T>(detail::arena::dst, static_cast<std::size_t>(g.n));
    enter_openmp();
    for (std::int64_t i = 0; i < g.m; ++i) {
      if (g.transpose_a)
        for (std::int64_t j = 0; j < g.k; ++j) as[j] = a[j * g.m + i];
      else std::copy(a + i * g.k, a + (i + 1) * g.k, as);
      if (half()) round_in_place(as, g.k);
      detail::gemm_in_parts(row, static_cast<const T*>(as), bs, cs, 1, 1);
      store(cs, c + i * g.n, g.n, g.accumulate);
    }
  }

  // --- element-wise work and sums ----------------------------------------------------------------

  // f(i) for every i in [0, n), split statically over the engine's threads; a block_functor
  // (engine/serial.hpp) a block at a time, every block whole but the last.
  template <class F>
  void for_each(std::int64_t n, F f) {
    detail::record_pass(pass_kind::for_each, n, f);
    if constexpr (block_functor<F>) {
      constexpr std::int64_t block = F::block_size;
      const std::int64_t blocks = (n + block - 1) / block;
      auto run = [n](const F& g, std::int64_t b) {
        const std::int64_t i = b * block, left = n - i;
        g.run_block(i, left < block ? left : block);
      };
#if defined(_OPENMP)
      pace();
      if (active_ > 1 && n >= parallel_grain) {
#  pragma omp parallel num_threads(active_)
        {
          const F g = f;  // as below
#  pragma omp for schedule(static)
          for (std::int64_t b = 0; b < blocks; ++b) run(g, b);
        }
        return;
      }
#endif
      for (std::int64_t b = 0; b < blocks; ++b) run(f, b);
      return;
    }
#if defined(_OPENMP)
    pace();
    if (active_ > 1 && n >= parallel_grain) {
#  pragma omp parallel num_threads(active_)
      {
        // Each thread's own copy: a local whose address never escapes, so the compiler keeps its
        // pointers in registers instead of reloading them after every store.
        const F g = f;
#  pragma omp for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) g(i);
      }
      return;
    }
#endif
    // The calls are independent (the contract of for_each): vectorise across them.
    DISTRIBUTE_OMP_SIMD
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
  // f(s, i) for every segment s in [0, segments) and i in [0, length): per-plane work (a plane's
  // statistics, its channel's bias), split over the engine's threads by segment. A functor with a
  // `whole_segment(s)` (the same values as its f(s, i) for every i, in loops that vectorise where a
  // call per element would not) is called with that instead; one with `terms_per_call()` (a call
  // that reads many terms: the maximum's chunks) is split over the threads by its terms' count.
  template <class F>
  void for_each_in_segments(std::int64_t segments, std::int64_t length, F f) {
    detail::record_pass(pass_kind::for_each_in_segments, segments * length, f);
    std::int64_t work = length;
    if constexpr (requires { f.terms_per_call(); }) work = length * f.terms_per_call();
    over_segments(segments, work, [&](std::int64_t s) {
      const F g = f;  // as in for_each
      if constexpr (requires { g.whole_segment(s); }) {
        g.whole_segment(s);
      } else {
        DISTRIBUTE_OMP_SIMD
        for (std::int64_t i = 0; i < length; ++i) g(s, i);
      }
    });
  }
  // out[s] = sum over i in [0, length) of f(s, i), in double and in a fixed order
  // (fixed_order_sum): the same bits for any thread count.
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) {
    segmented_sum(segments, length, f, out, [](std::int64_t, double sum) { return sum; });
  }
  // The same with an epilogue: out[s] = finish(s, the sum), in the same pass (a GPU engine writes it
  // from its reduction, so that per-segment work after a sum needs no launch of its own).
  template <class F, class Finish>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) {
    const detail::segmented_sum_plan plan = detail::plan_segmented_sum(segments, length);
    detail::record_pass(pass_kind::segmented_sum, plan.work_items(), f, plan.launches());
    // The same order, faster where the terms say where they lie (engine/serial.hpp): segments side
    // by side where each is a column (a sum over an outer axis), else run by run.
    if constexpr (requires(const F& g) {
                    g.segment_step();
                    g.run(std::int64_t{}, std::int64_t{});
                  }) {
      if (segments > 1 && length > 0 && f.segment_step() == 1 && f.run(0, 0).step != 1) {
        constexpr std::int64_t block = distribute::fixed_order_block;
        over_segments((segments + block - 1) / block, block * length, [&](std::int64_t k) {
          const std::int64_t s0 = k * block;
          distribute::fixed_order_sums_across(f, s0, std::min(block, segments - s0), length, out, finish);
        });
        return;
      }
    }
    if constexpr (requires(const F& g) { g.run(std::int64_t{}, std::int64_t{}); })
      over_segments(segments, length,
                    [&](std::int64_t s) { out[s] = finish(s, distribute::fixed_order_sum_by_runs(f, s, length)); });
    else
      over_segments(segments, length,
                    [&](std::int64_t s) { out[s] = finish(s, distribute::fixed_order_sum(f, s, length)); });
  }
  // Small results (statistics, loss values) where the host reads them: a copy on the CPU.
  template <class T>
  void to_host(const T* src, std::size_t n, T* dst) const {
    detail::record_host_read(n * sizeof(T));
    std::copy(src, src + n, dst);
  }

  // The engine of the calling thread for code outside any strategy (nn::local(), tools): every core.
  static engine& thread_default() {
    thread_local engine e{};
    return e;
  }

 private:
  // Below this many elements a parallel region costs more than it saves.
  static constexpr std::int64_t parallel_grain = 1 << 15;

  template <class T>
  bool uses_dnnl() const noexcept {
    return has_dnnl && std::is_same_v<T, float> && !options_.reference;
  }

  // The values of one example's input and output (a batch may be empty).
  static std::int64_t per_input(const conv_geometry& g) noexcept { return g.in_channels * g.in_height * g.in_width; }
  static std::int64_t per_output(const conv_geometry& g) noexcept {
    return g.out_channels * g.out_height * g.out_width;
  }
  // One example's (or, unless split_independent, the whole batch's) data gradient and weight gradient.
  template <class T>
  void backward_data_of(const conv_geometry& e, const T* dy, const T* w, T* dx) {
#if DISTRIBUTE_HAS_DNNL
    if constexpr (std::is_same_v<T, float>)
      if (use_dnnl(e) && through_dnnl(e, dy, w, detail::dnnl_conv::pass::backward_data, false,
                                      [&](detail::dnnl_conv& d, const float* a, const float* b, bool h, bool wino,
                                          bool round) { return d.backward_data(e, a, b, dx, arena_, h, wino, round); }))
        return;
#endif
    enter_openmp();
    detail::reference_conv<T>::backward_data(e, input(dy, e.output_size(), detail::arena::dst),
                                             input(w, e.weight_size(), detail::arena::weights), dx, columns<T>(e),
                                             threads_, active_);
  }
  template <class T>
  void backward_weights_of(const conv_geometry& e, const T* x, const T* dy, T* dw, T* db) {
#if DISTRIBUTE_HAS_DNNL
    if constexpr (std::is_same_v<T, float>)
      if (use_dnnl(e) &&
          through_dnnl(e, x, dy, detail::dnnl_conv::pass::backward_weights, db != nullptr,
                       [&](detail::dnnl_conv& d, const float* a, const float* b, bool h, bool wino, bool round) {
                         return d.backward_weights(e, a, b, dw, db, arena_, h, wino, round);
                       }))
        return;
#endif
    // (In bfloat16 the bias gradient sums the rounded dy, as oneDNN's sums its bfloat16 copy.)
    enter_openmp();
    detail::reference_conv<T>::backward_weights(e, input(x, e.input_size(), detail::arena::src),
                                                input(dy, e.output_size(), detail::arena::dst), dw, db, columns<T>(e),
                                                threads_, active_);
  }

  // The whole batch at once, or (split_independent) one example at a time.
  template <class F>
  void per_example(const conv_geometry& g, F&& f) {
    g.check();
    if (!options_.split_independent || g.batch <= 1) {
      f(g, 0);
      return;
    }
    conv_geometry one = g;
    one.batch = 1;
    for (std::int64_t n = 0; n < g.batch; ++n) f(one, n);
  }

  template <class F>
  void over_segments(std::int64_t segments, std::int64_t length, F&& f) {
#if defined(_OPENMP)
    pace();
    if (active_ > 1 && segments > 1 && segments * length >= parallel_grain) {
#  pragma omp parallel for num_threads(static_cast<int>(std::min<std::int64_t>(active_, segments))) schedule(static)
      for (std::int64_t s = 0; s < segments; ++s) f(s);
      return;
    }
#endif
    (void)length;
    for (std::int64_t s = 0; s < segments; ++s) f(s);
  }

  // Eigen's products and oneDNN's primitives run with the calling thread's OpenMP thread count where
  // the program is built with it: this replica's share (the count in use).
  void enter_openmp() {
#if defined(_OPENMP)
    pace();
    omp_set_num_threads(active_);
#endif
  }

  // adapt_threads: at the start of a pass, once a window's wall time has passed, the count for the
  // next window from what the team waited for a CPU in this one (detail/thread_governor.hpp).
  // Without it, the same windows (of a second) only watch for crowding, to say so once.
  void pace() {
    if (!governor_ && !watching_) return;
    const auto now = std::chrono::steady_clock::now();
    if (window_delay_ns_ >= 0) {
      const double wall = std::chrono::duration<double>(now - window_start_).count();
      if (wall < (governor_ ? governor_->config().window_s : 1.0)) return;
      const std::int64_t delay = team_.total_ns();
      if (delay >= window_delay_ns_) {
        const double waited = static_cast<double>(delay - window_delay_ns_) * 1e-9;
        if (governor_) active_ = governor_->decide(wall, waited);
        else watch(wall, waited);
      }
    }
    if (governor_ || watching_) open_window(now);
  }
  void watch(double wall, double waited) {
    crowded_windows_ = waited > 0.25 * wall ? crowded_windows_ + 1 : 0;
    if (crowded_windows_ < 2) return;
    watching_ = false;
    crowded_ = true;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      std::fprintf(
          stderr,
          "distribute: the CPU engine's %d threads waited %.2f s in all for a CPU in the last %.1f s: other programs "
          "are using "
          "these cores, and every parallel region waits for the thread that shares one (a step can run several "
          "times slower). This engine has compute_options::adapt_threads off; on (the default) it runs fewer threads "
          "while that lasts, with the same results (docs/nn.md, \"On a busy machine\"). (Said once.)\n",
          threads_, waited, wall);
  }
  void open_window(std::chrono::steady_clock::time_point now) {
    if (team_threads_ != active_) record_team();
    window_start_ = now;
    window_delay_ns_ = team_.total_ns();  // < 0: a thread of the team is gone; recorded again next time
    if (window_delay_ns_ < 0) team_threads_ = 0;
  }
  // The OS threads of this engine's team of active_ threads (libgomp keeps a calling thread's pool, so
  // later regions of that size run on the same threads).
  void record_team() {
    std::vector<long> tids(static_cast<std::size_t>(active_), 0);
#if defined(_OPENMP)
#  pragma omp parallel num_threads(active_)
    tids[static_cast<std::size_t>(omp_get_thread_num())] = detail::team_run_delay::this_thread();
#else
    tids[0] = detail::team_run_delay::this_thread();
#endif
    std::erase(tids, 0L);
    team_.set_team(std::move(tids));
    team_threads_ = active_;
  }
  static bool is_aligned(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }
  bool half() const noexcept { return precision_ == compute_precision::bfloat16; }
  // A value rounded to bfloat16 (nearest, ties to even), kept in T.
  template <class T>
  static T to_bfloat16(T v) noexcept {
    return static_cast<T>(static_cast<float>(bfloat16(static_cast<float>(v))));
  }
  template <class T>
  static void round_in_place(T* p, std::int64_t n) noexcept {
    DISTRIBUTE_OMP_SIMD
    for (std::int64_t i = 0; i < n; ++i) p[i] = to_bfloat16(p[i]);
  }
  // `n` values from `p` rounded to bfloat16, in scratch slot `s` (on the replica's threads).
  template <class T>
  const T* rounded(const T* p, std::int64_t n, detail::arena::slot s) {
    T* copy = arena_.get<T>(s, static_cast<std::size_t>(n));
    for_each(n, [p, copy](std::int64_t i) { copy[i] = to_bfloat16(p[i]); });
    return copy;
  }
  // What a reference convolution reads of its input `p`: `p` itself, or in bfloat16 a copy rounded
  // to bfloat16 in scratch slot `s`.
  template <class T>
  const T* input(const T* p, std::int64_t n, detail::arena::slot s) {
    return half() ? aligned_operand(p, n, s) : p;
  }
  // What a product reads of its operand `p`: `p` itself where it is 64-byte aligned, a copy in scratch
  // slot `s` otherwise; in bfloat16 always a copy, rounded to bfloat16.
  template <class T>
  const T* aligned_operand(const T* p, std::int64_t n, detail::arena::slot s) {
    if (half()) return rounded(p, n, s);
    if (is_aligned(p)) return p;
    T* copy = arena_.get<T>(s, static_cast<std::size_t>(n));
    std::copy(p, p + n, copy);
    return copy;
  }
  template <class T>
  static void store(const T* from, T* to, std::int64_t n, bool accumulate) {
    if (accumulate) {
      DISTRIBUTE_OMP_SIMD
      for (std::int64_t i = 0; i < n; ++i) to[i] += from[i];
    } else {
      std::copy(from, from + n, to);
    }
  }

  template <class T>
  T* columns(const conv_geometry& g) {
    return arena_.get<T>(detail::arena::columns, static_cast<std::size_t>(detail::reference_conv<T>::col_size(g)));
  }

#if DISTRIBUTE_HAS_DNNL
  bool use_dnnl(const conv_geometry& g) const noexcept { return !options_.reference && detail::dnnl_conv::supports(g); }
  // Whether pass `which` of e runs Winograd (in bfloat16: float32 Winograd on its inputs rounded to
  // bfloat16, as oneDNN's bfloat16 kernels read them: the same values) rather than the direct kernel
  // (in bfloat16 oneDNN's bfloat16 one). Only where Winograd applies (conv_winograd, winograd_pays:
  // oneDNN's kernel where it has one, the engine's own F(4x4, 3x3) elsewhere); there by compute_options::cpu_conv_choice: `rule` always, `timed`
  // (the default) unless the direct kernel took at most two thirds of Winograd's time when the two
  // were timed at the pass's first run, on its own inputs (a and b, as through_dnnl gets them).
  // The choice is kept for the process (conv_choices()), shared by every engine and every batch
  // size, so that all replicas of a run, and every later step, compute alike.
  bool winograd_for(detail::dnnl_conv::pass which, const conv_geometry& e, const float* a, const float* b, bool bias) {
    using pass = detail::dnnl_conv::pass;
    if (!options_.conv_winograd || !detail::dnnl_conv::winograd_pays(e)) return false;
    if (options_.cpu_conv_choice == conv_choice::rule) return true;
    choice_scratch s;  // (allocated only where the choice is timed)
    return timed_choice(
        {static_cast<conv_pass>(which), e, choice_precision(), threads_, conv_alternative::winograd}, [&](bool wino) {
          float* out = s.out(which == pass::forward         ? e.output_size()
                             : which == pass::backward_data ? e.input_size()
                                                            : e.weight_size());
          float* per_channel = bias ? s.channels(e.out_channels) : nullptr;
          return through_dnnl_as(e, a, b, which, bias, wino,
                                 [&](detail::dnnl_conv& d, const float* p, const float* q, bool h, bool w, bool round) {
                                   return which == pass::forward
                                              ? d.forward(e, p, q, per_channel, out, arena_, h, w, round)
                                          : which == pass::backward_data
                                              ? d.backward_data(e, p, q, out, arena_, h, w, round)
                                              : d.backward_weights(e, p, q, out, per_channel, arena_, h, w, round);
                                 });
        });
  }
  // Whether the forward of e runs as its swapped convolution's data gradient (dnnl_conv::forward_swapped)
  // rather than oneDNN's direct kernel: only for a convolution with few output channels (swaps_sides),
  // and only where timed (compute_options::cpu_conv_choice `timed`) the swapped form took at most two
  // thirds of the direct kernel's time. Kept for the process like winograd_for's choice.
  bool swapped_forward_for(const conv_geometry& e, const float* x, const float* w, bool bias) {
    if (options_.cpu_conv_choice == conv_choice::rule || !detail::dnnl_conv::swaps_sides(e)) return false;
    choice_scratch s;
    return timed_choice(
        {conv_pass::forward, e, choice_precision(), threads_, conv_alternative::swapped}, [&](bool swap) {
          float* out = s.out(e.output_size());
          const float* per_channel = bias ? s.channels(e.out_channels) : nullptr;
          return swap ? run_swapped_forward(e, x, w, per_channel, out)
                      : through_dnnl_as(
                            e, x, w, detail::dnnl_conv::pass::forward, bias, false,
                            [&](detail::dnnl_conv& d, const float* a, const float* b, bool h, bool wino, bool round) {
                              return d.forward(e, a, b, per_channel, out, arena_, h, wino, round);
                            });
        });
  }
  // y = conv(x, w) + bias as the swapped convolution's data gradient, where swapped_forward_for chose it;
  // false (nothing done) otherwise, or where the precision has no kernel for it.
  bool swapped_forward(const conv_geometry& e, const float* x, const float* w, const float* bias, float* y) {
    return swapped_forward_for(e, x, w, bias != nullptr) && run_swapped_forward(e, x, w, bias, y);
  }
  bool run_swapped_forward(const conv_geometry& e, const float* x, const float* w, const float* bias, float* y) {
    enter_openmp();
    const std::pair<detail::dnnl_conv::pass, bool> one{detail::dnnl_conv::pass::backward_data, false};
    return dnnl_now({&one, 1}, detail::dnnl_conv::swapped(e), half(), false)
        .forward_swapped(e, x, w, bias, y, arena_, half());
  }
  // The scratch outputs (zeros) and zero bias a timed choice runs its candidates on, made at the first run.
  struct choice_scratch {
    std::vector<float> values, bias;
    float* out(std::int64_t n) {
      if (values.empty()) values.assign(static_cast<std::size_t>(n), 0.0f);
      return values.data();
    }
    float* channels(std::int64_t n) {
      if (bias.empty()) bias.assign(static_cast<std::size_t>(n), 0.0f);
      return bias.data();
    }
  };
  compute_precision choice_precision() const noexcept {
    return precision_ == compute_precision::bfloat16 ? compute_precision::bfloat16 : compute_precision::float32;
  }
  // The choice for `wanted`'s case: the process's (or, with set_conv_timer, this engine's) where made,
  // else made now by `run(alternative)`, which runs a candidate on scratch outputs and returns false
  // where it has no kernel (timed as infinitely slow); with set_conv_timer the timer's seconds instead.
  template <class Run>
  bool timed_choice(const conv_choice_record& wanted, Run&& run) {
    auto& table = conv_timer_ ? own_choices_ : detail::shared_conv_choices();
    if (!conv_timer_) table.name_machine(detail::conv_choices_machine());
    if (const auto* known = table.find(wanted)) return known->use_alternative;
    return table
        .decide(wanted,
                [&](conv_choice_record& r) {
                  if (conv_timer_) {
                    r.alternative_seconds = conv_timer_(r, true);
                    r.direct_seconds = conv_timer_(r, false);
                  } else {
                    std::tie(r.alternative_seconds, r.direct_seconds) = time_both(run);
                  }
                  r.use_alternative =
                      conv_choice_record::alternative_wins(r.alternative, r.alternative_seconds, r.direct_seconds);
                })
        .use_alternative;
  }
  // The best times, in seconds, of the alternative and of the direct kernel (`run(true)`,
  // `run(false)`): each run twice first (making its plans, touching its scratch, waking the
  // threads), then three times each, in turns (alternative, direct, alternative, ...), so that a
  // change of the machine's load or clock during the timing falls on both. Infinity for a candidate
  // without a kernel.
  template <class Run>
  static std::pair<double, double> time_both(Run& run) {
    const auto once = [&](bool alternative) {  // seconds, or infinity
      const auto start = std::chrono::steady_clock::now();
      return run(alternative) ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                              : std::numeric_limits<double>::infinity();
    };
    for (int warm = 0; warm < 2; ++warm)
      for (const bool alternative : {true, false}) (void)once(alternative);
    double best[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    for (int turn = 0; turn < 3; ++turn)
      for (const bool alternative : {true, false})
        best[alternative ? 0 : 1] = std::min(best[alternative ? 0 : 1], once(alternative));
    return {best[0], best[1]};
  }
  // One convolution pass through oneDNN on its two inputs `a` and `b`: `pass(plans, a, b, half,
  // winograd, round)` runs it and returns false where oneDNN has no kernel for it (the reference computes it
  // then). In bfloat16 where Winograd runs (winograd_for) it runs in float32 on its inputs
  // rounded to bfloat16 (`round`: oneDNN's layouts are written rounded, dnnl_conv.hpp). It runs on
  // the plans and threads dnnl_now picks for it.
  template <class Pass>
  bool through_dnnl(const conv_geometry& e, const float* a, const float* b, detail::dnnl_conv::pass which, bool bias,
                    Pass&& pass) {
    return through_dnnl_as(e, a, b, which, bias, winograd_for(which, e, a, b, bias), pass);
  }
  template <class Pass>
  bool through_dnnl_as(const conv_geometry& e, const float* a, const float* b, detail::dnnl_conv::pass which, bool bias,
                       bool wino, Pass&& pass) {
    enter_openmp();
    const bool rounded = wino && half(), h = !wino && half();
    const std::pair<detail::dnnl_conv::pass, bool> one{which, bias};
    return pass(dnnl_now({&one, 1}, e, h, wino), a, b, h, wino, rounded);
  }
  // conv_backward's two passes through oneDNN (dnnl_conv::backward), on inputs rounded to bfloat16
  // once for both where Winograd runs on them; false where oneDNN has no kernel for either, where
  // their kernels were chosen apart (winograd_for), or where either pass must run on the configured
  // count while fewer are in use (dnnl_now): the caller then runs them one by one.
  bool both_through_dnnl(const conv_geometry& e, const float* x, const float* dy, const float* w, float* dx, float* dw,
                         float* db) {
    using pass = detail::dnnl_conv::pass;
    const bool wino = winograd_for(pass::backward_weights, e, x, dy, db != nullptr);
    if (dx && winograd_for(pass::backward_data, e, dy, w, false) != wino) return false;  // (chosen apart)
    enter_openmp();
    const bool rounded = wino && half(), h = !wino && half();
    const std::array<std::pair<pass, bool>, 2> both{
        { {pass::backward_weights, db != nullptr},
          { pass::backward_data,
            false } }};
    detail::dnnl_conv& d = dnnl_now(std::span{both}.first(dx ? 2 : 1), e, h, wino);
    if (&d != &dnnl(active_)) return false;
    return d.backward(e, x, dy, w, dx, dw, db, arena_, h, wino, rounded);
  }
  // The plans, and the OpenMP thread count, that passes of e (each with or without bias) run on now:
  // those of the count in use where every pass keeps its bits on any count (dnnl_conv's thread_rule)
  // with the kernel the configured count gets too; otherwise the configured count's, on all threads(),
  // so that no result follows the count in use (compute_options::adapt_threads).
  detail::dnnl_conv& dnnl_now(std::span<const std::pair<detail::dnnl_conv::pass, bool>> passes, const conv_geometry& e,
                              bool h, bool wino) {
    detail::dnnl_conv& now = dnnl(active_);
    if (active_ == threads_) return now;
    detail::dnnl_conv& configured = dnnl(threads_);
    bool keeps = true;
    for (const auto& [which, bias] : passes) {
      std::string kernel;
      {
        const detail::openmp_thread_count all{threads_};  // (its plan is made for them)
        kernel = configured.implementation(which, e, bias, h, wino);
      }
      keeps = keeps && now.rule(which, e, bias, h, wino) != detail::dnnl_conv::thread_rule::fixed_count &&
              now.implementation(which, e, bias, h, wino) == kernel;
    }
    if (keeps) return now;
#  if defined(_OPENMP)
    omp_set_num_threads(threads_);
#  endif
    return configured;
  }
  // The plans of a thread count: oneDNN fixes a primitive's thread count when it makes it.
  detail::dnnl_conv& dnnl(int count) {
    auto& d = dnnl_[static_cast<std::size_t>(count)];
    if (!d) d = std::make_shared<detail::dnnl_conv>(threads_);
    return *static_cast<detail::dnnl_conv*>(d.get());
  }
#endif
  std::function<double(const conv_choice_record&, bool alternative)> conv_timer_;
  detail::conv_choice_table own_choices_;
  // The oneDNN plans per thread count (one count unless adapt_threads), made on first use.
  std::vector<std::shared_ptr<void>> dnnl_;

  compute_options options_;
  compute_precision precision_ = compute_precision::float32;
  int threads_ = 1;
  int active_ = 1;  // the threads in use: threads_ unless adapt_threads found the machine busy
  // adapt_threads (empty otherwise): the decision, the team it watches and the current window.
  std::optional<detail::thread_governor> governor_;
  bool watching_ = false;    // without adapt_threads: the windows only watch (pace, watch)
  int crowded_windows_ = 0;  // crowded windows in a row while watching
  bool crowded_ = false;     // saw_crowding()
  detail::team_run_delay team_;
  int team_threads_ = 0;  // the count team_ was recorded for
  std::chrono::steady_clock::time_point window_start_{};
  std::int64_t window_delay_ns_ = -1;  // the team's run delay at window_start_; < 0: no window open
  detail::arena arena_;
};

static_assert(compute_engine<engine<cpu>>);

}  // namespace distribute
