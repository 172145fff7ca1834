// The signaling GEMM's compile-time configuration (tile, cluster, stages, shared memory,
// the CUTLASS mainloop collective) and the small device helpers every warp role uses.
// Included by signaling_gemm_kernel.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "signaling_gemm_instances.h"
#include "tile_schedule.h"
#include "work_units.cuh"

namespace flashoverlap {
namespace sg {

using namespace cute;

// Consumer schedules (the CUTLASS kernel schedules of the same names, our own kernel layer):
//  - cooperative: both consumer warpgroups compute one tile together (64 rows each); with
//    kOverlapEpilogue they stage it and the producer warpgroup's idle warps store it;
//  - ping-pong: each consumer warpgroup computes whole tiles of its own, alternating, and
//    stores one while the other's mainloop runs, so a tile boundary no longer stops the
//    tensor cores (docs/signaling_gemm.md, "Ping-pong consumers").
// The producer warpgroup's three warps that store the overlapped epilogue's tiles.
constexpr int kCopyOutThreads = 96;

//  - cooperative, overlapped in halves: the same, staging one warpgroup's 64 rows at a time,
//    so the staging takes half the smem and the 128x256 mainloop keeps 4 stages (the H100
//    runs the 4th stage's depth faster: docs/signaling_gemm.md, "On an H100"); warpgroup 1
//    stages once the copy-out warps have read warpgroup 0's rows out.
enum class ConsumerSchedule { kCooperative, kCooperativeOverlap, kPingPong, kCooperativeOverlapHalves };

// w as the caller stores it: [K, N] row-major (N-major for the MMA), or [N, K] row-major
// (K-major: the product is x @ w^T, w read in place; signaling_gemm.h, transpose_w).
enum class WeightLayout { kKN, kNK };

// kPeerStores_: the instance the launcher picks for launches with several mirrors (peer-store
// groups of 3 or more, an all-reduce): its copy-out warps store the mirrors by bulk copies
// (MirrorStagedRows), code that made ptxas spill the copy-out loop's state, which cost every
// other launch ~0.3%, so the other instances leave it out.
template <class Element_, int kBlockM, int kBlockN, int kClusterM,
          ConsumerSchedule kSchedule_ = ConsumerSchedule::kCooperative,
          WeightLayout kWeightLayout_ = WeightLayout::kKN, bool kPeerStores_ = false>
struct Config {
  using Element = Element_;
  static constexpr int BM = kBlockM, BN = kBlockN, CM = kClusterM, BK = kGemmBlockK;
  static constexpr ConsumerSchedule kSchedule = kSchedule_;
  static constexpr WeightLayout kWeightLayout = kWeightLayout_;
  // CUTLASS names B by its [K, N] view: RowMajor = N contiguous, ColumnMajor = K contiguous.
  using LayoutW = std::conditional_t<kWeightLayout_ == WeightLayout::kKN,
                                     cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  static constexpr bool kPingPong = kSchedule == ConsumerSchedule::kPingPong;
  // Overlapped epilogue: the consumers stage the whole tile in smem and go straight on to the
  // next tile's mainloop; the producer warpgroup's three idle warps copy it out and signal.
  // Costs smem (the whole tile staged: one mainloop stage fewer at 128x256) to take the
  // copy-out and the signal's fence off the tensor cores' critical path; staged in halves,
  // half that smem (4 stages at 128x256), warpgroup 1 waiting for warpgroup 0's rows' copy.
  static constexpr bool kStagedHalves = kSchedule == ConsumerSchedule::kCooperativeOverlapHalves;
  static constexpr bool kOverlapEpilogue =
      kSchedule == ConsumerSchedule::kCooperativeOverlap || kStagedHalves;
  // Threads that hold one tile's accumulators: both consumer warpgroups, or one (ping-pong).
  static constexpr int kMmaThreads = kPingPong ? 128 : 256;
  using TileShape = Shape<Int<BM>, Int<BN>, Int<BK>>;
  using ClusterShape = Shape<Int<CM>, _1, _1>;

  // Epilogue staging: a consumer warpgroup stages 64 tile rows at a time (cooperative: its
  // own 64 rows, in two halves of 32; ping-pong: each half of its 128-row tile, in a region
  // of its own, so both warpgroups may store at once). The wgmma accumulator holds rows r
  // and r+8 of each 16-row warp slice in separate registers, so a cooperative "half" = that
  // +8 bit. Rows are padded by 16 bytes: the bf16x2 register stores of a warp then hit 32
  // distinct banks, and every row stays 16-byte aligned for the vector copy-out. The sync
  // epilogue stages half tiles (34 KB for BN=256, 4 mainloop stages); the overlapped one the
  // whole tile (68 KB, 3 stages), since the consumers leave it there for the copy-out warps
  // (staged in halves: one warpgroup's 64 rows at a time, 34 KB, 4 stages);
  // ping-pong 2 x 64 rows (34 KB at BN=128: 6 stages of 32 KB).
  static constexpr int kEpiRows = kPingPong ? 64 : 32;
  static constexpr int kEpiPitchWords = (BN + 8) / 2;  // 32-bit words per staged row
  static constexpr int kEpiWords =
      (kStagedHalves ? BM / 2 : kOverlapEpilogue ? BM : 2 * kEpiRows) * kEpiPitchWords;
  static constexpr int kEpiBytes = kEpiWords * 4;

  static constexpr int kSmemCapacity = 232448;  // sm_90 opt-in dynamic smem per block
  static constexpr int kStageBytes = (BM + BN) * BK * int(sizeof(Element));
  static constexpr int kStages = (kSmemCapacity - kEpiBytes - 1024) / kStageBytes;
  // Reduction in the epilogue (add_from): the copy-out warps load the partial sums with
  // cp.async into a ring of kAddRingSlots 16-byte slots per thread, that many loads in flight
  // per thread instead of one (a serial L2 load per chunk made the add cost 5-16%: DESIGN.md,
  // "Peer stores"). Only from the smem the mainloop stages leave over (no stage is given up):
  // 8 slots (12 KB) at 128x256; none at 128x128, which then loads one chunk at a time.
  static constexpr int kAddRingLeftover =
      kSmemCapacity - kEpiBytes - 1024 - kStages * kStageBytes;
  static constexpr int kAddRingFit = kAddRingLeftover / (kCopyOutThreads * 16);
  static constexpr int kAddRingSlots =
      !kOverlapEpilogue || kAddRingFit < 2 ? 0 : (kAddRingFit < 8 ? kAddRingFit : 8);
  static_assert(!kOverlapEpilogue || kStagedHalves || BN != 256 || kAddRingSlots == 8,
                "the 128x256 overlapped instances keep their 3 stages and an 8-slot add ring");
  // Staged in halves: two consumer warpgroups of 64 rows each stage one at a time into
  // BM / 2 rows; the point of it is the 4th mainloop stage at 128x256, and the copy-out
  // (CopyStagedRowsPlain) has no add ring (the launcher gives it no adds: epilogue_adds).
  static_assert(!kStagedHalves || (BM == 128 && kMmaThreads == 256 && !kPingPong),
                "halves: two 64-row consumer warpgroups per tile");
  static_assert(!kStagedHalves || BN != 256 || kStages == 4,
                "halves at 128x256 exist to keep 4 mainloop stages");
  static_assert(!kStagedHalves || !kPeerStores_, "halves store plainly: no peer stores");
  // Several mirrors by bulk copies (above): the add ring writes the sums back for them.
  static constexpr bool kBulkMirrors = kPeerStores_ && kOverlapEpilogue && kAddRingSlots > 0;
  static_assert(!kPeerStores_ || kBulkMirrors, "a peer-stores instance needs the overlapped epilogue's add ring");
  static_assert(kStages + 3 <= kQueueRingSlots, "the leader may run kStages units ahead of its partner");
  // Split tail: one partial tile per CTA (kMmaThreads consumer threads x their accumulators).
  static constexpr size_t kPartialBytes = size_t(BM) * BN * 4;
  static constexpr int kMaxSplitSlots =
      int(kSplitPartialBytes / (CM * kPartialBytes)) < kSplitMaxFlags / CM
          ? int(kSplitPartialBytes / (CM * kPartialBytes)) : kSplitMaxFlags / CM;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, 8,   // x [M,K]: K-major
      Element, LayoutW, 8,                     // w [K,N] (N-major) or [N,K] (K-major)
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCount<kStages>,
      std::conditional_t<kPingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>>::CollectiveOp;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;

  // The producer warp hands each piece of work (a unit, or part of one's K loop: the split
  // tail) to the CTA's other warps through this small pipeline (it runs at most a few pieces
  // ahead: the mainloop's stages bound it).
  static constexpr int kUnitSlots = 8;
  using UnitPipeline = cutlass::PipelineAsync<kUnitSlots>;
  using UnitState = typename UnitPipeline::PipelineState;
  // Warps that take units from it: the two consumer warpgroups, and the copy-out warps.
  static constexpr int kUnitReaderWarps = 8 + (kOverlapEpilogue ? 3 : 0);
  static_assert(!kPingPong || BM == 128, "a ping-pong warpgroup holds a 128-row tile (two wgmma rows)");

  struct SharedStorage {
    // Mainloop tiles first: the dynamic smem window starts 1024-byte aligned, which the
    // 128-byte TMA/wgmma swizzle needs.
    typename Mainloop::TensorStorage mainloop;
    alignas(16) uint32_t epi[kEpiWords];
    alignas(16) uint4 add_ring[kAddRingSlots > 0 ? kAddRingSlots * kCopyOutThreads : 1];
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) typename UnitPipeline::SharedStorage unit_pipeline;
    PieceSlot pieces[kUnitSlots];  // PieceWork (work_units.cuh)
    // Overlapped epilogue: the staged tile's hand-off (consumers -> copy-out warps) and the
    // staging rows' return (copy-out warps -> consumers), one phase per staged tile; [0]
    // only. Staged in halves: staging_full[w] hands over warpgroup w's rows, staging_empty[w]
    // says that warpgroup w may stage (the other's rows were read out), one phase per tile
    // each. Every side waits once per staged tile, in order, and skips the same pieces, and
    // no barrier can complete its next phase before its waiter has waited for this one
    // (each completion needs the waiter's own later arrival, through the other barriers):
    // so a parity wait never passes on an earlier phase. With one shared pair, warpgroup 0
    // could wait on a phase whose predecessor was warpgroup 1's and not yet complete.
    cutlass::arch::ClusterBarrier staging_full[2], staging_empty[2];
    // Ping-pong: mma_turn[w] completes a phase when the other warpgroup has issued its
    // tile's mainloop, i.e. it is warpgroup w's turn on the tensor cores.
    cutlass::arch::ClusterBarrier mma_turn[2];
  };
  static_assert(sizeof(SharedStorage) <= kSmemCapacity, "shared memory over the sm_90 limit");

  struct Params {
    typename Mainloop::Params mainloop;  // TMA descriptors for x and w
    void* out;
    int32_t* counters;
    int k_tiles;
    int num_clusters;
    TileSchedule sched;
    int out_col_block;        // 0: out [M, N]; c > 0: out [N/c, M, c] (signaling_gemm.h)
    const int32_t* in_flags;  // null: x is ready; else wait per tile (signaling_gemm.h)
    int in_flag_rows;
    int32_t in_flag_value;
    // Reduction in the epilogue, peer stores (signaling_gemm.h): null add_from: store the
    // tile as is; mirror_count 0: store it once.
    const char* add_from;
    int64_t add_stride;
    int add_sources;
    const int32_t* add_counters;  // [source][group]; null: the partials are ready
    bool add_serial;              // tests: no add ring (signaling_gemm.h)
    bool signal_system;
    const int32_t* mirror_slots[kMaxAddSources];
    int mirror_count;
    int64_t mirror_offset;
    int32_t mirror_call;
    // groups < head_groups: head_out / head_counters of their destination (signaling_gemm.h)
    int head_groups;
    int head_groups_per_dest;
    int add_first_group;  // groups g >= this add add_from's partials (head_add_dests, signaling_gemm.h)
    char* head_out[kMaxAddSources];
    int32_t* head_counters[kMaxAddSources];
    const volatile int* abort_flag;  // peer waits give up (trap) once set (signaling_gemm.h)
    const int32_t* peer_failed;      // peer waits end (no trap) once set (signaling_gemm.h)
    // Dynamic tile queue (signaling_gemm.h), zeroed before the launch; null: round robin.
    uint32_t* queue_next;               // units claimed so far; [1]: units helpers took
    unsigned long long* queue_ring;     // [clusters][kQueueRingSlots]: tag << 32 | item
    // A helper launch (LaunchSignalingGemmHelpers) claims while the counter is below
    // claim_limit and uses rings ring_base + its cluster ids, tagged with ring_epoch (so an
    // earlier helper launch's entries in those rings never match). The main launch:
    // claim_limit kNoClaimLimit, ring_base 0, ring_epoch 0.
    unsigned claim_limit;
    int ring_base;
    int ring_epoch;
    // Split tail (sched.split_units > 0): partial tiles [slot][rank_m] and their ready flags.
    float* partials;
    int32_t* split_flags;
#ifdef FO_TIMELINE
    long long* timeline;
#endif
  };

  static constexpr int kThreads = 384;  // 1 producer warpgroup + 2 consumer warpgroups
};

// The epilogue addresses accumulator registers by the documented wgmma D-fragment layout
// (thread t, value v = v0 + 2*v1 + 4*v2 -> row 64*(t/128) + 16*((t/32)%4) + (t%32)/4 + 8*v1,
// column 8*v2 + 2*(t%4) + v0, in the TiledMma's tile: 128 x BN for the cooperative pair,
// 64 x BN for one ping-pong warpgroup, which repeats it over the tile's two 64-row halves).
// Prove at compile time that CuTe's TiledMma agrees, on a sample of threads covering every
// warp (and both warpgroups) and on all values.
template <class Cfg>
constexpr bool AccumulatorLayoutIsCanonical() {
  constexpr auto tv = typename Cfg::TiledMma{}.get_layoutC_TV();
  constexpr int kMmaRows = 64 * (Cfg::kMmaThreads / 128);
  constexpr int kThreadsSample[] = {0, 1, 2, 3, 4, 5, 7, 31, 32, 45, 64, 97, 127,
                                    128, 129, 161, 200, 224, 255};
  for (int t : kThreadsSample) {
    if (t >= Cfg::kMmaThreads) continue;
    for (int v = 0; v < Cfg::BN / 2; ++v) {
      const int v0 = v % 2, v1 = (v / 2) % 2, v2 = v / 4;
      const int m = 64 * (t / 128) + 16 * ((t / 32) % 4) + (t % 32) / 4 + 8 * v1;
      const int n = 8 * v2 + 2 * (t % 4) + v0;
      if (int(tv(t, v)) != m + kMmaRows * n) return false;
    }
  }
  return size(tv) == kMmaRows * Cfg::BN;
}

#ifdef FO_TIMELINE
// Where a CTA's warps spend a tile boundary (test builds: tests/cuda/build_timeline.sh).
__device__ __forceinline__ void Stamp(long long* tl, int role, int piece, int event) {
  if (tl != nullptr && blockIdx.x < kTimelineCtas && piece < kTimelinePieces)
    tl[((int(blockIdx.x) * kTimelineRoles + role) * kTimelinePieces + piece) * kTimelineEvents + event] =
        clock64();
}
#define FO_STAMP(role, piece, event) Stamp(params.timeline, role, piece, event)
#else
#define FO_STAMP(role, piece, event) ((void)0)
#endif

__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The copy-out warps' barrier among themselves: the warp is reconverged first (the copy-out
// loop leaves lanes at different trip counts) and the barrier is the non-.aligned form,
// which does not require every lane at the same instruction (synccheck reported "divergent
// threads" with bar.sync).
__device__ __forceinline__ void HandOffBarrier(int id, int threads) {
  __syncwarp();
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Named barrier ids: 0 is __syncthreads; CUTLASS's own epilogues reserve a few low ids.
// We run no CUTLASS epilogue, but stay clear of them anyway.
constexpr int kBarWarpGroup0 = 8;   // +1 for consumer warpgroup 1
constexpr int kBarConsumers = 10;   // both consumer warpgroups (256 threads)
constexpr int kBarCopyOut = 13;     // the 96 copy-out threads among themselves
constexpr int kConsumerThreads = 256;

}  // namespace sg
}  // namespace flashoverlap
