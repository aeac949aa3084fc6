// nn::check_gradients: it passes correct layers, sequentials and models written for a tape, and names
// the tensor, the worst element and both values where a backward is wrong; it refuses an all-zero
// gradient (a backward that forgot to add it) and a gradient overwritten instead of accumulated.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;
using dist::test::error_of;
using dist::test::mentions;
using dist::test::random_tensor;

namespace {

// What a hand-written backward can get wrong.
enum class fault { none, input_gradient, parameter_gradient, forgets_parameter_gradient, overwrites_gradient };

// y = a x + b element by element, with one-value parameters a and b, and a backward with a chosen fault.
struct affine_layer {
  using scalar_type = double;

  explicit affine_layer(fault f = fault::none) : f_{f} {}

  template <class R>
  tensor<double> forward(R&, const tensor<double>& x) {
    x_ = x;
    tensor<double> y{x.shape()};
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = a_[0] * x[i] + b_[0];
    return y;
  }
  template <class R>
  tensor<double> backward(R&, const tensor<double>& dy) {
    tensor<double> dx{dy.shape()};
    double da = 0, db = 0;
    for (std::size_t i = 0; i < dy.size(); ++i) {
      dx[i] = f_ == fault::input_gradient ? dy[i] : a_[0] * dy[i];  // the fault forgets the factor a
      da += dy[i] * x_[i];
      db += dy[i];
    }
    if (f_ == fault::parameter_gradient) da = db;  // dL/da taken as dL/db
    if (f_ != fault::forgets_parameter_gradient) {
      if (f_ == fault::overwrites_gradient) ga_[0] = da;
      else ga_[0] += da;
    }
    gb_[0] += db;
    return dx;
  }
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<double>(a_), std::span<double>(ga_));
    f(std::span<double>(b_), std::span<double>(gb_));
  }
  void zero_grad() { ga_[0] = gb_[0] = 0; }
  void set_training(bool) {}

 private:
  fault f_;
  std::vector<double> a_{1.5}, b_{0.25}, ga_{0.0}, gb_{0.0};
  tensor<double> x_;
};
static_assert(nn::layer<affine_layer>);

// A model written for a tape: a linear layer, tanh, a skip connection around them, and `last`.
template <class Last>
struct skip_model {
  using scalar_type = double;
  nn::linear<double> lin{{.in_features = 4, .out_features = 4}, 7};
  nn::tanh<double> act{};
  Last last{};

  template <class Tape>
  auto operator()(Tape& t, typename Tape::variable x) {
    return t(last, t.add(t(act, t(lin, x)), x));
  }
  template <class F>
  void for_each_parameter(F&& f) {
    lin.for_each_parameter(f);
    last.for_each_parameter(f);
  }
  void zero_grad() {
    lin.zero_grad();
    last.zero_grad();
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(porting_tools)

BOOST_AUTO_TEST_CASE(check_gradients_passes_correct_layers_and_reports_each_gradient) {
  nn::linear<double> lin{{.in_features = 7, .out_features = 4}, 1};
  const auto report = nn::check_gradients(lin, random_tensor<double>(shape{5, 7}, 21));
  BOOST_TEST(report.passed());
  BOOST_TEST(report.name == "linear");              // the type's name where the options give none
  BOOST_TEST_REQUIRE(report.tensors.size() == 3u);  // the input, the weights, the bias
  BOOST_TEST(report.tensors[0].tensor == "input");
  BOOST_TEST(report.tensors[0].shape == "(5, 7)");
  BOOST_TEST(report.tensors[1].tensor == "parameter 0");
  BOOST_TEST(report.tensors[1].shape == "(28 values)");
  BOOST_TEST(report.tensors[2].shape == "(4 values)");
  for (const auto& t : report.tensors) BOOST_TEST(t.relative_error < 1e-6, t.tensor << ": " << t.relative_error);
  // The parameters are left as they were, their gradients zeroed.
  nn::linear<double> fresh{{.in_features = 7, .out_features = 4}, 1};
  BOOST_TEST(dist::test::parameters_of<double>(lin) == dist::test::parameters_of<double>(fresh));
  for (const double g : dist::test::gradients_of<double>(lin)) BOOST_TEST(g == 0.0);

  affine_layer good;
  BOOST_TEST(nn::check_gradients(good, random_tensor<double>(shape::nchw(2, 1, 2, 3), 3)).passed());
  nn::sequential net{nn::conv2d<double>{{.in_channels = 2, .out_channels = 3, .kernel = 3, .padding = 1}, 4},
                     nn::tanh<double>{}, nn::flatten<double>{},
                     nn::linear<double>{{.in_features = 3 * 4 * 4, .out_features = 2}, 5}};
  const auto seq = nn::check_gradients(net, random_tensor<double>(shape::nchw(2, 2, 4, 4), 6), {.name = "classifier"});
  BOOST_TEST(seq.name == "classifier");
  BOOST_TEST(seq.tensors.size() == 5u);
}

BOOST_AUTO_TEST_CASE(check_gradients_names_the_wrong_gradient) {
  const auto x = random_tensor<double>(shape::nchw(2, 1, 2, 3), 3);
  affine_layer wrong_input{fault::input_gradient};
  try {
    nn::check_gradients(wrong_input, x);
    BOOST_ERROR("a wrong input gradient passed");
  } catch (const nn::gradient_check_error& e) {
    const std::string m = e.what();
    BOOST_TEST(m.starts_with("distribute: nn::check_gradients(affine_layer): input (2, 1, 2, 3): relative error"), m);
    // The worst element as (n, c, h, w), with the backward's value and the finite difference: dy
    // where a dy was due, a = 1.5.
    const auto& in = e.report().tensors.at(0);
    BOOST_TEST(mentions(m, "worst element " + in.worst_at + ": analytic "), m);
    BOOST_TEST(in.worst_at.starts_with("("));
    BOOST_TEST(in.numeric == 1.5 * in.analytic, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(in.relative_error > 0.3);
    BOOST_TEST(e.report().tensors.at(1).problem.empty());  // the parameters are right
    BOOST_TEST(!e.report().passed());
  }

  affine_layer wrong_parameter{fault::parameter_gradient};
  const std::string m = error_of([&] { nn::check_gradients(wrong_parameter, x, {.name = "scale and shift"}); });
  BOOST_TEST(m.starts_with("distribute: nn::check_gradients(scale and shift): parameter 0 (1 value): relative error"),
             m);
  BOOST_TEST(mentions(m, "above the tolerance 0.001; worst element 0: analytic"), m);
  // The error is a std::invalid_argument, for programs that catch that.
  BOOST_CHECK_THROW(nn::check_gradients(wrong_parameter, x), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(check_gradients_refuses_an_all_zero_or_overwritten_gradient) {
  const auto x = random_tensor<double>(shape{3, 4}, 8);
  affine_layer forgets{fault::forgets_parameter_gradient};
  const std::string m = error_of([&] { nn::check_gradients(forgets, x); });
  BOOST_TEST(mentions(m, "parameter 0 (1 value): the analytic gradient is zero in every element"), m);
  BOOST_TEST(mentions(m, "backward did not add to it, or the loss does not depend on it at this input"), m);

  affine_layer overwrites{fault::overwrites_gradient};
  const std::string o = error_of([&] { nn::check_gradients(overwrites, x); });
  BOOST_TEST(mentions(o, "parameter 0 (1 value): a second backward without zero_grad left the gradient at 1 times"), o);
  BOOST_TEST(mentions(o, "backward must add to the gradient, not overwrite it"), o);
  // Without the accumulation check the overwriting backward's values are right.
  BOOST_TEST(nn::check_gradients(overwrites, x, {.accumulation = false}).passed());

  // A loss that does not depend on a parameter at this input: refused as well, saying so.
  nn::sequential dead{nn::linear<double>{{.in_features = 4, .out_features = 3}, 9}, nn::relu<double>{}};
  dead.get<0>().for_each_parameter([](std::span<double> v, std::span<double>) {
    for (double& w : v) w = -0.5;  // every output negative for positive inputs: the relu passes no gradient
  });
  const std::string d = error_of([&] { nn::check_gradients(dead, random_tensor<double>(shape{3, 4}, 8, 0.1, 1.0)); });
  BOOST_TEST(mentions(d, "input (3, 4): the analytic gradient is zero in every element (the numeric one has norm 0)"),
             d);
}

BOOST_AUTO_TEST_CASE(check_gradients_runs_a_model_written_for_a_tape) {
  const auto x = random_tensor<double>(shape{3, 4}, 10);
  skip_model<nn::linear<double>> good{.last = nn::linear<double>{{.in_features = 4, .out_features = 2}, 8}};
  const auto report = nn::check_gradients(good, x);
  BOOST_TEST(report.passed());
  BOOST_TEST(report.tensors.size() == 5u);
  for (const auto& t : report.tensors) BOOST_TEST(t.relative_error < 1e-6, t.tensor << ": " << t.relative_error);

  skip_model<affine_layer> wrong{.last = affine_layer{fault::parameter_gradient}};
  const std::string m = error_of([&] { nn::check_gradients(wrong, x, {.name = "skip"}); });
  BOOST_TEST(m.starts_with("distribute: nn::check_gradients(skip): parameter 2 (1 value): relative error"), m);
}

BOOST_AUTO_TEST_CASE(check_gradients_refuses_bad_options) {
  affine_layer l;
  const auto x = random_tensor<double>(shape{2, 2}, 1);
  BOOST_TEST(mentions(error_of([&] { nn::check_gradients(l, x, {.step = 0}); }), "step is 0 but must be positive"));
  BOOST_TEST(mentions(error_of([&] { nn::check_gradients(l, x, {.tolerance = -1}); }),
                      "tolerance is -1 but must be positive"));
  BOOST_TEST(
      mentions(error_of([&] { nn::check_gradients(l, x, {.floor = -1}); }), "floor is -1 but must be at least 0"));
}

BOOST_AUTO_TEST_SUITE_END()
