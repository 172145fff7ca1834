"""scripts/gpu_session.sh runs the GPU tests in four parts (step gpu_part): every
tests/test_gpu*.py file must be in exactly one, or a new file's tests would never run on the
GPU machine. Read from the script itself (bash expands its GPU_PARTS array)."""
import pathlib
import subprocess

from _fake_tools import nvidia_smi, write_nvidia_smi

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _parts():
    script = (ROOT / "scripts" / "gpu_session.sh").read_text()
    start = script.index("GPU_PARTS=(")
    block = script[start:script.index("\n)\n", start) + 2]
    out = subprocess.run(["bash", "-c", block + '\nfor p in "${GPU_PARTS[@]}"; do echo "$p"; done'],
                         capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines()]


def test_every_gpu_test_file_is_in_exactly_one_part():
    parts = _parts()
    assert len(parts) == 4 and all(parts)
    listed = [f for part in parts for f in part]
    assert len(listed) == len(set(listed)), "a file in two parts"
    on_disk = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_gpu*.py"))
    assert sorted(listed) == on_disk


def test_gpu_part_refuses_a_part_it_does_not_have(tmp_path):
    for part in ("5", "0", "12", ""):  # 0 was GPU_PARTS[-1]: the last part under another name
        r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "gpu_part"],
                           env={"PATH": "/usr/bin:/bin", "GPU_PART": part, "OUT": str(tmp_path)},
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and "gpu_part: set GPU_PART=1, 2, 3 or 4" in r.stdout, part


def _fake_gpu(tmp_path, model="NVIDIA H200", count=1):
    """A PATH whose nvidia-smi lists `count` GPUs (the steps that need one run; 0: none, as
    on a CPU machine, which /usr/bin:/bin alone is not on a GPU machine)."""
    smi = write_nvidia_smi(tmp_path / "smi", nvidia_smi(count, model))
    return f"{smi.parent}:/usr/bin:/bin"


def _session(tmp_path, *steps, **env):
    """The script copied into a repository root of its own (no .whl/ to install, no out/ of
    the developer's to trip over), run from tmp_path/caller with OUT=out (relative)."""
    import shutil
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    for script in ("gpu_session.sh", "_gpus.sh"):
        shutil.copy(ROOT / "scripts" / script, repo / "scripts")
    caller = tmp_path / "caller"
    caller.mkdir(exist_ok=True)
    return subprocess.run(["bash", str(repo / "scripts" / "gpu_session.sh"), *steps],
                          env={"PATH": "/usr/bin:/bin", "OUT": "out", **env},
                          capture_output=True, text=True, timeout=120, cwd=caller)


def test_every_step_the_script_runs_is_a_known_step_and_back():
    """KNOWN_STEPS (checked before any setup) and the case labels that run them agree."""
    import re
    script = (ROOT / "scripts" / "gpu_session.sh").read_text()
    known = script[script.index('KNOWN_STEPS="') + 13:]
    known = set(known[:known.index('"')].split())
    body = script[script.index('  case "$step" in'):]
    labels = set(re.findall(r"^    ([a-z_0-9]+)\)", body, re.M))
    assert known == labels, (known ^ labels)


def test_steps_and_their_variables_are_checked_before_any_step_runs(tmp_path):
    """An unknown step, or gpu_k / gpu_files without their variable, stopped the script only
    when reached, after the setup and every step before it had run."""
    for steps, env, said in [(("info", "bogus"), {}, "unknown step bogus; the steps: build"),
                             (("info", "gpu"), {}, "unknown step gpu; the steps: build"),
                             (("info", "test"), {}, "unknown step test; the steps: build"),
                             (("info", "gpu_k"), {}, "gpu_k: set PYTEST_K"),
                             (("info", "gpu_files"), {}, "gpu_files: set GPU_FILES"),
                             (("pack", "info"), {}, "pack: must be the last step")]:
        r = _session(tmp_path, *steps, **env)
        assert r.returncode == 2 and said in r.stdout, (steps, r.stdout, r.stderr)
        assert not (tmp_path / "caller" / "out" / "info.log").exists()  # nothing ran


def test_without_a_gpu_only_the_steps_that_need_none_run(tmp_path):
    """On a machine without a GPU the benchmark steps ran XLA's composition on CPU, exit 0, and
    filed it as overlap_h200x0.json; now refused before anything runs. build (a CPU machine
    with nvcc), info, tests and pack still run there."""
    no_gpu = _fake_gpu(tmp_path, count=0)  # a GPU machine's own nvidia-smi is in /usr/bin
    for steps in (("info", "overlap_bench"), ("gemm_bench",), ("gpu_part",)):
        r = _session(tmp_path, *steps, GPU_PART="1", PATH=no_gpu)
        assert r.returncode == 2, (steps, r.stdout, r.stderr)
        assert f"{steps[-1]} needs a GPU (nvidia-smi lists none here)" in r.stdout, r.stdout
        assert not (tmp_path / "caller" / "out" / "info.log").exists()  # nothing ran
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "python3").write_text("#!/bin/bash\necho ran\n")
    (tools / "python3").chmod(0o755)
    r = _session(tmp_path, "info", "tests", PATH=f"{tools}:{no_gpu}")
    assert r.returncode == 0 and "info           rc=0 " in r.stdout, (r.stdout, r.stderr)


def test_a_failed_step_fails_the_script_and_a_relative_out_is_the_callers(tmp_path):
    """The summary said rc=4 but the script exited 0; OUT=out was made under the repository
    (the script cds there first)."""
    r = _session(tmp_path, "gpu_files", GPU_FILES="tests/no_such_file.py", PATH=_fake_gpu(tmp_path))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert (tmp_path / "caller" / "out" / "gpu_files.log").exists()
    assert not (tmp_path / "repo" / "out").exists()
    assert "gpu_files      rc=" in r.stdout and "gpu_files      rc=0 " not in r.stdout


def test_pack_leaves_one_archive_of_everything(tmp_path):
    """tar wrote its archive into the folder it read ('file changed as we read it', exit 1,
    with subfolders present), so the files were never deleted and the device tool, which
    returns 8 files at most, lost the rest."""
    import tarfile
    out = tmp_path / "caller" / "out"
    (out / "sanitize").mkdir(parents=True)
    (out / "sanitize" / "memcheck.log").write_text("ERROR SUMMARY: 0 errors\n" * 2000)
    (out / "a.log").write_text("a\n")
    r = _session(tmp_path, "pack")
    assert r.returncode == 0, (r.stdout, r.stderr)
    left = [p.name for p in out.iterdir()]
    assert len(left) == 1 and left[0].startswith("session_") and left[0].endswith(".tgz"), left
    names = tarfile.open(out / left[0]).getnames()
    assert {"./a.log", "./sanitize/memcheck.log", "./summary.txt"} <= set(names), names


def test_pack_never_loses_the_archive_when_some_files_stay(tmp_path):
    """An old .tgz in a subfolder (not archived, not deleted) kept its folder, find failed,
    and the first fixed version then removed the archive it had written: every result gone."""
    import tarfile
    out = tmp_path / "caller" / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "old.tgz").write_bytes(b"x")
    (out / "sub" / "b.log").write_text("b\n")
    (out / "a.log").write_text("a\n")
    r = _session(tmp_path, "pack")
    archives = list(out.glob("session_*.tgz"))
    assert len(archives) == 1, (r.stdout, list(out.rglob("*")))
    assert {"./a.log", "./sub/b.log"} <= set(tarfile.open(archives[0]).getnames())
    assert "some files could not be deleted" in r.stdout and r.returncode == 0, r.stdout


_FAKE_PYTHON3 = """#!/bin/bash
printf '%s|' python3 "$@" >> "$FAKE_LOG"
echo "CUDA=${JAX_FLASHOVERLAP_BUILD_CUDA:-} FALLBACK=${JAX_FLASHOVERLAP_FALLBACK:-}" >> "$FAKE_LOG"
echo "ran $*"
case " $* " in *" ${FAKE_FAIL:-@@} "*) exit 4;; esac
"""


def _faked(tmp_path, *steps, gpus=(), **env):
    """_session with a fake python3 (logs its arguments and the build / fallback switches;
    exits 4 when FAKE_FAIL is one of them) and a fake timeout (logs its limit) on PATH:
    (result, logged lines). gpus: _fake_gpu's model and count."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "python3").write_text(_FAKE_PYTHON3)
    (tools / "timeout").write_text('#!/bin/bash\necho "timeout $1" >> "$FAKE_LOG"; shift; "$@"\n')
    for f in tools.iterdir():
        f.chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    r = _session(tmp_path, *steps, PATH=f"{tools}:{_fake_gpu(tmp_path, *gpus)}", FAKE_LOG=str(log),
                 **env)
    return r, log.read_text().splitlines()


def test_the_default_steps_each_under_its_timeout(tmp_path):
    r, calls = _faked(tmp_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert calls == ["timeout 400", "python3|setup.py|build_ext|--inplace|CUDA=1 FALLBACK=",
                     "timeout 400", "python3|-m|jax_flashoverlap.info|CUDA= FALLBACK=",
                     "timeout 400", "python3|-m|pytest|-q|-x|-ra|tests|CUDA= FALLBACK="]
    summary = r.stdout[r.stdout.index("==== summary"):].splitlines()[1:]
    assert [line.split()[:2] for line in summary] == [["build", "rc=0"], ["info", "rc=0"],
                                                      ["tests", "rc=0"]], r.stdout


def test_the_gpu_test_steps_run_our_kernels_with_their_own_timeouts(tmp_path):
    """gpu_tests / gpu_part: 560 s unless STEP_TIMEOUT says; the GPU-marked tests only, with
    the fallback off (a fallen-back test checks XLA against itself)."""
    marked = "|-m|pytest|-q|-ra|-m|gpu or multigpu|"
    part3 = "|".join(_parts()[2])
    r, calls = _faked(tmp_path, "gpu_tests", "gpu_k", "gpu_part", PYTEST_K="peer and not big",
                      GPU_PART="3")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert calls == ["timeout 560", f"python3{marked}tests|CUDA= FALLBACK=0",
                     "timeout 400", f"python3{marked}-k|peer and not big|tests|CUDA= FALLBACK=0",
                     "timeout 560", f"python3{marked}{part3}|CUDA= FALLBACK=0"]
    assert "gpu_part3      rc=0 " in r.stdout
    r, calls = _faked(tmp_path, "gpu_tests", "info", GPU_PART="1", STEP_TIMEOUT="77")
    assert calls[0::2] == ["timeout 77", "timeout 77"], calls


def test_a_failed_build_stops_the_session_and_each_steps_rc_is_reported(tmp_path):
    r, calls = _faked(tmp_path, "build", "info", FAKE_FAIL="setup.py")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert not [c for c in calls if "jax_flashoverlap.info" in c], calls
    assert "build          rc=4 " in r.stdout
    r, calls = _faked(tmp_path, "info", "tests", FAKE_FAIL="jax_flashoverlap.info")
    assert r.returncode == 1 and "info           rc=4 " in r.stdout, r.stdout
    assert "tests          rc=0 " in r.stdout  # later steps still run


def test_results_are_named_after_the_gpus_the_machine_came_with(tmp_path):
    """The runbook's names on 2 x H200; an H200 pair asked for may come as H100s, whose results
    were filed as h200x2 and whose tune merged into configs/h200_x2.json: refused (that file's
    plans are the H200's), the call lost."""
    for model, tag, config in (("NVIDIA H200", "h200x2", "h200_x2"),
                               ("NVIDIA H100 80GB HBM3", "h100x2", "h100_x2")):
        r, calls = _faked(tmp_path, "tune", "overlap_all", gpus=(model, 2))
        assert r.returncode == 0, (r.stdout, r.stderr)
        args = [c.split("|") for c in calls if c.startswith("python3")]
        assert args[0][args[0].index("--out") + 1] == f"jax_flashoverlap/configs/{config}.json"
        assert args[0][args[0].index("--report") + 1].endswith(f"out/tune_{tag}.json")
        assert args[1][args[1].index("--out") + 1].endswith(f"out/{tag}.json"), args


def test_peer_bench_and_the_peer_tune_are_steps_of_their_own(tmp_path):
    """peer_bench ran three benches and then a whole tune --peer (call A's 400-550 s): the step
    could not end inside one 600 s device call, and its tune never ran."""
    r, calls = _faked(tmp_path, "peer_bench", gpus=("NVIDIA H200", 2))
    assert r.returncode == 0 and not [c for c in calls if "jax_flashoverlap.tune" in c], calls
    assert len([c for c in calls if "jax_flashoverlap.bench" in c]) == 3, calls
    r, calls = _faked(tmp_path, "peer_tune", gpus=("NVIDIA H200", 2))
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = tmp_path / "caller" / "out"
    assert [c for c in calls if c.startswith("python3")] == [
        f"python3|-m|jax_flashoverlap.tune|--world|2|--peer|--out|{out}/peer_tuned_h200x2.json|"
        f"--report|{out}/peer_tune_h200x2.json|CUDA= FALLBACK="], calls
