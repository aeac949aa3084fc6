#pragma once
// The plans of the CPU engine's convolutions (dnnl_conv.hpp): which form each pass takes for a
// geometry, and the primitives, layouts and reorders of each (pass, geometry) made once and kept.
//
// Each distinct (pass, geometry, bias) gets a plan once: oneDNN picks the layouts its fastest kernel
// wants (blocked channels, `format_tag::any`), and the plan holds the primitive, the reorders between
// the caller's NCHW and those layouts, and the memory objects they run on. A call points the memory
// objects at the caller's tensors and at arena scratch, reorders in, runs, and reorders out: no
// descriptor is built and nothing is allocated in steady state. oneDNN's workspace also comes from
// the arena (user scratchpad mode). In bfloat16 the reorders in are also the conversions (rounding
// to nearest even); a pass oneDNN has no bfloat16 kernel for returns false, and the engine computes
// it another way. `backward` runs a convolution's two gradients for one dy, and where their
// primitives read dy in the same layout (they do wherever both are blocked) reorders it once.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/dnnl_kernel_rules.hpp>
#include <distribute/engine/detail/dnnl_weight_pieces.hpp>
#include <distribute/engine/detail/openmp.hpp>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_version.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace distribute::detail {

class dnnl_conv_planner : public dnnl_kernel_rules, public dnnl_weight_pieces {
 public:
  // oneDNN needs right padding that gives exactly the output extents; where the window leaves input
  // rows unused at the far edge that padding is negative, which not every oneDNN kernel accepts.
  static bool supports(const conv_geometry& g) noexcept {
    return right_pad(g.in_height, g.out_height, g) >= 0 && right_pad(g.in_width, g.out_width, g) >= 0;
  }

  // Where Winograd's kernel is faster than the direct one (measured on two Zen 4 cores, one and two
  // threads, oneDNN 2.6.3): a 3x3 window at stride 1 with at least 32 channels in and out, over at
  // least 1024 output pixels an example (32x32); smaller planes or fewer channels leave its
  // transforms more costly than the multiplications they save. The rule reads no batch size, so an
  // example computes alike however a batch is split between replicas.
  static bool winograd_pays(const conv_geometry& g) noexcept {
    return g.kernel == 3 && g.stride == 1 && g.in_channels >= 32 && g.out_channels >= 32 &&
           g.out_height * g.out_width >= 1024;
  }

  // Where a Winograd data gradient is computed as its inside and its edges (dnnl_conv.hpp): a 3x3
  // window at stride 1 without padding, whose input plane takes one more row or column of 4x4 tiles
  // than its output plane (the output's extent is 0 or 3 modulo 4).
  static bool splits_border(const conv_geometry& g) noexcept {
    const auto tiles = [](std::int64_t n) { return (n + 3) / 4; };
    return g.kernel == 3 && g.stride == 1 && g.pad == 0 && g.batch > 0 &&
           (tiles(g.in_height) > tiles(g.out_height) || tiles(g.in_width) > tiles(g.out_width));
  }

  // Where a convolution's gradients are computed as passes of its swapped convolution (dnnl_conv.hpp):
  // stride 1, fewer than 8 output channels from at least 16 input channels, and the same padding on
  // both sides of each dimension (every stride-1 geometry conv_geometry::of makes).
  static bool swaps_sides(const conv_geometry& g) noexcept {
    return g.stride == 1 && g.out_channels < 8 && g.in_channels >= 16 && g.pad < g.kernel &&
           right_pad(g.in_height, g.out_height, g) == g.pad && right_pad(g.in_width, g.out_width, g) == g.pad;
  }
  // The swapped convolution of g (dnnl_conv.hpp): g's output plane in, g's input plane out, padding k-1-p.
  static conv_geometry swapped(const conv_geometry& g) noexcept {
    return {g.batch, g.out_channels,       g.out_height, g.out_width, g.in_channels, g.kernel,
            1,       g.kernel - 1 - g.pad, g.in_height,  g.in_width};
  }

 protected:
  // `pieces`: the weight gradients' grid (dnnl_weight_pieces.hpp); 1 computes each as one primitive
  // on the calling thread's OpenMP threads. `cut_channels_last`: the grid of channels-last passes
  // splits their output channels first (dnnl_weight_pieces.hpp), else only their examples.
  dnnl_conv_planner(int pieces, bool cut_channels_last)
      : pieces_{std::max(1, pieces)}, cut_channels_last_{cut_channels_last} {
    check(dnnl_engine_create(&engine_raw_, dnnl_cpu, 0), "dnnl_engine_create");
    engine_.reset(engine_raw_);
    dnnl_stream_t s = nullptr;
    check(dnnl_stream_create(&s, engine_raw_, dnnl_stream_default_flags), "dnnl_stream_create");
    stream_.reset(s);
  }

  static std::int64_t right_pad(std::int64_t in, std::int64_t out, const conv_geometry& g) noexcept {
    return (out - 1) * g.stride + g.kernel - in - g.pad;
  }

  struct plan {
    primitive_handle prim;
    std::string impl;
    thread_rule rule = thread_rule::fixed_count;
    std::size_t scratchpad_bytes = 0;
    memory scratchpad, bias;
    operand a, b, c;                 // forward: src, weights, dst; data gradient: diff_dst, weights, diff_src;
                                     // weight gradient: src, diff_dst, diff_weights
    operand window;                  // a data gradient's inside (splits_border): the weights as [kh][kw][in][out]
    std::unique_ptr<pieces> sliced;  // a weight gradient in pieces (a, b: x and dy; no c)
  };
  using key = std::array<std::int64_t, 15>;

  dnnl_stream_t stream() const noexcept { return stream_.get(); }

  // The plan of geometry g's data gradient: its inside's where splits_border applies and oneDNN has
  // the Winograd kernel for it, the whole pass's otherwise.
  plan* data_plan_for(const conv_geometry& g, bool half, bool winograd) {
    if (winograd && !half && splits_border(g))
      if (plan* inside = plan_for(pass::backward_data, g, false, half, winograd, true)) return inside;
    return plan_for(pass::backward_data, g, false, half, winograd);
  }

  // The plan a pass of g runs on as forward, backward_data and backward_weights run it: plan_of, and
  // for a data gradient split at its border (data_plan_for) its inside's.
  plan* pass_plan(pass which, const conv_geometry& g, bool bias, bool half, bool winograd) {
    if (which == pass::backward_data && !swaps_sides(g)) return data_plan_for(g, half, winograd);
    return plan_of(which, g, bias, half, winograd);
  }

  // The plan a pass of g runs on: for the gradients of a convolution that swaps_sides, the swapped
  // convolution's forward (the data gradient) or weight gradient (without bias: db is summed apart).
  plan* plan_of(pass which, const conv_geometry& g, bool bias, bool half, bool winograd) {
    if (which == pass::forward || !swaps_sides(g)) return plan_for(which, g, bias, half, winograd);
    if (which == pass::backward_data) return plan_for(pass::forward, swapped(g), false, half, false);
    return plan_for(which, swapped(g), false, false,
                    false);  // (on rounded float32 copies in bfloat16: backward_weights)
  }

  // The plan of a pass, made on first use; null where `half` has no kernel (remembered too). Asked
  // for `winograd` where oneDNN has no such kernel (or not for this geometry), the plan is direct.
  // With `inside`, the plan of a split data gradient's inside (splits_border): Winograd only, null
  // where oneDNN has no such kernel.
  plan* plan_for(pass which, const conv_geometry& g, bool bias, bool half, bool winograd, bool inside = false) {
    const key k{static_cast<std::int64_t>(which),
                bias,
                half,
                winograd,
                inside,
                g.batch,
                g.in_channels,
                g.in_height,
                g.in_width,
                g.out_channels,
                g.kernel,
                g.stride,
                g.pad,
                g.out_height,
                g.out_width};
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second.get();
    std::unique_ptr<plan> made =
        winograd ? make_plan(which, g, bias, half, dnnl_convolution_winograd, inside) : nullptr;
    if (!made && !inside) made = make_plan(which, g, bias, half, dnnl_convolution_direct);
    return plans_.emplace(k, std::move(made)).first->second.get();
  }

  // Strides and the padding on either side, per spatial dimension.
  struct window {
    dnnl_dims_t strides, pad_l, pad_r;
  };

  // Null where oneDNN has no kernel for `half` or for `algorithm` (any other failure throws).
  // With `inside` (a data gradient, splits_border): the plan of its inside, the same convolution with
  // padding 1 over the output's plane, writing into the input plane from row 1, column 1; and the
  // window's reorder for the edges.
  std::unique_ptr<plan> make_plan(pass which, const conv_geometry& whole, bool bias, bool half,
                                  dnnl_alg_kind_t algorithm, bool inside = false) {
    const conv_geometry g = inside ? conv_geometry::of(whole.batch, whole.in_channels, whole.out_height,
                                                       whole.out_width, whole.out_channels, 3, 1, 1)
                                   : whole;
    const bool may_lack = half || algorithm != dnnl_convolution_direct;
    // A weight gradient in pieces reads x and dy in the layouts oneDNN chooses for the whole pass,
    // which may follow the thread count it is chosen for: chosen for the configured count (`pieces_`),
    // whatever the count in use, so that every count's plan cuts the same grid in the same layouts.
    std::optional<openmp_thread_count> configured;
    if (which == pass::backward_weights && pieces_ > 1) configured.emplace(pieces_);
    const std::vector<dnnl_dim_t> src{g.batch, g.in_channels, g.in_height, g.in_width};
    const std::vector<dnnl_dim_t> wei{g.out_channels, g.in_channels, g.kernel, g.kernel};
    const std::vector<dnnl_dim_t> dst{g.batch, g.out_channels, g.out_height, g.out_width};
    const window win{{g.stride, g.stride},
                     {g.pad, g.pad},
                     {right_pad(g.in_height, g.out_height, g), right_pad(g.in_width, g.out_width, g)}};
    // What each operand is in: the pass's two inputs in bfloat16 with `half`, everything else float32.
    const dnnl_data_type_t in_type = half ? dnnl_bf16 : dnnl_f32;
    const bool src_in = which != pass::backward_data, wei_in = which != pass::backward_weights,
               dst_in = which != pass::forward;
    const memory_desc src_any = md(src, dnnl_format_tag_any, src_in ? in_type : dnnl_f32),
                      wei_any = md(wei, dnnl_format_tag_any, wei_in ? in_type : dnnl_f32),
                      dst_any = md(dst, dnnl_format_tag_any, dst_in ? in_type : dnnl_f32);
    const memory_desc src_user = md(src, dnnl_nchw), wei_user = md(wei, dnnl_oihw), dst_user = md(dst, dnnl_nchw);
    // The plain layouts the data gradient may ask for (below), in the pass's types.
    const memory_desc src_plain = md(src, dnnl_nchw, src_in ? in_type : dnnl_f32),
                      wei_plain = md(wei, dnnl_oihw, wei_in ? in_type : dnnl_f32),
                      dst_plain = md(dst, dnnl_nchw, dst_in ? in_type : dnnl_f32);
    const memory_desc bias_md = md({g.out_channels}, dnnl_x);

    dnnl_primitive_attr_t attr_raw = nullptr;
    check(dnnl_primitive_attr_create(&attr_raw), "dnnl_primitive_attr_create");
    const handle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy> attr{attr_raw};
    check(dnnl_primitive_attr_set_scratchpad_mode(attr_raw, dnnl_scratchpad_mode_user), "set_scratchpad_mode");

    // The forward descriptor is also the hint the two backward passes are built from (in bfloat16:
    // bfloat16 inputs, a float32 output, as the forward pass itself).
    const memory_desc fwd_src = md(src, dnnl_format_tag_any, in_type), fwd_wei = md(wei, dnnl_format_tag_any, in_type);
    const memory_desc fwd_dst = md(dst, dnnl_format_tag_any);
    const md_ptr bias_or_null = bias ? bias_md.get() : nullptr;
    desc_handle fwd = primitive_desc(pass::forward, algorithm, fwd_src.get(), fwd_wei.get(), bias_or_null,
                                     fwd_dst.get(), win, attr_raw, nullptr, may_lack);
    if (!fwd) return nullptr;
    auto p = std::make_unique<plan>();
    p->bias.make(engine_raw_, bias_md.get());
    desc_handle bwd;
    const_dnnl_primitive_desc_t pd = fwd.get();
    switch (which) {
      case pass::forward:
        p->a.set(engine_raw_, src_user.get(), query(pd, dnnl_query_src_md), true, reorders_, false, src);
        p->b.set(engine_raw_, wei_user.get(), query(pd, dnnl_query_weights_md), true, reorders_);
        p->c.set(engine_raw_, dst_user.get(), query(pd, dnnl_query_dst_md), false, reorders_, false, dst);
        break;
      case pass::backward_data: {
        // With fewer than 8 input channels (an image's) the blocked kernels' data gradient runs at a
        // third of the GEMM-based one that plain layouts select (measured 8 vs 25 GFLOP/s, 1 -> 16
        // channels, 7x7, on AVX2).
        const bool plain = g.in_channels < 8;
        bwd = primitive_desc(pass::backward_data, algorithm, (plain ? src_plain : src_any).get(),
                             (plain ? wei_plain : wei_any).get(), nullptr, (plain ? dst_plain : dst_any).get(), win,
                             attr_raw, fwd.get(), may_lack);
        if (!bwd) return nullptr;
        pd = bwd.get();
        p->a.set(engine_raw_, dst_user.get(), query(pd, dnnl_query_diff_dst_md), true, reorders_, false, dst);
        p->b.set(engine_raw_, wei_user.get(), query(pd, dnnl_query_weights_md), true, reorders_);
        if (!inside) {
          p->c.set(engine_raw_, src_user.get(), query(pd, dnnl_query_diff_src_md), false, reorders_, false, src);
          break;
        }
        // The inside of the whole input plane: rows and columns 1 to its extent - 2.
        const memory_desc in_place(
            src,
            {whole.in_channels * whole.in_height * whole.in_width, whole.in_height * whole.in_width, whole.in_width, 1},
            dnnl_f32);
        p->c.set(engine_raw_, in_place.get(), query(pd, dnnl_query_diff_src_md), false, reorders_);
        const memory_desc hwio = md(wei, dnnl_hwio);
        p->window.set(engine_raw_, wei_user.get(), hwio.get(), true, reorders_);
        break;
      }
      case pass::backward_weights:
        bwd = primitive_desc(pass::backward_weights, algorithm, src_any.get(), wei_any.get(), bias_or_null,
                             dst_any.get(), win, attr_raw, fwd.get(), may_lack);
        if (!bwd) return nullptr;
        pd = bwd.get();
        if (pieces_ > 1 && make_pieces(*p, g, bias, half, algorithm, pd, attr_raw, win)) return p;
        p->a.set(engine_raw_, src_user.get(), query(pd, dnnl_query_src_md), true, reorders_, false, src);
        p->b.set(engine_raw_, dst_user.get(), query(pd, dnnl_query_diff_dst_md), true, reorders_, false, dst);
        p->c.set(engine_raw_, wei_user.get(), query(pd, dnnl_query_diff_weights_md), false, reorders_, true);
        break;
    }
    const md_ptr scratchpad = query(pd, dnnl_query_scratchpad_md);
    p->scratchpad_bytes = dnnl_memory_desc_get_size(scratchpad);
    p->scratchpad.make(engine_raw_, scratchpad);
    p->impl = impl_of(pd);
    p->rule = rule_for(which, p->impl, false);
    p->prim = make_primitive(pd, "dnnl_primitive_create (convolution)");
    return p;
  }

  // A weight gradient's pieces (dnnl_weight_pieces.hpp) into p: p.a and p.b reorder x and dy into the
  // layouts the whole pass `whole` chose, where those are plain or blocks of 16 channels, and p.sliced
  // holds the grid and the one-thread primitives. False (p untouched) where the layouts are others, or
  // where oneDNN has no kernel for a piece as good as the whole pass's.
  bool make_pieces(plan& p, const conv_geometry& g, bool bias, bool half, dnnl_alg_kind_t algorithm,
                   const_dnnl_primitive_desc_t whole, const_dnnl_primitive_attr_t attr, const window& win) {
#if defined(_OPENMP)
    const dnnl_data_type_t in_type = half ? dnnl_bf16 : dnnl_f32;
    const std::vector<dnnl_dim_t> src{g.batch, g.in_channels, g.in_height, g.in_width};
    const std::vector<dnnl_dim_t> dst{g.batch, g.out_channels, g.out_height, g.out_width};
    // The layouts the whole pass chose, where an example's channels in blocks of 16 are contiguous
    // (plain, or blocks of 8 or 16 channels) or at least the example is (channels last; one block).
    struct chosen {
      dnnl_format_tag_t tag = dnnl_format_tag_undef;
      std::int64_t block = 1;  // channels a layout block holds (0: the channels cannot be split)
    };
    const auto layout = [&](md_ptr d, const std::vector<dnnl_dim_t>& dims) {
      for (const chosen c :
           {chosen{dnnl_nchw, 1}, chosen{dnnl_nChw8c, 8}, chosen{dnnl_nChw16c, 16}, chosen{dnnl_nhwc, 0}})
        if (dnnl_memory_desc_equal(d, md(dims, c.tag, in_type).get())) return c;
      return chosen{};
    };
    const chosen x_layout = layout(query(whole, dnnl_query_src_md), src),
                 dy_layout = layout(query(whole, dnnl_query_diff_dst_md), dst);
    if (x_layout.tag == dnnl_format_tag_undef || dy_layout.tag == dnnl_format_tag_undef) return false;
    const dnnl_format_tag_t x_tag = x_layout.tag, dy_tag = dy_layout.tag;
    auto q = std::make_unique<pieces>();
    // Channels last (both), where asked: output blocks first, each piece's channels of dy gathered
    // (dnnl_weight_pieces.hpp); otherwise runs of examples alone, as the layouts allow no other split.
    const bool channels_last = cut_channels_last_ && x_layout.block == 0 && dy_layout.block == 0;
    q->shape = pieces_grid(g, pieces_, x_layout.block > 0, dy_layout.block > 0, channels_last);
    // Fewer pieces than configured threads would leave threads idle on an idle machine (a batch of
    // one in channels-last layouts, which oneDNN's AMX kernels take, unless cut over its channels):
    // the whole pass on the configured count is faster there.
    if (q->shape.count() < pieces_) return false;
    q->out_channels = g.out_channels / q->shape.out_blocks;
    q->in_channels = g.in_channels / q->shape.in_blocks;
    const auto padded = [](std::int64_t c, const chosen& l) {
      return l.block > 1 ? (c + l.block - 1) / l.block * l.block : c;
    };
    q->x_channels = padded(g.in_channels, x_layout);
    q->dy_channels = padded(g.out_channels, dy_layout);
    q->x_plane = g.in_height * g.in_width;
    q->dy_plane = g.out_height * g.out_width;
    q->value_bytes = half ? 2 : 4;
    // A run of examples whose channels are whole is one primitive over the run (its examples are
    // contiguous in any of the layouts above); split channels are not, and go one example at a time,
    // except dy's output blocks in channels last, which each piece gathers for its whole run.
    const bool gather = channels_last && q->shape.out_blocks > 1;
    q->examples = q->shape.in_blocks == 1 && (q->shape.out_blocks == 1 || gather) && g.batch % q->shape.runs == 0
                      ? g.batch / q->shape.runs
                      : 1;
    const std::vector<dnnl_dim_t> piece_src{q->examples, q->in_channels, g.in_height, g.in_width};
    const std::vector<dnnl_dim_t> piece_dst{q->examples, q->out_channels, g.out_height, g.out_width};
    const std::vector<dnnl_dim_t> piece_wei{q->out_channels, q->in_channels, g.kernel, g.kernel};
    const memory_desc x_md = md(piece_src, x_tag, in_type), dy_md = md(piece_dst, dy_tag, in_type);
    const memory_desc wei_any = md(piece_wei, dnnl_format_tag_any, in_type),
                      dwei_any = md(piece_wei, dnnl_format_tag_any);
    const memory_desc bias_md = md({q->out_channels}, dnnl_x);
    const memory_desc fwd_dst = md(piece_dst, dnnl_format_tag_any);
    // Made for one thread: oneDNN fixes a primitive's thread count (and the split of its sums) here.
    const one_openmp_thread alone;
    const bool may_lack = true;
    desc_handle fwd = primitive_desc(pass::forward, algorithm, x_md.get(), wei_any.get(),
                                     bias ? bias_md.get() : nullptr, fwd_dst.get(), win, attr, nullptr, may_lack);
    if (!fwd) return false;
    desc_handle plain = primitive_desc(pass::backward_weights, algorithm, x_md.get(), dwei_any.get(), nullptr,
                                       dy_md.get(), win, attr, fwd.get(), may_lack);
    desc_handle with_bias = bias ? primitive_desc(pass::backward_weights, algorithm, x_md.get(), dwei_any.get(),
                                                  bias_md.get(), dy_md.get(), win, attr, fwd.get(), may_lack)
                                 : desc_handle{};
    if (!plain || (bias && !with_bias)) return false;
    const std::string whole_impl = impl_of(whole), piece_impl = impl_of(plain.get());
    const auto reference = [](const std::string& impl) { return impl.find("ref") != std::string::npos; };
    if (reference(piece_impl) && !reference(whole_impl)) return false;
    // Gathered pieces pay a copy of dy: only with the whole pass's own kernel (AMX's brgemm on AMX).
    if (gather && piece_impl != whole_impl) return false;
    if (gather)
      q->gathered_bytes = static_cast<std::size_t>(q->examples * q->out_channels * q->dy_plane) * q->value_bytes;
    const md_ptr gradient = query(plain.get(), dnnl_query_diff_weights_md);
    if (with_bias && !dnnl_memory_desc_equal(gradient, query(with_bias.get(), dnnl_query_diff_weights_md)))
      return false;
    q->gradient_bytes = dnnl_memory_desc_get_size(gradient);
    const md_ptr scratch_plain = query(plain.get(), dnnl_query_scratchpad_md);
    q->scratchpad_bytes = dnnl_memory_desc_get_size(scratch_plain);
    if (with_bias)
      q->scratchpad_bytes =
          std::max(q->scratchpad_bytes, dnnl_memory_desc_get_size(query(with_bias.get(), dnnl_query_scratchpad_md)));
    // The piece's gradient added into its block of the caller's [out][in][k][k] weights.
    // (A kernel with plain weights, oneDNN's gemm-based ones, writes the block's own layout where the
    // input channels are whole: the reorder then only adds.)
    const memory_desc block(piece_wei, {g.in_channels * g.kernel * g.kernel, g.kernel * g.kernel, g.kernel, 1},
                            dnnl_f32);
    q->plain = make_primitive(plain.get(), "dnnl_primitive_create (a weight gradient's piece)");
    if (with_bias) q->with_bias = make_primitive(with_bias.get(), "dnnl_primitive_create (a weight gradient's piece)");
    q->back = make_reorder(engine_raw_, gradient, block.get(), true);
    const memory_desc scratch_md =
        md({static_cast<dnnl_dim_t>(std::max<std::size_t>(q->scratchpad_bytes, 1))}, dnnl_x, dnnl_u8);
    q->threads.resize(static_cast<std::size_t>(pieces_));
    for (auto& ts : q->threads) {
      dnnl_stream_t raw = nullptr;
      check(dnnl_stream_create(&raw, engine_raw_, dnnl_stream_default_flags), "dnnl_stream_create");
      ts.stream.reset(raw);
      ts.src.make(engine_raw_, x_md.get());
      ts.ddst.make(engine_raw_, dy_md.get());
      ts.dwei.make(engine_raw_, gradient);
      ts.bias.make(engine_raw_, bias_md.get());
      ts.scratchpad.make(engine_raw_, scratch_md.get());
      ts.block.make(engine_raw_, block.get());
    }
    const memory_desc src_user = md(src, dnnl_nchw), dst_user = md(dst, dnnl_nchw);
    p.a.set(engine_raw_, src_user.get(), md(src, x_tag, in_type).get(), true, reorders_, false, src);
    p.b.set(engine_raw_, dst_user.get(), md(dst, dy_tag, in_type).get(), true, reorders_, false, dst);
    p.impl = piece_impl;
    p.rule = thread_rule::pieces;
    p.sliced = std::move(q);
    return true;
#else
    (void)p, (void)g, (void)bias, (void)half, (void)algorithm, (void)whole, (void)attr, (void)win;
    return false;
#endif
  }

  // The primitive descriptor of one pass over the operands (in the order of forward: src, weights,
  // bias or null, dst; in the backward passes the gradients of those), built from the forward one
  // (`hint`) for the backward passes. Null where `may_lack` and oneDNN has no kernel for it
  // (bfloat16 on some CPUs and geometries, Winograd on most); any other failure throws.
  desc_handle primitive_desc(pass which, dnnl_alg_kind_t algorithm, md_ptr src, md_ptr wei, md_ptr bias, md_ptr dst,
                             const window& w, const_dnnl_primitive_attr_t attr, const_dnnl_primitive_desc_t hint,
                             bool may_lack) {
    dnnl_primitive_desc_t raw = nullptr;
    dnnl_status_t s = dnnl_success;
#if DNNL_VERSION_MAJOR >= 3
    const dnnl_dims_t no_dilation{0, 0};
    switch (which) {
      case pass::forward:
        s = dnnl_convolution_forward_primitive_desc_create(&raw, engine_raw_, dnnl_forward_training, algorithm, src,
                                                           wei, bias, dst, w.strides, no_dilation, w.pad_l, w.pad_r,
                                                           attr);
        break;
      case pass::backward_data:
        s = dnnl_convolution_backward_data_primitive_desc_create(&raw, engine_raw_, algorithm, src, wei, dst, w.strides,
                                                                 no_dilation, w.pad_l, w.pad_r, hint, attr);
        break;
      case pass::backward_weights:
        s = dnnl_convolution_backward_weights_primitive_desc_create(
            &raw, engine_raw_, algorithm, src, wei, bias, dst, w.strides, no_dilation, w.pad_l, w.pad_r, hint, attr);
        break;
    }
#else
    dnnl_convolution_desc_t op;
    switch (which) {
      case pass::forward:
        check(dnnl_convolution_forward_desc_init(&op, dnnl_forward_training, algorithm, src, wei, bias, dst, w.strides,
                                                 w.pad_l, w.pad_r),
              "dnnl_convolution_forward_desc_init");
        break;
      case pass::backward_data:
        check(dnnl_convolution_backward_data_desc_init(&op, algorithm, src, wei, dst, w.strides, w.pad_l, w.pad_r),
              "dnnl_convolution_backward_data_desc_init");
        break;
      case pass::backward_weights:
        check(dnnl_convolution_backward_weights_desc_init(&op, algorithm, src, wei, bias, dst, w.strides, w.pad_l,
                                                          w.pad_r),
              "dnnl_convolution_backward_weights_desc_init");
        break;
    }
    s = dnnl_primitive_desc_create(&raw, &op, attr, engine_raw_, hint);
#endif
    if (s == dnnl_unimplemented && may_lack) return desc_handle{};
    check(s, "creating a convolution's primitive descriptor");
    return desc_handle{raw};
  }

  dnnl_engine_t engine_raw_ = nullptr;
  handle<dnnl_engine_t, dnnl_engine_destroy> engine_;
  handle<dnnl_stream_t, dnnl_stream_destroy> stream_;
  std::map<key, std::unique_ptr<plan>> plans_;  // destroyed before the stream and the engine
  std::size_t reorders_ = 0;
  int pieces_ = 1;
  bool cut_channels_last_ = false;
};

}  // namespace distribute::detail
