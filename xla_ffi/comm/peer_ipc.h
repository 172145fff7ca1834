// Peer-store buffers shared between processes of one host (docs/DESIGN.md, "Peer stores
// across processes"): a rank's recv buffer and signal words described by a record of CUDA IPC
// handles that another process opens, so its GEMM stores into them over NVLink as it would
// into a buffer of its own process. Free of the communicator, XLA, Python and NCCL (the
// records travel however the caller likes: JAX's key-value store, files in a test).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "xla_ffi/comm/peer_reduce_args.h"
#include "xla_ffi/comm/status.h"

namespace flashoverlap {

// What another process needs to store into one rank's buffers: the recv buffer (its size and
// how many times it was allocated: a new generation needs opening again) and the signal words
// (allocated once), the GPU they live on, and which process made the record (a process cannot
// open its own handles).
struct PeerRecord {
  uint64_t recv_bytes = 0;
  uint64_t generation = 0;
  uint64_t process_nonce = 0;
  uint8_t device_uuid[16] = {};
  cudaIpcMemHandle_t recv{};
  cudaIpcMemHandle_t signals{};
};

// The record's bytes (fixed size, a magic word and version first).
constexpr size_t kPeerRecordBytes = 8 + 3 * 8 + 16 + 2 * sizeof(cudaIpcMemHandle_t);

// A record of `recv` (recv_bytes, allocated for the generation-th time) and `signals`
// (kPeerSignalWords int32), both cudaMalloc'd on `device`, as bytes.
Status MakePeerRecord(int device, const void* recv, size_t recv_bytes, const int32_t* signals,
                      uint64_t generation, std::string* bytes);

// `bytes` back as a record; an error names what is wrong (size, magic, version).
Status ParsePeerRecord(const std::string& bytes, PeerRecord* record);

// Whether this process made `record` (its handles cannot be opened here).
bool MadeHere(const PeerRecord& record);

// The GPU's UUID as text (error messages: which ranks share a GPU).
std::string UuidText(const uint8_t uuid[16]);

// Another process's buffers as opened in this one, by rank (the group's own rank and ranks of
// this process stay empty): generation 0 = not open.
struct PeerMappings {
  uint64_t generation[kMaxPeerRanks] = {};
  void* recv[kMaxPeerRanks] = {};
  int32_t* signals[kMaxPeerRanks] = {};
};

// Opens rank `rank`'s buffers from `record` on the current device (peer access enabled as
// needed), closing an older generation of its recv first; its signal words are opened once.
// The caller has made sure that nothing uses the old recv any more.
Status OpenPeerRecord(const PeerRecord& record, int rank, PeerMappings* mappings);

// Closes every opened buffer, or (keep_signals) every recv buffer only: before its owner frees
// it (CUDA: an exporter's cudaFree before the importers' close is undefined behaviour). Best
// effort: goes on past a failure, returns the first.
Status ClosePeerMappings(PeerMappings* mappings, bool keep_signals = false);

}  // namespace flashoverlap
