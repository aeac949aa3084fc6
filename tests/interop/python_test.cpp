// The other side of the files: the example's generator saved here loads into its PyTorch port and
// computes the same output; the port's weights load here alike; every exported ONNX graph passes
// onnx.checker and onnxruntime computes this library's forward with it, at the example's demo size
// and at the paper's; the porting layers and the gradient penalties (R1, WGAN-GP: gradients of
// gradients) compute what PyTorch computes. Run by tests/interop/interop_check.py in the virtual
// environment scripts/setup.sh makes; where that could not be made (no PyPI), the tests are skipped
// with its note.

#include "interop_test_support.hpp"
#include "../shell_command.hpp"

#include <distribute/nn/onnx.hpp>
#include <distribute/nn/safetensors.hpp>

#include "models.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using namespace distribute::test;
using namespace std::string_literals;

#if DISTRIBUTE_HAS_SAFETENSORS

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

[[noreturn]] void skip(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(77);
}

// The environment's Python; `torch`: one that has PyTorch too. Where setup.sh could not install
// them (or torch did not import once installed) it leaves a note saying why, and the test is
// skipped; a missing environment without a note is a failure (setup.sh was not run).
std::string python(bool torch) {
  const fs::path venv = DISTRIBUTE_INTEROP_VENV;
  const fs::path py = venv / "bin" / "python";
  fs::path note = venv;
  note += ".unavailable";
  if (!fs::exists(py)) {
    if (fs::exists(note))
      skip("the interop environment could not be installed (" + note.string() + "): " + read_text(note));
    BOOST_FAIL(
        py.string()
        << " is missing: scripts/setup.sh creates it (configure with -DDISTRIBUTE_INTEROP_VENV=DIR for another place)");
  }
  fs::path no_torch = venv;
  no_torch += ".no-torch";
  if (torch && fs::exists(no_torch))
    skip("no PyTorch in the interop environment (" + no_torch.string() + "): " + read_text(no_torch));
  return py.string();
}

command_result run(const std::string& py, const std::vector<std::string>& args) {
  std::string command = "DISTRIBUTE_TORCH_PORT=";
  for (const std::string& part :
       {shell_quoted(DISTRIBUTE_TORCH_PORT), shell_quoted(py), shell_quoted(DISTRIBUTE_INTEROP_SCRIPT)})
    command.append(part).append(" ");
  for (const auto& a : args) command.append(shell_quoted(a)).append(" ");
  command += "2>&1";
  const command_result r = run_command(command);
  BOOST_TEST_MESSAGE(r.output);
  return r;
}

// A file of an input and the output the model gave for it.
void write_io(const fs::path& path, const dist::tensor<float>& x, const dist::tensor<float>& y) {
  auto entry = [](std::string name, const dist::tensor<float>& t) {
    std::vector<std::uint64_t> shape;
    for (std::size_t i = 0; i < t.shape().rank(); ++i) shape.push_back(static_cast<std::uint64_t>(t.shape()[i]));
    return nn::detail::safetensors::tensor_to_write{std::move(name), "F32", shape,
                                                    nn::detail::bytes_of(std::vector<float>(t.begin(), t.end()))};
  };
  const auto bytes = nn::detail::safetensors::encode({entry("input", x), entry("output", y)});
  dist::checkpoint::write_atomically(path, bytes);
}

double max_abs_diff(const dist::tensor<float>& a, const dist::tensor<float>& b) {
  BOOST_TEST_REQUIRE(a.shape() == b.shape());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace

// An input and its output, read as a two-tensor model named as the file names them.
struct io_model {
  using scalar_type = float;
  nn::parameter<float> input, output;
  template <class F>
  void for_each_parameter(F&& f) {
    input.visit(f);
    output.visit(f);
  }
  template <class S>
  void name_state(S& scope) {
    scope.parameter("input", input);
    scope.parameter("output", output);
  }
};

BOOST_AUTO_TEST_SUITE(torch)

BOOST_AUTO_TEST_CASE(our_generator_loads_into_the_pytorch_port) {
  const auto py = python(true);
  temp_dir dir;
  auto g = cyclegan::make_generator<dist::cpu>({.channels = 1, .filters = 16, .blocks = 3}, 5);
  g.set_training(false);
  auto r = nn::local();
  const auto x = random_input<float>(dist::shape::nchw(2, 1, 28, 28), 11);
  const auto y = g.forward(r, x);
  nn::save_safetensors(g, dir.path / "gen.safetensors");
  write_io(dir.path / "io.safetensors", x, y);
  const auto res = run(py, {"torch-load", (dir.path / "gen.safetensors").string(),
                            (dir.path / "io.safetensors").string(), "1", "16", "3"});
  BOOST_TEST(res.status == 0, res.output);
}

BOOST_AUTO_TEST_CASE(pytorch_weights_load_into_our_generator) {
  const auto py = python(true);
  temp_dir dir;
  const auto res = run(py, {"torch-save", dir.path.string(), "1", "16", "3", "7"});
  BOOST_TEST_REQUIRE(res.status == 0, res.output);
  auto g = cyclegan::make_generator<dist::cpu>({.channels = 1, .filters = 16, .blocks = 3}, 5);
  g.set_training(false);
  nn::load_safetensors(g, dir.path / "gen.safetensors");
  const auto s = dist::shape::nchw(2, 1, 28, 28);
  io_model io{{s, nn::init::zero, 0}, {s, nn::init::zero, 0}};
  nn::load_safetensors(io, dir.path / "io.safetensors");
  auto r = nn::local();
  const auto y = g.forward(r, io.input.value);
  const double d = max_abs_diff(y, io.output.value);
  BOOST_TEST_MESSAGE("max_abs_diff " << d);
  BOOST_TEST(d <= 1e-5);
}

namespace {

// A layer's gradients and buffers by their state-dict names, for the files below.
struct named_results {
  std::vector<std::pair<std::string, dist::tensor<float>>>* out;
  template <class T, class D>
  void parameter(const std::string& name, nn::parameter<T, D>& p) {
    out->emplace_back("grad." + name, p.grad);
  }
  void buffer(const std::string& name, std::span<double> b) {
    dist::tensor<float> t{dist::shape{static_cast<std::int64_t>(b.size())}};
    std::copy(b.begin(), b.end(), t.begin());
    out->emplace_back("after." + name, t);
  }
};

using named_tensors = std::vector<std::pair<std::string, dist::tensor<float>>>;

// Named float tensors as one safetensors file.
void write_tensors(const fs::path& path, const named_tensors& tensors) {
  std::vector<nn::detail::safetensors::tensor_to_write> entries;
  for (const auto& [name, t] : tensors) {
    std::vector<std::uint64_t> shape;
    for (std::size_t i = 0; i < t.shape().rank(); ++i) shape.push_back(static_cast<std::uint64_t>(t.shape()[i]));
    entries.push_back({name, "F32", shape, nn::detail::bytes_of(std::vector<float>(t.begin(), t.end()))});
  }
  dist::checkpoint::write_atomically(path, nn::detail::safetensors::encode(entries));
}

// PyTorch's layer (`kind` with `args`: interop_check.py) loads `layer`'s state as it was before one
// training forward and backward here, runs the same on the same input and output gradient, and gives
// the same output, input gradient, parameter gradients and (spectral norm's power iteration) buffers
// within 1e-5.
template <class L>
void compare_with_torch(L& layer, const dist::tensor<float>& x, const std::string& kind,
                        const std::vector<std::string>& args, bool input_gradient = true) {
  const auto py = python(true);
  temp_dir dir;
  nn::save_safetensors(layer, dir.path / "state.safetensors");
  auto r = nn::local();
  layer.set_training(true);
  layer.zero_grad();
  const auto y = layer.forward(r, x);
  const auto dy = random_input<float>(y.shape(), 17);
  const auto dx = layer.backward(r, dy);
  named_tensors tensors{{"input", x}, {"dy", dy}, {"output", y}};
  if (input_gradient) tensors.emplace_back("dx", dx);
  nn::for_each_named_state(layer, named_results{&tensors});
  write_tensors(dir.path / "io.safetensors", tensors);
  std::vector<std::string> command{"torch-layer", dir.path.string(), kind};
  command.insert(command.end(), args.begin(), args.end());
  const auto res = run(py, command);
  BOOST_TEST(res.status == 0, kind << ": " << res.output);
}

}  // namespace

BOOST_AUTO_TEST_CASE(porting_layers_compute_what_pytorchs_compute) {
  {
    nn::embedding<float> emb{{.num_embeddings = 9, .embedding_dim = 6}, 3};
    dist::tensor<float> ids{dist::shape{4, 5}};
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<float>((i * 7 + 3) % 9 == 5 ? 2 : (i * 7 + 3) % 9);
    compare_with_torch(emb, ids, "embedding", {"9", "6"}, false);
  }
  const auto img = random_input<float>(dist::shape::nchw(2, 3, 5, 7), 21);
  for (const std::int64_t s : {2, 3}) {
    nn::upsample<float> nearest{{.scale_factor = s}};
    compare_with_torch(nearest, img, "upsample_nearest", {std::to_string(s)});
    nn::upsample<float> bilinear{{.scale_factor = s, .mode = nn::upsample_mode::bilinear}};
    compare_with_torch(bilinear, img, "upsample_bilinear", {std::to_string(s)});
  }
  nn::pixel_shuffle<float> ps{{.upscale_factor = 2}};
  compare_with_torch(ps, random_input<float>(dist::shape::nchw(2, 8, 3, 5), 22), "pixel_shuffle", {"2"});
  {
    nn::layer_norm<float> ln{{.normalized_shape = dist::shape{3, 5, 7}}};
    // weights off 1 and 0, so that loading them is tested too
    ln.for_each_parameter([i = 0](std::span<float> v, std::span<float>) mutable {
      for (auto& w : v) w = 0.5f + 0.01f * static_cast<float>(i++ % 37);
    });
    compare_with_torch(ln, img, "layer_norm", {"3", "5", "7"});
    nn::layer_norm<float> last{{.normalized_shape = dist::shape{7}}};
    compare_with_torch(last, img, "layer_norm", {"7"});
  }
  {
    nn::spectral_norm sn{nn::linear<float>{{.in_features = 12, .out_features = 5}, 4}, {}, 6};
    compare_with_torch(sn, random_input<float>(dist::shape{3, 12}, 23), "spectral_linear", {"12", "5"});
    nn::spectral_norm sc{nn::conv2d<float>{{.in_channels = 3, .out_channels = 4, .kernel = 3, .padding = 1}, 4}, {}, 7};
    compare_with_torch(sc, img, "spectral_conv2d", {"3", "4", "3", "1"});
  }
}

namespace {

// A conditional discriminator written for the tape (its members called one by one, as gradient
// penalties need): reflect-padded and spectral-normalised convolutions, pooling, a linear layer, and
// a projection term through an embedding of the labels. interop_check.py's torch-penalty builds the
// same torch.nn.Module with the same attribute names.
struct penalty_discriminator : nn::module<penalty_discriminator, float> {
  nn::conv2d<float> c1{
      {.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1, .pad_mode = nn::padding_mode::reflect}, 1};
  nn::leaky_relu<float> leaky{0.2f};
  nn::spectral_norm<nn::conv2d<float>> c2{
      nn::conv2d<float>{{.in_channels = 4, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1}, 2}, {}, 3};
  nn::avg_pool2d<float> pool{{.kernel = 2}};
  nn::flatten<float> flat{};
  nn::linear<float> dense{{.in_features = 16, .out_features = 8}, 4};
  nn::embedding<float> embed{{.num_embeddings = 3, .embedding_dim = 8}, 5};
  nn::spectral_norm<nn::linear<float>> out{nn::linear<float>{{.in_features = 8, .out_features = 1}, 6}, {}, 7};
  dist::tensor<float> labels;

  auto members() { return nn::members("c1", c1, "c2", c2, "dense", dense, "embed", embed, "out", out); }

  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    auto h = t(leaky, t(c1, x));
    h = t(flat, t(pool, t(c2, h)));
    h = t(leaky, t(dense, h));
    const auto projection = nn::sum(t, nn::mul(t, t(embed, t.constant(labels)), h), 1, true);  // [N, 1]
    return nn::add(t, t(out, h), projection);
  }
};

// Every parameter's gradient as "<prefix>grad.<state-dict name>".
void add_gradients(penalty_discriminator& d, const std::string& prefix, named_tensors& out) {
  named_tensors all;
  nn::for_each_named_state(d, named_results{&all});
  for (auto& [name, t] : all)
    if (name.starts_with("grad.")) out.emplace_back(prefix + name, std::move(t));
}

}  // namespace

// R1 and WGAN-GP on the discriminator above: the penalties' values and every parameter gradient are
// those of PyTorch's autograd.grad(D(x).sum(), x, create_graph=True) and backward through them, on
// the same weights, inputs and points, within 1e-5 (interop_check.py's torch-penalty).
BOOST_AUTO_TEST_CASE(penalties_match_pytorchs_double_backward) {
  const auto py = python(true);
  temp_dir dir;
  penalty_discriminator d;
  const std::int64_t n = 4;
  d.labels = dist::tensor<float>{dist::shape{n}, std::vector<float>{2, 0, 1, 2}};
  // Weights and biases U(-0.5, 0.5) (the embedding's stay N(0, 1)): with the N(0, 0.02) draws, R1 is
  // near 5e-5 and its parameter gradients under 5e-4, too small for 1e-5 to tell a wrong one; at this
  // scale ||dD/dx_i|| is near 1 and the gradients near 1. (The biases do not reach the penalties'
  // gradients through piecewise-linear activations, but they set which side each one takes.)
  std::mt19937 gen(8);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  auto draw = [&](std::span<float> v, std::span<float>) {
    for (float& w : v) w = uniform(gen);
  };
  d.c1.for_each_parameter(draw);
  d.c2.for_each_parameter(draw);
  d.dense.for_each_parameter(draw);
  d.out.for_each_parameter(draw);
  auto r = nn::local();
  // Training forwards first: the power iteration brings u and v near W's singular vectors (from their
  // random draws sigma = u^T W v can be near 0, and W / sigma then magnifies every rounding). Then u
  // and v are fixed, as in PyTorch's eval mode, and saved with the weights.
  for (std::uint32_t i = 0; i < 3; ++i) {
    nn::tape<nn::local_replica, float> t{r};
    d(t, t.constant(random_input<float>(dist::shape::nchw(n, 2, 8, 8), 30 + i)));
  }
  d.set_training(false);
  nn::save_safetensors(d, dir.path / "state.safetensors");

  const auto x = random_input<float>(dist::shape::nchw(n, 2, 8, 8), 41);
  const auto fake = random_input<float>(x.shape(), 42);
  const auto alpha = nn::interpolation_weights(n, 5, 3, 0);
  dist::tensor<float> points{x.shape()};
  const std::size_t per = points.size() / static_cast<std::size_t>(n);
  for (std::size_t i = 0; i < points.size(); ++i)
    points[i] = fake[i] + static_cast<float>(alpha[i / per]) * (x[i] - fake[i]);

  named_tensors tensors{{"input", x}, {"labels", d.labels}, {"points", points}};
  {
    d.zero_grad();
    nn::tape<nn::local_replica, float> t{r};
    const auto p = nn::r1_penalty(t, x, [&](auto v) { return d(t, v); }, {.weight = 10});
    t.backward(p);
    tensors.emplace_back("r1", p.value());
    add_gradients(d, "r1.", tensors);
  }
  {
    d.zero_grad();
    nn::tape<nn::local_replica, float> t{r};
    const auto p = nn::gradient_penalty_at(t, points, [&](auto v) { return d(t, v); }, {.weight = 10});
    t.backward(p);
    tensors.emplace_back("gp", p.value());
    add_gradients(d, "gp.", tensors);
  }
  write_tensors(dir.path / "io.safetensors", tensors);
  const auto res = run(py, {"torch-penalty", dir.path.string()});
  BOOST_TEST(res.status == 0, res.output);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(onnxruntime)

// onnxruntime computes what our forward did, on an engine with `options`, within `tolerance`.
template <class M>
void check_with_onnxruntime(M& model, dist::shape input, const std::string& what, dist::compute_options options = {},
                            double tolerance = 1e-5) {
  const auto py = python(false);
  temp_dir dir;
  model.set_training(false);
  dist::engine_slot<dist::cpu> slot;
  slot.reset(options, 0);
  nn::local_replica r{dist::cpu{}, dist::comm::local{}, &slot};
  const auto x = random_input<float>(input, 13);
  const auto y = model.forward(r, x);
  nn::export_onnx(model, input, dir.path / "model.onnx");
  write_io(dir.path / "io.safetensors", x, y);
  const auto res = run(py, {"onnx", (dir.path / "model.onnx").string(), (dir.path / "io.safetensors").string(),
                            std::to_string(tolerance)});
  BOOST_TEST(res.status == 0, what << ": " << res.output);
  BOOST_TEST_MESSAGE(what << ": " << res.output);
}

BOOST_AUTO_TEST_CASE(every_layer) {
  auto m = small_model<float>(1);
  move_statistics(m, dist::shape::nchw(2, 2, 8, 8), 7);  // batch norm's running statistics are used
  check_with_onnxruntime(m, dist::shape::nchw(2, 2, 8, 8), "every layer");
}

BOOST_AUTO_TEST_CASE(generator_at_demo_size) {
  auto g = cyclegan::make_generator<dist::cpu>({.channels = 1, .filters = 16, .blocks = 3}, 5);
  check_with_onnxruntime(g, dist::shape::nchw(2, 1, 28, 28), "demo generator");
}

// At the paper's size (21 convolutions, sums of up to 3,136 products, 196,608 outputs in [-1, 1]) two
// correct float32 forwards differ by about 1e-5 at their largest difference, by how each CPU's kernels
// order their sums. Measured on a 2-core Zen 3 (AVX2, no AVX-512) for the PyTorch port of this
// generator (benchmarks/peer) with float64 as the truth: PyTorch's float32 forward 1.06e-5 from it,
// onnxruntime's 5.0e-6, PyTorch against onnxruntime 1.14e-5; ours against onnxruntime 1.13e-5 there
// (oneDNN's jit:avx2 kernels) and 6.5e-6 on a Zen 4 (AVX-512). Hence 3e-5 with every convolution
// direct: an export that got a layer wrong is off by orders of magnitude more. As the engine computes
// by default, the residual blocks' convolutions take Winograd (compute_options::conv_winograd:
// oneDNN's kernel on AVX-512, the engine's own F(4x4, 3x3) elsewhere, where timed faster), which
// rounds more, and over 18 such convolutions the differences add up: 1.2e-5 on the Zen 4 with
// oneDNN's kernel, 2.3e-5 on the Zen 3 with the engine's own (each of its convolutions within about
// 5e-6 of its largest magnitude from the direct result; oneDNN's within 2e-5). Hence 1e-4 for
// that check, still three orders of magnitude below a layer exported wrong.
BOOST_AUTO_TEST_CASE(generator_at_paper_size) {
  auto g = cyclegan::make_generator<dist::cpu>({.channels = 3, .filters = 64, .blocks = 9}, 5);
  check_with_onnxruntime(g, dist::shape::nchw(1, 3, 256, 256), "paper generator, direct convolutions",
                         {.conv_winograd = false}, 3e-5);
  check_with_onnxruntime(g, dist::shape::nchw(1, 3, 256, 256), "paper generator, the engine's default", {}, 1e-4);
}

BOOST_AUTO_TEST_CASE(porting_layers) {
  auto m = nn::sequential{
      nn::conv2d<float>{{.in_channels = 3, .out_channels = 8, .kernel = 3, .padding = 1}, 2},
      nn::pixel_shuffle<float>{{.upscale_factor = 2}},
      nn::upsample<float>{{.scale_factor = 2}},
      nn::upsample<float>{{.scale_factor = 3, .mode = nn::upsample_mode::bilinear}},
      nn::layer_norm<float>{{.normalized_shape = dist::shape{2, 48, 48}}},
      nn::spectral_norm{nn::conv2d<float>{{.in_channels = 2, .out_channels = 3, .kernel = 3, .padding = 1}, 3}, {}, 4}};
  // Training forwards first: the power iteration brings u and v near W's singular vectors. From their
  // random draws sigma = u^T W v can be near 0, and W / sigma then magnifies every rounding.
  move_statistics(m, dist::shape::nchw(2, 3, 4, 4), 7);
  check_with_onnxruntime(m, dist::shape::nchw(2, 3, 4, 4), "pixel_shuffle, upsample, layer_norm, spectral_norm");
  // Indices as the layer takes them (integral floats), cast to int64 in the graph.
  const auto py = python(false);
  temp_dir dir;
  nn::embedding<float> emb{{.num_embeddings = 10, .embedding_dim = 4}, 5};
  dist::tensor<float> ids{dist::shape{3, 4}};
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 3) % 10);
  auto r = nn::local();
  write_io(dir.path / "io.safetensors", ids, emb.forward(r, ids));
  nn::export_onnx(emb, ids.shape(), dir.path / "model.onnx");
  const auto res = run(py, {"onnx", (dir.path / "model.onnx").string(), (dir.path / "io.safetensors").string()});
  BOOST_TEST(res.status == 0, "embedding: " << res.output);
}

BOOST_AUTO_TEST_CASE(discriminator) {
  auto d = cyclegan::make_discriminator<dist::cpu>(
      {.channels = 1, .filters = 16, .layers = 2, .norm = cyclegan::norm_kind::batch}, 5);
  move_statistics(d, dist::shape::nchw(2, 1, 28, 28), 3);
  check_with_onnxruntime(d, dist::shape::nchw(2, 1, 28, 28), "discriminator with batch norm");
}

BOOST_AUTO_TEST_SUITE_END()

#endif
