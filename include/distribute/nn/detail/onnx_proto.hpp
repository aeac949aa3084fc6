#pragma once
// The ONNX messages an exported model needs, encoded with the library's own protobuf writer. Field
// numbers are those of onnx/onnx.proto:
//
//   ModelProto          ir_version = 1, producer_name = 2, producer_version = 3, graph = 7,
//                       opset_import = 8 (OperatorSetIdProto{domain = 1, version = 2})
//   GraphProto          node = 1, name = 2, initializer = 5, input = 11, output = 12
//   NodeProto           input = 1, output = 2, name = 3, op_type = 4, attribute = 5
//   AttributeProto      name = 1, f = 2, i = 3, s = 4, ints = 8, type = 20 (FLOAT 1, INT 2, STRING 3, INTS 7)
//   TensorProto         dims = 1, data_type = 2 (FLOAT 1, INT64 7, DOUBLE 11), name = 8, raw_data = 9
//   ValueInfoProto      name = 1, type = 2 (TypeProto{tensor_type = 1: {elem_type = 1, shape = 2}})
//   TensorShapeProto    dim = 1 (Dimension{dim_value = 1, dim_param = 2})
//
// raw_data is little-endian, as ONNX defines it.

#include <distribute/detail/protobuf.hpp>

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace distribute::nn::detail::onnx {

static_assert(std::endian::native == std::endian::little,
              "distribute: ONNX raw_data is little-endian; this writer copies bytes as they are");

using distribute::detail::protobuf::message;

inline constexpr std::int64_t ir_version = 8;  // the IR of opset 17
inline constexpr std::int64_t opset = 17;

enum class elem : std::int32_t { float32 = 1, int64 = 7, float64 = 11 };

template <class T>
constexpr elem elem_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>,
                "distribute: ONNX export writes float, double and int64 tensors");
  if constexpr (std::is_same_v<T, float>) return elem::float32;
  else if constexpr (std::is_same_v<T, double>) return elem::float64;
  else return elem::int64;
}

template <class T>
message tensor_proto(std::string_view name, std::span<const std::int64_t> dims, std::span<const T> values) {
  message t;
  for (const auto d : dims) t.integer(1, d);
  t.integer(2, static_cast<std::int64_t>(elem_of<T>()));
  t.bytes(8, name);
  const auto raw = std::as_bytes(values);
  t.bytes(9, std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
  return t;
}

// An attribute: one float, one integer, a string or a list of integers.
struct attribute {
  std::string name;
  std::variant<float, std::int64_t, std::string, std::vector<std::int64_t>> value;
};

inline message attribute_proto(const attribute& a) {
  message m;
  m.bytes(1, a.name);
  if (const auto* f = std::get_if<float>(&a.value)) {
    m.float32(2, *f).integer(20, 1);
  } else if (const auto* i = std::get_if<std::int64_t>(&a.value)) {
    m.integer(3, *i).integer(20, 2);
  } else if (const auto* s = std::get_if<std::string>(&a.value)) {
    m.bytes(4, *s).integer(20, 3);
  } else {
    for (const auto v : std::get<std::vector<std::int64_t>>(a.value)) m.integer(8, v);
    m.integer(20, 7);
  }
  return m;
}

inline message node_proto(std::string_view op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, std::string_view name,
                          const std::vector<attribute>& attributes) {
  message n;
  for (const auto& i : inputs) n.bytes(1, i);
  for (const auto& o : outputs) n.bytes(2, o);
  n.bytes(3, name).bytes(4, op);
  for (const auto& a : attributes) n.nested(5, attribute_proto(a));
  return n;
}

// A graph input or output: a tensor of `elem` whose first extent is the symbolic batch size.
inline message value_info(std::string_view name, elem type, std::span<const std::int64_t> dims) {
  message shape;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    message d;
    if (i == 0) d.bytes(2, "batch");
    else d.integer(1, dims[i]);
    shape.nested(1, d);
  }
  message tensor_type;
  tensor_type.integer(1, static_cast<std::int64_t>(type)).nested(2, shape);
  message type_proto;
  type_proto.nested(1, tensor_type);
  message v;
  v.bytes(1, name).nested(2, type_proto);
  return v;
}

}  // namespace distribute::nn::detail::onnx
