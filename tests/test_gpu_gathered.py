"""GPU tests of `all_gather_matmul(..., return_gathered=True)` and the Flax row layer's
overlapped backward built on it (the device machine, never CI).

Over every local GPU; on one GPU the all-gather is forced through a 1-rank communicator (the
default plan keeps XLA's composition there: nothing to gather), which runs the same handler,
copies, flags and GEMM, though no NCCL transfer. The compiled program is checked to hold our
custom call with its second result. Inputs are fresh random bf16. Outputs are poisoned:
conftest sets JAX_FLASHOVERLAP_POISON_OUTPUTS=1, so the handler fills both results and the
workspace with NaN before every call (checked on the lowered call), and an unwritten element
or a GEMM tile computed from rows that had not arrived shows as NaN. The gathered rows must
equal XLA's all_gather(x) bit for bit; the product is compared with float32 and XLA.
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

pytestmark = U.MARKS
TARGET = "flashoverlap_all_gather_gemm"


def _returns_gathered(text, rows, cols):
    """Some call of TARGET in the compiled HLO has two results, the second bf16[rows, cols]
    (matched on the result tuple, not the operands: at world 1 x has the same shape)."""
    result = re.compile(rf"= \(bf16\[\d+,\d+\]\{{1,0\}}, bf16\[{rows},{cols}\]\{{1,0\}}\) "
                        rf"custom-call\(")
    return any(TARGET in line and result.search(line) for line in text.splitlines())


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _mesh():
    return Mesh(np.array(jax.devices()), ("tp",))


def _forced(**kw):
    from jax_flashoverlap import plan_a2a
    return plan_a2a.forced(**kw)


def _programs(transpose_w):
    """(ours, XLA's bf16, float32) per-device programs returning (out, gathered)."""
    import jax_flashoverlap as fo
    mesh = _mesh()
    w_spec = P("tp", None) if transpose_w else P(None, "tp")
    ins, outs = (P("tp", None), w_spec), (P(None, "tp"), P("tp", None))

    def ours(x, w):
        return fo.all_gather_matmul(x, w, "tp", transpose_w=transpose_w, return_gathered=True)

    def ref(dot):
        def body(x, w):
            g = lax.all_gather(x, "tp", axis=0, tiled=True)
            return dot(g, w.T if transpose_w else w), g
        return body

    return [jax.jit(shard_map(b, mesh, ins, outs)) for b in (ours, ref(jnp.matmul), ref(U.dot32))]


def _inputs(M, N, K, transpose_w, seed):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    return U.normal(kx, (M, K)), U.normal(kw, (N, K) if transpose_w else (K, N), K ** -0.5)


@pytest.mark.parametrize("gather,chunks", [("p2p", 1), ("p2p", 2), ("collective", 1)])
@pytest.mark.parametrize("transpose_w", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("M,N,K", [(4096, 8192, 4096), (1000, 1024, 1000)])
def test_values_and_gathered_rows(gather, chunks, transpose_w, M, N, K):
    n = len(jax.devices())
    M = M // (n * chunks) * n * chunks
    x, w = _inputs(M, N, K, transpose_w, M + N + K + chunks)
    with _forced(gather=gather, chunks=chunks, comm_sms=8):
        ours, ref, ref32 = _programs(transpose_w)
        lowered = ours.lower(x, w)
        text = lowered.compile().as_text()
        assert TARGET in text, "the CUDA path is not used"
        assert _returns_gathered(text, M, K), text  # the second result: the gathered rows
        U.assert_poisoned(lowered.as_text(), TARGET)  # both results NaN before the call
        want, want_g = ref(x, w)
        y, g = ours(x, w)
    assert y.shape == want.shape and g.shape == (n * M, K)
    np.testing.assert_array_equal(np.asarray(g.astype(jnp.float32)),
                                  np.asarray(want_g.astype(jnp.float32)))
    assert bool(jnp.all(jnp.isfinite(y))), "non-finite output: unwritten or wrong tiles"
    assert U.rel_fro(y, ref32(x, w)[0]) < U.TOL
    assert U.rel_fro(y, want) < U.TOL


def test_200_calls_fresh_inputs_both_results_checked():
    """200 back-to-back calls (no host sync between them), fresh inputs each time: the
    product against float32 and the gathered rows against x, every call."""
    import jax_flashoverlap as fo
    mesh, n = _mesh(), len(jax.devices())
    M, N, K = 1024 * n, 2048, 1024
    specs = (P("tp", None), P(None, "tp")), (P(None, "tp"), P("tp", None))

    def body(x, w):
        return fo.all_gather_matmul(x, w, "tp", return_gathered=True)

    def ref32(x, w):
        return U.dot32(lax.all_gather(x, "tp", axis=0, tiled=True), w)

    with _forced(chunks=2, comm_sms=8):
        ours = shard_map(body, mesh, *specs)
        ref = shard_map(ref32, mesh, specs[0], specs[1][0])

        @jax.jit
        def step(key):
            kx, kw = jax.random.split(key)
            x = jax.random.normal(kx, (M, K), jnp.float32).astype(U.BF16)
            w = (jax.random.normal(kw, (K, N), jnp.float32) * K ** -0.5).astype(U.BF16)
            y, g = ours(x, w)
            r = ref(x, w)
            gathered_ok = jnp.all(g.reshape(n, M, K) == x[None])
            err = jnp.linalg.norm(y.astype(jnp.float32) - r) / jnp.linalg.norm(r)
            return err, gathered_ok, jnp.sum(x.astype(jnp.float32))

        U.assert_custom_call(step, (jax.random.PRNGKey(0),), TARGET)
        results = [step(k) for k in jax.random.split(jax.random.PRNGKey(23), 200)]
    errs = np.asarray(jax.device_get(jnp.stack([r[0] for r in results])))
    gathered_ok = np.asarray(jax.device_get(jnp.stack([r[1] for r in results])))
    assert np.all(np.isfinite(errs)) and errs.max() < U.TOL, errs
    assert gathered_ok.all(), f"gathered rows wrong in calls {np.flatnonzero(~gathered_ok)}"
    x_sums = np.asarray(jax.device_get(jnp.stack([r[2] for r in results])))
    assert len(set(x_sums.tolist())) == len(results), "the inputs were not fresh"


def test_flax_row_reduce_scatter_overlapped_backward():
    """RowParallelLinear(reduce='reduce_scatter', overlap_backward=True): the backward's dx is
    all_gather_matmul on the kernel as stored, returning the gathered dy that dw uses; value
    and grads match the float32 layer built from XLA's dot and psum_scatter."""
    from flax import nnx
    from jax_flashoverlap.flax import RowParallelLinear
    mesh, n = _mesh(), len(jax.devices())
    din, dout, rows = 2048 * n, 2048, 1024 * n
    layer = RowParallelLinear(din, dout, reduce="reduce_scatter", overlap_backward=True,
                              use_bias=False, rngs=nnx.Rngs(0))
    gdef, state = nnx.split(layer)
    specs = nnx.get_partition_spec(state)
    x = U.normal(jax.random.PRNGKey(4), (rows, din))
    ct = jax.random.normal(jax.random.PRNGKey(5), (rows, dout), jnp.float32)

    def ours(st, x):
        return nnx.merge(gdef, st)(x).astype(jnp.float32)

    def ref32(st, x):
        y = U.dot32(x, st["kernel"][...].astype(U.BF16))
        return lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)

    def forward(fn):
        return shard_map(fn, mesh, (specs, P(None, "tp")), P("tp", None))

    def grads(fn):  # value_and_grad: under grad alone XLA drops the unused forward call
        f = forward(fn)
        return jax.jit(jax.value_and_grad(lambda s, x: jnp.sum(f(s, x) * ct), argnums=(0, 1)))

    with _forced(comm_sms=8):
        g_ours = grads(ours)
        text = g_ours.lower(state, x).compile().as_text()
        # the forward's reduce-scatter and the backward's all-gather + GEMM, with its
        # second result (the gathered dy, [rows, dout])
        assert "flashoverlap_gemm_reduce_scatter" in text, text
        assert _returns_gathered(text, rows, dout), text
        y, y_ref = jax.jit(forward(ours))(state, x), jax.jit(forward(ref32))(state, x)
        (v, (gs, gx)), (v_ref, (gs_ref, gx_ref)) = g_ours(state, x), grads(ref32)(state, x)
    assert U.rel_fro(y, y_ref) < U.TOL
    assert abs(float(v) - float(v_ref)) <= 1e-2 * float(jnp.sum(jnp.abs(y_ref * ct)))
    assert bool(jnp.all(jnp.isfinite(gx)))
    assert U.rel_fro(gx, gx_ref) < U.TOL
    assert U.rel_fro(gs["kernel"].get_value(), gs_ref["kernel"].get_value()) < U.TOL


def test_sequence_parallel_mlp_in_scan_both_directions_overlapped():
    """The Flax layers' per-device functions with overlap_backward=True (column:
    all_gather_matmul forward, matmul_reduce_scatter for dx; row: matmul_reduce_scatter
    forward, all_gather_matmul returning the gathered dy for dx and dw) in a 3-layer
    lax.scan next to XLA's psum, under value_and_grad: every collective of the step is ours;
    value and grads vs the float32 composition, three times in a row (no stale flags)."""
    from jax_flashoverlap import _flax_common as fo_flax_common
    mesh, n = _mesh(), len(jax.devices())
    L, R, D, F = 3, 512, 1024, 2048 * n

    def make(col, row):
        def body(h, a, b, ct):
            def layer(h, ab):
                u = jnp.tanh(col(h, ab[0], "tp"))              # [n*R, F/n]
                h = h + row(u.astype(U.BF16), ab[1], "tp").astype(h.dtype)  # [R, D]
                return h + 1e-3 * lax.psum(h, "tp").astype(h.dtype), None
            out = lax.scan(layer, h, (a, b))[0]
            return lax.psum(jnp.sum(out.astype(jnp.float32) * ct), "tp")
        specs = (P("tp", None), P(None, None, "tp"), P(None, "tp", None), P("tp", None))
        f = shard_map(body, mesh, specs, P())
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))

    # (the last argument: the sequence dim, x's first)
    ours = make(lambda h, a, ax: fo_flax_common._sequence_parallel_matmul(h, a, ax, 0),
                lambda u, b, ax: fo_flax_common._row_scatter_matmul(u, b, ax, 0))
    ref = make(lambda h, a, ax: U.dot32(lax.all_gather(h, ax, axis=0, tiled=True), a),
               lambda u, b, ax: lax.psum_scatter(U.dot32(u, b), ax, scatter_dimension=0,
                                                 tiled=True))
    k = jax.random.split(jax.random.PRNGKey(31), 4)
    h0 = U.normal(k[0], (n * R, D))
    a = U.normal(k[1], (L, D, F), D ** -0.5)
    b = U.normal(k[2], (L, F, D), F ** -0.5)
    ct = jax.random.normal(k[3], (n * R, D), jnp.float32)
    with _forced(comm_sms=8):
        text = ours.lower(h0, a, b, ct).compile().as_text()
        for t in (TARGET, "flashoverlap_gemm_reduce_scatter"):
            assert t in text, f"{t} not in the compiled program"
        # the backward's all-gather + GEMM has its second result: gathered dy [n*R, D]
        assert _returns_gathered(text, n * R, D), "no all-gather call returning dy"
        results = [ours(h0, a, b, ct) for _ in range(3)]
    v_ref, g_ref = ref(h0, a, b, ct)
    for v, g in results:
        assert abs(float(v) - float(v_ref)) <= 2e-2 * abs(float(v_ref)) + 1.0
        for got, want in zip(g, g_ref):
            assert bool(jnp.all(jnp.isfinite(got)))
            assert U.rel_fro(got, want) < 3 * U.TOL
    np.testing.assert_array_equal(np.asarray(results[0][1][0], np.float32),
                                  np.asarray(results[2][1][0], np.float32))
