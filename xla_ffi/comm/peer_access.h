// Whether one GPU may store into memory another GPU's allocator made (the peer-store
// all-reduce mirrors each reduced block straight into the other ranks' XLA results when
// they are in this process). CUDA grants it three ways, by how the memory was allocated:
// legacy allocations (cuMemAlloc / cudaMalloc) through peer access, which the peer stores
// enable between their GPUs; memory pools (cudaMallocAsync, XLA's cuda_async allocator)
// through the pool's access list; virtual-memory mappings (cuMemCreate + cuMemMap, XLA's own
// allocator in recent versions) through the mapping's access list, which only the allocator
// that made it sets. Where they leave a peer out the all-reduce stages its mirrors in our own
// buffers instead (peer_stores.h), unless the user lets us grant the peers access to XLA's
// allocation ourselves (GrantPeersWrite; JAX_FLASHOVERLAP_GRANT_PEER_ACCESS).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// How `ptr` was allocated ("legacy", "pool" or "vmm") into `*kind`, and whether GPU `peer`
// may read and write it into `*writable` (legacy: true, peer access being enabled by whoever
// stores into it). A pointer the driver does not know (not device memory) is an error.
Status PeerMayWrite(const void* ptr, int peer, bool* writable, std::string* kind);

// The allocations (start, end) a communicator found writable by every other member: a call's
// result is looked up here first, so the driver is asked once per allocation (XLA's
// allocator hands out results from a few large ones).
using WritableRanges = std::vector<std::pair<uintptr_t, uintptr_t>>;

// Gives every GPU of `peers` read-write access to the allocation holding `ptr` where its
// allocator left them out: a virtual-memory mapping's access list (cuMemSetAccess over the
// mapping cuMemGetAddressRange reports: only that mapping, whole) or a memory pool's
// (cuMemPoolSetAccess: the whole pool); legacy memory needs nothing (peer access does it).
// The owner's own access is left as it is. `*kind` as PeerMayWrite.
Status GrantPeersWrite(const void* ptr, const std::vector<int>& peers, std::string* kind);

// An error unless every GPU of `peers` may write the allocation holding `ptr` (PeerMayWrite),
// naming the first that may not and what to do; remembers the allocation in `known` (none:
// nothing is remembered). With `grant`, a peer left out is first given access
// (GrantPeersWrite), then asked again, and nothing is remembered: the driver is asked at every
// call (a grant of ours goes with the mapping, which its allocator may replace).
Status CheckPeersMayWrite(const void* ptr, const std::vector<int>& peers, WritableRanges* known,
                          bool grant = false);

}  // namespace flashoverlap
