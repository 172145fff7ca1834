"""The tuner's measured cost model and candidate search (pure: no JAX, testable on CPU).

The tuner (jax_flashoverlap.tune) measures, on the machine, what plan.py's model only
assumes: the GEMM's wave time at each comm_sms (our kernel timed alone at that SM count)
and our capped collective's time per group (latency + bytes / bandwidth, fitted from the
collective alone at several group counts), and how much slower the GEMM runs beside NCCL
(fitted to one run of the op itself with even groups at that comm_sms, `fit_interference`:
the only number taken from the op, and never from the plan it then keeps unless that plan
is the calibration plan itself). With those it predicts every candidate plan with
plan.py's pipeline (gemm_end / comm_end recurrence), ranks them, and the tuner times only the
best few for real. The prediction of the plan it keeps is recorded next to its measured time:
that is the model's error.

Candidates per comm_sms: the dynamic-programming optimum under the measured model, even
bands of 1..MAX_EVEN groups, and, where the row block has at most EXHAUSTIVE_CUTS possible
boundaries, every composition of it (2^(cuts) plans).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from jax_flashoverlap import plan as plan_lib

EXHAUSTIVE_CUTS = 12   # <= 4096 plans per comm_sms
MAX_EVEN = 12


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
  # GEMM slowdown beside NCCL: one factor, or comm_sms -> factor (fit_interference)
  interference: object = plan_lib.DEFAULT_PROFILE.interference
  copy_bandwidth: float = plan_lib.DEFAULT_PROFILE.copy_bandwidth

  def slowdown(self, comm_sms: int) -> float:
    if isinstance(self.interference, dict):
      return self.interference.get(comm_sms, plan_lib.DEFAULT_PROFILE.interference)
    return self.interference

  def to_json(self) -> dict:
    return {"wave_ms": {str(s): w * 1e3 for s, w in self.wave_s.items()},
            "comm": {str(s): {"latency_us": c.latency_s * 1e6, "gb_per_s": c.bytes_per_s / 1e9}
                     for s, c in self.comm.items()},
            "interference": ({str(s): f for s, f in self.interference.items()}
                             if isinstance(self.interference, dict) else self.interference)}


def wave_time(gemm_s: float, m: int, n: int, comm_sms: int) -> float:
  """Seconds per wave from the GEMM's measured time at this comm_sms."""
  return gemm_s / plan_lib.gemm_waves(m, n, comm_sms)


def predict(collective: str, m: int, n: int, world: int, band_rows, comm_sms: int,
            cal: Calibration, itemsize: int = 2) -> float:
  """Predicted seconds of our op with this plan, from the measurements."""
  unit = cal.wave_s[comm_sms] * cal.slowdown(comm_sms)
  curve = cal.comm[comm_sms]
  blocks = world if collective == "reduce_scatter" else 1
  t = plan_lib.pipeline_time(
      band_rows, plan_lib.gemm_end_fn(collective, m, n, world, comm_sms, unit),
      lambda r0, r1: curve.time(blocks * (r1 - r0) * n * itemsize))
  if collective == "all_reduce":  # the last group's copy to the output is exposed
    t += (band_rows[-1] - band_rows[-2]) * n * itemsize / cal.copy_bandwidth
  return t


def fit_interference(collective: str, m: int, n: int, world: int, band_rows, comm_sms: int,
                     measured_s: float, cal: Calibration, itemsize: int = 2,
                     low: float = 0.8, high: float = 2.0) -> float:
  """The GEMM slowdown under which `predict` gives `measured_s` for this plan (one run of the
  op itself, measured in calibration), by bisection; clamped to [low, high]."""
  def at(factor):
    trial = dataclasses.replace(cal, interference={**_as_dict(cal), comm_sms: factor})
    return predict(collective, m, n, world, band_rows, comm_sms, trial, itemsize)
  if at(low) >= measured_s:
    return low
  if at(high) <= measured_s:
    return high
  for _ in range(50):
    mid = 0.5 * (low + high)
    low, high = (mid, high) if at(mid) < measured_s else (low, mid)
  return 0.5 * (low + high)


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


def _compositions(rows: int, step: int):
  cuts = list(range(step, rows, step))
  for r in range(len(cuts) + 1):
    for chosen in itertools.combinations(cuts, r):
      yield (0,) + chosen + (rows,)


def candidates(collective: str, m: int, n: int, world: int, cal: Calibration,
               itemsize: int = 2) -> list:
  """Every candidate plan for the calibrated comm_sms values, best predicted first (one per
  distinct (comm_sms, band_rows))."""
  blocks = world if collective == "reduce_scatter" else 1
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
    step = plan_lib.cut_step(m, n, sms)
    unit = cal.wave_s[sms] * cal.slowdown(sms)
    curve = cal.comm[sms]
    add(sms, plan_lib.best_cuts(
        rows, step, plan_lib.gemm_end_fn(collective, m, n, world, sms, unit),
        lambda r0, r1, c=curve: c.time(blocks * (r1 - r0) * n * itemsize)), "dp")
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
