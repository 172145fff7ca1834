// Several stream memory operations (waits for and writes of device int32 words) as one
// stream operation: cuStreamBatchMemOp (driver API, reached through the runtime's entry-point
// query, as stream_wait.cc and stream_write.cc reach theirs). A peer-store call tells and waits
// for every other rank of its group at each step; one operation per word cost each call about
// 2 us per word on one H200 (docs/DESIGN.md, "Bulk-copied mirrors").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// Whether the driver offers cuStreamBatchMemOp (resolved once per process).
bool HaveStreamBatch();

// One operation of a batch: wait until *word >= value, or write *word = value.
struct StreamWordOp {
  enum Kind { kWaitGeq, kWrite } kind;
  int32_t* word;
  int32_t value;
};

// Enqueues `ops` on `stream` as one stream operation, in array order; every write is
// preceded by a memory barrier (what the work queued before it wrote is visible first), as
// cuStreamWriteValue32's default. At most kMaxStreamBatch operations. Needs HaveStreamBatch().
constexpr int kMaxStreamBatch = 64;
Status EnqueueStreamBatch(cudaStream_t stream, const StreamWordOp* ops, int count);

}  // namespace flashoverlap
