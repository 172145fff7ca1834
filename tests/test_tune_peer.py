"""tune --peer on CPU devices (the lowering with the peer stores and the GPU timings faked; the
tuner's own code real): the peer stores are kept only where fastest, and their failure, which
is likely the first time they run on new hardware, is reported without costing the NCCL plans."""
import io
import json

import pytest

from jax_flashoverlap import tune, tuning

from _tune_fakes import fake_gpu_timings, tune_args


def _fake_peer(error=1e-3, raises=None):
    def peer_candidate(pb, ref32, errors, variants):
        from jax_flashoverlap import plan_peer
        from jax_flashoverlap.tune_model import Candidate
        errors["peer"] = error
        variants["peer"] = (lambda *a: None, pb.args)
        if raises is not None:  # after its first call, as a failure at lowering or run would
            raise raises
        p = plan_peer.plan(pb.collective, pb.m, pb.n, pb.k // pb.world)
        return Candidate(0, p.band_rows, p.predicted_s, "peer")
    return peer_candidate


def _timed_with_peer(monkeypatch, peer_ms):
    from jax_flashoverlap import bench
    rounds = []

    def timed(variants, **kw):
        rounds.append(set(variants))
        return {name: {"median_ms": peer_ms if name == "peer" else
                       (1.0 if name.startswith(("xla", "gemm")) else 0.5), "samples_ms": []}
                for name in variants}
    monkeypatch.setattr(bench, "time_variants", timed)
    return rounds


def _tune_one(args):
    import jax
    from jax_flashoverlap import bench_problem
    pb = bench_problem.TpProblem(args, "all_reduce", (256, 256, 256), jax.random.key(0))
    entry, row = tune.tune_problem(pb, args, tune.Progress(2, stream=io.StringIO()))
    assert tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                            "entries": [entry]})
    return entry, row


@pytest.mark.parametrize("peer_ms, kept", [(0.3, True), (0.7, False)])
def test_peer_stores_kept_only_where_fastest(peer_ms, kept, monkeypatch):
    """tune --peer (world 2): the peer stores are one more timed variant; faster than every
    NCCL plan (0.5 ms here) and XLA (1.0 ms), the entry says transport peer (comm_sms 0, the
    bands of one block, no CTA-policy round: no NCCL call); slower, the NCCL plan is kept and
    its CTA-policy round runs as before. The lowering with the peer stores is faked (CPU)."""
    fake_gpu_timings(monkeypatch)
    rounds = _timed_with_peer(monkeypatch, peer_ms)
    monkeypatch.setattr(tune, "peer_candidate", _fake_peer())
    entry, row = _tune_one(tune_args(peer=True))
    assert "peer" in rounds[1] and row["peer"]["measured_ms"] == peer_ms  # [0]: calibration
    if kept:
        assert entry["transport"] == "peer" and entry["comm_sms"] == 0
        assert entry["band_rows"] == [0, 128] and entry["measured_ms"] == peer_ms
        assert "cta_policy" not in entry and len(rounds) == 2  # calibration + timing, no CTA round
    else:
        assert "transport" not in entry and entry["comm_sms"] > 0 and entry["measured_ms"] == 0.5
        assert rounds[-1] >= {"default", "efficiency"}


@pytest.mark.parametrize("how", ["raises", "nan", "off"])
def test_a_failing_peer_candidate_leaves_the_nccl_plans(how, monkeypatch, capsys):
    """The peer stores' lowering or first call raised, or their result was NaN / off float32:
    that killed the whole problem (and `tune`, so a first run on new hardware lost every NCCL
    plan too). Now the failure is said and recorded (`peer.failed`), never saved, never timed
    against the rest, and the NCCL plan is kept."""
    fake_gpu_timings(monkeypatch)
    rounds = _timed_with_peer(monkeypatch, 0.1)  # faster than all: must still not be kept
    fake = {"raises": _fake_peer(raises=RuntimeError("peer: boom")),
            "nan": _fake_peer(error=float("nan")), "off": _fake_peer(error=0.5)}[how]
    monkeypatch.setattr(tune, "peer_candidate", fake)
    entry, row = _tune_one(tune_args(peer=True))
    assert "transport" not in entry and entry["overlap"] and entry["measured_ms"] == 0.5
    want = {"raises": "RuntimeError: peer: boom", "nan": "result off float32 by nan",
            "off": "result off float32 by 5.00e-01"}[how]
    assert row["peer"] == {"failed": want + ("" if how == "raises" else " (> 0.02)")}
    assert f"all_reduce 256x256x256: PEER STORES FAILED, not kept: {want}" in capsys.readouterr().out
    assert ("peer" in rounds[1]) is (how != "raises")  # a raised candidate is never timed


def test_a_broken_nccl_plan_still_refuses_to_save(monkeypatch):
    """The peer stores' values are judged apart; a wrong NCCL plan still stops the problem."""
    from jax_flashoverlap import bench
    fake_gpu_timings(monkeypatch)
    monkeypatch.setattr(tune, "peer_candidate", _fake_peer())
    real = bench.relative_error
    calls = []

    def first_plan_wrong(a, b):
        calls.append(1)
        return float("nan") if len(calls) == 1 else real(a, b)
    monkeypatch.setattr(bench, "relative_error", first_plan_wrong)
    with pytest.raises(RuntimeError, match="plan0_.*off float32 by nan"):
        _tune_one(tune_args(peer=True))


def test_tune_exits_1_after_saving_when_the_peer_stores_failed(tmp_path, monkeypatch, capsys):
    """The whole CLI (GPU backend faked): every problem is tuned and saved with its NCCL plan,
    the report says which problems' peer stores failed, and the exit status is 1."""
    import jax
    fake_gpu_timings(monkeypatch)
    _timed_with_peer(monkeypatch, 0.1)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tune, "peer_candidate", _fake_peer(raises=RuntimeError("peer: boom")))
    out, report = tmp_path / "cfg.json", tmp_path / "report.json"
    rc = tune.main(["--shapes", "256x256x256", "--world", "2", "--peer", "--top", "2",
                    "--calls", "1", "--samples", "1", "--comm-sms", "8",
                    "--cta-policies", "default", "--out", str(out), "--report", str(report)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "the peer stores failed on 2 problem(s) (all_reduce 256x256x256, reduce_scatter " \
           "256x256x256" in err
    saved = json.loads(out.read_text())["entries"]
    assert len(saved) == 2 and all("transport" not in e for e in saved)
    rows = json.loads(report.read_text())["rows"]
    assert [r["peer"] for r in rows] == [{"failed": "RuntimeError: peer: boom"}] * 2
