"""The examples' and benchmark scripts' --help: every option with a default states it, and the
value stated is the parser's (on CPU and, with jax.default_backend() answering "gpu", on GPUs).
The transformer example's --steps / --seq / --dim ... and most benchmark options printed none,
and a stated default that drifts from the code misleads."""
import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["examples/quickstart.py", "examples/global_view_jit.py",
           "examples/tp_transformer_block.py", "benchmarks/stress.py", "benchmarks/fuzz.py",
           "benchmarks/trace_op.py", "benchmarks/gemm_in_jax.py",
           "benchmarks/compile_variants.py", "benchmarks/epilogue_ab.py"]
# "(default: X)" or "(default: X on GPUs, Y on CPU)", up to a comma, a semicolon or the
# parenthesis.
_STATED = re.compile(r"default: ([^,;)]+?)(?: on GPUs, ([^,;)]+?) on CPU)?[,;)]")


class _Parsed(Exception):
  """Raised in place of parse_args: carries the script's parser out of its main()."""


@pytest.fixture
def isolated(monkeypatch):
  """Loading a script may set environment variables (stress.py: JAX_FLASHOVERLAP_FALLBACK=0
  and _POISON_OUTPUTS=1) and sys.path: put both back for the worker's later tests."""
  saved = dict(os.environ)
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.syspath_prepend(str(ROOT / "examples"))
  yield
  os.environ.clear()
  os.environ.update(saved)


def _parser(path, backend, monkeypatch):
  """The parser the script's main() builds, with the backend it asks about answering `backend`."""
  spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  import jax
  monkeypatch.setattr(jax, "default_backend", lambda: backend)

  def capture(parser, *args, **kwargs):
    raise _Parsed(parser)

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
  with pytest.raises(_Parsed) as parsed:
    module.main()
  return parsed.value.args[0]


def _value(action, stated):
  convert = action.type or str
  if action.nargs in ("+", "*"):
    return [convert(v) for v in stated.split()]
  return convert(stated)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("path", SCRIPTS)
def test_help_states_each_default(path, backend, monkeypatch, isolated):
  if path.endswith("tp_transformer_block.py"):
    pytest.importorskip("flax")
  options = [a for a in _parser(path, backend, monkeypatch)._actions if a.dest != "help"]
  assert len(options) >= 3
  for action in options:
    name = action.option_strings[0]
    if action.const is True or action.default is None:
      continue  # off unless given (--out), or computed (--k's help says how)
    said = _STATED.search(action.help or "")
    assert said, f"{path} {name}: no default in its help {action.help!r}"
    stated = said.group(1) if backend == "gpu" or not said.group(2) else said.group(2)
    if stated == "all" and action.choices:
      assert list(action.default) == list(action.choices), (path, name)
      continue
    try:
      value = _value(action, stated)
    except (ValueError, argparse.ArgumentTypeError):
      # Said in words ("the current time", "2 on an even count of >= 4 devices"), not a
      # mistyped value.
      assert not re.search(r"\d", stated) or len(stated.split()) > 3, (path, name, stated)
      continue
    assert value == action.default, (path, name, stated, action.default)
