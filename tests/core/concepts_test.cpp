// Conformance of every concrete type to the concepts it claims, checked at compile time, and the
// vocabulary types (reduce_op, dtype) checked at run time.

#include "test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <span>
#include <string>
#include <vector>

namespace dist = distribute;

static_assert(dist::device<dist::cpu>);
static_assert(dist::communicator<dist::comm::local>);
static_assert(dist::communicator<dist::comm::shared_memory>);
static_assert(dist::replica<dist::one_device_strategy<dist::cpu>::replica_type>);
static_assert(dist::replica<dist::mirrored_strategy<dist::cpu>::replica_type>);
static_assert(dist::replica<dist::mirrored_strategy<dist::cpu>::primary_replica_type>);
static_assert(dist::strategy<dist::one_device_strategy<dist::cpu>>);
static_assert(dist::strategy<dist::mirrored_strategy<dist::cpu>>);
static_assert(dist::distributed_dataset<std::vector<dist::per_replica<std::vector<float>>>>);

// What must not conform, does not.
static_assert(!dist::device<int>);
static_assert(!dist::communicator<dist::cpu>);
static_assert(!dist::replica<dist::cpu>);
static_assert(!dist::strategy<dist::comm::local>);
static_assert(!dist::distributed_dataset<std::vector<std::vector<float>>>);
static_assert(!dist::element<char>);
static_assert(!dist::element<std::string>);

// Per-replica and mirrored values are distinct types; under one device they hold their value in
// place, with no allocation and no overhead.
static_assert(!std::is_same_v<dist::per_replica<int>, dist::mirrored<int>>);
static_assert(sizeof(dist::per_replica<float, 1>) == sizeof(float));
static_assert(std::is_empty_v<dist::comm::local>);
// The one-device replica is its device and a pointer to its compute engine: the communicator adds nothing.
static_assert(sizeof(dist::one_device_strategy<dist::cpu>::replica_type) <=
              sizeof(dist::cpu) + sizeof(void*) + alignof(void*));
static_assert(dist::one_device_strategy<>::num_replicas_in_sync() == 1);

// A step written once against the concept compiles under every strategy.
template <dist::strategy S>
float generic_step(S& s) {
  auto losses = s.run([](dist::replica auto& r) { return r.all_reduce(dist::reduce_op::sum, 1.0f); });
  return s.reduce(dist::reduce_op::mean, losses);
}

BOOST_AUTO_TEST_SUITE(concepts)

BOOST_AUTO_TEST_CASE(reduce_op_names) {
  BOOST_TEST(dist::to_string(dist::reduce_op::sum) == "sum");
  BOOST_TEST(dist::to_string(dist::reduce_op::mean) == "mean");
  BOOST_TEST(dist::to_string(dist::reduce_op::min) == "min");
  BOOST_TEST(dist::to_string(dist::reduce_op::max) == "max");
  BOOST_TEST(dist::to_string(dist::reduce_op::prod) == "prod");
}

BOOST_AUTO_TEST_CASE(reduce_op_math) {
  using dist::detail::combine;
  using dist::detail::finish;
  BOOST_TEST(combine(dist::reduce_op::sum, 2, 3) == 5);
  BOOST_TEST(combine(dist::reduce_op::min, 2, 3) == 2);
  BOOST_TEST(combine(dist::reduce_op::max, 2, 3) == 3);
  BOOST_TEST(combine(dist::reduce_op::prod, 2, 3) == 6);
  BOOST_TEST(finish(dist::reduce_op::mean, 7, 2) == 3);  // integer mean truncates
  BOOST_TEST(finish(dist::reduce_op::mean, 7.0, 2) == 3.5);
  BOOST_TEST(finish(dist::reduce_op::sum, 7, 2) == 7);
}

BOOST_AUTO_TEST_CASE(dtypes) {
  BOOST_TEST(dist::dtype_of<float> == dist::dtype::float32);
  BOOST_TEST(dist::dtype_of<double> == dist::dtype::float64);
  BOOST_TEST(dist::dtype_of<std::int32_t> == dist::dtype::int32);
  BOOST_TEST(dist::dtype_of<const std::int64_t> == dist::dtype::int64);
  BOOST_TEST(dist::to_string(dist::dtype::bfloat16) == "bfloat16");
}

BOOST_AUTO_TEST_CASE(cpu_devices) {
  const auto devices = dist::cpu_replicas(3);
  BOOST_TEST(devices.size() == 3u);
  BOOST_TEST(devices[2].index() == 2);
  BOOST_TEST(devices[1].name() == "cpu:1");
  BOOST_TEST(!dist::all_cpu_replicas().empty());
  BOOST_CHECK_THROW(dist::cpu_replicas(0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(generic_step_runs_under_every_strategy) {
  dist::one_device_strategy<> one;
  BOOST_TEST(generic_step(one) == 1.0f);
  for (int n : {1, 2, 3}) {
    dist::mirrored_strategy<> mirrored{dist::cpu_replicas(n)};
    BOOST_TEST(generic_step(mirrored) == static_cast<float>(n));
  }
}

BOOST_AUTO_TEST_SUITE_END()
