#pragma once
// The MPI library's lifetime in this process, and what happens when a worker fails.
//
// MPI is initialised on first use (or by the user before that; then the user finalises it too) and
// finalised when the program exits. A worker whose collective timed out or whose step failed cannot
// take part in the job any more: the others are, or will be, waiting for it, and a request it has
// posted may still write into a buffer. So a failure is reported by an exception (the program may
// log or write something), and the job is then aborted: at once when the process exits, or after a
// grace period if it does not, by MPI_Abort, which ends every process of the job and cannot wait
// for the dead.
//
// What a failed worker prints: one line on stderr, the failure it saw, when it leaves the job (a
// program need not print the exception again). An exception that no one catches ends the job through
// MPI_Abort, after one line naming it (or none, when it is the failure already printed), instead of
// std::abort, whose signal makes the MPI library print a backtrace of every thread.

// Only the C API is used: skip the deprecated C++ bindings (and their warnings).
#ifndef OMPI_SKIP_MPICXX
#  define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#  define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace distribute::comm {

// The text of an MPI error code.
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

class mpi_runtime {
 public:
  // The process's runtime; initialises MPI the first time (with argc/argv when given) unless the
  // program already did.
  static mpi_runtime& instance(int* argc = nullptr, char*** argv = nullptr) {
    static mpi_runtime runtime(argc, argv);
    return runtime;
  }

  mpi_runtime(const mpi_runtime&) = delete;
  mpi_runtime& operator=(const mpi_runtime&) = delete;

  ~mpi_runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Finalising would wait for the peers of a broken job (or hang on requests that never complete).
    if (failed_.load()) abort_now();
    if (owned_) MPI_Finalize();
  }

  int thread_level() const noexcept { return thread_level_; }
  bool failed() const noexcept { return failed_.load(); }

  // Records that this worker can no longer take part in the job, prints why (once), and aborts the
  // job after `grace` unless the process exits first (then at exit). Returns at once.
  void fail(const std::string& message, std::chrono::milliseconds grace) {
    std::call_once(fail_once_, [&] {
      message_ = message;
      failed_.store(true);
      std::fprintf(stderr, "%s [the MPI job is aborted when this process exits, or in %lld ms]\n", message.c_str(),
                   static_cast<long long>(grace.count()));
      std::fflush(stderr);
      std::thread([grace] {
        std::this_thread::sleep_for(grace);
        abort_now();
      }).detach();
    });
  }

  std::string failure_message() const { return failed_.load() ? message_ : std::string{}; }

  [[noreturn]] static void abort_now() {
    std::fflush(stdout);
    std::fflush(stderr);
    // MPI_Abort asks the launcher to end every process. Should it block (a launcher that is itself
    // gone) or return, this process still ends.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(EXIT_FAILURE);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
    std::_Exit(EXIT_FAILURE);
  }

 private:
  mpi_runtime(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&thread_level_);
      return;
    }
    // One thread per process calls MPI at a time (the caller of the strategy, for the whole worker).
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &thread_level_);
    if (rc != MPI_SUCCESS) throw std::runtime_error("distribute: MPI_Init_thread failed: " + mpi_error_string(rc));
    owned_ = true;
    previous_terminate() = std::set_terminate(&on_terminate);
  }

  static std::terminate_handler& previous_terminate() {
    static std::terminate_handler handler = nullptr;
    return handler;
  }

  // An exception nobody caught: one line (unless it is the failure this worker already printed when
  // it left the job), then the job ends through MPI_Abort rather than a signal.
  [[noreturn]] static void on_terminate() {
    if (const std::exception_ptr e = std::current_exception()) {
      mpi_runtime& self = instance();
      std::string what = "an exception not derived from std::exception";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {}
      const std::string printed = self.failure_message();
      const std::string cause = what.starts_with("distribute: ") ? what.substr(12) : what;
      if (printed.empty() || printed.find(cause) == std::string::npos)
        std::fprintf(stderr, "distribute: uncaught exception: %s\n", what.c_str());
      abort_now();
    }
    if (auto previous = previous_terminate()) previous();
    std::abort();
  }

  bool owned_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::atomic<bool> failed_{false};
  std::once_flag fail_once_;
  std::string message_;
};

}  // namespace distribute::comm
