#pragma once
// The compile-time check of `strategy.run(fn, args...)`: fn is called as fn(replica, args...) with
// per-replica and mirrored arguments unwrapped to one replica's element. When it cannot be, one
// static_assert says so, and the type it is raised in names the positions of run's arguments that do
// not fit (counted from 1 after fn): those whose type fn's parameter at that place does not take,
// where fn's parameters can be read (a lambda whose parameters are not `auto`, a function), or two
// arguments that fit when swapped, otherwise. Without it, a wrong order shows as pages of
// invoke_result errors.

#include <distribute/per_replica.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace distribute::detail {

// What strategy.run's error names: the positions of run's arguments (1 = the first after fn) that fn
// cannot take where they are, fn's parameter count where it is known (0 otherwise), and run's
// argument count.
template <std::size_t... Positions>
struct run_arguments_at {};

template <class Positions, std::size_t FnParameters, std::size_t RunArguments>
struct strategy_run_cannot_call_fn {
  static_assert(
      sizeof(Positions) == 0,
      "distribute: strategy.run(fn, args...) calls fn(replica, args...), in that order, with each per_replica "
      "or mirrored argument unwrapped to the replica's own element, and fn cannot be called so: the positions "
      "in run_arguments_at<...> above (1 = run's first argument after fn) do not fit fn's parameters there; "
      "the numbers after it are fn's parameter count (replica included; 0: not known, fn is generic) and "
      "run's argument count. Check their order and count.");
};

template <class A>
using unwrapped_t = decltype(unwrap_for(std::declval<A&>(), std::size_t{0}));

// fn's parameters, where they can be read.
template <class F>
struct call_parameters {
  static constexpr bool known = false;
};
template <class F>
  requires requires { &F::operator(); }
struct call_parameters<F> : call_parameters<decltype(&F::operator())> {};
#define DISTRIBUTE_CALL_PARAMETERS(QUALIFIERS)          \
  template <class C, class Ret, class... P>             \
  struct call_parameters<Ret (C::*)(P...) QUALIFIERS> { \
    static constexpr bool known = true;                 \
    using type = std::tuple<P...>;                      \
  };
DISTRIBUTE_CALL_PARAMETERS()
DISTRIBUTE_CALL_PARAMETERS(const)
DISTRIBUTE_CALL_PARAMETERS(noexcept)
DISTRIBUTE_CALL_PARAMETERS(const noexcept)
DISTRIBUTE_CALL_PARAMETERS(&)
DISTRIBUTE_CALL_PARAMETERS(const&)
#undef DISTRIBUTE_CALL_PARAMETERS
template <class Ret, class... P>
struct call_parameters<Ret (*)(P...)> {
  static constexpr bool known = true;
  using type = std::tuple<P...>;
};
template <class Ret, class... P>
struct call_parameters<Ret(P...)> : call_parameters<Ret (*)(P...)> {};

template <std::size_t N>
struct position_list {
  std::array<std::size_t, N + 1> at{};
  std::size_t size = 0;
};

// Read parameters: each argument whose type the parameter at its place does not take.
template <class Params, class Args, std::size_t... I>
constexpr auto unfit_positions(std::index_sequence<I...>) {
  position_list<sizeof...(I)> out;
  constexpr std::size_t n = std::tuple_size_v<Params>;
  (
      [&] {
        if constexpr (I + 1 < n) {
          if (!std::is_convertible_v<std::tuple_element_t<I, Args>, std::tuple_element_t<I + 1, Params>>)
            out.at[out.size++] = I + 1;
        } else {
          out.at[out.size++] = I + 1;  // no parameter there
        }
      }(),
      ...);
  return out;
}

// Generic fn: two arguments that fit when swapped.
template <class F, class Replica, class Args, std::size_t I, std::size_t J, std::size_t... K>
constexpr bool fits_swapped(std::index_sequence<K...>) {
  return std::is_invocable_v<F&, Replica&, std::tuple_element_t<(K == I ? J : (K == J ? I : K)), Args>...>;
}
template <class F, class Replica, class Args>
constexpr auto swapped_positions() {
  constexpr std::size_t n = std::tuple_size_v<Args>;
  position_list<n> out;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          constexpr std::size_t i = I / (n ? n : 1), j = I % (n ? n : 1);
          if constexpr (i < j) {
            if (out.size == 0 && fits_swapped<F, Replica, Args, i, j>(std::make_index_sequence<n>{})) {
              out.at[out.size++] = i + 1;
              out.at[out.size++] = j + 1;
            }
          }
        }(),
        ...);
  }(std::make_index_sequence<n * n>{});
  return out;
}

template <auto List, std::size_t... I>
run_arguments_at<List.at[I]...> as_positions(std::index_sequence<I...>);

// Raises the error for fn, a replica type and run's argument types; returns nothing.
template <class F, class Replica, class... A>
void report_run_call() {
  using args = std::tuple<unwrapped_t<A>...>;
  using fn = std::remove_cvref_t<F>;
  if constexpr (call_parameters<fn>::known) {
    using params = typename call_parameters<fn>::type;
    constexpr auto list = unfit_positions<params, args>(std::index_sequence_for<A...>{});
    using positions = decltype(as_positions<list>(std::make_index_sequence<list.size>{}));
    (void)sizeof(strategy_run_cannot_call_fn<positions, std::tuple_size_v<params>, sizeof...(A)>);
  } else {
    constexpr auto list = swapped_positions<fn, Replica, args>();
    using positions = decltype(as_positions<list>(std::make_index_sequence<list.size>{}));
    (void)sizeof(strategy_run_cannot_call_fn<positions, 0, sizeof...(A)>);
  }
}

// Whether strategy.run can call fn(replica, args...).
template <class F, class Replica, class... A>
concept run_callable = std::is_invocable_v<F&, Replica&, unwrapped_t<A>...>;

}  // namespace distribute::detail
