// The test switch JAX_FLASHOVERLAP_POISON_OUTPUTS (read at lowering, attribute
// `poison_outputs`): before a call does anything, the buffers it is about to write are filled
// with 0xFF bytes on the compute stream, a NaN in bf16 and fp16. An element the call leaves
// unwritten then shows as NaN instead of the stale values of reused memory (XLA hands every
// call fresh, uninitialised output buffers, so a test cannot pre-fill them from JAX).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/ffi/check.h"

namespace flashoverlap {

// The attribute is 0 (off) or 1 (on).
inline ffi::Error CheckPoisonFlag(const char* op, int32_t poison_outputs) {
  FO_CHECK_ARG(poison_outputs == 0 || poison_outputs == 1,
               op << ": poison_outputs must be 0 or 1, got " << poison_outputs);
  return ffi::Error::Success();
}

// Fills `bytes` bytes at `data` with NaN bytes on `stream` (nothing for an empty buffer).
inline ffi::Error PoisonBytes(void* data, size_t bytes, cudaStream_t stream) {
  if (data == nullptr || bytes == 0) return ffi::Error::Success();
  FO_CHECK_CUDA(cudaMemsetAsync(data, 0xFF, bytes, stream));
  return ffi::Error::Success();
}

}  // namespace flashoverlap
