#pragma once
// The communicator of a group of one. Every collective is the identity (or a copy from input to
// output), written inline so that the optimiser removes it: `one_device_strategy` pays nothing.
//
// `group_of_one<Copy>` is that communicator for any device: `Copy` moves the elements of
// all_gather and reduce_scatter from input to output (a host copy here; the GPU's group of one,
// comm::cuda_solo, copies in its stream order because its buffers may be device memory).

#include <distribute/concepts/communicator.hpp>
#include <distribute/comm/argument_checks.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <span>
#include <utility>

namespace distribute::comm {

template <class Copy>
class group_of_one {
 public:
  constexpr group_of_one() = default;
  constexpr explicit group_of_one(Copy copy) : copy_{std::move(copy)} {}

  constexpr int rank() const noexcept { return 0; }
  constexpr int size() const noexcept { return 1; }

  // A sum, min, max, prod or mean over one contribution is that contribution.
  template <element T>
  void all_reduce(reduce_op, std::span<T>) noexcept {}
  template <element T>
  void all_reduce(reduce_op, std::span<const std::span<T>>) noexcept {}

  template <element T>
  void reduce_scatter(reduce_op, std::span<const T> in, std::span<T> out) {
    check_block_sizes("reduce_scatter", in.size(), out.size(), 1);
    copy_unless_same(in, out);
  }
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_block_sizes("all_gather", out.size(), in.size(), 1);
    copy_unless_same(in, out);
  }
  template <element T>
  void broadcast(std::span<T>, int root) {
    check_root(root, 1);
  }
  void barrier() noexcept {}

 private:
  template <class T>
  void copy_unless_same(std::span<const T> in, std::span<T> out) {
    if (!in.empty() && in.data() != out.data()) copy_(in, out);
  }
  [[no_unique_address]] Copy copy_{};
};

namespace detail {
struct host_copy {
  template <class T>
  void operator()(std::span<const T> in, std::span<T> out) const noexcept {
    std::copy(in.begin(), in.end(), out.begin());
  }
};
}  // namespace detail

class local : public group_of_one<detail::host_copy> {};

static_assert(distribute::communicator<local>);

}  // namespace distribute::comm
