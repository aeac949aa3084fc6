// Every element-wise pass of a CycleGAN training step offers a GPU enough work items: a pass over a
// tensor of 64K elements or more must offer at least one work item per 64 elements. Run on the CPU
// engine, whose pass records (engine/pass_observer.hpp) are the shape every engine launches.
//
// What tensor a pass covers is found without the pass's help: this binary replaces the global
// operator new to remember every block of 256 KiB or more (64K floats; a CPU tensor's storage is a
// std::vector), and each recorded pass's functor is read word by word for pointers into those
// blocks. The largest block it points into is its tensor. So a new functor that walks a plane or a
// row per call is caught whatever it is called, with no annotation to forget.
#define BOOST_TEST_MODULE distribute_launch_shape
#ifndef BOOST_TEST_DYN_LINK
#  define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>

#include "models.hpp"
#include "trainer.hpp"

#include <distribute/distribute.hpp>
#include <distribute/engine/detail/conv_engine_filter.hpp>
#include <distribute/engine/detail/segmented_sum_plan.hpp>
#include <distribute/engine/pass_observer.hpp>
#include <distribute/nn/detail/kernels.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace dist = distribute;
namespace kernels = distribute::nn::detail::kernels;

// --- the networks of the CPU trainer, marked -------------------------------------------------------
// On GPU replicas with --graphs on, each forward and backward the trainer calls on a network is
// captured as a CUDA graph and replayed with one launch (cyclegan/graphs.cuh holds the networks in
// nn::graphed); everything else in the step stays eager. Here the CPU trainer holds its networks in
// marked_network, which says on the calling thread whether a network's pass is running, so an observer
// can split a step's passes the way --graphs on would.

namespace {
thread_local int inside_network = 0;         // > 0 while a network's forward or backward runs
thread_local std::int64_t network_call = 0;  // which call that is (numbered across threads)
std::atomic<std::int64_t> network_calls{0};
}  // namespace

template <class M>
struct marked_network : M {
  explicit marked_network(M m) : M(std::move(m)) {}
  template <class... A>
  decltype(auto) forward(A&&... a) {
    const mark m;
    return M::forward(std::forward<A>(a)...);
  }
  template <class... A>
  decltype(auto) backward(A&&... a) {
    const mark m;
    return M::backward(std::forward<A>(a)...);
  }

 private:
  struct mark {
    mark() {
      if (inside_network++ == 0) network_call = ++network_calls;
    }
    ~mark() { --inside_network; }
    mark(const mark&) = delete;
    mark& operator=(const mark&) = delete;
  };
};

namespace cyclegan {
template <class M>
struct network_holder<distribute::cpu, M> {
  using type = marked_network<M>;
  static type hold(M m, bool /*graphs*/) { return type{std::move(m)}; }
};
}  // namespace cyclegan

// --- large heap blocks ---------------------------------------------------------------------------------

namespace {

constexpr std::size_t tracked_bytes = std::size_t{64} * 1024 * sizeof(float);

// The registry's own nodes come from malloc, so that recording a block allocates nothing through
// the operator new being replaced.
template <class T>
struct malloc_allocator {
  using value_type = T;
  malloc_allocator() = default;
  template <class U>
  malloc_allocator(const malloc_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (void* p = std::malloc(n * sizeof(T))) return static_cast<T*>(p);
    throw std::bad_alloc();
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const malloc_allocator<U>&) const noexcept {
    return true;
  }
};

struct block_registry {
  std::mutex m;
  std::map<std::uintptr_t, std::size_t, std::less<>, malloc_allocator<std::pair<const std::uintptr_t, std::size_t>>>
      blocks;
};
block_registry& registry() {
  static block_registry* r = new (std::malloc(sizeof(block_registry))) block_registry;  // never destroyed
  return *r;
}

// The size of the tracked block containing address a, 0 where none does.
std::size_t tracked_block_of(std::uintptr_t a) {
  auto& r = registry();
  const std::lock_guard lock(r.m);
  auto it = r.blocks.upper_bound(a);
  if (it == r.blocks.begin()) return 0;
  --it;
  return a < it->first + it->second ? it->second : 0;
}

}  // namespace

void* operator new(std::size_t bytes) {
  void* p = std::malloc(bytes > 0 ? bytes : 1);
  if (p == nullptr) throw std::bad_alloc();
  if (bytes >= tracked_bytes) {
    auto& r = registry();
    const std::lock_guard lock(r.m);
    r.blocks[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
  return p;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  {
    auto& r = registry();
    const std::lock_guard lock(r.m);
    r.blocks.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

// --- the observer --------------------------------------------------------------------------------------

namespace {

const char* kind_name(dist::pass_kind k) {
  switch (k) {
    case dist::pass_kind::for_each: return "for_each";
    case dist::pass_kind::for_each_in_segments: return "for_each_in_segments";
    case dist::pass_kind::segmented_sum: return "segmented_sum";
  }
  return "?";
}

// The launch-shape rule: a pass over `elements` (64K or more) offers at least elements / 64 work items.
constexpr std::int64_t large_tensor = 64 * 1024;
constexpr std::int64_t elements_per_work_item = 64;

struct launch_shapes final : dist::pass_observer {
  struct pass {
    std::string kind, functor;
    std::int64_t work_items, elements;
  };
  std::mutex m;
  std::vector<pass> passes;      // every pass over a tracked block
  std::vector<pass> too_narrow;  // those that break the rule
  std::int64_t seen = 0;

  void on_pass(const dist::pass_record& r) override {
    // The largest tracked block any word of the functor points into (its elements counted as floats).
    std::size_t largest = 0;
    const auto* bytes = static_cast<const unsigned char*>(r.functor);
    for (std::size_t off = 0; off + sizeof(std::uintptr_t) <= r.functor_bytes; off += alignof(std::uintptr_t)) {
      std::uintptr_t word = 0;
      std::memcpy(&word, bytes + off, sizeof word);
      largest = std::max(largest, tracked_block_of(word));
    }
    const std::lock_guard lock(m);
    ++seen;
    if (largest == 0) return;
    const pass p{kind_name(r.kind), std::string(r.functor_name), r.work_items,
                 static_cast<std::int64_t>(largest / sizeof(float))};
    passes.push_back(p);
    if (p.elements >= large_tensor && p.work_items < p.elements / elements_per_work_item) too_narrow.push_back(p);
  }
};

std::string describe(const launch_shapes::pass& p) {
  return p.kind + " of " + p.functor + ": " + std::to_string(p.work_items) + " work items over a tensor of " +
         std::to_string(p.elements) + " elements";
}

}  // namespace

// --- the tests -----------------------------------------------------------------------------------------

// The detector itself: a pass shaped like the reflection padding's old backward (a plane per work
// item) is caught, its per-element form is not.
BOOST_AUTO_TEST_CASE(a_plane_per_work_item_is_caught) {
  const std::int64_t planes = 16, h = 64, w = 64, p = 3, ph = h + 2 * p, pw = w + 2 * p;
  std::vector<float> dy(static_cast<std::size_t>(planes * ph * pw), 1.0f), dx(static_cast<std::size_t>(planes * h * w));
  dist::engine<dist::cpu> e{{.threads = 1}};
  {
    launch_shapes shapes;
    const dist::observe_passes observing(shapes);
    e.for_each(planes, kernels::reflect_pad_backward_plane<float>{dy.data(), dx.data(), h, w, p});
    BOOST_TEST_REQUIRE(shapes.too_narrow.size() == 1u);
    BOOST_TEST_MESSAGE(describe(shapes.too_narrow[0]));
    BOOST_TEST(shapes.too_narrow[0].elements == planes * ph * pw);
  }
  {
    launch_shapes shapes;
    const dist::observe_passes observing(shapes);
    e.for_each_in_segments(planes, h * w, kernels::reflect_pad_backward<float>{dy.data(), dx.data(), h, w, p});
    BOOST_TEST(shapes.passes.size() == 1u);
    BOOST_TEST(shapes.too_narrow.empty());
  }
}

namespace {
// The last pass seen, and how many.
struct last_pass final : dist::pass_observer {
  dist::pass_record record{};
  int seen = 0;
  void on_pass(const dist::pass_record& r) override { record = r, ++seen; }
};
}  // namespace

// A segmented sum over few long segments (a loss over one image, an instance norm's planes of a
// 256x256 tensor) is planned as chunks, so it too offers a work item per 64 elements or fewer; one
// over few segments (the loss, a bias gradient over 3 channels) is cut finer still, so it offers a
// large GPU a few blocks per multiprocessor; one that offers them already keeps one stage.
BOOST_AUTO_TEST_CASE(segmented_sums_are_planned_in_chunks) {
  namespace d = dist::detail;
  dist::engine<dist::cpu> e{{.threads = 1}};
  using plan_t = d::segmented_sum_plan;
  for (const auto& [segments, length] : {std::pair<std::int64_t, std::int64_t>{1, 3 * 256 * 256},
                                         {3, 256 * 256},
                                         {3, 2 * 256 * 256},
                                         {64, 256 * 256},
                                         {256, 16384},
                                         {256, 4096},
                                         {64, 1024},
                                         {1, 1},
                                         {1, 1023},
                                         {1, 1024},
                                         {7, 8193},
                                         {3, 8192},
                                         {1000, 10}}) {
    const d::segmented_sum_plan plan = d::plan_segmented_sum(segments, length);
    BOOST_TEST_CONTEXT(segments << " x " << length << ": " << plan.chunks << " chunks of " << plan.chunk) {
      BOOST_TEST(plan.work_items() * elements_per_work_item >= segments * length);
      BOOST_TEST(plan.chunk <= plan_t::chunk_limit);
      BOOST_TEST(plan.chunk * plan.chunks >= length);
      BOOST_TEST((plan.chunks - 1) * plan.chunk < length);  // no empty chunk
      // Enough blocks, where the segments are long enough to give them min_chunk values each.
      BOOST_TEST(plan.blocks() >=
                 std::min(plan_t::min_blocks, segments * std::max<std::int64_t>(1, length / plan_t::min_chunk)));
      // Cut finer than chunk_limit only to reach min_blocks, and never below min_chunk.
      if (plan.chunks > (length + plan_t::chunk_limit - 1) / plan_t::chunk_limit) {
        BOOST_TEST(segments * (plan.chunks - 1) < plan_t::min_blocks);
        BOOST_TEST(plan.chunks * plan_t::min_chunk <= length);
      }
      BOOST_TEST(plan.two_stage() ==
                 (length > plan_t::chunk_limit || (segments < plan_t::min_blocks && length >= 2 * plan_t::min_chunk)));
      // The chunks tile each segment in order, without gaps or overlaps.
      const d::chunk_start start{plan.length, plan.chunks, plan.chunk};
      const d::chunk_end end{plan.length, plan.chunks, plan.chunk};
      for (std::int64_t s : {std::int64_t{0}, segments - 1}) {
        std::int64_t at = s * length;
        for (std::int64_t k = s * plan.chunks; k < (s + 1) * plan.chunks; ++k) {
          BOOST_TEST(start(k) == at);
          BOOST_TEST(end(k) > start(k));
          at = end(k);
        }
        BOOST_TEST(at == (s + 1) * length);
      }
      // The engine reports the launches its plan makes: two where the sum is cut into chunks.
      last_pass last;
      std::vector<double> out(static_cast<std::size_t>(segments));
      {
        const dist::observe_passes observing(last);
        e.segmented_sum(segments, length, [](std::int64_t, std::int64_t) { return 1.0; }, out.data());
      }
      BOOST_TEST(last.seen == 1);
      BOOST_TEST(last.record.launches == plan.launches());
      BOOST_TEST(last.record.work_items == plan.work_items());
    }
  }
}

namespace {

// One training step of the CycleGAN example's trainer (generators of `filters` filters and `blocks`
// residual blocks, 3-layer discriminators with instance norm, batch 1, RGB images of size x size) on
// the CPU engine, run under `observer` after `unobserved` steps that are not.
void observe_cyclegan_step(dist::pass_observer& observer, std::int64_t filters, int blocks, int size, int unobserved) {
  dist::one_device_strategy<dist::cpu> s;
  cyclegan::train_options t;
  t.gen = {.channels = 3, .filters = filters, .blocks = blocks};
  t.disc = {.channels = 3, .filters = filters, .layers = 3, .norm = cyclegan::norm_kind::instance};
  t.batch = 1;
  t.total_steps = unobserved + 1;
  t.decay_fraction = 0;
  t.place = cyclegan::placement::full;
  cyclegan::trainer<dist::one_device_strategy<dist::cpu>> tr(s, t, 3, size, size);
  const auto image = dist::shape::nchw(1, 3, size, size);
  std::mt19937_64 rng{7};
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  cyclegan::tensor a{image}, b{image};
  for (auto& v : a) v = uniform(rng);
  for (auto& v : b) v = uniform(rng);
  for (int i = 0; i < unobserved; ++i) tr.step(a, b);
  const dist::observe_passes observing(observer);
  tr.step(a, b);
}

}  // namespace

// One training step of the CycleGAN example (both generators and discriminators, forward, backward,
// losses and Adam) on the CPU engine, at a size where its tensors reach well past 64K elements: every
// pass over a large tensor offers a work item per 64 elements.
BOOST_AUTO_TEST_CASE(every_pass_of_a_cyclegan_step_is_parallel_over_its_elements) {
  const int size = 128;
  launch_shapes shapes;
  observe_cyclegan_step(shapes, 16, 2, size, 0);
  std::int64_t largest = 0;
  for (const auto& p : shapes.passes) largest = std::max(largest, p.elements);
  BOOST_TEST_MESSAGE(shapes.seen << " passes, " << shapes.passes.size()
                                 << " over tensors of 256 KiB or more (the largest " << largest << " elements), "
                                 << shapes.too_narrow.size() << " too narrow");
  BOOST_TEST(shapes.seen > 100);            // the step ran through the observer
  BOOST_TEST(largest >= 16 * size * size);  // and over tensors the rule applies to
  std::map<std::string, int> narrow;
  for (const auto& p : shapes.too_narrow) ++narrow[describe(p)];
  for (const auto& [what, times] : narrow)
    BOOST_ERROR(what << " (" << times << " times): too few work items for a GPU");
}

namespace {

// The `n` most frequent functors of `counts`, a line each ("\n  <count> x <functor>"), for the logs.
std::string most_frequent(const std::map<std::string, int>& counts, std::size_t n) {
  std::vector<std::pair<int, std::string>> by_count;
  for (const auto& [functor, k] : counts) by_count.emplace_back(k, functor);
  std::sort(by_count.rbegin(), by_count.rend());
  std::string out;
  for (std::size_t i = 0; i < std::min(n, by_count.size()); ++i)
    out += "\n  " + std::to_string(by_count[i].first) + " x " + by_count[i].second;
  return out;
}

// Every pass, and those a GPU runs on one block of 256 threads (at most 256 work items): a launch
// of a few microseconds for almost no work.
struct pass_counts final : dist::pass_observer {
  static constexpr std::int64_t block = 256;
  std::mutex m;
  std::int64_t all = 0, launches = 0, one_block = 0;
  std::map<std::string, int> one_block_by_functor;
  void on_pass(const dist::pass_record& r) override {
    const std::lock_guard lock(m);
    ++all;
    launches += r.launches;
    if (r.work_items <= block) {
      ++one_block;
      ++one_block_by_functor[std::string(r.functor_name)];
    }
  }
};

}  // namespace

// The element-wise launches of one training step of the paper's CycleGAN (64 filters, 9 residual
// blocks, 3-layer discriminators with instance norm, batch 1), counted on the CPU engine: a GPU
// engine launches each pass once (a segmented sum cut into chunks twice), besides cuDNN's and
// cuBLAS's calls. Which passes run does not depend on the image's size, so 32x32 stands for
// 256x256; of the one-block passes, the per-plane ones (work items = planes) do not either. The
// counts are a budget: a change that adds passes to the step fails here (raise the budget only with
// the reason), and one that folds them lowers it. Measured 2026-11-29: 2,004 passes, 630 on one
// block, 600 of those the instance norms' per-plane coefficients (plane_gradient_coefficients,
// plane_affine, inverse_std_of_squares, divide_by: 150 each). Those four now ride on the segmented
// sums as their epilogues (nn/detail/plane_statistics.hpp): 1,380 passes, 30 on one block (624
// fewer: the 512-channel discriminator layer's norms had passes of 512 work items). The cycle and
// identity losses' sums over one image (one block at 32x32, 24 at 256x256) are now cut into at
// least 256 blocks where the image allows (detail/segmented_sum_plan.hpp): 26 on one block.
BOOST_AUTO_TEST_CASE(launches_per_paper_size_step_are_counted) {
  pass_counts c;
  observe_cyclegan_step(c, 64, 9, 32, 1);  // after a first step, which may set things up
  const std::string top = most_frequent(c.one_block_by_functor, 6);
  BOOST_TEST_MESSAGE("a paper-size step: " << c.all << " element-wise passes (" << c.launches << " launches), "
                                           << c.one_block
                                           << " of them on one GPU block; the most frequent of those:" << top);
  constexpr std::int64_t budget_all = 1380, budget_one_block = 26;
  BOOST_TEST(c.all > 1000);  // the step ran through the observer
  BOOST_TEST(c.all <= budget_all);
  BOOST_TEST(c.one_block <= budget_one_block);
}

namespace {

// A step's passes split as --graphs on would run them: inside a network's forward or backward (in its
// graphs) or outside (eager launches), and the reads of device values on the host on each side.
struct graph_split final : dist::pass_observer {
  std::mutex m;
  std::int64_t captured = 0, eager = 0, eager_two_stage = 0, host_reads_inside = 0, host_reads_outside = 0;
  std::set<std::int64_t> graphs;  // the network calls seen: one graph launch each
  std::map<std::string, int> eager_by_functor;
  void on_pass(const dist::pass_record& r) override {
    const std::lock_guard lock(m);
    if (inside_network > 0) {
      ++captured;
      graphs.insert(network_call);
      return;
    }
    ++eager;
    ++eager_by_functor[std::string(r.functor_name)];
    // A segmented sum cut into chunks is two launches (detail/segmented_sum_plan.hpp), as the engine
    // that ran the pass planned it.
    if (r.launches == 2) ++eager_two_stage;
  }
  void on_host_read(std::size_t) override {
    const std::lock_guard lock(m);
    ++(inside_network > 0 ? host_reads_inside : host_reads_outside);
  }
};

}  // namespace

// The paper's CycleGAN step (as launches_per_paper_size_step_are_counted) split as --graphs on would
// run it on a GPU replica: the networks' forward and backward calls become one graph launch each, the
// rest (losses, their gradients' scaling, Adam) stays eager. The step's logic allows the capture: no
// network pass reads device values on the host (a capture cannot wait for the device; batch norm
// would, the instance norms of this model keep their statistics on the device). The counts are the
// model behind docs/benchmarks.md's prediction for --graphs on, and a budget like the one above.
// Measured 2026-11-29: 1,286 passes in 24 network calls' graphs, 94 eager (64 of them Adam's; 4, the
// L1 losses, sums the engine plans in two stages), no host read inside a network: about 170 launches
// a step where eager mode makes about 1,430 besides cuDNN's and cuBLAS's, which the graphs hold too.
BOOST_AUTO_TEST_CASE(a_graphed_paper_size_step_leaves_few_launches_eager) {
  graph_split split;
  observe_cyclegan_step(split, 64, 9, 32, 1);
  const std::string top = most_frequent(split.eager_by_functor, 8);
  // Launches with --graphs on: each network call is its graph's launch and two copies (its input into
  // the graph's buffer, its output out: nn::graphed); each eager pass one launch, a two-stage sum two.
  const std::int64_t calls = static_cast<std::int64_t>(split.graphs.size()),
                     launches = 3 * calls + split.eager + split.eager_two_stage;
  BOOST_TEST_MESSAGE("a paper-size step with --graphs on: "
                     << split.captured << " passes in " << calls << " network calls' graphs, " << split.eager
                     << " eager (" << split.eager_two_stage << " of them sums in two stages); host reads "
                     << split.host_reads_inside << " inside the networks, " << split.host_reads_outside
                     << " outside; about " << launches << " launches besides cuDNN's and cuBLAS's; eager:" << top);
  BOOST_TEST(split.captured > 1000);  // the networks' passes were seen as theirs
  // Each network 3 forward and 3 backward calls: a generator for its identity loss, its cycle and the
  // other generator's cycle; a discriminator in the generators' update and on real and fake images.
  BOOST_TEST(calls == 24);
  BOOST_TEST(split.host_reads_inside == 0);
  constexpr std::int64_t budget_eager = 100;
  BOOST_TEST(split.eager <= budget_eager);
}

// The split above can see a network that a graph cannot hold: discriminators with batch norm read
// their statistics on the host inside their forward.
BOOST_AUTO_TEST_CASE(a_host_read_inside_a_network_is_seen) {
  graph_split split;
  {
    dist::one_device_strategy<dist::cpu> s;
    cyclegan::train_options t;
    t.gen = {.channels = 3, .filters = 8, .blocks = 1};
    t.disc = {.channels = 3, .filters = 8, .layers = 2, .norm = cyclegan::norm_kind::batch};
    t.batch = 2;
    t.total_steps = 1;
    t.decay_fraction = 0;
    cyclegan::trainer<dist::one_device_strategy<dist::cpu>> tr(s, t, 3, 16, 16);
    cyclegan::tensor a{dist::shape::nchw(2, 3, 16, 16)}, b{dist::shape::nchw(2, 3, 16, 16)};
    a.fill(0.25f), b.fill(-0.5f);
    const dist::observe_passes observing(split);
    tr.step(a, b);
  }
  BOOST_TEST_MESSAGE("batch-norm discriminators: " << split.host_reads_inside << " host reads inside the networks");
  BOOST_TEST(split.host_reads_inside > 0);
}

// Which cuDNN engines the GPU engine considers (engine/detail/conv_engine_filter.hpp), from its
// options and the call's precision; the GPU side applies it to each graph it builds.
BOOST_AUTO_TEST_CASE(conv_engine_filter_follows_the_options) {
  namespace d = dist::detail;
  using dist::compute_precision;
  // The defaults: float32 is float32 (no TF32 engines), deterministic engines only, 64 MiB of
  // workspace at most, every one built to be timed, and timed against cuDNN's first choice among all
  // engines (the rival) with a slowdown of 1.5.
  const d::conv_engine_filter defaults = d::conv_engine_filter_for(compute_precision::float32, dist::compute_options{});
  BOOST_TEST(defaults.exclude_tf32);
  BOOST_TEST(defaults.exclude_nondeterministic);
  BOOST_TEST(defaults.workspace_limit == std::int64_t{64} << 20);
  BOOST_TEST(defaults.build_all);
  BOOST_TEST(defaults.slowdown == 1.5);
  // The rival: the same precision and limit, any engine, cuDNN's first choice, no rival of its own.
  const d::conv_engine_filter rival = defaults.rival();
  BOOST_TEST(rival.exclude_tf32);
  BOOST_TEST(!rival.exclude_nondeterministic);
  BOOST_TEST(rival.workspace_limit == defaults.workspace_limit);
  BOOST_TEST(!rival.build_all);
  BOOST_TEST(rival.slowdown == 0);
  // 0: no timing, cuDNN's first deterministic engine (the choice of earlier versions); infinity:
  // timed, never a rival; deterministic off: no rival (any engine is allowed anyway).
  const d::conv_engine_filter first =
      d::conv_engine_filter_for(compute_precision::float32, {.deterministic_conv_slowdown = 0});
  BOOST_TEST(!first.build_all);
  BOOST_TEST(first.slowdown == 0);
  const d::conv_engine_filter strict = d::conv_engine_filter_for(
      compute_precision::float32, {.deterministic_conv_slowdown = std::numeric_limits<double>::infinity()});
  BOOST_TEST(strict.build_all);
  BOOST_TEST(strict.slowdown == 0);
  const d::conv_engine_filter loose = d::conv_engine_filter_for(compute_precision::float32, {.deterministic = false});
  BOOST_TEST(!loose.build_all);
  BOOST_TEST(loose.slowdown == 0);
  // TF32 and the 16-bit precisions allow tensor-core engines; determinism stays what the options say.
  for (const compute_precision p : {compute_precision::tf32, compute_precision::bfloat16, compute_precision::float16}) {
    BOOST_TEST(!d::conv_engine_filter_for(p, {}).exclude_tf32);
    BOOST_TEST(d::conv_engine_filter_for(p, {}).exclude_nondeterministic);
  }
  // deterministic = false: any engine, PyTorch's default; autotune builds them all; 0: no limit.
  const d::conv_engine_filter any = d::conv_engine_filter_for(
      compute_precision::float32, {.conv_autotune = true, .deterministic = false, .conv_workspace_limit = 0});
  BOOST_TEST(!any.exclude_nondeterministic);
  BOOST_TEST(any.exclude_tf32);
  BOOST_TEST(any.build_all);
  BOOST_TEST(any.workspace_limit == 0);
  // The retry where the limit left no engine drops the limit alone.
  d::conv_engine_filter retry = defaults.without_workspace_limit();
  BOOST_TEST(retry.workspace_limit == 0);
  retry.workspace_limit = defaults.workspace_limit;
  BOOST_TEST((retry == defaults));
  // The race: the deterministic engine stays unless it takes more than the slowdown times the
  // rival's time; a time that could not be taken keeps it.
  BOOST_TEST(d::keeps_deterministic(14.0, 10.0, 1.5));
  BOOST_TEST(d::keeps_deterministic(15.0, 10.0, 1.5));
  BOOST_TEST(!d::keeps_deterministic(15.01, 10.0, 1.5));
  BOOST_TEST(!d::keeps_deterministic(28.0, 0.5, 1.5));
  BOOST_TEST(d::keeps_deterministic(std::nan(""), 10.0, 1.5));
  BOOST_TEST(d::keeps_deterministic(28.0, std::nan(""), 1.5));
  BOOST_TEST(d::keeps_deterministic(28.0, 0.0, 1.5));
  BOOST_TEST(d::keeps_deterministic(0.0, 10.0, 1.5));
  // A limit beyond what cuDNN's 64-bit sizes hold is no limit cut short.
  BOOST_TEST(
      d::conv_engine_filter_for(compute_precision::float32, {.conv_workspace_limit = SIZE_MAX}).workspace_limit ==
      INT64_MAX);
}
