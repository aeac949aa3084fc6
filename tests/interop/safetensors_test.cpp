// nn::save_safetensors / load_safetensors: the names of PyTorch's state_dict, a bit-exact round trip,
// and every kind of malformed or mismatched file refused with an error that names what is wrong,
// leaving the model as it was.

#include "interop_test_support.hpp"

#include <distribute/nn/safetensors.hpp>

#include "models.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace dist = distribute;
namespace nn = distribute::nn;
using namespace distribute::test;

#if DISTRIBUTE_HAS_SAFETENSORS

namespace {

std::vector<std::byte> file_with_header(const std::string& json, std::size_t data_bytes = 0,
                                        std::uint64_t declared = UINT64_MAX) {
  std::vector<std::byte> out(8 + json.size() + data_bytes);
  const std::uint64_t n = declared == UINT64_MAX ? json.size() : declared;
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, json.data(), json.size());
  return out;
}

// The error of loading `bytes` into a fresh small model; the test fails if loading succeeds.
std::string load_error(std::span<const std::byte> bytes) {
  auto m = small_model<float>(1);
  const auto before = state_bytes(m);
  try {
    nn::load_safetensors(m, bytes, "test.safetensors");
  } catch (const nn::interop_error& e) {
    BOOST_TEST((state_bytes(m) == before), "a failed load changed the model");
    return e.what();
  }
  BOOST_FAIL("the malformed file loaded");
  return {};
}

void check_error(const std::string& json, const std::string& expected, std::size_t data_bytes = 0) {
  const auto what = load_error(file_with_header(json, data_bytes));
  BOOST_TEST_INFO("header " << json);
  BOOST_TEST((what.find(expected) != std::string::npos), "error '" << what << "' does not say '" << expected << "'");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(safetensors)

BOOST_AUTO_TEST_CASE(names_follow_pytorch_state_dict) {
  auto m = small_model<float>(1);
  const std::vector<std::string> expected{
      "0.weight",        "0.bias",        "1.weight",        "1.bias",        "1.running_mean", "1.running_var",  //
      "3.body.0.weight", "3.body.0.bias", "3.body.1.weight", "3.body.1.bias",  // residual_block: IN without affine
      "3.body.3.weight", "3.body.3.bias",                                      //
      "4.weight",        "4.bias",        "5.weight",        "5.bias",        "7.weight",       "7.bias",
      "10.weight",       "10.bias"};
  // The residual block's instance norms have no affine parameters: nothing named for them.
  std::vector<std::string> want;
  for (const auto& n : expected)
    if (n != "3.body.1.weight" && n != "3.body.1.bias") want.push_back(n);
  BOOST_TEST(state_names(m) == want, boost::test_tools::per_element());
}

// The names of the PyTorch port's state_dict (benchmarks/peer/cyclegan_torch.py): its generator is
// one nn.Sequential in which each residual block takes a position, and its discriminator one in
// which each stage takes three (conv, norm, activation).
BOOST_AUTO_TEST_CASE(the_example_networks_have_the_port_names) {
  auto g = cyclegan::make_generator<dist::cpu>({.channels = 1, .filters = 16, .blocks = 3}, 5);
  const std::vector<std::string> generator{
      "0.weight",         "3.weight",         "6.weight",         "9.body.0.weight",  "9.body.3.weight",
      "10.body.0.weight", "10.body.3.weight", "11.body.0.weight", "11.body.3.weight", "12.weight",
      "15.weight",        "18.weight",        "18.bias"};
  BOOST_TEST(state_names(g) == generator, boost::test_tools::per_element());
  auto d = cyclegan::make_discriminator<dist::cpu>({.channels = 1, .filters = 16, .layers = 2}, 5);
  const std::vector<std::string> discriminator{"0.weight", "0.bias", "2.weight", "5.weight", "8.weight", "8.bias"};
  BOOST_TEST(state_names(d) == discriminator, boost::test_tools::per_element());
  // With batch norm the stages' norms have state of their own, at the norm's position.
  auto b = cyclegan::make_discriminator<dist::cpu>(
      {.channels = 1, .filters = 16, .layers = 2, .norm = cyclegan::norm_kind::batch}, 5);
  const std::vector<std::string> batch{"0.weight",       "0.bias",        "2.weight", "3.weight", "3.bias",
                                       "3.running_mean", "3.running_var", "5.weight", "6.weight", "6.bias",
                                       "6.running_mean", "6.running_var", "8.weight", "8.bias"};
  BOOST_TEST(state_names(b) == batch, boost::test_tools::per_element());
}

template <class T>
void round_trip() {
  temp_dir dir;
  auto a = small_model<T>(1);
  move_statistics(a, dist::shape::nchw(2, 2, 8, 8), 7);
  const auto file = dir.path / "m.safetensors";
  nn::save_safetensors(a, file);
  auto b = small_model<T>(99);
  BOOST_TEST((state_bytes(b) != state_bytes(a)));
  nn::load_safetensors(b, file);
  BOOST_TEST((state_bytes(b) == state_bytes(a)), "the loaded state differs from the saved one");
  // The same forward, bit for bit.
  a.set_training(false);
  b.set_training(false);
  auto r = nn::local();
  const auto x = random_input<T>(dist::shape::nchw(2, 2, 8, 8), 3);
  BOOST_TEST((a.forward(r, x) == b.forward(r, x)));
  // No temporary is left beside the file.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  BOOST_TEST(files == 1u);
}

BOOST_AUTO_TEST_CASE(round_trip_is_bit_exact_float) { round_trip<float>(); }
BOOST_AUTO_TEST_CASE(round_trip_is_bit_exact_double) { round_trip<double>(); }

BOOST_AUTO_TEST_CASE(header_is_what_the_format_says) {
  auto m = small_model<float>(1);
  const auto bytes = nn::safetensors_bytes(m);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  BOOST_TEST(n % 8 == 0u);  // the data starts aligned, as the format's own writer makes it
  const std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  BOOST_TEST(header.find(R"("0.weight":{"dtype":"F32","shape":[4,2,3,3],"data_offsets":[0,288]})") != std::string::npos,
             header);
  BOOST_TEST(header.find(R"("1.running_var":{"dtype":"F64","shape":[4])") != std::string::npos, header);
  BOOST_TEST(header.find(R"("__metadata__":{"format":"pt"})") != std::string::npos, header);
}

// PyTorch writes running statistics as F32 and a num_batches_tracked counter: both load.
BOOST_AUTO_TEST_CASE(pytorch_statistics_and_counter_load) {
  auto m = small_model<float>(1);
  std::vector<nn::detail::safetensors::tensor_to_write> tensors;
  struct v {
    decltype(tensors)* out;
    void parameter(const std::string& name, nn::parameter<float, dist::cpu>& p) {
      std::vector<std::uint64_t> shape;
      for (std::size_t i = 0; i < p.value.shape().rank(); ++i)
        shape.push_back(static_cast<std::uint64_t>(p.value.shape()[i]));
      std::vector<float> values(p.value.size(), 0.25f);
      out->push_back({name, "F32", shape, nn::detail::bytes_of(values)});
    }
    void buffer(const std::string& name, std::span<double> b) {
      std::vector<float> values(b.size(), 0.5f);
      out->push_back({name, "F32", {b.size()}, nn::detail::bytes_of(values)});
    }
  };
  nn::for_each_named_state(m, v{&tensors});
  tensors.push_back({"1.num_batches_tracked", "I64", {}, nn::detail::bytes_of(std::vector<std::int64_t>{3})});
  const auto bytes = nn::detail::safetensors::encode(tensors);
  nn::load_safetensors(m, bytes);
  auto& bn = m.get<1>();
  for (const double x : bn.running_var()) BOOST_TEST(x == 0.5);
  for (const float x : bn.gamma().value) BOOST_TEST(x == 0.25f);
}

struct anonymous_layer {
  using scalar_type = float;
  nn::parameter<float> p{dist::shape{3}, nn::init::normal, 1};
  template <class F>
  void for_each_parameter(F&& f) {
    p.visit(f);
  }
};

BOOST_AUTO_TEST_CASE(a_layer_without_names_is_named_in_the_error) {
  auto m = nn::sequential{nn::relu<float>{}, anonymous_layer{}};
  try {
    (void)nn::safetensors_bytes(m);
    BOOST_FAIL("a layer with unnamed parameters was saved");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("anonymous_layer at '1.'") != std::string::npos, what);
    BOOST_TEST(what.find("name_state") != std::string::npos, what);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(safetensors_errors)

BOOST_AUTO_TEST_CASE(truncated_and_oversized_headers) {
  BOOST_TEST(load_error(std::vector<std::byte>(5)).find("fewer than the 8") != std::string::npos);
  BOOST_TEST(load_error(file_with_header("{}", 0, 1000)).find("runs past the end of the file") != std::string::npos);
  BOOST_TEST(load_error(file_with_header("{}", 0, 1)).find("cannot be a JSON object") != std::string::npos);
  // A gigantic header in a file that is that large (sparse: it takes no disk) is refused before
  // a byte of it is read.
  temp_dir dir;
  const auto path = dir.path / "huge.safetensors";
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    BOOST_TEST_REQUIRE(fd >= 0);
    const std::uint64_t n = 4'000'000'000ull;
    BOOST_TEST_REQUIRE(::write(fd, &n, 8) == 8);
    BOOST_TEST_REQUIRE(::ftruncate(fd, static_cast<off_t>(n + 8)) == 0);
    ::close(fd);
  }
  auto m = small_model<float>(1);
  try {
    nn::load_safetensors(m, path);
    BOOST_FAIL("a 4 GB header was accepted");
  } catch (const nn::interop_error& e) {
    BOOST_TEST(std::string(e.what()).find("over the format's limit") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(malformed_json) {
  check_error("{\"a\": ", "malformed JSON");
  check_error("[1, 2]", "an array is out of place at the top level");
  check_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [[[[[[1]]]]]], \"data_offsets\": [0, 4]}}",
              "an array is out of place in tensor 'a'");
  check_error(std::string(100000, '['),
              "an array is out of place at the top level");  // refused at the first bracket, not after 100000
  check_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", "a negative number");
  check_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", "a fraction");
  check_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", "tensor 'a' lacks its data_offsets");
  check_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"extra\": 1}}",
              "unknown field 'extra'");
  check_error("{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
              "a second 'dtype'");
  check_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", "1 data_offsets, not 2");
  check_error("{\"__metadata__\": {\"format\": 1}}", "a number is out of place in __metadata__");
  check_error("{\"a\": 5}", "a number is out of place as the value of 'a'");
  check_error("{\"a\": {\"dtype\": \"Q7\", \"shape\": [1], \"data_offsets\": [0, 4]}}", "unknown dtype 'Q7'", 4);
}

BOOST_AUTO_TEST_CASE(offsets_that_overrun_overlap_or_leave_gaps) {
  check_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "past its end", 4);
  check_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", "end before they begin", 8);
  check_error(
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
      "overlaps tensor 'a'", 12);
  check_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
              "bytes [0, 4) of the data belong to no tensor", 8);
  check_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
              "at the end of the data belong to no tensor", 8);
  check_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "needs 12 bytes", 8);
  check_error(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
              "needs over 2^64 bytes", 8);
  check_error(
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
      "'a' appears twice", 8);
}

BOOST_AUTO_TEST_CASE(a_file_of_another_model_names_the_tensor) {
  auto good = small_model<float>(1);
  const auto bytes = nn::safetensors_bytes(good);
  // Another architecture: the first tensor it lacks or has in another shape is named.
  auto other = nn::sequential{nn::conv2d<float>{{.in_channels = 2, .out_channels = 5, .kernel = 3}, 1}};
  try {
    nn::load_safetensors(other, bytes, "other.safetensors");
    BOOST_FAIL("loaded into another model");
  } catch (const nn::interop_error& e) {
    BOOST_TEST(std::string(e.what()).find("other.safetensors: tensor '1.weight' of the file is not in the model") !=
                   std::string::npos,
               e.what());
  }
  auto smaller = nn::sequential{
      nn::conv2d<float>{
          {.in_channels = 2, .out_channels = 5, .kernel = 3, .padding = 1, .pad_mode = nn::padding_mode::reflect}, 1},
      nn::batch_norm<float>{{.channels = 4}, 2}};
  const auto cut = nn::safetensors_bytes(smaller);
  const std::string what = load_error(cut);
  BOOST_TEST(what.find("tensor '0.weight' has shape [5, 2, 3, 3]; the model's has [4, 2, 3, 3]") != std::string::npos,
             what);

  // A double model's file into a float model: the dtype is named.
  auto d = small_model<double>(1);
  const std::string dtype = load_error(nn::safetensors_bytes(d));
  BOOST_TEST(dtype.find("tensor '0.weight' is F64; the model's is F32") != std::string::npos, dtype);

  // A missing tensor.
  auto no_linear = small_model<float>(1);
  std::vector<nn::detail::safetensors::tensor_to_write> tensors;
  struct v {
    decltype(tensors)* out;
    void parameter(const std::string& name, nn::parameter<float, dist::cpu>& p) {
      if (name == "10.bias") return;
      std::vector<std::uint64_t> shape;
      for (std::size_t i = 0; i < p.value.shape().rank(); ++i)
        shape.push_back(static_cast<std::uint64_t>(p.value.shape()[i]));
      out->push_back({name, "F32", shape, nn::detail::bytes_of(std::vector<float>(p.value.begin(), p.value.end()))});
    }
    void buffer(const std::string& name, std::span<double> b) {
      out->push_back({name, "F64", {b.size()}, nn::detail::bytes_of(std::vector<double>(b.begin(), b.end()))});
    }
  };
  nn::for_each_named_state(no_linear, v{&tensors});
  const std::string missing = load_error(nn::detail::safetensors::encode(tensors));
  BOOST_TEST(missing.find("the file has no tensor '10.bias' (the model's F32 [5])") != std::string::npos, missing);
  // An extra one.
  tensors.push_back({"10.bias", "F32", {5}, nn::detail::bytes_of(std::vector<float>(5))});
  tensors.push_back({"11.weight", "F32", {1}, nn::detail::bytes_of(std::vector<float>(1))});
  const std::string extra = load_error(nn::detail::safetensors::encode(tensors));
  BOOST_TEST(extra.find("tensor '11.weight' of the file is not in the model") != std::string::npos, extra);
}

BOOST_AUTO_TEST_CASE(missing_file_is_named) {
  auto m = small_model<float>(1);
  try {
    nn::load_safetensors(m, "/nonexistent/dir/m.safetensors");
    BOOST_FAIL("a missing file loaded");
  } catch (const nn::interop_error& e) {
    BOOST_TEST(std::string(e.what()).find("/nonexistent/dir/m.safetensors: cannot open") != std::string::npos,
               e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

#else
BOOST_AUTO_TEST_CASE(safetensors_unavailable) {
  BOOST_TEST_MESSAGE("built without nlohmann's JSON library: safetensors files are unavailable");
}
#endif
