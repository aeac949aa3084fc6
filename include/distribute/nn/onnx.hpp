#pragma once
// A model's inference graph as an ONNX file (opset 17), for onnxruntime, TensorRT and the rest:
//
//   nn::export_onnx(generator, shape::nchw(1, 3, 256, 256), "g_ab.onnx");
//
// The graph has one input "input" and one output "output"; their first extent is symbolic ("batch"),
// the others are those of `input_shape`. Weights are stored in the file. Normalisations take their
// inference form: batch norm normalises with its running statistics, instance norm with the
// statistics of each plane (as it always does); dropout is the identity.
//
// The library's layers map to ONNX operators: conv2d -> Conv (reflection padding: Pad(reflect) then
// Conv), conv_transpose2d -> ConvTranspose, instance_norm -> InstanceNormalization, batch_norm and
// sync_batch_norm -> BatchNormalization, relu / leaky_relu / tanh -> Relu / LeakyRelu / Tanh,
// linear -> Gemm, flatten -> Flatten, avg_pool2d -> AveragePool, residual_block -> its body and Add,
// sequential -> its layers in order. A layer of the user's gives its graph with a member
//
//   template <class G> typename G::value to_onnx(G& g, const typename G::value& x) {
//     return g.add(x, g.layer(body_, x));     // g.layer(sub_layer, x), g.add(a, b), g.node(...)
//   }
//
// and a layer with neither is an error naming it and its place in the model (interop_error).
//
// The encoding is the library's own (detail/protobuf.hpp, shared with the TensorBoard writer) rather
// than libonnx/libprotobuf: an exported model is a few messages written once, and a program that
// exports one then needs no protobuf runtime, no generated code, and no version of it to match.

#include <distribute/checkpoint/atomic_write.hpp>
#include <distribute/nn/activations.hpp>
#include <distribute/nn/batch_norm.hpp>
#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/conv_transpose2d.hpp>
#include <distribute/nn/detail/host_copy.hpp>
#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/detail/model_wrapper.hpp>
#include <distribute/nn/detail/onnx_proto.hpp>
#include <distribute/nn/dropout.hpp>
#include <distribute/nn/flatten.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/interop_error.hpp>
#include <distribute/nn/linear.hpp>
#include <distribute/nn/pooling.hpp>
#include <distribute/nn/residual_block.hpp>
#include <distribute/nn/sequential.hpp>
#include <distribute/tensor/shape.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace distribute::nn {

// A value of the graph being built: its name in the graph and its shape (with the batch extent of
// the shape given to export_onnx).
struct onnx_value {
  std::string name;
  distribute::shape shape;
};

// The graph being built, in element type T.
template <class T>
class onnx_graph {
 public:
  using attribute = detail::onnx::attribute;
  using value = onnx_value;

  // A node of `op` on `inputs` with one output, of shape `out`.
  onnx_value node(std::string_view op, std::vector<std::string> inputs, distribute::shape out,
                  std::vector<attribute> attributes = {}, std::string output = {}) {
    const std::string id = "n" + std::to_string(nodes_) + "_" + std::string(op);
    ++nodes_;
    if (output.empty()) output = id + "_out";
    graph_.nested(1, detail::onnx::node_proto(op, inputs, {output}, id, attributes));
    return {std::move(output), out};
  }
  // A constant of the graph (a weight); returns its name.
  template <class U>
  std::string initializer(std::string_view hint, std::vector<std::int64_t> dims, std::span<const U> values) {
    std::string name = place_ + std::string(hint);
    if (place_.empty()) name = "c" + std::to_string(constants_) + "." + std::string(hint);
    ++constants_;
    name = unique(std::move(name));
    initializers_.nested(5, detail::onnx::tensor_proto<U>(name, dims, values));
    return name;
  }
  template <class D>
  std::string initializer(std::string_view hint, const tensor<T, D>& t) {
    std::vector<std::int64_t> dims;
    for (std::size_t i = 0; i < t.shape().rank(); ++i) dims.push_back(t.shape()[i]);
    const auto host = detail::host_copy(t);
    return initializer<T>(hint, std::move(dims), std::span<const T>(host));
  }
  std::string constant_per_channel(std::string_view hint, std::int64_t channels, double value) {
    const std::vector<T> v(static_cast<std::size_t>(channels), static_cast<T>(value));
    return initializer<T>(hint, {channels}, std::span<const T>(v));
  }

  // `layer`'s part of the graph, applied to x.
  template <class L>
  onnx_value layer(L& l, const onnx_value& x);
  // Under the name of `child` (a position in a sequential, a member): weights are named "<path>.weight".
  template <class L>
  onnx_value layer(L& l, const onnx_value& x, std::string_view child) {
    const std::string outer = place_;
    place_ += std::string(child) + ".";
    auto y = layer(l, x);
    place_ = outer;
    return y;
  }
  onnx_value add(const onnx_value& a, const onnx_value& b) { return node("Add", {a.name, b.name}, a.shape); }

  // For errors: where in the model the layer being exported is.
  const std::string& place() const noexcept { return place_; }

  const detail::onnx::message& nodes() const noexcept { return graph_; }
  const std::string& initializer_fields() const noexcept { return initializers_.encoded(); }

 private:
  std::string unique(std::string name) {
    for (const auto& n : names_)
      if (n == name) return unique(name + "_");
    names_.push_back(name);
    return name;
  }

  detail::onnx::message graph_;         // the nodes (field 1), in order
  detail::onnx::message initializers_;  // the initializers (field 5)
  std::vector<std::string> names_;
  std::string place_;
  std::size_t nodes_ = 0, constants_ = 0;
};

namespace detail {

inline std::vector<std::int64_t> dims_of(const distribute::shape& s) {
  std::vector<std::int64_t> d;
  for (std::size_t i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

template <class T, class D, class G>
onnx_value onnx_library_layer(conv2d<T, D>& l, G& g, const onnx_value& x) {
  const auto& o = l.options();
  const auto out = l.output_shape(x.shape);
  std::vector<std::string> inputs{x.name, g.initializer("weight", l.weight().value)};
  if (!l.bias().value.empty()) inputs.push_back(g.initializer("bias", l.bias().value));
  std::int64_t pad = o.padding;
  if (o.pad_mode == padding_mode::reflect && o.padding > 0) {
    const std::vector<std::int64_t> pads{0, 0, o.padding, o.padding, 0, 0, o.padding, o.padding};
    const auto padded = shape::nchw(x.shape.n(), x.shape.c(), x.shape.h() + 2 * o.padding, x.shape.w() + 2 * o.padding);
    inputs[0] =
        g.node("Pad", {x.name, g.template initializer<std::int64_t>("pads", {8}, std::span<const std::int64_t>(pads))},
               padded, {{"mode", std::string("reflect")}})
            .name;
    pad = 0;
  }
  return g.node("Conv", std::move(inputs), out,
                {{"kernel_shape", std::vector<std::int64_t>{o.kernel, o.kernel}},
                 {"pads", std::vector<std::int64_t>{pad, pad, pad, pad}},
                 {"strides", std::vector<std::int64_t>{o.stride, o.stride}}});
}

template <class T, class D, class G>
onnx_value onnx_library_layer(conv_transpose2d<T, D>& l, G& g, const onnx_value& x) {
  const auto& o = l.options();
  const auto out = l.output_shape(x.shape);
  std::vector<std::string> inputs{x.name, g.initializer("weight", l.weight().value)};
  if (!l.bias().value.empty()) inputs.push_back(g.initializer("bias", l.bias().value));
  return g.node("ConvTranspose", std::move(inputs), out,
                {{"kernel_shape", std::vector<std::int64_t>{o.kernel, o.kernel}},
                 {"output_padding", std::vector<std::int64_t>{o.output_padding, o.output_padding}},
                 {"pads", std::vector<std::int64_t>{o.padding, o.padding, o.padding, o.padding}},
                 {"strides", std::vector<std::int64_t>{o.stride, o.stride}}});
}

template <class T, class D, class G>
onnx_value onnx_library_layer(instance_norm<T, D>& l, G& g, const onnx_value& x) {
  const auto& o = l.options();
  const std::string scale =
      o.affine ? g.initializer("weight", l.gamma().value) : g.constant_per_channel("ones", o.channels, 1.0);
  const std::string bias =
      o.affine ? g.initializer("bias", l.beta().value) : g.constant_per_channel("zeros", o.channels, 0.0);
  return g.node("InstanceNormalization", {x.name, scale, bias}, x.shape, {{"epsilon", static_cast<float>(o.eps)}});
}

template <class T, class D, bool Sync, class G>
onnx_value onnx_library_layer(basic_batch_norm<T, D, Sync>& l, G& g, const onnx_value& x) {
  const auto& o = l.options();
  const std::vector<T> mean(l.running_mean().begin(), l.running_mean().end()),
      var(l.running_var().begin(), l.running_var().end());
  const std::int64_t c = o.channels;
  std::vector<std::string> inputs{x.name, g.initializer("weight", l.gamma().value),
                                  g.initializer("bias", l.beta().value),
                                  g.template initializer<T>("running_mean", {c}, std::span<const T>(mean)),
                                  g.template initializer<T>("running_var", {c}, std::span<const T>(var))};
  return g.node("BatchNormalization", std::move(inputs), x.shape, {{"epsilon", static_cast<float>(o.eps)}});
}

template <class T, class D, class G>
onnx_value onnx_library_layer(relu<T, D>&, G& g, const onnx_value& x) {
  return g.node("Relu", {x.name}, x.shape);
}
template <class T, class D, class G>
onnx_value onnx_library_layer(leaky_relu<T, D>& l, G& g, const onnx_value& x) {
  return g.node("LeakyRelu", {x.name}, x.shape, {{"alpha", static_cast<float>(l.negative_slope())}});
}
template <class T, class D, class G>
onnx_value onnx_library_layer(nn::tanh<T, D>&, G& g, const onnx_value& x) {
  return g.node("Tanh", {x.name}, x.shape);
}
template <class T, class D, class G>
onnx_value onnx_library_layer(dropout<T, D>&, G&, const onnx_value& x) {
  return x;
}

template <class T, class D, class G>
onnx_value onnx_library_layer(linear<T, D>& l, G& g, const onnx_value& x) {
  const auto out = l.output_shape(x.shape);
  std::vector<std::string> inputs{x.name, g.initializer("weight", l.weight().value)};
  if (!l.bias().value.empty()) inputs.push_back(g.initializer("bias", l.bias().value));
  return g.node("Gemm", std::move(inputs), out, {{"transB", std::int64_t{1}}});
}
template <class T, class D, class G>
onnx_value onnx_library_layer(flatten<T, D>& l, G& g, const onnx_value& x) {
  return g.node("Flatten", {x.name}, l.output_shape(x.shape), {{"axis", std::int64_t{1}}});
}
template <class T, class D, class G>
onnx_value onnx_library_layer(avg_pool2d<T, D>& l, G& g, const onnx_value& x) {
  const std::int64_t k = l.options().kernel, s = l.stride();
  return g.node("AveragePool", {x.name}, l.output_shape(x.shape),
                {{"kernel_shape", std::vector<std::int64_t>{k, k}}, {"strides", std::vector<std::int64_t>{s, s}}});
}

template <class... Layers, class G>
onnx_value onnx_library_layer(sequential<Layers...>& l, G& g, const onnx_value& x) {
  onnx_value y = x;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((y = g.layer(l.template get<I>(), y, std::to_string(I))), ...);
  }(std::index_sequence_for<Layers...>{});
  return y;
}
template <class T, class D, class G>
onnx_value onnx_library_layer(residual_block<T, D>& l, G& g, const onnx_value& x) {
  return g.add(x, g.layer(l.body(), x, "body"));
}
template <class M, class G>
onnx_value onnx_library_layer(model_wrapper<M>& l, G& g, const onnx_value& x) {
  return g.layer(l.model(), x);
}

}  // namespace detail

template <class T>
template <class L>
onnx_value onnx_graph<T>::layer(L& l, const onnx_value& x) {
  if constexpr (requires { l.to_onnx(*this, x); }) {
    return l.to_onnx(*this, x);
  } else if constexpr (requires { detail::onnx_library_layer(l, *this, x); }) {
    try {
      return detail::onnx_library_layer(l, *this, x);
    } catch (const std::invalid_argument& e) {  // a shape the layer refuses, from its output_shape
      throw interop_error("distribute: ONNX export of layer " + detail::layer_name<L>() +
                          (place_.empty() ? "" : " at '" + place_.substr(0, place_.size() - 1) + "'") + ": " +
                          e.what());
    }
  } else {
    throw interop_error("distribute: ONNX export: layer " + detail::layer_name<L>() +
                        (place_.empty() ? "" : " at '" + place_.substr(0, place_.size() - 1) + "'") +
                        " has no ONNX form; give it a member `template <class G> typename G::value to_onnx(G& g, const "
                        "typename G::value& x)` "
                        "(nn/onnx.hpp)");
  }
}

// The ONNX model's bytes (export_onnx writes them).
template <class M>
std::string onnx_bytes(M& model, const distribute::shape& input_shape) {
  using T = typename M::scalar_type;
  onnx_graph<T> g;
  const onnx_value input{"input", input_shape};
  const onnx_value y = g.layer(model, input);
  const onnx_value out = g.node("Identity", {y.name}, y.shape, {}, "output");
  // A message's encoding is the concatenation of its fields, so the graph (nodes, name, initializers,
  // input, output, in field order) and the model around it are joined from parts: the weights are
  // copied, never encoded again.
  detail::onnx::message graph = g.nodes();
  graph.bytes(2, "distribute");
  std::string encoded = std::move(graph).encoded();
  encoded += g.initializer_fields();
  const auto type = detail::onnx::elem_of<T>();
  const auto in_dims = detail::dims_of(input_shape), out_dims = detail::dims_of(out.shape);
  detail::onnx::message io;
  io.nested(11, detail::onnx::value_info("input", type, in_dims));
  io.nested(12, detail::onnx::value_info(out.name, type, out_dims));
  encoded += io.encoded();
  detail::onnx::message whole;
  whole.bytes(7, encoded);  // ModelProto.graph
  detail::onnx::message opset_import;
  opset_import.bytes(1, "").integer(2, detail::onnx::opset);
  detail::onnx::message head;
  head.integer(1, detail::onnx::ir_version).bytes(2, "distribute");
  std::string model_bytes = head.encoded();
  model_bytes += whole.encoded();
  detail::onnx::message tail;
  tail.nested(8, opset_import);
  model_bytes += tail.encoded();
  return model_bytes;
}

// Writes `model`'s inference graph for inputs of `input_shape` to `path`, atomically. Throws
// interop_error for a layer without an ONNX form (naming it), or one that refuses `input_shape`.
template <class M>
void export_onnx(M& model, const distribute::shape& input_shape, const std::filesystem::path& path) {
  const std::string bytes = onnx_bytes(model, input_shape);
  checkpoint::write_atomically(path, std::string_view(bytes));
}

}  // namespace distribute::nn
