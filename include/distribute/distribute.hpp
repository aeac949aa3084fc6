#pragma once
// The whole library in one include.

#include <distribute/config.hpp>

#include <distribute/bfloat16.hpp>
#include <distribute/collective_options.hpp>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/reduce_op.hpp>

#include <distribute/concepts/communicator.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/concepts/distributed_dataset.hpp>
#include <distribute/concepts/replica.hpp>
#include <distribute/concepts/strategy.hpp>

#include <distribute/comm/local.hpp>
#include <distribute/comm/shared_memory.hpp>

#include <distribute/device/cpu.hpp>
#include <distribute/replica_context.hpp>

#include <distribute/strategy/mirrored_strategy.hpp>
#include <distribute/strategy/one_device_strategy.hpp>
#include <distribute/strategy/placement.hpp>

// Workers in processes joined by MPI; present when <mpi.h> is on the include path (link
// distribute::mpi).
#if __has_include(<mpi.h>)
#  include <distribute/comm/hierarchical.hpp>
#  include <distribute/comm/mpi.hpp>
#  include <distribute/strategy/multi_worker_mirrored_strategy.hpp>
#endif

#include <distribute/checkpoint.hpp>
#include <distribute/preemption.hpp>

// Tensors, layers and optimisers need Eigen; included when it is on the include path.
#if __has_include(<Eigen/Core>)
#  include <distribute/nn.hpp>
#  include <distribute/optim.hpp>
#endif

// The input pipeline; IDX sources when zlib is on the include path. Image folders are not included
// here (stb brings private copies of its decoders into every file that includes them):
// #include <distribute/data/image_folder.hpp>, or <distribute/data.hpp> for the whole layer.
#include <distribute/data/dataset.hpp>
#include <distribute/data/distribute.hpp>
#include <distribute/data/from_memory.hpp>
#if __has_include(<zlib.h>)
#  include <distribute/data/fashion_mnist.hpp>
#endif
