#pragma once
// multi_worker_mirrored_strategy<cuda, comm::nccl>: many processes (workers, started by mpirun or
// srun), each driving one or more GPUs with a replica thread per GPU, all joined by one NCCL
// communicator that spans the job. The strategy template of strategy/multi_worker_mirrored_strategy.hpp
// with the GPU worker group (cuda/strategy/detail/worker_group.cuh): the same replica numbering,
// cross-worker operations and failure semantics as on the CPU.
//
//   mpirun -np 8 ./train            one GPU per worker: node-local rank k takes cuda:k
//   multi_worker_mirrored_strategy<cuda, comm::nccl> s{argc, argv, {.devices = {0, 1}}};  two GPUs
//
// Replicas are numbered across the job (worker w holds replicas first(w) ...), and
// `num_replicas_in_sync()` counts them all; per-replica and mirrored values hold this worker's.
// `reduce`, `gather`, `verify_mirrored` and the broadcast of host state go over MPI; GPU tensors are
// broadcast over NCCL.

#include <distribute/concepts/strategy.hpp>
#include <distribute/cuda/strategy/detail/worker_group.cuh>
#include <distribute/strategy/multi_worker_mirrored_strategy.hpp>

namespace distribute {

static_assert(strategy<multi_worker_mirrored_strategy<cuda, comm::nccl>>);

}  // namespace distribute
