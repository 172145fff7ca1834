"""all_gather_matmul (issue #9) on CPU devices: values, gradients, vmap, errors, CUDA lowering.

Reference: lax.all_gather(x, axis, axis=0, tiled=True) @ w, the sequence-parallel
column-parallel layer: x rows sharded over tp, w columns sharded over tp.
"""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, assert_rel_fro, custom_call_lines,
                   lower_for_cuda, make_mesh_1d, make_mesh_2d,
                   rand, shard_map, upcast)

SPECS = (P("tp", None), P(None, "tp")), P(None, "tp")


def _ref(axis="tp"):
    return lambda x, w: lax.all_gather(x, axis, axis=0, tiled=True) @ w


def _ours(fo, axis="tp", **kw):
    return lambda x, w: fo.all_gather_matmul(x, w, axis, **kw)


def _run(body, mesh, x, w, specs=SPECS):
    return jax.jit(shard_map(body, mesh, *specs))(x, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_values(fo, tp_mesh, dtype, rows, rng):
    n = tp_mesh.shape["tp"]
    x = rand(rng, (n * rows, 24), dtype)
    w = rand(rng, (24, n * 16), dtype, scale=24 ** -0.5)
    got = _run(_ours(fo), tp_mesh, x, w)
    assert got.shape == (n * rows, n * 16)
    assert_close(got, _run(_ref(), tp_mesh, x, w))
    assert_rel_fro(got, _run(_ref(), tp_mesh, *upcast(x, w)))


def test_leading_dims(fo, rng):
    """x [B, S, K]: gathered along B (the first dim), as lax.all_gather(axis=0) does."""
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 2, 3, 16), jnp.bfloat16)
    w = rand(rng, (16, 32), jnp.bfloat16)
    specs = (P("tp", None, None), P(None, "tp")), P(None, None, "tp")
    body = lambda a, b: fo.all_gather_matmul(a, b, "tp")
    ref = lambda a, b: lax.all_gather(a, "tp", axis=0, tiled=True) @ b
    got = jax.jit(shard_map(body, mesh, *specs))(x, w)
    assert got.shape == (8, 3, 32)
    assert_close(got, jax.jit(shard_map(ref, mesh, *specs))(x, w))


def test_2d_mesh_over_tp(fo, rng):
    mesh = make_mesh_2d(2, 4)
    x = rand(rng, (2 * 4 * 5, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)
    specs = (P(("dp", "tp"), None), P(None, "tp")), P("dp", "tp")
    assert_close(_run(_ours(fo), mesh, x, w, specs), _run(_ref(), mesh, x, w, specs))


def test_grads(fo, rng):
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 6, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal((24, 32)), jnp.float32)

    def grads(body):
        f = shard_map(body, mesh, *SPECS)
        return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(x, w)

    for g, r in zip(grads(_ours(fo)), grads(_ref())):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


def test_grad_inside_shard_map(fo, rng):
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 6, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)

    def wrap(op):
        def body(a, b):
            return jax.grad(lambda a, b: jnp.sum(op(a, b).astype(jnp.float32) ** 2),
                            argnums=(0, 1))(a, b)
        return jax.jit(shard_map(body, mesh, SPECS[0], SPECS[0]))

    for g, r in zip(wrap(_ours(fo))(x, w), wrap(_ref())(x, w)):
        assert_close(g, r)


@pytest.mark.parametrize("w_batched", [False, True], ids=["x_batched", "both_batched"])
def test_vmap(fo, w_batched, rng):
    mesh = make_mesh_1d(4)
    B = 3
    x = rand(rng, (B, 4 * 5, 16), jnp.bfloat16)
    w = rand(rng, (B, 16, 32), jnp.bfloat16) if w_batched else rand(rng, (16, 32), jnp.bfloat16)
    in_axes = (0, 0 if w_batched else None)
    specs = (P(None, "tp", None), P(None, None, "tp") if w_batched else P(None, "tp")), P(None, None, "tp")
    run = lambda op: jax.jit(shard_map(jax.vmap(op, in_axes=in_axes), mesh, *specs))(x, w)
    assert_close(run(_ours(fo)), run(_ref()))


# ------------------------------------------------------------------ errors (trace time)

def _trace(fo, x_shape, w_shape, dtype=jnp.bfloat16, axis="tp", **kw):
    f = shard_map(lambda a, b: fo.all_gather_matmul(a, b, axis, **kw), make_mesh_1d(4), *SPECS)
    return jax.jit(f).trace(jax.ShapeDtypeStruct(x_shape, dtype), jax.ShapeDtypeStruct(w_shape, dtype))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(comm_sms=0), ValueError, "comm_sms must be >= 1"),
    (dict(comm_sms=-3), ValueError, "comm_sms"),
    (dict(comm_sms="8"), TypeError, "comm_sms"),
    (dict(dtype=jnp.float32), TypeError, "dtype"),
    (dict(axis="sp"), NameError, "'sp'"),
])
def test_bad_arguments(fo, kw, exc, match):
    with pytest.raises(exc, match=match):
        _trace(fo, (32, 16), (16, 32), **kw)


def test_bad_shapes(fo):
    with pytest.raises(ValueError, match="contracting dims differ"):
        _trace(fo, (32, 16), (24, 32))
    with pytest.raises(ValueError, match="N .* multiple of 8"):
        _trace(fo, (32, 16), (16, 4 * 3))


# ------------------------------------------------------------------ lowering

TARGET = "flashoverlap_all_gather_gemm"


def _cuda_text(fo, n, x_local, w_local, **kw):
    f = shard_map(_ours(fo, **kw), make_mesh_1d(n), *SPECS)
    args = (jax.ShapeDtypeStruct((n * x_local[0], x_local[1]), jnp.bfloat16),
            jax.ShapeDtypeStruct((w_local[0], n * w_local[1]), jnp.bfloat16))
    return lower_for_cuda(f, args)


def _calls(text):
    return custom_call_lines(text, TARGET)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_cuda_lowering_custom_call(fo, no_fallback, n):
    R, K, N = 2048, 8192, 4096  # per device: x [R, K], w [K, N]
    calls = _calls(_cuda_text(fo, n, (R, K), (K, N)))
    assert len(calls) == 1
    call = calls[0]
    for attr in ("comm_id", "world_size", "chunks"):
        assert re.search(rf"\b{attr}\b", call), call
    sms = int(re.search(r"comm_sms = (\d+) : i32", call).group(1))
    assert sms >= 1
    assert f"tensor<{n * R}x{N}xbf16>" in call and f"tensor<{R}x{K}xbf16>" in call, call


def test_cuda_lowering_explicit_comm_sms(fo, no_fallback):
    call = _calls(_cuda_text(fo, 2, (1024, 4096), (4096, 4096), comm_sms=12))[0]
    assert "comm_sms = 12 : i32" in call


def test_forced_chunks(fo, monkeypatch):
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    with plan_a2a.forced(chunks=4, comm_sms=16):
        call = _calls(_cuda_text(fo, 2, (2048, 4096), (4096, 4096)))[0]
    assert "chunks = 4 : i32" in call and "comm_sms = 16 : i32" in call
    with plan_a2a.forced(overlap=False):
        assert not _calls(_cuda_text(fo, 2, (2048, 4096), (4096, 4096)))


def test_forced_collective_gather_uses_its_own_communicators(fo, monkeypatch):
    """The collective gather lowers with chunks 1 onto a collective CTA-policy-ZERO
    communicator: another comm_id than the point-to-point one of the same comm_sms."""
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    ids = {}
    for gather in ("p2p", "collective"):
        with plan_a2a.forced(gather=gather, comm_sms=2, chunks=1):
            call = _calls(_cuda_text(fo, 2, (2048, 4096), (4096, 4096)))[0]
        assert "chunks = 1 : i32" in call and "comm_sms = 2 : i32" in call, call
        ids[gather] = re.search(r"comm_id = (-?\d+)", call).group(1)
    assert ids["p2p"] != ids["collective"], ids


def test_cpu_lowering_is_reference(fo):
    f = shard_map(_ours(fo), make_mesh_1d(4), *SPECS)
    text = jax.jit(f).trace(jax.ShapeDtypeStruct((32, 16), jnp.bfloat16),
                            jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)).lower().as_text()
    assert TARGET not in text and "all_gather" in text


# ------------------------------------------------------------------ plan

@pytest.mark.parametrize("rows,n,k,world", [(2048, 4096, 8192, 2), (4096, 14336, 4096, 2),
                                            (1000, 1024, 256, 4), (512, 8192, 8192, 8)])
def test_plan_is_valid_and_deterministic(rows, n, k, world):
    from jax_flashoverlap import plan_a2a
    p = plan_a2a.choose_all_gather_plan(rows, n, k, world)
    assert p == plan_a2a.choose_all_gather_plan(rows, n, k, world)
    assert rows % p.chunks == 0 and world * p.chunks <= 64
    assert p.comm_sms >= 1 and p.predicted_s > 0 and p.baseline_s > 0


@pytest.mark.parametrize("m,n,k,overlap", [
    (4096, 8192, 8192, False), (8192, 8192, 8192, False),       # lost on 2 x H200: XLA's path
    (16384, 8192, 16384, True), (8192, 8192, 28672, True)])     # won on 2 x H200
def test_plan_overlaps_only_where_measured_to_win(m, n, k, overlap):
    """Global M x N x K of benchmarks/results/a2a_h200x2.json on 2 GPUs (per device rows M/2,
    columns N/2): the default plan overlaps exactly where that run measured a gain."""
    from jax_flashoverlap import plan_a2a
    p = plan_a2a.choose_all_gather_plan(m // 2, n // 2, k, 2)
    assert p.overlap is overlap, p
