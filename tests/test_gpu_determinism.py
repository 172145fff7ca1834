"""Run-to-run determinism on the GPU (the device machine; never CI): the same inputs give the
same bits on every call, as XLA's dot + collective do for a fixed program. Users who need
reproducible training (bitwise-equal reruns, XLA's `--xla_gpu_deterministic_ops`) rely on it.

What could break it in our kernels: the signaling GEMM's tile queue (which cluster computes
which tile depends on timing) and its split tail (the last waves cut along K, one CTA storing
its partial sums and another adding them: timing decides which finishes first), the groups'
NCCL calls on the comm stream, and stale workspace between calls. The shapes are ones where
the split tail and the queue are in use (per GPU 4096 x 8192 x 4096, 8 SMs left to NCCL:
README, "split tail"). Each op is called back to back without a host sync in between, with
poisoned outputs (conftest), and every result must equal the first bit for bit.
"""
import contextlib

import numpy as np
import pytest

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import _gpu_util as U
from _util import shard_map

pytestmark = U.MARKS
CALLS = 12
M, N, K_LOCAL = 4096, 8192, 4096


@pytest.fixture(autouse=True)
def _our_kernels_at_every_shape(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _program(kind, mesh):
    import jax_flashoverlap as fo
    rows, cols, whole = P("tp", None), P(None, "tp"), P()
    programs = {  # kind: (per-device body, in_specs, out_specs, target)
        "matmul": (lambda a, b: fo.matmul(a, b, comm_sms=8), (rows, whole), rows,
                   "flashoverlap_gemm"),
        "all_reduce": (lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=8), (cols, rows),
                       whole, "flashoverlap_gemm_all_reduce"),
        "reduce_scatter": (lambda a, b: fo.matmul_reduce_scatter(a, b, "tp", comm_sms=8),
                           (cols, rows), rows, "flashoverlap_gemm_reduce_scatter"),
        "all_gather": (lambda a, b: fo.all_gather_matmul(a, b, "tp"), (rows, cols), cols,
                       "flashoverlap_all_gather_gemm"),
    }
    body, ins, out, target = programs[kind]
    return jax.jit(shard_map(body, mesh, ins, out)), ins, target


KINDS = ["matmul", "all_reduce", "reduce_scatter", "all_gather"]


def _one_rank_all_gather(kind, world):
    """On one GPU the all-gather's plan is XLA's dot (nothing to gather): forced through a
    1-rank communicator there, as tests/test_gpu_gathered.py does (read at lowering)."""
    from jax_flashoverlap import plan_a2a
    if kind == "all_gather" and world == 1:
        return plan_a2a.forced(comm_sms=8)
    return contextlib.nullcontext()


@pytest.mark.parametrize("kind", KINDS)
def test_same_inputs_give_the_same_bits_every_call(kind):
    devices = np.array(jax.devices())
    mesh, world = Mesh(devices, ("tp",)), devices.size
    f, specs, target = _program(kind, mesh)
    shapes = {"matmul": ((M * world, K_LOCAL), (K_LOCAL, N)),
              "all_gather": ((M, K_LOCAL), (K_LOCAL, N * world))}.get(
                  kind, ((M, K_LOCAL * world), (K_LOCAL * world, N)))
    kx, kw = jax.random.split(jax.random.PRNGKey(42 + KINDS.index(kind)))
    x = jax.device_put(U.normal(kx, shapes[0]), NamedSharding(mesh, specs[0]))
    w = jax.device_put(U.normal(kw, shapes[1], shapes[1][0] ** -0.5),
                       NamedSharding(mesh, specs[1]))
    with _one_rank_all_gather(kind, world):
        U.assert_custom_call(f, (x, w), target)
        results = [f(x, w) for _ in range(CALLS)]  # queued back to back
    first = np.asarray(results[0].astype(np.float32))
    assert np.all(np.isfinite(first))
    assert U.rel_fro(first, U.dot32(x, w)) < U.TOL
    differing = [i for i, y in enumerate(results[1:], 1)
                 if not np.array_equal(np.asarray(y.astype(np.float32)), first)]
    assert differing == [], f"calls {differing} of {CALLS} differ from the first in some bits"
