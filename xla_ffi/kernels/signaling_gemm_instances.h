// Internal interface between the dispatching launcher (signaling_gemm.cu) and the kernel
// instantiations (one .cu each, ~60 s of nvcc apiece, so they compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include "signaling_gemm.h"
#include "tile_schedule.h"

namespace flashoverlap {

constexpr int kMaxDevices = 64;

// Which share of a queue a launch takes (signaling_gemm.h, helper launches): the main launch
// claims every unit (claim_limit kNoClaimLimit = ~0u), a helper launch those below claim_limit,
// with the rings from ring_base on, tagged with ring_epoch.
struct QueueRole {
  unsigned claim_limit = ~0u;
  int ring_base = 0;
  int ring_epoch = 0;
};

struct InstanceOps {
  int block_m, block_n, cluster_m, stages, smem_bytes;
  int max_split_slots;  // partial tiles (per cluster) the queue workspace holds for this tile
  bool epilogue_adds;   // stores through CopyStagedRows: add_from and mirror stores (not the halves)
  // Once per device (cached, thread-safe): smem opt-in and max co-resident clusters.
  cudaError_t (*prepare)(int device, int* max_clusters);
  // Builds TMA descriptors and launches num_clusters clusters on `stream`.
  cudaError_t (*launch)(const SignalingGemmArgs& args, const TileSchedule& sched,
                        int num_clusters, const QueueRole& role, cudaStream_t stream);
};

// One per instantiation file. Default: the overlapped epilogue (the producer warpgroup's
// idle warps store and signal a tile while the consumers run the next one);
// FLASHOVERLAP_GEMM_EPILOGUE=sync picks the consumers-store-then-signal instances.
const InstanceOps& SignalingGemmBf16Tile128x256Overlap();  // cluster 2x1
const InstanceOps& SignalingGemmBf16Tile128x128Overlap();  // cluster 1x1
const InstanceOps& SignalingGemmF16Tile128x256Overlap();   // cluster 2x1
const InstanceOps& SignalingGemmF16Tile128x128Overlap();   // cluster 1x1
const InstanceOps& SignalingGemmBf16Tile128x256();  // cluster 2x1, epilogue in the consumers
const InstanceOps& SignalingGemmBf16Tile128x128();  // cluster 1x1
const InstanceOps& SignalingGemmF16Tile128x256();   // cluster 2x1
const InstanceOps& SignalingGemmF16Tile128x128();   // cluster 1x1
// FLASHOVERLAP_GEMM_EPILOGUE=halves: the overlapped epilogue staged one consumer
// warpgroup's rows at a time (4 mainloop stages), for launches with no add_from / mirrors /
// head groups (cluster 2x1).
const InstanceOps& SignalingGemmBf16Tile128x256Halves();
const InstanceOps& SignalingGemmF16Tile128x256Halves();
const InstanceOps& SignalingGemmBf16Tile128x256HalvesNK();
const InstanceOps& SignalingGemmF16Tile128x256HalvesNK();
// FLASHOVERLAP_GEMM_SCHEDULE=pingpong: in place of the 128x256 instances, each consumer
// warpgroup computes 128x128 tiles of its own (cluster 2x1).
const InstanceOps& SignalingGemmBf16Tile128x128PingPong();
const InstanceOps& SignalingGemmF16Tile128x128PingPong();
// w given as [N, K] (args.transpose_w): K-major weight loads, overlapped epilogue; the two
// comparison switches above (sync epilogue, ping-pong) apply to [K, N] weights only.
const InstanceOps& SignalingGemmBf16Tile128x256OverlapNK();  // cluster 2x1
const InstanceOps& SignalingGemmBf16Tile128x128OverlapNK();  // cluster 1x1
const InstanceOps& SignalingGemmF16Tile128x256OverlapNK();   // cluster 2x1
const InstanceOps& SignalingGemmF16Tile128x128OverlapNK();   // cluster 1x1
// Launches with several mirrors (peer-store groups of 3 or more, all-reduce) on 128x256 tiles:
// the overlapped instances with the mirrors stored by bulk copies (Config's kPeerStores_).
const InstanceOps& SignalingGemmBf16Tile128x256OverlapPeer();
const InstanceOps& SignalingGemmF16Tile128x256OverlapPeer();
const InstanceOps& SignalingGemmBf16Tile128x256OverlapNKPeer();
const InstanceOps& SignalingGemmF16Tile128x256OverlapNKPeer();

}  // namespace flashoverlap
