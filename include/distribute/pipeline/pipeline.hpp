#pragma once
// Pipeline parallelism: a model given as a sequence of stages, each stage on its own replica, and a
// step's batch cut into micro-batches that flow through them (activations forward, gradients
// backward, as point-to-point messages of the replicas' communicator). With `copies` > 1 the
// replicas form a mesh of stages x copies (the hybrid of pipeline and data parallelism): copy c runs
// the pipeline on its own batch, and each stage's gradients are summed over that stage's copies only
// (a sub-group of the communicator).
//
// This header is over 600 lines for one class template, which stays one: the schedule's passes, the
// messages between stages and the sums over copies all work on the same stages of each replica and
// the same numbering of stages and copies. Its options and step results are options.hpp, its
// schedules schedule.hpp.
//
//   dist::pipeline model(strategy, {.micro_batches = 8, .schedule = dist::pipeline_schedule::one_f_one_b},
//                        [](const dist::cpu& d) { return make_encoder(d); },     // stage 0
//                        [](const dist::cpu& d) { return make_decoder(d); });    // stage 1
//   auto losses = strategy.run([&](auto& r, optim::adam<>& opt) {
//     auto result = model.train_step(r, images, targets, mse_loss, global_batch);
//     opt.step(r, model.local(r));
//     return result.loss;
//   }, optimisers);
//
// Placement: the strategy's replicas are numbered copy * P + position. P is the number of stages
// (each replica holds one stage) or 1 (each replica holds every stage and the step is the plain one:
// micro-batches accumulate gradients one after the other). So under `one_device_strategy` the same
// code is the plain step, and with P = 1 and several copies it is data parallelism.
//
// A step (`train_step`) zeroes the gradients of the replica's stages, runs the schedule
// (schedule.hpp), and, with copies, sums each stage's gradients over its copies. The loss is scaled
// as everywhere (nn/losses.hpp): `loss(r, prediction, target, global_batch_size)` divides by the
// global batch, so the micro-batches' gradients add up to the gradient of the global mean.
//
// Activations: a stage keeps each micro-batch's input until that micro-batch's backward. Layers keep
// the state of their last forward only, so a stage whose last forward was another micro-batch runs
// the forward again first (GPipe's re-materialisation); layer buffers such as running statistics are
// put back afterwards, so the re-run changes nothing but the kept state. The forward is
// deterministic, so the gradients are the same bits as without the re-run. A stage that can set its
// forward state aside (`stashable_stage`: `auto k = stage.stash()` after a forward, and
// `stage.restore(std::move(k))` before that micro-batch's backward) is not run again, and its input
// is not kept.
//
// Semantics: a pipelined step equals one device over the whole batch: bit for bit where the engine
// is split-independent (`compute_options::split_independent` or the reference engine), else within
// float rounding. A stage that throws ends the step with that exception on the caller; a stage that
// never sends makes its receiver fail within the communicator's timeout, with a message naming both
// stages. Layers that communicate within their forward (`sync_batch_norm`) cannot be in a stage: their
// collectives would span every stage.

#include <distribute/collective_origin.hpp>
#include <distribute/comm/gradient_buckets.hpp>
#include <distribute/concepts/communicator.hpp>
#include <distribute/concepts/strategy.hpp>
#include <distribute/detail/activity.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/gradients.hpp>
#include <distribute/nn/losses.hpp>
#include <distribute/pipeline/options.hpp>
#include <distribute/pipeline/schedule.hpp>
#include <distribute/tensor/micro_batches.hpp>
#include <distribute/tensor/tensor.hpp>

#include <algorithm>
#include <any>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

// A stage that hands out the state its last forward left for the backward, and takes it back.
template <class S>
concept stashable_stage = requires(S& s) { s.restore(s.stash()); };

template <class... Stages>
  requires(sizeof...(Stages) > 0)
class pipeline {
  using first_stage = std::tuple_element_t<0, std::tuple<Stages...>>;

 public:
  using scalar_type = typename first_stage::scalar_type;
  using device_type = nn::layer_device_t<first_stage>;
  using tensor_type = tensor<scalar_type, device_type>;
  static constexpr int num_stages = static_cast<int>(sizeof...(Stages));
  static_assert((std::is_same_v<typename Stages::scalar_type, scalar_type> && ...),
                "distribute: the stages of a pipeline must share one scalar type");
  static_assert((std::is_same_v<nn::layer_device_t<Stages>, device_type> && ...),
                "distribute: the stages of a pipeline must share one device type");
  static_assert(std::is_same_v<device_type, cpu>, "distribute: pipelines run on CPU replicas");

  // `factories[k](device)` makes stage k on `device`; it is called once on every replica of this
  // process that holds stage k, and must give every copy the same initial values (seeded layers do).
  template <strategy S, class... F>
    requires(sizeof...(F) == sizeof...(Stages))
  pipeline(S& strategy, pipeline_options options, F&&... factories)
      : o_{check_options(options)},
        replicas_{strategy.num_replicas_in_sync()},
        positions_{positions_of(replicas_, o_.copies)},
        first_replica_{strategy.first_replica_id()} {
    const auto devices = strategy.devices();
    for (int i = 0; i < strategy.num_local_replicas(); ++i) {
      parts_.push_back(std::make_unique<part>());
      const int position = (first_replica_ + i) % positions_;
      make_stages(*parts_.back(), devices[static_cast<std::size_t>(i)], position, std::index_sequence_for<Stages...>{},
                  factories...);
    }
    for (int s = 0; s + 1 < num_stages; ++s) {
      labels_.push_back("pipeline activations, stage " + std::to_string(s) + " to stage " + std::to_string(s + 1));
      labels_.push_back("pipeline gradients, stage " + std::to_string(s + 1) + " to stage " + std::to_string(s));
    }
  }

  const pipeline_options& options() const noexcept { return o_; }
  // Stages per copy on the replicas: the number of stages, or 1 when every replica holds them all.
  int positions() const noexcept { return positions_; }
  int copies() const noexcept { return o_.copies; }
  // The stage replica `replica_id` holds (-1: all of them), and the copy it belongs to.
  int stage_of(int replica_id) const noexcept { return positions_ == 1 ? -1 : replica_id % positions_; }
  int copy_of(int replica_id) const noexcept { return replica_id / positions_; }

  // The stages replica `r` holds, as one model: parameters, buffers, gradients, training mode (for
  // optimisers, checkpoints and verify_mirrored).
  template <class R>
  auto& local(R& r) {
    return part_of(r).view;
  }
  // Stage I if replica `r` holds it, else null.
  template <std::size_t I, class R>
  auto* stage(R& r) {
    auto& s = std::get<I>(part_of(r).stages);
    return s ? &*s : nullptr;
  }

  // One training step over `input` (this copy's batch; read by the first stage) and `target` (read by
  // the last stage, for `loss`). `loss(r, prediction, target, global_batch_size)` returns an
  // nn::loss_result. The replica's stages end with the step's gradients.
  template <class R, class Loss>
  pipeline_step_result train_step(R& r, const tensor_type& input, const tensor_type& target, Loss&& loss,
                                  std::int64_t global_batch_size) {
    const auto started = clock::now();
    part& p = part_of(r);
    local_stages{&p}.zero_grad();
    pipeline_step_result result;
    if (positions_ == 1) {
      run_whole(r, p, input, target, loss, global_batch_size, result);
    } else {
      dispatch(stage_of(r.replica_id()), [&](auto index) {
        run_stage<decltype(index)::value>(r, p, input, target, loss, global_batch_size, result);
      });
    }
    if (o_.copies > 1) {
      const detail::collective_stopwatch timed{r.collective_meter()};
      reduce_over_copies(r, p);
    }
    // The time this stage waited for its neighbours is the replica's communication time (timings()).
    detail::add_to_meter(r.collective_meter(), static_cast<std::int64_t>(result.wait_seconds * 1e9));
    result.step_seconds = seconds_since(started);
    return result;
  }

  // The forward pass alone, over micro-batches: the last stage (every replica, when each holds every
  // stage) returns the output for the whole of `input`; the others return an empty tensor.
  template <class R>
  tensor_type predict(R& r, const tensor_type& input) {
    part& p = part_of(r);
    if (positions_ == 1) {
      std::vector<tensor_type> outs;
      for (std::int64_t offset = 0; auto n : micro_batch_sizes(batch_of(input), o_.micro_batches)) {
        outs.push_back(forward_all(r, p, batch_slice(input, offset, n)));
        offset += n;
      }
      return concatenate(outs);
    }
    tensor_type out;
    dispatch(stage_of(r.replica_id()), [&](auto index) { out = predict_stage<decltype(index)::value>(r, p, input); });
    return out;
  }

 private:
  using clock = std::chrono::steady_clock;
  using part_stages = std::tuple<std::optional<Stages>...>;
  struct part;

  // The stages one replica holds, enumerated as one model.
  struct local_stages {
    using scalar_type = pipeline::scalar_type;
    using device_type = pipeline::device_type;
    part* p;
    template <class F>
    void for_each_parameter(F&& f) {
      each([&](auto& s) { s.for_each_parameter(f); });
    }
    template <class F>
    void for_each_buffer(F&& f) {
      each([&](auto& s) {
        if constexpr (requires { s.for_each_buffer(f); }) s.for_each_buffer(f);
      });
    }
    void zero_grad() {
      each([](auto& s) { s.zero_grad(); });
    }
    void set_training(bool on) {
      each([on](auto& s) { s.set_training(on); });
    }
    template <class F>
    void each(F&& f) {
      std::apply([&](auto&... s) { ((s ? f(*s) : void()), ...); }, p->stages);
    }
  };

  struct part {
    part_stages stages;
    local_stages view{this};
    std::any sub_group;  // this replica's endpoint of its stage's copies, made on first use
    part() = default;
    part(const part&) = delete;
    part& operator=(const part&) = delete;
  };

  template <class S>
  struct stash_of {
    using type = int;
  };
  template <stashable_stage S>
  struct stash_of<S> {
    using type = decltype(std::declval<S&>().stash());
  };

  // The bytes a stash holds, where it says: a tensor, or anything with `bytes()`.
  template <class K>
  static std::size_t stash_bytes(const K& k) {
    if constexpr (std::is_same_v<K, tensor_type>) return k.size() * sizeof(scalar_type);
    else if constexpr (requires {
                         { k.bytes() } -> std::convertible_to<std::size_t>;
                       })
      return k.bytes();
    else return 0;
  }

  static double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

  static pipeline_options check_options(pipeline_options o) {
    if (o.micro_batches < 1)
      throw std::invalid_argument("distribute: pipeline_options::micro_batches must be at least 1, got " +
                                  std::to_string(o.micro_batches));
    if (o.copies < 1)
      throw std::invalid_argument("distribute: pipeline_options::copies must be at least 1, got " +
                                  std::to_string(o.copies));
    return o;
  }
  static int positions_of(int replicas, int copies) {
    if (replicas % copies == 0 && (replicas / copies == 1 || replicas / copies == num_stages)) return replicas / copies;
    throw std::invalid_argument("distribute: a pipeline of " + std::to_string(num_stages) + " stages x " +
                                std::to_string(copies) + " copies needs " + std::to_string(num_stages * copies) +
                                " replicas (or " + std::to_string(copies) +
                                ", each holding every stage); the strategy has " + std::to_string(replicas));
  }

  template <std::size_t... I, class... F>
  void make_stages(part& p, const device_type& device, int position, std::index_sequence<I...>, F&... factories) {
    ((positions_ == 1 || position == static_cast<int>(I)
          ? (void)std::get<I>(p.stages).emplace(std::invoke(factories, device))
          : void()),
     ...);
  }

  template <class R>
  part& part_of(R& r) {
    const int local = r.replica_id() - first_replica_;
    if (local < 0 || local >= static_cast<int>(parts_.size()) || r.num_replicas() != replicas_)
      throw std::logic_error("distribute: replica " + std::to_string(r.replica_id()) + " of " +
                             std::to_string(r.num_replicas()) +
                             " is not one of the replicas this pipeline was placed on (" + std::to_string(replicas_) +
                             " replicas, " + std::to_string(parts_.size()) + " in this process)");
    return *parts_[static_cast<std::size_t>(local)];
  }

  // f(std::integral_constant<std::size_t, stage>{}).
  template <class F>
  static void dispatch(int stage, F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((stage == static_cast<int>(I) ? (f(std::integral_constant<std::size_t, I>{}), 0) : 0), ...);
    }(std::index_sequence_for<Stages...>{});
  }

  static std::int64_t batch_of(const tensor_type& t) { return t.shape().rank() ? t.shape()[0] : 0; }

  template <class Loss, class R>
  static auto loss_of(Loss& loss, R& r, const tensor_type& y, const tensor_type& target, std::int64_t global) {
    auto l = std::invoke(loss, r, y, target, global);
    if (l.grad.shape() != y.shape())
      throw std::invalid_argument("distribute: a pipeline's loss returned a gradient of shape " +
                                  l.grad.shape().to_string() + " for a prediction of shape " + y.shape().to_string());
    return l;
  }

  template <class S, class R>
  static tensor_type backward_of(S& stage, R& r, const tensor_type& dy, bool input_gradient) {
    if constexpr (requires { stage.backward(r, dy, nn::no_input_gradient); }) {
      if (!input_gradient) return stage.backward(r, dy, nn::no_input_gradient);
    }
    return stage.backward(r, dy);
  }

  // Every stage on this replica, in order.
  template <class R>
  static tensor_type forward_all(R& r, part& p, tensor_type x) {
    std::apply([&](auto&... s) { ((x = s->forward(r, x)), ...); }, p.stages);
    return x;
  }
  // Every stage of a replica that holds them all, as one layer for nn::compute_gradients.
  struct all_stages {
    using scalar_type = pipeline::scalar_type;
    using device_type = pipeline::device_type;
    part* p;
    template <class R>
    tensor_type forward(R& r, const tensor_type& x) {
      return forward_all(r, *p, x);
    }
    template <class F>
    void for_each_parameter(F&& f) {
      p->view.for_each_parameter(f);
    }
    template <class R>
    tensor_type backward(R& r, const tensor_type& dy, nn::no_input_gradient_t) {
      backward_all<num_stages - 1>(r, *p, dy);
      return tensor_type{};
    }
  };
  // Micro-batches one after the other through every stage: gradient accumulation.
  template <class R, class Loss>
  void run_whole(R& r, part& p, const tensor_type& input, const tensor_type& target, Loss& loss, std::int64_t global,
                 pipeline_step_result& result) {
    result.micro_batches = static_cast<int>(std::min<std::int64_t>(o_.micro_batches, batch_of(input)));
    const auto started = clock::now();
    all_stages model{&p};
    result.loss = nn::compute_gradients(r, model, input, target, loss, global,
                                        {.micro_batches = o_.micro_batches, .all_reduce = false});
    result.compute_seconds = seconds_since(started);
  }
  template <std::size_t I, class R>
  static void backward_all(R& r, part& p, const tensor_type& dy) {
    tensor_type dx = backward_of(*std::get<I>(p.stages), r, dy, I > 0);
    if constexpr (I > 0) backward_all<I - 1>(r, p, dx);
  }

  // Message tags: three per micro-batch (the header of its activations, the activations, their gradient).
  static int tag(int micro_batch, int kind) { return 3 * micro_batch + kind; }
  enum : int { header_tag = 0, activation_tag = 1, gradient_tag = 2 };
  static constexpr std::size_t header_size = 2 + shape::max_rank;  // micro-batches, rank, extents

  // One stage of the pipeline: stage I on this replica.
  template <std::size_t I, class R, class Loss>
  void run_stage(R& r, part& p, const tensor_type& input, const tensor_type& target, Loss& loss, std::int64_t global,
                 pipeline_step_result& result) {
    using C = std::remove_reference_t<decltype(r.communicator())>;
    if constexpr (!point_to_point_communicator<C>) {
      throw std::logic_error(
          "distribute: a pipeline of stages on several replicas needs a communicator that passes messages");
    } else {
      constexpr bool first = I == 0, last = I + 1 == sizeof...(Stages);
      auto& stage = *std::get<I>(p.stages);
      auto& comm = r.communicator();
      // The stages of one copy are consecutive replicas; a replica's rank in the strategy's
      // communicator is its replica id.
      const int prev = r.replica_id() - 1, next = r.replica_id() + 1;
      inflow in = open_inflow<I>(comm, prev, next, input, result);
      const int m = in.micro_batches;
      result.micro_batches = m;
      std::vector<std::optional<tensor_type>> kept(static_cast<std::size_t>(m)), dys(static_cast<std::size_t>(m));
      constexpr bool stashable = stashable_stage<std::remove_reference_t<decltype(stage)>>;
      using stash_type = typename stash_of<std::remove_reference_t<decltype(stage)>>::type;
      std::vector<std::optional<stash_type>> stashes(static_cast<std::size_t>(m));
      std::vector<std::size_t> kept_input_bytes(static_cast<std::size_t>(m));
      std::vector<shape> out_shapes(static_cast<std::size_t>(m));
      std::size_t kept_bytes = 0;
      std::int64_t target_offset = 0;
      int last_forward = -1;
      for (const pipeline_op op : schedule_of(o_.schedule, static_cast<int>(I), num_stages, m)) {
        const int j = op.micro_batch;
        const auto uj = static_cast<std::size_t>(j);
        if (op.kind == pipeline_op::pass::forward) {
          tensor_type x = take_input<I>(in, comm, prev, j, input, result);
          const auto started = clock::now();
          tensor_type y = stage.forward(r, x);
          last_forward = j;
          // What the backward needs: the stage's stash, or the input to run the forward again on.
          std::size_t bytes = 0;
          if constexpr (stashable) {
            stashes[uj].emplace(stage.stash());
            bytes = stash_bytes(*stashes[uj]);
          } else {
            bytes = x.size() * sizeof(scalar_type);
            kept[uj].emplace(std::move(x));
          }
          kept_bytes += bytes;
          kept_input_bytes[uj] = bytes;
          if constexpr (last) {
            const std::int64_t n = batch_of(y);
            if (target_offset + n > batch_of(target))
              throw std::invalid_argument("distribute: the last pipeline stage got more examples than its " +
                                          std::to_string(batch_of(target)) + " targets");
            auto l = loss_of(loss, r, y, batch_slice(target, target_offset, n), global);
            target_offset += n;
            result.loss += static_cast<double>(l.value);
            kept_bytes += l.grad.size() * sizeof(scalar_type);
            dys[uj].emplace(std::move(l.grad));
            result.compute_seconds += seconds_since(started);
          } else {
            result.compute_seconds += seconds_since(started);
            out_shapes[uj] = y.shape();
            pass_on<I>(comm, next, j, m, y);
          }
          result.peak_kept_bytes = std::max(result.peak_kept_bytes, kept_bytes);
        } else {
          tensor_type dy;
          if constexpr (last) {
            dy = std::move(*dys[uj]);
            dys[uj].reset();
            kept_bytes -= dy.size() * sizeof(scalar_type);
          } else {
            dy = tensor_type{out_shapes[uj], device_type{}, uninitialized};
            recv_values(comm, next, tag(j, gradient_tag), dy, labels_[2 * I + 1].c_str(), result);
          }
          const auto started = clock::now();
          if constexpr (stashable) {
            stage.restore(std::move(*stashes[uj]));
            stashes[uj].reset();
          } else if (last_forward != j) {
            rerun_forward(stage, r, *kept[uj]);
            ++result.recomputed;
          }
          last_forward = j;
          tensor_type dx = backward_of(stage, r, dy, !first);
          result.compute_seconds += seconds_since(started);
          kept_bytes -= kept_input_bytes[uj];
          kept[uj].reset();
          if constexpr (!first) send_values(comm, prev, tag(j, gradient_tag), dx, labels_[2 * (I - 1) + 1].c_str());
        }
      }
      if constexpr (last) {
        if (target_offset != batch_of(target))
          throw std::invalid_argument("distribute: a pipeline step got " + std::to_string(target_offset) +
                                      " examples through its stages and " + std::to_string(batch_of(target)) +
                                      " targets");
      }
    }
  }

  template <std::size_t I, class R>
  tensor_type predict_stage(R& r, part& p, const tensor_type& input) {
    using C = std::remove_reference_t<decltype(r.communicator())>;
    if constexpr (!point_to_point_communicator<C>) {
      throw std::logic_error(
          "distribute: a pipeline of stages on several replicas needs a communicator that passes messages");
    } else {
      constexpr bool last = I + 1 == sizeof...(Stages);
      auto& stage = *std::get<I>(p.stages);
      auto& comm = r.communicator();
      const int prev = r.replica_id() - 1, next = r.replica_id() + 1;
      pipeline_step_result ignored;
      inflow in = open_inflow<I>(comm, prev, next, input, ignored);
      std::vector<tensor_type> outs;
      for (int j = 0; j < in.micro_batches; ++j) {
        tensor_type y = stage.forward(r, take_input<I>(in, comm, prev, j, input, ignored));
        if constexpr (last) outs.push_back(std::move(y));
        else pass_on<I>(comm, next, j, in.micro_batches, y);
      }
      return last ? concatenate(outs) : tensor_type{};
    }
  }

  // Where a stage's micro-batches come from: the batch (the first stage cuts it) or the previous
  // stage's messages (a header with the micro-batch count and the shape, then the values).
  struct inflow {
    int micro_batches = 0;
    std::vector<std::int64_t> sizes;  // the first stage's
    std::int64_t offset = 0;          // the first stage's next example
    std::array<std::int64_t, header_size> header{};
  };
  template <std::size_t I, class C>
  inflow open_inflow(C& comm, int prev, int next, const tensor_type& input, pipeline_step_result& result) {
    inflow in;
    if constexpr (I == 0) {
      in.sizes = micro_batch_sizes(batch_of(input), o_.micro_batches);
      in.micro_batches = static_cast<int>(in.sizes.size());
      if (in.micro_batches == 0) send_header(comm, next, 0, 0, shape{});  // the next stages learn there is none
    } else {
      recv_header(comm, prev, 0, in.header, result);
      if (in.header[0] < 0) throw std::invalid_argument("distribute: a pipeline stage received a corrupt header");
      in.micro_batches = static_cast<int>(in.header[0]);
    }
    return in;
  }
  template <std::size_t I, class C>
  tensor_type take_input(inflow& in, C& comm, int prev, int j, const tensor_type& input, pipeline_step_result& result) {
    if constexpr (I == 0) {
      const std::int64_t n = in.sizes[static_cast<std::size_t>(j)];
      in.offset += n;
      return batch_slice(input, in.offset - n, n);
    } else {
      if (j > 0) recv_header(comm, prev, j, in.header, result);
      tensor_type x{shape_of(in.header), device_type{}, uninitialized};
      recv_values(comm, prev, tag(j, activation_tag), x, labels_[2 * (I - 1)].c_str(), result);
      return x;
    }
  }
  template <std::size_t I, class C>
  void pass_on(C& comm, int next, int j, int m, const tensor_type& y) {
    send_header(comm, next, j, m, y.shape());
    send_values(comm, next, tag(j, activation_tag), y, labels_[2 * I].c_str());
  }

  // The forward of micro-batch `x` again, for the state its backward needs; buffers (running
  // statistics) as they were.
  template <class S, class R>
  static void rerun_forward(S& stage, R& r, const tensor_type& x) {
    std::vector<std::vector<std::byte>> saved;
    auto visit = [&](bool restore) {
      std::size_t i = 0;
      if constexpr (requires { stage.for_each_buffer([](auto) {}); }) {
        stage.for_each_buffer([&](auto span) {
          auto bytes = std::as_writable_bytes(span);
          if (restore) std::memcpy(bytes.data(), saved[i++].data(), bytes.size());
          else saved.emplace_back(bytes.begin(), bytes.end());
        });
      }
    };
    visit(false);
    (void)stage.forward(r, x);
    visit(true);
  }

  static shape shape_of(const std::array<std::int64_t, header_size>& h) {
    const auto rank = h[1];
    if (rank < 1 || rank > static_cast<std::int64_t>(shape::max_rank))
      throw std::invalid_argument("distribute: a pipeline stage received activations of rank " + std::to_string(rank));
    shape s;
    switch (rank) {
      case 1: s = shape{h[2]}; break;
      case 2: s = shape{h[2], h[3]}; break;
      case 3: s = shape{h[2], h[3], h[4]}; break;
      default: s = shape{h[2], h[3], h[4], h[5]}; break;
    }
    return s;
  }

  template <class C>
  void send_header(C& comm, int to, int j, int m, const shape& s) {
    std::array<std::int64_t, header_size> h{};
    h[0] = m;
    h[1] = static_cast<std::int64_t>(s.rank());
    for (std::size_t a = 0; a < s.rank(); ++a) h[2 + a] = s[a];
    const int from = comm.rank();
    const collective_label label(labels_[2 * static_cast<std::size_t>(std::min(from, to) % positions_)].c_str());
    comm.send(std::span<const std::int64_t>(h), to, tag(j, header_tag));
  }
  template <class C>
  void recv_header(C& comm, int from, int j, std::array<std::int64_t, header_size>& h, pipeline_step_result& result) {
    const auto started = clock::now();
    const collective_label label(labels_[2 * static_cast<std::size_t>(from % positions_)].c_str());
    comm.recv(std::span<std::int64_t>(h), from, tag(j, header_tag));
    result.wait_seconds += seconds_since(started);
  }
  template <class C>
  static void send_values(C& comm, int to, int t, const tensor_type& v, const char* label) {
    const collective_label l(label);
    comm.send(std::span<const scalar_type>(v.data(), v.size()), to, t);
  }
  template <class C>
  static void recv_values(C& comm, int from, int t, tensor_type& v, const char* label, pipeline_step_result& result) {
    const auto started = clock::now();
    const collective_label l(label);
    comm.recv(std::span<scalar_type>(v.data(), v.size()), from, t);
    result.wait_seconds += seconds_since(started);
  }

  // Each stage's gradients summed over its copies: in a sub-group of the stage's replicas, or over
  // every replica when each holds every stage.
  template <class R>
  void reduce_over_copies(R& r, part& p) {
    local_stages model{&p};
    if (positions_ == 1) {
      comm::all_reduce_gradients(r.communicator(), model, o_.reduction);
      return;
    }
    using C = std::remove_reference_t<decltype(r.communicator())>;
    if constexpr (point_to_point_communicator<C>) {
      using sub_type = std::decay_t<decltype(r.communicator().split(0, 0))>;
      if (!p.sub_group.has_value()) {
        const collective_label label("pipeline stage copies");
        p.sub_group = r.communicator().split(stage_of(r.replica_id()), copy_of(r.replica_id()));
      }
      comm::all_reduce_gradients(std::any_cast<sub_type&>(p.sub_group), model, o_.reduction);
    }
  }

  pipeline_options o_;
  int replicas_;
  int positions_;
  int first_replica_;
  std::vector<std::unique_ptr<part>> parts_;  // one per replica of this process
  std::vector<std::string> labels_;           // what the messages between stages s and s + 1 are called
};

template <strategy S, class... F>
pipeline(S&, pipeline_options, F&&...)
    -> pipeline<std::decay_t<std::invoke_result_t<F&, const typename S::device_type&>>...>;

}  // namespace distribute
