"""The cost model's picture of our GEMM: wave-aligned comm_sms, the kernel's units in the
reduce-scatter model, the split tail and the ping-pong schedule as the launcher has them, and
the plan cache following the kernel's launch-time switches (split from test_tuning.py)."""
import dataclasses
import math
import pathlib

import pytest

from jax_flashoverlap import plan as P
from jax_flashoverlap import tile_schedule as ts
from jax_flashoverlap import tune


@pytest.mark.parametrize("m, n", [(4096, 8192), (8192, 8192), (16384, 8192), (8192, 28672),
                                  (8192, 1024), (777, 4096)])
def test_wave_aligned_comm_sms_costs_the_gemm_nothing(m, n):
    """Raised comm_sms keeps the tile shape and the GEMM's waves; one SM more would not."""
    for c in (8, 12, 16):
        up = ts.wave_aligned_comm_sms(m, n, c, 40)
        assert c <= up <= 40
        assert ts.gemm_waves(m, n, up) == ts.gemm_waves(m, n, c)
        assert ts.cut_step(m, n, up) == ts.cut_step(m, n, c)
        if up < 40:
            assert (ts.gemm_waves(m, n, up + 1) > ts.gemm_waves(m, n, c)
                    or ts.cut_step(m, n, up + 1) != ts.cut_step(m, n, c))
        assert ts.wave_aligned_comm_sms(m, n, c, c) == c  # the limit holds


def test_wave_aligned_examples():
    # 8192 x 8192: 1024 units of 256 x 256; 62 clusters (8 SMs left) and 61 (10) both take
    # 17 waves, 60 (12) take 18
    assert ts.gemm_waves(8192, 8192, 8) == ts.gemm_waves(8192, 8192, 10) == 17
    assert ts.wave_aligned_comm_sms(8192, 8192, 8, 16) == 10
    # 4096 x 8192: 512 units; 9 waves from 8 up to 18 SMs left
    assert ts.wave_aligned_comm_sms(4096, 8192, 8, 32) == 18


@pytest.mark.parametrize("m, n, k, world", [(9216, 4096, 4096, 8), (15104, 1024, 4096, 2),
                                             (26112, 8192, 4096, 4), (2816, 8192, 2048, 2)])
def test_reduce_scatter_model_counts_the_kernels_units(m, n, k, world):
    """The kernel cuts each rank block's band into cluster rows on its own (tile_schedule.h
    ClusterRowsInGroup / CountUnits), so with M / world not a multiple of the unit rows every
    block ends in a partial unit. The model counted ceil(M / unit rows) (9216 x 4096 on 8
    ranks: 576 units for the kernel's 640) and predicted the GEMM's end too early."""
    plan = P.default_plan("reduce_scatter", m, n, k, world)
    kern = ts.kernel_geometry(m, n, plan.comm_sms)
    b = plan.band_rows
    units = sum(world * math.ceil((b1 - b0) / kern.rows_per_unit) for b0, b1 in zip(b, b[1:]))
    units *= math.ceil(n / kern.block_n)
    rows = m // world
    whole = P.gemm_end_fn("reduce_scatter", m, n, world, plan.comm_sms, 1.0)
    assert whole(rows) == math.ceil(units / kern.grid)
    k_tiles = math.ceil(k / ts.BLOCK_K)
    split, _, length = ts.split_tail(units, kern.grid, k_tiles, kern.max_split_slots)
    waves = ((units - split) / kern.grid + length / k_tiles if split
             else math.ceil(units / kern.grid))
    tail = P.gemm_end_fn("reduce_scatter", m, n, world, plan.comm_sms, 1.0, k)
    assert tail(rows) == pytest.approx(waves)
    for c in ts.raised_comm_sms_candidates(m, n, (8, 16), 16, k, world):  # no extra wave
        base = max(s for s in (8, 16) if s <= c)
        assert ts.gemm_waves(m, n, c, k, world) <= ts.gemm_waves(m, n, base, k, world)


def test_reduce_scatter_fallback_uses_the_kernels_units():
    # 1408 rows per rank: the undercount predicted 277 us against XLA's 290 (overlap); with
    # the kernel's units it is 289, not 3% faster: XLA's path.
    assert not P.default_plan("reduce_scatter", 2816, 8192, 2048, 2).overlap
    # The all-to-all's blocks (split_axis 0) likewise: 3200 rows per rank take 7 waves from 8
    # to 12 SMs left (counted over all of M: 6.45 at 8, 6.56 at 9).
    from jax_flashoverlap import plan_a2a
    assert plan_a2a._comm_sms_candidates(6400, 4096, plan_a2a.DEFAULT_PROFILE, 4096, 2) == [
        8, 12, 16]


def test_model_considers_the_wave_aligned_comm_sms(monkeypatch):
    """At 8192 x 8192 x 4096 all-reduce with whole units, 10 SMs cost the GEMM what 8 do and
    give NCCL more bandwidth (the profile interpolates between 8 and 16): the model takes 10.
    With the split tail (the default), 8 SMs left take 16.53 unit times and 10 take 17 (their
    last wave, 48 of 61 units, is too full to split): 10 costs the GEMM, and the model keeps 8."""
    monkeypatch.setenv("FLASHOVERLAP_GEMM_TAIL", "whole")
    plan = P.default_plan("all_reduce", 8192, 8192, 4096, 2)
    eight = P.default_plan("all_reduce", 8192, 8192, 4096, 2, 2,
                           dataclasses.replace(P.DEFAULT_PROFILE, comm_sms=8))
    assert plan.comm_sms == 10 and plan.predicted_s < eight.predicted_s
    monkeypatch.delenv("FLASHOVERLAP_GEMM_TAIL")
    assert ts.gemm_waves(8192, 8192, 8, 4096) == pytest.approx(15 + 98 / 64)
    assert ts.gemm_waves(8192, 8192, 10, 4096) == 17
    assert ts.wave_aligned_comm_sms(8192, 8192, 8, 16, 4096) == 8  # 9 left: 61 clusters, 17
    split = P.default_plan("all_reduce", 8192, 8192, 4096, 2)
    assert split.comm_sms == 8 and split.predicted_s < plan.predicted_s


def test_split_tail_mirrors_the_launcher():
    """ts.split_tail is PlanSplitTail (xla_ffi/kernels/tile_schedule.h): the values the
    launcher reported on one H200 (gemm_test correctness, `split=units/chunks`), and the
    header's thresholds."""
    assert ts.split_tail(1024, 66, 64, 66) == (100, 66, 97)   # 8192 x 8192 x 4096, 132 SMs
    assert ts.split_tail(1024, 66, 16, 66) == (100, 64, 25)   # K 1024
    assert ts.split_tail(588, 58, 16, 66) == (66, 56, 19)     # 5000 x 7168 x 1000, 116 SMs
    assert ts.split_tail(4096, 132, 24, 264) == (136, 131, 25)  # 128 x 128 tiles
    assert ts.split_tail(512, 66, 64, 66) == (0, 0, 0)        # last wave 50 / 66: too full
    assert ts.split_tail(1056, 66, 64, 66) == (0, 0, 0)       # full last wave
    assert ts.split_tail(1024, 66, 8, 66) == (0, 0, 0)        # too few K tiles
    assert ts.split_tail(1024, 66, 64, 10) == (0, 0, 0)       # partials do not fit
    header = (pathlib.Path(__file__).parent.parent / "xla_ffi/kernels/tile_schedule.h").read_text()
    assert f"kSplitMinKTiles = {ts.SPLIT_MIN_K_TILES};" in header
    assert f"kGemmBlockK = {ts.BLOCK_K};" in header
    assert "if (R == 0 || 10 * R > 7 * C) return;" in header
    wide, narrow = ts.kernel_geometry(8192, 8192, 0), ts.kernel_geometry(128, 1024, 0)
    assert (wide.max_split_slots, narrow.max_split_slots) == (66, 264)


def test_pingpong_schedule_geometry(monkeypatch):
    # FLASHOVERLAP_GEMM_SCHEDULE=pingpong: 128x128 tiles in the same 2x1 clusters where the
    # cooperative kernel takes 128x256 ones (signaling_gemm.cu: ChooseTileShape); small
    # problems keep the cluster-less 128x128 tiles.
    monkeypatch.setenv("FLASHOVERLAP_GEMM_SCHEDULE", "pingpong")
    wide, narrow = ts.kernel_geometry(8192, 8192, 8), ts.kernel_geometry(128, 1024, 0)
    assert (wide.block_m, wide.block_n, wide.cluster_m, wide.grid) == (128, 128, 2, 62)
    assert (narrow.block_n, narrow.cluster_m) == (128, 1)
    assert wide.max_split_slots == 132  # Config::kMaxSplitSlots of the ping-pong instance
    # Same work per wave as the cooperative kernel's 256 x 256 units, in twice as many units.
    monkeypatch.delenv("FLASHOVERLAP_GEMM_SCHEDULE")
    assert ts.kernel_geometry(8192, 8192, 8).block_n == 256
    source = (pathlib.Path(__file__).parent.parent / "xla_ffi/kernels/signaling_gemm.cu").read_text()
    assert '"FLASHOVERLAP_GEMM_SCHEDULE", "cooperative", "pingpong"' in source
    assert "wide = GemmTileShape{128, 128, 2}" in source


def test_pingpong_schedule_leaves_transpose_w_plans_alone(monkeypatch):
    """The launcher keeps the cooperative 128x256 tiles for [N, K] weights whatever
    FLASHOVERLAP_GEMM_SCHEDULE says (ChooseTileShape): the plans of transpose_w ops do not
    change with it (they did: the model priced 128x128 ping-pong tiles)."""
    from jax_flashoverlap import plan_a2a as A

    def plans(transpose_w):
        return (P.choose_plan("all_reduce", 8192, 8192, 4096, 2, transpose_w=transpose_w),
                P.choose_plan("reduce_scatter", 8192, 8192, 4096, 2, transpose_w=transpose_w),
                A.choose_a2a_plan(8192, 8192, 4096, 2, 0, 0, transpose_w=transpose_w),
                A.choose_all_gather_plan(4096, 8192, 8192, 2, transpose_w=transpose_w))

    nk, kn = plans(True), plans(False)
    monkeypatch.setenv("FLASHOVERLAP_GEMM_SCHEDULE", "pingpong")
    assert ts.kernel_geometry(8192, 8192, 8, transpose_w=True).block_n == 256
    assert plans(True) == nk
    assert all(a != b for a, b in zip(plans(False), kn))  # [K, N]: ping-pong tiles
    source = (pathlib.Path(__file__).parent.parent / "xla_ffi/kernels/signaling_gemm.cu").read_text()
    assert "pingpong && !args.transpose_w" in source


def test_cached_plans_follow_the_kernel_switches(monkeypatch):
    """A plan cached under one kernel (switches read at lowering) is not returned under
    another: the caches key on ts.kernel_switches()."""
    from jax_flashoverlap import plan_a2a
    args = ("all_reduce", 8192, 8192, 4096, 2)
    for env in ("FLASHOVERLAP_GEMM_SCHEDULE", "FLASHOVERLAP_GEMM_TAIL"):
        value = {"FLASHOVERLAP_GEMM_SCHEDULE": "pingpong", "FLASHOVERLAP_GEMM_TAIL": "whole"}[env]
        usual = P.default_plan(*args)
        monkeypatch.setenv(env, value)
        other = P.default_plan(*args)
        assert other == P.default_plan.__wrapped__(*args)
        assert other.predicted_s != usual.predicted_s
        assert (plan_a2a.default_all_gather_plan(4096, 8192, 8192, 2)
                == plan_a2a.default_all_gather_plan.__wrapped__(4096, 8192, 8192, 2))
        monkeypatch.delenv(env)
        assert P.default_plan(*args) == usual


def test_gemm_waves_follow_the_split_switches(monkeypatch):
    # 2048 units on 66 clusters: 30 waves whole, then 68 units as 66 chunks of 132 K tiles
    assert ts.gemm_waves(16384, 8192, 0, 8192) == pytest.approx(30 + 132 / 128)
    monkeypatch.setenv("FLASHOVERLAP_GEMM_QUEUE", "static")  # no queue: no split tail
    assert ts.gemm_waves(16384, 8192, 0, 8192) == 32
    monkeypatch.delenv("FLASHOVERLAP_GEMM_QUEUE")
    monkeypatch.setenv("FLASHOVERLAP_GEMM_TAIL", "whole")
    assert ts.gemm_waves(16384, 8192, 0, 8192) == 32


def test_tuner_raises_each_comm_sms_to_its_wave_aligned_value():
    assert tune.problem_comm_sms(8192, 8192, [8, 12, 16]) == [10, 15, 18]
    assert tune.problem_comm_sms(8192, 28672, [16, 8, 12]) == [8, 12, 16]  # already aligned
    assert tune.problem_comm_sms(8192, 8192, [8, 12, 16], align=False) == [8, 12, 16]
    for m, n in [(4096, 8192), (16384, 8192)]:
        got = tune.problem_comm_sms(m, n, [8, 12, 16])
        assert len(got) == len(set(got)) and got == sorted(got)
        assert all(ts.gemm_waves(m, n, s) == ts.gemm_waves(m, n, c)
                   for s, c in zip(got, [8, 12, 16]))


def test_wide_tiles_from_exactly_one_full_wave():
  """ChooseTileShape (signaling_gemm.cu) takes the 128x256 clusters once the wide tiles fill
  one wave, `wide_tiles >= usable`: at exactly one wave the model must agree (the plan's cut
  step and waves follow the shape)."""
  usable = ts.NUM_SMS - 8                       # 124
  n = 512                                      # 2 wide tiles per 128 rows
  m = 128 * usable // 2                        # wide_tiles == usable
  assert ts.kernel_geometry(m, n, 8) == ts.KernelGeometry(128, 256, 2, usable // 2)
  assert ts.kernel_geometry(m - 128, n, 8) == ts.KernelGeometry(128, 128, 1, usable)


def test_wave_aligned_comm_sms_never_passes_the_most_sms_a_call_may_leave():
  """Raising comm_sms stops at the GEMM's last 2-SM cluster (MAX_COMM_SMS), whatever limit is
  asked (tune --comm-sms 128 asks up to 136): 3 wide tiles take 3 waves on one cluster from
  129 SMs left to 130; at 131 the grid would be empty (and the plan invalid)."""
  assert ts.wave_aligned_comm_sms(128, 768, 129, 200) == P.MAX_COMM_SMS
  assert ts.wave_aligned_comm_sms(128, 768, 129, 129) == 129


def test_tuner_comm_sms_order_duplicates_and_the_last_values_limit():
    """problem_comm_sms: the requested values in any order or repeated give the same values
    (each raised below the next larger one), and the largest is raised by at most 8."""
    assert tune.problem_comm_sms(8192, 8192, [16, 8, 12]) == [10, 15, 18]
    assert tune.problem_comm_sms(8192, 8192, [8, 8, 12]) == [10, 18]
    assert tune.problem_comm_sms(2048, 2048, [8, 12, 16]) == [11, 15, 24]  # 16 + 8, not more
