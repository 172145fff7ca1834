"""The GPU diagnosis scripts' CPU-checkable parts: scripts/diagnose_hang.py's --wait check,
the child it starts (stacks dumped 5 s before the deadline, our kernels forced, its exit status
passed on), scripts/diagnose_ffi_error.py's verdict on each child's output and its exit status,
and scripts/first_call_overlap.py's refusal off GPU. Children are faked (a sitecustomize, or
subprocess.run patched), so no op runs here. The bad-input table has the other rows
(tests/_bad_cases_scripts.py)."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import types

import pytest

from _util import repo_env

ROOT = pathlib.Path(__file__).resolve().parent.parent

_FAKE_CHILD = """
import faulthandler, os, sys
if "-c" in sys.orig_argv:  # diagnose_hang.py's child, not the script
  def _report(seconds, exit=False):
    print("CHILD", seconds, exit, os.environ.get("JAX_FLASHOVERLAP_FALLBACK"), sys.argv[1:],
          flush=True)
    os._exit(7)
  faulthandler.dump_traceback_later = _report
"""


def _script(path, *args, timeout=60, **env):
  return subprocess.run([sys.executable, str(ROOT / path), *args], cwd=ROOT,
                        env=repo_env(JAX_PLATFORMS="cpu", **env), capture_output=True,
                        text=True, timeout=timeout)


@pytest.mark.parametrize("wait, dump", [("12", "7.0"), ("5.5", "0.5")])
def test_diagnose_hang_passes_the_childs_exit_status_on(tmp_path, wait, dump):
  """The child dumps its stacks 5 s before the deadline (a --wait of 5.5 s: 0.5 s; it was
  int(5.5) - 5 = 0, a child failing at once on faulthandler's "timeout must be greater than
  0", read as the op failing), runs our kernels (no fallback) and its exit status is the
  script's."""
  (tmp_path / "sitecustomize.py").write_text(_FAKE_CHILD)
  r = _script("scripts/diagnose_hang.py", "ag", "--wait", wait,
              PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", JAX_FLASHOVERLAP_FALLBACK="1")
  assert r.returncode == 7, (r.stdout, r.stderr)
  assert f"CHILD {dump} False 0 ['ag']" in r.stdout
  assert "[diagnose] ag: child exited 7 after" in r.stdout


def test_diagnose_hang_refuses_a_wait_of_5_s_or_less():
  for wait in ("5", "0", "-3"):
    r = _script("scripts/diagnose_hang.py", "ar", "--wait", wait)
    assert r.returncode == 2 and "must be a finite number of seconds > 5" in r.stderr, wait


def _ffi_module():
  spec = importlib.util.spec_from_file_location(
      "diagnose_ffi_error", ROOT / "scripts" / "diagnose_ffi_error.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _verdict(monkeypatch, returncode, stdout, case="alias_then_bad"):
  mod = _ffi_module()
  done = types.SimpleNamespace(returncode=returncode, stdout=stdout, stderr="")
  monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: done)
  ok, report = mod.run_case(case)
  return ok, report


def test_diagnose_ffi_error_wants_every_call_and_a_clean_exit(monkeypatch):
  calls = "nan\nraised XlaRuntimeError poison_outputs must be 0 or 1\nfinite\nfinite\n"
  ok, report = _verdict(monkeypatch, 0, calls + "child done\n")
  assert ok and "as expected" in report[0], report
  # the process unusable afterwards: the two good calls at the end did not both work
  assert not _verdict(monkeypatch, 0, "nan\nraised X\nfinite\nraised Y\nchild done\n")[0]
  assert not _verdict(monkeypatch, 0, "nan\nraised X\nchild done\n")[0]
  # every call as expected, then a crash on the way out
  ok, report = _verdict(monkeypatch, -11, calls + "child done\n")
  assert not ok and "exit -11, NOT as expected" in report[0], report
  # the child stopped before its end without an error status
  assert not _verdict(monkeypatch, 0, calls)[0]


def test_diagnose_ffi_error_exits_1_when_a_case_is_not_as_expected(monkeypatch, capsys):
  mod = _ffi_module()
  verdicts = {"bad_attr_first": (True, ["== bad_attr_first"]),
              "bad_sms_first": (False, ["== bad_sms_first"])}
  monkeypatch.setattr(mod, "run_case", verdicts.__getitem__)
  monkeypatch.setattr(sys, "argv", ["diagnose_ffi_error.py", "bad_attr_first", "bad_sms_first"])
  assert mod.main() == 1
  assert "1 of 2 cases as expected" in capsys.readouterr().out
  monkeypatch.setattr(sys, "argv", ["diagnose_ffi_error.py", "bad_attr_first"])
  assert mod.main() == 0


def test_diagnose_ffi_error_without_arguments_runs_every_case(monkeypatch, capsys):
  mod = _ffi_module()
  seen = []
  monkeypatch.setattr(mod, "run_case", lambda case: seen.append(case) or (True, [case]))
  monkeypatch.setattr(sys, "argv", ["diagnose_ffi_error.py"])
  assert mod.main() == 0
  assert seen == list(mod.EXPECTED) and len(seen) == 12
  assert "12 of 12 cases as expected" in capsys.readouterr().out


def test_first_call_overlap_refuses_a_cpu_backend_even_with_tracing_on():
  """FLASHOVERLAP_TRACE=1 alone must not start an 8192^3 product on CPU (no trace records
  there: XLA's path)."""
  r = _script("scripts/first_call_overlap.py", FLASHOVERLAP_TRACE="1", timeout=90)
  assert r.returncode == 1 and "needs a GPU and FLASHOVERLAP_TRACE=1" in r.stderr, r.stderr
  assert "'cpu'" in r.stderr


@pytest.mark.parametrize("args, code, text", [
    (["--help"], 0, "Does the first overlapped call of a process overlap?"),
    (["--groups", "4"], 2, "unrecognized arguments: --groups 4")])
def test_first_call_overlap_answers_help_and_refuses_arguments_before_jax(args, code, text):
  """The probe takes no arguments: --help prints what it measures and how to run it (it
  said "needs a GPU"), and an argument is argparse's exit 2, not silently dropped."""
  r = _script("scripts/first_call_overlap.py", *args)
  assert r.returncode == code, (r.stdout, r.stderr)
  assert text in (r.stdout if code == 0 else r.stderr)
  assert "needs a GPU" not in r.stdout + r.stderr
