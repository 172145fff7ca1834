"""The cost model's picture of the signaling GEMM: a Python mirror of the launcher's choices.

The tile shape and cluster the launcher picks for a problem (xla_ffi/kernels/signaling_gemm.cu:
ChooseTileShape), the work units it cuts the output into and the waves of its persistent grid
(xla_ffi/kernels/tile_schedule.h: CountUnits, PlanSplitTail), and the launch-time switches that
change them. The group plans (plan.py, plan_a2a.py, plan_peer.py) and the tuner's model build on
these; tests/test_tile_schedule.py checks the split tail against the C++ one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

NUM_SMS = 132    # H100 / H200 SXM
# The split tail (xla_ffi/kernels/tile_schedule.h, signaling_gemm.h).
BLOCK_K = 64                                 # kGemmBlockK
SPLIT_MIN_K_TILES = 16                       # kSplitMinKTiles
SPLIT_PARTIAL_BYTES = 66 * 2 * 128 * 256 * 4  # kSplitPartialBytes
SPLIT_MAX_FLAGS = 512                        # kSplitMaxFlags


@dataclasses.dataclass(frozen=True)
class KernelGeometry:
  """Mirror of the launcher's choices (xla_ffi/kernels/signaling_gemm.cu: ChooseTileShape)."""
  block_m: int
  block_n: int
  cluster_m: int
  grid: int  # clusters

  @property
  def rows_per_unit(self) -> int:
    return self.block_m * self.cluster_m

  @property
  def max_split_slots(self) -> int:
    """Partial cluster tiles the queue workspace holds (Config::kMaxSplitSlots)."""
    per_slot = self.cluster_m * self.block_m * self.block_n * 4
    return min(SPLIT_PARTIAL_BYTES // per_slot, SPLIT_MAX_FLAGS // self.cluster_m)


# FLASHOVERLAP_GEMM_SCHEDULE (_ext.GEMM_SCHEDULE_ENV; validated at lowering): 'pingpong'
# replaces the 128x256 tiles by 128x128 ones in the same 2x1 clusters. A ping-pong CTA
# computes its two warpgroups' tiles in turn, so a unit of 256 x 128 takes half the time
# of a 256 x 256 one and the wave model below holds with block_n = 128. [N, K] weights
# (transpose_w, taken by whatever depends on the tile width) keep the cooperative tiles.
SCHEDULE_ENV = "FLASHOVERLAP_GEMM_SCHEDULE"


def kernel_geometry(m: int, n: int, comm_sms: int, transpose_w: bool = False) -> KernelGeometry:
  usable = NUM_SMS - comm_sms
  wide_tiles = math.ceil(m / 128) * math.ceil(n / 256)
  if wide_tiles >= usable:
    pingpong = os.environ.get(SCHEDULE_ENV) == "pingpong" and not transpose_w
    return KernelGeometry(128, 128 if pingpong else 256, 2, usable // 2)
  return KernelGeometry(128, 128, 1, usable)


def split_tail_enabled() -> bool:
  """The launcher's switches: the split tail needs the tile queue (FLASHOVERLAP_GEMM_QUEUE
  not 'static') and FLASHOVERLAP_GEMM_TAIL not 'whole'."""
  return (os.environ.get("FLASHOVERLAP_GEMM_TAIL") != "whole"
          and os.environ.get("FLASHOVERLAP_GEMM_QUEUE") != "static")


def kernel_switches() -> tuple:
  """The launcher switches the model mirrors (tile shape, split tail): what a cached plan
  depends on besides its arguments."""
  return (split_tail_enabled(), os.environ.get(SCHEDULE_ENV) == "pingpong")


def cached_per_kernel_switches(fn):
  """functools.lru_cache over fn's arguments and kernel_switches(), read at each call: a
  switch changed in the process (tests, benchmarks) never returns a plan made for the other
  kernel."""
  cached = functools.lru_cache(maxsize=512)(lambda switches, *args, **kwargs: fn(*args, **kwargs))

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    return cached(kernel_switches(), *args, **kwargs)
  return wrapper


def split_tail(units: int, clusters: int, k_tiles: int, max_slots: int) -> tuple:
  """Mirror of the launcher's PlanSplitTail (tile_schedule.h): (split units, chunks, K tiles
  per chunk), or (0, 0, 0) when the last two waves stay whole units."""
  c, u = clusters, units
  if c < 2 or u <= c or k_tiles < SPLIT_MIN_K_TILES:
    return (0, 0, 0)
  r = u % c
  if r == 0 or 10 * r > 7 * c:
    return (0, 0, 0)
  total = (c + r) * k_tiles
  length = -(-total // c)
  chunks = -(-total // length)
  if chunks - 1 > max_slots:
    return (0, 0, 0)
  return (c + r, chunks, length)


def gemm_units(m: int, n: int, comm_sms: int, blocks: int = 1, transpose_w: bool = False) -> int:
  """Work units the kernel runs (tile_schedule.h CountUnits): each of `blocks` rank blocks
  (reduce-scatter: the world size) of m / blocks rows is cut into cluster rows on its own, so
  a block whose rows are not a multiple of the unit rows ends in a partial unit of its own."""
  kern = kernel_geometry(m, n, comm_sms, transpose_w)
  return blocks * math.ceil(m // blocks / kern.rows_per_unit) * math.ceil(n / kern.block_n)


def gemm_waves(m: int, n: int, comm_sms: int, k: int | None = None, blocks: int = 1,
               transpose_w: bool = False) -> float:
  """Waves of the persistent grid over the whole GEMM (the kernel's work units, gemm_units:
  `blocks` rank blocks), in unit times. Given the per-device K, the split tail counts: the
  last two waves take (clusters + R) / clusters unit times instead of 2 (e.g. 8192 x 8192 on
  124 SMs: 16.5, not 17); k None: whole units (an int)."""
  kern = kernel_geometry(m, n, comm_sms, transpose_w)
  units = gemm_units(m, n, comm_sms, blocks, transpose_w)
  whole = math.ceil(units / kern.grid)
  if k is None or not split_tail_enabled():
    return whole
  k_tiles = math.ceil(k / BLOCK_K)
  split, _, length = split_tail(units, kern.grid, k_tiles, kern.max_split_slots)
  if not split:
    return whole
  return (units - split) / kern.grid + length / k_tiles


def wave_aligned_comm_sms(m: int, n: int, comm_sms: int, limit: int, k: int | None = None,
                          blocks: int = 1, transpose_w: bool = False) -> int:
  """The most SMs, up to `limit`, that can be left to NCCL without costing the GEMM anything
  more than `comm_sms` does: same tile shape, same waves of its persistent grid (gemm_waves;
  with k, the split tail's fractional waves, which rarely stay equal: where the kernel splits
  its tail, SMs are no longer free). Why: a partial last wave of whole units leaves SMs idle,
  which are then free for the collective; e.g. at 4096 x 8192 (512 cluster units) with whole
  units 8 to 18 SMs left all take 9 waves (`bench gemm` on one H200, d3c65a9: 0.864 vs 0.861
  of XLA at 8 vs 16). blocks: the rank blocks of the group layout (gemm_units)."""
  kern = kernel_geometry(m, n, comm_sms, transpose_w)
  waves = gemm_waves(m, n, comm_sms, k, blocks, transpose_w)
  best = comm_sms
  for c in range(comm_sms + 1, min(limit, NUM_SMS - 2) + 1):
    other = kernel_geometry(m, n, c, transpose_w)
    if (other.block_m, other.block_n, other.cluster_m) != (kern.block_m, kern.block_n,
        kern.cluster_m) or gemm_waves(m, n, c, k, blocks, transpose_w) > waves:
      break
    best = c
  return best


def raised_comm_sms_candidates(m: int, n: int, candidates, limit: int, k: int | None = None,
                               blocks: int = 1, transpose_w: bool = False) -> list:
  """`candidates` and each raised to its wave boundary (at most `limit`, never below itself):
  the comm_sms values a cost model compares for a GEMM of m x n (x k: the split tail; in
  `blocks` rank blocks). Both are kept, since the raised one is not always better (fewer
  clusters finish the early groups later)."""
  return sorted({s for c in candidates
                 for s in (c, wave_aligned_comm_sms(m, n, c, max(c, limit), k, blocks,
                                                    transpose_w))})


def cut_step(m: int, n: int, comm_sms: int) -> int:
  """Rows of one work unit: group boundaries lie on multiples of it."""
  return kernel_geometry(m, n, comm_sms).rows_per_unit
