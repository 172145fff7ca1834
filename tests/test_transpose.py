"""Transposing the per-device ops: jax.linear_transpose in x (w fixed) and in w (x fixed)
equals the transpose of the reference composition (psum(x @ w), psum_scatter, all_to_all,
all_gather @ w). JAX transposes instead of differentiating in jax.linear_transpose and in
custom_linear_solve, so before the primitives had a transpose rule both raised
"Transpose rule ... not implemented" (e.g. jax.grad through jax.scipy.sparse.linalg.cg with
our op in the matvec), while jax.grad itself worked (ops.py's custom_jvp)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_flashoverlap as fo
from _util import assert_close, make_mesh_1d, rand

N = 4  # devices on the axis
BF16 = jnp.bfloat16

# op -> (ours, reference, x shape, w shape, in specs, out spec); per-device functions
CASES = {
    "matmul": (lambda a, b: fo.matmul(a, b), lambda a, b: a @ b,
               (8 * N, 32), (32, 16), (P("tp", None), P()), P("tp", None)),
    "all_reduce": (lambda a, b: fo.matmul_all_reduce(a, b, "tp"),
                   lambda a, b: lax.psum(a @ b, "tp"),
                   (5, 16 * N), (16 * N, 24), (P(None, "tp"), P("tp", None)), P()),
    "reduce_scatter": (lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"),
                       lambda a, b: lax.psum_scatter(a @ b, "tp", scatter_dimension=0,
                                                     tiled=True),
                       (4 * N, 16 * N), (16 * N, 32), (P(None, "tp"), P("tp", None)),
                       P("tp", None)),
    "all_to_all": (lambda a, b: fo.matmul_all_to_all(a, b, "tp"),
                   lambda a, b: lax.all_to_all(a @ b, "tp", 0, 0, tiled=True),
                   (4 * N * N, 24), (24, 16), (P("tp", None), P()), P("tp", None)),
    "all_to_all_ulysses": (lambda a, b: fo.matmul_all_to_all(a, b, "tp", split_axis=1,
                                                              concat_axis=0),
                           lambda a, b: lax.all_to_all(a @ b, "tp", 1, 0, tiled=True),
                           (4 * N, 24), (24, 8 * N), (P("tp", None), P()), P("tp", None)),
    "all_gather": (lambda a, b: fo.all_gather_matmul(a, b, "tp"),
                   lambda a, b: lax.all_gather(a, "tp", tiled=True) @ b,
                   (3 * N, 24), (24, 8 * N), (P("tp", None), P(None, "tp")), P(None, "tp")),
    "all_gather_gathered": (lambda a, b: fo.all_gather_matmul(a, b, "tp", return_gathered=True),
                            lambda a, b: (lax.all_gather(a, "tp", tiled=True) @ b,
                                          lax.all_gather(a, "tp", tiled=True)),
                            (3 * N, 24), (24, 8 * N), (P("tp", None), P(None, "tp")),
                            (P(None, "tp"), P("tp", None))),  # each device's copy, stacked
}


def _global(mesh, fn, in_specs, out_spec, check_vma):
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                         check_vma=check_vma)


@pytest.mark.parametrize("check_vma", [True, False], ids=["vma", "no_vma"])
@pytest.mark.parametrize("wrt", ["x", "w"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_linear_transpose_equals_the_references(op, wrt, check_vma, rng):
    ours, ref, x_shape, w_shape, in_specs, out_spec = CASES[op]
    mesh = make_mesh_1d(N)
    x, w = rand(rng, x_shape, BF16), rand(rng, w_shape, BF16)
    results = {}
    for name, fn in (("ours", ours), ("ref", ref)):
        g = _global(mesh, fn, in_specs, out_spec, check_vma)
        out = jax.eval_shape(g, x, w)
        cts = jax.tree.map(lambda s: rand(np.random.default_rng(7), s.shape, s.dtype), out)
        if wrt == "x":
            transposed = jax.linear_transpose(lambda a: g(a, w), x)
        else:
            transposed = jax.linear_transpose(lambda b: g(x, b), w)
        (results[name],) = jax.jit(transposed)(cts)
    assert results["ours"].shape == (x if wrt == "x" else w).shape
    assert results["ours"].dtype == BF16
    assert_close(results["ours"], results["ref"])


def test_transposing_in_x_and_w_at_once_is_refused_naming_the_op():
    mesh = make_mesh_1d(N)
    ours, _, x_shape, w_shape, in_specs, out_spec = CASES["all_reduce"]
    g = _global(mesh, ours, in_specs, out_spec, True)
    x = jnp.ones(x_shape, BF16)
    w = jnp.ones(w_shape, BF16)
    with pytest.raises(NotImplementedError, match="flashoverlap_gemm_all_reduce is linear in x "
                                                  "and in w separately"):
        jax.linear_transpose(g, x, w)(jnp.ones((5, 24), BF16))


def test_gradient_through_a_linear_solve_with_our_matvec(rng):
    """custom_linear_solve transposes the matvec for the gradient in b."""
    from jax.scipy.sparse.linalg import bicgstab, cg
    k = 16
    a0 = rng.standard_normal((k, k)).astype(np.float32)
    a = jnp.asarray(a0 @ a0.T / k + 2 * np.eye(k, dtype=np.float32), jnp.float16)  # SPD
    b = rand(rng, (8, k), jnp.float16)
    for solver in (cg, bicgstab):
        grads = {}
        for name, matvec in (("ours", lambda v: fo.matmul(v, a)), ("ref", lambda v: v @ a)):
            loss = lambda bb: solver(matvec, bb, maxiter=5)[0].astype(jnp.float32).sum()  # noqa: B023
            grads[name] = jax.jit(jax.grad(loss))(b)
        assert np.all(np.isfinite(np.asarray(grads["ours"], np.float32)))
        assert_close(grads["ours"], grads["ref"])


@pytest.mark.parametrize("keep", [0, 1], ids=["product", "gathered"])
def test_linear_transpose_of_one_output_of_the_gathered_all_gather(keep, rng):
    """With return_gathered=True the op has two outputs; a function that keeps one of them
    gives the other a symbolic zero cotangent, which the transpose rule makes an array."""
    ours, ref, x_shape, w_shape, in_specs, out_spec = CASES["all_gather_gathered"]
    mesh = make_mesh_1d(N)
    x, w = rand(rng, x_shape, BF16), rand(rng, w_shape, BF16)
    results = {}
    for name, fn in (("ours", ours), ("ref", ref)):
        g = _global(mesh, fn, in_specs, out_spec, True)
        out = jax.eval_shape(lambda a: g(a, w)[keep], x)
        ct = rand(np.random.default_rng(7), out.shape, out.dtype)
        (results[name],) = jax.jit(jax.linear_transpose(lambda a: g(a, w)[keep], x))(ct)
    assert results["ours"].shape == x.shape and results["ours"].dtype == BF16
    assert_close(results["ours"], results["ref"])
