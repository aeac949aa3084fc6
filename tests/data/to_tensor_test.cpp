// From the pipeline's NHWC values to NCHW tensors: layout, scaling, every rank, and errors.

#include <distribute/data/to_tensor.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace data = distribute::data;

BOOST_AUTO_TEST_SUITE(to_tensor)

BOOST_AUTO_TEST_CASE(nhwc_images_become_nchw_planes) {
  // 2 examples of 2x3 pixels, 3 channels: value = 100 e + 10 (y * 3 + x) + c.
  data::tensor<std::uint8_t> images{{2, 2, 3, 3}, {}};
  for (std::size_t e = 0; e < 2; ++e)
    for (std::size_t p = 0; p < 6; ++p)
      for (std::size_t c = 0; c < 3; ++c) images.values.push_back(static_cast<std::uint8_t>(100 * e + 10 * p + c));
  const auto t = data::to_tensor(images);
  BOOST_TEST(t.shape() == dist::shape::nchw(2, 3, 2, 3));
  for (std::int64_t e = 0; e < 2; ++e)
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t y = 0; y < 2; ++y)
        for (std::int64_t x = 0; x < 3; ++x)
          BOOST_TEST(t(e, c, y, x) == static_cast<float>(100 * e + 10 * (y * 3 + x) + c));
}

BOOST_AUTO_TEST_CASE(pixel_scalings_map_0_and_255_to_the_ends_of_their_ranges) {
  data::tensor<std::uint8_t> px{{1, 1, 3, 1}, {0, 51, 255}};
  const auto unit = data::to_tensor(px, data::pixels::unit);
  BOOST_TEST(unit[0] == 0.0f);
  BOOST_TEST(unit[1] == 0.2f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(unit[2] == 1.0f, boost::test_tools::tolerance(1e-6f));
  const auto symmetric = data::to_tensor(px, data::pixels::symmetric);
  BOOST_TEST(symmetric[0] == -1.0f);
  BOOST_TEST(symmetric[2] == 1.0f, boost::test_tools::tolerance(1e-6f));
  const auto d = data::to_tensor<double>(px, {.scale = 0.5, .offset = 3.0});
  BOOST_TEST(d[1] == 28.5);
}

BOOST_AUTO_TEST_CASE(every_rank_and_a_batch) {
  data::tensor<float> features{{2, 3}, {1, 2, 3, 4, 5, 6}};
  const auto f = data::to_tensor(features);
  BOOST_TEST(f.shape() == (dist::shape{2, 3}));
  BOOST_TEST(f[4] == 5.0f);
  data::tensor<float> gray{{1, 2, 2}, {1, 2, 3, 4}};
  BOOST_TEST(data::to_tensor(gray).shape() == dist::shape::nchw(1, 1, 2, 2));
  data::tensor<std::int32_t> scalars{{3}, {7, 8, 9}};
  BOOST_TEST(data::to_tensor(scalars)[2] == 9.0f);
  data::batch<std::uint8_t> b;
  b.images = data::tensor<std::uint8_t>{{1, 1, 1, 2}, {10, 20}};
  b.labels = {4};
  const auto t = data::to_tensor(b);
  BOOST_TEST(t.shape() == dist::shape::nchw(1, 2, 1, 1));
  BOOST_TEST(t[1] == 20.0f);
  // An empty batch keeps its shape.
  data::tensor<std::uint8_t> none{{0, 4, 4, 1}, {}};
  BOOST_TEST(data::to_tensor(none).shape() == dist::shape::nchw(0, 1, 4, 4));
}

BOOST_AUTO_TEST_CASE(bad_shapes_are_named) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto rank5 = message([] { data::to_tensor(data::tensor<float>{{1, 1, 1, 1, 1}, {0}}); });
  BOOST_TEST(rank5.find("got shape [1, 1, 1, 1, 1]") != std::string::npos, rank5);
  const auto count = message([] { data::to_tensor(data::tensor<float>{{2, 2}, {1, 2, 3}}); });
  BOOST_TEST(count.find("got 3 values for shape [2, 2]") != std::string::npos, count);
}

BOOST_AUTO_TEST_SUITE_END()
