"""The benchmark CLI on CPU devices: every in-process variant computes XLA's values, the JSON
records them, the plot is written, and 'ours' is flagged when it did not run our custom call
(here: it never does, CPU has no CUDA path)."""
import json

import pytest

from jax_flashoverlap import bench


def _run(tmp_path, *argv):
    out = tmp_path / "r.json"
    assert bench.main([*argv, "--samples", "2", "--calls", "1", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_overlap_all_variants(tmp_path):
    plot = tmp_path / "p.png"
    d = _run(tmp_path, "overlap", "--shapes", "64x64x256", "--world", "4", "--plot", str(plot))
    assert {r["collective"] for r in d["rows"]} == {"all_reduce", "reduce_scatter"}
    for r in d["rows"]:
        for v in ("xla_dot", "xla_collective", "xla_dot_collective", "ours", "two_chunk",
                  "ppermute_ring", "ours_model"):
            assert r["times_ms"][v] > 0, v
        assert all(e < 1e-2 for e in r["variant_rel_error_vs_f32"].values()), r
        assert r["uses_custom_call"] is False  # CPU: the reference path, and it says so
        assert "xla_windowed" not in r["times_ms"]  # GPU-only variant
    assert d["git_commit"] and d["command"].startswith("python -m jax_flashoverlap.bench")
    pytest.importorskip("matplotlib")
    assert d["plot"] == str(plot) and plot.stat().st_size > 1000


def test_gemm_reports_reference_path(tmp_path, capsys):
    d = _run(tmp_path, "gemm", "--shapes", "64x64x128", "--comm-sms", "0")
    assert d["rows"][0]["uses_custom_call"] == {"ours_sms0": False}
    assert "not the signaling GEMM" in capsys.readouterr().out


def test_sweep_refuses_variants_without_our_custom_call(tmp_path):
    with pytest.raises(RuntimeError, match="custom call is not in the compiled program"):
        _run(tmp_path, "sweep", "--shapes", "64x64x256", "--world", "2", "--comm-sms", "8",
             "--groups", "2", "--collectives", "all_reduce")
