"""Gradients through each op equal the gradients of the reference composition, w.r.t. x and w.

Two ways of differentiating a shard_map program are covered:
  * jax.grad of a global scalar loss of a shard_map program (the usual training setup),
  * jax.grad taken *inside* the shard_map body (per-device loss), which exercises the vma typing of
    the op's VJP under check_vma=True.
Loss = sum(out.astype(f32) * ct) with a fixed random cotangent ct, so every output element matters.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, assert_rel_fro, f32, op_fn, rand,
                   shard_map, upcast)


def _setup(name, n, rng, dt, mesh_kind="1d"):
    """Inputs, specs and the global output shape for op `name`."""
    if mesh_kind == "1d":
        if name == "all_reduce":
            x, w = rand(rng, (5, 16 * n), dt), rand(rng, (16 * n, 24), dt)
            specs = (P(None, "tp"), P("tp", None), P())
        elif name == "reduce_scatter":
            x, w = rand(rng, (3 * n, 16 * n), dt), rand(rng, (16 * n, 32), dt)
            specs = (P(None, "tp"), P("tp", None), P("tp", None))
        else:
            x, w = rand(rng, (5 * n, 24), dt), rand(rng, (24, 16), dt)
            specs = (P("tp", None), P(), P("tp", None))
    else:  # (dp=2, tp=4)
        if name == "all_reduce":
            x, w = rand(rng, (2 * 5, 64), dt), rand(rng, (64, 24), dt)
            specs = (P("dp", "tp"), P("tp", None), P("dp", None))
        elif name == "reduce_scatter":
            x, w = rand(rng, (2 * 12, 64), dt), rand(rng, (64, 32), dt)
            specs = (P("dp", "tp"), P("tp", None), P(("dp", "tp"), None))
        else:
            x, w = rand(rng, (2 * 5, 32), dt), rand(rng, (32, 32), dt)
            specs = (P("dp", None), P(None, "tp"), P("dp", "tp"))
    out_shape = (x.shape[0], w.shape[1])
    return x, w, specs, out_shape


def _global_grads(body, mesh, specs, x, w, ct):
    xs, ws, os_ = specs
    f = shard_map(body, mesh, (xs, ws), os_)

    def loss(x, w):
        return jnp.sum(f(x, w).astype(jnp.float32) * ct)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)


def _check_grads(got, want, want32, x, w):
    for g, r, r32, a, label in zip(got, want, want32, (x, w), ("dx", "dw")):
        assert g.shape == a.shape and g.dtype == a.dtype, f"{label}: {g.shape} {g.dtype}"
        assert_close(g, r)
        assert_rel_fro(g, r32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul"])
def test_grad_of_shard_map_program(fo, mesh4, name, dtype, rng):
    x, w, specs, out_shape = _setup(name, 4, rng, dtype)
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))
    op, ref = op_fn(fo, name)
    got = _global_grads(op, mesh4, specs, x, w, ct)
    want = _global_grads(ref, mesh4, specs, x, w, ct)
    want32 = _global_grads(ref, mesh4, specs, *upcast(x, w), ct)
    _check_grads(got, want, want32, x, w)
    # and the math, independent of JAX's collectives: d/dx = ct @ w^T, d/dw = x^T @ ct
    np.testing.assert_allclose(f32(want32[0]), f32(ct) @ f32(w).T, rtol=1e-4, atol=1e-4)
    assert_rel_fro(got[0], f32(ct) @ f32(w).T)
    assert_rel_fro(got[1], f32(x).T @ f32(ct))


@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_grad_other_mesh_sizes(fo, name, n, rng):
    from _util import make_mesh_1d

    mesh = make_mesh_1d(n)
    x, w, specs, out_shape = _setup(name, n, rng, jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))
    op, ref = op_fn(fo, name)
    got = _global_grads(op, mesh, specs, x, w, ct)
    want = _global_grads(ref, mesh, specs, x, w, ct)
    want32 = _global_grads(ref, mesh, specs, *upcast(x, w), ct)
    _check_grads(got, want, want32, x, w)


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul"])
def test_grad_2d_mesh(fo, mesh2d, name, rng):
    x, w, specs, out_shape = _setup(name, 4, rng, jnp.bfloat16, mesh_kind="2d")
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))
    op, ref = op_fn(fo, name)
    got = _global_grads(op, mesh2d, specs, x, w, ct)
    want = _global_grads(ref, mesh2d, specs, x, w, ct)
    want32 = _global_grads(ref, mesh2d, specs, *upcast(x, w), ct)
    _check_grads(got, want, want32, x, w)


@pytest.mark.parametrize("policy", ["default", "nothing_saveable", "dots_saveable"])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul"])
def test_grad_under_remat(fo, mesh4, name, policy, rng):
    """jax.checkpoint around a layer built on our op (how large models are trained): grads equal
    those without remat (exactly) and the reference's under the same remat; a policy that saves
    nothing recomputes our op in the backward (it appears twice in the grad's jaxpr), so its
    communicators run again there."""
    from _util import PRIMITIVE_NAMES
    x, w, specs, out_shape = _setup(name, 4, rng, jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))
    op, ref = op_fn(fo, name)
    pol = None if policy == "default" else getattr(jax.checkpoint_policies, policy)

    def layer(f, remat):
        body = lambda x, w: jnp.tanh(f(x, w))  # noqa: E731  (a nonlinearity: residuals matter)
        return jax.checkpoint(body, policy=pol) if remat else body

    got = _global_grads(layer(op, True), mesh4, specs, x, w, ct)
    for g, r, a in zip(got, _global_grads(layer(ref, True), mesh4, specs, x, w, ct), (x, w)):
        assert g.shape == a.shape and g.dtype == a.dtype
        assert_close(g, r)
    plain = _global_grads(layer(op, False), mesh4, specs, x, w, ct)
    for g, p in zip(got, plain):
        np.testing.assert_array_equal(f32(g), f32(p))
    xs, ws, os_ = specs
    f = shard_map(layer(op, True), mesh4, (xs, ws), os_)
    text = str(jax.make_jaxpr(jax.grad(lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * ct),
                                       argnums=(0, 1)))(x, w))
    calls = text.count(PRIMITIVE_NAMES[name] + "[")
    # nothing_saveable: the forward's call and its recomputation in the backward
    assert calls == 2 if policy == "nothing_saveable" else calls >= 1, text


def _inner_grads(body, mesh, specs, x, w, ct):
    """jax.grad inside the shard_map body; the per-device grads come back with x's and w's specs."""
    xs, ws, os_ = specs

    def per_device(x, w, ct):
        def loss(x, w):
            return jnp.sum(body(x, w).astype(jnp.float32) * ct)

        return jax.grad(loss, argnums=(0, 1))(x, w)

    f = shard_map(per_device, mesh, (xs, ws, os_), (xs, ws))
    return jax.jit(f)(x, w, ct)


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul"])
def test_grad_inside_shard_map_body(fo, mesh4, name, rng):
    x, w, specs, out_shape = _setup(name, 4, rng, jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))
    op, ref = op_fn(fo, name)
    got = _inner_grads(op, mesh4, specs, x, w, ct)
    want = _inner_grads(ref, mesh4, specs, x, w, ct)
    want32 = _inner_grads(ref, mesh4, specs, *upcast(x, w), ct)
    _check_grads(got, want, want32, x, w)


def test_grad_through_scan_of_layers(fo, mesh4, rng):
    """Training-step shape: grad w.r.t. stacked weights of a scanned TP MLP built from our ops."""
    L, M, D, F = 2, 8, 32, 64
    dt = jnp.bfloat16
    h0 = rand(rng, (M, D), dt)
    w1 = rand(rng, (L, D, F), dt, scale=D ** -0.5)
    w2 = rand(rng, (L, F, D), dt, scale=F ** -0.5)
    in_specs = (P(), P(None, None, "tp"), P(None, "tp", None))

    def make(mm, ar):
        def body(h0, w1, w2):
            def layer(h, ws):
                return ar(jnp.tanh(mm(h, ws[0])), ws[1]), None

            return lax.scan(layer, h0, (w1, w2))[0]

        f = shard_map(body, mesh4, in_specs, P())
        return jax.jit(jax.grad(lambda h, a, b: jnp.sum(f(h, a, b).astype(jnp.float32) ** 2),
                                argnums=(0, 1, 2)))

    ours = make(fo.matmul, lambda u, b: fo.matmul_all_reduce(u, b, "tp"))
    ref = make(lambda a, b: a @ b, lambda u, b: lax.psum(u @ b, "tp"))
    got = ours(h0, w1, w2)
    want = ref(h0, w1, w2)
    want32 = ref(*upcast(h0, w1, w2))
    for g, r, r32 in zip(got, want, want32):
        assert g.dtype == dt
        assert_close(g, r)
        assert_rel_fro(g, r32, tol=2e-2)
