// Models that name their members once (nn::module): what the library derives from members() (the
// parameters and buffers in member order, zero_grad, set_training, state-dict names, safetensors,
// checkpoints, the digest, ONNX weight names), training under a mirrored strategy against the same
// layers in a sequential, and models nested in models.

#include "nn_test_support.hpp"

#include <distribute/checkpoint.hpp>
#include <distribute/nn/module.hpp>
#include <distribute/nn/onnx.hpp>
#include <distribute/nn/safetensors.hpp>
#include <distribute/nn/state_dict.hpp>
#include <distribute/nn/tape.hpp>

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::shape;
using dist::tensor;
using dist::test::error_of;
using dist::test::mentions;

namespace {

// Two members: a convolution and a batch norm (parameters, buffers and a training mode).
struct conv_norm : nn::module<conv_norm> {
  nn::conv2d<float> conv{{.in_channels = 2, .out_channels = 3, .kernel = 3, .stride = 1, .padding = 1}, 11};
  nn::batch_norm<float> norm{{.channels = 3}, 12};
  auto members() { return nn::members("conv", conv, "norm", norm); }

  template <class R>
  tensor<float> forward(R& r, const tensor<float>& x) {
    return norm.forward(r, conv.forward(r, x));
  }
  template <class R>
  tensor<float> backward(R& r, const tensor<float>& dy) {
    return conv.backward(r, norm.backward(r, dy));
  }
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    return onnx_member(g, norm, onnx_member(g, conv, x));
  }
};
static_assert(nn::parameterized<conv_norm>);
static_assert(dist::gradient_enumerable<conv_norm>);
static_assert(nn::layer<conv_norm>);

// The names of a model's state dict, in order.
struct name_collector {
  std::vector<std::string>* out;
  template <class T, class D>
  void parameter(const std::string& name, nn::parameter<T, D>&) {
    out->push_back(name);
  }
  void buffer(const std::string& name, std::span<double>) { out->push_back(name); }
};
template <class M>
std::vector<std::string> state_names(M& m) {
  std::vector<std::string> names;
  nn::for_each_named_state(m, name_collector{&names});
  return names;
}

template <class M>
std::vector<const float*> parameter_addresses(M& m) {
  std::vector<const float*> out;
  m.for_each_parameter([&](std::span<float> v, std::span<float>) { out.push_back(v.data()); });
  return out;
}

template <class M>
std::vector<float> all_values(M& m) {
  std::vector<float> out;
  m.for_each_parameter([&](std::span<float> v, std::span<float>) { out.insert(out.end(), v.begin(), v.end()); });
  return out;
}

// Moves every parameter a little, so that a copy made from a seed differs.
template <class M>
void perturb(M& m, std::uint32_t seed) {
  m.for_each_parameter([&](std::span<float> v, std::span<float>) {
    const auto d = dist::test::random_tensor<float>(shape{static_cast<std::int64_t>(v.size())}, seed++, -0.1, 0.1);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += d[i];
  });
}

// conv -> sync batch norm, recorded on a tape; the same layers as `make_chain` below.
struct taped_pair : nn::module<taped_pair> {
  nn::conv2d<float> conv{{.in_channels = 1, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1}, 21};
  nn::sync_batch_norm<float> norm{{.channels = 2}, 22};
  auto members() { return nn::members("conv", conv, "norm", norm); }

  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    return t(norm, t(conv, x));
  }
};
auto make_chain() {
  return nn::sequential{
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1}, 21},
      nn::sync_batch_norm<float>{{.channels = 2}, 22}};
}

// Nested: a model of models, a range of them, and a stage that unpacks into a sequential.
struct block : nn::module<block> {
  nn::conv2d<float> conv;
  nn::instance_norm<float> norm;
  explicit block(std::uint64_t seed)
      : conv{{.in_channels = 2, .out_channels = 2, .kernel = 3, .padding = 1}, seed},
        norm{{.channels = 2, .affine = true}, seed + 1} {}
  auto members() { return nn::members("conv", conv, "norm", norm); }
};
struct stage : nn::module<stage> {
  static constexpr bool unpacks_into_sequential = true;  // PyTorch: conv, norm, act in the enclosing Sequential
  nn::conv2d<float> conv{{.in_channels = 2, .out_channels = 2, .kernel = 3, .padding = 1, .bias = false}, 31};
  nn::batch_norm<float> norm{{.channels = 2}, 32};
  nn::leaky_relu<float> act{0.2f};
  auto members() { return nn::members("conv", conv, "norm", norm, "act", act); }
  template <class R>
  tensor<float> forward(R& r, const tensor<float>& x) {
    return act.forward(r, norm.forward(r, conv.forward(r, x)));
  }
  template <class R>
  tensor<float> backward(R& r, const tensor<float>& dy) {
    return conv.backward(r, norm.backward(r, act.backward(r, dy)));
  }
};
struct outer : nn::module<outer> {
  block first{40};
  std::vector<block> blocks{block{50}, block{60}};
  nn::sequential<stage, nn::conv2d<float>> tail{
      stage{}, nn::conv2d<float>{{.in_channels = 2, .out_channels = 1, .kernel = 1}, 70}};
  auto members() { return nn::members("first", first, "blocks", blocks, "tail", tail); }
};

// Members whose names a state dict cannot hold.
struct twice_named : nn::module<twice_named> {
  nn::linear<float> a{{.in_features = 2, .out_features = 2}, 1}, b{{.in_features = 2, .out_features = 2}, 2};
  auto members() { return nn::members("a", a, "a", b); }
};
struct listed_twice : nn::module<listed_twice> {
  nn::linear<float> a{{.in_features = 2, .out_features = 2}, 1};
  auto members() { return nn::members("a", a, "again", a); }
};
struct dotted : nn::module<dotted> {
  nn::linear<float> a{{.in_features = 2, .out_features = 2}, 1};
  auto members() { return nn::members("a.b", a); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(model_members)

BOOST_AUTO_TEST_CASE(two_members_give_the_bookkeeping) {
  conv_norm m;
  // Parameters in member order, the members' own tensors.
  std::vector<const float*> expected{m.conv.weight().value.data(), m.conv.bias().value.data(),
                                     m.norm.gamma().value.data(), m.norm.beta().value.data()};
  BOOST_TEST((parameter_addresses(m) == expected));
  std::vector<const double*> buffers;
  m.for_each_buffer([&](std::span<double> b) { buffers.push_back(b.data()); });
  BOOST_TEST((buffers == std::vector<const double*>{m.norm.running_mean().data(), m.norm.running_var().data()}));

  // zero_grad reaches every member.
  m.for_each_parameter([](std::span<float>, std::span<float> g) { std::fill(g.begin(), g.end(), 1.0f); });
  m.zero_grad();
  m.for_each_parameter([](std::span<float>, std::span<float> g) {
    for (float v : g) BOOST_TEST(v == 0.0f);
  });

  // set_training reaches the norm: in evaluation its running statistics stay; in training they move.
  auto r = nn::local();
  const auto x = dist::test::random_tensor<float>(shape::nchw(4, 2, 5, 5), 3);
  const std::vector<double> mean0 = m.norm.running_mean();
  m.set_training(false);
  m.forward(r, x);
  BOOST_TEST((m.norm.running_mean() == mean0));
  m.set_training(true);
  m.forward(r, x);
  BOOST_TEST((m.norm.running_mean() != mean0));

  // State-dict names: those of a PyTorch module with attributes `conv` and `norm`.
  BOOST_TEST((state_names(m) == std::vector<std::string>{"conv.weight", "conv.bias", "norm.weight", "norm.bias",
                                                         "norm.running_mean", "norm.running_var"}));
  BOOST_TEST(m.member_name(m.norm) == "norm");
  nn::linear<float> stranger{{}, 1};
  BOOST_TEST(mentions(error_of([&] { (void)m.member_name(stranger); }), "not one of its members()"));
}

BOOST_AUTO_TEST_CASE(the_digest_covers_parameters_and_buffers) {
  conv_norm a, b;
  BOOST_TEST(a.state_digest() == b.state_digest());
  BOOST_TEST(a.state_digest() == dist::detail::digest_model(a).state());
  a.conv.weight().value[0] += 1.0f;
  BOOST_TEST(a.state_digest() != b.state_digest());
  BOOST_TEST(nn::parameter_digest(a) != nn::parameter_digest(b));
  a.conv.weight().value[0] = b.conv.weight().value[0];
  BOOST_TEST(a.state_digest() == b.state_digest());
  auto r = nn::local();
  a.forward(r, dist::test::random_tensor<float>(shape::nchw(2, 2, 4, 4), 5));  // moves the running statistics
  BOOST_TEST(nn::parameter_digest(a) == nn::parameter_digest(b));
  BOOST_TEST(a.state_digest() != b.state_digest());
}

BOOST_AUTO_TEST_CASE(files_round_trip_bit_for_bit) {
  conv_norm a, b;
  auto r = nn::local();
  a.forward(r, dist::test::random_tensor<float>(shape::nchw(2, 2, 4, 4), 7));
  perturb(a, 100);
  BOOST_TEST_REQUIRE(a.state_digest() != b.state_digest());
#if DISTRIBUTE_HAS_SAFETENSORS
  const auto bytes = nn::safetensors_bytes(a);
  nn::load_safetensors(b, std::span<const std::byte>(bytes));
  BOOST_TEST(a.state_digest() == b.state_digest());
  BOOST_TEST((nn::safetensors_bytes(b) == bytes));
#else
  BOOST_TEST_MESSAGE("no nlohmann JSON: the safetensors part is left out");
#endif
  conv_norm c;
  dist::checkpoint::archive ar;
  ar.put_model("model", a);
  ar.get_model("model", c);
  BOOST_TEST(a.state_digest() == c.state_digest());

  // ONNX: each member's weights under its state-dict name.
  const std::string onnx = nn::onnx_bytes(a, shape::nchw(1, 2, 4, 4));
  for (const char* name : {"conv.weight", "conv.bias", "norm.weight", "norm.running_var"})
    BOOST_TEST(onnx.find(name) != std::string::npos, name);
}

BOOST_AUTO_TEST_CASE(names_a_state_dict_cannot_hold_are_refused) {
  twice_named t;
  BOOST_TEST(mentions(error_of([&] { state_names(t); }), "twice_named::members(): two members are named 'a'"));
  listed_twice l;
  BOOST_TEST(mentions(error_of([&] { state_names(l); }), "'a' and 'again' are the same member"));
  dotted d;
  BOOST_TEST(mentions(error_of([&] { state_names(d); }), "the name 'a.b' is not a state-dict name"));
}

// Trained on a tape under 2 replicas with its gradients all-reduced while backward runs, the model
// changes, stays mirrored, and has the bits of the same layers in a sequential trained by hand.
BOOST_AUTO_TEST_CASE(trains_under_a_mirrored_strategy) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  auto models = s.mirror([](auto&) { return taped_pair{}; });
  auto chains = s.mirror([](auto&) { return make_chain(); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  auto chain_opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  const auto initial = all_values(models[0]);
  constexpr std::int64_t batch = 4;
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto x = dist::test::random_tensor<float>(shape::nchw(batch, 1, 6, 6), 300 + step);
    const auto y = dist::test::random_tensor<float>(shape::nchw(batch, 2, 3, 3), 400 + step);
    const auto xs = s.scatter(std::vector<float>(x.begin(), x.end()), 36);
    const auto ys = s.scatter(std::vector<float>(y.begin(), y.end()), 18);
    s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, taped_pair& m,
            decltype(make_chain())& c, optim::adam<float>& o, optim::adam<float>& co) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 36;
          const tensor<float> xt{shape::nchw(n, 1, 6, 6), xl}, yt{shape::nchw(n, 2, 3, 3), yl};
          m.zero_grad();
          auto sync = r.overlap_gradients();
          nn::tape t{r};
          t.loss(t(m, t.constant(xt)), [&](const tensor<float>& p) { return nn::mse(r, p, yt, batch); });
          sync.add(m);
          t.backward();
          sync.wait();
          o.step(r, m);

          c.zero_grad();
          const auto loss = nn::mse(r, c.forward(r, xt), yt, batch);
          c.backward(r, loss.grad, nn::no_input_gradient);
          r.all_reduce_gradients(c);
          co.step(r, c);
        },
        xs, ys, models, chains, opts, chain_opts);
  }
  s.verify_mirrored(models);
  BOOST_TEST((all_values(models[0]) != initial));
  BOOST_TEST((all_values(models[0]) == all_values(chains[0])));
  BOOST_TEST(models[0].state_digest() == chains[0].state_digest());  // running statistics included
  perturb(models[1], 9);
  BOOST_TEST(mentions(error_of([&] { s.verify_mirrored(models); }), "parameters differ on replica(s) 1"));
}

BOOST_AUTO_TEST_CASE(models_nest) {
  outer m;
  BOOST_TEST((state_names(m) ==
              std::vector<std::string>{"first.conv.weight", "first.conv.bias", "first.norm.weight", "first.norm.bias",
                                       "blocks.0.conv.weight", "blocks.0.conv.bias", "blocks.0.norm.weight",
                                       "blocks.0.norm.bias", "blocks.1.conv.weight", "blocks.1.conv.bias",
                                       "blocks.1.norm.weight", "blocks.1.norm.bias", "tail.0.weight", "tail.1.weight",
                                       "tail.1.bias", "tail.1.running_mean", "tail.1.running_var", "tail.3.weight",
                                       "tail.3.bias"}));
  // Parameters in the same order: the nested members' own, then the range's, then the sequential's.
  std::vector<const float*> expected;
  for (auto* b : {&m.first, &m.blocks[0], &m.blocks[1]})
    for (const float* p : {b->conv.weight().value.data(), b->conv.bias().value.data(), b->norm.gamma().value.data(),
                           b->norm.beta().value.data()})
      expected.push_back(p);
  for (const float* p : parameter_addresses(m.tail)) expected.push_back(p);
  BOOST_TEST((parameter_addresses(m) == expected));
  std::size_t buffers = 0;
  m.for_each_buffer([&](std::span<double>) { ++buffers; });
  BOOST_TEST(buffers == 2u);
  BOOST_TEST(m.member_name(m.blocks[1]) == "blocks.1");
  BOOST_TEST(m.blocks[1].member_name(m.blocks[1].norm) == "norm");

  m.for_each_parameter([](std::span<float>, std::span<float> g) { std::fill(g.begin(), g.end(), 2.0f); });
  m.zero_grad();
  float sum = 0;
  m.for_each_parameter([&](std::span<float>, std::span<float> g) {
    for (float v : g) sum += v;
  });
  BOOST_TEST(sum == 0.0f);
  m.set_training(false);
  auto r = nn::local();
  const std::vector<double> mean0 = m.tail.get<0>().norm.running_mean();
  m.tail.forward(r, dist::test::random_tensor<float>(shape::nchw(2, 2, 3, 3), 8));
  BOOST_TEST((m.tail.get<0>().norm.running_mean() == mean0));

  // A copy is a model of its own: its members() refer to its own members.
  outer copy = m;
  perturb(copy, 20);
  BOOST_TEST(copy.state_digest() != m.state_digest());
#if DISTRIBUTE_HAS_SAFETENSORS
  const auto bytes = nn::safetensors_bytes(copy);
  nn::load_safetensors(m, std::span<const std::byte>(bytes));
  BOOST_TEST(copy.state_digest() == m.state_digest());
#endif
}

BOOST_AUTO_TEST_SUITE_END()
