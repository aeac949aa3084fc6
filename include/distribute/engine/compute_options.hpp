#pragma once
// How a compute engine computes: the precision of its convolutions and products, and the options a
// strategy passes to every replica's engine (strategy.set_compute_options). Plain values, with no
// engine behind them: strategies are core headers and name these without bringing in any engine.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace distribute {

// What convolutions and matrix products compute in (mixed precision). Tensors, parameters, their
// gradients and optimiser state stay float32 whatever it is: they are the master copy. Under
// `bfloat16` or `float16` an engine that supports it runs each convolution and product on 16-bit
// copies of its operands with float32 accumulation (tensor cores on a GPU) and writes float32
// results, as PyTorch's autocast runs those ops; `tf32` keeps float32 operands and rounds the
// products' inputs to TF32. The CPU engine computes in float32, and in bfloat16 on a CPU with bf16
// units (see engine<cpu>::use_precision).
enum class compute_precision : std::uint8_t { float32, tf32, bfloat16, float16 };

constexpr std::string_view to_string(compute_precision p) noexcept {
  switch (p) {
    case compute_precision::float32: return "float32";
    case compute_precision::tf32: return "tf32";
    case compute_precision::bfloat16: return "bfloat16";
    case compute_precision::float16: return "float16";
  }
  return "?";
}
// Whether `p` computes on 16-bit copies.
constexpr bool is_half(compute_precision p) noexcept {
  return p == compute_precision::bfloat16 || p == compute_precision::float16;
}

// A convolution's three passes, for the choices an engine reports.
enum class conv_pass : std::uint8_t { forward, backward_data, backward_weights };
inline const char* to_string(conv_pass p) noexcept {
  return p == conv_pass::forward ? "forward" : p == conv_pass::backward_data ? "data gradient" : "weight gradient";
}

// How a CPU engine picks between two ways oneDNN can compute a convolution pass (engine_options).
enum class conv_choice : std::uint8_t {
  timed,  // timed on this machine at the pass's first run: the faster, by a margin
  rule,   // the rule written in the library (winograd_pays), measured on a Zen 4
};

// How an engine computes (strategy.set_compute_options). Every field has a default that suits
// training.
struct compute_options {
  // Threads of this replica's engine; 0 takes the replica's share of the cores this process may run
  // on (all of them under one device, cores / replicas under a mirrored strategy, at least one).
  int threads = 0;
  // Convolutions one example at a time, matrix products one row at a time. The fast path may pick
  // different kernels for different batch sizes, so an example's output can differ in the last bits
  // with the split of the batch between replicas; this mode makes every example's forward and data
  // gradient independent of the split (and of the thread count), at some cost in speed. Weight
  // gradients are sums over examples and follow the batch's order either way.
  bool split_independent = false;
  // Use the portable reference (im2col + Eigen GEMM) even where a faster library is built in: the
  // cross-check of tests, and a way to rule the library out when results look wrong.
  bool reference = false;
  // CPU engines: run fewer threads (down to one) while other processes keep the cores busy, and the
  // full count again once they are free. A program on a machine it shares (a CI runner, a training
  // server, a build running beside it) otherwise keeps one thread per core: the thread that shares a
  // core with a busy process runs half the time, and every parallel region waits for it at its
  // barrier (measured: a 2-core step 4.5x slower with one busy process, docs/benchmarks.md). The
  // engine watches how long its own threads wait for a CPU (the kernel's run delay) and tries one
  // thread more now and then. The results do not depend on how many threads run: every sum is split
  // by the configured count (`threads`), never by the count in use, so reruns have the same bits
  // whatever the load did. Off, the count never moves (and the engine says once on stderr when its
  // threads wait for the cores). GPU engines ignore it.
  bool adapt_threads = true;
  // CPU engines: compute 3x3 convolutions at stride 1 with at least 32 channels in and out over
  // planes of at least 32x32 with Winograd's minimal filtering F(4x4, 3x3): oneDNN's kernel where
  // the oneDNN the program runs on has one (oneDNN 2.x on CPUs with AVX-512), the engine's own
  // elsewhere (engine/detail/winograd_f4x3.hpp: CPUs with AVX2 only, oneDNN 3.x); the engine's name
  // says which. These are the residual blocks of an image generator, and there it is 2.5-3x faster
  // than direct convolution with oneDNN's kernel on AVX-512, 2-2.9x with the engine's own on AVX2
  // (docs/benchmarks.md). It rounds
  // more: a convolution's output differs from the exact one by about 2e-5 of its largest magnitude
  // (direct: about 1e-6). Still deterministic, and the same for every split of a batch. Off, every
  // convolution is direct, as PyTorch's CPU convolutions are. GPU engines ignore it (cuDNN's
  // heuristics choose their algorithms).
  bool conv_winograd = true;
  // CPU engines: where a pass could run either way (the convolutions `conv_winograd` takes to
  // Winograd: in float32 Winograd or direct; in bfloat16 float32 Winograd on the inputs rounded to
  // bfloat16, or oneDNN's bfloat16 direct kernel), `timed` times both on this machine at the pass's
  // first run (the shape, the pass, the precision: best of three runs each, in turns, on scratch
  // outputs) and keeps Winograd unless the direct kernel takes at most two thirds of its time;
  // `rule` always takes Winograd there. Winograd wins by 2.5-3x on AVX-512 CPUs without AMX (a Zen 4
  // measured it), where the timed choice keeps it; on a Xeon with AMX, in bfloat16, oneDNN's direct
  // kernels took 0.58-0.74 of its time for a residual block's convolution, and the timed choice
  // takes them where they are that much faster. The choice is made once per process and shape, before
  // the pass's first result, so every replica and later step computes alike, and kept in a file of
  // the machine's choices (engine/conv_choices.hpp: $DISTRIBUTE_CONV_CHOICES or
  // ~/.cache/distribute/cpu_conv_choices.txt) that later runs read, so that they compute alike too
  // (engine<cpu>::conv_choices() reports them; `rule` fixes the choice to Winograd). The forward of a
  // convolution with few output channels from many (a generator's last layer) is timed the same way
  // against its swapped form (engine/detail/dnnl_conv.hpp), which is taken only where it takes at most
  // two thirds of the direct kernel's time; `rule` keeps the direct kernel there.
  conv_choice cpu_conv_choice = conv_choice::timed;
  // GPU engines: whether float convolutions and matrix products may use TF32 tensor cores (a 10-bit
  // mantissa in the products, float accumulation: about 1e-3 relative, several times faster). Off,
  // they compute in float32 throughout and match the CPU engine to float rounding. The CPU engine
  // ignores it.
  bool tf32 = false;
  // GPU engines: the precision of convolutions and matrix products (compute_precision above);
  // `float32` here with `tf32` true means `tf32`. A model can choose its own for its passes
  // (nn::with_precision), whatever the engine's default.
  compute_precision precision = compute_precision::float32;
  // GPU engines: time, at its first run, every engine cuDNN offers for each convolution (shape,
  // pass, precision) and keep the fastest, as PyTorch's torch.backends.cudnn.benchmark does; off,
  // the first of cuDNN's heuristics. Often faster, and the first run of each shape is slower. Which
  // engine wins depends on timing, so two runs (or a run and its resumption) may compute a
  // convolution with different engines and differ in the last bits; off, every run computes alike.
  // Engines that are not deterministic are excluded either way unless `deterministic` is off. The
  // CPU engine ignores it.
  bool conv_autotune = false;
  // GPU engines: only cuDNN engines whose sums have a fixed order (no atomics), so that a rerun of a
  // fixed configuration gives the same bits, as on the CPU. Off, cuDNN may pick any engine, as
  // PyTorch's default (torch.backends.cudnn.deterministic = False) does: its fastest data and weight
  // gradients for many shapes split the sum over blocks and add the parts with atomics, so the last
  // bits of a gradient change from run to run. Either way engines are ranked by cuDNN's heuristics
  // (or timed, with conv_autotune). The CPU engine is deterministic and ignores it.
  bool deterministic = true;
  // GPU engines, under `deterministic`: how each convolution (shape, pass, precision) picks its
  // deterministic engine. At its first eager run it times every deterministic engine cuDNN offers
  // within conv_workspace_limit (as conv_autotune does) and keeps the fastest, then times that one
  // against cuDNN's own first choice among all engines: where the deterministic engine takes more
  // than this many times as long, the convolution keeps cuDNN's choice instead, whose sums may finish
  // with atomics (its last bits may then change from run to run), and the engine says so once on
  // stderr (and in its nondeterministic_convolutions()). The choice is made once, before the pass's
  // first result, and holds for the process: every later step computes with the same engines. A
  // rerun times again, and where two engines time within noise of each other it may pick the other,
  // which changes last bits. Infinity: always a deterministic engine, the fastest. 0: no timing,
  // cuDNN's first deterministic engine (the same engine, so the same bits, in every run; on an
  // H100 that was 3-block data gradient of a 7x7 convolution at 14 ms a call). GPU only.
  double deterministic_conv_slowdown = 1.5;
  // GPU engines: the most workspace one convolution engine may use, in bytes; engines that need more
  // are not considered (where every engine does, the one cuDNN ranks first is used whatever it needs).
  // The workspace is one buffer a replica's convolutions share, kept at the largest of their needs,
  // so this bounds it. 64 MiB: PyTorch's whole paper-size CycleGAN step peaks at 1.2 GB on an H100,
  // and staying within 1.1 times that leaves about 120 MB above the peer's, of which this takes half.
  // PyTorch's autotuned step peaked only 4 MB above its untuned one, so the engines it picks need
  // little workspace; ours, allowed any, peaked at 9.7 GB. 0: no limit.
  std::size_t conv_workspace_limit = std::size_t{64} << 20;
};

// The precision an engine with `options` computes in when no model chose one.
constexpr compute_precision default_precision(const compute_options& o) noexcept {
  return o.precision == compute_precision::float32 && o.tf32 ? compute_precision::tf32 : o.precision;
}

// The name these options had before they were called compute options (the strategies' engines of
// collectives are another thing: collective_engine()).
using engine_options [[deprecated("distribute: engine_options is now compute_options")]] = compute_options;

}  // namespace distribute
