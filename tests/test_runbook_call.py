"""scripts/runbook_call.sh, docs/multi_gpu_runbook.md's calls A-C as one command each: what it
refuses before any GPU work, the steps and bounds it hands scripts/gpu_session.sh (a stub here
that logs them), the peer check deciding the tune's --peer, and what comes back: one archive
of the logs and one of the objects the build added, also when RUN_LIMIT cuts a hung step."""
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import time

from _fake_tools import nvidia_smi, write_nvidia_smi

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Logs its arguments and environment, "builds" one new object, prints a summary as
# gpu_session.sh does; FAKE_SESSION_SLEEP: hangs instead.
_SESSION_STUB = r'''#!/bin/bash
[ -n "${FAKE_SESSION_SLEEP:-}" ] && sleep "$FAKE_SESSION_SLEEP"
python3 -c 'import json, os, sys; print(json.dumps({"args": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("STEP_TIMEOUT", "TUNE_ARGS", "OVERLAP_ARGS", "JAX_FLASHOVERLAP_GIT_COMMIT", "NCCL_NVLS_ENABLE", "OUT")}}))' "$@" > "$FAKE_SESSION_LOG"
touch build/obj/new.o
echo "==== summary"; echo "build rc=0"; exit "${FAKE_SESSION_RC:-0}"
'''


def _call(tmp_path, *args, gpus=2, peer_rc=0, **env):
  """(returncode, stdout, the stub's logged call or None, out dir, repo) of the script copied
  into a repository of its own with a carried object, a stub peer check and fake GPUs."""
  repo = tmp_path / "repo"
  (repo / "scripts").mkdir(parents=True)
  for script in ("runbook_call.sh", "_gpus.sh"):
    shutil.copy(ROOT / "scripts" / script, repo / "scripts")
  (repo / "scripts" / "gpu_session.sh").write_text(_SESSION_STUB)
  (repo / ".gpu_obj").mkdir()
  (repo / ".gpu_obj" / "carried.o").write_bytes(b"o")
  (repo / ".build").mkdir()
  check = repo / ".build" / "peer_reduce_2gpu_test"
  check.write_text(f"#!/bin/bash\necho \"peer check $*\"; exit {peer_rc}\n")
  check.chmod(0o755)
  tools = tmp_path / "tools"
  write_nvidia_smi(tools, nvidia_smi(gpus))
  out, log = tmp_path / "out", tmp_path / "session.json"
  full = {"PATH": f"{tools}:/usr/bin:/bin", "OUT": str(out), "FAKE_SESSION_LOG": str(log),
          "TMPDIR": str(tmp_path), **env}
  r = subprocess.run(["bash", str(repo / "scripts" / "runbook_call.sh"), *args], env=full,
                     capture_output=True, text=True, timeout=120, cwd=tmp_path)
  logged = json.loads(log.read_text()) if log.exists() else None
  return r.returncode, r.stdout + r.stderr, logged, out, repo


def _read(path, name):
  with tarfile.open(path) as tar:
    return tar.extractfile(f"./{name}").read().decode()


def test_bad_calls_are_refused_before_anything_runs(tmp_path):
  for i, (args, env, said) in enumerate((
      ((), {"COMMIT": "abc"}, "usage: COMMIT=<hash> bash scripts/runbook_call.sh A|B|C"),
      (("D",), {"COMMIT": "abc"}, "usage:"),
      (("A",), {}, "runbook_call: set COMMIT"),
      (("B",), {"COMMIT": "abc", "RUN_LIMIT": "soon"}, "RUN_LIMIT=soon must be a count"),
      (("B",), {"COMMIT": "abc", "RUN_LIMIT": "5"}, "RUN_LIMIT=5 must be a count of seconds >= 20"))):
    code, out, logged, outdir, repo = _call(tmp_path / str(i), *args, **env)
    assert code == 2 and said in out and logged is None, (args, out)
    assert not (repo / "build").exists()


def test_fewer_than_two_gpus_run_nothing(tmp_path):
  for gpus in (0, 1):
    code, out, logged, _, repo = _call(tmp_path / str(gpus), "C", gpus=gpus, COMMIT="abc")
    assert code == 3 and logged is None, out
    assert f"runbook_call C: {gpus} GPU(s) here, the runbook's calls need 2 or more" in out
    assert not (repo / "build").exists()


def test_call_a_tunes_with_the_peer_stores_only_where_their_check_passed(tmp_path):
  for peer_rc, want in ((0, "--peer"), (1, None)):
    code, out, logged, outdir, repo = _call(tmp_path / str(peer_rc), "A", peer_rc=peer_rc,
                                            COMMIT="c0ffee1")
    assert code == 0, out
    assert logged["args"] == ["build", "tune"]
    env = logged["env"]
    assert env["TUNE_ARGS"] == want
    assert (env["JAX_FLASHOVERLAP_GIT_COMMIT"], env["NCCL_NVLS_ENABLE"]) == ("c0ffee1", "0")
    # what the check left (an instant stub here; 1-4 s on a GPU): the runbook gave 480 s
    # to the tune after a check taking its whole 60 s
    assert 500 <= int(env["STEP_TIMEOUT"]) <= 530
    assert sorted(p.name for p in outdir.iterdir()) == ["logs.tgz", "obj.tgz"]
    assert {oct(p.stat().st_mode & 0o777) for p in outdir.iterdir()} == {"0o644"}
    assert _read(outdir / "logs.tgz", "pr2.log").startswith("peer check check --json")
    summary = _read(outdir / "logs.tgz", "summary.txt")
    assert f"TUNE_ARGS='{want or ''}'" in summary and "gpu_session rc=0" in summary
    # only the object the build added comes back; the carried one was copied in for it
    with tarfile.open(outdir / "obj.tgz") as tar:
      assert tar.getnames() == ["new.o"]
    assert (repo / "build" / "obj" / "carried.o").exists()


def test_calls_b_and_c_and_the_callers_own_arguments(tmp_path):
  code, out, logged, _, _ = _call(tmp_path / "b", "B", COMMIT="abc", OVERLAP_ARGS="--collectives reduce_scatter")
  assert code == 0 and logged["args"] == ["build", "overlap_all"], out
  assert logged["env"]["OVERLAP_ARGS"] == "--collectives reduce_scatter"
  assert 500 <= int(logged["env"]["STEP_TIMEOUT"]) <= 540
  code, out, logged, _, _ = _call(tmp_path / "c", "C", COMMIT="abc", TUNE_ARGS="--shapes 1x2x3")
  assert code == 0 and logged["args"] == ["build", "stress", "flax_example", "a2a_bench"], out
  assert 160 <= int(logged["env"]["STEP_TIMEOUT"]) <= 180
  code, out, logged, _, _ = _call(tmp_path / "s", "C", COMMIT="abc", STEP_TIMEOUT="99")
  assert logged["env"]["STEP_TIMEOUT"] == "99"
  code, out, logged, outdir, _ = _call(tmp_path / "f", "B", COMMIT="abc", FAKE_SESSION_RC="1")
  assert code == 1 and "gpu_session rc=1" in _read(outdir / "logs.tgz", "summary.txt")


def test_a_hung_step_is_cut_by_run_limit_and_the_logs_still_come_back(tmp_path):
  t0 = time.monotonic()
  code, out, logged, outdir, _ = _call(tmp_path, "B", COMMIT="abc", RUN_LIMIT="20",
                                       FAKE_SESSION_SLEEP="300")
  assert code == 124 and time.monotonic() - t0 < 40, out
  assert sorted(p.name for p in outdir.iterdir()) == ["logs.tgz"]  # no object was added
  assert "gpu_session rc=124" in _read(outdir / "logs.tgz", "summary.txt")
  assert os.path.exists(outdir / "logs.tgz")
