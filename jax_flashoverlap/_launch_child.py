"""One process of `python -m jax_flashoverlap.launch`: runs the program (a script path, or
`-m module`) as `__main__`, as `python script.py` / `python -m module` would.

A program that fails (an uncaught exception, or `sys.exit` with a non-zero status) makes this
process exit at once with that status, its traceback printed and stdout / stderr / logging
flushed, without the interpreter's exit handlers: once `jax.distributed` is initialized, JAX's
handler waits in a shutdown barrier for every other process (up to its shutdown timeout,
300 s), and the launcher, which stops the others only when one has exited, would wait with
it. A program that ends normally exits normally (every handler runs, JAX's shutdown too).
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import traceback


def _exit_now(status: int) -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # noqa: BLE001  (a closed or broken stream: nothing left to save)
      pass
  logging.shutdown()
  os._exit(status)


def _failure_status(code) -> int | None:
  """The exit status of a SystemExit's code when it is a failure, else None."""
  if code is None or code == 0:
    return None
  if isinstance(code, int):
    return code & 0xFF or 1
  print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
  return 1


def run(argv: list) -> None:
  if not argv or argv == ["-m"]:
    raise SystemExit("jax_flashoverlap._launch_child: missing the program (script.py or "
                     "-m module)")
  try:
    if argv[0] == "-m":
      sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's path in argv[0]
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
      path = os.path.abspath(argv[0])
      if not os.path.isfile(path):  # as python's own message and status
        print(f"{sys.executable}: can't open file {path!r}: no such file", file=sys.stderr)
        _exit_now(2)
      sys.argv = list(argv)
      sys.path[0] = os.path.dirname(path)  # as `python script.py` (here: the cwd of -m)
      runpy.run_path(path, run_name="__main__")
  except SystemExit as exit_:
    status = _failure_status(exit_.code)
    if status is None:
      raise
    _exit_now(status)
  except KeyboardInterrupt:
    traceback.print_exc()
    _exit_now(130)
  except BaseException:  # noqa: BLE001  (any failure: report it and exit now)
    traceback.print_exc()
    _exit_now(1)


if __name__ == "__main__":
  run(sys.argv[1:])
