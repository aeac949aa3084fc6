#pragma once
// The optimisers and dynamic loss scaling in one include (needs Eigen 3.3 or later, as the layers
// they step do: <distribute/nn.hpp>).

#include <distribute/optim/adam.hpp>
#include <distribute/optim/loss_scaler.hpp>
#include <distribute/optim/sgd.hpp>
