#pragma once
// A lookup table (PyTorch's nn.Embedding, Keras's Embedding): row k of the weight
// [num_embeddings, embedding_dim] for index k. The input holds class indices as integral values of
// the layer's scalar type T in a tensor of any shape [*] of rank 1 to 3 (float holds every integer
// below 2^24 exactly, more than any vocabulary); the output is [*, embedding_dim]. An index that is
// negative, not below num_embeddings or not an integer is an error naming it and its position.
//
// The weight is drawn N(0, 1) from the seed, as PyTorch initialises it (not the N(0, 0.02) of the
// other layers); with `padding_idx` that row starts at zero and gets no gradient (PyTorch's). State
// dict name: "weight". Indices have no gradient: backward returns zeros of the input's shape (so a
// tape or a sequential can route it; no_input_gradient returns nothing), and adds dy's rows to the
// weight rows the indices picked.
//
// The weight gradient is a scatter-add (several examples may pick one row). It runs as a gather
// (kernels::embedding_row_gradient): the examples are grouped by the row they picked on the host
// (the forward brings the indices there to check them), and each element of a used row adds the
// gradients of its examples in example order. That is parallel over the used rows' elements, has no
// atomics, and has the same bits on every device and thread count, which atomic adds on a GPU would
// not (their order changes from run to run). A row that every example picks is summed by
// embedding_dim calls each walking the batch; for batches of token ids that is rare and short. The
// engine's segmented sums need segments of equal length, which a row's examples are not.

#include <distribute/nn/detail/embedding_kernels.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/nn/layer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::nn {

// Defaults: PyTorch's nn.Embedding(num_embeddings, embedding_dim) has no defaults for the sizes;
// here they are 1. padding_idx: none; a negative value counts from the end, as PyTorch's does.
struct embedding_options {
  std::int64_t num_embeddings = 1;
  std::int64_t embedding_dim = 1;
  std::optional<std::int64_t> padding_idx{};
};

namespace detail {
inline std::string describe(const embedding_options& o) {
  return "{num_embeddings " + std::to_string(o.num_embeddings) + ", embedding_dim " + std::to_string(o.embedding_dim) +
         (o.padding_idx ? ", padding_idx " + std::to_string(*o.padding_idx) : std::string()) + "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class embedding : public detail::optional_input_gradient<embedding<T, D>> {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    shape in_shape{};
    std::vector<std::int64_t> indices;  // on the host: the weight gradient's grouping is made there
  };
  static constexpr const char* layer_name = "embedding";

  embedding(embedding_options o, std::uint64_t seed, const D& device = {}) : o_{check(o)}, device_{device} {
    const shape s{o_.num_embeddings, o_.embedding_dim};
    std::vector<T> host(static_cast<std::size_t>(s.numel()));
    detail::fill_normal(std::span<T>(host), detail::sub_seed(seed, 0), 0.0, 1.0);
    if (const auto p = padding_row()) std::fill_n(host.begin() + *p * o_.embedding_dim, o_.embedding_dim, T(0));
    weight_.value = tensor_type::from_host(s, std::span<const T>(host), device);
    weight_.grad = tensor_type{s, device};
  }

  const embedding_options& options() const noexcept { return o_; }
  parameter<T, D>& weight() noexcept { return weight_; }

  // [*, embedding_dim] for indices of shape [*] (rank 1 to 3).
  shape output_shape(const shape& in) const {
    if (in.rank() < 1 || in.rank() > 3)
      throw std::invalid_argument("distribute: embedding " + detail::describe(o_) + " got indices of shape " +
                                  in.to_string() + "; it takes [N], [N, L] or [N, L, K] (the output adds a dimension)");
    switch (in.rank()) {
      case 1: return shape{in[0], o_.embedding_dim};
      case 2: return shape{in[0], in[1], o_.embedding_dim};
      default: return shape{in[0], in[1], in[2], o_.embedding_dim};
    }
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    const shape out = output_shape(x.shape());
    std::vector<T> values(x.size());
    if (!values.empty()) e.to_host(x.data(), values.size(), values.data());
    s.indices.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) s.indices[i] = checked_index(values[i], i, x.shape());
    s.in_shape = x.shape();
    tensor_type y{out, device_, uninitialized};
    e.for_each(out.numel(),
               detail::kernels::embedding_gather<T>{x.data(), weight_.value.data(), y.data(), o_.embedding_dim});
    kept_.stamp(s, this);
    return y;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    weight_.visit(f);
  }
  void zero_grad() { weight_.zero_grad(); }
  void set_training(bool) {}
  template <class S>
  void name_state(S& s) {
    s.parameter("weight", weight_);
  }
  // ONNX: Gather of the weight's rows at the indices cast to int64.
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    const auto cast = g.node("Cast", {x.name}, x.shape, {{"to", std::int64_t{7}}});  // INT64
    return g.node("Gather", {g.initializer("weight", weight_.value), cast.name}, output_shape(x.shape),
                  {{"axis", std::int64_t{0}}});
  }

  // The backward recorded on a tape (nn::create_graph): indices have no gradient, recorded or not.
  // (A gradient that reaches the embedding's output flows on into its weight by backward.)
  template <class Tape>
  typename Tape::variable recorded_backward(Tape&, state_type&, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable, bool) {
    return {};
  }

 private:
  friend class detail::optional_input_gradient<embedding>;
  template <class R>
  tensor_type backward_pass(R& r, state_type& s, const tensor_type& dy, bool input_gradient) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const shape out = output_shape(s.in_shape);
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: embedding " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + out.to_string());
    // The examples grouped by row (a stable sort: example order within a row), the padding row left out.
    std::vector<std::int64_t> order(s.indices.size());
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return s.indices[static_cast<std::size_t>(a)] < s.indices[static_cast<std::size_t>(b)];
    });
    const auto pad = padding_row();
    std::vector<std::int64_t> rows, offsets, examples;
    examples.reserve(order.size());
    for (const std::int64_t i : order) {
      const std::int64_t k = s.indices[static_cast<std::size_t>(i)];
      if (pad && k == *pad) continue;
      if (rows.empty() || rows.back() != k) {
        rows.push_back(k);
        offsets.push_back(static_cast<std::int64_t>(examples.size()));
      }
      examples.push_back(i);
    }
    offsets.push_back(static_cast<std::int64_t>(examples.size()));
    if (!rows.empty()) {
      const auto rows_d = on_device(rows), offsets_d = on_device(offsets), examples_d = on_device(examples);
      e.for_each(static_cast<std::int64_t>(rows.size()) * o_.embedding_dim,
                 detail::kernels::embedding_row_gradient<T>{dy.data(), rows_d.data(), offsets_d.data(),
                                                            examples_d.data(), weight_.grad.data(), o_.embedding_dim});
    }
    if (!input_gradient) return tensor_type{};
    return tensor_type{s.in_shape, device_};
  }

  tensor<std::int64_t, D> on_device(const std::vector<std::int64_t>& v) const {
    return tensor<std::int64_t, D>::from_host(shape{static_cast<std::int64_t>(v.size())},
                                              std::span<const std::int64_t>(v), device_);
  }

  std::int64_t checked_index(T v, std::size_t position, const shape& in) const {
    const double d = static_cast<double>(v);
    if (!(d >= 0 && d < static_cast<double>(o_.num_embeddings)) || std::floor(d) != d)
      throw std::invalid_argument(
          "distribute: embedding " + detail::describe(o_) + ": index " + detail::short_number(d) + " at position " +
          std::to_string(position) + " of the indices of shape " + in.to_string() + " is " +
          (std::floor(d) != d && std::isfinite(d) ? "not an integer"
                                                  : "outside [0, " + std::to_string(o_.num_embeddings) + ")"));
    return static_cast<std::int64_t>(d);
  }

  std::optional<std::int64_t> padding_row() const {
    if (!o_.padding_idx) return std::nullopt;
    return *o_.padding_idx < 0 ? *o_.padding_idx + o_.num_embeddings : *o_.padding_idx;
  }

  static embedding_options check(embedding_options o) {
    const detail::option_check c("embedding", detail::describe(o));
    const embedding_options defaults;
    c.at_least("num_embeddings", o.num_embeddings, defaults.num_embeddings, 1);
    c.at_least("embedding_dim", o.embedding_dim, defaults.embedding_dim, 1);
    if (o.padding_idx)
      // (padding_idx has no default value: the fallback given never equals it)
      c.require(*o.padding_idx >= -o.num_embeddings && *o.padding_idx < o.num_embeddings, "padding_idx", *o.padding_idx,
                *o.padding_idx + 1, "must be in [-num_embeddings, num_embeddings)");
    return o;
  }

  embedding_options o_;
  D device_;
  parameter<T, D> weight_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
