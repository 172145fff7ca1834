"""docs/multi_gpu_runbook.md's literal commands, run here as far as they go without GPUs: the
plan of a rare 2-GPU session must not meet a broken command of its own there."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK = (ROOT / "docs" / "multi_gpu_runbook.md").read_text()


def _snippet(start: str) -> str:
  """The inline `code` of the runbook that begins with `start`, its line breaks joined."""
  text = " ".join(RUNBOOK.split())
  i = text.index("`" + start) + 1
  return text[i:text.index("`", i)]


def _bring_back(tmp_path, built, kept):
  """The runbook's object snippet in a tree with build/obj/<built> and .gpu_obj/<kept>:
  (exit status, names in $OUT/obj.tgz or None)."""
  import tarfile
  for folder, names in (("build/obj", built), (".gpu_obj", kept)):
    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for name in names:
      (tmp_path / folder / name).write_bytes(b"o")
  (tmp_path / "out").mkdir(exist_ok=True)
  r = subprocess.run(["bash", "-uc", _snippet("new=();")], cwd=tmp_path, capture_output=True,
                     text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
  archive = tmp_path / "out" / "obj.tgz"
  return r.returncode, (sorted(tarfile.open(archive).getnames()) if archive.exists() else None)


def test_the_object_snippet_brings_back_the_new_objects_only(tmp_path):
  assert _bring_back(tmp_path / "a", ["k.1.o", "h.2.o"], ["k.1.o"]) == (0, ["h.2.o"])


def test_the_object_snippet_succeeds_when_nothing_is_new(tmp_path):
  """The usual case (every object carried): tar refused an empty archive, exit 2."""
  assert _bring_back(tmp_path, ["k.1.o"], ["k.1.o"]) == (0, None)


def test_every_call_fits_the_wrapper_timeout():
  """Each call runs `timeout 570 bash scripts/gpu_session.sh STEPS` with STEP_TIMEOUT bounding
  every step: build + N x STEP_TIMEOUT over 570 s let the wrapper cut the last step (call C's
  three steps at 200 s, call B's 560 s after build)."""
  calls = re.findall(r"STEP_TIMEOUT=(\d+)[^`\n]*?gpu_session\.sh ((?:[a-z_0-9]+ ?)+)", RUNBOOK)
  assert len(calls) >= 3, calls  # calls A, B, C
  for timeout, steps in calls:
    steps = [s for s in steps.split() if s != "build"]
    assert int(timeout) * len(steps) <= 540, (timeout, steps)
