"""Global view: row_parallel_matmul under jax.jit with NamedSharding inputs, no shard_map.

x [M, K] sharded on K over one mesh axis, w [K, N] sharded on K over the same axis (or, with
transpose_w=True, w [N, K] sharded on its last dim: the product is x @ w.T).
all_reduce: output [M, N] replicated over that axis; reduce_scatter: rows sharded over it.
Other mesh axes (dp on M) pass through. Values equal x @ w computed by XLA with its own sharding.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, VMAPS, all_spec_axes, assert_close, assert_rel_fro,
                   check_against_refs, collectives, f32, make_mesh_1d, rand, spec_axes, upcast,
                   with_partitioner)


def _put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def _inputs(mesh, rng, dt, reduce, dp=False, transpose_w=False):
    tp = mesh.shape["tp"]
    ndp = mesh.shape["dp"] if dp else 1
    M = ndp * (5 if reduce == "all_reduce" else 3 * tp)  # odd M for all_reduce
    K, N = 16 * tp, 24
    x = rand(rng, (M, K), dt)
    x_spec = P("dp", "tp") if dp else P(None, "tp")
    if transpose_w:
        return _put(mesh, x, x_spec), _put(mesh, rand(rng, (N, K), dt), P(None, "tp"))
    return _put(mesh, x, x_spec), _put(mesh, rand(rng, (K, N), dt), P("tp", None))


def _check_out_sharding(out, reduce, dp):
    spec = out.sharding.spec
    axes = all_spec_axes(spec)
    row_axes = spec_axes(spec[0]) if len(spec) else ()
    if reduce == "all_reduce":
        assert "tp" not in axes, f"all_reduce output must be replicated over tp, got {spec}"
        if not dp:
            assert out.sharding.is_fully_replicated, spec
    else:
        assert "tp" in row_axes, f"reduce_scatter output rows must be sharded over tp, got {spec}"
        assert len(spec) < 2 or "tp" not in spec_axes(spec[1]), spec
    if dp:
        assert "dp" in row_axes, f"dp sharding of M must pass through, got {spec}"
    else:
        assert "dp" not in axes


def _shardy() -> bool:
    return bool(getattr(jax.config, "jax_use_shardy_partitioner", False))


def _rs_out_sharding(x):
    """The reduce-scatter layout: x's row axes, then the contracting axis 'tp'."""
    rows = spec_axes(x.sharding.spec[0]) + ("tp",)
    return NamedSharding(x.sharding.mesh, P(rows, None))


def _run(fo, x, w, reduce, axis_name, transpose_w=False):
    """The reduce-scatter's compiled program must hold no all-gather: the rows stay where the
    reduce-scatter put them. Under Shardy with several mesh axes and no axis_name, the
    contracting axis is unknown to the sharding rule, so the layout is asked for with
    out_shardings there (README, docs/DESIGN.md); everywhere else it is inferred."""
    fn = lambda a, b: fo.row_parallel_matmul(a, b, reduce=reduce, axis_name=axis_name,
                                             transpose_w=transpose_w)
    if reduce == "reduce_scatter":
        ask = _shardy() and axis_name is None and len(x.sharding.mesh.axis_names) > 1
        f = jax.jit(fn, out_shardings=_rs_out_sharding(x)) if ask else jax.jit(fn)
        hlo = f.lower(x, w).compile().as_text()
        assert "all-gather" not in hlo, "reduce_scatter output was gathered"
        assert "reduce-scatter" in hlo or "all-reduce" not in hlo
        return f(x, w)
    return jax.jit(fn)(x, w)


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("dp", [False, True], ids=["tp", "dp_tp"])
def test_global_view_gspmd_infers_reduce_scatter_rows(fo, dp, transpose_w, rng):
    """With GSPMD the partitioner infers the row-sharded output itself (no out_shardings)."""
    from _util import make_mesh_2d, with_partitioner

    mesh = make_mesh_2d(2, 4) if dp else make_mesh_1d(4)
    x, w = _inputs(mesh, rng, jnp.bfloat16, "reduce_scatter", dp=dp, transpose_w=transpose_w)
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce="reduce_scatter",
                                                    transpose_w=transpose_w))
    out, hlo = with_partitioner(True, lambda: (f(x, w), f.lower(x, w).compile().as_text()))
    assert "all-gather" not in hlo
    check_against_refs(out, _xla(x, w, transpose_w), _np(x, w, transpose_w))
    _check_out_sharding(out, "reduce_scatter", dp=dp)


def _xla(x, w, transpose_w=False):
    return jax.jit(lambda a, b: a @ (b.T if transpose_w else b))(x, w)


def _np(x, w, transpose_w=False):
    return np.matmul(f32(x), f32(w).T if transpose_w else f32(w))


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_global_view_1d(fo, tp_mesh, reduce, transpose_w, rng):
    x, w = _inputs(tp_mesh, rng, jnp.bfloat16, reduce, transpose_w=transpose_w)
    out = _run(fo, x, w, reduce, None, transpose_w)
    assert out.shape == (x.shape[0], 24) and out.dtype == x.dtype
    if transpose_w:  # w [N, K] is used as sharded (P(None, tp)): no reshard of it
        hlo = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce=reduce, transpose_w=True)
                      ).lower(x, w).compile().as_text()
        assert "all-gather" not in hlo and "all-to-all" not in hlo, hlo
    check_against_refs(out, _xla(x, w, transpose_w), _np(x, w, transpose_w))
    _check_out_sharding(out, reduce, dp=False)


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
def test_k_sharded_on_w_only_picks_w_axis(fo, mesh4, transpose_w, gspmd, rng):
    """x replicated, w's K over tp (its first dim, or its last with transpose_w): the
    contracting axis is w's, so the reduce-scatter's output rows come out over it."""
    x = _put(mesh4, rand(rng, (12, 64), jnp.bfloat16), P())
    w = _put(mesh4, rand(rng, (24, 64) if transpose_w else (64, 24), jnp.bfloat16,
                           scale=64 ** -0.5), P(None, "tp") if transpose_w else P("tp", None))
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter",
                                                    transpose_w=transpose_w))
    out = with_partitioner(gspmd, lambda: f(x, w))
    assert out.shape == (12, 24), out.shape
    check_against_refs(out, _xla(x, w, transpose_w), _np(x, w, transpose_w))
    _check_out_sharding(out, "reduce_scatter", dp=False)


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_k_not_sharded_is_a_local_dot_keeping_the_rows(fo, reduce, gspmd, rng):
    """K sharded nowhere: no contracting axis, nothing to reduce (or scatter): XLA's local dot,
    x's rows keep their data-parallel axis and nothing moves."""
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (16, 64), jnp.bfloat16), P("dp", None))
    w = _put(mesh, rand(rng, (64, 24), jnp.bfloat16, scale=64 ** -0.5), P())
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce))
    out, colls = with_partitioner(gspmd, lambda: (f(x, w), collectives(f, x, w)))
    assert tuple(out.sharding.spec) + (None,) * (2 - len(out.sharding.spec)) == ("dp", None)
    assert colls == [], colls
    check_against_refs(out, _xla(x, w), _np(x, w))


@pytest.mark.parametrize("dp", [False, True], ids=["tp", "dp_tp"])
def test_all_reduce_rows_a_multiple_of_the_mesh_stay_whole(fo, dp, rng):
    """all_reduce with M a multiple of dp * tp (where the reduce-scatter's rule would split
    the rows): the output is replicated over tp, after one all-reduce and nothing else."""
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4) if dp else make_mesh_1d(4)
    x = _put(mesh, rand(rng, (16, 64), jnp.bfloat16), P("dp", "tp") if dp else P(None, "tp"))
    w = _put(mesh, rand(rng, (64, 24), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, "all_reduce", "tp"))
    out, colls = f(x, w), collectives(f, x, w)
    assert colls == ["all-reduce"], colls
    _check_out_sharding(out, "all_reduce", dp=dp)
    check_against_refs(out, _xla(x, w), _np(x, w))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_global_view_explicit_axis_name(fo, mesh4, reduce, dtype, rng):
    x, w = _inputs(mesh4, rng, dtype, reduce)
    out = _run(fo, x, w, reduce, "tp")
    check_against_refs(out, _xla(x, w), np.matmul(f32(x), f32(w)))
    _check_out_sharding(out, reduce, dp=False)


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("axis_name", [None, "tp"], ids=["infer_axis", "axis_tp"])
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_global_view_2d_dp_tp(fo, mesh2d, reduce, axis_name, transpose_w, rng):
    x, w = _inputs(mesh2d, rng, jnp.bfloat16, reduce, dp=True, transpose_w=transpose_w)
    assert x.sharding.spec == P("dp", "tp")
    out = _run(fo, x, w, reduce, axis_name, transpose_w)
    check_against_refs(out, _xla(x, w, transpose_w), _np(x, w, transpose_w))
    _check_out_sharding(out, reduce, dp=True)


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_global_view_output_feeds_next_op(fo, mesh4, reduce, rng):
    """The output is a normal sharded array inside the same jit (used by following XLA ops)."""
    x, w = _inputs(mesh4, rng, jnp.bfloat16, reduce)

    def f(a, b):
        y = fo.row_parallel_matmul(a, b, reduce=reduce)
        return jnp.tanh(y) * 2

    got = jax.jit(f)(x, w)
    want = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2)(x, w)
    assert_close(got, want)


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("dp", [False, True], ids=["tp", "dp_tp"])
def test_global_view_grad(fo, reduce, dp, transpose_w, rng):
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4) if dp else make_mesh_1d(4)
    x, w = _inputs(mesh, rng, jnp.bfloat16, reduce, dp=dp, transpose_w=transpose_w)
    ct = jnp.asarray(rng.standard_normal((x.shape[0], 24), dtype=np.float32))

    def grads(mm, a, b):
        loss = lambda a, b: jnp.sum(mm(a, b).astype(jnp.float32) * ct)
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b)

    got = grads(lambda a, b: fo.row_parallel_matmul(a, b, reduce=reduce,
                                                    transpose_w=transpose_w), x, w)
    ref = lambda a, b: a @ (b.T if transpose_w else b)  # noqa: E731
    want = grads(ref, x, w)
    want32 = grads(ref, *upcast(x, w))
    for g, r, r32, a in zip(got, want, want32, (x, w)):
        assert g.shape == a.shape and g.dtype == a.dtype
        assert_close(g, r)
        assert_rel_fro(g, r32)


# Mesh shapes and x layouts away from the documented P(dp, tp). Shardy's rule splits x's rows
# into the data-parallel factor d and the rest; with rows over tp and tp larger than d (2x4),
# Shardy splits tp into sub-axes that no PartitionSpec expresses, which crashed inside JAX
# (custom_partitioner: KeyError) before the partitioner decoded the shardings itself.
_MESH_SHAPES = [(2, 4), (4, 2), (8, 1), (1, 8)]
_ROW_X_SPECS = [P("tp", None), P(("tp", "dp"), None), P("dp", "tp"), P("tp", "dp")]


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("x_spec", _ROW_X_SPECS, ids=str)
@pytest.mark.parametrize("shape", _MESH_SHAPES, ids=lambda s: f"dp{s[0]}xtp{s[1]}")
def test_any_mesh_shape_and_x_layout_gives_xla_values(fo, shape, x_spec, reduce, rng):
    from _util import make_mesh_2d

    mesh = make_mesh_2d(*shape)
    x = _put(mesh, rand(rng, (64, 128), jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (128, 64), jnp.bfloat16, scale=128 ** -0.5), P("tp", None))
    out = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce, axis_name="tp"))(x, w)
    assert out.shape == (64, 64) and out.dtype == jnp.bfloat16
    check_against_refs(out, _xla(x, w), _np(x, w))


# jax.vmap of the global view over x (directly, of jit, of checkpoint, nested): the op again on
# x with the batch as a new leading dim, its sequence dim one further (a custom_vmap inside
# the custom_jvp). Before, custom_partitioning had no batching rule: a direct vmap got our
# NotImplementedError, vmap of jit / checkpoint JAX's own. x as the README's table says:
# rows P(None, tp) on a 1-D mesh, Megatron's [S, B, K] P(None, dp, tp) on a (dp, tp) mesh.
_VMAP_LAYOUTS = [
    # (mesh, x shape without the batch, x spec, output spec per reduce)
    ((4,), (12, 64), P(None, "tp"), {"all_reduce": P(), "reduce_scatter": P("tp")}),
    ((2, 4), (16, 4, 64), P(None, "dp", "tp"),
     {"all_reduce": P(None, "dp"), "reduce_scatter": P("tp", "dp")}),
]


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("how", VMAPS)
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("mesh_shape,shape,x_spec,out_specs", _VMAP_LAYOUTS,
                         ids=["rows-tp", "megatron-dp-tp"])
def test_vmap_over_x(fo, rng, mesh_shape, shape, x_spec, out_specs, reduce, how, gspmd):
    from _util import collectives, make_mesh_2d, vmapped, with_partitioner

    mesh = make_mesh_1d(*mesh_shape) if len(mesh_shape) == 1 else make_mesh_2d(*mesh_shape)
    batch = (2, 3) if how == "nested" else (3,)
    x = _put(mesh, rand(rng, batch + shape, jnp.bfloat16), P(*(None,) * len(batch), *x_spec))
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))
    f = jax.jit(vmapped(lambda a, b: fo.row_parallel_matmul(a, b, reduce, "tp"), how))
    out, colls = with_partitioner(gspmd, lambda: (f(x, w), collectives(f, x, w)))
    want = P(*(None,) * len(batch), *out_specs[reduce])
    ndim = len(batch) + len(shape)
    assert out.shape == (*batch, *shape[:-1], 32)
    got = tuple(out.sharding.spec) + (None,) * (ndim - len(out.sharding.spec))
    assert got == tuple(want) + (None,) * (ndim - len(want)), out.sharding.spec
    assert colls == [reduce.replace("_", "-")], colls
    check_against_refs(out, _xla(x, w), _np(x, w))


@pytest.mark.parametrize("how", ["direct", "of_checkpoint", "nested"])
@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_vmap_over_x_derivatives(fo, mesh4, rng, reduce, how):
    """grad of a vmapped loss, vmap of grad, jvp and linearize of the vmap: those of x @ w."""
    from _util import vmapped

    batch = (2, 3) if how == "nested" else (3,)
    x = _put(mesh4, rand(rng, batch + (8, 64), jnp.bfloat16), P(*(None,) * len(batch), None,
                                                                "tp"))
    w = _put(mesh4, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))
    ct = jnp.asarray(rng.standard_normal(batch + (8, 32)), jnp.float32)
    ours = lambda a, b: fo.row_parallel_matmul(a, b, reduce)  # noqa: E731
    ref = lambda a, b: a @ b  # noqa: E731

    def derivatives(mm):
        vm = vmapped(mm, how)
        loss = lambda a, b: jnp.sum(vm(a, b).astype(jnp.float32) * ct)  # noqa: E731
        one = lambda a, b: jnp.sum(jnp.sin(mm(a, b).astype(jnp.float32)))  # noqa: E731
        _, lin = jax.linearize(vm, x, w)
        return (jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w),
                jax.jit(vmapped(jax.grad(one, argnums=(0, 1)), how))(x, w),
                jax.jit(lambda a, b: jax.jvp(vm, (a, b), (a, b)))(x, w), lin(x, w))

    for g, r in zip(jax.tree.leaves(derivatives(ours)), jax.tree.leaves(derivatives(ref))):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


@pytest.mark.parametrize("how", VMAPS)
def test_vmap_over_w_is_refused_naming_the_function(fo, mesh4, rng, how):
    x = _put(mesh4, rand(rng, (8, 64), jnp.bfloat16), P(None, "tp"))
    w = _put(mesh4, rand(rng, (2, 3, 64, 32), jnp.bfloat16), P(None, None, "tp", None))
    f = lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter")  # noqa: E731
    f = {"of_jit": jax.jit, "of_checkpoint": jax.checkpoint}.get(how, lambda g: g)(f)
    f = jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(None, 0)) if how == "nested" else \
        jax.vmap(f, in_axes=(None, 0))
    if how != "nested":
        w = w[0]
    with pytest.raises(NotImplementedError, match=r"row_parallel_matmul: jax.vmap over w is not "
                       r"supported .* vmap over x only \(in_axes=\(0, None\)\)"):
        jax.jit(f)(x, w)


@pytest.mark.parametrize("dp", [False, True], ids=["tp", "dp_tp"])
def test_reduce_scatter_one_row_per_device(fo, dp, rng):
    """M == dp * tp (one output row per device): the Shardy rule has no size-1 rows factor
    (Shardy refused it: 'dim mapping can't have a factor of size 1', an MLIR verifier error
    that RowParallelLinear(reduce='reduce_scatter') under jit hit at M == tp)."""
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4) if dp else make_mesh_1d(4)
    M = 8 if dp else 4
    x = _put(mesh, rand(rng, (M, 64), jnp.bfloat16), P("dp", "tp") if dp else P(None, "tp"))
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))
    out = _run(fo, x, w, "reduce_scatter", "tp")
    check_against_refs(out, _xla(x, w), _np(x, w))
    _check_out_sharding(out, "reduce_scatter", dp=dp)


# x with its leading dims kept (not flattened to rows). Flattening [S, B] with B over dp
# (more than one row per device) is not rows over dp: before, the all-reduce came back
# replicated over dp and the reduce-scatter replicated, after gathers around the op.
_LEADING_DIMS = [
    # (x shape, x spec, reduce, sequence_dim, output spec)
    ((16, 4, 64), P(None, "dp", "tp"), "all_reduce", 0, P(None, "dp", None)),
    ((16, 4, 64), P(None, "dp", "tp"), "reduce_scatter", 0, P("tp", "dp", None)),  # Megatron
    ((4, 16, 64), P("dp", None, "tp"), "all_reduce", 0, P("dp", None, None)),
    ((4, 16, 64), P("dp", None, "tp"), "reduce_scatter", 1, P("dp", "tp", None)),  # [B, S]
    ((4, 16, 64), P("dp", None, "tp"), "reduce_scatter", -1, P("dp", "tp", None)),
    ((2, 4, 8, 64), P(None, "dp", None, "tp"), "reduce_scatter", 2, P(None, "dp", "tp", None)),
    ((8, 2, 64), P(None, "dp", "tp"), "reduce_scatter", 0, P("tp", "dp", None)),  # S == 2 * tp
    ((4, 2, 64), P(None, "dp", "tp"), "reduce_scatter", 0, P("tp", "dp", None)),  # S == tp
    # S (dim 1) whole on each device, B over dp: S / tp = 3, S / (dp * tp) would not divide
    ((4, 12, 64), P("dp", None, "tp"), "reduce_scatter", 1, P("dp", "tp", None)),
]


@pytest.fixture
def lowered_ops(monkeypatch):
    """(op name, sequence_dim) of each per-device op the partitioner lowers."""
    from jax_flashoverlap import ops
    seen = []
    for name in ("matmul_all_reduce", "matmul_reduce_scatter"):
        def spy(*args, _real=getattr(ops, name), _name=name, **kwargs):
            seen.append((_name, kwargs.get("sequence_dim", 0)))
            return _real(*args, **kwargs)
        monkeypatch.setattr(ops, name, spy)
    return seen


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("shape,x_spec,reduce,sequence_dim,out_spec", _LEADING_DIMS,
                         ids=lambda v: str(v).replace(" ", ""))
def test_leading_dims_keep_their_layout(fo, rng, lowered_ops, shape, x_spec, reduce,
                                        sequence_dim, out_spec, gspmd):
    from _util import make_mesh_2d, with_partitioner

    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, shape, jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce, "tp",
                                                    sequence_dim=sequence_dim))
    out, hlo = with_partitioner(gspmd, lambda: (f(x, w), f.lower(x, w).compile().as_text()))
    op = "matmul_" + reduce
    want = (op, sequence_dim % (len(shape) - 1) if reduce == "reduce_scatter" else 0)
    assert lowered_ops and set(lowered_ops) == {want}, lowered_ops  # once per compilation
    got = tuple(out.sharding.spec) + (None,) * (len(shape) - len(out.sharding.spec))
    assert out.shape == (*shape[:-1], 32) and got == tuple(out_spec), out.sharding.spec
    assert "all-gather" not in hlo and "all-to-all" not in hlo, "x or the output was moved"
    check_against_refs(out, _xla(x, w), _np(x, w))


def test_leading_dims_grads(fo, rng):
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (4, 16, 64), jnp.bfloat16), P("dp", None, "tp"))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16), P(None, "tp"))
    ct = jnp.asarray(rng.standard_normal((4, 16, 32)), jnp.float32)

    def grads(f):
        return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(x, w)

    ours = grads(lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter", "tp",
                                                     transpose_w=True, sequence_dim=1))
    for g, r in zip(ours, grads(lambda a, b: a @ b.T)):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


@pytest.mark.parametrize("shape,x_spec,local", [
    ((4, 16, 64), P("dp", None, "tp"), 2),
    ((6, 4, 64), P(None, "dp", "tp"), 6),  # S itself not a multiple of tp (Shardy's rule too)
], ids=["B-over-dp", "S-6"])
def test_leading_dims_scatter_dim_not_divisible_names_sequence_dim(fo, rng, shape, x_spec,
                                                                  local):
    """[B, S, K] with B = 2 per device: the default sequence_dim 0 cannot be scattered over
    tp = 4; the error says so and points at sequence_dim."""
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, shape, jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16), P("tp", None))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"reduce_scatter needs dim 0 \(the sequence_dim\) of each shard "
                             rf"\({local}\) to be divisible by the size 4 of axis 'tp'; "
                             r"sequence_dim names the leading dim of x to scatter"):
        jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter", "tp"))(x, w)


@pytest.mark.parametrize("shape,sequence_dim,what", [
    ((6, 64), 0, r"the rows of x \(shape \(6, 64\)\)"),
    ((8, 6, 64), 1, r"dim 1 \(the sequence_dim\) of x \(shape \(8, 6, 64\)\)"),
], ids=["rows", "sequence_dim_1"])
def test_scatter_dim_not_divisible_is_caught_at_trace_time_under_set_mesh(fo, shape,
                                                                          sequence_dim, what):
    """axis_name and a mesh in context (jax.set_mesh): the mesh gives the axis' size at trace
    time, so the error comes from tracing, before XLA partitions anything (the partitioner
    would raise it only at compile time, inside JAX's runtime error)."""
    from _util import make_mesh_2d

    sds = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16)  # noqa: E731
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter", "tp",
                                                    sequence_dim=sequence_dim))
    with jax.set_mesh(make_mesh_2d(2, 4)):
        with pytest.raises(ValueError, match=what + r" to be divisible by the size 4 of "
                                                    r"axis 'tp'"):
            f.trace(sds(shape), sds((64, 32)))
        f.trace(sds((8,) + shape[1:]) if sequence_dim == 0 else sds((8, 8, 64)),
                sds((64, 32)))  # divisible: traces

# x [S, B, K] with S itself over dp (P(dp, None, tp)) and scattered over tp too. GSPMD infers
# the output's S over (dp, tp); Shardy's rule sees shapes, not shardings, and takes dp on
# another leading dim (the layouts above, which a rule keeping S's dp share would break: the
# output's S could not take tp while that share is unsharded), so there the output loses the
# share after a gather unless it is constrained (README): then one reduce-scatter.
@pytest.mark.parametrize("constrain", [False, True], ids=["inferred", "constrained"])
@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("shape", [(16, 4, 64), (8, 4, 64), (16, 1, 64)],
                         ids=lambda s: "x" + "x".join(map(str, s)))
def test_sequence_dim_over_dp_and_tp(fo, rng, shape, gspmd, constrain):
    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, shape, jnp.bfloat16), P("dp", None, "tp"))
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))
    out_spec = P(("dp", "tp"), None, None)
    fn = lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter", "tp")  # noqa: E731
    f = jax.jit(fn, out_shardings=NamedSharding(mesh, out_spec)) if constrain else jax.jit(fn)
    out, colls = with_partitioner(gspmd, lambda: (f(x, w), collectives(f, x, w)))
    assert out.shape == (*shape[:-1], 32)
    check_against_refs(out, _xla(x, w), _np(x, w))
    if gspmd or constrain:
        got = tuple(out.sharding.spec) + (None,) * (3 - len(out.sharding.spec))
        assert got == tuple(out_spec), out.sharding.spec
        assert colls == ["reduce-scatter"], colls


# x's rows not over the other mesh axes (x P(None, tp) on a (dp, tp) mesh): Shardy's rule
# cannot shard the reduce-scatter's output rows over tp while their dp share is unsharded
# (README), so the program wants the output replicated and XLA all-gathers it after the op.
# The partitioner warns with the constraint that keeps it scattered; with it, no warning and
# one reduce-scatter; x's rows over dp: no warning.
@pytest.mark.parametrize("case", ["replicated", "constrained", "rows_over_dp",
                                  "constrained_to_move"])
def test_reduce_scatter_wanted_replicated_warns(fo, rng, case):
    import warnings

    from _util import make_mesh_2d

    mesh = make_mesh_2d(2, 4)
    x_spec = P("dp", "tp") if case == "rows_over_dp" else P(None, "tp")
    x = _put(mesh, rand(rng, (16, 64), jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (64, 24), jnp.bfloat16, scale=64 ** -0.5), P("tp", None))

    def fn(a, b):
        y = fo.row_parallel_matmul(a, b, "reduce_scatter", axis_name="tp")
        if case == "constrained":
            y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("tp", None)))
        if case == "constrained_to_move":  # rows in 8 blocks: most not where they were reduced
            y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(("dp", "tp"), None)))
        return y

    f = jax.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, colls = f(x, w), collectives(f, x, w)
    said = [str(c.message) for c in caught if "more collectives after the op" in str(c.message)]
    check_against_refs(out, _xla(x, w), _np(x, w))
    if case == "replicated":
        assert said and "P('tp', None)" in said[0] and "reduce='all_reduce'" in said[0], said
        assert tuple(out.sharding.spec) in ((), (None,), (None, None)), out.sharding.spec
        assert colls == ["reduce-scatter", "all-gather"], colls
    elif case == "constrained_to_move":  # what the user asked for, at a price it names
        assert said and "P('tp', None)" in said[0] and "all_reduce" not in said[0], said
        assert colls == ["reduce-scatter", "collective-permute"], colls
    else:
        assert not said, said
        assert colls == ["reduce-scatter"], colls


# x's rows that the data-parallel axis does not divide (10 rows over dp=4, a layout XLA pads:
# blocks of 3, 3, 3, 1): the reduce-scatter's partitioner compared the layout the program
# wants (P(dp, None), uneven) with the op's through devices_indices_map, which raises
# IndivisibleError there, and the whole compile failed with JAX's `INTERNAL: custom_partitioner:
# ... IndivisibleError` (XLA's own x @ w takes the layout). Now: XLA's values and the warning.
@pytest.mark.parametrize("rows", [10, 6, 18])
def test_reduce_scatter_rows_uneven_over_dp_give_xla_values(fo, rng, rows):
    import warnings

    from _util import make_mesh_2d

    mesh = make_mesh_2d(4, 2)
    x = rand(rng, (rows, 32), jnp.bfloat16)
    w = rand(rng, (32, 16), jnp.bfloat16, scale=32 ** -0.5)

    @jax.jit
    def f(a, b):
        a = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P("dp", "tp")))
        b = jax.lax.with_sharding_constraint(b, NamedSharding(mesh, P("tp", None)))
        return fo.row_parallel_matmul(a, b, "reduce_scatter", axis_name="tp")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the layout warning (the output is wanted over dp)
        out = f(x, w)
        grads = jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b).astype(jnp.float32))), (0, 1))(x, w)
    check_against_refs(out, _xla(x, w), _np(x, w))
    want = jax.grad(lambda a, b: jnp.sum(jnp.sin((a @ b).astype(jnp.float32))), (0, 1))(x, w)
    for got, ref in zip(grads, want):
        assert_rel_fro(got, f32(ref))
