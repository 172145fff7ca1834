// PeerMayWrite / CheckPeersMayWrite (xla_ffi/comm/peer_access.h) against the driver, on one
// GPU: memory of each kind CUDA grants access to differently, asked about by its own device
// (the only other "peer" one GPU has). A legacy cudaMalloc buffer and a cudaMallocAsync pool
// buffer must be writable; a virtual-memory mapping only where its access list says so: one
// mapped read-write, one read-only and one with no access set must be told apart. A host
// pointer is an error. CheckPeersMayWrite must refuse the read-only mapping naming why, and
// ask the driver once per allocation (the second lookup of a pointer inside a known one adds
// nothing). GrantPeersWrite must change exactly the mapping holding its pointer (a read-only
// mapping becomes writable, its neighbour in the same reservation stays read-only, a write
// lands), and CheckPeersMayWrite with `grant` take a read-only mapping it refuses without,
// at every call (access taken back in between is granted again).
//   peer_access_test            prints one line per case, exit 0 if all passed
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
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

// `count` granules on device 0 mapped one by one (a mapping each, as an allocator that grows
// maps its chunks) into one reservation of `count + 1` granules (the last left unmapped), each
// with `flags` for device 0 (0: no access set). Returns the first granule's address.
CUdeviceptr MapGranules(int count, unsigned long long flags, size_t* size) {
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
  CUdeviceptr base = 0;
  MustDriver(reserve(&base, *size * (count + 1), 0, 0, 0), "cuMemAddressReserve");
  for (int i = 0; i < count; ++i) {
    CUmemGenericAllocationHandle handle = 0;
    const CUdeviceptr at = base + i * *size;
    MustDriver(create(&handle, *size, &prop, 0), "cuMemCreate");
    MustDriver(map(at, *size, 0, handle, 0), "cuMemMap");
    if (flags != 0) {
      CUmemAccessDesc access = {};
      access.location = prop.location;
      access.flags = static_cast<CUmemAccess_flags>(flags);
      MustDriver(set_access(at, *size, &access, 1), "cuMemSetAccess");
    }
  }
  return base;  // kept until the process exits
}

CUdeviceptr MapGranule(unsigned long long flags, size_t* size) { return MapGranules(1, flags, size); }

// GrantPeersWrite on one GPU (its only "peer" is itself): two read-only mappings side by side
// in one reservation; granting the second must make it, and only it, writable, and a write to
// it must land.
void CheckGrant() {
  size_t size = 0;
  const CUdeviceptr first = MapGranules(2, CU_MEM_ACCESS_FLAGS_PROT_READ, &size);
  const CUdeviceptr second = first + size;
  std::string kind;
  const fo::Status granted = fo::GrantPeersWrite(reinterpret_cast<void*>(second + 4096), {0}, &kind);
  Expect(granted.ok() && kind == "vmm", "GrantPeersWrite, a read-only mapping (pointer inside) -> " +
                                            (granted.ok() ? kind : granted.message));
  ExpectKind(reinterpret_cast<void*>(second), "vmm", true, "granted mapping");
  ExpectKind(reinterpret_cast<void*>(first), "vmm", false, "its neighbour in the reservation, not granted");
  Must(cudaMemset(reinterpret_cast<void*>(second), 0x5a, size), "cudaMemset (granted mapping)");
  std::vector<unsigned char> back(size);
  Must(cudaMemcpy(back.data(), reinterpret_cast<void*>(second), size, cudaMemcpyDeviceToHost), "cudaMemcpy");
  bool landed = true;
  for (unsigned char b : back) landed = landed && b == 0x5a;
  Expect(landed, "a write into the granted mapping lands");

  // CheckPeersMayWrite with grant: a read-only mapping is granted and remembered; without, refused.
  const CUdeviceptr third = MapGranule(CU_MEM_ACCESS_FLAGS_PROT_READ, &size);
  fo::WritableRanges known;
  const fo::Status plain = fo::CheckPeersMayWrite(reinterpret_cast<void*>(third), {0}, &known);
  Expect(!plain.ok() && plain.message.find("GRANT_PEER_ACCESS=1") != std::string::npos && known.empty(),
         "CheckPeersMayWrite, read-only mapping, no grant -> refused, names the switch");
  const fo::Status with_grant = fo::CheckPeersMayWrite(reinterpret_cast<void*>(third), {0}, &known, /*grant=*/true);
  ExpectKind(reinterpret_cast<void*>(third), "vmm", true, "CheckPeersMayWrite with grant, then");
  Expect(with_grant.ok() && known.empty(),
         "CheckPeersMayWrite, read-only mapping, grant -> granted, nothing remembered");
  // The mapping's access taken back (as if its allocator had mapped the range anew): the next
  // check with grant must see it and grant again, not trust an earlier answer.
  using SetAccessFn = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  auto set_access = reinterpret_cast<SetAccessFn>(fo::DriverEntryPoint("cuMemSetAccess"));
  CUmemAccessDesc read_only = {};
  read_only.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  read_only.location.id = 0;
  read_only.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  MustDriver(set_access(third, size, &read_only, 1), "cuMemSetAccess (read-only again)");
  ExpectKind(reinterpret_cast<void*>(third), "vmm", false, "the same mapping, read-only again");
  const fo::Status again = fo::CheckPeersMayWrite(reinterpret_cast<void*>(third), {0}, &known, /*grant=*/true);
  ExpectKind(reinterpret_cast<void*>(third), "vmm", true, "CheckPeersMayWrite with grant, again");
  Expect(again.ok(), "CheckPeersMayWrite with grant, access taken back -> granted again");

  // Legacy memory needs no grant (peer access covers it): nothing to do, no error.
  void* legacy = nullptr;
  Must(cudaMalloc(&legacy, 1 << 16), "cudaMalloc");
  const fo::Status none = fo::GrantPeersWrite(legacy, {0}, &kind);
  Expect(none.ok() && kind == "legacy", "GrantPeersWrite, cudaMalloc buffer -> nothing to grant");
  int on_host = 0;
  const fo::Status host = fo::GrantPeersWrite(&on_host, {0}, &kind);
  Expect(!host.ok() && host.message.find("not device memory") != std::string::npos,
         "GrantPeersWrite, host pointer -> " + host.message);

  // For the record: a pool asked to grant its own GPU (only a second GPU is a real peer).
  cudaStream_t stream;
  Must(cudaStreamCreate(&stream), "cudaStreamCreate");
  void* pooled = nullptr;
  Must(cudaMallocAsync(&pooled, 1 << 16, stream), "cudaMallocAsync");
  Must(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const fo::Status pool = fo::GrantPeersWrite(pooled, {0}, &kind);
  std::printf("GrantPeersWrite, a pool buffer, its own GPU: %s\n", pool.ok() ? "ok" : pool.message.c_str());

  // What asking costs (the handler asks once per new allocation of a result).
  const auto start = std::chrono::steady_clock::now();
  constexpr int kAsks = 2000;
  for (int i = 0; i < kAsks; ++i) {
    bool writable = false;
    fo::PeerMayWrite(reinterpret_cast<void*>(second), 0, &writable, &kind);
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("PeerMayWrite on a mapping: %.2f us per call\n", us / kAsks);
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
  CheckGrant();
  // For the record (docs/DESIGN.md): whether a stream wait could flush remote writes.
  int flush = -1;
  Must(cudaDeviceGetAttribute(&flush, cudaDevAttrCanFlushRemoteWrites, 0), "cudaDeviceGetAttribute");
  std::printf("cudaDevAttrCanFlushRemoteWrites: %d\n", flush);
  std::printf("%s (%d failed)\n", failures == 0 ? "ALL PASS" : "FAILURES", failures);
  return failures == 0 ? 0 : 1;
}
