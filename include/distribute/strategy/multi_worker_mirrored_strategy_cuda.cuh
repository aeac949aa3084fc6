#pragma once
// multi_worker_mirrored_strategy<cuda, comm::nccl>: many processes (workers, started by mpirun or
// srun), each driving one or more GPUs with a replica thread per GPU, all joined by one NCCL
// communicator that spans the job. NCCL is itself hierarchical (NVLink/NVLS inside a node, the
// network between nodes), so one communicator across all GPUs is the GPU form of the CPU strategy's
// in-process stage + cross-process stage. MPI only bootstraps it: rank 0 makes the NCCL unique id and
// MPI_Bcast gives it to every worker; `reduce`, `gather` and `broadcast` of host values go over MPI.
//
//   mpirun -np 8 ./train            one GPU per worker: node-local rank k takes cuda:k
//   multi_worker_mirrored_strategy<cuda, comm::nccl> s{argc, argv, {.devices = {0, 1}}};  two GPUs
//
// Replicas are numbered across the job (worker w holds replicas first(w) ...), and
// `num_replicas_in_sync()` counts them all; per-replica and mirrored values hold this worker's.
// `reduce` and `gather` combine every replica's value in replica order (bit-identical on every worker
// and to a single process holding every replica).
//
// Failure semantics: within a worker, as mirrored_strategy<cuda>. Across workers: NCCL does not tell
// a rank that another process gave up (aborting a communicator is local), so a worker whose step
// fails tells every other worker over MPI (an out-of-band notice, `detail::worker_failure_notice`)
// and aborts its communicators. A worker waiting in an NCCL collective looks for that notice and
// gives up at once with collective_aborted naming the failed worker and its error; one that was not
// waiting refuses its next step the same way. A worker that dies without a word leaves the others to
// their deadline (collective_timeout), never a hang. With several workers, a failed step leaves the
// communicator unusable for the whole job: this strategy then refuses further work, and the job
// restarts from a checkpoint.

#include <distribute/collective_options.hpp>
#include <distribute/comm/nccl.cuh>
#include <distribute/concepts/strategy.hpp>
#include <distribute/config.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/device/cuda.cuh>
#include <distribute/errors.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/strategy/detail/cuda_replica_comm.cuh>
#include <distribute/strategy/detail/cuda_replica_hooks.cuh>
#include <distribute/strategy/detail/multi_worker_base.hpp>
#include <distribute/strategy/detail/replica_pool.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>
#include <distribute/strategy/detail/worker_replica_context.hpp>
#include <distribute/strategy/multi_worker_mirrored_strategy.hpp>
#include <distribute/tensor/cuda_tensor.cuh>

#if !DISTRIBUTE_HAS_MPI
#  error "multi_worker_mirrored_strategy<cuda, nccl> needs MPI to bootstrap NCCL (link distribute::mpi)"
#endif

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

struct multi_worker_cuda_options {
  // This worker's GPUs, by ordinal. Empty: one GPU, the node-local rank modulo the visible GPUs.
  std::vector<int> devices{};
  // How long a replica waits in a collective (and the job in NCCL's set-up) before it gives up.
  collective_options collectives{};
};

namespace detail {

inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw collective_error(std::string("distribute: ") + call + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

// Initialises MPI if nobody has, and finalises it at exit if it did.
inline void ensure_mpi(int* argc, char*** argv) {
  int initialised = 0;
  mpi_check(MPI_Initialized(&initialised), "MPI_Initialized");
  if (initialised) return;
  int provided = 0;
  mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  struct finaliser {
    ~finaliser() {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    }
  };
  static finaliser at_exit;
}

// Every worker's `bytes` of data, concatenated in worker order; `offsets[w]` is where worker w's
// start, `offsets[workers]` the total.
inline std::vector<unsigned char> all_gather_bytes(MPI_Comm comm, const void* mine, std::size_t bytes,
                                                   std::vector<std::size_t>& offsets) {
  int workers = 0;
  mpi_check(MPI_Comm_size(comm, &workers), "MPI_Comm_size");
  const long long own = static_cast<long long>(bytes);
  std::vector<long long> sizes(static_cast<std::size_t>(workers));
  mpi_check(MPI_Allgather(&own, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, comm), "MPI_Allgather");
  std::vector<int> counts(static_cast<std::size_t>(workers)), displs(static_cast<std::size_t>(workers));
  offsets.assign(static_cast<std::size_t>(workers) + 1, 0);
  for (int w = 0; w < workers; ++w) {
    const auto i = static_cast<std::size_t>(w);
    if (sizes[i] > INT32_MAX - static_cast<long long>(offsets[i]))
      throw std::length_error("distribute: a multi-worker gather above 2 GiB goes through the replicas' collectives");
    counts[i] = static_cast<int>(sizes[i]);
    displs[i] = static_cast<int>(offsets[i]);
    offsets[i + 1] = offsets[i] + static_cast<std::size_t>(sizes[i]);
  }
  std::vector<unsigned char> out(offsets.back());
  mpi_check(MPI_Allgatherv(mine, static_cast<int>(bytes), MPI_BYTE, out.data(), counts.data(), displs.data(), MPI_BYTE, comm),
            "MPI_Allgatherv");
  return out;
}

// The out-of-band failure notice between GPU workers. A worker whose step failed sends every other
// worker a short message on a communicator of its own; each worker keeps one receive posted for it
// and tests it while its replicas wait for NCCL. MPI is only called from the thread that runs the
// strategy's steps (replica 0's: MPI may have been initialised for that thread alone).
class worker_failure_notice {
 public:
  struct message {
    int worker = -1;
    char text[500]{};
  };

  worker_failure_notice() = default;
  worker_failure_notice(const worker_failure_notice&) = delete;
  worker_failure_notice& operator=(const worker_failure_notice&) = delete;
  ~worker_failure_notice() { close(); }

  // Collective over `world` (it duplicates it).
  void open(MPI_Comm world) {
    mpi_check(MPI_Comm_dup(world, &comm_), "MPI_Comm_dup");
    mpi_check(MPI_Comm_size(comm_, &workers_), "MPI_Comm_size");
    mpi_check(MPI_Irecv(&in_, static_cast<int>(sizeof in_), MPI_BYTE, MPI_ANY_SOURCE, 0, comm_, &recv_), "MPI_Irecv");
  }

  // Which thread may call MPI from now on.
  void set_caller(std::thread::id id) noexcept { caller_.store(id, std::memory_order_relaxed); }

  // "worker W failed: ..." once another worker has announced its failure; nothing before that, or on
  // a thread other than the caller's.
  std::optional<std::string> poll() {
    if (std::this_thread::get_id() != caller_.load(std::memory_order_relaxed)) return seen();
    if (!seen_.load(std::memory_order_acquire) && recv_ != MPI_REQUEST_NULL) {
      int arrived = 0;
      if (MPI_Test(&recv_, &arrived, MPI_STATUS_IGNORE) == MPI_SUCCESS && arrived) {
        in_.text[sizeof in_.text - 1] = '\0';
        reason_ = "worker " + std::to_string(in_.worker) + " failed: " + in_.text;
        seen_.store(true, std::memory_order_release);
      }
    }
    return seen();
  }
  bool received() const noexcept { return seen_.load(std::memory_order_acquire); }

  // Tells every other worker, without waiting for them.
  void announce(int me, const std::string& why) noexcept {
    if (comm_ == MPI_COMM_NULL || workers_ < 2 || out_) return;
    out_ = std::make_unique<message>();
    out_->worker = me;
    std::strncpy(out_->text, why.c_str(), sizeof out_->text - 1);
    for (int w = 0; w < workers_; ++w) {
      if (w == me) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(out_.get(), static_cast<int>(sizeof *out_), MPI_BYTE, w, 0, comm_, &r) == MPI_SUCCESS) sends_.push_back(r);
    }
  }

  void close() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (recv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&recv_);
      MPI_Wait(&recv_, MPI_STATUS_IGNORE);
    }
    bool sent = true;
    for (auto& r : sends_) {
      int done = 0;
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (!done) {
        MPI_Request_free(&r);
        sent = false;
      }
    }
    // A send MPI has not finished with keeps its buffer.
    if (!sent) (void)out_.release();
    MPI_Comm_free(&comm_);
  }

 private:
  std::optional<std::string> seen() const {
    if (!seen_.load(std::memory_order_acquire)) return std::nullopt;
    return reason_;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int workers_ = 1;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  message in_{};
  std::unique_ptr<message> out_;
  std::vector<MPI_Request> sends_;
  std::atomic<std::thread::id> caller_{};
  std::atomic<bool> seen_{false};
  std::string reason_;  // written before seen_ is set, read after
};

template <class T>
inline constexpr bool is_cuda_tensor_v = false;
template <class E>
inline constexpr bool is_cuda_tensor_v<tensor<E, cuda>> = true;

}  // namespace detail

template <>
class multi_worker_mirrored_strategy<cuda, comm::nccl>
    : public detail::multi_worker_base<multi_worker_mirrored_strategy<cuda, comm::nccl>> {
 public:
  static constexpr std::size_t extent = std::dynamic_extent;
  using device_type = cuda;
  using communicator_type = comm::nccl;
  using replica_type = detail::worker_replica_context<cuda, comm::nccl>;
  using primary_replica_type = replica_context<cuda, comm::cuda_solo>;
  template <class T>
  using per_replica_type = per_replica<T>;
  template <class T>
  using mirrored_type = mirrored<T>;

  multi_worker_mirrored_strategy() : multi_worker_mirrored_strategy(multi_worker_cuda_options{}) {}
  explicit multi_worker_mirrored_strategy(multi_worker_cuda_options options) : multi_worker_mirrored_strategy(nullptr, nullptr, std::move(options)) {}
  // Initialises MPI with the program's arguments (the launcher may pass some), if not already.
  multi_worker_mirrored_strategy(int& argc, char**& argv, multi_worker_cuda_options options = {})
      : multi_worker_mirrored_strategy(&argc, &argv, std::move(options)) {}

  int num_replicas_in_sync() const noexcept { return st_->group->world_size(); }
  int num_local_replicas() const noexcept { return st_->group->local_size(); }
  int worker_index() const noexcept { return st_->worker; }
  int num_workers() const noexcept { return st_->workers; }
  bool is_chief() const noexcept { return worker_index() == 0; }
  int first_replica_id() const noexcept { return st_->group->first_rank(); }
  std::span<const cuda> devices() const noexcept { return st_->devices; }
  // The MPI communicator of the workers (a duplicate of MPI_COMM_WORLD), for the program's own use
  // between steps.
  MPI_Comm mpi_communicator() const noexcept { return st_->mpi; }

  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    state& st = *st_;
    st.notice.set_caller(std::this_thread::get_id());
    // A worker that failed while this one was not waiting for it.
    if (num_workers() > 1 && st.failure.empty()) {
      if (auto why = st.notice.poll()) {
        st.failure = *why;
        st.group->abort_all_for_failure();
      }
    }
    check_usable("run");
    const detail::exclusive_step exclusive(st.in_step, "multi_worker_mirrored_strategy<cuda, nccl>");
    (check_argument(args), ...);
    auto& meeting = st.group->meeting();
    meeting.reset();
    detail::cuda_replica_hooks hooks{st.devices, meeting.options().timeout,
                                     [&st](int rank) noexcept { st.group->abort_replica(rank); },
                                     [this](const std::exception_ptr& failure) { leave_job(failure); }};
    return detail::run_replicas(st.pool, st.replicas, meeting, st.steps++, hooks, fn, args...);
  }

  template <class F, class... A>
  decltype(auto) run_on_primary(F&& fn, A&&... args) {
    const cuda& dev = st_->devices[0];
    const detail::device_guard current(dev.index());
    primary_replica_type r{dev, comm::cuda_solo{dev.stream()}};
    return std::invoke(fn, r, detail::unwrap_for(args, 0)...);
  }

  // Every replica's value of every worker, reduced in replica order; the same bits on every worker.
  template <detail::arithmetic T, std::size_t E>
  T reduce(reduce_op op, const per_replica<T, E>& values) const {
    const auto all = gather(values);
    T acc = all[0];
    for (std::size_t i = 1; i < all.size(); ++i) acc = detail::combine(op, acc, all[i]);
    return detail::finish(op, acc, static_cast<int>(all.size()));
  }
  template <detail::arithmetic_sequence S, std::size_t E>
  auto reduce(reduce_op op, const per_replica<S, E>& values) const {
    using T = std::ranges::range_value_t<S>;
    check_count(values.size(), "reduce");
    const std::size_t len = std::ranges::size(values[0]);
    for (const auto& v : values)
      if (std::ranges::size(v) != len)
        throw std::invalid_argument("distribute: reduce needs equal sizes on every replica; got " + std::to_string(len) +
                                    " and " + std::to_string(std::ranges::size(v)));
    const auto all = gather(values);
    if (all.size() != len * static_cast<std::size_t>(num_replicas_in_sync()))
      throw std::invalid_argument("distribute: reduce needs equal sizes on every replica of every worker; this worker's have " +
                                  std::to_string(len) + " elements");
    std::vector<T> acc(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(len));
    for (std::size_t r = 1; r < static_cast<std::size_t>(num_replicas_in_sync()); ++r)
      for (std::size_t j = 0; j < len; ++j) acc[j] = detail::combine(op, acc[j], all[r * len + j]);
    for (auto& x : acc) x = detail::finish(op, x, num_replicas_in_sync());
    return acc;
  }

  // Every replica's value of every worker, in replica order; the same on every worker.
  template <detail::arithmetic T, std::size_t E>
  std::vector<T> gather(const per_replica<T, E>& values, int axis = 0) const {
    return gather_elements(local_elements(values, axis));
  }
  template <detail::arithmetic_sequence S, std::size_t E>
  auto gather(const per_replica<S, E>& values, int axis = 0) const {
    return gather_elements(local_elements(values, axis));
  }

  // One copy of `factory(device)` per local replica, then replica 0's copy sent to every replica of
  // the job: identical copies even if the factory is not deterministic.
  template <class F>
  auto mirror(F&& factory) {
    static_assert(std::invocable<F&, cuda&>, "distribute: mirror(factory) calls factory(device&) once per replica");
    using T = std::decay_t<std::invoke_result_t<F&, cuda&>>;
    auto copies = make<mirrored<T>>([&](std::size_t r) { return std::invoke(factory, st_->devices[r]); });
    broadcast(copies, 0);
    return copies;
  }

  // Makes every copy on every worker equal to replica `from`'s (a replica id of the job). CUDA
  // tensors (of one shape everywhere) go over NCCL; trivially copyable values and contiguous
  // sequences of them over MPI.
  template <class T, std::size_t E>
  void broadcast(mirrored<T, E>& value, int from = 0) const {
    check_broadcast(value.size(), from);
    if constexpr (detail::is_cuda_tensor_v<T>) {
      // A step of its own: every replica joins the NCCL broadcast. The strategy's state is shared, so
      // this is a const operation on the strategy as the concept has it.
      const_cast<multi_worker_mirrored_strategy&>(*this).run([from](auto& r, T& t) { r.broadcast(t.values(), from); }, value);
    } else {
      static_assert(std::is_trivially_copyable_v<T> || detail::contiguous_state<T>,
                    "distribute: broadcast between GPU workers supports CUDA tensors, trivially copyable values and "
                    "contiguous sequences of trivially copyable elements");
      check_usable("broadcast");
      const int owner = worker_of(from);
      if (owner == worker_index() && from != first_replica_id())
        value[0] = value[static_cast<std::size_t>(from - first_replica_id())];
      if (num_workers() > 1) {
        if constexpr (std::is_trivially_copyable_v<T>) {
          detail::mpi_check(MPI_Bcast(&value[0], static_cast<int>(sizeof(T)), MPI_BYTE, owner, st_->mpi), "MPI_Bcast");
        } else {
          using V = std::ranges::range_value_t<T>;
          long long n = static_cast<long long>(std::ranges::size(value[0]));
          detail::mpi_check(MPI_Bcast(&n, 1, MPI_LONG_LONG, owner, st_->mpi), "MPI_Bcast");
          if constexpr (requires { value[0].resize(std::size_t{}); }) value[0].resize(static_cast<std::size_t>(n));
          if (static_cast<long long>(std::ranges::size(value[0])) != n)
            throw std::invalid_argument("distribute: broadcast of a fixed-size sequence of a different size");
          detail::mpi_check(MPI_Bcast(std::ranges::data(value[0]), static_cast<int>(n * static_cast<long long>(sizeof(V))),
                                      MPI_BYTE, owner, st_->mpi),
                            "MPI_Bcast");
        }
      }
      for (std::size_t r = 1; r < value.size(); ++r) value[r] = value[0];
    }
  }

  template <class T, std::size_t E>
  void verify_mirrored(const mirrored<T, E>& value) const {
    static_assert(detail::digestible<T>,
                  "distribute: verify_mirrored needs T to be trivially copyable, a contiguous range of trivially "
                  "copyable elements, or to have a member `std::uint64_t state_digest() const`");
    check_count(value.size(), "verify_mirrored");
    std::vector<std::uint64_t> mine;
    for (const auto& v : value) mine.push_back(detail::digest_of(v));
    check_digests(gather_elements(mine));
  }

  // Re-batches a dataset of GLOBAL batches into this worker's per-replica batches, with the worker
  // index and count filled in for sharding: see <distribute/data/distribute.hpp>.
  template <class Ds, class Options = data::distribute_options>
  auto distribute(const Ds& dataset, Options options) const {
    static_assert(requires { sizeof(data::distributor<Ds, extent>); },
                  "distribute: strategy.distribute(dataset) needs #include <distribute/data.hpp>");
    fill_worker(options, "distribute");
    return data::distributor<Ds, extent>::distribute(dataset, static_cast<std::size_t>(num_local_replicas()), options);
  }
  template <class Ds, class Options = data::distribute_options>
  auto distribute(const Ds& dataset) const {
    static_assert(requires { sizeof(Options); }, "distribute: strategy.distribute(dataset) needs #include <distribute/data.hpp>");
    return distribute(dataset, Options{});
  }

 private:
  struct state {
    explicit state(multi_worker_cuda_options o)
        : options{std::move(o)}, pool(static_cast<int>(options.devices.empty() ? 1 : options.devices.size())) {}
    ~state() {
      notice.close();
      if (mpi != MPI_COMM_NULL) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&mpi);
      }
    }
    multi_worker_cuda_options options;
    MPI_Comm mpi = MPI_COMM_NULL;
    detail::worker_failure_notice notice;  // before `group`, whose watch uses it
    int worker = 0, workers = 1;
    std::vector<int> first_of;  // first replica id of each worker, and the total at the end
    std::vector<detail::owned_stream> streams;
    std::vector<cuda> devices;
    std::unique_ptr<comm::nccl_group> group;
    std::vector<replica_type> replicas;
    std::atomic<bool> in_step{false};
    std::int64_t steps = 0;  // `run` calls started: collectives name their step (collective_origin.hpp)
    std::string failure;
    detail::replica_pool pool;  // last: its threads stop before the rest is destroyed
  };

  multi_worker_mirrored_strategy(int* argc, char*** argv, multi_worker_cuda_options options) {
    detail::ensure_mpi(argc, argv);
    std::vector<int> ordinals = options.devices;
    MPI_Comm world = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
    // An unusable driver is this worker's problem to report, like a missing GPU.
    int visible = 0;
    std::string problem;
    try {
      visible = cuda_device_count();
    } catch (const std::exception& e) {
      problem = std::string("cannot use its GPUs (") + e.what() + ")";
    }
    // Every worker reaches every MPI call below: a worker that cannot start says why, and the others
    // learn of it from the vote instead of waiting in a collective it will never join.
    MPI_Comm node = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int local_rank = 0;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    if (problem.empty() && visible == 0) problem = "found no CUDA device on this worker";
    if (problem.empty() && ordinals.empty()) ordinals.push_back(local_rank % visible);
    for (std::size_t i = 0; i < ordinals.size() && problem.empty(); ++i) {
      const int d = ordinals[i];
      if (d < 0 || d >= visible)
        problem = "was given cuda:" + std::to_string(d) + ", but " + std::to_string(visible) + " CUDA device(s) are visible";
      else if (std::find(ordinals.begin(), ordinals.begin() + static_cast<std::ptrdiff_t>(i), d) != ordinals.begin() + static_cast<std::ptrdiff_t>(i))
        problem = "was given cuda:" + std::to_string(d) + " twice (NCCL takes one rank per GPU)";
    }
    int mine_ok = problem.empty() ? 1 : 0, all_ok = 0;
    detail::mpi_check(MPI_Allreduce(&mine_ok, &all_ok, 1, MPI_INT, MPI_MIN, world), "MPI_Allreduce");
    if (!all_ok) {
      int me = 0;
      MPI_Comm_rank(world, &me);
      MPI_Comm_free(&world);
      if (!problem.empty())
        throw std::invalid_argument("distribute: multi_worker_mirrored_strategy<cuda, nccl> on worker " + std::to_string(me) +
                                    " " + problem);
      throw std::runtime_error("distribute: multi_worker_mirrored_strategy<cuda, nccl>: another worker could not start "
                               "(it reports why)");
    }
    options.devices = ordinals;
    st_ = std::make_unique<state>(std::move(options));
    state& st = *st_;
    st.mpi = world;
    detail::mpi_check(MPI_Comm_rank(world, &st.worker), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(world, &st.workers), "MPI_Comm_size");
    // Replica numbering across the job, then the NCCL id from worker 0.
    const int local = static_cast<int>(ordinals.size());
    std::vector<int> counts(static_cast<std::size_t>(st.workers));
    detail::mpi_check(MPI_Allgather(&local, 1, MPI_INT, counts.data(), 1, MPI_INT, world), "MPI_Allgather");
    st.first_of.assign(1, 0);
    for (int c : counts) st.first_of.push_back(st.first_of.back() + c);
    ncclUniqueId id{};
    if (st.worker == 0) id = comm::nccl_group::new_unique_id();
    detail::mpi_check(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, world), "MPI_Bcast (NCCL unique id)");
    for (int d : ordinals) st.streams.emplace_back(d);
    for (std::size_t r = 0; r < ordinals.size(); ++r) st.devices.push_back(cuda{ordinals[r]}.on(st.streams[r].get()));
    st.group = std::make_unique<comm::nccl_group>(st.devices, id, st.first_of[static_cast<std::size_t>(st.worker)],
                                                  st.first_of.back(), st.options.collectives);
    if (st.workers > 1) {
      st.notice.open(world);
      st.notice.set_caller(std::this_thread::get_id());
      st.group->set_outside_watch([&notice = st.notice] { return notice.poll(); });
    }
    for (int r = 0; r < local; ++r)
      st.replicas.emplace_back(st.devices[static_cast<std::size_t>(r)], st.group->endpoint(r), r, st.worker);
  }

  // Sharding by worker needs the same number of replicas on every worker.
  template <class Options>
  void fill_worker(Options& options, const char* op) const {
    if (num_workers() == 1) return;
    const auto& first = st_->first_of;
    for (int w = 1; w < num_workers(); ++w)
      if (first[static_cast<std::size_t>(w) + 1] - first[static_cast<std::size_t>(w)] != first[1])
        throw std::invalid_argument(std::string("distribute: ") + op +
                                    " shards a global batch evenly over workers with the same number of GPUs; worker " +
                                    std::to_string(w) + " differs from worker 0 (use scatter for uneven workers)");
    options.num_workers = static_cast<std::size_t>(num_workers());
    options.worker_index = static_cast<std::size_t>(worker_index());
  }

  int worker_of(int replica) const {
    int w = 0;
    while (st_->first_of[static_cast<std::size_t>(w) + 1] <= replica) ++w;
    return w;
  }

  template <class T>
  std::vector<T> gather_elements(const std::vector<T>& mine) const {
    check_usable("gather");
    std::vector<std::size_t> offsets;
    const auto bytes = detail::all_gather_bytes(st_->mpi, mine.data(), mine.size() * sizeof(T), offsets);
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

  // A failed step leaves the job's NCCL communicator unusable: abort it here, so that the other
  // workers' collectives fail now instead of at their deadline, and refuse further work.
  void leave_job(const std::exception_ptr& failure) {
    state& st = *st_;
    // One worker: the failures the meeting caught left the communicators intact, and NCCL's own
    // failures mark them broken (collectives then say so); nothing else waits on this process.
    if (num_workers() == 1 || !st.failure.empty()) return;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      st.failure = e.what();
    } catch (...) {
      st.failure = "an exception not derived from std::exception";
    }
    // Unless this failure is another worker's, tell the others before their NCCL waits run out.
    if (!st.notice.received()) st.notice.announce(st.worker, st.failure);
    st.group->abort_all_for_failure();
  }

  void check_usable(const char* op) const {
    if (!st_->failure.empty())
      throw collective_aborted(std::string("distribute: ") + op + " on worker " + std::to_string(worker_index()) +
                               " cannot run: a step failed and the job's NCCL communicator is gone (" + st_->failure +
                               "); restart the job from a checkpoint");
  }

  std::unique_ptr<state> st_;
};

static_assert(strategy<multi_worker_mirrored_strategy<cuda, comm::nccl>>);

}  // namespace distribute
