#pragma once
// What oneDNN's kernels are, for the CPU engine's convolutions (dnnl_conv.hpp): the passes, the kernel
// oneDNN chose for each (its implementation name), the ISA and the library loaded, and by which rule
// each pass keeps its bits on any count of threads.
//
// Which passes keep their bits on any count of threads (`thread_rule`, per plan, from the kernel
// oneDNN reports). Not the kernel a CPU happens to pick: a pass runs on the count in use only where
// its kernel is one whose sums are known to be split by output and not by thread (oneDNN's direct
// `jit:` kernels on AVX2 and AVX-512, `jit_bf16`, Winograd, and the reference kernels: each output is
// one thread's fixed loop over channels and window), or where it is a weight gradient in one-thread
// pieces. Every other kernel runs on the configured count whatever the count in use
// (`fixed_count`): oneDNN's weight gradients unsliced (their threads split the batch and add their
// partial sums: jit_avx512_core_amx_convolution_bwd_weights_t and brgemm's bwd_w balance the batch
// over the threads the primitive was made for, then accumulate thread by thread), the kernels built
// on sgemm (`gemm:`; its driver may split the sum dimension between threads), the AMX and brgemm
// kernels (`amx`, `brg`: their blockings are chosen for the thread count, as 3.x's strided data
// gradient is measured to do), the data gradients of oneDNN 3.x, and any kernel not named here. On a
// CPU with AMX that keeps the bits of a configuration fixed at the price of not shedding threads on
// those passes when the machine is busy (compute_options::adapt_threads).

#include <distribute/engine/detail/winograd_f4x3.hpp>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_version.h>

#include <cstdint>
#include <string>

namespace distribute::detail {

struct dnnl_kernel_rules {
  enum class pass : std::uint8_t { forward, backward_data, backward_weights };

  // oneDNN 3.x's data-gradient kernels for strided convolutions (brgconv_strided) choose their
  // blocking, and with it the order of their sums, by the thread count they are made for (measured on
  // 3.2: 3 threads differ from 1, 2 and 4); 2.x's give each value of dx one thread. Where this is
  // true, the CPU engine runs data gradients on its configured count of threads whatever the count in
  // use, so that their bits do not follow the load.
  static constexpr bool data_gradient_follows_thread_count = DNNL_VERSION_MAJOR >= 3;

  // How a pass keeps its bits whatever the count of threads in use (above).
  enum class thread_rule : std::uint8_t {
    per_output,   // its kernel sums each output on one thread in a fixed order: any count in use
    pieces,       // a weight gradient in one-thread pieces: any count in use
    fixed_count,  // its kernel's sums may follow the thread count: the configured count always
  };
  // The rule for a pass by the kernel oneDNN chose for it (`impl`, its implementation name) and
  // whether it is a weight gradient in pieces.
  static thread_rule rule_for(pass which, const std::string& impl, bool in_pieces) noexcept {
    if (in_pieces) return thread_rule::pieces;
    // The engine's own Winograd (winograd_f4x3.hpp): each output computed on one thread, in items
    // fixed by the geometry.
    if (impl == winograd_f4x3::name) return thread_rule::per_output;
    if (which == pass::backward_weights) return thread_rule::fixed_count;
    if (which == pass::backward_data && data_gradient_follows_thread_count) return thread_rule::fixed_count;
    const auto has = [&](const char* part) { return impl.find(part) != std::string::npos; };
    if (has("amx") || has("brg") || has("gemm")) return thread_rule::fixed_count;
    if (has("ref") || impl.rfind("jit:", 0) == 0 || impl.rfind("jit_bf16:", 0) == 0 || impl.rfind("jit_wino", 0) == 0)
      return thread_rule::per_output;
    return thread_rule::fixed_count;
  }
  static const char* to_string(thread_rule r) noexcept {
    switch (r) {
      case thread_rule::per_output: return "one thread per output";
      case thread_rule::pieces: return "one-thread pieces";
      case thread_rule::fixed_count: return "the configured count";
    }
    return "?";
  }
  // The ISA oneDNN dispatches to on this CPU, for logs and tests: "avx512_core_amx", "avx512_core_bf16", ...
  static std::string isa() {
    switch (dnnl_get_effective_cpu_isa()) {
      case dnnl_cpu_isa_sse41: return "sse41";
      case dnnl_cpu_isa_avx: return "avx";
      case dnnl_cpu_isa_avx2: return "avx2";
      case dnnl_cpu_isa_avx512_core: return "avx512_core";
      case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
      case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
      case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
      default: return "isa " + std::to_string(static_cast<int>(dnnl_get_effective_cpu_isa()));
    }
  }

  // The oneDNN this program runs on, for logs: "oneDNN 3.2.0" (the library loaded, which is the one
  // the build found unless the loader was pointed elsewhere).
  static std::string library() {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }

 protected:
  // The implementation oneDNN chose for `pd` ("jit:avx512_core", ...; "" where it does not say).
  static std::string impl_of(const_dnnl_primitive_desc_t pd) {
    const char* impl = nullptr;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl ? std::string(impl)
                                                                                                     : std::string();
  }
};

}  // namespace distribute::detail
