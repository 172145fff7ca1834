// The signaling GEMM's work units: which one a CTA takes next (round robin, or the dynamic
// tile queue of signaling_gemm.h), how the producer warp hands each piece of work to the
// CTA's other warps, and the split tail's partial tiles. Device code only; included by
// signaling_gemm_kernel.cuh.
#pragma once

#include <cstdint>

#include "cutlass/pipeline/pipeline.hpp"

#include "signaling_gemm.h"
#include "tile_schedule.h"

namespace flashoverlap {
namespace sg {

// ---- work units: which one a CTA takes next ------------------------------------------------

constexpr unsigned kNoUnit = 0xFFFFFFFFu;
constexpr unsigned kNoClaimLimit = 0xFFFFFFFFu;  // Params::claim_limit of the main launch

// Which units a CTA works on, decided by lane 0 of its producer warp: round robin without a
// queue; with it, the cluster's leader CTA claims units from the counter and publishes them in
// the cluster's ring, where the partner CTA reads them, so both CTAs of a cluster work on the
// same units. No wait sits between two units' loads: the leader issues the claim for the next
// unit before it loads the current one and publishes it after (the atomic's result is first
// used then); the partner reads the coming entry after loading (relaxed: the id is the only
// data handed over) and polls only if it was not there yet. Claims stay in the order units
// are processed, so a wave still covers the schedule's compact L2 panel.
template <class Cfg>
struct UnitClaims {
  const typename Cfg::Params& p;
  int cluster_id;
  bool leader;
  unsigned current = 0, pending = 0;  // leader: the claims for seq and seq + 1
  unsigned long long peek = 0;        // partner: an early read of entry seq

  __device__ UnitClaims(const typename Cfg::Params& params, int cluster, uint32_t rank)
      : p(params), cluster_id(cluster), leader(rank == 0) {}

  // The raw counter value; Checked() is applied where the claim is first used, so issuing a
  // claim never waits for the atomic's result. An increment that never wraps (atom.inc with
  // a bound the counter cannot reach, 2^30 plus a runtime value), not an add: ptxas turns an
  // atomic add (and an inc with a constant all-ones bound) into a warp-aggregated sequence
  // whose shuffle of the result made every claim wait ~700 cycles for the atomic.
  __device__ unsigned Claim() {
    if (p.claim_limit != kNoClaimLimit) return ClaimBelow(p.claim_limit);
    unsigned u;
    const unsigned bound = (1u << 30) + unsigned(p.sched.num_items);
    asm volatile("atom.relaxed.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(u) : "l"(p.queue_next), "r"(bound) : "memory");
    return u;
  }
  // A helper's claim: the counter's next value if it is below `limit` (compare-and-swap, so
  // a helper never takes a unit past its group: the collective after it waits for the helper
  // to exit), else kNoUnit. Each claim is counted in queue_next[1] (statistics).
  __device__ unsigned ClaimBelow(unsigned limit) {
    unsigned cur;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(cur) : "l"(p.queue_next) : "memory");
    while (cur < limit) {
      const unsigned prev = atomicCAS(p.queue_next, cur, cur + 1);
      if (prev == cur) {
        atomicAdd(p.queue_next + 1, 1u);
        return cur;
      }
      cur = prev;
    }
    return kNoUnit;
  }
  __device__ unsigned Checked(unsigned u) const {
    return u < unsigned(p.sched.num_items) ? u : kNoUnit;
  }
  __device__ unsigned long long* Slot(int seq) const {
    return p.queue_ring + size_t(p.ring_base + cluster_id) * kQueueRingSlots + seq % kQueueRingSlots;
  }
  // seq + 1 in the tag's low 25 bits and the launch's epoch (< 2^7) above them (a helper
  // launch has fewer than 2^25 units, the launcher checks; the main launch's epoch is 0 and
  // its rings its own, so its seq may use all 32 bits).
  __device__ unsigned long long Tag(int seq) const {
    return (static_cast<unsigned long long>(p.ring_epoch) << 57) +
           (static_cast<unsigned long long>(seq + 1) << 32);
  }
  // The slot's previous entry (seq - kQueueRingSlots) was read long ago: the multicast
  // pipeline keeps the two CTAs within kStages units of each other (static_assert in Config).
  __device__ void Publish(int seq, unsigned id) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(Slot(seq)), "l"(Tag(seq) | id) : "memory");
  }
  __device__ unsigned long long Read(int seq) const {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(Slot(seq)) : "memory");
    return v;
  }

  // The seq-th item (seq = 0, 1, ... in turn; a unit, or a split tail chunk), -1 when none
  // is left.
  __device__ int Next(int seq) {
    if (p.queue_next == nullptr) {
      const long long u = cluster_id + static_cast<long long>(seq) * p.num_clusters;
      return u < p.sched.num_items ? int(u) : -1;
    }
    unsigned id;
    if (leader) {
      if (seq == 0) {
        current = Checked(Claim());
        if (Cfg::CM > 1) Publish(0, current);
      }
      id = current;
      if (id != kNoUnit) pending = Claim();  // its result is first used in Loaded()
    } else {
      unsigned long long v = peek;
      while ((v & 0xFFFFFFFF00000000ull) != Tag(seq)) {
        __nanosleep(64);
        v = Read(seq);
      }
      id = unsigned(v & 0xFFFFFFFFull);
    }
    return id == kNoUnit ? -1 : int(id);
  }

  // After the seq-th unit's loads were issued: hand out / look for the next one.
  __device__ void Loaded(int seq) {
    if (p.queue_next == nullptr) return;
    if (leader) {
      current = Checked(pending);
      if (Cfg::CM > 1) Publish(seq + 1, current);
    } else {
      peek = Read(seq + 1);
    }
  }
};

// Producer warp: the seq-th item's claim, shared by the warp (-1: none left).
template <class Cfg>
__device__ int ClaimItem(UnitClaims<Cfg>& claims, int seq, int lane) {
  int item = 0;
  if (lane == 0) item = claims.Next(seq);
  return __shfl_sync(0xffffffffu, item, 0);
}

// A piece of work and the tile it computes, as the producer hands it out: the producer
// decodes the unit once (DecodeUnit reads the schedule from kernel parameters with dynamic
// indices; on the consumers it sat between two tiles' wgmmas).
struct PieceWork {
  Piece piece;
  TileWork work;
};
struct alignas(16) PieceSlot {
  int v[8];  // unit, k_begin, k_count, kind | slot << 2, group, n_tile, dst_row, rows
};

// Producer warp: hands one piece (unit -1: done) to the CTA's other warps.
template <class Cfg>
__device__ void PublishPiece(typename Cfg::UnitPipeline& pipe, typename Cfg::UnitState& state,
                             PieceSlot* slots, const Piece& piece, const TileWork& work, int lane) {
  if (lane == 0) {
    pipe.producer_acquire(state);
    asm volatile("" ::: "memory");
    volatile int* v = slots[state.index()].v;
    v[0] = piece.unit, v[1] = piece.k_begin, v[2] = piece.k_count, v[3] = piece.kind | piece.slot << 2;
    v[4] = work.group, v[5] = work.n_tile, v[6] = work.dst_row, v[7] = work.rows;
    asm volatile("" ::: "memory");
    pipe.producer_commit(state);
  }
  ++state;
}

// Any other warp: the next piece the producer handed out (unit -1: done). One lane waits and
// releases the slot (the pipeline counts warps), the warp shares what it read.
template <class Cfg>
__device__ PieceWork NextPiece(typename Cfg::UnitPipeline& pipe, typename Cfg::UnitState& state,
                               const PieceSlot* slots, int lane) {
  int v[8] = {0};
  if (lane == 0) {
    pipe.consumer_wait(state);
    asm volatile("" ::: "memory");
    const volatile int* slot = slots[state.index()].v;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 8; ++i) v[i] = slot[i];
    asm volatile("" ::: "memory");
    pipe.consumer_release(state);
  }
  ++state;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 8; ++i) v[i] = __shfl_sync(0xffffffffu, v[i], 0);
  // (src_row stays with the producer: only its TMA loads need it)
  return PieceWork{Piece{v[0], v[1], v[2], v[3] & 3, v[3] >> 2}, TileWork{v[4], v[5], -1, v[6], v[7]}};
}

// ---- split tail: partial tiles between two chunks ------------------------------------------

// Accumulators per consumer thread, in float4s.
template <class Cfg>
constexpr int kPartialFloat4s = Cfg::BM * Cfg::BN / (4 * Cfg::kMmaThreads);

// The Cfg::kMmaThreads threads that hold the tile (both consumer warpgroups, or one in the
// ping-pong; `mma_thread` is the thread's index among them) leave their accumulators in
// partial slot `slot` (layout: float4 j of thread t at [j * kMmaThreads + t], so a warp
// writes 512 contiguous bytes per j), then one thread publishes the slot's flag. Same release
// pattern as the group counters: every thread's stores precede the barrier, the releasing
// thread's gpu-scope fence orders them all before the flag.
template <class Cfg, class Accum>
__device__ void StorePartial(const typename Cfg::Params& p, const Accum& accum, int slot,
                             int rank_m, int mma_thread, int barrier_id) {
  float4* dst = reinterpret_cast<float4*>(p.partials) +
                size_t(slot * Cfg::CM + rank_m) * (Cfg::BM * Cfg::BN / 4);
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kPartialFloat4s<Cfg>; ++j) {
    __stcg(dst + j * Cfg::kMmaThreads + mma_thread,
           make_float4(accum(4 * j), accum(4 * j + 1), accum(4 * j + 2), accum(4 * j + 3)));
  }
  asm volatile("bar.sync %0, %1;" ::"r"(barrier_id), "r"(Cfg::kMmaThreads) : "memory");
  if (mma_thread == 0) {
    __threadfence();
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p.split_flags + slot * Cfg::CM + rank_m),
                 "r"(1) : "memory");
  }
}

// The other side: every thread waits for the flag itself (acquire: then its own loads see
// the partial; no barrier, so no warp reaches one while its lane 0 still spins) and adds
// its own part of the partial (L2 loads: the data came from another SM).
template <class Cfg, class Accum>
__device__ void AddPartial(const typename Cfg::Params& p, Accum& accum, int slot, int rank_m,
                           int mma_thread) {
  const int32_t* flag = p.split_flags + slot * Cfg::CM + rank_m;
  int32_t seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(flag) : "memory");
    if (seen != 0) break;
    __nanosleep(64);
  }
  const float4* src = reinterpret_cast<const float4*>(p.partials) +
                      size_t(slot * Cfg::CM + rank_m) * (Cfg::BM * Cfg::BN / 4);
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kPartialFloat4s<Cfg>; ++j) {
    const float4 v = __ldcg(src + j * Cfg::kMmaThreads + mma_thread);
    accum(4 * j) += v.x;
    accum(4 * j + 1) += v.y;
    accum(4 * j + 2) += v.z;
    accum(4 * j + 3) += v.w;
  }
}

}  // namespace sg
}  // namespace flashoverlap
