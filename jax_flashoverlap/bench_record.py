"""What the benchmark CLIs record besides their timings: the commit measured, the rows as they
finish (so a run cut short keeps them) and strict JSON. Used by bench, tune and benchmarks/."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys


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


def is_stream(path) -> bool:
  """Whether `path` names a stream rather than a file: this process's descriptors
  (/dev/stdout, /dev/fd/N, /proc/self/fd/N), anything under /proc, a link under /dev (what
  they lead to may be a regular file, a redirected log, which must not be replaced), or an
  existing FIFO, device or socket (/dev/null). A plain path under /dev (/dev/shm/r.json) is
  a file: every path under /dev was a stream, and a new file there was refused as not
  writable."""
  path = os.path.abspath(path)
  if _own_fd(path) is not None or path.startswith("/proc/"):
    return True
  if path.startswith("/dev/") and os.path.islink(path):
    return True
  return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def _own_fd(path):
  """The file descriptor a path names in this process (/dev/stdout, /dev/stderr, /dev/fd/N,
  /proc/self/fd/N), else None. Opened anew, such a path gets its own offset: into a
  redirected log it overwrote what the process printed meanwhile."""
  path = os.path.abspath(path)
  named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
  if path in named:
    return named[path]
  for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
    if path.startswith(prefix) and path[len(prefix):].isdigit():
      return int(path[len(prefix):])
  return None


def write_json(path, result):
  """result as strict JSON at path, replaced whole (a reader never sees half a file); a link
  is followed (its target replaced, the link kept). A stream (is_stream) is appended to: a
  FIFO, /dev/null, /dev/stdout, also when stdout is redirected to a file (replacing that file
  lost the log); writers of a stream write once, at the end (is_stream)."""
  text = json.dumps(json_safe(result), indent=1, default=str, allow_nan=False)
  fd = _own_fd(path)
  if fd is not None:  # this process's stdout / stderr / fd N: written at its own offset
    sys.stdout.flush()
    sys.stderr.flush()
    data = (text + "\n").encode()
    while data:
      data = data[os.write(fd, data):]
    return
  if is_stream(path):
    with open(path, "a") as f:
      f.write(text + "\n")
    return
  path = os.path.realpath(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)  # made only once there is something to write
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


def run_main(main) -> int:
  """main()'s exit status; a reader that closed the pipe (`bench ... | head -1`) ends the run
  quietly, as Unix tools do, instead of a BrokenPipeError traceback (and another one when
  Python flushes stdout at exit)."""
  try:
    return main()
  except BrokenPipeError:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the exit's flush has nowhere to fail
    return 141  # 128 + SIGPIPE, a shell's status for a command its pipe's reader left
