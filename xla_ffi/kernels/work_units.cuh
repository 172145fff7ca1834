// The signaling GEMM's work units: which one a CTA takes next (round robin, or the dynamic
// tile queue of signaling_gemm.h), and how the producer warp hands each to the CTA's other
// warps. Device code only; included by signaling_gemm_kernel.cuh.
#pragma once

#include <cstdint>

#include "cutlass/pipeline/pipeline.hpp"

#include "signaling_gemm.h"

namespace flashoverlap {
namespace sg {

// ---- work units: which one a CTA takes next ------------------------------------------------

constexpr unsigned kNoUnit = 0xFFFFFFFFu;

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

  __device__ unsigned Claim() {
    const unsigned u = atomicAdd(p.queue_next, 1u);
    return u < unsigned(p.sched.num_units) ? u : kNoUnit;
  }
  __device__ unsigned long long* Slot(int seq) const {
    return p.queue_ring + size_t(cluster_id) * kQueueRingSlots + seq % kQueueRingSlots;
  }
  static __device__ unsigned long long Tag(int seq) {
    return static_cast<unsigned long long>(seq + 1) << 32;
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

  // The seq-th unit (seq = 0, 1, ... in turn), -1 when none is left.
  __device__ int Next(int seq) {
    if (p.queue_next == nullptr) {
      const long long u = cluster_id + static_cast<long long>(seq) * p.num_clusters;
      return u < p.sched.num_units ? int(u) : -1;
    }
    unsigned id;
    if (leader) {
      if (seq == 0) {
        current = Claim();
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
      current = pending;
      if (Cfg::CM > 1) Publish(seq + 1, current);
    } else {
      peek = Read(seq + 1);
    }
  }
};

// Producer warp: the seq-th unit, handed to the CTA's other warps too (-1: done).
template <class Cfg>
__device__ int ClaimAndPublishUnit(UnitClaims<Cfg>& claims, typename Cfg::UnitPipeline& pipe,
                                   typename Cfg::UnitState& state, int* ids, int seq, int lane) {
  int unit = 0;
  if (lane == 0) {
    unit = claims.Next(seq);
    pipe.producer_acquire(state);
    asm volatile("" ::: "memory");
    *reinterpret_cast<volatile int*>(ids + state.index()) = unit;
    asm volatile("" ::: "memory");
    pipe.producer_commit(state);
  }
  ++state;
  return __shfl_sync(0xffffffffu, unit, 0);
}

// Any other warp: the next unit the producer handed out (-1: done). One lane waits and
// releases the slot (the pipeline counts warps), the warp shares the id.
template <class Cfg>
__device__ int NextUnit(typename Cfg::UnitPipeline& pipe, typename Cfg::UnitState& state,
                        const int* ids, int lane) {
  int unit = 0;
  if (lane == 0) {
    pipe.consumer_wait(state);
    asm volatile("" ::: "memory");
    unit = *reinterpret_cast<const volatile int*>(ids + state.index());
    asm volatile("" ::: "memory");
    pipe.consumer_release(state);
  }
  ++state;
  return __shfl_sync(0xffffffffu, unit, 0);
}

}  // namespace sg
}  // namespace flashoverlap
