#pragma once
// Copies a value's state from one worker to every other through a cross-worker communicator: what
// `mirror` and `broadcast` of a multi-worker strategy do between processes, where copy-assignment
// cannot reach. A value is sent as, in this order of preference:
//   - a model: every parameter (`for_each_parameter`) in one message, and its buffers
//     (`for_each_buffer`, e.g. running statistics) in another;
//   - an object that streams its state (`save(std::ostream&)` / `load(std::istream&)`: optimisers);
//   - a trivially copyable value: its bytes;
//   - a contiguous sequence of trivially copyable elements: its size, then its elements.

#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/detail/digest.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <ranges>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::detail {

template <class T>
concept with_buffers = requires(T& t) { t.for_each_buffer([](std::span<double>) {}); };
template <class T>
concept streams_state = requires(const T& c, T& t, std::ostream& os, std::istream& is) {
  c.save(os);
  t.load(is);
};
template <class T>
concept contiguous_state = std::ranges::contiguous_range<T> && std::ranges::sized_range<T> &&
                           std::is_trivially_copyable_v<std::ranges::range_value_t<T>>;

template <class T>
concept broadcastable_state =
    gradient_enumerable<T> || streams_state<T> || std::is_trivially_copyable_v<T> || contiguous_state<T>;

template <class Cross, class T>
void broadcast_bytes(Cross& cross, T* data, std::size_t n, int root) {
  cross.broadcast(std::span<unsigned char>(reinterpret_cast<unsigned char*>(data), n * sizeof(T)), root);
}

template <class Cross, broadcastable_state T>
void broadcast_state(Cross& cross, T& value, int root) {
  const bool is_root = cross.rank() == root;
  if constexpr (gradient_enumerable<T>) {
    using S = typename T::scalar_type;
    // Packed on the host (a GPU model's parameters are copied down and back up).
    std::vector<S> packed;
    value.for_each_parameter([&](std::span<S> v, std::span<S>) {
      packed.resize(packed.size() + v.size());
      copy_parameter_values<T>(v.data(), v.size(), packed.data() + packed.size() - v.size());
    });
    cross.broadcast(std::span<S>(packed), root);
    std::size_t at = 0;
    value.for_each_parameter([&](std::span<S> v, std::span<S>) {
      copy_parameter_values<T>(packed.data() + at, v.size(), v.data());
      at += v.size();
    });
    if constexpr (with_buffers<T>) {
      std::vector<double> buffers;
      value.for_each_buffer([&](std::span<double> b) { buffers.insert(buffers.end(), b.begin(), b.end()); });
      cross.broadcast(std::span<double>(buffers), root);
      at = 0;
      value.for_each_buffer([&](std::span<double> b) {
        if (!b.empty()) std::memcpy(b.data(), buffers.data() + at, b.size_bytes());
        at += b.size();
      });
    }
  } else if constexpr (streams_state<T>) {
    std::string bytes;
    if (is_root) {
      std::ostringstream os;
      value.save(os);
      bytes = std::move(os).str();
    }
    std::int64_t size = static_cast<std::int64_t>(bytes.size());
    cross.broadcast(std::span<std::int64_t>(&size, 1), root);
    bytes.resize(static_cast<std::size_t>(size));
    broadcast_bytes(cross, bytes.data(), bytes.size(), root);
    if (!is_root) {
      std::istringstream is(bytes);
      value.load(is);
    }
  } else if constexpr (std::is_trivially_copyable_v<T>) {
    broadcast_bytes(cross, &value, 1, root);
  } else {
    std::int64_t size = static_cast<std::int64_t>(std::ranges::size(value));
    cross.broadcast(std::span<std::int64_t>(&size, 1), root);
    if (static_cast<std::size_t>(size) != std::ranges::size(value)) {
      if constexpr (requires { value.resize(std::size_t{}); }) {
        value.resize(static_cast<std::size_t>(size));
      } else {
        throw std::invalid_argument("distribute: broadcast of a sequence of " +
                                    std::to_string(std::ranges::size(value)) +
                                    " elements from a worker whose copy has " + std::to_string(size));
      }
    }
    broadcast_bytes(cross, std::ranges::data(value), std::ranges::size(value), root);
  }
}

}  // namespace distribute::detail
