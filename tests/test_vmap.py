"""jax.vmap of each op over a leading batch axis, inside shard_map (check_vma=True).

Three batching modes: x batched and w unbatched (in_axes=(0, None)), w batched and x unbatched
(in_axes=(None, 0): the rule folds w [B, K, N] into [K, B*N]), and both batched (in_axes=(0, 0)).
The reference is jax.vmap of the reference composition (JAX batches psum / psum_scatter itself).
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, check_against_refs, f32, make_mesh_1d, op_fn,
                   rand, rel_fro, shard_map, upcast, REL_FRO_TOL)

B = 3


def _case(name, n, rng, dt, w_batched, x_batched=True):
    """Batched global inputs and specs. Per device: x [B, M, K_local] (or [B, M_local, K]);
    x_batched=False: x without its batch axis."""
    if name == "all_reduce":
        x = rand(rng, (B, 5, 16 * n), dt)
        xs, os_ = P(None, None, "tp"), P()
        w_shape, ws = (16 * n, 24), P("tp", None)
    elif name == "reduce_scatter":
        x = rand(rng, (B, 3 * n, 16 * n), dt)
        xs, os_ = P(None, None, "tp"), P(None, "tp", None)
        w_shape, ws = (16 * n, 32), P("tp", None)
    else:
        x = rand(rng, (B, 5 * n, 24), dt)
        xs, os_ = P(None, "tp", None), P(None, "tp", None)
        w_shape, ws = (24, 16), P()
    if w_batched:
        w = rand(rng, (B,) + w_shape, dt)
        ws = P(None, *ws) if len(ws) else P()
    else:
        w = rand(rng, w_shape, dt)
    if not x_batched:
        x, xs = x[0], P(*xs[1:])  # the output keeps its batch axis (from w): os_ unchanged
    return x, w, xs, ws, os_


def _run(body, mesh, in_axes, specs, x, w):
    xs, ws, os_ = specs
    return jax.jit(shard_map(jax.vmap(body, in_axes=in_axes), mesh, (xs, ws), os_))(x, w)


@pytest.mark.parametrize("x_batched,w_batched", [(True, False), (False, True), (True, True)],
                         ids=["w_unbatched", "x_unbatched", "w_batched"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul"])
def test_vmap(fo, mesh4, name, dtype, x_batched, w_batched, rng):
    x, w, xs, ws, os_ = _case(name, 4, rng, dtype, w_batched, x_batched)
    in_axes = (0 if x_batched else None, 0 if w_batched else None)
    op, ref = op_fn(fo, name)
    got = _run(op, mesh4, in_axes, (xs, ws, os_), x, w)
    want = _run(ref, mesh4, in_axes, (xs, ws, os_), x, w)
    want32 = _run(ref, mesh4, in_axes, (xs, ws, os_), *upcast(x, w))
    check_against_refs(got, want, want32)
    assert got.shape[0] == B
    # global math, per batch element
    glob = np.matmul(f32(x), f32(w))
    assert got.shape == glob.shape
    assert rel_fro(got, glob) < REL_FRO_TOL


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_vmap_mesh_of_2(fo, name, rng):
    mesh = make_mesh_1d(2)
    x, w, xs, ws, os_ = _case(name, 2, rng, jnp.bfloat16, w_batched=False)
    op, ref = op_fn(fo, name)
    got = _run(op, mesh, (0, None), (xs, ws, os_), x, w)
    want = _run(ref, mesh, (0, None), (xs, ws, os_), x, w)
    want32 = _run(ref, mesh, (0, None), (xs, ws, os_), *upcast(x, w))
    check_against_refs(got, want, want32)


def _a2a_ag_fns(fo):
    return {
        "all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, "tp"),
                       lambda x, w: jax.lax.all_to_all(x @ w, "tp", 0, 0, tiled=True)),
        "all_gather": (lambda x, w: fo.all_gather_matmul(x, w, "tp"),
                       lambda x, w: jax.lax.all_gather(x, "tp", axis=0, tiled=True) @ w),
    }


@pytest.mark.parametrize("batched", ["x", "w", "both"])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "matmul", "all_to_all",
                                  "all_gather"])
def test_vmap_over_an_empty_batch(fo, mesh4, name, batched, rng):
    """A batch of size 0 gives the empty result XLA's composition gives (it divided by the
    batch size before)."""
    if name in ("all_to_all", "all_gather"):
        op, ref = _a2a_ag_fns(fo)[name]
        x = rand(rng, (B, 8 * 4, 24), jnp.bfloat16)
        xs, os_ = P(None, "tp", None), P(None, "tp", None)
        w_shape, ws = (24, 16), P()
    else:
        x, w, xs, ws, os_ = _case(name, 4, rng, jnp.bfloat16, w_batched=False)
        w_shape = w.shape
        op, ref = op_fn(fo, name)
    x = x[:0] if batched in ("x", "both") else x[0]
    w = jnp.zeros(((0,) if batched in ("w", "both") else ()) + w_shape, jnp.bfloat16)
    if batched == "x":
        in_axes = (0, None)
    else:
        in_axes = (None, 0) if batched == "w" else (0, 0)
        ws = P(None, *ws) if len(ws) else P()
        if batched == "w":
            xs = P(*xs[1:])
    got = _run(op, mesh4, in_axes, (xs, ws, os_), x, w)
    want = _run(ref, mesh4, in_axes, (xs, ws, os_), x, w)
    assert got.shape == want.shape and got.dtype == want.dtype and got.size == 0, (got.shape,
                                                                                   want.shape)


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "all_to_all", "all_gather"])
def test_pmap_axis_names_are_mesh_axes(fo, name, rng):
    """A pmap axis is a manual mesh axis (unlike a vmap one): the ops take it."""
    n = 4
    x = rand(rng, (n, 16, 32), jnp.bfloat16)
    w = rand(rng, (n, 32, 16), jnp.bfloat16)
    fns = dict(_a2a_ag_fns(fo), **{k: op_fn(fo, k) for k in ("all_reduce", "reduce_scatter")})
    ours, ref = fns[name]
    devices = jax.devices("cpu")[:n]
    got = jax.pmap(ours, axis_name="tp", devices=devices)(x, w)
    want = jax.pmap(ref, axis_name="tp", devices=devices)(x, w)
    assert got.shape == want.shape
    np.testing.assert_array_equal(f32(got), f32(want))


def _batch_axis_moved(a, spec, to):
    """Global `a` batched on its axis 0 (spec P(None, ...)) with that axis moved to `to`."""
    entries = list(tuple(spec) + (None,) * (a.ndim - len(tuple(spec))))
    entries.insert(to, entries.pop(0))
    return jnp.moveaxis(a, 0, to), P(*entries)


@pytest.mark.parametrize("x_axis,w_axis", [(1, None), (None, 2), (2, 1)],
                         ids=["x1", "w2", "x2_w1"])
@pytest.mark.parametrize("name", ["reduce_scatter", "matmul", "all_gather"])  # both rules
def test_vmap_over_an_inner_axis(fo, mesh4, name, x_axis, w_axis, rng):
    """vmap(in_axes=1 or 2): the batching rules get operands batched along an inner axis and
    must move it to the front (the tests above batch axis 0 only, where that move is a no-op)."""
    x_batched, w_batched = x_axis is not None, w_axis is not None
    if name in ("all_to_all", "all_gather"):
        op, ref = _a2a_ag_fns(fo)[name]
        x, xs = rand(rng, (B, 8 * 4, 24), jnp.bfloat16), P(None, "tp", None)
        w, ws = rand(rng, (B, 24, 16), jnp.bfloat16), P(None, None, None)
        os_ = P(None, "tp", None)
        if not x_batched:
            x, xs = x[0], P("tp", None)
        if not w_batched:
            w, ws = w[0], P()
    else:
        x, w, xs, ws, os_ = _case(name, 4, rng, jnp.bfloat16, w_batched, x_batched)
        op, ref = op_fn(fo, name)
    if x_batched:
        x, xs = _batch_axis_moved(x, xs, x_axis)
    if w_batched:
        w, ws = _batch_axis_moved(w, ws, w_axis)
    in_axes = (x_axis, w_axis)
    got = _run(op, mesh4, in_axes, (xs, ws, os_), x, w)
    want = _run(ref, mesh4, in_axes, (xs, ws, os_), x, w)
    assert got.shape[0] == B
    assert_close(got, want)
