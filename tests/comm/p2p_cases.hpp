#pragma once
// Point-to-point messages and sub-groups of every communicator that has them
// (point_to_point_communicator, concepts/communicator.hpp): rings of empty, small and several-MiB
// messages in every order of sending and receiving; ranks that all send to all before they receive;
// the messages of one tag in the order sent, and tags received in another order; a message in flight
// across collectives; mismatched messages named (where a mismatch is an error of the run rather than
// the end of the job); bad ranks and tags refused before anything is sent; and sub-groups by color
// and key whose collectives and messages stay apart from their parent's, splits of splits included.
//
// The including file defines `distribute::test::p2p_groups`, a communicator_cases::type_list of
// Groups (communicator_cases.hpp), and includes this file, which adds the cases to the suites `p2p`
// and `split`. Groups whose communicator passes no messages (comm::local) get no cases.

#include "communicator_cases.hpp"

#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace distribute::test::communicator_cases {

using messaging_groups = typename only<passes_messages, p2p_groups>::type;
using messaging_group_list = typename test_types<messaging_groups>::type;
using message_mismatch_group_list =
    typename test_types<typename only<names_message_mismatches, p2p_groups>::type>::type;

template <class Groups>
using message_types = type_list<float, double, std::int32_t>;
using ring_cases = typename test_types<typename typed_cases<message_types, messaging_groups>::type>::type;

// A communicator whose tags have an upper bound (comm::mpi: tag_limit()).
template <class C>
concept limits_tags = requires(const C& c) {
  { c.tag_limit() } -> std::convertible_to<int>;
};

// What rank `from` sends with `tag`: n values that name both, exact in every element type.
template <class T>
std::vector<T> message(int from, int tag, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(static_cast<std::int64_t>((static_cast<std::size_t>(from * 1000 + tag * 7) + i) % 100003));
  return v;
}

template <class T>
bool is_message(const std::vector<T>& got, int from, int tag) {
  return got == message<T>(from, tag, got.size());
}

// Empty, small, and several MiB (above any eager limit of MPI: the receiver must take part).
inline constexpr std::size_t ring_sizes[] = {0, 1, 1000, std::size_t{1} << 20, (std::size_t{6} << 20) / 4 + 3};

// Each rank sends to the next and receives from the previous one; the ranks of parity
// `receives_first` receive first (none: -1).
template <class T, class Group>
void check_ring(Group& g, int receives_first) {
  using C = typename Group::communicator;
  const int n = g.ranks();
  for (const std::size_t size : ring_sizes) {
    std::vector<int> delivered(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, C& c) {
      const int next = next_of(rank, n), previous = previous_of(rank, n);
      const auto out = message<T>(rank, 3, size);
      std::vector<T> in(size);
      if (rank % 2 == receives_first) {
        c.recv(std::span<T>(in), previous, 3);
        c.send(std::span<const T>(out), next, 3);
      } else {
        c.send(std::span<const T>(out), next, 3);
        c.recv(std::span<T>(in), previous, 3);
      }
      delivered[static_cast<std::size_t>(rank)] = is_message(in, previous, 3);
    });
    for (const int r : held)
      BOOST_TEST(delivered[static_cast<std::size_t>(r)], g.name() << ": " << size << " " << to_string(dtype_of<T>)
                                                                  << " to rank " << r << ", parity " << receives_first
                                                                  << " receiving first");
  }
}

}  // namespace distribute::test::communicator_cases

BOOST_AUTO_TEST_SUITE(p2p)

BOOST_AUTO_TEST_CASE_TEMPLATE(a_ring_where_every_rank_sends_first, Case,
                              distribute::test::communicator_cases::ring_cases) {
  using namespace distribute::test::communicator_cases;
  Case::groups::for_each([](auto& g) {
    if (has_two_ranks(g)) check_ring<typename Case::element>(g, -1);
  });
}

// Even ranks receive first and odd ones send first, then the other way round: rings that need no
// buffering, and (for the receivers that wait first) the hand-over straight into the receiver's
// buffer.
BOOST_AUTO_TEST_CASE_TEMPLATE(a_ring_where_some_ranks_receive_first, Case,
                              distribute::test::communicator_cases::ring_cases) {
  using namespace distribute::test::communicator_cases;
  Case::groups::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    check_ring<typename Case::element>(g, 0);
    check_ring<typename Case::element>(g, 1);
  });
}

// Every rank sends several MiB to every other before it receives anything (a pipeline's stages send
// activations forward and gradients backward at once): the sends must not wait for receivers, and
// they take a copy.
BOOST_AUTO_TEST_CASE_TEMPLATE(everyone_sends_to_everyone_before_receiving, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    const std::size_t count = (std::size_t{8} << 20) / sizeof(double);
    std::vector<int> delivered(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      for (int q = 0; q < n; ++q) {
        if (q == rank) continue;
        auto out = message<double>(rank, 9, count);
        c.send(std::span<const double>(out), q, 9);
        out.assign(count, -1.0);
      }
      int ok = 0;
      for (int q = 0; q < n; ++q) {
        if (q == rank) continue;
        std::vector<double> in(count);
        c.recv(std::span<double>(in), q, 9);
        ok += is_message(in, q, 9);
      }
      delivered[static_cast<std::size_t>(rank)] = ok;
    });
    for (const int r : held)
      BOOST_TEST(delivered[static_cast<std::size_t>(r)] == n - 1, g.name() << ": rank " << r << " received "
                                                                           << delivered[static_cast<std::size_t>(r)]
                                                                           << " of " << n - 1 << " messages");
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(messages_with_one_tag_arrive_in_the_order_sent, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    constexpr int count = 40;
    std::vector<std::size_t> wrong(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      const int next = next_of(rank, n), previous = previous_of(rank, n);
      for (int k = 0; k < count; ++k) {
        // Alternately small and large, so that eager and rendezvous deliveries are mixed under MPI.
        const std::vector<std::int64_t> out(k % 2 ? std::size_t{1} << 17 : 1, std::int64_t{rank} * 100000 + k);
        c.send(std::span<const std::int64_t>(out), next, 11);
      }
      std::size_t bad = 0;
      for (int k = 0; k < count; ++k) {
        std::vector<std::int64_t> in(k % 2 ? std::size_t{1} << 17 : 1);
        c.recv(std::span<std::int64_t>(in), previous, 11);
        for (const auto x : in) bad += x != std::int64_t{previous} * 100000 + k;
      }
      wrong[static_cast<std::size_t>(rank)] = bad;
    });
    for (const int r : held)
      BOOST_TEST(wrong[static_cast<std::size_t>(r)] == 0u, g.name() << ": rank " << r << " received out of order");
  });
}

// Tags are received in another order than sent, with messages of one tag among them in order; and
// the largest tag, where the communicator has a limit.
BOOST_AUTO_TEST_CASE_TEMPLATE(messages_are_matched_by_tag, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    const std::size_t sizes[] = {5, std::size_t{1} << 20, 0, 77};
    struct seen {
      std::vector<int> order;
      int tags_matched = 0;
      bool last_tag_is_large = true, last_tag_delivered = true;
    };
    std::vector<seen> got(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      auto& mine = got[static_cast<std::size_t>(rank)];
      const int next = next_of(rank, n), previous = previous_of(rank, n);
      for (int tag = 0; tag < 4; ++tag) {
        const auto out = message<float>(rank, tag, sizes[tag]);
        c.send(std::span<const float>(out), next, tag);
      }
      for (int k = 0; k < 4; ++k) c.send(std::span<const int>(&k, 1), next, 4);
      const int hundred = 100, two_hundred = 200;
      c.send(std::span<const int>(&hundred, 1), next, 5);
      c.send(std::span<const int>(&two_hundred, 1), next, 6);

      int one = -1;
      for (const int tag : {6, 5}) {
        c.recv(std::span<int>(&one, 1), previous, tag);  // the last sent, taken first
        mine.order.push_back(one);
      }
      for (const int tag : {3, 1, 0, 2}) {
        std::vector<float> in(sizes[tag]);
        c.recv(std::span<float>(in), previous, tag);
        mine.tags_matched += is_message(in, previous, tag);
      }
      for (int k = 0; k < 4; ++k) {
        c.recv(std::span<int>(&one, 1), previous, 4);
        mine.order.push_back(one);
      }
      if constexpr (limits_tags<typename G::communicator>) {
        const int last = c.tag_limit() - 1;
        mine.last_tag_is_large = last >= 32767;
        const std::int32_t sent = rank;
        c.send(std::span<const std::int32_t>(&sent, 1), next, last);
        std::int32_t received = -1;
        c.recv(std::span<std::int32_t>(&received, 1), previous, last);
        mine.last_tag_delivered = received == previous;
      }
    });
    for (const int r : held) {
      const auto& s = got[static_cast<std::size_t>(r)];
      BOOST_TEST(s.order == (std::vector<int>{200, 100, 0, 1, 2, 3}), boost::test_tools::per_element());
      BOOST_TEST(s.tags_matched == 4, g.name() << ": rank " << r << " matched " << s.tags_matched << " of 4 tags");
      BOOST_TEST(s.last_tag_is_large, g.name() << ": the largest tag is below 32767");
      BOOST_TEST(s.last_tag_delivered, g.name() << ": the largest tag");
    }
  });
}

// A message larger than MPI delivers eagerly, still in flight while its sender and receiver meet in
// collectives (which must neither wait for it nor take it).
BOOST_AUTO_TEST_CASE_TEMPLATE(a_message_in_flight_across_collectives, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    const std::size_t count = std::size_t{4} << 20;
    std::vector<float> sums(static_cast<std::size_t>(n));
    std::vector<int> delivered(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      const auto out = message<float>(rank, 2, count);
      c.send(std::span<const float>(out), next_of(rank, n), 2);
      c.barrier();
      std::vector<float> sum(1000, 1.0f);
      c.all_reduce(distribute::reduce_op::sum, std::span<float>(sum));
      sums[static_cast<std::size_t>(rank)] = sum[999];
      std::vector<float> in(count);
      c.recv(std::span<float>(in), previous_of(rank, n), 2);
      delivered[static_cast<std::size_t>(rank)] = is_message(in, previous_of(rank, n), 2);
    });
    for (const int r : held) {
      BOOST_TEST(sums[static_cast<std::size_t>(r)] == static_cast<float>(n), g.name());
      BOOST_TEST(delivered[static_cast<std::size_t>(r)], g.name() << ": rank " << r);
    }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_length_mismatch_names_both_ends, G,
                              distribute::test::communicator_cases::message_mismatch_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const auto msg = error_of<distribute::collective_mismatch>(g, [](int rank, typename G::communicator& c) {
      std::vector<float> v(rank == 0 ? 5 : 4);
      if (rank == 0) c.send(std::span<const float>(v), 1, 3);
      else if (rank == 1) c.recv(std::span<float>(v), 0, 3);
    });
    const auto zero = named(G::rank_name, {0}), one = named(G::rank_name, {1});
    BOOST_TEST(contains(msg, one + "'s recv of 4 float32, tag 3 from " + zero), g.name() << ": " << msg);
    BOOST_TEST(contains(msg, "met " + zero + "'s send of 5 float32, tag 3, to " + one), g.name() << ": " << msg);
    // The group works again.
    std::vector<int> ran(static_cast<std::size_t>(g.ranks()));
    for (const int r : g.run([&](int rank, typename G::communicator&) { ran[static_cast<std::size_t>(rank)] = 1; }))
      BOOST_TEST(ran[static_cast<std::size_t>(r)] == 1);
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_type_mismatch_names_both_ends_even_when_the_receiver_waits_first, G,
                              distribute::test::communicator_cases::message_mismatch_group_list) {
  using namespace distribute::test::communicator_cases;
  using namespace std::chrono_literals;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const auto msg = error_of<distribute::collective_mismatch>(g, [](int rank, typename G::communicator& c) {
      if (rank == 0) {
        std::this_thread::sleep_for(20ms);  // rank 1 is waiting by now
        const std::vector<int> v(4);
        c.send(std::span<const int>(v), 1, 0);
      } else if (rank == 1) {
        std::vector<float> v(4);
        c.recv(std::span<float>(v), 0, 0);
      }
    });
    BOOST_TEST(contains(msg, "recv of 4 float32, tag 0 from " + named(G::rank_name, {0})), g.name() << ": " << msg);
    BOOST_TEST(contains(msg, "send of 4 int32, tag 0, to " + named(G::rank_name, {1})), g.name() << ": " << msg);
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bad_ranks_and_tags_are_refused_before_anything_is_sent, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  // Every rank makes the mistakes, each refused there and then; the communicator has not failed.
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    // Per rank: each refusal's message, and what it must say.
    struct refusal {
      std::string what;
      std::vector<std::string> must_say;
    };
    std::vector<std::vector<refusal>> refusals(static_cast<std::size_t>(n));
    std::vector<int> failed(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      auto& mine = refusals[static_cast<std::size_t>(rank)];
      const auto refused = [&](std::vector<std::string> must_say, auto&& call) {
        try {
          call();
          mine.push_back({"not refused", std::move(must_say)});
        } catch (const std::invalid_argument& e) {
          mine.push_back({e.what(), std::move(must_say)});
        }
      };
      const auto names_rank = [](int peer) {
        return std::vector<std::string>{"names rank " + std::to_string(peer) + "; it must be another rank"};
      };
      const auto bad_tag = [](long long tag) {
        return std::vector<std::string>{"needs a tag", "got " + std::to_string(tag)};
      };
      std::vector<float> buf(4);
      const std::span<const float> out(buf);
      const int next = next_of(rank, n), previous = previous_of(rank, n);
      refused(names_rank(-1), [&] { c.send(out, -1, 0); });
      refused(names_rank(n), [&] { c.send(out, n, 0); });
      refused(names_rank(rank), [&] { c.send(out, rank, 0); });
      refused(names_rank(-1), [&] { c.recv(std::span<float>(buf), -1, 0); });
      refused(names_rank(rank), [&] { c.recv(std::span<float>(buf), rank, 0); });
      refused(bad_tag(-1), [&] { c.send(out, next, -1); });
      refused(bad_tag(-3), [&] { c.recv(std::span<float>(buf), previous, -3); });
      if constexpr (limits_tags<typename G::communicator>) {
        refused(bad_tag(c.tag_limit()), [&] { c.send(out, next, c.tag_limit()); });
        refused(bad_tag(1 << 20), [&] { c.recv(std::span<float>(buf), previous, 1 << 20); });
      }
      refused({"split needs a color >= 0, got -1"}, [&] { (void)c.split(-1, 0); });
      failed[static_cast<std::size_t>(rank)] = has_failed(c);
      c.barrier();
    });
    for (const int r : held) {
      for (const auto& [what, must_say] : refusals[static_cast<std::size_t>(r)])
        for (const auto& part : must_say) BOOST_TEST(contains(what, part), g.name() << ": rank " << r << ": " << what);
      BOOST_TEST(!failed[static_cast<std::size_t>(r)], g.name() << ": a refused call failed the communicator");
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(split)

// Ranks split by parity, ranked in reverse: collectives and messages inside each part, while a
// message of the parent with the same tag is in flight around them.
BOOST_AUTO_TEST_CASE_TEMPLATE(parts_work_apart_from_their_parent, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    struct seen {
      int size = 0, rank = 0;
      double small_sum = 0, large_sum = 0;
      std::int64_t from_root = -1;
      bool part_message = true, parent_message = false, mismatch_named = true;
      std::string mismatch;
      float parent_sum = 0;
    };
    std::vector<seen> got(static_cast<std::size_t>(n));
    const auto members_of = [n](int color) {
      std::vector<int> m;
      for (int q = 0; q < n; ++q)
        if (q % 2 == color) m.push_back(q);
      return m;
    };
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      auto& mine = got[static_cast<std::size_t>(rank)];
      const auto members = members_of(rank % 2);
      // A parent message with tag 5, sent before the split and received after the part's own tag 5.
      const auto parent_out = message<std::int32_t>(rank, 5, 100);
      c.send(std::span<const std::int32_t>(parent_out), next_of(rank, n), 5);

      auto part = c.split(rank % 2, -rank);
      mine.size = part.size();
      mine.rank = part.rank();
      // The part's all-reduce sums its members only (both of MPI's all-reduce paths).
      for (const std::size_t count : {std::size_t{3}, std::size_t{100000}}) {
        std::vector<double> v(count, static_cast<double>(rank + 1));
        part.all_reduce(distribute::reduce_op::sum, std::span<double>(v));
        (count == 3 ? mine.small_sum : mine.large_sum) = v[count - 1];
      }
      // Its broadcast, from its rank 0 (the member with the highest rank of the parent).
      std::int64_t root_value = rank;
      part.broadcast(std::span<std::int64_t>(&root_value, 1), 0);
      mine.from_root = root_value;
      if (part.size() > 1) {
        // Messages in the part, with the parent's tag: a ring over the part's ranks.
        const int to = next_of(part.rank(), part.size()), from = previous_of(part.rank(), part.size());
        const auto out = message<std::int32_t>(part.rank(), 5, 100);
        part.send(std::span<const std::int32_t>(out), to, 5);
        std::vector<std::int32_t> in(100);
        part.recv(std::span<std::int32_t>(in), from, 5);
        mine.part_message = is_message(in, from, 5);
        // A mismatch in the part names its ranks by their ranks in the parent.
        if constexpr (G::names_mismatches) {
          std::vector<float> v(part.rank() == 0 ? 3 : 4);
          try {
            part.all_reduce(distribute::reduce_op::sum, std::span<float>(v));
            mine.mismatch = "no error";
          } catch (const distribute::collective_mismatch& e) {
            mine.mismatch = e.what();
          }
          mine.mismatch_named =
              contains(mine.mismatch, named(G::rank_name, {members.back()}) + " called all_reduce(sum) of 3 float32");
        }
      }
      std::vector<std::int32_t> parent_in(100);
      c.recv(std::span<std::int32_t>(parent_in), previous_of(rank, n), 5);
      mine.parent_message = is_message(parent_in, previous_of(rank, n), 5);
      // The parent's collectives are untouched.
      std::vector<float> all(7, 1.0f);
      c.all_reduce(distribute::reduce_op::sum, std::span<float>(all));
      mine.parent_sum = all[6];
      part.barrier();
      c.barrier();
    });
    for (const int r : held) {
      const auto& s = got[static_cast<std::size_t>(r)];
      const auto members = members_of(r % 2);
      const auto size = static_cast<int>(members.size());
      double want = 0;
      for (const int q : members) want += q + 1;
      BOOST_TEST(s.size == size, g.name() << ": rank " << r);
      BOOST_TEST(s.rank == size - 1 - r / 2, g.name() << ": rank " << r << ", ranked in reverse");
      BOOST_TEST(s.small_sum == want, g.name() << ": rank " << r);
      BOOST_TEST(s.large_sum == want, g.name() << ": rank " << r);
      BOOST_TEST(s.from_root == members.back(), g.name() << ": rank " << r);
      BOOST_TEST(s.part_message, g.name() << ": rank " << r << " got the part's message, not the parent's");
      BOOST_TEST(s.mismatch_named, g.name() << ": rank " << r << ": " << s.mismatch);
      BOOST_TEST(s.parent_message, g.name() << ": rank " << r << " got the parent's message, not the part's");
      BOOST_TEST(s.parent_sum == static_cast<float>(n), g.name() << ": rank " << r);
    }
  });
}

// The ranks as a mesh of rows and columns (2 x 3 for 6 ranks): rows by one split, keyed to reverse
// their order, columns by another; collectives and messages inside each.
BOOST_AUTO_TEST_CASE_TEMPLATE(sub_groups_of_a_mesh_run_their_own_collectives_and_messages, G,
                              distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks(), width = (n + 1) / 2;
    struct seen {
      int row_rank = -1, row_size = -1, column_rank = -1, column_size = -1;
      float row_sum = 0, column_sum = 0, from_neighbour = -1;
    };
    std::vector<seen> got(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      auto row = c.split(rank / width, -rank);
      auto column = c.split(rank % width, rank);
      float a = static_cast<float>(rank), b = static_cast<float>(rank), neighbour = -1;
      row.all_reduce(distribute::reduce_op::sum, std::span<float>(&a, 1));
      column.all_reduce(distribute::reduce_op::sum, std::span<float>(&b, 1));
      if (column.size() > 1) {
        if (column.rank() == 0) column.send(std::span<const float>(&b, 1), 1, 0);
        else if (column.rank() == 1) column.recv(std::span<float>(&neighbour, 1), 0, 0);
      }
      c.barrier();  // the parent still works
      got[static_cast<std::size_t>(rank)] = {row.rank(), row.size(), column.rank(), column.size(), a, b, neighbour};
    });
    for (const int r : held) {
      const auto& s = got[static_cast<std::size_t>(r)];
      std::vector<int> row, column;
      for (int q = 0; q < n; ++q) {
        if (q / width == r / width) row.push_back(q);
        if (q % width == r % width) column.push_back(q);
      }
      const auto position = [r](const std::vector<int>& m) {
        return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
      };
      float row_sum = 0, column_sum = 0;
      for (const int q : row) row_sum += static_cast<float>(q);
      for (const int q : column) column_sum += static_cast<float>(q);
      BOOST_TEST(s.row_size == static_cast<int>(row.size()), g.name() << ": rank " << r);
      BOOST_TEST(s.row_rank == static_cast<int>(row.size()) - 1 - position(row), g.name() << ": rank " << r);
      BOOST_TEST(s.column_size == static_cast<int>(column.size()), g.name() << ": rank " << r);
      BOOST_TEST(s.column_rank == position(column), g.name() << ": rank " << r);
      BOOST_TEST(s.row_sum == row_sum, g.name() << ": rank " << r);
      BOOST_TEST(s.column_sum == column_sum, g.name() << ": rank " << r);
      if (position(column) == 1) BOOST_TEST(s.from_neighbour == column_sum, g.name() << ": rank " << r);
    }
  });
}

// One color for everyone: a copy of the group in key order, split again; every level passes
// messages, and copies of a part are the same part.
BOOST_AUTO_TEST_CASE_TEMPLATE(a_split_of_a_split, G, distribute::test::communicator_cases::messaging_group_list) {
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    struct seen {
      int size = -1, rank = -1, again_size = -1, again_sum = -1;
      float from = -1;
    };
    std::vector<seen> got(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, typename G::communicator& c) {
      auto& mine = got[static_cast<std::size_t>(rank)];
      auto reversed = c.split(0, n - rank);
      mine.size = reversed.size();
      mine.rank = reversed.rank();
      const float out[2] = {static_cast<float>(reversed.rank()), 1.5f};
      reversed.send(std::span<const float>(out), next_of(reversed.rank(), reversed.size()), 0);
      float in[2] = {};
      reversed.recv(std::span<float>(in), previous_of(reversed.rank(), reversed.size()), 0);
      mine.from = in[0];

      auto again = reversed.split(reversed.rank() == 0 ? 1 : 0, 0);
      mine.again_size = again.size();
      int one = 1;
      again.all_reduce(distribute::reduce_op::sum, std::span<int>(&one, 1));
      mine.again_sum = one;
      auto copy = again;
      copy.barrier();
    });
    for (const int r : held) {
      const auto& s = got[static_cast<std::size_t>(r)];
      BOOST_TEST(s.size == n, g.name() << ": rank " << r);
      BOOST_TEST(s.rank == n - 1 - r, g.name() << ": rank " << r);
      BOOST_TEST(s.from == static_cast<float>(previous_of(n - 1 - r, n)), g.name() << ": rank " << r);
      BOOST_TEST(s.again_size == (r == n - 1 ? 1 : n - 1), g.name() << ": rank " << r);
      BOOST_TEST(s.again_sum == s.again_size, g.name() << ": rank " << r);
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
