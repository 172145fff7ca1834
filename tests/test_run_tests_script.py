"""scripts/run_tests.sh, the README's test command: workers without a GPU, none with one, the
count switch checked, pytest's arguments passed on. Run against a fake venv python that
prints what it was asked to run, and a fake nvidia-smi, so no pytest runs inside pytest."""
import os
import pathlib
import subprocess

import pytest
from _fake_tools import nvidia_smi, write_nvidia_smi

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(tmp_path, *args, gpu, xdist=True, workers=None, pytest_rc=0, env_extra=None):
  """(returncode, stdout, stderr) of run_tests.sh with a fake venv and a fake nvidia-smi
  (gpu: lists one GPU, or is the script text of one; else fails, as without a driver).
  The fake pytest exits with pytest_rc and writes to tmp_path/seen.txt the compile cache it
  was given (JAX_FLASHOVERLAP_TEST_CACHE_DIR or "unset") and whether that directory exists."""
  venv_bin = tmp_path / "venv" / "bin"
  venv_bin.mkdir(parents=True)
  seen = tmp_path / "seen.txt"
  (venv_bin / "python").write_text(
      "#!/bin/bash\n"
      f'if [ "$1" = -c ]; then exit {0 if xdist else 1}; fi\n'
      'echo "python $*"\n'
      'd="${JAX_FLASHOVERLAP_TEST_CACHE_DIR-unset}"\n'
      f'{{ echo "$d"; [ -d "$d" ] && echo exists || echo absent; }} > "{seen}"\n'
      f"exit {pytest_rc}\n")
  tools = tmp_path / "tools"
  tools.mkdir()
  write_nvidia_smi(tools, (gpu if isinstance(gpu, str) else nvidia_smi()) if gpu else "exit 9\n")
  (venv_bin / "python").chmod(0o755)
  env = {"PATH": f"{tools}:/usr/bin:/bin", "VENV": str(tmp_path / "venv")}
  if workers is not None:
    env["JAX_FLASHOVERLAP_TEST_WORKERS"] = workers
  env.update(env_extra or {})
  r = subprocess.run(["bash", str(ROOT / "scripts" / "run_tests.sh"), *args], env=env,
                     capture_output=True, text=True, timeout=60)
  return r.returncode, r.stdout.strip(), r.stderr.strip()


def test_without_a_gpu_one_worker_per_core(tmp_path):
  cores = len(os.sched_getaffinity(0))  # what nproc counts
  code, out, _ = _run(tmp_path, "-k", "plan", gpu=False)
  assert code == 0
  if cores > 1:
    assert out == f"python -m pytest -q -n {cores} -k plan"
  else:
    assert out == "python -m pytest -q -k plan"


def test_with_a_gpu_one_test_at_a_time(tmp_path):
  assert _run(tmp_path, "tests/test_gpu.py", gpu=True) == (
      0, "python -m pytest -q tests/test_gpu.py", "")


@pytest.mark.parametrize("workers, expected", [
    ("3", "python -m pytest -q -n 3 -x"),
    ("1", "python -m pytest -q -x"),
    ("0", "python -m pytest -q -x"),
])
def test_the_worker_count_switch_wins(tmp_path, workers, expected):
  assert _run(tmp_path, "-x", gpu=True, workers=workers) == (0, expected, "")


def test_without_xdist_the_tests_still_run_and_say_why(tmp_path):
  code, out, err = _run(tmp_path, gpu=False, xdist=False, workers="2")
  assert (code, out) == (0, "python -m pytest -q")
  assert err == "run_tests: pytest-xdist is not installed: running the tests one at a time"


@pytest.mark.parametrize("workers", ["two", "-1", "2.5", " "])
def test_a_bad_worker_count_is_refused(tmp_path, workers):
  code, out, err = _run(tmp_path, gpu=False, workers=workers)
  assert (code, out) == (2, "")
  assert err == f"run_tests: JAX_FLASHOVERLAP_TEST_WORKERS={workers} must be a count >= 0"


def test_gpus_listed_one_line_at_a_time_are_gpus(tmp_path):
  """An nvidia-smi still writing after its first GPU line: `grep -q` stopped reading there,
  the next write got SIGPIPE and, under pipefail, the GPU machine read as having none (one
  xdist worker per core on the GPUs)."""
  smi = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'; sleep 0.2\n" for i in range(3))
  assert _run(tmp_path, "tests/test_gpu.py", gpu=smi) == (
      0, "python -m pytest -q tests/test_gpu.py", "")


def _seen(tmp_path):
  return (tmp_path / "seen.txt").read_text().split("\n")[:2]


@pytest.mark.parametrize("pytest_rc", [0, 3])
def test_without_a_gpu_the_run_shares_a_compile_cache_it_removes(tmp_path, pytest_rc):
  """One fresh directory for the whole run, there while pytest runs, gone after it, whether
  the tests passed or not; pytest's exit status is the script's."""
  code, out, _ = _run(tmp_path, gpu=False, workers="0", pytest_rc=pytest_rc)
  assert (code, out) == (pytest_rc, "python -m pytest -q")
  cache, state = _seen(tmp_path)
  assert pathlib.Path(cache).name.startswith("jax_flashoverlap_tests."), cache
  assert state == "exists"
  assert not pathlib.Path(cache).exists(), "the run's compile cache was left behind"


def test_with_a_gpu_no_compile_cache(tmp_path):
  assert _run(tmp_path, gpu=True)[0] == 0
  assert _seen(tmp_path) == ["unset", "absent"]


@pytest.mark.parametrize("given", ["", "mine"])
def test_a_compile_cache_given_is_used_as_is_and_kept(tmp_path, given):
  """Set: that directory, kept after the run; set empty: none (conftest reads empty as off)."""
  path = str(tmp_path / given) if given else ""
  if given:
    (tmp_path / given).mkdir()
  assert _run(tmp_path, gpu=False, workers="0",
              env_extra={"JAX_FLASHOVERLAP_TEST_CACHE_DIR": path})[0] == 0
  assert _seen(tmp_path) == [path, "exists" if given else "absent"]
  assert not given or (tmp_path / given).is_dir()


def test_a_compile_cache_that_is_a_file_is_refused(tmp_path):
  (tmp_path / "file").write_text("")
  code, out, err = _run(tmp_path, gpu=False, workers="0",
                        env_extra={"JAX_FLASHOVERLAP_TEST_CACHE_DIR": str(tmp_path / "file")})
  assert (code, out) == (2, "")
  assert err == f"run_tests: JAX_FLASHOVERLAP_TEST_CACHE_DIR={tmp_path / 'file'} is not a directory"
