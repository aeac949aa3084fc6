#pragma once
// Preemption without lost work: a termination signal on any worker becomes one agreed checkpoint
// and a clean stop, and the restarted job continues from it bit for bit (after TensorFlow's
// tf.distribute.experimental.PreemptionCheckpointHandler).
//
//   dist::preemption_checkpoint handler{strategy, "runs/ckpt",
//       [&](dist::checkpoint::archive& a) { a.put_model("net", nets[0]); a.put_state("opt", opts[0]); },
//       [&](const dist::checkpoint::archive& a) { a.get_model("net", nets[0]); a.get_state("opt", opts[0]);
//                                                 strategy.broadcast(nets, 0); strategy.broadcast(opts, 0); }};
//   for (std::int64_t step = handler.first_step(); step < steps; ++step) {
//     train_step(strategy, nets, opts, step);        // the data of a step is a function of the step
//     if (handler.after_step(step)) break;           // a signal on any worker: all stop here, saved
//   }
//   return handler.exit_code();                      // 0, or what preemption_options::exit_code says
//
// Signals. While a handler lives, SIGTERM, SIGINT and SIGUSR1 (preemption_options::signals) only
// set a flag: a lock-free atomic store, which is all a signal handler may do. The flag is the
// process's, so a signal that lands on any thread (a replica's, one of the engine's OpenMP threads,
// the main thread in a collective or in a checkpoint write) is seen the same way, at the next
// step boundary. A second signal while the checkpoint is written sets the flag again and nothing
// else: the write finishes. A SIGKILL then (Slurm's KillWait expiring) leaves the previous
// checkpoint or the new one, never half of one (checkpoint::save writes a temporary and renames it).
// The previous handlers come back when the handler is destroyed.
//
// Agreement. after_step(step) asks whether any worker saw a signal: one process reads its own flag
// (one_device_strategy and mirrored_strategy: no communication); workers in several processes add
// one all-reduce of one integer across the workers (multi_worker_mirrored_strategy). Every worker
// gets the same answer after the same step, so all stop together, and the chief writes one
// checkpoint of that step; the others learn whether it was written (one more all-reduce, only then).
// A signal to one worker stops them all: under mpirun, send it to the workers (Open MPI's mpirun
// forwards SIGUSR1 and SIGUSR2 to them, while SIGTERM or SIGINT to mpirun itself ends the job);
// under Slurm, `srun --signal=USR1@120` or `sbatch --signal=B:USR1@120` (docs/multi_worker.md).
//
// Restore. The constructor loads the directory's latest checkpoint that loads (checkpoint::directory:
// the chief reads it and, across processes, sends its bytes to every worker, whose disks may not
// hold it) and calls `restore` with it on every worker; first_step() is then one past its step.
// A directory without checkpoints starts at step 0; one whose every checkpoint fails to load is an
// error (checkpoint::no_loadable_checkpoint), not a fresh start.

#include <distribute/checkpoint.hpp>
#include <distribute/reduce_op.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute {

struct preemption_options {
  // The signals that ask for a checkpoint and a stop.
  std::vector<int> signals{SIGTERM, SIGINT, SIGUSR1};
  // What exit_code() returns after a preemption: 0, or a code the job script acts on (requeue).
  int exit_code = 0;
  // Also a checkpoint after every `save_every`-th step (0: only on a signal and through save()).
  std::int64_t save_every = 0;
  // Checkpoints kept in the directory (checkpoint::directory).
  int keep = 3;
};

namespace detail {

// The last preemption signal this process received; 0 when none. Written by the signal handler.
inline std::atomic<int> preemption_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only store to a lock-free atomic");

extern "C" inline void distribute_on_preemption_signal(int sig) {
  preemption_signal.store(sig, std::memory_order_relaxed);
}

// While it lives, `signals` set preemption_signal; the actions they had before come back after.
class preemption_signals {
 public:
  explicit preemption_signals(const std::vector<int>& signals) {
    struct sigaction on{};
    on.sa_handler = distribute_on_preemption_signal;
    sigemptyset(&on.sa_mask);
    on.sa_flags = SA_RESTART;  // a write or a wait the signal interrupts goes on
    for (const int s : signals) {
      struct sigaction before{};
      if (::sigaction(s, &on, &before) != 0) {
        restore();
        throw std::invalid_argument("distribute: preemption_checkpoint cannot watch signal " + std::to_string(s) +
                                    ": " + std::strerror(errno));
      }
      saved_.emplace_back(s, before);
    }
  }
  ~preemption_signals() { restore(); }
  preemption_signals(const preemption_signals&) = delete;
  preemption_signals& operator=(const preemption_signals&) = delete;

 private:
  void restore() noexcept {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) ::sigaction(it->first, &it->second, nullptr);
    saved_.clear();
  }
  std::vector<std::pair<int, struct sigaction>> saved_;
};

}  // namespace detail

// The name of a signal for messages: "SIGTERM", or "signal 40".
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(sig);
  }
}

// The signals and the agreement without the checkpoint: for a training loop that writes its own
// checkpoints (the examples' trainers). While it lives, the signals only set the flag (above).
template <class S>
class preemption_watch {
 public:
  explicit preemption_watch(S& strategy, const std::vector<int>& signals = preemption_options{}.signals)
      : s_{strategy} {
    detail::preemption_signal.store(0, std::memory_order_relaxed);
    signals_.emplace(signals);
  }
  preemption_watch(const preemption_watch&) = delete;
  preemption_watch& operator=(const preemption_watch&) = delete;

  // Whether a watched signal reached any worker. Every worker calls it at the same point (after the
  // same step) and gets the same answer: one process reads its flag, several add one all-reduce of
  // one integer across the workers.
  bool stop_requested() {
    seen_ = detail::preemption_signal.load(std::memory_order_relaxed);
    return agreed(seen_ != 0);
  }
  // The signal this process saw at the last stop_requested (0: none, or another worker's only).
  int signal() const noexcept { return seen_; }
  // Whether `mine` holds on any worker (the maximum over the workers).
  bool agreed(bool mine) {
    if (s_.num_workers() <= 1) return mine;
    const std::int64_t v = mine ? 1 : 0;
    return s_.reduce(reduce_op::max, s_.values_from_function([v](int) { return v; })) != 0;
  }

 private:
  S& s_;
  std::optional<detail::preemption_signals> signals_;
  int seen_ = 0;
};

template <class S>
class preemption_checkpoint {
 public:
  using save_function = std::function<void(checkpoint::archive&)>;
  using restore_function = std::function<void(const checkpoint::archive&)>;

  // `save(archive)` puts what a restart needs (models, optimisers, random engines, data position)
  // into the archive; `restore(archive)` reads it back on every worker. The step is kept apart.
  preemption_checkpoint(S& strategy, std::filesystem::path dir, save_function save, restore_function restore,
                        preemption_options options = {})
      : s_{strategy}, dir_{std::move(dir), options.keep}, save_{std::move(save)}, options_{std::move(options)} {
    if (!save_ || !restore)
      throw std::invalid_argument("distribute: preemption_checkpoint needs a save and a restore function");
    if (options_.save_every < 0)
      throw std::invalid_argument("distribute: preemption_options::save_every must not be negative");
    watch_.emplace(s_, options_.signals);
    if (s_.is_chief()) dir_.remove_stale_temporaries();
    restore_latest(restore);
  }
  preemption_checkpoint(const preemption_checkpoint&) = delete;
  preemption_checkpoint& operator=(const preemption_checkpoint&) = delete;

  // The first step to run: 0, or one past the restored checkpoint's.
  std::int64_t first_step() const noexcept { return first_step_; }
  bool resumed() const noexcept { return first_step_ > 0; }
  // The checkpoint restored, where there was one.
  const std::optional<std::filesystem::path>& restored_from() const noexcept { return restored_from_; }

  // After step `step` has completed on every replica: true when the training loop must stop, because
  // a watched signal reached some worker (every worker gets true after the same step); the
  // checkpoint of `step` is then written. Also writes the periodic checkpoints (save_every).
  bool after_step(std::int64_t step) {
    const bool stop = watch_->stop_requested();
    const int seen = watch_->signal();
    const bool periodic = options_.save_every > 0 && (step + 1) % options_.save_every == 0;
    if (!stop) {
      if (periodic) save(step);
      return false;
    }
    if (!preempted_) {
      preempted_ = true;
      signal_ = seen;
      stopped_at_ = step;
      save(step);
    }
    return true;
  }

  // Writes the checkpoint of `step` (the chief; every worker calls it), as at a preemption: at the
  // end of training, say. Throws on every worker where the chief could not write it.
  void save(std::int64_t step) {
    std::string failure;
    if (s_.is_chief()) {
      try {
        checkpoint::archive a;
        save_(a);
        a.put("preemption/step", step);
        last_saved_ = dir_.save(step, a);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    // Every worker learns whether it was written (one more all-reduce across processes).
    if (!agreed(!failure.empty())) return;
    throw checkpoint::checkpoint_error("distribute: the checkpoint of step " + std::to_string(step) + " in " +
                                       dir_.path().string() + " was not written" +
                                       (failure.empty() ? " (see the chief's error)" : ": " + failure));
  }

  // Whether the loop stopped for a signal, which (0 where it reached another worker only), and after
  // which step.
  bool preempted() const noexcept { return preempted_; }
  int signal() const noexcept { return signal_; }
  std::int64_t stopped_at() const noexcept { return stopped_at_; }
  // The checkpoint this process wrote last (the chief's), for messages.
  const std::optional<std::filesystem::path>& last_saved() const noexcept { return last_saved_; }
  // What the program should exit with: preemption_options::exit_code after a preemption, else 0.
  int exit_code() const noexcept { return preempted_ ? options_.exit_code : 0; }
  // "SIGTERM after step 412: checkpoint runs/ckpt/ckpt-0000000412.dck", for the program's last line.
  std::string describe() const {
    if (!preempted_) return "not preempted";
    return (signal_ ? signal_name(signal_) : std::string("a signal to another worker")) + " after step " +
           std::to_string(stopped_at_) + ": checkpoint " +
           (last_saved_ ? last_saved_->string() : dir_.path().string() + " (written by the chief)");
  }

 private:
  bool agreed(bool mine) { return watch_->agreed(mine); }

  void restore_latest(const restore_function& restore) {
    std::vector<std::uint8_t> bytes;
    std::string failure;
    if (s_.is_chief()) {
      try {
        if (auto found = dir_.load_latest_with_path()) {
          restored_from_ = found->first;
          const auto raw = checkpoint::serialize(found->second);
          bytes.resize(raw.size());
          std::memcpy(bytes.data(), raw.data(), raw.size());
        }
      } catch (const std::exception& e) {
        if (s_.num_workers() <= 1) throw;
        failure = e.what();
      }
    }
    if (s_.num_workers() > 1) {
      if (agreed(!failure.empty())) {
        if (!failure.empty()) throw checkpoint::checkpoint_error(failure);
        throw checkpoint::checkpoint_error("distribute: the chief could not read the checkpoints in " +
                                           dir_.path().string() + " (see its error)");
      }
      broadcast_bytes(bytes);
    }
    if (bytes.empty()) return;
    const auto a =
        checkpoint::parse(std::as_bytes(std::span<const std::uint8_t>(bytes)),
                          restored_from_ ? restored_from_->string() : dir_.path().string() + " (the chief's)");
    const auto step = a.template get<std::int64_t>("preemption/step");
    if (step < 0)
      throw checkpoint::checkpoint_error("distribute: the checkpoint in " + dir_.path().string() +
                                         " has a negative step");
    restore(a);
    first_step_ = step + 1;
  }

  // The chief's `bytes` to every worker (their size first).
  void broadcast_bytes(std::vector<std::uint8_t>& bytes) {
    if constexpr (requires { s_.communicator(); }) {
      std::uint64_t size = bytes.size();
      s_.communicator().broadcast(std::span<std::uint64_t>(&size, 1), 0);
      bytes.resize(static_cast<std::size_t>(size));
      if (size > 0) s_.communicator().broadcast(std::span<std::uint8_t>(bytes), 0);
    } else {
      throw std::logic_error(
          "distribute: preemption_checkpoint: a strategy of several workers needs communicator() to send "
          "the chief's checkpoint to the others");
    }
  }

  S& s_;
  checkpoint::directory dir_;
  save_function save_;
  preemption_options options_;
  std::optional<preemption_watch<S>> watch_;
  std::int64_t first_step_ = 0;
  std::optional<std::filesystem::path> restored_from_, last_saved_;
  bool preempted_ = false;
  int signal_ = 0;
  std::int64_t stopped_at_ = -1;
};

}  // namespace distribute
