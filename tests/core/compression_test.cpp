// bfloat16 (distribute/bfloat16.hpp) and gradients all-reduced through it
// (gradient_reduction::compression): the rounding against an independent reference, bfloat16 as a
// collective element type, and what `all_reduce_gradients` computes with compression on CPU replicas.

#include "test_support.hpp"

#include <distribute/bfloat16.hpp>
#include <distribute/comm/gradient_buckets.hpp>

#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
using dist::bfloat16;

namespace {

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

// The bfloat16 nearest to finite `x` by comparing distances in double (exact for these values):
// the two candidates are `x` truncated toward zero and the next one away from zero; a tie goes to
// the one with an even last bit.
std::uint16_t reference_rounding(float x) {
  const std::uint32_t u = bits_of(x);
  const auto low = static_cast<std::uint16_t>(u >> 16);
  const auto high = static_cast<std::uint16_t>(low + 1);  // may step into the next binade, or to infinity
  const double below = std::abs(static_cast<double>(x) - static_cast<double>(float_of(std::uint32_t{low} << 16)));
  // Past the largest finite value the next candidate is 2^128 in magnitude (IEEE: rounding as if the
  // exponent were unbounded, then infinity).
  const float next = float_of(std::uint32_t{high} << 16);
  const double next_value =
      std::isinf(next) ? std::copysign(0x1p128, static_cast<double>(x)) : static_cast<double>(next);
  const double above = std::abs(next_value - static_cast<double>(x));
  if (below < above) return low;
  if (above < below) return high;
  return (low & 1u) == 0 ? low : high;
}

// A model of float gradients for all_reduce_gradients: one parameter tensor per entry of `sizes`.
struct toy_model {
  using scalar_type = float;
  std::vector<std::vector<float>> values, gradients;
  explicit toy_model(const std::vector<std::size_t>& sizes) {
    for (const auto n : sizes) {
      values.emplace_back(n, 0.0f);
      gradients.emplace_back(n, 0.0f);
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t i = 0; i < values.size(); ++i) f(std::span<float>(values[i]), std::span<float>(gradients[i]));
  }
  std::vector<float> flat_gradients() const {
    std::vector<float> out;
    for (const auto& g : gradients) out.insert(out.end(), g.begin(), g.end());
    return out;
  }
};
struct toy_double_model {
  using scalar_type = double;
  std::vector<double> value = {1.0}, gradient = {2.0};
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<double>(value), std::span<double>(gradient));
  }
};

const std::vector<std::size_t> toy_sizes = {7, 300, 1, 64, 1000};

// Replica r's gradients: irregular values of several magnitudes, seeded by r.
std::vector<float> gradients_for(int r, std::size_t n) {
  std::mt19937 gen(1234u + 77u * static_cast<std::uint32_t>(r));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 4);
  std::vector<float> g(n);
  for (auto& x : g) x = std::ldexp(mantissa(gen), exponent(gen));
  return g;
}

// What every replica holds after the bfloat16 all-reduce of the replicas' `inputs`: each rounded to
// bfloat16, combined in the documented tree with a rounding per addition, widened back.
std::vector<float> expected_bfloat16_sum(const std::vector<std::vector<float>>& inputs, dist::reduce_op op) {
  std::vector<std::vector<bfloat16>> narrowed;
  for (const auto& in : inputs) {
    std::vector<bfloat16> b;
    for (const float v : in) b.push_back(bfloat16(v));
    narrowed.push_back(b);
  }
  const auto reduced = dist::test::serial_reduce(op, narrowed);
  std::vector<float> out;
  for (const auto b : reduced) out.push_back(static_cast<float>(b));
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(bfloat16_type)

BOOST_AUTO_TEST_CASE(rounds_to_nearest_ties_to_even) {
  // Around 1 a bfloat16 step is 2^-7: half a step is a tie, broken toward the even last bit.
  BOOST_TEST(bfloat16(1.0f).bits() == 0x3f80);
  BOOST_TEST(bfloat16(1.0f + 0x1p-8f).bits() == 0x3f80);              // tie, 0x3f80 is even
  BOOST_TEST(bfloat16(1.0f + 0x1p-7f + 0x1p-8f).bits() == 0x3f82);    // tie, 0x3f81 is odd: up
  BOOST_TEST(bfloat16(1.0f + 0x1p-8f + 0x1p-20f).bits() == 0x3f81);   // just over half: up
  BOOST_TEST(bfloat16(1.0f + 0x1p-8f - 0x1p-20f).bits() == 0x3f80);   // just under half: down
  BOOST_TEST(bfloat16(-1.0f - 0x1p-8f - 0x1p-20f).bits() == 0xbf81);  // the same by magnitude below zero
  // Infinities, signed zeros, overflow, NaN, subnormals.
  BOOST_TEST(bfloat16(std::numeric_limits<float>::infinity()).bits() == 0x7f80);
  BOOST_TEST(bfloat16(-std::numeric_limits<float>::infinity()).bits() == 0xff80);
  BOOST_TEST(bfloat16(0.0f).bits() == 0x0000);
  BOOST_TEST(bfloat16(-0.0f).bits() == 0x8000);
  BOOST_TEST(bfloat16(std::numeric_limits<float>::max()).bits() == 0x7f80);  // past bfloat16's largest: infinity
  BOOST_TEST(bfloat16(float_of(0x7f7f7fffu)).bits() == 0x7f7f);              // under half a step below it: kept
  BOOST_TEST(bfloat16(std::numeric_limits<float>::quiet_NaN()).bits() == 0x7fff);
  BOOST_TEST(bfloat16(float_of(0xff800001u)).bits() == 0x7fff);  // a negative signalling NaN: the one NaN
  BOOST_TEST(bfloat16(float_of(0x7fffffffu)).bits() == 0x7fff);  // would carry into the sign without the check
  BOOST_TEST(bfloat16(0x1p-133f).bits() == 0x0001);              // bfloat16's smallest subnormal
  BOOST_TEST(bfloat16(0x1p-135f).bits() == 0x0000);              // a quarter of it: to zero
  BOOST_TEST(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  static_assert(bfloat16(3.0f).bits() == 0x4040);  // constexpr
}

BOOST_AUTO_TEST_CASE(matches_an_independent_reference_on_random_floats) {
  std::mt19937 gen(99);
  std::uniform_int_distribution<std::uint32_t> any;
  int checked = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = float_of(any(gen));
    if (!std::isfinite(x)) continue;
    const auto ours = bfloat16(x).bits(), theirs = reference_rounding(x);
    if (ours != theirs) BOOST_TEST_REQUIRE(ours == theirs, "bits " << std::hex << bits_of(x));
    ++checked;
  }
  BOOST_TEST(checked > 1'900'000);
  // Every bfloat16 is a float: widening and narrowing again is the identity, NaN aside.
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    if (std::isnan(static_cast<float>(h))) continue;
    if (bfloat16(static_cast<float>(h)).bits() != b) BOOST_TEST_REQUIRE(bfloat16(static_cast<float>(h)).bits() == b);
  }
}

BOOST_AUTO_TEST_CASE(arithmetic_rounds_after_each_operation) {
  const bfloat16 one(1.0f), tiny(0x1p-8f);
  BOOST_TEST((one + tiny).bits() == one.bits());           // 1 + 2^-8 is a tie: stays at 1
  BOOST_TEST(((one + tiny) + tiny).bits() == one.bits());  // and stays, one rounding per addition
  BOOST_TEST((one + (tiny + tiny)).bits() == bfloat16(1.0f + 0x1p-7f).bits());
  BOOST_TEST(static_cast<float>(bfloat16(6.0f) / bfloat16(3)) == 2.0f);
  BOOST_TEST((bfloat16(-0.0f) == bfloat16(0.0f)));
  BOOST_TEST(!(bfloat16(std::numeric_limits<float>::quiet_NaN()) == bfloat16(std::numeric_limits<float>::quiet_NaN())));
  BOOST_TEST((-bfloat16(2.0f)).bits() == 0xc000);
  static_assert(dist::element<bfloat16> && dist::dtype_of<bfloat16> == dist::dtype::bfloat16);
}

BOOST_AUTO_TEST_CASE(is_a_collective_element_type) {
  for (const int replicas : {2, 3, 5}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    std::vector<std::vector<bfloat16>> inputs;
    for (int r = 0; r < replicas; ++r) {
      std::vector<bfloat16> v;
      for (const float x : gradients_for(r, 5000)) v.push_back(bfloat16(x));
      inputs.push_back(v);
    }
    for (const auto op : {dist::reduce_op::sum, dist::reduce_op::mean, dist::reduce_op::max}) {
      const auto expected = dist::test::serial_reduce(op, inputs);
      auto data = s.values_from_function([&](int r) { return inputs[static_cast<std::size_t>(r)]; });
      s.run([&](dist::replica auto& r, std::vector<bfloat16>& mine) { r.all_reduce(op, mine); }, data);
      for (int r = 0; r < replicas; ++r)
        BOOST_TEST_REQUIRE(dist::test::bit_equal(data[static_cast<std::size_t>(r)], expected),
                           dist::to_string(op) << " over " << replicas << " replicas, replica " << r);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compression)

BOOST_AUTO_TEST_CASE(gradients_travel_as_bfloat16_and_every_replica_gets_the_same_bits) {
  for (const int replicas : {2, 3, 4}) {
    for (const auto op : {dist::reduce_op::sum, dist::reduce_op::mean}) {
      // Default buckets (one) and small ones (several, a gradient larger than the cap alone).
      for (const std::size_t cap : {std::size_t{25} << 20, std::size_t{1200}}) {
        dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
        std::vector<std::vector<float>> inputs;
        for (int r = 0; r < replicas; ++r) {
          std::size_t total = 0;
          for (const auto n : toy_sizes) total += n;
          inputs.push_back(gradients_for(r, total));
        }
        auto models = s.mirror([](auto&) { return toy_model{toy_sizes}; });
        const dist::gradient_reduction how{.op = op,
                                           .bucket_bytes = cap,
                                           .first_bucket_bytes = 100,
                                           .compression = dist::gradient_compression::bfloat16};
        s.run(
            [&](dist::replica auto& r, toy_model& m) {
              const auto& mine = inputs[static_cast<std::size_t>(r.replica_id())];
              std::size_t at = 0;
              for (auto& g : m.gradients)
                for (auto& x : g) x = mine[at++];
              return r.all_reduce_gradients(m, how);
            },
            models);
        // Not the plain float sum: the compression did something.
        const auto exact = dist::test::serial_reduce(op, inputs);
        // Each bucket is its own bfloat16 all-reduce of the same elements, so one expectation serves
        // every bucket split.
        const auto expected = expected_bfloat16_sum(inputs, op);
        for (int r = 0; r < replicas; ++r) {
          const auto got = models[static_cast<std::size_t>(r)].flat_gradients();
          BOOST_TEST_REQUIRE(dist::test::bit_equal(got, expected), replicas << " replicas, " << dist::to_string(op)
                                                                            << ", bucket cap " << cap << ", replica "
                                                                            << r);
        }
        BOOST_TEST(!dist::test::bit_equal(expected, exact));
        // Within bfloat16's precision of the exact result: a rounding of each input and of each
        // partial sum, relative to the sum of magnitudes.
        std::vector<float> magnitude(exact.size(), 0.0f);
        for (const auto& in : inputs)
          for (std::size_t i = 0; i < in.size(); ++i) magnitude[i] += std::abs(in[i]);
        const float scale = op == dist::reduce_op::mean ? 1.0f / static_cast<float>(replicas) : 1.0f;
        for (std::size_t i = 0; i < exact.size(); ++i)
          if (std::abs(expected[i] - exact[i]) > 3.0f * static_cast<float>(replicas) * 0x1p-9f * magnitude[i] * scale)
            BOOST_TEST_REQUIRE(false, "element " << i << ": " << expected[i] << " against " << exact[i]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_narrowing_buffer_kept_per_thread_is_bounded_by_the_bucket_cap) {
  // Each replica thread keeps its bfloat16 buffer for the next step, but only up to the largest
  // bucket the cap makes: a gradient larger than the cap (a bucket of its own) gets a buffer of its
  // own, returned after.
  std::size_t total = 0;
  for (const auto n : toy_sizes) total += n;
  const std::size_t largest = 1000;  // the largest of toy_sizes
  for (const std::size_t cap : {std::size_t{25} << 20, std::size_t{1200}}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
    auto models = s.mirror([](auto&) { return toy_model{toy_sizes}; });
    // (Default caps: one bucket of every gradient.)
    const dist::gradient_reduction how{.bucket_bytes = cap,
                                       .first_bucket_bytes = cap > 1200 ? std::size_t{1} << 20 : 100,
                                       .compression = dist::gradient_compression::bfloat16};
    const auto kept = s.run(
        [&](dist::replica auto& r, toy_model& m) {
          auto& buffer = dist::comm::kept_narrowing_buffer<bfloat16>();
          buffer = {};
          for (auto& g : m.gradients) g = gradients_for(r.replica_id(), g.size());
          r.all_reduce_gradients(m, how);
          return buffer.size();
        },
        models);
    for (const std::size_t k : kept) {
      if (cap == (std::size_t{25} << 20)) {
        BOOST_TEST(k == total, "one bucket of every gradient: its buffer is kept");
      } else {
        BOOST_TEST(k <= cap / sizeof(float), "kept " << k << " elements under a cap of " << cap / sizeof(float));
        BOOST_TEST(k > 0u, "the buckets under the cap kept a buffer");
        BOOST_TEST(k < largest);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(nothing_is_rounded_where_nothing_travels) {
  // One device and a group of one replica send nothing: the gradients keep their float bits.
  const auto g = gradients_for(0, 1372);
  const dist::gradient_reduction how{.compression = dist::gradient_compression::bfloat16};
  auto check = [&](auto& s) {
    auto models = s.mirror([](auto&) { return toy_model{toy_sizes}; });
    s.run(
        [&](dist::replica auto& r, toy_model& m) {
          std::size_t at = 0;
          for (auto& v : m.gradients)
            for (auto& x : v) x = g[at++];
          r.all_reduce_gradients(m, how);
        },
        models);
    BOOST_TEST(dist::test::bit_equal(models[0].flat_gradients(), g));
  };
  dist::one_device_strategy<> one;
  check(one);
  dist::mirrored_strategy<> single{dist::cpu_replicas(1)};
  check(single);
}

BOOST_AUTO_TEST_CASE(what_cannot_be_compressed_is_refused_before_any_collective) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  dist::one_device_strategy<> one;
  auto refused = [](auto& strategy, auto make, const dist::gradient_reduction& how, const std::string& says) {
    auto models = strategy.mirror([&](auto&) { return make(); });
    try {
      strategy.run([&](dist::replica auto& r, auto& m) { r.all_reduce_gradients(m, how); }, models);
      BOOST_TEST(false, "not refused: " << says);
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  const auto bf16 = dist::gradient_compression::bfloat16;
  for (int pass = 0; pass < 2; ++pass) {
    auto run = [&](auto& strategy) {
      refused(strategy, [] { return toy_double_model{}; }, {.compression = bf16}, "this model's are float64");
      refused(
          strategy, [] { return toy_model{toy_sizes}; }, {.op = dist::reduce_op::max, .compression = bf16},
          "by sum or mean, not max");
      refused(
          strategy, [] { return toy_model{toy_sizes}; }, {.compression = static_cast<dist::gradient_compression>(7)},
          "is not a gradient_compression");
    };
    if (pass == 0) run(s);
    else run(one);  // refused alike where nothing would travel
  }
  // The strategy is still usable: nothing half-ran.
  auto models = s.mirror([](auto&) { return toy_model{toy_sizes}; });
  s.run([&](dist::replica auto& r, toy_model& m) { r.all_reduce_gradients(m, {.compression = bf16}); }, models);
}

BOOST_AUTO_TEST_SUITE_END()
