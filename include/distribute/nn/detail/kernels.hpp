#pragma once
// The element-wise arithmetic of the layers and losses, as small functors over raw pointers that any
// engine can run: the CPU engine in its loops, a GPU engine in its kernels (hence
// DISTRIBUTE_HOST_DEVICE and nothing from the standard library but <cmath>). Each is called with an
// element index i, or a plane (segment) s and an index i within it.
//
// One header per topic; this one includes them all. The arithmetic on whole buffers that the
// optimisers share (add_to, scale, multiply) is distribute::detail::kernels
// (detail/element_kernels.hpp); the optimisers' updates are optim/detail/update_kernels.hpp.

#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/detail/activation_kernels.hpp>
#include <distribute/nn/detail/dense_kernels.hpp>
#include <distribute/nn/detail/dropout_kernels.hpp>
#include <distribute/nn/detail/embedding_kernels.hpp>
#include <distribute/nn/detail/layer_norm_kernels.hpp>
#include <distribute/nn/detail/loss_kernels.hpp>
#include <distribute/nn/detail/norm_kernels.hpp>
#include <distribute/nn/detail/padding_kernels.hpp>
#include <distribute/nn/detail/plane_sum_kernels.hpp>
#include <distribute/nn/detail/pooling_kernels.hpp>
#include <distribute/nn/detail/resampling_kernels.hpp>
#include <distribute/nn/detail/spectral_norm_kernels.hpp>
