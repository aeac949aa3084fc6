#pragma once
// Tensors, layers and losses in one include (needs Eigen 3.3 or later); the optimisers that step
// them are <distribute/optim.hpp>. Eigen views of tensors are opt-in: <distribute/tensor/eigen.hpp>
// (Matrix maps), <distribute/tensor/eigen_tensor.hpp>.

#include <distribute/tensor/shape.hpp>
#include <distribute/tensor/tensor.hpp>

#include <distribute/nn/activations.hpp>
#include <distribute/nn/batch_norm.hpp>
#include <distribute/nn/broadcasting.hpp>
#include <distribute/nn/check_gradients.hpp>
#include <distribute/nn/classification_losses.hpp>
#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/conv_transpose2d.hpp>
#include <distribute/nn/dropout.hpp>
#include <distribute/nn/embedding.hpp>
#include <distribute/nn/elementwise.hpp>
#include <distribute/nn/flatten.hpp>
#include <distribute/nn/gradients.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/layer_norm.hpp>
#include <distribute/nn/linear.hpp>
#include <distribute/nn/losses.hpp>
#include <distribute/nn/module.hpp>
#include <distribute/nn/parameter.hpp>
#include <distribute/nn/penalties.hpp>
#include <distribute/nn/pixel_shuffle.hpp>
#include <distribute/nn/pooling.hpp>
#include <distribute/nn/reductions.hpp>
#include <distribute/nn/residual_block.hpp>
#include <distribute/nn/sequential.hpp>
#include <distribute/nn/shape_ops.hpp>
#include <distribute/nn/spectral_norm.hpp>
#include <distribute/nn/tape.hpp>
#include <distribute/nn/tape_ops.hpp>
#include <distribute/nn/tensor_ops.hpp>
#include <distribute/nn/upsample.hpp>
#include <distribute/nn/with_precision.hpp>
