#pragma once
// The replicas of a strategy as groups of the communicator cases (communicator_cases.hpp): each
// replica runs on its own thread with its replica context's communicator, as in a step, and a
// replica that throws releases the others before `run` rethrows. The communicators of one process
// reduce in the CPU engine's order, so their results are held to the serial reduction bit for bit.
// The CPU's groups are here (comm::local, comm::shared_memory); the GPU's are tests/gpu's.

#include "../core/test_support.hpp"
#include "communicator_cases.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::test {

// Irregular values (test_support.hpp) and their serial reduction in the CPU engine's order.
struct serial_reference {
  using element_types = communicator_cases::type_list_of<test::element_types>;
  using all_reduce_types = element_types;
  static constexpr const auto& ops = all_ops;

  template <class T>
  static std::vector<T> values(int rank, std::size_t n, reduce_op op, std::uint32_t seed) {
    return values_for<T>(rank, n, op, seed);
  }
  template <class T>
  static std::vector<T> reduced(reduce_op op, const std::vector<std::vector<T>>& inputs) {
    return serial_reduce(op, inputs);
  }
  template <class T>
  static bool same(reduce_op, const std::vector<T>& got, const std::vector<T>& want) {
    return bit_equal(got, want);
  }
  template <class T>
  static std::vector<T> irregular(int rank, std::size_t n, std::uint32_t seed) {
    return values_for<T>(rank, n, reduce_op::sum, seed);
  }
  static constexpr bool reduces_irregular_values_exactly = true;
};

// The replicas of the strategy S. `Memory` makes each replica's buffers on its device: host memory
// by default, device or host memory on a GPU.
template <class S, class Memory = communicator_cases::host_memory>
class strategy_group {
 public:
  using communicator = typename S::replica_type::communicator_type;
  using device_type = typename S::replica_type::device_type;

  // `make()` returns the strategy.
  template <class Make>
  strategy_group(std::string name, Make make)
      : s_(make()), name_{std::move(name)}, devices_(static_cast<std::size_t>(s_.num_replicas_in_sync())) {}

  std::string name() const { return name_; }
  int ranks() const { return static_cast<int>(s_.num_replicas_in_sync()); }

  std::vector<int> run(const std::function<void(int, communicator&)>& f) {
    s_.run([&](auto& r) {
      const int rank = r.replica_id();
      devices_[static_cast<std::size_t>(rank)].emplace(r.device());
      f(rank, r.communicator());
    });
    std::vector<int> all(static_cast<std::size_t>(ranks()));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }

  static const char* memory_name(int memory) { return Memory::name(memory); }

  // Called by replica `rank` inside `run`, which has recorded its device.
  template <class T>
  auto buffer(int rank, std::vector<T> values, int memory) const {
    return Memory::template buffer<T>(*devices_[static_cast<std::size_t>(rank)], std::move(values), memory);
  }

 private:
  S s_;
  std::string name_;
  std::vector<std::optional<device_type>> devices_;
};

// The settings of the CPU's groups.
struct cpu_groups {
  using reference = serial_reference;
  static constexpr int memories = 1;
  static constexpr const char* rank_name = "replica";
};

// comm::shared_memory: mirrored_strategy<cpu> with each of `Replicas` replicas.
template <int... Replicas>
struct shared_memory_groups : cpu_groups {
  using communicator = comm::shared_memory;
  static constexpr bool names_mismatches = true;
  static constexpr bool names_message_mismatches = true;

  template <class F>
  static void for_each(F&& f) {
    for (const int n : {Replicas...}) {
      strategy_group<mirrored_strategy<>> g("shared_memory, " + std::to_string(n) + " replicas", [n] {
        return mirrored_strategy<>(cpu_replicas(n), collective_options{.timeout = std::chrono::minutes(1)});
      });
      static_assert(std::is_same_v<typename decltype(g)::communicator, communicator>);
      communicator_cases::each_on_its_own(g, f);
    }
  }
};

// comm::local: the one replica of one_device_strategy<cpu>.
struct local_groups : cpu_groups {
  using communicator = comm::local;
  static constexpr bool names_mismatches = false;
  static constexpr bool names_message_mismatches = false;

  template <class F>
  static void for_each(F&& f) {
    strategy_group<one_device_strategy<>> g("local", [] { return one_device_strategy<>{}; });
    static_assert(std::is_same_v<typename decltype(g)::communicator, communicator>);
    f(g);
  }
};

}  // namespace distribute::test
