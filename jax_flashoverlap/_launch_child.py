"""One process of `python -m jax_flashoverlap.launch`: runs the program (a script, a folder or
zip with a `__main__.py`, or `-m module`) in a real `__main__` module, as `python script.py` /
`python -m module` would.

Started by file path, not as part of the package: nothing but the standard library is imported
before the program runs (JAX reads its `JAX_*` variables when it is imported, which the
program may set first).

The one difference: a program that fails (an uncaught exception, or `sys.exit` with a failing
status) while `jax.distributed` is running exits at once with that status, its traceback
printed (through `sys.excepthook`) and every open file flushed, without the exit handlers:
JAX's handler would wait in a shutdown barrier for every other process (up to its shutdown
timeout, 300 s), and the launcher, which stops the others only once one has exited, would wait
with it. Without `jax.distributed`, and for a program that ends well, everything is Python's
own.
"""

import os
import sys

# Python put this file's folder (the package's) first on sys.path, where its modules would
# shadow the standard library's and the program's (trace.py, flax.py): the program's own
# entry goes there instead, before anything else is imported.
_SAFE_PATH = bool(getattr(sys.flags, "safe_path", False))  # -P / PYTHONSAFEPATH: none added
if not _SAFE_PATH:
  del sys.path[0]

import gc  # noqa: E402
import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402
import io  # noqa: E402
import signal  # noqa: E402
import types  # noqa: E402


def _jax_distributed_running() -> bool:
  jax = sys.modules.get("jax")
  try:
    return bool(jax is not None and jax.distributed.is_initialized())
  except Exception:  # noqa: BLE001  (a JAX without it, or half torn down: not running)
    return False


def _flush_everything() -> None:
  """What a normal exit would write: every open writable file object, the std streams,
  logging's handlers."""
  for obj in gc.get_objects():
    try:
      if isinstance(obj, io.IOBase) and not obj.closed and obj.writable():
        obj.flush()
    except Exception:  # noqa: BLE001  (a broken file: nothing left to save)
      pass
  if "logging" in sys.modules:
    sys.modules["logging"].shutdown()


def _exit_now(status: int) -> None:
  _flush_everything()
  os._exit(status)


def _status_of(code) -> int:
  """The exit status Python gives `sys.exit(code)`."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  print(code, file=sys.stderr)
  return 1


def _main_module(path: str, spec=None) -> types.ModuleType:
  """A fresh `__main__`, kept in sys.modules (as Python's: pickling a class the program
  defines, or its files' flush at exit, depend on it)."""
  main = types.ModuleType("__main__")
  main.__file__ = path
  main.__builtins__ = __builtins__
  main.__spec__ = spec
  main.__loader__ = spec.loader if spec is not None else None
  main.__package__ = spec.parent if spec is not None else None
  sys.modules["__main__"] = main
  return main


def _code_of_module(name: str):
  """(spec, code) of `-m name` (a package: its `__main__`)."""
  spec = importlib.util.find_spec(name)
  if spec is None:
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
  if spec.submodule_search_locations is not None:
    name = name + ".__main__"
    spec = importlib.util.find_spec(name)
    if spec is None:
      raise ImportError(f"No module named {name!r}; {name[:-9]!r} is a package and cannot "
                        "be directly executed")
  return spec, spec.loader.get_code(name)


def _prepare(argv: list):
  """(the program's code, its __main__ module), sys.argv and sys.path set as Python sets them."""
  if argv[0] == "-m":
    if not _SAFE_PATH:
      sys.path.insert(0, os.getcwd())
    spec, code = _code_of_module(argv[1])
    sys.argv = [spec.origin, *argv[2:]]
    return code, _main_module(spec.origin, spec)
  path = argv[0]
  sys.argv = list(argv)
  if os.path.isdir(path) or (os.path.isfile(path) and _is_zip(path)):
    sys.path.insert(0, path)  # a folder or zip app: its __main__.py
    spec = importlib.machinery.PathFinder.find_spec("__main__", [path])
    if spec is None:
      _cannot_run(f"can't find '__main__' module in {path!r}")
    return spec.loader.get_code("__main__"), _main_module(spec.origin, spec)
  if not _SAFE_PATH:
    sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
  try:
    with open(path, "rb") as f:
      source = f.read()
  except OSError as err:
    _cannot_run(f"can't open file {os.path.abspath(path)!r}: [Errno {err.errno}] "
                f"{err.strerror}")
  return compile(source, path, "exec", dont_inherit=True), _main_module(path)


def _is_zip(path: str) -> bool:
  import zipfile
  return zipfile.is_zipfile(path)


def _cannot_run(message: str, status: int = 2) -> None:
  """Python's own way of refusing a program it cannot start."""
  print(f"{sys.executable}: {message}", file=sys.stderr)
  sys.exit(status)


def _note_returned() -> None:
  """Tells the launcher (a file in its JAX_FLASHOVERLAP_LAUNCH_NOTES folder) that the program
  ended well while jax.distributed runs: the process now waits in JAX's shutdown barrier for
  the others, and if they wait for it in a collective, the launcher names it."""
  folder, me = (os.environ.get(f"JAX_FLASHOVERLAP_{v}") for v in ("LAUNCH_NOTES", "PROCESS_ID"))
  if folder and me and _jax_distributed_running():
    try:
      open(os.path.join(folder, f"process{me}.returned"), "w").close()
    except OSError:  # no note: only the launcher's message is the poorer
      pass


def run(argv: list) -> None:
  if not argv or argv == ["-m"]:
    _cannot_run("jax_flashoverlap._launch_child: missing the program (script.py or -m module)")
  try:
    code, main = _prepare(argv)
  except ImportError as err:  # -m of a module that is not there: Python's message, status 1
    _cannot_run(f"Error while finding module specification for {argv[1]!r} ({err})", 1)
  try:
    exec(code, main.__dict__)
    _note_returned()
  except SystemExit as exit_:
    status = _status_of(exit_.code) if _jax_distributed_running() else None
    if status:  # a failure while jax.distributed runs: now, not after JAX's barrier
      _exit_now(status)
    _note_returned()
    raise
  except KeyboardInterrupt:
    if not _jax_distributed_running():
      raise
    sys.excepthook(*_without_this_frame(sys.exc_info()))
    _flush_everything()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # die by SIGINT, as Python does
    os.kill(os.getpid(), signal.SIGINT)
  except BaseException:  # noqa: BLE001  (any other failure: reported as Python reports it)
    sys.excepthook(*_without_this_frame(sys.exc_info()))
    if _jax_distributed_running():
      _exit_now(1)
    sys.exit(1)


def _without_this_frame(info):
  """The exception as Python would report it: from the program's frames, not run()'s."""
  kind, value, tb = info
  if tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
    value = value.with_traceback(tb)  # the default hook reads the exception's own
  return kind, value, tb


if __name__ == "__main__":
  run(sys.argv[1:])
