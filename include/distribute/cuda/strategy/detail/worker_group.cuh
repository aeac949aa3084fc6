#pragma once
// The worker group of multi_worker_mirrored_strategy<cuda, comm::nccl> (strategy/detail/worker_group.hpp
// says what a worker group is): each worker drives one or more GPUs with a replica thread per GPU,
// all joined by one NCCL communicator that spans the job. NCCL is itself hierarchical (NVLink/NVLS
// inside a node, the network between nodes), so one communicator across all GPUs is the GPU form of
// the CPU group's in-process stage + cross-process stage. MPI bootstraps it (worker 0 makes the NCCL
// unique id and broadcasts it) and carries what the strategy moves between workers on the host.
//
// Failure: NCCL does not tell a rank that another process gave up (aborting a communicator is
// local), so a worker whose step fails tells every other worker over MPI (an out-of-band notice) and
// aborts its communicators. A worker waiting in an NCCL collective looks for that notice and gives up
// at once with collective_aborted naming the failed worker and its error; one that was not waiting
// refuses its next step the same way. A worker that dies without a word leaves the others to their
// deadline (collective_timeout), never a hang. With several workers, a failed step leaves the
// communicator unusable for the whole job: the strategy then refuses further work, and the job
// restarts from a checkpoint.

#include <distribute/collective_options.hpp>
#include <distribute/comm/job_layout.hpp>
#include <distribute/comm/mpi.hpp>
#include <distribute/comm/mpi_runtime.hpp>
#include <distribute/config.hpp>
#include <distribute/cuda/comm/nccl.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/strategy/detail/device_policy.cuh>
#include <distribute/cuda/strategy/detail/replica_hooks.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/detail/hardware.hpp>
#include <distribute/errors.hpp>
#include <distribute/strategy/detail/worker_group.hpp>

#if !DISTRIBUTE_HAS_MPI
#  error "multi_worker_mirrored_strategy<cuda, nccl> needs MPI to bootstrap NCCL (link distribute::mpi)"
#endif

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace distribute {

struct multi_worker_cuda_options {
  // This worker's GPUs, by ordinal. Empty: one GPU, the node-local rank modulo the visible GPUs.
  std::vector<int> devices{};
  // How long a replica waits in a collective (and the job in NCCL's set-up and in the strategy's
  // host exchanges between workers) before it gives up.
  collective_options collectives{};
};

namespace detail {

inline void mpi_checked(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw collective_error(std::string("distribute: ") + call + " failed: " + comm::mpi_error_string(rc));
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
    mpi_checked(MPI_Comm_dup(world, &comm_), "MPI_Comm_dup");
    mpi_checked(MPI_Comm_size(comm_, &workers_), "MPI_Comm_size");
    mpi_checked(MPI_Irecv(&in_, static_cast<int>(sizeof in_), MPI_BYTE, MPI_ANY_SOURCE, 0, comm_, &recv_), "MPI_Irecv");
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
      if (MPI_Isend(out_.get(), static_cast<int>(sizeof *out_), MPI_BYTE, w, 0, comm_, &r) == MPI_SUCCESS)
        sends_.push_back(r);
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

template <>
class worker_group<cuda, comm::nccl> {
 public:
  using options_type = multi_worker_cuda_options;
  using communicator = comm::nccl;
  static constexpr const char* strategy_name = "multi_worker_mirrored_strategy<cuda, nccl>";
  // GPU tensors (of one shape everywhere) are broadcast by the replicas over NCCL.
  template <class T>
  static constexpr bool broadcasts_in_step = is_cuda_tensor_v<T>;

  worker_group(multi_worker_cuda_options options, int* argc, char*** argv)
      : options_{std::move(options)}, cross_{start(options_.collectives, argc, argv)} {
    const std::vector<int> ordinals = agree_on_devices();
    const int local = static_cast<int>(ordinals.size());
    options_.devices = ordinals;
    layout_ = comm::job_layout::gather(cross_, local);
    // The NCCL id from worker 0.
    ncclUniqueId id{};
    if (worker_index() == 0) id = comm::nccl_group::new_unique_id();
    {
      const collective_label label("strategy construction (NCCL unique id)");
      cross_.broadcast(std::span<unsigned char>(reinterpret_cast<unsigned char*>(&id), sizeof id), 0);
    }
    for (int d : ordinals) streams_.emplace_back(d);
    for (std::size_t r = 0; r < ordinals.size(); ++r) devices_.push_back(cuda{ordinals[r]}.on(streams_[r].get()));
    // NCCL reads and writes peer GPUs' buffers directly within a process; the library's tensors come
    // from its memory pools, which peer access alone does not open (as in mirrored_strategy<cuda>).
    for (const auto& a : devices_)
      for (const auto& b : devices_) (void)share_pool(a.index(), b.index());
    nccl_ = std::make_unique<comm::nccl_group>(devices_, id, first_replica(worker_index()), total_replicas(),
                                               options_.collectives);
    if (num_workers() > 1) {
      notice_.open(MPI_COMM_WORLD);
      notice_.set_caller(std::this_thread::get_id());
      nccl_->set_outside_watch([&notice = notice_] { return notice.poll(); });
    }
  }
  worker_group(const worker_group&) = delete;
  worker_group& operator=(const worker_group&) = delete;
  ~worker_group() { notice_.close(); }

  std::vector<cuda>& devices() noexcept { return devices_; }
  const std::vector<cuda>& devices() const noexcept { return devices_; }
  const multi_worker_cuda_options& options() const noexcept { return options_; }

  int worker_index() const noexcept { return cross_.rank(); }
  int num_workers() const noexcept { return layout_.num_workers(); }
  int local_replicas() const noexcept { return static_cast<int>(devices_.size()); }
  int total_replicas() const noexcept { return layout_.total_replicas(); }
  int first_replica(int w) const noexcept { return layout_.first_replica(w); }
  int replicas_of(int w) const noexcept { return layout_.replicas_of(w); }
  int worker_of(int replica) const noexcept { return layout_.worker_of(replica); }
  const comm::job_layout& layout() const noexcept { return layout_; }

  communicator endpoint(int local_rank) { return nccl_->endpoint(local_rank); }
  comm::mpi& cross() noexcept { return cross_; }
  const comm::mpi& cross() const noexcept { return cross_; }

  // Where the replicas meet: NCCL's host-side meeting (a type internal to the communicators).
  auto& meeting() { return nccl_->meeting(); }
  void prepare_step() {
    // One worker: NCCL's own failures mark the communicators broken; they are rebuilt here. (With
    // several, a failure ends the job's use of them.)
    if (num_workers() == 1 && nccl_->broken()) nccl_->rebuild();
    meeting().reset();
  }
  template <class F>
  auto hooks(F failed) {
    return cuda_replica_hooks{devices_, meeting().options().timeout,
                              [this](int rank) noexcept { nccl_->abort_replica(rank); }, std::move(failed)};
  }

  // Another worker's failure, announced while this one was not waiting for it: this worker's
  // communicators are aborted (the job's NCCL communicator is gone) and the reason returned.
  std::optional<std::string> partner_failure() {
    notice_.set_caller(std::this_thread::get_id());
    auto why = notice_.poll();
    if (why) nccl_->abort_all_for_failure();
    return why;
  }
  // Tells the other workers (unless the failure is another worker's) before their NCCL waits run out,
  // and aborts this worker's communicators.
  void leave(const std::string&, const std::string& cause) {
    if (!notice_.received()) notice_.announce(worker_index(), cause);
    nccl_->abort_all_for_failure();
  }

  std::pair<int, int> core_shares() const {
    const int mine = static_cast<int>(std::max(1u, usable_hardware_threads()));
    return {std::max(1, mine / std::max(1, local_replicas())), mine};
  }

 private:
  static comm::mpi start(const collective_options& collectives, int* argc, char*** argv) {
    if (argc) comm::mpi_runtime::instance(argc, argv);
    comm::mpi_options o;
    o.collectives = collectives;
    o.shared_memory = false;  // the host exchanges are small; the GPUs carry the data
    return comm::mpi(o);
  }

  // This worker's GPU ordinals. Every worker reaches every collective here: a worker that cannot
  // start says why, and the others learn of it from the vote instead of waiting in a collective it
  // will never join.
  std::vector<int> agree_on_devices() {
    std::vector<int> ordinals = options_.devices;
    int visible = 0;
    std::string problem;
    try {
      visible = cuda_device_count();  // an unusable driver is this worker's problem to report
    } catch (const std::exception& e) {
      problem = std::string("cannot use its GPUs (") + e.what() + ")";
    }
    MPI_Comm node = MPI_COMM_NULL;
    mpi_checked(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                "MPI_Comm_split_type");
    int local_rank = 0;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    if (problem.empty() && visible == 0) problem = "found no CUDA device on this worker";
    if (problem.empty() && ordinals.empty()) ordinals.push_back(local_rank % visible);
    for (std::size_t i = 0; i < ordinals.size() && problem.empty(); ++i) {
      const int d = ordinals[i];
      const auto before = ordinals.begin() + static_cast<std::ptrdiff_t>(i);
      if (d < 0 || d >= visible)
        problem =
            "was given cuda:" + std::to_string(d) + ", but " + std::to_string(visible) + " CUDA device(s) are visible";
      else if (std::find(ordinals.begin(), before, d) != before)
        problem = "was given cuda:" + std::to_string(d) + " twice (NCCL takes one rank per GPU)";
    }
    int ok = problem.empty() ? 1 : 0;
    {
      const collective_label label("strategy construction (every worker's GPUs usable)");
      cross_.all_reduce(reduce_op::min, std::span<int>(&ok, 1));
    }
    if (!problem.empty())
      throw std::invalid_argument(std::string("distribute: ") + strategy_name + " on worker " +
                                  std::to_string(worker_index()) + " " + problem);
    if (!ok)
      throw std::runtime_error(std::string("distribute: ") + strategy_name +
                               ": another worker could not start (it reports why)");
    return ordinals;
  }

  multi_worker_cuda_options options_;
  comm::mpi cross_;
  comm::job_layout layout_;
  worker_failure_notice notice_;  // before the NCCL group, whose watch uses it
  std::vector<owned_stream> streams_;
  std::vector<cuda> devices_;
  std::unique_ptr<comm::nccl_group> nccl_;
};

}  // namespace detail
}  // namespace distribute
