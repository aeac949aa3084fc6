#pragma once
// A weight gradient of the CPU engine's convolutions (dnnl_conv.hpp) cut into pieces: the grid, what a
// piece is, and running the pieces. The plan that cuts a pass into them is dnnl_conv_planner.hpp's.
//
// Weight gradients in pieces. A oneDNN weight gradient sums over the batch and the plane, and splits
// that sum between its threads: its last bits depend on how many threads run it. Made with `pieces`
// above one (the engine's thread count, a fixed part of its configuration), a weight gradient is
// instead computed as a fixed grid of pieces: a block of output channels times a block of input
// channels (whole blocks of 16) for a run of examples, each piece by a primitive made for one thread,
// over the whole run where the channels are not split and one example at a time where they are. The
// pieces run on however many threads are in use now (the engine's count may follow the machine's load,
// compute_options::adapt_threads), and each piece's bits are the same on any of them: the grid, and so
// the result, depends on the geometry and `pieces` alone. The pieces of one block of channels add into
// the caller's gradient through oneDNN's reorder (sum post-op); with more than one run of examples
// each run sums into its own buffer and the runs are added in order. The pieces read x and dy in the
// layouts oneDNN chose for the whole pass, where an example's block of 16 channels is contiguous
// (plain nchw, or channels in blocks of 8 or 16).
//
// In channels-last layouts (nhwc: what oneDNN's AMX kernels take in bfloat16) the grid splits only
// the examples, so a batch of one there is one primitive on the configured count. Asked to
// (`cut_channels_last`, dnnl_conv_planner.hpp), it splits the output channels first instead, and the
// examples only where those do not give enough pieces: each piece is then the whole batch (or its
// run) over a block of output channels. A block of channels of an nhwc tensor is not contiguous, and
// oneDNN computes a strided one with its reference kernel, so each piece first gathers its channels
// of dy into a dense nhwc copy of its own (0.1 ms for a residual block's); x is read whole. Such
// pieces are used only where oneDNN computes them with the kernel it chose for the whole pass. The
// engine leaves the cut off: on a 2-core Xeon with AMX it took 1.04-1.6x the time of one two-thread
// primitive for the CycleGAN's weight gradients in bfloat16 at a batch of one (oneDNN 2.6.3 and 3.2;
// the pieces' kernel alone keeps its speed, the loss is in what runs around it, not yet located),
// and the bfloat16 step 2-5% longer, with no gain shown beside a busy process (docs/benchmarks.md,
// "Weight gradients in pieces"). bench_weight_pieces measures it again.
//
// Where oneDNN chose another layout, where the grid has fewer pieces than the configured count of
// threads, or where oneDNN would compute a piece with its reference kernel but not the whole pass, the
// weight gradient stays one primitive, and its rule (dnnl_kernel_rules.hpp) is to run on the
// configured count of threads always.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/dnnl_memory.hpp>
#include <distribute/engine/detail/openmp.hpp>

#include <oneapi/dnnl/dnnl.h>
#if defined(_OPENMP)
#  include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace distribute::detail {

class dnnl_weight_pieces : public dnnl_memory {
 public:
  // The grid of pieces a weight gradient of g is computed in (above): output-channel blocks, input-channel
  // blocks and runs of examples; all 1 where it is one primitive. For tests and logs.
  struct grid {
    std::int64_t out_blocks = 1, in_blocks = 1, runs = 1;
    bool channels_last = false;  // x and dy in nhwc: output blocks first, dy gathered per piece (above)
    std::int64_t count() const noexcept { return out_blocks * in_blocks * runs; }
  };

 protected:
  // A weight gradient's pieces (above): one-thread primitives over one example's block of channels.
  struct pieces {
    grid shape;
    std::int64_t out_channels = 0, in_channels = 0;  // of one piece
    std::int64_t examples = 1;                       // of one primitive call: a whole run, or one
    // The layouts of x and dy as a piece reads them: channels (padded to blocks of 16 where blocked)
    // and plane size, and the bytes of a value, to find an example's block in the whole tensor.
    std::int64_t x_channels = 0, x_plane = 0, dy_channels = 0, dy_plane = 0;
    std::size_t value_bytes = 4;
    // Channels last with output blocks: a piece's channels of dy gathered into a dense buffer of this
    // many bytes (its examples, its channels) before it runs (above).
    std::size_t gathered_bytes = 0;
    primitive_handle plain, with_bias;  // the piece's primitive without and with the bias gradient
    primitive_handle back;              // its gradient's layout -> the caller's [out][in][k][k] block, added
    std::size_t scratchpad_bytes = 0, gradient_bytes = 0;
    struct thread_state {  // what one thread points at the data: memory objects and its stream
      handle<dnnl_stream_t, dnnl_stream_destroy> stream;
      memory src, ddst, dwei, bias, scratchpad, block;
    };
    std::vector<thread_state> threads;
  };

  // A weight gradient in pieces (above), added to dw (and db where not null) from x and dy in the
  // pieces' layouts (`xs`, `dys`), on the calling thread's OpenMP threads (at most one per piece).
  void run_pieces(pieces& q, const conv_geometry& g, const std::byte* xs, const std::byte* dys, float* dw, float* db,
                  arena& a) {
    const grid shape = q.shape;
    const std::int64_t items = shape.count(), weights = g.weight_size(), window = g.kernel * g.kernel;
    // With more than one run of examples each run sums into its own [weights, bias] buffer.
    const std::int64_t run_size = weights + g.out_channels;
    float* sums =
        shape.runs > 1 ? a.get<float>(arena::gradient, static_cast<std::size_t>(shape.runs * run_size)) : nullptr;
    if (sums) std::fill(sums, sums + shape.runs * run_size, 0.0f);
    const int team = static_cast<int>(
        std::min<std::int64_t>({openmp_threads(), static_cast<std::int64_t>(q.threads.size()), items}));
    const auto aligned = [](std::size_t bytes) { return (bytes + 63) / 64 * 64; };
    const std::size_t scratch_step = aligned(q.scratchpad_bytes), gradient_step = aligned(q.gradient_bytes),
                      bias_step = aligned(static_cast<std::size_t>(q.out_channels) * sizeof(float));
    std::byte* scratch =
        a.get<std::byte>(arena::workspace, std::max<std::size_t>(scratch_step, 64) * static_cast<std::size_t>(team));
    std::byte* gradients = a.get<std::byte>(arena::weights, gradient_step * static_cast<std::size_t>(team));
    std::byte* biases = a.get<std::byte>(arena::bias_gradient, bias_step * static_cast<std::size_t>(team));
    const std::size_t gathered_step = aligned(q.gathered_bytes);
    std::byte* gathered = q.gathered_bytes > 0
                              ? a.get<std::byte>(arena::columns, gathered_step * static_cast<std::size_t>(team))
                              : nullptr;
    parallel_items(items, team, [&](std::int64_t item) {
#if defined(_OPENMP)
      const int t = omp_get_thread_num();
#else
      const int t = 0;
#endif
      auto& ts = q.threads[static_cast<std::size_t>(t)];
      const std::int64_t run = item / (shape.out_blocks * shape.in_blocks),
                         o = item / shape.in_blocks % shape.out_blocks, i = item % shape.in_blocks;
      float* to = sums ? sums + run * run_size : dw;
      float* to_bias = sums ? sums + run * run_size + weights : db;
      const bool bias = db && i == 0;
      float* bias_out = reinterpret_cast<float*>(biases + bias_step * static_cast<std::size_t>(t));
      dnnl_memory_t gradient = ts.dwei.point(gradients + gradient_step * static_cast<std::size_t>(t));
      dnnl_memory_t block = ts.block.point(to + (o * q.out_channels * g.in_channels + i * q.in_channels) * window);
      const std::int64_t first = run * g.batch / shape.runs, last = (run + 1) * g.batch / shape.runs;
      for (std::int64_t n = first; n < last; n += q.examples) {
        const std::byte* dy_piece;
        if (gathered) {
          std::byte* to_dy = gathered + gathered_step * static_cast<std::size_t>(t);
          gather_channels(dys, to_dy, n, q, o);
          dy_piece = to_dy;
        } else {
          dy_piece =
              dys + static_cast<std::size_t>((n * q.dy_channels + o * q.out_channels) * q.dy_plane) * q.value_bytes;
        }
        std::array<dnnl_exec_arg_t, 5> args{
            {{DNNL_ARG_SRC,
              ts.src.point(xs + static_cast<std::size_t>((n * q.x_channels + i * q.in_channels) * q.x_plane) *
                                    q.value_bytes)},
             {DNNL_ARG_DIFF_DST, ts.ddst.point(dy_piece)},
             {DNNL_ARG_DIFF_WEIGHTS, gradient}}};
        int used = 3;
        if (bias) args[static_cast<std::size_t>(used++)] = {DNNL_ARG_DIFF_BIAS, ts.bias.point(bias_out)};
        if (q.scratchpad_bytes > 0)
          args[static_cast<std::size_t>(used++)] = {
              DNNL_ARG_SCRATCHPAD, ts.scratchpad.point(scratch + scratch_step * static_cast<std::size_t>(t))};
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

  // Output block o's channels of the examples [n, n + q.examples) of dy (nhwc, all its channels) into
  // `to`, dense nhwc over the piece's channels: a copy of one contiguous run of channels per position.
  static void gather_channels(const std::byte* dys, std::byte* to, std::int64_t n, const pieces& q,
                              std::int64_t o) noexcept {
    const std::size_t run = static_cast<std::size_t>(q.out_channels) * q.value_bytes,
                      stride = static_cast<std::size_t>(q.dy_channels) * q.value_bytes;
    const std::int64_t positions = q.examples * q.dy_plane;
    const std::byte* from = dys + (static_cast<std::size_t>(n * q.dy_plane) * stride +
                                   static_cast<std::size_t>(o * q.out_channels) * q.value_bytes);
    for (std::int64_t p = 0; p < positions; ++p)
      std::memcpy(to + static_cast<std::size_t>(p) * run, from + static_cast<std::size_t>(p) * stride, run);
  }

  // The grid of a weight gradient in `count` pieces (above): as many runs of examples as the batch
  // allows up to `count`, then the input channels' blocks of 16, then the output channels', each
  // split into equal parts (where their layouts let them be split); together at least `count`
  // pieces where the geometry has them. With `channels_last` (x and dy in nhwc): the output
  // channels' blocks first, in the fewest equal parts that reach `count` (all of them where none
  // does), then runs of examples; never the input channels.
  static grid pieces_grid(const conv_geometry& g, int count, bool split_in = true, bool split_out = true,
                          bool channels_last = false) {
    const auto largest_divisor = [](std::int64_t n, std::int64_t at_most) {
      for (std::int64_t d = std::min(n, std::max<std::int64_t>(at_most, 1)); d > 1; --d)
        if (n % d == 0) return d;
      return std::int64_t{1};
    };
    grid shape;
    if (channels_last) {
      shape.channels_last = true;
      const std::int64_t blocks = g.out_channels % 16 == 0 ? g.out_channels / 16 : 1;
      shape.out_blocks = blocks;
      for (std::int64_t d = 1; d <= blocks; ++d)
        if (blocks % d == 0 && d >= count) {
          shape.out_blocks = d;
          break;
        }
      shape.runs =
          std::max<std::int64_t>(1, std::min<std::int64_t>(g.batch, (count + shape.out_blocks - 1) / shape.out_blocks));
      return shape;
    }
    shape.runs = std::max<std::int64_t>(1, std::min<std::int64_t>(g.batch, count));
    std::int64_t rest = (count + shape.runs - 1) / shape.runs;
    shape.in_blocks = largest_divisor(split_in && g.in_channels % 16 == 0 ? g.in_channels / 16 : 1, rest);
    rest = (rest + shape.in_blocks - 1) / shape.in_blocks;
    shape.out_blocks = largest_divisor(split_out && g.out_channels % 16 == 0 ? g.out_channels / 16 : 1, rest);
    return shape;
  }
};

}  // namespace distribute::detail
