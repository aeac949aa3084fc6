#pragma once
// Many processes (workers), each with one or more replicas on threads of its own, started by an MPI
// launcher (mpirun -np K, srun). A program started without a launcher is one worker and behaves
// like mirrored_strategy.
//
//   multi_worker_mirrored_strategy<> s{argc, argv, {.local_replicas = 2}};    CPU replicas, MPI
//   multi_worker_mirrored_strategy<cuda, comm::nccl> s{argc, argv};            a GPU per worker, NCCL
//                                           (cuda/strategy/multi_worker_mirrored_strategy.cuh)
//
// One template for every device: the worker group (strategy/detail/worker_group.hpp) is its only
// device-specific part: how a worker's replicas are made and joined (shared memory in the worker and
// MPI between workers for CPU replicas; one NCCL communicator across the job's GPUs), and what a
// replica's thread does around a step. What crosses workers on the host (`reduce`, `gather`,
// `mirror` and `broadcast` of host state, `verify_mirrored`, the input agreement) goes over MPI for
// every device.
//
// Replicas are numbered across the job (worker w holds replicas first(w) ...), and
// `num_replicas_in_sync()` counts them all. Per-replica and mirrored values hold this worker's
// replicas; what crosses workers goes through the collectives: `run`'s collectives span the job,
// `reduce` and `gather` combine every worker's replicas and give every worker the same result,
// `mirror` and `broadcast` copy the chief's (worker 0's) state to every worker, `scatter` and
// `distribute` give this worker its replicas' shares of a global batch.
//
// Failure semantics: one worker cannot leave a step that the others are in. When a step fails on
// any replica of a job with several workers (an exception, a timeout, a mismatch), `run` rethrows
// the first failure and the strategy refuses further work. CPU workers: the job is aborted when this
// process exits (or after `abort_grace`), and the other workers stop within their collective timeout
// at most. GPU workers: the failing worker tells the others over MPI and aborts its NCCL
// communicators, and a worker waiting in NCCL gives up at once. Checkpoints written by the chief are
// how a job continues (docs/multi_worker.md).

#include <distribute/collective_options.hpp>
#include <distribute/comm/hierarchical.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/comm/mpi.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/errors.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/strategy/detail/multi_worker_base.hpp>
#include <distribute/strategy/detail/replica_pool.hpp>
#include <distribute/strategy/detail/state_broadcast.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>
#include <distribute/strategy/detail/worker_replica_context.hpp>
#include <distribute/strategy/detail/worker_group.hpp>
#include <distribute/strategy/detail/device_policy.hpp>
#include <distribute/strategy/detail/run_loop.hpp>
#include <distribute/strategy/detail/step_clock.hpp>
#include <distribute/step_timings.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

namespace data::detail {
template <std::size_t Extent>
struct split_global_batch;  // <distribute/data/distribute.hpp>
template <class D>
class agreed_steps_dataset;
}  // namespace data::detail

template <device D = cpu, class Comm = comm::mpi>
class multi_worker_mirrored_strategy : public detail::multi_worker_base<multi_worker_mirrored_strategy<D, Comm>> {
  static_assert(
      requires { sizeof(detail::worker_group<D, Comm>); },
      "distribute: multi_worker_mirrored_strategy runs CPU replicas joined by MPI (<cpu, comm::mpi>) or GPUs "
      "joined by NCCL (<cuda, comm::nccl>, in <distribute/cuda/strategy/multi_worker_mirrored_strategy.cuh>)");
  using group_type = detail::worker_group<D, Comm>;
  using policy = detail::device_policy<D>;

 public:
  static constexpr std::size_t extent = std::dynamic_extent;
  using device_type = D;
  using options_type = typename group_type::options_type;
  using communicator_type = typename group_type::communicator;
  using replica_type = detail::worker_replica_context<D, communicator_type>;
  using primary_replica_type = replica_context<D, typename policy::solo_communicator>;
  template <class T>
  using per_replica_type = per_replica<T>;
  template <class T>
  using mirrored_type = mirrored<T>;

  // One replica per worker (CPU), one GPU per worker (cuda: the node-local rank's), MPI initialised
  // without the program's arguments (if not already).
  multi_worker_mirrored_strategy() : multi_worker_mirrored_strategy(options_type{}) {}
  explicit multi_worker_mirrored_strategy(options_type options)
      : state_{std::make_unique<state>(std::move(options), nullptr, nullptr)} {}
  // Initialises MPI with the program's arguments (the launcher may pass some), if not already.
  multi_worker_mirrored_strategy(int& argc, char**& argv, options_type options = {})
      : state_{std::make_unique<state>(std::move(options), &argc, &argv)} {}

  multi_worker_mirrored_strategy(multi_worker_mirrored_strategy&&) noexcept = default;
  multi_worker_mirrored_strategy& operator=(multi_worker_mirrored_strategy&&) noexcept = default;
  // A strategy destroyed by an exception on its way up (one that did not come from a collective,
  // whose failure has already taken this worker out) leaves the job: the other workers may be in a
  // collective waiting for this one, and would otherwise wait for their timeout (MPI_Finalize waits
  // for them too). The job is then aborted as for any failure.
  ~multi_worker_mirrored_strategy() {
    if (state_ && std::uncaught_exceptions() > 0 && state_->group.num_workers() > 1 && state_->failure.empty())
      leave_job(*state_, std::make_exception_ptr(std::runtime_error(
                             "an exception ended the program's use of the strategy (the worker left the job)")));
  }

  // --- the job ---------------------------------------------------------------------------------
  int num_replicas_in_sync() const noexcept { return state_->group.total_replicas(); }
  int num_local_replicas() const noexcept { return state_->group.local_replicas(); }
  int worker_index() const noexcept { return state_->group.worker_index(); }
  int num_workers() const noexcept { return state_->group.num_workers(); }
  // Worker 0 writes checkpoints and logs.
  bool is_chief() const noexcept { return worker_index() == 0; }
  // The replica id of this worker's first replica; its replicas are first .. first + local - 1.
  int first_replica_id() const noexcept { return state_->group.first_replica(worker_index()); }
  // This worker's devices (cpu:0 ..; GPUs bound to their replicas' streams).
  std::span<const D> devices() const noexcept { return state_->group.devices(); }
  // The workers' MPI communicator, for the program's own collectives between steps (called by every
  // worker, never inside `run`).
  comm::mpi& communicator() const noexcept { return state_->group.cross(); }
  const options_type& options() const noexcept { return state_->group.options(); }

  // --- steps -----------------------------------------------------------------------------------

  // Calls `fn(replica, args...)` on each of this worker's replicas concurrently (every worker does
  // the same); per-replica and mirrored arguments are unwrapped to the replica's own element.
  // Returns this worker's per_replica<R> (or nothing for a void fn).
  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    state& st = *state_;
    // A worker that failed while this one was not waiting for it.
    if (st.failure.empty() && num_workers() > 1)
      if (auto why = st.group.partner_failure()) st.failure = *why;
    check_usable("strategy.run");
    const detail::exclusive_step exclusive(st.in_step, group_type::strategy_name);
    const detail::step_clock::step_scope timed{st.clock};
    (check_argument(args), ...);
    st.group.prepare_step();
    auto hooks = st.group.hooks([this](const std::exception_ptr& e) { fail_job(e); });
    return detail::run_replicas(st.pool, st.replicas, st.group.meeting(), st.steps++, hooks, fn, args...);
  }

  // Where this worker's time went since the strategy was made (step_timings.hpp): compute and
  // collective time (averaged over this worker's replicas), input wait, checkpoints. Between steps.
  step_timings timings() const noexcept { return state_->clock.totals(); }

  // How this worker's replicas' compute engines work (engine/engine.hpp). By default each replica's
  // engine uses its share of the cores (see state::set_compute_options). Between steps only.
  void set_compute_options(const compute_options& options) { state_->set_compute_options(options); }
  [[deprecated("distribute: set_engine_options is now set_compute_options")]]
  void set_engine_options(const compute_options& options) {
    set_compute_options(options);
  }

  // Calls `fn(primary, args...)` once on this worker, on the calling thread, as a group of one on
  // its first device (collectives are no-ops). Every worker runs it; `broadcast` afterwards makes
  // mirrored state that it changed identical again.
  template <class F, class... A>
  decltype(auto) run_on_primary(F&& fn, A&&... args) {
    detail::check_run_parameters<std::remove_reference_t<F>, primary_replica_type, std::remove_reference_t<A>...>();
    const detail::step_clock::step_scope timed{state_->clock};
    const D& device = state_->group.devices()[0];
    [[maybe_unused]] const auto entered = policy::enter(device);
    primary_replica_type r{device, policy::solo(device), &state_->primary_engine};
    return std::invoke(fn, r, detail::unwrap_for(args, 0)...);
  }

  // --- cross-replica operations (called by every worker, outside `run`) -----------------------

  // Every replica's value of every worker, reduced; the same on every worker. Arithmetic values give
  // a value, sequences an element-wise std::vector.
  template <detail::arithmetic T, std::size_t E>
  T reduce(reduce_op op, const per_replica<T, E>& values) const {
    check_count(values.size(), "reduce");
    const reduce_op partial = op == reduce_op::mean ? reduce_op::sum : op;
    T acc = values[0];
    for (std::size_t i = 1; i < values.size(); ++i) acc = detail::combine(partial, acc, values[i]);
    across(op, std::span<T>(&acc, 1), "strategy.reduce");
    return acc;
  }
  template <detail::arithmetic_sequence S, std::size_t E>
  auto reduce(reduce_op op, const per_replica<S, E>& values) const {
    using T = std::ranges::range_value_t<S>;
    check_count(values.size(), "reduce");
    const reduce_op partial = op == reduce_op::mean ? reduce_op::sum : op;
    std::vector<T> acc(std::ranges::begin(values[0]), std::ranges::end(values[0]));
    for (std::size_t i = 1; i < values.size(); ++i) {
      if (std::ranges::size(values[i]) != acc.size())
        throw std::invalid_argument("distribute: reduce needs equal sizes on every replica; replica " +
                                    std::to_string(first_replica_id()) + " has " + std::to_string(acc.size()) +
                                    " elements, replica " + std::to_string(first_replica_id() + static_cast<int>(i)) +
                                    " has " + std::to_string(std::ranges::size(values[i])));
      std::size_t j = 0;
      for (const auto& x : values[i]) {
        acc[j] = detail::combine(partial, acc[j], static_cast<T>(x));
        ++j;
      }
    }
    across(op, std::span<T>(acc), "strategy.reduce");
    return acc;
  }

  // Every replica's value of every worker, in replica order; the same on every worker.
  template <detail::arithmetic T, std::size_t E>
  std::vector<T> gather(const per_replica<T, E>& values, int axis = 0) const {
    const std::vector<T> mine = local_elements(values, axis);
    check_usable("strategy.gather");
    auto& g = state_->group;
    std::vector<T> out(static_cast<std::size_t>(num_replicas_in_sync()));
    std::vector<std::size_t> counts(static_cast<std::size_t>(num_workers()));
    for (int w = 0; w < num_workers(); ++w)
      counts[static_cast<std::size_t>(w)] = static_cast<std::size_t>(g.replicas_of(w));
    guarded([&] {
      const detail::api_scope origin("strategy.gather", last_step());
      g.cross().all_gather(std::span<const T>(mine), std::span<T>(out), std::span<const std::size_t>(counts));
    });
    return out;
  }
  template <detail::arithmetic_sequence S, std::size_t E>
  auto gather(const per_replica<S, E>& values, int axis = 0) const {
    using T = std::ranges::range_value_t<S>;
    const std::vector<T> mine = local_elements(values, axis);
    check_usable("strategy.gather");
    auto& cross = state_->group.cross();
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(num_workers()));
    const std::uint64_t own = mine.size();
    std::vector<T> out;
    guarded([&] {
      const detail::api_scope origin("strategy.gather", last_step());
      cross.all_gather(std::span<const std::uint64_t>(&own, 1), std::span<std::uint64_t>(counts));
      const std::vector<std::size_t> sizes(counts.begin(), counts.end());
      std::size_t total = 0;
      for (auto c : sizes) total += c;
      out.resize(total);
      cross.all_gather(std::span<const T>(mine), std::span<T>(out), std::span<const std::size_t>(sizes));
    });
    return out;
  }

  // One copy of `factory(device)` per local replica, then the chief's first copy sent to every
  // worker: the copies are identical across the job even if the factory is not deterministic.
  template <class F>
  auto mirror(F&& factory) {
    static_assert(std::invocable<F&, D&>, "distribute: mirror(factory) calls factory(device&) once per replica");
    using T = std::decay_t<std::invoke_result_t<F&, D&>>;
    static_assert(
        detail::broadcastable_state<T> || group_type::template broadcasts_in_step<T>,
        "distribute: multi_worker_mirrored_strategy::mirror sends the chief's copy to the other workers; T must "
        "be a model (for_each_parameter), stream its state (save/load), be trivially copyable, or be a "
        "contiguous sequence of trivially copyable elements");
    auto& devices = state_->group.devices();
    auto copies = this->template make<mirrored<T>>([&](std::size_t r) { return std::invoke(factory, devices[r]); });
    if constexpr (group_type::template broadcasts_in_step<T>) {
      broadcast(copies, 0);
    } else {
      sync_from(copies, 0, "strategy.mirror");
    }
    return copies;
  }

  // Makes every copy on every worker equal to replica `from`'s (a replica id of the job). Device
  // state (GPU tensors of one shape everywhere) goes through the replicas' own broadcast in a step;
  // host state over MPI.
  template <class T, std::size_t E>
  void broadcast(mirrored<T, E>& value, int from = 0) const {
    check_broadcast(value.size(), from);
    if constexpr (group_type::template broadcasts_in_step<T>) {
      // A step of its own: every replica joins. The strategy's state is shared, so this is a const
      // operation on the strategy as the concept has it.
      const_cast<multi_worker_mirrored_strategy&>(*this).run([from](auto& r, T& t) { r.broadcast(t.values(), from); },
                                                             value);
    } else {
      const int owner = state_->group.worker_of(from);
      if (owner == worker_index() && from != first_replica_id()) {
        detail::assign_state(value[0], value[static_cast<std::size_t>(from - first_replica_id())]);
      }
      sync_from(value, owner, "strategy.broadcast");
    }
  }

  // Compares a digest of every copy on every worker with replica 0's and throws
  // `mirrored_divergence` naming the replicas that differ. A model's digest covers its parameters
  // and its buffers (running statistics); when copies differ, a second gather says which of the two.
  template <class T, std::size_t E>
  void verify_mirrored(const mirrored<T, E>& value) const {
    static_assert(
        detail::digestible<T>,
        "distribute: verify_mirrored needs T to be trivially copyable, a contiguous range of trivially "
        "copyable elements, a model (for_each_parameter) or to have a member `std::uint64_t state_digest() const`");
    check_count(value.size(), "verify_mirrored");
    check_usable("strategy.verify_mirrored");
    std::vector<std::uint64_t> mine;
    for (const auto& v : value) mine.push_back(detail::digest_of(v));
    std::vector<std::uint64_t> all(static_cast<std::size_t>(num_replicas_in_sync()));
    std::vector<std::size_t> counts(static_cast<std::size_t>(num_workers()));
    for (int w = 0; w < num_workers(); ++w)
      counts[static_cast<std::size_t>(w)] = static_cast<std::size_t>(state_->group.replicas_of(w));
    guarded([&] {
      const detail::api_scope origin("strategy.verify_mirrored", last_step());
      state_->group.cross().all_gather(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(all),
                                       std::span<const std::size_t>(counts));
    });
    if constexpr (gradient_enumerable<T>) {
      // Every worker holds the same digests: all take this second gather, or none does.
      if (const auto differ = detail::replicas_differing(all); !differ.empty()) {
        std::vector<std::uint64_t> parts, all_parts(2 * all.size());
        for (const auto& v : value) detail::append_model_digests(v, parts);
        for (auto& c : counts) c *= 2;
        guarded([&] {
          const detail::api_scope origin("strategy.verify_mirrored (which parts differ)", last_step());
          state_->group.cross().all_gather(std::span<const std::uint64_t>(parts), std::span<std::uint64_t>(all_parts),
                                           std::span<const std::size_t>(counts));
        });
        throw mirrored_divergence("distribute: mirrored copies differ from replica 0's on replica(s) " + differ +
                                  detail::which_parts_differ(all_parts));
      }
    }
    check_digests(all);
  }

  // Re-batches a dataset of GLOBAL batches into this worker's per-replica batches, with the worker
  // index and count filled in for sharding: see <distribute/data/distribute.hpp>.
  template <class Ds, class Options = data::distribute_options>
  auto distribute(const Ds& dataset, Options options) const {
    static_assert(
        requires { sizeof(data::distributor<Ds, extent>); },
        "distribute: strategy.distribute(dataset) needs #include <distribute/data.hpp>");
    const auto local = static_cast<std::size_t>(num_local_replicas());
    if (num_workers() > 1 && !same_replicas_everywhere()) {
      // Sharding by data with one share per replica of the job (rather than an equal share per worker):
      // every worker reads every global batch and keeps its replicas' shares.
      using policy = decltype(options.policy);
      if (options.policy == policy::file)
        throw std::invalid_argument(
            "distribute: shard_policy::file splits the files evenly over workers; with workers "
            "holding different numbers of replicas use shard_policy::data (or automatic)");
      if (options.policy != policy::off) {
        if (options.prefetch == 0 || options.prefetch_threads == 0)
          throw std::invalid_argument(
              "distribute::data: distribute needs a prefetch of at least 1 step on at least 1 thread");
        // Named through Ds so that it is looked up where <distribute/data.hpp> is included.
        using split = std::conditional_t<sizeof(Ds) != 0, data::detail::split_global_batch<extent>, void>;
        auto out = dataset
                       .map(split{local, static_cast<std::size_t>(num_replicas_in_sync()),
                                  static_cast<std::size_t>(first_replica_id())})
                       .prefetch(options.prefetch, options.prefetch_threads);
        return data::detail::agreed_steps_dataset<decltype(out)>(std::move(out), census(), options.uneven,
                                                                 static_cast<std::size_t>(worker_index()),
                                                                 static_cast<std::size_t>(num_workers()), true);
      }
    }
    fill_worker(options);
    return data::distributor<Ds, extent>::distribute(dataset, local, options, census());
  }
  template <class Ds, class Options = data::distribute_options>
  auto distribute(const Ds& dataset) const {
    static_assert(
        requires { sizeof(Options); }, "distribute: strategy.distribute(dataset) needs #include <distribute/data.hpp>");
    return distribute(dataset, Options{});
  }
  template <class F, class Options = data::distribute_options>
  auto distribute_from_function(const F& fn, Options options) const {
    static_assert(
        requires { sizeof(data::function_distributor<F, extent>); },
        "distribute: strategy.distribute_from_function(fn) needs #include <distribute/data.hpp>");
    if (num_workers() > 1 && !same_replicas_everywhere())
      throw std::invalid_argument(
          "distribute: distribute_from_function gives each worker's input pipeline an equal part "
          "of the global batch; with workers holding different numbers of replicas use distribute "
          "or scatter");
    fill_worker(options);
    return data::function_distributor<F, extent>::distribute(fn, static_cast<std::size_t>(num_local_replicas()),
                                                             options, census());
  }
  template <class F, class Options = data::distribute_options>
  auto distribute_from_function(const F& fn) const {
    static_assert(
        requires { sizeof(Options); },
        "distribute: strategy.distribute_from_function(fn) needs #include <distribute/data.hpp>");
    return distribute_from_function(fn, Options{});
  }

 private:
  using base = detail::multi_worker_base<multi_worker_mirrored_strategy>;
  using base::check_argument;
  using base::check_broadcast;
  using base::check_count;
  using base::check_digests;
  using base::local_elements;

  struct state {
    state(options_type options, int* argc, char*** argv)
        : group(std::move(options), argc, argv),
          engines(group.devices().size()),
          clock(group.devices().size()),
          pool(static_cast<int>(group.devices().size())) {
      set_compute_options({});
      const auto& devices = group.devices();
      replicas.reserve(devices.size());
      for (std::size_t r = 0; r < devices.size(); ++r)
        replicas.emplace_back(devices[r], group.endpoint(static_cast<int>(r)), static_cast<int>(r),
                              group.worker_index(), &engines[r], clock.meter(r));
    }
    // Each replica's engine gets its share of the cores (the worker group says how many).
    void set_compute_options(const compute_options& o) {
      const auto [share, primary] = group.core_shares();
      for (auto& e : engines) e.reset(o, share);
      primary_engine.reset(o, primary);
    }
    group_type group;                     // this worker's devices and replicas' communicators, and the job around them
    std::vector<engine_slot<D>> engines;  // one per local replica; never resized (replicas point in)
    engine_slot<D> primary_engine;
    detail::step_clock clock;  // one collective meter per local replica (replicas point in)
    std::vector<replica_type> replicas;
    std::atomic<bool> in_step{false};
    std::int64_t steps = 0;     // `run` calls started: collectives name their step (collective_origin.hpp)
    std::string failure;        // why this worker left the job
    detail::replica_pool pool;  // last: its threads stop before the rest is destroyed
  };

  static std::string what(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      return ex.what();
    } catch (...) {
      return "an exception not derived from std::exception";
    }
  }

  // With other workers in the job, a failure on this one leaves them waiting in a collective that
  // will not complete: this worker leaves the job (the worker group says how the others learn of it).
  void fail_job(const std::exception_ptr& failure) const { leave_job(*state_, failure); }
  static void leave_job(state& st, const std::exception_ptr& failure) {
    const int workers = st.group.num_workers();
    if (workers == 1 || !st.failure.empty()) return;
    st.failure = what(failure);
    const std::string_view cause = std::string_view(st.failure).starts_with("distribute: ")
                                       ? std::string_view(st.failure).substr(12)
                                       : std::string_view(st.failure);
    st.group.leave("distribute: worker " + std::to_string(st.group.worker_index()) + " of " + std::to_string(workers) +
                       " failed: " + std::string(cause),
                   st.failure);
  }

  // Runs cross-worker work of the calling thread; a failure is a failure of the job.
  template <class F>
  void guarded(F&& f) const {
    guarded(*state_, f);
  }
  template <class F>
  static void guarded(state& st, F&& f) {
    try {
      f();
    } catch (...) {
      leave_job(st, std::current_exception());
      throw;
    }
  }

  void check_usable(const char* op) const { check_usable(*state_, op); }
  static void check_usable(const state& st, const char* op) {
    if (!st.failure.empty())
      throw collective_aborted(std::string("distribute: ") + op + " on worker " +
                               std::to_string(st.group.worker_index()) +
                               " cannot run: this worker left the job after a failure: " + st.failure);
  }

  // The cross-worker stage of `reduce`: `values` hold this worker's partial result.
  template <class T>
  void across(reduce_op op, std::span<T> values, const char* what_op) const {
    check_usable(what_op);
    if (num_workers() == 1) {
      for (auto& v : values) v = detail::finish(op, v, num_replicas_in_sync());
      return;
    }
    guarded([&] {
      const detail::api_scope origin(what_op, last_step());
      state_->group.cross().all_reduce(op, values, num_replicas_in_sync());
    });
  }

  // Copies the first local copy of worker `owner` to every copy on every worker.
  template <class T, std::size_t E>
  void sync_from(mirrored<T, E>& value, int owner, const char* api) const {
    check_usable(api);
    const detail::api_scope origin(api, last_step());
    if (num_workers() > 1) {
      static_assert(
          detail::broadcastable_state<T>,
          "distribute: broadcast between workers needs T to be a model (for_each_parameter), stream its "
          "state (save/load), be trivially copyable, or be a contiguous sequence of trivially copyable elements");
      guarded([&] { detail::broadcast_state(state_->group.cross(), value[0], owner); });
    }
    for (std::size_t r = 1; r < value.size(); ++r) {
      if constexpr (std::is_copy_assignable_v<T>) {
        detail::assign_state(value[r], value[0]);
      } else {
        if (num_workers() > 1) guarded([&] { detail::broadcast_state(state_->group.cross(), value[r], owner); });
      }
    }
  }

  // The distributed datasets' agreement before each step: {examples, workers out of input} summed
  // over the workers (data/distribute.hpp). The dataset keeps this, so it refers to the state, which
  // stays where it is when the strategy is moved.
  auto census() const {
    return [st = state_.get()](std::array<std::uint64_t, 2> mine) {
      if (st->group.num_workers() == 1) return mine;
      check_usable(*st, "the input agreement");
      const detail::api_scope origin("input agreement (strategy.distribute)", st->steps - 1);
      guarded(*st, [&] { st->group.cross().all_reduce(reduce_op::sum, std::span<std::uint64_t>(mine)); });
      return mine;
    };
  }

  // The step the strategy's own collectives come after (-1 before the first).
  std::int64_t last_step() const noexcept { return state_->steps - 1; }

  bool same_replicas_everywhere() const noexcept { return state_->group.layout().even(); }

  template <class Options>
  void fill_worker(Options& options) const {
    options.num_workers = static_cast<std::size_t>(num_workers());
    options.worker_index = static_cast<std::size_t>(worker_index());
  }

  std::unique_ptr<state> state_;
};

}  // namespace distribute
