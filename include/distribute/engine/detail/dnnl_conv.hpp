#pragma once
// Convolutions through oneDNN: forward, data gradient and weight gradient of float32 NCHW tensors,
// computed in float32 or, with `half`, on bfloat16 copies of the two inputs with float32
// accumulation and float32 results (mixed precision on a CPU with bf16 units: AVX512-BF16, AMX).
//
// The parts: dnnl_kernel_rules.hpp (the passes, the kernels oneDNN chose and by which rule each keeps
// its bits on any count of threads), dnnl_memory.hpp (oneDNN's objects, operands and their reorders,
// rounding to bfloat16), dnnl_weight_pieces.hpp (a weight gradient cut into pieces) and
// dnnl_conv_planner.hpp (which form a pass takes, and its plan, made once); this header runs the passes.
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
// for each piece (14.8 ms a piece against 7.6). The bias gradient, which the swapped convolution does
// not see, is summed from dy (rounded in bfloat16) in a fixed order (fixed_order_sum per
// example plane, the examples in order), one channel per thread. The forward pass has a swapped form
// too, the swapped convolution's data gradient (`forward_swapped`), which is not always faster: on
// the Zen 4 in bfloat16 the two tied, on a Zen 3 (AVX2) in float32 it took 14.7 ms against the direct
// kernel's 43.7; the engine times the two and takes it only where it is clearly faster.
//
// Threads: oneDNN is built on OpenMP here (both Debian's and the one scripts/setup.sh fetches) and
// runs each primitive with the calling thread's OpenMP thread count, which the engine sets to the
// count in use before every call.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/dnnl_conv_planner.hpp>
#include <distribute/engine/detail/openmp.hpp>
#include <distribute/engine/detail/winograd_f4x3.hpp>
#include <distribute/engine/serial.hpp>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace distribute::detail {

class dnnl_conv : public dnnl_conv_planner {
 public:
  // `pieces`: the weight gradients' grid (dnnl_weight_pieces.hpp); 1 computes each as one primitive on
  // the calling thread's OpenMP threads. `cut_channels_last`: channels-last weight gradients cut over
  // their output channels (dnnl_weight_pieces.hpp: measured slower than one primitive, so the engine
  // leaves it off; for tests and bench_weight_pieces).
  explicit dnnl_conv(int pieces = 1, bool cut_channels_last = false) : dnnl_conv_planner{pieces, cut_channels_last} {}

  // y = conv(x, w) + bias (bias may be null). False (nothing done) where `half` has no kernel.
  // With `round`, on x and w rounded to bfloat16 (dnnl_memory.hpp).
  bool forward(const conv_geometry& g, const float* x, const float* w, const float* bias, float* y, arena& a,
               bool half = false, bool winograd = false, bool round = false) {
    if (own_winograd(g, half, winograd)) {
      winograd_f4x3::forward(g, x, w, bias, y, a, round, openmp_threads());
      ++own_winograd_passes_;
      return true;
    }
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

  // y = conv(x, w) + bias as above, computed for a convolution that swaps_sides as the data gradient
  // of its swapped convolution (the window turned; the bias added after, per plane): where oneDNN's
  // direct forward pads the few output channels to its block (above), that pass reads them as the
  // side it takes as it is. Other bits than forward's; the engine takes it where timed faster
  // (engine<cpu>::swapped_forward_for). False (nothing done) where `half` has no kernel.
  bool forward_swapped(const conv_geometry& g, const float* x, const float* w, const float* bias, float* y, arena& a,
                       bool half = false) {
    if (!backward_data(swapped(g), x, turned_window(g, w, a), y, a, half)) return false;
    if (bias) {
      const std::int64_t plane = g.out_height * g.out_width;
      parallel_items(g.batch * g.out_channels, openmp_threads(), [&](std::int64_t item) {
        const float b = bias[item % g.out_channels];
        float* p = y + item * plane;
        for (std::int64_t i = 0; i < plane; ++i) p[i] += b;
      });
    }
    ++swapped_passes_;
    return true;
  }

  // dx = the data gradient of conv for dy (overwritten). False where `half` has no kernel.
  bool backward_data(const conv_geometry& g, const float* dy, const float* w, float* dx, arena& a, bool half = false,
                     bool winograd = false, bool round = false) {
    if (own_winograd(g, half, winograd)) {  // the forward of the swapped convolution, on the turned window
      winograd_f4x3::forward(swapped(g), dy, turned_window(g, w, a), nullptr, dx, a, round, openmp_threads());
      ++own_winograd_passes_;
      return true;
    }
    if (swaps_sides(g)) {
      if (!forward(swapped(g), dy, turned_window(g, w, a), nullptr, dx, a, half, false, round)) return false;
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
    if (own_winograd(g, half, winograd)) {
      winograd_f4x3::backward_weights(g, x, dy, dw, a, round, openmp_threads());
      if (db) bias_gradient(g, dy, db, round);
      ++own_winograd_passes_;
      return true;
    }
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
  bool backward(const conv_geometry& g, const float* x, const float* dy, const float* w, float* dx, float* dw,
                float* db, arena& a, bool half = false, bool winograd = false, bool round = false) {
    // The swapped convolution's passes read dy in different roles, and the engine's own Winograd
    // reads it as it is: the caller runs them one by one.
    if (swaps_sides(g) || own_winograd(g, half, winograd)) return false;
    plan* weights_plan = plan_for(pass::backward_weights, g, db != nullptr, half, winograd);
    plan* data_plan = dx ? data_plan_for(g, half, winograd) : nullptr;
    if (!weights_plan || (dx && !data_plan)) return false;
    const bool shared = data_plan && operand::same_layout(weights_plan->b, data_plan->a);
    run_backward_weights(*weights_plan, g, x, dy, dw, db, a, round);
    if (!data_plan) return true;
    plan& p = *data_plan;
    dnnl_memory_t ddst =
        shared ? p.a.reordered(a, arena::dst) : p.a.in(stream(), dy, a, arena::dst, round, arena::rounded_b);
    run_backward_data(p, g, ddst, dy, w, dx, a, round);
    return true;
  }

  // The implementation oneDNN chose for a pass (for example "jit:avx2", "jit_bf16:avx512_core_bf16",
  // "jit_wino_4x3:avx512_core"), for logs and benchmarks; "" where `half` has no kernel.
  // The gradients of a convolution that swaps_sides name the swapped convolution's kernels.
  std::string implementation(pass which, const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    if (own_winograd(g, half, winograd)) return winograd_f4x3::name;
    const plan* p = pass_plan(which, g, bias, half, winograd);
    return p ? p->impl : std::string();
  }
  // The rule by which a pass keeps its bits on any count of threads in use (dnnl_kernel_rules.hpp),
  // for the plan the pass runs on (made here if it is not yet); per_output where `half` has no kernel
  // (the caller computes the pass another way). The swapped convolution's data gradient is its
  // forward; a data gradient split at its border is its inside's Winograd pass and edges of one
  // thread each.
  thread_rule rule(pass which, const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    if (own_winograd(g, half, winograd)) return rule_for(which, winograd_f4x3::name, false);
    const plan* p = pass_plan(which, g, bias, half, winograd);
    return p ? p->rule : thread_rule::per_output;
  }
  std::size_t plans() const noexcept { return plans_.size(); }
  // The reorders run so far (into and out of the primitives' layouts), for tests and logs.
  std::size_t reorders() const noexcept { return reorders_; }
  // The data gradients computed as their inside and their edges so far (splits_border), for tests.
  std::size_t border_splits() const noexcept { return border_splits_; }
  // Where g swaps_sides, the swapped convolution's grid in g's terms (its output blocks are g's input blocks).
  grid weight_grid(const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    if (own_winograd(g, half, winograd)) return grid{};
    const plan* p = plan_of(pass::backward_weights, g, bias, half, winograd);
    if (!p || !p->sliced) return grid{};
    grid shape = p->sliced->shape;
    if (swaps_sides(g)) std::swap(shape.out_blocks, shape.in_blocks);
    return shape;
  }
  // Whether a weight gradient of g is computed in pieces (dnnl_weight_pieces.hpp), for tests and logs.
  bool in_pieces(const conv_geometry& g, bool bias, bool half = false, bool winograd = false) {
    if (own_winograd(g, half, winograd)) return false;  // (its own items: winograd_f4x3.hpp)
    const plan* p = plan_of(pass::backward_weights, g, bias, half, winograd);
    return p && p->sliced;
  }
  // The passes computed through a swapped convolution so far (swaps_sides), for tests.
  std::size_t swapped_passes() const noexcept { return swapped_passes_; }

  // The passes computed by the engine's own Winograd so far (winograd_f4x3.hpp), for tests.
  std::size_t own_winograd_passes() const noexcept { return own_winograd_passes_; }
  // Computes the passes asked for Winograd with the engine's own F(4x4, 3x3) even where oneDNN has a
  // Winograd kernel (for tests and benchmarks on such CPUs; the engine keeps oneDNN's there).
  void prefer_own_winograd(bool prefer) noexcept { prefer_own_ = prefer; }

  // Whether the oneDNN loaded has a Winograd kernel for this CPU (asked once, with a convolution
  // winograd_pays accepts).
  static bool library_has_winograd() {
    static const bool has = [] {
      dnnl_conv probe;
      const conv_geometry g = conv_geometry::of(1, 32, 32, 32, 32, 3, 1, 1);
      const plan* p = probe.pass_plan(pass::forward, g, false, false, true);  // (oneDNN's plan, not own_winograd's)
      return p && p->impl.find("wino") != std::string::npos;
    }();
    return has;
  }
  // Who computes the Winograd passes, for logs: "oneDNN's kernel" or "own F(4x4, 3x3) over oneDNN's sgemm".
  static std::string winograd_kernel() {
    return library_has_winograd() ? "oneDNN's Winograd kernel" : "own Winograd F(4x4, 3x3) over oneDNN's sgemm";
  }

 private:
  void run(plan& p, std::vector<dnnl_exec_arg_t>& args, arena& a) {
    if (p.scratchpad_bytes > 0)
      args.push_back({DNNL_ARG_SCRATCHPAD, p.scratchpad.point(a.get<std::byte>(arena::workspace, p.scratchpad_bytes))});
    check(dnnl_primitive_execute(p.prim.get(), stream(), static_cast<int>(args.size()), args.data()), "convolution");
  }

  // The data gradient of geometry g by plan `p` (g's own, or its inside's) from `ddst` (dy as the
  // primitive reads it) into dx.
  void run_backward_data(plan& p, const conv_geometry& g, dnnl_memory_t ddst, const float* dy, const float* w,
                         float* dx, arena& a, bool round) {
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
    if (inside)
      edges(p, g, dy, round ? a.get<float>(arena::rounded_c, static_cast<std::size_t>(g.weight_size())) : w, dx, a,
            round);
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
          check(dnnl_sgemm('N', 'N', C, H, K, 1.0f, window + (kh * 3 + kw) * C * K, K, line, L, 1.0f, out + kh, P),
                "dnnl_sgemm");
        const std::int64_t x = edge == 2 ? 0 : Q - 1;
        for (std::int64_t c = 0; c < C; ++c)
          for (std::int64_t i = 1; i < P - 1; ++i) dxn[(c * P + i) * Q + x] = out[c * P + i];
      }
    });
  }
  // The weight gradient of plan `p`, added to dw (and db where not null). dy's copy in the
  // primitive's layout, where it needs one, is left in the arena's `dst` slot (backward reads it).
  void run_backward_weights(plan& p, const conv_geometry& g, const float* x, const float* dy, float* dw, float* db,
                            arena& a, bool round) {
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

  // g's window w turned for its swapped convolution (turn_window), in the arena's `swapped` slot.
  static float* turned_window(const conv_geometry& g, const float* w, arena& a) {
    float* turned = a.get<float>(arena::swapped, static_cast<std::size_t>(g.weight_size()));
    turn_window(g.out_channels, g.in_channels, g.kernel, w, turned);
    return turned;
  }
  // A window [outs][ins][k][k] turned half a turn and transposed into [ins][outs][k][k]: to[i][o][a][b]
  // = from[o][i][k-1-a][k-1-b], or with `add` to[...] += from[...]. Turning a turned window back is
  // turn_window(ins, outs, ...).
  static void turn_window(std::int64_t outs, std::int64_t ins, std::int64_t k, const float* from, float* to,
                          bool add = false) noexcept {
    const std::int64_t k2 = k * k;
    for (std::int64_t o = 0; o < outs; ++o)
      for (std::int64_t i = 0; i < ins; ++i) {
        const float* f = from + (o * ins + i) * k2;
        float* t = to + (i * outs + o) * k2 + k2 - 1;
        for (std::int64_t q = 0; q < k2; ++q) {
          if (add) t[-q] += f[q];
          else t[-q] = f[q];
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

  // Whether a pass of g asked for Winograd runs the engine's own (winograd_f4x3.hpp): in float32
  // (or on rounded inputs), where oneDNN has no Winograd kernel or the own one is preferred.
  bool own_winograd(const conv_geometry& g, bool half, bool winograd) const {
    return winograd && !half && winograd_f4x3::applies(g) && (prefer_own_ || !library_has_winograd());
  }

  std::size_t border_splits_ = 0;
  std::size_t swapped_passes_ = 0;
  std::size_t own_winograd_passes_ = 0;
  bool prefer_own_ = false;
};

}  // namespace distribute::detail
