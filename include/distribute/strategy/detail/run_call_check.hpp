#pragma once
// The compile-time checks of `strategy.run(fn, args...)`: fn is called as fn(replica, args...) with
// per-replica and mirrored arguments unwrapped to one replica's element.
//
// When fn cannot be called so, one static_assert says so, and the type it is raised in names the
// positions of run's arguments that do not fit (counted from 1 after fn): those whose type fn's
// parameter at that place does not take, where fn's parameters can be read (a lambda whose parameters
// are not `auto`, a function), or two arguments that fit when swapped, otherwise. An argument that
// fits but for being const gets its own error, which says so. Without them, a wrong order shows as
// pages of invoke_result errors.
//
// When fn can be called, one more rule: a mirrored argument is taken by reference. Taken by value,
// each replica would train a copy that is thrown away when fn returns, the mirrored state would never
// change, and verify_mirrored would still pass. fn's parameters are read where fn is a function, a
// lambda with typed parameters, or a generic lambda whose template arguments can be named from run's
// arguments without instantiating it for any other types (see find_specialization below); elsewhere a
// copy is not seen.

#include <distribute/per_replica.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
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

// The two errors of a single argument, one type per position of run's arguments (1 = the first
// after fn) up to 8, so that the message itself names it; beyond, the position is the number in the
// type above the message. The other template argument is the parameter's or the argument's type.
template <class T>
inline constexpr bool never_true = false;

#define DISTRIBUTE_RUN_BY_VALUE_ADVICE                                                                    \
  " by value (its type is the second name in the type above): each replica would update a copy that is "  \
  "thrown away when fn returns, so the mirrored state would never change (and verify_mirrored would not " \
  "notice). Take it by reference: T& (or auto&), or const T& if fn only reads it."
#define DISTRIBUTE_RUN_CONST_ADVICE                                                                        \
  ", and fn's parameter there is a non-const reference (the argument's type is the last name in the type " \
  "above). Take it as const& (const T& or const auto&), or pass a non-const argument."

template <std::size_t Position, class Parameter>
struct strategy_run_fn_takes_mirrored_by_value {
  static_assert(never_true<Parameter>,
                "distribute: strategy.run(fn, args...) or run_on_primary: fn takes the argument at the position "
                "named above (1 = run's first after fn), a mirrored value," DISTRIBUTE_RUN_BY_VALUE_ADVICE);
};

struct per_replica_input {};
struct mirrored_value {};
struct shared_value {};
template <class A>
using argument_kind =
    std::conditional_t<is_per_replica_v<std::remove_cvref_t<A>>, per_replica_input,
                       std::conditional_t<is_mirrored_v<std::remove_cvref_t<A>>, mirrored_value, shared_value>>;

template <std::size_t Position, class Kind, class Argument>
struct strategy_run_argument_is_const {
  static_assert(never_true<Argument>,
                "distribute: strategy.run(fn, args...): the argument at the position named above (1 = run's first "
                "after fn) is const" DISTRIBUTE_RUN_CONST_ADVICE);
};

#define DISTRIBUTE_RUN_ARGUMENT_ERRORS(N)                                                                     \
  template <class Parameter>                                                                                  \
  struct strategy_run_fn_takes_mirrored_by_value<N, Parameter> {                                              \
    static_assert(never_true<Parameter>,                                                                      \
                  "distribute: strategy.run(fn, args...) or run_on_primary: fn takes argument " #N            \
                  " (a mirrored value)" DISTRIBUTE_RUN_BY_VALUE_ADVICE);                                      \
  };                                                                                                          \
  template <class Argument>                                                                                   \
  struct strategy_run_argument_is_const<N, per_replica_input, Argument> {                                     \
    static_assert(never_true<Argument>, "distribute: strategy.run(fn, args...): argument " #N                 \
                                        " is const (a const per-replica input)" DISTRIBUTE_RUN_CONST_ADVICE); \
  };                                                                                                          \
  template <class Argument>                                                                                   \
  struct strategy_run_argument_is_const<N, mirrored_value, Argument> {                                        \
    static_assert(never_true<Argument>, "distribute: strategy.run(fn, args...): argument " #N                 \
                                        " is const (a const mirrored value)" DISTRIBUTE_RUN_CONST_ADVICE);    \
  };                                                                                                          \
  template <class Argument>                                                                                   \
  struct strategy_run_argument_is_const<N, shared_value, Argument> {                                          \
    static_assert(never_true<Argument>,                                                                       \
                  "distribute: strategy.run(fn, args...): argument " #N                                       \
                  " is const (a const value, shared by every replica)" DISTRIBUTE_RUN_CONST_ADVICE);          \
  };
DISTRIBUTE_RUN_ARGUMENT_ERRORS(1)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(2)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(3)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(4)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(5)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(6)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(7)
DISTRIBUTE_RUN_ARGUMENT_ERRORS(8)
#undef DISTRIBUTE_RUN_ARGUMENT_ERRORS
#undef DISTRIBUTE_RUN_BY_VALUE_ADVICE
#undef DISTRIBUTE_RUN_CONST_ADVICE

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

// --- the parameters of a generic fn --------------------------------------------------------------
// A generic lambda's call operator is a template: its parameters exist per specialization. The one a
// call uses is named by its template arguments, given explicitly; they are guessed from run's
// arguments, and a guess is tried by calling with it and each argument passed as a braced list
// `{arg}`. Nothing is deduced from a braced list, so a guess that leaves a template parameter to
// deduce (another `auto`, a pack) does not fit. A guess fits, then, only where each argument's type
// is the guessed one or converts to it. So a guess that fits names the specialization the call itself
// uses, already instantiated, when it names no type that another argument converts to.
//
// A guess: a mask of the positions (0 = the replica) whose parameters are `auto`, and a mask of those
// given a const argument's type as const. The replica alone and all positions come first: there the
// template arguments fall in order, and no conversion can mislead (the replica's type is no other
// argument's). Then the masks between, leaving out the positions whose type another argument converts
// to. Fewest const first, so that `auto x` of a const argument is named without const, as the call
// deduces it. A forwarding reference `auto&&` fits no guess: a lambda with one is not read.
//
// Trying a guess that does not fit must not instantiate fn for its types (which could fail to compile
// inside fn, an error in code that is right). GCC instantiates a specialization only once a call has
// chosen it; clang and EDG (nvcc's front end) instantiate each one they try, to deduce its return
// type. With those, only the replica's `auto` is read, and only where a call that deduces it from
// the replica alone (every other argument braced) fits: the specialization then is the call's (for
// a replica taken as `auto&&`, one whose replica is an rvalue reference: the same code).
inline constexpr bool guesses_are_free =
#if defined(__GNUC__) && !defined(__clang__) && !defined(__EDG__) && !defined(__CUDACC__) && \
    !defined(__INTEL_COMPILER) && !defined(__NVCOMPILER)
    true;
#else
    false;
#endif

template <class... T>
struct run_types {};

template <class F, class Explicit, class Args>
inline constexpr bool explicitly_callable = false;
template <class F, class... E, class... U>
inline constexpr bool explicitly_callable<F, run_types<E...>, run_types<U...>> =
    requires(F& f, U&... u) { f.template operator()<E...>({u}...); };

// fn(replica, {args}...): deduces template parameters from the replica only.
template <class F, class Args>
inline constexpr bool deduced_from_replica_alone = false;
template <class F, class Replica, class... U>
inline constexpr bool deduced_from_replica_alone<F, run_types<Replica, U...>> =
    requires(F& f, Replica& r, U&... u) { f(r, {u}...); };

template <class F, class Explicit>
struct specialization_parameters {
  static constexpr bool known = false;
};
template <class F, class... E>
  requires requires { &F::template operator()<E...>; }
struct specialization_parameters<F, run_types<E...>> : call_parameters<decltype(&F::template operator()<E...>)> {};

// The explicit template arguments of a guess: the types at the positions in Mask, const where
// Constness says so.
template <std::uint32_t Mask, std::uint32_t Constness, class Out, class... U>
struct guessed_arguments {
  using type = Out;
};
template <std::uint32_t Mask, std::uint32_t Constness, class... E, class U0, class... U>
struct guessed_arguments<Mask, Constness, run_types<E...>, U0, U...>
    : guessed_arguments<
          (Mask >> 1), (Constness >> 1),
          std::conditional_t<(Mask & 1u) != 0,
                             run_types<E..., std::conditional_t<(Constness & 1u) != 0, U0, std::remove_const_t<U0>>>,
                             run_types<E...>>,
          U...> {};
template <std::uint32_t Mask, std::uint32_t Constness, class Args>
struct guessed_for;
template <std::uint32_t Mask, std::uint32_t Constness, class... U>
struct guessed_for<Mask, Constness, run_types<U...>> : guessed_arguments<Mask, Constness, run_types<>, U...> {};

struct parameter_guess {
  std::uint32_t mask = 0, constness = 0;
};

// The guesses in the order tried: the replica alone and all positions; or (Between) the masks
// between them that leave out the positions in Unsafe.
template <std::size_t N, std::uint32_t Const, bool Between, std::uint32_t Unsafe, class Out>
constexpr void visit_guesses(Out&& out) {
  constexpr std::uint32_t all = (std::uint32_t{1} << N) - 1;
  auto masks = [&](std::uint32_t mask) {
    const std::uint32_t choice = mask & Const;
    for (int bits = 0; bits <= std::popcount(choice); ++bits)
      for (std::uint32_t c = choice;; c = (c - 1) & choice) {  // every subset of choice
        if (std::popcount(c) == bits) out(parameter_guess{mask, c});
        if (c == 0) break;
      }
  };
  if constexpr (!Between) {
    masks(1);
    if (all != 1) masks(all);
  } else {
    for (int bits = 1; bits < static_cast<int>(N); ++bits)
      for (std::uint32_t mask = 2; mask < all; ++mask)
        if (std::popcount(mask) == bits && (mask & Unsafe) == 0) masks(mask);
  }
}
template <std::size_t N, std::uint32_t Const, bool Between, std::uint32_t Unsafe>
constexpr std::size_t guess_count() {
  std::size_t n = 0;
  visit_guesses<N, Const, Between, Unsafe>([&](parameter_guess) { ++n; });
  return n;
}
template <std::size_t N, std::uint32_t Const, bool Between, std::uint32_t Unsafe = 0>
constexpr auto guesses() {
  std::array<parameter_guess, guess_count<N, Const, Between, Unsafe>()> list{};
  std::size_t k = 0;
  visit_guesses<N, Const, Between, Unsafe>([&](parameter_guess g) { list[k++] = g; });
  return list;
}

// The first guess that fits, as a type list of template arguments; void if none does.
template <class F, class Args, auto Guesses, std::size_t K = 0>
constexpr auto find_specialization() {
  if constexpr (K == Guesses.size()) {
    return std::type_identity<void>{};
  } else {
    using e = typename guessed_for<Guesses[K].mask, Guesses[K].constness, Args>::type;
    if constexpr (explicitly_callable<F, e, Args>) return std::type_identity<e>{};
    else return find_specialization<F, Args, Guesses, K + 1>();
  }
}

// Whether a parameter of type X (or const X&) takes `{a}` for an lvalue a of type A, as the guesses'
// calls pass them.
template <class X>
void list_initialized(const X&);
template <class A, class X>
inline constexpr bool list_converts = requires(A& a) { list_initialized<X>({a}); };

// The positions whose argument's type another argument, of another type, converts to: a guess
// that names one of them could fit with the wrong template arguments.
template <class Target, class... X>
inline constexpr bool converted_into =
    ((!std::is_same_v<X, Target> &&
      (std::is_base_of_v<Target, X> || std::is_convertible_v<X&, Target> || list_converts<X, Target>)) ||
     ...);
template <class... X>
constexpr std::uint32_t conversion_targets() {
  std::uint32_t m = 0, bit = 1;
  ((m |= converted_into<X, X...> ? bit : 0, bit <<= 1), ...);
  return m;
}

template <class Fn, class Explicit>
constexpr auto parameters_of_specialization() {
  if constexpr (std::is_void_v<Explicit>) return std::type_identity<void>{};
  else if constexpr (!specialization_parameters<Fn, Explicit>::known) return std::type_identity<void>{};
  else return std::type_identity<typename specialization_parameters<Fn, Explicit>::type>{};
}

// fn's parameter types as a std::tuple (the replica's first), or void where they cannot be read.
template <class F, class Replica, class... A>
constexpr auto read_parameters() {
  using fn = std::remove_cvref_t<F>;
  constexpr std::size_t n = sizeof...(A) + 1;
  if constexpr (call_parameters<fn>::known) {
    return std::type_identity<typename call_parameters<fn>::type>{};
  } else if constexpr (!guesses_are_free) {
    if constexpr (deduced_from_replica_alone<F, run_types<Replica, std::remove_reference_t<unwrapped_t<A>>...>>)
      return parameters_of_specialization<fn, run_types<Replica>>();
    else return std::type_identity<void>{};
  } else if constexpr (n > 9) {  // at most 2^8 guesses for all positions given as `auto`
    return std::type_identity<void>{};
  } else {
    using args = run_types<Replica, std::remove_reference_t<unwrapped_t<A>>...>;
    constexpr std::uint32_t const_positions = [] {
      std::uint32_t m = 0, bit = 2;  // bit 0: the replica, never const here
      ((m |= std::is_const_v<std::remove_reference_t<unwrapped_t<A>>> ? bit : 0, bit <<= 1), ...);
      return m;
    }();
    using ends = typename decltype(find_specialization<F, args, guesses<n, const_positions, false>()>())::type;
    if constexpr (!std::is_void_v<ends>) {
      return parameters_of_specialization<fn, ends>();
    } else if constexpr (n > 6) {
      return std::type_identity<void>{};
    } else {
      constexpr std::uint32_t unsafe =
          conversion_targets<std::remove_cvref_t<Replica>, std::remove_cvref_t<unwrapped_t<A>>...>();
      using found =
          typename decltype(find_specialization<F, args, guesses<n, const_positions, true, unsafe>()>())::type;
      return parameters_of_specialization<fn, found>();
    }
  }
}

template <std::size_t Position, class Params, bool Mirrored>
constexpr void check_taken_by_reference() {
  if constexpr (Mirrored && Position < std::tuple_size_v<Params>) {
    using parameter = std::tuple_element_t<Position, Params>;
    if constexpr (!std::is_reference_v<parameter>)
      (void)sizeof(strategy_run_fn_takes_mirrored_by_value<Position, parameter>);
  }
}

// Where fn can be called: refuses a mirrored argument that fn takes by value (one error per such
// argument). Costs nothing for a call without mirrored arguments.
template <class F, class Replica, class... A>
constexpr void check_run_parameters() {
  if constexpr ((is_mirrored_v<std::remove_cvref_t<A>> || ...)) {
    using params = typename decltype(read_parameters<F, Replica, A...>())::type;
    if constexpr (!std::is_void_v<params>) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (check_taken_by_reference<I + 1, params, is_mirrored_v<std::remove_cvref_t<A>>>(), ...);
      }(std::index_sequence_for<A...>{});
    }
  }
}

// --- fn that cannot be called ---------------------------------------------------------------------
template <std::size_t N>
struct position_list {
  std::array<std::size_t, N + 1> at{};
  std::size_t size = 0;
};

// An argument that a parameter would take but for the argument being const.
template <class Arg, class Param>
inline constexpr bool fits_but_for_const =
    std::is_const_v<std::remove_reference_t<Arg>> && !std::is_convertible_v<Arg, Param> &&
    std::is_convertible_v<std::remove_cvref_t<Arg>&, Param>;

// Read parameters: each argument whose type the parameter at its place does not take (Const: those
// that it would take but for being const; otherwise the others).
template <class Params, class Args, bool Const, std::size_t... I>
constexpr auto unfit_positions(std::index_sequence<I...>) {
  position_list<sizeof...(I)> out;
  constexpr std::size_t n = std::tuple_size_v<Params>;
  (
      [&] {
        if constexpr (I + 1 < n) {
          using arg = std::tuple_element_t<I, Args>;
          using param = std::tuple_element_t<I + 1, Params>;
          if (!std::is_convertible_v<arg, param> && fits_but_for_const<arg, param> == Const) out.at[out.size++] = I + 1;
        } else if (!Const) {
          out.at[out.size++] = I + 1;  // no parameter there
        }
      }(),
      ...);
  return out;
}

// Generic fn: the const arguments that it takes once every const argument but them is made
// non-const (when making all of them non-const lets it be called at all).
template <class F, class Replica, class Args, std::uint32_t Drop, std::size_t... I>
constexpr bool invocable_dropping_const(std::index_sequence<I...>) {
  return std::is_invocable_v<
      F&, Replica&,
      std::conditional_t<((Drop >> I) & 1u) != 0, std::remove_cvref_t<std::tuple_element_t<I, Args>>&,
                         std::tuple_element_t<I, Args>>...>;
}
template <class F, class Replica, class Args>
constexpr auto const_positions_of_generic() {
  constexpr std::size_t n = std::tuple_size_v<Args>;
  position_list<n> out;
  if constexpr (n <= 32) {
    constexpr std::uint32_t const_args = [] {
      std::uint32_t m = 0;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((m |= std::is_const_v<std::remove_reference_t<std::tuple_element_t<I, Args>>> ? std::uint32_t{1} << I : 0),
         ...);
      }(std::make_index_sequence<n>{});
      return m;
    }();
    if constexpr (const_args != 0 &&
                  invocable_dropping_const<F, Replica, Args, const_args>(std::make_index_sequence<n>{})) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (
            [&] {
              if constexpr (((const_args >> I) & 1u) != 0) {
                if (!invocable_dropping_const<F, Replica, Args, (const_args & ~(std::uint32_t{1} << I))>(
                        std::make_index_sequence<n>{}))
                  out.at[out.size++] = I + 1;
              }
            }(),
            ...);
      }(std::make_index_sequence<n>{});
    }
  }
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

// One error per const argument in List.
template <auto List, class... A>
constexpr void report_const_arguments() {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (
        [&] {
          constexpr std::size_t position = List.at[K];
          using a = std::tuple_element_t<position - 1, std::tuple<A...>>;
          (void)sizeof(
              strategy_run_argument_is_const<position, argument_kind<a>, std::remove_reference_t<unwrapped_t<a>>>);
        }(),
        ...);
  }(std::make_index_sequence<List.size>{});
}

// Raises the errors for fn, a replica type and run's argument types; returns nothing.
template <class F, class Replica, class... A>
void report_run_call() {
  using args = std::tuple<unwrapped_t<A>...>;
  using fn = std::remove_cvref_t<F>;
  if constexpr (call_parameters<fn>::known) {
    using params = typename call_parameters<fn>::type;
    constexpr auto consts = unfit_positions<params, args, true>(std::index_sequence_for<A...>{});
    constexpr auto list = unfit_positions<params, args, false>(std::index_sequence_for<A...>{});
    report_const_arguments<consts, A...>();
    if constexpr (consts.size == 0 || list.size != 0 || std::tuple_size_v<params> != sizeof...(A) + 1) {
      using positions = decltype(as_positions<list>(std::make_index_sequence<list.size>{}));
      (void)sizeof(strategy_run_cannot_call_fn<positions, std::tuple_size_v<params>, sizeof...(A)>);
    }
  } else {
    constexpr auto consts = const_positions_of_generic<F, Replica, args>();
    if constexpr (consts.size != 0) {
      report_const_arguments<consts, A...>();
    } else {
      constexpr auto list = swapped_positions<fn, Replica, args>();
      using positions = decltype(as_positions<list>(std::make_index_sequence<list.size>{}));
      (void)sizeof(strategy_run_cannot_call_fn<positions, 0, sizeof...(A)>);
    }
  }
}

// Whether strategy.run can call fn(replica, args...).
template <class F, class Replica, class... A>
concept run_callable = std::is_invocable_v<F&, Replica&, unwrapped_t<A>...>;

}  // namespace distribute::detail
