#pragma once
// The collectives of every communicator (concepts/communicator.hpp): all-reduce in place and of
// several buffers fused into one, reduce-scatter, all-gather, broadcast from every root and barrier,
// with every op and element type and in every kind of memory; results that are the same bits on
// every rank and in every run; sizes that do not fit refused on every rank before any waits; and,
// where the communicator names them, calls that disagree named, after which the group goes on.
//
// The including file defines `distribute::test::collective_groups`, a communicator_cases::type_list
// of Groups (communicator_cases.hpp), and includes this file, which adds the cases to the suite
// `collectives`.

#include "communicator_cases.hpp"

#include <distribute/detail/digest.hpp>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::test::communicator_cases {

using collective_group_list = typename test_types<collective_groups>::type;
using collective_cases_typed =
    typename test_types<typename typed_cases<element_types_of, collective_groups>::type>::type;
using all_reduce_cases = typename test_types<typename typed_cases<all_reduce_types_of, collective_groups>::type>::type;
using mismatch_group_list = typename test_types<typename only<names_mismatches, collective_groups>::type>::type;

// Empty, smaller than any group, odd tails, one 256-element unit of the GPU's slices and a bit,
// several slices, and more than a shared-memory chunk of 4 KiB.
inline constexpr std::size_t all_reduce_sizes[] = {0, 1, 2, 3, 5, 7, 17, 1000, 4099, 65539, 70001, 100003};

template <class T>
std::string describe(reduce_op op, std::size_t n) {
  return std::string(to_string(op)) + " of " + std::to_string(n) + " " + std::string(to_string(dtype_of<T>));
}

}  // namespace distribute::test::communicator_cases

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_AUTO_TEST_CASE_TEMPLATE(all_reduce_gives_every_rank_the_reduction, Case,
                              distribute::test::communicator_cases::all_reduce_cases) {
  using namespace distribute::test::communicator_cases;
  using G = typename Case::groups;
  using T = typename Case::element;
  using R = typename G::reference;
  G::for_each([](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    for (const distribute::reduce_op op : R::ops)
      for (const std::size_t n : all_reduce_sizes)
        for (int memory = 0; memory < G::memories; ++memory) {
          std::vector<std::vector<T>> inputs;
          for (std::size_t r = 0; r < n_ranks; ++r)
            inputs.push_back(R::template values<T>(static_cast<int>(r), n, op, 7));
          const auto want = R::template reduced<T>(op, inputs);
          std::vector<std::vector<T>> got(n_ranks);
          const auto held = g.run([&](int rank, typename G::communicator& c) {
            auto b = g.template buffer<T>(rank, inputs[static_cast<std::size_t>(rank)], memory);
            c.all_reduce(op, b.span());
            got[static_cast<std::size_t>(rank)] = b.values();
          });
          for (const int r : held)
            BOOST_TEST(R::template same<T>(op, got[static_cast<std::size_t>(r)], want),
                       g.name() << ": all_reduce(" << describe<T>(op, n) << ") in " << g.memory_name(memory)
                                << " differs on rank " << r);
        }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(all_reduce_gives_the_same_bits_on_every_rank_and_in_every_run, Case,
                              distribute::test::communicator_cases::collective_cases_typed) {
  // Values whose sum depends on the order it is taken in: every rank holds the bits of rank 0, and
  // every run those of the first (compared through digests that the ranks gather, so that workers
  // of different processes are compared too).
  using namespace distribute::test::communicator_cases;
  using G = typename Case::groups;
  using T = typename Case::element;
  using R = typename G::reference;
  G::for_each([](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    const std::pair<std::size_t, int> sizes_and_runs[] = {{10007, 100}, {50001, 2}};
    for (const auto op : {distribute::reduce_op::sum, distribute::reduce_op::mean})
      for (const auto& [n, runs] : sizes_and_runs)
        for (int memory = 0; memory < G::memories; ++memory) {
          std::vector<std::vector<T>> inputs;
          for (std::size_t r = 0; r < n_ranks; ++r)
            inputs.push_back(R::template irregular<T>(static_cast<int>(r), n, 11));
          std::vector<T> want;
          if constexpr (R::reduces_irregular_values_exactly) want = R::template reduced<T>(op, inputs);
          std::int64_t first = 0;
          std::size_t across_ranks = 0, across_runs = 0, not_reduced = 0;
          for (int run = 0; run < runs; ++run) {
            std::vector<std::vector<std::int64_t>> digests(n_ranks);
            std::vector<std::vector<T>> got(n_ranks);
            const auto held = g.run([&](int rank, typename G::communicator& c) {
              const auto me = static_cast<std::size_t>(rank);
              auto b = g.template buffer<T>(rank, inputs[me], memory);
              c.all_reduce(op, b.span());
              got[me] = b.values();
              const auto mine = std::bit_cast<std::int64_t>(distribute::detail::fnv1a(got[me].data(), n * sizeof(T)));
              digests[me].resize(n_ranks);
              c.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(digests[me]));
            });
            for (const int r : held) {
              const auto& d = digests[static_cast<std::size_t>(r)];
              if (run == 0) first = d[0];
              for (const auto x : d) across_ranks += x != d[0];
              across_runs += d[0] != first;
              if constexpr (R::reduces_irregular_values_exactly)
                if (run == 0) not_reduced += !R::template same<T>(op, got[static_cast<std::size_t>(r)], want);
            }
          }
          const auto what = g.name() + ": all_reduce(" + describe<T>(op, n) + ") in " + g.memory_name(memory);
          BOOST_TEST(across_ranks == 0u, what << ": ranks hold different bits");
          BOOST_TEST(across_runs == 0u, what << ": runs give different bits");
          BOOST_TEST(not_reduced == 0u, what << ": not the reference's bits");
        }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fused_buffers_reduce_as_one_collective, Case,
                              distribute::test::communicator_cases::collective_cases_typed) {
  // Buffers of different lengths (one empty; enough elements for blocks and chunks that span several
  // buffers), in every kind of memory at once, reduced in one call: each as if reduced alone.
  using namespace distribute::test::communicator_cases;
  using G = typename Case::groups;
  using T = typename Case::element;
  using R = typename G::reference;
  const std::vector<std::size_t> lengths{5, 0, 1000, 3, 17, 4096, 70001, 140003};
  G::for_each([&](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    for (const distribute::reduce_op op : R::ops)
      for (int shift = 0; shift < G::memories; ++shift) {
        std::vector<std::vector<std::vector<T>>> inputs(n_ranks);
        for (std::size_t r = 0; r < n_ranks; ++r)
          for (std::size_t i = 0; i < lengths.size(); ++i)
            inputs[r].push_back(
                R::template values<T>(static_cast<int>(r), lengths[i], op, 100 + static_cast<std::uint32_t>(i)));
        std::vector<std::vector<T>> want;
        for (std::size_t i = 0; i < lengths.size(); ++i) {
          std::vector<std::vector<T>> of_buffer;
          for (std::size_t r = 0; r < n_ranks; ++r) of_buffer.push_back(inputs[r][i]);
          want.push_back(R::template reduced<T>(op, of_buffer));
        }
        std::vector<std::vector<std::vector<T>>> got(n_ranks);
        const auto held = g.run([&](int rank, typename G::communicator& c) {
          const auto me = static_cast<std::size_t>(rank);
          using buffer = decltype(g.template buffer<T>(rank, std::vector<T>{}, 0));
          std::vector<buffer> bufs;
          std::vector<std::span<T>> spans;
          for (std::size_t i = 0; i < lengths.size(); ++i)
            bufs.push_back(g.template buffer<T>(rank, inputs[me][i],
                                                static_cast<int>(i + static_cast<std::size_t>(shift)) % G::memories));
          for (auto& b : bufs) spans.push_back(b.span());
          c.all_reduce(op, std::span<const std::span<T>>(spans));
          for (const auto& b : bufs) got[me].push_back(b.values());
        });
        for (const int r : held)
          for (std::size_t i = 0; i < lengths.size(); ++i)
            BOOST_TEST(R::template same<T>(op, got[static_cast<std::size_t>(r)][i], want[i]),
                       g.name() << ": buffer " << i << " of a fused all_reduce(" << describe<T>(op, lengths[i])
                                << ") differs on rank " << r);
      }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(all_gather_orders_blocks_by_rank, Case,
                              distribute::test::communicator_cases::collective_cases_typed) {
  using namespace distribute::test::communicator_cases;
  using G = typename Case::groups;
  using T = typename Case::element;
  using R = typename G::reference;
  G::for_each([](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{33}, std::size_t{1001}, std::size_t{1003}})
      for (int in_memory = 0; in_memory < G::memories; ++in_memory)
        for (int out_memory = 0; out_memory < G::memories; ++out_memory) {
          std::vector<T> want;
          for (std::size_t r = 0; r < n_ranks; ++r) {
            const auto v = R::template values<T>(static_cast<int>(r), n, distribute::reduce_op::sum, 3);
            want.insert(want.end(), v.begin(), v.end());
          }
          std::vector<std::vector<T>> got(n_ranks);
          const auto held = g.run([&](int rank, typename G::communicator& c) {
            auto in =
                g.template buffer<T>(rank, R::template values<T>(rank, n, distribute::reduce_op::sum, 3), in_memory);
            auto out = g.template buffer<T>(rank, std::vector<T>(n * n_ranks), out_memory);
            c.all_gather(std::span<const T>(in.span()), out.span());
            got[static_cast<std::size_t>(rank)] = out.values();
          });
          for (const int r : held)
            BOOST_TEST((got[static_cast<std::size_t>(r)] == want),
                       g.name() << ": all_gather of " << n << " " << distribute::to_string(distribute::dtype_of<T>)
                                << " from " << g.memory_name(in_memory) << " to " << g.memory_name(out_memory)
                                << " on rank " << r);
        }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_scatter_gives_each_rank_its_reduced_block, Case,
                              distribute::test::communicator_cases::collective_cases_typed) {
  using namespace distribute::test::communicator_cases;
  using G = typename Case::groups;
  using T = typename Case::element;
  using R = typename G::reference;
  G::for_each([](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    for (const distribute::reduce_op op : R::ops)
      for (const std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{9}, std::size_t{33}, std::size_t{1003}})
        for (int in_memory = 0; in_memory < G::memories; ++in_memory)
          for (int out_memory = 0; out_memory < G::memories; ++out_memory) {
            std::vector<std::vector<T>> inputs;
            for (std::size_t r = 0; r < n_ranks; ++r)
              inputs.push_back(R::template values<T>(static_cast<int>(r), m * n_ranks, op, 5));
            const auto reduced = R::template reduced<T>(op, inputs);
            std::vector<std::vector<T>> got(n_ranks);
            const auto held = g.run([&](int rank, typename G::communicator& c) {
              const auto me = static_cast<std::size_t>(rank);
              auto in = g.template buffer<T>(rank, inputs[me], in_memory);
              auto out = g.template buffer<T>(rank, std::vector<T>(m), out_memory);
              c.reduce_scatter(op, std::span<const T>(in.span()), out.span());
              got[me] = out.values();
            });
            for (const int r : held) {
              const auto block = static_cast<std::ptrdiff_t>(m) * r;
              const std::vector<T> want(reduced.begin() + block,
                                        reduced.begin() + block + static_cast<std::ptrdiff_t>(m));
              BOOST_TEST(R::template same<T>(op, got[static_cast<std::size_t>(r)], want),
                         g.name() << ": reduce_scatter(" << describe<T>(op, m) << " a block) from "
                                  << g.memory_name(in_memory) << " to " << g.memory_name(out_memory) << " on rank "
                                  << r);
            }
          }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(broadcast_from_every_root, Case,
                              distribute::test::communicator_cases::collective_cases_typed) {
  using namespace distribute::test::communicator_cases;
  using G = typename Case::groups;
  using T = typename Case::element;
  using R = typename G::reference;
  G::for_each([](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    for (const std::size_t n : {std::size_t{1}, std::size_t{4}, std::size_t{517}, std::size_t{1001}})
      for (int root = 0; root < g.ranks(); ++root)
        for (int memory = 0; memory < G::memories; ++memory) {
          std::vector<std::vector<T>> got(n_ranks);
          const auto held = g.run([&](int rank, typename G::communicator& c) {
            auto b = g.template buffer<T>(rank, R::template values<T>(rank, n, distribute::reduce_op::sum, 9), memory);
            c.broadcast(b.span(), root);
            got[static_cast<std::size_t>(rank)] = b.values();
          });
          const auto want = R::template values<T>(root, n, distribute::reduce_op::sum, 9);
          for (const int r : held)
            BOOST_TEST((got[static_cast<std::size_t>(r)] == want),
                       g.name() << ": broadcast of " << n << " " << distribute::to_string(distribute::dtype_of<T>)
                                << " from rank " << root << " in " << g.memory_name(memory) << " on rank " << r);
        }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(barrier_orders_writes_before_reads, G,
                              distribute::test::communicator_cases::collective_group_list) {
  // Every rank writes its slot, meets the others, then must see every slot of this process written.
  G::for_each([](auto& g) {
    const auto n_ranks = static_cast<std::size_t>(g.ranks());
    std::size_t unseen = 0;
    for (int round = 0; round < 50; ++round) {
      std::vector<std::atomic<int>> slots(n_ranks);
      std::vector<std::size_t> seen(n_ranks);
      const auto held = g.run([&](int rank, typename G::communicator& c) {
        slots[static_cast<std::size_t>(rank)].store(round + 1, std::memory_order_relaxed);
        c.barrier();
        std::size_t count = 0;
        for (auto& x : slots) count += x.load(std::memory_order_relaxed) == round + 1;
        seen[static_cast<std::size_t>(rank)] = count;
      });
      for (const int r : held) unseen += seen[static_cast<std::size_t>(r)] != held.size();
    }
    BOOST_TEST(unseen == 0u, g.name() << ": a rank left a barrier before another had entered it");
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(wrong_sizes_are_refused_on_every_rank_before_any_waits, G,
                              distribute::test::communicator_cases::collective_group_list) {
  // Every rank makes the same mistakes: each is refused there and then (a rank that waited would
  // wait for ever), the communicator has not failed, and the next collective works.
  using namespace distribute::test::communicator_cases;
  G::for_each([](auto& g) {
    const int n = g.ranks();
    const auto n_ranks = static_cast<std::size_t>(n);
    for (int memory = 0; memory < G::memories; ++memory) {
      std::vector<int> refused(n_ranks), failed(n_ranks), sums(n_ranks);
      const auto held = g.run([&](int rank, typename G::communicator& c) {
        const auto me = static_cast<std::size_t>(rank);
        const auto refuses = [&](auto&& call) {
          try {
            call();
          } catch (const std::invalid_argument&) {
            ++refused[me];
          }
        };
        auto block = g.template buffer<float>(rank, std::vector<float>(3), memory);
        auto too_long = g.template buffer<float>(rank, std::vector<float>(3 * n_ranks + 1), memory);
        auto too_short = g.template buffer<float>(rank, std::vector<float>(3 * n_ranks - 1), memory);
        refuses([&] { c.all_gather(std::span<const float>(block.span()), too_long.span()); });
        refuses([&] { c.all_gather(std::span<const float>(block.span()), too_short.span()); });
        refuses([&] {
          c.reduce_scatter(distribute::reduce_op::sum, std::span<const float>(too_long.span()), block.span());
        });
        refuses([&] { c.broadcast(block.span(), n); });
        refuses([&] { c.broadcast(block.span(), -1); });
        failed[me] = has_failed(c);
        int one = 1;
        c.all_reduce(distribute::reduce_op::sum, std::span<int>(&one, 1));
        sums[me] = one;
        c.barrier();
      });
      for (const int r : held) {
        const auto i = static_cast<std::size_t>(r);
        BOOST_TEST(refused[i] == 5,
                   g.name() << ", " << g.memory_name(memory) << ": rank " << r << " refused " << refused[i] << " of 5");
        BOOST_TEST(!failed[i], g.name() << ": a refused call failed the communicator");
        BOOST_TEST(sums[i] == n, g.name() << ": the collective after the refused ones");
      }
    }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(disagreeing_calls_are_named_and_the_group_goes_on, G,
                              distribute::test::communicator_cases::mismatch_group_list) {
  // In host memory, which every communicator accepts.
  using namespace distribute::test::communicator_cases;
  using C = typename G::communicator;
  G::for_each([](auto& g) {
    if (!has_two_ranks(g)) return;
    const int n = g.ranks();
    std::vector<int> others;
    for (int q = 0; q < n; ++q)
      if (q != 1) others.push_back(q);

    // Rank 1 has one element more.
    auto msg = error_of<distribute::collective_mismatch>(g, [](int rank, C& c) {
      std::vector<float> v(rank == 1 ? 11 : 10, 1.0f);
      c.all_reduce(distribute::reduce_op::sum, std::span<float>(v));
    });
    BOOST_TEST(contains(msg, named(G::rank_name, {1}) + " called all_reduce(sum) of 11 float32"), g.name()
                                                                                                      << ": " << msg);
    BOOST_TEST(contains(msg, named(G::rank_name, others) + " called all_reduce(sum) of 10 float32"),
               g.name() << ": " << msg);

    // Rank 0 takes the max where the others sum.
    msg = error_of<distribute::collective_mismatch>(g, [](int rank, C& c) {
      std::vector<double> v(4, 1.0);
      c.all_reduce(rank == 0 ? distribute::reduce_op::max : distribute::reduce_op::sum, std::span<double>(v));
    });
    BOOST_TEST(contains(msg, "all_reduce(max) of 4 float64"), g.name() << ": " << msg);

    // Rank 0 waits at a barrier where the others gather.
    msg = error_of<distribute::collective_mismatch>(g, [n](int rank, C& c) {
      std::vector<int> in(1), out(static_cast<std::size_t>(n));
      if (rank == 0) c.barrier();
      else c.all_gather(std::span<const int>(in), std::span<int>(out));
    });
    BOOST_TEST((contains(msg, "called barrier") && contains(msg, "called all_gather")), g.name() << ": " << msg);

    // Nothing moved, so the ranks are still in step.
    std::vector<int> failed(static_cast<std::size_t>(n)), sums(static_cast<std::size_t>(n));
    const auto held = g.run([&](int rank, C& c) {
      const auto me = static_cast<std::size_t>(rank);
      failed[me] = has_failed(c);
      std::vector<int> ok(3, 1);
      c.all_reduce(distribute::reduce_op::sum, std::span<int>(ok));
      sums[me] = ok[2];
    });
    for (const int r : held) {
      BOOST_TEST(!failed[static_cast<std::size_t>(r)], g.name() << ": a mismatch failed the communicator");
      BOOST_TEST(sums[static_cast<std::size_t>(r)] == n, g.name() << ": the collective after the mismatches");
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
