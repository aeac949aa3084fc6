#pragma once
// The communicator of a group of one. Every collective is the identity (or a copy from input to
// output), written inline so that the optimiser removes it: `one_device_strategy` pays nothing.

#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>
#include <distribute/comm/detail/check.hpp>

#include <algorithm>
#include <span>

namespace distribute::comm {

class local {
 public:
  constexpr int rank() const noexcept { return 0; }
  constexpr int size() const noexcept { return 1; }

  // A sum, min, max, prod or mean over one contribution is that contribution.
  template <element T>
  void all_reduce(reduce_op, std::span<T>) noexcept {}
  template <element T>
  void all_reduce(reduce_op, std::span<const std::span<T>>) noexcept {}

  template <element T>
  void reduce_scatter(reduce_op, std::span<const T> in, std::span<T> out) {
    detail::check_block_sizes("reduce_scatter", in.size(), out.size(), 1);
    copy_unless_same(in, out);
  }
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_block_sizes("all_gather", out.size(), in.size(), 1);
    copy_unless_same(in, out);
  }
  template <element T>
  void broadcast(std::span<T>, int root) {
    detail::check_root(root, 1);
  }
  void barrier() noexcept {}

 private:
  template <class T>
  static void copy_unless_same(std::span<const T> in, std::span<T> out) noexcept {
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
  }
};

}  // namespace distribute::comm
