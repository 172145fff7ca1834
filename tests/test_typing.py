"""The public API's hints, which jax_flashoverlap/py.typed hands to users' type checkers (CI
has no mypy: these are the cheap checks). Every parameter and return of what README documents
is annotated (an unannotated one is Any to mypy, and pyright guesses it from the body: a
union with tuples for the ops and the Flax layers), and each annotation resolves (under
`from __future__ import annotations` a misspelt or unimported name fails only there)."""
import inspect
import typing

import pytest

import jax
import jax_flashoverlap as fo
from jax_flashoverlap import plan, plan_a2a, trace


def _check_annotated(fn, name):
  sig = inspect.signature(fn)
  bare = [p for p in sig.parameters if p != "self"
          and sig.parameters[p].annotation is inspect.Parameter.empty]
  assert not bare, f"{name}: parameters without a hint: {bare}"
  assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return hint"
  return typing.get_type_hints(fn)  # raises on a hint naming nothing


PUBLIC_FUNCTIONS = [n for n in fo.__all__ if inspect.isfunction(getattr(fo, n))]


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_every_public_function_is_annotated(name):
  _check_annotated(getattr(fo, name), name)


def test_the_public_list_is_what_the_readme_documents():
  """So that the test above covers the ops and the global views, not an empty list."""
  assert {"matmul", "matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_to_all",
          "all_gather_matmul", "row_parallel_matmul", "column_parallel_matmul", "info",
          "ops_as_dots"} <= set(PUBLIC_FUNCTIONS)


@pytest.mark.parametrize("fn", [plan.forced, plan_a2a.forced, trace.recording],
                         ids=["plan.forced", "plan_a2a.forced", "trace.recording"])
def test_the_forcing_and_tracing_contexts_are_annotated(fn):
  _check_annotated(fn, fn.__qualname__)


def test_all_gather_matmul_result_follows_return_gathered():
  """One overload per value of return_gathered: the pair for True, the array for False."""
  returns = {typing.get_type_hints(o)["return"]: typing.get_type_hints(o)["return_gathered"]
             for o in typing.get_overloads(fo.all_gather_matmul)}
  assert returns[jax.Array] == typing.Literal[False]
  assert returns[tuple[jax.Array, jax.Array]] == typing.Literal[True]


def test_the_flax_layers_calls_are_annotated():
  pytest.importorskip("flax")
  from jax_flashoverlap import flax as fo_flax
  for name in ("RowParallelLinear", "ColumnParallelLinear", "RowParallelDense",
               "ColumnParallelDense"):
    hints = _check_annotated(getattr(fo_flax, name).__call__, f"{name}.__call__")
    assert hints["return"] is jax.Array, name
