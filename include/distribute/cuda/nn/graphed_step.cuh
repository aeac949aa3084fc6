#pragma once
// A whole training step of a GPU replica as one CUDA graph: forward, loss, backward, the gradient
// all-reduce and the optimiser's update, captured once and then replayed with one launch per step
// (PyTorch's whole-network capture with torch.cuda.graph). Where nn::graphed takes the launches of a
// model's passes off the host, this takes those of everything else too, collectives included.
//
//   nn::graphed_step<float> whole;   // shared by the replicas: one graph per replica
//   auto opt = strategy.mirror([](auto&) { return optim::adam<float>{{.lr = 2e-4, .capturable = true}}; });
//   strategy.run([&](auto& r) {
//     const auto loss = whole.run(r, [&](const auto& x, const auto& y) {
//       auto& m = r.local(model);
//       m.zero_grad();
//       auto l = nn::mse(r, m.forward(r, x), y, global_batch, nn::value_on_device);
//       m.backward(r, l.grad);
//       r.all_reduce_gradients(m);
//       r.local(opt).step(r, m);
//       return l.value;                 // a tensor the graph writes
//     }, r.local(x), r.local(y));       // the step's inputs, copied into the graph's own
//     ...                               // loss.to_vector()[0] reads the loss when wanted
//   });
//
// The first `warmup_passes` calls of a replica (per set of input shapes) run the step eagerly; the
// next is captured (`cudaStreamCaptureModeThreadLocal`, instantiated with AutoFreeOnLaunch) over the
// graph's own copies of the inputs, and from then on each call copies its inputs into those, launches
// the graph and returns a copy of the tensor the step returned. A change of input shapes drops the
// graph and warms up again, and so do NCCL communicators rebuilt after a failure (the graph held the
// old ones' operations).
//
// What a step may hold: everything that queues GPU work on the replica's stream and keeps its memory
// where it was. Collectives go into the graph where the communicator can capture them (NCCL's: one
// GPU per replica); a replay that holds them is met and waited for as a collective (cuda/comm/nccl.cuh:
// deadline, errors, a replica that does not come). What it may not hold, and what then happens:
//   - host reads of device values (a loss's host value, batch norm's statistics, the loss scaler's
//     inf check): `graph_capture_error`, so use `nn::value_on_device` losses;
//   - optimisers with host step values: adam and sgd refuse unless constructed `capturable`;
//   - collectives of communicators that cannot be captured (cuda_peer: logical replicas sharing a
//     GPU): graph_capture_error.
// A capture that fails on any replica leaves every replica eager for good (they agree with one
// all-reduce after each capture), `eager_reason()` says why, and the step is run again eagerly at
// once. What the step's host code changed before it failed (a dropout's random stream) has then
// changed twice. A failure that is not the same on every replica (a CUDA error on one) makes the
// replicas' collectives disagree: collective_mismatch, not a hang.
//
// Rules, as for PyTorch's captured graphs: every replica captures at the same call (the same input
// shapes on every replica); what the step reads or writes must stay where it was captured (the
// model's parameters and gradients, the optimiser's state: `load` writes in place; call `reset()`
// after replacing a model or optimiser the step uses); host values the step passes to kernels are
// frozen at the capture (a learning rate: the capturable optimisers read theirs from device memory,
// `set_lr` writes it); random numbers drawn on the host (dropout) repeat. Do not nest graphed models
// (nn::graphed) inside: use the plain ones.

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>
#include <distribute/cuda/nn/graphed.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/reduce_op.hpp>
#include <distribute/replica_context.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::nn {

template <class T = float>
class graphed_step {
 public:
  using tensor_type = tensor<T, cuda>;

  // graph_options::warmup_passes counts eager steps here.
  explicit graphed_step(graph_options options = {})
      : options_{detail::check_graph_options(options, "nn::graphed_step")} {}
  graphed_step(const graphed_step&) = delete;
  graphed_step& operator=(const graphed_step&) = delete;

  // Runs `step(inputs...)` on replica `r`: eagerly, captured, or replayed (above). `step` receives
  // tensors on r's device with the inputs' values and returns a tensor_type.
  template <class R, class Step, class... Inputs>
    requires(std::is_same_v<Inputs, tensor_type> && ...) && std::is_invocable_r_v<tensor_type, Step&, const Inputs&...>
  tensor_type run(R& r, Step&& step, const Inputs&... inputs) {
    if (!options_.enabled || eager_.load(std::memory_order_acquire)) return step(inputs...);
    replica_graph& g = graph_of(r.replica_id());
    std::vector<distribute::shape> key{inputs.shape()...};
    // Communicators rebuilt after a failure are new ones: a graph holding the old ones' operations
    // is captured again.
    if (key != g.key || generation_of(r) != g.generation) {
      g.drop();
      g.key = std::move(key);
      g.generation = generation_of(r);
    }
    if (g.graph) {
      std::size_t i = 0;
      ((g.inputs[i++] = inputs), ...);  // same shapes: copied into the graph's buffers, on the stream
      return replay(r, g);
    }
    if (g.eager_steps < options_.warmup_passes) {
      ++g.eager_steps;
      return step(inputs...);
    }
    g.inputs.clear();
    (g.inputs.push_back(detail::on_replica_stream(r, inputs)), ...);
    g.output = tensor_type{};
    const auto failure = g.graph.capture(r.device().index(), r.device().stream(), [&] {
      const detail::graph_capture_scope capturing{r, graph_capture::step};
      g.output = capture_call(step, g.inputs, std::index_sequence_for<Inputs...>{});
    });
    g.collectives = take_captured(r);
    if (!agree(r, failure.empty())) {
      g.drop();
      give_up(failure.empty() ? "another replica's capture failed" : "capturing the step failed: " + failure);
      return step(inputs...);
    }
    captures_.fetch_add(1, std::memory_order_relaxed);
    hold(r, g);
    return replay(r, g);
  }

  // Whether replica `replica_id`'s step is a graph now.
  bool replaying(int replica_id) const {
    const std::lock_guard lock{m_};
    const auto it = graphs_.find(replica_id);
    return it != graphs_.end() && static_cast<bool>(it->second.graph);
  }
  // Graphs captured so far, over every replica.
  std::size_t captures() const noexcept { return captures_.load(std::memory_order_relaxed); }
  // Why the step runs eagerly for good; empty while graphs are allowed.
  std::string eager_reason() const {
    const std::lock_guard lock{m_};
    return reason_;
  }
  // Drops every graph (the next calls warm up and capture again): after replacing a model or an
  // optimiser the step uses. Between steps only.
  void reset() {
    const std::lock_guard lock{m_};
    graphs_.clear();
  }

 private:
  struct replica_graph {
    std::vector<distribute::shape> key;
    int eager_steps = 0;
    distribute::detail::cuda_graph graph;
    std::vector<tensor_type> inputs;  // the graph's own copies of the inputs
    tensor_type output;               // what the captured step returned: the graph writes it
    std::size_t collectives = 0;      // captured collectives of this replica
    std::uint64_t generation = 0;     // of the communicators they belong to
    // What destroys the graph, registered with the communicator when the graph holds its collectives
    // (NCCL lets no communicator go while such a graph exists): dropping it unregisters.
    std::shared_ptr<std::function<void()>> destroy;
    void drop() {
      destroy.reset();
      graph.reset();
      eager_steps = 0;
      collectives = 0;
    }
  };

  template <class Step, std::size_t... I>
  static tensor_type capture_call(Step& step, const std::vector<tensor_type>& inputs, std::index_sequence<I...>) {
    return step(inputs[I]...);
  }

  replica_graph& graph_of(int replica_id) {
    const std::lock_guard lock{m_};
    return graphs_[replica_id];  // std::map: the element stays where it is
  }

  template <class R>
  static std::uint64_t generation_of(R& r) {
    if constexpr (requires { r.communicator().generation(); }) return r.communicator().generation();
    else return 0;
  }

  template <class R>
  static std::size_t take_captured(R& r) {
    if constexpr (requires { r.communicator().take_captured(); }) return r.communicator().take_captured();
    else return 0;
  }

  // A graph holding collectives is destroyed before its communicator is aborted or destroyed.
  template <class R>
  static void hold(R& r, replica_graph& g) {
    if constexpr (requires { r.communicator().hold_graph(std::weak_ptr<std::function<void()>>{}); }) {
      if (g.collectives == 0) return;
      g.destroy = std::make_shared<std::function<void()>>([&graph = g.graph] { graph.reset(); });
      r.communicator().hold_graph(g.destroy);
    }
  }

  // Every replica says whether its capture succeeded (one all-reduce, outside any capture).
  template <class R>
  static bool agree(R& r, bool ok) {
    if (r.num_replicas() == 1) return ok;
    std::array<std::int32_t, 1> flag{ok ? 1 : 0};
    r.all_reduce(reduce_op::min, flag);
    return flag[0] == 1;
  }

  template <class R>
  tensor_type replay(R& r, replica_graph& g) {
    const auto launch = [&g, stream = r.device().stream()] { g.graph.launch(stream); };
    if constexpr (requires { r.communicator().replay_captured(std::size_t{}, launch); }) {
      if (g.collectives != 0) r.communicator().replay_captured(g.collectives, launch);
      else launch();
    } else {
      launch();
    }
    return tensor_type(g.output);
  }

  // Every replica comes here after the same failed agreement (each has dropped its own graph).
  void give_up(std::string why) {
    const std::lock_guard lock{m_};
    if (reason_.empty()) reason_ = std::move(why);
    eager_.store(true, std::memory_order_release);
  }

  graph_options options_;
  mutable std::mutex m_;
  std::map<int, replica_graph> graphs_;
  std::string reason_;
  std::atomic<bool> eager_{false};
  std::atomic<std::size_t> captures_{0};
};

}  // namespace distribute::nn
