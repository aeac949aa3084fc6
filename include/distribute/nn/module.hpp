#pragma once
// A model whose members are named once, as a PyTorch module's attributes are:
//
//   struct generator : nn::module<generator> {
//     nn::linear<> embed{...}, dense{...};
//     nn::sequential<...> up{...};
//     auto members() { return nn::members("embed", embed, "dense", dense, "up", up); }
//     // forward/backward, or operator()(tape&, x), written by the user
//   };
//
// From `members()` alone the model has what the library asks of a model: `for_each_parameter` and
// `for_each_buffer` (members in the order listed: the order the gradients are bucketed in, the
// optimisers' state is kept in and checkpoints are written in), `zero_grad`, `set_training`,
// `name_state` (state-dict names "embed.weight", "up.0.bias", ...: the names of a PyTorch module
// with attributes of the same names, so safetensors files and ONNX weights carry them),
// `state_digest` (for strategy.verify_mirrored), and `scalar_type`/`device_type`. So it is
// `nn::parameterized`, and the optimisers, `all_reduce_gradients`, gradient overlaps, mirror,
// broadcast, verify_mirrored, checkpoints, safetensors and the tape take it as they take a
// sequential. A member may be a layer, a model (with members() of its own: names nest), or a range
// of them (std::vector<block>, named "blocks.0", "blocks.1", ..., as an nn.ModuleList).
//
// Why a base class rather than a concept the walkers detect: the walkers call members
// (`m.for_each_parameter(f)`, `typename M::scalar_type`) in seven modules, among them concepts/,
// comm/, strategy/ and checkpoint/, which lie below nn/ and may not know what nn means by members();
// user code calls `g.zero_grad()` and `g.set_training(false)` as members (PyTorch's `g.zero_grad()`,
// `g.train(False)`); and a model is itself a member of other models. The base gives the user's type
// those members, so every walker and container works unchanged, as with a PyTorch `nn.Module`
// subclass.
//
// `module<Self, T = float, D = cpu>`: T and D are the members' scalar type and device (checked); a
// template over the device writes `nn::module<generator<D>, float, D>`. A model whose members sit
// directly in an enclosing sequential in PyTorch (a conv-norm-activation stage written as one type)
// declares `static constexpr bool unpacks_into_sequential = true;` (nn/state_dict.hpp): its members
// then take the enclosing sequential's next positions. In `to_onnx`, `onnx_member(g, m, x)` exports
// member m under its name. A type's own member function of the same name (its own set_training,
// say) hides the base's.

#include <distribute/concepts/device.hpp>
#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::nn {

// One named member of a model: what nn::members makes of a ("name", member) pair.
template <class L>
struct named_member {
  std::string_view name;
  L& value;
};

namespace detail {

// What a member is: a layer or a model (its parameters, zero_grad, set_training) ...
template <class L>
concept member_model = gradient_enumerable<L> && requires(L& l) {
  l.zero_grad();
  l.set_training(true);
};
// ... or a range of them (an nn.ModuleList).
template <class L>
concept member_range = !member_model<L> && std::ranges::forward_range<L> && member_model<std::ranges::range_value_t<L>>;

template <class L>
concept has_members = requires(L& l) { l.members(); };

// The model type a member holds: itself, or its elements.
template <class L>
struct member_element {
  using type = L;
};
template <member_range L>
struct member_element<L> {
  using type = std::ranges::range_value_t<L>;
};

// f(element) for the member itself, or for each element of a range.
template <class L, class F>
void each_element(L& m, F&& f) {
  if constexpr (member_range<L>) {
    for (auto& e : m) f(e);
  } else {
    f(m);
  }
}

}  // namespace detail

// The members of a model, as `members("embed", embed, "dense", dense, ...)`: names (string literals,
// or anything a std::string_view is made from) and members (lvalues: the model's own), in pairs. A
// tuple of named_member; members() makes a new one at every call, so a copied model refers to its own.
template <class... A>
auto members(A&&... args) {
  static_assert(
      sizeof...(A) % 2 == 0,
      "distribute: nn::members takes names and members in pairs: members(\"embed\", embed, \"dense\", dense)");
  using types = std::tuple<A...>;
  auto all = std::forward_as_tuple(std::forward<A>(args)...);
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    static_assert((std::is_convertible_v<std::tuple_element_t<2 * I, types>, std::string_view> && ...),
                  "distribute: nn::members: every first of a pair is a name (a string)");
    static_assert((std::is_lvalue_reference_v<std::tuple_element_t<2 * I + 1, types>> && ...),
                  "distribute: nn::members: every second of a pair is a member of the model (an lvalue), not a "
                  "temporary");
    static_assert(((detail::member_model<std::remove_reference_t<std::tuple_element_t<2 * I + 1, types>>> ||
                    detail::member_range<std::remove_reference_t<std::tuple_element_t<2 * I + 1, types>>>) &&
                   ...),
                  "distribute: nn::members: a member must be a layer or a model (scalar_type, for_each_parameter, "
                  "zero_grad, set_training), or a range of them");
    return std::tuple{named_member<std::remove_reference_t<std::tuple_element_t<2 * I + 1, types>>>{
        std::string_view(std::get<2 * I>(all)), std::get<2 * I + 1>(all)}...};
  }(std::make_index_sequence<sizeof...(A) / 2>{});
}

// The base of a model that names its members once (above). Self is the model, which has a public
// `members()` returning nn::members(...).
template <class Self, class T = float, device D = cpu>
class module {
 public:
  using scalar_type = T;
  using device_type = D;

  template <class F>
  void for_each_parameter(F&& f) {
    each([&](std::string_view, auto& m) { m.for_each_parameter(f); });
  }
  // Non-trainable state (running statistics) of the members that have any, in member order.
  template <class F>
  void for_each_buffer(F&& f) {
    each([&](std::string_view, auto& m) {
      if constexpr (requires { m.for_each_buffer(f); }) m.for_each_buffer(f);
    });
  }
  void zero_grad() {
    each([](std::string_view, auto& m) { m.zero_grad(); });
  }
  void set_training(bool on) {
    each([on](std::string_view, auto& m) { m.set_training(on); });
  }

  // State-dict names (nn/state_dict.hpp): "<member>.<its names>", "<member>.<i>.<its names>" for a
  // range; the enclosing sequential's positions where Self unpacks into it.
  template <class S>
  void name_state(S& s) {
    check_members();
    constexpr bool unpacks = requires { requires Self::unpacks_into_sequential; };
    for_each_member([&](std::string_view name, auto& m) {
      using L = std::remove_reference_t<decltype(m)>;
      if constexpr (unpacks) {
        detail::each_element(m, [&](auto& e) { s.next(e); });
      } else if constexpr (detail::member_range<L>) {
        std::size_t i = 0;
        for (auto& e : m) s.child(std::string(name) + "." + std::to_string(i++), e);
      } else {
        s.child(name, m);
      }
    });
  }

  // For strategy.verify_mirrored: the bits of the parameters and of the buffers (const in effect;
  // enumeration is non-const).
  std::uint64_t state_digest() const { return distribute::detail::digest_model(mutable_self()).state(); }

  // The name of member `m` ("dense", or "blocks.2" for an element of a range); an
  // std::invalid_argument if `m` is not one of members().
  template <class L>
  std::string member_name(const L& m) const {
    std::string found;
    mutable_self_members([&](std::string_view name, auto& member) {
      using M = std::remove_cvref_t<decltype(member)>;
      if (!found.empty()) return;
      if constexpr (std::is_same_v<M, L>) {
        if (&member == &m) found = std::string(name);
      } else if constexpr (detail::member_range<M>) {
        if constexpr (std::is_same_v<std::ranges::range_value_t<M>, L>) {
          std::size_t i = 0;
          for (auto& e : member) {
            if (&e == &m) {
              found = std::string(name) + "." + std::to_string(i);
              break;
            }
            ++i;
          }
        }
      }
    });
    if (found.empty())
      throw std::invalid_argument("distribute: " + detail::layer_name<Self>() + ": a " + detail::layer_name<L>() +
                                  " that is not one of its members() (list it there to name it)");
    return found;
  }

  // In a `to_onnx(G& g, x)`: member `m` applied to x, its weights named "<member>.weight" as in the
  // state dict.
  template <class G, class L>
  typename G::value onnx_member(G& g, L& m, const typename G::value& x) const {
    return g.layer(m, x, member_name(m));
  }

 private:
  Self& self() noexcept { return static_cast<Self&>(*this); }
  Self& mutable_self() const noexcept { return const_cast<Self&>(static_cast<const Self&>(*this)); }

  // f(name, member) for each named member, in order.
  template <class F>
  void for_each_member(F&& f) {
    static_assert(detail::has_members<Self>,
                  "distribute: a model deriving from nn::module<Self> needs a public `auto members()` returning "
                  "nn::members(\"name\", member, ...)");
    std::apply([&](auto... m) { (f(m.name, m.value), ...); }, self().members());
  }
  template <class F>
  void mutable_self_members(F&& f) const {
    const_cast<module&>(*this).for_each_member(f);
  }
  // f(name, model) for each member, and for each element of a range member; the members' types are
  // checked against T and D here, where Self is complete.
  template <class F>
  void each(F&& f) {
    for_each_member([&](std::string_view name, auto& m) {
      using E = typename detail::member_element<std::remove_reference_t<decltype(m)>>::type;
      static_assert(std::is_same_v<typename E::scalar_type, T>,
                    "distribute: a member of an nn::module<Self, T, D> computes in another scalar type than T");
      static_assert(std::is_same_v<layer_device_t<E>, D>,
                    "distribute: a member of an nn::module<Self, T, D> lives on another device than D");
      detail::each_element(m, [&](auto& e) { f(name, e); });
    });
  }
  // Names must be usable in a state dict: not empty, without '.', each once; each member listed once.
  void check_members() {
    std::vector<std::pair<std::string_view, const void*>> seen;
    for_each_member([&](std::string_view name, auto& m) {
      const std::string who = "distribute: " + detail::layer_name<Self>() + "::members(): ";
      if (name.empty() || name.find('.') != std::string_view::npos)
        throw std::invalid_argument(who + "the name '" + std::string(name) +
                                    "' is not a state-dict name (it must be non-empty, without '.')");
      for (const auto& [n, at] : seen) {
        if (n == name) throw std::invalid_argument(who + "two members are named '" + std::string(name) + "'");
        if (at == static_cast<const void*>(&m))
          throw std::invalid_argument(who + "'" + std::string(n) + "' and '" + std::string(name) +
                                      "' are the same member (its parameters would be enumerated twice)");
      }
      seen.emplace_back(name, static_cast<const void*>(&m));
    });
  }
};

}  // namespace distribute::nn
