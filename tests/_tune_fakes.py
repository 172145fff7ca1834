"""Fakes for the tuner's tests on CPU devices (tests/test_tune_model.py, test_tune_peer.py)."""


def fake_gpu_timings(monkeypatch):
    """tune_problem on CPU devices: the custom-call check, the capped collective and the timings
    faked (ours 0.5 ms, XLA 1.0 ms, the collective alone slower with more groups); the tuner's
    own code is real."""
    from jax_flashoverlap import bench, bench_problem
    monkeypatch.setattr(bench, "uses_custom_call", lambda fn, args, target: True)
    monkeypatch.setattr(bench_problem, "nccl_capped_fn", lambda pb, plan: (lambda y: y))

    def ms(name):
        if name.startswith("coll_"):
            return 0.2 + 0.01 * int(name.rsplit("_g", 1)[1])
        return 1.0 if name.startswith(("xla", "gemm")) else 0.5

    monkeypatch.setattr(bench, "time_variants", lambda variants, **kw: {
        name: {"median_ms": ms(name), "samples_ms": []} for name in variants})


def tune_args(**kw):
    import types
    args = dict(world=2, dtype="bfloat16", comm_sms=[8, 16], wave_align=True, calls=1,
                samples=1, top=2, max_error=0.02, cta_policies=["default", "efficiency"],
                peer=False)
    args.update(kw)
    return types.SimpleNamespace(**args)
