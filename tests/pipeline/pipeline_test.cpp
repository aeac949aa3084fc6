// Pipeline parallelism in one process: schedules, micro-batches, a pipelined step against one device
// over the whole batch (2 and 4 stages, both schedules, uneven micro-batches), the stage x copy mesh,
// and the failures: a stage that throws, a stage that never sends.

#include "pipeline_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dist = distribute;
namespace pt = distribute::pipeline_test;
using namespace std::chrono_literals;
using dist::pipeline_op;
using dist::pipeline_schedule;

BOOST_AUTO_TEST_SUITE(pipeline_schedules)

BOOST_AUTO_TEST_CASE(gpipe_runs_every_forward_then_every_backward_in_order) {
  const auto ops = dist::schedule_of(pipeline_schedule::gpipe, 1, 4, 3);
  using p = pipeline_op::pass;
  const std::vector<pipeline_op> expected{{p::forward, 0},  {p::forward, 1},  {p::forward, 2},
                                          {p::backward, 0}, {p::backward, 1}, {p::backward, 2}};
  BOOST_TEST((ops == expected));
}

BOOST_AUTO_TEST_CASE(one_f_one_b_fills_alternates_and_drains) {
  using p = pipeline_op::pass;
  // Stage 0 of 4 over 6: three forwards, then F3 B0 F4 B1 F5 B2, then B3 B4 B5.
  const auto first = dist::schedule_of(pipeline_schedule::one_f_one_b, 0, 4, 6);
  const std::vector<pipeline_op> expected{{p::forward, 0},  {p::forward, 1},  {p::forward, 2},  {p::forward, 3},
                                          {p::backward, 0}, {p::forward, 4},  {p::backward, 1}, {p::forward, 5},
                                          {p::backward, 2}, {p::backward, 3}, {p::backward, 4}, {p::backward, 5}};
  BOOST_TEST((first == expected));
  // The last stage alternates from the start.
  const auto last = dist::schedule_of(pipeline_schedule::one_f_one_b, 3, 4, 2);
  const std::vector<pipeline_op> alternating{{p::forward, 0}, {p::backward, 0}, {p::forward, 1}, {p::backward, 1}};
  BOOST_TEST((last == alternating));
}

BOOST_AUTO_TEST_CASE(every_schedule_runs_each_pass_once_in_order_and_bounds_what_it_keeps) {
  for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    for (int stages : {1, 2, 3, 4, 8}) {
      for (int m : {0, 1, 2, 3, 4, 7, 16}) {
        for (int s = 0; s < stages; ++s) {
          const auto ops = dist::schedule_of(schedule, s, stages, m);
          BOOST_TEST_REQUIRE(ops.size() == 2 * static_cast<std::size_t>(m));
          int next_f = 0, next_b = 0, live = 0, peak = 0;
          for (const auto& op : ops) {
            if (op.kind == pipeline_op::pass::forward) {
              BOOST_TEST_REQUIRE(op.micro_batch == next_f++);
              peak = std::max(peak, ++live);
            } else {
              BOOST_TEST_REQUIRE(op.micro_batch == next_b++);
              BOOST_TEST_REQUIRE(op.micro_batch < next_f);  // its forward ran before
              --live;
            }
          }
          const int bound = schedule == pipeline_schedule::gpipe ? m : std::min(m, stages - s);
          BOOST_TEST(peak == bound, dist::to_string(schedule) << " stage " << s << " of " << stages << ", m " << m);
        }
      }
    }
  }
  BOOST_CHECK_THROW(dist::schedule_of(pipeline_schedule::gpipe, 2, 2, 1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(the_ideal_bubble_is_the_formula) {
  BOOST_TEST(dist::ideal_bubble(4, 4) == 3.0 / 7.0);
  BOOST_TEST(dist::ideal_bubble(1, 8) == 0.0);
  BOOST_TEST(dist::ideal_bubble(2, 16) == 1.0 / 17.0);
}

BOOST_AUTO_TEST_CASE(micro_batches_are_as_even_as_possible_and_never_empty) {
  using dist::micro_batch_sizes;
  BOOST_TEST(micro_batch_sizes(8, 3) == (std::vector<std::int64_t>{3, 3, 2}), boost::test_tools::per_element());
  BOOST_TEST(micro_batch_sizes(2, 4) == (std::vector<std::int64_t>{1, 1}), boost::test_tools::per_element());
  BOOST_TEST(micro_batch_sizes(0, 4).empty());
  BOOST_CHECK_THROW(micro_batch_sizes(4, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pipeline_equivalence)

// A pipelined step equals one device over the whole batch, bit for bit, with the split-independent
// reference engine: 2 and 4 stages, both schedules, micro-batch counts that split 8 examples evenly,
// unevenly, one per example, and more micro-batches than examples.
BOOST_AUTO_TEST_CASE(a_pipelined_step_is_one_device_over_the_whole_batch_bit_for_bit) {
  constexpr int batch = 8, steps = 2;
  for (int stages : {2, 4}) {
    const auto expected = pt::one_device_run(stages, batch, steps);
    for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
      for (int m : {1, 3, 8, 11}) {
        const auto got =
            pt::pipelined_run(stages, /*copies=*/1, batch, steps, {.micro_batches = m, .schedule = schedule});
        const std::string what = std::to_string(stages) + " stages, " + dist::to_string(schedule) + ", " +
                                 std::to_string(m) + " micro-batches";
        BOOST_TEST_REQUIRE(got.parameters.size() == expected.parameters.size(), what);
        for (std::size_t k = 0; k < got.parameters.size(); ++k)
          BOOST_TEST_REQUIRE(pt::bit_equal(got.parameters[k], expected.parameters[k]), what << ": stage " << k);
        for (std::size_t i = 0; i < got.losses.size(); ++i)
          BOOST_TEST(got.losses[i] == expected.losses[i], boost::test_tools::tolerance(1e-6) << what);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(under_one_device_the_pipeline_is_the_plain_step) {
  const auto expected = pt::one_device_run(3, 6, 2);
  for (int m : {1, 4}) {
    const auto got = pt::one_device_pipelined_run(3, 6, 2, {.micro_batches = m});
    for (std::size_t k = 0; k < got.parameters.size(); ++k)
      BOOST_TEST_REQUIRE(pt::bit_equal(got.parameters[k], expected.parameters[k]));
  }
}

// Stages x copies: each stage's gradients are summed over its copies only. The copies' sums are
// grouped differently from one device's, so they agree to float rounding.
BOOST_AUTO_TEST_CASE(the_hybrid_of_stages_and_copies_is_one_device) {
  const auto expected = pt::one_device_run(2, 8, 3);
  for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    const auto got = pt::pipelined_run(2, /*copies=*/2, 8, 3, {.micro_batches = 2, .schedule = schedule});
    for (std::size_t k = 0; k < got.parameters.size(); ++k)
      BOOST_TEST(pt::max_relative_difference(got.parameters[k], expected.parameters[k]) < 1e-5, "stage " << k);
    BOOST_TEST(got.copies_agree);
  }
  // Copies of the whole model (each replica holds every stage): data parallelism.
  const auto data_parallel = pt::pipelined_run(2, /*copies=*/2, 8, 3, {.micro_batches = 2}, /*one_position=*/true);
  for (std::size_t k = 0; k < data_parallel.parameters.size(); ++k)
    BOOST_TEST(pt::max_relative_difference(data_parallel.parameters[k], expected.parameters[k]) < 1e-5);
}

BOOST_AUTO_TEST_CASE(the_default_engine_agrees_within_float_rounding) {
  const auto expected = pt::one_device_run(2, 8, 2, /*reference=*/false);
  const auto got = pt::pipelined_run(2, 1, 8, 2, {.micro_batches = 4}, false, /*reference=*/false);
  for (std::size_t k = 0; k < got.parameters.size(); ++k)
    BOOST_TEST(pt::max_relative_difference(got.parameters[k], expected.parameters[k]) < 1e-4);
}

BOOST_AUTO_TEST_CASE(predict_gives_the_last_stage_the_whole_output) {
  for (int stages : {1, 2, 4}) {
    pt::with_stages(stages, [&](auto n) {
      auto s = pt::reference_strategy(stages);
      auto model = pt::make_pipeline<decltype(n)::value>(s, {.micro_batches = 3});
      const auto x = pt::inputs(7, 1);
      auto outs = s.run([&](auto& r) { return model.predict(r, x); });
      const auto expected = pt::one_device_forward(stages, x);
      BOOST_TEST(pt::bit_equal(outs[static_cast<std::size_t>(stages - 1)].values(), expected.values()));
      for (int r = 0; r + 1 < stages; ++r) BOOST_TEST(outs[static_cast<std::size_t>(r)].empty());
    });
  }
}

BOOST_AUTO_TEST_CASE(one_f_one_b_keeps_fewer_inputs_than_gpipe) {
  auto peak = [](pipeline_schedule schedule) {
    auto s = pt::reference_strategy(4);
    auto model = pt::make_pipeline<4>(s, {.micro_batches = 8, .schedule = schedule});
    const auto x = pt::inputs(8, 2), y = pt::targets(8, 2);
    auto results = s.run([&](auto& r) { return model.train_step(r, x, y, pt::mse_loss{}, 8); });
    return results[0];
  };
  const auto gpipe = peak(pipeline_schedule::gpipe), one_f_one_b = peak(pipeline_schedule::one_f_one_b);
  // Stage 0 keeps all 8 micro-batch inputs under GPipe, at most 4 under 1F1B.
  BOOST_TEST(gpipe.peak_kept_bytes == 8 * pt::micro_batch_input_bytes);
  BOOST_TEST(one_f_one_b.peak_kept_bytes == 4 * pt::micro_batch_input_bytes);
  BOOST_TEST(gpipe.micro_batches == 8);
}

BOOST_AUTO_TEST_CASE(a_batch_without_examples_runs_no_micro_batches) {
  auto s = pt::reference_strategy(2);
  auto model = pt::make_pipeline<2>(s, {.micro_batches = 4});
  const dist::tensor<float> none{dist::shape::nchw(0, pt::channels, pt::side, pt::side)};
  auto results = s.run([&](auto& r) { return model.train_step(r, none, none, pt::mse_loss{}, 1); });
  BOOST_TEST(results[0].micro_batches == 0);
  BOOST_TEST(results[1].micro_batches == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(pipeline_failures)

BOOST_AUTO_TEST_CASE(a_stage_that_throws_ends_the_step_with_its_exception) {
  for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    for (int failing : {0, 1, 3}) {
      auto s = pt::reference_strategy(4, 60s);
      pt::fault fault{.stage = failing, .micro_batch = 2, .kind = pt::fault::throws};
      auto model = pt::make_pipeline<4>(s, {.micro_batches = 4, .schedule = schedule}, &fault);
      const auto x = pt::inputs(8, 1), y = pt::targets(8, 1);
      const auto started = std::chrono::steady_clock::now();
      try {
        s.run([&](auto& r) { return model.train_step(r, x, y, pt::mse_loss{}, 8); });
        BOOST_FAIL("the step did not fail");
      } catch (const std::runtime_error& e) {
        BOOST_TEST(std::string(e.what()) == "stage " + std::to_string(failing) + " failed on micro-batch 2");
      }
      BOOST_TEST((std::chrono::steady_clock::now() - started < 20s));
      // The next step runs.
      fault.kind = pt::fault::none;
      auto ok = s.run([&](auto& r) { return model.train_step(r, x, y, pt::mse_loss{}, 8); });
      BOOST_TEST(ok[3].micro_batches == 4);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_stage_that_never_sends_times_out_naming_both_stages) {
  auto s = pt::reference_strategy(2, 300ms);
  pt::fault fault{.stage = 0, .micro_batch = 1, .kind = pt::fault::stalls, .stall = 1500ms};
  auto model = pt::make_pipeline<2>(s, {.micro_batches = 2}, &fault);
  const auto x = pt::inputs(4, 1), y = pt::targets(4, 1);
  try {
    s.run([&](auto& r) { return model.train_step(r, x, y, pt::mse_loss{}, 4); });
    BOOST_FAIL("the step did not fail");
  } catch (const dist::collective_timeout& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("replica 1 timed out after 300 ms") != std::string::npos, msg);
    BOOST_TEST(msg.find("from pipeline activations, stage 0 to stage 1") != std::string::npos, msg);
    BOOST_TEST(msg.find("that replica 0 never sent") != std::string::npos, msg);
  }
}

BOOST_AUTO_TEST_CASE(a_placement_that_does_not_fit_the_replicas_is_refused) {
  auto s = pt::reference_strategy(3);
  try {
    auto model = pt::make_pipeline<2>(s, {.copies = 1});
    BOOST_FAIL("no error");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find(
                   "2 stages x 1 copies needs 2 replicas (or 1, each holding every stage); the strategy has 3") !=
                   std::string::npos,
               e.what());
  }
  BOOST_CHECK_THROW(pt::make_pipeline<3>(s, {.micro_batches = 0}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {
// y = w x over every element; its forward state (the input) can be set aside and taken back.
class scale_stage {
 public:
  using scalar_type = float;
  using device_type = dist::cpu;
  using tensor_type = dist::tensor<float>;
  explicit scale_stage(float w) : w_{dist::shape{1}, std::vector<float>{w}}, g_{dist::shape{1}} {}

  template <class R>
  tensor_type forward(R&, const tensor_type& x) {
    x_ = x;
    tensor_type y = x;
    for (auto& v : y) v *= w_[0];
    return y;
  }
  template <class R>
  tensor_type backward(R&, const tensor_type& dy) {
    if (dy.shape() != x_.shape()) throw std::logic_error("backward of another micro-batch's forward");
    tensor_type dx = dy;
    for (std::size_t i = 0; i < dy.size(); ++i) {
      g_[0] += dy[i] * x_[i];
      dx[i] *= w_[0];
    }
    return dx;
  }
  tensor_type stash() { return std::move(x_); }
  void restore(tensor_type x) { x_ = std::move(x); }
  template <class F>
  void for_each_parameter(F&& f) {
    f(w_.values(), g_.values());
  }
  void zero_grad() { g_.fill(0); }
  void set_training(bool) {}

 private:
  tensor_type w_, g_, x_;
};
static_assert(dist::stashable_stage<scale_stage>);
}  // namespace

BOOST_AUTO_TEST_SUITE(pipeline_equivalence)

BOOST_AUTO_TEST_CASE(a_stashable_stage_is_not_run_again) {
  // Micro-batches of different sizes: a backward given another micro-batch's state would throw.
  for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    auto s = pt::reference_strategy(3);
    auto make = [](float w) { return [w](const dist::cpu&) { return scale_stage(w); }; };
    dist::pipeline model(s, {.micro_batches = 4, .schedule = schedule}, make(0.5f), make(2.0f), make(-1.5f));
    const auto x = pt::inputs(7, 0), y = pt::targets(7, 0);
    auto results = s.run([&](auto& r) { return model.train_step(r, x, y, pt::mse_loss{}, 7); });
    for (const auto& result : results) BOOST_TEST(result.recomputed == 0);
    // Stage 0 keeps the stashes (its inputs), not the inputs as well: all 7 examples under GPipe, the
    // first three micro-batches (2 + 2 + 2 examples) under 1F1B.
    const std::size_t examples = schedule == pipeline_schedule::gpipe ? 7 : 6;
    BOOST_TEST(results[0].peak_kept_bytes == examples * pt::micro_batch_input_bytes);
    // The gradients against the chain on one device.
    std::vector<scale_stage> chain{scale_stage(0.5f), scale_stage(2.0f), scale_stage(-1.5f)};
    auto local = dist::nn::local();
    dist::tensor<float> a = x;
    for (auto& st : chain) a = st.forward(local, a);
    auto l = dist::nn::mse(local, a, y, 7);
    dist::tensor<float> d = l.grad;
    for (int k = 2; k >= 0; --k) d = chain[static_cast<std::size_t>(k)].backward(local, d);
    auto grads = s.run([&](auto& r) { return pt::gradients_of(model.local(r)); });
    for (int k = 0; k < 3; ++k)
      BOOST_TEST(grads[static_cast<std::size_t>(k)][0] == pt::gradients_of(chain[static_cast<std::size_t>(k)])[0],
                 boost::test_tools::tolerance(1e-5f));
  }
}

BOOST_AUTO_TEST_SUITE_END()
