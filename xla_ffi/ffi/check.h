// CHECK macros that turn failures into xla::ffi::Error instead of throwing.
// Every CUDA and NCCL return code in the FFI layer goes through one of these. Every error they
// return has code INTERNAL (see FO_CHECK_ARG: other codes crashed the process).
#pragma once

#include <cuda_runtime.h>

#include <sstream>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace flashoverlap {

namespace ffi = xla::ffi;

// Builds "<op>: <what> (<file>:<line>)" so the Python exception names the op.
inline std::string FormatError(const char* file, int line, const std::string& what) {
  std::ostringstream out;
  out << what << " [" << file << ":" << line << "]";
  return out.str();
}

}  // namespace flashoverlap

// A bad argument reaching a handler (shape, attribute, plan, no communicator): the message
// names the op and what was expected. Returned with code INTERNAL, not INVALID_ARGUMENT: on
// the H200 machine (jaxlib 0.10.2, CUDA 13) every INVALID_ARGUMENT returned by one of our
// handlers at execution crashed the process (SIGSEGV) where INTERNAL came back as a Python
// JaxRuntimeError (scripts/diagnose_ffi_error.py; benchmarks/results/logs/ffi_error_h200x1/).
#define FO_CHECK_ARG(cond, msg)                                                   \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream fo_msg_;                                                 \
      fo_msg_ << msg;                                                             \
      return ::xla::ffi::Error::Internal(                                         \
          ::flashoverlap::FormatError(__FILE__, __LINE__, fo_msg_.str()));        \
    }                                                                             \
  } while (0)

// Returns ffi::Error::Internal when `cond` is false.
#define FO_CHECK(cond, msg)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream fo_msg_;                                                 \
      fo_msg_ << msg;                                                             \
      return ::xla::ffi::Error::Internal(                                         \
          ::flashoverlap::FormatError(__FILE__, __LINE__, fo_msg_.str()));        \
    }                                                                             \
  } while (0)

// Returns ffi::Error::Internal naming the CUDA error when `expr` fails.
#define FO_CHECK_CUDA(expr)                                                       \
  do {                                                                            \
    cudaError_t fo_err_ = (expr);                                                 \
    if (fo_err_ != cudaSuccess) {                                                 \
      return ::xla::ffi::Error::Internal(::flashoverlap::FormatError(             \
          __FILE__, __LINE__,                                                     \
          std::string("CUDA error in ") + #expr + ": " +                          \
              cudaGetErrorName(fo_err_) + " (" + cudaGetErrorString(fo_err_) +    \
              ")"));                                                              \
    }                                                                             \
  } while (0)

// Propagates an ffi::Error returned by a helper.
#define FO_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                            \
    ::xla::ffi::Error fo_status_ = (expr);                                        \
    if (fo_status_.failure()) return fo_status_;                                  \
  } while (0)
