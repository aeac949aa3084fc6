#pragma once
// The cross-replica operations that do not depend on how replicas run: reductions of per-replica
// results, gathering, scattering, creating and re-synchronising mirrored state. Written once for
// every strategy; a strategy provides `num_replicas_in_sync()`, `devices()` and `run`.

#include <distribute/concepts/device.hpp>
#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/reduce_op.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

// The input pipeline (<distribute/data.hpp>) defines these; `distribute` and
// `distribute_from_function` below name them only in templates, so strategies do not depend on it.
namespace data {
struct distribute_options;
template <class D, std::size_t Extent>
struct distributor;
template <class F, std::size_t Extent>
struct function_distributor;
}  // namespace data

namespace detail {

// What `reduce` and `gather` accept as one value: built-in arithmetic types and collective elements
// (types added through dtype_traits, such as half precision).
template <class T>
concept arithmetic = std::is_arithmetic_v<T> || element<T>;

template <class T>
concept arithmetic_sequence = std::ranges::sized_range<const T> && arithmetic<std::ranges::range_value_t<T>>;

// A value whose state can be digested to compare mirrored copies: arithmetic values and contiguous
// sequences of them, any type with a member `state_digest()` returning std::uint64_t (which then
// decides what its state is), or a model on the host (its parameters and its buffers).
template <class T>
concept digestible =
    std::is_trivially_copyable_v<T> ||
    (std::ranges::contiguous_range<const T> && std::is_trivially_copyable_v<std::ranges::range_value_t<T>>) ||
    requires(const T& t) {
      { t.state_digest() } -> std::convertible_to<std::uint64_t>;
    } || gradient_enumerable<T>;

template <digestible T>
std::uint64_t digest_of(const T& value) {
  if constexpr (requires {
                  { value.state_digest() } -> std::convertible_to<std::uint64_t>;
                }) {
    return value.state_digest();
  } else if constexpr (gradient_enumerable<T>) {
    return digest_model(const_cast<T&>(value)).state();  // enumeration is non-const, reading is not
  } else if constexpr (std::is_trivially_copyable_v<T>) {
    return fnv1a(&value, sizeof(T));
  } else {
    return fnv1a(std::ranges::data(value), std::ranges::size(value) * sizeof(std::ranges::range_value_t<T>));
  }
}

// Makes `to` hold `from`'s state, for broadcasts between the replicas of one process. A value is
// copy-assigned, except a model whose parameters live on a device: copy assignment would also copy
// the layers' device (the source replica's GPU and stream), so its parameters are copied into the
// destination's own memory and its buffers (host memory) assigned, and every layer stays where it is.
template <class T>
void assign_state(T& to, T& from) {
  if constexpr (gradient_enumerable<T> && !host_parameters<T>) {
    using S = typename T::scalar_type;
    std::vector<std::span<S>> source;
    from.for_each_parameter([&](std::span<S> v, std::span<S>) { source.push_back(v); });
    std::size_t i = 0;
    to.for_each_parameter([&](std::span<S> v, std::span<S>) {
      if (i >= source.size() || source[i].size() != v.size())
        throw std::invalid_argument(
            "distribute: broadcast between copies of a model whose parameters differ in count or size");
      copy_parameter_values<T>(source[i].data(), v.size(), v.data());
      ++i;
    });
    if constexpr (requires { from.for_each_buffer([](std::span<double>) {}); }) {
      std::vector<std::span<double>> buffers;
      from.for_each_buffer([&](std::span<double> b) { buffers.push_back(b); });
      std::size_t k = 0;
      to.for_each_buffer([&](std::span<double> b) {
        if (k >= buffers.size() || buffers[k].size() != b.size())
          throw std::invalid_argument(
              "distribute: broadcast between copies of a model whose buffers differ in count or size");
        std::copy(buffers[k].begin(), buffers[k].end(), b.begin());
        ++k;
      });
    }
  } else {
    static_assert(
        std::is_copy_assignable_v<T>,
        "distribute: broadcast of mirrored<T> between local replicas copy-assigns T; T must be copy-assignable");
    to = from;
  }
}

// The replicas (after the first) whose digest differs from the first's, as "1, 3"; empty if none.
// `digests` holds `stride` digests per replica, in replica order; `at` picks one of them.
inline std::string replicas_differing(std::span<const std::uint64_t> digests, std::size_t stride = 1,
                                      std::size_t at = 0) {
  std::string differ;
  for (std::size_t i = stride + at; i < digests.size(); i += stride)
    if (digests[i] != digests[at]) differ += (differ.empty() ? "" : ", ") + std::to_string(i / stride);
  return differ;
}

// A model's parameters' and buffers' digests, appended to `out` (two per copy, for
// `which_parts_differ`).
template <gradient_enumerable T>
void append_model_digests(const T& value, std::vector<std::uint64_t>& out) {
  const auto d = digest_model(const_cast<T&>(value));
  out.push_back(d.parameters);
  out.push_back(d.buffers);
}

// For a `mirrored_divergence` of a model: which of its parts differ from the first copy's, on which
// replicas, given two digests per replica (append_model_digests). Empty if neither does.
inline std::string which_parts_differ(std::span<const std::uint64_t> parts) {
  std::string out;
  if (const auto p = replicas_differing(parts, 2, 0); !p.empty()) out += "; parameters differ on replica(s) " + p;
  if (const auto b = replicas_differing(parts, 2, 1); !b.empty())
    out += "; buffers (such as batch norm's running statistics) differ on replica(s) " + b;
  return out;
}

// `scatter`'s split: a batch of examples (`example_size` elements each) cut along its first axis into
// `total` shares as evenly as possible; returns the shares of replicas [first, first + count), the
// replicas this process holds.
template <class V, class T>
V batch_shares(std::span<const T> batch, std::size_t example_size, std::size_t total, std::size_t first,
               std::size_t count) {
  if (example_size == 0 || batch.size() % example_size != 0)
    throw std::invalid_argument("distribute: scatter got " + std::to_string(batch.size()) +
                                " elements, not a whole number of examples of " + std::to_string(example_size));
  const std::size_t examples = batch.size() / example_size;
  return make_replica_values<V>(count, [&](std::size_t r) {
    const auto k = first + r;
    const auto from = batch.begin() + static_cast<std::ptrdiff_t>(share_offset(examples, total, k) * example_size);
    return std::vector<T>(from, from + static_cast<std::ptrdiff_t>(share_of(examples, total, k) * example_size));
  });
}

}  // namespace detail

template <class Derived, std::size_t Extent>
class strategy_base {
 public:
  // The replica count when fixed at compile time (1 for one device), else std::dynamic_extent.
  static constexpr std::size_t extent = Extent;

  template <class T>
  using per_replica_type = per_replica<T, Extent>;
  template <class T>
  using mirrored_type = mirrored<T, Extent>;

  // Where this process stands in the job: every strategy answers these, so that "the chief saves,
  // the others wait" and logging code stay the same when the strategy changes. A single process is
  // the whole job: worker 0 of 1, the chief, holding every replica.
  static constexpr int worker_index() noexcept { return 0; }
  static constexpr int num_workers() noexcept { return 1; }
  static constexpr bool is_chief() noexcept { return true; }
  int num_local_replicas() const noexcept { return self().num_replicas_in_sync(); }
  static constexpr int first_replica_id() noexcept { return 0; }

  // Reduces one value per replica to one value, in replica order (deterministic). Arithmetic values
  // give a value; sequences of them reduce element-wise and give a std::vector. `mean` divides the
  // sum by the replica count.
  template <detail::arithmetic T, std::size_t E>
  T reduce(reduce_op op, const per_replica<T, E>& values) const {
    check_count(values.size(), "reduce");
    T acc = values[0];
    for (std::size_t i = 1; i < values.size(); ++i) acc = detail::combine(op, acc, values[i]);
    return detail::finish(op, acc, static_cast<int>(values.size()));
  }
  template <detail::arithmetic_sequence S, std::size_t E>
  auto reduce(reduce_op op, const per_replica<S, E>& values) const {
    using T = std::ranges::range_value_t<S>;
    check_count(values.size(), "reduce");
    std::vector<T> acc(std::ranges::begin(values[0]), std::ranges::end(values[0]));
    for (std::size_t i = 1; i < values.size(); ++i) {
      if (std::ranges::size(values[i]) != acc.size())
        throw std::invalid_argument("distribute: reduce needs equal sizes on every replica; replica 0 has " +
                                    std::to_string(acc.size()) + " elements, replica " + std::to_string(i) + " has " +
                                    std::to_string(std::ranges::size(values[i])));
      std::size_t j = 0;
      for (const auto& x : values[i]) {
        acc[j] = detail::combine(op, acc[j], static_cast<T>(x));
        ++j;
      }
    }
    for (auto& x : acc) x = detail::finish(op, x, static_cast<int>(values.size()));
    return acc;
  }

  // Concatenates the replicas' values along `axis`, in replica order: values give a vector of one
  // value per replica; sequences give their concatenation (axis 0, the only axis a flat sequence has).
  template <detail::arithmetic T, std::size_t E>
  std::vector<T> gather(const per_replica<T, E>& values, int axis = 0) const {
    check_count(values.size(), "gather");
    check_axis(axis);
    return std::vector<T>(values.begin(), values.end());
  }
  template <detail::arithmetic_sequence S, std::size_t E>
  auto gather(const per_replica<S, E>& values, int axis = 0) const {
    check_count(values.size(), "gather");
    check_axis(axis);
    std::vector<std::ranges::range_value_t<S>> out;
    std::size_t total = 0;
    for (const auto& v : values) total += std::ranges::size(v);
    out.reserve(total);
    for (const auto& v : values) out.insert(out.end(), std::ranges::begin(v), std::ranges::end(v));
    return out;
  }

  // Every replica's value, in replica order.
  template <class T, std::size_t E>
  std::span<const T, E> local_results(const per_replica<T, E>& values) const {
    check_count(values.size(), "local_results");
    return values.values();
  }

  // Splits a batch along its first axis, `example_size` elements per example, into one part per
  // replica. The split is as even as possible; with a remainder the first replicas get one example
  // more, and with fewer examples than replicas the last replicas get empty parts.
  template <class T>
  per_replica_type<std::vector<T>> scatter(std::span<const T> batch, std::size_t example_size = 1) const {
    const auto n = static_cast<std::size_t>(self().num_replicas_in_sync());
    return detail::batch_shares<per_replica_type<std::vector<T>>>(batch, example_size, n, 0, n);
  }
  // Any contiguous batch: std::vector, std::array, std::span<T>, ...
  template <std::ranges::contiguous_range B>
    requires std::ranges::sized_range<B>
  auto scatter(const B& batch, std::size_t example_size = 1) const {
    using T = std::remove_cv_t<std::ranges::range_value_t<B>>;
    return scatter(std::span<const T>(std::ranges::data(batch), std::ranges::size(batch)), example_size);
  }

  // One value per replica from `fn(replica_id)`, called for each replica in order.
  template <class F>
    requires std::invocable<F&, int>
  auto values_from_function(F&& fn) const {
    using T = std::decay_t<std::invoke_result_t<F&, int>>;
    return make<per_replica_type<T>>([&](std::size_t r) { return std::invoke(fn, static_cast<int>(r)); });
  }

  // One copy of `factory(device)` per replica. The copies must come out identical (seed any random
  // initialisation); `verify_mirrored` checks, `broadcast` re-synchronises.
  template <class F>
  auto mirror(F&& factory) {
    using D = typename Derived::device_type;
    static_assert(std::invocable<F&, D&>, "distribute: mirror(factory) calls factory(device&) once per replica");
    using T = std::decay_t<std::invoke_result_t<F&, D&>>;
    auto& devices = self().devices_for_factory();
    return make<mirrored_type<T>>([&](std::size_t r) { return std::invoke(factory, devices[r]); });
  }

  // Makes every copy equal to replica `from`'s, after an update that ran on one replica only.
  template <class T, std::size_t E>
  void broadcast(mirrored<T, E>& value, int from = 0) const {
    check_count(value.size(), "broadcast");
    if (from < 0 || static_cast<std::size_t>(from) >= value.size())
      throw std::invalid_argument("distribute: broadcast from replica " + std::to_string(from) + " of " +
                                  std::to_string(value.size()));
    for (std::size_t r = 0; r < value.size(); ++r)
      if (r != static_cast<std::size_t>(from)) detail::assign_state(value[r], value[static_cast<std::size_t>(from)]);
  }

  // Re-batches a dataset of GLOBAL batches into per-replica batches (per_replica<Batch>), shards it
  // across workers as `options` say, and prefetches: see <distribute/data/distribute.hpp>.
  template <class D, class Options = data::distribute_options>
  auto distribute(const D& dataset, const Options& options) const {
    static_assert(
        requires { sizeof(data::distributor<D, Extent>); },
        "distribute: strategy.distribute(dataset) needs #include <distribute/data.hpp>");
    return data::distributor<D, Extent>::distribute(dataset, static_cast<std::size_t>(self().num_replicas_in_sync()),
                                                    options);
  }
  template <class D, class Options = data::distribute_options>
  auto distribute(const D& dataset) const {
    static_assert(
        requires { sizeof(Options); }, "distribute: strategy.distribute(dataset) needs #include <distribute/data.hpp>");
    return distribute(dataset, Options{});
  }

  // Calls `fn(input_context)` for this worker's input pipeline; the dataset it returns yields
  // per-replica batches, which go to the replicas in turn: see <distribute/data/distribute.hpp>.
  template <class F, class Options = data::distribute_options>
  auto distribute_from_function(const F& fn, const Options& options) const {
    static_assert(
        requires { sizeof(data::function_distributor<F, Extent>); },
        "distribute: strategy.distribute_from_function(fn) needs #include <distribute/data.hpp>");
    return data::function_distributor<F, Extent>::distribute(
        fn, static_cast<std::size_t>(self().num_replicas_in_sync()), options);
  }
  template <class F, class Options = data::distribute_options>
  auto distribute_from_function(const F& fn) const {
    static_assert(
        requires { sizeof(Options); },
        "distribute: strategy.distribute_from_function(fn) needs #include <distribute/data.hpp>");
    return distribute_from_function(fn, Options{});
  }

  // A debug check that mirrored copies are identical: compares a digest of each copy with the
  // primary's and throws `mirrored_divergence` naming the replicas that differ. A model's digest
  // covers its parameters and its buffers (running statistics); the message says which differ.
  template <class T, std::size_t E>
  void verify_mirrored(const mirrored<T, E>& value) const {
    static_assert(
        detail::digestible<T>,
        "distribute: verify_mirrored needs T to be trivially copyable, a contiguous range of trivially "
        "copyable elements, a model (for_each_parameter) or to have a member `std::uint64_t state_digest() const`");
    check_count(value.size(), "verify_mirrored");
    std::vector<std::uint64_t> digests;
    for (const auto& v : value) digests.push_back(detail::digest_of(v));
    const std::string differ = detail::replicas_differing(digests);
    if (differ.empty()) return;
    std::string parts;
    if constexpr (gradient_enumerable<T>) {
      std::vector<std::uint64_t> both;
      for (const auto& v : value) detail::append_model_digests(v, both);
      parts = detail::which_parts_differ(both);
    }
    throw mirrored_divergence("distribute: mirrored copies differ from the primary's on replica(s) " + differ + parts);
  }

 protected:
  // Builds a replica-indexed value from `make_one(replica)`, called in replica order.
  template <class V, class F>
  V make(F&& make_one) const {
    return detail::make_replica_values<V>(static_cast<std::size_t>(self().num_replicas_in_sync()), make_one);
  }

  void check_count(std::size_t n, const char* op) const {
    const auto expected = static_cast<std::size_t>(self().num_replicas_in_sync());
    if (n != expected)
      throw std::invalid_argument(std::string("distribute: ") + op + " got a value for " + std::to_string(n) +
                                  " replicas from a strategy of " + std::to_string(expected));
  }

  static void check_axis(int axis) {
    if (axis != 0)
      throw std::invalid_argument("distribute: gather of flat sequences concatenates along axis 0, got axis " +
                                  std::to_string(axis));
  }

  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace distribute
