// nn::export_onnx without a Python: the graph's operators and weights are in the file, a layer with
// no ONNX form and an input shape a layer refuses are errors naming the layer and its place.
// (onnx.checker and onnxruntime read the files in python_test.cpp.)

#include "interop_test_support.hpp"

#include <distribute/nn/onnx.hpp>

#include "models.hpp"

#include <boost/test/unit_test.hpp>

#include <string>

namespace dist = distribute;
namespace nn = distribute::nn;
using namespace distribute::test;

BOOST_AUTO_TEST_SUITE(onnx)

BOOST_AUTO_TEST_CASE(the_generator_graph_has_its_operators_and_weights) {
  auto g = cyclegan::make_generator<dist::cpu>({.channels = 1, .filters = 16, .blocks = 3}, 5);
  const std::string bytes = nn::onnx_bytes(g, dist::shape::nchw(1, 1, 28, 28));
  for (const char* op : {"Pad", "reflect", "Conv", "InstanceNormalization", "Relu", "ConvTranspose", "Add", "Tanh",
                         "Identity", "output", "input"})
    BOOST_TEST(bytes.find(op) != std::string::npos, op);
  // Every weight, named by its place in the model.
  BOOST_TEST(bytes.find("0.weight") != std::string::npos);
  BOOST_TEST(bytes.find("9.block2.body.3.weight") != std::string::npos);
  std::size_t weights = 0;
  g.for_each_parameter([&](auto v, auto) { weights += v.size_bytes(); });
  BOOST_TEST(bytes.size() > weights);
  BOOST_TEST(bytes.size() < weights + 64 * 1024);
}

struct custom_layer {
  using scalar_type = float;
  template <class F>
  void for_each_parameter(F&&) {}
};

BOOST_AUTO_TEST_CASE(a_layer_without_an_onnx_form_is_named) {
  auto m = nn::sequential{nn::relu<float>{}, nn::sequential{nn::relu<float>{}, custom_layer{}}};
  try {
    (void)nn::onnx_bytes(m, dist::shape::nchw(1, 1, 4, 4));
    BOOST_FAIL("a layer without an ONNX form was exported");
  } catch (const nn::interop_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("layer custom_layer at '1.1' has no ONNX form") != std::string::npos, what);
  }
}

BOOST_AUTO_TEST_CASE(an_input_a_layer_refuses_is_named) {
  auto m = small_model<float>(1);
  try {
    (void)nn::onnx_bytes(m, dist::shape::nchw(1, 3, 8, 8));
    BOOST_FAIL("an input of the wrong channel count was exported");
  } catch (const nn::interop_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("layer conv2d at '0'") != std::string::npos, what);
  }
}

BOOST_AUTO_TEST_CASE(the_file_is_written_whole) {
  temp_dir dir;
  auto m = small_model<float>(1);
  nn::export_onnx(m, dist::shape::nchw(2, 2, 8, 8), dir.path / "m.onnx");
  BOOST_TEST(fs::file_size(dir.path / "m.onnx") == nn::onnx_bytes(m, dist::shape::nchw(2, 2, 8, 8)).size());
}

BOOST_AUTO_TEST_SUITE_END()
