#include "xla_ffi/comm/peer_access.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include "xla_ffi/comm/driver_entry.h"

namespace flashoverlap {
namespace {

// The driver functions asked here (reached through the runtime: nothing links libcuda).
struct Driver {
  CUresult (*get_attribute)(void*, CUpointer_attribute, CUdeviceptr);
  CUresult (*pool_access)(CUmemAccess_flags*, CUmemoryPool, CUmemLocation*);
  CUresult (*map_access)(unsigned long long*, const CUmemLocation*, CUdeviceptr);
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*address_range)(CUdeviceptr*, size_t*, CUdeviceptr);
  bool complete() const {
    return get_attribute && pool_access && map_access && retain && release && address_range;
  }
};

template <class Fn>
void Find(Fn* fn, const char* name) {
  *fn = reinterpret_cast<Fn>(DriverEntryPoint(name));
}

const Driver& Functions() {
  static const Driver driver = [] {
    Driver d{};
    Find(&d.get_attribute, "cuPointerGetAttribute");
    Find(&d.pool_access, "cuMemPoolGetAccess");
    Find(&d.map_access, "cuMemGetAccess");
    Find(&d.retain, "cuMemRetainAllocationHandle");
    Find(&d.release, "cuMemRelease");
    Find(&d.address_range, "cuMemGetAddressRange");
    return d;
  }();
  return driver;
}

Status DriverError(const char* what, CUresult res) {
  return Status::Error(std::string(what) + " failed with CUresult " + std::to_string(res));
}

// PeerMayWrite's questions, the owner's context current.
Status Classify(const Driver& d, CUdeviceptr address, int peer, bool* writable, std::string* kind) {
  CUmemLocation location = {};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = peer;
  CUmemoryPool pool = nullptr;
  CUresult res = d.get_attribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, address);
  if (res != CUDA_SUCCESS) return DriverError("cuPointerGetAttribute (mempool)", res);
  if (pool != nullptr) {
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    res = d.pool_access(&flags, pool, &location);
    if (res != CUDA_SUCCESS) return DriverError("cuMemPoolGetAccess", res);
    *kind = "pool";
    *writable = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return Status::Ok();
  }
  // Mapped by cuMemMap (virtual memory management) or not: only such a mapping has a handle.
  CUmemGenericAllocationHandle handle = 0;
  res = d.retain(&handle, reinterpret_cast<void*>(address));
  if (res == CUDA_ERROR_INVALID_VALUE) {
    *kind = "legacy";
    *writable = true;
    return Status::Ok();
  }
  if (res != CUDA_SUCCESS) return DriverError("cuMemRetainAllocationHandle", res);
  res = d.release(handle);
  if (res != CUDA_SUCCESS) return DriverError("cuMemRelease", res);
  unsigned long long flags = 0;
  res = d.map_access(&flags, &location, address);
  if (res != CUDA_SUCCESS) return DriverError("cuMemGetAccess", res);
  *kind = "vmm";
  *writable = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return Status::Ok();
}

}  // namespace

Status PeerMayWrite(const void* ptr, int peer, bool* writable, std::string* kind) {
  const Driver& d = Functions();
  if (!d.complete()) {
    return Status::Error("the driver lacks one of cuPointerGetAttribute, cuMemPoolGetAccess, "
                         "cuMemGetAccess, cuMemRetainAllocationHandle, cuMemRelease, cuMemGetAddressRange");
  }
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(ptr);
  unsigned int memory_type = 0;
  CUresult res = d.get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address);
  if (res != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE) {
    return Status::Error("not device memory the driver knows (cuPointerGetAttribute: CUresult " +
                         std::to_string(res) + ", memory type " + std::to_string(memory_type) + ")");
  }
  // The owner's context current (the handler's is already; a Python thread may hold another).
  int owner = -1, current = -1;
  res = d.get_attribute(&owner, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address);
  if (res != CUDA_SUCCESS) return DriverError("cuPointerGetAttribute (device ordinal)", res);
  FO_RETURN_IF_CUDA(cudaGetDevice(&current));
  if (current != owner) FO_RETURN_IF_CUDA(cudaSetDevice(owner));
  Status status = Classify(d, address, peer, writable, kind);
  if (current != owner) {
    Status back = CudaStatus(cudaSetDevice(current), "cudaSetDevice");
    if (status.ok()) status = back;
  }
  return status;
}

Status CheckPeersMayWrite(const void* ptr, const std::vector<int>& peers, WritableRanges* known) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& range : *known) {
    if (address >= range.first && address < range.second) return Status::Ok();
  }
  for (int peer : peers) {
    bool writable = false;
    std::string kind;
    FO_RETURN_IF_NOT_OK(PeerMayWrite(ptr, peer, &writable, &kind));
    if (!writable) {
      return Status::Error("the result buffer (" + kind + " memory) is not writable by device " +
                           std::to_string(peer) + ", which mirrors its block of the all-reduce "
                           "into it: XLA's allocator gave that device no access, though the "
                           "memory probed when the op was lowered was writable "
                           "(jax_flashoverlap.comm.peer_results_writable); use "
                           "JAX_FLASHOVERLAP_TRANSPORT=nccl");
    }
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult res = Functions().address_range(&base, &size, static_cast<CUdeviceptr>(address));
  if (res != CUDA_SUCCESS) return DriverError("cuMemGetAddressRange", res);
  // Bounded (an allocator that hands out an allocation per result would grow it for ever):
  // past kMaxKnown the oldest is asked about again when next seen.
  constexpr size_t kMaxKnown = 256;
  if (known->size() >= kMaxKnown) known->erase(known->begin());
  known->emplace_back(static_cast<uintptr_t>(base), static_cast<uintptr_t>(base) + size);
  return Status::Ok();
}

}  // namespace flashoverlap
