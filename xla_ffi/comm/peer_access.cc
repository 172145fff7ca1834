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
  CUresult (*pool_set_access)(CUmemoryPool, const CUmemAccessDesc*, size_t);
  CUresult (*map_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  bool complete() const {
    return get_attribute && pool_access && map_access && retain && release && address_range &&
           pool_set_access && map_set_access;
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
    Find(&d.pool_set_access, "cuMemPoolSetAccess");
    Find(&d.map_set_access, "cuMemSetAccess");
    return d;
  }();
  return driver;
}

Status DriverError(const char* what, CUresult res) {
  return Status::Error(std::string(what) + " failed with CUresult " + std::to_string(res));
}

// How the memory at `address` was allocated (the owner's context current): its pool (null
// if none) and, for the rest, whether it is a virtual-memory mapping (only such a mapping has
// an allocation handle).
Status Allocation(const Driver& d, CUdeviceptr address, CUmemoryPool* pool, std::string* kind) {
  *pool = nullptr;
  CUresult res = d.get_attribute(pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, address);
  if (res != CUDA_SUCCESS) return DriverError("cuPointerGetAttribute (mempool)", res);
  if (*pool != nullptr) {
    *kind = "pool";
    return Status::Ok();
  }
  CUmemGenericAllocationHandle handle = 0;
  res = d.retain(&handle, reinterpret_cast<void*>(address));
  if (res == CUDA_ERROR_INVALID_VALUE) {
    *kind = "legacy";
    return Status::Ok();
  }
  if (res != CUDA_SUCCESS) return DriverError("cuMemRetainAllocationHandle", res);
  res = d.release(handle);
  if (res != CUDA_SUCCESS) return DriverError("cuMemRelease", res);
  *kind = "vmm";
  return Status::Ok();
}

CUmemLocation DeviceLocation(int device) {
  CUmemLocation location = {};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = device;
  return location;
}

// PeerMayWrite's questions, the owner's context current.
Status Classify(const Driver& d, CUdeviceptr address, int peer, bool* writable, std::string* kind) {
  CUmemLocation location = DeviceLocation(peer);
  CUmemoryPool pool = nullptr;
  FO_RETURN_IF_NOT_OK(Allocation(d, address, &pool, kind));
  if (*kind == "legacy") {
    *writable = true;
    return Status::Ok();
  }
  if (*kind == "pool") {
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    const CUresult res = d.pool_access(&flags, pool, &location);
    if (res != CUDA_SUCCESS) return DriverError("cuMemPoolGetAccess", res);
    *writable = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return Status::Ok();
  }
  unsigned long long flags = 0;
  const CUresult res = d.map_access(&flags, &location, address);
  if (res != CUDA_SUCCESS) return DriverError("cuMemGetAccess", res);
  *writable = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return Status::Ok();
}

// GrantPeersWrite's changes, the owner's context current.
Status Grant(const Driver& d, CUdeviceptr address, const std::vector<int>& peers, std::string* kind) {
  CUmemoryPool pool = nullptr;
  FO_RETURN_IF_NOT_OK(Allocation(d, address, &pool, kind));
  if (*kind == "legacy" || peers.empty()) return Status::Ok();
  std::vector<CUmemAccessDesc> access(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    access[i].location = DeviceLocation(peers[i]);
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (*kind == "pool") {
    const CUresult res = d.pool_set_access(pool, access.data(), access.size());
    return res == CUDA_SUCCESS ? Status::Ok() : DriverError("cuMemPoolSetAccess", res);
  }
  // cuMemSetAccess takes whole mappings only: the one holding `address`, as the driver reports it.
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult res = d.address_range(&base, &size, address);
  if (res != CUDA_SUCCESS) return DriverError("cuMemGetAddressRange", res);
  res = d.map_set_access(base, size, access.data(), access.size());
  if (res != CUDA_SUCCESS) {
    return Status::Error("cuMemSetAccess over the mapping [" + std::to_string(base) + ", +" +
                         std::to_string(size) + ") failed with CUresult " + std::to_string(res));
  }
  return Status::Ok();
}

// `step` with the context of the device owning the device memory at `address` current (the
// handler's is already; a Python thread may hold another); the caller's device restored.
template <class Step>
Status WithOwnerCurrent(const Driver& d, CUdeviceptr address, Step step) {
  if (!d.complete()) {
    return Status::Error("the driver lacks one of cuPointerGetAttribute, cuMemPoolGetAccess, "
                         "cuMemGetAccess, cuMemRetainAllocationHandle, cuMemRelease, "
                         "cuMemGetAddressRange, cuMemPoolSetAccess, cuMemSetAccess");
  }
  unsigned int memory_type = 0;
  CUresult res = d.get_attribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address);
  if (res != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE) {
    return Status::Error("not device memory the driver knows (cuPointerGetAttribute: CUresult " +
                         std::to_string(res) + ", memory type " + std::to_string(memory_type) + ")");
  }
  int owner = -1, current = -1;
  res = d.get_attribute(&owner, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address);
  if (res != CUDA_SUCCESS) return DriverError("cuPointerGetAttribute (device ordinal)", res);
  FO_RETURN_IF_CUDA(cudaGetDevice(&current));
  if (current != owner) FO_RETURN_IF_CUDA(cudaSetDevice(owner));
  Status status = step();
  if (current != owner) {
    Status back = CudaStatus(cudaSetDevice(current), "cudaSetDevice");
    if (status.ok()) status = back;
  }
  return status;
}

}  // namespace

Status PeerMayWrite(const void* ptr, int peer, bool* writable, std::string* kind) {
  const Driver& d = Functions();
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(ptr);
  return WithOwnerCurrent(d, address, [&] { return Classify(d, address, peer, writable, kind); });
}

Status GrantPeersWrite(const void* ptr, const std::vector<int>& peers, std::string* kind) {
  const Driver& d = Functions();
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(ptr);
  return WithOwnerCurrent(d, address, [&] { return Grant(d, address, peers, kind); });
}

Status CheckPeersMayWrite(const void* ptr, const std::vector<int>& peers, WritableRanges* known,
                          bool grant) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  // A grant of ours lasts as long as the mapping: were XLA to unmap a range and map it again,
  // a remembered range would send the other GPU's stores into memory it may no longer write.
  // So with `grant` every call asks (~1 us per peer) and re-grants what lost access.
  WritableRanges* remember = grant ? nullptr : known;
  if (remember != nullptr) {
    for (const auto& range : *remember) {
      if (address >= range.first && address < range.second) return Status::Ok();
    }
  }
  for (int peer : peers) {
    bool writable = false;
    std::string kind;
    FO_RETURN_IF_NOT_OK(PeerMayWrite(ptr, peer, &writable, &kind));
    if (!writable && grant) {
      Status granted = GrantPeersWrite(ptr, peers, &kind);
      if (!granted.ok()) {
        return Status::Error("granting the group's other devices access to the result buffer (" +
                             kind + " memory; JAX_FLASHOVERLAP_GRANT_PEER_ACCESS) failed: " +
                             granted.message);
      }
      FO_RETURN_IF_NOT_OK(PeerMayWrite(ptr, peer, &writable, &kind));
    }
    if (!writable) {
      return Status::Error("the result buffer (" + kind + " memory) is not writable by device " +
                           std::to_string(peer) + ", which mirrors its block of the all-reduce "
                           "into it: XLA's allocator gave that device no access, though the "
                           "memory probed when the op was lowered was writable "
                           "(jax_flashoverlap.comm.peer_results_writable); use "
                           "JAX_FLASHOVERLAP_TRANSPORT=nccl" +
                           std::string(grant ? "" : ", or JAX_FLASHOVERLAP_GRANT_PEER_ACCESS=1 "
                                                    "to let this op grant that access"));
    }
  }
  if (remember == nullptr) return Status::Ok();
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult res = Functions().address_range(&base, &size, static_cast<CUdeviceptr>(address));
  if (res != CUDA_SUCCESS) return DriverError("cuMemGetAddressRange", res);
  // Bounded (an allocator that hands out an allocation per result would grow it for ever):
  // past kMaxKnown the oldest is asked about again when next seen.
  constexpr size_t kMaxKnown = 256;
  if (remember->size() >= kMaxKnown) remember->erase(remember->begin());
  remember->emplace_back(static_cast<uintptr_t>(base), static_cast<uintptr_t>(base) + size);
  return Status::Ok();
}

}  // namespace flashoverlap
