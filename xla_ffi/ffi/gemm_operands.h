// The GEMM operands of every handler (flashoverlap_gemm and the overlapped ops): x [M, K] and
// w [K, N] (or [N, K] with the transpose_w attribute) checked, and the signaling GEMM's
// arguments built from them, in one place.
#pragma once

#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/ffi/check.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

// N of x @ w: w is [K, N], or [N, K] with transpose_w.
inline int64_t GemmN(const ffi::AnyBuffer& w, int32_t transpose_w) {
  return w.dimensions()[transpose_w ? 0 : 1];
}

// x [M, K] @ w [K, N] (or w [N, K] with transpose_w) -> out: bfloat16 or float16 throughout,
// 2-D, N and K multiples of 8 (the output's shape is each op's own check).
inline ffi::Error CheckGemmOperands(const char* op, const ffi::AnyBuffer& x,
                                    const ffi::AnyBuffer& w, const ffi::AnyBuffer& out,
                                    int32_t transpose_w) {
  FO_CHECK_ARG(transpose_w == 0 || transpose_w == 1,
               op << ": transpose_w must be 0 or 1, got " << transpose_w);
  auto dtype = x.element_type();
  FO_CHECK_ARG(dtype == ffi::DataType::BF16 || dtype == ffi::DataType::F16,
               op << ": x must be bfloat16 or float16");
  FO_CHECK_ARG(w.element_type() == dtype && out.element_type() == dtype,
               op << ": x, w and the output must share one dtype");
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  FO_CHECK_ARG(xd.size() == 2 && wd.size() == 2 && out.dimensions().size() == 2,
               op << ": x, w and the output must be 2-D");
  const int64_t m = xd[0], k = xd[1], n = GemmN(w, transpose_w);
  FO_CHECK_ARG(wd[transpose_w ? 1 : 0] == k,
               op << ": x is [" << m << ", " << k << "] but w is [" << wd[0] << ", " << wd[1]
                  << "] (expected " << (transpose_w ? "[N, K]" : "[K, N]") << ")");
  FO_CHECK_ARG(n % 8 == 0 && k % 8 == 0, op << ": N and K must be multiples of 8");
  return ffi::Error::Success();
}

// The signaling GEMM of a call: x [m, K] (row-major, where the op keeps it) @ w -> out, in w's
// dtype, signalling into `counters` (null: no signal); the group layout is each op's own.
inline SignalingGemmArgs GemmArgs(const void* x, int64_t m, const ffi::AnyBuffer& w,
                                  int32_t transpose_w, void* out, int32_t* counters,
                                  int comm_sms) {
  SignalingGemmArgs args;
  args.x = x;
  args.w = w.untyped_data();
  args.transpose_w = transpose_w != 0;
  args.out = out;
  args.m = m;
  args.k = w.dimensions()[transpose_w ? 1 : 0];
  args.n = GemmN(w, transpose_w);
  args.dtype = w.element_type() == ffi::DataType::BF16 ? GemmDType::kBFloat16
                                                       : GemmDType::kFloat16;
  args.counters = counters;
  args.comm_sms = comm_sms;
  return args;
}

}  // namespace flashoverlap
