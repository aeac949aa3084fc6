#pragma once
// The few protocol-buffer messages of a TensorBoard event file, encoded by hand (no protobuf
// library). Field numbers are those of tensorboard/compat/proto/{event,summary,tensor}.proto:
//
//   Event           wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
//                   summary = 5 (Summary)
//   Summary         value = 1 (repeated Value)
//   Summary.Value   tag = 1 (string), simple_value = 2 (float), image = 4 (Image),
//                   tensor = 8 (TensorProto), metadata = 9 (SummaryMetadata)
//   Summary.Image   height = 1, width = 2, colorspace = 3 (int32), encoded_image_string = 4 (bytes)
//   TensorProto     dtype = 1 (enum; DT_STRING = 7), tensor_shape = 2 (TensorShapeProto; empty:
//                   a scalar), string_val = 8 (repeated bytes)
//   SummaryMetadata plugin_data = 1 (PluginData{plugin_name = 1 (string), content = 2 (bytes)})
//
// Fields are written in field-number order and proto3 defaults (a zero step) are left out, as
// protobuf's own serialiser does, so the bytes equal those of TensorBoard's Python classes.

#include <distribute/detail/protobuf.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace distribute::summary::detail {

using distribute::detail::protobuf::append_fixed;
using distribute::detail::protobuf::append_key;
using distribute::detail::protobuf::append_varint;
using distribute::detail::protobuf::message;
using distribute::detail::protobuf::wire;

inline constexpr std::int64_t dt_string = 7;
inline constexpr std::string_view file_version = "brain.Event:2";

// Summary.Value messages.
inline message scalar_value(std::string_view tag, float value) {
  message v;
  v.bytes(1, tag).float32(2, value);  // simple_value is in a oneof: written even when 0
  return v;
}

inline message image_value(std::string_view tag, int height, int width, int colorspace, std::string_view png) {
  message image;
  image.integer(1, height).integer(2, width).integer(3, colorspace).bytes(4, png);
  message v;
  v.bytes(1, tag).nested(4, image);
  return v;
}

// What the `text` plugin reads (tensorboard/plugins/text/summary_v2.py, text_pb): a scalar DT_STRING
// tensor, and metadata naming the plugin, whose content (TextPluginData{version = 0}) encodes empty.
inline message text_value(std::string_view tag, std::string_view text) {
  message tensor;
  tensor.integer(1, dt_string).nested(2, message{}).bytes(8, text);
  message plugin_data;
  plugin_data.bytes(1, "text");
  message metadata;
  metadata.nested(1, plugin_data);
  message v;
  v.bytes(1, tag).nested(8, tensor).nested(9, metadata);
  return v;
}

inline message summary_of(const message& value) {
  message s;
  s.nested(1, value);
  return s;
}

inline message event_header(double wall_time, std::int64_t step) {
  message e;
  if (std::bit_cast<std::uint64_t>(wall_time) != 0) e.float64(1, wall_time);
  if (step != 0) e.integer(2, step);
  return e;
}

inline std::string version_event(double wall_time) {
  message e = event_header(wall_time, 0);
  e.bytes(3, file_version);
  return std::move(e).encoded();
}

inline std::string summary_event(double wall_time, std::int64_t step, const message& value) {
  message e = event_header(wall_time, step);
  e.nested(5, summary_of(value));
  return std::move(e).encoded();
}

}  // namespace distribute::summary::detail
