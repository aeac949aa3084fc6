// The gradient all-reduce overlapped with backward (replica_context::overlap_gradients): the bits of
// the blocking all-reduce, buckets that start while backward is still running, sync_batch_norm's
// collectives inside backward taking their turn, failures that end the step without a hang, and
// nothing at all under one device.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::shape;
using dist::tensor;

namespace {

// A layer that passes its input through and calls `on_backward(r)` in backward: to look at an open
// overlap from inside backward, or to fail there.
struct probe : nn::detail::stateless {
  using scalar_type = float;
  std::function<void(int replica)> on_backward;
  template <class R>
  tensor<float> forward(R&, const tensor<float>& x) {
    return x;
  }
  template <class R>
  tensor<float> backward(R& r, const tensor<float>& dy) {
    if (on_backward) on_backward(r.replica_id());
    return dy;
  }
};

constexpr std::int64_t global_batch = 12;

// probe -> conv -> sync_batch_norm -> relu -> residual block -> conv stride 2 -> tanh: the probe's
// backward runs last, after every parameter's gradient is final.
auto make_net(std::uint64_t seed) {
  return nn::sequential{
      probe{},
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1, .bias = false},
                        seed},
      nn::sync_batch_norm<float>{{.channels = 4}, seed + 1},
      nn::relu<float>{},
      nn::residual_block<float>{4, seed + 2},
      nn::conv2d<float>{{.in_channels = 4,
                         .out_channels = 2,
                         .kernel = 3,
                         .stride = 2,
                         .padding = 1,
                         .pad_mode = nn::padding_mode::reflect},
                        seed + 3},
      nn::tanh<float>{}};
}
using net_type = decltype(make_net(0));

struct global_data {
  std::vector<float> x, y;
};
global_data data_for_step(int step) {
  const auto x = dist::test::random_tensor<float>(shape::nchw(global_batch, 1, 6, 6), 71 + 2 * step, -1.0, 2.0);
  const auto y = dist::test::random_tensor<float>(shape::nchw(global_batch, 2, 3, 3), 72 + 2 * step, -0.5, 0.5);
  return {{x.begin(), x.end()}, {y.begin(), y.end()}};
}

// Every parameter of `net`, flattened in enumeration order.
template <class Net>
std::vector<float> parameters_of(Net& net) {
  std::vector<float> p;
  net.for_each_parameter([&](std::span<float> v, std::span<float>) { p.insert(p.end(), v.begin(), v.end()); });
  return p;
}

// Buckets small enough that the net's gradients take several (its largest tensor, 4x4x3x3 floats,
// is 576 bytes).
constexpr dist::gradient_reduction small_buckets{.bucket_bytes = 600, .first_bucket_bytes = 100};

struct run_record {
  std::vector<float> parameters;
  std::vector<std::size_t> collectives;    // per step, replica 0
  std::vector<std::size_t> started_early;  // per step, replica 0: buckets started before backward ended
  std::vector<std::size_t> held_back;      // per step, replica 0: buckets that waited for an earlier one
};

// Adam steps on a different global batch each step; checks that every replica holds the same bits.
template <class S>
run_record train(S& s, bool overlap, const dist::gradient_reduction& how, int steps = 3) {
  auto nets = s.mirror([](auto&) { return make_net(1234); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  run_record out;
  for (int step = 0; step < steps; ++step) {
    const auto data = data_for_step(step);
    auto xs = s.scatter(data.x, 36);
    auto ys = s.scatter(data.y, 18);
    std::vector<std::size_t> started(static_cast<std::size_t>(s.num_replicas_in_sync()));
    std::vector<std::size_t> held(started.size());
    auto counts = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, net_type& net,
            optim::adam<float>& opt) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 36;
          const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
          net.zero_grad();
          const auto loss = nn::mse(net.forward(r, x), y, global_batch);
          std::size_t collectives = 0;
          if (overlap) {
            auto sync = r.overlap_gradients(how);
            sync.add(net);
            net.get<0>().on_backward = [&](int id) { started[static_cast<std::size_t>(id)] = sync.started(); };
            net.backward(r, loss.grad);
            net.get<0>().on_backward = nullptr;
            held[static_cast<std::size_t>(r.replica_id())] = sync.held_back();
            collectives = sync.wait();
          } else {
            net.backward(r, loss.grad);
            collectives = r.all_reduce_gradients(net, how);
          }
          opt.step(net);
          return collectives;
        },
        xs, ys, nets, opts);
    out.collectives.push_back(counts[0]);
    out.started_early.push_back(started[0]);
    out.held_back.push_back(held[0]);
  }
  s.verify_mirrored(nets);
  out.parameters = parameters_of(nets[0]);
  return out;
}

// Models that are not sequentials: their gradients are never announced by backward.
struct two_tensors {
  using scalar_type = float;
  std::vector<float> v = std::vector<float>(300), g = std::vector<float>(300), v2 = std::vector<float>(50),
                     g2 = std::vector<float>(50);
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(v), std::span<float>(g));
    f(std::span<float>(v2), std::span<float>(g2));
  }
};
struct one_tensor {
  using scalar_type = float;
  std::vector<float> v, g;
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(v), std::span<float>(g));
  }
};

// A communicator with a split phase (as NCCL's: start_all_reduce, finish_started, abandon_started)
// over a CPU replica's own: what is started runs at finish_started, in order; every call is logged,
// and a collective called while started all-reduces are pending is logged as an error. It drives the
// overlap's split-phase path on the CPU.
template <class C>
struct split_phase_log {
  C inner;
  std::vector<std::string>* log;
  std::vector<std::function<void()>> started{};

  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  void note(const std::string& what) {
    log->push_back(started.empty() ? what : what + " with started all-reduces pending");
  }
  template <class... A>
  void all_reduce(A&&... a) {
    note("all_reduce");
    inner.all_reduce(std::forward<A>(a)...);
  }
  template <class... A>
  void reduce_scatter(A&&... a) {
    note("reduce_scatter");
    inner.reduce_scatter(std::forward<A>(a)...);
  }
  template <class... A>
  void all_gather(A&&... a) {
    note("all_gather");
    inner.all_gather(std::forward<A>(a)...);
  }
  template <class... A>
  void broadcast(A&&... a) {
    note("broadcast");
    inner.broadcast(std::forward<A>(a)...);
  }
  void barrier() {
    note("barrier");
    inner.barrier();
  }
  template <class T>
  void start_all_reduce(dist::reduce_op op, std::span<const std::span<T>> buffers) {
    log->push_back("start");
    started.push_back([this, op, b = std::vector<std::span<T>>(buffers.begin(), buffers.end())] {
      inner.all_reduce(op, std::span<const std::span<T>>(b));
    });
  }
  void finish_started() {
    if (started.empty()) return;
    log->push_back("finish " + std::to_string(started.size()));
    auto pending = std::move(started);
    started.clear();
    for (auto& f : pending) f();
  }
  void abandon_started() noexcept {
    if (!started.empty()) log->push_back("abandon " + std::to_string(started.size()));
    started.clear();
  }
};

// probe -> conv -> sync_batch_norm -> conv stride 2: the split-phase cases' net (small, as it is
// instantiated for a replica type of its own), with small_buckets_4 four buckets a step.
auto make_small_net(std::uint64_t seed) {
  return nn::sequential{
      probe{},
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1, .bias = false},
                        seed},
      nn::sync_batch_norm<float>{{.channels = 4}, seed + 1},
      nn::conv2d<float>{{.in_channels = 4, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1}, seed + 2}};
}
using small_net_type = decltype(make_small_net(0));
constexpr dist::gradient_reduction small_buckets_4{.bucket_bytes = 150, .first_bucket_bytes = 10};

// The number of entries of `log` equal to `what`.
std::size_t count_of(const std::vector<std::string>& log, const std::string& what) {
  return static_cast<std::size_t>(std::count(log.begin(), log.end(), what));
}

bool mentions(const std::exception& e, const std::string& what) {
  return std::string(e.what()).find(what) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(overlap)

BOOST_AUTO_TEST_CASE(overlapped_all_reduce_has_the_bits_of_the_blocking_one) {
  dist::gradient_reduction small_bfloat16 = small_buckets;
  small_bfloat16.compression = dist::gradient_compression::bfloat16;
  for (const int replicas : {2, 3}) {
    for (const auto& how : {dist::gradient_reduction{}, small_buckets, small_bfloat16}) {
      dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
      const auto blocking = train(s, false, how);
      const auto overlapped = train(s, true, how);
      BOOST_TEST((overlapped.parameters == blocking.parameters),
                 replicas << " replicas, bucket cap " << how.bucket_bytes);
      BOOST_TEST(overlapped.collectives == blocking.collectives);
      // Every parameter's gradient was announced before the first layer's backward: all buckets
      // had started while backward ran.
      BOOST_TEST(overlapped.started_early == overlapped.collectives);
      // ...each in its turn: backward finished the buckets in plan order.
      BOOST_TEST(overlapped.held_back == (std::vector<std::size_t>{0, 0, 0}));
      if (how.bucket_bytes == small_buckets.bucket_bytes) BOOST_TEST(blocking.collectives[0] > 3u);
    }
  }
}

BOOST_AUTO_TEST_CASE(bfloat16_gradients_track_float_ones) {
  // The same training with the gradients all-reduced as bfloat16: not the float run's bits (the
  // compression is in effect), within bfloat16's precision of them after a few steps, and the same
  // bits on every replica (train checks) and from run to run.
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  dist::gradient_reduction compressed = small_buckets;
  compressed.compression = dist::gradient_compression::bfloat16;
  const auto plain = train(s, false, small_buckets);
  const auto ours = train(s, false, compressed);
  BOOST_TEST(!(ours.parameters == plain.parameters));
  const double err = dist::test::relative_error_of<float>(ours.parameters, plain.parameters);
  BOOST_TEST(err < 2e-2, "bfloat16 gradients move the parameters " << err << " from float ones");
  BOOST_TEST_MESSAGE("3 replicas, 3 Adam steps: bfloat16 gradients' parameters differ from float ones by " << err);
  BOOST_TEST((train(s, false, compressed).parameters == ours.parameters));
}

BOOST_AUTO_TEST_CASE(the_compared_runs_train) {
  // Not a vacuous comparison: the steps move the parameters, under one device (where the overlap
  // does nothing) and over 3 replicas alike. (That replicas reach one device's parameters is the
  // equivalence suite's test of the blocking all-reduce, which the overlapped one equals bit for bit;
  // this net's residual-block biases, followed by instance norm, have gradients of rounding noise
  // that Adam turns into steps of its learning rate, so it is not the net to show it with.)
  auto initial_net = make_net(1234);
  const auto initial = parameters_of(initial_net);
  dist::one_device_strategy<> one;
  const auto reference = train(one, true, small_buckets);
  BOOST_TEST(reference.collectives == (std::vector<std::size_t>{0, 0, 0}));
  BOOST_TEST(dist::test::relative_error_of<float>(reference.parameters, initial) > 1e-3);
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  const auto ours = train(s, true, small_buckets);
  BOOST_TEST(dist::test::relative_error_of<float>(ours.parameters, initial) > 1e-3);
}

BOOST_AUTO_TEST_CASE(gradients_nobody_announces_are_all_reduced_by_wait) {
  // A model that is not a sequential: its gradients are never announced, so nothing starts before
  // wait, and wait still sums them all.
  using flat = two_tensors;
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto models = s.mirror([](auto&) { return flat{}; });
  auto started = s.run(
      [](dist::replica auto& r, flat& m) {
        for (std::size_t i = 0; i < m.g.size(); ++i)
          m.g[i] = static_cast<float>(r.replica_id() + 1) * static_cast<float>(i);
        for (std::size_t i = 0; i < m.g2.size(); ++i) m.g2[i] = static_cast<float>(r.replica_id() + 1);
        auto sync = r.overlap_gradients({.bucket_bytes = 1000, .first_bucket_bytes = 1000});
        sync.add(m);
        r.gradients_ready(m);  // a replica may also announce a whole model itself...
        const auto before = sync.started();
        return std::pair{before, sync.wait()};
      },
      models);
  for (auto [before, collectives] : started) {
    BOOST_TEST(before == 2u);  // ...which starts both buckets
    BOOST_TEST(collectives == 2u);
  }
  for (const auto& m : models) {
    for (std::size_t i = 0; i < m.g.size(); ++i) BOOST_REQUIRE(m.g[i] == 6.0f * static_cast<float>(i));
    for (float x : m.g2) BOOST_REQUIRE(x == 6.0f);
  }
  auto none = s.run(
      [](dist::replica auto& r, flat& m) {
        auto sync = r.overlap_gradients();
        sync.add(m);
        const auto before = sync.started();
        sync.wait();
        return before;
      },
      models);
  for (auto c : none) BOOST_TEST(c == 0u);
  for (const auto& m : models) BOOST_REQUIRE(m.g2[0] == 18.0f);
}

namespace {

// Two convolutions that run first -> second but enumerate their parameters second first: the bucket
// plan (reverse enumeration) holds `first` before `second`, while backward finishes `second` first.
// A container written so is correct (it announces each child as sequential does), only its buckets
// wait for their turn.
struct enumerated_backwards {
  using scalar_type = float;
  nn::conv2d<float> first{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1}, 5};
  nn::conv2d<float> second{{.in_channels = 4, .out_channels = 2, .kernel = 3, .stride = 1, .padding = 1}, 6};
  template <class R>
  tensor<float> forward(R& r, const tensor<float>& x) {
    return second.forward(r, first.forward(r, x));
  }
  template <class R>
  tensor<float> backward(R& r, const tensor<float>& dy) {
    auto d = second.backward(r, dy);
    r.gradients_ready(second);
    d = first.backward(r, d);
    r.gradients_ready(first);
    return d;
  }
  template <class F>
  void for_each_parameter(F&& f) {
    second.for_each_parameter(f);
    first.for_each_parameter(f);
  }
  void zero_grad() {
    first.zero_grad();
    second.zero_grad();
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(buckets_finished_out_of_plan_order_are_counted_and_still_sum_right) {
  // held_back() is what would tell a model that gains from buckets rebuilt in ready order: every
  // sequential gives 0 (overlapped_all_reduce_has_the_bits_of_the_blocking_one), this model does
  // not. Its results are still the blocking all-reduce's, bit for bit.
  using model = enumerated_backwards;
  // One bucket per tensor: first.w (144 B), first.b, second.w (288 B), second.b; the plan is
  // first.b, first.w, second.b, second.w, and backward finishes second's two before first's.
  const dist::gradient_reduction per_tensor{.bucket_bytes = 1, .first_bucket_bytes = 1};
  const auto data = data_for_step(0);
  std::vector<float> gradients[2];  // overlapped, blocking
  for (const bool overlap : {true, false}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
    auto models = s.mirror([](auto&) { return model{}; });
    auto xs = s.scatter(data.x, 36);
    const auto held = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, model& m) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 36;
          const tensor<float> x{shape::nchw(n, 1, 6, 6), xl};
          m.zero_grad();
          const auto y = m.forward(r, x);
          const auto loss = nn::mse(y, tensor<float>(y.shape()), global_batch);
          if (!overlap) {
            m.backward(r, loss.grad);
            return std::pair{std::size_t{0}, r.all_reduce_gradients(m, per_tensor)};
          }
          auto sync = r.overlap_gradients(per_tensor);
          sync.add(m);
          m.backward(r, loss.grad);
          const auto h = sync.held_back();
          return std::pair{h, sync.wait()};
        },
        xs, models);
    for (const auto& [h, buckets] : held) {
      BOOST_TEST(buckets == 4u);
      // second.b and second.w were final while first.b, the plan's first bucket, still waited.
      BOOST_TEST(h == (overlap ? 2u : 0u));
    }
    auto& g = gradients[overlap ? 0 : 1];
    models[0].for_each_parameter([&](std::span<float>, std::span<float> d) { g.insert(g.end(), d.begin(), d.end()); });
    BOOST_TEST(std::any_of(g.begin(), g.end(), [](float v) { return v != 0.0f; }));
  }
  BOOST_TEST((gradients[0] == gradients[1]), "the overlapped all-reduce's gradients are the blocking one's");
}

namespace {

// What replica `r` says when it all-reduces `v` in capture mode `mode` (empty: it ran), the mode
// restored after.
template <class R>
std::string all_reduce_refusal(R& r, dist::graph_capture mode, std::vector<float>& v) {
  const auto was = r.set_graph_capture(mode);
  std::string why;
  try {
    r.all_reduce(dist::reduce_op::sum, v);
  } catch (const dist::graph_capture_error& e) {
    why = e.what();
  }
  r.set_graph_capture(was);
  return why;
}

}  // namespace

BOOST_AUTO_TEST_CASE(capture_modes_decide_what_collectives_and_announcements_do) {
  // While a replica's stream is captured into a CUDA graph (nn::graphed and nn::graphed_step set the
  // mode; here it is set by hand on CPU replicas): a model's passes refuse collectives; a whole step
  // refuses them where the communicator cannot capture them (every CPU one; NCCL can), on every
  // replica alike and before anything is issued, so nothing hangs; gradient announcements are held
  // back (the overlap's wait all-reduces those buckets). Without a capture all runs as usual.
  using flat = two_tensors;
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto models = s.mirror([](auto&) { return flat{}; });
  struct seen {
    dist::graph_capture before = dist::graph_capture::step;
    std::string passes, step;
    float sum = 0;
    std::size_t held = 9, released = 0;
  };
  auto out = s.run(
      [](dist::replica auto& r, flat& m) {
        seen x;
        std::vector<float> v{1.0f};
        x.before = r.graph_capture_mode();
        x.passes = all_reduce_refusal(r, dist::graph_capture::passes, v);
        x.step = all_reduce_refusal(r, dist::graph_capture::step, v);
        r.all_reduce(dist::reduce_op::sum, v);
        x.sum = v[0];
        auto sync = r.overlap_gradients({.bucket_bytes = 1000, .first_bucket_bytes = 1000});
        sync.add(m);
        r.set_graph_capture(dist::graph_capture::step);
        r.gradients_ready(m);
        x.held = sync.started();
        r.set_graph_capture(dist::graph_capture::none);
        r.gradients_ready(m);
        x.released = sync.started();
        sync.wait();
        return x;
      },
      models);
  for (const auto& x : out) {
    BOOST_TEST((x.before == dist::graph_capture::none));
    BOOST_TEST(dist::test::mentions(x.passes, "while its passes were being captured"), x.passes);
    BOOST_TEST(dist::test::mentions(x.step, "cannot be captured"), x.step);
    BOOST_TEST(x.sum == 2.0f);
    BOOST_TEST(x.held == 0u);
    BOOST_TEST(x.released == 2u);
  }
  // A group of one has nothing to wait for: its collectives may go into a whole-step graph.
  dist::mirrored_strategy<> one{dist::cpu_replicas(1)};
  const auto alone = one.run([](dist::replica auto& r) {
    std::vector<float> v{3.0f};
    const auto why = all_reduce_refusal(r, dist::graph_capture::step, v);
    return std::pair{why, v[0]};
  });
  BOOST_TEST(alone[0].first == "");
  BOOST_TEST(alone[0].second == 3.0f);
}

BOOST_AUTO_TEST_CASE(collectives_called_while_open_take_their_turn) {
  // A program's own collective between add and wait goes through the overlap's queue, after the
  // buckets already started, and returns its result as usual.
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto nets = s.mirror([](auto&) { return make_net(7); });
  const auto data = data_for_step(0);
  auto xs = s.scatter(data.x, 36);
  auto totals = s.run(
      [&](dist::replica auto& r, const std::vector<float>& xl, net_type& net) {
        const auto n = static_cast<std::int64_t>(xl.size()) / 36;
        const tensor<float> x{shape::nchw(n, 1, 6, 6), xl};
        net.zero_grad();
        auto y = net.forward(r, x);
        auto sync = r.overlap_gradients(small_buckets);
        sync.add(net);
        net.backward(r, y);
        const float total = r.all_reduce(dist::reduce_op::sum, static_cast<float>(r.replica_id() + 1));
        std::vector<int> ids(2);
        r.all_gather(std::vector<int>{r.replica_id()}, ids);
        sync.wait();
        return std::pair{total, ids};
      },
      xs, nets);
  for (const auto& [total, ids] : totals) {
    BOOST_TEST(total == 3.0f);
    BOOST_TEST((ids == std::vector<int>{0, 1}));
  }
}

BOOST_AUTO_TEST_CASE(one_overlap_at_a_time_per_replica) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto nets = s.mirror([](auto&) { return make_net(7); });
  // What each replica's misuse said (asserted here, on the test's thread).
  auto errors = s.run(
      [&](dist::replica auto& r, net_type& net) {
        std::vector<std::string> said;
        auto error_of = [&](auto&& f) {
          try {
            f();
            said.push_back("(nothing)");
          } catch (const std::exception& e) {
            said.push_back(e.what());
          }
        };
        {
          auto first = r.overlap_gradients();
          error_of([&] { auto again = r.overlap_gradients(); });
          first.add(net);
          first.wait();
          error_of([&] { first.add(net); });
        }
        auto second = r.overlap_gradients();  // the first one is closed
        error_of([&] { second.add(net).add(net); });
        return said;
      },
      nets);
  for (const auto& said : errors) {
    BOOST_REQUIRE(said.size() == 3u);
    BOOST_TEST(said[0].find("another is open") != std::string::npos, said[0]);
    BOOST_TEST(said[1].find("add after wait") != std::string::npos, said[1]);
    BOOST_TEST(said[2].find("already holds") != std::string::npos, said[2]);
  }
}

BOOST_AUTO_TEST_CASE(a_replica_that_throws_in_backward_ends_the_step_without_a_hang) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(3), {.timeout = std::chrono::seconds(30)}};
  auto nets = s.mirror([](auto&) { return make_net(7); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  const auto data = data_for_step(0);
  auto xs = s.scatter(data.x, 36);
  auto ys = s.scatter(data.y, 18);
  auto step = [&](bool fail) {
    return s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, net_type& net,
            optim::adam<float>& opt) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 36;
          const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
          net.zero_grad();
          const auto loss = nn::mse(net.forward(r, x), y, global_batch);
          auto sync = r.overlap_gradients(small_buckets);
          sync.add(net);
          net.get<0>().on_backward = [fail](int id) {
            if (fail && id == 1) throw std::runtime_error("replica 1 gave up in backward");
          };
          net.backward(r, loss.grad);
          sync.wait();
          opt.step(net);
          return loss.value;
        },
        xs, ys, nets, opts);
  };
  const auto t0 = std::chrono::steady_clock::now();
  BOOST_CHECK_EXCEPTION(step(true), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "replica 1 gave up in backward"); });
  const bool quick = std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10);
  BOOST_TEST(quick, "the failure was not waited out");
  // The strategy is usable again: a clean step runs, and the copies agree after a broadcast.
  s.broadcast(nets, 0);
  s.broadcast(opts, 0);
  const auto losses = step(false);
  BOOST_TEST(std::isfinite(s.reduce(dist::reduce_op::sum, losses)));
  s.verify_mirrored(nets);
}

BOOST_AUTO_TEST_CASE(mismatched_buckets_fail_every_replica_from_wait) {
  // Replicas that add models of different sizes: the first bucket's collective is a mismatch, which
  // reaches the caller from wait (thrown on the overlap's thread), naming the gradient all-reduce.
  using flat = one_tensor;
  dist::mirrored_strategy<> s{dist::cpu_replicas(2), {.timeout = std::chrono::seconds(30)}};
  auto models = s.values_from_function(
      [](int id) { return flat{std::vector<float>(10 + 5 * id), std::vector<float>(10 + 5 * id)}; });
  BOOST_CHECK_EXCEPTION(s.run(
                            [](dist::replica auto& r, flat& m) {
                              auto sync = r.overlap_gradients();
                              sync.add(m);
                              r.gradients_ready(m);
                              sync.wait();
                            },
                            models),
                        dist::collective_mismatch,
                        [](const dist::collective_mismatch& e) { return mentions(e, "all_reduce_gradients"); });
}

BOOST_AUTO_TEST_CASE(a_split_phase_communicator_starts_buckets_in_backward_and_finishes_them_in_wait) {
  // The path a GPU replica's NCCL takes, run on the CPU: buckets start from the replica's own thread
  // as backward announces them (no communication thread), a collective called while some are pending
  // (sync_batch_norm's, inside backward) first finishes them, `wait` finishes the rest, and the
  // parameters have the bits of the blocking all-reduce through the same communicator.
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto run = [&](bool overlap, std::vector<std::vector<std::string>>& logs, std::vector<std::size_t>& early) {
    auto nets = s.mirror([](auto&) { return make_small_net(1234); });
    auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
    logs.assign(2, {});
    early.assign(2, 0);
    for (int step = 0; step < 2; ++step) {
      const auto data = data_for_step(step);
      auto xs = s.scatter(data.x, 36);
      auto ys = s.scatter(data.y, 18);
      s.run(
          [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, small_net_type& net,
              optim::adam<float>& opt) {
            using R = std::remove_cvref_t<decltype(r)>;
            using C = typename R::communicator_type;
            auto& log = logs[static_cast<std::size_t>(r.replica_id())];
            dist::replica_context<typename R::device_type, split_phase_log<C>> rs{r.device(), {r.communicator(), &log}};
            const auto n = static_cast<std::int64_t>(xl.size()) / 36;
            const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
            net.zero_grad();
            const auto loss = nn::mse(net.forward(rs, x), y, global_batch);
            if (overlap) {
              auto sync = rs.overlap_gradients(small_buckets_4);
              sync.add(net);
              net.get<0>().on_backward = [&](int id) { early[static_cast<std::size_t>(id)] = count_of(log, "start"); };
              net.backward(rs, loss.grad);
              net.get<0>().on_backward = nullptr;
              log.push_back("wait");
              sync.wait();
            } else {
              net.backward(rs, loss.grad);
              rs.all_reduce_gradients(net, small_buckets_4);
            }
            opt.step(net);
          },
          xs, ys, nets, opts);
    }
    s.verify_mirrored(nets);
    return parameters_of(nets[0]);
  };
  std::vector<std::vector<std::string>> blocking_log, overlap_log;
  std::vector<std::size_t> unused, early;
  const auto blocking = run(false, blocking_log, unused);
  const auto overlapped = run(true, overlap_log, early);
  BOOST_TEST((overlapped == blocking));
  for (std::size_t id = 0; id < 2; ++id) {
    const auto& log = overlap_log[id];
    BOOST_TEST_INFO("replica " << id);
    // No collective ever ran with started all-reduces pending.
    BOOST_TEST(std::none_of(log.begin(), log.end(),
                            [](const std::string& e) { return e.find("pending") != std::string::npos; }));
    BOOST_TEST(count_of(log, "abandon 1") + count_of(log, "abandon 2") == 0u);
    // Every bucket of the last step started before the first layer's backward; wait finished the
    // last ones, sync_batch_norm's backward collectives what had started before them.
    // The same collectives as the blocking run: its gradient all-reduces became starts.
    const auto starts = count_of(log, "start");
    BOOST_TEST(starts > 6u);
    BOOST_TEST(starts + count_of(log, "all_reduce") == count_of(blocking_log[id], "all_reduce"));
    BOOST_TEST(early[id] == starts);
    const auto wait = std::find(log.rbegin(), log.rend(), "wait");
    BOOST_REQUIRE(wait != log.rend());
    BOOST_TEST((wait != log.rbegin() && (wait - 1)->starts_with("finish ")), "wait finished what was started");
    BOOST_TEST(std::any_of(log.begin(), wait.base(), [](const std::string& e) { return e.starts_with("finish "); }),
               "a collective inside backward finished the buckets started before it");
  }
}

BOOST_AUTO_TEST_CASE(a_replica_that_throws_with_started_all_reduces_abandons_them) {
  // Replica 1 throws in its first layer's backward, after every bucket started: the overlap's
  // destructor abandons them (NCCL aborts its communicator there); replica 0 fails in wait.
  dist::mirrored_strategy<> s{dist::cpu_replicas(2), {.timeout = std::chrono::seconds(30)}};
  auto nets = s.mirror([](auto&) { return make_small_net(7); });
  const auto data = data_for_step(0);
  auto xs = s.scatter(data.x, 36);
  std::vector<std::vector<std::string>> logs(2);
  BOOST_CHECK_EXCEPTION(
      s.run(
          [&](dist::replica auto& r, const std::vector<float>& xl, small_net_type& net) {
            using R = std::remove_cvref_t<decltype(r)>;
            auto& log = logs[static_cast<std::size_t>(r.replica_id())];
            dist::replica_context<typename R::device_type, split_phase_log<typename R::communicator_type>> rs{
                r.device(), {r.communicator(), &log}};
            const auto n = static_cast<std::int64_t>(xl.size()) / 36;
            const tensor<float> x{shape::nchw(n, 1, 6, 6), xl};
            net.zero_grad();
            auto y = net.forward(rs, x);
            auto sync = rs.overlap_gradients(small_buckets_4);
            sync.add(net);
            net.get<0>().on_backward = [](int id) {
              if (id == 1) throw std::runtime_error("replica 1 gave up in backward");
            };
            net.backward(rs, y);
            sync.wait();
          },
          xs, nets),
      std::runtime_error, [](const std::runtime_error& e) { return mentions(e, "replica 1 gave up in backward"); });
  BOOST_TEST(logs[1].back().starts_with("abandon "), "last entry of replica 1: " << logs[1].back());
  BOOST_TEST(count_of(logs[1], "wait") == 0u);
}

BOOST_AUTO_TEST_CASE(compute_gradients_overlaps_the_last_micro_batch) {
  for (const int parts : {1, 3}) {
    std::vector<std::vector<float>> results;
    for (const bool overlap : {false, true}) {
      dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
      auto nets = s.mirror([](auto&) { return make_net(99); });
      const auto data = data_for_step(1);
      auto xs = s.scatter(data.x, 36);
      auto ys = s.scatter(data.y, 18);
      s.run(
          [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, net_type& net) {
            const auto n = static_cast<std::int64_t>(xl.size()) / 36;
            const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
            net.zero_grad();
            nn::compute_gradients(
                r, net, x, y, [](auto&, const auto& p, const auto& t, std::int64_t b) { return nn::mse(p, t, b); },
                global_batch, {.micro_batches = parts, .overlap = overlap, .reduction = small_buckets});
          },
          xs, ys, nets);
      std::vector<float> grads;
      nets[0].for_each_parameter(
          [&](std::span<float>, std::span<float> g) { grads.insert(grads.end(), g.begin(), g.end()); });
      results.push_back(grads);
    }
    BOOST_TEST((results[0] == results[1]), parts << " micro-batches");
  }
}

BOOST_AUTO_TEST_CASE(under_one_device_nothing_runs) {
  dist::one_device_strategy<> s;
  auto nets = s.mirror([](auto&) { return make_net(7); });
  auto counts = s.run(
      [](dist::replica auto& r, net_type& net) {
        auto sync = r.overlap_gradients();
        sync.add(net);
        return std::pair{sync.started(), sync.wait()};
      },
      nets);
  BOOST_TEST(counts[0].first == 0u);
  BOOST_TEST(counts[0].second == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
