"""Group plans: how the GEMM's output rows are split into communication groups.

A plan is a pure function of (collective, shape, dtype, world size, machine profile), so every
rank of an axis derives the same one (DESIGN.md, "Communicators"). It travels to the FFI
handler as custom-call attributes, i.e. it is part of the compiled program.

`band_rows` are boundaries inside one rank block of rows (the whole M for all-reduce, M / n
rows for reduce-scatter; xla_ffi/kernels/signaling_gemm.h).

The default plan comes from a cost model (the FlashOverlap paper's, on our schedule):

    gemm_end[g] = (waves until group g's last work unit is done) * unit time * interference
                  (the kernel's split tail ends the last two waves early: gemm_waves)
    comm_end[g] = max(gemm_end[g], comm_end[g-1]) + comm_time(bytes of group g)

minimized exactly by dynamic programming over group boundaries (boundaries on cluster rows:
the kernel's unit of work). When the best plan is not predicted to beat XLA's serial
dot + collective, the op falls back to that (so it is never slower than XLA by design).
"""

from __future__ import annotations

import dataclasses
import contextlib
import math
import numbers
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from jax_flashoverlap import _compat
from jax_flashoverlap.plan_search import MAX_GROUPS, best_cuts
from jax_flashoverlap.tile_schedule import (NUM_SMS, cached_per_kernel_switches, gemm_waves,
                                            kernel_geometry, raised_comm_sms_candidates)

# M, N and K must stay below this (signaling_gemm.cu LaunchSignalingGemm: 32-bit TMA
# coordinates and int row arithmetic); larger problems are XLA's (primitives.too_large).
KERNEL_MAX_DIM = 1 << 30
# The most SMs a call may leave to NCCL: the GEMM keeps one 2-SM cluster (its 128 x 256
# tiles run on 2x1 clusters; with fewer than 2 SMs the launcher refuses the call).
MAX_COMM_SMS = NUM_SMS - 2


@dataclasses.dataclass(frozen=True)
class MachineProfile:
  """Calibration of the cost model. Defaults: 2 x H200, NCCL 2.28, bf16 (DESIGN.md tables)."""
  sm_flops: float = 5.3e12          # dense bf16 flop/s per SM in the GEMM (~700 TFLOP/s / 132)
  interference: float = 1.06        # GEMM slowdown while NCCL runs beside it
  comm_latency: float = 40e-6       # per group: stream wait + NCCL launch + sync
  # Bus bandwidths (bytes/s) of our capped, registered-window collectives by CTA cap, fit to
  # the "NCCL capped alone" column of benchmarks/results/overlap_h200x2_tuned.json (2 x H200,
  # ~10 us per call taken off): the reduce-scatter on 8 CTAs is slow (~90 GB/s).
  # Linear in between, clamped outside.
  all_reduce_busbw: tuple = ((8, 235e9), (16, 294e9))
  # The all-reduce in place on XLA's output (JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output): a
  # plain buffer, ~20 GB/s per CTA (DESIGN.md: 128 MB took 3.37 / 1.80 / 0.96 / 0.63 ms on
  # 2 / 4 / 8 / 16 CTAs alone), and no copy to the output.
  all_reduce_in_place: bool = False
  all_reduce_plain_busbw: tuple = ((2, 40e9), (4, 75e9), (8, 140e9), (16, 213e9))
  reduce_scatter_busbw: tuple = ((8, 90e9), (16, 200e9))
  copy_bandwidth: float = 1.5e12    # workspace -> output copy (copy engine), bytes/s
  # XLA's own uncapped collectives (the baseline we must beat).
  xla_all_reduce_busbw: float = 227e9
  xla_reduce_scatter_busbw: float = 200e9
  comm_sms: int | None = None       # SMs left to NCCL; None: the model picks a candidate
  # 4 starved NCCL in the sweep. Each also raised to the most SMs that cost the GEMM no extra
  # wave (wave_aligned_comm_sms), up to the largest CTA count calibrated below.
  comm_sms_candidates: tuple = (8, 16)
  min_gain: float = 0.03            # fall back unless predicted >= 3% faster


DEFAULT_PROFILE = MachineProfile()

# 4 ranks (benchmarks/results/h200x4.json, commit dd4b801, 4 x H200): bus bandwidths from its
# "XLA collective" and "NCCL capped alone" columns (NCCL's bus bandwidth is higher with 4
# ranks, the capped reduce-scatter's on 8 CTAs too); GEMM and latency figures as for 2 ranks. Re-predicting the plans that
# ran measured: -10%..+11% (with the 2-rank profile: -14%..+13%); XLA baselines +3..+21%
# too slow (2-rank profile: +8..+34%): XLA's dot + collective measured ~10% under the sum of
# the two alone (back-to-back calls overlap a little), which the model does not have.
WORLD4_PROFILE = dataclasses.replace(
    DEFAULT_PROFILE, all_reduce_busbw=((8, 219e9), (16, 259e9)),
    reduce_scatter_busbw=((8, 119e9), (16, 203e9)), xla_all_reduce_busbw=265e9,
    xla_reduce_scatter_busbw=233e9)
PROFILES = {2: DEFAULT_PROFILE, 4: WORLD4_PROFILE}  # by world size


def profile_for_world(world: int) -> MachineProfile:
  """The calibration measured at the largest world size <= `world` (2 ranks' below that)."""
  known = [w for w in PROFILES if w <= world]
  return PROFILES[max(known)] if known else DEFAULT_PROFILE


@dataclasses.dataclass(frozen=True)
class GroupPlan:
  collective: str        # "all_reduce" | "reduce_scatter"
  rows_per_block: int
  band_rows: tuple       # 0 = b_0 < ... < b_G = rows_per_block
  comm_sms: int
  overlap: bool = True   # False: run XLA's dot + collective instead
  predicted_s: float = 0.0
  baseline_s: float = 0.0
  cta_policy: str = "default"  # the communicator's ncclConfig_t.CTAPolicy (comm.CTA_POLICIES)
  # "nccl", or "peer" (plan_peer.py: band_rows are the bands of one rank's block of
  # M / world rows for both collectives; comm_sms 0, the GEMM on every SM)
  transport: str = "nccl"
  # Where the plan (and predicted_s) comes from: "cost_model", "tuned" (a config entry: its
  # predicted_s is the tuner's measurement) or "forced". Not part of the plan's identity.
  source: str = dataclasses.field(default="cost_model", compare=False)

  @property
  def num_groups(self) -> int:
    return len(self.band_rows) - 1

  def validate(self, world: int = 2) -> None:
    """Raises ValueError naming what is wrong (world: the group's size, for a peer-store
    plan, whose launch runs every rank block's bands)."""
    b = self.band_rows
    if len(b) < 2 or b[0] != 0 or b[-1] != self.rows_per_block:
      raise ValueError(f"plan band_rows {b} must start at 0 and end at {self.rows_per_block}")
    if any(b1 <= b0 for b0, b1 in zip(b, b[1:])):
      raise ValueError(f"plan band_rows {b} must be strictly increasing")
    if self.num_groups > MAX_GROUPS:
      raise ValueError(f"plan has {self.num_groups} groups; at most {MAX_GROUPS} are supported")
    if not 0 <= self.comm_sms <= MAX_COMM_SMS:
      raise ValueError(f"plan comm_sms={self.comm_sms} must be in [0, {MAX_COMM_SMS}]")
    if self.cta_policy not in ("default", "efficiency", "zero"):
      raise ValueError(f"plan cta_policy={self.cta_policy!r} must be 'default', 'efficiency' "
                       "or 'zero'")
    if self.transport not in ("nccl", "peer"):
      raise ValueError(f"plan transport={self.transport!r} must be 'nccl' or 'peer'")
    if self.transport == "peer" and (self.comm_sms != 0 or world * self.num_groups > MAX_GROUPS):
      raise ValueError(f"a peer-store plan runs the GEMM on every SM (comm_sms 0, got "
                       f"{self.comm_sms}) with at most {MAX_GROUPS // world} bands per block "
                       f"at world size {world} (got {self.num_groups})")


def _comm_time(collective: str, group_bytes: float, world: int, p: MachineProfile,
               comm_sms: int) -> float:
  if collective == "all_reduce":
    table = p.all_reduce_plain_busbw if p.all_reduce_in_place else p.all_reduce_busbw
    wire = group_bytes * 2 * (world - 1) / world / _busbw(table, comm_sms)
    # The copy to XLA's output runs on the copy engine beside the next group's all-reduce.
    return p.comm_latency + wire
  return p.comm_latency + group_bytes * (world - 1) / world / _busbw(p.reduce_scatter_busbw,
                                                                       comm_sms)


def _busbw(table: tuple, ctas: int) -> float:
  """Piecewise-linear bus bandwidth for a CTA cap from (ctas, bytes/s) points."""
  points = sorted(table)
  if ctas <= points[0][0]:
    return points[0][1] * max(ctas, 1) / points[0][0]  # fewer CTAs: proportionally slower
  for (c0, b0), (c1, b1) in zip(points, points[1:]):
    if ctas <= c1:
      return b0 + (b1 - b0) * (ctas - c0) / (c1 - c0)
  return points[-1][1]


def baseline_time(collective: str, m: int, n: int, k: int, world: int, itemsize: int = 2,
                  profile: MachineProfile = DEFAULT_PROFILE) -> float:
  """Predicted XLA dot (all SMs) followed by XLA's collective."""
  p = profile
  gemm = 2.0 * m * n * k / (p.sm_flops * NUM_SMS)
  nbytes = m * n * itemsize
  if collective == "all_reduce":
    comm = p.comm_latency + nbytes * 2 * (world - 1) / world / p.xla_all_reduce_busbw
  else:
    comm = p.comm_latency + nbytes * (world - 1) / world / p.xla_reduce_scatter_busbw
  return gemm + comm


def plan_time(collective: str, m: int, n: int, k: int, world: int, band_rows, comm_sms: int,
              itemsize: int = 2, profile: MachineProfile = DEFAULT_PROFILE,
              transpose_w: bool = False) -> float:
  """Predicted time of a given plan (the same model the search minimizes)."""
  p = profile
  kern = kernel_geometry(m, n, comm_sms, transpose_w)
  unit_time = 2.0 * kern.block_m * kern.block_n * k / p.sm_flops * p.interference
  tail = last_group_tail(collective, n, itemsize, p.copy_bandwidth, p.all_reduce_in_place)
  return pipeline_time(
      band_rows, gemm_end_fn(collective, m, n, world, comm_sms, unit_time, k, transpose_w),
      lambda r0, r1: _comm_time(collective, _group_bytes(collective, r0, r1, n, world, itemsize),
                                world, p, comm_sms)) + (tail(*band_rows[-2:]) if tail else 0.0)


def last_group_tail(collective: str, n: int, itemsize: int, copy_bandwidth: float,
                    in_place: bool = False):
  """(r0, r1) -> the time after the last group's communication that nothing hides: the
  all-reduce's copy of that group's rows out of the workspace (none in place); None when
  there is none. The cost model's and the tuner's (its measured copy bandwidth)."""
  if collective == "all_reduce" and not in_place:
    return lambda r0, r1: (r1 - r0) * n * itemsize / copy_bandwidth
  return None


def pipeline_time(band_rows, gemm_end, comm_time) -> float:
  """End of the last group's communication: group g starts when its rows are written
  (gemm_end(b_{g+1})) and group g-1's communication is done."""
  comm_end = 0.0
  for b0, b1 in zip(band_rows, band_rows[1:]):
    comm_end = max(gemm_end(b1), comm_end) + comm_time(b0, b1)
  return comm_end


def rank_blocks(collective: str, world: int) -> int:
  """The rank blocks of the GEMM's output rows (signaling_gemm.h GroupLayout::num_blocks):
  the world size for reduce-scatter (rank r's rows are block r), else 1."""
  return world if collective == "reduce_scatter" else 1


def gemm_end_fn(collective: str, m: int, n: int, world: int, comm_sms: int, unit_time: float,
                k: int | None = None, transpose_w: bool = False):
  """r -> when the GEMM has written rows [0, r) of every rank block: whole waves of the
  persistent grid over the work units up to there (the kernel's band order), each unit_time,
  and never later than the whole GEMM's end (gemm_waves: with the split tail the last wave
  ends early; k None: whole units)."""
  blocks = rank_blocks(collective, world)
  kern = kernel_geometry(m, n, comm_sms, transpose_w)
  step = kern.rows_per_unit
  n_tiles = math.ceil(n / kern.block_n)
  end = gemm_waves(m, n, comm_sms, k, blocks, transpose_w)
  return lambda r: min(math.ceil(blocks * math.ceil(r / step) * n_tiles / kern.grid),
                       end) * unit_time


def _group_bytes(collective: str, r0: int, r1: int, n: int, world: int, itemsize: int) -> int:
  blocks = rank_blocks(collective, world)
  return blocks * (r1 - r0) * n * itemsize


def calibrated_ctas(collective: str, profile: MachineProfile) -> int:
  """The largest CTA cap the profile's bandwidth table for this collective was measured at
  (the model clamps beyond it, so it cannot tell what more CTAs would bring)."""
  if collective == "all_reduce":
    table = (profile.all_reduce_plain_busbw if profile.all_reduce_in_place
             else profile.all_reduce_busbw)
  else:
    table = profile.reduce_scatter_busbw
  return max(c for c, _ in table)


@cached_per_kernel_switches
def default_plan(collective: str, m: int, n: int, k: int, world: int, itemsize: int = 2,
                 profile: MachineProfile = DEFAULT_PROFILE, transpose_w: bool = False
                 ) -> GroupPlan:
  """The cost model's best plan for this problem (deterministic; identical on every rank).

  m is the per-device GEMM's M (all rows of x), k its K (the local shard of the global K).
  comm_sms is the profile's, or the best of its candidates. transpose_w: w is [N, K] (the
  kernel's tile width then ignores FLASHOVERLAP_GEMM_SCHEDULE; part of the cache key).
  """
  if collective not in ("all_reduce", "reduce_scatter"):
    raise ValueError(f"unknown collective {collective!r}")
  if profile.comm_sms is not None:
    candidates = (profile.comm_sms,)
  else:  # raised within the CTA counts the bandwidth table was measured at
    candidates = raised_comm_sms_candidates(m, n, profile.comm_sms_candidates,
                                            calibrated_ctas(collective, profile), k,
                                            rank_blocks(collective, world),
                                            transpose_w)
  plans = [_best_bands(collective, m, n, k, world, itemsize, profile, sms, transpose_w)
           for sms in candidates]
  plan = min(plans, key=lambda p: p.predicted_s)
  plan.validate()
  return plan


def _best_bands(collective, m, n, k, world, itemsize, p, comm_sms, transpose_w) -> GroupPlan:
  """The cost model's best group boundaries for one comm_sms (best_cuts)."""
  blocks = rank_blocks(collective, world)
  rows = m // blocks
  kern = kernel_geometry(m, n, comm_sms, transpose_w)
  unit_time = 2.0 * kern.block_m * kern.block_n * k / p.sm_flops * p.interference
  band_rows = best_cuts(
      rows, kern.rows_per_unit,
      gemm_end_fn(collective, m, n, world, comm_sms, unit_time, k, transpose_w),
      lambda r0, r1: _comm_time(collective, _group_bytes(collective, r0, r1, n, world, itemsize),
                                world, p, comm_sms),
      tail=last_group_tail(collective, n, itemsize, p.copy_bandwidth, p.all_reduce_in_place))
  predicted = plan_time(collective, m, n, k, world, band_rows, comm_sms, itemsize, p,
                        transpose_w)
  baseline = baseline_time(collective, m, n, k, world, itemsize, p)
  return GroupPlan(collective, rows, band_rows, comm_sms,
                   predicted < baseline * (1.0 - p.min_gain), predicted, baseline)


# --- overrides (tuning, benchmarks) ----------------------------------------------------------

class Override(threading.local):
  """A per-thread plan override: `get()` is None outside `active(value)`. Every override in
  force (plan's, plan_a2a's) is also a JAX state in jit's trace and cache keys: a function
  JAX had lowered before was given back from its cache under `forced(...)`, with its old plan
  (a tuning loop over `forced` plans of one jitted function measured the first every time)."""

  value = None
  instances = []  # every Override (class-wide), in creation order: _OVERRIDES_STATE's value

  def __init__(self):  # (threading.local runs it again in every thread: registered once)
    if not any(o is self for o in Override.instances):
      Override.instances.append(self)

  def get(self):
    return self.value

  @contextlib.contextmanager
  def active(self, value) -> Iterator[None]:
    previous, self.value = self.value, value
    try:
      if _OVERRIDES_STATE is None:  # pragma: no cover  (a JAX without such states)
        yield
      else:
        with _OVERRIDES_STATE(tuple(o.value for o in Override.instances)):
          yield
    finally:
      self.value = previous


_OVERRIDES_STATE = _compat.traced_state(
    "jax_flashoverlap_plan_overrides",
    "jax_flashoverlap's forced plans in force (plan.forced, plan_a2a.forced): part of jit's "
    "cache key, so that a function is lowered again under another override")
_override = Override()


def forced(num_groups: int | None = None, comm_sms: int | None = None, overlap: bool = True,
           band_rows: Sequence[int] | None = None, cta_policy: str | None = None
           ) -> contextlib.AbstractContextManager[None]:
  """Within this context, ops *lowered* here use `num_groups` even row bands (aligned to the
  kernel's cluster rows) or exactly `band_rows` (boundaries in one rank block's rows), and/or
  `comm_sms` and the communicator's `cta_policy`, instead of the cost model's plan;
  overlap=False forces XLA's dot + collective. A forced plan is an NCCL plan: it takes the
  NCCL path also where JAX_FLASHOVERLAP_TRANSPORT asks for the peer stores (which it used to
  ignore, overlap=False included). For tuning: jit-compile inside the context."""
  if num_groups is not None and band_rows is not None:
    raise ValueError("forced(): give num_groups or band_rows, not both")
  check_forced(num_groups=num_groups, comm_sms=comm_sms)
  check_forced_overlap(overlap)
  bands = None
  if band_rows is not None:
    # read once (an iterator would be empty after the check); int(b) truncated 10.7 to 10
    # (and read True as 1) without a word
    bands = None if isinstance(band_rows, (str, bytes)) else tuple(band_rows)
    if bands is None or not all(isinstance(b, numbers.Integral) and not isinstance(b, bool)
                                for b in bands):
      raise TypeError(f"forced(): band_rows must be a sequence of ints (row boundaries in one "
                      f"rank block), got {band_rows!r}")
    bands = tuple(int(b) for b in bands)
    if len(bands) < 2:  # else a TypeError from deep in the all-reduce's cost model
      raise ValueError(f"forced(): band_rows needs at least 2 boundaries (0, ..., the rows of "
                       f"one rank block), got {band_rows!r}")
  return _override.active((num_groups, comm_sms, overlap, bands, cta_policy))


def check_forced(**values) -> None:
  """forced()'s numbers (plan_a2a's too), checked when the context is made: they reach the
  lowered custom call as they are (num_groups=0 used to become one group silently)."""
  bounds = {"num_groups": (1, MAX_GROUPS), "comm_sms": (0, MAX_COMM_SMS),
            "chunks": (1, MAX_GROUPS)}
  for name, value in values.items():
    if value is None:
      continue
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
      raise TypeError(f"forced(): {name} must be an int or None, got {value!r}")
    low, high = bounds[name]
    if not low <= value <= high:
      raise ValueError(f"forced(): {name} must be in [{low}, {high}], got {value}")


def check_forced_overlap(overlap) -> None:
  """forced()'s overlap: a real bool. A truthy string ("false", "no") overlapped, silently."""
  if not isinstance(overlap, (bool, np.bool_)):
    raise TypeError(f"forced(): overlap must be a bool (False: XLA's dot + collective), got "
                    f"{overlap!r}")


def is_forced() -> bool:
  return _override.get() is not None


def is_forced_off() -> bool:
  """A forced(overlap=False) context: XLA's dot + collective, whatever the shape."""
  override = _override.get()
  return override is not None and not override[2]


def plan_from_entry(collective: str, m: int, world: int, entry: dict) -> GroupPlan:
  """The GroupPlan of a tuned config entry (jax_flashoverlap.tuning; validated). A peer-store
  entry's bands cover one block of m / world rows for both collectives (plan_peer.py)."""
  transport = entry.get("transport", "nccl")
  blocks = world if transport == "peer" else rank_blocks(collective, world)
  plan = GroupPlan(collective, m // blocks, tuple(entry["band_rows"]), entry["comm_sms"],
                   entry.get("overlap", True),
                   entry.get("measured_ms", 0.0) / 1e3, entry.get("baseline_ms", 0.0) / 1e3,
                   entry.get("cta_policy", "default"), transport, source="tuned")
  plan.validate(world)
  return plan


def choose_plan(collective: str, m: int, n: int, k: int, world: int, itemsize: int = 2,
                comm_sms: int | None = None, gpu: str | None = None,
                dtype: str = "bfloat16", in_place: bool = False,
                transpose_w: bool = False) -> GroupPlan:
  """The NCCL-path plan an op lowers with, by priority: an active `forced(...)` override; an
  explicit `comm_sms` (the cost model's best bands for it); a tuned config entry for this
  GPU, world size and shape (jax_flashoverlap.tuning; tuned with the registered workspace, so
  not for an all-reduce `in_place` on XLA's output; a peer-store entry is plan_peer.tuned's,
  not this path's); the cost model (transpose_w: w is [N, K])."""
  in_place = bool(in_place) and collective == "all_reduce"
  override = _override.get()
  forced_groups, forced_sms, forced_overlap, forced_bands, forced_policy = (
      override or (None, None, True, None, None))
  if override is None and comm_sms is None and not in_place:
    from jax_flashoverlap import tuning
    entry = tuning.lookup(gpu, world, collective, dtype, m, n, k)
    if entry is not None and entry.get("transport", "nccl") == "nccl":
      return plan_from_entry(collective, m, world, entry)
  if forced_sms is not None:  # the override first, as the priority above says
    comm_sms = forced_sms
  profile = profile_for_world(world)
  if comm_sms is not None:
    profile = dataclasses.replace(profile, comm_sms=int(comm_sms))
  if in_place:
    profile = dataclasses.replace(profile, all_reduce_in_place=True)
  plan = default_plan(collective, m, n, k, world, itemsize, profile, transpose_w)
  if override is None:
    return plan
  bands = forced_bands
  if forced_groups is not None:
    bands = aligned_even_bands(collective, m, n, world, forced_groups, plan.comm_sms)
  if bands is not None:
    plan = dataclasses.replace(plan, band_rows=bands, predicted_s=plan_time(
        collective, m, n, k, world, bands, plan.comm_sms, itemsize, profile, transpose_w))
  plan = dataclasses.replace(plan, overlap=forced_overlap, source="forced")
  if forced_policy is not None:
    plan = dataclasses.replace(plan, cta_policy=forced_policy)
  plan.validate()
  return plan


def aligned_even_bands(collective: str, m: int, n: int, world: int, num_groups: int,
                       comm_sms: int) -> tuple:
  """`num_groups` even bands of one rank block, on the kernel's cluster-row boundaries."""
  blocks = rank_blocks(collective, world)
  return even_bands(m // blocks, num_groups, kernel_geometry(m, n, comm_sms).rows_per_unit)


def even_bands(rows: int, num_groups: int, align: int) -> tuple:
  """`rows` split into at most `num_groups` bands with boundaries on multiples of `align`."""
  units = max(1, math.ceil(rows / align))
  num_groups = max(1, min(num_groups, units, MAX_GROUPS))
  bounds = {0, rows}
  for g in range(1, num_groups):
    bounds.add(min(rows, (units * g // num_groups) * align))
  return tuple(sorted(bounds))
