// Driver API functions reached through the runtime's entry-point query (nothing links
// libcuda): the stream memory operations of stream_wait.cc, stream_write.cc, stream_batch.cc.
#pragma once

namespace flashoverlap {

// The driver's `name` in its CUDA 12.0 form, or null when the driver does not offer it (the
// query's error is cleared: callers fall back). Callers cache the result.
void* DriverEntryPoint(const char* name);

}  // namespace flashoverlap
