"""Which plan the tuner keeps and what its entry records (tune.tune_problem, tune_a2a.tune_op on
CPU devices, the GPU timings faked: tests/_tune_fakes.py): the fastest plan, XLA's path where
no plan beat it, the per-device problem it is keyed by and the refitted model's prediction."""
import io

import pytest

from jax_flashoverlap import tune, tune_a2a, tune_model as TM, tuning

from _tune_fakes import fake_gpu_timings, tune_args


@pytest.mark.parametrize("op, ms, kept", [
    ("all_gather", {"sms8_chunks2": 0.4}, "sms8_chunks2"),  # the fastest plan, not the first
    ("all_to_all", {"sms8_g4": 0.5}, None),                 # only as fast as XLA: XLA's path
])
def test_tune_op_keeps_the_fastest_plan_or_xla(op, ms, kept, monkeypatch):
    """tune_a2a.tune_op: the plan measured fastest becomes the entry (keyed by the per-device
    problem; its model error is predicted / measured - 1), or XLA's composition where no plan
    beat it; the grid's other plans (0.6 ms) are slower than XLA (0.5 ms) here."""
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax_flashoverlap import bench
    fake_gpu_timings(monkeypatch)
    monkeypatch.setattr(bench, "time_variants", lambda variants, **kw: {
        name: {"median_ms": ms.get(name, 0.5 if name == "xla_composition" else 0.6),
               "samples_ms": []} for name in variants})
    args = tune_args(comm_sms=[8])
    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    entry, row = tune_a2a.tune_op(op, (256, 256, 256), mesh, args,
                                  tune.Progress(1, stream=io.StringIO()), jax.random.key(0))
    rows, n_local, k_local = tune_a2a.local_problem(op, 256, 256, 256, 2)
    assert (entry["m"], entry["n"], entry["k"]) == (rows, n_local, k_local) == \
        ((128, 128, 256) if op == "all_gather" else (128, 256, 256))
    assert entry["baseline_ms"] == 0.5 and row["entry"] is entry
    if kept is None:
        assert not entry["overlap"] and entry["measured_ms"] == 0.5 and "model_error" not in entry
    else:
        predicted = row["predicted_ms"][kept]
        assert entry["overlap"] and entry["measured_ms"] == 0.4 and entry["comm_sms"] == 8
        assert entry["chunks"] == 2 and entry["predicted_ms"] == predicted
        assert entry["model_error"] == pytest.approx(predicted / 0.4 - 1)
    assert tuning.validate({"schema": tuning.SCHEMA, "gpu": "NVIDIA H200", "world_size": 2,
                            "entries": [entry]})


def test_the_kept_plans_prediction_uses_the_refitted_calibration(monkeypatch):
    """The calibration runs again in the timing round and the model is refitted to them (clocks
    drift between rounds): the entry's predicted_ms (and so its model_error) must come from the
    refit, not from the first round's calibration."""
    import jax
    from jax_flashoverlap import bench, bench_problem
    fake_gpu_timings(monkeypatch)

    def ms(name):  # the op's calibration runs are 20% slower in the timing round
        if name.startswith("coll_"):
            return 0.2 + 0.01 * int(name.rsplit("_g", 1)[1])
        if name.startswith("plan"):  # a timed plan: one of several groups is the fastest
            return 0.48 if "_g1_" in name else 0.45
        return {"xla": 1.0, "gemm": 0.2, "calibration_op": 0.6}.get(
            name.rsplit("_sms", 1)[0].split("_dot")[0], 0.5)

    monkeypatch.setattr(bench, "time_variants", lambda variants, **kw: {
        name: {"median_ms": ms(name), "samples_ms": []} for name in variants})
    fits, real = [], tune.fit_op
    monkeypatch.setattr(tune, "fit_op", lambda *a: fits.append(real(*a)) or fits[-1])
    args = tune_args(cta_policies=["default"], comm_sms=[8], top=6)
    pb = bench_problem.TpProblem(args, "all_reduce", (256, 256, 256), jax.random.key(0))
    entry, row = tune.tune_problem(pb, args, tune.Progress(2, stream=io.StringIO()))
    cal, refit = fits
    bands, sms = entry["band_rows"], entry["comm_sms"]
    predicted = [TM.predict("all_reduce", 256, 256, 2, bands, sms, c) * 1e3 for c in (cal, refit)]
    assert predicted[0] != pytest.approx(predicted[1])  # the rounds differ: so must the models
    assert entry["predicted_ms"] == pytest.approx(predicted[1])
    assert entry["model_error"] == pytest.approx(predicted[1] / entry["measured_ms"] - 1)
    assert entry["measured_ms"] == 0.45
