// One worker of a job that the failure tests start under mpiexec (failure_test.cpp):
//   --scenario=train    checkpointed training; the chief saves after every step and, when the
//                       checkpoint directory holds one, the job resumes from the chief's latest.
//                       --kill-at=K: the last worker kills itself (SIGKILL) inside a step before
//                       step K, while the others wait in a collective for it.
//   --scenario=stall    the last worker stops taking part at step 3; the others must time out.
//   --scenario=mismatch worker 1's replicas all-reduce one element more than the others'
//                       (--no-fingerprints: without the fingerprint check).
//   --scenario=throw-outside worker 1's program throws outside any step (its input is missing, say)
//                       while worker 0 waits in a step's all-reduce.
//   --scenario=api-mismatch after a step, worker 1 reports a loss with strategy.reduce while worker 0
//                       runs another step: the same all-reduce of one float32, from different APIs.
//   --scenario=p2p-never-sent worker 1 waits for a message worker 0 never sends (--split: in a
//                       communicator split off the world, in which world workers 2 and 1 are ranks 0
//                       and 1, and world worker 2 waits for world worker 1; three workers).
//   --scenario=p2p-mismatch worker 1 receives 64 float32 where worker 0 sent 80 (--type: 64 int32).
//   --scenario=pipeline-throws  a pipeline of 2 stages on 2 workers (one replica each); stage 0 throws
//                       on the forward of micro-batch 1 while stage 1 waits for its activations.
//   --scenario=pipeline-stall   the same, but stage 0 sleeps 3 s there: stage 1 times out.
// Any scenario: --no-shared-memory makes the workers all-reduce over the ring of messages.
//   --scenario=throw    a replica of worker 1 throws at step 2 (--linger: the process then sleeps;
//                       --overlap: inside a gradient overlap with a bucket in flight).
//   --scenario=single   a program started without a launcher is one worker.
//   --scenario=preempt  the training of `train` under preemption_checkpoint (no periodic checkpoints):
//                       --signal-at=K --signal-worker=W: worker W raises SIGTERM on itself inside
//                       step K while the other workers wait in a collective for it; --pid-dir=D:
//                       every worker writes its pid to D/pid-<worker> and each step takes 50 ms more,
//                       for a signal from outside. Each worker prints "worker w stopped after step k"
//                       or "worker w trained to step N"; the chief writes final.bin at the end.
// Exit codes: 0 done, 3 a collective error reached the program (the job is then aborted), 4 wrong.

#include "mpi_test_support.hpp"
#include <distribute/preemption.hpp>
#include "training.hpp"
#include "../pipeline/pipeline_test_support.hpp"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

namespace dist = distribute;
namespace ckpt = distribute::checkpoint;
using strategy_type = dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi>;

namespace {

using arguments = std::map<std::string, std::string>;

arguments parse(int argc, char** argv) {
  arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (!a.starts_with("--")) continue;
    const auto eq = a.find('=');
    args[std::string(a.substr(2, eq == std::string_view::npos ? std::string_view::npos : eq - 2))] =
        eq == std::string_view::npos ? "" : std::string(a.substr(eq + 1));
  }
  return args;
}

std::int64_t number(const arguments& args, const std::string& key, std::int64_t otherwise) {
  const auto it = args.find(key);
  return it == args.end() ? otherwise : std::stoll(it->second);
}

dist::multi_worker_options options_from(const arguments& args) {
  dist::multi_worker_options o{
      .local_replicas = static_cast<int>(number(args, "replicas", 2)),
      .mpi = dist::test::test_mpi_options(std::chrono::milliseconds(number(args, "timeout-ms", 20000)))};
  if (args.contains("no-fingerprints")) o.mpi.check_fingerprints = false;
  if (args.contains("no-shared-memory")) o.mpi.shared_memory = false;
  return o;
}

// Checkpointed training: resumes from the chief's latest checkpoint, saves after every step, and
// writes the final parameters (chief) to <dir>/final.bin.
int train(strategy_type& s, const arguments& args) {
  const std::filesystem::path dir = args.at("dir");
  const std::int64_t steps = number(args, "steps", 8), kill_at = number(args, "kill-at", -1);
  ckpt::directory checkpoints(dir / "checkpoints", 2);

  auto nets = s.mirror([](auto&) { return dist::test::make_net(1234); });
  auto opts = s.mirror([](auto&) { return dist::optim::adam<float>{{.lr = 1e-2}}; });

  // The chief reads its latest checkpoint and sends the state to every worker (the others may not
  // see the chief's disk).
  std::int64_t first_step = 0;
  if (s.is_chief()) {
    if (auto latest = checkpoints.load_latest()) {
      first_step = latest->get<std::int64_t>("step") + 1;
      latest->get_model("model", nets[0]);
      latest->get_state("optimizer", opts[0]);
    }
  }
  s.communicator().broadcast(std::span<std::int64_t>(&first_step, 1), 0);
  if (first_step > 0) {
    s.broadcast(nets, 0);
    s.broadcast(opts, 0);
    if (s.is_chief()) std::printf("resumed at step %lld\n", static_cast<long long>(first_step));
  }

  for (std::int64_t step = first_step; step < steps; ++step) {
    if (step == kill_at) {
      // Every worker is inside a step, between two collectives, when the last replica dies.
      s.run([&](dist::replica auto& r) {
        r.barrier();
        if (r.replica_id() == s.num_replicas_in_sync() - 1) std::raise(SIGKILL);
        r.barrier();
      });
    }
    dist::test::train_step(s, nets, opts, step);
    if (s.is_chief()) {
      ckpt::archive a;
      a.put("step", step);
      a.put_model("model", nets[0]);
      a.put_state("optimizer", opts[0]);
      checkpoints.save(step, a);
    }
  }
  s.verify_mirrored(nets);
  if (s.is_chief()) {
    const auto p = dist::test::parameters_of(nets[0]);
    std::ofstream out(dir / "final.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
    std::printf("trained to step %lld\n", static_cast<long long>(steps));
  }
  return 0;
}

// Training under preemption_checkpoint (above).
int preempt(strategy_type& s, const arguments& args) {
  const std::filesystem::path dir = args.at("dir");
  const std::int64_t steps = number(args, "steps", 8), signal_at = number(args, "signal-at", -1),
                     signal_worker = number(args, "signal-worker", 1);
  const bool outside = args.contains("pid-dir");
  auto nets = s.mirror([](auto&) { return dist::test::make_net(1234); });
  auto opts = s.mirror([](auto&) { return dist::optim::adam<float>{{.lr = 1e-2}}; });
  dist::preemption_checkpoint handler{s, dir / "checkpoints",
                                      [&](ckpt::archive& a) {
                                        a.put_model("model", nets[0]);
                                        a.put_state("optimizer", opts[0]);
                                      },
                                      [&](const ckpt::archive& a) {
                                        a.get_model("model", nets[0]);
                                        a.get_state("optimizer", opts[0]);
                                        s.broadcast(nets, 0);
                                        s.broadcast(opts, 0);
                                      }};
  if (handler.resumed() && s.is_chief())
    std::printf("resumed at step %lld\n", static_cast<long long>(handler.first_step()));
  if (outside) {
    std::ofstream(std::filesystem::path(args.at("pid-dir")) / ("pid-" + std::to_string(s.worker_index())))
        << ::getpid() << "\n";
  }
  for (std::int64_t step = handler.first_step(); step < steps; ++step) {
    if (step == signal_at)
      s.run([&](dist::replica auto& r) {
        r.barrier();
        if (s.worker_index() == signal_worker && r.replica_id() == s.first_replica_id()) std::raise(SIGTERM);
        r.barrier();
      });
    dist::test::train_step(s, nets, opts, step);
    if (outside) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (handler.after_step(step)) {
      std::printf("worker %d stopped after step %lld (%s)\n", s.worker_index(), static_cast<long long>(step),
                  handler.describe().c_str());
      std::fflush(stdout);
      return handler.exit_code();
    }
  }
  handler.save(steps - 1);
  s.verify_mirrored(nets);
  if (s.is_chief()) {
    const auto p = dist::test::parameters_of(nets[0]);
    std::ofstream out(dir / "final.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
  }
  std::printf("worker %d trained to step %lld\n", s.worker_index(), static_cast<long long>(steps));
  return 0;
}

// Steps of all-reduces; the last worker stops joining at step 3 and waits far beyond the timeout.
int stall(strategy_type& s) {
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && s.worker_index() == s.num_workers() - 1) {
      std::this_thread::sleep_for(std::chrono::minutes(2));
      return 4;
    }
    s.run([](dist::replica auto& r) {
      std::vector<float> g(1000, 1.0f);
      r.all_reduce(dist::reduce_op::sum, g);
    });
  }
  return 4;
}

// Two gradient tensors of 1,000 floats, each a bucket of its own under a 4,000-byte cap.
struct slab {
  using scalar_type = float;
  std::vector<float> v = std::vector<float>(1000), g = std::vector<float>(1000, 1.0f);
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(v), std::span<float>(g));
  }
};
struct two_slabs {
  using scalar_type = float;
  slab first, last;
  template <class F>
  void for_each_parameter(F&& f) {
    first.for_each_parameter(f);
    last.for_each_parameter(f);
  }
};

// Worker 1's replica throws at step 2. It leaves the job: as its process exits (or, with --linger, when
// the abort grace has passed while it sleeps), the job is aborted, long before the others' timeout.
// With --overlap it throws in the middle of a gradient overlap: its first bucket is in flight on the
// replica's communication thread, the second never starts.
int throws(strategy_type& s, const arguments& args) {
  const bool overlap = args.contains("overlap");
  for (int step = 0; step < 6; ++step) {
    try {
      s.run([&](dist::replica auto& r) {
        const bool fails = step == 2 && s.worker_index() == 1 && r.local_replica_id() == 0;
        if (overlap) {
          two_slabs m;
          auto sync = r.overlap_gradients({.bucket_bytes = 4000, .first_bucket_bytes = 4000});
          sync.add(m);
          r.gradients_ready(m.last);  // its bucket starts
          if (fails) throw std::runtime_error("boom at step 2");
          r.gradients_ready(m.first);
          sync.wait();
          return;
        }
        if (fails) throw std::runtime_error("boom at step 2");
        std::vector<float> g(1000, 1.0f);
        r.all_reduce(dist::reduce_op::sum, g);
      });
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "caught: %s\n", e.what());
      if (!args.contains("linger")) return 3;
      std::this_thread::sleep_for(std::chrono::minutes(2));
      return 4;
    }
  }
  return 4;
}

int pipeline_fault(strategy_type& s, bool throws) {
  namespace pt = dist::pipeline_test;
  const pt::fault fault{.stage = 0,
                        .micro_batch = 1,
                        .kind = throws ? pt::fault::throws : pt::fault::stalls,
                        .stall = std::chrono::seconds(3)};
  auto model = pt::make_pipeline<2>(s, {.micro_batches = 4}, &fault);
  const auto x = pt::inputs(8, 0), y = pt::targets(8, 0);
  s.run([&](auto& r) { return model.train_step(r, x, y, pt::mse_loss{}, 8); });
  return 4;
}

int mismatch(strategy_type& s) {
  s.run([&](dist::replica auto& r) {
    std::vector<float> g(s.worker_index() == 1 ? 5 : 4, 1.0f);
    r.all_reduce(dist::reduce_op::sum, g);
  });
  return 4;
}

// Worker 0 runs a second training step (its gradient all-reduce: one float) while worker 1, whose
// input ran out, reports its loss (strategy.reduce: one float). Both must name both calls.
struct one_weight {
  using scalar_type = float;
  std::vector<float> w{1.0f}, g{0.5f};
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(w), std::span<float>(g));
  }
};

int api_mismatch(strategy_type& s) {
  auto models = s.mirror([](auto&) { return one_weight{}; });
  s.run([](dist::replica auto& r, one_weight& m) { r.all_reduce_gradients(m); }, models);
  if (s.worker_index() == 1) {
    const auto losses = s.run([](dist::replica auto&) { return 1.0f; });
    std::printf("loss %f\n", static_cast<double>(s.reduce(dist::reduce_op::sum, losses)));
  } else {
    s.run([](dist::replica auto& r, one_weight& m) { r.all_reduce_gradients(m); }, models);
  }
  return 4;
}

int throws_outside(strategy_type& s) {
  if (s.worker_index() == 1) throw std::runtime_error("no input file");
  s.run([](dist::replica auto& r) {
    std::vector<float> g(1000, 1.0f);
    r.all_reduce(dist::reduce_op::sum, g);
  });
  return 4;
}

// Point-to-point failures, on the MPI communicator itself.
int p2p_never_sent(const arguments& args) {
  dist::comm::mpi world{dist::test::test_mpi_options(std::chrono::milliseconds(number(args, "timeout-ms", 2000)))};
  dist::comm::mpi c = world;
  int waiter = 1, silent = 0;
  if (args.contains("split")) {
    c = world.split(world.rank() == 0 ? 1 : 0, -world.rank());
    waiter = 0;  // world worker 2
    silent = 1;  // world worker 1
    if (world.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(30));
      return 4;
    }
  }
  if (c.rank() == waiter) {
    const dist::collective_label label("stage backward");
    std::vector<float> in(64);
    c.recv(std::span<float>(in), silent, 3);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(30));  // far beyond the timeout
  }
  return 4;
}

int p2p_mismatch(const arguments& args) {
  dist::comm::mpi c{dist::test::test_mpi_options(std::chrono::milliseconds(number(args, "timeout-ms", 2000)))};
  if (c.rank() == 0) {
    const dist::collective_label label("stage forward");
    if (args.contains("type")) {
      const std::vector<std::int32_t> out(64, 1);
      c.send(std::span<const std::int32_t>(out), 1, 3);
    } else {
      const std::vector<float> out(80, 1.0f);
      c.send(std::span<const float>(out), 1, 3);
    }
    c.barrier();  // worker 1 never comes: it failed
  } else if (c.rank() == 1) {
    std::vector<float> in(64);
    c.recv(std::span<float>(in), 0, 3);
  }
  return 4;
}

int single(const arguments& args) {
  strategy_type s{options_from(args)};
  const bool ok = s.num_workers() == 1 && s.worker_index() == 0 && s.is_chief() && s.num_replicas_in_sync() == 2;
  const auto sums = s.run([](dist::replica auto& r) { return r.all_reduce(dist::reduce_op::sum, r.replica_id() + 1); });
  std::printf("single worker: %d workers, %d replicas, sum %d\n", s.num_workers(), s.num_replicas_in_sync(), sums[0]);
  return ok && sums[0] == 3 && sums[1] == 3 ? 0 : 4;
}

}  // namespace

int run_scenario(int argc, char** argv) {
  const auto args = parse(argc, argv);
  const std::string name = args.at("scenario");
  try {
    if (name == "single") return single(args);
    if (name == "p2p-never-sent") return p2p_never_sent(args);
    if (name == "p2p-mismatch") return p2p_mismatch(args);
    strategy_type s{argc, argv, options_from(args)};
    if (name == "train") return train(s, args);
    if (name == "preempt") return preempt(s, args);
    if (name == "stall") return stall(s);
    if (name == "mismatch") return mismatch(s);
    if (name == "api-mismatch") return api_mismatch(s);
    if (name == "throw-outside") return throws_outside(s);
    if (name == "throw") return throws(s, args);
    if (name == "pipeline-throws" || name == "pipeline-stall") return pipeline_fault(s, name == "pipeline-throws");
    std::fprintf(stderr, "unknown scenario %s\n", name.c_str());
    return 4;
  } catch (const dist::collective_error&) {
    if (args.contains("uncaught")) throw;  // to main's caller: std::terminate
    // The stalled job's survivors time out within moments of each other, and the first to exit
    // aborts the job: stay a little (well inside the abort grace), so that every survivor's line is
    // printed and the test can read what each one named.
    if (name == "stall") std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return 3;  // the library printed it, once, as this worker left the job
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caught: %s\n", e.what());
    return 4;
  }
}
