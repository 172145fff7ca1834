"""The group plan's dynamic programming (plan_search.best_cuts, cuts_by_count) against scalar
reference implementations written here, and the default plan where the 64-group cap binds
(large M: the search used to drop the extensions past the cap and return far worse plans)."""
import dataclasses
import math
import random

import pytest

from jax_flashoverlap import plan as P
from jax_flashoverlap import plan_search as S
from jax_flashoverlap import tile_schedule as ts


def _by_count_reference(rows, step, gemm_end, comm_time, max_groups, tail=None):
  """Scalar triple loop: {G: earliest end} over the same candidate cuts (tail: after the last
  group's communication)."""
  cuts = S.cut_grid(rows, step)
  last = len(cuts) - 1
  extra = lambda i, j: tail(cuts[i], cuts[j]) if tail and j == last else 0.0  # noqa: E731
  best = {0: {0: 0.0}}
  for g in range(1, max_groups + 1):
    best[g] = {}
    for j in range(1, len(cuts)):
      options = [max(gemm_end(cuts[j]), t) + comm_time(cuts[i], cuts[j]) + extra(i, j)
                 for i, t in best[g - 1].items() if i < j]
      if options:
        best[g][j] = min(options)
  return {g: row[len(cuts) - 1] for g, row in best.items() if len(cuts) - 1 in row and g}


def _old_capped_search(rows, step, gemm_end, comm_time):
  """The search before the fix: one predecessor per cut, extensions past the cap dropped."""
  cuts = [0] + list(range(step, rows, step)) + [rows]
  best, prev, count = [0.0] + [math.inf] * (len(cuts) - 1), [0] * len(cuts), [0] * len(cuts)
  for j in range(1, len(cuts)):
    for i in range(j):
      if best[i] == math.inf or count[i] + 1 > P.MAX_GROUPS:
        continue
      t = max(gemm_end(cuts[j]), best[i]) + comm_time(cuts[i], cuts[j])
      if t < best[j] - 1e-12:
        best[j], prev[j], count[j] = t, i, count[i] + 1
  bounds = [len(cuts) - 1]
  while bounds[-1]:
    bounds.append(prev[bounds[-1]])
  return tuple(cuts[j] for j in reversed(bounds))


def _random_problem(seed):
  rng = random.Random(seed)
  step = rng.choice([128, 256])
  rows = step * rng.randint(2, 24) + rng.choice([0, 0, rng.randint(1, step - 1)])
  per_row, latency = rng.uniform(0.5, 2.0), rng.uniform(0.0, 40.0)
  wave = step * rng.randint(1, 4)
  bandwidth = rng.uniform(0.3, 3.0)
  gemm_end = lambda r: math.ceil(r / wave) * wave * per_row  # noqa: E731  waves of units
  comm_time = lambda r0, r1: latency + (r1 - r0) / bandwidth  # noqa: E731
  return rows, step, gemm_end, comm_time


@pytest.mark.parametrize("seed", range(40))
def test_cuts_by_count_is_exact_per_group_count(seed):
  rows, step, gemm_end, comm_time = _random_problem(seed)
  max_groups = 6
  got = S.cuts_by_count(rows, step, gemm_end, comm_time, max_groups)
  want = _by_count_reference(rows, step, gemm_end, comm_time, max_groups)
  assert sorted(got) == sorted(want)
  for g, (end, bands) in got.items():
    assert end == pytest.approx(want[g], rel=1e-12, abs=1e-12)
    assert len(bands) == g + 1 and bands[0] == 0 and bands[-1] == rows
    assert all(b0 < b1 for b0, b1 in zip(bands, bands[1:]))
    assert P.pipeline_time(bands, gemm_end, comm_time) == pytest.approx(end, rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_best_cuts_is_the_earliest_plan_within_the_cap(seed):
  rows, step, gemm_end, comm_time = _random_problem(seed)
  bands = S.best_cuts(rows, step, gemm_end, comm_time)
  ends = S.cuts_by_count(rows, step, gemm_end, comm_time, P.MAX_GROUPS)
  assert len(bands) - 1 <= P.MAX_GROUPS
  assert P.pipeline_time(bands, gemm_end, comm_time) == pytest.approx(
      min(e for e, _ in ends.values()), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_the_search_minimizes_the_end_with_the_last_groups_tail(seed):
  """A tail after the last group's communication (the all-reduce's copy-out, the all-to-all's
  concat_axis=1 copies) is part of what both passes minimize: without it the search chose
  plans with one large last band, whose copy the predicted time then charged."""
  rows, step, gemm_end, comm_time = _random_problem(seed)
  per_row = random.Random(seed).uniform(0.2, 2.0)
  tail = lambda r0, r1: per_row * (r1 - r0)  # noqa: E731
  got = S.cuts_by_count(rows, step, gemm_end, comm_time, 6, tail=tail)
  want = _by_count_reference(rows, step, gemm_end, comm_time, 6, tail=tail)
  assert sorted(got) == sorted(want)
  for g, (end, bands) in got.items():
    assert end == pytest.approx(want[g], rel=1e-12, abs=1e-12)
    assert end == pytest.approx(P.pipeline_time(bands, gemm_end, comm_time) + tail(*bands[-2:]),
                                rel=1e-12)
  bands = S.best_cuts(rows, step, gemm_end, comm_time, tail=tail)
  assert P.pipeline_time(bands, gemm_end, comm_time) + tail(*bands[-2:]) == pytest.approx(
      min(want.values()) if len(S.cut_grid(rows, step)) - 1 <= 6 else
      min(e for e, _ in S.cuts_by_count(rows, step, gemm_end, comm_time, P.MAX_GROUPS,
                                        tail=tail).values()), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("collective, m, n, k, world, better", [
    ("all_reduce", 13622, 22480, 664, 2, (0, 768, 3840, 13568, 13622)),
    ("all_reduce", 16369, 15752, 512, 4, (0, 256, 2048, 16128, 16369)),
])
def test_the_all_reduce_plan_counts_its_copy_out(collective, m, n, k, world, better):
  """A helper's shapes: the plan chosen was 11% (8%) slower by the model's own time than these
  bands at the same comm_sms; the second fell back to XLA though these bands would gain."""
  plan = P.default_plan(collective, m, n, k, world)
  profile = P.profile_for_world(world)
  assert plan.predicted_s <= P.plan_time(collective, m, n, k, world, better, plan.comm_sms,
                                         profile=profile) * (1 + 1e-9)
  assert plan.overlap


def test_best_cuts_where_the_cap_binds():
  """Free communication per row and a latency so small that one group per cut is optimal:
  300 cuts, so the unconstrained optimum has 300 groups; the answer must be the best plan of
  at most 64 groups (the count-aware DP), not a 64-group prefix with one huge last band."""
  step, rows = 256, 256 * 300
  gemm_end = lambda r: float(r)  # noqa: E731
  comm_time = lambda r0, r1: 1e-3 + 0.5 * (r1 - r0)  # noqa: E731
  bands = S.best_cuts(rows, step, gemm_end, comm_time)
  best = min(e for e, _ in S.cuts_by_count(rows, step, gemm_end, comm_time, P.MAX_GROUPS).values())
  assert len(bands) - 1 <= P.MAX_GROUPS
  assert P.pipeline_time(bands, gemm_end, comm_time) == pytest.approx(best, rel=1e-12)
  old = _old_capped_search(rows, step, gemm_end, comm_time)
  assert P.pipeline_time(old, gemm_end, comm_time) > 1.1 * best  # what the fix changes
  assert max(b1 - b0 for b0, b1 in zip(old, old[1:])) > 100 * step


@pytest.mark.parametrize("collective, m, world, better_than", [
    ("all_reduce", 98304, 2, 0.9),      # was 64 groups, a 26112-row last band: 12.79 ms
    ("all_reduce", 131072, 2, 0.8),     # was 18.98 ms
    ("reduce_scatter", 196608, 2, 0.85),  # was slower than XLA: XLA's path
])
def test_default_plan_at_large_m(collective, m, world, better_than):
  n, k = 8192, 4096
  plan = P.default_plan(collective, m, n, k, world)
  plan.validate()
  prof = P.profile_for_world(world)
  kern = ts.kernel_geometry(m, n, plan.comm_sms)
  unit = 2.0 * kern.block_m * kern.block_n * k / prof.sm_flops * prof.interference
  gemm_end = P.gemm_end_fn(collective, m, n, world, plan.comm_sms, unit, k)
  blocks = world if collective == "reduce_scatter" else 1
  comm = lambda r0, r1: P._comm_time(collective, blocks * (r1 - r0) * n * 2, world, prof,  # noqa: E731
                                     plan.comm_sms)
  old = _old_capped_search(m // blocks, kern.rows_per_unit, gemm_end, comm)
  old_time = P.plan_time(collective, m, n, k, world, old, plan.comm_sms)
  assert plan.overlap
  assert plan.predicted_s < better_than * old_time


def test_default_plans_of_the_design_shapes_are_unchanged_by_the_fix():
  """Where the cap does not bind, the first pass is the search as it was (measured plans)."""
  for collective in ("all_reduce", "reduce_scatter"):
    for m, n, k in [(4096, 8192, 4096), (8192, 8192, 4096), (16384, 8192, 8192),
                    (8192, 28672, 4096), (8192, 8192, 14336)]:
      plan = P.default_plan(collective, m, n, k, 2)
      prof = P.profile_for_world(2)
      kern = ts.kernel_geometry(m, n, plan.comm_sms)
      unit = 2.0 * kern.block_m * kern.block_n * k / prof.sm_flops * prof.interference
      gemm_end = P.gemm_end_fn(collective, m, n, 2, plan.comm_sms, unit, k)
      blocks = 2 if collective == "reduce_scatter" else 1
      comm = lambda r0, r1: P._comm_time(collective, blocks * (r1 - r0) * n * 2, 2, prof,  # noqa: E731
                                         plan.comm_sms)
      assert plan.band_rows == _old_capped_search(m // blocks, kern.rows_per_unit, gemm_end,
                                                  comm)


def test_cut_grid_coarsens_past_max_cuts():
  assert S.cut_grid(1000, 256) == [0, 256, 512, 768, 1000]
  grid = S.cut_grid(256 * (S.MAX_CUTS * 3), 256)
  assert len(grid) - 1 <= S.MAX_CUTS and grid[1] % 256 == 0 and grid[1] > 256


@pytest.mark.parametrize("kw, match", [
    ({"num_groups": 0}, r"num_groups must be in \[1, 64\], got 0"),   # was one group, silently
    ({"num_groups": 65}, r"num_groups must be in \[1, 64\], got 65"),
    ({"comm_sms": 131}, r"comm_sms must be in \[0, 130\], got 131"),
    ({"comm_sms": -1}, r"comm_sms must be in \[0, 130\], got -1"),
])
def test_forced_rejects_out_of_range_numbers(kw, match):
  with pytest.raises(ValueError, match=match):
    P.forced(**kw)
  with pytest.raises(TypeError, match="num_groups must be an int or None, got 2.0"):
    P.forced(num_groups=2.0)
  with P.forced(num_groups=64, comm_sms=130):  # the bounds are legal
    assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2).comm_sms == 130


def test_the_all_to_all_plan_counts_its_concat_axis_1_copies():
  """concat_axis=1's last-group copies are part of the search too (a helper's shape: the
  plan chose (0, 512, 4878), 12.6% slower by the model's own time than (0, 512, 4864, 4878))."""
  from jax_flashoverlap import plan_a2a as A
  m, n, k, world = 19512, 11968, 208, 4
  plan = A.choose_a2a_plan(m, n, k, world, 0, 1)
  assert plan.predicted_s <= A.a2a_plan_time(m, n, k, world, 0, 1, (0, 512, 4864, 4878),
                                             plan.comm_sms) * (1 + 1e-9)


def test_bus_bandwidth_below_the_first_calibrated_cta_count_is_proportional():
  """Fewer CTAs than the table's first point run proportionally slower (a cap of 4 is half
  the 8-CTA bandwidth), not as fast as 8: the model would otherwise pick starved caps."""
  table = ((8, 240e9), (16, 300e9))
  assert P._busbw(table, 4) == pytest.approx(120e9)
  assert P._busbw(table, 8) == pytest.approx(240e9)
  assert P._busbw(table, 12) == pytest.approx(270e9)
  assert P._busbw(table, 64) == pytest.approx(300e9)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_baseline_uses_xlas_bandwidth_of_its_own_collective(collective):
  """XLA's dot + all-reduce / reduce-scatter (the baseline the plan must beat), each at its
  own bus bandwidth: the reduce-scatter's is not the all-reduce's."""
  m, n, k, world = 8192, 8192, 4096, 4
  p = P.MachineProfile(xla_all_reduce_busbw=100e9, xla_reduce_scatter_busbw=400e9)
  gemm = 2.0 * m * n * k / (p.sm_flops * ts.NUM_SMS)
  nbytes = m * n * 2
  wire = (nbytes * 2 * (world - 1) / world / 100e9 if collective == "all_reduce"
          else nbytes * (world - 1) / world / 400e9)
  assert P.baseline_time(collective, m, n, k, world, 2, p) == pytest.approx(
      gemm + p.comm_latency + wire, rel=1e-12)


@pytest.mark.parametrize("collective, in_place, charged", [
    ("all_reduce", False, True), ("all_reduce", True, False), ("reduce_scatter", False, False)])
def test_plan_time_charges_the_last_bands_copy_out_only_from_the_workspace(
    collective, in_place, charged):
  """plan_time (the predicted_s the fallback compares) adds the all-reduce's last copy out of
  the workspace (last band's bytes / copy bandwidth); in place on XLA's output, or for a
  reduce-scatter, there is none."""
  m, n, k, world, bands = 8192, 8192, 4096, 2, (0, 2048, 6144, 8192)
  base = P.MachineProfile(all_reduce_in_place=in_place)
  slow = dataclasses.replace(base, copy_bandwidth=1e11)
  fast = dataclasses.replace(base, copy_bandwidth=1e30)
  extra = (P.plan_time(collective, m, n, k, world, bands, 16, profile=slow)
           - P.plan_time(collective, m, n, k, world, bands, 16, profile=fast))
  want = (8192 - 6144) * n * 2 / 1e11 if charged else 0.0
  assert extra == pytest.approx(want, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("units", [1025, 1500, 2047, 2048, 5000])
def test_cut_grid_stays_within_max_cuts(units):
  """Past MAX_CUTS units the step coarsens enough to stay within MAX_CUTS candidate cuts (the
  DP's cost grows as their square): a floor instead of a ceiling left up to 2x as many."""
  cuts = S.cut_grid(units * 128, 128)
  assert len(cuts) - 1 <= S.MAX_CUTS and cuts[0] == 0 and cuts[-1] == units * 128


@pytest.mark.parametrize("split,concat", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_the_all_to_all_plan_time_of_one_group_by_hand(split, concat):
  """a2a_plan_time (every plan's predicted_s, the fall-back decision's input) of a one-group
  plan, by hand: split_axis 0 is world row blocks of M / world x N (all of them GEMM work
  before the group leaves), split_axis 1 one block of M x N / world columns; concat_axis 1
  adds the last group's exposed 2-D copies."""
  from jax_flashoverlap import plan_a2a as A
  m, n, k, world, sms, p = 4096, 8192, 4096, 4, 16, A.DEFAULT_PROFILE
  blocks, rows, cols = {0: (world, m // world, n), 1: (1, m, n // world)}[split]
  assert A.a2a_shape(m, n, world, split) == (blocks, rows, cols)
  step, block_n, grid = A._kernel(m, n, sms)
  units = blocks * math.ceil(rows / step) * math.ceil(n / block_n)
  want = (math.ceil(units / grid) * A._unit_time(k, step, block_n, p) + p.comm_latency
          + (world - 1) * rows * cols * 2 / A._busbw(p.p2p_bw, sms))
  if concat == 1:
    want += world * rows * cols * 2 / p.copy_bandwidth
  got = A.a2a_plan_time(m, n, k, world, split, concat, (0, rows), sms)
  assert got == pytest.approx(want, rel=1e-12)
