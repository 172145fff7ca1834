"""bench_variants' parts on CPU, in process: the chain's dependent calls, the environment
helpers the variants lower or run under, the xla_windowed variant's subprocess (its command,
flags and answer; its program, run here in process) and how its answer enters a row, and the
plot's like-for-like bars."""
import json
import subprocess
import sys

import pytest

from jax_flashoverlap import bench, bench_problem, bench_variants


def _problem(collective, world=4):
    import argparse

    import jax
    return bench_problem.TpProblem(argparse.Namespace(world=world, dtype="bfloat16"), collective,
                                   (64, 64, 256), jax.random.key(11))


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_chain_runs_chain_calls_that_the_compiler_keeps(collective):
    """CHAIN calls of the op per device, each kept by the next one's dependence on it (without
    it XLA drops the op: the chain timed an empty loop)."""
    import jax
    pb = _problem(collective)
    calls = []

    def counted(x, w):
        jax.debug.callback(lambda: calls.append(1))
        return pb.coll(x @ w)
    chain = bench_variants.chained(pb, counted)
    jax.block_until_ready(chain(*pb.args))
    assert len(calls) == bench_variants.CHAIN * pb.world
    text = bench_variants.chained(pb, pb.ours).lower(*pb.args).compile().as_text()
    op = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter"}[collective]
    assert op in text and " dot(" in text, text


def test_env_helpers_set_restore_and_pin(monkeypatch):
    """overridden_env: the values inside, the old ones back after (an unset one unset again),
    an exception too; pin_env: set or unset, no restore; model_plans_only: no tuned config, the
    NCCL transport."""
    from jax_flashoverlap import tuning
    monkeypatch.setenv("FO_TEST_A", "a0")
    monkeypatch.delenv("FO_TEST_B", raising=False)
    with bench_variants.overridden_env({"FO_TEST_A": "1", "FO_TEST_B": "2"}):
        assert (bench_variants.os.environ["FO_TEST_A"], bench_variants.os.environ["FO_TEST_B"]) == (
            "1", "2")
    assert bench_variants.os.environ["FO_TEST_A"] == "a0"
    assert "FO_TEST_B" not in bench_variants.os.environ
    with pytest.raises(RuntimeError):
        with bench_variants.overridden_env({"FO_TEST_A": "3", "FO_TEST_B": "4"}):
            raise RuntimeError("inside")
    assert bench_variants.os.environ["FO_TEST_A"] == "a0"
    assert "FO_TEST_B" not in bench_variants.os.environ
    bench_variants.pin_env({"FO_TEST_A": None, "FO_TEST_B": "5"})
    assert "FO_TEST_A" not in bench_variants.os.environ
    assert bench_variants.os.environ["FO_TEST_B"] == "5"
    monkeypatch.setenv(tuning.TUNED_ENV, "1")
    monkeypatch.setenv(bench_variants.TRANSPORT_ENV, "peer")
    with bench_variants.model_plans_only():
        assert bench_variants.os.environ[tuning.TUNED_ENV] == "0"
        assert bench_variants.os.environ[bench_variants.TRANSPORT_ENV] == "nccl"
    assert bench_variants.os.environ[tuning.TUNED_ENV] == "1"
    assert bench_variants.os.environ[bench_variants.TRANSPORT_ENV] == "peer"


def test_xla_windowed_starts_no_subprocess_off_gpu(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a subprocess off GPU")
    monkeypatch.setattr(bench_variants.subprocess, "run", refuse)
    assert bench_variants.xla_windowed_for("all_reduce", 64, 32, 128, 4, "bfloat16", 1, 2) is None


def test_xla_windowed_subprocess_gets_the_problem_and_the_users_flags(monkeypatch):
    """The subprocess's command names the problem in the order its __main__ reads it (M before
    N), its XLA_FLAGS are the user's (a device count) plus the windowed-einsum ones, and its
    answer is its last stdout line; a failed subprocess: an error with its stderr."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    got = []

    def fake_run(cmd, env, **kw):
        got.append((cmd, env["XLA_FLAGS"]))
        code = 0 if len(got) == 1 else 3
        return subprocess.CompletedProcess(cmd, code, stdout='a log line\n{"median_ms": 1.5, '
                                           '"windowed_loop": true}\n', stderr="it broke")
    monkeypatch.setattr(bench_variants.subprocess, "run", fake_run)
    args = ("reduce_scatter", 64, 32, 128, 4, "float16", 3, 5)
    assert bench_variants.xla_windowed_for(*args) == {"median_ms": 1.5, "windowed_loop": True}
    cmd, flags = got[0]
    assert cmd == [sys.executable, "-m", "jax_flashoverlap.bench_variants", "reduce_scatter",
                   "64", "32", "128", "4", "float16", "3", "5"]
    assert flags == ("--xla_force_host_platform_device_count=4 " +
                     bench_variants.WINDOWED_FLAGS)
    with pytest.raises(RuntimeError, match="its subprocess exited 3: it broke"):
        bench_variants.xla_windowed_for(*args)


@pytest.mark.parametrize("outcome", ["timeout", "silent", "not_json", "no_fields"])
def test_xla_windowed_subprocess_that_hangs_or_says_nothing_is_an_error(outcome, monkeypatch):
    """A subprocess past its time limit raised TimeoutExpired and one that printed nothing an
    IndexError, either ending `bench overlap` mid-run: each is now a RuntimeError saying which,
    which the bench records as a failed variant."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    stdout = {"silent": "", "not_json": "Traceback?\n", "no_fields": '{"median_ms": 1.0}\n'}

    def fake_run(cmd, timeout, **kw):
        assert timeout == bench_variants.WINDOWED_TIMEOUT_S
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 0, stdout=stdout[outcome], stderr="")
    monkeypatch.setattr(bench_variants.subprocess, "run", fake_run)
    match = ("ran past 600 s" if outcome == "timeout" else "printed no result")
    with pytest.raises(RuntimeError, match=match):
        bench_variants.xla_windowed_for("all_reduce", 64, 32, 128, 4, "bfloat16", 1, 2)


def test_a_windowed_loop_makes_the_variant_and_none_does_not(capsys):
    times = {"ours": 1.0}
    assert bench_variants.add_windowed(times, None, "x") is None and times == {"ours": 1.0}
    loop = {"median_ms": 0.7, "windowed_loop": True}
    assert bench_variants.add_windowed(times, loop, "x") is loop
    assert times == {"ours": 1.0, "xla_windowed": 0.7} and capsys.readouterr().out == ""
    times = {"ours": 1.0}
    flat = {"median_ms": 0.9, "windowed_loop": False}
    assert bench_variants.add_windowed(times, flat, "rs 64x64x256") is flat
    assert times == {"ours": 1.0} and "XLA built no windowed-einsum loop" in capsys.readouterr().out
    assert bench_variants.has_windowed_loop("%cp = collective-permute(%a)")
    assert bench_variants.has_windowed_loop("%windowed_dot_general_body_ag.1 (p: f32[]) {")
    assert not bench_variants.has_windowed_loop("%ar = all-reduce(%a), to_apply=%add")


@pytest.mark.parametrize("collective, x_spec, w_spec, out_spec", [
    ("all_reduce", (None, "tp"), ("tp", None), ()),
    ("reduce_scatter", (None, "tp"), ("tp", None), ("tp", None)),
    ("all_gather", ("tp", None), (None, "tp"), (None, "tp")),
])
def test_windowed_program_is_the_global_view_product(monkeypatch, capsys, collective, x_spec,
                                                     w_spec, out_spec):
    """The subprocess body (in process here): x @ w of the given shape and dtype on `world`
    devices, sharded as XLA's windowed-einsum passes expect for that collective; the JSON
    line carries the timed median."""
    import jax.numpy as jnp
    timed = {}

    def fake_time(variants, **kw):
        timed.update(variants)
        return {"xla_windowed": {"median_ms": 2.5, "samples_ms": []}}
    monkeypatch.setattr(bench, "time_variants", fake_time)
    bench_variants._windowed_main(collective, 64, 32, 128, 4, "float16", 1, 2)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "median_ms": 2.5, "windowed_loop": False}
    fn, (x, w) = timed["xla_windowed"]
    assert (x.shape, w.shape, x.dtype, w.dtype) == ((64, 128), (128, 32), jnp.float16,
                                                      jnp.float16)
    assert x.sharding.mesh.devices.size == 4 and w.sharding.mesh.devices.size == 4
    assert tuple(x.sharding.spec) == x_spec and tuple(w.sharding.spec) == w_spec
    out = fn(x, w)
    assert tuple(out.sharding.spec) == out_spec
    ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
    assert bench.relative_error(out, ref) < 1e-2


def _recorded_bars(monkeypatch):
    """{label: heights} of every bar bench_variants.plot draws (matplotlib's Agg backend)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.axes
    heights = {}
    bar = matplotlib.axes.Axes.bar

    def record(self, x, height, *args, **kwargs):
        heights[kwargs["label"]] = list(height)
        return bar(self, x, height, *args, **kwargs)
    monkeypatch.setattr(matplotlib.axes.Axes, "bar", record)
    return heights


def test_plot_compares_the_chain_with_xla_s_chain(tmp_path, monkeypatch):
    """ours_chain's bar is over XLA's chain (like for like), the others' over XLA's dot +
    collective; XLA's own programs get no bar."""
    heights = _recorded_bars(monkeypatch)
    t = {"xla_dot": 1.0, "xla_collective": 1.0, "xla_dot_collective": 2.0, "ours": 1.6,
         "xla_chain": 3.0, "ours_chain": 2.0}
    rows = [dict(collective="reduce_scatter", m=64, n=64, k=256, world=4, dtype="bfloat16",
                 times_ms=t)]
    assert bench_variants.plot({"rows": rows}, str(tmp_path / "p.png")) == str(tmp_path / "p.png")
    assert heights == {"ours": [1.25], "ours_chain": [1.5]}


def test_plot_draws_no_bar_for_a_variant_not_run_at_a_shape(tmp_path, monkeypatch):
    """ppermute_ring needs M % world == 0 and xla_windowed a windowed loop: a row without the
    variant got a bar of height 0, read as a speedup of 0x. Now no bar (NaN height)."""
    import math
    heights = _recorded_bars(monkeypatch)
    t = {"xla_dot": 1.0, "xla_collective": 1.0, "xla_dot_collective": 2.0, "ours": 1.6}
    rows = [dict(collective="all_reduce", m=m, n=64, k=256, world=4, dtype="bfloat16",
                 times_ms=times) for m, times in ((63, t), (64, dict(t, ppermute_ring=2.5)))]
    assert bench_variants.plot({"rows": rows}, str(tmp_path / "p.png")) == str(tmp_path / "p.png")
    assert heights["ours"] == [1.25, 1.25]
    assert math.isnan(heights["ppermute_ring"][0]) and heights["ppermute_ring"][1] == 0.8
