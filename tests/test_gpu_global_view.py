"""GPU tests of the global views under plain `jax.jit` (no shard_map): `row_parallel_matmul`
(all-reduce / reduce-scatter) and `column_parallel_matmul` (all-gather), the device machine,
never CI.

They need >= 2 GPUs: over a 1-device mesh XLA does not partition the program at all
(custom_partitioning's partitioner never runs), so the global views are XLA's own dot there,
which `test_one_device_mesh_is_xla_dot` checks (and the CPU tests check on 1 device too).
Each test checks that the compiled program holds our custom call, poisoned (conftest:
outputs NaN before the call), and compares with float32 on fresh random bf16 inputs; the
output's sharding is the one the global view promises.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import _gpu_util as U

pytestmark = U.MARKS
requires_two = pytest.mark.skipif(U.N_GPUS < 2, reason=f"needs >= 2 GPUs, have {U.N_GPUS}")


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _mesh():
    return Mesh(np.array(jax.devices()), ("tp",))


def _put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def _product32(x, w, transpose_w):
    return jax.jit(lambda a, b: U.dot32(a, b.T if transpose_w else b))(x, w)


@requires_two
@pytest.mark.parametrize("transpose_w", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_row_parallel_matmul(reduce, transpose_w):
    """x [M, K] and w sharded on K over tp: per device our GEMM + collective; the output
    replicated (all-reduce) or rows over tp (reduce-scatter)."""
    import jax_flashoverlap as fo
    mesh, n = _mesh(), U.N_GPUS
    M, N, K = 2048 * n, 4096, 2048 * n
    kx, kw = jax.random.split(jax.random.PRNGKey(7 + transpose_w))
    x = _put(mesh, U.normal(kx, (M, K)), P(None, "tp"))
    w_shape, w_spec = ((N, K), P(None, "tp")) if transpose_w else ((K, N), P("tp", None))
    w = _put(mesh, U.normal(kw, w_shape, K ** -0.5), w_spec)
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce=reduce,
                                                    transpose_w=transpose_w))
    U.assert_custom_call(f, (x, w), "flashoverlap_gemm_" + reduce)
    y = f(x, w)
    want_spec = P() if reduce == "all_reduce" else P("tp")
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, want_spec), 2), y.sharding
    assert bool(jnp.all(jnp.isfinite(y)))
    assert U.rel_fro(y, _product32(x, w, transpose_w)) < U.TOL


@requires_two
@pytest.mark.parametrize("transpose_w", [False, True], ids=["kn", "nk"])
def test_column_parallel_matmul(transpose_w):
    """x rows and w's N sharded over tp: per device all_gather_matmul; output N over tp."""
    import jax_flashoverlap as fo
    mesh, n = _mesh(), U.N_GPUS
    M, N, K = 1024 * n, 2048 * n, 1024
    kx, kw = jax.random.split(jax.random.PRNGKey(41 + transpose_w))
    x = _put(mesh, U.normal(kx, (M, K)), P("tp", None))
    w_shape, w_spec = ((N, K), P("tp", None)) if transpose_w else ((K, N), P(None, "tp"))
    w = _put(mesh, U.normal(kw, w_shape, K ** -0.5), w_spec)
    f = jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, transpose_w=transpose_w))
    U.assert_custom_call(f, (x, w), "flashoverlap_all_gather_gemm")
    y = f(x, w)
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "tp")), 2), y.sharding
    assert bool(jnp.all(jnp.isfinite(y)))
    assert U.rel_fro(y, _product32(x, w, transpose_w)) < U.TOL


def test_one_device_mesh_is_xla_dot():
    """Over one device XLA does not partition: no partitioner runs, no custom call is emitted,
    and the global views compute x @ w with XLA's dot (nothing to reduce or gather)."""
    import jax_flashoverlap as fo
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    kx, kw = jax.random.split(jax.random.PRNGKey(3))
    x = _put(mesh, U.normal(kx, (512, 1024)), P(None, "tp"))
    w = _put(mesh, U.normal(kw, (1024, 768), 1024 ** -0.5), P("tp", None))
    for f in (lambda a, b: fo.row_parallel_matmul(a, b),
              lambda a, b: fo.column_parallel_matmul(a, b)):
        text = jax.jit(f).lower(x, w).compile().as_text()
        assert "flashoverlap_" not in text, "a custom call over one device"
        assert U.rel_fro(jax.jit(f)(x, w), _product32(x, w, False)) < U.TOL


@requires_two
@pytest.mark.parametrize("sequence_dim", [0, 1], ids=["S-B", "B-S"])
def test_sequence_parallel_mlp_keeps_leading_dims(sequence_dim):
    """Megatron's sequence-parallel MLP under jit on x [S, B, D] sharded on S over tp (or
    [B, S, D] with sequence_dim=1): column_parallel_matmul's all-gather + GEMM and
    row_parallel_matmul's GEMM + reduce-scatter are our custom calls, x is never flattened
    to rows, the output comes back in x's layout, and the values equal float32's."""
    import jax_flashoverlap as fo
    mesh, n = _mesh(), U.N_GPUS
    S, B, D, F = 1024 * n, 2, 1024, 2048 * n
    shape = (S, B, D) if sequence_dim == 0 else (B, S, D)
    x_spec = P("tp", None, None) if sequence_dim == 0 else P(None, "tp", None)
    k = jax.random.split(jax.random.PRNGKey(53 + sequence_dim), 3)
    x = _put(mesh, U.normal(k[0], shape), x_spec)
    w1 = _put(mesh, U.normal(k[1], (D, F), D ** -0.5), P(None, "tp"))
    w2 = _put(mesh, U.normal(k[2], (F, D), F ** -0.5), P("tp", None))

    def mlp(x, w1, w2):
        h = fo.column_parallel_matmul(x, w1, "tp", sequence_dim=sequence_dim)
        h = jnp.tanh(h.astype(jnp.float32)).astype(U.BF16)
        return fo.row_parallel_matmul(h, w2, "reduce_scatter", "tp", sequence_dim=sequence_dim)

    f = jax.jit(mlp)
    U.assert_custom_call(f, (x, w1, w2), "flashoverlap_all_gather_gemm")
    U.assert_custom_call(f, (x, w1, w2), "flashoverlap_gemm_reduce_scatter")
    y = f(x, w1, w2)
    assert y.shape == shape
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, x_spec), 3), y.sharding
    assert bool(jnp.all(jnp.isfinite(y)))
    want = jax.jit(lambda x, w1, w2: U.dot32(jnp.tanh(U.dot32(x, w1)).astype(U.BF16), w2))(
        x, w1, w2)
    assert U.rel_fro(y, want) < U.TOL
