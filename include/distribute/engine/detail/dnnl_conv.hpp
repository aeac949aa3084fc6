#pragma once
// Convolutions through oneDNN: forward, data gradient and weight gradient of float32 NCHW tensors.
//
// Each distinct (pass, geometry, bias) gets a plan once: oneDNN picks the layouts its fastest kernel
// wants (blocked channels, `format_tag::any`), and the plan holds the primitive and the reorders
// between the caller's NCHW and those layouts. A call then reorders into arena scratch, runs, and
// reorders back: no descriptor is built and no memory is allocated in steady state. oneDNN's own
// workspace also comes from the arena (user scratchpad mode).
//
// Threads: oneDNN is built on OpenMP here and runs each primitive with the calling thread's OpenMP
// thread count, which the engine sets to the replica's share before every call.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/arena.hpp>

#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

namespace distribute::detail {

class dnnl_conv {
 public:
  enum class pass : std::uint8_t { forward, backward_data, backward_weights };

  dnnl_conv() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  // oneDNN needs right padding that gives exactly the output extents; where the window leaves input
  // rows unused at the far edge that padding is negative, which not every oneDNN kernel accepts.
  static bool supports(const conv_geometry& g) noexcept {
    return right_pad(g.in_height, g.out_height, g) >= 0 && right_pad(g.in_width, g.out_width, g) >= 0;
  }

  // y = conv(x, w) + bias (bias may be null).
  void forward(const conv_geometry& g, const float* x, const float* w, const float* bias, float* y, arena& a) {
    plan& p = plan_for(pass::forward, g, bias != nullptr);
    dnnl::memory src = p.a.in(engine_, stream_, x, a, arena::src);
    dnnl::memory wei = p.b.in(engine_, stream_, w, a, arena::weights);
    dnnl::memory dst = p.c.out(engine_, y, a, arena::dst);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias) args.insert({DNNL_ARG_BIAS, dnnl::memory(p.bias, engine_, const_cast<float*>(bias))});
    run(p, args, a);
    p.c.back(engine_, stream_, dst, y);
    stream_.wait();
  }

  // dx = the data gradient of conv for dy (overwritten).
  void backward_data(const conv_geometry& g, const float* dy, const float* w, float* dx, arena& a) {
    plan& p = plan_for(pass::backward_data, g, false);
    dnnl::memory ddst = p.a.in(engine_, stream_, dy, a, arena::dst);
    dnnl::memory wei = p.b.in(engine_, stream_, w, a, arena::weights);
    dnnl::memory dsrc = p.c.out(engine_, dx, a, arena::src);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}};
    run(p, args, a);
    p.c.back(engine_, stream_, dsrc, dx);
    stream_.wait();
  }

  // dw += the weight gradient for (x, dy); db += the sum of dy per channel (db may be null).
  void backward_weights(const conv_geometry& g, const float* x, const float* dy, float* dw, float* db, arena& a) {
    plan& p = plan_for(pass::backward_weights, g, db != nullptr);
    dnnl::memory src = p.a.in(engine_, stream_, x, a, arena::src);
    dnnl::memory ddst = p.b.in(engine_, stream_, dy, a, arena::dst);
    // The gradient lands in scratch (oneDNN overwrites), then is added in the caller's layout.
    float* dw_user = a.get<float>(arena::gradient, static_cast<std::size_t>(g.weight_size()));
    dnnl::memory dwei = p.c.out(engine_, dw_user, a, arena::weights);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}};
    float* db_user = nullptr;
    if (db) {
      db_user = a.get<float>(arena::bias_gradient, static_cast<std::size_t>(g.out_channels));
      args.insert({DNNL_ARG_DIFF_BIAS, dnnl::memory(p.bias, engine_, db_user)});
    }
    run(p, args, a);
    p.c.back(engine_, stream_, dwei, dw_user);
    stream_.wait();
    for (std::int64_t i = 0; i < g.weight_size(); ++i) dw[i] += dw_user[i];
    if (db)
      for (std::int64_t i = 0; i < g.out_channels; ++i) db[i] += db_user[i];
  }

  // The implementation oneDNN chose for a pass (for example "jit:avx2"), for logs and benchmarks.
  std::string implementation(pass which, const conv_geometry& g, bool bias) {
    return plan_for(which, g, bias).prim_desc_impl;
  }
  std::size_t plans() const noexcept { return plans_.size(); }

 private:
  static std::int64_t right_pad(std::int64_t in, std::int64_t out, const conv_geometry& g) noexcept {
    return (out - 1) * g.stride + g.kernel - in - g.pad;
  }

  // One operand: the caller's layout, the primitive's, and the reorders between them when they differ.
  struct operand {
    dnnl::memory::desc user, lib;
    bool same = true;
    dnnl::reorder to_lib, to_user;

    void set(const dnnl::engine& e, const dnnl::memory::desc& u, const dnnl::memory::desc& l, bool input) {
      user = u;
      lib = l;
      same = (u == l);
      if (same) return;
      if (input) to_lib = dnnl::reorder(dnnl::reorder::primitive_desc(e, u, e, l));
      else to_user = dnnl::reorder(dnnl::reorder::primitive_desc(e, l, e, u));
    }
    // The operand as the primitive reads it: the caller's memory, or a reordered copy in scratch.
    dnnl::memory in(const dnnl::engine& e, dnnl::stream& s, const float* data, arena& a, arena::slot slot) const {
      dnnl::memory um(user, e, const_cast<float*>(data));
      if (same) return um;
      dnnl::memory lm(lib, e, a.get<std::byte>(slot, lib.get_size()));
      to_lib.execute(s, um, lm);
      return lm;
    }
    // Where the primitive writes: the caller's memory, or scratch to reorder back from.
    dnnl::memory out(const dnnl::engine& e, float* data, arena& a, arena::slot slot) const {
      if (same) return dnnl::memory(user, e, data);
      return dnnl::memory(lib, e, a.get<std::byte>(slot, lib.get_size()));
    }
    void back(const dnnl::engine& e, dnnl::stream& s, dnnl::memory& lm, float* data) const {
      if (same) return;
      dnnl::memory um(user, e, data);
      to_user.execute(s, lm, um);
    }
  };

  struct plan {
    dnnl::primitive prim;
    std::string prim_desc_impl;
    dnnl::memory::desc scratchpad, bias;
    operand a, b, c;  // forward: src, weights, dst; data gradient: diff_dst, weights, diff_src;
                      // weight gradient: src, diff_dst, diff_weights
  };
  using key = std::array<std::int64_t, 13>;

  void run(plan& p, std::unordered_map<int, dnnl::memory>& args, arena& a) {
    if (p.scratchpad.get_size() > 0)
      args.insert({DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratchpad, engine_, a.get<std::byte>(arena::workspace, p.scratchpad.get_size()))});
    p.prim.execute(stream_, args);
  }

  plan& plan_for(pass which, const conv_geometry& g, bool bias) {
    const key k{static_cast<std::int64_t>(which), bias, g.batch, g.in_channels, g.in_height, g.in_width,
                g.out_channels, g.kernel, g.stride, g.pad, g.out_height, g.out_width, 0};
    auto it = plans_.find(k);
    if (it != plans_.end()) return *it->second;
    return *plans_.emplace(k, make_plan(which, g, bias)).first->second;
  }

  std::unique_ptr<plan> make_plan(pass which, const conv_geometry& g, bool bias) {
    using dnnl::memory;
    using tag = memory::format_tag;
    const auto f32 = memory::data_type::f32;
    const memory::dims src{g.batch, g.in_channels, g.in_height, g.in_width};
    const memory::dims wei{g.out_channels, g.in_channels, g.kernel, g.kernel};
    const memory::dims dst{g.batch, g.out_channels, g.out_height, g.out_width};
    const memory::dims strides{g.stride, g.stride}, pad_l{g.pad, g.pad};
    const memory::dims pad_r{right_pad(g.in_height, g.out_height, g), right_pad(g.in_width, g.out_width, g)};
    const memory::desc src_any(src, f32, tag::any), wei_any(wei, f32, tag::any), dst_any(dst, f32, tag::any);
    const memory::desc src_user(src, f32, tag::nchw), wei_user(wei, f32, tag::oihw), dst_user(dst, f32, tag::nchw);
    const memory::desc bias_md({g.out_channels}, f32, tag::x);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const auto alg = dnnl::algorithm::convolution_direct;

    // The forward descriptor is also the hint the two backward passes are built from.
    const auto fwd_desc = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_any, wei_any,
                                                                 bias_md, dst_any, strides, pad_l, pad_r)
                               : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_any, wei_any,
                                                                 dst_any, strides, pad_l, pad_r);
    const dnnl::convolution_forward::primitive_desc fwd(fwd_desc, attr, engine_);
    auto p = std::make_unique<plan>();
    p->bias = bias_md;
    switch (which) {
      case pass::forward:
        p->prim = dnnl::convolution_forward(fwd);
        p->prim_desc_impl = fwd.impl_info_str();
        p->scratchpad = fwd.scratchpad_desc();
        p->a.set(engine_, src_user, fwd.src_desc(), true);
        p->b.set(engine_, wei_user, fwd.weights_desc(), true);
        p->c.set(engine_, dst_user, fwd.dst_desc(), false);
        break;
      case pass::backward_data: {
        const dnnl::convolution_backward_data::primitive_desc bd(
            dnnl::convolution_backward_data::desc(alg, src_any, wei_any, dst_any, strides, pad_l, pad_r), attr, engine_, fwd);
        p->prim = dnnl::convolution_backward_data(bd);
        p->prim_desc_impl = bd.impl_info_str();
        p->scratchpad = bd.scratchpad_desc();
        p->a.set(engine_, dst_user, bd.diff_dst_desc(), true);
        p->b.set(engine_, wei_user, bd.weights_desc(), true);
        p->c.set(engine_, src_user, bd.diff_src_desc(), false);
        break;
      }
      case pass::backward_weights: {
        const auto desc = bias ? dnnl::convolution_backward_weights::desc(alg, src_any, wei_any, bias_md, dst_any, strides, pad_l, pad_r)
                               : dnnl::convolution_backward_weights::desc(alg, src_any, wei_any, dst_any, strides, pad_l, pad_r);
        const dnnl::convolution_backward_weights::primitive_desc bw(desc, attr, engine_, fwd);
        p->prim = dnnl::convolution_backward_weights(bw);
        p->prim_desc_impl = bw.impl_info_str();
        p->scratchpad = bw.scratchpad_desc();
        p->a.set(engine_, src_user, bw.src_desc(), true);
        p->b.set(engine_, dst_user, bw.diff_dst_desc(), true);
        p->c.set(engine_, wei_user, bw.diff_weights_desc(), false);
        break;
      }
    }
    return p;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<key, std::unique_ptr<plan>> plans_;
};

}  // namespace distribute::detail
