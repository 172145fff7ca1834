"""`python -m jax_flashoverlap.tune` on CPU: what it refuses before any GPU time (no GPU,
several processes, bad world sizes, shapes and output paths), the config folder it makes, the
entries it keeps when a later problem fails, the kernel build it records and its flags (the
tuner's GPU timings faked where a run is needed)."""
import json
import os
import subprocess
import sys

import pytest

from jax_flashoverlap import plan as plan_lib, tuning, tune
from _tuning_util import H200, entry as _entry, write_config as _write


def test_tune_cli_refuses_without_gpu():
    repo = tuning.PACKAGE_DIR.parent.parent
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # no GPU, also on GPU machines
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.tune", "--shapes", "256x256x256"],
                       capture_output=True, text=True, timeout=240, cwd=repo, env=env)
    assert r.returncode == 2 and "needs GPUs" in r.stderr, r.stderr


@pytest.mark.parametrize("argv, message", [
    (["--world", "-1"], "--world must be in [1, 8] (the devices here; 0: all), got -1"),
    (["--world", "9"], "--world must be in [1, 8] (the devices here; 0: all), got 9"),
    (["--world", "3", "--shapes", "64x64x64"], "--shapes 64x64x64: K=64 must split over "
                                               "--world 3 into a multiple of 8 per device"),
    (["--world", "2", "--shapes", "64x60x64"], "--shapes 64x60x64: N=60 must be a multiple of 8"),
    (["--world", "2", "--shapes", "30x256x256"], "--shapes 30x256x256: tuning a GEMM + "
                                                 "collective needs M divisible by 2 * world = 4"),
    (["--calls", "0"], "--calls must be >= 1, got 0"),
    (["--samples", "0"], "--samples must be >= 1, got 0"),
    (["--max-error", "0"], "--max-error must be a finite number > 0 (the largest relative "
                           "error vs float32 accepted), got 0.0"),
    (["--world", "1", "--peer"], "--peer: the peer stores take a mesh of 2 to 8 GPUs, --world is 1"),
    (["--collectives", "--ops", "all_to_all", "--world", "1"], "--ops needs a mesh of >= 2 GPUs "
                                                               "(over one device"),
])
def test_tune_cli_checks_world_and_shapes_before_any_gpu_time(argv, message, monkeypatch,
                                                              capsys):
    """--world sliced the device list unchecked (-1: all but the last device, 9 of 8: all 8),
    --world 3 with K=64 crashed in JAX (IndivisibleError), M=30 on 2 GPUs crashed after the
    calibration (no collective curve): now parser errors (exit 2), before any device work. The
    8 CPU devices pass for GPUs here (the check after the GPU one is what is tested)."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tune, "tune_problem", lambda *a: pytest.fail("tuned a bad problem"))
    shapes = [] if "--shapes" in argv else ["--shapes", "512x512x512"]
    with pytest.raises(SystemExit) as info:
        tune.main(["--collectives", "all_reduce", *shapes, *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("other-world", "--out: jax_flashoverlap: {d}/x4.json holds plans for cpu x 4, not cpu x 2"),
    ("not-json", "--out: jax_flashoverlap: invalid tuned-config file {d}/junk.json: not JSON"),
    ("a-directory", "--out: jax_flashoverlap: cannot read tuned-config file {d}/configs"),
    ("default-file-broken", "the config file: jax_flashoverlap: invalid tuned-config file "
                            "{d}/configs/cpu_x2.json: not JSON"),
    ("report-in-missing-folder", "--report {d}/no/r.json: cannot write there ({d}/no is not a "
                                 "writable directory)"),
    ("report-a-directory", "--report {d}/configs: cannot write there (a directory)"),
])
def test_tune_cli_checks_its_output_paths_before_any_gpu_time(case, message, tmp_path,
                                                              monkeypatch, capsys):
    """The config to merge into and the report were first touched after every problem was
    tuned: an --out of another world size, not JSON or a directory, a broken default file or
    a --report in a missing folder then raised (ConfigError, FileNotFoundError) and the hours
    of results were lost. Now parser errors (exit 2) before any problem is tuned."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tune, "tune_problem", lambda *a: pytest.fail("tuned before the check"))
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    (tmp_path / "configs").mkdir()
    _write(tmp_path / "x4.json", [], gpu="cpu", world_size=4)
    (tmp_path / "junk.json").write_text("{")
    if case == "default-file-broken":  # <gpu>_x<world>.json in the config dir (CPU: 'cpu')
        (tmp_path / "configs" / "cpu_x2.json").write_text("{")
    out = {"other-world": ["--out", str(tmp_path / "x4.json")],
           "not-json": ["--out", str(tmp_path / "junk.json")],
           "a-directory": ["--out", str(tmp_path / "configs")],
           "default-file-broken": [],
           "report-in-missing-folder": ["--report", str(tmp_path / "no" / "r.json")],
           "report-a-directory": ["--report", str(tmp_path / "configs")]}[case]
    with pytest.raises(SystemExit) as info:
        tune.main(["--collectives", "all_reduce", "--shapes", "512x512x512", "--world", "2",
                   *out])
    assert info.value.code == 2
    assert message.format(d=tmp_path) in capsys.readouterr().err


def test_tune_cli_makes_a_missing_config_dir(tmp_path, monkeypatch):
    """A $JAX_FLASHOVERLAP_CONFIG_DIR that does not exist is an error at lookup: the tuner, which
    writes there, makes it first (its own lookups would fail otherwise)."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path / "new" / "configs"))

    def stop(pb, args, progress):
        assert (tmp_path / "new" / "configs").is_dir() and tuning.lookup(
            H200, 2, "all_reduce", "bfloat16", 1024, 512, 256) is None
        raise SystemExit(0)

    monkeypatch.setattr(tune, "tune_problem", stop)
    with pytest.raises(SystemExit) as info:
        tune.main(["--collectives", "all_reduce", "--shapes", "512x512x512", "--world", "2"])
    assert info.value.code == 0


def test_tune_cli_keeps_the_problems_tuned_before_a_failure(tmp_path, monkeypatch):
    """Each problem's entry is saved when it is tuned: the config was written only at the end,
    so a failure in the last problem lost every earlier result (hours on a real machine)."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    # an existing folder: with --out given tune makes none, and a missing one is refused up
    # front (as every lowering of the tuner's own runs would refuse it)
    (tmp_path / "configs").mkdir()
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    tuned = []

    def fake(pb, args, progress):
        if len(tuned) == 1:
            raise RuntimeError("the GPU fell over")
        tuned.append(pb)
        entry = _entry(m=pb.m, n=pb.n, k=pb.k // 2, band_rows=[0, pb.m // 2, pb.m])
        return entry, {"collective": pb.collective, "m": pb.m}

    monkeypatch.setattr(tune, "tune_problem", fake)
    out, report = tmp_path / "c.json", tmp_path / "r.json"
    with pytest.raises(RuntimeError, match="fell over"):
        tune.main(["--collectives", "all_reduce", "--shapes", "512x512x512", "1024x512x512",
                   "--world", "2", "--out", str(out), "--report", str(report)])
    data = json.loads(out.read_text())
    assert [(e["m"], e["n"]) for e in data["entries"]] == [(512, 512)]
    rep = json.loads(report.read_text())
    assert rep["complete"] is False and len(rep["rows"]) == 1


def _tune_refused(monkeypatch):
    """tune.main's exit status on a GPU backend (faked) where it must stop before tuning."""
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tune, "tune_problem", lambda *a: pytest.fail("tuned"))
    with pytest.raises(SystemExit) as info:
        tune.main(["--collectives", "all_reduce", "--shapes", "512x512x512", "--world", "2"])
    return info.value.code


def test_tune_cli_names_a_launcher_variable_that_is_not_a_number(monkeypatch, capsys):
    monkeypatch.setenv("JAX_FLASHOVERLAP_NUM_PROCESSES", "two")
    assert _tune_refused(monkeypatch) == 2
    assert "JAX_FLASHOVERLAP_NUM_PROCESSES='two' must be an integer" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["jax_distributed", "launcher_env"])
def test_tune_cli_refuses_several_processes(monkeypatch, capsys, how):
    """Under the launcher each process would calibrate on devices it may not own and write the
    config: a parser error naming how to run it instead. The tuner never starts
    jax.distributed itself, so under jax_flashoverlap.launch JAX sees one process: the
    launcher's own variable must be enough to refuse."""
    import jax
    if how == "jax_distributed":
        monkeypatch.setattr(jax, "process_count", lambda: 2)
    else:
        assert jax.process_count() == 1
        monkeypatch.setenv("JAX_FLASHOVERLAP_NUM_PROCESSES", "2")
    assert _tune_refused(monkeypatch) == 2
    assert "runs in one process" in capsys.readouterr().err


def test_the_tuner_records_the_kernel_build_in_each_entry_and_its_report(tmp_path, monkeypatch):
    """The whole CLI (GPU backend and timings faked, the tuner's code real)."""
    import jax
    from _tune_fakes import fake_gpu_timings
    from jax_flashoverlap import _ext
    fake_gpu_timings(monkeypatch)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(_ext, "kernel_build", lambda: "5eed0123abcd4567")
    out, report = tmp_path / "cfg.json", tmp_path / "report.json"
    rc = tune.main(["--shapes", "256x256x256", "--world", "2", "--top", "2", "--calls", "1",
                    "--samples", "1", "--comm-sms", "8", "--cta-policies", "default",
                    "--out", str(out), "--report", str(report)])
    assert rc == 0
    saved = json.loads(out.read_text())["entries"]
    assert len(saved) == 2 and all(e["kernel"] == "5eed0123abcd4567" for e in saved), saved
    assert json.loads(report.read_text())["kernel_build"] == "5eed0123abcd4567"
    tuning.load_file(out)  # and the file it wrote validates


@pytest.mark.parametrize("flag, wave_align", [([], True), (["--no-wave-align"], False)])
def test_no_wave_align_is_off_unless_given_and_its_help_shows_no_default(flag, wave_align, tmp_path,
                                                                        monkeypatch, capsys):
    import jax

    class Stop(Exception):
        pass

    def capture(pb, args, progress):
        raise Stop(args.wave_align)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tune, "tune_problem", capture)
    with pytest.raises(Stop) as got:
        tune.main(["--shapes", "256x256x256", "--world", "2", "--out", str(tmp_path / "c.json")]
                  + flag)
    assert got.value.args == (wave_align,)
    with pytest.raises(SystemExit):
        tune.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-wave-align tune exactly the --comm-sms values given (without it they are " \
           "raised) --cta-policies" in text, text


@pytest.mark.parametrize("argv", [["--comm-sms", "1", str(plan_lib.MAX_COMM_SMS)],
                                  ["--world", "8", "--peer"],
                                  ["--world", "2", "--peer", "--top", "1", "--calls", "1",
                                   "--samples", "1", "--max-error", "1e-9"]])
def test_tune_cli_accepts_the_edges_of_each_range(argv, monkeypatch):
    """The refusals above stop at their bounds: --comm-sms 1 and MAX_COMM_SMS, --peer on 8
    GPUs (plan_peer.MAX_WORLD) or 2, --top / --calls / --samples 1 and a tiny --max-error are
    tuned, with the values given."""
    import jax

    class Stop(Exception):
        pass

    def capture(pb, args, progress):
        raise Stop(args)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(tune, "tune_problem", capture)
    world = [] if "--world" in argv else ["--world", "2"]
    with pytest.raises(Stop) as got:
        tune.main(["--collectives", "all_reduce", "--shapes", "512x512x512", *world, *argv])
    args = got.value.args[0]
    assert args.world == int((world or argv)[1])
    if "--comm-sms" in argv:
        assert args.comm_sms == [1, plan_lib.MAX_COMM_SMS]
    if "--peer" in argv:
        assert args.peer is True
    if "--top" in argv:
        assert (args.top, args.calls, args.samples, args.max_error) == (1, 1, 1, 1e-9)


def test_tune_cli_reports_ops_only_runs_complete(tmp_path, monkeypatch):
    """`--collectives --ops ...` (no GEMM + collective problems): the GEMM + collective's shape
    rules do not apply (M=18 is not divisible by 2 * world, fine for an all-gather), the op's
    entry is saved and the report says complete once every op is tuned (op problems count)."""
    import jax
    from jax_flashoverlap import tune_a2a
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    tuned = []

    def fake(op, shape, mesh, args, progress, key):
        tuned.append((op, shape, mesh.devices.size))
        entry = tune_a2a.entry_for(op, "bfloat16", *tune_a2a.local_problem(op, *shape, 2), 2, None, 0.6,
                                   0.5)
        return entry, {"op": op}

    monkeypatch.setattr(tune_a2a, "tune_op", fake)
    out, report = tmp_path / "c.json", tmp_path / "r.json"
    rc = tune.main(["--collectives", "--ops", "all_gather", "--shapes", "18x32x64",
                    "--world", "2", "--out", str(out), "--report", str(report)])
    assert rc == 0 and tuned == [("all_gather", (18, 32, 64), 2)]
    rep = json.loads(report.read_text())
    assert rep["complete"] is True and rep["rows"] == [{"op": "all_gather"}]
    assert [(e["collective"], e["overlap"]) for e in tuning.load_file(out).values()] == \
        [("all_gather", False)]
