#pragma once
// The contract every communicator keeps (concepts/communicator.hpp), written once and checked for
// each of them: comm::local and comm::shared_memory (tests/core), comm::mpi (tests/mpi), and the GPU
// replicas' cuda_peer and NCCL (tests/gpu). This header says what the cases need from a
// communicator's test file; collective_cases.hpp holds the collectives' cases (suite
// `collectives`), p2p_cases.hpp those of point-to-point messages and `split` (suites `p2p` and
// `split`), each included by the test file of its suites.
//
// The cases are templates over `Groups`, the groups of one communicator type that a test file can
// make (replica_groups.hpp has those of a strategy's replicas, mpi_groups.hpp those of MPI):
//   using communicator = C;                       what each rank is given
//   using reference = R;                          the values reduced, and what every rank must then hold
//   static constexpr int memories;                the kinds of memory a buffer can be in (1: host memory;
//                                                 2 on a GPU: device memory, then host memory)
//   static constexpr bool names_mismatches;       ranks whose collectives disagree all get a
//                                                 collective_mismatch naming each call, and go on (a
//                                                 group of one rank is passed over)
//   static constexpr bool names_message_mismatches;  a message received as another type or length is a
//                                                 collective_mismatch of the run naming both ends (MPI
//                                                 ends the job instead: tests/mpi/failure_test.cpp)
//   static constexpr const char* rank_name;       what the errors call a rank: "replica", "worker"
//   template <class F> static void for_each(F&& f);   f(group&) for every group to check, made one at a time
// and each group with
//   std::string name() const;                     for the messages of failed checks
//   int ranks() const;                            its size
//   std::vector<int> run(const std::function<void(int rank, C&)>& f);
//       f on every rank of the group that this process holds (every rank of a group of threads; this
//       process's own rank under MPI); returns those ranks, or rethrows what a rank threw once the
//       others are released
//   template <class T> auto buffer(int rank, std::vector<T> values, int memory);
//       rank's buffer of `values` in memory `memory` (0 .. memories-1): `span()` for the collective,
//       `values()` to read it back, on that rank's thread
//   static const char* memory_name(int memory);
//
// and the reference R with
//   using element_types = ...;                    a type_list of the element types checked
//   using all_reduce_types = ...;                 those all-reduce is also checked with (a GPU's halves)
//   static constexpr reduce_op ops[];             every op
//   template <class T> static std::vector<T> values(int rank, std::size_t n, reduce_op op, std::uint32_t seed);
//   template <class T> static std::vector<T> reduced(reduce_op op, const std::vector<std::vector<T>>& inputs);
//   template <class T> static bool same(reduce_op op, const std::vector<T>& got, const std::vector<T>& want);
//       values that `reduced` reduces as the communicator must, and whether a result is that
//   template <class T> static std::vector<T> irregular(int rank, std::size_t n, std::uint32_t seed);
//   static constexpr bool reduces_irregular_values_exactly;
//       values whose sum depends on the order it is taken in; whether `reduced` gives the
//       communicator's bits for them too (a communicator that promises an order), or the check is
//       only that every rank and every run agree
//
// A case records what each rank saw and checks it on the test's own thread afterwards: Boost.Test
// is not to be called from several threads at once.

#include <distribute/concepts/communicator.hpp>
#include <distribute/reduce_op.hpp>

#include <boost/mpl/fold.hpp>
#include <boost/mpl/list.hpp>
#include <boost/mpl/placeholders.hpp>
#include <boost/mpl/push_front.hpp>
#include <boost/test/execution_monitor.hpp>
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::test::communicator_cases {

// f(g) for one group of several a case checks (a Groups' for_each), so that one group's failure hides
// no other's: a failed requirement (already reported) or an exception (reported here, naming the
// group) ends this group's checks, and the next group runs. For groups whose ranks are threads of this
// process; under MPI a rank that left a case early would leave the others waiting in it.
template <class Group, class F>
void each_on_its_own(Group& g, F& f) {
  try {
    f(g);
  } catch (const boost::execution_aborted&) {
  } catch (const std::exception& e) {
    BOOST_ERROR(g.name() << ": " << e.what());
  }
}

// Lists of types, for the cases' Cartesian products and filters.
template <class... Ts>
struct type_list {};

template <class... Lists>
struct concat;
template <>
struct concat<> {
  using type = type_list<>;
};
template <class... As>
struct concat<type_list<As...>> {
  using type = type_list<As...>;
};
template <class... As, class... Bs, class... Rest>
struct concat<type_list<As...>, type_list<Bs...>, Rest...> : concat<type_list<As..., Bs...>, Rest...> {};

template <class List, class T>
struct append;
template <class... Ts, class T>
struct append<type_list<Ts...>, T> {
  using type = type_list<Ts..., T>;
};

// A boost::mpl sequence (the tests' element_types) as a type_list.
template <class Sequence>
using type_list_of = typename boost::mpl::fold<Sequence, type_list<>, append<boost::mpl::_1, boost::mpl::_2>>::type;

// The groups of a list for which Keep<Groups>::value holds.
template <template <class> class Keep, class List>
struct only;
template <template <class> class Keep, class... Gs>
struct only<Keep, type_list<Gs...>> {
  using type = typename concat<std::conditional_t<Keep<Gs>::value, type_list<Gs>, type_list<>>...>::type;
};

// One case of a templated case: the groups of one communicator, with one element type.
template <class Groups, class T>
struct typed_case {
  using groups = Groups;
  using element = T;
};

// Every Groups of the list with every type of Types<Groups>.
template <template <class> class Types, class List>
struct typed_cases;
template <class Groups, class List>
struct typed_row;
template <class Groups, class... Ts>
struct typed_row<Groups, type_list<Ts...>> {
  using type = type_list<typed_case<Groups, Ts>...>;
};
template <template <class> class Types, class... Gs>
struct typed_cases<Types, type_list<Gs...>> {
  using type = typename concat<typename typed_row<Gs, Types<Gs>>::type...>::type;
};

// A type_list as BOOST_AUTO_TEST_CASE_TEMPLATE takes it: a boost::mpl list, of any length (an empty
// one registers no case). Boost.Test also takes variadic lists, but not where Boost.Config believes
// the compiler an old nvcc, as under clang's CUDA front end.
template <class List>
struct test_types;
template <>
struct test_types<type_list<>> {
  using type = boost::mpl::list<>;
};
template <class T, class... Ts>
struct test_types<type_list<T, Ts...>> {
  using type = typename boost::mpl::push_front<typename test_types<type_list<Ts...>>::type, T>::type;
};

template <class Groups>
using element_types_of = typename Groups::reference::element_types;
template <class Groups>
using all_reduce_types_of = typename Groups::reference::all_reduce_types;

template <class Groups>
struct names_mismatches : std::bool_constant<Groups::names_mismatches> {};
template <class Groups>
struct names_message_mismatches : std::bool_constant<point_to_point_communicator<typename Groups::communicator> &&
                                                     Groups::names_message_mismatches> {};
template <class Groups>
struct passes_messages : std::bool_constant<point_to_point_communicator<typename Groups::communicator>> {};

// A buffer in host memory, which every communicator accepts.
template <class T>
class host_buffer {
 public:
  explicit host_buffer(std::vector<T> values) : values_{std::move(values)} {}
  std::span<T> span() noexcept { return values_; }
  const std::vector<T>& values() const noexcept { return values_; }

 private:
  std::vector<T> values_;
};

// The memory of groups whose buffers are host memory only: the place of a rank (a device) is not
// needed.
struct host_memory {
  static constexpr int kinds = 1;
  static const char* name(int) noexcept { return "host memory"; }
  template <class T, class Place>
  static host_buffer<T> buffer(const Place&, std::vector<T> values, int) {
    return host_buffer<T>(std::move(values));
  }
};

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// How the errors name ranks: "replica 1", "workers 0, 2".
inline std::string named(const char* rank_name, const std::vector<int>& ranks) {
  std::string s = std::string(rank_name) + (ranks.size() == 1 ? " " : "s ");
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Runs `f` on `g` expecting the error E; its message, or what happened instead.
template <class E, class Group, class F>
std::string error_of(Group& g, const F& f) {
  try {
    g.run(f);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("another error: ") + e.what();
  }
  return "no error";
}

// Whether `c` has failed and refuses further calls, where a communicator can (comm::mpi); the others
// report each failure by the call's own error.
template <class C>
bool has_failed(const C& c) {
  if constexpr (requires { c.failed(); }) return c.failed();
  else return false;
}

// The ring's neighbours of `rank` among `ranks`.
inline int next_of(int rank, int ranks) { return (rank + 1) % ranks; }
inline int previous_of(int rank, int ranks) { return (rank + ranks - 1) % ranks; }

// Whether `g` has the two ranks a case needs; says so when not.
template <class Group>
bool has_two_ranks(const Group& g) {
  if (g.ranks() >= 2) return true;
  BOOST_TEST_MESSAGE(g.name() << ": one rank, nothing to check");
  return false;
}

}  // namespace distribute::test::communicator_cases
