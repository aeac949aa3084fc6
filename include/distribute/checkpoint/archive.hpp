#pragma once
// What a checkpoint holds: named binary sections, in the order they were put. Typed helpers turn the
// usual training state into sections and back: plain values (step, epoch, seeds), vectors, models
// (every parameter and, where a layer has them, its running statistics), optimisers (through their
// save/load), and standard random engines (through their text form). A model on a GPU is read and
// written through the host, so the section is the same bytes whichever device wrote it: a model
// trained on a GPU loads into the same model on a CPU, and back.
//
// Loading never leaves an object half-written: the section is checked against the object first
// (counts, sizes, element width), and only then copied in. Values are in this machine's byte order;
// the file format (checkpoint/file.hpp) refuses files of the other order.

#include <distribute/checkpoint/error.hpp>
#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/detail/digest.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::checkpoint {

// A model as checkpoints see it: its parameters (the gradient-enumeration that optimisers and
// all_reduce_gradients use), optionally with non-trainable buffers such as running statistics.
template <class M>
concept has_buffers = requires(M& m) { m.for_each_buffer([](std::span<double>) {}); };

// Optimisers and other objects that stream their own state.
template <class S>
concept saveable = requires(const S& s, std::ostream& os) { s.save(os); };
template <class S>
concept loadable = requires(S& s, std::istream& is) { s.load(is); };

namespace detail {

class byte_writer {
 public:
  template <class T>
  void pod(const T& v) {
    raw(&v, sizeof v);
  }
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte> take() && { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Reads with bounds checks; `what` names the section in errors.
class byte_reader {
 public:
  byte_reader(std::span<const std::byte> in, std::string_view what) : in_{in}, what_{what} {}
  template <class T>
  T pod() {
    T v{};
    std::memcpy(&v, take(sizeof v).data(), sizeof v);
    return v;
  }
  std::span<const std::byte> take(std::size_t n) {
    if (n > in_.size() - pos_) fail("is truncated");
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::size_t left() const noexcept { return in_.size() - pos_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw checkpoint_error("distribute: checkpoint section '" + std::string(what_) + "' " + why);
  }

 private:
  std::span<const std::byte> in_;
  std::string_view what_;
  std::size_t pos_ = 0;
};

}  // namespace detail

class archive {
 public:
  // --- raw sections ----------------------------------------------------------------------------
  void put_bytes(std::string name, std::span<const std::byte> bytes) {
    if (name.empty()) throw std::invalid_argument("distribute: a checkpoint section needs a name");
    if (contains(name)) throw std::invalid_argument("distribute: checkpoint section '" + name + "' is already present");
    index_.emplace(name, sections_.size());
    sections_.emplace_back(std::move(name), std::vector<std::byte>(bytes.begin(), bytes.end()));
  }
  std::span<const std::byte> bytes(std::string_view name) const {
    if (const auto it = index_.find(name); it != index_.end()) return sections_[it->second].second;
    std::string present;
    for (const auto& [n, b] : sections_) present += (present.empty() ? "" : ", ") + n;
    throw checkpoint_error("distribute: the checkpoint has no section '" + std::string(name) +
                           "' (it has: " + (present.empty() ? "nothing" : present) + ")");
  }
  bool contains(std::string_view name) const { return index_.find(name) != index_.end(); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& s : sections_) out.push_back(s.first);
    return out;
  }
  const std::vector<std::pair<std::string, std::vector<std::byte>>>& sections() const noexcept { return sections_; }

  // --- plain values ----------------------------------------------------------------------------
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put(std::string name, const T& value) {
    put_bytes(std::move(name), std::as_bytes(std::span<const T, 1>(&value, 1)));
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  T get(std::string_view name) const {
    const auto b = bytes(name);
    if (b.size() != sizeof(T))
      throw checkpoint_error("distribute: checkpoint section '" + std::string(name) + "' holds " +
                             std::to_string(b.size()) + " bytes; the value asked for has " + std::to_string(sizeof(T)));
    T v;
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }

  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put_vector(std::string name, const std::vector<T>& v) {
    put_bytes(std::move(name), std::as_bytes(std::span<const T>(v)));
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  std::vector<T> get_vector(std::string_view name) const {
    const auto b = bytes(name);
    if (b.size() % sizeof(T) != 0)
      throw checkpoint_error("distribute: checkpoint section '" + std::string(name) + "' holds " +
                             std::to_string(b.size()) + " bytes, not a whole number of " + std::to_string(sizeof(T)) +
                             "-byte elements");
    std::vector<T> v(b.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }

  // --- models ----------------------------------------------------------------------------------
  // Layout: u32 element width, u64 parameter count, each (u64 n, n values); u64 buffer count, each
  // (u64 n, n doubles).
  template <gradient_enumerable M>
  void put_model(std::string name, M& model) {
    using T = typename M::scalar_type;
    detail::byte_writer w;
    w.pod(static_cast<std::uint32_t>(sizeof(T)));
    const auto params = parameters_of(model);
    w.pod(static_cast<std::uint64_t>(params.size()));
    std::vector<T> staged;  // a device model's parameter, read through the host
    for (auto p : params) {
      w.pod(static_cast<std::uint64_t>(p.size()));
      if constexpr (distribute::detail::host_parameters<M>) {
        w.raw(p.data(), p.size_bytes());
      } else {
        staged.resize(p.size());
        distribute::detail::copy_parameter_values<M>(p.data(), p.size(), staged.data());
        w.raw(staged.data(), p.size_bytes());
      }
    }
    const auto bufs = buffers_of(model);
    w.pod(static_cast<std::uint64_t>(bufs.size()));
    for (auto b : bufs) {
      w.pod(static_cast<std::uint64_t>(b.size()));
      w.raw(b.data(), b.size_bytes());
    }
    put_bytes(std::move(name), std::move(w).take());
  }

  template <gradient_enumerable M>
  void get_model(std::string_view name, M& model) const {
    using T = typename M::scalar_type;
    detail::byte_reader r{bytes(name), name};
    if (const auto width = r.pod<std::uint32_t>(); width != sizeof(T))
      r.fail("holds " + std::to_string(width) + "-byte parameters; the model has " + std::to_string(sizeof(T)) +
             "-byte ones");
    const auto params = parameters_of(model);
    const auto bufs = buffers_of(model);
    // Check everything before writing anything.
    std::vector<std::span<const std::byte>> param_bytes, buf_bytes;
    read_spans(r, params, param_bytes, "parameter");
    read_spans(r, bufs, buf_bytes, "buffer");
    if (r.left() != 0) r.fail("has " + std::to_string(r.left()) + " bytes after the model's state");
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].empty()) continue;
      if constexpr (distribute::detail::host_parameters<M>) {
        std::memcpy(params[i].data(), param_bytes[i].data(), param_bytes[i].size());
      } else {  // a device model: the bytes may be unaligned for T, so they go through an aligned copy
        std::vector<T> staged(params[i].size());
        std::memcpy(staged.data(), param_bytes[i].data(), param_bytes[i].size());
        distribute::detail::copy_parameter_values<M>(staged.data(), staged.size(), params[i].data());
      }
    }
    for (std::size_t i = 0; i < bufs.size(); ++i)
      if (!bufs[i].empty()) std::memcpy(bufs[i].data(), buf_bytes[i].data(), buf_bytes[i].size());
  }

  // --- objects that save and load themselves (optimisers) --------------------------------------
  template <saveable S>
  void put_state(std::string name, const S& s) {
    std::ostringstream os(std::ios::binary);
    s.save(os);
    if (!os) throw checkpoint_error("distribute: could not serialise checkpoint section '" + name + "'");
    put_string(std::move(name), std::move(os).str());
  }
  template <loadable S>
  void get_state(std::string_view name, S& s) const {
    std::istringstream is(as_string(name), std::ios::binary);
    try {
      s.load(is);
    } catch (const checkpoint_error&) {
      throw;
    } catch (const std::exception& e) {
      throw checkpoint_error("distribute: checkpoint section '" + std::string(name) +
                             "' could not be loaded: " + e.what());
    }
    if (is.peek() != std::char_traits<char>::eof())
      throw checkpoint_error("distribute: checkpoint section '" + std::string(name) +
                             "' has bytes left after the object's state (a different type or version?)");
  }

  // --- streamable values (standard random engines) --------------------------------------------
  template <class E>
    requires requires(std::ostream& os, const E& e) { os << e; }
  void put_text(std::string name, const E& e) {
    std::ostringstream os;
    os << e;
    put_string(std::move(name), std::move(os).str());
  }
  template <class E>
    requires requires(std::istream& is, E& e) { is >> e; }
  void get_text(std::string_view name, E& e) const {
    std::istringstream is(as_string(name));
    E value = e;
    if (!(is >> value) || (is >> std::ws, !is.eof()))
      throw checkpoint_error("distribute: checkpoint section '" + std::string(name) + "' is not a valid saved value");
    e = std::move(value);
  }

  friend bool operator==(const archive&, const archive&) = default;

 private:
  void put_string(std::string name, const std::string& s) {
    put_bytes(std::move(name), std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  std::string as_string(std::string_view name) const {
    const auto b = bytes(name);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }

  template <class M>
  static auto parameters_of(M& model) {
    std::vector<std::span<typename M::scalar_type>> out;
    model.for_each_parameter([&](auto value, auto) { out.push_back(value); });
    return out;
  }
  template <class M>
  static std::vector<std::span<double>> buffers_of(M& model) {
    std::vector<std::span<double>> out;
    if constexpr (has_buffers<M>) model.for_each_buffer([&](std::span<double> b) { out.push_back(b); });
    return out;
  }

  template <class Span>
  static void read_spans(detail::byte_reader& r, const std::vector<Span>& target,
                         std::vector<std::span<const std::byte>>& out, const char* kind) {
    const auto count = r.pod<std::uint64_t>();
    if (count != target.size())
      r.fail("holds " + std::to_string(count) + " " + kind + "s; the model has " + std::to_string(target.size()));
    for (std::size_t i = 0; i < target.size(); ++i) {
      const auto n = r.pod<std::uint64_t>();
      if (n != target[i].size())
        r.fail("holds " + std::to_string(n) + " values for " + kind + " " + std::to_string(i) + "; the model's has " +
               std::to_string(target[i].size()));
      out.push_back(r.take(target[i].size_bytes()));
    }
  }

  std::vector<std::pair<std::string, std::vector<std::byte>>> sections_;
  // Name -> position in sections_: a file of n sections loads in O(n log n), not O(n^2).
  std::map<std::string, std::size_t, std::less<>> index_;
};

}  // namespace distribute::checkpoint
