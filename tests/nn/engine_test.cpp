// The CPU engine: oneDNN's convolutions against the portable reference (forward, data gradient,
// weight and bias gradients; strides, paddings, odd shapes), the layers on both, thread shares,
// determinism, the split-independent mode, Winograd for wide 3x3 convolutions and the scratch arena;
// and mixed precision on the CPU (suite `precision`).

#include "nn_test_support.hpp"
#include "precision_case.hpp"

#include <distribute/distribute.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <unistd.h>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::conv_geometry;
using dist::shape;
using dist::tensor;

namespace {

std::vector<float> random_values(std::int64_t n, std::uint32_t seed) {
  const auto t = dist::test::random_tensor<float>(shape{n}, seed);
  return {t.begin(), t.end()};
}

// A model that is one flat parameter.
struct flat {
  using scalar_type = float;
  std::vector<float> value, grad;
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(value), std::span<float>(grad));
  }
};

double relative(const std::vector<float>& a, const std::vector<float>& b) {
  return dist::test::relative_error_of<float>(a, b);
}

// Every pass of one geometry on two engines; returns the worst relative difference.
double compare_engines(dist::engine<dist::cpu>& fast, dist::engine<dist::cpu>& ref, const conv_geometry& g, bool bias) {
  const auto x = random_values(g.input_size(), 1), w = random_values(g.weight_size(), 2);
  const auto b = random_values(g.out_channels, 3), dy = random_values(g.output_size(), 4);
  double worst = 0;
  auto both = [&](auto&& run) {
    const auto a = run(fast), r = run(ref);
    BOOST_TEST_REQUIRE(a.size() == r.size());
    worst = std::max(worst, relative(a, r));
  };
  both([&](auto& e) {
    std::vector<float> y(static_cast<std::size_t>(g.output_size()), -7.0f);
    e.conv_forward(g, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
    return y;
  });
  both([&](auto& e) {
    std::vector<float> dx(static_cast<std::size_t>(g.input_size()), -7.0f);  // overwritten, not added to
    e.conv_backward_data(g, dy.data(), w.data(), dx.data());
    return dx;
  });
  both([&](auto& e) {
    // Accumulated onto what is there: start from non-zero gradients.
    std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.25f),
        db(static_cast<std::size_t>(g.out_channels), 0.5f);
    e.conv_backward_weights(g, x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr);
    if (bias) dw.insert(dw.end(), db.begin(), db.end());
    return dw;
  });
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(engine)

BOOST_AUTO_TEST_CASE(the_build_says_what_computes) {
  dist::engine<dist::cpu> e, ref{{.reference = true}};
  BOOST_TEST_MESSAGE("CPU engine: " << e.name() << "; with reference = true: " << ref.name());
  BOOST_TEST(ref.name().find("reference") != std::string::npos);
#if defined(DISTRIBUTE_USE_DNNL)
  BOOST_TEST(dist::engine<dist::cpu>::has_dnnl);
  BOOST_TEST(e.name().find("oneDNN") != std::string::npos);
#else
  BOOST_TEST(!dist::engine<dist::cpu>::has_dnnl);
#endif
}

BOOST_AUTO_TEST_CASE(fast_convolutions_match_the_reference) {
  dist::engine<dist::cpu> fast, ref{{.reference = true}};
  struct c {
    std::int64_t n, ci, h, w, co, k, s, p;
  };
  // CycleGAN's shapes (c7s1, d, R, the PatchGAN's 4x4), odd channel counts, non-square planes, a
  // window that leaves the last input row unused, 1x1 kernels, one example.
  const std::vector<c> cases{{2, 1, 34, 34, 16, 7, 1, 0},  {2, 16, 28, 28, 32, 3, 2, 1}, {3, 32, 14, 14, 64, 3, 2, 1},
                             {2, 64, 9, 9, 64, 3, 1, 0},   {2, 16, 34, 34, 1, 7, 1, 0},  {2, 1, 28, 28, 16, 4, 2, 1},
                             {2, 16, 14, 14, 32, 4, 2, 1}, {2, 32, 7, 7, 64, 4, 1, 1},   {2, 64, 6, 6, 1, 4, 1, 1},
                             {1, 3, 13, 9, 5, 3, 2, 0},    {2, 5, 11, 7, 3, 3, 3, 1},    {1, 17, 8, 8, 9, 1, 1, 0},
                             {3, 8, 16, 16, 8, 5, 2, 2},   {1, 3, 12, 12, 4, 2, 2, 0}};
  for (const auto& k : cases)
    for (bool bias : {false, true}) {
      const auto g = conv_geometry::of(k.n, k.ci, k.h, k.w, k.co, k.k, k.s, k.p);
      const double err = compare_engines(fast, ref, g, bias);
      BOOST_TEST(err < 2e-5, g.to_string() << (bias ? " with bias" : "") << ": relative difference " << err);
    }
}

BOOST_AUTO_TEST_CASE(wide_3x3_convolutions_take_winograd) {
  // Geometries compute_options::conv_winograd applies to (3x3, stride 1, >= 32 channels in and out,
  // >= 32x32 output planes: a residual block's, with and without padding), and one just outside
  // (31x31 output) that stays direct. Winograd is oneDNN's kernel where it has one, the engine's own
  // elsewhere (engine/detail/winograd_f4x3.hpp).
  // (Winograd by the rule: the timed choice has its own test.)
  dist::engine<dist::cpu> wino{{.cpu_conv_choice = dist::conv_choice::rule}}, direct{{.conv_winograd = false}},
      ref{{.reference = true}};
  const auto eligible = {conv_geometry::of(2, 32, 34, 34, 32, 3, 1, 0), conv_geometry::of(1, 64, 40, 36, 48, 3, 1, 1)};
  const auto outside = conv_geometry::of(2, 32, 33, 33, 32, 3, 1, 0);
  // With oneDNN, passes asked for Winograd compute it: with oneDNN's kernel where it has one, else
  // with the engine's own.
  constexpr bool has = dist::engine<dist::cpu>::has_dnnl;
#if defined(DISTRIBUTE_USE_DNNL)
  BOOST_TEST_MESSAGE("oneDNN " << (dist::detail::dnnl_conv::library_has_winograd() ? "has" : "has no")
                               << " Winograd kernel here: " << wino.name());
  BOOST_TEST((wino.name().find("Winograd") != std::string::npos) == has);
  BOOST_TEST(direct.name().find("Winograd") == std::string::npos);
  for (const auto& g : eligible) BOOST_TEST(dist::detail::dnnl_conv::winograd_pays(g), g.to_string());
  BOOST_TEST(!dist::detail::dnnl_conv::winograd_pays(outside));
  BOOST_TEST(
      !dist::detail::dnnl_conv::winograd_pays(conv_geometry::of(1, 16, 34, 34, 32, 3, 1, 0)));  // too few channels
  BOOST_TEST(!dist::detail::dnnl_conv::winograd_pays(conv_geometry::of(1, 32, 66, 66, 32, 3, 2, 0)));  // stride 2
#endif
  for (const auto& g : eligible)
    for (bool bias : {false, true}) {
      // Winograd rounds more than direct convolution: about 2e-5 of the largest magnitude per output.
      const double w_err = compare_engines(wino, ref, g, bias), d_err = compare_engines(direct, ref, g, bias);
      BOOST_TEST(w_err < 1e-4, g.to_string() << ": Winograd against the reference: " << w_err);
      BOOST_TEST(d_err < 2e-5, g.to_string() << ": direct against the reference: " << d_err);
      // Where the kernel is there it is used: its results are not direct convolution's.
      if (has)
        BOOST_TEST(compare_engines(wino, direct, g, bias) > 0.0, g.to_string() << ": Winograd gave direct's bits");
    }
  BOOST_TEST(compare_engines(wino, direct, outside, true) == 0.0, "outside the rule both engines are direct");
  // Still deterministic: a second engine gives the same bits.
  const auto g = *eligible.begin();
  const auto x = random_values(g.input_size(), 21), w = random_values(g.weight_size(), 22);
  std::vector<float> y(static_cast<std::size_t>(g.output_size())), again(y.size());
  wino.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), y.data());
  dist::engine<dist::cpu> other{{.cpu_conv_choice = dist::conv_choice::rule}};
  other.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), again.data());
  BOOST_TEST((y == again));
}

#if defined(DISTRIBUTE_USE_DNNL)
// The engine's own Winograd F(4x4, 3x3) (engine/detail/winograd_f4x3.hpp), which computes the passes
// asked for Winograd where oneDNN has no such kernel (CPUs without AVX-512, oneDNN 3.x), taken here
// on every CPU (prefer_own_winograd): all three passes and the bias gradient against the reference
// over paddings 0, 1 and 2, planes that are not multiples of the 4x4 tiles, odd channel counts and
// batches; the same bits on 1, 2 and 3 threads, and for a batch and its examples one at a time
// (forward and data gradient); on inputs rounded to bfloat16 as it rounds them (`round`); and the
// name and thread rule it reports. Geometries it does not apply to go to oneDNN's direct kernels.
BOOST_AUTO_TEST_CASE(own_winograd_matches_the_reference_and_keeps_its_bits_on_any_thread_count) {
  using conv = dist::detail::dnnl_conv;
  using pass = conv::pass;
  using wino = dist::detail::winograd_f4x3;
  const std::vector<conv_geometry> cases{
      conv_geometry::of(1, 5, 9, 11, 7, 3, 1, 1),     // 9x11: partial tiles both ways
      conv_geometry::of(2, 8, 13, 10, 6, 3, 1, 0),    // no padding, 11x8
      conv_geometry::of(3, 3, 7, 7, 4, 3, 1, 2),      // padding 2 (its data gradient: padding 0)
      conv_geometry::of(1, 40, 34, 34, 33, 3, 1, 0),  // wide, 32x32 (its data gradient: 34x34)
      conv_geometry::of(2, 33, 20, 17, 48, 3, 1, 1)};
  dist::engine<dist::cpu> ref{{.reference = true}};
  dist::detail::arena scratch;
  for (const auto& g : cases) {
    BOOST_TEST_REQUIRE(wino::applies(g), g.to_string());
    const auto x = random_values(g.input_size(), 61), w = random_values(g.weight_size(), 62),
               b = random_values(g.out_channels, 63), dy = random_values(g.output_size(), 64);
    // All three passes (dx overwritten, dw and db added to) through dnnl_conv on `threads`.
    const auto passes = [&](int threads, const conv_geometry& geometry, std::int64_t from, bool round) {
      const dist::detail::openmp_thread_count count{threads};
      conv d;
      d.prefer_own_winograd(true);
      const std::int64_t in = from * g.in_channels * g.in_height * g.in_width,
                         out = from * g.out_channels * g.out_height * g.out_width;
      std::vector<float> y(static_cast<std::size_t>(geometry.output_size()), -7.0f),
          dx(static_cast<std::size_t>(geometry.input_size()), -7.0f),
          dw(static_cast<std::size_t>(g.weight_size()), 0.25f), db(static_cast<std::size_t>(g.out_channels), 0.5f);
      BOOST_TEST(d.forward(geometry, x.data() + in, w.data(), b.data(), y.data(), scratch, false, true, round));
      BOOST_TEST(d.backward_data(geometry, dy.data() + out, w.data(), dx.data(), scratch, false, true, round));
      BOOST_TEST(d.backward_weights(geometry, x.data() + in, dy.data() + out, dw.data(), db.data(), scratch, false,
                                    true, round));
      BOOST_TEST(d.own_winograd_passes() == 3u);
      BOOST_TEST(!d.backward(geometry, x.data(), dy.data(), w.data(), dx.data(), dw.data(), db.data(), scratch, false,
                             true, round));  // one by one, not both from one reorder
      for (const pass which : {pass::forward, pass::backward_data, pass::backward_weights}) {
        BOOST_TEST(d.implementation(which, geometry, true, false, true) == wino::name);
        BOOST_TEST((d.rule(which, geometry, true, false, true) == conv::thread_rule::per_output));
      }
      return std::tuple{y, dx, dw, db};
    };
    const auto [y, dx, dw, db] = passes(2, g, 0, false);
    // The reference, on the same inputs.
    std::vector<float> ry(y.size()), rdx(dx.size()), rdw(dw.size(), 0.25f), rdb(db.size(), 0.5f);
    ref.conv_forward(g, x.data(), w.data(), b.data(), ry.data());
    ref.conv_backward_data(g, dy.data(), w.data(), rdx.data());
    ref.conv_backward_weights(g, x.data(), dy.data(), rdw.data(), rdb.data());
    // Winograd's roundings: a few 1e-6 of the largest magnitude here (a wrong coefficient in any
    // transform is off by far more than 1e-4).
    BOOST_TEST(relative(y, ry) < 1e-4, g.to_string() << ": forward " << relative(y, ry));
    BOOST_TEST(relative(dx, rdx) < 1e-4, g.to_string() << ": data gradient " << relative(dx, rdx));
    BOOST_TEST(relative(dw, rdw) < 1e-4, g.to_string() << ": weight gradient " << relative(dw, rdw));
    BOOST_TEST(relative(db, rdb) < 1e-6, g.to_string() << ": bias gradient " << relative(db, rdb));
    BOOST_TEST(relative(y, ry) > 0.0, "Winograd's roundings are not the direct sum's");
    BOOST_TEST_MESSAGE(g.to_string() << ": own Winograd against the reference: forward " << relative(y, ry)
                                     << ", data gradient " << relative(dx, rdx) << ", weight gradient "
                                     << relative(dw, rdw));
    // The thread count changes no bit.
    for (const int threads : {1, 3}) {
      const auto other = passes(threads, g, 0, false);
      BOOST_TEST((std::get<0>(other) == y), g.to_string() << " forward, " << threads << " threads");
      BOOST_TEST((std::get<1>(other) == dx), g.to_string() << " data gradient, " << threads << " threads");
      BOOST_TEST((std::get<2>(other) == dw), g.to_string() << " weight gradient, " << threads << " threads");
      BOOST_TEST((std::get<3>(other) == db), g.to_string() << " bias gradient, " << threads << " threads");
    }
    // Each example alone gives the batch's bits (forward and data gradient).
    conv_geometry one = g;
    one.batch = 1;
    for (std::int64_t n = 0; n < g.batch; ++n) {
      const auto alone = passes(2, one, n, false);
      const auto out = static_cast<std::size_t>(one.output_size()), in = static_cast<std::size_t>(one.input_size());
      BOOST_TEST(std::equal(std::get<0>(alone).begin(), std::get<0>(alone).end(), y.begin() + n * out),
                 g.to_string() << " example " << n << " forward");
      BOOST_TEST(std::equal(std::get<1>(alone).begin(), std::get<1>(alone).end(), dx.begin() + n * in),
                 g.to_string() << " example " << n << " data gradient");
    }
    // `round`: the bits of the unrounded pass on inputs rounded to bfloat16.
    {
      const auto rounded = [](std::vector<float> v) {
        for (auto& e : v) e = static_cast<float>(dist::bfloat16(e));
        return v;
      };
      const auto xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
      conv d;
      d.prefer_own_winograd(true);
      std::vector<float> a(y.size()), c(y.size()), da(dw.size(), 0.0f), dc(dw.size(), 0.0f);
      d.forward(g, x.data(), w.data(), b.data(), a.data(), scratch, false, true, true);
      d.forward(g, xr.data(), wr.data(), b.data(), c.data(), scratch, false, true, false);
      BOOST_TEST((a == c), g.to_string() << ": rounded forward");
      d.backward_weights(g, x.data(), dy.data(), da.data(), nullptr, scratch, false, true, true);
      d.backward_weights(g, xr.data(), dyr.data(), dc.data(), nullptr, scratch, false, true, false);
      BOOST_TEST((da == dc), g.to_string() << ": rounded weight gradient");
      BOOST_TEST(!(a == y), "rounding changed the inputs");
    }
  }
  // Not a 3x3 window at stride 1 with even padding: not own Winograd's; oneDNN's direct kernel computes it.
  for (const auto& g : {conv_geometry::of(1, 8, 12, 12, 8, 3, 2, 1), conv_geometry::of(1, 8, 12, 12, 8, 5, 1, 2),
                        conv_geometry::of(1, 8, 12, 12, 8, 3, 1, 3)}) {
    BOOST_TEST(!wino::applies(g), g.to_string());
    conv d;
    d.prefer_own_winograd(true);
    const auto x = random_values(g.input_size(), 65), w = random_values(g.weight_size(), 66);
    std::vector<float> y(static_cast<std::size_t>(g.output_size())), ry(y.size());
    BOOST_TEST(d.forward(g, x.data(), w.data(), nullptr, y.data(), scratch, false, true));
    BOOST_TEST(d.own_winograd_passes() == 0u);
    BOOST_TEST(d.implementation(pass::forward, g, false, false, true) != wino::name);
    ref.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), ry.data());
    BOOST_TEST(relative(y, ry) < 2e-5, g.to_string());
  }
  BOOST_CHECK_THROW(
      wino::forward(conv_geometry::of(1, 8, 12, 12, 8, 3, 2, 1), nullptr, nullptr, nullptr, nullptr, scratch, false, 1),
      std::invalid_argument);
  BOOST_TEST_MESSAGE("Winograd passes here: " << conv::winograd_kernel());
}
#endif

// Where Winograd's data gradient spans one more row or column of 4x4 tiles than dy's plane (a 3x3
// window without padding over an output extent of 0 or 3 modulo 4), oneDNN computes its inside (the
// same convolution with padding 1) and matrix products its four edges. Every element, edges and
// corners included, matches the reference; the edges do not depend on the thread count or on how
// the batch is split; and the split is taken exactly where the rule says.
BOOST_AUTO_TEST_CASE(winograd_data_gradients_split_into_inside_and_edges_match_the_reference) {
  struct c {
    conv_geometry g;
    bool splits;
  };
  const std::vector<c> cases{{conv_geometry::of(2, 32, 34, 34, 32, 3, 1, 0), true},    // 32x32: 9x9 tiles against 8x8
                             {conv_geometry::of(1, 40, 35, 34, 48, 3, 1, 0), true},    // 33x32: the columns only
                             {conv_geometry::of(3, 48, 38, 37, 32, 3, 1, 0), true},    // 36x35: both, odd channels
                             {conv_geometry::of(1, 32, 36, 36, 32, 3, 1, 0), false},   // 34x34: 9x9 tiles either way
                             {conv_geometry::of(1, 32, 34, 34, 32, 3, 1, 1), false}};  // padded: no edges
  dist::engine<dist::cpu> wino, one{{.threads = 1}}, two{{.threads = 2}}, split{{.split_independent = true}},
      ref{{.reference = true}};
  for (const auto& [g, splits] : cases) {
#if defined(DISTRIBUTE_USE_DNNL)
    BOOST_TEST(dist::detail::dnnl_conv::splits_border(g) == splits, g.to_string());
#endif
    const auto dy = random_values(g.output_size(), 51), w = random_values(g.weight_size(), 52);
    auto data_gradient = [&](dist::engine<dist::cpu>& e) {
      std::vector<float> dx(static_cast<std::size_t>(g.input_size()), -7.0f);  // overwritten, edges included
      e.conv_backward_data(g, dy.data(), w.data(), dx.data());
      return dx;
    };
    const auto fast = data_gradient(wino), exact = data_gradient(ref);
    const double err = relative(fast, exact);
    BOOST_TEST(err < 1e-4, g.to_string() << ": against the reference " << err);
    // The edges alone (an edge left out or added twice is off by a third of its values or more).
    double edge_err = 0, scale = 0;
    for (std::int64_t i = 0; i < g.input_size(); ++i) {
      const std::int64_t col = i % g.in_width, row = i / g.in_width % g.in_height;
      scale = std::max(scale, static_cast<double>(std::fabs(exact[static_cast<std::size_t>(i)])));
      if (row == 0 || col == 0 || row == g.in_height - 1 || col == g.in_width - 1)
        edge_err = std::max(edge_err, static_cast<double>(std::fabs(fast[static_cast<std::size_t>(i)] -
                                                                    exact[static_cast<std::size_t>(i)])));
    }
    BOOST_TEST(edge_err < 1e-4 * scale, g.to_string()
                                            << ": edges " << edge_err << " from the reference's, of " << scale);
    BOOST_TEST((data_gradient(one) == data_gradient(two)), g.to_string() << ": one thread against two");
    BOOST_TEST((data_gradient(split) == fast), g.to_string() << ": one example at a time against the batch");
  }
#if defined(DISTRIBUTE_USE_DNNL)
  // Counted at the library's seam: where oneDNN has the kernel, each splitting pass is split once
  // (the engine's own Winograd computes the data gradient whole, as its swapped convolution's forward).
  if (dist::detail::dnnl_conv::library_has_winograd()) {
    dist::detail::dnnl_conv conv;
    dist::detail::arena a;
    for (const auto& [g, splits] : cases) {
      const auto dy = random_values(g.output_size(), 53), w = random_values(g.weight_size(), 54);
      std::vector<float> dx(static_cast<std::size_t>(g.input_size()));
      const std::size_t before = conv.border_splits();
      BOOST_TEST(conv.backward_data(g, dy.data(), w.data(), dx.data(), a, false, true));
      BOOST_TEST(conv.border_splits() - before == (splits ? 1u : 0u), g.to_string());
      // Not asked for Winograd: never split.
      BOOST_TEST(conv.backward_data(g, dy.data(), w.data(), dx.data(), a, false, false));
      BOOST_TEST(conv.border_splits() - before == (splits ? 1u : 0u), g.to_string());
    }
  }
#endif
}

// conv_backward: both gradients of a convolution in one call give the bits of the two passes one by
// one, on every path (direct, Winograd, bfloat16, the reference), with and without a data gradient
// and a bias; and through oneDNN, dy is reordered once for both passes where they read it alike.
BOOST_AUTO_TEST_CASE(both_gradients_in_one_call_are_the_two_passes_bits) {
  const auto geometries = {conv_geometry::of(2, 16, 20, 20, 32, 3, 1, 1),  // direct, blocked layouts
                           conv_geometry::of(1, 32, 34, 34, 32, 3, 1, 0),  // Winograd where oneDNN has it
                           conv_geometry::of(2, 3, 17, 17, 16, 7, 2, 3),   // an image's channels, stride 2
                           conv_geometry::of(1, 8, 9, 9, 3, 3, 1, 0),      // three output channels
                           conv_geometry::of(2, 32, 12, 12, 3, 5, 1, 2)};  // three from many: swapped passes
  std::vector<dist::compute_options> options{
      {}, {.conv_winograd = false}, {.reference = true}, {.split_independent = true}};
  for (const auto& o : options)
    for (bool bf16 : {false, true}) {
      if (bf16 && !dist::detail::cpu_has_bf16_units()) continue;
      dist::engine<dist::cpu> one{o}, two{o};
      if (bf16) {
        one.use_precision(dist::compute_precision::bfloat16);
        two.use_precision(dist::compute_precision::bfloat16);
      }
      for (const auto& g : geometries)
        for (bool bias : {false, true})
          for (bool data : {true, false}) {
            const auto x = random_values(g.input_size(), 31), dy = random_values(g.output_size(), 32);
            const auto w = random_values(g.weight_size(), 33);
            // Gradients accumulate onto what is there; dx is overwritten.
            std::vector<float> dw1(static_cast<std::size_t>(g.weight_size()), 0.25f), dw2 = dw1;
            std::vector<float> db1(static_cast<std::size_t>(g.out_channels), 0.5f), db2 = db1;
            std::vector<float> dx1(static_cast<std::size_t>(g.input_size()), -7.0f), dx2 = dx1;
            one.conv_backward(g, x.data(), dy.data(), w.data(), data ? dx1.data() : nullptr, dw1.data(),
                              bias ? db1.data() : nullptr);
            two.conv_backward_weights(g, x.data(), dy.data(), dw2.data(), bias ? db2.data() : nullptr);
            if (data) two.conv_backward_data(g, dy.data(), w.data(), dx2.data());
            const std::string what = g.to_string() + (bf16 ? " bfloat16" : " float32") +
                                     (o.reference ? " reference" : "") + (o.conv_winograd ? "" : " direct") +
                                     (o.split_independent ? " split" : "") + (bias ? " with bias" : "") +
                                     (data ? "" : " without dx");
            BOOST_TEST((dw1 == dw2), what << ": weight gradients differ");
            BOOST_TEST((db1 == db2), what << ": bias gradients differ");
            BOOST_TEST((dx1 == dx2), what << ": data gradients differ");
          }
    }
#if defined(DISTRIBUTE_USE_DNNL)
  // Counted at the library's seam: one reorder of dy fewer than the two passes, where both read it
  // in a blocked layout (16 and 32 channels), and as many where the data gradient reads it plain (an
  // image's 3 input channels: the GEMM-based kernel).
  for (const auto& [g, saved] : {std::pair{conv_geometry::of(1, 16, 20, 20, 32, 3, 1, 1), 1},
                                 std::pair{conv_geometry::of(1, 3, 17, 17, 16, 7, 2, 3), 0}}) {
    dist::detail::dnnl_conv conv;
    dist::detail::arena a;
    const auto x = random_values(g.input_size(), 41), dy = random_values(g.output_size(), 42),
               w = random_values(g.weight_size(), 43);
    std::vector<float> dw(static_cast<std::size_t>(g.weight_size())), dx(static_cast<std::size_t>(g.input_size()));
    conv.backward_weights(g, x.data(), dy.data(), dw.data(), nullptr, a);  // plans made, then counted
    conv.backward_data(g, dy.data(), w.data(), dx.data(), a);
    const std::size_t start = conv.reorders();
    conv.backward_weights(g, x.data(), dy.data(), dw.data(), nullptr, a);
    conv.backward_data(g, dy.data(), w.data(), dx.data(), a);
    const std::size_t apart = conv.reorders() - start;
    BOOST_TEST(conv.backward(g, x.data(), dy.data(), w.data(), dx.data(), dw.data(), nullptr, a));
    const std::size_t together = conv.reorders() - start - apart;
    BOOST_TEST(together + saved == apart, g.to_string()
                                              << ": " << apart << " reorders apart, " << together << " together");
  }
#endif
}

#if defined(DISTRIBUTE_USE_DNNL)
// An output that oneDNN writes channels last (nhwc) reaches the caller's planes (nchw) through the
// library's own transposition (dnnl_memory::planes_from_channels_last) or oneDNN's reorder, whichever
// was faster here when the plan was made: both give the same values, for channel counts and plane
// sizes that are multiples of 16 and not, and count as a reorder; inputs and outputs added to the
// caller's values keep oneDNN's reorder.
BOOST_AUTO_TEST_CASE(channels_last_outputs_are_transposed_exactly) {
  struct exposed : dist::detail::dnnl_memory {
    using dnnl_memory::data_of;
    using dnnl_memory::make_reorder;
    using dnnl_memory::md;
    using dnnl_memory::operand;
  };
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  BOOST_TEST_REQUIRE(dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success);
  BOOST_TEST_REQUIRE(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) == dnnl_success);
  for (const std::vector<dnnl_dim_t>& dims : {std::vector<dnnl_dim_t>{1, 256, 66, 66},
                                              {1, 64, 262, 262},
                                              {2, 3, 5, 7},
                                              {3, 17, 9, 11},
                                              {2, 16, 3, 1},
                                              {1, 32, 64, 64}}) {
    const auto user = exposed::md(dims, dnnl_nchw), lib = exposed::md(dims, dnnl_nhwc);
    const std::int64_t count = dims[0] * dims[1] * dims[2] * dims[3], c = dims[1], hw = dims[2] * dims[3];
    std::string what = std::to_string(dims[0]);
    for (std::size_t i = 1; i < 4; ++i) what += "x" + std::to_string(dims[i]);
    std::size_t reorders = 0;
    exposed::operand out;
    out.set(engine, user.get(), lib.get(), false, reorders, false, dims);
    BOOST_TEST_REQUIRE(out.channels_last_out, what);
    BOOST_TEST_MESSAGE(what << ": " << (out.own_transpose ? "the library's transposition" : "oneDNN's reorder")
                            << " chosen");
    dist::detail::arena a;
    std::vector<float> planes(static_cast<std::size_t>(count), -1.0f), by_onednn(planes.size(), -3.0f),
        expected(planes.size(), -2.0f);
    // The primitive's output, as it would write it: distinct values (exact in float up to 2^24).
    auto* written = reinterpret_cast<float*>(
        const_cast<std::byte*>(exposed::data_of(out.out(planes.data(), a, dist::detail::arena::dst))));
    for (std::int64_t i = 0; i < count; ++i) written[i] = static_cast<float>(i);
    out.own_transpose = true;
    out.back(stream, planes.data());
    BOOST_TEST(reorders == 1u, what);
    out.own_transpose = false;
    out.back(stream, by_onednn.data());
    BOOST_TEST(reorders == 2u, what);
    BOOST_TEST((planes == by_onednn), what << ": the two ways differ");
    // oneDNN's own reorder of the same values.
    const auto reorder = exposed::make_reorder(engine, lib.get(), user.get(), false);
    exposed::operand copy_in, copy_out;  // memory objects of the two layouts
    copy_in.set(engine, lib.get(), lib.get(), true, reorders);
    copy_out.set(engine, user.get(), user.get(), true, reorders);
    const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, copy_in.user.point(written)},
                                     {DNNL_ARG_TO, copy_out.user.point(expected.data())}};
    BOOST_TEST_REQUIRE(dnnl_primitive_execute(reorder.get(), stream, 2, args) == dnnl_success);
    BOOST_TEST_REQUIRE(dnnl_stream_wait(stream) == dnnl_success);
    BOOST_TEST((planes == expected), what << ": differs from oneDNN's reorder");
    // And by its definition: planes[b][k][q] = channels_last[b][q][k].
    bool defined = true;
    for (std::int64_t b = 0; b < dims[0]; ++b)
      for (std::int64_t k = 0; k < c; ++k)
        for (std::int64_t q = 0; q < hw; ++q)
          defined = defined &&
                    planes[static_cast<std::size_t>((b * c + k) * hw + q)] == static_cast<float>((b * hw + q) * c + k);
    BOOST_TEST(defined, what);
    // Not for an input, nor for an output added to the caller's values (oneDNN's sum post-op).
    exposed::operand input, added;
    input.set(engine, user.get(), lib.get(), true, reorders, false, dims);
    added.set(engine, user.get(), lib.get(), false, reorders, true, dims);
    BOOST_TEST(!input.channels_last_out);
    BOOST_TEST(!added.channels_last_out);
  }
  dnnl_stream_destroy(stream);
  dnnl_engine_destroy(engine);
}
#endif

BOOST_AUTO_TEST_CASE(layers_match_on_both_engines) {
  // The same layers, the same weights, one replica on each engine: outputs and every gradient.
  auto run = [](bool reference) {
    dist::one_device_strategy<> s;
    s.set_compute_options({.reference = reference});
    std::vector<std::vector<float>> out;
    s.run([&](dist::replica auto& r) {
      nn::conv2d<float> reflect{{.in_channels = 3,
                                 .out_channels = 8,
                                 .kernel = 3,
                                 .stride = 1,
                                 .padding = 1,
                                 .pad_mode = nn::padding_mode::reflect},
                                1};
      nn::conv2d<float> down{
          {.in_channels = 8, .out_channels = 6, .kernel = 4, .stride = 2, .padding = 1, .bias = false}, 2};
      nn::conv_transpose2d<float> up{
          {.in_channels = 6, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1}, 3};
      // Every bias feeds something other than a normalisation, so that its gradient is not zero.
      auto net = nn::sequential{std::move(reflect), nn::leaky_relu<float>{0.2f},
                                std::move(down),    nn::instance_norm<float>{{.channels = 6, .affine = true}, 4},
                                nn::relu<float>{},  std::move(up),
                                nn::tanh<float>{}};
      const auto x = dist::test::random_tensor<float>(shape::nchw(3, 3, 12, 10), 5);
      const auto y = net.forward(r, x);
      const auto g = dist::test::random_tensor<float>(y.shape(), 6);
      const auto dx = net.backward(r, g);
      out.emplace_back(y.begin(), y.end());
      out.emplace_back(dx.begin(), dx.end());
      net.for_each_parameter(
          [&](std::span<float>, std::span<float> grad) { out.emplace_back(grad.begin(), grad.end()); });
    });
    return out;
  };
  const auto fast = run(false), ref = run(true);
  BOOST_TEST_REQUIRE(fast.size() == ref.size());
  for (std::size_t i = 0; i < fast.size(); ++i) {
    const double err = relative(fast[i], ref[i]);
    BOOST_TEST(err < 1e-4, "tensor " << i << " (0: y, 1: dx, then parameter gradients): relative difference " << err);
  }
}

BOOST_AUTO_TEST_CASE(each_replica_gets_its_share_of_the_cores) {
  const int cores = static_cast<int>(std::max(1u, dist::detail::usable_hardware_threads()));
  dist::one_device_strategy<> one;
  one.run([&](dist::replica auto& r) { BOOST_TEST(r.engine().threads() == cores); });
  for (int n : {1, 2, 3}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    auto threads = s.run([](dist::replica auto& r) { return r.engine().threads(); });
    for (int t : threads) BOOST_TEST(t == std::max(1, cores / n), n << " replicas: an engine with " << t << " threads");
    // The primary alone, between mirrored blocks, has every core.
    BOOST_TEST(s.run_on_primary([](auto& r) { return r.engine().threads(); }) == cores);
    // Every replica has its own engine (its own caches and scratch).
    auto addresses = s.run([](dist::replica auto& r) { return reinterpret_cast<std::uintptr_t>(&r.engine()); });
    std::vector<std::uintptr_t> a(addresses.begin(), addresses.end());
    std::sort(a.begin(), a.end());
    BOOST_TEST((std::adjacent_find(a.begin(), a.end()) == a.end()));
  }
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  s.set_compute_options({.threads = 3});
  for (int t : s.run([](dist::replica auto& r) { return r.engine().threads(); })) BOOST_TEST(t == 3);
}

// compute_options::adapt_threads (the default) with threads busy on every core: the engine's team
// waits for a CPU, so it steps down (the decision itself: core.thread_governor_decision), and
// computes the same bits as an engine whose count is fixed. Off, the count never moves, and the
// engine says once on stderr that its threads wait for the cores (saw_crowding).
BOOST_AUTO_TEST_CASE(adapt_threads_steps_down_while_other_threads_keep_the_cores_busy) {
  const int cores = static_cast<int>(std::max(1u, dist::detail::usable_hardware_threads()));
  BOOST_TEST(dist::compute_options{}.adapt_threads);
  dist::engine<dist::cpu> fixed{{.threads = 2, .adapt_threads = false}};
  dist::engine<dist::cpu> adapting{{.threads = 2}};
  BOOST_TEST(adapting.threads() == 2);
  BOOST_TEST(adapting.active_threads() == 2);
  const auto g = conv_geometry::of(4, 16, 20, 20, 32, 3, 1, 1);
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < cores; ++i)
    busy.emplace_back([&stop] {
      volatile double x = 1.0;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  int least = 2;
  double worst = 0;
  const auto start = std::chrono::steady_clock::now();
  // (The fixed engine says once, on stderr, that its threads wait for the cores: saw_crowding.)
  while ((least == 2 || !fixed.saw_crowding()) && std::chrono::steady_clock::now() - start < std::chrono::seconds(8)) {
    worst = std::max(worst, compare_engines(adapting, fixed, g, true));
    least = std::min(least, adapting.active_threads());
  }
  stop = true;
  for (auto& t : busy) t.join();
  BOOST_TEST(worst == 0.0, "adapting against fixed: relative difference " << worst);
  BOOST_TEST(fixed.active_threads() == 2);
  BOOST_TEST(!adapting.saw_crowding());  // it adapts instead of saying so
#if defined(_OPENMP)
  if (dist::detail::team_run_delay::available()) {
    BOOST_TEST(least == 1,
               "with " << cores << " busy threads on " << cores << " cores the engine kept 2 threads for 8 s");
    BOOST_TEST(fixed.saw_crowding(),
               "with " << cores << " busy threads on " << cores << " cores a fixed engine saw no crowding in 8 s");
  } else BOOST_TEST_MESSAGE("this kernel reports no run delay: adapt_threads keeps the count");
#else
  BOOST_TEST(least == 2);  // without OpenMP there is nothing to adapt
#endif
}

// Every sum is split by the configured thread count, never by the count in use: oneDNN's weight
// gradients in a grid of one-thread pieces (dnnl_conv.hpp), matrix products and the reference's in
// parts of one thread each (eigen_gemm.hpp). Each geometry below, on engines of 2 and 3 threads, gives
// the same bits with every count in use (set_active_threads, as adapt_threads does on a busy
// machine), for the forward pass, both gradients and the bias gradient, and matches the reference:
// a batch of one and of several (the runs of examples), channels in whole blocks of 16 and not (an
// image's 3, a 3-channel output, 4 in blocks of 8), Winograd's and direct kernels, oneDNN's gemm-based
// bfloat16 weight gradient (plain weights: its pieces add into the caller's block as they are), the
// gradients of a convolution that swaps sides, and with and without a bias.
// The convolutions whose passes the count-in-use tests run: the library's layers' kinds of shape.
const std::vector<conv_geometry>& count_in_use_geometries() {
  static const std::vector<conv_geometry> geometries{
      conv_geometry::of(1, 3, 38, 38, 32, 7, 1, 0),  conv_geometry::of(1, 32, 34, 34, 64, 3, 2, 1),
      conv_geometry::of(1, 64, 34, 34, 64, 3, 1, 0), conv_geometry::of(1, 32, 38, 38, 3, 7, 1, 0),
      conv_geometry::of(4, 16, 18, 18, 16, 3, 1, 0), conv_geometry::of(5, 32, 36, 36, 48, 3, 1, 0),
      conv_geometry::of(3, 48, 20, 20, 3, 4, 2, 1),  conv_geometry::of(8, 1, 20, 20, 16, 7, 1, 0),
      conv_geometry::of(2, 4, 8, 7, 4, 3, 1, 0),      // (oneDNN blocks 4 channels by 8 on AVX2 and AVX-512)
      conv_geometry::of(3, 16, 21, 19, 1, 4, 1, 1),   // one channel out: the swapped convolution's passes
      conv_geometry::of(1, 3, 40, 40, 32, 7, 1, 6)};  // (bfloat16: oneDNN's gemm-based kernel, plain weights)
  return geometries;
}

BOOST_AUTO_TEST_CASE(every_count_in_use_gives_the_same_bits) {
  const auto& geometries = count_in_use_geometries();
  std::vector<bool> precisions{false};
  if (dist::detail::cpu_has_bf16_units()) precisions.push_back(true);
  for (const bool half : precisions)
    for (const auto& g : geometries)
      for (const bool bias : {false, true}) {
        const auto x = random_values(g.input_size(), 21), w = random_values(g.weight_size(), 22);
        const auto dy = random_values(g.output_size(), 23), b = random_values(g.out_channels, 24);
        const auto passes = [&](dist::engine<dist::cpu>& e) {
          std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size()));
          std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.25f),
              db(static_cast<std::size_t>(g.out_channels), 0.5f);
          e.conv_forward(g, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
          e.conv_backward(g, x.data(), dy.data(), w.data(), dx.data(), dw.data(), bias ? db.data() : nullptr);
          y.insert(y.end(), dx.begin(), dx.end());
          y.insert(y.end(), dw.begin(), dw.end());
          if (bias) y.insert(y.end(), db.begin(), db.end());
          return y;
        };
        dist::engine<dist::cpu> reference{{.threads = 1, .reference = true}};
        if (half) reference.use_precision(dist::compute_precision::bfloat16);
        const auto expected = passes(reference);
        for (const int threads : {2, 3}) {
          dist::engine<dist::cpu> e{{.threads = threads, .adapt_threads = false}};
          if (half) e.use_precision(dist::compute_precision::bfloat16);
          const auto all = passes(e);
          BOOST_TEST(relative(all, expected) < 1e-4, g.to_string() << " bias " << bias << " half " << half);
          for (int in_use = threads - 1; in_use >= 1; --in_use) {
            e.set_active_threads(in_use);
            BOOST_TEST(e.active_threads() == in_use);
            BOOST_TEST((passes(e) == all), g.to_string() << " bias " << bias << " half " << half << ": " << in_use
                                                         << " of " << threads << " threads in use");
          }
        }
      }
  // Matrix products (a linear layer's three), and the reference's convolutions.
  for (const auto& [m, n, k, ta, tb] :
       {std::tuple{8L, 64L, 512L, false, false}, std::tuple{300L, 200L, 700L, false, true},
        std::tuple{64L, 1000L, 512L, true, false}, std::tuple{200L, 48L, 900L, true, true}}) {
    const auto a = random_values(m * k, 25), b = random_values(k * n, 26);
    const dist::gemm_geometry gg{.m = m, .n = n, .k = k, .transpose_a = ta, .transpose_b = tb, .accumulate = true};
    dist::engine<dist::cpu> e{{.threads = 3, .adapt_threads = false}};
    std::vector<float> first;
    for (int in_use = 3; in_use >= 1; --in_use) {
      e.set_active_threads(in_use);
      std::vector<float> c(static_cast<std::size_t>(m * n), 1.0f);
      e.gemm(gg, a.data(), b.data(), c.data());
      if (first.empty()) first = c;
      else
        BOOST_TEST((c == first), "product " << m << "x" << n << "x" << k << ": " << in_use << " of 3 threads in use");
    }
  }
  const auto g = conv_geometry::of(2, 16, 34, 34, 32, 3, 1, 0);
  const auto x = random_values(g.input_size(), 27), w = random_values(g.weight_size(), 28),
             dy = random_values(g.output_size(), 29);
  dist::engine<dist::cpu> e{{.threads = 3, .reference = true, .adapt_threads = false}};
  std::vector<float> first;
  for (int in_use = 3; in_use >= 1; --in_use) {
    e.set_active_threads(in_use);
    std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size()));
    std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.0f);
    e.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), y.data());
    e.conv_backward(g, x.data(), dy.data(), w.data(), dx.data(), dw.data(), static_cast<float*>(nullptr));
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    if (first.empty()) first = y;
    else BOOST_TEST((y == first), "the reference: " << in_use << " of 3 threads in use");
  }
  BOOST_TEST(e.active_threads() == 1);
  e.set_active_threads(7);
  BOOST_TEST(e.active_threads() == 3);  // never more than its count
}

#if DISTRIBUTE_HAS_DNNL
// Which passes may run on fewer threads than configured is a rule of the kernel oneDNN names, not of
// the CPU the suite runs on: kernels of other CPUs (AMX, brgemm) by their names, then every pass of the
// count-in-use geometries as this CPU's oneDNN makes them, checked against the rule and listed with
// the ISA (so a log says whether AMX kernels were exercised). every_count_in_use_gives_the_same_bits
// checks the bits the engine gets by it.
BOOST_AUTO_TEST_CASE(passes_run_on_fewer_threads_only_where_their_kernel_keeps_its_order) {
  using conv = dist::detail::dnnl_conv;
  using rule = conv::thread_rule;
  using pass = conv::pass;
  // Names oneDNN 2.6 and 3.x report on AVX-512, Zen 4, and Sapphire Rapids with AMX.
  BOOST_TEST((conv::rule_for(pass::forward, "jit:avx512_core", false) == rule::per_output));
  BOOST_TEST((conv::rule_for(pass::forward, "jit_wino_4x3:avx512_core", false) == rule::per_output));
  BOOST_TEST((conv::rule_for(pass::forward, "jit:avx512_core_bf16", false) == rule::per_output));
  BOOST_TEST((conv::rule_for(pass::forward, "jit_bf16:avx512_core_bf16", false) == rule::per_output));
  BOOST_TEST((conv::rule_for(pass::forward, "ref:any", false) == rule::per_output));
  BOOST_TEST((conv::rule_for(pass::backward_data, "jit:avx2", false) ==
              (conv::data_gradient_follows_thread_count ? rule::fixed_count : rule::per_output)));
  BOOST_TEST((conv::rule_for(pass::forward, "gemm:jit", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::backward_data, "x64:gemm:jit", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::forward, "jit:avx512_core_amx_bf16", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::forward, "brgconv:avx512_core_amx_bf16", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::backward_data, "brgconv_strided:avx10_1_512_amx", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::forward, "some_future_kernel:avx10_2", false) == rule::fixed_count));
  // A weight gradient oneDNN computes whole splits the batch between its threads (the AMX one that
  // made the bits follow the count), whatever its name; in pieces it keeps them with any.
  BOOST_TEST((conv::rule_for(pass::backward_weights, "jit:avx512_core_amx_bf16", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::backward_weights, "jit:avx512_core", false) == rule::fixed_count));
  BOOST_TEST((conv::rule_for(pass::backward_weights, "jit:avx512_core_amx_bf16", true) == rule::pieces));
  // The engine's own Winograd keeps its bits on any count, weight gradient included (its items are fixed).
  BOOST_TEST((conv::rule_for(pass::backward_weights, dist::detail::winograd_f4x3::name, false) == rule::per_output));

  BOOST_TEST_MESSAGE("oneDNN " << conv::library() << " on ISA " << conv::isa());
  std::vector<bool> precisions{false};
  if (dist::detail::cpu_has_bf16_units()) precisions.push_back(true);
  int fewer = 0, configured = 0;
  for (const bool half : precisions)
    for (const auto& g : count_in_use_geometries())
      for (const pass which : {pass::forward, pass::backward_data, pass::backward_weights})
        for (const bool bias : {false, true}) {
          if (which == pass::backward_data && bias) continue;
          const bool wino = conv::winograd_pays(g);
          conv d{3};
          const dist::detail::openmp_thread_count all{3};
          const std::string kernel = d.implementation(which, g, bias, half, wino);
          if (kernel.empty()) continue;  // no bfloat16 kernel: the engine computes it another way
          const rule r = d.rule(which, g, bias, half, wino);
          const bool pieces = which == pass::backward_weights && d.in_pieces(g, bias, half, wino);
          BOOST_TEST_MESSAGE(g.to_string() << (half ? " bf16 " : " f32 ") << static_cast<int>(which) << " bias " << bias
                                           << ": " << kernel << ": " << conv::to_string(r));
          // The plan's rule is the rule of its kernel's name; a weight gradient never runs on fewer
          // threads unless in pieces, nor does a kernel the rule does not know.
          BOOST_TEST((r == conv::rule_for(which, kernel, pieces)), g.to_string() << " " << kernel);
          // (The engine's own Winograd sums each weight gradient's element on one thread.)
          if (which == pass::backward_weights && kernel != dist::detail::winograd_f4x3::name)
            BOOST_TEST((r != rule::per_output), g.to_string() << " " << kernel);
          if (r == rule::fixed_count) ++configured;
          else ++fewer;
        }
  BOOST_TEST_MESSAGE(fewer << " passes may run on fewer threads than configured, " << configured
                           << " on the configured count");
  BOOST_TEST(fewer + configured > 0);
}

// Where a pass could run Winograd or the direct kernel, the timed choice (the default) keeps the
// faster by the margin, once, before the pass's first result: with a timer that makes the direct
// kernel faster the engine computes direct convolution's bits (those of conv_winograd = false) at
// every step, times each candidate once, and reports the choice; a Winograd that is not slower by a
// third keeps Winograd; `rule` never times. In float32 and, where the CPU has bf16 units, bfloat16.
BOOST_AUTO_TEST_CASE(the_timed_kernel_choice_keeps_the_faster_once_and_its_bits_after) {
  const auto g = conv_geometry::of(1, 32, 34, 34, 32, 3, 1, 0);
  BOOST_TEST_REQUIRE(dist::detail::dnnl_conv::winograd_pays(g));
  const auto x = random_values(g.input_size(), 41), w = random_values(g.weight_size(), 42),
             dy = random_values(g.output_size(), 43);
  const auto steps = [&](dist::engine<dist::cpu>& e) {
    std::vector<std::vector<float>> out;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size()));
      std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.0f);
      e.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), y.data());
      e.conv_backward(g, x.data(), dy.data(), w.data(), dx.data(), dw.data(), static_cast<float*>(nullptr));
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dw.begin(), dw.end());
      out.push_back(std::move(y));
    }
    return out;
  };
  std::vector<bool> precisions{false};
  if (dist::detail::cpu_has_bf16_units()) precisions.push_back(true);
  for (const bool half : precisions) {
    const auto precision = half ? dist::compute_precision::bfloat16 : dist::compute_precision::float32;
    const auto make = [&](dist::compute_options o) {
      o.threads = 2;
      o.precision = precision;
      return o;
    };
    dist::engine<dist::cpu> wino{make({.cpu_conv_choice = dist::conv_choice::rule})},
        direct{make({.conv_winograd = false})};
    const auto wino_bits = steps(wino), direct_bits = steps(direct);
    BOOST_TEST_REQUIRE((wino_bits[0] != direct_bits[0]), "Winograd and direct give other bits (half " << half << ")");

    // Direct takes 0.6 of Winograd's time: the engine takes it, and computes its bits at every step.
    int timed = 0;
    dist::engine<dist::cpu> faster_direct{make({})};
    faster_direct.set_conv_timer([&](const dist::conv_choice_record& r, bool winograd) {
      ++timed;
      BOOST_TEST((r.geometry == g));
      return winograd ? 1.0 : 0.6;
    });
    const auto chose_direct = steps(faster_direct);
    for (const auto& step : chose_direct) BOOST_TEST((step == direct_bits[0]), "half " << half);
    BOOST_TEST(timed == 6);  // two candidates, three passes, once
    const auto choices = faster_direct.conv_choices();
    BOOST_TEST_REQUIRE(choices.size() == 3u);
    for (const auto& c : choices) {
      BOOST_TEST(!c.use_alternative);
      BOOST_TEST((c.alternative == dist::conv_alternative::winograd));
      BOOST_TEST((c.precision == precision));
      BOOST_TEST(c.direct_seconds == 0.6);
      BOOST_TEST_MESSAGE(c.to_string());
    }

    // Direct at 0.7 of Winograd's time is inside the margin: Winograd stays.
    dist::engine<dist::cpu> close{make({})};
    close.set_conv_timer([](const dist::conv_choice_record&, bool winograd) { return winograd ? 1.0 : 0.7; });
    for (const auto& step : steps(close)) BOOST_TEST((step == wino_bits[0]), "half " << half);
    for (const auto& c : close.conv_choices()) BOOST_TEST(c.use_alternative);

    // The rule times nothing.
    dist::engine<dist::cpu> ruled{make({.cpu_conv_choice = dist::conv_choice::rule})};
    ruled.set_conv_timer([&](const dist::conv_choice_record&, bool) {
      BOOST_FAIL("the rule timed a pass");
      return 0.0;
    });
    BOOST_TEST((steps(ruled)[2] == wino_bits[0]));
    BOOST_TEST(ruled.conv_choices().empty());
  }
  // Timed for real, the choice is made once per case for the process and reported with its times.
  dist::engine<dist::cpu> real{{.threads = 2}}, again{{.threads = 2}};
  const auto first = steps(real);
  BOOST_TEST((first[2] == first[0]));
  BOOST_TEST((steps(again)[0] == first[0]), "a second engine of the process uses the same choices");
  std::size_t ours = 0;
  conv_geometry other_batch = g;
  other_batch.batch = 5;
  for (const auto& c : real.conv_choices())
    if (c.same_case({.pass = c.pass, .geometry = other_batch, .precision = dist::compute_precision::float32})) {
      ++ours;
      BOOST_TEST(c.alternative_seconds > 0.0);
      BOOST_TEST(c.direct_seconds > 0.0);
      BOOST_TEST(c.use_alternative == !(c.direct_seconds * 1.5 <= c.alternative_seconds));
      BOOST_TEST_MESSAGE("timed here: " << c.to_string());
    }
  BOOST_TEST(ours == 3u);
}

// The choices file: a choice made in one process is read by the next on the same machine (and not on
// another), without timing again; lines that do not parse are ignored.
BOOST_AUTO_TEST_CASE(kernel_choices_persist_per_machine_in_the_choices_file) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("distribute_conv_choices_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path file = dir / "sub" / "choices.txt";
  const dist::conv_choice_record wanted{.pass = dist::conv_pass::backward_weights,
                                        .geometry = conv_geometry::of(2, 64, 34, 34, 64, 3, 1, 0),
                                        .precision = dist::compute_precision::bfloat16,
                                        .threads = 2};
  int timed = 0;
  const auto time = [&](dist::conv_choice_record& r) {
    ++timed;
    r.alternative_seconds = 0.004;
    r.direct_seconds = 0.002;
    r.use_alternative = false;
  };
  {
    dist::detail::conv_choice_table first{file, "machine A"};
    BOOST_TEST(first.find(wanted) == nullptr);
    BOOST_TEST(!first.decide(wanted, time).use_alternative);
    BOOST_TEST(timed == 1);
  }
  BOOST_TEST_REQUIRE(fs::exists(file));
  // A narrow forward's choice (the swapped form against the direct kernel) is a case of its own.
  const dist::conv_choice_record narrow{.pass = dist::conv_pass::forward,
                                        .geometry = conv_geometry::of(1, 64, 38, 38, 3, 7, 1, 0),
                                        .precision = dist::compute_precision::float32,
                                        .threads = 2,
                                        .alternative = dist::conv_alternative::swapped};
  {
    dist::detail::conv_choice_table first{file, "machine A"};
    BOOST_TEST(first.find(narrow) == nullptr);
    BOOST_TEST(first
                   .decide(narrow,
                           [&](dist::conv_choice_record& r) {
                             ++timed;
                             r.alternative_seconds = 0.001;
                             r.direct_seconds = 0.003;
                             r.use_alternative = true;
                           })
                   .use_alternative);
    BOOST_TEST(timed == 2);
  }
  // Lines that do not parse are ignored, those of the older format without the alternative too.
  const dist::conv_choice_record older{.pass = dist::conv_pass::forward,
                                       .geometry = conv_geometry::of(1, 64, 34, 34, 64, 3, 1, 0),
                                       .precision = dist::compute_precision::float32};
  {
    std::ofstream(file, std::ios::app) << "garbage without a tab\nmachine A\t9 9 9\n"
                                       << "machine A\t0 64 34 34 64 3 1 0 32 32 0 direct 4 2\n";
  }
  dist::conv_choice_record other_batch = wanted;
  other_batch.geometry.batch = 7;  // a choice holds whatever the batch
  dist::detail::conv_choice_table second{file, "machine A"};
  const auto* read = second.find(other_batch);
  BOOST_TEST_REQUIRE(read != nullptr);
  BOOST_TEST(read->from_file);
  BOOST_TEST(!read->use_alternative);
  BOOST_TEST((read->alternative == dist::conv_alternative::winograd));
  BOOST_TEST(read->direct_seconds == 0.002);
  BOOST_TEST(!second.decide(other_batch, time).use_alternative);
  BOOST_TEST(timed == 2);  // not timed again
  BOOST_TEST(second.find(older) == nullptr);
  const auto* swapped = second.find(narrow);
  BOOST_TEST_REQUIRE(swapped != nullptr);
  BOOST_TEST((swapped->alternative == dist::conv_alternative::swapped));
  BOOST_TEST(swapped->use_alternative);
  BOOST_TEST(swapped->alternative_seconds == 0.001);
  BOOST_TEST(swapped->to_string().find("swapped 1.00 ms, direct 3.00 ms: swapped") != std::string::npos,
             swapped->to_string());
  dist::conv_choice_record narrow_winograd = narrow;  // (the same pass and shape, another candidate)
  narrow_winograd.alternative = dist::conv_alternative::winograd;
  BOOST_TEST(second.find(narrow_winograd) == nullptr);
  BOOST_TEST(second.all().size() == 2u);
  BOOST_TEST(read->to_string().find("from an earlier run") != std::string::npos, read->to_string());
  dist::detail::conv_choice_table elsewhere{file, "machine B"};
  BOOST_TEST(elsewhere.find(wanted) == nullptr);
  dist::detail::conv_choice_table unnamed{file, ""};  // no machine named yet: the file is not read
  BOOST_TEST(unnamed.find(wanted) == nullptr);
  fs::remove_all(dir);
}

// The forward of a convolution with few output channels from many (swaps_sides: a generator's last
// layer) is timed against its swapped form, the swapped convolution's data gradient: the engine takes
// that where it takes at most two thirds of the direct kernel's time, with the same bits at every
// later call, close to the reference's; inside the margin, and by the rule, the direct kernel stays.
// In float32, and in bfloat16 where the CPU has bf16 units. Timed for real, the record holds both
// times and the choice they give.
BOOST_AUTO_TEST_CASE(a_narrow_forward_takes_its_swapped_form_where_timed_faster) {
  const auto g = conv_geometry::of(2, 16, 20, 20, 3, 7, 1, 3);  // 16 -> 3 channels, 7x7, padding 3
  BOOST_TEST_REQUIRE(dist::detail::dnnl_conv::swaps_sides(g));
  BOOST_TEST(!dist::detail::dnnl_conv::swaps_sides(conv_geometry::of(2, 16, 20, 20, 8, 7, 1, 3)));  // 8 out: blocks fit
  const auto x = random_values(g.input_size(), 31), w = random_values(g.weight_size(), 32);
  const auto b = random_values(g.out_channels, 33);
  const auto forward = [&](dist::engine<dist::cpu>& e) {
    std::vector<float> y(static_cast<std::size_t>(g.output_size()), -7.0f);
    e.conv_forward(g, x.data(), w.data(), b.data(), y.data());
    return y;
  };
  dist::engine<dist::cpu> ref{{.reference = true}};
  const auto reference = forward(ref);
  std::vector<bool> precisions{false};
  if (dist::detail::cpu_has_bf16_units()) precisions.push_back(true);
  std::vector<float> first_float32, direct_float32;
  for (const bool half : precisions) {
    const auto precision = half ? dist::compute_precision::bfloat16 : dist::compute_precision::float32;
    const double tolerance = half ? 2e-2 : 2e-5;  // (bfloat16: the inputs rounded to 8 bits)
    const auto make = [&](dist::compute_options o) {
      o.threads = 2;
      o.precision = precision;
      return o;
    };
    dist::engine<dist::cpu> ruled{make({.cpu_conv_choice = dist::conv_choice::rule})};
    ruled.set_conv_timer([](const dist::conv_choice_record&, bool) {
      BOOST_FAIL("the rule timed a pass");
      return 0.0;
    });
    const auto direct = forward(ruled);
    BOOST_TEST(ruled.conv_choices().empty());
    BOOST_TEST(relative(direct, reference) < tolerance, "half " << half);

    // The swapped form at 0.6 of the direct kernel's time: taken, once, with its own bits every time.
    int timed = 0;
    dist::engine<dist::cpu> faster_swapped{make({})};
    faster_swapped.set_conv_timer([&](const dist::conv_choice_record& r, bool swapped) {
      ++timed;
      BOOST_TEST((r.alternative == dist::conv_alternative::swapped));
      BOOST_TEST((r.pass == dist::conv_pass::forward));
      BOOST_TEST((r.precision == precision));
      BOOST_TEST((r.geometry == g));
      return swapped ? 0.6 : 1.0;
    });
    const auto first = forward(faster_swapped);
    BOOST_TEST((forward(faster_swapped) == first), "half " << half);
    BOOST_TEST(timed == 2);
    BOOST_TEST(first != direct, "the swapped form sums in another order: other bits (half " << half << ")");
    BOOST_TEST(relative(first, reference) < tolerance, "half " << half);
    const auto choices = faster_swapped.conv_choices();
    BOOST_TEST_REQUIRE(choices.size() == 1u);
    BOOST_TEST(choices[0].use_alternative);
    BOOST_TEST_MESSAGE(choices[0].to_string());
    // At 0.7 it is inside the margin: the direct kernel stays, with its bits.
    dist::engine<dist::cpu> close{make({})};
    close.set_conv_timer([](const dist::conv_choice_record&, bool swapped) { return swapped ? 0.7 : 1.0; });
    BOOST_TEST((forward(close) == direct), "half " << half);
    BOOST_TEST_REQUIRE(close.conv_choices().size() == 1u);
    BOOST_TEST(!close.conv_choices()[0].use_alternative);
    if (!half) {
      first_float32 = first;
      direct_float32 = direct;
    }
  }

  // Timed for real (float32): one record of the process for this case, with both times and their
  // choice, and the result of the kernel chosen.
  dist::engine<dist::cpu> real{{.threads = 2}};
  const auto timed_result = forward(real);
  std::size_t ours = 0;
  for (const auto& c : real.conv_choices())
    if (c.same_case({.pass = dist::conv_pass::forward,
                     .geometry = g,
                     .precision = dist::compute_precision::float32,
                     .alternative = dist::conv_alternative::swapped})) {
      ++ours;
      BOOST_TEST(c.alternative_seconds > 0.0);
      BOOST_TEST(c.direct_seconds > 0.0);
      BOOST_TEST(c.use_alternative == (c.alternative_seconds * 1.5 <= c.direct_seconds));
      BOOST_TEST_MESSAGE("timed here: " << c.to_string());
      if (c.use_alternative) BOOST_TEST((timed_result == first_float32), "the swapped form's bits");
      else BOOST_TEST((timed_result == direct_float32), "the direct kernel's bits");
    }
  BOOST_TEST(ours == 1u);
}

// The grid of a weight gradient's pieces reads the geometry and the configured count only: as many
// runs of examples as the batch allows, then blocks of 16 input channels, then output channels.
BOOST_AUTO_TEST_CASE(weight_gradients_in_pieces_follow_the_geometry_and_the_configured_count) {
  const auto grid = [](int pieces, const conv_geometry& g) {
    dist::detail::dnnl_conv conv{pieces};
    const auto s = conv.weight_grid(g, false, false, dist::detail::dnnl_conv::winograd_pays(g));
    return std::tuple{s.runs, s.in_blocks, s.out_blocks};
  };
  using t = std::tuple<std::int64_t, std::int64_t, std::int64_t>;
  BOOST_TEST((grid(2, conv_geometry::of(1, 256, 18, 18, 256, 3, 1, 0)) == t{1, 2, 1}));  // a residual block's
  BOOST_TEST((grid(2, conv_geometry::of(1, 3, 38, 38, 64, 7, 1, 0)) == t{1, 1, 2}));     // an image in: output blocks
  BOOST_TEST((grid(2, conv_geometry::of(1, 64, 38, 38, 3, 7, 1, 0)) == t{1, 2, 1}));     // an image out: input blocks
  BOOST_TEST((grid(2, conv_geometry::of(8, 1, 20, 20, 16, 7, 1, 0)) == t{2, 1, 1}));     // a batch: runs of examples
  BOOST_TEST((grid(4, conv_geometry::of(2, 64, 20, 20, 64, 3, 1, 1)) == t{2, 2, 1}));
  BOOST_TEST((grid(1, conv_geometry::of(1, 256, 18, 18, 256, 3, 1, 0)) == t{1, 1, 1}));  // one thread: one primitive
}

// Where oneDNN's weight gradient reads x and dy channels last (nhwc: its AMX kernels in bfloat16) and
// the cut is asked for (the engine does not: measured slower), the pieces are blocks of output
// channels over the whole batch, each gathering its channels of dy, and examples are split only where
// those are too few; the gradient is that of the reference within bfloat16's products' rounding, its
// bits are the same with any count of threads in use, and the pieces run the kernel the whole pass
// would. Without the cut (the engine's planner) a batch of one stays one primitive on the configured
// count and a batch splits its examples. A CPU whose oneDNN chooses other layouts in bfloat16 (no
// AMX) computes these passes as before; the test says which it covered.
BOOST_AUTO_TEST_CASE(channels_last_weight_gradients_are_cut_over_output_channels) {
  using conv = dist::detail::dnnl_conv;
  if (!dist::detail::cpu_has_bf16_units()) {
    BOOST_TEST_MESSAGE("no bfloat16 units: oneDNN has no channels-last bfloat16 weight gradient here");
    return;
  }
  struct k {
    conv_geometry g;
    int pieces;
    std::int64_t runs, out_blocks;
  };
  const std::vector<k> cases{
      {conv_geometry::of(1, 64, 34, 34, 64, 3, 1, 0), 2, 1, 2},   // a residual block's, batch 1
      {conv_geometry::of(1, 64, 34, 34, 64, 3, 1, 0), 3, 1, 4},   // 4 blocks: the fewest parts reaching 3
      {conv_geometry::of(1, 32, 18, 18, 48, 3, 1, 1), 2, 1, 3},   // 3 blocks: all of them
      {conv_geometry::of(3, 32, 18, 18, 32, 4, 2, 1), 2, 1, 2},   // a batch: still the channels, whole batch
      {conv_geometry::of(4, 32, 12, 12, 16, 3, 1, 1), 2, 2, 1}};  // one block: runs of examples
  int covered = 0;
  for (const auto& c : cases) {
    const auto& g = c.g;
    conv d{c.pieces, true};
    const std::string kernel = d.implementation(conv::pass::backward_weights, g, true, true, false);
    const auto grid = d.weight_grid(g, true, true, false);
    BOOST_TEST_MESSAGE(g.to_string() << " on " << c.pieces << " threads: " << kernel << ", grid " << grid.runs << " x "
                                     << grid.in_blocks << " x " << grid.out_blocks
                                     << (grid.channels_last ? ", channels last" : ""));
    if (!grid.channels_last) continue;
    ++covered;
    BOOST_TEST(grid.runs == c.runs, g.to_string());
    BOOST_TEST(grid.in_blocks == 1, g.to_string());
    BOOST_TEST(grid.out_blocks == c.out_blocks, g.to_string());
    BOOST_TEST((d.rule(conv::pass::backward_weights, g, true, true, false) == conv::thread_rule::pieces));
    // The pieces' kernel is the whole pass's: the one-primitive planner's choice.
    conv whole{1};
    BOOST_TEST(whole.implementation(conv::pass::backward_weights, g, true, true, false) == kernel, g.to_string());
    // Without the cut: examples alone, and a batch too small for them one primitive.
    conv engines{c.pieces};
    const auto plain = engines.weight_grid(g, true, true, false);
    BOOST_TEST(plain.out_blocks == 1, g.to_string());
    BOOST_TEST(engines.in_pieces(g, true, true, false) == (g.batch >= c.pieces), g.to_string());

    const auto x = random_values(g.input_size(), 51), dy = random_values(g.output_size(), 52);
    dist::engine<dist::cpu> reference{{.threads = 1, .reference = true}};
    reference.use_precision(dist::compute_precision::bfloat16);
    std::vector<float> dw_ref(static_cast<std::size_t>(g.weight_size()), 0.25f),
        db_ref(static_cast<std::size_t>(g.out_channels), 0.5f);
    reference.conv_backward_weights(g, x.data(), dy.data(), dw_ref.data(), db_ref.data());
    std::vector<float> first;
    for (int in_use = c.pieces; in_use >= 1; --in_use) {
      const dist::detail::openmp_thread_count threads{in_use};
      dist::detail::arena a;
      std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.25f),
          db(static_cast<std::size_t>(g.out_channels), 0.5f);
      BOOST_TEST_REQUIRE(d.backward_weights(g, x.data(), dy.data(), dw.data(), db.data(), a, true));
      BOOST_TEST(relative(dw, dw_ref) < 1e-4, g.to_string() << ": the weight gradient on " << in_use);
      BOOST_TEST(relative(db, db_ref) < 1e-5, g.to_string() << ": the bias gradient on " << in_use);
      dw.insert(dw.end(), db.begin(), db.end());
      if (first.empty()) first = dw;
      else BOOST_TEST((dw == first), g.to_string() << ": " << in_use << " of " << c.pieces << " threads in use");
    }
  }
  BOOST_TEST_MESSAGE(covered << " of " << cases.size() << " weight gradients were channels last on ISA " << conv::isa()
                             << (covered == 0 ? ": this CPU's oneDNN chose other layouts, none exercised" : ""));
}
#endif

#if DISTRIBUTE_HAS_DNNL
// A convolution with few output channels from many computes its gradients as passes of its swapped
// convolution (dnnl_conv.hpp): the rule, the swapped geometry, and gradients that match the reference
// with the window turned and the bias gradient summed apart, through dnnl_conv (the engine's passes
// over such shapes are in fast_convolutions_match_the_reference and every_count_in_use_gives_the_same_bits).
BOOST_AUTO_TEST_CASE(narrow_outputs_take_their_gradients_from_the_swapped_convolution) {
  using conv = dist::detail::dnnl_conv;
  BOOST_TEST(conv::swaps_sides(conv_geometry::of(1, 64, 262, 262, 3, 7, 1, 0)));  // a generator's last layer
  BOOST_TEST(conv::swaps_sides(conv_geometry::of(1, 512, 31, 31, 1, 4, 1, 1)));   // a PatchGAN's last
  BOOST_TEST(!conv::swaps_sides(conv_geometry::of(1, 64, 34, 34, 3, 4, 2, 1)));   // stride 2
  BOOST_TEST(!conv::swaps_sides(conv_geometry::of(1, 64, 34, 34, 8, 3, 1, 1)));   // a block of 8 out
  BOOST_TEST(!conv::swaps_sides(conv_geometry::of(1, 8, 34, 34, 3, 3, 1, 1)));    // few channels in too
  conv_geometry short_output = conv_geometry::of(1, 64, 34, 34, 3, 3, 1, 0);
  short_output.out_height = 31;  // the window leaves the last input row unused: no swapped geometry
  BOOST_TEST(!conv::swaps_sides(short_output));
  BOOST_TEST((conv::swapped(conv_geometry::of(2, 64, 262, 262, 3, 7, 1, 0)) ==
              conv_geometry::of(2, 3, 256, 256, 64, 7, 1, 6)));
  BOOST_TEST(
      (conv::swapped(conv_geometry::of(1, 512, 31, 31, 1, 4, 1, 1)) == conv_geometry::of(1, 1, 30, 30, 512, 4, 1, 2)));

  std::vector<bool> precisions{false};
  if (dist::detail::cpu_has_bf16_units()) precisions.push_back(true);
  for (const bool half : precisions)
    for (const auto& g : {conv_geometry::of(2, 32, 20, 18, 3, 7, 1, 0), conv_geometry::of(2, 48, 12, 13, 1, 4, 1, 1),
                          conv_geometry::of(1, 16, 9, 9, 5, 3, 1, 1)}) {
      BOOST_TEST_REQUIRE(conv::swaps_sides(g));
      const auto x = random_values(g.input_size(), 31), w = random_values(g.weight_size(), 32),
                 dy = random_values(g.output_size(), 33);
      dist::engine<dist::cpu> reference{{.threads = 1, .reference = true}};
      if (half) reference.use_precision(dist::compute_precision::bfloat16);
      std::vector<float> dx_ref(static_cast<std::size_t>(g.input_size()));
      std::vector<float> dw_ref(static_cast<std::size_t>(g.weight_size()), 0.25f),
          db_ref(static_cast<std::size_t>(g.out_channels), 0.5f);
      reference.conv_backward_data(g, dy.data(), w.data(), dx_ref.data());
      reference.conv_backward_weights(g, x.data(), dy.data(), dw_ref.data(), db_ref.data());

      conv d{2};
      dist::detail::arena a;
      std::vector<float> dx(static_cast<std::size_t>(g.input_size()), -7.0f);
      std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.25f),
          db(static_cast<std::size_t>(g.out_channels), 0.5f);
      if (!d.backward_data(g, dy.data(), w.data(), dx.data(), a, half))
        continue;  // no bfloat16 kernel: computed elsewhere
      BOOST_TEST(d.swapped_passes() == 1u);
      BOOST_TEST_REQUIRE(d.backward_weights(g, x.data(), dy.data(), dw.data(), db.data(), a, half));
      BOOST_TEST(d.swapped_passes() == 2u);
      BOOST_TEST(
          !d.backward(g, x.data(), dy.data(), w.data(), dx.data(), dw.data(), db.data(), a, half));  // one by one
      const double bound = half ? 1e-4 : 2e-5;
      BOOST_TEST(relative(dx, dx_ref) < bound, g.to_string() << " half " << half << ": the data gradient");
      BOOST_TEST(relative(dw, dw_ref) < bound, g.to_string() << " half " << half << ": the weight gradient");
      BOOST_TEST(relative(db, db_ref) < 1e-6, g.to_string() << " half " << half << ": the bias gradient");
      BOOST_TEST(d.implementation(conv::pass::backward_data, g, false, half) ==
                 d.implementation(conv::pass::forward, conv::swapped(g), false, half));
    }
}
#endif

BOOST_AUTO_TEST_CASE(results_are_bit_identical_from_run_to_run) {
  const auto g = conv_geometry::of(4, 16, 20, 20, 32, 3, 1, 1);
  const auto x = random_values(g.input_size(), 7), w = random_values(g.weight_size(), 8),
             dy = random_values(g.output_size(), 9);
  auto once = [&] {
    dist::engine<dist::cpu> e;
    std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size()));
    std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.0f);
    e.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), y.data());
    e.conv_backward_data(g, dy.data(), w.data(), dx.data());
    e.conv_backward_weights(g, x.data(), dy.data(), dw.data(), static_cast<float*>(nullptr));
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  const auto first = once();
  for (int i = 0; i < 3; ++i) BOOST_TEST((once() == first), "run " << i + 2 << " differs from the first");
}

BOOST_AUTO_TEST_CASE(split_independent_mode_gives_every_example_the_same_bits_under_any_split) {
  // An example's output and input gradient computed in a batch of 4 and alone are the same bits.
  const auto g4 = conv_geometry::of(4, 16, 14, 14, 32, 3, 2, 1);
  auto g1 = g4;
  g1.batch = 1;
  const auto x = random_values(g4.input_size(), 10), w = random_values(g4.weight_size(), 11);
  const auto dy = random_values(g4.output_size(), 12);
  for (bool reference : {false, true}) {
    dist::engine<dist::cpu> e{{.split_independent = true, .reference = reference}};
    std::vector<float> y4(static_cast<std::size_t>(g4.output_size())), dx4(static_cast<std::size_t>(g4.input_size()));
    e.conv_forward(g4, x.data(), w.data(), static_cast<const float*>(nullptr), y4.data());
    e.conv_backward_data(g4, dy.data(), w.data(), dx4.data());
    for (std::int64_t n = 0; n < 4; ++n) {
      std::vector<float> y1(static_cast<std::size_t>(g1.output_size())), dx1(static_cast<std::size_t>(g1.input_size()));
      e.conv_forward(g1, x.data() + n * g1.input_size(), w.data(), static_cast<const float*>(nullptr), y1.data());
      e.conv_backward_data(g1, dy.data() + n * g1.output_size(), w.data(), dx1.data());
      BOOST_TEST(std::equal(y1.begin(), y1.end(), y4.begin() + n * g1.output_size()), "example " << n << " forward");
      BOOST_TEST(std::equal(dx1.begin(), dx1.end(), dx4.begin() + n * g1.input_size()),
                 "example " << n << " data gradient");
    }
  }
}

BOOST_AUTO_TEST_CASE(scratch_is_shared_and_stops_growing) {
  // Scratch belongs to the replica's engine, sized by the largest layer, and a second step of the
  // same shapes allocates no more of it.
  dist::one_device_strategy<> s;
  std::size_t after_first = 0, after_second = 0;
  auto net = nn::sequential{
      nn::conv2d<float>{
          {.in_channels = 3, .out_channels = 16, .kernel = 7, .padding = 3, .pad_mode = nn::padding_mode::reflect}, 1},
      nn::relu<float>{},
      nn::conv2d<float>{{.in_channels = 16, .out_channels = 32, .kernel = 3, .stride = 2, .padding = 1}, 2},
      nn::conv_transpose2d<float>{
          {.in_channels = 32, .out_channels = 8, .stride = 2, .padding = 1, .output_padding = 1}, 3}};
  const auto x = dist::test::random_tensor<float>(shape::nchw(2, 3, 32, 32), 13);
  auto step = [&](dist::replica auto& r) {
    net.zero_grad();
    const auto y = net.forward(r, x);
    net.backward(r, y);
    return r.engine().scratch_bytes();
  };
  after_first = s.run(step)[0];
  after_second = s.run(step)[0];
  BOOST_TEST(after_first > 0u);
  BOOST_TEST(after_second == after_first);
}

BOOST_AUTO_TEST_CASE(backward_without_the_input_gradient_gives_the_same_parameter_gradients) {
  // The first layer of a network fed with data skips dL/dx; every parameter's gradient is unchanged.
  auto make = [] {
    return nn::sequential{
        nn::conv2d<float>{
            {.in_channels = 3, .out_channels = 8, .kernel = 7, .padding = 3, .pad_mode = nn::padding_mode::reflect}, 1},
        nn::relu<float>{},
        nn::conv_transpose2d<float>{
            {.in_channels = 8, .out_channels = 4, .stride = 2, .padding = 1, .output_padding = 1}, 2},
        nn::tanh<float>{}};
  };
  auto grads = [](auto& net) {
    std::vector<std::vector<float>> g;
    net.for_each_parameter([&](std::span<float>, std::span<float> grad) { g.emplace_back(grad.begin(), grad.end()); });
    return g;
  };
  auto full = make(), partial = make();
  auto r = nn::local();
  const auto x = dist::test::random_tensor<float>(shape::nchw(2, 3, 10, 12), 21);
  const auto y = full.forward(r, x);
  partial.forward(r, x);
  const auto dy = dist::test::random_tensor<float>(y.shape(), 22);
  const auto dx = full.backward(r, dy);
  const auto none = partial.backward(r, dy, nn::no_input_gradient);
  BOOST_TEST((dx.shape() == x.shape()));
  BOOST_TEST(none.empty());
  BOOST_TEST((grads(full) == grads(partial)));
  // A lone transposed convolution as well.
  const nn::conv_transpose2d_options up{
      .in_channels = 3, .out_channels = 2, .stride = 2, .padding = 1, .output_padding = 1};
  nn::conv_transpose2d<float> a{up, 3}, b{up, 3};
  const auto ya = a.forward(r, x);
  b.forward(r, x);
  a.backward(r, ya);
  BOOST_TEST(b.backward(r, ya, nn::no_input_gradient).empty());
  BOOST_TEST((grads(a) == grads(b)));
}

BOOST_AUTO_TEST_CASE(optimisers_on_a_replicas_engine_give_the_same_bits) {
  // step(r, model) runs the update on the replica's threads; step(model) on the calling thread.
  auto make = [] {
    flat m;
    const auto v = random_values(100000, 31), g = random_values(100000, 32);  // above the parallel grain
    m.value = v;
    m.grad = g;
    return m;
  };
  dist::one_device_strategy<> s;
  auto a = make(), b = make(), c = make(), d = make();
  dist::optim::adam<float> oa{{.lr = 1e-2, .weight_decay = 1e-3}}, ob{{.lr = 1e-2, .weight_decay = 1e-3}};
  dist::optim::sgd<float> oc{{.lr = 1e-2, .momentum = 0.9}}, od{{.lr = 1e-2, .momentum = 0.9}};
  for (int i = 0; i < 3; ++i) {
    oa.step(a);
    oc.step(c);
    s.run([&](dist::replica auto& r) {
      ob.step(r, b);
      od.step(r, d);
    });
  }
  BOOST_TEST((a.value == b.value));
  BOOST_TEST((c.value == d.value));
  BOOST_TEST(oa.state_digest() == ob.state_digest());
  BOOST_TEST(oc.state_digest() == od.state_digest());
}

namespace {

// The documented order of a plane's sum, written out independently: term i into running sum
// i mod 32 while whole rows of 32 last, the rest into a sum of their own in index order, the 32
// folded pairwise (l += l + 16, + 8, ..., + 1), the rest added last.
double documented_plane_sum(const std::vector<double>& terms) {
  double lane[32] = {};
  const std::size_t whole = terms.size() / 32 * 32;
  for (std::size_t i = 0; i < whole; ++i) lane[i % 32] += terms[i];
  double rest = 0;
  for (std::size_t i = whole; i < terms.size(); ++i) rest += terms[i];
  for (std::size_t w = 16; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0] + rest;
}

}  // namespace

BOOST_AUTO_TEST_CASE(plane_sums_add_in_the_documented_order_on_any_thread_count) {
  // Terms whose sum depends on the order: large values that cancel, and small ones between.
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> small(-1.0, 1.0);
  std::bernoulli_distribution large(0.1);
  bool some_differ_from_index_order = false;
  for (const std::int64_t length : {0, 1, 31, 32, 33, 64, 95, 1000, 4099, 70001}) {
    const std::int64_t planes = 3;
    std::vector<float> x(static_cast<std::size_t>(planes * length));
    for (float& v : x) v = static_cast<float>(large(gen) ? small(gen) * 1e8 : small(gen));
    std::vector<std::vector<double>> results;
    for (const int threads : {1, 2}) {
      dist::engine<dist::cpu> e{{.threads = threads}};
      std::vector<double> sums(static_cast<std::size_t>(planes), -1.0);
      e.segmented_sum(planes, length, nn::detail::kernels::value_of<float>{x.data(), length}, sums.data());
      results.push_back(sums);
    }
    std::vector<double> serial(static_cast<std::size_t>(planes), -1.0);
    dist::serial_engine{}.segmented_sum(planes, length, nn::detail::kernels::value_of<float>{x.data(), length},
                                        serial.data());
    results.push_back(serial);
    for (std::int64_t s = 0; s < planes; ++s) {
      const std::vector<double> terms(x.begin() + s * length, x.begin() + (s + 1) * length);
      const double want = documented_plane_sum(terms);
      double index_order = 0;
      for (const double t : terms) index_order += t;
      some_differ_from_index_order = some_differ_from_index_order || index_order != want;
      for (std::size_t k = 0; k < results.size(); ++k)
        BOOST_TEST(std::memcmp(&results[k][static_cast<std::size_t>(s)], &want, sizeof want) == 0,
                   "length " << length << " plane " << s << " engine " << k << ": "
                             << results[k][static_cast<std::size_t>(s)] << " against " << want);
    }
  }
  // The test tells the orders apart: these terms do not sum to the same bits in index order.
  BOOST_TEST(some_differ_from_index_order);
}

namespace {

// Where element (segment s, term i) of a reduction of a row-major tensor of `extents` over the axes
// of `reduced` lies, written out from the shape alone: s row-major over the kept axes, i over the
// reduced ones.
std::int64_t reduction_offset(const std::array<std::int64_t, 4>& extents, const std::array<bool, 4>& reduced,
                              std::int64_t s, std::int64_t i) {
  std::int64_t offset = 0, stride = 1;
  for (int k = 3; k >= 0; --k) {
    const auto e = extents[static_cast<std::size_t>(k)];
    std::int64_t& from = reduced[static_cast<std::size_t>(k)] ? i : s;
    offset += (from % e) * stride;
    from /= e;
    stride *= e;
  }
  return offset;
}

}  // namespace

BOOST_AUTO_TEST_CASE(reductions_over_any_axes_keep_the_documented_order_and_the_first_maximum) {
  // Every choice of axes of shapes whose runs (the innermost reduced axis) start and end inside the
  // rows of 32 terms, with sums of fewer and of more than 32 terms and one past the parallel grain:
  // the CPU engine's sums (walked run by run, and segments side by side where each is a column) are
  // the documented order's bits, term by term, on one and two threads, and its maximum is the first
  // of the largest (a NaN first of all), as a loop over the terms finds it.
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> small(-1.0, 1.0);
  std::bernoulli_distribution large(0.1), nan(0.002);
  std::uniform_int_distribution<int> level(-2, 2);
  int across = 0, runs = 0;
  for (const std::array<std::int64_t, 4> extents :
       {std::array<std::int64_t, 4>{3, 5, 7, 11}, {2, 33, 3, 70}, {40, 3, 2, 9}, {8, 64, 9, 9}}) {
    const shape sh{extents[0], extents[1], extents[2], extents[3]};
    std::vector<float> x(static_cast<std::size_t>(sh.numel()));
    for (float& v : x) v = static_cast<float>(large(gen) ? small(gen) * 1e8 : small(gen));
    tensor<float> ties{sh};  // few levels: ties everywhere, and some NaN
    for (std::size_t k = 0; k < ties.size(); ++k)
      ties.data()[k] = nan(gen) ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(level(gen));
    for (int bits = 1; bits < 16; ++bits) {
      std::array<bool, 4> reduced{};
      std::array<bool, shape::max_rank> mask{};
      for (std::size_t k = 0; k < 4; ++k) reduced[k] = mask[k] = (bits & (1 << k)) != 0;
      const auto m = nn::detail::reduction_of(sh, reduced);
      const nn::detail::kernels::strided_term<float> probe{x.data(), m.kept.axes ? m.kept.strides[3] : 0,
                                                           m.reduced.axes ? m.reduced.strides[3] : 0};
      const bool one_axis_each = m.kept.axes <= 1 && m.reduced.axes <= 1;
      across += one_axis_each && m.segments > 1 && probe.segment_step() == 1 && probe.step != 1;
      runs += !one_axis_each;
      std::vector<double> want(static_cast<std::size_t>(m.segments));
      for (std::int64_t s = 0; s < m.segments; ++s) {
        std::vector<double> terms;
        for (std::int64_t i = 0; i < m.length; ++i)
          terms.push_back(x[static_cast<std::size_t>(reduction_offset(extents, reduced, s, i))]);
        want[static_cast<std::size_t>(s)] = documented_plane_sum(terms);
      }
      for (const int threads : {1, 2}) {
        dist::engine<dist::cpu> e{{.threads = threads}};
        std::vector<double> got(static_cast<std::size_t>(m.segments), -1.0);
        nn::detail::sum_terms(e, m, x.data(), got.data());
        BOOST_TEST(std::memcmp(got.data(), want.data(), want.size() * sizeof(double)) == 0,
                   sh.to_string() << " over axes mask " << bits << " on " << threads << " threads");
      }
      auto r = nn::local();
      const auto [values, places] =
          nn::detail::max_and_place(r, "max", ties, mask, nn::detail::reduced_shape(sh, mask, false));
      bool same = true;
      for (std::int64_t s = 0; s < m.segments && same; ++s) {
        float best = 0;
        std::int64_t where = -1;
        for (std::int64_t i = 0; i < m.length; ++i) {
          const float v = ties.data()[reduction_offset(extents, reduced, s, i)];
          if (where < 0 || (!std::isnan(best) && (std::isnan(v) || v > best))) {
            best = v;
            where = i;
          }
        }
        const float got = values.data()[s];
        same = places.data()[s] == where && (got == best || (std::isnan(got) && std::isnan(best)));
      }
      BOOST_TEST(same, "the maximum of " << sh.to_string() << " over axes mask " << bits);
    }
  }
  // Both of the engine's faster walks were taken.
  BOOST_TEST(across > 0);
  BOOST_TEST(runs > 0);
}

BOOST_AUTO_TEST_CASE(relu_passes_are_the_selects_bit_for_bit_at_every_special_value) {
  // Past the parallel grain (2^15 elements) on two threads, and small on one, in float and double:
  // relu and leaky relu, forward and backward, give exactly what `x > 0 ? a : b` gives (the kernels
  // compute both sides and select by a mask over their bits, detail/select.hpp, so that the loops
  // vectorise without mask registers): dx is dy where x > 0 and exactly zero elsewhere (x = 0, -0,
  // negative, NaN), whatever dy is there (NaN, infinity), and the signs of zeros are kept.
  const auto check = []<class T>(T) {
    const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
    const T xs[] = {T(-1), T(0), -T(0), nan, T(2), T(1e-30), -inf, inf};
    const T dys[] = {nan, inf, -inf, T(5), T(3), T(-7), -T(0), T(0.5)};
    const T slope = T(0.25);
    // Equal bits, or both NaN (a NaN's payload is the arithmetic's).
    const auto same = [](T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); };
    for (const std::int64_t n : {8, 40000}) {
      std::vector<T> x(static_cast<std::size_t>(n)), dy(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = xs[i % 8];
        dy[i] = dys[(i / 8 + i) % 8];
      }
      for (const int threads : {1, 2}) {
        dist::engine<dist::cpu> e{{.threads = threads}};
        std::vector<T> y(x.size(), T(-9)), leaky_y(x.size(), T(-9)), dx(x.size(), T(-9)), leaky_dx(x.size(), T(-9));
        e.for_each(n, nn::detail::kernels::relu_forward<T>{x.data(), y.data()});
        e.for_each(n, nn::detail::kernels::leaky_relu_forward<T>{x.data(), leaky_y.data(), slope});
        e.for_each(n, nn::detail::kernels::relu_backward<T>{x.data(), dy.data(), dx.data()});
        e.for_each(n, nn::detail::kernels::leaky_relu_backward<T>{x.data(), dy.data(), leaky_dx.data(), slope});
        std::size_t bad = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          const bool pass = x[i] > T(0);
          bad += !same(y[i], pass ? x[i] : T(0)) + !same(leaky_y[i], pass ? x[i] : slope * x[i]) +
                 !same(dx[i], pass ? dy[i] : T(0)) + !same(leaky_dx[i], pass ? dy[i] : slope * dy[i]);
        }
        BOOST_TEST(bad == 0u,
                   sizeof(T) << "-byte values, " << n << " elements, " << threads << " threads: " << bad << " wrong");
      }
    }
  };
  check(0.0f);
  check(0.0);
}

BOOST_AUTO_TEST_CASE(bad_geometry_is_refused_with_its_extents) {
  dist::engine<dist::cpu> e;
  BOOST_CHECK_EXCEPTION(
      conv_geometry::of(1, 3, 4, 4, 8, 7, 1, 0), std::invalid_argument,
      [](const std::invalid_argument& ex) { return std::string(ex.what()).find("kernel 7") != std::string::npos; });
}

BOOST_AUTO_TEST_SUITE_END()

// --- mixed precision on the CPU (nn::with_precision, compute_precision): float32 and tf32 are the
// model itself, bit for bit; bfloat16 computes on a CPU with bf16 units; float16, and bfloat16
// without bf16 units, are refused with the reason, leaving the engine as it was; the engine's
// precision comes back after a pass that throws.

namespace {

using dist::compute_precision;
namespace optim = distribute::optim;

auto precision_net() {
  return nn::sequential{nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .padding = 1}, 5},
                        nn::relu<float>{}, nn::flatten<float>{},
                        nn::linear<float>({.in_features = 4 * 6 * 6, .out_features = 3}, 6)};
}

// Three Adam steps of `net` over 2 CPU replicas; replica 0's parameters after them.
template <class Net>
std::vector<float> train_three_steps(Net prototype) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto nets = s.mirror([&](auto&) { return prototype; });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  const auto x = dist::test::random_tensor<float>(shape::nchw(4, 1, 6, 6), 3);
  const auto y = dist::test::random_tensor<float>(shape{4, 3}, 4);
  auto xs = s.scatter(std::vector<float>(x.begin(), x.end()), 36);
  auto ys = s.scatter(std::vector<float>(y.begin(), y.end()), 3);
  for (int step = 0; step < 3; ++step)
    s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, Net& net,
            optim::adam<float>& opt) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 36;
          net.zero_grad();
          const auto loss =
              nn::mse(r, net.forward(r, tensor<float>{shape::nchw(n, 1, 6, 6), xl}), tensor<float>{shape{n, 3}, yl}, 4);
          net.backward(r, loss.grad);
          r.all_reduce_gradients(net);
          opt.step(r, net);
        },
        xs, ys, nets, opts);
  s.verify_mirrored(nets);
  std::vector<float> p;
  nets[0].for_each_parameter([&](std::span<float> v, std::span<float>) { p.insert(p.end(), v.begin(), v.end()); });
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(precision)

BOOST_AUTO_TEST_CASE(names_and_the_engine_default) {
  BOOST_TEST(dist::to_string(compute_precision::bfloat16) == "bfloat16");
  BOOST_TEST(dist::to_string(compute_precision::float16) == "float16");
  BOOST_TEST(dist::is_half(compute_precision::float16));
  BOOST_TEST(!dist::is_half(compute_precision::tf32));
  BOOST_TEST((dist::default_precision({}) == compute_precision::float32));
  BOOST_TEST((dist::default_precision({.tf32 = true}) == compute_precision::tf32));
  BOOST_TEST((dist::default_precision({.precision = compute_precision::bfloat16}) == compute_precision::bfloat16));
}

BOOST_AUTO_TEST_CASE(float32_and_tf32_are_the_model_itself_bit_for_bit) {
  const auto plain = train_three_steps(precision_net());
  BOOST_TEST((train_three_steps(nn::with_precision{precision_net(), compute_precision::float32}) == plain));
  BOOST_TEST((train_three_steps(nn::with_precision{precision_net(), compute_precision::tf32}) ==
              plain));  // nothing to round on a CPU
  auto initial = precision_net();
  std::vector<float> p0;
  initial.for_each_parameter([&](std::span<float> v, std::span<float>) { p0.insert(p0.end(), v.begin(), v.end()); });
  BOOST_TEST(dist::test::relative_error_of<float>(plain, p0) > 1e-3);  // the steps moved the parameters
}

BOOST_AUTO_TEST_CASE(float16_on_the_cpu_is_refused_and_bfloat16_without_bf16_units) {
  std::vector<compute_precision> refused{compute_precision::float16};
  if (!dist::detail::cpu_has_bf16_units()) refused.push_back(compute_precision::bfloat16);
  for (const auto p : refused) {
    auto net = nn::with_precision{precision_net(), p};
    auto r = nn::local();
    const auto x = dist::test::random_tensor<float>(shape::nchw(1, 1, 6, 6), 3);
    const std::string said = dist::test::error_of([&] { net.forward(r, x); });
    const std::string expected = p == compute_precision::float16 ? "computes in float32 or bfloat16, not float16"
                                                                 : "bfloat16 only on a CPU with bf16 units";
    BOOST_TEST(said.find(expected) != std::string::npos, said);
    BOOST_TEST((r.engine().precision() == compute_precision::float32));  // unchanged
    // Asked of the engine directly, the same.
    dist::engine<dist::cpu> e;
    BOOST_CHECK_THROW(e.use_precision(p), std::invalid_argument);
    BOOST_TEST((e.precision() == compute_precision::float32));
  }
}

// bfloat16 on a CPU with bf16 units: each convolution through oneDNN's bf16 kernels agrees with the
// reference engine's convolution of the inputs rounded to bfloat16 (the same exact products, summed
// in float32 in another order) and is measurably not the float32 convolution; matrix products are
// the float32 product of the rounded inputs, bit for bit. Where the CPU has no bf16 units, the
// refusal is the previous test's.
BOOST_AUTO_TEST_CASE(bfloat16_convolutions_and_products_on_a_cpu_with_bf16_units) {
  if (!dist::detail::cpu_has_bf16_units()) {
    BOOST_TEST_MESSAGE("this CPU has no bf16 units: the CPU engine refuses bfloat16 (tested above)");
    dist::engine<dist::cpu> e;
    BOOST_CHECK_THROW(e.use_precision(compute_precision::bfloat16), std::invalid_argument);
    return;
  }
  auto rounded = [](std::vector<float> v) {
    for (auto& x : v) x = static_cast<float>(dist::bfloat16(x));
    return v;
  };
  auto values = [](std::size_t n, std::uint32_t seed) {
    const auto t = dist::test::random_tensor<float>(shape{static_cast<std::int64_t>(n)}, seed);
    return std::vector<float>(t.begin(), t.end());
  };
  auto max_relative = [](const std::vector<float>& a, const std::vector<float>& b) {
    double scale = 0, worst = 0;
    for (const float v : b) scale = std::max(scale, std::abs(static_cast<double>(v)));
    for (std::size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) / scale);
    return worst;
  };
  // A generator's first layer (an image's 3 channels, plain layouts), a 3x3 and a strided 4x4 of
  // blocked channels, a 1-channel 7x7.
  const dist::conv_geometry geometries[] = {
      dist::conv_geometry::of(2, 3, 20, 20, 16, 7, 1, 3), dist::conv_geometry::of(2, 32, 12, 12, 32, 3, 1, 1),
      dist::conv_geometry::of(2, 16, 16, 16, 32, 4, 2, 1), dist::conv_geometry::of(1, 1, 9, 9, 8, 7, 1, 3)};
  for (const auto& g : geometries) {
    BOOST_TEST_CONTEXT("conv " << g.in_channels << "->" << g.out_channels << " k" << g.kernel << " s" << g.stride) {
      const auto x = values(static_cast<std::size_t>(g.input_size()), 11),
                 w = values(static_cast<std::size_t>(g.weight_size()), 12);
      const auto bias = values(static_cast<std::size_t>(g.out_channels), 13),
                 dy = values(static_cast<std::size_t>(g.output_size()), 14);
      struct results {
        std::vector<float> y, dx, dw, db;
      };
      auto run = [&](bool reference, compute_precision p, const std::vector<float>& xs, const std::vector<float>& ws,
                     const std::vector<float>& dys) {
        dist::engine<dist::cpu> e{{.threads = 1, .reference = reference}};
        e.use_precision(p);
        results out{std::vector<float>(static_cast<std::size_t>(g.output_size())),
                    std::vector<float>(static_cast<std::size_t>(g.input_size())),
                    std::vector<float>(static_cast<std::size_t>(g.weight_size()), 0.0f),
                    std::vector<float>(static_cast<std::size_t>(g.out_channels), 0.0f)};
        e.conv_forward(g, xs.data(), ws.data(), bias.data(), out.y.data());
        e.conv_backward_data(g, dys.data(), ws.data(), out.dx.data());
        e.conv_backward_weights(g, xs.data(), dys.data(), out.dw.data(), out.db.data());
        return out;
      };
      const auto ours = run(false, compute_precision::bfloat16, x, w, dy);
      const auto emulated = run(true, compute_precision::float32, rounded(x), rounded(w), rounded(dy));
      const auto reference_half = run(true, compute_precision::bfloat16, x, w, dy);
      const auto full = run(false, compute_precision::float32, x, w, dy);
      for (auto [mine, theirs, what] :
           {std::tuple{&ours.y, &emulated.y, "forward"}, std::tuple{&ours.dx, &emulated.dx, "data gradient"},
            std::tuple{&ours.dw, &emulated.dw, "weight gradient"},
            std::tuple{&ours.db, &emulated.db, "bias gradient"}}) {
        BOOST_TEST(max_relative(*mine, *theirs) < 1e-5,
                   what << ": oneDNN's bfloat16 against rounded inputs, " << max_relative(*mine, *theirs));
      }
      // The reference engine in bfloat16 rounds its inputs itself: the emulation's bits.
      BOOST_TEST((reference_half.y == emulated.y));
      BOOST_TEST((reference_half.dx == emulated.dx));
      BOOST_TEST((reference_half.dw == emulated.dw));
      BOOST_TEST((reference_half.db == emulated.db));
      // And bfloat16 is not float32: inputs off by up to 2^-9 move the results by more than float32's rounding.
      BOOST_TEST(max_relative(ours.y, full.y) > 1e-4);
      BOOST_TEST(max_relative(ours.dw, full.dw) > 1e-4);
      BOOST_TEST(max_relative(ours.y, full.y) < 2e-2);
    }
  }
  // Products: the float32 product of the rounded operands, bit for bit (whole batch and row by row).
  for (const bool split : {false, true}) {
    const dist::gemm_geometry g{.m = 5, .n = 7, .k = 33};
    const auto a = values(5 * 33, 21), b = values(33 * 7, 22);
    std::vector<float> ours(35), theirs(35);
    dist::engine<dist::cpu> e{{.threads = 1, .split_independent = split}};
    e.use_precision(compute_precision::bfloat16);
    e.gemm(g, a.data(), b.data(), ours.data());
    e.use_precision(compute_precision::float32);
    const auto ra = rounded(a), rb = rounded(b);
    e.gemm(g, ra.data(), rb.data(), theirs.data());
    BOOST_TEST((ours == theirs), "split_independent " << split);
    std::vector<float> plain(35);
    e.gemm(g, a.data(), b.data(), plain.data());
    BOOST_TEST(!(ours == plain));
  }
  // A convolution Winograd pays for: in bfloat16 the float32 Winograd convolution of the rounded
  // inputs, bit for bit (where oneDNN has the kernel; else oneDNN's bfloat16 kernel, checked above).
  {
    const auto g = dist::conv_geometry::of(1, 32, 34, 34, 32, 3, 1, 0);
    const auto x = values(static_cast<std::size_t>(g.input_size()), 31),
               w = values(static_cast<std::size_t>(g.weight_size()), 32);
    const auto dy = values(static_cast<std::size_t>(g.output_size()), 33);
    auto run = [&](compute_precision p, const std::vector<float>& xs, const std::vector<float>& ws,
                   const std::vector<float>& dys) {
      // (Winograd by the rule: timed, a CPU with AMX takes oneDNN's bfloat16 kernel, which is faster there.)
      dist::engine<dist::cpu> e{{.threads = 1, .cpu_conv_choice = dist::conv_choice::rule}};
      e.use_precision(p);
      std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size()));
      std::vector<float> dw(static_cast<std::size_t>(g.weight_size()), 0.0f),
          db(static_cast<std::size_t>(g.out_channels), 0.0f);
      e.conv_forward(g, xs.data(), ws.data(), static_cast<const float*>(nullptr), y.data());
      e.conv_backward_data(g, dys.data(), ws.data(), dx.data());
      e.conv_backward_weights(g, xs.data(), dys.data(), dw.data(), db.data());
      for (auto* v : {&dx, &dw, &db}) y.insert(y.end(), v->begin(), v->end());
      return y;
    };
    const auto half = run(compute_precision::bfloat16, x, w, dy);
    const auto on_rounded = run(compute_precision::float32, rounded(x), rounded(w), rounded(dy));
    if (dist::engine<dist::cpu>::has_dnnl)  // Winograd (oneDNN's or the engine's own)
      BOOST_TEST((half == on_rounded), "bfloat16 Winograd: " << max_relative(half, on_rounded));
    else BOOST_TEST(max_relative(half, on_rounded) < 1e-4);
  }
  // Training: the same steps on every replica (train_three_steps verifies), near float32's, not it.
  const auto plain = train_three_steps(precision_net());
  const auto half = train_three_steps(nn::with_precision{precision_net(), compute_precision::bfloat16});
  BOOST_TEST(!(half == plain));
  const double err = dist::test::relative_error_of<float>(half, plain);
  BOOST_TEST(err < 2e-2, "bfloat16 moved 3 Adam steps' parameters " << err << " from float32's");
  BOOST_TEST_MESSAGE("bfloat16 on the CPU: 3 Adam steps' parameters " << err << " from float32's");
  BOOST_TEST(
      (train_three_steps(nn::with_precision{precision_net(), compute_precision::bfloat16}) == half));  // repeatable
}

// The bounds the GPU suite holds its 16-bit training to (tests/nn/precision_case.hpp), checked on the
// CPU engine's arithmetic of the same model and data: bfloat16's distance from float32 after three
// Adam steps is bfloat16's rounding (here about 3.5e-2), within the bound and not near zero, and
// runs are repeatable.
BOOST_AUTO_TEST_CASE(the_gpu_suites_bfloat16_bound_holds_for_the_cpus_bfloat16) {
  namespace pc = dist::test::precision_case;
  if (!dist::detail::cpu_has_bf16_units()) {
    BOOST_TEST_MESSAGE("this CPU has no bf16 units: the CPU engine refuses bfloat16 (tested above)");
    return;
  }
  dist::one_device_strategy<dist::cpu> s;
  const auto to_device = [](auto&, const std::vector<float>& x) { return tensor<float>{pc::input_shape, x}; };
  const auto to_host = [](auto v) { return std::vector<float>(v.begin(), v.end()); };
  const auto [plain, plain_restored] = pc::train(s, compute_precision::float32, to_device, to_host);
  const auto [half, half_restored] = pc::train(s, compute_precision::bfloat16, to_device, to_host);
  BOOST_TEST(plain_restored);
  BOOST_TEST(half_restored);
  const double err = pc::relative_distance(plain, half);
  BOOST_TEST_MESSAGE("bfloat16 on the CPU, the GPU suite's case: 3 Adam steps' parameters " << err
                                                                                            << " from float32's");
  BOOST_TEST(err <= pc::bfloat16_from_float32);
  BOOST_TEST(err > 1e-2);  // bfloat16's rounding, not float32's: the bound is not loose by accident
  BOOST_TEST((pc::train(s, compute_precision::bfloat16, to_device, to_host).first == half));
}

BOOST_AUTO_TEST_CASE(the_engine_precision_comes_back_after_a_pass_that_throws) {
  auto net = nn::with_precision{precision_net(), compute_precision::tf32};
  auto r = nn::local();
  const auto wrong = dist::test::random_tensor<float>(shape::nchw(1, 2, 6, 6), 3);  // 2 channels for a 1-channel conv
  BOOST_CHECK_THROW(net.forward(r, wrong), std::invalid_argument);
  BOOST_TEST((r.engine().precision() == compute_precision::float32));
  const auto right = dist::test::random_tensor<float>(shape::nchw(1, 1, 6, 6), 3);
  {
    const dist::precision_scope scope{r.engine(), compute_precision::tf32};
    BOOST_TEST((r.engine().precision() == compute_precision::tf32));
    net.forward(r, right);
    BOOST_TEST((r.engine().precision() == compute_precision::tf32));  // the wrapper restored the outer scope's
  }
  BOOST_TEST((r.engine().precision() == compute_precision::float32));
}

BOOST_AUTO_TEST_SUITE_END()
