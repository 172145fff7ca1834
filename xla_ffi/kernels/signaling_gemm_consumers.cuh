// The signaling GEMM's consumer warpgroups (sm_90a): the mainloop's wgmmas, the split
// tail's partial sums, and each tile's store and signal, in the two schedules of
// ConsumerSchedule (signaling_gemm_config.cuh). Included by signaling_gemm_kernel.cuh.
#pragma once

#include "signaling_gemm_config.cuh"
#include "signaling_gemm_epilogue.cuh"

namespace flashoverlap {
namespace sg {

using namespace cute;

// Cooperative: both consumer warpgroups (threads 128..383) compute each tile together, 64
// rows each, then store it (sync) or stage it for the copy-out warps (overlapped epilogue).
template <class Cfg>
__device__ void CooperativeConsumer(const typename Cfg::Params& params,
                                    typename Cfg::SharedStorage& ss, typename Cfg::Pipeline& pipeline,
                                    typename Cfg::UnitPipeline& unit_pipe, int rank_m, int thread_idx) {
  constexpr int BN = Cfg::BN;
  const int M = params.sched.m, N = params.sched.n;
  const int lane = thread_idx % 32;
  typename Cfg::Mainloop mainloop;
  // Same numbering as CUTLASS's cooperative kernel: mma warpgroup = (thread % 256) / 128.
  const int mma_thread = thread_idx % 256;
  const int mwg = mma_thread / 128;            // rows [64*mwg, 64*mwg+64) of the tile
  const int wg_thread = mma_thread % 128;
  const int mwarp = wg_thread / 32;
  uint32_t* epi = ss.epi + mwg * Cfg::kEpiRows * Cfg::kEpiPitchWords;
  char* out = static_cast<char*>(params.out);
  typename Cfg::TiledMma tiled_mma;
  typename Cfg::PipelineState read_state;

  typename Cfg::UnitState unit_state;
  uint32_t empty_phase = 0;
  // Overlapped epilogue: this warpgroup staged a tile before (its rows, or in halves the
  // other's after them, not yet read out: wait before staging again).
  bool staged_before = false;
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

    if constexpr (Cfg::kStagedHalves) {
      // This warpgroup's 64 rows into the staging rows once they are its (warpgroup 1: the
      // copy-out warps read warpgroup 0's rows of this tile out; warpgroup 0: warpgroup 1's of
      // the previous tile), then on to the next tile.
#ifndef FO_TEST_PLANT_RACE  // defined only by the sanitizer's negative-control test build
      if (mwg == 1 || staged_before) {
        ss.staging_empty[mwg].wait(empty_phase);
        empty_phase ^= 1;
      }
#endif
      staged_before = true;
      StageWarpRows<Cfg>(ss.epi + 16 * mwarp * Cfg::kEpiPitchWords, accum, 0, lane);
      ss.staging_full[mwg].arrive();  // this thread's part is staged (release)
      if (thread_idx == 128) FO_STAMP(0, np, 4);
      continue;
    } else if constexpr (Cfg::kOverlapEpilogue) {
      // Whole tile into smem (rows 64*mwg + 16*warp + 8*half + lane/4), then on to the
      // next tile: the copy-out warps store and signal it meanwhile. First wait until they
      // have read the previous one out of the staging rows.
#ifndef FO_TEST_PLANT_RACE  // defined only by the sanitizer's negative-control test build
      if (staged_before) {
        ss.staging_empty[0].wait(empty_phase);
        empty_phase ^= 1;
      }
#endif
      staged_before = true;
      StageWarpRows<Cfg>(ss.epi + (64 * mwg + 16 * mwarp) * Cfg::kEpiPitchWords, accum, 0, lane);
      ss.staging_full[0].arrive();  // this thread's part is staged (release)
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
    if (mma_thread == 0) SignalGroup(params, w.group);
  }
}

// Ping-pong: consumer warpgroup wg (0 or 1, threads 128 + 128 * wg ..) computes the CTA's
// pieces wg, wg + 2, wg + 4, ... as whole tiles of its own, and skips the other's stages in
// the mainloop pipeline. Their mainloops take turns on the tensor cores (mma_turn: a
// warpgroup starts its tile's wgmmas once the other has issued all of its own), so each
// warpgroup's tail, store and signal run while the other computes. Each warpgroup stages
// through its own 64 rows of smem, so both may store at once.
template <class Cfg>
__device__ void PingPongConsumer(const typename Cfg::Params& params,
                                 typename Cfg::SharedStorage& ss, typename Cfg::Pipeline& pipeline,
                                 typename Cfg::UnitPipeline& unit_pipe, int rank_m, int thread_idx) {
  static_assert(Cfg::kPingPong && Cfg::kMmaThreads == 128, "one warpgroup per tile");
  const int wg = thread_idx / 128 - 1;
  const int wg_thread = thread_idx % 128, warp = wg_thread / 32, lane = wg_thread % 32;
  const int barrier = kBarWarpGroup0 + wg;
  uint32_t* epi = ss.epi + wg * Cfg::kEpiRows * Cfg::kEpiPitchWords;
  typename Cfg::Mainloop mainloop;
  typename Cfg::TiledMma tiled_mma;
  typename Cfg::PipelineState read_state;
  typename Cfg::UnitState unit_state;
  uint32_t turn_phase = 0;
  for (int np = 0;; ++np) {
    const PieceWork pw = NextPiece<Cfg>(unit_pipe, unit_state, ss.pieces, lane);
    const Piece& piece = pw.piece;
    const TileWork& w = pw.work;
    if (piece.unit < 0) break;
    if ((np & 1) != wg) {  // the other warpgroup's piece: its stages are not ours
      read_state.advance(piece.k_count);
      continue;
    }
    auto accum = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
    // The fragment is the TiledMma's 64-row tile twice: values [0, BN/2) rows 0..63, then
    // [BN/2, BN) rows 64..127 (the staging below relies on it).
    static_assert(decltype(size<1>(accum))::value == 2 && decltype(size<2>(accum))::value == 1 &&
                      decltype(size<0>(accum))::value == Cfg::BN / 2,
                  "unexpected ping-pong accumulator fragment");
    if (wg_thread == 0) FO_STAMP(2 * wg, np, 0);
    if (np > 0) {  // piece np - 1 (the other warpgroup's) has issued its wgmmas
      ss.mma_turn[wg].wait(turn_phase);
      turn_phase ^= 1;
    }
    if (wg_thread == 0) FO_STAMP(2 * wg, np, 1);
    mainloop.mma(pipeline, read_state, accum, piece.k_count, wg_thread, ss.mainloop,
                 params.mainloop);
    ss.mma_turn[wg ^ 1].arrive();
    if (wg_thread == 0) FO_STAMP(2 * wg, np, 2);
    mainloop.mma_tail(pipeline, read_state, piece.k_count);
    read_state.advance(piece.k_count);
    if (wg_thread == 0) FO_STAMP(2 * wg, np, 3);
    if (w.rows <= 0) continue;  // idle cluster partner past the band end: CTA-uniform
    if (piece.kind == kPieceStorePartial) {  // split tail: the unit is finished elsewhere
      StorePartial<Cfg>(params, accum, piece.slot, rank_m, wg_thread, barrier);
      continue;
    }
    if (piece.kind == kPieceAddPartial) AddPartial<Cfg>(params, accum, piece.slot, rank_m, wg_thread);
    CUTLASS_PRAGMA_UNROLL
    for (int half = 0; half < 2; ++half) {
      StageWarpRows<Cfg>(epi + 16 * warp * Cfg::kEpiPitchWords, accum, half * (Cfg::BN / 2), lane);
      NamedBarrierSync(barrier, 128);
      CopyStagedRows<Cfg>(params, epi, w, 64 * half, 64, wg_thread, 128, /*add_ring=*/nullptr);
#ifndef FO_TEST_PLANT_RACE  // defined only by the sanitizer's negative-control test build
      // WAR on the staging rows; after the second half, every store of the tile precedes it.
      NamedBarrierSync(barrier, 128);
#endif
    }
    // Signal: the barrier above ordered the warpgroup's stores before this thread's
    // gpu-scope fence, which orders them (cumulatively) before the counter increment.
    if (wg_thread == 0) SignalGroup(params, w.group);
    if (wg_thread == 0) FO_STAMP(2 * wg, np, 4);
  }
}

}  // namespace sg
}  // namespace flashoverlap
