#pragma once
// oneDNN's objects as the CPU engine's convolutions (dnnl_conv.hpp) hold them: owning handles, memory
// descriptors, memory objects pointed at new data on each call, an operand in the caller's layout and
// the primitive's with the reorder between them, and rounding to bfloat16 on the way in.
//
// Written against oneDNN's C API: its C++ API is header code that every program including the
// layers would compile (measured: +7.8 CPU-seconds on the CycleGAN trainer's translation unit).
// Builds with oneDNN 2.x and 3.x. The two differ in two places, each under DNNL_VERSION_MAJOR: a
// memory descriptor (a value in 2.x, a handle oneDNN allocates in 3.x; `memory_desc` below owns
// either) and how a convolution's primitive descriptor is made (from an operation descriptor in 2.x,
// directly in 3.x; `primitive_desc`, dnnl_conv_planner.hpp).
//
// With `round` (Winograd in bfloat16: the engine's float32 arithmetic on bfloat16 values) a pass's two
// inputs are rounded to bfloat16 (nearest, ties to even) on their way into the primitive's layout.
// Where that layout is channels in blocks of 16 (nChw16c, the activations of every Winograd pass)
// one pass over the tensor both rounds and reorders (oneDNN's reorders copy float32 exactly and
// cannot round); elsewhere (the weights) a rounded copy is reordered.

#include <distribute/bfloat16.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/openmp.hpp>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_version.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::detail {

class dnnl_memory {
 protected:
  static void check(dnnl_status_t s, const char* what) {
    if (s != dnnl_success)
      throw std::runtime_error(std::string("distribute: oneDNN's ") + what + " failed with status " +
                               std::to_string(static_cast<int>(s)));
  }
  template <class T, dnnl_status_t (*Destroy)(T)>
  struct deleter {
    void operator()(T p) const noexcept {
      if (p) Destroy(p);
    }
  };
  template <class T, dnnl_status_t (*Destroy)(T)>
  using handle = std::unique_ptr<std::remove_pointer_t<T>, deleter<T, Destroy>>;
  using memory_handle = handle<dnnl_memory_t, dnnl_memory_destroy>;
  using primitive_handle = handle<dnnl_primitive_t, dnnl_primitive_destroy>;
  using desc_handle = handle<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy>;

#if DNNL_VERSION_MAJOR >= 3
  using md_ptr = const_dnnl_memory_desc_t;  // what oneDNN's functions take and its queries return
  using md_handle = handle<dnnl_memory_desc_t, dnnl_memory_desc_destroy>;
  // A memory descriptor: a handle oneDNN allocates, destroyed with this object.
  class memory_desc {
   public:
    memory_desc(const std::vector<dnnl_dim_t>& dims, dnnl_format_tag_t tag, dnnl_data_type_t type) {
      dnnl_memory_desc_t raw = nullptr;
      check(dnnl_memory_desc_create_with_tag(&raw, static_cast<int>(dims.size()), dims.data(), type, tag),
            "dnnl_memory_desc_create_with_tag");
      d_.reset(raw);
    }
    memory_desc(const std::vector<dnnl_dim_t>& dims, const std::vector<dnnl_dim_t>& strides, dnnl_data_type_t type) {
      dnnl_memory_desc_t raw = nullptr;
      check(
          dnnl_memory_desc_create_with_strides(&raw, static_cast<int>(dims.size()), dims.data(), type, strides.data()),
          "dnnl_memory_desc_create_with_strides");
      d_.reset(raw);
    }
    md_ptr get() const noexcept { return d_.get(); }

   private:
    md_handle d_;
  };
#else
  using md_ptr = const dnnl_memory_desc_t*;
  // A memory descriptor: a plain struct in oneDNN 2.x.
  class memory_desc {
   public:
    memory_desc(const std::vector<dnnl_dim_t>& dims, dnnl_format_tag_t tag, dnnl_data_type_t type) {
      check(dnnl_memory_desc_init_by_tag(&d_, static_cast<int>(dims.size()), dims.data(), type, tag),
            "dnnl_memory_desc_init_by_tag");
    }
    memory_desc(const std::vector<dnnl_dim_t>& dims, const std::vector<dnnl_dim_t>& strides, dnnl_data_type_t type) {
      check(dnnl_memory_desc_init_by_strides(&d_, static_cast<int>(dims.size()), dims.data(), type, strides.data()),
            "dnnl_memory_desc_init_by_strides");
    }
    md_ptr get() const noexcept { return &d_; }

   private:
    dnnl_memory_desc_t d_{};
  };
#endif
  static memory_desc md(const std::vector<dnnl_dim_t>& dims, dnnl_format_tag_t tag, dnnl_data_type_t type = dnnl_f32) {
    return memory_desc(dims, tag, type);
  }
  // An operand's descriptor in a primitive descriptor; valid while that primitive descriptor lives.
  static md_ptr query(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    md_ptr d = dnnl_primitive_desc_query_md(pd, what, 0);
    if (!d) throw std::runtime_error("distribute: oneDNN returned no memory descriptor for a convolution operand");
    return d;
  }

  // A memory object of a fixed descriptor, pointed at new data on each call.
  struct memory {
    memory_handle m;
    void make(dnnl_engine_t e, md_ptr d) {
      dnnl_memory_t raw = nullptr;
      check(dnnl_memory_create(&raw, d, e, DNNL_MEMORY_NONE), "dnnl_memory_create");
      m.reset(raw);
    }
    dnnl_memory_t point(const void* data) const {
      check(dnnl_memory_set_data_handle(m.get(), const_cast<void*>(data)), "dnnl_memory_set_data_handle");
      return m.get();
    }
  };

  // One operand: the caller's layout, the primitive's, and the reorder between them when they differ.
  struct operand {
    memory user, lib;
    std::size_t lib_bytes = 0;  // the size of the primitive's layout
    std::int64_t count = 0;     // the values, in the caller's layout
    bool same = true;
    // An activation [n, c, h, w] whose primitive layout is nChw16c with whole blocks of channels:
    // in() with rounding writes that layout itself.
    bool blocked16 = false;
    // An output [n, c, h, w] that the primitive writes channels last (nhwc, float32) and the caller
    // reads as planes (nchw); with `own_transpose`, back() transposes it itself
    // (planes_from_channels_last) instead of running oneDNN's reorder, which is slow for planes whose
    // size is not a multiple of 16 (below). Chosen when the plan is made, by timing both here
    // (own_transpose_faster): they write the same values, so the choice changes the time alone.
    bool channels_last_out = false, own_transpose = false;
    std::int64_t n = 0, c = 0, hw = 0;
    primitive_handle reorder;
    std::size_t* reorders = nullptr;  // the reorders run (dnnl_conv::reorders_)

    // With `accumulate` (an output), the reorder back adds to the caller's values instead of
    // overwriting them (oneDNN's sum post-op: dst = src + dst, one rounding, as `+=`).
    // `dims`: an activation's [n, c, h, w] (empty for weights).
    void set(dnnl_engine_t e, md_ptr u, md_ptr l, bool input, std::size_t& counter, bool accumulate = false,
             const std::vector<dnnl_dim_t>& dims = {}) {
      reorders = &counter;
      lib_bytes = dnnl_memory_desc_get_size(l);
      count = static_cast<std::int64_t>(dnnl_memory_desc_get_size(u) / sizeof(float));
      same = dnnl_memory_desc_equal(u, l) != 0;
      if (dims.size() == 4) {
        n = dims[0], c = dims[1], hw = dims[2] * dims[3];
        blocked16 = input && dims[1] % 16 == 0 && dnnl_memory_desc_equal(l, md(dims, dnnl_nChw16c).get()) != 0;
        channels_last_out = !input && !accumulate && dnnl_memory_desc_equal(u, md(dims, dnnl_nchw).get()) != 0 &&
                            dnnl_memory_desc_equal(l, md(dims, dnnl_nhwc).get()) != 0;
      }
      user.make(e, u);
      if (same) return;
      lib.make(e, l);
      reorder = input ? make_reorder(e, u, l, false) : make_reorder(e, l, u, accumulate);
      if (channels_last_out) own_transpose = own_transpose_faster(e, reorder.get(), l, u, n, c, hw);
    }
    // The operand as the primitive reads it: the caller's memory, or a reordered copy in scratch slot
    // `slot`. With `round`, its values rounded to bfloat16: written in the primitive's layout at once
    // where that is blocked16, else a rounded copy in slot `plain` (reordered where it has to be).
    dnnl_memory_t in(dnnl_stream_t s, const float* data, arena& a, arena::slot slot, bool round = false,
                     arena::slot plain = arena::rounded_a) const {
      if (round && blocked16) {
        float* blocks = a.get<float>(slot, lib_bytes / sizeof(float));
        round_into_blocks(data, blocks, n, c, hw);
        return lib.point(blocks);
      }
      if (round) {
        float* copy = a.get<float>(plain, static_cast<std::size_t>(count));
        round_copy(data, copy, count);
        data = copy;
      }
      dnnl_memory_t um = user.point(data);
      if (same) return um;
      dnnl_memory_t lm = lib.point(a.get<std::byte>(slot, lib_bytes));
      const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, lm}};
      check(dnnl_primitive_execute(reorder.get(), s, 2, args), "reorder");
      ++*reorders;
      return lm;
    }
    // The copy in the primitive's layout that `in` left in scratch slot `slot` (nothing else may have
    // used the slot since).
    dnnl_memory_t reordered(arena& a, arena::slot slot) const { return lib.point(a.get<std::byte>(slot, lib_bytes)); }
    // Whether two operands are reordered into the same layout (so one copy serves both).
    static bool same_layout(const operand& x, const operand& y) {
      if (x.same || y.same) return false;
      return dnnl_memory_desc_equal(x.lib_desc(), y.lib_desc()) != 0;
    }
    md_ptr lib_desc() const {
      md_ptr d = nullptr;
      check(dnnl_memory_get_memory_desc(lib.m.get(), &d), "dnnl_memory_get_memory_desc");
      return d;
    }
    // Where the primitive writes: the caller's memory, or scratch to reorder back from.
    dnnl_memory_t out(float* data, arena& a, arena::slot slot) const {
      if (same) return user.point(data);
      return lib.point(a.get<std::byte>(slot, lib_bytes));
    }
    void back(dnnl_stream_t s, float* data) const {
      if (same) return;
      if (own_transpose) {
        planes_from_channels_last(reinterpret_cast<const float*>(data_of(lib.m.get())), data, n, c, hw);
        ++*reorders;
        return;
      }
      const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, lib.m.get()}, {DNNL_ARG_TO, user.point(data)}};
      check(dnnl_primitive_execute(reorder.get(), s, 2, args), "reorder");
      ++*reorders;
    }
  };

  // The primitive of `pd`; `what` names it in the error.
  static primitive_handle make_primitive(const_dnnl_primitive_desc_t pd, const char* what) {
    dnnl_primitive_t raw = nullptr;
    check(dnnl_primitive_create(&raw, pd), what);
    return primitive_handle{raw};
  }
  // A reorder from layout `from` to `to`; with `accumulate` it adds to what `to` holds (oneDNN's sum
  // post-op: dst = src + dst, one rounding, as `+=`).
  static primitive_handle make_reorder(dnnl_engine_t e, md_ptr from, md_ptr to, bool accumulate) {
    handle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy> attr;
    if (accumulate) {
      dnnl_primitive_attr_t raw_attr = nullptr;
      check(dnnl_primitive_attr_create(&raw_attr), "dnnl_primitive_attr_create");
      attr.reset(raw_attr);
      dnnl_post_ops_t raw_ops = nullptr;
      check(dnnl_post_ops_create(&raw_ops), "dnnl_post_ops_create");
      const handle<dnnl_post_ops_t, dnnl_post_ops_destroy> ops{raw_ops};
#if DNNL_VERSION_MAJOR >= 3
      check(dnnl_post_ops_append_sum(raw_ops, 1.0f, 0, dnnl_data_type_undef), "dnnl_post_ops_append_sum");
#else
      check(dnnl_post_ops_append_sum(raw_ops, 1.0f), "dnnl_post_ops_append_sum");
#endif
      check(dnnl_primitive_attr_set_post_ops(raw_attr, raw_ops), "dnnl_primitive_attr_set_post_ops");
    }
    dnnl_primitive_desc_t rpd = nullptr;
    check(dnnl_reorder_primitive_desc_create(&rpd, from, e, to, e, attr.get()), "dnnl_reorder_primitive_desc_create");
    const desc_handle owned{rpd};
    return make_primitive(rpd, "dnnl_primitive_create (reorder)");
  }

  // A value rounded to bfloat16 (distribute::bfloat16's rounding), kept in float.
  static float to_bfloat16(float v) noexcept { return static_cast<float>(bfloat16(v)); }
  // to[i] = from[i] rounded, for i < count, on the calling thread's OpenMP threads.
  static void round_copy(const float* from, float* to, std::int64_t count) noexcept {
#if defined(_OPENMP)
#  pragma omp parallel for simd schedule(static)
#endif
    for (std::int64_t i = 0; i < count; ++i) to[i] = to_bfloat16(from[i]);
  }
  // An [n, c, hw] tensor rounded into nChw16c (c a multiple of 16): block b's position p holds its 16
  // channels' values at p. One pass in place of a rounded copy and oneDNN's reorder of it.
  static void round_into_blocks(const float* from, float* to, std::int64_t n, std::int64_t c,
                                std::int64_t hw) noexcept {
    constexpr std::int64_t run = 64;  // positions per work item: 16 rows of 256 contiguous bytes read
    const std::int64_t blocks = n * (c / 16), runs = (hw + run - 1) / run;
#if defined(_OPENMP)
#  pragma omp parallel for schedule(static)
#endif
    for (std::int64_t item = 0; item < blocks * runs; ++item) {
      const std::int64_t b = item / runs, start = item % runs * run, end = std::min(start + run, hw);
      const float* src = from + b * 16 * hw;
      float* dst = to + b * 16 * hw;
      for (std::int64_t q = start; q < end; ++q) {
#if defined(_OPENMP)
#  pragma omp simd
#endif
        for (std::int64_t k = 0; k < 16; ++k) dst[q * 16 + k] = to_bfloat16(src[k * hw + q]);
      }
    }
  }

  // An [n, hw, c] tensor (channels last) transposed into [n, c, hw] (planes), on the calling thread's
  // OpenMP threads: each work item a run of 64 positions of one example, read 16 channels at a time
  // (64 rows of 64 contiguous bytes, which stay in L1) and written as 16 rows of 64 contiguous
  // values. oneDNN's reorder (jit:uni, 2.6 and 3.2) between those layouts runs at about 3 GB/s on two
  // cores where the plane's size is not a multiple of 16 (a residual block's padded 66x66, 13 ms for
  // a 64x262x262 tensor) and at 15-21 where it is; this at 13-22 on every size measured
  // (docs/benchmarks.md, "Channels-last outputs"), so each plan times both (own_transpose_faster).
  // A copy: the values are the same whoever writes them.
  static void planes_from_channels_last(const float* from, float* to, std::int64_t n, std::int64_t c,
                                        std::int64_t hw) noexcept {
    constexpr std::int64_t run = 64, width = 16;
    const std::int64_t runs = (hw + run - 1) / run;
#if defined(_OPENMP)
#  pragma omp parallel for schedule(static)
#endif
    for (std::int64_t item = 0; item < n * runs; ++item) {
      const std::int64_t b = item / runs, start = item % runs * run, end = std::min(start + run, hw);
      const float* src = from + b * hw * c;
      float* dst = to + b * c * hw;
      for (std::int64_t c0 = 0; c0 < c; c0 += width)
        for (std::int64_t k = c0; k < std::min(c0 + width, c); ++k) {
          float* row = dst + k * hw;
#if defined(_OPENMP)
#  pragma omp simd
#endif
          for (std::int64_t q = start; q < end; ++q) row[q] = src[q * c + k];
        }
    }
  }

  // Whether planes_from_channels_last writes an [n, c, hw] channels-last tensor (descriptor `from`)
  // into planes (`to`) faster than oneDNN's `reorder` between them, on this machine: each run seven
  // times in turn on scratch tensors, on one thread, the fastest of each. One thread, because on a
  // busy machine a parallel run waits for whichever of its threads the load delays: timed on two
  // threads beside a compile, oneDNN's reorder was chosen for some 66x66 and 262x262 outputs, 5-7x
  // slower alone. Both split their work evenly between threads, so one thread ranks them as two do.
  static bool own_transpose_faster(dnnl_engine_t e, const_dnnl_primitive_t reorder, md_ptr from, md_ptr to,
                                   std::int64_t n, std::int64_t c, std::int64_t hw) {
    const auto count = static_cast<std::size_t>(n * c * hw);
    std::vector<float> source(count), target(count);
    dnnl_stream_t raw = nullptr;
    check(dnnl_stream_create(&raw, e, dnnl_stream_default_flags), "dnnl_stream_create");
    const handle<dnnl_stream_t, dnnl_stream_destroy> s{raw};
    memory src, dst;
    src.make(e, from);
    dst.make(e, to);
    const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src.point(source.data())},
                                     {DNNL_ARG_TO, dst.point(target.data())}};
    const one_openmp_thread one;
    using clock = std::chrono::steady_clock;
    auto theirs = clock::duration::max(), ours = clock::duration::max();
    for (int i = 0; i < 7; ++i) {
      auto t0 = clock::now();
      check(dnnl_primitive_execute(reorder, s.get(), 2, args), "reorder");
      check(dnnl_stream_wait(s.get()), "dnnl_stream_wait");
      theirs = std::min(theirs, clock::now() - t0);
      t0 = clock::now();
      planes_from_channels_last(source.data(), target.data(), n, c, hw);
      ours = std::min(ours, clock::now() - t0);
    }
    return ours < theirs;
  }

  static const std::byte* data_of(dnnl_memory_t m) {
    void* d = nullptr;
    check(dnnl_memory_get_data_handle(m, &d), "dnnl_memory_get_data_handle");
    return static_cast<const std::byte*>(d);
  }
};

}  // namespace distribute::detail
