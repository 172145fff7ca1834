"""The tuner's measured cost model and search (jax_flashoverlap.tune_model), its config
entries and progress display (jax_flashoverlap.tune), and forced explicit plans: on CPU."""
import dataclasses
import io
import itertools
import math

import pytest

from jax_flashoverlap import plan as P
from jax_flashoverlap import tile_schedule as ts
from jax_flashoverlap import tune, tune_model as TM, tuning

from _tune_fakes import fake_gpu_timings, tune_args


def test_fit_comm_curve_recovers_latency_and_bandwidth():
    lat, bw, total = 25e-6, 180e9, 128 << 20
    points = [(g, total, g * lat + total / bw) for g in (1, 2, 4, 8)]
    curve = TM.fit_comm_curve(points)
    assert curve.latency_s == pytest.approx(lat, rel=1e-9)
    assert curve.bytes_per_s == pytest.approx(bw, rel=1e-9)
    assert curve.time(1 << 20) == pytest.approx(lat + (1 << 20) / bw)


def test_fit_comm_curve_clamps_negative_latency_and_needs_two_group_counts():
    total = 64 << 20
    # times that shrink with more groups: no positive latency fits; bandwidth alone
    curve = TM.fit_comm_curve([(1, total, 1.0e-3), (4, total, 0.9e-3)])
    assert curve.latency_s == 0.0 and curve.bytes_per_s > 0
    with pytest.raises(ValueError, match="two or more group counts"):
        TM.fit_comm_curve([(2, total, 1e-3), (2, total, 1.1e-3)])
    # times that do not grow at all (a broken timer): this error, not a ZeroDivisionError
    with pytest.raises(ValueError, match="do not grow with bytes"):
        TM.fit_comm_curve([(1, total, 0.0), (2, 2 * total, 0.0)])


def _calibration_from_profile(collective, m, n, k, world, sms_list, p=P.DEFAULT_PROFILE):
    """The calibration under which tune_model must predict exactly what plan.py does."""
    wave, comm = {}, {}
    for sms in sms_list:
        kern = ts.kernel_geometry(m, n, sms)
        wave[sms] = 2.0 * kern.block_m * kern.block_n * k / p.sm_flops
        if collective == "all_reduce":
            bw = P._busbw(p.all_reduce_busbw, sms) * world / (2 * (world - 1))
        else:
            bw = P._busbw(p.reduce_scatter_busbw, sms) * world / (world - 1)
        comm[sms] = TM.CommCurve(p.comm_latency, bw)
    return TM.Calibration(wave, comm, p.interference, p.copy_bandwidth, k=k)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("shape", [(8192, 8192, 4096), (4096, 8192, 4096), (8192, 28672, 4096)])
def test_predict_matches_the_cost_model_under_its_own_calibration(collective, shape):
    m, n, k = shape
    cal = _calibration_from_profile(collective, m, n, k, 2, (8, 16))
    for sms in (8, 16):
        for groups in (1, 3, 6):
            bands = P.aligned_even_bands(collective, m, n, 2, groups, sms)
            assert TM.predict(collective, m, n, 2, bands, sms, cal) == pytest.approx(
                P.plan_time(collective, m, n, k, 2, bands, sms), rel=1e-12)


@pytest.mark.parametrize("m, n, k", [(8192, 8192, 4096),
                                     (8192, 8192, 1024)])  # small K: the copy-out's tail matters
def test_candidates_are_sorted_and_the_dp_plan_is_the_best_found(m, n, k):
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8, 16))
    cands = TM.candidates("all_reduce", m, n, 2, cal)
    times = [c.predicted_s for c in cands]
    assert times == sorted(times)
    assert len({(c.comm_sms, c.band_rows) for c in cands}) == len(cands)
    assert {c.comm_sms for c in cands} == {8, 16}
    # no even split beats the dynamic-programming optimum of the same comm_sms
    for sms in (8, 16):
        dp = next(c for c in cands if c.comm_sms == sms and c.how == "dp")
        evens = [c for c in cands if c.comm_sms == sms and c.how.startswith("even")]
        assert evens and all(dp.predicted_s <= c.predicted_s + 1e-15 for c in evens)
        # nor does one more cut in its last band (the all-reduce's copy-out is part of the
        # search: without it the dp plan kept one large last band whose copy predict charges)
        step = ts.cut_step(m, n, sms)
        for cut in range(dp.band_rows[-2] + step, m, step):
            bands = dp.band_rows[:-1] + (cut, m)
            assert dp.predicted_s <= TM.predict("all_reduce", m, n, 2, bands, sms, cal) + 1e-15


def test_small_problems_are_searched_exhaustively():
    m, n, k = 2048, 4096, 2048  # 8 work units of 256 rows: 2^7 compositions per comm_sms
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8,))
    cands = TM.candidates("all_reduce", m, n, 2, cal)
    step = ts.cut_step(m, n, 8)
    assert step == 256 or step == 128
    cuts = list(range(step, m, step))
    brute = min(TM.predict("all_reduce", m, n, 2, (0,) + c + (m,), 8, cal)
                for r in range(len(cuts) + 1) for c in itertools.combinations(cuts, r))
    assert len(cands) == 2 ** len(cuts)
    assert cands[0].predicted_s == pytest.approx(brute, rel=1e-12)


def test_shortlist_keeps_the_best_of_every_comm_sms():
    mk = lambda sms, t, g: TM.Candidate(sms, tuple(range(0, g + 1)), t, "x")
    cands = sorted([mk(8, 1.0, 2), mk(8, 1.1, 3), mk(8, 1.2, 4), mk(16, 2.0, 2), mk(12, 3.0, 2)],
                   key=lambda c: c.predicted_s)
    short = TM.shortlist(cands, 2)
    assert {c.comm_sms for c in short} == {8, 12, 16} and len(short) == 3
    assert [c.predicted_s for c in short] == sorted(c.predicted_s for c in short)
    assert len(TM.shortlist(cands, 4)) == 4 and TM.shortlist(cands, 4)[1].predicted_s == 1.1


def test_entries_validate_and_carry_the_model_error():
    chosen = TM.Candidate(16, (0, 1280, 4096, 8192), 1.0e-3, "dp")
    e = tune.entry_for("all_reduce", "bfloat16", 8192, 8192, 4096, 2, chosen, 1.05, 1.22)
    assert e["overlap"] and e["predicted_ms"] == pytest.approx(1.0)
    assert e["model_error"] == pytest.approx(1.0 / 1.05 - 1)
    xla = tune.entry_for("reduce_scatter", "bfloat16", 4096, 8192, 4096, 2, None, 0.0, 0.56)
    assert not xla["overlap"] and xla["band_rows"] == [0, 2048]
    assert xla["measured_ms"] == xla["baseline_ms"] == 0.56
    tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                     "entries": [e, xla]})
    with pytest.raises(tuning.ConfigError, match="model_error"):
        tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                         "entries": [dict(e, model_error="small")]})


def test_progress_lines_on_a_log():
    out = io.StringIO()
    bar = tune.Progress(4, stream=out, width=8)
    bar.show("calibrating")
    bar.step("calibrated")
    bar.step("timed")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[........] 0/4") and lines[0].endswith("calibrating")
    assert lines[1].startswith("[##......] 1/4") and lines[2].startswith("[####....] 2/4")


def test_progress_on_a_terminal_keeps_result_lines_apart_and_counts_the_cta_round(monkeypatch):
    """On a terminal the bar has no newline: a problem's result line (stdout) was glued to the
    bar's text, and the bar read 2/2 while the CTA-policy round still ran. Now a result line
    replaces the bar's line, and a problem's second step comes after its CTA round."""
    import contextlib
    import jax
    from jax_flashoverlap import bench_problem

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    fake_gpu_timings(monkeypatch)
    term, args = Terminal(), tune_args()
    bar = tune.Progress(2, stream=term)
    real_show, shown = bar.show, []
    monkeypatch.setattr(bar, "show", lambda what: (shown.append((bar.done, what)),
                                                   real_show(what)))
    pb = bench_problem.TpProblem(args, "all_reduce", (256, 256, 256), jax.random.key(0))
    with contextlib.redirect_stdout(term):
        tune.tune_problem(pb, args, bar)
    assert [d for d, what in shown if "CTA policies" in what] == [1]
    screen = [line.rsplit("\r", 1)[-1] for line in term.getvalue().replace("\033[K", "")
              .split("\n")]
    results = [line for line in screen if "xla 1.000 ms" in line]
    assert len(results) == 1 and results[0].startswith("all_reduce 256x256x256: xla"), screen
    assert screen[-3].startswith("[####") and screen[-3].endswith("timed"), screen


def test_forced_explicit_bands():
    bands = (0, 512, 2048, 8192)
    with P.forced(band_rows=bands, comm_sms=12):
        plan = P.choose_plan("all_reduce", 8192, 8192, 4096, 2)
    assert plan.band_rows == bands and plan.comm_sms == 12 and plan.overlap
    assert plan.predicted_s == pytest.approx(P.plan_time("all_reduce", 8192, 8192, 4096, 2,
                                                         bands, 12))
    with pytest.raises(ValueError, match="not both"):
        P.forced(num_groups=2, band_rows=bands)
    with P.forced(band_rows=(0, 512, 4096)):  # does not end at the block's rows
        with pytest.raises(ValueError, match="must start at 0 and end at 8192"):
            P.choose_plan("all_reduce", 8192, 8192, 4096, 2)
    # any iterable of ints, read once (a generator was consumed by the int check and the
    # plan got no bands at all)
    with P.forced(band_rows=(b for b in bands), comm_sms=12):
        assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2).band_rows == bands


def test_single_cta_policy_is_timed_and_saved(monkeypatch):
    """`tune --cta-policies zero`: every plan is calibrated and timed under that policy and the
    entry records it (one policy was ignored: default communicators, no cta_policy saved)."""
    import jax
    from jax_flashoverlap import bench_problem
    fake_gpu_timings(monkeypatch)
    policies, real = [], P.forced

    def spy(*a, **kw):
        policies.append(kw.get("cta_policy"))
        return real(*a, **kw)

    monkeypatch.setattr(P, "forced", spy)
    args = tune_args(cta_policies=["zero"])
    pb = bench_problem.TpProblem(args, "all_reduce", (256, 256, 256), jax.random.key(0))
    entry, row = tune.tune_problem(pb, args, tune.Progress(2, stream=io.StringIO()))
    assert policies and set(policies) == {"zero"}
    assert entry["overlap"] and entry["cta_policy"] == "zero" and row["entry"] is entry
    assert tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                            "entries": [entry]})


@pytest.mark.parametrize("policy_ms, overlap", [((1.05, 1.02), False), ((0.90, 0.95), True),
                                               ((1.0, 1.0), False)])  # a tie: XLA's path
def test_cta_policy_round_is_compared_with_xla_in_that_round(policy_ms, overlap, monkeypatch):
    """--cta-policies default efficiency (the default): the kept plan is timed again under each
    policy in a round of its own, where clocks differ. Its time there was saved with
    overlap=true even when slower than XLA (measured_ms 1.02 > baseline_ms 1.0). XLA's path is
    now timed in that round too, and wins the entry when it is faster there."""
    import jax
    from jax_flashoverlap import bench, bench_problem
    fake_gpu_timings(monkeypatch)
    rounds = []

    def timed(variants, **kw):
        rounds.append(set(variants))
        ms = {"default": policy_ms[0], "efficiency": policy_ms[1]}
        return {name: {"median_ms": ms.get(name, 1.0 if name.startswith(("xla", "gemm"))
                                           else 0.97), "samples_ms": []} for name in variants}

    monkeypatch.setattr(bench, "time_variants", timed)
    args = tune_args()
    pb = bench_problem.TpProblem(args, "all_reduce", (256, 256, 256), jax.random.key(0))
    entry, row = tune.tune_problem(pb, args, tune.Progress(2, stream=io.StringIO()))
    assert rounds[-1] == {"default", "efficiency", "xla_dot_collective"}
    assert entry["overlap"] is overlap and entry["baseline_ms"] == 1.0
    if overlap:
        assert entry["cta_policy"] == "default" and entry["measured_ms"] == 0.90
    else:
        assert "cta_policy" not in entry and entry["measured_ms"] == 1.0
    assert tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                            "entries": [entry]})


def test_tune_problem_refuses_a_shape_it_cannot_calibrate(monkeypatch):
    """M = 30 on 2 GPUs: only 1 group splits M / world, so no collective curve can be fitted and
    the search had no candidate (`min() arg is an empty sequence`, after the calibration's GPU
    time). tune.main refuses such shapes; tune_problem does too, before calibrating."""
    import types
    monkeypatch.setattr(tune, "calibrate", lambda *a, **k: pytest.fail("calibrated anyway"))
    pb = types.SimpleNamespace(collective="all_reduce", m=30, n=256, k=256, world=2)
    with pytest.raises(ValueError, match=r"needs M divisible by 2 \* world = 4 .*got M=30"):
        tune.tune_problem(pb, tune_args(), tune.Progress(2, stream=io.StringIO()))
    assert tune.calibration_shape_error((32, 256, 256), 2) is None


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all", "all_gather"])
def test_a_nan_result_fails_the_tuners_value_check(op, monkeypatch):
    """One timed plan's result NaN (an unwritten tile, NaN-poisoned): `max(errors) > max_error`
    let it through (nan compares False either way), and a plan from a broken build was saved.
    Now every plan is checked with `not error <= max_error`, in tune and tune_a2a."""
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax_flashoverlap import bench, bench_problem
    fake_gpu_timings(monkeypatch)
    seen = []

    def error(out, ref):  # the second plan's result is NaN, the others are right
        seen.append(None)
        return math.nan if len(seen) == 2 else 1e-3

    monkeypatch.setattr(bench, "relative_error", error)
    args = tune_args(cta_policies=["default"], top=3)
    with pytest.raises(RuntimeError, match=r"off float32 by nan .*not saving plans"):
        if op == "all_reduce":
            pb = bench_problem.TpProblem(args, op, (256, 256, 256), jax.random.key(0))
            tune.tune_problem(pb, args, tune.Progress(2, stream=io.StringIO()))
        else:
            mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
            tune_a2a.tune_op(op, (256, 256, 256), mesh, args,
                             tune.Progress(1, stream=io.StringIO()), jax.random.key(0))
    assert len(seen) >= 2


def test_tune_cli_rejects_bad_arguments():
    with pytest.raises(SystemExit):
        tune.main(["--comm-sms", "0"])
    with pytest.raises(SystemExit):
        tune.main(["--top", "0"])


# --- all-to-all / all-gather entries (jax_flashoverlap.tune_a2a) ------------------------------

from jax_flashoverlap import plan_a2a, tune_a2a  # noqa: E402


def test_a2a_grid_and_local_problem():
    assert tune_a2a.local_problem("all_gather", 8192, 8192, 4096, 2) == (4096, 4096, 4096)
    assert tune_a2a.local_problem("all_to_all", 8192, 8192, 4096, 2) == (4096, 8192, 4096)
    g = tune_a2a.grid("all_gather", (8, 16), 4096, 2)
    assert [p.name for p in g] == ["sms8_chunks1", "sms8_chunks2", "sms8_chunks4",
                                   "sms16_chunks1", "sms16_chunks2", "sms16_chunks4",
                                   "sms1_collective", "sms2_collective", "sms4_collective"]
    assert all(p.groups == 1 for p in g if p.gather == "collective")
    assert len(tune_a2a.grid("all_to_all", (8,), 4096, 2)) == len(tune_a2a.A2A_GROUPS)
    # chunks that do not divide the rows are not in the grid
    assert [p.groups for p in tune_a2a.grid("all_gather", (8,), 6, 2)
            if p.gather == "p2p"] == [1, 2]


@pytest.mark.parametrize("op", ["all_to_all", "all_to_all_ulysses", "all_gather"])
def test_a2a_entries_validate_and_are_looked_up(op, tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))
    rows, n, k = tune_a2a.local_problem(op, 8192, 8192, 4096, 2)
    p = tune_a2a.GridPlan("x", 16, 2)
    plan = tune_a2a._chosen_plan(op, p, rows, n, k, 2, 2)
    won = tune_a2a.entry_for(op, "bfloat16", rows, n, k, 2, plan, 2.0, 2.5)
    lost = tune_a2a.entry_for(op, "float16", rows, n, k, 2, None, 2.6, 2.5)
    assert won["overlap"] and won["comm_sms"] == 16 and "model_error" in won
    assert not lost["overlap"] and lost["measured_ms"] == 2.5
    tuning.write_entries(tmp_path / "h200_x2.json", "NVIDIA H200", 2, [won, lost])
    if op == "all_gather":
        assert won["chunks"] == 2
        got = plan_a2a.choose_all_gather_plan(rows, n, k, 2, gpu="NVIDIA H200")
        assert (got.chunks, got.comm_sms, got.overlap) == (2, 16, True)
        assert not plan_a2a.choose_all_gather_plan(rows, n, k, 2, gpu="NVIDIA H200",
                                                   dtype="float16").overlap
    else:
        split = 1 if op == "all_to_all_ulysses" else 0
        got = plan_a2a.choose_a2a_plan(rows, n, k, 2, split, 0, gpu="NVIDIA H200")
        assert got.band_rows == tuple(won["band_rows"]) and got.comm_sms == 16
        # another split / concat is another problem: the cost model's plan
        assert plan_a2a.choose_a2a_plan(rows, n, k, 2, 1 - split, 0, gpu="NVIDIA H200") == \
            plan_a2a.default_a2a_plan(rows, n, k, 2, 1 - split, 0)
    # an explicit comm_sms or another GPU: the cost model
    assert (plan_a2a.choose_all_gather_plan(rows, n, k, 2, comm_sms=8, gpu="NVIDIA H200")
            .comm_sms == 8)


@pytest.mark.parametrize("shape, tuned", [("64x24x64", False), ("64x32x64", True)])
def test_tune_cli_refuses_an_op_shape_the_kernels_cannot_take(shape, tuned, tmp_path,
                                                             monkeypatch, capsys):
    """--ops all_to_all_ulysses with N=24 on 2 GPUs passed the shape checks (N a multiple of 8
    and of the world size), but the column blocks need N divisible by 8 * world: every plan
    lowered to XLA's composition and the run stopped in tune_op after compiling them ('our
    custom call is not in the compiled program'), losing the problems before it. Now a parser
    error (exit 2) before any GPU time; N=32 is tuned."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))

    def reached(*a):
        raise SystemExit(0)

    monkeypatch.setattr(tune_a2a, "tune_op", reached)
    with pytest.raises(SystemExit) as info:
        tune.main(["--collectives", "--ops", "all_to_all_ulysses", "--shapes", shape,
                   "--world", "2"])
    assert info.value.code == (0 if tuned else 2)
    if not tuned:
        assert ("--shapes 64x24x64: all_to_all_ulysses on 2 devices: N=24 is not a multiple of "
                "8 * axis size (16)") in capsys.readouterr().err
    for op in ("all_to_all", "all_to_all_ulysses", "all_gather"):  # the design shapes: fine
        assert tune_a2a.unsupported(op, 8192, 8192, 8192, 2) is None


BAD_A2A = {
    "a2a_no_split_axis": dict(collective="all_to_all", m=4096, n=512, k=64, comm_sms=8,
                              concat_axis=0, band_rows=[0, 2048]),
    "a2a_bands_wrong_rows": dict(collective="all_to_all", m=4096, n=512, k=64, comm_sms=8,
                                 split_axis=0, concat_axis=0, band_rows=[0, 4096]),
    "ag_chunks_not_dividing": dict(collective="all_gather", m=4096, n=512, k=64, comm_sms=8,
                                   chunks=3),
    "ag_no_chunks": dict(collective="all_gather", m=4096, n=512, k=64, comm_sms=8),
    "ag_collective_in_chunks": dict(collective="all_gather", m=4096, n=512, k=64, comm_sms=2,
                                    chunks=2, gather="collective"),
    "ag_unknown_gather": dict(collective="all_gather", m=4096, n=512, k=64, comm_sms=2,
                              chunks=1, gather="nvshmem"),
}


@pytest.mark.parametrize("case", sorted(BAD_A2A))
def test_bad_a2a_entries_are_errors(case):
    entry = dict(BAD_A2A[case], dtype="bfloat16")
    with pytest.raises(tuning.ConfigError, match="split_axis|band_rows|chunks|end at|gather"):
        tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                         "entries": [entry]}, path=case)


# --- the communicator's CTA policy (ncclConfig_t.CTAPolicy) -----------------------------------

def test_cta_policy_in_plans_configs_and_communicator_ids(tmp_path, monkeypatch):
    from jax_flashoverlap import comm
    from _util import make_mesh_1d
    mesh = make_mesh_1d(4)
    ids = {p: comm.comm_id_for(mesh, "tp", 16, cta_policy=p) for p in comm.CTA_POLICIES}
    assert len(set(ids.values())) == 3
    assert ids["default"] == comm.comm_id_for(mesh, "tp", 16)  # ids of before are kept
    with pytest.raises(ValueError, match="cta_policy must be one of"):
        comm.comm_id_for(mesh, "tp", 16, cta_policy="fast")
    with P.forced(cta_policy="efficiency"):
        plan = P.choose_plan("all_reduce", 8192, 8192, 4096, 2)
    assert plan.cta_policy == "efficiency"
    assert P.choose_plan("all_reduce", 8192, 8192, 4096, 2).cta_policy == "default"
    with P.forced(cta_policy="fast"):
        with pytest.raises(ValueError, match="cta_policy='fast'"):
            P.choose_plan("all_reduce", 8192, 8192, 4096, 2)
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))
    entry = dict(collective="all_reduce", dtype="bfloat16", m=1024, n=512, k=256, comm_sms=12,
                 band_rows=[0, 512, 1024], cta_policy="efficiency",
                 cta_policy_ms={"default": 0.2, "efficiency": 0.19})
    tuning.write_entries(tmp_path / "t.json", "NVIDIA H200", 2, [entry])
    assert P.choose_plan("all_reduce", 1024, 512, 256, 2, gpu="NVIDIA H200").cta_policy == \
        "efficiency"
    with pytest.raises(tuning.ConfigError, match="'cta_policy' must be"):
        tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                         "entries": [dict(entry, cta_policy="zero-sm")]})


def test_collective_gather_plans(tmp_path, monkeypatch):
    """The collective all-gather (one ncclAllGather on a CTA-policy-ZERO communicator): chosen
    by forced(gather=...) or a tuned entry, whole blocks only; off in the default plans until
    measured; its modelled time has every remote block arrive at once."""
    rows, n, k = 4096, 4096, 8192
    assert plan_a2a.choose_all_gather_plan(rows, n, k, 2).gather == "p2p"
    with plan_a2a.forced(gather="collective", comm_sms=2):
        got = plan_a2a.choose_all_gather_plan(rows, n, k, 2)
    assert (got.gather, got.chunks, got.comm_sms) == ("collective", 1, 2)
    with plan_a2a.forced(gather="collective", chunks=2):
        with pytest.raises(ValueError, match="chunks=1"):
            plan_a2a.choose_all_gather_plan(rows, n, k, 2)
    with pytest.raises(ValueError, match="gather must be one of"):
        plan_a2a.forced(gather="nvshmem")
    # the model: remote blocks arrive together; a slower link only delays them
    p = plan_a2a.DEFAULT_PROFILE
    fast = plan_a2a.all_gather_plan_time(rows, n, k, 2, 1, 2, 2, p, "collective")
    slow = plan_a2a.all_gather_plan_time(rows, n, k, 2, 1, 2, 2, dataclasses.replace(
        p, ce_all_gather_bw=p.ce_all_gather_bw / 100), "collective")
    assert slow > fast > 0
    on = dataclasses.replace(p, collective_gather=True)
    assert plan_a2a.default_all_gather_plan(rows, n, k, 2, 2, on).predicted_s <= \
        plan_a2a.default_all_gather_plan(rows, n, k, 2, 2, p).predicted_s
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))
    plan = tune_a2a._chosen_plan("all_gather", tune_a2a.GridPlan("x", 2, 1, "collective"),
                                 rows, n, k, 2, 2)
    entry = tune_a2a.entry_for("all_gather", "bfloat16", rows, n, k, 2, plan, 1.0, 1.2)
    assert entry["gather"] == "collective" and entry["chunks"] == 1
    tuning.write_entries(tmp_path / "c.json", "NVIDIA H200", 2, [entry])
    got = plan_a2a.choose_all_gather_plan(rows, n, k, 2, gpu="NVIDIA H200")
    assert (got.gather, got.chunks, got.comm_sms) == ("collective", 1, 2)



@pytest.mark.parametrize("kw, match", [
    (dict(comm_sms=500), r"comm_sms must be in \[0, 130\], got 500"),
    (dict(comm_sms=-4), r"comm_sms must be in \[0, 130\], got -4"),
    (dict(chunks=0), r"chunks must be in \[1, 64\], got 0"),
    (dict(chunks=-2), r"chunks must be in \[1, 64\], got -2"),
    (dict(num_groups=0), r"num_groups must be in \[1, 64\], got 0"),
    (dict(num_groups=-1), r"num_groups must be in \[1, 64\], got -1"),
])
def test_a2a_forced_rejects_out_of_range_numbers(kw, match):
    """plan_a2a.forced's numbers reach the custom call as given (its plans have no validate):
    out of range they were accepted (chunks=0: ZeroDivisionError at the plan choice)."""
    assert P.MAX_COMM_SMS == 130
    with pytest.raises(ValueError, match=match):
        plan_a2a.forced(**kw)
    with pytest.raises(TypeError, match="comm_sms must be an int or None, got '8'"):
        plan_a2a.forced(comm_sms="8")
    with plan_a2a.forced(comm_sms=P.MAX_COMM_SMS, chunks=1, num_groups=1):  # the bounds: legal
        assert plan_a2a.choose_all_gather_plan(4096, 8192, 4096, 2).comm_sms == P.MAX_COMM_SMS

def test_fit_op_runs_recovers_slowdown_and_group_overhead():
    m, n, k = 8192, 8192, 4096
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8, 16))
    few = P.aligned_even_bands("all_reduce", m, n, 2, 3, 16)
    many = P.aligned_even_bands("all_reduce", m, n, 2, 12, 16)
    truth = dataclasses.replace(cal, interference={8: 1.06, 16: 1.17},
                                group_overhead_s={16: 9e-6})
    runs = [(b, TM.predict("all_reduce", m, n, 2, b, 16, truth)) for b in (few, many)]
    slowdown, overhead = TM.fit_op_runs("all_reduce", m, n, 2, 16, runs, cal)
    assert slowdown == pytest.approx(1.17, rel=1e-6)
    assert overhead == pytest.approx(9e-6, rel=1e-4)
    # the runs in either order (the most groups first gave (0.8, 1.97e-05): the clamp)
    assert TM.fit_op_runs("all_reduce", m, n, 2, 16, runs[::-1], cal) == pytest.approx(
        (slowdown, overhead), rel=1e-9)
    fitted = dataclasses.replace(cal, interference={16: slowdown}, group_overhead_s={16: overhead})
    other = P.aligned_even_bands("all_reduce", m, n, 2, 7, 16)  # a plan not fitted to
    assert TM.predict("all_reduce", m, n, 2, other, 16, fitted) == pytest.approx(
        TM.predict("all_reduce", m, n, 2, other, 16, truth), rel=1e-6)
    assert fitted.to_json()["group_overhead_us"]["16"] == pytest.approx(9.0, rel=1e-4)
    # one run: the slowdown alone; no negative overhead; clamped, never absurd
    s1, o1 = TM.fit_op_runs("all_reduce", m, n, 2, 16, runs[:1], truth)
    assert o1 == 0.0 and 0.8 <= s1 <= 2.0
    faster_with_more = [(few, runs[0][1]), (many, runs[0][1] * 0.9)]
    s2, o2 = TM.fit_op_runs("all_reduce", m, n, 2, 16, faster_with_more, cal)
    assert o2 >= 0.0 and 0.8 <= s2 <= 2.0
    assert TM.fit_op_runs("all_reduce", m, n, 2, 16, [(few, 1e-9)], cal) == (0.8, 0.0)


def test_dp_by_count_is_the_best_plan_of_each_group_count():
    m, n, k = 2048, 4096, 2048  # 8 work units: every composition can be checked
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8,))
    step = ts.cut_step(m, n, 8)
    gemm_end = P.gemm_end_fn("all_reduce", m, n, 2, 8, cal.wave_s[8] * cal.slowdown(8))
    comm = lambda r0, r1: cal.comm[8].time((r1 - r0) * n * 2)
    by_count = TM.best_cuts_by_count(m, step, gemm_end, comm, 16)
    assert sorted(by_count) == list(range(1, m // step + 1))  # at most one group per unit
    everything = list(TM._compositions(m, step))
    for g, bands in by_count.items():
        assert len(bands) - 1 == g and bands[0] == 0 and bands[-1] == m
        same_count = [b for b in everything if len(b) - 1 == g]
        best = min(P.pipeline_time(b, gemm_end, comm) for b in same_count)
        assert P.pipeline_time(bands, gemm_end, comm) == pytest.approx(best, rel=1e-12)
    # with a cost per group, the candidates' best is the best over counts too
    costly = dataclasses.replace(cal, group_overhead_s={8: 50e-6})
    cands = TM.candidates("all_reduce", m, n, 2, costly)
    brute = min(TM.predict("all_reduce", m, n, 2, b, 8, costly) for b in everything)
    assert cands[0].predicted_s == pytest.approx(brute, rel=1e-12)


def test_slowdown_of_a_comm_sms_not_fitted_is_the_default_profiles():
    """fit_op_runs fills the slowdown per comm_sms; one never fitted takes the cost model's
    default (a GEMM beside NCCL a little slower), not 1.0 (as fast as alone)."""
    curve = TM.CommCurve(5e-6, 1e11)
    cal = TM.Calibration({8: 1e-5, 16: 1e-5}, {8: curve, 16: curve}, interference={8: 1.3})
    assert P.DEFAULT_PROFILE.interference != 1.0  # the premise: the two differ
    assert cal.slowdown(8) == 1.3
    assert cal.slowdown(16) == P.DEFAULT_PROFILE.interference
    assert TM.Calibration({8: 1e-5}, {8: curve}, interference=1.2).slowdown(16) == 1.2


def test_wave_time_counts_the_split_tail_given_k():
    """8192 x 8192 on all SMs: 16 waves of whole units, fewer with K = 4096's split tail; the
    time per wave is the GEMM's over the waves the kernel really runs."""
    assert ts.gemm_waves(8192, 8192, 0) == 16
    waves = ts.gemm_waves(8192, 8192, 0, 4096)
    assert waves < 16
    assert TM.wave_time(1.0, 8192, 8192, 0) == 1 / 16
    assert TM.wave_time(1.0, 8192, 8192, 0, k=4096) == pytest.approx(1 / waves, rel=1e-12)


def test_candidates_hold_every_even_split_up_to_max_even():
    m, n, k = 8192, 8192, 4096  # 32 work units: searched by the DP, not exhaustively
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8,))
    found = {c.band_rows for c in TM.candidates("all_reduce", m, n, 2, cal)}
    step = ts.cut_step(m, n, 8)
    assert m // step - 1 > TM.EXHAUSTIVE_CUTS
    for g in range(1, TM.MAX_EVEN + 1):
        assert tuple(P.even_bands(m, g, step)) in found, g


@pytest.mark.parametrize("units, exhaustive", [(TM.EXHAUSTIVE_CUTS + 1, True),
                                               (TM.EXHAUSTIVE_CUTS + 2, False)])
def test_every_composition_is_a_candidate_up_to_exhaustive_cuts_boundaries(units, exhaustive):
    n, k = 8192, 2048
    m = 256 * units
    assert ts.cut_step(m, n, 8) == 256
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8,))
    cands = TM.candidates("all_reduce", m, n, 2, cal)
    assert (len(cands) == 2 ** (units - 1)) == exhaustive, len(cands)
    assert any(c.how == "exhaustive" for c in cands) == exhaustive


def test_candidates_cut_on_the_work_units_of_their_own_comm_sms():
    """1024 x 4096 is 128 wide tiles: on all 132 SMs the kernel runs 128-row units, with 8
    SMs left to NCCL (124) 2-CTA clusters of 256 rows; a plan at comm_sms 8 cuts on 256."""
    m, n, k = 1024, 4096, 4096
    assert (ts.cut_step(m, n, 0), ts.cut_step(m, n, 8)) == (128, 256)  # the premise
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8,))
    cands = TM.candidates("all_reduce", m, n, 2, cal)
    assert len(cands) == 2 ** 3  # 4 units of 256 rows: every composition
    assert all(b % 256 == 0 for c in cands for b in c.band_rows)


def test_the_best_plan_of_every_group_count_charges_the_copy_out():
    """The DP's best plan of each group count minimizes the time predict gives, the
    all-reduce's copy-out of its last group included: moving its last cut never helps."""
    m, n, k = 8192, 8192, 1024  # small K: the copy-out matters; 32 units, no exhaustive search
    cal = _calibration_from_profile("all_reduce", m, n, k, 2, (8,))
    cands = TM.candidates("all_reduce", m, n, 2, cal)
    step = ts.cut_step(m, n, 8)
    for g in range(2, TM.MAX_DP_GROUPS + 1):
        best = min((c for c in cands if c.num_groups == g), key=lambda c: c.predicted_s)
        for cut in range(best.band_rows[-3] + step, m, step):
            bands = best.band_rows[:-2] + (cut, m)
            assert best.predicted_s <= TM.predict("all_reduce", m, n, 2, bands, 8, cal) + 1e-15, (
                g, best.band_rows, bands)
