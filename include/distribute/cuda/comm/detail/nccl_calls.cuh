#pragma once
// What every NCCL call of the communicator (cuda/comm/nccl.cuh) shares: `nccl_error`, thrown when an
// NCCL call fails, the check of a call's result with NCCL's own message, and the library's element
// types and reductions as NCCL's. A `mean` keeps the bits of a sum followed by one division, as in
// every other communicator of this library: NCCL's ncclAvg is used only where that is exact
// (nccl_average_is_exact), and our division follows NCCL's sum elsewhere (divide_after_nccl).

#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <nccl.h>

#include <string>

namespace distribute {

// An NCCL call failed (other than by the time-outs and aborts every communicator reports).
struct nccl_error : collective_error {
  nccl_error(ncclResult_t code, const std::string& what) : collective_error(what), code_{code} {}
  ncclResult_t code() const noexcept { return code_; }

 private:
  ncclResult_t code_;
};

namespace comm::detail {

inline std::string nccl_message(ncclResult_t rc, const char* call, ncclComm_t comm) {
  std::string msg = std::string("distribute: ") + call + " failed: " + ncclGetErrorString(rc);
  if (comm != nullptr) {
    if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
      msg += std::string(" (") + last + ")";
  }
  return msg;
}

// ncclInProgress is not an error: a non-blocking communicator finishes the call in the background.
inline ncclResult_t nccl_check(ncclResult_t rc, const char* call, ncclComm_t comm = nullptr) {
  if (rc != ncclSuccess && rc != ncclInProgress) throw nccl_error(rc, nccl_message(rc, call, comm));
  return rc;
}

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  switch (dtype_of<T>) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::int32: return ncclInt32;
    case dtype::int64: return ncclInt64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
  }
  return ncclFloat32;
}

// `mean`: NCCL's ncclAvg where it gives the same bits as a sum followed by one division (what every
// other communicator of this library computes), else NCCL's sum and our division. ncclAvg multiplies every
// input by 1/n before summing (floating point): with n a power of two that scaling is exact and
// commutes with each rounding of the sum, so the result is the sum divided by n, bit for bit, unless
// scaled values fall below the normal range (float16's starts at 6e-5, too near gradients' values:
// float16 keeps the division). Integers are always summed and divided (NCCL's average is for
// unsigned integers only).
template <class T>
constexpr bool nccl_average_is_exact(int ranks) noexcept {
  const bool power_of_two = ranks > 0 && (ranks & (ranks - 1)) == 0;
  const dtype t = dtype_of<T>;
  return power_of_two && (t == dtype::float32 || t == dtype::float64 || t == dtype::bfloat16);
}

template <class T>
constexpr ncclRedOp_t nccl_op(reduce_op op, int ranks) noexcept {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::mean: return nccl_average_is_exact<T>(ranks) ? ncclAvg : ncclSum;
    case reduce_op::prod: return ncclProd;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
  }
  return ncclSum;
}

// Whether a mean still needs our division after NCCL.
template <class T>
constexpr bool divide_after_nccl(reduce_op op, int ranks) noexcept {
  return op == reduce_op::mean && ranks > 1 && !nccl_average_is_exact<T>(ranks);
}

}  // namespace comm::detail

}  // namespace distribute
