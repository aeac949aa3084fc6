#pragma once
// A communicator is one rank's endpoint of a group that runs collectives together. The concept is
// deliberately small; communicators (shared memory, MPI, NCCL) differ in everything else.
//
// Every collective is called by every rank of the group, in the same order, with matching arguments:
//   all_reduce(op, buf)        in place; buf is the same length on every rank
//   all_reduce(op, bufs)       several buffers fused into one collective (same lengths on every rank)
//   reduce_scatter(op, in, out) in.size() == size() * out.size(); rank r receives reduced block r
//   all_gather(in, out)        out.size() == size() * in.size(); block r of out is rank r's in
//   broadcast(buf, root)       every rank's buf becomes root's
//   barrier()
//
// Some communicators also pass messages between two ranks and split into sub-groups
// (`point_to_point_communicator`): shared memory, MPI, NCCL; `local` has no other rank to talk to.
//   send(buf, dst, tag)        to rank dst, matched by tag >= 0; may return before it is received
//   recv(buf, src, tag)        the message src sent with tag: the same element type and length
//   split(color, key)          a collective; an endpoint of the group of the ranks with the same color

#include <distribute/reduce_op.hpp>

#include <concepts>
#include <span>

namespace distribute {

template <class C>
concept communicator = requires(C& c, const C& cc, reduce_op op, std::span<float> buf, std::span<const float> in,
                                std::span<const std::span<float>> bufs, std::span<double> dbuf, std::span<int> ibuf) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.all_reduce(op, buf);
  c.all_reduce(op, dbuf);
  c.all_reduce(op, bufs);
  c.reduce_scatter(op, in, buf);
  c.all_gather(in, buf);
  c.broadcast(buf, 0);
  c.broadcast(ibuf, 0);
  c.barrier();
};

template <class C>
concept point_to_point_communicator =
    communicator<C> && requires(C& c, std::span<const float> in, std::span<float> out) {
      c.send(in, 1, 0);
      c.recv(out, 0, 0);
      c.split(0, 0);
    };

}  // namespace distribute
