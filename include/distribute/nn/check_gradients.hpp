#pragma once
// nn::check_gradients: a layer's (or a model's) backward pass held to central finite differences, in
// double precision, for the input gradient and every parameter gradient. A backward is written by
// hand here, and a wrong one trains on without an error: a gradient forgotten (never added) or
// overwritten instead of added still lets the loss fall, slowly and to the wrong place. This is the
// check a port from PyTorch or Keras needs for each hand-written layer and each hand-wired model.
//
//   nn::linear<double> lin{{.in_features = 7, .out_features = 4}, 1};
//   auto report = nn::check_gradients(lin, x);                 // throws nn::gradient_check_error
//   auto report = nn::check_gradients(model, x, {.tolerance = 1e-4, .name = "decoder"});
//
// The loss is L = sum(w * model(x)) with fixed weights w drawn uniformly from [-1, 1) (options.seed):
// every output counts, with a weight no backward could get right by accident. Each value v of the
// input and of each parameter is moved by +-h and dL/dv = (L(v + h) - L(v - h)) / 2h is compared with
// what backward gave, as a whole tensor: ||analytic - numeric|| / max(||analytic||, ||numeric||,
// floor) must stay within the tolerance. The floor keeps a gradient that is zero by construction (the
// bias of a convolution followed by a normalisation) from comparing rounding noise with rounding noise.
//
// Besides a mismatch, it refuses what would make the check prove nothing or hide a fault: an analytic
// gradient that is zero in every element (a backward that forgot to add to a parameter's gradient, or
// returned zeros for the input), a loss that does not depend on the input, and (options.accumulation)
// a parameter gradient that a second backward without zero_grad overwrote instead of adding to.
//
// What it takes: a layer of doubles on the CPU (`forward(r, x)`, `backward(r, dy)`,
// `for_each_parameter`, `zero_grad`: a library layer, a sequential, a user's layer), or a model written
// for a tape (`model(tape, x)` returning the tape's variable, with `scalar_type`, `for_each_parameter`
// and `zero_grad`), which is recorded on an nn::tape (one input: a model of several is checked through
// a wrapper that splits one input). The model must be deterministic: dropout in training draws a new
// mask at every forward, so check it with set_training(false). The parameters are left with their
// values and their gradients zeroed.

#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/tape.hpp>
#include <distribute/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::nn {

struct gradient_check_options {
  double step = 1e-6;        // h of the central difference
  double tolerance = 1e-3;   // the largest relative error of a whole gradient
  std::uint64_t seed = 99;   // of the weights w of the loss sum(w * y)
  double floor = 1e-5;       // gradients of smaller norm are compared in absolute terms
  bool accumulation = true;  // also check that a second backward adds to the parameter gradients
  std::string name{};        // names the model in the report; its type's name when empty
};

// One gradient compared: the input's or a parameter's.
struct gradient_check_entry {
  std::string tensor{};       // "input" or "parameter 2"
  std::string shape{};        // "(5, 7)" for the input; the value count "(28)" for a parameter
  double relative_error = 0;  // ||analytic - numeric|| / max(||analytic||, ||numeric||, floor)
  std::size_t worst = 0;      // the element of the largest |analytic - numeric| (flat index)
  std::string worst_at{};     // the same as (n, c, h, w) for the input, as a flat index for a parameter
  double analytic = 0;        // the two gradients at that element
  double numeric = 0;
  std::string problem{};  // empty where the gradient passed
};

struct gradient_check_report {
  std::string name{};
  double tolerance = 0;
  std::vector<gradient_check_entry> tensors{};

  bool passed() const {
    return std::all_of(tensors.begin(), tensors.end(), [](const auto& t) { return t.problem.empty(); });
  }
  // One line per gradient: the tensor, the relative error, the worst element with both values.
  std::string to_string() const;
};

// What check_gradients throws where a gradient is wrong or the check would prove nothing: the message
// names the model, the tensor and what is wrong, followed by every gradient's line (`report()`).
class gradient_check_error : public std::invalid_argument {
 public:
  gradient_check_error(const std::string& message, gradient_check_report report)
      : std::invalid_argument{message}, report_{std::move(report)} {}
  const gradient_check_report& report() const noexcept { return report_; }

 private:
  gradient_check_report report_;
};

namespace detail {

inline std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

inline std::string element_at(const shape& s, std::size_t flat) {
  if (s.rank() <= 1) return std::to_string(flat);
  std::vector<std::int64_t> at(s.rank());
  auto rest = static_cast<std::int64_t>(flat);
  for (std::size_t i = s.rank(); i-- > 0;) {
    at[i] = rest % s[i];
    rest /= s[i];
  }
  std::string out = "(";
  for (std::size_t i = 0; i < at.size(); ++i) out += (i ? ", " : "") + std::to_string(at[i]);
  return out + ")";
}

// Compares `analytic` with `numeric` and fills everything of `e` but the tensor's names and problem.
inline void compare_gradients(gradient_check_entry& e, std::span<const double> analytic,
                              std::span<const double> numeric, double floor) {
  double d = 0, na = 0, nb = 0, worst = -1;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    const double diff = analytic[i] - numeric[i];
    d += diff * diff;
    na += analytic[i] * analytic[i];
    nb += numeric[i] * numeric[i];
    if (std::abs(diff) > worst) worst = std::abs(diff), e.worst = i;
  }
  const double scale = std::max(std::sqrt(std::max(na, nb)), floor);
  e.relative_error = scale == 0 ? 0.0 : std::sqrt(d) / scale;
  if (!analytic.empty()) e.analytic = analytic[e.worst], e.numeric = numeric[e.worst];
}

inline double norm_of(std::span<const double> v) {
  double s = 0;
  for (const double x : v) s += x * x;
  return std::sqrt(s);
}

// How a model is run: a layer's forward and backward, or a model recorded on a tape.
template <class M>
concept taped_model = requires(M& m, tape<local_replica, double>& t, tape<local_replica, double>::variable v) {
  { m(t, v) } -> std::same_as<tape<local_replica, double>::variable>;
};
template <class M>
concept of_doubles = std::same_as<typename M::scalar_type, double>;
template <class M>
concept checkable_model = of_doubles<M> && std::same_as<layer_device_t<M>, cpu> && requires(M& m) {
  m.for_each_parameter([](std::span<double>, std::span<double>) {});
  m.zero_grad();
} && (layer<M> || taped_model<M>);

template <class M>
tensor<double> model_forward(M& model, local_replica& r, const tensor<double>& x) {
  if constexpr (layer<M>) {
    return model.forward(r, x);
  } else {
    tape<local_replica, double> t{r};
    return t(model, t.constant(x)).value();
  }
}

// dL/dx for dL/dy = w, after a fresh forward; the parameters' gradients are added to.
template <class M>
tensor<double> model_backward(M& model, local_replica& r, const tensor<double>& x, const tensor<double>& w) {
  if constexpr (layer<M>) {
    model.forward(r, x);
    return model.backward(r, w);
  } else {
    tape<local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto y = t(model, v);
    if (y.shape() != w.shape())
      throw std::invalid_argument("distribute: nn::check_gradients: the model gave an output of shape " +
                                  y.shape().to_string() + " on the tape and " + w.shape().to_string() +
                                  " outside it, for the same input");
    t.backward(y, w);
    return t.gradient(v);  // empty where no gradient reached the input
  }
}

template <class M>
std::vector<std::vector<double>> parameter_gradient_copies(M& model) {
  std::vector<std::vector<double>> out;
  model.for_each_parameter([&](std::span<double>, std::span<double> g) { out.emplace_back(g.begin(), g.end()); });
  return out;
}

inline void check_options(const gradient_check_options& o) {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("distribute: nn::check_gradients: gradient_check_options::" + what);
  };
  if (!(o.step > 0) || !std::isfinite(o.step)) bad("step is " + format_number(o.step) + " but must be positive");
  if (!(o.tolerance > 0)) bad("tolerance is " + format_number(o.tolerance) + " but must be positive");
  if (!(o.floor >= 0)) bad("floor is " + format_number(o.floor) + " but must be at least 0");
}

}  // namespace detail

inline std::string gradient_check_report::to_string() const {
  std::string out;
  for (const auto& t : tensors) {
    out += "  " + t.tensor + " " + t.shape + ": ";
    if (!t.problem.empty()) out += "FAILS: " + t.problem + "\n";
    else
      out += "relative error " + detail::format_number(t.relative_error) + "; worst element " + t.worst_at +
             ": analytic " + detail::format_number(t.analytic) + ", numeric " + detail::format_number(t.numeric) + "\n";
  }
  return out;
}

// Checks `model`'s backward against central differences at input `x` (see the top of this file).
// Returns the report where every gradient passes; throws gradient_check_error naming the first that
// does not, and std::invalid_argument for bad options or an input the model refuses.
template <class M>
gradient_check_report check_gradients(M& model, tensor<double> x, const gradient_check_options& options = {}) {
  static_assert(detail::of_doubles<M>,
                "distribute: nn::check_gradients computes in double: instantiate the layer or model with double "
                "(nn::linear<double>, my_model<double>)");
  static_assert(detail::checkable_model<M>,
                "distribute: nn::check_gradients takes a CPU layer (forward(r, x), backward(r, dy)) or a model "
                "written for a tape (model(tape, x)), with for_each_parameter and zero_grad");
  detail::check_options(options);
  const std::string name = options.name.empty() ? detail::layer_name<M>() : options.name;
  const std::string where = "distribute: nn::check_gradients(" + name + "): ";
  auto r = local();

  const auto y = detail::model_forward(model, r, x);
  if (y.empty()) throw std::invalid_argument(where + "the model's output is empty");
  tensor<double> w{y.shape()};
  {
    detail::splitmix64 gen{options.seed};
    for (auto& v : w) v = 2.0 * gen.uniform() - 1.0;
  }
  auto loss = [&] {
    const auto out = detail::model_forward(model, r, x);
    if (out.shape() != w.shape())
      throw std::invalid_argument(where + "the model's output changed shape from " + w.shape().to_string() + " to " +
                                  out.shape().to_string() + " for inputs of the same shape");
    double s = 0;
    for (std::size_t i = 0; i < out.size(); ++i) s += w[i] * out[i];
    return s;
  };
  const double h = options.step;
  auto central_differences = [&](std::span<double> values) {
    std::vector<double> numeric(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double keep = values[i];
      values[i] = keep + h;
      const double up = loss();
      values[i] = keep - h;
      const double down = loss();
      values[i] = keep;
      numeric[i] = (up - down) / (2 * h);
    }
    return numeric;
  };

  // The analytic gradients first: the finite differences below run more forwards.
  model.zero_grad();
  const auto dx = detail::model_backward(model, r, x, w);
  const auto analytic = detail::parameter_gradient_copies(model);
  std::vector<std::vector<double>> twice;
  if (options.accumulation && !analytic.empty()) {
    detail::model_backward(model, r, x, w);
    twice = detail::parameter_gradient_copies(model);
  }
  model.zero_grad();

  gradient_check_report report{name, options.tolerance, {}};
  auto judge = [&](gradient_check_entry& e, std::span<const double> a, std::span<const double> n, auto&& at) {
    detail::compare_gradients(e, a, n, options.floor);
    e.worst_at = at(e.worst);
    if (std::all_of(a.begin(), a.end(), [](double v) { return v == 0; }))
      e.problem = "the analytic gradient is zero in every element (the numeric one has norm " +
                  detail::format_number(detail::norm_of(n)) +
                  "): backward did not add to it, or the loss does not depend on it at this input (then check "
                  "another input)";
    else if (e.relative_error > options.tolerance)
      e.problem = "relative error " + detail::format_number(e.relative_error) + " above the tolerance " +
                  detail::format_number(options.tolerance) + "; worst element " + e.worst_at + ": analytic " +
                  detail::format_number(e.analytic) + ", numeric " + detail::format_number(e.numeric);
  };

  {
    gradient_check_entry e{.tensor = "input", .shape = x.shape().to_string()};
    if (dx.empty()) {
      e.problem = "backward returned no input gradient (an empty tensor)";
    } else if (dx.shape() != x.shape()) {
      e.problem = "backward returned an input gradient of shape " + dx.shape().to_string();
    } else {
      const auto numeric = central_differences(x.values());
      judge(e, dx.values(), numeric, [&](std::size_t i) { return detail::element_at(x.shape(), i); });
      if (e.problem.empty() && detail::norm_of(numeric) == 0)
        e.problem = "the loss does not change with the input, so the check would prove nothing: check another input";
    }
    report.tensors.push_back(std::move(e));
  }

  std::vector<std::span<double>> values;
  model.for_each_parameter([&](std::span<double> v, std::span<double>) { values.push_back(v); });
  for (std::size_t p = 0; p < values.size(); ++p) {
    // Appended, not `"literal" + std::string`: GCC 12 at -O3 warns (-Wrestrict) falsely about that form.
    gradient_check_entry e{.tensor = std::string("parameter ").append(std::to_string(p)),
                           .shape = std::string("(")
                                        .append(std::to_string(values[p].size()))
                                        .append(values[p].size() == 1 ? " value)" : " values)")};
    if (analytic.size() != values.size() || analytic[p].size() != values[p].size()) {
      e.problem = "for_each_parameter gave a gradient of another size than the value, or another count of parameters";
      report.tensors.push_back(std::move(e));
      break;
    }
    if (values[p].empty()) {  // nothing to compare
      report.tensors.push_back(std::move(e));
      continue;
    }
    const auto numeric = central_differences(values[p]);
    judge(e, analytic[p], numeric, [](std::size_t i) { return std::to_string(i); });
    if (e.problem.empty() && !twice.empty()) {
      // A second backward without zero_grad must add as much again: twice the first gradient.
      double dot = 0, sq = 0;
      std::vector<double> doubled(analytic[p].size());
      for (std::size_t i = 0; i < doubled.size(); ++i) {
        doubled[i] = 2 * analytic[p][i];
        dot += twice[p][i] * analytic[p][i];
        sq += analytic[p][i] * analytic[p][i];
      }
      gradient_check_entry acc;
      detail::compare_gradients(acc, twice[p], doubled, options.floor);
      if (acc.relative_error > options.tolerance)
        e.problem = "a second backward without zero_grad left the gradient at " +
                    detail::format_number(sq > 0 ? dot / sq : 0) +
                    " times the first one, where gradients accumulate to 2 times: backward must add to the "
                    "gradient, not overwrite it";
    }
    report.tensors.push_back(std::move(e));
  }

  for (const auto& e : report.tensors)
    if (!e.problem.empty())
      throw gradient_check_error(where + e.tensor + " " + e.shape + ": " + e.problem + "\n" + report.to_string(),
                                 report);
  return report;
}

}  // namespace distribute::nn
