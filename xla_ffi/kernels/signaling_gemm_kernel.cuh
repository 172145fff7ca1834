// The signaling GEMM kernel (sm_90a): CUTLASS's TMA + wgmma warp-specialized cooperative
// mainloop collective, wrapped in our own persistent kernel layer (tile order from
// tile_schedule.h, register->smem->global epilogue with a row remap, one signal per tile).
// Included by exactly one .cu per instantiation (signaling_gemm_<dtype>_<tile>.cu).
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

template <class Element_, int kBlockM, int kBlockN, int kClusterM, bool kOverlapEpilogue_ = false>
struct Config {
  using Element = Element_;
  static constexpr int BM = kBlockM, BN = kBlockN, CM = kClusterM, BK = kGemmBlockK;
  // Overlapped epilogue: the consumers stage the whole tile in smem and go straight on to the
  // next tile's mainloop; the producer warpgroup's three idle warps copy it out and signal.
  // Costs smem (the whole tile staged: one mainloop stage fewer at 128x256) to take the
  // copy-out and the signal's fence off the tensor cores' critical path.
  static constexpr bool kOverlapEpilogue = kOverlapEpilogue_;
  using TileShape = Shape<Int<BM>, Int<BN>, Int<BK>>;
  using ClusterShape = Shape<Int<CM>, _1, _1>;

  // Epilogue staging: each consumer warpgroup owns 64 tile rows and stages them in two
  // halves of 32 rows (the wgmma accumulator holds rows r and r+8 of each 16-row warp
  // slice in separate registers, so "half" = that +8 bit). Rows are padded by 16 bytes:
  // the bf16x2 register stores of a warp then hit 32 distinct banks, and every row stays
  // 16-byte aligned for the vector copy-out. The sync epilogue stages half tiles (34 KB for
  // BN=256, 4 mainloop stages); the overlapped one the whole tile (68 KB, 3 stages), since
  // the consumers leave it there for the copy-out warps.
  static constexpr int kEpiRows = 32;
  static constexpr int kEpiPitchWords = (BN + 8) / 2;  // 32-bit words per staged row
  static constexpr int kEpiWords = (kOverlapEpilogue ? BM : 2 * kEpiRows) * kEpiPitchWords;
  static constexpr int kEpiBytes = kEpiWords * 4;

  static constexpr int kSmemCapacity = 232448;  // sm_90 opt-in dynamic smem per block
  static constexpr int kStageBytes = (BM + BN) * BK * int(sizeof(Element));
  static constexpr int kStages = (kSmemCapacity - kEpiBytes - 1024) / kStageBytes;
  static_assert(kStages + 3 <= kQueueRingSlots, "the leader may run kStages units ahead of its partner");
  // Split tail: one partial tile per CTA (256 consumer threads x BN/2 fp32 accumulators).
  static constexpr size_t kPartialBytes = size_t(BM) * BN * 4;
  static constexpr int kMaxSplitSlots =
      int(kSplitPartialBytes / (CM * kPartialBytes)) < kSplitMaxFlags / CM
          ? int(kSplitPartialBytes / (CM * kPartialBytes)) : kSplitMaxFlags / CM;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, 8,   // x [M,K]: K-major
      Element, cutlass::layout::RowMajor, 8,   // w [K,N]: N-major
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCount<kStages>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
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

  struct SharedStorage {
    // Mainloop tiles first: the dynamic smem window starts 1024-byte aligned, which the
    // 128-byte TMA/wgmma swizzle needs.
    typename Mainloop::TensorStorage mainloop;
    alignas(16) uint32_t epi[kEpiWords];
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) typename UnitPipeline::SharedStorage unit_pipeline;
    PieceSlot pieces[kUnitSlots];  // PieceWork (work_units.cuh)
    // Overlapped epilogue: the staged tile's hand-off (consumers -> copy-out warps) and the
    // staging rows' return (copy-out warps -> consumers), one phase per staged tile.
    cutlass::arch::ClusterBarrier staging_full, staging_empty;
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
    // Dynamic tile queue (signaling_gemm.h), zeroed before the launch; null: round robin.
    uint32_t* queue_next;               // units claimed so far
    unsigned long long* queue_ring;     // [clusters][kQueueRingSlots]: (seq + 1) << 32 | item
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
// column 8*v2 + 2*(t%4) + v0). Prove at compile time that CuTe's TiledMma agrees, on a
// sample of threads covering every warp and both warpgroups and on all values.
template <class Cfg>
constexpr bool AccumulatorLayoutIsCanonical() {
  constexpr auto tv = typename Cfg::TiledMma{}.get_layoutC_TV();
  constexpr int kThreadsSample[] = {0, 1, 2, 3, 4, 5, 7, 31, 32, 45, 64, 97, 127,
                                    128, 129, 161, 200, 224, 255};
  for (int t : kThreadsSample) {
    for (int v = 0; v < Cfg::BN / 2; ++v) {
      const int v0 = v % 2, v1 = (v / 2) % 2, v2 = v / 4;
      const int m = 64 * (t / 128) + 16 * ((t / 32) % 4) + (t % 32) / 4 + 8 * v1;
      const int n = 8 * v2 + 2 * (t % 4) + v0;
      if (int(tv(t, v)) != m + Cfg::BM * n) return false;
    }
  }
  return size(tv) == 256 * (Cfg::BM * Cfg::BN / 256);
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

template <class Element>
__device__ __forceinline__ uint32_t PackPair(float a, float b) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Four 8x8 16-bit matrices from registers to shared memory (stmatrix, sm_90): register j of
// a lane holds row lane / 4, columns 2 * (lane % 4) + {0, 1} of matrix j; lanes 8j..8j+7 give
// the 16-byte-aligned addresses of matrix j's rows.
__device__ __forceinline__ void StoreMatrixX4(uint32_t smem_addr, uint32_t r0, uint32_t r1,
                                              uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Waits until *flag == value (the tile's input rows have arrived), then makes the data
// those rows' writers released visible to this thread's later TMA (async-proxy) loads.
// Every lane of the producer warp waits itself, so whichever lane CUTLASS elects to issue
// the TMA has acquired the flag and fenced the proxies.
__device__ __forceinline__ void WaitInputFlag(const int32_t* flag, int32_t value) {
  int32_t seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
    if (seen == value) break;
    __nanosleep(128);
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Named barrier ids: 0 is __syncthreads; CUTLASS's own epilogues reserve a few low ids.
// We run no CUTLASS epilogue, but stay clear of them anyway.
constexpr int kBarWarpGroup0 = 8;   // +1 for consumer warpgroup 1
constexpr int kBarConsumers = 10;   // both consumer warpgroups (256 threads)
constexpr int kBarCopyOut = 13;     // the 96 copy-out threads among themselves
constexpr int kCopyOutThreads = 96;
constexpr int kConsumerThreads = 256;

// Byte offset in `out` of tile row `row`, column `col` (row-major or column-blocked).
__device__ __forceinline__ int64_t OutOffset(int dst_row, int row, int col, int M, int N,
                                             int out_col_block) {
  if (out_col_block == 0) return ((int64_t(dst_row) + row) * N + col) * 2;
  const int c = out_col_block;  // column block j stored as its own [M, c] matrix; c % 8 == 0
  const int j = col / c;
  return ((int64_t(j) * M + dst_row + row) * c + (col - j * c)) * 2;
}

// Overlapped epilogue, copy-out side (threads 32..127 of the producer warpgroup): for every
// tile this CTA stores, wait until the consumers staged it, copy it to global memory, signal
// its group, then hand the staging rows back.
template <class Cfg>
__device__ void CopyOutTiles(const typename Cfg::Params& params, const uint32_t* epi,
                             typename Cfg::UnitPipeline& unit_pipe, const PieceSlot* pieces,
                             cutlass::arch::ClusterBarrier& ss_full,
                             cutlass::arch::ClusterBarrier& ss_empty, int et) {
  const TileSchedule& sched = params.sched;
  uint32_t full_phase = 0;
  constexpr int kChunksPerRow = Cfg::BN / 8;
  char* out = static_cast<char*>(params.out);
  typename Cfg::UnitState unit_state;
  for (int np = 0;; ++np) {
    const PieceWork pw = NextPiece<Cfg>(unit_pipe, unit_state, pieces, et % 32);
    const Piece& piece = pw.piece;
    const TileWork& w = pw.work;
    if (et == 0) FO_STAMP(2, np, 0);
    if (piece.unit < 0) break;
    // The consumers skip these too: an idle cluster partner; a partial sum left for later.
    if (w.rows <= 0 || piece.kind == kPieceStorePartial) continue;
    // The tile is staged: all 256 consumer threads arrived (each arrive releases its own
    // stores; this wait acquires them). mbarriers rather than named barriers shared by both
    // sides: compute-sanitizer's racecheck reported the bar.arrive / bar.sync hand-off racy,
    // and the later barrier.sync one intermittently with several tiles per CTA.
    ss_full.wait(full_phase);
    full_phase ^= 1;
    if (et == 0) FO_STAMP(2, np, 1);
    const int n0 = w.n_tile * Cfg::BN;
    for (int id = et; id < Cfg::BM * kChunksPerRow; id += kCopyOutThreads) {
      const int row = id / kChunksPerRow, ch = id % kChunksPerRow, col = n0 + 8 * ch;
      if (row < w.rows && col < sched.n) {
        const uint4 v = *reinterpret_cast<const uint4*>(epi + row * Cfg::kEpiPitchWords + 4 * ch);
        *reinterpret_cast<uint4*>(out + OutOffset(w.dst_row, row, col, sched.m, sched.n,
                                                  params.out_col_block)) = v;
      }
    }
    if (et == 0) FO_STAMP(2, np, 2);
    ss_empty.arrive();  // this thread's reads of the staging rows are done (release)
    // Signal as in the consumers' epilogue: every copy-out store precedes this barrier, the
    // releasing thread's gpu-scope fence orders them all before the counter increment.
    HandOffBarrier(kBarCopyOut, kCopyOutThreads);
    if (et == 0 && params.counters != nullptr) {
      __threadfence();
      atomicAdd(params.counters + w.group, 1);
    }
    if (et == 0) FO_STAMP(2, np, 3);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
SignalingGemmKernel(const __grid_constant__ typename Cfg::Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = typename Cfg::Mainloop;
  using Pipeline = typename Cfg::Pipeline;
  using PipelineState = typename Cfg::PipelineState;
  using X = Underscore;
  constexpr int BN = Cfg::BN, CM = Cfg::CM;

  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);

  const int thread_idx = int(threadIdx.x);
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp_in_group = cutlass::canonical_warp_idx_sync() % 4;
  const int lane = cutlass::canonical_lane_idx();
  const uint32_t rank_in_cluster = cute::block_rank_in_cluster();
  const int rank_m = int(rank_in_cluster) % CM;
  const int cluster_id = int(blockIdx.x) / CM;
  const TileSchedule& sched = params.sched;

  if (thread_idx == 0) Mainloop::prefetch_tma_descriptors(params.mainloop);

  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer
                            : Pipeline::ThreadCategory::Consumer;
  if (warp_group == 0 && warp_in_group != 0) pp.role = Pipeline::ThreadCategory::NonParticipant;
  pp.is_leader = (thread_idx % 128) == 0;
  pp.num_consumers = 256;
  pp.transaction_bytes = params.mainloop.tma_transaction_bytes;
  Pipeline pipeline(ss.pipeline, pp, typename Cfg::ClusterShape{});

  typename Cfg::UnitPipeline::Params up;
  up.role = (warp_group == 0 && warp_in_group == 0) ? Cfg::UnitPipeline::ThreadCategory::Producer
                                                    : Cfg::UnitPipeline::ThreadCategory::Consumer;
  up.producer_arv_count = 1;
  up.consumer_arv_count = Cfg::kUnitReaderWarps;
  up.initializing_warp = 0;
  typename Cfg::UnitPipeline unit_pipe(ss.unit_pipeline, up);
  if constexpr (Cfg::kOverlapEpilogue) {
    if (thread_idx == 0) {
      ss.staging_full.init(kConsumerThreads);
      ss.staging_empty.init(kCopyOutThreads);
      cutlass::arch::fence_barrier_init();
    }
  }

  // Barrier initialisation must be visible to every CTA of the cluster before any TMA
  // multicast or remote arrive touches it.
  if constexpr (CM > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  Mainloop mainloop;
  const int M = sched.m, N = sched.n;

  if (warp_group == 0) {
    // Producer warpgroup: one warp issues the TMA loads of every unit this cluster owns.
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (warp_in_group == 0) {
      PipelineState write_state = cutlass::make_producer_start_state<Pipeline>();
      const int k_extent = params.k_tiles * Cfg::BK;
      Tensor mA = params.mainloop.tma_load_a.get_tma_tensor(make_shape(M, k_extent, 1));
      Tensor mB = params.mainloop.tma_load_b.get_tma_tensor(make_shape(N, k_extent, 1));
      Tensor gB_nkl = local_tile(mB, typename Cfg::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
      typename Cfg::UnitState unit_state = cutlass::make_producer_start_state<typename Cfg::UnitPipeline>();
      UnitClaims<Cfg> claims(params, cluster_id, rank_in_cluster);  // used by lane 0 only
      UnitDecoder decoder;
      int np = 0;  // pieces so far (timeline)
      for (int seq = 0;; ++seq) {
        if (lane == 0) FO_STAMP(1, np, 0);
        const int item = ClaimItem<Cfg>(claims, seq, lane);
        if (lane == 0) FO_STAMP(1, np, 1);
        if (item < 0) {
          PublishPiece<Cfg>(unit_pipe, unit_state, ss.pieces, Piece{-1, 0, 0, 0, 0}, TileWork{}, lane);
          break;
        }
        Piece pieces[kMaxPiecesPerItem];
        const int count = ItemPieces(sched, item, pieces);
        for (int i = 0; i < count; ++i) {
          const Piece& piece = pieces[i];
          const TileWork w = decoder.Decode(sched, piece.unit, rank_m);
          if (lane == 0) FO_STAMP(1, np, 4);
          PublishPiece<Cfg>(unit_pipe, unit_state, ss.pieces, piece, w, lane);
          if (lane == 0) FO_STAMP(1, np, 5);
          // Input rows still in flight (all-gather + GEMM): wait for their flag. Idle cluster
          // partners (rows <= 0) load rows that are never stored, so they need not wait.
          if (params.in_flags != nullptr && w.rows > 0) {
            WaitInputFlag(params.in_flags + w.src_row / params.in_flag_rows, params.in_flag_value);
          }
          // Tiles start at arbitrary rows (band and rank-block offsets), so shift the TMA
          // coordinate space to the tile's first row and take tile 0. Rows past M read as
          // zeros (TMA bounds), rows of a neighbouring band are computed but never stored.
          Tensor gA_mkl = local_tile(domain_offset(make_coord(w.src_row, 0, 0), mA),
                                     typename Cfg::TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
          auto k_iter = make_coord_iterator(idx2crd(piece.k_begin, shape<3>(gA_mkl)), shape<3>(gA_mkl));
          if (lane == 0) FO_STAMP(1, np, 2);
          mainloop.load(params.mainloop, pipeline, write_state, cute::make_tuple(gA_mkl, gB_nkl),
                        make_coord(0, w.n_tile, _, 0), k_iter, piece.k_count, lane,
                        rank_in_cluster, ss.mainloop);
          write_state.advance(piece.k_count);
          if (lane == 0) FO_STAMP(1, np, 3);
          ++np;
        }
        if (lane == 0) claims.Loaded(seq);
      }
      // Keep this CTA alive until every consumer of the cluster released our stages.
      mainloop.load_tail(pipeline, write_state);
    } else if constexpr (Cfg::kOverlapEpilogue) {
      CopyOutTiles<Cfg>(params, ss.epi, unit_pipe, ss.pieces, ss.staging_full, ss.staging_empty,
                        thread_idx - 32);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<232>();
    // Same numbering as CUTLASS's cooperative kernel: mma warpgroup = (thread % 256) / 128.
    const int mma_thread = thread_idx % 256;
    const int mwg = mma_thread / 128;            // rows [64*mwg, 64*mwg+64) of the tile
    const int wg_thread = mma_thread % 128;
    const int mwarp = wg_thread / 32;
    uint32_t* epi = ss.epi + mwg * Cfg::kEpiRows * Cfg::kEpiPitchWords;
    char* out = static_cast<char*>(params.out);
    typename Cfg::TiledMma tiled_mma;
    PipelineState read_state;

    typename Cfg::UnitState unit_state;
    uint32_t empty_phase = 0;
    bool staged_before = false;  // overlapped epilogue: a tile was staged (rows not yet free)
    for (int np = 0;; ++np) {
      if (thread_idx == 128) FO_STAMP(0, np, 0);
      const PieceWork pw = NextPiece<Cfg>(unit_pipe, unit_state, ss.pieces, lane);
      const Piece& piece = pw.piece;
      const TileWork& w = pw.work;
      if (piece.unit < 0) break;
      auto accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
      if (thread_idx == 128) FO_STAMP(0, np, 1);
      mainloop.mma(pipeline, read_state, accum, piece.k_count, mma_thread, ss.mainloop,
                   params.mainloop);
      if (thread_idx == 128) FO_STAMP(0, np, 2);
      mainloop.mma_tail(pipeline, read_state, piece.k_count);
      if (thread_idx == 128) FO_STAMP(0, np, 3);
      read_state.advance(piece.k_count);
      if (w.rows <= 0) continue;  // idle cluster partner past the band end: CTA-uniform
      if (piece.kind == kPieceStorePartial) {  // split tail: the unit is finished elsewhere
        StorePartial<Cfg>(params, accum, piece.slot, rank_m, mma_thread, kBarConsumers);
        continue;
      }
      if (piece.kind == kPieceAddPartial)
        AddPartial<Cfg>(params, accum, piece.slot, rank_m, mma_thread);

      if constexpr (Cfg::kOverlapEpilogue) {
        // Whole tile into smem (rows 64*mwg + 16*warp + 8*half + lane/4), then on to the
        // next tile: the copy-out warps store and signal it meanwhile. First wait until they
        // have read the previous one out of the staging rows.
        if (staged_before) {
          ss.staging_empty.wait(empty_phase);
          empty_phase ^= 1;
        }
        staged_before = true;
        // stmatrix x4 per two 8-column blocks: matrix i (lanes 8i..8i+7 give its row
        // addresses) is rows 8 * (i & 1) .. +7 of the warp's 16, column block v2 + (i >> 1);
        // each lane's registers are already the fragment stmatrix takes (row lane / 4,
        // columns 2 * (lane % 4) + {0, 1}). A quarter of the store instructions of one 32-bit
        // store per pair, which the timeline showed at ~950 cycles per tile.
        const int mat = lane / 8;
        const uint32_t row_addr = static_cast<uint32_t>(__cvta_generic_to_shared(
            ss.epi + (64 * mwg + 16 * mwarp + 8 * (mat & 1) + lane % 8) * Cfg::kEpiPitchWords +
            4 * (mat >> 1)));
        using E = typename Cfg::Element;
        CUTLASS_PRAGMA_UNROLL
        for (int v2 = 0; v2 < BN / 8; v2 += 2) {
          StoreMatrixX4(row_addr + 16 * v2, PackPair<E>(accum(4 * v2), accum(4 * v2 + 1)),
                        PackPair<E>(accum(4 * v2 + 2), accum(4 * v2 + 3)),
                        PackPair<E>(accum(4 * v2 + 4), accum(4 * v2 + 5)),
                        PackPair<E>(accum(4 * v2 + 6), accum(4 * v2 + 7)));
        }
        ss.staging_full.arrive();  // this thread's part is staged (release)
        if (thread_idx == 128) FO_STAMP(0, np, 4);
        continue;
      }
      const int n0 = w.n_tile * BN;
      CUTLASS_PRAGMA_UNROLL
      for (int half = 0; half < 2; ++half) {
        // Registers -> padded smem rows (local row = 8*warp + lane/4).
        CUTLASS_PRAGMA_UNROLL
        for (int v2 = 0; v2 < BN / 8; ++v2) {
          epi[(8 * mwarp + lane / 4) * Cfg::kEpiPitchWords + 4 * v2 + lane % 4] =
              PackPair<typename Cfg::Element>(accum(4 * v2 + 2 * half), accum(4 * v2 + 2 * half + 1));
        }
        NamedBarrierSync(kBarWarpGroup0 + mwg, 128);
        // smem -> global, 16 bytes per thread, a warp covers whole contiguous row spans.
        constexpr int kChunksPerRow = BN / 8;
        CUTLASS_PRAGMA_UNROLL
        for (int it = 0; it < Cfg::kEpiRows * kChunksPerRow / 128; ++it) {
          const int id = it * 128 + wg_thread;
          const int lr = id / kChunksPerRow;
          const int ch = id % kChunksPerRow;
          const int tile_row = 64 * mwg + 16 * (lr / 8) + 8 * half + lr % 8;
          const int col = n0 + 8 * ch;
          if (tile_row < w.rows && col < N) {
            const uint4 v = *reinterpret_cast<const uint4*>(epi + lr * Cfg::kEpiPitchWords + 4 * ch);
            *reinterpret_cast<uint4*>(out + OutOffset(w.dst_row, tile_row, col, M, N,
                                                      params.out_col_block)) = v;
          }
        }
#ifndef FO_TEST_PLANT_RACE  // defined only by the sanitizer's negative-control test build
        if (half == 0) NamedBarrierSync(kBarWarpGroup0 + mwg, 128);  // WAR on the staging rows
#endif
      }
      // Signal: every consumer thread's stores precede this barrier; the releasing thread's
      // gpu-scope fence then orders all of them (cumulatively, through the barrier) before
      // the counter increment. This barrier also protects the staging rows of the next tile.
      NamedBarrierSync(kBarConsumers, 256);
      if (mma_thread == 0 && params.counters != nullptr) {
        __threadfence();
        atomicAdd(params.counters + w.group, 1);
      }
    }
  }
#endif
}

// ---- host side -----------------------------------------------------------------------

template <class Cfg>
struct Instance {
  static constexpr int kSmemBytes = int(sizeof(typename Cfg::SharedStorage));

  // Launch shape of `clusters` clusters of Cfg::CM CTAs (the occupancy query and the launch
  // must describe the same kernel). `attr` must outlive the returned config.
  static cudaLaunchConfig_t LaunchConfig(int clusters, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(clusters * Cfg::CM, 1, 1);
    cfg.blockDim = dim3(Cfg::kThreads, 1, 1);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = stream;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = Cfg::CM;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
  }

  // Per-device one-time setup: opt in to the large smem size, ask the occupancy API how
  // many clusters of this kernel (with its real smem size) can be resident at once.
  static cudaError_t Prepare(int device, int* max_clusters) {
    static std::mutex mu;
    static int cached[kMaxDevices] = {0};
    if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
    std::lock_guard<std::mutex> lock(mu);
    if (cached[device] > 0) {
      *max_clusters = cached[device];
      return cudaSuccess;
    }
    auto kernel = &SignalingGemmKernel<Cfg>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) return e;
    if (Cfg::CM > 1) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 0);
      if (e != cudaSuccess) return e;
    }
    int sms = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = LaunchConfig(sms / Cfg::CM, nullptr, &attr);
    int clusters = 0;
    e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e != cudaSuccess) return e;
    if (clusters <= 0) return cudaErrorInvalidConfiguration;
    cached[device] = clusters;
    *max_clusters = clusters;
    return cudaSuccess;
  }

  static cudaError_t Launch(const SignalingGemmArgs& args, const TileSchedule& sched,
                            int num_clusters, cudaStream_t stream) {
    // The launcher plans the split tail (sched.split_*) within our slot capacity, and only
    // with a queue (the partials live in its workspace).
    if (sched.k_tiles != (int(args.k) + Cfg::BK - 1) / Cfg::BK ||
        (sched.split_units > 0 && (args.queue == nullptr || sched.split_chunks - 1 > Cfg::kMaxSplitSlots)))
      return cudaErrorInvalidValue;
    using Element = typename Cfg::Element;
    using Mainloop = typename Cfg::Mainloop;
    const int M = int(args.m), N = int(args.n), K = int(args.k);
    typename Mainloop::Arguments ml_args{
        static_cast<const Element*>(args.x),
        cutlass::make_cute_packed_stride(typename Mainloop::StrideA{}, make_shape(M, K, 1)),
        static_cast<const Element*>(args.w),
        cutlass::make_cute_packed_stride(typename Mainloop::StrideB{}, make_shape(N, K, 1))};
    typename Cfg::Params params;
    // Builds the TMA descriptors (driver entry point reached through the runtime).
    params.mainloop = Mainloop::to_underlying_arguments(make_shape(M, N, K, 1), ml_args, nullptr);
    params.out = args.out;
    params.counters = args.counters;
    params.k_tiles = sched.k_tiles;
    params.num_clusters = num_clusters;
    params.sched = sched;
    params.out_col_block = args.out_col_block;
    params.in_flags = args.in_flags;
    params.in_flag_rows = args.in_flag_rows;
    params.in_flag_value = args.in_flag_value;
#ifdef FO_TIMELINE
    params.timeline = args.timeline;
#endif
    params.queue_next = static_cast<uint32_t*>(args.queue);
    char* queue = static_cast<char*>(args.queue);
    params.queue_ring = queue == nullptr ? nullptr
        : reinterpret_cast<unsigned long long*>(queue + kQueueRingOffset);
    const bool split = queue != nullptr && sched.split_units > 0;
    params.partials = split ? reinterpret_cast<float*>(queue + kQueuePartialsOffset) : nullptr;
    params.split_flags = split ? reinterpret_cast<int32_t*>(queue + kQueueFlagsOffset) : nullptr;

    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = LaunchConfig(num_clusters, stream, &attr);
    return cudaLaunchKernelEx(&cfg, &SignalingGemmKernel<Cfg>, params);
  }
};

// Defines the InstanceOps getter declared in signaling_gemm_instances.h.
#define FO_DEFINE_SIGNALING_GEMM_INSTANCE(NAME, ELEMENT, BM, BN, CM, OVERLAP_EPILOGUE)      \
  namespace {                                                                               \
  using NAME##Cfg = ::flashoverlap::sg::Config<ELEMENT, BM, BN, CM, OVERLAP_EPILOGUE>;       \
  static_assert(::flashoverlap::sg::AccumulatorLayoutIsCanonical<NAME##Cfg>(),              \
                "wgmma accumulator layout differs from the one the epilogue assumes");      \
  }                                                                                         \
  const InstanceOps& NAME() {                                                               \
    static const InstanceOps ops = {BM, BN, CM, NAME##Cfg::kStages,                          \
                                    ::flashoverlap::sg::Instance<NAME##Cfg>::kSmemBytes,   \
                                    NAME##Cfg::kMaxSplitSlots,                               \
                                    &::flashoverlap::sg::Instance<NAME##Cfg>::Prepare,      \
                                    &::flashoverlap::sg::Instance<NAME##Cfg>::Launch};      \
    return ops;                                                                             \
  }

}  // namespace sg
}  // namespace flashoverlap
