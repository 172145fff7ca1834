// The signaling GEMM's epilogue pieces: accumulators to bf16 / f16 pairs, stmatrix staging,
// the output's row remap, and the overlapped epilogue's copy-out warps.
// Included by signaling_gemm_kernel.cuh.
#pragma once

#include "signaling_gemm_config.cuh"

namespace flashoverlap {
namespace sg {

using namespace cute;

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

// Byte offset in `out` of tile row `row`, column `col` (row-major or column-blocked).
__device__ __forceinline__ int64_t OutOffset(int dst_row, int row, int col, int M, int N,
                                             int out_col_block) {
  if (out_col_block == 0) return ((int64_t(dst_row) + row) * N + col) * 2;
  const int c = out_col_block;  // column block j stored as its own [M, c] matrix; c % 8 == 0
  const int j = col / c;
  return ((int64_t(j) * M + dst_row + row) * c + (col - j * c)) * 2;
}

// A finished tile's signal, by the one thread that releases it: the barrier before the call
// ordered its threads' stores before this thread's fence, which orders them all
// (cumulatively) before the counter increment the waiter acquires. System scope where the
// counters (and the stores) are another GPU's: the fence and the increment both (a .gpu-scope
// atomic does not synchronize with another GPU's system-scope acquire).
// Head groups (signaling_gemm.h) count into their destination's head_counters, the rest
// into counters from head_groups on.
template <class Params>
__device__ __forceinline__ void SignalGroup(const Params& params, int group) {
  const bool head = group < params.head_groups;
  int32_t* counter;
  if (head) {
    const int dest = group / params.head_groups_per_dest;
    counter = params.head_counters[dest];
    if (counter != nullptr) counter += group - dest * params.head_groups_per_dest;
  } else {
    counter = params.counters == nullptr ? nullptr : params.counters + (group - params.head_groups);
  }
  if (counter == nullptr) return;
  if (head || params.signal_system) {
    __threadfence_system();
    atomicAdd_system(counter, 1);
  } else {
    __threadfence();
    atomicAdd(counter, 1);
  }
}

// One warp's 16 accumulator rows (fragment values [value0, value0 + BN / 2): the warp's rows
// lane / 4 and 8 + lane / 4) to smem rows `rows`, `rows` + 1, ... (a word pointer, pitch
// kEpiPitchWords), with stmatrix.x4 per two 8-column blocks: matrix i (lanes 8i..8i+7 give
// its row addresses) is rows 8 * (i & 1) .. +7, column block v2 + (i >> 1); each lane's
// registers already are the fragment stmatrix takes (row lane / 4, columns
// 2 * (lane % 4) + {0, 1}). A quarter of the store instructions of one 32-bit store per
// pair, which the timeline showed at ~950 cycles per tile.
template <class Cfg, class Accum>
__device__ __forceinline__ void StageWarpRows(uint32_t* rows, const Accum& accum, int value0,
                                              int lane) {
  using E = typename Cfg::Element;
  const int mat = lane / 8;
  const uint32_t row_addr = static_cast<uint32_t>(__cvta_generic_to_shared(
      rows + (8 * (mat & 1) + lane % 8) * Cfg::kEpiPitchWords + 4 * (mat >> 1)));
  CUTLASS_PRAGMA_UNROLL
  for (int v2 = 0; v2 < Cfg::BN / 8; v2 += 2) {
    const int v = value0 + 4 * v2;
    StoreMatrixX4(row_addr + 16 * v2, PackPair<E>(accum(v), accum(v + 1)),
                  PackPair<E>(accum(v + 2), accum(v + 3)), PackPair<E>(accum(v + 4), accum(v + 5)),
                  PackPair<E>(accum(v + 6), accum(v + 7)));
  }
}

// Tiles of group g in this launch (TilesInGroup on the host): what a source's counter of g
// reaches once that source, with the same layout and tile shape, stored all of its partials.
__device__ __forceinline__ int TilesOfGroup(const TileSchedule& s, int g) {
  return s.num_blocks * CeilDiv(s.band_rows[g + 1] - s.band_rows[g], s.block_m) * s.n_tiles;
}

// Spins between two reads of the abort flag in the waits for another GPU (host-mapped memory:
// a read crosses PCIe, so not on every spin of every waiting thread).
constexpr int kAbortCheckSpins = 256;

// One spin of a wait for another GPU: a short sleep, and every kAbortCheckSpins-th spin the
// watchdog's verdict (signaling_gemm.h, abort_flag): trap rather than wait for ever.
template <class Params>
__device__ __forceinline__ void PeerWaitSpin(const Params& params, int& spins) {
  if (++spins == kAbortCheckSpins) {
    spins = 0;
    if (params.abort_flag != nullptr && *params.abort_flag != 0) __trap();
  }
  __nanosleep(256);
}

// Whether the peer-store pair failed (signaling_gemm.h, peer_failed): set by a stream write
// from either GPU; relaxed, system scope (nothing is read after it that it would order).
template <class Params>
__device__ __forceinline__ bool PeerFailed(const Params& params) {
  if (params.peer_failed == nullptr) return false;
  int32_t failed;
  asm volatile("ld.relaxed.sys.global.b32 %0, [%1];" : "=r"(failed) : "l"(params.peer_failed) : "memory");
  return failed != 0;
}

// Reduction in the epilogue (signaling_gemm.h, add_from): waits until every source has stored
// its partials of `group` (a head group's one source: a negative index, add_counters[group -
// head_groups]). Each storing thread acquires the counters itself (system scope:
// another GPU may have written them after the data), so its own later loads of the partials
// (and of the mirror slot) see what the counters' writers released; no barrier needed.
template <class Params>
__device__ __forceinline__ void WaitAddCounters(const Params& params, int group) {
  if (params.add_counters == nullptr) return;
  const int tiles = TilesOfGroup(params.sched, group);
  const int groups = params.sched.num_groups - params.head_groups;
  int spins = 0;
  for (int s = 0; s < params.add_sources; ++s) {
    const int32_t* counter = params.add_counters + s * groups + (group - params.head_groups);
    while (true) {
      int32_t seen;
      asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      if (seen >= tiles || PeerFailed(params)) break;
      PeerWaitSpin(params, spins);
    }
  }
}

// Mirror i's base (signaling_gemm.h, mirror_slots): once the slot's stamp says its pointer
// is this call's, the pointer plus mirror_offset. Acquire, so the pointer words its writer
// set before the stamp are the ones read. Null (no mirror stores) if the peers failed.
template <class Params>
__device__ __forceinline__ char* MirrorBase(const Params& params, int i) {
  const int32_t* slot = params.mirror_slots[i];
  int spins = 0;
  while (true) {
    int32_t stamp;
    asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(stamp) : "l"(slot + 2) : "memory");
    if (stamp == params.mirror_call) break;
    if (PeerFailed(params)) return nullptr;
    PeerWaitSpin(params, spins);
  }
  uint32_t lo, hi;
  asm volatile("ld.relaxed.sys.global.b32 %0, [%1];" : "=r"(lo) : "l"(slot) : "memory");
  asm volatile("ld.relaxed.sys.global.b32 %0, [%1];" : "=r"(hi) : "l"(slot + 1) : "memory");
  return reinterpret_cast<char*>((uint64_t(hi) << 32) | lo) + params.mirror_offset;
}

// Sums of 16-byte chunks (eight elements) in fp32: a chunk's values added into `sum`, and the
// sum rounded back to one chunk.
template <class E>
__device__ __forceinline__ void AccumulateChunk(float2 (&sum)[4], uint4 chunk) {
  using E2 = std::conditional_t<std::is_same_v<E, cutlass::bfloat16_t>, __nv_bfloat162, __half2>;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(&chunk);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 4; ++i) {
    uint32_t word = words[i];
    const E2 pair = *reinterpret_cast<E2*>(&word);
    float2 f;
    if constexpr (std::is_same_v<E2, __nv_bfloat162>) f = __bfloat1622float2(pair);
    else f = __half22float2(pair);
    sum[i].x += f.x;
    sum[i].y += f.y;
  }
}
template <class E>
__device__ __forceinline__ uint4 RoundChunk(const float2 (&sum)[4]) {
  uint4 r;
  uint32_t* rw = reinterpret_cast<uint32_t*>(&r);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 4; ++i) rw[i] = PackPair<E>(sum[i].x, sum[i].y);
  return r;
}

// Eight staged (already rounded) values plus the same eight elements of every source, summed
// in fp32 and rounded once: for one source exactly NCCL's sum of two rounded partials. The
// partials are read through L2 (ld.global.cg): another GPU (or this launch's head tiles)
// wrote them while the launch ran.
template <class Cfg>
__device__ __forceinline__ uint4 AddPartialSums(const typename Cfg::Params& params, uint4 v,
                                                int64_t offset) {
  using E = typename Cfg::Element;
  float2 sum[4] = {};
  AccumulateChunk<E>(sum, v);
  for (int s = 0; s < params.add_sources; ++s)
    AccumulateChunk<E>(sum, __ldcg(reinterpret_cast<const uint4*>(params.add_from + s * params.add_stride + offset)));
  return RoundChunk<E>(sum);
}

// One 16-byte chunk of a staged tile: chunk `id` of rows [first_row, first_row + rows) is
// tile row first_row + id / (BN / 8), columns 8 * (id % (BN / 8)) on; `valid` false past the
// tile's valid rows or past N (not stored).
struct StagedChunk {
  int row, ch;
  int64_t offset;  // in out (and in every partial-sum source, laid out alike)
  bool valid;
};
template <class Cfg>
__device__ __forceinline__ StagedChunk LocateChunk(const TileSchedule& sched, const TileWork& w,
                                                   int out_col_block, int first_row, int id) {
  constexpr int kChunksPerRow = Cfg::BN / 8;
  StagedChunk c;
  c.row = id / kChunksPerRow;
  c.ch = id % kChunksPerRow;
  const int col = w.n_tile * Cfg::BN + 8 * c.ch;
  c.valid = first_row + c.row < w.rows && col < sched.n;
  c.offset = c.valid ? OutOffset(w.dst_row, first_row + c.row, col, sched.m, sched.n, out_col_block) : 0;
  return c;
}

__device__ __forceinline__ void CopyAsync16(void* smem, const void* global) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(global) : "memory");
}
__device__ __forceinline__ void CopyAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// CopyStagedRows' reduction with one source through the add ring (signaling_gemm_config.cuh,
// kAddRingSlots = D): this thread's j-th chunk loads its partial into its own slot j % D, D
// loads ahead of the add, so D loads are in flight instead of one. A slot is only refilled
// after the add that read it was stored (the store depends on the value read), and each
// thread reads only its own slots, after its own wait_group: no barrier. The loads follow
// WaitAddCounters' acquire in program order, as the serial loads do. Several sources keep
// the serial loads: a ring per source did not fit the copy-out warps' 40 registers (ptxas
// spilled, also on the one-source path).
template <class Cfg>
__device__ __forceinline__ void CopyAddRingRows(const typename Cfg::Params& params,
                                                uint32_t* staged, const TileWork& w,
                                                int first_row, int rows, int thread, int threads,
                                                char* out, char* mirror, bool write_back, uint4* ring) {
  using E = typename Cfg::Element;
  constexpr int D = Cfg::kAddRingSlots;
  const int chunks = rows * (Cfg::BN / 8);
  uint4* slots = ring + thread;  // slot j: slots[(j % D) * threads]
  auto issue = [&](int j) {
    const int id = thread + j * threads;
    if (id < chunks) {
      const StagedChunk c = LocateChunk<Cfg>(params.sched, w, params.out_col_block, first_row, id);
      if (c.valid) CopyAsync16(slots + (j % D) * threads, params.add_from + c.offset);
    }
    CopyAsyncCommit();  // one group per j, empty or not: wait_group counts groups
  };
#pragma unroll 1
  for (int j = 0; j < D; ++j) issue(j);
  for (int j = 0, id = thread; id < chunks; ++j, id += threads) {
    CopyAsyncWait<D - 1>();  // groups 0..j complete
    const StagedChunk c = LocateChunk<Cfg>(params.sched, w, params.out_col_block, first_row, id);
    if (c.valid) {
      uint4* chunk = reinterpret_cast<uint4*>(staged + c.row * Cfg::kEpiPitchWords + 4 * c.ch);
      float2 sum[4] = {};
      AccumulateChunk<E>(sum, *chunk);
      AccumulateChunk<E>(sum, slots[(j % D) * threads]);
      const uint4 v = RoundChunk<E>(sum);
      *reinterpret_cast<uint4*>(out + c.offset) = v;
      if (mirror != nullptr) *reinterpret_cast<uint4*>(mirror + c.offset) = v;
      if (write_back) *chunk = v;
    }
    issue(j + D);
  }
  CopyAsyncWait<0>();
}

// Whether CopyStagedRows leaves a tile's mirrors to MirrorStagedRows: a peer-stores instance
// (Config::kBulkMirrors), several mirrors, and an own group that adds through the add ring
// (which then writes the sums back over the staged values). Recomputed where needed rather
// than returned: a flag live across the copy loops made ptxas spill in the copy-out warps.
template <class Cfg>
__device__ __forceinline__ bool MirrorsInBulk(const typename Cfg::Params& params, int group) {
  return Cfg::kBulkMirrors && params.mirror_count > 1 && group >= params.head_groups &&
         params.add_from != nullptr && group >= params.add_first_group && params.add_sources == 1 &&
         !params.add_serial;
}

// Staged rows [0, rows) (tile rows first_row + i) to `out`, 16 bytes per thread and step, a
// warp covering contiguous row spans; `thread` of `threads` copying threads. Rows past the
// tile's valid rows and columns past N are not stored. With add_from (from add_first_group
// on: head groups too, along a ring), the other ranks' partial sums of those elements are
// added on the way (once their counters are complete): through the add ring (the copy-out
// warps of instances that have one, one source) or one chunk at a time. With mirror slots,
// each chunk is stored there too, except where MirrorsInBulk: there the add ring writes the
// sums back over the staged values and MirrorStagedRows stores whole rows afterwards.
template <class Cfg>
__device__ __forceinline__ void CopyStagedRows(const typename Cfg::Params& params,
                                               uint32_t* staged, const TileWork& w,
                                               int first_row, int rows, int thread, int threads,
                                               uint4* add_ring) {
  const bool head = w.group < params.head_groups;  // stored elsewhere
  char* out = head ? params.head_out[w.group / params.head_groups_per_dest] : static_cast<char*>(params.out);
  const bool add = params.add_from != nullptr && w.group >= params.add_first_group;
  if (add) WaitAddCounters(params, w.group);
  char* mirror = params.mirror_count == 0 || head ? nullptr : MirrorBase(params, 0);
  // Further mirrors (groups of 3 or more): their stamps now; on the chunk path (no add ring:
  // 128 x 128 tiles, add_serial) their pointers re-read from the slots per chunk (through L2)
  // rather than held: the copy-out warps run on 40 registers, and a pointer per mirror, or a
  // pass of its own, made ptxas spill there.
  bool more_mirrors = mirror != nullptr && params.mirror_count > 1;
  for (int i = 1; more_mirrors && i < params.mirror_count; ++i) more_mirrors = MirrorBase(params, i) != nullptr;
  if (params.mirror_count > 1 && !more_mirrors) mirror = nullptr;  // the peers failed: no mirror stores
  if constexpr (Cfg::kAddRingSlots > 0) {
    if (add && add_ring != nullptr && params.add_sources == 1 && !params.add_serial) {
      const bool bulk = MirrorsInBulk<Cfg>(params, w.group);  // mirrored after, by the caller
      CopyAddRingRows<Cfg>(params, staged, w, first_row, rows, thread, threads, out,
                           bulk ? nullptr : mirror, bulk, add_ring);
      return;
    }
  }
  for (int id = thread; id < rows * (Cfg::BN / 8); id += threads) {
    const StagedChunk c = LocateChunk<Cfg>(params.sched, w, params.out_col_block, first_row, id);
    if (c.valid) {
      uint4 v = *reinterpret_cast<const uint4*>(staged + c.row * Cfg::kEpiPitchWords + 4 * c.ch);
      if (add) v = AddPartialSums<Cfg>(params, v, c.offset);
      *reinterpret_cast<uint4*>(out + c.offset) = v;
      if (mirror != nullptr) *reinterpret_cast<uint4*>(mirror + c.offset) = v;
      for (int i = 1; more_mirrors && i < params.mirror_count; ++i) {
        const unsigned long long base = __ldcg(reinterpret_cast<const unsigned long long*>(params.mirror_slots[i]));
        *reinterpret_cast<uint4*>(reinterpret_cast<char*>(base) + params.mirror_offset + c.offset) = v;
      }
    }
  }
}

// The staged-in-halves instances' copy-out: plain stores of staged rows into out (the
// launcher gives them no add_from, mirrors or head groups: InstanceOps::epilogue_adds).
template <class Cfg>
__device__ __forceinline__ void CopyStagedRowsPlain(const typename Cfg::Params& params,
                                                    const uint32_t* staged, const TileWork& w,
                                                    int first_row, int rows, int thread, int threads) {
  char* out = static_cast<char*>(params.out);
  for (int id = thread; id < rows * (Cfg::BN / 8); id += threads) {
    const StagedChunk c = LocateChunk<Cfg>(params.sched, w, params.out_col_block, first_row, id);
    if (c.valid)
      *reinterpret_cast<uint4*>(out + c.offset) =
          *reinterpret_cast<const uint4*>(staged + c.row * Cfg::kEpiPitchWords + 4 * c.ch);
  }
}

// Bulk copies (the async proxy, cp.async.bulk) from shared to global memory, one group per
// thread: issued, committed, then waited for until the shared memory has been read, or until
// the writes are complete.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void BulkStore(void* global, uint32_t smem_addr, int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(global), "r"(smem_addr),
               "r"(bytes) : "memory");
}
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void BulkWaitRead() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void BulkWait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// The mirror stores of a group of 3 or more (MirrorsInBulk; CopyStagedRows wrote the sums
// back and waited for every mirror's stamp): each staged row goes to every mirror in one bulk
// copy of up to BN * 2 bytes, issued by one lane of the warp that wrote the row back
// (CopyStagedRows' chunk order gives each warp whole rows: BN / 8 chunks divide 32). A bulk
// copy takes its operands in uniform registers, so one lane issues the warp's copies rather
// than each lane its own (which made ptxas spill 28-60 bytes). The lane waits once per tile,
// until the staging rows are read (or, when the tile is signalled, until the stores are
// complete), instead of the copy-out warps storing each chunk n - 1 more times after an L2
// read of its pointer. Needs out row-major (the launcher refuses several mirrors with
// out_col_block).
template <class Cfg>
__device__ __forceinline__ void MirrorStagedRows(const typename Cfg::Params& params, const uint32_t* staged,
                                                 const TileWork& w, int thread) {
  constexpr int kChunksPerRow = Cfg::BN / 8;
  constexpr int kWarpRows = 32 / kChunksPerRow;               // rows a warp copies per step
  constexpr int kStepRows = kCopyOutThreads / kChunksPerRow;  // rows all copy-out warps copy per step
  static_assert(32 % kChunksPerRow == 0 && kCopyOutThreads % 32 == 0, "a staged row must be one warp's");
  FenceProxyAsyncShared();  // this lane's write-backs before the async proxy reads them
  // Every lane's fenced write-backs before the elected lane's copies: __syncwarp orders
  // memory among the warp's lanes; shfl.sync / elect.sync are documented to converge them
  // only (the ordering held in the SASS, but by no rule).
  __syncwarp();
  const int warp = __shfl_sync(0xffffffff, thread / 32, 0);  // warp-uniform
  if (!cute::elect_one_sync()) return;
  const int col = w.n_tile * Cfg::BN;
  const int bytes = MinInt(Cfg::BN, params.sched.n - col) * 2;
  const int pitch = int(params.sched.n) * 2;  // bytes per row of out
  const int rows = w.rows;
  const int64_t first = (int64_t(w.dst_row) + warp * kWarpRows) * pitch + col * 2;
  const uint32_t src0 = static_cast<uint32_t>(__cvta_generic_to_shared(staged)) + warp * kWarpRows * Cfg::kEpiPitchWords * 4;
#pragma unroll 1
  for (int i = 0; i < params.mirror_count; ++i) {
    // CopyStagedRows waited for the stamps; one that does not match: the peers failed.
    const int32_t* slot = params.mirror_slots[i];
    int32_t stamp;
    asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(stamp) : "l"(slot + 2) : "memory");
    if (stamp != params.mirror_call) continue;
    char* dst = reinterpret_cast<char*>(__ldcg(reinterpret_cast<const unsigned long long*>(slot))) + params.mirror_offset + first;
    uint32_t src = src0;
#pragma unroll 1
    for (int row = warp * kWarpRows; row < rows; row += kStepRows) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kWarpRows; ++r) {
        if (row + r < rows) BulkStore(dst + r * pitch, src + r * Cfg::kEpiPitchWords * 4, bytes);
      }
      dst += kStepRows * pitch;
      src += kStepRows * Cfg::kEpiPitchWords * 4;
    }
  }
  BulkCommit();
  if (params.counters != nullptr) BulkWait();  // SignalGroup releases the tile: complete first
  else BulkWaitRead();                         // the staging rows go back to the consumers
}

// Overlapped epilogue, copy-out side (threads 32..127 of the producer warpgroup): for every
// tile this CTA stores, wait until the consumers staged it, copy it to global memory, signal
// its group, then hand the staging rows back.
template <class Cfg>
__device__ void CopyOutTiles(const typename Cfg::Params& params, uint32_t* epi,
                             uint4* add_ring, typename Cfg::UnitPipeline& unit_pipe, const PieceSlot* pieces,
                             cutlass::arch::ClusterBarrier* ss_full,
                             cutlass::arch::ClusterBarrier* ss_empty, int et) {
  uint32_t full_phase = 0;
  typename Cfg::UnitState unit_state;
  for (int np = 0;; ++np) {
    const PieceWork pw = NextPiece<Cfg>(unit_pipe, unit_state, pieces, et % 32);
    const Piece& piece = pw.piece;
    const TileWork& w = pw.work;
    if (et == 0) FO_STAMP(2, np, 0);
    if (piece.unit < 0) break;
    // The consumers skip these too: an idle cluster partner; a partial sum left for later.
    if (w.rows <= 0 || piece.kind == kPieceStorePartial) continue;
    // The tile is staged: all 256 consumer threads arrived, or in halves a warpgroup's 128
    // for its rows (each arrive releases its own
    // stores; this wait acquires them). mbarriers rather than named barriers shared by both
    // sides: compute-sanitizer's racecheck reported the bar.arrive / bar.sync hand-off racy,
    // and the later barrier.sync one intermittently with several tiles per CTA.
    if constexpr (Cfg::kStagedHalves) {
      // Warpgroup h's rows (tile rows 64h..), then the staging rows go to the other
      // warpgroup: warpgroup 1 of this tile, warpgroup 0 of the next one.
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        ss_full[h].wait(full_phase);
        if (et == 0 && h == 0) FO_STAMP(2, np, 1);
        CopyStagedRowsPlain<Cfg>(params, epi, w, 64 * h, 64, et, kCopyOutThreads);
        ss_empty[1 - h].arrive();  // this thread's reads of the staging rows are done (release)
      }
      full_phase ^= 1;
      if (et == 0) FO_STAMP(2, np, 2);
    } else {
      ss_full[0].wait(full_phase);
      full_phase ^= 1;
      if (et == 0) FO_STAMP(2, np, 1);
      CopyStagedRows<Cfg>(params, epi, w, 0, Cfg::BM, et, kCopyOutThreads, add_ring);
      if (MirrorsInBulk<Cfg>(params, w.group)) MirrorStagedRows<Cfg>(params, epi, w, et);
      if (et == 0) FO_STAMP(2, np, 2);
      ss_empty[0].arrive();  // this thread's reads of the staging rows are done (release)
    }
    // Signal as in the consumers' epilogue: every copy-out store precedes this barrier, the
    // releasing thread's gpu-scope fence orders them all before the counter increment.
    HandOffBarrier(kBarCopyOut, kCopyOutThreads);
    if (et == 0) SignalGroup(params, w.group);
    if (et == 0) FO_STAMP(2, np, 3);
  }
  BulkWait();  // MirrorStagedRows' stores complete before the kernel ends (no-op without)
}

}  // namespace sg
}  // namespace flashoverlap
