#pragma once
// Eigen's Core, as the library includes it: after the x86 intrinsics, so that GCC 12's false
// warnings about them stay quiet (detail/x86_intrinsics.hpp says why).

#include <distribute/detail/x86_intrinsics.hpp>

#include <Eigen/Core>
