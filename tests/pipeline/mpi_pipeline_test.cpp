// Pipeline parallelism with stages as MPI workers (one replica each), under mpiexec: a pipelined step
// equals one device over the whole batch (bit for bit with the split-independent reference engine),
// for both schedules; with 4 workers also 4 stages, and the hybrid of 2 stages x 2 copies.

#define BOOST_TEST_MODULE distribute_pipeline_mpi
#ifndef BOOST_TEST_DYN_LINK
#  define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>

#include "pipeline_test_support.hpp"

#include <distribute/comm/mpi.hpp>
#include <distribute/strategy/multi_worker_mirrored_strategy.hpp>
#include <distribute/tensor/micro_batches.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace dist = distribute;
namespace pt = distribute::pipeline_test;
using dist::pipeline_schedule;

namespace {

using strategy_type = dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi>;

strategy_type make_strategy() {
  dist::comm::mpi_options o;
  o.collectives.timeout = std::chrono::seconds(30);
  o.abort_grace = std::chrono::seconds(2);
  strategy_type s{{.local_replicas = 1, .mpi = o}};
  s.set_compute_options(pt::reference_engine());
  return s;
}

// This worker's stage parameters after `steps` pipelined steps (copy c trains on its share of each
// batch), and the losses summed over the job.
template <int N>
pt::run_result run_on_workers(strategy_type& s, int copies, std::int64_t batch, int steps, dist::pipeline_options o) {
  o.copies = copies;
  auto model = pt::make_pipeline<N>(s, o);
  dist::optim::adam<> opt({.lr = pt::learning_rate});
  pt::run_result out;
  for (int t = 0; t < steps; ++t) {
    const auto x = pt::inputs(batch, t), y = pt::targets(batch, t);
    auto losses = s.run([&](auto& r) {
      const int c = model.copy_of(r.replica_id());
      const std::int64_t lo = batch * c / copies, hi = batch * (c + 1) / copies;
      auto result = model.train_step(r, dist::batch_slice(x, lo, hi - lo), dist::batch_slice(y, lo, hi - lo),
                                     pt::mse_loss{}, batch);
      opt.step(r, model.local(r));
      return result.loss;
    });
    out.losses.push_back(s.reduce(dist::reduce_op::sum, losses));
  }
  out.parameters.push_back(s.run([&](auto& r) { return pt::parameters_of(model.local(r)); })[0]);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(pipeline_mpi)

BOOST_AUTO_TEST_CASE(stages_as_workers_equal_one_device_bit_for_bit) {
  auto s = make_strategy();
  const int workers = s.num_workers();
  const int stage = s.worker_index();
  auto check = [&](auto n) {
    constexpr int N = decltype(n)::value;
    const auto expected = pt::one_device_run(N, 8, 2);
    for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
      for (int m : {1, 3, 8}) {
        const auto got = run_on_workers<N>(s, 1, 8, 2, {.micro_batches = m, .schedule = schedule});
        BOOST_TEST(pt::bit_equal(got.parameters[0], expected.parameters[static_cast<std::size_t>(stage)]),
                   N << " stages, " << dist::to_string(schedule) << ", " << m << " micro-batches: stage " << stage);
        for (std::size_t t = 0; t < got.losses.size(); ++t)
          BOOST_TEST(got.losses[t] == expected.losses[t], boost::test_tools::tolerance(1e-6));
      }
    }
  };
  if (workers == 2) check(std::integral_constant<int, 2>{});
  else if (workers == 4) check(std::integral_constant<int, 4>{});
  else BOOST_TEST_MESSAGE("run with 2 or 4 workers");
}

BOOST_AUTO_TEST_CASE(the_hybrid_of_2_stages_x_2_copies_across_workers_is_one_device) {
  auto s = make_strategy();
  if (s.num_workers() != 4) return;
  const auto expected = pt::one_device_run(2, 8, 3);
  for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    const auto got = run_on_workers<2>(s, 2, 8, 3, {.micro_batches = 2, .schedule = schedule});
    const int stage = s.worker_index() % 2;
    BOOST_TEST(
        pt::max_relative_difference(got.parameters[0], expected.parameters[static_cast<std::size_t>(stage)]) < 1e-5,
        "worker " << s.worker_index());
    // The copies of a stage hold the same bits.
    auto mine = got.parameters[0];
    auto other = mine;
    auto partner = s.communicator().split(stage, s.worker_index());
    partner.broadcast(std::span<float>(other), 0);
    BOOST_TEST(pt::bit_equal(mine, other));
  }
}

BOOST_AUTO_TEST_SUITE_END()
