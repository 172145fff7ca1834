"""Compiled programs that outlive their process, on the GPU (the device machine; never CI).

* JAX's persistent compilation cache: a second process finds the overlapped all-reduce compiled
  by the first (a hit, no compile), still calls our custom call and computes the op's values.
  It works because the lowering, which still runs on a hit, makes the communicators and is the
  same text in every process (tests/test_compile_cache.py).
* `jax.experimental.serialize_executable`: a loaded executable has none of the lowering's
  communicators, so calling it in a fresh process is a Python exception saying so and what to
  do (the process goes on); after lowering the same function in that process it runs and gives
  the serializing process's result bit for bit.
* `comm.destroy_communicators()` under a compiled program: the call's error says to clear
  JAX's caches before lowering again (a new lowering of the same function is JAX's cached one,
  which makes none), and following it works.

Each step is a fresh process (tests/_cache_child.py) over every local GPU, without
preallocation (this pytest process may hold most of the memory). Inputs are fresh random bf16;
conftest's poison switch reaches the children through the environment.
"""
import json
import os
import subprocess
import sys

import pytest

import _gpu_util as U
from _util import REPO

pytestmark = U.MARKS
CHILD = f"{REPO}/tests/_cache_child.py"
OP = "flashoverlap_gemm_all_reduce"  # the handler names its target


@pytest.fixture(autouse=True)
def _our_kernels_at_every_shape(monkeypatch):
    U.use_our_kernels(monkeypatch)  # the children inherit it


def _child(mode, workdir) -> dict:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, f"{REPO}/tests",
                                                      os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, CHILD, mode, str(workdir)], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_persistent_cache_hit_keeps_our_kernel(tmp_path):
    first = _child("cache", tmp_path)
    second = _child("cache", tmp_path)
    assert (first["misses"], first["hits"]) == (1, 0), first
    assert (second["misses"], second["hits"]) == (0, 1), second
    for run in (first, second):
        assert run["custom_call"], f"no custom call: XLA's path would pass as well ({run})"
        assert run["finite"] and run["rel_err"] < U.TOL, run


def test_serialized_executable_needs_the_lowering_in_its_process(tmp_path):
    made = _child("serialize", tmp_path)
    assert made["custom_call"] and made["rel_err"] < U.TOL, made
    loaded = _child("load", tmp_path)
    error = loaded["error"] or ""
    assert loaded["finite"] is None, f"ran without communicators: {loaded}"
    for part in (OP, "no communicator", "serialize_executable", "lower the same function"):
        assert part in error, f"{part!r} not in {error!r}"
    assert loaded["after"] == 8.0, loaded  # the error left the process usable
    again = _child("lower_load", tmp_path)
    assert again["rel_err"] < U.TOL and again["max_abs_diff"] == 0.0, again


def test_destroyed_communicators_come_back_as_the_error_says(tmp_path):
    r = _child("destroy", tmp_path)
    assert r["before"] < U.TOL, r
    for error in (r["error"], r["error_after_lower"]):
        assert error and "no communicator" in error and "jax.clear_caches()" in error, r
    assert r["after_clear_caches"] < U.TOL, r
