"""Our ops inside JAX control flow on GPUs (the device machine; never CI).

The CPU suite runs XLA's composition there; on a GPU the handler runs once per execution of
the custom call, which inside control flow is a data-dependent number of times per program
run (a while loop's trip count, 0 included), or not at all (a cond not taken), on the same
communicator as the program's other calls (its counters reset, its workspace reused, each call
ordered after the previous one by `call_done`). Each run here has a different count, fresh
inputs, and the op's input depends on the iteration so XLA cannot hoist the call out of the
loop; outputs are poisoned (conftest), so a call that never ran or ran on stale state shows.
Runs over every local GPU (one GPU: a 1-rank communicator, still our kernels).
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = U.MARKS

N_GPUS = max(U.N_GPUS, 1)
M, N, K = 1024, 1024, 512 * N_GPUS
KINDS = ["matmul", "all_reduce", "reduce_scatter"]


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _op(kind):
    """(ours, float32 reference, in_specs, out_spec, target) per device."""
    import jax_flashoverlap as fo
    if kind == "matmul":
        return (fo.matmul, U.dot32, (P(), P()), P(), "flashoverlap_gemm")
    specs = (P(None, "tp"), P("tp", None))
    if kind == "all_reduce":
        return (lambda a, b: fo.matmul_all_reduce(a, b, "tp"),
                lambda a, b: lax.psum(U.dot32(a, b), "tp"), specs, P(), "flashoverlap_gemm_all_reduce")
    return (lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"),
            lambda a, b: lax.psum_scatter(U.dot32(a, b), "tp", scatter_dimension=0, tiled=True),
            specs, P("tp", None), "flashoverlap_gemm_reduce_scatter")


def _scaled(x, i):
    """x * (i + 1) / 4 in x's dtype: the op's input depends on the iteration (no hoisting)."""
    return x * ((i + 1).astype(jnp.float32) / 4).astype(x.dtype)


def _inputs(seed):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    return U.normal(kx, (M, K)), U.normal(kw, (K, N), K ** -0.5)


def _check(out, ref, what):
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    assert np.all(np.isfinite(out)), f"{what}: non-finite values (a poisoned tile)"
    if not np.any(ref):
        assert not np.any(out), f"{what}: expected zeros (the op never ran)"
    else:
        assert U.rel_fro(out, ref) < U.TOL, what


@pytest.mark.parametrize("kind", KINDS)
def test_while_loop_data_dependent_trip_count(kind):
    """One compiled program, run with 0, 3, 1 and 5 iterations: the handler runs that many
    times per execution, each on the previous call's communicator state."""
    op, ref, in_specs, out_spec, target = _op(kind)
    mesh = Mesh(np.array(jax.devices()), ("tp",))

    def looped(f):
        def body(x, w, n):
            zero = jnp.zeros_like(f(x, w), jnp.float32)
            step = lambda c: (c[0] + 1, c[1] + f(_scaled(x, c[0]), w).astype(jnp.float32))
            return lax.while_loop(lambda c: c[0] < n, step, (jnp.int32(0), zero))[1]
        return jax.jit(shard_map(body, mesh, (*in_specs, P()), out_spec))

    ours, theirs = looped(op), looped(ref)
    x, w = _inputs(0)
    U.assert_custom_call(ours, (x, w, jnp.int32(2)), target)
    for seed, n in enumerate((0, 3, 1, 5)):
        x, w = _inputs(seed + 1)
        _check(ours(x, w, jnp.int32(n)), theirs(x, w, jnp.int32(n)), f"{kind}, {n} iterations")


@pytest.mark.parametrize("kind", KINDS)
def test_cond_taken_or_not_and_other_shape_per_branch(kind):
    """lax.cond: the op on all rows in one branch, on two halves of the rows (a second call
    site with half the workspace) in the other; then a program whose cond skips the op
    altogether on some runs. Alternating runs reuse the communicator between the call sites."""
    op, ref, in_specs, out_spec, target = _op(kind)
    mesh = Mesh(np.array(jax.devices()), ("tp",))

    def two_sites(f):
        def body(x, w, p):
            whole = lambda: f(x, w)
            halves = lambda: jnp.concatenate([f(x[:M // 2], w), f(x[M // 2:], w)], axis=0)
            return lax.cond(p, whole, halves).astype(jnp.float32)
        return jax.jit(shard_map(body, mesh, (*in_specs, P()), out_spec))

    def maybe(f):
        def body(x, w, p):
            zero = jnp.zeros_like(f(x, w), jnp.float32)
            return lax.cond(p, lambda: f(x, w).astype(jnp.float32), lambda: zero)
        return jax.jit(shard_map(body, mesh, (*in_specs, P()), out_spec))

    ours2, ref2, ours1, ref1 = two_sites(op), two_sites(ref), maybe(op), maybe(ref)
    x, w = _inputs(10)
    U.assert_custom_call(ours2, (x, w, jnp.bool_(True)), target)
    for seed, p in enumerate((True, False, False, True, False)):
        x, w = _inputs(11 + seed)
        _check(ours2(x, w, jnp.bool_(p)), ref2(x, w, jnp.bool_(p)), f"{kind}, two sites, p={p}")
        _check(ours1(x, w, jnp.bool_(not p)), ref1(x, w, jnp.bool_(not p)),
               f"{kind}, op or nothing, p={not p}")


@pytest.mark.parametrize("unroll", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_fori_loop_and_scan_in_while(kind, unroll):
    """fori_loop with static bounds (rolled, or unrolled: three call sites in a row on one
    stream), and a scan nested in a while loop, each call's input depending on its step."""
    op, ref, in_specs, out_spec, target = _op(kind)
    mesh = Mesh(np.array(jax.devices()), ("tp",))

    def looped(f):
        def body(x, w):
            zero = jnp.zeros_like(f(x, w), jnp.float32)
            add = lambda i, c: c + f(_scaled(x, i), w).astype(jnp.float32)
            a = lax.fori_loop(0, 3, add, zero, unroll=unroll)

            def outer(c):
                i, acc = c
                acc, _ = lax.scan(lambda s, j: (add(i * 2 + j, s), None), acc, jnp.arange(2))
                return i + 1, acc
            b = lax.while_loop(lambda c: c[0] < 2, outer, (jnp.int32(0), zero))[1]
            return a, b
        return jax.jit(shard_map(body, mesh, in_specs, (out_spec, out_spec)))

    ours, theirs = looped(op), looped(ref)
    x, w = _inputs(20)
    U.assert_custom_call(ours, (x, w), target)
    for seed in range(2):
        x, w = _inputs(21 + seed)
        for got, want, what in zip(ours(x, w), theirs(x, w), ("fori_loop", "scan in while")):
            _check(got, want, f"{kind}, {what}, unroll={unroll}")
