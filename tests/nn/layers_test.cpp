// Tensors and their Eigen views; every layer's backward against central finite differences; the
// reference definitions of reflection padding, convolution and transposed convolution; the losses.

#include "nn_test_support.hpp"

#include <distribute/nn/classification_losses.hpp>
#include <distribute/tensor/eigen_tensor.hpp>

#include <boost/test/unit_test.hpp>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;

namespace {

// The definition of a convolution (PyTorch's Conv2d, zero padding), element by element.
tensor<double> reference_conv2d(const tensor<double>& x, const tensor<double>& w, std::int64_t s, std::int64_t p) {
  const auto& xs = x.shape();
  const std::int64_t co = w.shape()[0], k = w.shape()[2];
  const std::int64_t ho = (xs.h() + 2 * p - k) / s + 1, wo = (xs.w() + 2 * p - k) / s + 1;
  tensor<double> y{shape::nchw(xs.n(), co, ho, wo)};
  for (std::int64_t n = 0; n < xs.n(); ++n)
    for (std::int64_t o = 0; o < co; ++o)
      for (std::int64_t oh = 0; oh < ho; ++oh)
        for (std::int64_t ow = 0; ow < wo; ++ow) {
          double acc = 0;
          for (std::int64_t c = 0; c < xs.c(); ++c)
            for (std::int64_t i = 0; i < k; ++i)
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t ih = oh * s - p + i, iw = ow * s - p + j;
                if (ih >= 0 && ih < xs.h() && iw >= 0 && iw < xs.w()) acc += x(n, c, ih, iw) * w(o, c, i, j);
              }
          y(n, o, oh, ow) = acc;
        }
  return y;
}

// The definition of a transposed convolution (PyTorch's ConvTranspose2d): input (ih, iw) scatters
// w[c, o, i, j] into output (ih*s - p + i, iw*s - p + j).
tensor<double> reference_conv_transpose2d(const tensor<double>& x, const tensor<double>& w, std::int64_t s,
                                          std::int64_t p, std::int64_t op) {
  const auto& xs = x.shape();
  const std::int64_t co = w.shape()[1], k = w.shape()[2];
  const std::int64_t ho = (xs.h() - 1) * s - 2 * p + k + op, wo = (xs.w() - 1) * s - 2 * p + k + op;
  tensor<double> y{shape::nchw(xs.n(), co, ho, wo)};
  for (std::int64_t n = 0; n < xs.n(); ++n)
    for (std::int64_t c = 0; c < xs.c(); ++c)
      for (std::int64_t ih = 0; ih < xs.h(); ++ih)
        for (std::int64_t iw = 0; iw < xs.w(); ++iw)
          for (std::int64_t o = 0; o < co; ++o)
            for (std::int64_t i = 0; i < k; ++i)
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t oh = ih * s - p + i, ow = iw * s - p + j;
                if (oh >= 0 && oh < ho && ow >= 0 && ow < wo) y(n, o, oh, ow) += x(n, c, ih, iw) * w(c, o, i, j);
              }
  return y;
}

double max_abs_diff(const tensor<double>& a, const tensor<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tensors)

BOOST_AUTO_TEST_CASE(shape_and_storage) {
  const auto s = shape::nchw(2, 3, 4, 5);
  BOOST_TEST(s.rank() == 4u);
  BOOST_TEST(s.numel() == 120);
  BOOST_TEST((s.with_batch(7) == shape::nchw(7, 3, 4, 5)));
  BOOST_TEST(s.to_string() == "(2, 3, 4, 5)");
  dist::tensor<float> t{s};
  BOOST_TEST(t.size() == 120u);
  t(1, 2, 3, 4) = 7.0f;
  BOOST_TEST(t[119] == 7.0f);  // NCHW: the last element
  t(1, 0, 0, 1) = 3.0f;
  BOOST_TEST(t[61] == 3.0f);
  BOOST_CHECK_THROW((dist::tensor<float>{s, std::vector<float>(3)}), std::invalid_argument);
  BOOST_CHECK_THROW(t.reshape(shape{7}), std::invalid_argument);
  BOOST_CHECK_THROW((shape{1, 2, 3, 4, 5}), std::invalid_argument);
  BOOST_CHECK_THROW((shape{-1}), std::invalid_argument);
}

// The contract both devices' tensors keep (the CUDA suite checks the same on a GPU): a default-made
// tensor is empty although its rank-0 shape counts one element; copying it, or assigning it over a
// full one, gives an empty tensor and reads nothing; it cannot be reshaped to one element.
BOOST_AUTO_TEST_CASE(a_default_tensor_is_empty_and_copies_as_empty) {
  dist::tensor<float> empty;
  BOOST_TEST(empty.empty());
  BOOST_TEST(empty.size() == 0u);
  BOOST_TEST(empty.shape().numel() == 1);  // rank 0: the reason size() cannot be the shape's count
  const dist::tensor<float> copy{empty};
  BOOST_TEST(copy.empty());
  dist::tensor<float> full{shape{2, 3}};
  full = empty;
  BOOST_TEST(full.empty());
  BOOST_CHECK_THROW(empty.reshape(shape{1}), std::invalid_argument);
  dist::tensor<float> grown;
  grown.resize(shape{1});
  BOOST_TEST(grown.size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_range_fill_writes_that_range_alone) {
  dist::tensor<float> t{shape{10}};
  t.fill(1.0f);
  t.fill(5.0f, 3, 2);
  const std::vector<float> want{1, 1, 1, 5, 5, 1, 1, 1, 1, 1};
  BOOST_TEST(std::vector<float>(t.begin(), t.end()) == want, boost::test_tools::per_element());
  t.fill(9.0f, 10, 0);  // empty, at the end: nothing
  BOOST_TEST(std::vector<float>(t.begin(), t.end()) == want, boost::test_tools::per_element());
  BOOST_CHECK_EXCEPTION(t.fill(0.0f, 8, 3), std::out_of_range, [](const std::out_of_range& e) {
    return std::string(e.what()).find("[8, 8 + 3) outside its 10 elements") != std::string::npos;
  });
  BOOST_CHECK_THROW(t.fill(0.0f, 11, 0), std::out_of_range);
  // No overflow past the check. (The count goes through a volatile: seeing the constant, GCC 12 warns
  // of the memset the check never reaches, -Wstringop-overflow.)
  volatile std::size_t huge = std::size_t(-1);
  BOOST_CHECK_THROW(t.fill(0.0f, 1, huge), std::out_of_range);
  BOOST_TEST(std::vector<float>(t.begin(), t.end()) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(eigen_views_alias_the_storage) {
  dist::tensor<float> t{shape::nchw(2, 3, 2, 2)};
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i);
  auto m = dist::example_matrix(t, 1);  // example 1 as [C, H*W]
  BOOST_TEST(m.rows() == 3);
  BOOST_TEST(m.cols() == 4);
  BOOST_TEST(m(2, 3) == 23.0f);
  BOOST_TEST(m.data() == t.data() + 12);  // zero-copy
  m(0, 0) = -1.0f;
  BOOST_TEST(t(1, 0, 0, 0) == -1.0f);
  auto e = dist::as_eigen_tensor<4>(t);
  BOOST_TEST(e(1, 2, 1, 0) == t(1, 2, 1, 0));
  e(0, 1, 1, 1) = 42.0f;
  BOOST_TEST(t(0, 1, 1, 1) == 42.0f);
  BOOST_TEST(dist::as_vector(t).sum() == std::accumulate(t.begin(), t.end(), 0.0f));
  BOOST_CHECK_THROW(dist::as_matrix(t, 5, 5), std::out_of_range);
  BOOST_CHECK_THROW(dist::as_eigen_tensor<3>(t), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layers)

BOOST_AUTO_TEST_CASE(conv2d_matches_its_definition) {
  for (auto [s, p] : {std::pair{1, 0}, std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 0}}) {
    nn::conv2d<double> conv{{.in_channels = 3, .out_channels = 4, .kernel = 3, .stride = s, .padding = p}, 5};
    auto r = nn::local();
    const auto x = dist::test::random_tensor<double>(shape::nchw(2, 3, 7, 6), 1);
    auto y = conv.forward(r, x);
    auto ref = reference_conv2d(x, conv.weight().value, s, p);
    BOOST_TEST_REQUIRE((y.shape() == ref.shape()));
    BOOST_TEST(max_abs_diff(y, ref) < 1e-12, "stride " << s << " padding " << p);
  }
}

BOOST_AUTO_TEST_CASE(reflection_padding_matches_its_definition) {
  // A 1x1 identity convolution with reflection padding 2 returns the padded image (PyTorch's
  // ReflectionPad2d(2) of [[1,2,3],[4,5,6],[7,8,9]]).
  nn::conv2d<double> pad{{.in_channels = 1,
                          .out_channels = 1,
                          .kernel = 1,
                          .stride = 1,
                          .padding = 2,
                          .pad_mode = nn::padding_mode::reflect,
                          .bias = false},
                         0};
  pad.weight().value[0] = 1.0;
  auto r = nn::local();
  const tensor<double> x{shape::nchw(1, 1, 3, 3), {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  const auto y = pad.forward(r, x);
  const std::vector<double> expected{9, 8, 7, 8, 9, 8, 7,  //
                                     6, 5, 4, 5, 6, 5, 4,  //
                                     3, 2, 1, 2, 3, 2, 1,  //
                                     6, 5, 4, 5, 6, 5, 4,  //
                                     9, 8, 7, 8, 9, 8, 7,  //
                                     6, 5, 4, 5, 6, 5, 4,  //
                                     3, 2, 1, 2, 3, 2, 1};
  BOOST_TEST_REQUIRE((y.shape() == shape::nchw(1, 1, 7, 7)));
  BOOST_TEST(std::vector<double>(y.begin(), y.end()) == expected, boost::test_tools::per_element());
  // Padding as large as the plane has no reflection.
  BOOST_CHECK_THROW(pad.forward(r, tensor<double>{shape::nchw(1, 1, 2, 2)}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(reflection_padding_gradient_is_its_adjoint_added_in_a_fixed_order) {
  // The backward kernel against the definition: each padded position's gradient added onto the
  // source position it copied, rows in order and positions in order within a row (one reflect() per
  // element), bit for bit; the kernel splits each row into its borders and a vectorised interior.
  namespace kernels = nn::detail::kernels;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const auto& [h, w, p] :
       {std::tuple{3, 3, 1}, std::tuple{4, 7, 3}, std::tuple{9, 5, 2}, std::tuple{16, 33, 3}, std::tuple{2, 9, 1}}) {
    const std::int64_t planes = 3, ph = h + 2 * p, pw = w + 2 * p;
    std::vector<float> dy(static_cast<std::size_t>(planes * ph * pw));
    for (float& v : dy) v = d(gen);
    std::vector<float> got(static_cast<std::size_t>(planes * h * w), 7.0f), want(got.size(), 0.0f);
    dist::engine<dist::cpu> e{{.threads = 2}};
    e.for_each(planes, kernels::reflect_pad_backward_plane<float>{dy.data(), got.data(), h, w, p});
    for (std::int64_t s = 0; s < planes; ++s)
      for (std::int64_t i = 0; i < ph; ++i)
        for (std::int64_t j = 0; j < pw; ++j)
          want[static_cast<std::size_t>((s * h + kernels::reflect(i - p, h)) * w + kernels::reflect(j - p, w))] +=
              dy[static_cast<std::size_t>((s * ph + i) * pw + j)];
    BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0, h << "x" << w << " pad " << p);
  }
}

BOOST_AUTO_TEST_CASE(output_shapes_follow_the_formulas) {
  // conv2d: Ho = floor((H + 2p - k) / s) + 1.
  nn::conv2d<float> c7{{.in_channels = 3,
                        .out_channels = 64,
                        .kernel = 7,
                        .stride = 1,
                        .padding = 3,
                        .pad_mode = nn::padding_mode::reflect},
                       0};
  BOOST_TEST((c7.output_shape(shape::nchw(1, 3, 256, 256)) == shape::nchw(1, 64, 256, 256)));
  nn::conv2d<float> d128{{.in_channels = 64, .out_channels = 128, .kernel = 3, .stride = 2, .padding = 1}, 0};
  BOOST_TEST((d128.output_shape(shape::nchw(1, 64, 256, 256)) == shape::nchw(1, 128, 128, 128)));
  nn::conv2d<float> c4{{.in_channels = 1, .out_channels = 8, .kernel = 4, .stride = 2, .padding = 1}, 0};
  BOOST_TEST((c4.output_shape(shape::nchw(2, 1, 28, 28)) == shape::nchw(2, 8, 14, 14)));
  // conv_transpose2d: Ho = (H - 1) s - 2p + k + output_padding.
  struct row {
    std::int64_t h, k, s, p, op, expected;
  };
  for (const row t : {row{64, 3, 2, 1, 1, 128}, row{7, 3, 2, 1, 1, 14}, row{7, 4, 2, 1, 0, 14}, row{5, 3, 1, 1, 0, 5},
                      row{3, 2, 2, 0, 0, 6}, row{4, 3, 3, 0, 2, 14}}) {
    nn::conv_transpose2d<float> u{
        {.in_channels = 2, .out_channels = 3, .kernel = t.k, .stride = t.s, .padding = t.p, .output_padding = t.op}, 0};
    BOOST_TEST((u.output_shape(shape::nchw(1, 2, t.h, t.h)) == shape::nchw(1, 3, t.expected, t.expected)),
               "H " << t.h << " k " << t.k << " s " << t.s << " p " << t.p << " op " << t.op);
  }
  BOOST_CHECK_THROW((nn::conv_transpose2d<float>{{.stride = 2, .output_padding = 2}, 0}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(conv_transpose2d_matches_its_definition) {
  struct row {
    std::int64_t k, s, p, op;
  };
  for (const row t : {row{3, 2, 1, 1}, row{4, 2, 1, 0}, row{3, 1, 1, 0}, row{2, 2, 0, 0}}) {
    nn::conv_transpose2d<double> u{{.in_channels = 3,
                                    .out_channels = 2,
                                    .kernel = t.k,
                                    .stride = t.s,
                                    .padding = t.p,
                                    .output_padding = t.op,
                                    .bias = false},
                                   3};
    auto r = nn::local();
    const auto x = dist::test::random_tensor<double>(shape::nchw(2, 3, 5, 4), 2);
    const auto y = u.forward(r, x);
    const auto ref = reference_conv_transpose2d(x, u.weight().value, t.s, t.p, t.op);
    BOOST_TEST_REQUIRE((y.shape() == ref.shape()));
    BOOST_TEST(max_abs_diff(y, ref) < 1e-12, "k " << t.k << " s " << t.s);
  }
}

BOOST_AUTO_TEST_CASE(convolutions_backward) {
  using dist::test::check_gradients;
  using dist::test::random_tensor;
  const auto x = random_tensor<double>(shape::nchw(2, 3, 6, 5), 11);
  nn::conv2d<double> zero_pad{{.in_channels = 3, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1}, 1};
  check_gradients(zero_pad, x, "conv2d zero padding, stride 2, bias");
  nn::conv2d<double> reflect{{.in_channels = 3,
                              .out_channels = 2,
                              .kernel = 3,
                              .stride = 1,
                              .padding = 2,
                              .pad_mode = nn::padding_mode::reflect},
                             2};
  check_gradients(reflect, x, "conv2d reflection padding 2");
  nn::conv2d<double> no_bias{
      {.in_channels = 3, .out_channels = 2, .kernel = 4, .stride = 2, .padding = 1, .bias = false}, 3};
  check_gradients(no_bias, x, "conv2d 4x4 stride 2 without bias");
  nn::conv_transpose2d<double> up{
      {.in_channels = 3, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1}, 4};
  check_gradients(up, x, "conv_transpose2d stride 2 output_padding 1");
  nn::conv_transpose2d<double> up4{
      {.in_channels = 3, .out_channels = 2, .kernel = 4, .stride = 2, .padding = 1, .output_padding = 0, .bias = false},
      5};
  check_gradients(up4, x, "conv_transpose2d 4x4");
}

BOOST_AUTO_TEST_CASE(normalisations_backward) {
  using dist::test::check_gradients;
  const auto x = dist::test::random_tensor<double>(shape::nchw(3, 2, 4, 3), 12, -2.0, 3.0);
  nn::instance_norm<double> in_plain{{.channels = 2}, 1};
  check_gradients(in_plain, x, "instance_norm");
  nn::instance_norm<double> in_affine{{.channels = 2, .affine = true}, 2};
  check_gradients(in_affine, x, "instance_norm affine");
  nn::batch_norm<double> bn{{.channels = 2}, 3};
  check_gradients(bn, x, "batch_norm training");
  nn::sync_batch_norm<double> sbn{{.channels = 2}, 4};
  check_gradients(sbn, x, "sync_batch_norm training (one replica)");
  nn::batch_norm<double> bn_eval{{.channels = 2}, 5};
  auto r = nn::local();
  for (int i = 0; i < 3; ++i) bn_eval.forward(r, dist::test::random_tensor<double>(x.shape(), 20 + i));
  bn_eval.set_training(false);
  check_gradients(bn_eval, x, "batch_norm eval");
}

BOOST_AUTO_TEST_CASE(activations_and_blocks_backward) {
  using dist::test::check_gradients;
  const auto x = dist::test::random_tensor<double>(shape::nchw(2, 3, 4, 4), 13);
  nn::relu<double> relu;
  check_gradients(relu, x, "relu");
  nn::leaky_relu<double> leaky{0.2};
  check_gradients(leaky, x, "leaky_relu");
  nn::tanh<double> tanh;
  check_gradients(tanh, x, "tanh");
  nn::residual_block<double> block{3, 7};
  check_gradients(block, x, "residual_block");
  nn::sequential net{
      nn::conv2d<double>{{.in_channels = 3, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1}, 1},
      nn::batch_norm<double>{{.channels = 4}, 2},
      nn::leaky_relu<double>{0.2},
      nn::conv_transpose2d<double>{
          {.in_channels = 4, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1}, 3},
      nn::instance_norm<double>{{.channels = 2, .affine = true}, 4},
      nn::tanh<double>{}};
  check_gradients(net, x, "sequential");
}

BOOST_AUTO_TEST_CASE(initialisation_is_seeded_normal) {
  nn::conv2d<float> a{{.in_channels = 64, .out_channels = 64, .kernel = 3}, 42},
      b{{.in_channels = 64, .out_channels = 64, .kernel = 3}, 42},
      c{{.in_channels = 64, .out_channels = 64, .kernel = 3}, 43};
  BOOST_TEST(a.weight().value == b.weight().value);
  BOOST_TEST(!(a.weight().value == c.weight().value));
  double s = 0, s2 = 0;
  const auto& w = a.weight().value;
  for (float v : w) {
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(w.size()), mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  BOOST_TEST(std::abs(mean) < 0.001);  // 36864 draws: the mean's sd is 0.0001
  BOOST_TEST(std::abs(sd - 0.02) < 0.0005);
  for (float v : a.bias().value) BOOST_TEST(v == 0.0f);
}

BOOST_AUTO_TEST_CASE(misuse_is_reported) {
  auto r = nn::local();
  nn::conv2d<float> conv{{.in_channels = 3, .out_channels = 4}, 1};
  BOOST_CHECK_THROW(conv.backward(r, tensor<float>{shape::nchw(1, 4, 3, 3)}), std::logic_error);
  BOOST_CHECK_THROW(conv.forward(r, tensor<float>{shape::nchw(1, 2, 5, 5)}), std::invalid_argument);
  conv.forward(r, tensor<float>{shape::nchw(1, 3, 5, 5)});
  BOOST_CHECK_THROW(conv.backward(r, tensor<float>{shape::nchw(1, 4, 5, 5)}), std::invalid_argument);
  nn::batch_norm<float> bn{{.channels = 2}, 1};
  BOOST_CHECK_THROW(bn.forward(r, tensor<float>{shape::nchw(0, 2, 3, 3)}), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(losses)

BOOST_AUTO_TEST_CASE(compute_average_loss_divides_by_the_global_batch) {
  const std::vector<float> per_example{1.0f, 2.0f, 3.0f};
  BOOST_TEST(nn::compute_average_loss(per_example, 3) == 2.0f);
  BOOST_TEST(nn::compute_average_loss(per_example, 12) == 0.5f);  // this replica's share of the mean
  BOOST_TEST(nn::compute_average_loss(std::vector<float>{}, 12) == 0.0f);
  BOOST_CHECK_THROW(nn::compute_average_loss(per_example, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(mse_and_l1_values_and_gradients) {
  const tensor<double> pred{shape{2, 3}, {1, 2, 3, 0, 0, 0}}, target{shape{2, 3}, {1, 0, 0, 1, -1, 2}};
  // Per example: mse (0 + 4 + 9)/3 and (1 + 1 + 4)/3; over a global batch of 4.
  const auto m = nn::mse(pred, target, 4);
  BOOST_TEST(m.value == (13.0 / 3 + 6.0 / 3) / 4, boost::test_tools::tolerance(1e-14));
  BOOST_TEST(m.grad[1] == 2 * 2.0 / (3 * 4), boost::test_tools::tolerance(1e-14));
  const auto l = nn::l1(pred, target, 2);
  BOOST_TEST(l.value == (5.0 / 3 + 4.0 / 3) / 2, boost::test_tools::tolerance(1e-14));
  BOOST_TEST(l.grad[3] == -1.0 / 6, boost::test_tools::tolerance(1e-14));
  BOOST_TEST(l.grad[0] == 0.0);
  // Gradients against central differences of the value.
  for (int which = 0; which < 2; ++which) {
    auto p = dist::test::random_tensor<double>(shape::nchw(3, 2, 2, 2), 5);
    const auto t = dist::test::random_tensor<double>(p.shape(), 6);
    auto loss = [&] { return which == 0 ? nn::mse(p, t, 5) : nn::l1(p, t, 5); };
    const auto analytic = loss().grad;
    std::vector<double> numeric(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double keep = p[i];
      p[i] = keep + 1e-6;
      const double up = loss().value;
      p[i] = keep - 1e-6;
      const double down = loss().value;
      p[i] = keep;
      numeric[i] = (up - down) / 2e-6;
    }
    BOOST_TEST(dist::test::relative_error(numeric, analytic.values()) < 1e-6, (which == 0 ? "mse" : "l1"));
  }
  BOOST_CHECK_THROW(nn::mse(pred, tensor<double>{shape{3, 2}}, 2), std::invalid_argument);
}

// With the value left on the device (`nn::value_on_device`, for CUDA graphs): the value the host form
// returns, bit for bit, and the same gradient, on the serial engine and on a CPU engine of 2 threads;
// an empty batch gives 0; bad operands fail as in the host form.
BOOST_AUTO_TEST_CASE(values_left_on_the_device_have_the_host_values_bits) {
  struct serial_replica {
    dist::serial_engine e;
    dist::serial_engine& engine() { return e; }
  } serial;
  struct cpu_replica {
    dist::engine<dist::cpu> e{{.threads = 2}};
    dist::engine<dist::cpu>& engine() { return e; }
  } threaded;
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  auto same_values = [](const tensor<float>& a, const tensor<float>& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  auto check = [&](auto& r, const char* engine_name) {
    for (const shape s : {shape::nchw(5, 3, 4, 4), shape{7, 3}, shape{1, 1}}) {
      const auto p = dist::test::random_tensor<float>(s, 31, -3.0, 3.0);
      const auto t = dist::test::random_tensor<float>(s, 32, 0.0, 1.0);
      for (const std::int64_t batch : {s[0], 3 * s[0] + 1}) {
        const auto m = nn::mse(r, p, t, batch), l = nn::l1(r, p, t, batch), b = nn::bce_with_logits(r, p, t, batch);
        const auto md = nn::mse(r, p, t, batch, nn::value_on_device), ld = nn::l1(r, p, t, batch, nn::value_on_device),
                   bd = nn::bce_with_logits(r, p, t, batch, nn::value_on_device);
        BOOST_TEST(md.value.shape() == shape{1});
        BOOST_TEST(same(md.host_value(), m.value), engine_name << " mse " << s.to_string() << " batch " << batch);
        BOOST_TEST(same(ld.host_value(), l.value), engine_name << " l1 " << s.to_string() << " batch " << batch);
        BOOST_TEST(same(bd.host_value(), b.value), engine_name << " bce " << s.to_string() << " batch " << batch);
        BOOST_TEST(same_values(md.grad, m.grad));
        BOOST_TEST(same_values(ld.grad, l.grad));
        BOOST_TEST(same_values(bd.grad, b.grad));
      }
    }
    const auto empty = nn::mse(r, tensor<float>{shape{0, 3}}, tensor<float>{shape{0, 3}}, 4, nn::value_on_device);
    BOOST_TEST(empty.host_value() == 0.0f);
    BOOST_CHECK_THROW(nn::l1(r, tensor<float>{shape{2, 3}}, tensor<float>{shape{3, 2}}, 2, nn::value_on_device),
                      std::invalid_argument);
    BOOST_CHECK_THROW(nn::mse(r, tensor<float>{shape{2, 3}}, tensor<float>{shape{2, 3}}, 0, nn::value_on_device),
                      std::invalid_argument);
  };
  check(serial, "serial engine");
  check(threaded, "engine<cpu>");
}

// A loss between tensors of different shapes is refused with both shapes, in every form: on the
// calling thread, with a replica, with the value left on the device; for other spatial sizes, and
// for the same element count in another shape (which the arithmetic alone would not notice).
BOOST_AUTO_TEST_CASE(a_loss_of_tensors_of_different_shapes_names_both) {
  using dist::test::error_of;
  using dist::test::mentions;
  struct serial_replica {
    dist::serial_engine e;
    dist::serial_engine& engine() { return e; }
  } r;
  const tensor<float> pred{shape::nchw(2, 3, 8, 8)};
  for (const shape other : {shape::nchw(2, 3, 4, 4), shape{2, 192}}) {
    const tensor<float> target{other};
    const std::string both = "of a prediction (2, 3, 8, 8) and a target " + other.to_string();
    const std::vector<std::pair<std::string, std::function<void()>>> calls{
        {"mse", [&] { nn::mse(pred, target, 2); }},
        {"mse", [&] { nn::mse(r, pred, target, 2); }},
        {"mse", [&] { nn::mse(r, pred, target, 2, nn::value_on_device); }},
        {"l1", [&] { nn::l1(pred, target, 2); }},
        {"l1", [&] { nn::l1(r, pred, target, 2); }},
        {"l1", [&] { nn::l1(r, pred, target, 2, nn::value_on_device); }},
        {"bce_with_logits", [&] { nn::bce_with_logits(pred, target, 2); }},
        {"bce_with_logits", [&] { nn::bce_with_logits(r, pred, target, 2); }},
        {"bce_with_logits", [&] { nn::bce_with_logits(r, pred, target, 2, nn::value_on_device); }}};
    for (const auto& [name, call] : calls) {
      const std::string what = error_of(call);
      BOOST_TEST(mentions(what, "distribute: " + name + " " + both), what);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
