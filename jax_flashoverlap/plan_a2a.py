"""Plans of the all-to-all and all-gather ops (issue #9): deterministic, identical on every rank.

GEMM + all-to-all (`matmul_all_to_all`): y = x @ w is n blocks of R x C (split_axis 0: row
blocks, R = M/n, C = N; split_axis 1: column blocks, R = M, C = N/n). `band_rows` cut R into
groups; group g is band g of every block, and once it is computed it is exchanged by one
grouped ncclSend/ncclRecv batch (xla_ffi/comm/gemm_all_to_all_call.cc). Cost model, as plan.py's:

    gemm_end[g] = waves until group g's last work unit * unit time * interference
    comm_end[g] = max(gemm_end[g], comm_end[g-1]) + latency + (n-1) * bytes(part) / a2a_bw

minimized by dynamic programming over cluster-row cuts of R.

All-gather + GEMM (`all_gather_matmul`): x's n row blocks of R rows arrive one step at a time
(`chunks` transfers per block, each announced by a flag); the GEMM computes the local block
first, then each block once it has arrived. The plan picks `chunks` and `comm_sms` (>= 1).

Bandwidths are first guesses for 2 x H200. Measured on 2 x H200 (benchmarks/results/
a2a_h200x2.json): the all-to-all plans the model chose won (1.04-1.05x) and it fell back
elsewhere (0.99-1.01x); the all-gather plans won with GEMMs of ~3 ms (1.16-1.19x) but lost
with GEMMs under 1 ms (0.76-0.78x: the transfers did not hide behind the local block, which
the model does not explain), hence `min_all_gather_gemm_s`. Where no gain over XLA's dot +
collective is predicted the op lowers to XLA's own composition (same switches as the other ops).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

from jax_flashoverlap import plan as plan_lib, tile_schedule

MAX_GROUPS = 64


@dataclasses.dataclass(frozen=True)
class CommProfile:
  """Calibration (guesses until measured; GEMM figures are plan.py's)."""
  sm_flops: float = plan_lib.DEFAULT_PROFILE.sm_flops
  interference: float = plan_lib.DEFAULT_PROFILE.interference
  comm_latency: float = plan_lib.DEFAULT_PROFILE.comm_latency
  # Bytes each rank sends per second in our capped send/recv batches, by CTA cap.
  p2p_bw: tuple = ((8, 120e9), (16, 200e9))
  xla_all_to_all_bw: float = 200e9   # XLA's all-to-all, bytes sent per rank per second
  xla_all_gather_bw: float = 200e9   # XLA's all-gather, bytes received per rank per second
  copy_bandwidth: float = 1.5e12     # 2-D copies of concat_axis=1 (copy engine)
  comm_sms: int | None = None
  comm_sms_candidates: tuple = (8, 16)
  chunk_candidates: tuple = (1, 2, 4)
  min_gain: float = 0.03
  # All-gather + GEMM overlaps only when the (modelled) GEMM takes at least this long: on
  # 2 x H200 it lost at 0.4 and 0.8 ms and won at 2.8 and 3.3 ms (module docstring).
  min_all_gather_gemm_s: float = 1.5e-3
  # The collective gather (one ncclAllGather over a registered window, CTA policy ZERO: copy
  # engines, the GEMM keeps all but `ce_comm_sms` SMs): bytes received per rank per second
  # (DESIGN.md: 0.26 ms for a 128 MB all-gather on 2 x H200). Off in the default plans until
  # measured inside the op on 2 GPUs; tuned configs and forced(gather=...) can choose it.
  collective_gather: bool = False
  ce_all_gather_bw: float = 246e9
  ce_comm_sms: tuple = (2,)


DEFAULT_PROFILE = CommProfile()


@dataclasses.dataclass(frozen=True)
class AllToAllPlan:
  rows_per_block: int    # R
  band_rows: tuple       # 0 = b_0 < ... < b_G = R
  comm_sms: int
  overlap: bool = True
  predicted_s: float = 0.0
  baseline_s: float = 0.0

  @property
  def num_groups(self) -> int:
    return len(self.band_rows) - 1


GATHERS = ("p2p", "collective")


@dataclasses.dataclass(frozen=True)
class AllGatherPlan:
  chunks: int            # transfers (and flags) per row block
  comm_sms: int          # >= 1: NCCL runs while the GEMM waits for it
  overlap: bool = True
  predicted_s: float = 0.0
  baseline_s: float = 0.0
  # p2p: chunked ncclSend/ncclRecv; collective: one ncclAllGather over a registered window on
  # a CTA-policy-ZERO communicator (chunks 1; xla_ffi/comm/all_gather_gemm_call.cc)
  gather: str = "p2p"


def _kernel(m: int, n: int, comm_sms: int, transpose_w: bool = False):
  """(rows per work unit, block_n, clusters) as signaling_gemm.cu's ChooseTileShape (the
  collectives' model's mirror of it, tile_schedule.kernel_geometry; transpose_w: w is
  [N, K])."""
  kern = tile_schedule.kernel_geometry(m, n, comm_sms, transpose_w)
  return kern.rows_per_unit, kern.block_n, kern.grid


def _busbw(table: tuple, ctas: int) -> float:
  points = sorted(table)
  if ctas <= points[0][0]:
    return points[0][1] * max(ctas, 1) / points[0][0]
  for (c0, b0), (c1, b1) in zip(points, points[1:]):
    if ctas <= c1:
      return b0 + (b1 - b0) * (ctas - c0) / (c1 - c0)
  return points[-1][1]


def _unit_time(k: int, rows_per_unit: int, block_n: int, p: CommProfile) -> float:
  # A unit is rows_per_unit x block_n of output on rows_per_unit / 128 SMs.
  return 2.0 * 128 * block_n * k / p.sm_flops * p.interference


def a2a_shape(m: int, n: int, world: int, split_axis: int) -> tuple:
  """(blocks, R, C): GEMM blocks of the group layout, rows and columns of one a2a block."""
  if split_axis == 0:
    return world, m // world, n
  return 1, m, n // world


def a2a_baseline(m, n, k, world, itemsize=2, p: CommProfile = DEFAULT_PROFILE) -> float:
  gemm = 2.0 * m * n * k / (p.sm_flops * tile_schedule.NUM_SMS)
  return gemm + p.comm_latency + m * n * itemsize * (world - 1) / world / p.xla_all_to_all_bw


def a2a_plan_time(m, n, k, world, split_axis, concat_axis, band_rows, comm_sms, itemsize=2,
                  p: CommProfile = DEFAULT_PROFILE, transpose_w: bool = False) -> float:
  blocks, _, cols = a2a_shape(m, n, world, split_axis)
  step, block_n, grid = _kernel(m, n, comm_sms, transpose_w)
  unit = _unit_time(k, step, block_n, p)
  n_tiles = math.ceil(n / block_n)
  bw = _busbw(p.p2p_bw, comm_sms)
  units = 0
  comm_end = 0.0
  for b0, b1 in zip(band_rows, band_rows[1:]):
    units += blocks * math.ceil((b1 - b0) / step) * n_tiles
    gemm_end = math.ceil(units / grid) * unit
    comm_end = max(gemm_end, comm_end) + p.comm_latency + (
        (world - 1) * (b1 - b0) * cols * itemsize / bw)
  if concat_axis == 1:  # the last group's 2-D copies are exposed
    comm_end += _copy_tail(world, cols, itemsize, p)(*band_rows[-2:])
  return comm_end


def _copy_tail(world, cols, itemsize, p):
  """(r0, r1) -> the last group's 2-D copies with concat_axis=1, which nothing hides."""
  return lambda r0, r1: world * (r1 - r0) * cols * itemsize / p.copy_bandwidth


def _best_a2a(m, n, k, world, split_axis, concat_axis, itemsize, p, comm_sms,
              transpose_w=False) -> AllToAllPlan:
  blocks, rows, cols = a2a_shape(m, n, world, split_axis)
  step, block_n, grid = _kernel(m, n, comm_sms, transpose_w)
  unit = _unit_time(k, step, block_n, p)
  n_tiles = math.ceil(n / block_n)
  bw = _busbw(p.p2p_bw, comm_sms)
  band_rows = plan_lib.best_cuts(
      rows, step, lambda r: math.ceil(blocks * math.ceil(r / step) * n_tiles / grid) * unit,
      lambda r0, r1: p.comm_latency + (world - 1) * (r1 - r0) * cols * itemsize / bw,
      tail=_copy_tail(world, cols, itemsize, p) if concat_axis == 1 else None)
  predicted = a2a_plan_time(m, n, k, world, split_axis, concat_axis, band_rows, comm_sms,
                            itemsize, p, transpose_w)
  baseline = a2a_baseline(m, n, k, world, itemsize, p)
  return AllToAllPlan(rows, band_rows, comm_sms, predicted < baseline * (1 - p.min_gain),
                      predicted, baseline)


def a2a_supported(m: int, n: int, world: int, split_axis: int, k: int = 0) -> str | None:
  """None when our kernels can run this shape, else why not (then XLA's composition runs)."""
  if world < 2:
    return "one rank: nothing to exchange"
  if split_axis == 0 and m % world:
    return f"M={m} is not divisible by the axis size {world}"
  if split_axis == 1 and n % (8 * world):
    return f"N={n} is not a multiple of 8 * axis size ({8 * world}): column blocks need 16-byte rows"
  if max(m, n, k) >= plan_lib.KERNEL_MAX_DIM:
    return "M, N or K >= 2^30 (the signaling GEMM's limit)"
  return None


def _comm_sms_candidates(m: int, n: int, p: CommProfile, k: int | None = None,
                         blocks: int = 1, transpose_w: bool = False) -> list:
  """The profile's comm_sms, else its candidates and each raised to the most SMs that cost the
  GEMM no extra wave, within the calibrated CTA counts (tile_schedule.wave_aligned_comm_sms;
  blocks: the group layout's rank blocks, a2a_shape)."""
  if p.comm_sms is not None:
    return [p.comm_sms]
  return tile_schedule.raised_comm_sms_candidates(m, n, p.comm_sms_candidates,
                                                  max(c for c, _ in p.p2p_bw), k, blocks,
                                                  transpose_w)


@tile_schedule.cached_per_kernel_switches
def default_a2a_plan(m, n, k, world, split_axis, concat_axis, itemsize=2,
                     profile: CommProfile = DEFAULT_PROFILE, transpose_w=False) -> AllToAllPlan:
  plans = [_best_a2a(m, n, k, world, split_axis, concat_axis, itemsize, profile, c, transpose_w)
           for c in _comm_sms_candidates(m, n, profile, k,
                                         a2a_shape(m, n, world, split_axis)[0], transpose_w)]
  return min(plans, key=lambda q: q.predicted_s)


# --- all-gather + GEMM --------------------------------------------------------------------


def _all_gather_gemm_time(rows, n, k, world, p: CommProfile) -> float:
  return 2.0 * world * rows * n * k / (p.sm_flops * tile_schedule.NUM_SMS)


def all_gather_baseline(rows, n, k, world, itemsize=2, p: CommProfile = DEFAULT_PROFILE) -> float:
  gemm = _all_gather_gemm_time(rows, n, k, world, p)
  return gemm + p.comm_latency + (world - 1) * rows * k * itemsize / p.xla_all_gather_bw


def all_gather_plan_time(rows, n, k, world, chunks, comm_sms, itemsize=2,
                         p: CommProfile = DEFAULT_PROFILE, gather: str = "p2p",
                         transpose_w: bool = False) -> float:
  """Chunks arrive one after another; the GEMM runs chunk by chunk, never before arrival.
  Collective gather: every remote block arrives at once, after one all-gather."""
  f = rows // chunks
  step, block_n, grid = _kernel(world * rows, n, comm_sms, transpose_w)
  unit = _unit_time(k, step, block_n, p)
  chunk_work = math.ceil(f / step) * math.ceil(n / block_n) * unit / grid
  if gather == "collective":
    arrived = p.comm_latency + (world - 1) * rows * k * itemsize / p.ce_all_gather_bw
    return max(chunks * chunk_work, arrived) + (world - 1) * chunks * chunk_work + unit
  transfer = p.comm_latency + f * k * itemsize / _busbw(p.p2p_bw, comm_sms)
  t = chunks * chunk_work  # the local block, ready at once
  arrived = 0.0
  for _ in range((world - 1) * chunks):
    arrived += transfer
    t = max(t, arrived) + chunk_work
  return t + unit  # the last wave's tail


@tile_schedule.cached_per_kernel_switches
def default_all_gather_plan(rows, n, k, world, itemsize=2,
                            profile: CommProfile = DEFAULT_PROFILE,
                            transpose_w=False) -> AllGatherPlan:
  sms = _comm_sms_candidates(world * rows, n, profile, k, 1, transpose_w)
  baseline = all_gather_baseline(rows, n, k, world, itemsize, profile)
  big_enough = _all_gather_gemm_time(rows, n, k, world, profile) >= profile.min_all_gather_gemm_s
  candidates = [(c, chunks, "p2p") for c in sms for chunks in profile.chunk_candidates
                if rows % chunks == 0 and world * chunks <= MAX_GROUPS]
  if profile.collective_gather:
    candidates += [(c, 1, "collective") for c in profile.ce_comm_sms]
  best = None
  for c, chunks, gather in candidates:
    t = all_gather_plan_time(rows, n, k, world, chunks, c, itemsize, profile, gather,
                             transpose_w)
    if best is None or t < best.predicted_s - 1e-12:
      best = AllGatherPlan(chunks, max(1, c),
                           big_enough and t < baseline * (1 - profile.min_gain), t, baseline,
                           gather)
  return best


def all_gather_supported(rows: int, n: int, world: int, one_rank: bool = False,
                         k: int = 0) -> str | None:
  """Why our all-gather + GEMM cannot take this problem, or None. one_rank: a 1-rank
  communicator is acceptable (forced plans: tests run the whole call on one GPU)."""
  if world < 2 and not one_rank:
    return "one rank: nothing to gather"
  if world > MAX_GROUPS:
    return f"more than {MAX_GROUPS} ranks"
  if max(world * rows, n, k) >= plan_lib.KERNEL_MAX_DIM:
    return "M, N or K >= 2^30 (the signaling GEMM's limit)"
  return None


# --- overrides (tuning, benchmarks) -----------------------------------------------------------

_override = plan_lib.Override()


def forced(num_groups: int | None = None, comm_sms: int | None = None, overlap: bool = True,
           chunks: int | None = None, gather: str | None = None
           ) -> contextlib.AbstractContextManager[None]:
  """Within this context, these ops *lowered* here use `num_groups` even bands (all-to-all),
  `chunks` and `gather` ("p2p" | "collective", all-gather), `comm_sms`, or overlap=False
  (XLA's composition)."""
  plan_lib.check_forced(num_groups=num_groups, comm_sms=comm_sms, chunks=chunks)
  plan_lib.check_forced_overlap(overlap)
  if gather is not None and gather not in GATHERS:
    raise ValueError(f"forced(): gather must be one of {GATHERS}, got {gather!r}")
  return _override.active((num_groups, comm_sms, overlap, chunks, gather))


def is_forced() -> bool:
  return _override.get() is not None


def _profile_for(comm_sms):
  override = _override.get()
  if override is not None and override[1] is not None:  # the override first, as plan's
    comm_sms = override[1]
  if comm_sms is None:
    return DEFAULT_PROFILE
  return dataclasses.replace(DEFAULT_PROFILE, comm_sms=int(comm_sms))


def _tuned(collective, gpu, world, dtype, m, n, k, **variant):
  """The tuned config entry (jax_flashoverlap.tuning) for this problem, or None."""
  from jax_flashoverlap import tuning
  return tuning.lookup(gpu, world, collective, dtype, m, n, k, **variant)


def choose_a2a_plan(m, n, k, world, split_axis, concat_axis, itemsize=2,
                    comm_sms=None, gpu=None, dtype="bfloat16", transpose_w=False
                    ) -> AllToAllPlan:
  """By priority: a `forced(...)` override, an explicit comm_sms, a tuned config entry for
  this GPU, world size and shape, the cost model (transpose_w: w is [N, K])."""
  override = _override.get()
  if override is None and comm_sms is None:
    entry = _tuned("all_to_all", gpu, world, dtype, m, n, k, split_axis=split_axis,
                   concat_axis=concat_axis)
    if entry is not None:
      return AllToAllPlan(a2a_shape(m, n, world, split_axis)[1], tuple(entry["band_rows"]),
                          entry["comm_sms"], entry.get("overlap", True),
                          entry.get("measured_ms", 0.0) / 1e3,
                          entry.get("baseline_ms", 0.0) / 1e3)
  plan = default_a2a_plan(m, n, k, world, split_axis, concat_axis, itemsize,
                          _profile_for(comm_sms), transpose_w)
  if override is None:
    return plan
  num_groups, _, overlap, _, _ = override
  if num_groups is not None:
    step = _kernel(m, n, plan.comm_sms)[0]
    bands = plan_lib.even_bands(plan.rows_per_block, num_groups, step)
    plan = dataclasses.replace(plan, band_rows=bands, predicted_s=a2a_plan_time(
        m, n, k, world, split_axis, concat_axis, bands, plan.comm_sms, itemsize,
        transpose_w=transpose_w))
  return dataclasses.replace(plan, overlap=overlap)


def choose_all_gather_plan(rows, n, k, world, itemsize=2, comm_sms=None, gpu=None,
                           dtype="bfloat16", transpose_w=False) -> AllGatherPlan:
  """By priority: a `forced(...)` override, an explicit comm_sms, a tuned config entry, the
  cost model."""
  override = _override.get()
  if override is None and comm_sms is None:
    entry = _tuned("all_gather", gpu, world, dtype, rows, n, k)
    if entry is not None:
      return AllGatherPlan(entry["chunks"], max(1, entry["comm_sms"]),
                           entry.get("overlap", True), entry.get("measured_ms", 0.0) / 1e3,
                           entry.get("baseline_ms", 0.0) / 1e3, entry.get("gather", "p2p"))
  plan = default_all_gather_plan(rows, n, k, world, itemsize, _profile_for(comm_sms),
                                 transpose_w)
  if override is None:
    return plan
  _, forced_sms, overlap, chunks, gather = override
  if forced_sms == 0 and comm_sms is None and overlap:  # was read as 1 without a word
    raise ValueError("forced comm_sms=0: the all-gather's overlapped call needs comm_sms >= 1 "
                     "(all_gather_matmul's own check); force 1 or more")
  gather = gather or plan.gather
  if gather == "collective":
    if chunks not in (None, 1):
      raise ValueError(f"forced chunks={chunks}: the collective gather takes whole blocks "
                       "(chunks=1)")
    chunks = 1
  if chunks is not None:
    if rows % chunks or world * chunks > MAX_GROUPS:
      raise ValueError(f"forced chunks={chunks} must divide the {rows} local rows and "
                       f"world * chunks must be <= {MAX_GROUPS}")
  chunks = int(chunks or plan.chunks)
  plan = dataclasses.replace(plan, chunks=chunks, gather=gather,
                             predicted_s=all_gather_plan_time(
                                 rows, n, k, world, chunks, plan.comm_sms, itemsize,
                                 gather=gather, transpose_w=transpose_w))
  return dataclasses.replace(plan, overlap=overlap)
