#pragma once
// The Fashion-MNIST classifier that scores translations: the examples' shared one
// (examples/common/fmnist_classifier.hpp, where its layers are listed), under the names the
// CycleGAN example uses.

#include "../common/fmnist_classifier.hpp"
#include "models.hpp"

namespace cyclegan {

using fmnist::classes;
using fmnist::classifier;
using fmnist::classifier_on;
using fmnist::classifier_shape;
using fmnist::make_classifier;
using fmnist::predict;

}  // namespace cyclegan
