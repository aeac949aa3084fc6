// Dense layers and classification losses: the CPU engine's matrix product against its definition,
// linear and flatten against PyTorch's values and central finite differences, their errors, split
// independence and determinism; softmax cross-entropy, binary cross-entropy with logits and accuracy
// against PyTorch's values, finite differences and the global-batch rule; a linear classifier trained
// on two replicas.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::gemm_geometry;
using dist::shape;
using dist::tensor;

namespace {

// Values printed by PyTorch 2.15 (float64), for the calls named in the tests that use them.
// torch.nn.Linear(3, 2): y, weight.grad, bias.grad, x.grad.
const std::vector<double> pytorch_linear_y{0.6499999999999999,  -0.4999999999999999, -0.075, -0.4, 0.9, -2.0,
                                           0.39999999999999997, 0.9000000000000002};
const std::vector<double> pytorch_linear_dw{6.5, 3.25, -0.125, 0.0, -2.5, -2.625};
const std::vector<double> pytorch_linear_db{2.0, 2.25};
const std::vector<double> pytorch_linear_dx{
    -0.30000000000000004, -0.7, 0.8999999999999999, 0.8500000000000001,  0.9, -1.05, -0.05000000000000002,
    0.42500000000000004,  -0.6, 0.6000000000000001, 0.09999999999999998, 0.0};
// F.cross_entropy(logits, labels): the value and logits.grad; then reduction='sum', divided by 10.
const double pytorch_ce_mean_value = 1.6138432032674275;
const std::vector<double> pytorch_ce_mean_grad{-0.08524971527850803, 0.060608242676178474, 0.02464147260232955,
                                               0.029028633668535288, 0.2144942026521143,   -0.2435228363206496,
                                               0.041884197878726145, -0.180944632051131,   0.13906043417240488,
                                               0.08333333333333333,  -0.16666666666666669, 0.08333333333333333};
const double pytorch_ce_sum10_value = 0.645537281306971;
const std::vector<double> pytorch_ce_sum10_grad{-0.03409988611140321, 0.02424329707047139,  0.00985658904093182,
                                                0.011611453467414115, 0.08579768106084573,  -0.09740913452825985,
                                                0.01675367915149046,  -0.0723778528204524,  0.055624173668961954,
                                                0.03333333333333333,  -0.06666666666666667, 0.03333333333333333};
// F.binary_cross_entropy_with_logits(logits, targets): the value and logits.grad.
const double pytorch_bce_mean_value = 1.182262785141993;
const std::vector<double> pytorch_bce_mean_grad{-0.0629234447996909, 0.03857920275016373, -0.007904312196261106,
                                                0.07917013542017666, 0.10004158514671913, -0.16366896500631808};

using distribute::test::mentions;

using distribute::test::error_of;

// |a - b| <= tolerance * max(|a|, |b|) for every element (a relative check of each value; an exact
// zero is compared with 1e-12 as its scale).
void check_close(std::span<const double> got, const std::vector<double>& expected, double tolerance,
                 const std::string& what) {
  BOOST_TEST_REQUIRE(got.size() == expected.size(), what);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max({std::abs(got[i]), std::abs(expected[i]), 1e-12});
    BOOST_TEST(std::abs(got[i] - expected[i]) <= tolerance * scale,
               what << "[" << i << "]: " << got[i] << " against " << expected[i]);
  }
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The definition of c (+)= op(a) op(b), in double.
std::vector<double> reference_gemm(const gemm_geometry& g, const std::vector<float>& a, const std::vector<float>& b,
                                   std::vector<double> c) {
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const double av = a[static_cast<std::size_t>(g.transpose_a ? p * g.m + i : i * g.k + p)];
        const double bv = b[static_cast<std::size_t>(g.transpose_b ? j * g.k + p : p * g.n + j)];
        s += av * bv;
      }
      auto& out = c[static_cast<std::size_t>(i * g.n + j)];
      out = g.accumulate ? out + s : s;
    }
  return c;
}

std::vector<float> random_values(std::int64_t n, std::uint32_t seed) {
  const auto t = dist::test::random_tensor<float>(shape{n}, seed);
  return {t.begin(), t.end()};
}

// `n` floats starting `offset` elements past a 64-byte boundary, inside `storage`.
std::span<float> placed(std::vector<float>& storage, std::size_t n, std::size_t offset) {
  storage.assign(n + offset + 16, 0.0f);
  std::size_t start = 0;
  while (reinterpret_cast<std::uintptr_t>(storage.data() + start) % 64 != 0) ++start;
  return {storage.data() + start + offset, n};
}

// A linear classifier of points in the plane: three classes around (3, 3), (4, 3) and (3.5, 3.9),
// +-0.25 on each axis, linearly separable but off the origin and close together, so that the bias
// and a few hundred steps are needed. 60 examples (classes interleaved, so that every part of the
// batch has each class), SGD with momentum on the global-batch loss, gradients summed across
// replicas.
constexpr std::int64_t classifier_batch = 60;

struct classifier_run {
  std::vector<float> parameters;  // weight then bias
  int steps = 0;
  std::int64_t first_correct = 0, last_correct = 0;
  float first_loss = 0, last_loss = 0;
};

// Up to `max_steps` steps; with `stop_when_all_correct`, stops after the first step whose logits
// classify every example correctly.
template <class S>
classifier_run train_classifier(S& s, int max_steps, bool stop_when_all_correct) {
  std::vector<float> points;
  std::vector<std::int32_t> labels;
  const auto noise = dist::test::random_tensor<float>(shape{classifier_batch, 2}, 61, -0.25, 0.25);
  const float centres[3][2] = {{3.0f, 3.0f}, {4.0f, 3.0f}, {3.5f, 3.9f}};
  for (std::int64_t i = 0; i < classifier_batch; ++i) {
    const auto c = static_cast<std::int32_t>(i % 3);
    points.push_back(centres[c][0] + noise[static_cast<std::size_t>(2 * i)]);
    points.push_back(centres[c][1] + noise[static_cast<std::size_t>(2 * i + 1)]);
    labels.push_back(c);
  }
  auto models = s.mirror([](auto&) { return nn::linear<float>{{.in_features = 2, .out_features = 3}, 5}; });
  auto opts = s.mirror([](auto&) { return optim::sgd<float>{{.lr = 0.1, .momentum = 0.9}}; });
  const auto xs = s.scatter(points, 2);
  const auto ys = s.scatter(labels, 1);
  classifier_run out;
  for (int step = 0; step < max_steps; ++step) {
    const auto results = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<std::int32_t>& yl,
            nn::linear<float>& m, optim::sgd<float>& opt) {
          const tensor<float> x{shape{static_cast<std::int64_t>(yl.size()), 2}, xl};
          m.zero_grad();
          const auto logits = m.forward(r, x);
          const auto loss = nn::softmax_cross_entropy(r, logits, yl, classifier_batch);
          m.backward(r, loss.grad, nn::no_input_gradient);
          r.all_reduce_gradients(m);
          opt.step(r, m);
          return std::pair{loss.value, nn::accuracy(r, logits, yl)};
        },
        xs, ys, models, opts);
    float loss = 0;
    std::int64_t correct = 0;
    for (const auto& [l, c] : results) {
      loss += l;
      correct += c;
    }
    if (step == 0) {
      out.first_loss = loss;
      out.first_correct = correct;
    }
    out.last_loss = loss;
    out.last_correct = correct;
    out.steps = step + 1;
    if (stop_when_all_correct && correct == classifier_batch) break;
  }
  s.verify_mirrored(models);  // the replicas stepped in lockstep
  models[0].for_each_parameter(
      [&](std::span<float> v, std::span<float>) { out.parameters.insert(out.parameters.end(), v.begin(), v.end()); });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dense)

BOOST_AUTO_TEST_CASE(engine_gemm_matches_its_definition) {
  struct size {
    std::int64_t m, n, k;
  };
  // Tiny (Eigen's coefficient-wise product), one row, one column, and blocked GEMM sizes.
  for (const size sz : {size{3, 2, 3}, size{1, 5, 7}, size{6, 1, 4}, size{37, 29, 53}, size{64, 96, 130}})
    for (int transposes = 0; transposes < 4; ++transposes)
      for (bool accumulate : {false, true})
        for (bool split : {false, true}) {
          const gemm_geometry g{.m = sz.m,
                                .n = sz.n,
                                .k = sz.k,
                                .transpose_a = (transposes & 1) != 0,
                                .transpose_b = (transposes & 2) != 0,
                                .accumulate = accumulate};
          dist::engine<dist::cpu> e{{.threads = 2, .split_independent = split}};
          const auto a = random_values(g.a_size(), 1), b = random_values(g.b_size(), 2),
                     c0 = random_values(g.c_size(), 3);
          std::vector<float> c = c0;
          e.gemm(g, a.data(), b.data(), c.data());
          const auto expected = reference_gemm(g, a, b, std::vector<double>(c0.begin(), c0.end()));
          const std::vector<double> got(c.begin(), c.end());
          BOOST_TEST(dist::test::relative_error(got, expected) < 1e-6, g.to_string() << (split ? " split" : ""));
        }
  // Nothing to compute: an empty product leaves c alone; k = 0 gives zeros.
  dist::engine<dist::cpu> e;
  std::vector<float> c{5.0f, 6.0f};
  e.gemm(gemm_geometry{.m = 0, .n = 2, .k = 3}, c.data(), c.data(), c.data());
  BOOST_TEST(c == (std::vector<float>{5.0f, 6.0f}));
  const float none = 0;
  e.gemm(gemm_geometry{.m = 1, .n = 2, .k = 0}, &none, &none, c.data());
  BOOST_TEST(c == (std::vector<float>{0.0f, 0.0f}));
  BOOST_CHECK_THROW(e.gemm(gemm_geometry{.m = -1, .n = 2, .k = 3}, c.data(), c.data(), c.data()),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(engine_gemm_bits_do_not_depend_on_addresses) {
  // The same operands at other addresses (aligned, or 1 and 3 floats past a 64-byte boundary) give
  // the same bits, in both modes, for a tiny and a blocked size.
  for (const gemm_geometry g : {gemm_geometry{.m = 3, .n = 4, .k = 5, .transpose_b = true},
                                gemm_geometry{.m = 33, .n = 17, .k = 70, .transpose_a = true, .accumulate = true}})
    for (bool split : {false, true}) {
      dist::engine<dist::cpu> e{{.threads = 1, .split_independent = split}};
      const auto a = random_values(g.a_size(), 4), b = random_values(g.b_size(), 5), c0 = random_values(g.c_size(), 6);
      std::vector<std::vector<float>> results;
      for (std::size_t offset : {0, 1, 3}) {
        std::vector<float> as, bs, cs;
        auto ap = placed(as, a.size(), offset), bp = placed(bs, b.size(), offset), cp = placed(cs, c0.size(), offset);
        std::copy(a.begin(), a.end(), ap.begin());
        std::copy(b.begin(), b.end(), bp.begin());
        std::copy(c0.begin(), c0.end(), cp.begin());
        e.gemm(g, ap.data(), bp.data(), cp.data());
        results.emplace_back(cp.begin(), cp.end());
      }
      BOOST_TEST(same_bits(results[1], results[0]), g.to_string() << (split ? " split" : "") << ": offset 1");
      BOOST_TEST(same_bits(results[2], results[0]), g.to_string() << (split ? " split" : "") << ": offset 3");
    }
}

BOOST_AUTO_TEST_CASE(engine_gemm_rows_are_split_independent) {
  // With split_independent, row i of a product of m rows has the bits of the one-row product.
  dist::engine<dist::cpu> e{{.threads = 2, .split_independent = true}};
  const gemm_geometry g{.m = 41, .n = 30, .k = 75, .transpose_b = true};
  const auto a = random_values(g.a_size(), 7), b = random_values(g.b_size(), 8);
  std::vector<float> c(static_cast<std::size_t>(g.c_size()));
  e.gemm(g, a.data(), b.data(), c.data());
  for (std::int64_t i : {0, 1, 17, 40}) {
    std::vector<float> row(static_cast<std::size_t>(g.n));
    gemm_geometry one = g;
    one.m = 1;
    e.gemm(one, a.data() + i * g.k, b.data(), row.data());
    BOOST_TEST(same_bits(row, std::span<const float>(c).subspan(static_cast<std::size_t>(i * g.n), row.size())),
               "row " << i);
  }
}

BOOST_AUTO_TEST_CASE(linear_matches_pytorch) {
  // torch.nn.Linear(3, 2).double() with weight [[0.1, -0.2, 0.3], [0.4, 0.5, -0.6]], bias
  // [0.05, -0.1]; y = lin(x); y.backward(dy). The literals are PyTorch's printed values.
  nn::linear<double> lin{{.in_features = 3, .out_features = 2}, 1};
  lin.weight().value = tensor<double>{shape{2, 3}, {0.1, -0.2, 0.3, 0.4, 0.5, -0.6}};
  lin.bias().value = tensor<double>{shape{2}, {0.05, -0.1}};
  const tensor<double> x{shape{4, 3}, {1.0, 2.0, 3.0, -1.0, 0.5, 0.25, 0.0, -2.0, 1.5, 3.0, -1.0, -0.5}};
  const tensor<double> dy{shape{4, 2}, {1.0, -1.0, 0.5, 2.0, -1.5, 0.25, 2.0, 1.0}};
  auto r = nn::local();
  const auto y = lin.forward(r, x);
  BOOST_TEST_REQUIRE((y.shape() == shape{4, 2}));
  const auto dx = lin.backward(r, dy);
  check_close(y.values(), pytorch_linear_y, 1e-6, "y");
  check_close(lin.weight().grad.values(), pytorch_linear_dw, 1e-6, "dW");
  check_close(lin.bias().grad.values(), pytorch_linear_db, 1e-6, "db");
  check_close(dx.values(), pytorch_linear_dx, 1e-6, "dx");
  // Gradients accumulate until zero_grad.
  lin.forward(r, x);
  lin.backward(r, dy);
  std::vector<double> twice;
  for (double v : pytorch_linear_dw) twice.push_back(2 * v);
  check_close(lin.weight().grad.values(), twice, 1e-6, "dW after two backward passes");
}

BOOST_AUTO_TEST_CASE(linear_and_flatten_backward) {
  using dist::test::check_gradients;
  const auto x = dist::test::random_tensor<double>(shape{5, 7}, 21);
  nn::linear<double> with_bias{{.in_features = 7, .out_features = 4}, 1};
  check_gradients(with_bias, x, "linear with bias");
  nn::linear<double> no_bias{{.in_features = 7, .out_features = 3, .bias = false}, 2};
  check_gradients(no_bias, x, "linear without bias");
  nn::linear<double> one{{.in_features = 7, .out_features = 1}, 3};
  check_gradients(one, dist::test::random_tensor<double>(shape{1, 7}, 22), "linear, one example, one output");
  nn::flatten<double> flat;
  check_gradients(flat, dist::test::random_tensor<double>(shape::nchw(2, 3, 2, 2), 23), "flatten");
  // A small classifier: conv, relu, flatten, linear.
  nn::sequential net{
      nn::conv2d<double>{{.in_channels = 2, .out_channels = 3, .kernel = 3, .stride = 2, .padding = 1}, 4},
      nn::relu<double>{}, nn::flatten<double>{}, nn::linear<double>{{.in_features = 3 * 3 * 3, .out_features = 4}, 5}};
  check_gradients(net, dist::test::random_tensor<double>(shape::nchw(2, 2, 5, 6), 24), "conv, relu, flatten, linear");
}

BOOST_AUTO_TEST_CASE(linear_without_input_gradient) {
  auto r = nn::local();
  nn::linear<float> a{{.in_features = 6, .out_features = 5}, 9}, b{{.in_features = 6, .out_features = 5}, 9};
  const auto x = dist::test::random_tensor<float>(shape{4, 6}, 31);
  const auto dy = dist::test::random_tensor<float>(shape{4, 5}, 32);
  a.forward(r, x);
  b.forward(r, x);
  BOOST_TEST(a.backward(r, dy, nn::no_input_gradient).empty());
  BOOST_TEST((b.backward(r, dy).shape() == shape{4, 6}));
  BOOST_TEST(a.weight().grad == b.weight().grad);
  BOOST_TEST(a.bias().grad == b.bias().grad);
  // sequential passes the question on to its first layer.
  nn::sequential net{nn::linear<float>{{.in_features = 6, .out_features = 5}, 9}, nn::tanh<float>{}};
  net.forward(r, x);
  BOOST_TEST(net.backward(r, dy, nn::no_input_gradient).empty());
}

BOOST_AUTO_TEST_CASE(linear_initialisation_is_seeded) {
  nn::linear<float> a{{.in_features = 300, .out_features = 100}, 42}, b{{.in_features = 300, .out_features = 100}, 42},
      c{{.in_features = 300, .out_features = 100}, 43};
  BOOST_TEST((a.weight().value.shape() == shape{100, 300}));  // [out, in], PyTorch's order
  BOOST_TEST((a.bias().value.shape() == shape{100}));
  BOOST_TEST(a.weight().value == b.weight().value);
  BOOST_TEST(!(a.weight().value == c.weight().value));
  double s = 0, s2 = 0;
  for (float v : a.weight().value) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(a.weight().value.size()), mean = s / n;
  BOOST_TEST(std::abs(mean) < 0.001);  // 30000 draws: the mean's sd is 0.0001
  BOOST_TEST(std::abs(std::sqrt(s2 / n - mean * mean) - 0.02) < 0.0005);
  for (float v : a.bias().value) BOOST_TEST(v == 0.0f);
  // Without a bias, only the weight is a parameter.
  nn::linear<float> no_bias{{.in_features = 3, .out_features = 2, .bias = false}, 1};
  int count = 0;
  no_bias.for_each_parameter([&](std::span<float>, std::span<float>) { ++count; });
  BOOST_TEST(count == 1);
}

BOOST_AUTO_TEST_CASE(flatten_folds_all_but_the_batch) {
  auto r = nn::local();
  nn::flatten<float> flat;
  const auto x = dist::test::random_tensor<float>(shape::nchw(2, 3, 4, 5), 41);
  const auto y = flat.forward(r, x);
  BOOST_TEST((y.shape() == shape{2, 60}));
  BOOST_TEST(std::vector<float>(y.begin(), y.end()) == std::vector<float>(x.begin(), x.end()));  // NCHW order kept
  const auto dx = flat.backward(r, y);
  BOOST_TEST((dx.shape() == x.shape()));
  BOOST_TEST((flat.output_shape(shape{4, 7}) == shape{4, 7}));
  BOOST_TEST((flat.output_shape(shape{3, 2, 5}) == shape{3, 10}));
  BOOST_TEST((flat.output_shape(shape::nchw(0, 3, 2, 2)) == shape{0, 12}));
}

BOOST_AUTO_TEST_CASE(misuse_is_reported) {
  auto r = nn::local();
  nn::linear<float> lin{{.in_features = 4, .out_features = 3}, 1};
  std::string what = error_of([&] { lin.backward(r, tensor<float>{shape{2, 3}}); });
  BOOST_TEST(mentions(what, "linear::backward called without a forward pass"), what);
  what = error_of([&] { lin.forward(r, tensor<float>{shape{2, 5}}); });
  BOOST_TEST(mentions(what, "linear {in_features 4, out_features 3, bias} got a tensor of shape (2, 5)"), what);
  BOOST_TEST(mentions(what, "it takes [N, 4]"), what);
  what = error_of([&] { lin.forward(r, tensor<float>{shape::nchw(2, 4, 1, 1)}); });
  BOOST_TEST(mentions(what, "got a tensor of shape (2, 4, 1, 1)"), what);
  BOOST_TEST(mentions(what, "nn::flatten"), what);
  what = error_of([&] { lin.forward(r, tensor<float>{shape{4}}); });
  BOOST_TEST(mentions(what, "got a tensor of shape (4)"), what);
  lin.forward(r, tensor<float>{shape{2, 4}});
  what = error_of([&] { lin.backward(r, tensor<float>{shape{2, 4}}); });
  BOOST_TEST(mentions(what, "backward got dy of shape (2, 4), expected (2, 3)"), what);
  what = error_of([] { nn::linear<float>{{.in_features = 0, .out_features = 3, .bias = false}, 1}; });
  BOOST_TEST(mentions(what, "linear {in_features 0, out_features 3, no bias}: in_features is 0 but must be at least 1"),
             what);
  what = error_of([] { nn::linear<float>{{.in_features = 2, .out_features = -1}, 1}; });
  BOOST_TEST(mentions(what, "linear {in_features 2, out_features -1, bias}: out_features is -1 but must be at least 1"),
             what);

  nn::flatten<float> flat;
  what = error_of([&] { flat.backward(r, tensor<float>{shape{2, 3}}); });
  BOOST_TEST(mentions(what, "flatten::backward called without a forward pass"), what);
  what = error_of([&] { flat.forward(r, tensor<float>{shape{6}}); });
  BOOST_TEST(mentions(what, "flatten got a tensor of shape (6)"), what);
  flat.forward(r, tensor<float>{shape::nchw(2, 3, 2, 2)});
  what = error_of([&] { flat.backward(r, tensor<float>{shape{2, 6}}); });
  BOOST_TEST(mentions(what, "flatten backward got dy of shape (2, 6), expected (2, 12)"), what);
}

BOOST_AUTO_TEST_CASE(linear_examples_are_split_independent) {
  // With split_independent, an example's output and input gradient have the same bits whether it is
  // computed in the whole batch, in a part of it, or alone; without it, two runs of one
  // configuration still agree bit for bit.
  const std::int64_t in = 37, out = 19, n = 9;
  const auto x = dist::test::random_tensor<float>(shape{n, in}, 51);
  const auto dy = dist::test::random_tensor<float>(shape{n, out}, 52);
  auto rows = [&](std::int64_t from, std::int64_t count, std::span<const float> src, std::int64_t width) {
    return tensor<float>{shape{count, width},
                         std::vector<float>(src.begin() + from * width, src.begin() + (from + count) * width)};
  };
  for (bool split : {true, false}) {
    dist::one_device_strategy<> s;
    s.set_compute_options({.threads = 2, .split_independent = split});
    s.run([&](dist::replica auto& r) {
      nn::linear<float> lin{{.in_features = in, .out_features = out}, 7};
      const auto y = lin.forward(r, x);
      const auto dx = lin.backward(r, dy);
      const auto again = lin.forward(r, x);
      BOOST_TEST(same_bits(again.values(), y.values()), "the same batch twice, split " << split);
      if (!split) return;
      for (auto [from, count] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {4, 5}, {3, 1}, {8, 1}}) {
        const auto part_y = lin.forward(r, rows(from, count, x.values(), in));
        const auto part_dx = lin.backward(r, rows(from, count, dy.values(), out));
        BOOST_TEST(same_bits(part_y.values(), y.values().subspan(static_cast<std::size_t>(from * out),
                                                                 static_cast<std::size_t>(count * out))),
                   "outputs of examples " << from << ".." << from + count - 1);
        BOOST_TEST(same_bits(part_dx.values(), dx.values().subspan(static_cast<std::size_t>(from * in),
                                                                   static_cast<std::size_t>(count * in))),
                   "input gradients of examples " << from << ".." << from + count - 1);
      }
    });
  }
}

BOOST_AUTO_TEST_CASE(a_linear_classifier_learns_a_separable_problem_on_two_replicas) {
  // 100% accuracy on two replicas within a few hundred SGD steps; the same steps on one device end
  // with the same parameters to float rounding.
  dist::mirrored_strategy<> two{dist::cpu_replicas(2)};
  const auto trained = train_classifier(two, 400, true);
  BOOST_TEST_MESSAGE("linear classifier, 2 replicas: "
                     << trained.first_correct << "/" << classifier_batch << " correct at first, all after "
                     << trained.steps << " steps; loss " << trained.first_loss << " -> " << trained.last_loss);
  BOOST_TEST(trained.first_correct < classifier_batch);  // the problem needs learning
  BOOST_TEST(trained.last_correct == classifier_batch,
             trained.last_correct << "/" << classifier_batch << " correct after " << trained.steps << " steps");
  BOOST_TEST(trained.last_loss < 0.5f * trained.first_loss);
  dist::one_device_strategy<> one;
  const auto reference = train_classifier(one, trained.steps, false);
  const double err = dist::test::relative_error_of<float>(trained.parameters, reference.parameters);
  BOOST_TEST(err < 1e-4, "2 replicas against one device after " << trained.steps << " steps: " << err);
  BOOST_TEST(reference.last_correct == classifier_batch);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(classification_losses)

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_matches_pytorch) {
  // F.cross_entropy(logits, labels) on float64 logits, then .backward(); and
  // F.cross_entropy(logits, labels, reduction='sum') / 10. The literals are PyTorch's printed values.
  const tensor<double> logits{shape{4, 3}, {2.0, 1.0, 0.1, 0.5, 2.5, -1.0, -0.3, 0.2, 0.9, 1.0, 1.0, 1.0}};
  const std::vector<std::int32_t> labels{0, 2, 1, 1};
  const auto mean = nn::softmax_cross_entropy(logits, labels, 4);
  check_close(std::span<const double>(&mean.value, 1), {pytorch_ce_mean_value}, 1e-6, "mean loss");
  check_close(mean.grad.values(), pytorch_ce_mean_grad, 1e-6, "mean loss gradient");
  const auto share = nn::softmax_cross_entropy(logits, labels, 10);  // a share of a global batch of 10
  check_close(std::span<const double>(&share.value, 1), {pytorch_ce_sum10_value}, 1e-6, "sum / 10");
  check_close(share.grad.values(), pytorch_ce_sum10_grad, 1e-6, "sum / 10 gradient");
  // With a replica: the same bits.
  auto r = nn::local();
  const auto with_replica = nn::softmax_cross_entropy(r, logits, labels, 4);
  BOOST_TEST(with_replica.value == mean.value);
  BOOST_TEST(with_replica.grad == mean.grad);
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_is_stable_for_large_logits) {
  // F.cross_entropy(float32 [[1000, 0], [-1000, 1000]], [0, 0], reduction='none') is [0, 2000].
  const tensor<float> logits{shape{2, 2}, {1000.0f, 0.0f, -1000.0f, 1000.0f}};
  const auto l = nn::softmax_cross_entropy(logits, std::vector<std::int32_t>{0, 0}, 1);
  BOOST_TEST(l.value == 2000.0f);
  const std::vector<float> expected_grad{0.0f, 0.0f, -1.0f, 1.0f};
  BOOST_TEST(std::vector<float>(l.grad.begin(), l.grad.end()) == expected_grad, boost::test_tools::per_element());
  const auto one =
      nn::softmax_cross_entropy(tensor<float>{shape{1, 2}, {1000.0f, 0.0f}}, std::vector<std::int32_t>{0}, 1);
  BOOST_TEST(one.value == 0.0f);
  // Equal logits: log K.
  const auto flat =
      nn::softmax_cross_entropy(tensor<double>{shape{1, 5}, {3, 3, 3, 3, 3}}, std::vector<std::int32_t>{4}, 1);
  BOOST_TEST(flat.value == std::log(5.0), boost::test_tools::tolerance(1e-15));
}

BOOST_AUTO_TEST_CASE(bce_with_logits_matches_pytorch) {
  // F.binary_cross_entropy_with_logits(logits, targets) on float64, then .backward(). PyTorch's mean
  // over all 6 elements is the mean of the two examples' means. The literals are PyTorch's values.
  const tensor<double> logits{shape{2, 3}, {0.5, -1.2, 3.0, -0.1, 2.2, -4.0}};
  const tensor<double> targets{shape{2, 3}, {1.0, 0.0, 1.0, 0.0, 0.3, 1.0}};
  const auto l = nn::bce_with_logits(logits, targets, 2);
  check_close(std::span<const double>(&l.value, 1), {pytorch_bce_mean_value}, 1e-6, "mean loss");
  check_close(l.grad.values(), pytorch_bce_mean_grad, 1e-6, "mean loss gradient");
  auto r = nn::local();
  const auto with_replica = nn::bce_with_logits(r, logits, targets, 2);
  BOOST_TEST(with_replica.value == l.value);
  BOOST_TEST(with_replica.grad == l.grad);
  // Saturated logits stay finite: F.binary_cross_entropy_with_logits(float32 [[100, -100, 30]],
  // [[0, 1, 1]], reduction='none') is [100, 100, 9.357623e-14]; the mean over the example here.
  const auto big = nn::bce_with_logits(tensor<float>{shape{1, 3}, {100.0f, -100.0f, 30.0f}},
                                       tensor<float>{shape{1, 3}, {0.0f, 1.0f, 1.0f}}, 1);
  BOOST_TEST(big.value == (100.0f + 100.0f + 9.357623e-14f) / 3, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(big.grad[0] == 1.0f / 3, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(big.grad[1] == -1.0f / 3, boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(gradients_match_finite_differences) {
  for (int which = 0; which < 2; ++which) {
    auto x = dist::test::random_tensor<double>(shape{5, 4}, 71, -3.0, 3.0);
    const auto targets = dist::test::random_tensor<double>(x.shape(), 72, 0.0, 1.0);
    const std::vector<std::int32_t> labels{3, 0, 1, 3, 2};
    auto loss = [&] {
      return which == 0 ? nn::softmax_cross_entropy(x, labels, 7) : nn::bce_with_logits(x, targets, 7);
    };
    const auto analytic = loss().grad;
    std::vector<double> numeric(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double keep = x[i];
      x[i] = keep + 1e-6;
      const double up = loss().value;
      x[i] = keep - 1e-6;
      const double down = loss().value;
      x[i] = keep;
      numeric[i] = (up - down) / 2e-6;
    }
    const double err = dist::test::relative_error(numeric, analytic.values());
    BOOST_TEST(err < 1e-6, (which == 0 ? "softmax_cross_entropy" : "bce_with_logits") << ": relative error " << err);
  }
}

BOOST_AUTO_TEST_CASE(a_batch_split_in_parts_adds_up_to_the_whole) {
  // Two parts of a batch of 7 (4 and 3 examples), each over the global batch of 7: the shares add up
  // to the whole batch's loss, and each part's gradient is its rows of the whole's.
  const auto logits = dist::test::random_tensor<float>(shape{7, 5}, 81, -4.0, 4.0);
  const auto targets = dist::test::random_tensor<float>(logits.shape(), 82, 0.0, 1.0);
  const std::vector<std::int32_t> labels{0, 4, 2, 2, 1, 3, 0};
  auto part = [](const tensor<float>& t, std::int64_t from, std::int64_t count) {
    const std::int64_t w = t.shape()[1];
    return tensor<float>{shape{count, w}, std::vector<float>(t.begin() + from * w, t.begin() + (from + count) * w)};
  };
  const std::span<const std::int32_t> all(labels);
  for (int which = 0; which < 2; ++which) {
    auto loss = [&](const tensor<float>& x, const tensor<float>& t, std::span<const std::int32_t> y) {
      return which == 0 ? nn::softmax_cross_entropy(x, y, 7) : nn::bce_with_logits(x, t, 7);
    };
    const auto whole = loss(logits, targets, all);
    const auto a = loss(part(logits, 0, 4), part(targets, 0, 4), all.subspan(0, 4));
    const auto b = loss(part(logits, 4, 3), part(targets, 4, 3), all.subspan(4, 3));
    const char* name = which == 0 ? "softmax_cross_entropy" : "bce_with_logits";
    BOOST_TEST(std::abs(a.value + b.value - whole.value) <= 1e-6f * std::abs(whole.value),
               name << ": " << a.value << " + " << b.value << " against " << whole.value);
    std::vector<float> joined(a.grad.begin(), a.grad.end());
    joined.insert(joined.end(), b.grad.begin(), b.grad.end());
    BOOST_TEST(same_bits(joined, whole.grad.values()), name << ": the parts' gradients are the whole's rows");
  }
  // A replica without examples contributes nothing.
  const auto empty = nn::softmax_cross_entropy(tensor<float>{shape{0, 5}}, std::vector<std::int32_t>{}, 7);
  BOOST_TEST(empty.value == 0.0f);
  BOOST_TEST((empty.grad.shape() == shape{0, 5}));
  BOOST_TEST(nn::accuracy(tensor<float>{shape{0, 5}}, std::vector<std::int32_t>{}) == 0);
}

BOOST_AUTO_TEST_CASE(accuracy_counts_argmax_hits_and_breaks_ties_like_torch) {
  // torch.argmax([[1, 3, 3], [2, 2, 2], [0, -1, 0]], dim=1) is [1, 0, 0]: the first of equal maxima.
  const tensor<float> logits{shape{4, 3}, {1, 3, 3, 2, 2, 2, 0, -1, 0, 0.1f, 0.2f, 0.3f}};
  BOOST_TEST(nn::accuracy(logits, std::vector<std::int32_t>{1, 0, 0, 2}) == 4);
  BOOST_TEST(nn::accuracy(logits, std::vector<std::int32_t>{2, 1, 2, 2}) == 1);
  BOOST_TEST(nn::accuracy(logits, std::vector<std::int32_t>{0, 2, 1, 0}) == 0);
  auto r = nn::local();
  BOOST_TEST(nn::accuracy(r, logits, std::vector<std::int32_t>{1, 0, 0, 1}) == 3);
}

BOOST_AUTO_TEST_CASE(misuse_is_reported) {
  const tensor<float> logits{shape{3, 4}};
  std::string what = error_of([&] { nn::softmax_cross_entropy(logits, std::vector<std::int32_t>{0, 4, 1}, 3); });
  BOOST_TEST(mentions(what, "softmax_cross_entropy: the label of example 1 is 4, outside [0, 4) for 4 classes"), what);
  what = error_of([&] { nn::softmax_cross_entropy(logits, std::vector<std::int32_t>{0, 1, -1}, 3); });
  BOOST_TEST(mentions(what, "the label of example 2 is -1"), what);
  what = error_of([&] { nn::softmax_cross_entropy(logits, std::vector<std::int32_t>{0, 1}, 3); });
  BOOST_TEST(mentions(what, "softmax_cross_entropy of logits (3, 4) and 2 labels: one label per example"), what);
  what = error_of([&] {
    nn::softmax_cross_entropy(tensor<float>{shape::nchw(3, 4, 1, 1)}, std::vector<std::int32_t>{0, 1, 2}, 3);
  });
  BOOST_TEST(mentions(what, "softmax_cross_entropy takes logits [N, K]; got a tensor of shape (3, 4, 1, 1)"), what);
  what = error_of([&] { nn::softmax_cross_entropy(logits, std::vector<std::int32_t>{0, 1, 2}, 0); });
  BOOST_TEST(mentions(what, "softmax_cross_entropy needs a positive global batch size, got 0"), what);
  what = error_of([&] { nn::accuracy(logits, std::vector<std::int32_t>{0, 1, 7}); });
  BOOST_TEST(mentions(what, "accuracy: the label of example 2 is 7, outside [0, 4)"), what);
  what = error_of([&] { nn::bce_with_logits(logits, tensor<float>{shape{4, 3}}, 3); });
  BOOST_TEST(mentions(what, "bce_with_logits of a prediction (3, 4) and a target (4, 3)"), what);
  what = error_of([&] { nn::bce_with_logits(logits, logits, -2); });
  BOOST_TEST(mentions(what, "bce_with_logits needs a positive global batch size, got -2"), what);
}

BOOST_AUTO_TEST_SUITE_END()
