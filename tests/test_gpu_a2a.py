"""GPU tests of matmul_all_to_all and all_gather_matmul (issue #9; the device machine, never CI).

Skipped cleanly without GPUs or the built extension. Every test checks that the compiled
program contains our custom call (else it would compare XLA with itself). Inputs are fresh
random bf16. Outputs are poisoned: conftest sets JAX_FLASHOVERLAP_POISON_OUTPUTS=1, so each
call's handler fills its output and workspace with NaN before it runs (checked on the lowered
call), and any element the op leaves unwritten shows as a NaN. Errors are relative Frobenius
errors against float32 (< 1e-2) and against XLA's own bf16 result.
"""
import contextlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from _util import shard_map
import _gpu_util as U


ON_GPU, N_GPUS = U.ON_GPU, U.N_GPUS
pytestmark = [
    pytest.mark.gpu, pytest.mark.multigpu,
    pytest.mark.skipif(not ON_GPU, reason=f"no GPU (platform {U.platform()!r})"),
    pytest.mark.skipif(ON_GPU and not {"flashoverlap_gemm_all_to_all",
                                       "flashoverlap_all_gather_gemm"} <= U.available_targets(),
                       reason="the CUDA extension with the #9 targets is not built"),
    pytest.mark.skipif(N_GPUS < 2, reason=f"needs >= 2 GPUs, have {N_GPUS}"),
]

TOL, BF16 = U.TOL, U.BF16


@pytest.fixture(autouse=True)
def _our_kernels_at_every_shape(monkeypatch):
    monkeypatch.setenv("JAX_FLASHOVERLAP_FALLBACK", "0")
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)


def _mesh():
    return Mesh(np.array(jax.devices()), ("tp",))


_normal, _rel_fro, _dot32 = U.normal, U.rel_fro, U.dot32


# (ours, reference bf16, reference f32) per-device bodies and specs -------------------------

def _a2a(split, concat):
    import jax_flashoverlap as fo
    ours = lambda x, w: fo.matmul_all_to_all(x, w, "tp", split_axis=split, concat_axis=concat)
    ref = lambda x, w: lax.all_to_all(x @ w, "tp", split, concat, tiled=True)
    ref32 = lambda x, w: lax.all_to_all(_dot32(x, w), "tp", split, concat, tiled=True)
    return (ours, ref, ref32), (P("tp", None), P()), P("tp", None), "flashoverlap_gemm_all_to_all"


def _ag():
    import jax_flashoverlap as fo
    ours = lambda x, w: fo.all_gather_matmul(x, w, "tp")
    ref = lambda x, w: lax.all_gather(x, "tp", axis=0, tiled=True) @ w
    ref32 = lambda x, w: _dot32(lax.all_gather(x, "tp", axis=0, tiled=True), w)
    return (ours, ref, ref32), (P("tp", None), P(None, "tp")), P(None, "tp"), "flashoverlap_all_gather_gemm"


def _programs(kind):
    bodies, ins, out, target = kind
    mesh = _mesh()
    return [jax.jit(shard_map(b, mesh, ins, out)) for b in bodies], target


def _check(kind, x, w):
    (ours, ref, ref32), target = _programs(kind)
    U.assert_custom_call(ours, (x, w), target)  # and poisoned: NaN outputs before the call
    want = ref(x, w)
    y = ours(x, w)
    assert y.shape == want.shape and y.dtype == BF16
    assert bool(jnp.all(jnp.isfinite(y))), "non-finite output: unwritten or wrong tiles"
    assert _rel_fro(y, ref32(x, w)) < TOL
    assert _rel_fro(y, want) < TOL


@pytest.mark.parametrize("split,concat,M,N,K", [
    (0, 0, 4096, 8192, 8192),   # global x rows; per device x [M/n, K], w [K, N] replicated
    (1, 0, 4096, 8192, 8192),   # Ulysses
    (0, 1, 4096, 8192, 4096),
    (1, 1, 4096, 8192, 4096),
    (0, 0, 2000, 1024, 1000),   # odd: 1000 rows per device, 500 per block on 2 GPUs
    (1, 0, 2002, 8192, 1000),   # odd M per device, column blocks
])
def test_all_to_all_vs_xla(split, concat, M, N, K):
    n = N_GPUS
    M = M // (n * n) * n * n or n * n
    kx, kw = jax.random.split(jax.random.PRNGKey(M + N + K + split))
    x, w = _normal(kx, (M, K)), _normal(kw, (K, N), K ** -0.5)
    _check(_a2a(split, concat), x, w)


@pytest.mark.parametrize("M,N,K,chunks", [
    (4096, 8192, 8192, None),   # global: x [M, K] rows sharded, w [K, N] columns sharded
    (4096, 8192, 8192, 2),
    (8192, 28672, 4096, 4),
    (1000, 1024, 1000, None),   # 500 rows per device
    (2 * 127, 2048, 512, 1),
])
def test_all_gather_matmul_vs_xla(M, N, K, chunks):
    from jax_flashoverlap import plan_a2a
    n = N_GPUS
    M = M // n * n
    kx, kw = jax.random.split(jax.random.PRNGKey(M + N + K))
    x, w = _normal(kx, (M, K)), _normal(kw, (K, N), K ** -0.5)
    if chunks is not None and (M // n) % chunks:
        pytest.skip(f"{M // n} rows per device not divisible by {chunks} chunks")
    with plan_a2a.forced(chunks=chunks) if chunks else contextlib.nullcontext():
        _check(_ag(), x, w)  # compiled (and planned) inside the context


@pytest.mark.parametrize("M,N,K", [(8192, 8192, 4096), (1000, 1024, 1000), (2 * 127, 2048, 512)])
@pytest.mark.parametrize("comm_sms", [1, 4])
def test_collective_all_gather_matmul_vs_xla(M, N, K, comm_sms):
    """The collective gather: one ncclAllGather over the registered window of a CTA-policy-ZERO
    communicator (copy engines), the GEMM on all but comm_sms SMs; values, and 20 calls in a
    row with fresh inputs."""
    from jax_flashoverlap import plan_a2a
    n = N_GPUS
    M = M // n * n
    with plan_a2a.forced(gather="collective", comm_sms=comm_sms):
        kx, kw = jax.random.split(jax.random.PRNGKey(M + N + K + comm_sms))
        x, w = _normal(kx, (M, K)), _normal(kw, (K, N), K ** -0.5)
        _check(_ag(), x, w)  # poisoned output, against XLA and float32
        (ours, _, ref32), target = _programs(_ag())
        assert target in ours.lower(x, w).compile().as_text()
        errs = []
        for key in jax.random.split(jax.random.PRNGKey(3), 20):
            kx, kw = jax.random.split(key)
            x, w = _normal(kx, (M, K)), _normal(kw, (K, N), K ** -0.5)
            errs.append(_rel_fro(ours(x, w), ref32(x, w)))
    assert all(e < TOL for e in errs), errs  # max() would skip a NaN (an unwritten tile)
    assert len(set(np.round(errs, 8))) > 1, "identical errors: the inputs were not fresh"


@pytest.mark.parametrize("which", ["a2a_rows", "a2a_ulysses", "all_gather"])
def test_stress_200_calls_fresh_inputs(which):
    """200 back-to-back calls (no host sync in between), fresh inputs each time, each checked."""
    M, N, K = 2048, 4096, 4096
    kind = {"a2a_rows": _a2a(0, 0), "a2a_ulysses": _a2a(1, 0), "all_gather": _ag()}[which]
    (ours, _, ref32), target = _programs(kind)

    @jax.jit
    def step(key):
        kx, kw = jax.random.split(key)
        x = jax.random.normal(kx, (M, K), jnp.float32).astype(BF16)
        w = (jax.random.normal(kw, (K, N), jnp.float32) * K ** -0.5).astype(BF16)
        y, r = ours(x, w), ref32(x, w)
        return jnp.linalg.norm(y.astype(jnp.float32) - r) / jnp.linalg.norm(r)

    U.assert_custom_call(ours, (jnp.zeros((M, K), BF16), jnp.zeros((K, N), BF16)), target)
    errs = [step(k) for k in jax.random.split(jax.random.PRNGKey(11), 200)]
    errs = np.asarray(jax.device_get(jnp.stack(errs)))
    assert np.all(np.isfinite(errs)), errs
    assert errs.max() < TOL, f"worst call {errs.argmax()}: {errs.max():.3e}"
    assert len(set(np.round(errs, 8))) > 1, "all errors identical: inputs were not fresh"


def test_sequence_parallel_mlp_in_scan():
    """all_gather_matmul -> matmul_reduce_scatter (the sequence-parallel MLP), then
    matmul_all_to_all and XLA's psum, inside lax.scan; repeated: no hang, same values."""
    import jax_flashoverlap as fo

    L, R, D, F = 4, 512, 2048, 4096
    n = N_GPUS
    mesh = _mesh()

    def make(ag, rs, a2a):
        def body(h, a, b, c):
            def layer(h, ws):
                a, b, c = ws
                u = jnp.tanh(ag(h, a))                  # [n*R, F/n]
                h = jnp.tanh(rs(u, b))                  # [R, D]
                h = jnp.tanh(a2a(h, c))                 # [R, D], rows exchanged
                h = h + 1e-3 * lax.psum(h, "tp")        # an XLA collective in between
                return h, None
            return lax.scan(layer, h, (a, b, c))[0]
        specs = (P("tp", None), P(None, None, "tp"), P(None, "tp", None), P())
        return jax.jit(shard_map(body, mesh, specs, P("tp", None)))

    ours = make(lambda h, a: fo.all_gather_matmul(h, a, "tp"),
                lambda u, b: fo.matmul_reduce_scatter(u, b, "tp"),
                lambda h, c: fo.matmul_all_to_all(h, c, "tp"))
    ref = make(lambda h, a: lax.all_gather(h, "tp", axis=0, tiled=True) @ a,
               lambda u, b: lax.psum_scatter(u @ b, "tp", scatter_dimension=0, tiled=True),
               lambda h, c: lax.all_to_all(h @ c, "tp", 0, 0, tiled=True))
    k = jax.random.split(jax.random.PRNGKey(5), 4)
    h0 = _normal(k[0], (n * R, D))
    a = _normal(k[1], (L, D, F), D ** -0.5)
    b = _normal(k[2], (L, F, D), F ** -0.5)
    c = _normal(k[3], (L, D, D), D ** -0.5)
    text = ours.lower(h0, a, b, c).compile().as_text()
    for t in ("flashoverlap_all_gather_gemm", "flashoverlap_gemm_reduce_scatter",
              "flashoverlap_gemm_all_to_all"):
        assert t in text, f"{t} not in the compiled program"
    want = ref(h0, a, b, c)
    for _ in range(5):
        assert _rel_fro(ours(h0, a, b, c), want) < 3 * TOL
