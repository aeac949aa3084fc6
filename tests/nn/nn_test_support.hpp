#pragma once
// Helpers of the nn tests: seeded random tensors, norms, and the central finite-difference check that
// every layer's backward pass is held to.

#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/optim.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace distribute::test {

template <class T>
tensor<T> random_tensor(shape s, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  tensor<T> t{s};
  for (auto& x : t) x = static_cast<T>(d(gen));
  return t;
}

// ||a - b|| / max(||a||, ||b||, floor): the relative error of a whole gradient. The floor keeps a
// gradient that is zero by construction (the bias of a convolution followed by a normalisation) from
// comparing rounding noise with rounding noise; with the default 0 both zero gives 0.
inline double relative_error(std::span<const double> a, std::span<const double> b, double floor = 0) {
  double d = 0, na = 0, nb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const double scale = std::max(std::sqrt(std::max(na, nb)), floor);
  return scale == 0 ? 0.0 : std::sqrt(d) / scale;
}
template <class T>
double relative_error_of(std::span<const T> a, std::span<const T> b) {
  std::vector<double> da(a.begin(), a.end()), db(b.begin(), b.end());
  return relative_error(da, db);
}

// Checks a layer's backward against central differences of L(x, params) = sum(w * layer(x)), in
// double precision, for the input gradient and every parameter gradient: nn::check_gradients
// (<distribute/nn/check_gradients.hpp>), its error reported as a test failure.
template <class L>
void check_gradients(L& layer, tensor<double> x, const std::string& what, double tolerance = 1e-3) {
  std::string failure;
  try {
    nn::check_gradients(layer, std::move(x), {.tolerance = tolerance, .name = what});
  } catch (const nn::gradient_check_error& e) {
    failure = e.what();
  }
  BOOST_TEST(failure.empty(), failure);
}

// Whether `s` contains `part` (for error messages).
// Every parameter gradient (value) of `m`, flattened in enumeration order.
template <class T, class M>
std::vector<T> gradients_of(M& m) {
  std::vector<T> g;
  m.for_each_parameter([&](std::span<T>, std::span<T> grad) { g.insert(g.end(), grad.begin(), grad.end()); });
  return g;
}
template <class T, class M>
std::vector<T> parameters_of(M& m) {
  std::vector<T> p;
  m.for_each_parameter([&](std::span<T> v, std::span<T>) { p.insert(p.end(), v.begin(), v.end()); });
  return p;
}

inline bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The message of the exception that `f` throws; "no error" if none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace distribute::test
