"""GPU tests of `transpose_w=True` (w [N, K], the product x @ w.T; the device machine, never CI):
every op through our kernels (the custom call is checked in the compiled program) against XLA's
own x @ w.T composition and a float32 reference; the compiled program holds no relayout of w
(the point of the option). Skipped without a GPU or the extension; the per-op table and the
CPU tests are in test_transpose_w.py.
"""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from _util import shard_map
import _gpu_util as U
from test_transpose_w import OPS, _global, _ours, _ref_t, _specs

pytestmark = U.MARKS


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


# How a compiled program moves w into another layout: a transpose, or (after XLA's layout
# assignment) a copy to a transposed layout, fused or not.
_RELAYOUT = re.compile(r"\b(transpose|copy|fusion)\(")


def _compiled_text(fn, *args):
    return fn.lower(*args).compile().as_text()


def _inputs_nk(M, N, K, seed):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    return U.normal(kx, (M, K)), U.normal(kw, (N, K), K ** -0.5)  # w as stored: [N, K]


@pytest.mark.parametrize("M,N,K,tile", [
    (4096, 8192, 4096, None),   # 128x256 tiles, 2x1 clusters
    (1, 8, 8, None),            # the smallest problem
    (127, 7168, 520, None),     # 128x128 tiles, partial rows and K tile
    (3000, 2056, 1000, "256"),  # wide tiles forced: partial tiles in M, N and K, split tail
    (8192, 4096, 3072, None),   # a column-parallel backward's dx GEMM (q|k|v of an 8B model)
])
def test_matmul(monkeypatch, M, N, K, tile):
    import jax_flashoverlap as fo
    if tile:
        monkeypatch.setenv("FLASHOVERLAP_GEMM_TILE", tile)  # read at every launch
    x, w = _inputs_nk(M, N, K, M + N + K)
    ours = jax.jit(lambda a, b: fo.matmul(a, b, transpose_w=True))
    text = _compiled_text(ours, x, w)
    assert OPS["matmul"][3] in text and re.search(r"transpose_w\s*=\s*1", text), text
    assert not _RELAYOUT.search(text), "w was moved before the custom call:\n" + text
    y = ours(x, w)
    assert y.shape == (M, N) and y.dtype == U.BF16
    assert bool(jnp.all(jnp.isfinite(y)))
    assert U.rel_fro(y, jax.jit(lambda a, b: U.dot32(a, b.T))(x, w)) < U.TOL
    assert U.rel_fro(y, jax.jit(lambda a, b: a @ b.T)(x, w)) < U.TOL
    # The [K, N] kernel on a materialized w.T computes the same tiles in the same order; only
    # the weight's loads differ, so the two agree bit for bit.
    y_kn = jax.jit(lambda a, b: fo.matmul(a, b.T))(x, w)
    assert bool(jnp.all(y == y_kn))


def test_without_the_option_w_is_moved():
    """The control of the relayout check above: `matmul(x, w.T)` compiles a move of w."""
    import jax_flashoverlap as fo
    x, w = _inputs_nk(512, 1024, 768, 3)
    assert _RELAYOUT.search(_compiled_text(jax.jit(lambda a, b: fo.matmul(a, b.T)), x, w))


def _ar_rs(fo, kind):
    """(mesh over every local GPU, in specs, out spec, ours, float32 reference); one GPU: a
    1-rank communicator, the same handler and sequence."""
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    xs, ws, out = OPS[kind][2]  # w [N, K]: sharded on K, the contracted dim
    if kind == "all_reduce":
        ref32 = lambda a, b: lax.psum(U.dot32(a, b.T), "tp")
    else:
        ref32 = lambda a, b: lax.psum_scatter(U.dot32(a, b.T), "tp", scatter_dimension=0,
                                              tiled=True)
    return mesh, (xs, ws), out, _ours(fo, kind, transpose_w=True), ref32


@pytest.mark.parametrize("kind,M,N,K", [
    ("all_reduce", 4096, 8192, 8192),
    ("reduce_scatter", 4096, 8192, 8192),
    ("all_reduce", 1000, 8192, 2048),   # M not a multiple of the tile size
])
def test_all_reduce_reduce_scatter_every_gpu(kind, M, N, K):
    import jax_flashoverlap as fo
    mesh, ins, out, op, ref32 = _ar_rs(fo, kind)
    ours, want = (jax.jit(shard_map(f, mesh, ins, out)) for f in (op, ref32))
    x, w = _inputs_nk(M, N, K, 11 + M)
    U.assert_custom_call(ours, (x, w), "flashoverlap_gemm_" + kind)
    y = ours(x, w)
    assert bool(jnp.all(jnp.isfinite(y)))
    assert U.rel_fro(y, want(x, w)) < U.TOL


def test_grads_of_the_column_backward_form():
    """grad of sum(matmul_all_reduce(x, w [N, K], transpose_w=True) * ct) vs float32's, with
    the forward value returned too: the all-reduce's backward is local dots only, so a plain
    jax.grad program has no custom call at all (XLA drops the unused forward) and would pass
    on XLA's path; with the value kept, the program runs our call and its output is checked."""
    import jax_flashoverlap as fo
    mesh, ins, out, op, ref32 = _ar_rs(fo, "all_reduce")
    M, N, K = 1024, 2048, 1024
    x, w = _inputs_nk(M, N, K, 5)
    ct = U.normal(jax.random.PRNGKey(9), (M, N))

    def grad_fn(f):
        g = shard_map(f, mesh, ins, out)

        def loss(a, b):
            y = g(a, b)
            return jnp.sum(y.astype(jnp.float32) * ct), y
        return jax.jit(jax.grad(loss, (0, 1), has_aux=True))

    ours = grad_fn(op)
    U.assert_custom_call(ours, (x, w), "flashoverlap_gemm_all_reduce")
    (gs, y), (gs_ref, y_ref) = ours(x, w), grad_fn(ref32)(x, w)
    assert bool(jnp.all(jnp.isfinite(y))) and U.rel_fro(y, y_ref) < U.TOL
    for g, r in zip(gs, gs_ref):
        assert g.shape == r.shape
        assert U.rel_fro(g, r) < U.TOL


# per device x [m, k], w [cols, k]: a real shape, and partial tiles in every dim (m a multiple
# of 8 for the row splits, cols / 8 a multiple of 8 for the Ulysses split)
LOCAL = [(4096, 4096, 8192), (1016, 520, 1088)]


@pytest.mark.multigpu
@pytest.mark.skipif(U.N_GPUS < 2, reason=f"needs >= 2 GPUs, have {U.N_GPUS}")
@pytest.mark.parametrize("m,k,cols", LOCAL)
@pytest.mark.parametrize("name", [n for n in OPS if n != "matmul"])
def test_collective_ops(name, m, k, cols):
    import jax_flashoverlap as fo
    from jax.sharding import Mesh
    import numpy as np
    mesh, n = Mesh(np.array(jax.devices()), ("tp",)), U.N_GPUS
    xs, ws, os_ = _specs(name)
    kx, kw = jax.random.split(jax.random.PRNGKey(m + k + cols))
    x = U.normal(kx, _global((m, k), xs, n))
    w = U.normal(kw, _global((cols, k), ws, n), k ** -0.5)
    run = lambda body: jax.jit(shard_map(body, mesh, (xs, ws), os_))  # noqa: E731
    ours = run(_ours(fo, name, transpose_w=True))
    U.assert_custom_call(ours, (x, w), OPS[name][3])
    y = ours(x, w)
    assert bool(jax.numpy.all(jax.numpy.isfinite(y)))
    ref32 = run(lambda a, b: OPS[name][1](a.astype("float32"), b.astype("float32").T))(x, w)
    assert U.rel_fro(y, ref32) < U.TOL
    assert U.rel_fro(y, run(_ref_t(name))(x, w)) < U.TOL


@pytest.mark.multigpu
@pytest.mark.skipif(U.N_GPUS < 2, reason=f"needs >= 2 GPUs, have {U.N_GPUS}")
def test_sequence_parallel_backward_overlap_grads():
    """The sequence-parallel Flax column layer with overlap_backward=True: its dx is
    matmul_reduce_scatter on the kernel read in place; grads against XLA's composition."""
    from flax import nnx
    from jax_flashoverlap.flax import ColumnParallelLinear
    mesh, n = Mesh(np.array(jax.devices()), ("tp",)), U.N_GPUS
    D, F, rows = 2048, 4096, 1024
    layer = ColumnParallelLinear(D, F, sequence_parallel=True, overlap_backward=True,
                                 use_bias=False, dtype=U.BF16, rngs=nnx.Rngs(0))
    gdef, state = nnx.split(layer)
    specs = nnx.get_partition_spec(state)
    x = U.normal(jax.random.PRNGKey(1), (n * rows, D))
    ct = U.normal(jax.random.PRNGKey(2), (n * rows, F))

    def grads(body):
        f = shard_map(body, mesh, (specs, P("tp")), P(None, "tp"))
        return jax.jit(jax.grad(lambda s, a: jnp.sum(f(s, a).astype(jnp.float32) * ct),
                                argnums=(0, 1)))

    ours = grads(lambda s, a: nnx.merge(gdef, s)(a))
    ref = grads(lambda s, a: lax.all_gather(a, "tp", axis=0, tiled=True).astype(jnp.float32)
                @ s["kernel"][...].astype(U.BF16).astype(jnp.float32))
    text = ours.lower(state, x).compile().as_text()
    assert "flashoverlap_gemm_reduce_scatter" in text and "flashoverlap_all_gather_gemm" in text
    (gs, gx), (gs_ref, gx_ref) = ours(state, x), ref(state, x)
    assert U.rel_fro(gx, gx_ref) < U.TOL
    assert U.rel_fro(gs["kernel"].get_value(), gs_ref["kernel"].get_value()) < U.TOL
