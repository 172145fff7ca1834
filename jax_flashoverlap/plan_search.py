"""The group plan's search: the group boundaries with the earliest predicted end, by dynamic
programming over candidate cuts (plan.py's cost model supplies gemm_end and comm_time).

Pure functions of their arguments; plan._best_bands calls best_cuts, the tests
(tests/test_plan_dp.py) check both passes against scalar references."""

from __future__ import annotations

import math

MAX_GROUPS = 64  # xla_ffi/kernels/signaling_gemm.h: kMaxGroups

MAX_CUTS = 1024  # candidate boundaries of the group DP; beyond, cuts lie on a coarser step


def cut_grid(rows: int, step: int) -> list:
  """Candidate group boundaries: 0, the multiples of `step` below `rows` (coarsened to a
  multiple of it when there would be more than MAX_CUTS: one of rows / MAX_CUTS rows is
  fine enough, and the DP's cost grows as their square), and rows."""
  step *= max(1, math.ceil(math.ceil(rows / step) / MAX_CUTS))
  return [0] + list(range(step, rows, step)) + [rows]


def _group_tables(rows: int, step: int, gemm_end, comm_time, tail=None):
  """(cuts, ready, comm): cut_grid, gemm_end at each cut, comm[i, j] = comm_time of a group
  from cuts[i] to cuts[j] (inf for j <= i), plus tail(cuts[i], rows) for the last group
  (work after its communication that nothing hides, e.g. the all-reduce's last copy-out)."""
  import numpy as np
  cuts = cut_grid(rows, step)
  size = len(cuts)
  ready = np.array([gemm_end(c) for c in cuts], dtype=np.float64)
  comm = np.full((size, size), np.inf)
  for i in range(size):
    for j in range(i + 1, size):
      comm[i, j] = comm_time(cuts[i], cuts[j])
    if tail is not None and i < size - 1:
      comm[i, size - 1] += tail(cuts[i], cuts[-1])
  return cuts, ready, comm


def _bands(cuts, prev, last) -> tuple:
  bounds = [last]
  while bounds[-1] != 0:
    bounds.append(prev[bounds[-1]])
  return tuple(cuts[j] for j in reversed(bounds))


def cuts_by_count(rows: int, step: int, gemm_end, comm_time, max_groups: int,
                  tail=None) -> dict:
  """{G: (end, band_rows)}: for each group count G <= max_groups, the plan with the earliest
  end (dynamic programming over cut_grid, the count in the state). gemm_end(r): when the GEMM
  has written rows [0, r) of every block; comm_time(r0, r1): one group's communication;
  tail(r0, rows): what follows the last group's (None: nothing). Each group starts when both
  its rows and the previous group are done. Vectorized (numpy): G passes over the cuts x cuts
  table of group times."""
  return _by_count(*_group_tables(rows, step, gemm_end, comm_time, tail), max_groups)


def _by_count(cuts, ready, comm, max_groups: int) -> dict:
  """cuts_by_count on _group_tables' tables."""
  import numpy as np
  size = len(cuts)
  best = np.full(size, np.inf)  # minimal end of a plan whose last group ends at cuts[j]
  best[0] = 0.0
  prevs = []
  out = {}
  for g in range(1, min(max_groups, size - 1) + 1):
    t = np.maximum(ready[None, :], best[:, None]) + comm  # from cuts[i] (rows) to cuts[j]
    low = t.min(axis=0)
    # The first i within 1e-12 of the minimum: ties keep the earlier cut, whatever the rounding.
    prevs.append(np.argmax(t <= low[None, :] + 1e-12, axis=0))
    best = low
    if np.isfinite(best[-1]):
      bounds = [size - 1]
      for back in reversed(prevs):
        bounds.append(int(back[bounds[-1]]))
      out[g] = (float(best[-1]), tuple(cuts[j] for j in reversed(bounds)))
  return out


def best_cuts(rows: int, step: int, gemm_end, comm_time, tail=None) -> tuple:
  """band_rows of the earliest-ending plan with at most MAX_GROUPS groups; tail(r0, rows): the
  time after the last group's communication that nothing hides (None: none), part of the end
  minimized (without it the search preferred one large last band whose copy-out the plan's
  predicted time then charged: up to 11% slower plans at small K).

  First the DP without a count (one predecessor per cut); when its optimum has more than
  MAX_GROUPS groups (large M), the count-aware one (cuts_by_count; the fewest groups among
  near ties). The first pass alone used to drop the extensions past the cap, which at
  M = 98304 left 64 groups with a 26112-row last band, predicted 12.8 ms where 15 groups
  take 10.8 ms, and at M = 196608 a plan slower than XLA (so XLA's path) where 55 groups
  were 20% faster."""
  cuts, ready, comm = _group_tables(rows, step, gemm_end, comm_time, tail)
  inf = float("inf")
  best = [0.0] + [inf] * (len(cuts) - 1)  # best[j]: minimal end of a plan ending at cuts[j]
  prev = [0] * len(cuts)
  count = [0] * len(cuts)
  for j in range(1, len(cuts)):
    for i in range(j):
      t = max(ready[j], best[i]) + comm[i, j]
      if t < best[j] - 1e-12:
        best[j], prev[j], count[j] = t, i, count[i] + 1
  if count[-1] <= MAX_GROUPS:
    return _bands(cuts, prev, len(cuts) - 1)
  plans = _by_count(cuts, ready, comm, MAX_GROUPS)
  end = min(e for e, _ in plans.values())
  return next(bands for _, (e, bands) in sorted(plans.items()) if e <= end + 1e-12)
