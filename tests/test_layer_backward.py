"""jax_flashoverlap.layer_backward used directly (the Flax layers' overlap_backward=True
matmuls): where column_matmul's overlapped dx would be wrong it refuses, and inputs without
rows differentiate as their plain compositions do (values and gradients elsewhere:
tests/test_flax*.py)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from _util import assert_close, make_mesh_1d
from jax_flashoverlap import layer_backward as lb

BF16 = jnp.bfloat16
N = 4


def _grads(fn, in_specs, out_spec, x, w, check_vma=True):
    f = jax.shard_map(fn, mesh=make_mesh_1d(N), in_specs=in_specs, out_specs=out_spec,
                      check_vma=check_vma)
    loss = lambda a, b: jnp.sum(jnp.sin(f(a, b).astype(jnp.float32)))  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)


def test_column_matmul_refuses_check_vma_false():
    """With check_vma=False shard_map sums a replicated x's gradient over the axis itself, so
    the all-reduced dx came out axis-size (here 4) times too large, silently."""
    x, w = jnp.ones((8, 32), BF16), jnp.ones((32, 16 * N), BF16)
    specs = ((P(), P(None, "tp")), P(None, "tp"))
    with pytest.raises(ValueError, match="column_matmul: needs x invariant and w varying over "
                                         "'tp'.*use x @ w"):
        _grads(lambda a, b: lb.column_matmul(a, b, "tp"), *specs, x, w, check_vma=False)


def test_column_matmul_gradients_equal_the_plain_matmuls(rng):
    x = jnp.asarray(rng.standard_normal((8, 32)), BF16)
    w = jnp.asarray(rng.standard_normal((32, 16 * N)), BF16)
    specs = ((P(), P(None, "tp")), P(None, "tp"))
    ours = _grads(lambda a, b: lb.column_matmul(a, b, "tp"), *specs, x, w)
    ref = _grads(lambda a, b: a @ b, *specs, x, w)
    for got, want in zip(ours, ref):
        assert_close(got, want)


def test_a_column_input_without_rows_differentiates_as_the_plain_matmul(rng):
    """The forward (a local matmul) took it; the backward's matmul_all_reduce refused dy ("x
    must not be empty"), also through ColumnParallelLinear(overlap_backward=True). (The other
    two functions' forwards are our ops, which take x without rows since session 40:
    tests/test_empty_rows.py.)"""
    specs = ((P(), P(None, "tp")), P(None, "tp"))
    x = jnp.zeros((0, 32), BF16)
    w = jnp.asarray(rng.standard_normal((32, 16 * N)), BF16)
    got = _grads(lambda a, b: lb.column_matmul(a, b, "tp"), *specs, x, w)
    want = _grads(lambda a, b: a @ b, *specs, x, w)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(r, np.float32))


@pytest.mark.parametrize("axes", [("dp", "tp"), ["dp", "tp"]], ids=["tuple", "list"])
def test_column_matmul_over_two_axes(axes, rng):
    """A tuple of axes (as the ops take) was refused ('x varies over [], w over ['dp',
    'tp']'), a list raised 'unhashable type'."""
    from _util import make_mesh_2d
    mesh = make_mesh_2d(2, 4)
    x = jnp.asarray(rng.standard_normal((8, 32)), BF16)
    w = jnp.asarray(rng.standard_normal((32, 8 * 8)), BF16)
    specs = dict(mesh=mesh, in_specs=(P(), P(None, ("dp", "tp"))), out_specs=P(None, ("dp", "tp")))
    grads = {}
    for name, fn in (("ours", lambda a, b: lb.column_matmul(a, b, axes)), ("ref", jnp.matmul)):
        f = jax.shard_map(fn, **specs)
        loss = lambda a, b: jnp.sum(jnp.sin(f(a, b).astype(jnp.float32)))  # noqa: E731,B023
        grads[name] = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    for got, want in zip(grads["ours"], grads["ref"]):
        assert_close(got, want)


def test_column_matmul_refuses_x_varying_over_the_axis():
    """x sharded over 'tp' (varying) with w sharded on out: dx = psum(dy @ w.T) would sum the
    ranks' different rows' cotangents together. Refused, naming the axes x varies over."""
    x, w = jnp.ones((8 * N, 32), BF16), jnp.ones((32, 16 * N), BF16)
    specs = ((P("tp", None), P(None, "tp")), P("tp", None))
    with pytest.raises(ValueError, match=r"column_matmul: needs x invariant and w varying over "
                                         r"'tp'.*x varies over \['tp'\]"):
        _grads(lambda a, b: lb.column_matmul(a, b, "tp"), *specs, x, w)


def test_a_column_input_without_features_differentiates_as_the_plain_matmul():
    """x [M, 0] (so w [0, N/n]): dy [M, N/n] has rows and columns, but the backward's
    matmul_all_reduce(dy, w) would get an empty w, which it refuses. The gradients' types
    (traced: XLA cannot compile a shard_map whose operands are all empty)."""
    specs = ((P(), P(None, "tp")), P(None, "tp"))
    x, w = jnp.zeros((8, 0), BF16), jnp.zeros((0, 16 * N), BF16)

    def grads(fn):
        f = jax.shard_map(fn, mesh=make_mesh_1d(N), in_specs=specs[0], out_specs=specs[1])
        loss = lambda a, b: jnp.sum(jnp.sin(f(a, b).astype(jnp.float32)))  # noqa: E731
        return jax.eval_shape(jax.grad(loss, argnums=(0, 1)), x, w)

    assert grads(lambda a, b: lb.column_matmul(a, b, "tp")) == grads(jnp.matmul)
