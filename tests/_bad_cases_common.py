"""Shared expectations and helpers of the bad-input table (tests/test_bad_inputs.py)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flashoverlap as fo
from jax_flashoverlap import _compat, _ext, distributed, plan as plan_lib, tuning

from _util import assert_close, make_mesh_1d, make_mesh_2d, shard_map

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16, F16 = jnp.bfloat16, jnp.float16
H200 = "NVIDIA H200"
JaxRuntimeError = jax.errors.JaxRuntimeError


# ----------------------------------------------------------------------------- expectations

@dataclasses.dataclass(frozen=True)
class Raises:
    type: type | tuple
    match: tuple


@dataclasses.dataclass(frozen=True)
class Warns:
    category: type
    match: tuple


@dataclasses.dataclass(frozen=True)
class Exits:
    code: int
    match: tuple
    max_s: float


SAME = "same values as XLA"


def raises(exc, *match):
    return Raises(exc, match)


def warns(category, *match):
    return Warns(category, match)


def exits(code, *match, max_s=60.0):
    return Exits(code, match, max_s)


# ----------------------------------------------------------------------------- helpers

def sds(shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def rand(shape, dtype=BF16, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return jnp.asarray(a, dtype)


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def trace_op(op, x, w, *, n=4, axis="tp", x_spec=P(None, "tp"), w_spec=P("tp", None), **kw):
    """Traces (only) a shard_map over a 1-D 'tp' mesh of n CPU devices calling op `op`."""
    mesh = make_mesh_1d(n)
    if op == "all_reduce":
        body, out = (lambda a, b: fo.matmul_all_reduce(a, b, axis, **kw)), P()
    elif op == "reduce_scatter":
        body, out = (lambda a, b: fo.matmul_reduce_scatter(a, b, axis, **kw)), P("tp")
    else:  # matmul: data parallel, rows of x over tp, w replicated
        body, out = (lambda a, b: fo.matmul(a, b, **kw)), P("tp")
        x_spec, w_spec = P("tp"), P()
    return jax.make_jaxpr(shard_map(body, mesh, (x_spec, w_spec), out))(x, w)


def cuda_lowering_text(op="all_reduce", x=(16, 64), w=(64, 32), **kw):
    """StableHLO of a fresh (uncached) shard_map program cross-lowered for CUDA on CPU (x, w:
    global shapes; kw: the op's keywords)."""
    mesh = make_mesh_1d(4)
    if op == "all_reduce":
        body = lambda a, b: fo.matmul_all_reduce(a, b, "tp", **kw)  # noqa: E731
    else:
        body = lambda a, b: fo.matmul_reduce_scatter(a, b, "tp", **kw)  # noqa: E731
    f = shard_map(body, mesh, (P(None, "tp"), P("tp", None)), P() if op == "all_reduce" else P("tp"))
    lowered = jax.jit(f).trace(sds(x), sds(w)).lower(lowering_platforms=("cuda",))
    return lowered.as_text()


def row_parallel(x, w, **kw):
    return jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, **kw))(x, w)


def rp_inputs(mesh, x_shape=(16, 64), w_shape=(64, 32), x_spec=P(None, "tp"),
              w_spec=P("tp", None)):
    return put(rand(x_shape), mesh, x_spec), put(rand(w_shape, seed=1), mesh, w_spec)


def cli_env():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)  # the conftest's 8 devices are not needed in a CLI
    return env


def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def assert_dead(pid):
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

