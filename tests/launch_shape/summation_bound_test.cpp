// The bound the GPU tests hold cuDNN's convolutions to against the CPU's float32 reference
// (tests/gpu/summation_bound.hpp), checked here without a GPU: the products of the GPU cases'
// convolutions (tests/gpu/engine_test.cu, suite `passes`: the generator's 7x7 3->64 convolution
// over 256x256 and its 3x3 256->256 residual one, at smaller sizes where the sum's length allows)
// summed in float32 in three orders a correct engine may use, each against the exact sum (double).
//   - The former check, 1e-4 relative to each value with a floor of 1e-3, fails orders that are
//     all correct: where a sum cancels to near zero, its rounding is more than 1e-4 of it.
//   - Every order is within the bound of every element, and any two orders within twice it.
//   - The bound still catches what a wrong engine does: a term left out; an output off by 1% (10% in
//     the 65,536-term sums), found and named; zeros.
#include <boost/test/unit_test.hpp>

#include "../gpu/summation_bound.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sb = distribute::test::summation_bound;

namespace {

// Uniform in [-1, 1), 24 random bits each (exact in float), from splitmix64: the same values
// wherever the test runs.
std::vector<float> uniform_values(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) {
    std::uint64_t z = (seed += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    x = static_cast<float>(static_cast<double>(z >> 40) * 0x1p-23 - 1.0);
  }
  return v;
}

// A stride-1, unpadded convolution of square images (the GPU cases' kind), NCHW, batch 1.
struct geometry {
  std::int64_t in_channels, size, out_channels, kernel;
  std::int64_t out_size() const { return size - kernel + 1; }
};
enum class pass { forward, data, weights };

// The convolution's operands, and for each output the pairs whose products it sums.
struct convolution {
  geometry g;
  pass p;
  std::vector<float> x, w, dy;

  convolution(geometry geo, pass which)
      : g(geo),
        p(which),
        x(uniform_values(g.in_channels * g.size * g.size, 4)),
        w(uniform_values(g.out_channels * g.in_channels * g.kernel * g.kernel, 5)),
        dy(uniform_values(g.out_channels * g.out_size() * g.out_size(), 6)) {}

  std::int64_t outputs() const {
    const std::int64_t kk = g.kernel * g.kernel, o = g.out_size();
    return p == pass::forward
               ? g.out_channels * o * o
               : (p == pass::data ? g.in_channels * g.size * g.size : g.out_channels * g.in_channels * kk);
  }
  // K: the most products an output sums (the data gradient's edges sum fewer).
  std::int64_t terms() const {
    const std::int64_t kk = g.kernel * g.kernel, o = g.out_size();
    return p == pass::forward ? g.in_channels * kk : (p == pass::data ? g.out_channels * kk : o * o);
  }
  float xv(std::int64_t c, std::int64_t i, std::int64_t j) const {
    return x[static_cast<std::size_t>((c * g.size + i) * g.size + j)];
  }
  float wv(std::int64_t o, std::int64_t c, std::int64_t i, std::int64_t j) const {
    return w[static_cast<std::size_t>(((o * g.in_channels + c) * g.kernel + i) * g.kernel + j)];
  }
  float dyv(std::int64_t o, std::int64_t i, std::int64_t j) const {
    return dy[static_cast<std::size_t>((o * g.out_size() + i) * g.out_size() + j)];
  }

  // The operand pairs of output `e`, in the order of the library's loops.
  void pairs(std::int64_t e, std::vector<float>& a, std::vector<float>& b) const {
    a.clear();
    b.clear();
    const std::int64_t k = g.kernel, o = g.out_size();
    if (p == pass::forward) {
      const std::int64_t oc = e / (o * o), oh = e / o % o, ow = e % o;
      for (std::int64_t c = 0; c < g.in_channels; ++c)
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j) a.push_back(wv(oc, c, i, j)), b.push_back(xv(c, oh + i, ow + j));
    } else if (p == pass::data) {
      const std::int64_t c = e / (g.size * g.size), ih = e / g.size % g.size, iw = e % g.size;
      for (std::int64_t oc = 0; oc < g.out_channels; ++oc)
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j)
            if (ih - i >= 0 && ih - i < o && iw - j >= 0 && iw - j < o)
              a.push_back(wv(oc, c, i, j)), b.push_back(dyv(oc, ih - i, iw - j));
    } else {
      const std::int64_t oc = e / (g.in_channels * k * k), c = e / (k * k) % g.in_channels, i = e / k % k, j = e % k;
      for (std::int64_t oh = 0; oh < o; ++oh)
        for (std::int64_t ow = 0; ow < o; ++ow) a.push_back(dyv(oc, oh, ow)), b.push_back(xv(c, oh + i, ow + j));
    }
  }
};

// Three float32 orders of the same products.
// Each product rounded, then added left to right (a plain loop; the products are stored first, so
// that no compiler fuses them into the sums).
float sequential(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& products) {
  products.resize(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) products[i] = a[i] * b[i];
  float s = 0;
  for (const float q : products) s += q;
  return s;
}
// A GPU kernel's: the sum split in chunks of 2,048 products (split-K); in each, 32 lanes of a warp
// accumulate every 32nd product with fused multiply-adds, then combine by a butterfly (pairwise);
// the chunks' partial sums added in order.
float blocked(const std::vector<float>& a, const std::vector<float>& b) {
  constexpr std::size_t chunk = 2048, lanes = 32;
  float total = 0;
  for (std::size_t from = 0; from < a.size(); from += chunk) {
    float lane[lanes] = {};
    const std::size_t to = std::min(a.size(), from + chunk);
    for (std::size_t i = from; i < to; ++i) lane[(i - from) % lanes] = std::fma(a[i], b[i], lane[(i - from) % lanes]);
    for (std::size_t width = lanes / 2; width > 0; width /= 2)
      for (std::size_t l = 0; l < width; ++l) lane[l] += lane[l + width];
    total += lane[0];
  }
  return total;
}
// Any order: a fixed random permutation of the terms, fused multiply-adds.
float permuted(const std::vector<float>& a, const std::vector<float>& b, const std::vector<std::uint32_t>& order) {
  float s = 0;
  for (const std::uint32_t i : order)
    if (i < a.size()) s = std::fma(a[i], b[i], s);
  return s;
}

std::vector<std::uint32_t> random_order(std::int64_t n) {
  std::vector<std::uint32_t> order(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  std::uint64_t state = 7;
  for (std::size_t i = order.size(); i > 1; --i) {  // Fisher-Yates, with a fixed generator
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    std::swap(order[i - 1], order[static_cast<std::size_t>((state >> 33) % i)]);
  }
  return order;
}

// One case simulated: each order's float32 results, the exact sums, sum |p_i| and each output's
// largest |p_i| (the term a wrong kernel could leave out).
struct simulation {
  std::string name;
  std::int64_t terms = 0;
  double detects = 1e-2;  // a relative error the bound finds on most outputs
  std::vector<double> exact, absolute;
  std::vector<double> largest_term;        // each output's product of the largest magnitude
  std::vector<double> first_chunk;         // each output's sum of its first 2,048 products (a split-K partial)
  std::vector<std::vector<float>> orders;  // sequential, blocked, permuted
  static constexpr const char* order_names[] = {"sequential", "blocked", "permuted"};
};

simulation simulate(const std::string& name, const convolution& conv, double detects = 1e-2) {
  simulation s;
  s.name = name;
  s.detects = detects;
  s.terms = conv.terms();
  const auto n = static_cast<std::size_t>(conv.outputs());
  s.exact.resize(n);
  s.absolute.resize(n);
  s.largest_term.resize(n);
  s.first_chunk.resize(n);
  s.orders.assign(3, std::vector<float>(n));
  const auto order = random_order(s.terms);
  std::vector<float> a, b, products;
  for (std::size_t e = 0; e < n; ++e) {
    conv.pairs(static_cast<std::int64_t>(e), a, b);
    double exact = 0, absolute = 0, largest = 0, chunk = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double q = static_cast<double>(a[i]) * b[i];  // exact: 48 significant bits
      exact += q;
      absolute += std::abs(q);
      if (std::abs(q) > std::abs(largest)) largest = q;
      if (i < 2048) chunk += q;
    }
    s.exact[e] = exact;
    s.absolute[e] = absolute;
    s.largest_term[e] = largest;
    s.first_chunk[e] = chunk;
    s.orders[0][e] = sequential(a, b, products);
    s.orders[1][e] = blocked(a, b);
    s.orders[2][e] = permuted(a, b, order);
  }
  return s;
}

// The GPU cases' convolutions. Where only the number of outputs is cut (fewer output channels of
// a weight gradient or a forward pass, fewer input channels of a data gradient), each output's sum
// is the GPU case's own.
const std::vector<simulation>& simulations() {
  static const std::vector<simulation> all = [] {
    std::vector<simulation> v;
    v.push_back(simulate("7x7 3->64 weight gradient over 256x256 (K = 65,536; 8 of the 64 output channels)",
                         convolution({3, 262, 8, 7}, pass::weights), 1e-1));
    v.push_back(
        simulate("7x7 3->64 data gradient (K = 3,136; 3 channels of 38x38)", convolution({3, 38, 64, 7}, pass::data)));
    v.push_back(simulate("3x3 256->256 forward (K = 2,304; 32 of the 256 output channels, 8x8)",
                         convolution({256, 10, 32, 3}, pass::forward)));
    v.push_back(simulate("3x3 256->256 data gradient (K = 2,304; 16 of the 256 input channels, 10x10)",
                         convolution({16, 10, 256, 3}, pass::data)));
    v.push_back(simulate("3x3 256->256 weight gradient over 64x64 (K = 4,096; 4 x 4 of the channels)",
                         convolution({4, 66, 4, 3}, pass::weights)));
    return v;
  }();
  return all;
}

// The former check of tests/gpu/engine_test.cu: the difference relative to each value, with a floor
// of 1e-3, at most 1e-4. Returns the worst, and how many elements are beyond 1e-4.
std::pair<double, std::size_t> former_check(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  std::size_t beyond = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max(std::abs(static_cast<double>(want[i])), 1e-3);
    const double relative = std::abs(static_cast<double>(got[i]) - want[i]) / scale;
    worst = std::max(worst, relative);
    if (relative > 1e-4) ++beyond;
  }
  return {worst, beyond};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_comparisons_are_bounded_by_float32_sums)

BOOST_AUTO_TEST_CASE(the_former_relative_check_fails_correct_orders) {
  // The former check compared a GPU order with the CPU's: here each pair of simulated orders.
  std::size_t failing_cases = 0;
  for (const simulation& s : simulations()) {
    double worst = 0;
    for (std::size_t i = 0; i < s.orders.size(); ++i)
      for (std::size_t j = i + 1; j < s.orders.size(); ++j) {
        const auto [relative, beyond] = former_check(s.orders[i], s.orders[j]);
        worst = std::max(worst, relative);
        BOOST_TEST_MESSAGE(s.name << ", " << simulation::order_names[i] << " against " << simulation::order_names[j]
                                  << ": " << beyond << " of " << s.exact.size() << " elements beyond 1e-4 (worst "
                                  << relative << ")");
      }
    if (worst > 1e-4) ++failing_cases;
  }
  BOOST_TEST(failing_cases >= 1u);
  // Among them the longest sums, the 7x7 weight gradient's, in a CPU-like order against a GPU-like one.
  const simulation& longest = simulations().front();
  BOOST_TEST(former_check(longest.orders[0], longest.orders[1]).second > 0u);
}

BOOST_AUTO_TEST_CASE(every_order_is_within_the_bound) {
  for (const simulation& s : simulations()) {
    BOOST_TEST_CONTEXT(s.name) {
      // Each order against the exact sum: one side's bound.
      for (std::size_t i = 0; i < s.orders.size(); ++i) {
        const sb::verdict v = sb::compare(s.orders[i], s.exact, s.absolute, sb::factor(s.terms));
        BOOST_TEST_MESSAGE(s.name << ", " << simulation::order_names[i] << " against the exact sums: worst "
                                  << v.worst_ratio << " of the bound");
        BOOST_TEST(v.within(), simulation::order_names[i] << ": " << v.describe());
      }
      // Two orders against each other, as the GPU test compares: both sides' bounds.
      for (std::size_t i = 0; i < s.orders.size(); ++i)
        for (std::size_t j = i + 1; j < s.orders.size(); ++j) {
          const sb::verdict v = sb::compare(s.orders[i], s.orders[j], s.absolute, sb::between(s.terms));
          BOOST_TEST(v.within(),
                     simulation::order_names[i] << " against " << simulation::order_names[j] << ": " << v.describe());
        }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_wrong_result_is_caught) {
  for (const simulation& s : simulations()) {
    BOOST_TEST_CONTEXT(s.name) {
      // The blocked order as the GPU's, the sequential one as the CPU's, as the GPU test compares.
      const std::vector<float>&gpu = s.orders[1], &cpu = s.orders[0];
      const double bound = sb::between(s.terms);
      const std::size_t n = gpu.size();
      BOOST_TEST_REQUIRE(sb::compare(gpu, cpu, s.absolute, bound).within());
      // How many outputs are caught when each is made wrong by `wrong(e)`.
      auto caught = [&](auto&& wrong, double with_bound) {
        std::vector<double> v(n);
        for (std::size_t e = 0; e < n; ++e) v[e] = wrong(e);
        return sb::compare(v, cpu, s.absolute, with_bound).exceeding;
      };

      // One output off by s.detects relative (1%; 10% for the 65,536-term sums), the largest: found,
      // and named.
      std::size_t largest = 0;
      for (std::size_t e = 0; e < n; ++e)
        if (std::abs(s.exact[e]) > std::abs(s.exact[largest])) largest = e;
      std::vector<float> one_wrong = gpu;
      one_wrong[largest] *= static_cast<float>(1 + s.detects);
      const sb::verdict v = sb::compare(one_wrong, cpu, s.absolute, bound);
      BOOST_TEST(v.exceeding == 1u);
      BOOST_TEST(v.worst_at == largest);
      BOOST_TEST_MESSAGE(s.name << ": " << v.describe());

      // Every output off by as much: caught on most of them (not on those near zero).
      const std::size_t off = caught([&](std::size_t e) { return gpu[e] * (1 + s.detects); }, bound);
      BOOST_TEST(off > n / 2, off << " of " << n << " outputs " << s.detects << " off caught");

      // A term left out of every output: its largest one, or in the long sums a split-K partial of
      // 2,048 products.
      if (s.terms <= 4096) {
        BOOST_TEST(caught([&](std::size_t e) { return gpu[e] - s.largest_term[e]; }, bound) == n);
      } else {
        const std::size_t lost = caught([&](std::size_t e) { return gpu[e] - s.first_chunk[e]; }, bound);
        BOOST_TEST(lost > n / 2, lost << " of " << n << " outputs without a partial sum caught");
      }

      // Zeros for a result: caught nearly everywhere. The worst-case bound alone would let the
      // 65,536-term sums pass on most outputs: why each side takes the probabilistic one there.
      const std::size_t zeros = caught([](std::size_t) { return 0.0; }, bound);
      BOOST_TEST(zeros >= n * 9 / 10, zeros << " of " << n << " zero outputs caught");
      if (s.terms > 4096) {
        const std::size_t worst_case_zeros = caught([](std::size_t) { return 0.0; }, 2 * sb::worst_case(s.terms));
        BOOST_TEST(worst_case_zeros < n / 2, worst_case_zeros << " of " << n << " caught by the worst case");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(each_side_takes_the_smaller_bound_and_nothing_slips_through) {
  // The worst case below lambda^2 = 100 terms, the probabilistic bound above.
  BOOST_TEST(sb::factor(99) == sb::worst_case(99));
  BOOST_TEST(sb::factor(101) == sb::probable(101));
  BOOST_TEST(sb::factor(65536) < sb::worst_case(65536) / 25);
  BOOST_TEST(sb::between(2304) == 2 * sb::factor(2304));

  const std::vector<double> sums{1.0, 1.0, 0.0};
  const std::vector<float> want{1.0f, -2.0f, 0.0f};
  BOOST_TEST(sb::compare(want, want, sums, 1e-3).within());
  // A NaN is beyond any bound, and reported as the worst.
  const sb::verdict nan = sb::compare(std::vector<float>{1.0f, std::nanf(""), 0.0f}, want, sums, 1e-3);
  BOOST_TEST(nan.exceeding == 1u);
  BOOST_TEST(nan.worst_at == 1u);
  // An output of no terms (sum |p_i| = 0) must be exactly zero.
  BOOST_TEST(sb::compare(std::vector<float>{1.0f, -2.0f, 1e-30f}, want, sums, 1e-3).exceeding == 1u);
  // Sizes that differ are never within, and say so.
  const sb::verdict shorter = sb::compare(std::vector<float>{1.0f}, want, sums, 1e-3);
  BOOST_TEST(!shorter.within());
  BOOST_TEST(shorter.describe().find("sizes differ") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
