"""What the benchmark CLIs record besides their timings: the commit measured, the rows as they
finish (so a run cut short keeps them) and strict JSON. Used by bench, tune and benchmarks/."""

from __future__ import annotations

import json
import math
import os
import subprocess


def git_commit(root=None) -> str:
  """The commit results are recorded against: $JAX_FLASHOVERLAP_GIT_COMMIT when set (the GPU
  machine gets the working tree beside a git directory that may be older, or none: the
  caller passes the hash), else git's HEAD of `root` (this checkout), with "+dirty" when the
  tree differs from it (changed or untracked files: the results are not HEAD's), else
  "unknown"."""
  if os.environ.get("JAX_FLASHOVERLAP_GIT_COMMIT"):
    return os.environ["JAX_FLASHOVERLAP_GIT_COMMIT"]
  root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True,
                                    text=True, timeout=10)
    out = git("rev-parse", "HEAD")
    commit = out.stdout.strip()
    if out.returncode != 0 or len(commit) != 40:
      return "unknown"
    status = git("status", "--porcelain")
    return commit + ("+dirty" if status.returncode != 0 or status.stdout.strip() else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


class RowLog(list):
  """The rows of one bench run. Each append also rewrites --out (main() sets args.on_row; the
  file says "complete": false until the run ends), so a run cut short, e.g. by a device
  call's time limit, keeps every row it finished."""

  def __init__(self, args):
    super().__init__()
    self._on_row = getattr(args, "on_row", None)

  def append(self, row):
    super().append(row)
    if self._on_row is not None:
      self._on_row(list(self))


def write_json(path, result):
  """result as strict JSON at path, replaced whole (a reader never sees half a file). A link
  is followed (its target replaced, the link kept); a device or FIFO (/dev/stdout) is written
  to, not replaced by a regular file."""
  text = json.dumps(json_safe(result), indent=1, default=str, allow_nan=False)
  if os.path.exists(path) and not os.path.isfile(path):  # (exists, isfile: links followed)
    with open(path, "w") as f:
      f.write(text + "\n")
    return
  path = os.path.realpath(path)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):  # a failed write leaves no stray file beside the target
      os.remove(tmp)


def json_safe(value):
  """value with every NaN / infinity as None (JSON null): json.dump wrote them as bare NaN,
  which is not JSON (JSON.parse, jq and strict parsers refuse the file). Such a value means
  "undefined", e.g. overlap_efficiency when XLA's dot + collective is no slower than
  max(dot, collective)."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_safe(v) for v in value]
  return value
