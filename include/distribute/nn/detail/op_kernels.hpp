#pragma once
// The element-wise arithmetic of the operations between layers (nn/elementwise.hpp,
// nn/broadcasting.hpp, nn/reductions.hpp, nn/shape_ops.hpp): functors any engine runs, on the CPU in
// its loops and on a GPU through Thrust, so nothing from the standard library but <cmath>'s
// functions, which CUDA provides on the device too.
//
// Every pass is parallel over the elements of its output (a reduction's output element is a segment
// of the engine's segmented_sum, whose terms the engine spreads itself); the one exception, the
// maximum, reduces in chunks of `max_chunk` terms per work item, one pass per factor of `max_chunk`,
// so that no work item walks a whole row.

#include <distribute/config.hpp>
#include <distribute/nn/detail/float_lanes.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

// A loop whose iterations combine into one value by `op` (OpenMP's simd reduction clause), on the
// host where OpenMP is on; elsewhere (a GPU's device code, a build without OpenMP) a plain loop.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#  define DISTRIBUTE_SIMD_REDUCTION(...) _Pragma(DISTRIBUTE_SIMD_REDUCTION_TEXT(omp simd reduction(__VA_ARGS__)))
#  define DISTRIBUTE_SIMD_REDUCTION_TEXT(...) #__VA_ARGS__
#else
#  define DISTRIBUTE_SIMD_REDUCTION(...)
#endif

namespace distribute::nn::detail {

// A row-major walk over `extents` read through `strides`: the offset of linear index i. A stride of
// 0 repeats an axis (broadcasting); an extent of 1 drops one (a reduction's other half). The axes in
// use are the last `axes` of the four (op_shapes.hpp's `simplified` merges the axes that continue
// each other and drops those of extent 1), and the outermost of them needs no division: a
// contiguous walk costs none, where four 64-bit divisions per element cost more than the memory.
struct strided_map {
  std::int64_t extents[4] = {1, 1, 1, 1};
  std::int64_t strides[4] = {0, 0, 0, 0};
  int axes = 4;
  DISTRIBUTE_HOST_DEVICE std::int64_t operator()(std::int64_t i) const {
    std::int64_t offset = 0;
    const int outer = 4 - axes;
    for (int k = 3; k > outer; --k) {
      const std::int64_t q = i / extents[k];
      offset += (i - q * extents[k]) * strides[k];
      i = q;
    }
    return axes > 0 ? offset + i * strides[outer] : 0;
  }
};

namespace kernels {

using index = std::int64_t;

// Terms i, i + 1, ..., i + count - 1 of a sum's segment at p[0], p[step], p[2 * step], ...
template <class T>
struct term_run {
  const T* p;
  std::int64_t step, count;
};

// The unary operations: value(x), dy/dx from x and y = value(x), and d2y/dx2 from x (`second`, for
// gradients taken with create_graph). Those with exp or log in float on the host also have
// `value_block` (and softplus `derivative_block`: f'(x) from x alone): lanes::width values at once
// through float_lanes.hpp, and value(x) there is the same block with one value in it, so a value's
// bits do not depend on which of the two computed it. In double, and on a GPU, <cmath>'s.
template <class T>
struct square_op {
  static constexpr const char* name = "square";
  DISTRIBUTE_HOST_DEVICE T value(T x) const { return x * x; }
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const { return T(2) * x; }
  DISTRIBUTE_HOST_DEVICE T second(T) const { return T(2); }
};
template <class T>
struct sqrt_op {
  static constexpr const char* name = "sqrt";
  DISTRIBUTE_HOST_DEVICE T value(T x) const { return std::sqrt(x); }
  // 1 / (2 sqrt(x)): infinite at 0, as PyTorch's.
  DISTRIBUTE_HOST_DEVICE T derivative(T, T y) const { return T(1) / (T(2) * y); }
  DISTRIBUTE_HOST_DEVICE T second(T x) const { return T(-1) / (T(4) * x * std::sqrt(x)); }
};
template <class T>
struct exp_op {
  static constexpr const char* name = "exp";
  DISTRIBUTE_HOST_DEVICE T value(T x) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>)
      return lanes::one(x, [this](const float* a, float* b) { value_block(a, b); });
#endif
    return std::exp(x);
  }
  DISTRIBUTE_HOST_DEVICE T derivative(T, T y) const { return y; }
  DISTRIBUTE_HOST_DEVICE T second(T x) const { return value(x); }
  void value_block(const float* x, float* y) const { lanes::exp(x, y); }
};
template <class T>
struct log_op {
  static constexpr const char* name = "log";
  DISTRIBUTE_HOST_DEVICE T value(T x) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>)
      return lanes::one(x, [this](const float* a, float* b) { value_block(a, b); });
#endif
    return std::log(x);
  }
  void value_block(const float* x, float* y) const { lanes::log(x, y); }
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const { return T(1) / x; }
  DISTRIBUTE_HOST_DEVICE T second(T x) const { return T(-1) / (x * x); }
};
template <class T>
struct pow_op {
  static constexpr const char* name = "pow";
  T p;
  DISTRIBUTE_HOST_DEVICE T value(T x) const { return std::pow(x, p); }
  // p x^(p - 1); 0 for p = 0, where PyTorch's is 0 too (not 0 * inf at x = 0).
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const { return p == T(0) ? T(0) : p * std::pow(x, p - T(1)); }
  DISTRIBUTE_HOST_DEVICE T second(T x) const {
    return p == T(0) || p == T(1) ? T(0) : p * (p - T(1)) * std::pow(x, p - T(2));
  }
};
template <class T>
struct abs_op {
  static constexpr const char* name = "abs";
  DISTRIBUTE_HOST_DEVICE T value(T x) const { return x < T(0) ? -x : x; }
  // sign(x), 0 at 0 (PyTorch's).
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
  DISTRIBUTE_HOST_DEVICE T second(T) const { return T(0); }
};
template <class T>
struct clamp_op {
  static constexpr const char* name = "clamp";
  T low, high;
  DISTRIBUTE_HOST_DEVICE T value(T x) const { return x < low ? low : (x > high ? high : x); }
  // 1 within [low, high], both ends included (PyTorch's), 0 outside.
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const { return x >= low && x <= high ? T(1) : T(0); }
  DISTRIBUTE_HOST_DEVICE T second(T) const { return T(0); }
};
template <class T>
struct sigmoid_op {
  static constexpr const char* name = "sigmoid";
  DISTRIBUTE_HOST_DEVICE T value(T x) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>)
      return lanes::one(x, [this](const float* a, float* b) { value_block(a, b); });
#endif
    return T(1) / (T(1) + std::exp(-x));
  }
  void value_block(const float* x, float* y) const { lanes::logistic(x, y); }
  DISTRIBUTE_HOST_DEVICE T derivative(T, T y) const { return y * (T(1) - y); }
  DISTRIBUTE_HOST_DEVICE T second(T x) const {
    const T y = value(x);
    return y * (T(1) - y) * (T(1) - T(2) * y);
  }
};
// log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's Softplus).
template <class T>
struct softplus_op {
  static constexpr const char* name = "softplus";
  T beta, threshold;
  DISTRIBUTE_HOST_DEVICE T value(T x) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>)
      return lanes::one(x, [this](const float* a, float* b) { value_block(a, b); });
#endif
    return beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
  }
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<T, float>)
      return lanes::one(x, [this](const float* a, float* b) { derivative_block(a, b); });
#endif
    return beta * x > threshold ? T(1) : T(1) / (T(1) + std::exp(-beta * x));
  }
  DISTRIBUTE_HOST_DEVICE T second(T x) const {
    if (beta * x > threshold) return T(0);
    const T s = derivative(x, x);
    return beta * s * (T(1) - s);
  }
  void value_block(const float* x, float* y) const { lanes::softplus(x, y, beta, threshold); }
  void derivative_block(const float* x, float* d) const { lanes::softplus_derivative(x, d, beta, threshold); }
};

// The derivative of a unary operation as an operation of its own (what a gradient taken with
// create_graph records): value(x) = op's f'(x), derivative = op's f''(x).
template <class Op>
struct derivative_of {
  // A gradient of a gradient of a gradient (a third order) is not recorded.
  static constexpr const char* name = "the derivative of a function (a third-order gradient)";
  Op op;
  template <class T>
  DISTRIBUTE_HOST_DEVICE T value(T x) const {
    return op.derivative(x, op.value(x));
  }
  template <class T>
  DISTRIBUTE_HOST_DEVICE T derivative(T x, T) const {
    return op.second(x);
  }
};

// Whether Op has a block form of its value or of its derivative for T (float, on the host).
template <class Op, class T>
concept value_in_blocks = requires(const Op& op, const T* x, T* y) { op.value_block(x, y); };
template <class Op, class T>
concept derivative_in_blocks = requires(const Op& op, const T* x, T* y) { op.derivative_block(x, y); };

// count <= lanes::width values at x through block(x, y), into y: the block itself where it is
// whole, else through a padded copy.
template <class Block>
void through_block(const float* x, float* y, index count, const Block& block) {
  if (count == lanes::width) block(x, y);
  else lanes::part(x, y, static_cast<int>(count), block);
}

// The element-wise passes. Where the operation has block forms, `run_block(i, count)` computes
// elements i to i + count - 1 (count <= block_size) the same as operator() would one by one; the
// host engines call it (engine/cpu.hpp's for_each), GPUs call operator().
template <class T, class Op>
struct unary_forward {
  const T* x;
  T* y;
  Op op;
  static constexpr index block_size = lanes::width;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = op.value(x[i]); }
  void run_block(index i, index count) const
    requires value_in_blocks<Op, T>
  {
    through_block(x + i, y + i, count, [this](const float* a, float* b) { op.value_block(a, b); });
  }
};
template <class T, class Op>
struct unary_backward {
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  Op op;
  static constexpr index block_size = lanes::width;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { dx[i] = dy[i] * op.derivative(x[i], y[i]); }
  void run_block(index i, index count) const
    requires derivative_in_blocks<Op, T>
  {
    float d[lanes::width];
    through_block(x + i, d, count, [this](const float* a, float* b) { op.derivative_block(a, b); });
    for (index l = 0; l < count; ++l) dx[i + l] = dy[i + l] * d[l];
  }
};

// The binary operations: value(a, b) and its partial derivatives.
template <class T>
struct add_op {
  DISTRIBUTE_HOST_DEVICE T value(T a, T b) const { return a + b; }
  DISTRIBUTE_HOST_DEVICE T d_a(T, T) const { return T(1); }
  DISTRIBUTE_HOST_DEVICE T d_b(T, T) const { return T(1); }
};
template <class T>
struct sub_op {
  DISTRIBUTE_HOST_DEVICE T value(T a, T b) const { return a - b; }
  DISTRIBUTE_HOST_DEVICE T d_a(T, T) const { return T(1); }
  DISTRIBUTE_HOST_DEVICE T d_b(T, T) const { return T(-1); }
};
template <class T>
struct mul_op {
  DISTRIBUTE_HOST_DEVICE T value(T a, T b) const { return a * b; }
  DISTRIBUTE_HOST_DEVICE T d_a(T, T b) const { return b; }
  DISTRIBUTE_HOST_DEVICE T d_b(T a, T) const { return a; }
};
template <class T>
struct div_op {
  DISTRIBUTE_HOST_DEVICE T value(T a, T b) const { return a / b; }
  DISTRIBUTE_HOST_DEVICE T d_a(T, T b) const { return T(1) / b; }
  DISTRIBUTE_HOST_DEVICE T d_b(T a, T b) const { return -a / (b * b); }
};

// Gathers and broadcasts go by rows (for_each_in_segments: row s, element i of it): the output's
// innermost run of axes that every operand walks with one stride (op_shapes.hpp's `rows_of`), so
// that an operand's offset costs a multiply-add per element and its divisions once per row, which
// the CPU engine's inner loop hoists (per element, they cost more than the memory traffic).
struct row_operand {
  strided_map outer;  // the row's start
  std::int64_t step;  // along the row
  DISTRIBUTE_HOST_DEVICE std::int64_t operator()(std::int64_t s, std::int64_t i) const { return outer(s) + i * step; }
};
// Calls body(sa, sb) with two operands' steps along a row as constants where they are 0 or 1 (a
// broadcast operand, a contiguous one), so that the row's loop in `body` vectorises (a runtime step
// of 0 keeps GCC's from it); with the steps as they are otherwise. The host's whole_segment forms.
template <class Body>
void with_row_steps(index sa, index sb, Body&& body) {
  struct zero {
    constexpr operator index() const noexcept { return 0; }
  };
  struct one {
    constexpr operator index() const noexcept { return 1; }
  };
  if (sa == 1 && sb == 1) body(one{}, one{});
  else if (sa == 1 && sb == 0) body(one{}, zero{});
  else if (sa == 0 && sb == 1) body(zero{}, one{});
  else body(sa, sb);
}
template <class T, class Op>
struct broadcast_binary_rows {
  const T* a;
  const T* b;
  T* out;
  row_operand ra, rb;
  std::int64_t length;
  Op op;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    out[s * length + i] = op.value(a[ra(s, i)], b[rb(s, i)]);
  }
  // The CPU engine's form: the row's starts once, then a loop that vectorises.
  void whole_segment(index s) const {
    const T* pa = a + ra.outer(s);
    const T* pb = b + rb.outer(s);
    T* po = out + s * length;
    with_row_steps(ra.step, rb.step, [&](auto sa, auto sb) {
      for (index i = 0; i < length; ++i) po[i] = op.value(pa[i * sa], pb[i * sb]);
    });
  }
};
template <class T, class Op, bool First>
struct broadcast_partial_rows {
  const T* a;
  const T* b;
  const T* dy;
  T* g;
  row_operand ra, rb;
  std::int64_t length;
  Op op;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const T va = a[ra(s, i)], vb = b[rb(s, i)];
    const index o = s * length + i;
    g[o] = dy[o] * (First ? op.d_a(va, vb) : op.d_b(va, vb));
  }
  void whole_segment(index s) const {
    const T* pa = a + ra.outer(s);
    const T* pb = b + rb.outer(s);
    const T* pdy = dy + s * length;
    T* pg = g + s * length;
    with_row_steps(ra.step, rb.step, [&](auto sa, auto sb) {
      for (index i = 0; i < length; ++i) {
        const T va = pa[i * sa], vb = pb[i * sb];
        pg[i] = pdy[i] * (First ? op.d_a(va, vb) : op.d_b(va, vb));
      }
    });
  }
};
template <class T>
struct gather_rows {
  const T* x;
  T* out;
  row_operand rx;
  std::int64_t length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const { out[s * length + i] = x[rx(s, i)]; }
  void whole_segment(index s) const {
    const T* px = x + rx.outer(s);
    T* po = out + s * length;
    with_row_steps(rx.step, 0, [&](auto step, auto) {
      for (index i = 0; i < length; ++i) po[i] = px[i * step];
    });
  }
};

// The term (s, i) of a reduction: element i of the reduced axes of output element s.
template <class T>
struct reduction_term {
  const T* x;
  strided_map kept, reduced;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    return static_cast<double>(x[kept(s) + reduced(i)]);
  }
  // Terms i, i + 1, ... of segment s to the end of the innermost reduced axis: one stride apart (a
  // host engine's sum walks them so, engine/serial.hpp's fixed_order_sum_by_runs).
  DISTRIBUTE_HOST_DEVICE term_run<T> run(index s, index i) const {
    const std::int64_t e = reduced.extents[3];  // (the map's axes in use are its last ones)
    return {x + kept(s) + reduced(i), reduced.axes > 0 ? reduced.strides[3] : 0, e - i % e};
  }
};
// The same where the kept and the reduced axes each merge into one: x[s * kept_step + i * step].
template <class T>
struct strided_term {
  const T* x;
  std::int64_t kept_step, step;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    return static_cast<double>(x[s * kept_step + i * step]);
  }
  DISTRIBUTE_HOST_DEVICE term_run<T> run(index s, index i) const {
    return {x + s * kept_step + i * step, step, std::int64_t{1} << 62};  // (to the segment's end)
  }
  // Segment s + 1's term i lies this far after segment s's.
  DISTRIBUTE_HOST_DEVICE std::int64_t segment_step() const { return kept_step; }
};
// out[i] = T(sums[i] * k).
template <class T>
struct scaled_from_double {
  const double* sums;
  T* out;
  double k;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { out[i] = static_cast<T>(sums[i] * k); }
};

// The maximum in chunks: work item (s, c) takes terms [c * chunk, (c + 1) * chunk) of output s
// (from x through kept/reduced on the first pass, from the previous pass's [segments, length] rows
// after) and writes their maximum and its index. The first maximum wins a tie, and a NaN wins over
// every number (PyTorch's max propagates NaN).
template <class T>
struct max_chunk_pass {
  const T* x;  // the first pass's input, or null
  strided_map kept, reduced;
  const T* values;             // a later pass's input rows, or null
  const std::int64_t* places;  // their indices into the reduced axes
  std::int64_t length, chunk;
  T* out_values;
  std::int64_t* out_places;
  std::int64_t chunks;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index c) const {
    const std::int64_t begin = c * chunk;
    const std::int64_t end = begin + chunk < length ? begin + chunk : length;
    // Run by run (terms one stride apart: the innermost reduced axis, or a previous pass's row), the
    // walk's divisions once a run.
    const std::int64_t base = x ? kept(s) : s * length;
    const std::int64_t inner = x ? reduced.extents[3] : length;
    const std::int64_t step = x ? (reduced.axes > 0 ? reduced.strides[3] : 0) : 1;
    const auto for_runs = [&](auto&& f) {
      for (std::int64_t i = begin; i < end;) {
        const std::int64_t left = inner - i % inner, n = left < end - i ? left : end - i;
        if (f(i, x ? x + base + reduced(i) : values + base + i, n)) return;
        i += n;
      }
    };
    T best{};
    std::int64_t where = -1;
#if defined(__CUDA_ARCH__)
    // On a GPU one pass in index order, a branch a term: a thread walks its chunk once.
    for_runs([&](std::int64_t i, const T* p, std::int64_t n) {
      for (std::int64_t k = 0; k < n; ++k) {
        const T v = p[k * step];
        const bool v_nan = v != v, best_nan = where >= 0 && best != best;
        if (where < 0 || (!best_nan && (v_nan || v > best))) {
          best = v;
          where = x ? i + k : places[base + i + k];
        }
      }
      return false;
    });
#else
    // On the host two passes over the chunk's terms (at most `chunk`, in cache), in loops without a
    // branch per term: whether there is a NaN and the largest value, then the first term that is a
    // NaN or (none being one) equals the largest. That is the term the walk in index order above
    // keeps, the first of equal maxima or the first NaN (-0 and +0 are equal).
    int nan = 0;
    T m = x ? x[base + reduced(begin)] : values[base + begin];
    for_runs([&](std::int64_t, const T* p, std::int64_t n) {
      if (step == 1) {  // (the common case, in loops of its own: they vectorise)
        DISTRIBUTE_SIMD_REDUCTION(| : nan)
        for (std::int64_t k = 0; k < n; ++k) nan |= p[k] != p[k];
        if (nan) return true;
        DISTRIBUTE_SIMD_REDUCTION(max : m)
        for (std::int64_t k = 0; k < n; ++k) m = p[k] > m ? p[k] : m;
        return false;
      }
      for (std::int64_t k = 0; k < n; ++k) nan |= p[k * step] != p[k * step];
      if (nan) return true;
      for (std::int64_t k = 0; k < n; ++k) m = p[k * step] > m ? p[k * step] : m;
      return false;
    });
    // The first such term: where the terms are contiguous, the least index that holds one, in a loop
    // that vectorises (a minimum over the run, at most `chunk` terms: an int); else term by term.
    for_runs([&](std::int64_t i, const T* p, std::int64_t n) {
      if (step == 1) {
        const int count = static_cast<int>(n);
        int first = count;
        if (nan) {
          DISTRIBUTE_SIMD_REDUCTION(min : first)
          for (int k = 0; k < count; ++k) {
            const int at = p[k] != p[k] ? k : count;
            first = at < first ? at : first;
          }
        } else {
          DISTRIBUTE_SIMD_REDUCTION(min : first)
          for (int k = 0; k < count; ++k) {
            const int at = p[k] == m ? k : count;
            first = at < first ? at : first;
          }
        }
        if (first == count) return false;
        best = p[first];
        where = x ? i + first : places[base + i + first];
        return true;
      }
      for (std::int64_t k = 0; k < n; ++k) {
        const T v = p[k * step];
        if (nan ? v != v : v == m) {
          best = v;
          where = x ? i + k : places[base + i + k];
          return true;
        }
      }
      return false;
    });
#endif
    out_values[s * chunks + c] = best;
    out_places[s * chunks + c] = where;
  }
  // On the host: a segment's chunks one after another, each in its own loops (a SIMD loop across
  // the chunks, the engine's default, would run those in lock step).
  void whole_segment(index s) const {
    for (index c = 0; c < chunks; ++c) (*this)(s, c);
  }
  // The terms a call reads: the CPU engine weighs a pass by them, not by its calls, when it decides
  // whether to split the pass over its threads.
  std::int64_t terms_per_call() const noexcept { return chunk < length ? chunk : length; }
};
// dx[kept(s) + reduced(place[s])] = dy[s]: the maximum's gradient, into a zeroed dx.
template <class T>
struct scatter_to_places {
  const T* dy;
  const std::int64_t* places;
  T* dx;
  strided_map kept, reduced;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const { dx[kept(s) + reduced(places[s])] = dy[s]; }
};

// out[n, k] = (k == labels[n]) for [N, classes].
template <class T>
struct one_hot_rows {
  const std::int64_t* labels;
  T* out;
  std::int64_t classes;
  DISTRIBUTE_HOST_DEVICE void operator()(index n, index k) const {
    out[n * classes + k] = labels[n] == k ? T(1) : T(0);
  }
};

}  // namespace kernels
}  // namespace distribute::nn::detail
