"""What `python -m jax_flashoverlap.bench` computes from its measurements (CPU, in process):
the speedups, E and errors a row records from stubbed timings, the summary of the targets,
the median of samples of several calls, the value check's threshold, and the shape / world
checks that refuse arguments before any device work."""
import argparse
import json

import pytest

from jax_flashoverlap import bench, bench_a2a, bench_problem, bench_targets


def _stub_times(monkeypatch, *tables):
    """bench.time_variants answering the i-th call with tables[i] (the last one repeated)."""
    calls = []

    def fake(variants, **kw):
        table = tables[min(len(calls), len(tables) - 1)]
        calls.append(sorted(variants))
        return {v: {"median_ms": table[v], "samples_ms": []} for v in variants}
    monkeypatch.setattr(bench, "time_variants", fake)
    return calls


def test_overlap_row_numbers_from_its_times(tmp_path, monkeypatch):
    """speedup = baseline / ours, E = (baseline - ours) / (baseline - max(dot, collective)),
    per-variant speedups over XLA's dot + collective only, the chain's per-call ratio, the
    errors (vs XLA: 0 on CPU; vs float32: bf16 rounding), and the plan as it lowered."""
    import dataclasses
    real_plan = bench_problem.lowered_plan
    monkeypatch.setattr(bench_problem, "lowered_plan", lambda pb: dataclasses.replace(
        real_plan(pb), predicted_s=1e-3, baseline_s=2e-3, source="tuned"))
    chain = bench.bench_variants.CHAIN
    _stub_times(monkeypatch, {"xla_dot": 1.0, "xla_collective": 0.6, "xla_dot_collective": 2.0,
                              "ours": 1.25, "two_chunk": 1.6, "xla_chain": 3.0 * chain,
                              "ours_chain": 2.0 * chain})
    out = tmp_path / "o.json"
    assert bench.main(["overlap", "--shapes", "64x64x256", "--world", "2", "--collectives",
                       "all_reduce", "--variants", "two_chunk", "chain", "--trace", "0",
                       "--out", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["speedup"] == pytest.approx(1.6)
    assert row["overlap_efficiency"] == pytest.approx(0.75)  # (2 - 1.25) / (2 - 1)
    assert row["speedups"] == pytest.approx({"xla_dot_collective": 1.0, "ours": 1.6,
                                             "two_chunk": 1.25})
    assert row["times_ms"]["xla_chain"] == pytest.approx(3.0)  # per call of the chain
    assert row["chain_speedup"] == pytest.approx(1.5)
    assert row["rel_error"] == 0.0 and 0 < row["rel_error_vs_f32"] < 1e-2
    assert row["plan"]["predicted_ms"] == pytest.approx(1.0)
    assert row["plan"]["predicted_baseline_ms"] == pytest.approx(2.0)
    assert row["plan"]["predicted_ours_ms"] == pytest.approx(2.0)  # XLA's ran (CPU)
    assert row["plan"]["source"] == "tuned"
    assert row["targets"]["speedup_at_least_1"] is True  # world 2, bf16: judged
    assert row["targets"]["model_error_below_10pct"] is None  # a tuned plan: no model


def test_a2a_row_numbers_from_its_times(tmp_path, monkeypatch):
    """bench a2a: speedup = XLA's composition / ours and E against max(dot, collective); where
    the composition is no slower than that, E is undefined (null), not a ZeroDivisionError;
    its summary is of #9's two targets only."""
    _stub_times(monkeypatch,
                {"xla_dot": 1.0, "xla_collective": 0.6, "xla_composition": 2.0, "ours": 1.25},
                {"xla_dot": 1.0, "xla_collective": 0.6, "xla_composition": 1.0, "ours": 0.8})
    out = tmp_path / "a.json"
    assert bench.main(["a2a", "--shapes", "64x64x128", "32x64x128", "--world", "2", "--ops",
                       "all_to_all", "--samples", "2", "--calls", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    first, second = d["rows"]
    assert first["speedup"] == pytest.approx(1.6)
    assert first["overlap_efficiency"] == pytest.approx(0.75)
    assert first["targets"] == {"speedup_at_least_1": True, "efficiency_at_least_0.5": True}
    assert second["speedup"] == pytest.approx(1.25) and second["overlap_efficiency"] is None
    assert set(d["targets"]) == set(bench_targets.A2A_TARGETS)
    assert second["targets"]["efficiency_at_least_0.5"] is False  # undefined: not met
    assert d["targets"]["efficiency_at_least_0.5"] == {"met": 1, "of": 2}


def test_a2a_wrong_values_are_flagged_and_the_run_exits_1(tmp_path, monkeypatch, capsys):
    import jax_flashoverlap as fo
    real = fo.matmul_all_to_all
    monkeypatch.setattr(fo, "matmul_all_to_all", lambda *a, **k: -real(*a, **k))
    out = tmp_path / "w.json"
    assert bench.main(["a2a", "--shapes", "64x64x128", "--world", "2", "--ops", "all_to_all",
                       "--samples", "2", "--calls", "1", "--out", str(out)]) == 1
    row = json.loads(out.read_text())["rows"][0]
    assert set(row["failed_value_check"]) == {"ours"} and row["times_ms"]["ours"] > 0
    assert set(row["targets"].values()) == {False}
    assert "VALUE CHECK FAILED: all_to_all 64x64x128 ours" in capsys.readouterr().out


def test_a_sample_is_the_mean_of_its_calls(monkeypatch):
    """--calls 4: a sample of 8 ms for the 4 back-to-back calls is 2 ms per call."""
    class Done:
        def block_until_ready(self):
            return self
    clock = iter([0.0, 8e-3, 8e-3, 20e-3])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    got = bench.time_variants({"only": (lambda: Done(), ())}, calls=4, samples=2, warmup=0)
    assert got["only"]["samples_ms"] == pytest.approx([2.0, 3.0])
    assert got["only"]["median_ms"] == pytest.approx(2.5)


def test_the_value_check_flags_nan_and_errors_well_above_rounding(capsys):
    bad = bench.failed_values({"ours": float("nan"), "a": 0.05, "b": 3e-3}, "t")
    assert set(bad) == {"ours", "a"}
    assert capsys.readouterr().out.count("VALUE CHECK FAILED") == 2


def test_relative_error_is_relative_to_the_reference():
    import numpy as np
    ref = np.full((4, 4), 2.0, np.float32)
    assert bench.relative_error(ref * 2, ref) == pytest.approx(1.0)
    assert bench.relative_error(ref, ref * 2) == pytest.approx(0.5)


def test_shape_and_world_checks():
    """What --shapes and --world refuse before any compile: not three positive numbers, a
    per-device K not a multiple of 8 (also where K is), K not splitting over the world, N not a
    multiple of 8, and a reduce-scatter's M not splitting; --world from 0 (all) to the
    device count."""
    import jax
    assert bench._parse_shape("8x16x32") == (8, 16, 32)
    for text in ("8x8x8x8", "8x8", "0x8x8"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench._parse_shape(text)
    bench.check_tp_shape((64, 64, 256), 8, ("all_reduce", "reduce_scatter"))
    bench.check_tp_shape((63, 64, 256), 8, ("all_reduce",))
    for shape, world, says in (((64, 64, 64), 16, "K=64 must split"),
                               ((64, 64, 260), 8, "K=260 must split"),
                               ((64, 66, 256), 2, "N=66 must be a multiple of 8"),
                               ((63, 64, 256), 2, "needs M divisible by 2")):
        with pytest.raises(ValueError, match=says):
            bench.check_tp_shape(shape, world, ("reduce_scatter",))
    parser = argparse.ArgumentParser()
    count = len(jax.devices())
    assert bench.resolve_world(parser, 0) == count and bench.resolve_world(parser, count) == count
    with pytest.raises(SystemExit):
        bench.resolve_world(parser, count + 1)
    args = argparse.Namespace(kind="overlap", shapes=[(63, 64, 256)], world=2,
                              collectives=["all_reduce", "reduce_scatter"])
    with pytest.raises(SystemExit):
        bench._check_shapes(parser, args)


def test_a2a_shape_checks():
    bench_a2a.check_shape("all_to_all_ulysses", 64, 64, 4, 128)
    bench_a2a.check_shape("all_gather", 64, 64, 2, 128)
    for op, n, world, says in (("all_to_all_ulysses", 66, 4, "needs N divisible by 4"),
                               ("all_gather", 32, 8, "N per device to be a multiple of 8"),
                               ("all_to_all", 68, 2, "N to be a multiple of 8")):
        with pytest.raises(ValueError, match=says):
            bench_a2a.check_shape(op, 64, n, world, 128)


def _stub_gemm_times(monkeypatch, table):
    """bench.time_variants answering from `table` and recording each variant's input shapes
    and dtypes: what bench gemm would time."""
    seen = {}

    def fake(variants, **kw):
        for v, (fn, args) in variants.items():
            seen[v] = [(tuple(a.shape), str(a.dtype)) for a in args]
        return {v: {"median_ms": table[v], "samples_ms": []} for v in variants}
    monkeypatch.setattr(bench, "time_variants", fake)
    return seen


def test_gemm_row_with_transpose_w_from_its_times(tmp_path, monkeypatch):
    """bench gemm --transpose-w (untested before): w stored [N, K] for XLA's dot and ours with
    transpose_w=True, the same weight stored [K, N] for the [K, N] kernel and our op on an XLA
    w.T copy (the first --comm-sms only); per-GPU K = K / world; the row's shape, dtype and
    switch; xla / ours per variant; errors against XLA's dot (0 on CPU) and float32 (rounding)."""
    seen = _stub_gemm_times(monkeypatch, {
        "xla_dot": 2.0, "ours_sms0": 1.0, "ours_sms8": 4.0, "ours_sms0_on_w_T_copy": 2.5,
        "ours_sms0_kn_kernel": 0.5})
    out = tmp_path / "g.json"
    assert bench.main(["gemm", "--shapes", "64x32x256", "--world", "2", "--comm-sms", "0", "8",
                       "--transpose-w", "--dtype", "float16", "--samples", "2", "--calls", "1",
                       "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["m"], row["n"], row["k"], row["global_k"]) == (64, 32, 128, 256)
    assert row["dtype"] == "float16" and row["transpose_w"] is True
    nk, kn = [((64, 128), "float16"), ((32, 128), "float16")], [((64, 128), "float16"),
                                                                 ((128, 32), "float16")]
    assert seen == {"xla_dot": nk, "ours_sms0": nk, "ours_sms8": nk, "ours_sms0_on_w_T_copy": nk,
                    "ours_sms0_kn_kernel": kn}
    assert row["ratio_xla_over_ours"] == pytest.approx({
        "ours_sms0": 2.0, "ours_sms8": 0.5, "ours_sms0_on_w_T_copy": 0.8,
        "ours_sms0_kn_kernel": 4.0})
    assert set(row["rel_error"]) == set(row["ratio_xla_over_ours"])
    assert all(e < 1e-6 for e in row["rel_error"].values()), row["rel_error"]
    assert all(0 < e < 1e-2 for e in row["rel_error_vs_f32"].values()), row["rel_error_vs_f32"]
    assert row["failed_value_check"] == {}


def test_gemm_wrong_values_are_flagged_not_timed_and_the_run_exits_1(tmp_path, monkeypatch,
                                                                       capsys):
    """Our GEMM's result off: flagged with its error against float32, left out of the timing
    (gemm keeps no variant), and the run exits 1; XLA's dot still timed."""
    import jax_flashoverlap as fo
    real = fo.matmul
    monkeypatch.setattr(fo, "matmul", lambda x, w, **kw: real(x, w, **kw) * 2)
    seen = _stub_gemm_times(monkeypatch, {"xla_dot": 2.0})
    out = tmp_path / "w.json"
    assert bench.main(["gemm", "--shapes", "64x32x256", "--world", "2", "--comm-sms", "0",
                       "--samples", "2", "--calls", "1", "--out", str(out)]) == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert set(seen) == {"xla_dot"} and set(row["times_ms"]) == {"xla_dot"}
    assert row["failed_value_check"] == {"ours_sms0": row["rel_error_vs_f32"]["ours_sms0"]}
    assert row["failed_value_check"]["ours_sms0"] > 0.5
    assert "VALUE CHECK FAILED: gemm 64x32x128 ours_sms0" in capsys.readouterr().out


def test_gemm_warns_when_any_variant_runs_xla_s_dot(tmp_path, monkeypatch, capsys):
    """The warning that 'ours' is XLA's dot comes as soon as one variant lacks our custom call
    (here the first has it, the second not); each variant's answer is recorded."""
    answers = iter([True, False])
    monkeypatch.setattr(bench, "uses_custom_call", lambda fn, args, target: next(answers))
    _stub_gemm_times(monkeypatch, {"xla_dot": 2.0, "ours_sms0": 1.0, "ours_sms8": 1.0})
    out = tmp_path / "c.json"
    assert bench.main(["gemm", "--shapes", "64x32x128", "--world", "1", "--comm-sms", "0", "8",
                       "--samples", "2", "--calls", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["uses_custom_call"] == {"ours_sms0": True, "ours_sms8": False}
    assert "not the signaling GEMM" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["overlap", "a2a"])
def test_a_failed_windowed_subprocess_is_a_failed_variant_not_the_end(kind, tmp_path,
                                                                      monkeypatch, capsys):
  """XLA's windowed-einsum program runs in a subprocess (GPU only); one that hung or printed
  nothing raised out of the bench, losing every row after it. Now: VARIANT FAILED, the row
  kept with `variant_failures`, the next rows measured, exit 1."""
  from jax_flashoverlap import bench_variants

  def hung(*args):
    raise RuntimeError("its subprocess ran past 600 s")
  monkeypatch.setattr(bench_variants, "xla_windowed", hung)
  monkeypatch.setattr(bench_variants, "xla_windowed_for", hung)
  out = tmp_path / "f.json"
  argv = (["overlap", "--collectives", "all_reduce", "--variants", "xla_windowed", "--trace",
           "0"] if kind == "overlap" else ["a2a", "--ops", "all_gather"])
  assert bench.main([*argv, "--shapes", "64x64x128", "32x64x128", "--world", "2",
                     "--samples", "2", "--calls", "1", "--out", str(out)]) == 1
  d = json.loads(out.read_text())
  assert d["complete"] is True and len(d["rows"]) == 2
  for row in d["rows"]:
    assert row["variant_failures"] == {"xla_windowed": "RuntimeError: its subprocess ran "
                                                       "past 600 s"}
    assert row["xla_windowed"] is None and "xla_windowed" not in row["times_ms"]
    assert row["times_ms"]["ours"] > 0 and not row["failed_value_check"]
  captured = capsys.readouterr()
  assert captured.out.count("VARIANT FAILED: ") == 2
  assert "`variant_failures` in the rows): exit 1" in captured.err


@pytest.mark.parametrize("samples, balanced", [(20, False), (14, True)])
def test_an_overlap_row_records_whether_its_rounds_were_whole_squares(samples, balanced,
                                                                      tmp_path, monkeypatch):
    """The rounds balance each place and each predecessor over whole squares only (a multiple
    of the variants timed, twice it for an odd count): call B's default 20 rounds over the 12
    variants a row times on 2 GPUs are one square and 8 rows of the next, and the JSON's
    method said 'each place and each predecessor alike' all the same. Each row says now."""
    _stub_times(monkeypatch, {"xla_dot": 1.0, "xla_collective": 0.6, "xla_dot_collective": 2.0,
                              "ours": 1.25, "two_chunk": 1.6, "xla_chain": 24.0,
                              "ours_chain": 16.0})
    out = tmp_path / "o.json"
    assert bench.main(["overlap", "--shapes", "64x64x256", "--world", "2", "--collectives",
                       "all_reduce", "--variants", "two_chunk", "chain", "--trace", "0",
                       "--samples", str(samples), "--calls", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["rows"][0]["rounds"] == {"variants": 7, "samples": samples, "balanced": balanced}
    assert "each place and each predecessor alike)" not in d["method"], d["method"]


def test_balanced_rounds_is_true_exactly_where_the_square_balances():
    """bench.balanced_rounds against round_order's own rows: places and ordered neighbours."""
    import collections
    for n in range(1, 13):
        names = list(range(n))
        for samples in range(1, 3 * n + 1):
            rows = [bench.round_order(names, r) for r in range(samples)]
            places = collections.Counter((v, row.index(v)) for row in rows for v in row)
            follows = collections.Counter((row[i], row[i + 1]) for row in rows
                                          for i in range(n - 1))
            even = (len(set(places.values())) == 1 and len(places) == n * n and
                    (n < 2 or (len(set(follows.values())) == 1 and len(follows) == n * (n - 1))))
            assert bench.balanced_rounds(n, samples) == even, (n, samples)


def test_square_rounds_is_the_fewest_whole_squares_of_at_least_the_rounds_asked():
  """bench.square_rounds (epilogue_ab.py's default --samples: 20 for its 10 variants, where
  its old default 15 was one square and a half)."""
  for n in range(1, 13):
    for at_least in range(1, 31):
      got = bench.square_rounds(n, at_least)
      assert got >= at_least and bench.balanced_rounds(n, got), (n, at_least, got)
      assert not any(bench.balanced_rounds(n, s) for s in range(at_least, got)), (n, at_least)
  assert bench.square_rounds(10, 15) == 20 and bench.square_rounds(5, 15) == 20
