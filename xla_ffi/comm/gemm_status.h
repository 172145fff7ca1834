// A signaling-GEMM launcher's result as a Status, with the launcher's reason
// (LastSignalingGemmError). Shared by every comm-layer sequence that launches the GEMM.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "xla_ffi/comm/status.h"
#include "xla_ffi/kernels/signaling_gemm.h"

namespace flashoverlap {

inline Status GemmLaunchStatus(cudaError_t launched, const char* what) {
  if (launched == cudaSuccess) return Status::Ok();
  return Status::Error(std::string(what) + " failed: " + cudaGetErrorString(launched) + " (" +
                       LastSignalingGemmError() + ")");
}

}  // namespace flashoverlap
