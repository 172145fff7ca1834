"""The tuner's measured cost model and candidate search (pure: no JAX, testable on CPU).

The tuner (jax_flashoverlap.tune) measures, on the machine, what plan.py's model only
assumes: the GEMM's wave time at each comm_sms (our kernel timed alone at that SM count)
and our capped collective's time per group (latency + bytes / bandwidth, fitted from the
collective alone at several group counts), and, from two runs of the op itself with even
groups (few and many) at that comm_sms, how much slower the GEMM runs beside NCCL and what
each group adds on the critical path (`fit_op_runs`: the only numbers taken from the op; the
report says when the plan it keeps is one of those runs). With those it predicts every
candidate plan with
plan.py's pipeline (gemm_end / comm_end recurrence), ranks them, and the tuner times only the
best few for real. The prediction of the plan it keeps is recorded next to its measured time:
that is the model's error.

Candidates per comm_sms: the dynamic-programming optimum under the measured model, and the
optimum for every group count up to MAX_DP_GROUPS (a cost per group makes the best count
matter), even bands of 1..MAX_EVEN groups, and, where the row block has at most
EXHAUSTIVE_CUTS possible boundaries, every composition of it (2^(cuts) plans).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from jax_flashoverlap import plan as plan_lib
from jax_flashoverlap import plan_search
from jax_flashoverlap import tile_schedule

EXHAUSTIVE_CUTS = 12   # <= 4096 plans per comm_sms
MAX_EVEN = 12
MAX_DP_GROUPS = 16     # best_cuts_by_count: the optimum for every group count up to this


@dataclasses.dataclass(frozen=True)
class CommCurve:
  """Time of one group's collective on our capped communicator: latency + bytes / bandwidth
  (bytes: the group's span in the workspace, every rank block together)."""
  latency_s: float
  bytes_per_s: float

  def time(self, nbytes: float) -> float:
    return self.latency_s + nbytes / self.bytes_per_s


def fit_comm_curve(points) -> CommCurve:
  """Least squares of t = groups * latency + total_bytes / bandwidth over measured
  (groups, total_bytes, seconds) of the collective alone. Needs two distinct group counts;
  a negative fitted latency is clamped to 0 (refit for bandwidth alone)."""
  points = [(float(g), float(b), float(t)) for g, b, t in points]
  if len({g for g, _, _ in points}) < 2:
    raise ValueError("fit_comm_curve needs measurements at two or more group counts")
  # Normal equations of t = a * g + c * b (a = latency, c = 1 / bandwidth).
  sgg = sum(g * g for g, _, _ in points)
  sbb = sum(b * b for _, b, _ in points)
  sgb = sum(g * b for g, b, _ in points)
  sgt = sum(g * t for g, _, t in points)
  sbt = sum(b * t for _, b, t in points)
  det = sgg * sbb - sgb * sgb
  a = (sgt * sbb - sbt * sgb) / det if det else 0.0
  c = (sgg * sbt - sgb * sgt) / det if det else 0.0
  if a < 0 or not det:
    a = 0.0
    c = sbt / sbb
  if c <= 0:
    raise ValueError(f"measured collective times do not grow with bytes: {points}")
  return CommCurve(a, 1.0 / c)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Measurements of one problem (collective, per-device m x n x k, world) on this machine."""
  wave_s: dict           # comm_sms -> seconds per wave of our GEMM alone
  comm: dict             # comm_sms -> CommCurve of our capped collective
  # GEMM slowdown beside NCCL: one factor, or comm_sms -> factor (fit_op_runs)
  interference: float | dict = plan_lib.DEFAULT_PROFILE.interference
  copy_bandwidth: float = plan_lib.DEFAULT_PROFILE.copy_bandwidth
  # comm_sms -> seconds every group adds to the op on its critical path (stream waits,
  # launches, signals: what the collective alone does not show; fit_op_runs)
  group_overhead_s: dict = dataclasses.field(default_factory=dict)
  # per-device K (the GEMM's split tail: tile_schedule.gemm_waves); None: whole units
  k: int | None = None

  def slowdown(self, comm_sms: int) -> float:
    if isinstance(self.interference, dict):
      return self.interference.get(comm_sms, plan_lib.DEFAULT_PROFILE.interference)
    return self.interference

  def to_json(self) -> dict:
    return {"wave_ms": {str(s): w * 1e3 for s, w in self.wave_s.items()},
            "comm": {str(s): {"latency_us": c.latency_s * 1e6, "gb_per_s": c.bytes_per_s / 1e9}
                     for s, c in self.comm.items()},
            "interference": ({str(s): f for s, f in self.interference.items()}
                             if isinstance(self.interference, dict) else self.interference),
            "group_overhead_us": {str(s): v * 1e6 for s, v in self.group_overhead_s.items()},
            "k": self.k}


def wave_time(gemm_s: float, m: int, n: int, comm_sms: int, k: int | None = None) -> float:
  """Seconds per wave (one unit time) from the GEMM's measured time at this comm_sms."""
  return gemm_s / tile_schedule.gemm_waves(m, n, comm_sms, k)


def predict(collective: str, m: int, n: int, world: int, band_rows, comm_sms: int,
            cal: Calibration, itemsize: int = 2) -> float:
  """Predicted seconds of our op with this plan, from the measurements."""
  unit = cal.wave_s[comm_sms] * cal.slowdown(comm_sms)
  curve = cal.comm[comm_sms]
  blocks = plan_lib.rank_blocks(collective, world)
  t = plan_lib.pipeline_time(
      band_rows, plan_lib.gemm_end_fn(collective, m, n, world, comm_sms, unit, cal.k),
      lambda r0, r1: curve.time(blocks * (r1 - r0) * n * itemsize))
  tail = plan_lib.last_group_tail(collective, n, itemsize, cal.copy_bandwidth)
  if tail is not None:  # the last group's copy to the output is exposed
    t += tail(*band_rows[-2:])
  return t + (len(band_rows) - 1) * cal.group_overhead_s.get(comm_sms, 0.0)


def fit_op_runs(collective: str, m: int, n: int, world: int, comm_sms: int, runs,
                cal: Calibration, itemsize: int = 2, low: float = 0.8,
                high: float = 2.0) -> tuple:
  """(slowdown, per-group overhead in s) that make `predict` give the measured times of runs
  of the op itself at this comm_sms: runs = [(band_rows, measured_s), ...] with different
  group counts. With t_i = P_i(slowdown) + G_i * overhead for two runs, the overhead cancels
  in G_2 * t_1 - G_1 * t_2, which fixes the slowdown (bisection, clamped to [low, high]);
  then the overhead follows (clamped at 0, the slowdown then refit to the first run alone).
  One run: the slowdown alone."""
  def with_(factor, overhead):
    return dataclasses.replace(cal, interference={**_as_dict(cal), comm_sms: factor},
                               group_overhead_s={**cal.group_overhead_s, comm_sms: overhead})

  def pred(bands, factor):
    return predict(collective, m, n, world, bands, comm_sms, with_(factor, 0.0), itemsize)

  def bisect(f):  # f increasing; its root in [low, high], clamped
    lo, hi = low, high
    if f(lo) >= 0:
      return lo
    if f(hi) <= 0:
      return hi
    for _ in range(60):
      mid = 0.5 * (lo + hi)
      lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)

  # fewest groups first: the bisection's function rises with the factor only in that order
  # (the most groups first, it fell: the slowdown went to its clamp, the rest to the overhead)
  runs = sorted(((tuple(b), float(t)) for b, t in runs), key=lambda r: len(r[0]))
  (b1, t1) = runs[0]
  g1 = len(b1) - 1
  if len(runs) >= 2 and len(runs[1][0]) - 1 != g1:
    (b2, t2) = runs[1]
    g2 = len(b2) - 1
    factor = bisect(lambda f: g2 * pred(b1, f) - g1 * pred(b2, f) - (g2 * t1 - g1 * t2))
    overhead = (t1 - pred(b1, factor)) / g1
    if overhead >= 0:
      return factor, overhead
  return bisect(lambda f: pred(b1, f) - t1), 0.0


def _as_dict(cal: Calibration) -> dict:
  if isinstance(cal.interference, dict):
    return dict(cal.interference)
  return {s: cal.interference for s in cal.wave_s}


@dataclasses.dataclass(frozen=True)
class Candidate:
  comm_sms: int
  band_rows: tuple
  predicted_s: float
  how: str               # "dp", "even<G>", "exhaustive"

  @property
  def num_groups(self) -> int:
    return len(self.band_rows) - 1


def best_cuts_by_count(rows: int, step: int, gemm_end, comm_time, max_groups: int,
                       tail=None) -> dict:
  """{G: band_rows} minimizing the pipeline's end for each group count G <= max_groups
  (plan_search.cuts_by_count): with a fixed cost per group, the best plan overall is one of these."""
  return {g: bands for g, (_, bands) in
          plan_search.cuts_by_count(rows, step, gemm_end, comm_time, max_groups,
                                    tail=tail).items()}


def _compositions(rows: int, step: int):
  cuts = list(range(step, rows, step))
  for r in range(len(cuts) + 1):
    for chosen in itertools.combinations(cuts, r):
      yield (0,) + chosen + (rows,)


def candidates(collective: str, m: int, n: int, world: int, cal: Calibration,
               itemsize: int = 2) -> list:
  """Every candidate plan for the calibrated comm_sms values, best predicted first (one per
  distinct (comm_sms, band_rows))."""
  blocks = plan_lib.rank_blocks(collective, world)
  rows = m // blocks
  found = {}

  def add(sms, bands, how):
    bands = tuple(bands)
    if (sms, bands) not in found:
      found[(sms, bands)] = Candidate(sms, bands, predict(collective, m, n, world, bands, sms,
                                                          cal, itemsize), how)

  for sms in sorted(cal.wave_s):
    if sms not in cal.comm:
      continue
    step = tile_schedule.cut_step(m, n, sms)
    unit = cal.wave_s[sms] * cal.slowdown(sms)
    curve = cal.comm[sms]
    gemm_end = plan_lib.gemm_end_fn(collective, m, n, world, sms, unit, cal.k)
    comm_time = lambda r0, r1, c=curve: c.time(blocks * (r1 - r0) * n * itemsize)
    tail = plan_lib.last_group_tail(collective, n, itemsize, cal.copy_bandwidth)
    add(sms, plan_lib.best_cuts(rows, step, gemm_end, comm_time, tail=tail), "dp")
    for g, bands in best_cuts_by_count(rows, step, gemm_end, comm_time, MAX_DP_GROUPS,
                                       tail=tail).items():
      add(sms, bands, f"dp{g}")
    for g in range(1, MAX_EVEN + 1):
      add(sms, plan_lib.even_bands(rows, g, step), f"even{g}")
    if math.ceil(rows / step) - 1 <= EXHAUSTIVE_CUTS:
      for bands in _compositions(rows, step):
        if len(bands) - 1 <= plan_lib.MAX_GROUPS:
          add(sms, bands, "exhaustive")
  return sorted(found.values(), key=lambda c: (c.predicted_s, c.comm_sms, c.band_rows))


def shortlist(cands: list, count: int) -> list:
  """The `count` best predicted, but at least the best of every comm_sms (the SM split is the
  least certain part of the model), best first."""
  best_per_sms = {}
  for c in cands:
    best_per_sms.setdefault(c.comm_sms, c)
  picked = list(best_per_sms.values())
  for c in cands:
    if len(picked) >= max(count, len(best_per_sms)):
      break
    if c not in picked:
      picked.append(c)
  return sorted(picked, key=lambda c: c.predicted_s)
