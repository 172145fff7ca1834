"""matmul_all_to_all (issue #9) on CPU devices: values, gradients, vmap, errors, CUDA lowering.

Reference: lax.all_to_all(x @ w, axis, split_axis, concat_axis, tiled=True). On CPU the op
lowers to exactly that, so values must agree to the last bit; the CUDA lowering is checked by
cross-lowering (no GPU needed).
"""
import re

import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, assert_rel_fro, custom_call_lines,
                   lower_for_cuda, make_mesh_1d, make_mesh_2d,
                   rand, shard_map, upcast)

AXES = [(0, 0), (1, 0), (0, 1), (1, 1)]
AXES_IDS = ["rows", "ulysses", "rows_to_cols", "cols"]


def _ref(split, concat, axis="tp"):
    return lambda x, w: lax.all_to_all(x @ w, axis, split, concat, tiled=True)


def _ours(fo, split, concat, axis="tp", **kw):
    return lambda x, w: fo.matmul_all_to_all(x, w, axis, split_axis=split, concat_axis=concat, **kw)


def _inputs(rng, n, dt, rows_per_rank=3, k=24, cols_per_rank=8, ndp=1):
    """Global x [ndp * n * n * rows_per_rank, k] (rows sharded), w [k, n * cols_per_rank]."""
    x = rand(rng, (ndp * n * n * rows_per_rank, k), dt)
    w = rand(rng, (k, n * cols_per_rank), dt, scale=k ** -0.5)
    return x, w


def _run(body, mesh, x, w, xs=P("tp", None)):
    return jax.jit(shard_map(body, mesh, (xs, P()), xs))(x, w)


@pytest.mark.parametrize("split,concat", AXES, ids=AXES_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_values(fo, tp_mesh, split, concat, dtype, rng):
    n = tp_mesh.shape["tp"]
    x, w = _inputs(rng, n, dtype)
    got = _run(_ours(fo, split, concat), tp_mesh, x, w)
    want = _run(_ref(split, concat), tp_mesh, x, w)
    assert_close(got, want)
    want32 = _run(_ref(split, concat), tp_mesh, *upcast(x, w))
    assert_rel_fro(got, want32)


@pytest.mark.parametrize("split,concat", AXES, ids=AXES_IDS)
def test_odd_shapes(fo, split, concat, rng):
    """Rows per block not a multiple of anything, N = 8 per rank, K = 8."""
    mesh = make_mesh_1d(4)
    x, w = _inputs(rng, 4, jnp.bfloat16, rows_per_rank=7, k=8, cols_per_rank=2)
    if split == 1:
        w = rand(rng, (8, 4 * 8), jnp.bfloat16)
    got = _run(_ours(fo, split, concat), mesh, x, w)
    assert_close(got, _run(_ref(split, concat), mesh, x, w))


@pytest.mark.parametrize("concat", [0, 1], ids=["ulysses", "cols"])
def test_columns_split_take_rows_not_divisible_by_the_axis(fo, concat, rng):
    """split_axis=1 splits N, so x's rows (per device, here 5 on 4 ranks) need not divide by
    the axis size (only split_axis=0 needs that)."""
    mesh = make_mesh_1d(4)
    x, w = rand(rng, (4 * 5, 16), jnp.bfloat16), rand(rng, (16, 4 * 8), jnp.bfloat16)
    got = _run(_ours(fo, 1, concat), mesh, x, w)
    assert_close(got, _run(_ref(1, concat), mesh, x, w))


def test_default_concat_is_split(fo, rng):
    mesh = make_mesh_1d(4)
    x, w = _inputs(rng, 4, jnp.bfloat16)
    got = _run(lambda a, b: fo.matmul_all_to_all(a, b, "tp", split_axis=1), mesh, x, w)
    assert_close(got, _run(_ref(1, 1), mesh, x, w))


def test_leading_dims_rowwise(fo, rng):
    """x [B, S, K] with split = concat = 0: B is split, as lax.all_to_all does."""
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 8, 5, 16), jnp.bfloat16)
    w = rand(rng, (16, 24), jnp.bfloat16)
    body = lambda a, b: fo.matmul_all_to_all(a, b, "tp")
    ref = lambda a, b: lax.all_to_all(a @ b, "tp", 0, 0, tiled=True)
    specs = (P("tp", None, None), P()), P("tp", None, None)
    got = jax.jit(shard_map(body, mesh, *specs))(x, w)
    want = jax.jit(shard_map(ref, mesh, *specs))(x, w)
    assert got.shape == (32, 5, 24)
    assert_close(got, want)


def test_2d_mesh_over_tp(fo, rng):
    mesh = make_mesh_2d(2, 4)
    x, w = _inputs(rng, 4, jnp.bfloat16, ndp=2)
    xs = P(("dp", "tp"), None)
    for split, concat in AXES:
        got = _run(_ours(fo, split, concat), mesh, x, w, xs)
        assert_close(got, _run(_ref(split, concat), mesh, x, w, xs))


@pytest.mark.parametrize("split,concat", AXES, ids=AXES_IDS)
def test_grads(fo, split, concat, rng):
    mesh = make_mesh_1d(4)
    x, w = _inputs(rng, 4, jnp.bfloat16)
    out_shape = jax.eval_shape(lambda a, b: _run(_ref(split, concat), mesh, a, b), x, w).shape
    ct = jnp.asarray(rng.standard_normal(out_shape), jnp.float32)

    def grads(body, x, w):
        f = shard_map(body, mesh, (P("tp", None), P()), P("tp", None))
        return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(x, w)

    got = grads(_ours(fo, split, concat), x, w)
    want = grads(_ref(split, concat), x, w)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


def test_grad_inside_shard_map(fo, rng):
    """Per-device loss differentiated inside the body (vma typing of the VJP, check_vma=True)."""
    mesh = make_mesh_1d(4)
    x, w = _inputs(rng, 4, jnp.bfloat16)

    def body(op):
        def f(a, b):
            return jax.grad(lambda a, b: jnp.sum(op(a, b).astype(jnp.float32) ** 2),
                            argnums=(0, 1))(a, b)
        return f

    specs = (P("tp", None), P()), (P("tp", None), P("tp"))
    wrap = lambda op: jax.jit(shard_map(lambda a, b: (lambda g: (g[0], g[1][None]))(body(op)(a, b)),
                                        mesh, *specs))
    got = wrap(_ours(fo, 1, 0))(x, w)
    want = wrap(_ref(1, 0))(x, w)
    for g, r in zip(got, want):
        assert_close(g, r)


@pytest.mark.parametrize("w_batched", [False, True], ids=["x_batched", "both_batched"])
def test_vmap(fo, w_batched, rng):
    mesh = make_mesh_1d(4)
    B = 3
    x = rand(rng, (B, 4 * 8, 16), jnp.bfloat16)
    w = rand(rng, (B, 16, 32), jnp.bfloat16) if w_batched else rand(rng, (16, 32), jnp.bfloat16)
    in_axes = (0, 0 if w_batched else None)
    specs = (P(None, "tp", None), P()), P(None, "tp", None)
    for split, concat in AXES:
        run = lambda op: jax.jit(shard_map(jax.vmap(op, in_axes=in_axes), mesh, *specs))(x, w)
        assert_close(run(_ours(fo, split, concat)), run(_ref(split, concat)))


# ------------------------------------------------------------------ errors (trace time)

def _trace(fo, mesh, x_shape, w_shape, dtype=jnp.bfloat16, **kw):
    body = lambda a, b: fo.matmul_all_to_all(a, b, "tp", **kw)
    f = shard_map(body, mesh, (P("tp", None), P()), P("tp", None))
    return jax.jit(f).trace(jax.ShapeDtypeStruct(x_shape, dtype), jax.ShapeDtypeStruct(w_shape, dtype))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(split_axis=2), ValueError, "split_axis must be 0"),
    (dict(split_axis="0"), TypeError, "split_axis must be an int"),
    (dict(split_axis=True), TypeError, "split_axis must be an int"),
    (dict(split_axis=0, concat_axis=-1), ValueError, "concat_axis must be 0"),
    (dict(comm_sms=-1), ValueError, "comm_sms"),
    (dict(comm_sms=2.0), TypeError, "comm_sms"),
])
def test_bad_arguments(fo, kw, exc, match):
    with pytest.raises(exc, match=match):
        _trace(fo, make_mesh_1d(4), (32, 16), (16, 32), **kw)


def test_rows_not_divisible(fo):
    with pytest.raises(ValueError, match=r"split_axis=0 needs the first dim of x.*divisible by the size 4"):
        _trace(fo, make_mesh_1d(4), (4 * 6, 16), (16, 32))  # 6 rows per device


def test_cols_not_divisible(fo):
    with pytest.raises(ValueError, match=r"split_axis=1 needs N .* divisible by the size 3"):
        _trace(fo, make_mesh_1d(3), (3 * 6, 16), (16, 32), split_axis=1)


def test_columns_need_2d_x(fo):
    with pytest.raises(ValueError, match="x must be 2-D"):
        body = lambda a, b: fo.matmul_all_to_all(a, b, "tp", split_axis=1, concat_axis=0)
        f = shard_map(body, make_mesh_1d(4), (P("tp", None, None), P()), P("tp", None, None))
        jax.jit(f).trace(jax.ShapeDtypeStruct((16, 2, 16), jnp.bfloat16),
                         jax.ShapeDtypeStruct((16, 32), jnp.bfloat16))


def test_bad_dtype_and_axis(fo):
    with pytest.raises(TypeError, match="dtype"):
        _trace(fo, make_mesh_1d(4), (32, 16), (16, 32), dtype=jnp.float32)
    with pytest.raises(fo.AxisNameError, match="'sp'"):
        f = shard_map(lambda a, b: fo.matmul_all_to_all(a, b, "sp"), make_mesh_1d(4),
                      (P("tp", None), P()), P("tp", None))
        jax.jit(f).trace(jax.ShapeDtypeStruct((32, 16), jnp.bfloat16),
                         jax.ShapeDtypeStruct((16, 32), jnp.bfloat16))


# ------------------------------------------------------------------ lowering

TARGET = "flashoverlap_gemm_all_to_all"


def _cuda_text(fo, mesh, x_shape, w_shape, split, concat):
    f = shard_map(_ours(fo, split, concat), mesh, (P("tp", None), P()), P("tp", None))
    args = (jax.ShapeDtypeStruct(x_shape, jnp.bfloat16), jax.ShapeDtypeStruct(w_shape, jnp.bfloat16))
    return lower_for_cuda(f, args)


def _calls(text):
    return custom_call_lines(text, TARGET)


@pytest.mark.parametrize("split,concat", AXES, ids=AXES_IDS)
def test_cuda_lowering_custom_call(fo, no_fallback, split, concat):
    n, M, K, N = 2, 4096, 4096, 8192  # per device x [M, K]
    text = _cuda_text(fo, make_mesh_1d(n), (n * M, K), (K, N), split, concat)
    calls = _calls(text)
    assert len(calls) == 1, text
    call = calls[0]
    for attr in ("comm_id", "comm_sms", "world_size", "band_rows"):
        assert re.search(rf"\b{attr}\b", call), call
    assert re.search(rf"split_axis = {split} : i32", call), call
    assert re.search(rf"concat_axis = {concat} : i32", call), call
    out = {(0, 0): (M, N), (1, 0): (n * M, N // n), (0, 1): (M // n, n * N), (1, 1): (M, N)}[(split, concat)]
    assert f"tensor<{out[0]}x{out[1]}xbf16>" in call, call


@pytest.mark.parametrize("split,concat", AXES, ids=AXES_IDS)
def test_cuda_lowering_asks_for_the_products_workspace(fo, no_fallback, monkeypatch, split,
                                                       concat):
    """Lowered for this machine's GPUs (the communicator calls faked and recorded here): one
    peer-to-peer communicator with a workspace of the product, M x N bf16, twice that with
    concat_axis=1."""
    from jax_flashoverlap import comm
    made = []
    monkeypatch.setattr(comm, "mesh_is_local_gpu", lambda mesh: True)
    monkeypatch.setattr(comm, "ensure_communicators", lambda *a, **k: made.append(k))
    n, M, K, N = 2, 4096, 4096, 8192
    assert len(_calls(_cuda_text(fo, make_mesh_1d(n), (n * M, K), (K, N), split, concat))) == 1
    assert [(k["workspace_bytes"], k["peer_to_peer"]) for k in made] == [
        (M * N * 2 * (2 if concat == 1 else 1), True)], made


def test_cuda_lowering_unsupported_shape_uses_reference(fo, no_fallback):
    """split_axis=1 with N/n not a multiple of 8: XLA's dot + all_to_all, no custom call."""
    text = _cuda_text(fo, make_mesh_1d(4), (4 * 64, 64), (64, 4 * 12), 1, 0)
    assert not _calls(text)
    assert "all_to_all" in text and "dot_general" in text


def test_cpu_lowering_is_reference(fo):
    f = shard_map(_ours(fo, 0, 0), make_mesh_1d(4), (P("tp", None), P()), P("tp", None))
    text = jax.jit(f).trace(jax.ShapeDtypeStruct((32, 16), jnp.bfloat16),
                            jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)).lower().as_text()
    assert TARGET not in text and "all_to_all" in text


def test_forced_plan(fo, monkeypatch):
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    with plan_a2a.forced(num_groups=3, comm_sms=16):
        text = _cuda_text(fo, make_mesh_1d(2), (2 * 4096, 4096), (4096, 8192), 0, 0)
    call = _calls(text)[0]
    assert "comm_sms = 16 : i32" in call
    assert re.search(r"band_rows = dense<\[0, \d+, \d+, 2048\]>", call), call
    with plan_a2a.forced(overlap=False):
        assert not _calls(_cuda_text(fo, make_mesh_1d(2), (2 * 4096, 4096), (4096, 8192), 0, 0))


# ------------------------------------------------------------------ plan

@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize("m,n,k,world", [(4096, 8192, 4096, 2), (8192, 8192, 4096, 2),
                                         (1000, 1024, 256, 4), (16384, 28672, 8192, 8)])
def test_plan_is_valid_and_deterministic(split, m, n, k, world):
    from jax_flashoverlap import plan_a2a
    p = plan_a2a.choose_a2a_plan(m, n, k, world, split, 0)
    assert p == plan_a2a.choose_a2a_plan(m, n, k, world, split, 0)
    rows = m // world if split == 0 else m
    assert p.rows_per_block == rows
    assert p.band_rows[0] == 0 and p.band_rows[-1] == rows
    assert all(b1 > b0 for b0, b1 in zip(p.band_rows, p.band_rows[1:]))
    assert 1 <= p.num_groups <= 64
    # a candidate (8, 16) or one raised to its wave boundary, with the GEMM's waves unchanged
    assert p.comm_sms in plan_a2a._comm_sms_candidates(m, n, plan_a2a.DEFAULT_PROFILE)
    assert 8 <= p.comm_sms <= 16
    assert p.predicted_s > 0 and p.baseline_s > 0


@pytest.mark.parametrize("split,concat", [(1, 0), (0, 1), (1, 1)], ids=AXES_IDS[1:])
def test_columns_need_2d_x_says_which_axes(fo, split, concat):
    """The op takes x [..., K] for (0, 0) only; the error for the other axes said just "x must
    be 2-D [M, K]", naming neither split_axis / concat_axis nor the (0, 0) that takes x of rank 3."""
    body = lambda a, b: fo.matmul_all_to_all(a, b, "tp", split_axis=split, concat_axis=concat)
    f = shard_map(body, make_mesh_1d(4), (P("tp", None, None), P()), P("tp", None, None))
    want = (rf"x must be 2-D \[M, K\] with split_axis={split}, concat_axis={concat} \(only "
            r"split_axis=concat_axis=0 takes x \[\.\.\., K\]\), got shape \(4, 2, 16\)")
    with pytest.raises(ValueError, match=want):
        jax.jit(f).trace(jax.ShapeDtypeStruct((16, 2, 16), jnp.bfloat16),
                         jax.ShapeDtypeStruct((16, 32), jnp.bfloat16))
