#include "xla_ffi/comm/stream_batch.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "xla_ffi/comm/driver_entry.h"

namespace flashoverlap {
namespace {

using BatchMemOpFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);

BatchMemOpFn BatchMemOp() {
  static BatchMemOpFn fn = reinterpret_cast<BatchMemOpFn>(DriverEntryPoint("cuStreamBatchMemOp"));
  return fn;
}

}  // namespace

bool HaveStreamBatch() { return BatchMemOp() != nullptr; }

Status EnqueueStreamBatch(cudaStream_t stream, const StreamWordOp* ops, int count) {
  if (count <= 0) return Status::Ok();
  if (count > kMaxStreamBatch || BatchMemOp() == nullptr)
    return Status::Error("EnqueueStreamBatch: " + std::to_string(count) + " operations (at most " +
                         std::to_string(kMaxStreamBatch) + ") or no cuStreamBatchMemOp in the driver");
  CUstreamBatchMemOpParams params[kMaxStreamBatch] = {};
  for (int i = 0; i < count; ++i) {
    CUstreamBatchMemOpParams& p = params[i];
    if (ops[i].kind == StreamWordOp::kWaitGeq) {
      p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      p.waitValue.address = reinterpret_cast<CUdeviceptr>(ops[i].word);
      p.waitValue.value = static_cast<cuuint32_t>(ops[i].value);
      p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    } else {
      p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      p.writeValue.address = reinterpret_cast<CUdeviceptr>(ops[i].word);
      p.writeValue.value = static_cast<cuuint32_t>(ops[i].value);
      p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;  // preceded by a memory barrier
    }
  }
  const CUresult res = BatchMemOp()(reinterpret_cast<CUstream>(stream), static_cast<unsigned int>(count), params, 0);
  if (res != CUDA_SUCCESS) return Status::Error("cuStreamBatchMemOp failed with CUresult " + std::to_string(res));
  return Status::Ok();
}

}  // namespace flashoverlap
