"""Values of the per-device ops inside jax.shard_map (check_vma=True) against XLA's reference.

Every case checks three things:
  * the op equals the same computation done with XLA ops in the same dtype
    (psum(x @ w), psum_scatter(x @ w, tiled), x @ w) inside the same shard_map,
  * its relative Frobenius error against the float32-upcast reference is < 1e-2,
  * the global result equals the global numpy product x @ w (the sharding layouts below are chosen so
    that this holds for every op; for reduce_scatter it proves rank r holds rows [r*M/n, (r+1)*M/n)).
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, check_against_refs, f32, op_fn, rand, rel_fro, shard_map,
                   upcast, REL_FRO_TOL)


def _run_case(fo, mesh, name, x, w, x_spec, w_spec, out_spec):
    op, ref = op_fn(fo, name, "tp")
    got = jax.jit(shard_map(op, mesh, (x_spec, w_spec), out_spec))(x, w)
    want = jax.jit(shard_map(ref, mesh, (x_spec, w_spec), out_spec))(x, w)
    want32 = jax.jit(shard_map(ref, mesh, (x_spec, w_spec), out_spec))(*upcast(x, w))
    assert got.dtype == x.dtype
    check_against_refs(got, want, want32)
    # Independent of any JAX collective semantics: the global math.
    glob = np.matmul(f32(x), f32(w))
    assert got.shape == glob.shape
    assert rel_fro(got, glob) < REL_FRO_TOL
    return got


# (name, builder(n, rng, dtype) -> (x, w, x_spec, w_spec, out_spec))
def _ar_2d(n, rng, dt):  # odd M = 5
    return (rand(rng, (5, 16 * n), dt), rand(rng, (16 * n, 24), dt),
            P(None, "tp"), P("tp", None), P())


def _ar_3d(n, rng, dt):  # x [B, S, K]
    return (rand(rng, (2, 3, 16 * n), dt), rand(rng, (16 * n, 24), dt),
            P(None, None, "tp"), P("tp", None), P())


def _rs(n, rng, dt):  # M = 3n: divisible by n, M/n = 3 rows per rank (not a multiple of 8)
    return (rand(rng, (3 * n, 16 * n), dt), rand(rng, (16 * n, 32), dt),
            P(None, "tp"), P("tp", None), P("tp", None))


def _mm(n, rng, dt):  # data-parallel plain GEMM: x rows sharded, w replicated; 5 rows per device
    return (rand(rng, (5 * n, 24), dt), rand(rng, (24, 16), dt),
            P("tp", None), P(), P("tp", None))


CASES_1D = {
    "all_reduce": ("all_reduce", _ar_2d),
    "all_reduce_3d": ("all_reduce", _ar_3d),
    "reduce_scatter": ("reduce_scatter", _rs),
    "matmul": ("matmul", _mm),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", list(CASES_1D))
def test_values_1d_mesh(fo, tp_mesh, case, dtype, rng):
    name, build = CASES_1D[case]
    n = tp_mesh.shape["tp"]
    x, w, xs, ws, os_ = build(n, rng, dtype)
    out = _run_case(fo, tp_mesh, name, x, w, xs, ws, os_)
    if name == "reduce_scatter":
        assert out.shape == (x.shape[0], w.shape[1])  # global view: n blocks of M/n rows
    elif name == "all_reduce":
        assert out.shape == x.shape[:-1] + (w.shape[1],)  # leading dims of x kept


# 2-D (dp=2, tp=4) mesh; the collective runs over 'tp' only, 'dp' is data parallel on M.
def _ar_dp(rng, dt):
    return (rand(rng, (2 * 5, 4 * 16), dt), rand(rng, (64, 24), dt),
            P("dp", "tp"), P("tp", None), P("dp", None))


def _ar_dp_3d(rng, dt):
    return (rand(rng, (2 * 2, 3, 64), dt), rand(rng, (64, 24), dt),
            P("dp", None, "tp"), P("tp", None), P("dp", None, None))


def _rs_dp(rng, dt):  # per dp shard M = 12 rows, 3 per tp rank
    return (rand(rng, (2 * 12, 64), dt), rand(rng, (64, 32), dt),
            P("dp", "tp"), P("tp", None), P(("dp", "tp"), None))


def _mm_dp(rng, dt):  # column-parallel plain GEMM: x rows over dp, w columns over tp
    return (rand(rng, (2 * 5, 32), dt), rand(rng, (32, 4 * 8), dt),
            P("dp", None), P(None, "tp"), P("dp", "tp"))


CASES_2D = {
    "all_reduce": ("all_reduce", _ar_dp),
    "all_reduce_3d": ("all_reduce", _ar_dp_3d),
    "reduce_scatter": ("reduce_scatter", _rs_dp),
    "matmul": ("matmul", _mm_dp),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", list(CASES_2D))
def test_values_2d_mesh(fo, mesh2d, case, dtype, rng):
    name, build = CASES_2D[case]
    x, w, xs, ws, os_ = build(rng, dtype)
    _run_case(fo, mesh2d, name, x, w, xs, ws, os_)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matmul_outside_shard_map(fo, dtype, rng):
    x, w = rand(rng, (5, 24), dtype), rand(rng, (24, 16), dtype)
    eager = fo.matmul(x, w)
    jitted = jax.jit(fo.matmul)(x, w)
    want = jax.jit(lambda a, b: a @ b)(x, w)
    want32 = np.matmul(f32(x), f32(w))
    for got in (eager, jitted):
        assert got.shape == (5, 16) and got.dtype == dtype
        check_against_refs(got, want, want32)


# ----------------------------------------------------------------------------- jit + scan

def _mlp_all_reduce(mm, ar):
    """Megatron MLP stack: column-parallel GEMM, tanh, row-parallel GEMM + all-reduce; scan over layers."""

    def body(h0, w1, w2):
        def layer(h, ws):
            a, b = ws
            u = jnp.tanh(mm(h, a))  # [M, F/n], varies over tp
            return ar(u, b), None   # [M, D], invariant over tp

        h, _ = lax.scan(layer, h0, (w1, w2))
        return h

    return body


def _mlp_reduce_scatter(mm, rs):
    """Sequence-parallel stack: all_gather rows, column-parallel GEMM, row-parallel GEMM + reduce-scatter."""

    def body(h0, w1, w2):
        def layer(h, ws):
            a, b = ws
            hg = lax.all_gather(h, "tp", axis=0, tiled=True)  # [M, D]
            u = jnp.tanh(mm(hg, a))
            return rs(u, b), None  # [M/n, D]

        h, _ = lax.scan(layer, h0, (w1, w2))
        return h

    return body


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_jit_scan_over_layers(fo, mesh4, kind, rng):
    L, M, D, F = 3, 8, 32, 64
    dt = jnp.bfloat16
    h0 = rand(rng, (M, D), dt)
    w1 = rand(rng, (L, D, F), dt, scale=D ** -0.5)
    w2 = rand(rng, (L, F, D), dt, scale=F ** -0.5)
    w_specs = (P(None, None, "tp"), P(None, "tp", None))
    if kind == "all_reduce":
        ours = _mlp_all_reduce(fo.matmul, lambda u, b: fo.matmul_all_reduce(u, b, "tp"))
        ref = _mlp_all_reduce(lambda a, b: a @ b, lambda u, b: lax.psum(u @ b, "tp"))
        h_spec = P()
    else:
        ours = _mlp_reduce_scatter(fo.matmul, lambda u, b: fo.matmul_reduce_scatter(u, b, "tp"))
        ref = _mlp_reduce_scatter(
            lambda a, b: a @ b,
            lambda u, b: lax.psum_scatter(u @ b, "tp", scatter_dimension=0, tiled=True))
        h_spec = P("tp", None)
    in_specs = (h_spec,) + w_specs
    got = jax.jit(shard_map(ours, mesh4, in_specs, h_spec))(h0, w1, w2)
    want = jax.jit(shard_map(ref, mesh4, in_specs, h_spec))(h0, w1, w2)
    want32 = jax.jit(shard_map(ref, mesh4, in_specs, h_spec))(*upcast(h0, w1, w2))
    assert got.shape == (M, D) and got.dtype == dt
    check_against_refs(got, want, want32)


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("shape,dim", [((3, None, 64), 1), ((3, None, 64), -1),
                                       ((2, 3, None, 64), 2), ((None, 3, 64), 0)],
                         ids=["dim1", "dim-1", "dim2_of_4d", "dim0"])
def test_reduce_scatter_sequence_dim(fo, tp_mesh, rng, shape, dim, transpose_w):
    """matmul_reduce_scatter(..., sequence_dim=d) == psum_scatter(x @ w, scatter_dimension=d,
    tiled=True): x [B, S, K] scatters S; the global product is x @ w."""
    n = tp_mesh.shape["tp"]
    d = dim % (len(shape) - 1)
    shape = tuple(2 * n if size is None else size for size in shape)  # S: 2 rows per rank
    x = rand(rng, shape, jnp.bfloat16)
    w = rand(rng, (32, 64) if transpose_w else (64, 32), jnp.bfloat16, scale=0.125)
    x_spec = P(*(None,) * (len(shape) - 1), "tp")
    w_spec = P(None, "tp") if transpose_w else P("tp", None)
    out_spec = P(*(None,) * d, "tp")

    def ours(a, b):
        return fo.matmul_reduce_scatter(a, b, "tp", sequence_dim=dim, transpose_w=transpose_w)

    def ref(a, b):
        return lax.psum_scatter(a @ (b.T if transpose_w else b), "tp", scatter_dimension=d,
                                tiled=True)

    got = jax.jit(shard_map(ours, tp_mesh, (x_spec, w_spec), out_spec))(x, w)
    want = jax.jit(shard_map(ref, tp_mesh, (x_spec, w_spec), out_spec))(x, w)
    want32 = jax.jit(shard_map(ref, tp_mesh, (x_spec, w_spec), out_spec))(*upcast(x, w))
    check_against_refs(got, want, want32)
    glob = np.matmul(f32(x), f32(w).T if transpose_w else f32(w))
    assert got.shape == glob.shape and rel_fro(got, glob) < REL_FRO_TOL


@pytest.mark.parametrize("name", ["all_reduce", "all_gather"])
def test_a_list_of_axes_is_their_tuple(fo, mesh2d, name, rng):
    """axis_name=['dp', 'tp'] (a list, as JAX's collectives take) reduces / gathers over both
    axes, as the tuple does: the ops' static parameters must be hashable."""
    axes = ("dp", "tp")
    ops = {
        "all_reduce": (lambda a, b, ax: fo.matmul_all_reduce(a, b, ax),
                       lambda a, b: lax.psum(a @ b, axes), (P(None, axes), P(axes, None), P())),
        "all_gather": (lambda a, b, ax: fo.all_gather_matmul(a, b, ax),
                       lambda a, b: lax.all_gather(a, axes, tiled=True) @ b,
                       (P(axes, None), P(None, axes), P(None, axes))),
    }
    ours, ref, (xs, ws, os_) = ops[name]
    x, w = rand(rng, (8 * 8, 16 * 8), jnp.bfloat16), rand(rng, (16 * 8, 8 * 8), jnp.bfloat16)
    run = lambda body, *args: jax.jit(shard_map(body, mesh2d, (xs, ws), os_))(*args)  # noqa: E731
    got = run(lambda a, b: ours(a, b, list(axes)), x, w)
    check_against_refs(got, run(ref, x, w), run(ref, *upcast(x, w)))
