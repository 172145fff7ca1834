"""`transpose_w=True` on every per-device op: w is [N, K] and the product is x @ w.T.

For each op: values inside shard_map (check_vma=True) equal the reference composition on
x @ w.T (and our op on the materialized w.T), gradients w.r.t. x and w equal the reference's,
jax.vmap with w batched (the [B, N, K] fold of gemm / all-reduce / reduce-scatter, lax.map
for the others), and the CUDA lowering (cross-lowered, no GPU) passes `transpose_w = 1 : i32`
(`0` by default) with w's [N, K] operand and no transpose before the call. The Flax column
layer's backward uses it instead of a w.T copy. Bad inputs are rows of test_bad_inputs.py.
"""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, assert_rel_fro, custom_call_lines, f32,
                   lower_for_cuda, make_mesh_1d, rand, rel_fro, shard_map, upcast, REL_FRO_TOL)

# name -> (our op(fo, x, w, **kw), reference(x, w [K, N]), (x spec, w [N, K] spec, out spec),
#          custom-call target)
OPS = {
    "matmul": (lambda fo, a, b, **kw: fo.matmul(a, b, **kw),
               lambda a, b: a @ b,
               (P("tp", None), P(), P("tp", None)), "flashoverlap_gemm"),
    "all_reduce": (lambda fo, a, b, **kw: fo.matmul_all_reduce(a, b, "tp", **kw),
                   lambda a, b: lax.psum(a @ b, "tp"),
                   (P(None, "tp"), P(None, "tp"), P()), "flashoverlap_gemm_all_reduce"),
    "reduce_scatter": (lambda fo, a, b, **kw: fo.matmul_reduce_scatter(a, b, "tp", **kw),
                       lambda a, b: lax.psum_scatter(a @ b, "tp", scatter_dimension=0,
                                                     tiled=True),
                       (P(None, "tp"), P(None, "tp"), P("tp", None)),
                       "flashoverlap_gemm_reduce_scatter"),
    "all_to_all_rows": (lambda fo, a, b, **kw: fo.matmul_all_to_all(a, b, "tp", **kw),
                        lambda a, b: lax.all_to_all(a @ b, "tp", 0, 0, tiled=True),
                        (P("tp", None), P(), P("tp", None)), "flashoverlap_gemm_all_to_all"),
    "all_to_all_ulysses": (lambda fo, a, b, **kw: fo.matmul_all_to_all(
                               a, b, "tp", split_axis=1, concat_axis=0, **kw),
                           lambda a, b: lax.all_to_all(a @ b, "tp", 1, 0, tiled=True),
                           (P("tp", None), P(), P("tp", None)), "flashoverlap_gemm_all_to_all"),
    # sequence-parallel column layer: w's N (its first dim when transposed) sharded
    "all_gather": (lambda fo, a, b, **kw: fo.all_gather_matmul(a, b, "tp", **kw),
                   lambda a, b: lax.all_gather(a, "tp", axis=0, tiled=True) @ b,
                   (P("tp", None), P("tp", None), P(None, "tp")), "flashoverlap_all_gather_gemm"),
}
# ops whose global result is the global x @ w.T (the all-to-alls permute blocks)
GLOBAL_PRODUCT = ("matmul", "all_reduce", "reduce_scatter", "all_gather")


def _global(local, spec, n, batch=()):
    """Global shape of per-device `local` under `spec` over a 'tp' axis of size n."""
    spec = tuple(spec) + (None,) * (len(local) - len(tuple(spec)))
    return tuple(batch) + tuple(d * n if s == "tp" else d for d, s in zip(local, spec))


def _specs(name, batched=(False, False)):
    """(x spec, w spec, out spec), with a leading None on the batched operands (and out)."""
    xs, ws, os_ = OPS[name][2]
    lead = lambda s, b: P(None, *s) if b else s  # noqa: E731
    return lead(xs, batched[0]), lead(ws, batched[1]), lead(os_, any(batched))


def _inputs(name, n, rng, dt, m=None, k=16, cols=None, batch=None):
    """Random global x [.., M, K] and w [.., N, K]; per device M = 3n rows, N = 8n columns."""
    xs, ws, _ = OPS[name][2]
    m, cols = m or 3 * n, cols or 8 * n
    x = rand(rng, _global((m, k), xs, n, batch[0] if batch else ()), dt)
    w = rand(rng, _global((cols, k), ws, n, batch[1] if batch else ()), dt, scale=k ** -0.5)
    return x, w


def _kn_spec(w_spec):
    """The spec of w.T [K, N] from that of w [N, K]."""
    return P(*reversed((tuple(w_spec) + (None, None))[:2]))


def _ours(fo, name, **kw):
    return lambda a, b: OPS[name][0](fo, a, b, **kw)


def _ref_t(name):
    """The reference composition on x @ w.T (w [N, K])."""
    return lambda a, b: OPS[name][1](a, b.T)


def _jit(body, mesh, specs):
    return jax.jit(shard_map(body, mesh, specs[:2], specs[2]))


# ----------------------------------------------------------------------------- values

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", list(OPS))
def test_values(fo, tp_mesh, name, dtype, rng):
    n = tp_mesh.shape["tp"]
    x, w = _inputs(name, n, rng, dtype)
    specs = _specs(name)
    got = _jit(_ours(fo, name, transpose_w=True), tp_mesh, specs)(x, w)
    want = _jit(_ref_t(name), tp_mesh, specs)(x, w)
    assert got.dtype == dtype
    assert_close(got, want)
    assert_rel_fro(got, _jit(_ref_t(name), tp_mesh, specs)(*upcast(x, w)))
    # ...and our op on the materialized transpose (w.T [K, N], its spec reversed)
    xs, ws, os_ = specs
    plain = _jit(_ours(fo, name), tp_mesh, (xs, _kn_spec(ws), os_))
    assert_close(got, plain(x, w.T))
    if name in GLOBAL_PRODUCT:  # independent of JAX's collectives: the global math
        glob = np.matmul(f32(x), f32(w).T)
        assert got.shape == glob.shape and rel_fro(got, glob) < REL_FRO_TOL


# ----------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("name", list(OPS))
def test_grads(fo, name, rng):
    mesh = make_mesh_1d(4)
    x, w = _inputs(name, 4, rng, jnp.bfloat16)
    specs = _specs(name)
    out_shape = jax.eval_shape(_jit(_ref_t(name), mesh, specs), x, w).shape
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))

    def grads(body, *args):
        f = shard_map(body, mesh, specs[:2], specs[2])
        loss = lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct)  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(*args)

    got = grads(_ours(fo, name, transpose_w=True), x, w)
    want = grads(_ref_t(name), x, w)
    want32 = grads(_ref_t(name), *upcast(x, w))
    for g, r, r32, a in zip(got, want, want32, (x, w)):
        assert g.shape == a.shape and g.dtype == a.dtype
        assert_close(g, r)
        assert_rel_fro(g, r32)
    if name in GLOBAL_PRODUCT:  # d/dw of x @ w.T is ct.T @ x: [N, K], not [K, N]
        assert_rel_fro(got[1], f32(ct).T @ f32(x))


# ----------------------------------------------------------------------------- vmap

B = 3
BATCHED = {"x": (True, False), "w": (False, True), "both": (True, True)}


@pytest.mark.parametrize("batched", list(BATCHED))
@pytest.mark.parametrize("name", list(OPS))
def test_vmap(fo, name, batched, rng):
    mesh = make_mesh_1d(4)
    bx, bw = BATCHED[batched]
    x, w = _inputs(name, 4, rng, jnp.bfloat16, batch=((B,) if bx else (), (B,) if bw else ()))
    specs = _specs(name, (bx, bw))
    in_axes = (0 if bx else None, 0 if bw else None)
    run = lambda body: _jit(jax.vmap(body, in_axes=in_axes), mesh, specs)(x, w)  # noqa: E731
    got = run(_ours(fo, name, transpose_w=True))
    assert got.shape[0] == B
    assert_close(got, run(_ref_t(name)))


def test_vmap_w_batched_folds_without_transpose(fo):
    """w [B, N, K] batched, x not: one call on the reshaped [B*N, K] (no transpose, no map)."""
    mesh = make_mesh_1d(4)
    specs = _specs("all_reduce", (False, True))
    f = shard_map(jax.vmap(_ours(fo, "all_reduce", transpose_w=True), in_axes=(None, 0)),
                  mesh, specs[:2], specs[2])
    jaxpr = str(jax.make_jaxpr(f)(jax.ShapeDtypeStruct((5, 64), jnp.bfloat16),
                                  jax.ShapeDtypeStruct((B, 24, 64), jnp.bfloat16)))
    assert re.search(r"flashoverlap_gemm_all_reduce\[[^\]]*transpose_w=True", jaxpr), jaxpr
    # w reaches our primitive reshaped, never transposed (the output's own transpose follows)
    assert "bf16[72,16]" in jaxpr
    assert " transpose[" not in jaxpr.split("flashoverlap_gemm_all_reduce[")[0], jaxpr


# ----------------------------------------------------------------------------- CUDA lowering

# per device x [M, K], w [N, K]: large enough that the plans overlap (with no_fallback)
LOWER_LOCAL = (4096, 4096, 8192)  # (m, k, cols)


@pytest.mark.parametrize("transpose_w", [None, False, True], ids=["default", "false", "true"])
@pytest.mark.parametrize("name", list(OPS))
def test_cuda_lowering_attribute(fo, no_fallback, name, transpose_w):
    n, (m, k, cols) = 2, LOWER_LOCAL
    xs, ws, os_ = specs = _specs(name)
    kw = {} if transpose_w is None else {"transpose_w": transpose_w}
    w_local = (cols, k) if transpose_w else (k, cols)
    if not transpose_w:  # the [K, N] layout: w's spec reversed
        specs = (xs, _kn_spec(ws), os_)
    args = (jax.ShapeDtypeStruct(_global((m, k), xs, n), jnp.bfloat16),
            jax.ShapeDtypeStruct(_global(w_local, specs[1], n), jnp.bfloat16))
    text = lower_for_cuda(shard_map(_ours(fo, name, **kw), make_mesh_1d(n), specs[:2],
                                    specs[2]), args)
    calls = custom_call_lines(text, OPS[name][3])
    assert len(calls) == 1, text
    call = calls[0]
    assert f"transpose_w = {int(bool(transpose_w))} : i32" in call, call
    # w reaches the call in its own layout (no transpose pass), and N is read from it
    assert f"tensor<{w_local[0]}x{w_local[1]}xbf16>" in call, call
    assert "transpose" not in text.replace("transpose_w", ""), text
    out = jax.eval_shape(_jit(_ref_t(name), make_mesh_1d(n), _specs(name)),
                         jax.ShapeDtypeStruct(args[0].shape, jnp.bfloat16),
                         jax.ShapeDtypeStruct(_global((cols, k), ws, n), jnp.bfloat16))
    local_out = tuple(d // n if s == "tp" else d for d, s in
                      zip(out.shape, tuple(os_) + (None,) * 2))
    assert f"-> tensor<{local_out[0]}x{local_out[1]}xbf16>" in call, call



@pytest.mark.parametrize("name", list(OPS))
def test_cuda_lowering_reads_n_past_the_kernels_limit_from_w(fo, no_fallback, name):
    """w [N, K] with N = 2^30 (the kernels' limit) and a small K: N must be read from w's first
    dim, or the limit checks pass and a call the launcher refuses at run time is emitted. With
    the fallback off the GEMM ops name N; the all-to-all and all-gather take XLA's path."""
    n, big = 2, 1 << 30
    xs, ws, os_ = specs = _specs(name)
    args = (jax.ShapeDtypeStruct(_global((512, 64), xs, n), jnp.bfloat16),
            jax.ShapeDtypeStruct(_global((big, 64), ws, n), jnp.bfloat16))
    f = shard_map(_ours(fo, name, transpose_w=True), make_mesh_1d(n), specs[:2], os_)
    if name in ("matmul", "all_reduce", "reduce_scatter"):
        with pytest.raises(ValueError, match=rf"N={big} \(columns of the output\) must be < 2\^30"):
            lower_for_cuda(f, args)
    else:
        text = lower_for_cuda(f, args)
        assert not custom_call_lines(text, OPS[name][3]) and "dot_general" in text, text

def test_cpu_lowering_is_the_reference(fo):
    specs = _specs("all_reduce")
    f = shard_map(_ours(fo, "all_reduce", transpose_w=True), make_mesh_1d(4), specs[:2],
                  specs[2])
    text = jax.jit(f).trace(jax.ShapeDtypeStruct((5, 64), jnp.bfloat16),
                            jax.ShapeDtypeStruct((24, 64), jnp.bfloat16)).lower().as_text()
    assert "flashoverlap" not in text and "dot_general" in text


# ----------------------------------------------------------------------------- bad input
# (the rest, with messages, are rows of test_bad_inputs.py / docs/errors.md)

def _trace(fo, name, x_shape, w_shape, n=4, **kw):
    specs = _specs(name)
    f = shard_map(_ours(fo, name, **kw), make_mesh_1d(n), specs[:2], specs[2])
    return jax.make_jaxpr(f)(jax.ShapeDtypeStruct(x_shape, jnp.bfloat16),
                             jax.ShapeDtypeStruct(w_shape, jnp.bfloat16))


@pytest.mark.parametrize("value", [1, "True", None, np.array(True)], ids=repr)
@pytest.mark.parametrize("name", list(OPS))
def test_transpose_w_must_be_a_bool(fo, name, value):
    x_shape = _global((8, 16), _specs(name)[0], 4)
    w_shape = _global((16, 16), _specs(name)[1], 4)
    with pytest.raises(TypeError, match=r"transpose_w must be a bool \(True: w is \[N, K\]\)"):
        _trace(fo, name, x_shape, w_shape, transpose_w=value)
    _trace(fo, name, x_shape, w_shape, transpose_w=np.bool_(True))  # numpy's bool is one


def test_all_to_all_columns_name_n_as_the_first_dim_of_w(fo):
    with pytest.raises(ValueError, match=r"split_axis=1 needs N \(first dim of w, shape "
                                         r"\(32, 16\)\) to be divisible by the size 3"):
        _trace(fo, "all_to_all_ulysses", (3 * 6, 16), (32, 16), n=3, transpose_w=True)


# ----------------------------------------------------------------------------- Flax

def test_flax_column_backward_reads_the_kernel_in_place(rng):
    """The column layer's overlapped backward is matmul_all_reduce(dy, kernel, transpose_w=True):
    no more transposes in the grad than XLA's own backward has (its dw), same grads."""
    nnx = pytest.importorskip("flax.nnx")
    from jax_flashoverlap.flax import ColumnParallelLinear
    mesh = make_mesh_1d(4)
    x = rand(rng, (8, 32), jnp.bfloat16)
    grads, transposes = {}, {}
    for overlap in (True, False):
        gdef, state = nnx.split(ColumnParallelLinear(32, 64, overlap_backward=overlap,
                                                     rngs=nnx.Rngs(0)))
        f = jax.shard_map(lambda s, x: nnx.merge(gdef, s)(x), mesh=mesh,
                          in_specs=(nnx.get_partition_spec(state), P()),
                          out_specs=P(None, "tp"))
        grad = jax.grad(lambda s, x: jnp.sum(jnp.sin(f(s, x).astype(jnp.float32))),
                        argnums=(0, 1))
        text = str(jax.make_jaxpr(grad)(state, x))
        if overlap:
            assert re.search(r"flashoverlap_gemm_all_reduce\[[^\]]*transpose_w=True", text), text
        transposes[overlap] = text.count(" transpose[")
        grads[overlap] = jax.jit(grad)(state, x)
    assert transposes[True] == transposes[False], transposes
    # dx within bf16 rounding of XLA's own backward (which rounds each rank's product before
    # the sum on JAX 0.11, not on 0.10: test_flax.py, column backward); dw the same bits
    assert_close(grads[True][1], grads[False][1])
    np.testing.assert_array_equal(f32(grads[True][0]["kernel"].get_value()),
                                  f32(grads[False][0]["kernel"].get_value()))
