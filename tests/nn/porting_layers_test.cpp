// The layers a port from PyTorch reaches for: embedding, upsample (nearest, bilinear), pixel_shuffle,
// layer_norm and spectral_norm. Gradients against finite differences in double, values against
// PyTorch (literals below: the calls that produced them are named), shapes, state-dict names and
// every error. The comparison with PyTorch itself on random inputs and weights is in
// tests/interop/python_test.cpp.

#include "nn_test_support.hpp"

#include <distribute/nn/check_gradients.hpp>
#include <distribute/nn/state_dict.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;
using namespace distribute::test;

namespace {

static_assert(nn::layer_with_state<nn::embedding<float>>);
static_assert(nn::layer_with_state<nn::upsample<float>>);
static_assert(nn::layer_with_state<nn::pixel_shuffle<float>>);
static_assert(nn::layer_with_state<nn::layer_norm<float>>);
static_assert(nn::layer_with_state<nn::spectral_norm<nn::linear<float>>>);
static_assert(nn::layer_with_state<nn::spectral_norm<nn::conv2d<float>>>);

struct name_collector {
  std::vector<std::string>* names;
  template <class T, class D>
  void parameter(const std::string& name, nn::parameter<T, D>&) {
    names->push_back(name);
  }
  void buffer(const std::string& name, std::span<double>) { names->push_back(name); }
};
template <class M>
std::vector<std::string> names_of(M& m) {
  std::vector<std::string> out;
  nn::for_each_named_state(m, name_collector{&out});
  return out;
}

// Sets every parameter to seeded random values (so that weights of 1 and biases of 0 do not hide a
// gradient that ignores them).
template <class M>
void randomise(M& m, std::uint32_t seed) {
  m.for_each_parameter([&](std::span<double> v, std::span<double>) {
    const auto r = random_tensor<double>(shape{static_cast<std::int64_t>(v.size())}, seed++, -1.5, 1.5);
    std::copy(r.begin(), r.end(), v.begin());
  });
}

// nn::check_gradients passes, or the test fails with its report.
#define CHECK_GRADIENTS(call)                                         \
  do {                                                                \
    const auto problem = error_of([&] { nn::check_gradients call; }); \
    BOOST_TEST(problem == "no error", problem);                       \
  } while (0)

tensor<double> indices(shape s, std::vector<double> v) { return tensor<double>{s, v}; }

}  // namespace

BOOST_AUTO_TEST_SUITE(porting_layers)

// --- embedding --------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(embedding_gathers_rows_in_any_index_shape) {
  nn::embedding<double> emb{{.num_embeddings = 5, .embedding_dim = 3}, 7};
  auto r = nn::local();
  const auto w = emb.weight().value;
  const auto y = emb.forward(r, indices(shape{4}, {4, 0, 4, 2}));
  BOOST_TEST((y.shape() == shape{4, 3}));
  const int picked[] = {4, 0, 4, 2};
  for (int i = 0; i < 4; ++i)
    for (int d = 0; d < 3; ++d)
      BOOST_TEST(y[static_cast<std::size_t>(i * 3 + d)] == w[static_cast<std::size_t>(picked[i] * 3 + d)]);
  const auto y2 = emb.forward(r, indices(shape{2, 2}, {1, 3, 3, 0}));
  BOOST_TEST((y2.shape() == shape{2, 2, 3}));
  BOOST_TEST(y2[3 * 3 + 1] == w[0 * 3 + 1]);
  BOOST_TEST((emb.output_shape(shape{2, 3, 4}) == shape{2, 3, 4, 3}));
}

BOOST_AUTO_TEST_CASE(embedding_weights_are_standard_normal_as_pytorchs) {
  nn::embedding<double> emb{{.num_embeddings = 200, .embedding_dim = 50}, 3};
  double mean = 0, sq = 0;
  for (double v : emb.weight().value) mean += v;
  mean /= 10000;
  for (double v : emb.weight().value) sq += (v - mean) * (v - mean);
  const double sd = std::sqrt(sq / 10000);
  BOOST_TEST(std::abs(mean) < 0.05);
  BOOST_TEST(std::abs(sd - 1.0) < 0.05);
  BOOST_TEST((names_of(emb) == std::vector<std::string>{"weight"}));
}

// The weight gradient against finite differences, with rows picked several times, once, and never.
BOOST_AUTO_TEST_CASE(embedding_weight_gradient_matches_finite_differences) {
  nn::embedding<double> emb{{.num_embeddings = 6, .embedding_dim = 4}, 11};
  auto r = nn::local();
  const auto x = indices(shape{3, 3}, {2, 5, 2, 0, 2, 5, 1, 1, 2});
  const auto g = random_tensor<double>(shape{3, 3, 4}, 5);
  emb.zero_grad();
  emb.forward(r, x);
  const auto dx = emb.backward(r, g);
  BOOST_TEST((dx.shape() == x.shape()));  // zeros: indices have no gradient
  for (double v : dx) BOOST_TEST(v == 0.0);
  const std::vector<double> analytic(emb.weight().grad.begin(), emb.weight().grad.end());
  auto loss = [&] {
    const auto y = emb.forward(r, x);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += g[i] * y[i];
    return s;
  };
  auto& w = emb.weight().value;
  std::vector<double> numeric(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double keep = w[i];
    w[i] = keep + 1e-6;
    const double up = loss();
    w[i] = keep - 1e-6;
    const double down = loss();
    w[i] = keep;
    numeric[i] = (up - down) / 2e-6;
  }
  BOOST_TEST(relative_error(numeric, analytic) < 1e-8);
  for (std::size_t d = 0; d < 4; ++d) BOOST_TEST(analytic[3 * 4 + d] == 0.0);  // row 3: never picked
  // The no_input_gradient form adds the same and returns nothing.
  emb.zero_grad();
  emb.forward(r, x);
  BOOST_TEST(emb.backward(r, g, nn::no_input_gradient).empty());
  BOOST_TEST(relative_error(analytic, std::vector<double>(emb.weight().grad.begin(), emb.weight().grad.end())) == 0.0);
}

// Each example's rows added in example order: two halves of a batch accumulate to the whole's bits.
BOOST_AUTO_TEST_CASE(embedding_gradients_of_parts_of_a_batch_have_the_bits_of_the_whole) {
  nn::embedding<float> emb{{.num_embeddings = 7, .embedding_dim = 5}, 2};
  auto r = nn::local();
  const tensor<float> x{shape{8}, std::vector<float>{3, 1, 3, 3, 6, 1, 3, 0}};
  const auto g = random_tensor<float>(shape{8, 5}, 9);
  emb.zero_grad();
  emb.forward(r, x);
  emb.backward(r, g);
  const auto whole = gradients_of<float>(emb);
  emb.zero_grad();
  for (int half = 0; half < 2; ++half) {
    tensor<float> xs{shape{4}}, gs{shape{4, 5}};
    std::copy_n(x.begin() + half * 4, 4, xs.begin());
    std::copy_n(g.begin() + half * 20, 20, gs.begin());
    emb.forward(r, xs);
    emb.backward(r, gs);
  }
  BOOST_TEST(gradients_of<float>(emb) == whole);
}

BOOST_AUTO_TEST_CASE(embedding_padding_row_starts_at_zero_and_gets_no_gradient) {
  nn::embedding<double> emb{{.num_embeddings = 4, .embedding_dim = 2, .padding_idx = -1}, 1};  // row 3
  BOOST_TEST(emb.weight().value[6] == 0.0);
  BOOST_TEST(emb.weight().value[7] == 0.0);
  auto r = nn::local();
  emb.zero_grad();
  emb.forward(r, indices(shape{3}, {3, 1, 3}));
  emb.backward(r, tensor<double>{shape{3, 2}, std::vector<double>{1, 2, 3, 4, 5, 6}});
  const auto& gr = emb.weight().grad;
  BOOST_TEST(gr[6] == 0.0);
  BOOST_TEST(gr[7] == 0.0);
  BOOST_TEST(gr[2] == 3.0);
  BOOST_TEST(gr[3] == 4.0);
}

BOOST_AUTO_TEST_CASE(embedding_refuses_bad_indices_naming_them) {
  nn::embedding<float> emb{{.num_embeddings = 4, .embedding_dim = 2}, 1};
  auto r = nn::local();
  auto err = [&](std::vector<float> v) {
    return error_of([&] { emb.forward(r, tensor<float>{shape{static_cast<std::int64_t>(v.size())}, v}); });
  };
  const auto e1 = err({0, 4, 1});
  BOOST_TEST(mentions(e1, "distribute: embedding {num_embeddings 4, embedding_dim 2}: index 4 at position 1"), e1);
  BOOST_TEST(mentions(e1, "outside [0, 4)"), e1);
  BOOST_TEST(mentions(err({-1}), "index -1 at position 0"));
  const auto e3 = err({1, 2.5f});
  BOOST_TEST(mentions(e3, "index 2.5 at position 1 of the indices of shape (2) is not an integer"), e3);
  BOOST_TEST(mentions(err({NAN}), "outside [0, 4)"));
  BOOST_TEST(mentions(error_of([&] { emb.forward(r, tensor<float>{shape::nchw(1, 1, 1, 1)}); }),
                      "got indices of shape (1, 1, 1, 1)"));
  emb.forward(r, tensor<float>{shape{2}});
  BOOST_TEST(mentions(error_of([&] { emb.backward(r, tensor<float>{shape{2, 3}}); }),
                      "backward got dy of shape (2, 3), expected (2, 2)"));
  const auto opt = error_of([] { nn::embedding<float>{{.num_embeddings = 0, .embedding_dim = 2}, 1}; });
  BOOST_TEST(mentions(opt, "num_embeddings is 0 but must be at least 1"), opt);
  const auto pad = error_of([] { nn::embedding<float>{{.num_embeddings = 3, .padding_idx = 3}, 1}; });
  BOOST_TEST(mentions(pad, "padding_idx is 3 but must be in [-num_embeddings, num_embeddings)"), pad);
}

// --- upsample ---------------------------------------------------------------------------------------

// torch.nn.Upsample(scale_factor=2, mode=...)(torch.tensor([[[[1., 2.], [3., 4.]]]]))
BOOST_AUTO_TEST_CASE(upsample_values_are_pytorchs) {
  auto r = nn::local();
  const tensor<double> x{shape::nchw(1, 1, 2, 2), std::vector<double>{1, 2, 3, 4}};
  nn::upsample<double> nearest{};
  const std::vector<double> n{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  BOOST_TEST(nearest.forward(r, x).values() == n, boost::test_tools::per_element());
  nn::upsample<double> bilinear{{.scale_factor = 2, .mode = nn::upsample_mode::bilinear}};
  const std::vector<double> b{1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0};
  BOOST_TEST(bilinear.forward(r, x).values() == b, boost::test_tools::per_element());
  // scale 3, bilinear, one row: torch.nn.functional.interpolate(torch.tensor([[[[0., 3.]]]]),
  // scale_factor=3, mode="bilinear") = [0, 0, 1, 2, 3, 3]
  nn::upsample<double> three{{.scale_factor = 3, .mode = nn::upsample_mode::bilinear}};
  const auto y = three.forward(r, tensor<double>{shape::nchw(1, 1, 1, 2), std::vector<double>{0, 3}});
  BOOST_TEST((y.shape() == shape::nchw(1, 1, 3, 6)));
  const std::vector<double> row{0, 0, 1, 2, 3, 3};
  for (std::size_t i = 0; i < 6; ++i) BOOST_TEST(std::abs(y[i] - row[i]) < 1e-12);
}

BOOST_AUTO_TEST_CASE(upsample_gradients_match_finite_differences) {
  const auto x = random_tensor<double>(shape::nchw(2, 3, 5, 4), 3);
  for (const auto mode : {nn::upsample_mode::nearest, nn::upsample_mode::bilinear})
    for (const std::int64_t s : {1, 2, 3}) {
      nn::upsample<double> up{{.scale_factor = s, .mode = mode}};
      CHECK_GRADIENTS((up, x, {.tolerance = 1e-6}));
    }
}

BOOST_AUTO_TEST_CASE(upsample_refuses_bad_shapes_and_options) {
  auto r = nn::local();
  nn::upsample<float> up{};
  BOOST_TEST(mentions(
      error_of([&] { up.forward(r, tensor<float>{shape{2, 3}}); }),
      "distribute: upsample {scale_factor 2, mode nearest} got a tensor of shape (2, 3); it takes [N, C, H, W]"));
  up.forward(r, tensor<float>{shape::nchw(1, 1, 2, 2)});
  BOOST_TEST(mentions(error_of([&] { up.backward(r, tensor<float>{shape::nchw(1, 1, 2, 2)}); }),
                      "backward got dy of shape (1, 1, 2, 2), expected (1, 1, 4, 4)"));
  BOOST_TEST(
      mentions(error_of([] { nn::upsample<float>{{.scale_factor = 0}}; }), "scale_factor is 0 but must be at least 1"));
}

// --- pixel_shuffle ----------------------------------------------------------------------------------

// torch.nn.PixelShuffle(2)(torch.arange(8.).reshape(1, 8, 1, 1)):
// [[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]; on 2x2 planes, channel k's (h, w) lands at (2h + k/2 % 2, 2w + k % 2).
BOOST_AUTO_TEST_CASE(pixel_shuffle_moves_elements_in_pytorchs_order) {
  auto r = nn::local();
  nn::pixel_shuffle<double> ps{{.upscale_factor = 2}};
  tensor<double> x{shape::nchw(1, 8, 1, 1)};
  for (std::size_t i = 0; i < 8; ++i) x[i] = static_cast<double>(i);
  const auto y = ps.forward(r, x);
  BOOST_TEST((y.shape() == shape::nchw(1, 2, 2, 2)));
  BOOST_TEST(y.values() == x.values(), boost::test_tools::per_element());
  const auto big = random_tensor<double>(shape::nchw(2, 18, 2, 3), 4);
  nn::pixel_shuffle<double> ps3{{.upscale_factor = 3}};
  const auto yb = ps3.forward(r, big);
  BOOST_TEST((yb.shape() == shape::nchw(2, 2, 6, 9)));
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t c = 0; c < 2; ++c)
      for (std::int64_t h = 0; h < 6; ++h)
        for (std::int64_t w = 0; w < 9; ++w) {
          const std::int64_t k = c * 9 + (h % 3) * 3 + w % 3;
          BOOST_TEST(yb[static_cast<std::size_t>(((n * 2 + c) * 6 + h) * 9 + w)] ==
                     big[static_cast<std::size_t>(((n * 18 + k) * 2 + h / 3) * 3 + w / 3)]);
        }
  // Backward is the inverse permutation (pixel_unshuffle): the output given back is the input.
  BOOST_TEST(ps3.backward(r, yb).values() == big.values(), boost::test_tools::per_element());
  CHECK_GRADIENTS((ps3, big, {.tolerance = 1e-6}));
}

BOOST_AUTO_TEST_CASE(pixel_shuffle_refuses_channels_that_do_not_divide) {
  auto r = nn::local();
  nn::pixel_shuffle<float> ps{{.upscale_factor = 2}};
  const auto e = error_of([&] { ps.forward(r, tensor<float>{shape::nchw(1, 6, 2, 2)}); });
  BOOST_TEST(mentions(e,
                      "distribute: pixel_shuffle {upscale_factor 2} got a tensor of shape (1, 6, 2, 2); it takes "
                      "[N, C*4, H, W]"),
             e);
  BOOST_TEST(mentions(error_of([] { nn::pixel_shuffle<float>{{.upscale_factor = 0}}; }),
                      "upscale_factor is 0 but must be at least 1"));
}

// --- layer_norm -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(layer_norm_normalises_each_group_and_starts_as_pytorch) {
  nn::layer_norm<double> ln{{.normalized_shape = shape{3, 4}}};
  BOOST_TEST((names_of(ln) == std::vector<std::string>{"weight", "bias"}));
  for (double v : ln.weight().value) BOOST_TEST(v == 1.0);
  for (double v : ln.bias().value) BOOST_TEST(v == 0.0);
  BOOST_TEST((ln.weight().value.shape() == shape{3, 4}));
  auto r = nn::local();
  const auto x = random_tensor<double>(shape{5, 3, 4}, 8, -3, 4);
  const auto y = ln.forward(r, x);
  for (std::size_t g = 0; g < 5; ++g) {
    double m = 0, v = 0;
    for (std::size_t i = 0; i < 12; ++i) m += y[g * 12 + i];
    m /= 12;
    for (std::size_t i = 0; i < 12; ++i) v += (y[g * 12 + i] - m) * (y[g * 12 + i] - m);
    BOOST_TEST(std::abs(m) < 1e-12);
    BOOST_TEST(std::abs(v / 12 - 1.0) < 1e-4);  // eps 1e-5 in the variance
  }
  // torch.nn.LayerNorm(3)(torch.tensor([[1., 2., 4.]])) = [[-1.0690, -0.2673, 1.3363]]
  nn::layer_norm<double> three{{.normalized_shape = shape{3}}};
  const auto t = three.forward(r, tensor<double>{shape{1, 3}, std::vector<double>{1, 2, 4}});
  BOOST_TEST(std::abs(t[0] + 1.0690) < 1e-4);
  BOOST_TEST(std::abs(t[1] + 0.2673) < 1e-4);
  BOOST_TEST(std::abs(t[2] - 1.3363) < 1e-4);
}

BOOST_AUTO_TEST_CASE(layer_norm_gradients_match_finite_differences) {
  {
    nn::layer_norm<double> ln{{.normalized_shape = shape{7}}};
    randomise(ln, 3);
    CHECK_GRADIENTS((ln, random_tensor<double>(shape{4, 7}, 1), {.tolerance = 1e-6}));
  }
  {
    nn::layer_norm<double> ln{{.normalized_shape = shape{2, 3, 4}}};
    randomise(ln, 5);
    CHECK_GRADIENTS((ln, random_tensor<double>(shape::nchw(3, 2, 3, 4), 2), {.tolerance = 1e-6}));
  }
  {
    nn::layer_norm<double> ln{{.normalized_shape = shape{4}, .elementwise_affine = false}};
    BOOST_TEST(names_of(ln).empty());
    CHECK_GRADIENTS((ln, random_tensor<double>(shape{2, 3, 4}, 6), {.tolerance = 1e-6}));
  }
  {
    nn::layer_norm<double> ln{{.normalized_shape = shape{5}, .bias = false}};
    BOOST_TEST((names_of(ln) == std::vector<std::string>{"weight"}));
    randomise(ln, 9);
    CHECK_GRADIENTS((ln, random_tensor<double>(shape{3, 5}, 7), {.tolerance = 1e-6}));
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_refuses_shapes_that_do_not_end_in_its_shape) {
  auto r = nn::local();
  nn::layer_norm<float> ln{{.normalized_shape = shape{3, 4}}};
  const auto e = error_of([&] { ln.forward(r, tensor<float>{shape{2, 4, 3}}); });
  BOOST_TEST(mentions(e,
                      "distribute: layer_norm {normalized_shape (3, 4), eps 1e-05, elementwise_affine} got a "
                      "tensor of shape (2, 4, 3); its trailing extents must be (3, 4)"),
             e);
  BOOST_TEST(mentions(error_of([&] { ln.forward(r, tensor<float>{shape{4}}); }), "got a tensor of shape (4)"));
  ln.forward(r, tensor<float>{shape{2, 3, 4}});
  BOOST_TEST(mentions(error_of([&] { ln.backward(r, tensor<float>{shape{2, 12}}); }),
                      "backward got dy of shape (2, 12), expected (2, 3, 4)"));
  BOOST_TEST(mentions(error_of([] { nn::layer_norm<float>{{.normalized_shape = shape{4}, .eps = 0}}; }),
                      "eps is 0 but must be positive"));
  BOOST_TEST(
      mentions(error_of([] { nn::layer_norm<float>{{.normalized_shape = shape{}}}; }), "normalized_shape is empty"));
}

// --- spectral_norm ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(spectral_norm_names_its_state_as_pytorch) {
  nn::spectral_norm sn{nn::conv2d<float>{{.in_channels = 3, .out_channels = 5, .kernel = 3}, 1}};
  BOOST_TEST((names_of(sn) == std::vector<std::string>{"weight_orig", "bias", "weight_u", "weight_v"}));
  BOOST_TEST(sn.weight_u().size() == 5u);
  BOOST_TEST(sn.weight_v().size() == 27u);
  double nu = 0;
  for (double v : sn.weight_u()) nu += v * v;
  BOOST_TEST(std::abs(nu - 1.0) < 1e-6);  // normalised draws, as PyTorch's
  nn::spectral_norm lin{nn::linear<float>{{.in_features = 4, .out_features = 2, .bias = false}, 1}};
  BOOST_TEST((names_of(lin) == std::vector<std::string>{"weight_orig", "weight_u", "weight_v"}));
}

// The power iteration finds the largest singular value, and the layer computes with W / sigma.
BOOST_AUTO_TEST_CASE(spectral_norm_divides_by_the_largest_singular_value) {
  nn::linear<double> lin{{.in_features = 3, .out_features = 2, .bias = false}, 1};
  const std::vector<double> w{3, 0, 0, 0, -1, 0};  // singular values 3 and 1
  std::copy(w.begin(), w.end(), lin.weight().value.begin());
  nn::spectral_norm sn{lin, {}, 4};
  auto r = nn::local();
  const tensor<double> x{shape{1, 3}, std::vector<double>{1, 1, 1}};
  tensor<double> y;
  for (int i = 0; i < 30; ++i) y = sn.forward(r, x);
  BOOST_TEST(std::abs(std::abs(y[0]) - 1.0) < 1e-9);
  BOOST_TEST(std::abs(std::abs(y[1]) - 1.0 / 3) < 1e-9);
  BOOST_TEST(std::abs(std::abs(sn.weight_u()[0]) - 1.0) < 1e-9);
  // In evaluation u and v stay as they are.
  const std::vector<double> u(sn.weight_u().begin(), sn.weight_u().end());
  sn.set_training(false);
  sn.forward(r, x);
  BOOST_TEST(std::vector<double>(sn.weight_u().begin(), sn.weight_u().end()) == u);
  sn.set_training(true);
  nn::spectral_norm none{lin, {.n_power_iterations = 0}, 4};
  const std::vector<double> u0(none.weight_u().begin(), none.weight_u().end());
  none.forward(r, x);
  BOOST_TEST(std::vector<double>(none.weight_u().begin(), none.weight_u().end()) == u0);
}

// u and v constants, as PyTorch's gradient takes them: checked in evaluation, where a forward does not
// move them, after training forwards moved them off their draws.
BOOST_AUTO_TEST_CASE(spectral_norm_gradients_match_finite_differences) {
  auto r = nn::local();
  {
    nn::spectral_norm sn{nn::linear<double>{{.in_features = 5, .out_features = 4}, 3}, {}, 2};
    randomise(sn, 4);
    const auto x = random_tensor<double>(shape{3, 5}, 1);
    sn.forward(r, x);
    sn.set_training(false);
    CHECK_GRADIENTS((sn, x, {.tolerance = 1e-6}));
  }
  {
    nn::spectral_norm sn{
        nn::conv2d<double>{{.in_channels = 2, .out_channels = 3, .kernel = 3, .padding = 1}, 3}, {}, 5};
    randomise(sn, 6);
    const auto x = random_tensor<double>(shape::nchw(2, 2, 4, 4), 2);
    sn.forward(r, x);
    sn.forward(r, x);
    sn.set_training(false);
    CHECK_GRADIENTS((sn, x, {.tolerance = 1e-6}));
  }
}

// Two applications before the backwards: each backward uses its own forward's W / sigma, u and v.
BOOST_AUTO_TEST_CASE(spectral_norm_applied_twice_keeps_each_forwards_values) {
  auto r = nn::local();
  nn::spectral_norm sn{nn::linear<double>{{.in_features = 4, .out_features = 3}, 3}, {}, 2};
  randomise(sn, 8);
  const auto a = random_tensor<double>(shape{2, 4}, 1), b = random_tensor<double>(shape{2, 4}, 2);
  const auto g = random_tensor<double>(shape{2, 3}, 3);
  using state = decltype(sn)::state_type;
  state sa, sb;
  sn.forward(r, a, sa);
  sn.forward(r, b, sb);  // moves u and v again
  sn.zero_grad();
  const auto db = sn.backward(r, sb, g);
  const auto da = sn.backward(r, sa, g);
  const auto together = gradients_of<double>(sn);
  // The same by one forward and backward each, from the same u and v.
  nn::spectral_norm again{nn::linear<double>{{.in_features = 4, .out_features = 3}, 3}, {}, 2};
  randomise(again, 8);
  again.zero_grad();
  again.forward(r, a);
  const auto da1 = again.backward(r, g);
  again.forward(r, b);
  const auto db1 = again.backward(r, g);
  BOOST_TEST(da.values() == da1.values(), boost::test_tools::per_element());
  BOOST_TEST(db.values() == db1.values(), boost::test_tools::per_element());
  BOOST_TEST(relative_error(together, gradients_of<double>(again)) < 1e-14);
  BOOST_TEST(mentions(error_of([&] { sn.backward(r, sa, g); }),
                      "spectral_norm::backward got the state of its forward 1 a second time"));
}

BOOST_AUTO_TEST_CASE(spectral_norm_refuses_bad_options) {
  const auto e = error_of([] { nn::spectral_norm sn{nn::linear<float>{{}, 1}, {.n_power_iterations = -1}}; });
  BOOST_TEST(mentions(e,
                      "distribute: spectral_norm {n_power_iterations -1, eps 1e-12}: n_power_iterations is -1 but "
                      "must be at least 0"),
             e);
  BOOST_TEST(mentions(error_of([] { nn::spectral_norm sn{nn::linear<float>{{}, 1}, {.eps = 0}}; }),
                      "eps is 0 but must be positive"));
}

// --- on a tape --------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_layers_record_on_a_tape_several_times) {
  auto r = nn::local();
  nn::upsample<double> up{{.mode = nn::upsample_mode::bilinear}};
  nn::layer_norm<double> ln{{.normalized_shape = shape{2, 4, 4}}};
  randomise(ln, 2);
  const auto x = random_tensor<double>(shape::nchw(1, 2, 2, 2), 4);
  const auto g = random_tensor<double>(shape::nchw(1, 2, 4, 4), 5);
  nn::tape<nn::local_replica, double> t{r};
  const auto v = t.watch(x);
  const auto y = t.add(t(ln, t(up, v)), t(up, v));
  ln.zero_grad();
  t.backward(y, g);
  // By hand: dx = up'(ln'(g)) + up'(g).
  ln.forward(r, up.forward(r, x));
  const auto by_ln = ln.backward(r, g);
  const auto part = up.backward(r, by_ln);
  up.forward(r, x);
  const auto direct = up.backward(r, g);
  const auto dx = t.gradient(v);
  for (std::size_t i = 0; i < dx.size(); ++i) BOOST_TEST(std::abs(dx[i] - (part[i] + direct[i])) < 1e-12);
}

BOOST_AUTO_TEST_SUITE_END()
