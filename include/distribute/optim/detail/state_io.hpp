#pragma once
// The binary form of optimiser state: a tag, the step count, then each buffer as (count, values).
// Native byte order: state is saved and restored on the same kind of machine (checkpoints add their
// own checksum and atomic write around it).

#include <cstdint>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::optim::detail {

template <class V>
void write_pod(std::ostream& os, const V& v) {
  os.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class V>
V read_pod(std::istream& is) {
  V v{};
  if (!is.read(reinterpret_cast<char*>(&v), sizeof v))
    throw std::runtime_error("distribute: truncated optimiser state");
  return v;
}

template <class T>
void write_buffers(std::ostream& os, const std::vector<std::vector<T>>& buffers) {
  write_pod(os, static_cast<std::uint64_t>(buffers.size()));
  for (const auto& b : buffers) {
    write_pod(os, static_cast<std::uint64_t>(b.size()));
    os.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size() * sizeof(T)));
  }
}

template <class T>
std::vector<std::vector<T>> read_buffers(std::istream& is) {
  const auto n = read_pod<std::uint64_t>(is);
  if (n > (std::uint64_t{1} << 32)) throw std::runtime_error("distribute: corrupt optimiser state (buffer count)");
  std::vector<std::vector<T>> buffers;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto size = read_pod<std::uint64_t>(is);
    if (size > (std::uint64_t{1} << 40) / sizeof(T))
      throw std::runtime_error("distribute: corrupt optimiser state (buffer size)");
    std::vector<T> b(static_cast<std::size_t>(size));
    if (!is.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size() * sizeof(T))))
      throw std::runtime_error("distribute: truncated optimiser state");
    buffers.push_back(std::move(b));
  }
  return buffers;
}

inline void write_tag(std::ostream& os, const char (&tag)[8]) { os.write(tag, 8); }
inline void read_tag(std::istream& is, const char (&tag)[8]) {
  char got[8]{};
  if (!is.read(got, 8) || std::string(got, 8) != std::string(tag, 8))
    throw std::runtime_error(std::string("distribute: not a saved ") + tag + " optimiser state");
}

// Parameter `index` of the model has `size` elements, which its state does not (or it has no state).
[[noreturn]] inline void throw_state_mismatch(std::size_t index, std::size_t size) {
  throw std::invalid_argument("distribute: optimiser state does not match the model (parameter " +
                              std::to_string(index) + " has " + std::to_string(size) + " elements)");
}

// Buffers are created on the first step, one per parameter in enumeration order; a later step must
// see the same parameters. (Host buffers; state_buffers.hpp holds them wherever the model is.)
template <class T>
std::vector<T>& buffer_for(std::vector<std::vector<T>>& buffers, std::size_t index, std::size_t size) {
  if (index == buffers.size()) buffers.push_back(std::vector<T>(size));  // zero-filled
  if (index > buffers.size() || buffers[index].size() != size) throw_state_mismatch(index, size);
  return buffers[index];
}

}  // namespace distribute::optim::detail
