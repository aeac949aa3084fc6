// Fusion in nn::sequential: a norm followed by a ReLU runs as one layer, and plus_input's residual
// add is done in the last norm's output pass. Held to the same layers run one by one (the same bits,
// forward and backward), to finite differences, and to the passes the engine is asked for (so a
// change that silently stops fusing fails here, not only in a benchmark).

#include "nn_test_support.hpp"

#include <distribute/engine/pass_observer.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;
using dist::test::error_of;
using dist::test::gradients_of;
using dist::test::mentions;
using dist::test::random_tensor;

namespace {

template <class T>
std::vector<T> values(const tensor<T>& t) {
  return {t.data(), t.data() + t.size()};
}
// Bit for bit, so that -0 and 0 differ and a NaN is never equal to anything.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
// An affine norm with a spread of betas, so the ReLU's mask depends on gamma and beta, not on xhat's sign.
template <class T>
nn::instance_norm<T> affine_norm(std::int64_t channels, std::uint64_t seed) {
  nn::instance_norm<T> in{{.channels = channels, .affine = true}, seed};
  int k = 0;
  in.for_each_parameter([&](std::span<T> v, std::span<T>) {
    if (k++ == 1)
      for (std::size_t c = 0; c < v.size(); ++c) v[c] = static_cast<T>(0.3 * (static_cast<double>(c) - 1.0));
  });
  return in;
}

// The names of the passes an engine runs while it lives, with their counts.
class pass_names : public dist::pass_observer {
 public:
  void on_pass(const dist::pass_record& p) override { ++count[std::string(p.functor_name)]; }
  int containing(const std::string& part) const {
    int n = 0;
    for (const auto& [name, k] : count)
      if (name.find(part) != std::string::npos) n += k;
    return n;
  }
  std::map<std::string, int> count;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(fusion)

BOOST_AUTO_TEST_CASE(a_norm_and_relu_in_a_sequential_give_the_bits_of_the_two_layers_one_by_one) {
  auto r = nn::local();
  for (const bool affine : {false, true}) {
    BOOST_TEST_CONTEXT((affine ? "affine" : "plain")) {
      const auto x = random_tensor<float>(shape::nchw(2, 3, 5, 4), 31, -2.0, 2.0);
      const auto dy = random_tensor<float>(x.shape(), 32);
      auto make = [&] { return affine ? affine_norm<float>(3, 5) : nn::instance_norm<float>{{.channels = 3}, 5}; };

      nn::sequential fused{make(), nn::relu<float>{}};
      const auto y = fused.forward(r, x);
      const auto dx = fused.backward(r, dy);

      auto in = make();
      nn::relu<float> relu;
      const auto y_ref = relu.forward(r, in.forward(r, x));
      const auto dx_ref = in.backward(r, relu.backward(r, dy));

      BOOST_TEST(same_bits(values(y), values(y_ref)));
      BOOST_TEST(same_bits(values(dx), values(dx_ref)));
      BOOST_TEST(same_bits(gradients_of<float>(fused), gradients_of<float>(in)));
      // The ReLU did cut: some outputs are 0, and so are their gradients' contributions.
      int zeros = 0;
      for (float v : values(y)) zeros += v == 0.0f;
      BOOST_TEST(zeros > 0);
      BOOST_TEST(zeros < static_cast<int>(y.size()));
    }
  }
}

BOOST_AUTO_TEST_CASE(plus_input_gives_the_bits_of_the_body_then_the_add) {
  auto r = nn::local();
  const auto x = random_tensor<float>(shape::nchw(2, 4, 6, 5), 41);
  const auto dy = random_tensor<float>(x.shape(), 42);
  nn::residual_block<float> block{4, 9};
  nn::residual_block<float> twin{4, 9};
  auto& body = twin.body();

  const auto y = block.forward(r, x);
  const auto dx = block.backward(r, dy);
  // The twin's body, its layers one by one (no fusion), then the adds.
  auto h = body.get<1>().forward(r, body.get<0>().forward(r, x));
  h = body.get<4>().forward(r, body.get<3>().forward(r, body.get<2>().forward(r, h)));
  std::vector<float> y_ref = values(h);
  for (std::size_t i = 0; i < y_ref.size(); ++i) y_ref[i] += x.data()[i];
  auto g = body.get<2>().backward(r, body.get<3>().backward(r, body.get<4>().backward(r, dy)));
  g = body.get<0>().backward(r, body.get<1>().backward(r, g));
  std::vector<float> dx_ref = values(g);
  for (std::size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] += dy.data()[i];

  BOOST_TEST(same_bits(values(y), y_ref));
  BOOST_TEST(same_bits(values(dx), dx_ref));
  BOOST_TEST(same_bits(gradients_of<float>(block), gradients_of<float>(twin)));

  // The same with the caller's states, and with a body whose last layer cannot take the add.
  nn::residual_block<float> held{4, 9};
  typename nn::residual_block<float>::state_type s;
  BOOST_TEST(same_bits(values(held.forward(r, x, s)), y_ref));
  BOOST_TEST(same_bits(values(held.backward(r, s, dy)), dx_ref));
  nn::sequential tail{nn::conv2d<float>{{.in_channels = 4, .out_channels = 4, .kernel = 3, .padding = 1}, 3},
                      nn::relu<float>{}};
  nn::sequential tail_twin{nn::conv2d<float>{{.in_channels = 4, .out_channels = 4, .kernel = 3, .padding = 1}, 3},
                           nn::relu<float>{}};
  std::vector<float> t_ref = values(tail_twin.forward(r, x));
  for (std::size_t i = 0; i < t_ref.size(); ++i) t_ref[i] += x.data()[i];
  BOOST_TEST(same_bits(values(tail.forward(r, x, nn::plus_input)), t_ref));
}

BOOST_AUTO_TEST_CASE(fused_layers_match_finite_differences) {
  using dist::test::check_gradients;
  const auto x = random_tensor<double>(shape::nchw(2, 3, 4, 4), 51, -2.0, 2.0);
  nn::sequential plain{nn::instance_norm<double>{{.channels = 3}, 1}, nn::relu<double>{}};
  check_gradients(plain, x, "instance_norm + relu");
  nn::sequential affine{affine_norm<double>(3, 2), nn::relu<double>{}};
  check_gradients(affine, x, "affine instance_norm + relu");
  // Fused in the middle of a longer chain, and a norm that ends it (nothing to fuse).
  nn::sequential chain{nn::conv2d<double>{{.in_channels = 3, .out_channels = 2, .kernel = 3, .padding = 1}, 3},
                       nn::instance_norm<double>{{.channels = 2}, 4}, nn::relu<double>{},
                       nn::conv2d<double>{{.in_channels = 2, .out_channels = 3, .kernel = 3, .padding = 1}, 5},
                       nn::instance_norm<double>{{.channels = 3}, 6}};
  check_gradients(chain, x, "conv, norm + relu, conv, norm");
}

BOOST_AUTO_TEST_CASE(a_residual_block_runs_no_pass_of_its_own_for_the_relu_or_the_forward_add) {
  auto r = nn::local();
  const auto x = random_tensor<float>(shape::nchw(1, 4, 8, 8), 61);
  nn::residual_block<float> block{4, 3};
  pass_names forward, backward;
  {
    const dist::observe_passes watch{forward};
    (void)block.forward(r, x);
  }
  {
    const dist::observe_passes watch{backward};
    (void)block.backward(r, x);
  }
  BOOST_TEST(forward.containing("relu_forward") == 0);
  BOOST_TEST(forward.containing("add_to") == 0);
  BOOST_TEST(forward.containing("plane_norm_output") == 2);
  BOOST_TEST(backward.containing("relu_backward") == 0);
  BOOST_TEST(backward.containing("plane_norm_input_gradient") == 2);
  BOOST_TEST(backward.containing("add_to") == 1);  // dx = body's dx + dy
}

BOOST_AUTO_TEST_CASE(plus_input_on_a_body_that_changes_the_shape_names_both_shapes) {
  auto r = nn::local();
  const auto x = random_tensor<float>(shape::nchw(1, 2, 8, 8), 71);
  nn::sequential down{
      nn::conv2d<float>{{.in_channels = 2, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1}, 1}};
  const std::string e = error_of([&] { (void)down.forward(r, x, nn::plus_input); });
  BOOST_TEST(mentions(e, "plus_input"));
  BOOST_TEST(mentions(e, "(1, 2, 4, 4)"));
  BOOST_TEST(mentions(e, "(1, 2, 8, 8)"));
  nn::sequential norm_last{
      nn::conv2d<float>{{.in_channels = 2, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1}, 1},
      nn::instance_norm<float>{{.channels = 2}, 2}};
  const std::string e2 = error_of([&] { (void)norm_last.forward(r, x, nn::plus_input); });
  BOOST_TEST(mentions(e2, "residual"));
  BOOST_TEST(mentions(e2, "(1, 2, 4, 4)"));
}

BOOST_AUTO_TEST_SUITE_END()
