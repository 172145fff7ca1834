// A small status type for the framework-free layers (kernels/, comm/): empty message = OK.
// The FFI layer turns a failed Status into ffi::Error; module.cc into a Python exception.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <utility>

namespace flashoverlap {

struct Status {
  std::string message;  // empty: success
  bool ok() const { return message.empty(); }
  static Status Ok() { return {}; }
  static Status Error(std::string what) { return {std::move(what)}; }
};

inline Status CudaStatus(cudaError_t err, const char* expr) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Error(std::string("CUDA error in ") + expr + ": " + cudaGetErrorName(err) +
                       " (" + cudaGetErrorString(err) + ")");
}

inline Status NcclStatus(ncclResult_t err, const char* expr) {
  if (err == ncclSuccess) return Status::Ok();
  return Status::Error(std::string("NCCL error in ") + expr + ": " + ncclGetErrorString(err));
}

}  // namespace flashoverlap

#define FO_RETURN_IF_CUDA(expr)                                                   \
  do {                                                                            \
    ::flashoverlap::Status fo_s_ = ::flashoverlap::CudaStatus((expr), #expr);     \
    if (!fo_s_.ok()) return fo_s_;                                                \
  } while (0)

#define FO_RETURN_IF_NCCL(expr)                                                   \
  do {                                                                            \
    ::flashoverlap::Status fo_s_ = ::flashoverlap::NcclStatus((expr), #expr);     \
    if (!fo_s_.ok()) return fo_s_;                                                \
  } while (0)

#define FO_RETURN_IF_NOT_OK(expr)                                                 \
  do {                                                                            \
    ::flashoverlap::Status fo_s_ = (expr);                                        \
    if (!fo_s_.ok()) return fo_s_;                                                \
  } while (0)
