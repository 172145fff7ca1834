// PeerMayWrite / CheckPeersMayWrite (xla_ffi/comm/peer_access.h) against the driver, on one
// GPU: memory of each kind CUDA grants access to differently, asked about by its own device
// (the only other "peer" one GPU has). A legacy cudaMalloc buffer and a cudaMallocAsync pool
// buffer must be writable; a virtual-memory mapping only where its access list says so: one
// mapped read-write, one read-only and one with no access set must be told apart. A host
// pointer is an error. CheckPeersMayWrite must refuse the read-only mapping naming why, and
// ask the driver once per allocation (the second lookup of a pointer inside a known one adds
// nothing).
//   peer_access_test            prints one line per case, exit 0 if all passed
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "xla_ffi/comm/driver_entry.h"
#include "xla_ffi/comm/peer_access.h"

namespace fo = flashoverlap;

namespace {

int failures = 0;

void Expect(bool ok, const std::string& what) {
  std::printf("%-72s %s\n", what.c_str(), ok ? "PASS" : "FAIL");
  if (!ok) ++failures;
}

void Must(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

void MustDriver(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::printf("%s: CUresult %d\n", what, static_cast<int>(r));
    std::exit(2);
  }
}

// PeerMayWrite(ptr, device 0) is ok with this kind and this answer.
void ExpectKind(const void* ptr, const char* kind, bool writable, const std::string& what) {
  bool got_writable = !writable;
  std::string got_kind;
  const fo::Status s = fo::PeerMayWrite(ptr, 0, &got_writable, &got_kind);
  Expect(s.ok() && got_kind == kind && got_writable == writable,
         what + " -> " + (s.ok() ? got_kind + (got_writable ? ", writable" : ", not writable") : s.message));
}

// A virtual-memory mapping of one granule on device 0 with `flags` for it (0: no access set).
CUdeviceptr MapGranule(unsigned long long flags, size_t* size) {
  using CreateFn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  using GranularityFn = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  using ReserveFn = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using MapFn = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using SetAccessFn = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  auto create = reinterpret_cast<CreateFn>(fo::DriverEntryPoint("cuMemCreate"));
  auto granularity = reinterpret_cast<GranularityFn>(fo::DriverEntryPoint("cuMemGetAllocationGranularity"));
  auto reserve = reinterpret_cast<ReserveFn>(fo::DriverEntryPoint("cuMemAddressReserve"));
  auto map = reinterpret_cast<MapFn>(fo::DriverEntryPoint("cuMemMap"));
  auto set_access = reinterpret_cast<SetAccessFn>(fo::DriverEntryPoint("cuMemSetAccess"));
  if (!create || !granularity || !reserve || !map || !set_access) {
    std::printf("the driver lacks the virtual memory management functions\n");
    std::exit(2);
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  MustDriver(granularity(size, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  CUmemGenericAllocationHandle handle = 0;
  MustDriver(create(&handle, *size, &prop, 0), "cuMemCreate");
  CUdeviceptr ptr = 0;
  MustDriver(reserve(&ptr, *size, 0, 0, 0), "cuMemAddressReserve");
  MustDriver(map(ptr, *size, 0, handle, 0), "cuMemMap");
  if (flags != 0) {
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = static_cast<CUmemAccess_flags>(flags);
    MustDriver(set_access(ptr, *size, &access, 1), "cuMemSetAccess");
  }
  return ptr;  // kept until the process exits
}

}  // namespace

int main() {
  Must(cudaSetDevice(0), "cudaSetDevice");
  Must(cudaFree(nullptr), "context");
  void* legacy = nullptr;
  Must(cudaMalloc(&legacy, 1 << 20), "cudaMalloc");
  ExpectKind(legacy, "legacy", true, "cudaMalloc buffer");
  ExpectKind(static_cast<char*>(legacy) + 4096, "legacy", true, "cudaMalloc buffer, inside");

  cudaStream_t stream;
  Must(cudaStreamCreate(&stream), "cudaStreamCreate");
  void* pooled = nullptr;
  Must(cudaMallocAsync(&pooled, 1 << 20, stream), "cudaMallocAsync");
  Must(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  ExpectKind(pooled, "pool", true, "cudaMallocAsync buffer (the default pool)");

  size_t size = 0;
  const CUdeviceptr rw = MapGranule(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, &size);
  const CUdeviceptr ro = MapGranule(CU_MEM_ACCESS_FLAGS_PROT_READ, &size);
  const CUdeviceptr none = MapGranule(0, &size);
  ExpectKind(reinterpret_cast<void*>(rw), "vmm", true, "mapping, read-write");
  ExpectKind(reinterpret_cast<void*>(ro), "vmm", false, "mapping, read-only");
  ExpectKind(reinterpret_cast<void*>(none), "vmm", false, "mapping, no access set");

  int on_host = 0;
  bool writable = false;
  std::string kind;
  const fo::Status host = fo::PeerMayWrite(&on_host, 0, &writable, &kind);
  Expect(!host.ok() && host.message.find("not device memory") != std::string::npos,
         "host pointer -> " + host.message);

  fo::WritableRanges known;
  const fo::Status refused = fo::CheckPeersMayWrite(reinterpret_cast<void*>(ro), {0}, &known);
  Expect(!refused.ok() && refused.message.find("not writable by device 0") != std::string::npos &&
             known.empty(),
         "CheckPeersMayWrite, read-only mapping -> refused");
  const fo::Status first = fo::CheckPeersMayWrite(legacy, {0}, &known);
  const fo::Status again = fo::CheckPeersMayWrite(static_cast<char*>(legacy) + 512, {0}, &known);
  Expect(first.ok() && again.ok() && known.size() == 1 && known[0].first <= reinterpret_cast<uintptr_t>(legacy) &&
             known[0].second >= reinterpret_cast<uintptr_t>(legacy) + (1 << 20),
         "CheckPeersMayWrite, cudaMalloc buffer twice -> one allocation remembered");
  // For the record (docs/DESIGN.md): whether a stream wait could flush remote writes.
  int flush = -1;
  Must(cudaDeviceGetAttribute(&flush, cudaDevAttrCanFlushRemoteWrites, 0), "cudaDeviceGetAttribute");
  std::printf("cudaDevAttrCanFlushRemoteWrites: %d\n", flush);
  std::printf("%s (%d failed)\n", failures == 0 ? "ALL PASS" : "FAILURES", failures);
  return failures == 0 ? 0 : 1;
}
