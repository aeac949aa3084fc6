// Every layer option error names the layer with its options, the option, its value (marked when it
// is the default) and the rule; an error inside a sequential names the layer's index and type.

#include <distribute/nn.hpp>

#include <boost/test/unit_test.hpp>

#include <stdexcept>
#include <string>

namespace dist = distribute;
namespace nn = distribute::nn;

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

BOOST_AUTO_TEST_SUITE(option_errors)

BOOST_AUTO_TEST_CASE(an_option_that_breaks_a_rule_of_another_names_both) {
  // output_padding given, stride left at its default (1, PyTorch's).
  const auto msg = error_of([] {
    nn::conv_transpose2d<float>({.in_channels = 16, .out_channels = 32, .kernel = 7, .output_padding = 1}, 1);
  });
  BOOST_TEST(msg ==
             "distribute: conv_transpose2d {in_channels 16, out_channels 32, kernel 7, stride 1, padding 0, "
             "output_padding 1}: output_padding is 1 but must be below stride (1)");
}

BOOST_AUTO_TEST_CASE(a_defaulted_option_that_breaks_a_rule_says_it_is_the_default) {
  // No layer's defaults break its rules today, so the check itself: a value equal to the option's
  // default is marked, one the program wrote is not.
  const nn::detail::option_check c{"conv_transpose2d", "{stride 1, output_padding 1}"};
  BOOST_TEST(error_of([&] { c.below("output_padding", 1, 1, "stride", 1); }) ==
             "distribute: conv_transpose2d {stride 1, output_padding 1}: output_padding is 1 (the default) but must "
             "be below stride (1)");
  BOOST_TEST(error_of([&] { c.below("output_padding", 1, 0, "stride", 1); }) ==
             "distribute: conv_transpose2d {stride 1, output_padding 1}: output_padding is 1 but must be below stride "
             "(1)");
}

BOOST_AUTO_TEST_CASE(each_option_is_named_with_its_value) {
  BOOST_TEST(error_of([] {
               nn::conv2d<float>({.in_channels = 0}, 1);
             }).find("in_channels is 0 but must be at least 1") != std::string::npos);
  BOOST_TEST(error_of([] {
               nn::conv2d<float>({.in_channels = 1, .stride = 0}, 1);
             }).find("stride is 0 but must be at least 1") != std::string::npos);
  BOOST_TEST(error_of([] { nn::conv2d<float>({.padding = -2}, 1); }).find("padding is -2 but must be at least 0") !=
             std::string::npos);
  BOOST_TEST(error_of([] { nn::conv_transpose2d<float>({.kernel = 0}, 1); }).find("conv_transpose2d {") !=
             std::string::npos);
  BOOST_TEST(error_of([] { nn::instance_norm<float>({.channels = -1, .affine = true}, 1); }) ==
             "distribute: instance_norm {channels -1, eps 1e-05, affine}: channels is -1 but must be at least 1");
  BOOST_TEST(error_of([] {
               nn::instance_norm<float>({.channels = 2, .eps = 0}, 1);
             }).find("eps is 0 but must be positive") != std::string::npos);
  BOOST_TEST(error_of([] { nn::batch_norm<float>({.channels = 2, .momentum = 2}, 1); }) ==
             "distribute: batch_norm {channels 2, eps 1e-05, momentum 2}: momentum is 2 but must be in [0, 1]");
}

BOOST_AUTO_TEST_CASE(an_error_inside_a_sequential_names_the_layer) {
  auto net = nn::sequential{nn::conv2d<float>({.in_channels = 3, .out_channels = 4}, 1), nn::relu<float>{},
                            nn::conv2d<float>({.in_channels = 5, .out_channels = 1}, 2)};
  auto r = nn::local();
  const auto msg = error_of([&] { net.forward(r, dist::tensor<float>{dist::shape::nchw(1, 3, 8, 8)}); });
  BOOST_TEST(msg ==
             "distribute: layer 2 (conv2d) of a sequential of 3: conv2d {in_channels 5, out_channels 1, kernel 3, "
             "stride 1, padding 0} got a tensor of shape (1, 4, 6, 6)");
  // Nested: the outer index first.
  auto outer =
      nn::sequential{nn::relu<float>{}, nn::sequential{nn::conv2d<float>({.in_channels = 2, .out_channels = 2}, 3)}};
  const auto nested = error_of([&] { outer.forward(r, dist::tensor<float>{dist::shape::nchw(1, 3, 8, 8)}); });
  BOOST_TEST(
      nested.find(
          "distribute: layer 1 (sequential) of a sequential of 2: layer 0 (conv2d) of a sequential of 1: conv2d") == 0,
      nested);
  // Backward too.
  auto one = nn::sequential{nn::relu<float>{}, nn::conv2d<float>({.in_channels = 3, .out_channels = 1}, 4)};
  one.forward(r, dist::tensor<float>{dist::shape::nchw(1, 3, 8, 8)});
  const auto back = error_of([&] { one.backward(r, dist::tensor<float>{dist::shape::nchw(1, 1, 3, 3)}); });
  BOOST_TEST(back.find("distribute: layer 1 (conv2d) of a sequential of 2: conv2d") == 0, back);
}

BOOST_AUTO_TEST_SUITE_END()
