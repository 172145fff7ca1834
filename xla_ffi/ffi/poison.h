// The test switch JAX_FLASHOVERLAP_POISON_OUTPUTS (read at lowering, attribute
// `poison_outputs`): before a call does anything, the buffers it is about to write are filled
// with 0xFF bytes on the compute stream, a NaN in bf16 and fp16. An element the call leaves
// unwritten then shows as NaN instead of the stale values of reused memory (XLA hands every
// call fresh, uninitialised output buffers, so a test cannot pre-fill them from JAX).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "xla/ffi/api/ffi.h"
#include "xla_ffi/ffi/check.h"

namespace flashoverlap {

// Fills `bytes` bytes at `data` with NaN bytes on `stream` (nothing for an empty buffer).
inline ffi::Error PoisonBytes(void* data, size_t bytes, cudaStream_t stream) {
  if (data == nullptr || bytes == 0) return ffi::Error::Success();
  FO_CHECK_CUDA(cudaMemsetAsync(data, 0xFF, bytes, stream));
  return ffi::Error::Success();
}

// Checks the attribute (0 or 1); with 1, fills XLA's `results` (null entries skipped) with NaN
// on `stream`. Every handler calls it before its own work.
inline ffi::Error PoisonResults(const char* op, int32_t poison_outputs, cudaStream_t stream,
                                std::initializer_list<const ffi::AnyBuffer*> results) {
  FO_CHECK_ARG(poison_outputs == 0 || poison_outputs == 1,
               op << ": poison_outputs must be 0 or 1, got " << poison_outputs);
  if (poison_outputs == 0) return ffi::Error::Success();
  for (const ffi::AnyBuffer* result : results) {
    if (result != nullptr) {
      const ffi::Error poisoned = PoisonBytes(result->untyped_data(), result->size_bytes(), stream);
      FO_CHECK(poisoned.success(), op << ": filling a result with NaN (poison_outputs): " << poisoned.message());
    }
  }
  return ffi::Error::Success();
}

}  // namespace flashoverlap
