"""Global view of the sequence-parallel column GEMM: column_parallel_matmul under jax.jit with
NamedSharding inputs, no shard_map.

x [M, K] with its rows sharded over tp (and any data-parallel axes), w [K, N] with N sharded
over tp (w [N, K] sharded on its first dim with transpose_w=True): per device
all_gather_matmul, the output [M, N] with N over tp and the rows over the other axes. Values
equal x @ w computed by XLA; the compiled program gathers x once and moves nothing else.
x [S, B, K] (any rank) keeps its leading dims: the sequence dim (the first, or sequence_dim)
is gathered, the others keep their data-parallel sharding.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, assert_rel_fro, make_mesh_1d,
                   make_mesh_2d, rand, upcast)
from _util import VMAPS, vmapped, with_partitioner
from _util import collectives as _collectives


def _put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def _run(fo, x, w, axis_name=None, transpose_w=False):
    f = jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, axis_name,
                                                       transpose_w=transpose_w))
    return f(x, w), _collectives(f, x, w)


def _want(x, w, transpose_w=False):
    return jnp.matmul(x, w.T if transpose_w else w)


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [2, 4, 8], ids=lambda n: f"tp{n}")
def test_values_and_layout(fo, rng, n, dtype, transpose_w):
    mesh = make_mesh_1d(n)
    M, K, N = 3 * n, 40, 16 * n
    x = _put(mesh, rand(rng, (M, K), dtype), P("tp", None))
    w_global = rand(rng, (N, K) if transpose_w else (K, N), dtype, scale=K ** -0.5)
    w = _put(mesh, w_global, P("tp", None) if transpose_w else P(None, "tp"))
    y, colls = _run(fo, x, w, transpose_w=transpose_w)
    assert y.shape == (M, N) and y.dtype == dtype
    assert y.sharding.spec == P(None, "tp"), y.sharding.spec
    assert colls == ["all-gather"], colls  # x's rows gathered once, nothing else moved
    assert_close(y, jax.jit(_want, static_argnums=2)(x, w, transpose_w))
    assert_rel_fro(y, jax.jit(_want, static_argnums=2)(*upcast(x, w), transpose_w))


def test_data_parallel_rows_pass_through(fo, rng):
    """x rows P((dp, tp)): gathered over tp only, the output rows stay over dp."""
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (2 * 4 * 3, 32), jnp.bfloat16), P(("dp", "tp"), None))
    w = _put(mesh, rand(rng, (32, 4 * 8), jnp.bfloat16), P(None, "tp"))
    y, colls = _run(fo, x, w, axis_name="tp")
    assert y.sharding.spec == P("dp", "tp"), y.sharding.spec
    assert colls == ["all-gather"], colls
    assert_close(y, jax.jit(_want)(x, w))


def test_rows_not_sharded_over_the_axis_is_a_local_dot(fo, rng):
    """x replicated over tp (rows over dp only): nothing to gather, no communication."""
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (2 * 5, 32), jnp.bfloat16), P("dp", None))
    w = _put(mesh, rand(rng, (32, 4 * 8), jnp.bfloat16), P(None, "tp"))
    y, colls = _run(fo, x, w, axis_name="tp")
    assert y.sharding.spec == P("dp", "tp") and colls == [], (y.sharding.spec, colls)
    assert_close(y, jax.jit(_want)(x, w))


def test_grads_equal_those_of_x_at_w(fo, rng):
    mesh = make_mesh_1d(4)
    x = _put(mesh, rand(rng, (12, 32), jnp.bfloat16), P("tp", None))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16), P(None, "tp"))
    ct = jnp.asarray(rng.standard_normal((12, 64)), jnp.float32)

    def grads(f):
        return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(x, w)

    for g, r in zip(grads(fo.column_parallel_matmul), grads(jnp.matmul)):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


# Errors found in the custom partitioner (which knows the shardings) come back wrapped by XLA
# as JaxRuntimeError, the ValueError's message kept (as row_parallel_matmul's).
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(axis_name=3), TypeError, "axis_name must be a mesh axis name"),
    (dict(axis_name="sp"), jax.errors.JaxRuntimeError,
     "axis_name 'sp' is not an axis of the mesh \\('tp',\\)"),
    (dict(transpose_w=1), TypeError, "transpose_w must be a bool"),
])
def test_bad_arguments(fo, rng, kwargs, exc, match):
    mesh = make_mesh_1d(4)
    x = _put(mesh, rand(rng, (8, 32), jnp.bfloat16), P("tp", None))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16), P(None, "tp"))
    with pytest.raises(exc, match=match):
        jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, **kwargs))(x, w)


def test_n_sharded_over_two_axes_needs_axis_name(fo, rng):
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (16, 32), jnp.bfloat16), P("tp", None))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16), P(None, ("dp", "tp")))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"N is sharded over several mesh axes \('dp', 'tp'\); pass axis_name"):
        jax.jit(lambda a, b: fo.column_parallel_matmul(a, b))(x, w)


def test_bad_shapes_are_caught_at_trace_time(fo):
    sds = jax.ShapeDtypeStruct
    with pytest.raises(ValueError, match="contracting dims differ"):
        jax.jit(fo.column_parallel_matmul).trace(sds((8, 32), jnp.bfloat16),
                                                 sds((24, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"x must have at least 2 dims \[\.\.\., K\]"):
        jax.jit(fo.column_parallel_matmul).trace(sds((32,), jnp.bfloat16),
                                                 sds((32, 64), jnp.bfloat16))


@pytest.mark.parametrize("sequence_dim,exc,match", [
    (2, ValueError, r"sequence_dim=2 is not a leading dim of x \(3-D: \[\.\.\., K\] has "
                    r"leading dims 0\.\.1, or -2\.\.-1\)"),
    (-3, ValueError, "sequence_dim=-3 is not a leading dim of x"),
    (True, TypeError, "sequence_dim must be an int"),
    (1.0, TypeError, "sequence_dim must be an int"),
])
def test_bad_sequence_dim_is_caught_at_trace_time(fo, sequence_dim, exc, match):
    sds = jax.ShapeDtypeStruct
    f = jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, sequence_dim=sequence_dim))
    with pytest.raises(exc, match=r"column_parallel_matmul: " + match):
        f.trace(sds((2, 8, 32), jnp.bfloat16), sds((32, 64), jnp.bfloat16))


# Mesh shapes and x layouts away from the documented rows P((dp, tp)): with x's rows over tp
# and tp larger than the data-parallel factor of Shardy's rule (2x4), Shardy splits tp into
# sub-axes no PartitionSpec expresses, which crashed inside JAX (custom_partitioner: KeyError).
@pytest.mark.parametrize("axis_name", [None, "tp"], ids=["infer_axis", "axis_tp"])
@pytest.mark.parametrize("x_spec", [P("tp", None), P(("tp", "dp"), None), P(("dp", "tp"), None),
                                    P("dp", None)], ids=str)
@pytest.mark.parametrize("shape", [(2, 4), (4, 2), (8, 1), (1, 8)],
                         ids=lambda s: f"dp{s[0]}xtp{s[1]}")
def test_any_mesh_shape_and_x_layout_gives_xla_values(fo, rng, shape, x_spec, axis_name):
    mesh = make_mesh_2d(*shape)
    x = _put(mesh, rand(rng, (64, 128), jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (128, 64), jnp.bfloat16, scale=128 ** -0.5), P(None, "tp"))
    y = jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, axis_name))(x, w)
    assert y.shape == (64, 64) and y.dtype == jnp.bfloat16
    assert_close(y, jax.jit(_want)(x, w))
    assert_rel_fro(y, jax.jit(_want)(*upcast(x, w)))


# jax.vmap of the global view over x (directly, of jit, of checkpoint, nested): the op again on
# x with the batch as a new leading dim, its sequence dim one further (a custom_vmap inside
# the custom_jvp). Before, a direct vmap got our NotImplementedError, vmap of jit / checkpoint
# JAX's own (custom_partitioning has no batching rule). x as the README's table says: rows
# P(tp) on a 1-D mesh, Megatron's [S, B, K] P(tp, dp, None) on a (dp, tp) mesh.
@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("how", VMAPS)
@pytest.mark.parametrize("mesh_shape,shape,x_spec,out_spec", [
    ((4,), (12, 32), P("tp", None), P(None, "tp")),
    ((2, 4), (16, 4, 32), P("tp", "dp", None), P(None, "dp", "tp")),
], ids=["rows-tp", "megatron-dp-tp"])
def test_vmap_over_x(fo, rng, gathered_dims, mesh_shape, shape, x_spec, out_spec, how, gspmd):
    mesh = make_mesh_1d(*mesh_shape) if len(mesh_shape) == 1 else make_mesh_2d(*mesh_shape)
    batch = (2, 3) if how == "nested" else (3,)
    x = _put(mesh, rand(rng, batch + shape, jnp.bfloat16), P(*(None,) * len(batch), *x_spec))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16, scale=32 ** -0.5), P(None, "tp"))
    f = jax.jit(vmapped(lambda a, b: fo.column_parallel_matmul(a, b, "tp"), how))
    y, colls = with_partitioner(gspmd, lambda: (f(x, w), _collectives(f, x, w)))
    assert set(gathered_dims) == {len(batch)}, gathered_dims  # the op's own gather
    ndim = len(batch) + len(shape)
    want = (None,) * len(batch) + tuple(out_spec) + (None,) * (len(shape) - len(out_spec))
    got = tuple(y.sharding.spec) + (None,) * (ndim - len(y.sharding.spec))
    assert y.shape == (*batch, *shape[:-1], 64) and got == want, y.sharding.spec
    assert colls == ["all-gather"], colls
    assert_close(y, jax.jit(_want)(x, w))


@pytest.mark.parametrize("how", ["direct", "of_jit", "nested"])
def test_vmap_over_x_grads(fo, rng, how):
    """grad of a vmapped loss and vmap of grad: those of x @ w."""
    mesh = make_mesh_1d(4)
    batch = (2, 3) if how == "nested" else (3,)
    x = _put(mesh, rand(rng, batch + (8, 32), jnp.bfloat16), P(*(None,) * len(batch), "tp"))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16, scale=32 ** -0.5), P(None, "tp"))
    ct = jnp.asarray(rng.standard_normal(batch + (8, 64)), jnp.float32)

    def grads(mm):
        loss = lambda a, b: jnp.sum(vmapped(mm, how)(a, b).astype(jnp.float32) * ct)  # noqa
        one = lambda a, b: jnp.sum(jnp.sin(mm(a, b).astype(jnp.float32)))  # noqa: E731
        return (jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w),
                jax.jit(vmapped(jax.grad(one, argnums=(0, 1)), how))(x, w))

    for g, r in zip(jax.tree.leaves(grads(fo.column_parallel_matmul)),
                    jax.tree.leaves(grads(jnp.matmul))):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


# Shardy's rule takes every mesh axis but the gather axis as data parallel (x rows P((dp, tp))):
# with x's rows over tp only, or a mesh axis that does not shard them (pp), the output came
# back replicated or with N whole, after more all-gathers (README). A constraint on the output
# gives the documented layout with one all-gather.
@pytest.mark.parametrize("shape,names,x_spec,out_spec", [
    ((2, 4), ("dp", "tp"), P("tp", None), P(None, "tp")),
    ((4, 2), ("dp", "tp"), P("tp", None), P(None, "tp")),
    ((2, 2, 2), ("dp", "tp", "pp"), P(("dp", "tp"), None), P("dp", "tp")),
], ids=["dp2xtp4-rows-tp", "dp4xtp2-rows-tp", "dp-tp-pp-rows-dp-tp"])
def test_output_constraint_gives_the_layout_with_one_gather(fo, rng, shape, names, x_spec,
                                                            out_spec):
    from jax.sharding import Mesh
    mesh = Mesh(np.array(jax.devices("cpu")[:8]).reshape(shape), names)
    x = _put(mesh, rand(rng, (64, 64), jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P(None, "tp"))
    out = NamedSharding(mesh, out_spec)
    f = jax.jit(lambda a, b: jax.lax.with_sharding_constraint(
        fo.column_parallel_matmul(a, b, "tp"), out))
    y = f(x, w)
    assert y.sharding.spec == out_spec, y.sharding.spec
    assert _collectives(f, x, w) == ["all-gather"]
    assert_close(y, jax.jit(_want)(x, w))


# x with its leading dims kept (not flattened to rows): the sequence dim (the first, or
# sequence_dim) over tp is gathered inside the op, the other leading dims keep their
# data-parallel sharding. Flattened [B, S] over (dp, tp) is not P((dp, tp)) rows once B has
# more than one row per device: XLA gathered x itself and the op was a local dot.
_SEQUENCE_LAYOUTS = [
    # (x shape, x spec, sequence_dim, output spec)
    ((16, 4, 32), P("tp", "dp", None), 0, P(None, "dp", "tp")),       # [S, B, K] Megatron
    ((16, 4, 32), P("tp", None, None), 0, P(None, None, "tp")),       # S over tp only
    ((4, 16, 32), P("dp", "tp", None), 1, P("dp", None, "tp")),       # [B, S, K]
    ((2, 16, 32), P("dp", "tp", None), -1, P("dp", None, "tp")),      # one row of B each
    ((8, 16, 32), P(None, "tp", None), 1, P(None, None, "tp")),
    ((2, 4, 16, 32), P(None, "dp", "tp", None), 2, P(None, "dp", None, "tp")),
]


@pytest.fixture
def gathered_dims(monkeypatch):
    """The sequence_dim of each all_gather_matmul the partitioner lowers (the op's own
    gather, as opposed to XLA gathering x before a local dot)."""
    from jax_flashoverlap import ops
    dims, real = [], ops.all_gather_matmul

    def spy(*args, **kwargs):
        dims.append(kwargs.get("sequence_dim", 0))
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "all_gather_matmul", spy)
    return dims


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("shape,x_spec,sequence_dim,out_spec", _SEQUENCE_LAYOUTS,
                         ids=lambda v: str(v).replace(" ", ""))
def test_leading_dims_keep_their_layout(fo, rng, gathered_dims, shape, x_spec, sequence_dim,
                                        out_spec, gspmd):
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, shape, jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16, scale=32 ** -0.5), P(None, "tp"))
    f = jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, sequence_dim=sequence_dim))
    y, colls = with_partitioner(gspmd, lambda: (f(x, w), _collectives(f, x, w)))
    # the op lowered on the sequence dim (once per compilation)
    assert gathered_dims and set(gathered_dims) == {sequence_dim % (len(shape) - 1)}, \
        gathered_dims
    got = tuple(y.sharding.spec) + (None,) * (len(shape) - len(y.sharding.spec))
    assert y.shape == (*shape[:-1], 64) and got == tuple(out_spec), y.sharding.spec
    assert colls == ["all-gather"], colls  # the op's own, nothing else moved
    assert_close(y, jax.jit(_want)(x, w))
    assert_rel_fro(y, jax.jit(_want)(*upcast(x, w)))


def test_leading_dims_grads_equal_those_of_x_at_w(fo, rng):
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (4, 16, 32), jnp.bfloat16), P("dp", "tp", None))
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16), P("tp", None))
    ct = jnp.asarray(rng.standard_normal((4, 16, 64)), jnp.float32)

    def grads(f):
        return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(x, w)

    ours = grads(lambda a, b: fo.column_parallel_matmul(a, b, transpose_w=True,
                                                        sequence_dim=1))
    for g, r in zip(ours, grads(lambda a, b: a @ b.T)):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


def test_sequence_dim_not_over_the_axis_warns_and_gives_xla_values(fo, rng, gathered_dims):
    """[B, S, K] with S over tp but the default sequence_dim 0: XLA gathers x and the op is a
    local dot; a warning names the sequence_dim that overlaps."""
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (4, 16, 32), jnp.bfloat16), P("dp", "tp", None))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16), P(None, "tp"))
    with pytest.warns(UserWarning, match=r"x \(shape \(4, 16, 32\)\) has dim 1 sharded over "
                      r"'tp', not its sequence_dim 0: .* pass sequence_dim=1"):
        y = jax.jit(fo.column_parallel_matmul)(x, w)
    assert gathered_dims == []
    assert_close(y, jax.jit(_want)(x, w))


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
def test_k_over_the_axis_is_no_leading_dim_to_name(fo, rng, gspmd):
    """x's K (its last dim, not a leading one) over tp: a local dot after XLA moves x, and no
    warning pointing sequence_dim at K (no leading dim of x is over tp)."""
    import warnings

    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, (16, 32), jnp.bfloat16), P(None, "tp"))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16, scale=32 ** -0.5), P(None, "tp"))
    f = jax.jit(lambda a, b: fo.column_parallel_matmul(a, b, "tp"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = with_partitioner(gspmd, lambda: f(x, w))
    said = [str(c.message) for c in caught if "pass sequence_dim" in str(c.message)]
    assert not said, said
    assert_close(y, jax.jit(_want)(x, w))


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("mesh_shape,rows", [((2, 4), 10), ((4, 2), 10), ((4, 2), 6)],
                         ids=["dp2xtp4-m10", "dp4xtp2-m10", "dp4xtp2-m6"])
def test_rows_the_data_parallel_axes_do_not_divide_are_a_local_dot(fo, rng, mesh_shape, rows,
                                                                   transpose_w):
    """x replicated with M not a multiple of the other mesh axes' size d: Shardy's rule has no
    (d a) split of the rows there; nothing over tp to gather, XLA's local dot (w [N, K] too)."""
    mesh = make_mesh_2d(*mesh_shape)
    x = _put(mesh, rand(rng, (rows, 32), jnp.bfloat16), P())
    w_global = rand(rng, (64, 32) if transpose_w else (32, 64), jnp.bfloat16, scale=32 ** -0.5)
    w = _put(mesh, w_global, P("tp", None) if transpose_w else P(None, "tp"))
    y, colls = _run(fo, x, w, axis_name="tp", transpose_w=transpose_w)
    assert y.shape == (rows, 64) and colls == [], (y.shape, colls)
    assert_close(y, jax.jit(_want, static_argnums=2)(x, w, transpose_w))


@pytest.mark.parametrize("mesh_shape", [(2, 4), (4, 2)], ids=["dp2xtp4", "dp4xtp2"])
def test_axis_inferred_from_w_on_a_2d_mesh_keeps_n_over_it(fo, rng, mesh_shape):
    """No axis_name on a (dp, tp) mesh: the axis is w's N's (tp), not the mesh's first; the
    output has N over tp after the op's one gather (the rule takes no data-parallel share
    without axis_name, README)."""
    mesh = make_mesh_2d(*mesh_shape)
    x = _put(mesh, rand(rng, (64, 32), jnp.bfloat16), P("tp", None))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16, scale=32 ** -0.5), P(None, "tp"))
    y, colls = _run(fo, x, w)
    assert y.sharding.spec == P(None, "tp") and colls == ["all-gather"], (y.sharding.spec, colls)
    assert_close(y, jax.jit(_want)(x, w))

# x [S, B, K] with S over (dp, tp): gathered over tp, the output's S keeps dp. GSPMD infers
# it; Shardy's rule sees shapes, not shardings, and keeps S's dp share only for x [M, K] (for
# x [S, B, K] it would break Megatron's P(tp, dp, None): Shardy splits tp into sub-axes over
# the share's factor), so there the output is constrained (README): then one all-gather.
@pytest.mark.parametrize("constrain", [False, True], ids=["inferred", "constrained"])
@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("shape,sequence_dim,x_spec,out_spec", [
    ((32, 4, 32), 0, P(("dp", "tp"), None, None), P("dp", None, "tp")),
    ((4, 32, 32), 1, P(None, ("dp", "tp"), None), P(None, "dp", "tp")),
], ids=["S-first", "S-second"])
def test_sequence_dim_over_dp_and_tp(fo, rng, shape, sequence_dim, x_spec, out_spec, gspmd,
                                     constrain):
    mesh = make_mesh_2d(2, 4)
    x = _put(mesh, rand(rng, shape, jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16, scale=32 ** -0.5), P(None, "tp"))
    fn = lambda a, b: fo.column_parallel_matmul(a, b, "tp", sequence_dim=sequence_dim)  # noqa
    f = jax.jit(fn, out_shardings=NamedSharding(mesh, out_spec)) if constrain else jax.jit(fn)
    y, colls = with_partitioner(gspmd, lambda: (f(x, w), _collectives(f, x, w)))
    assert_close(y, jax.jit(_want)(x, w))
    if gspmd or constrain:
        got = tuple(y.sharding.spec) + (None,) * (3 - len(y.sharding.spec))
        assert got == tuple(out_spec), y.sharding.spec
        assert colls == ["all-gather"], colls


@pytest.mark.parametrize("gspmd", [False, True], ids=["shardy", "gspmd"])
@pytest.mark.parametrize("mesh_shape,x_spec,out_spec,want_colls", [
    ((2, 4), P("dp", None), P("dp", "tp"), []),                  # a local dot
    ((4, 2), P("tp", None), P(None, "tp"), ["all-gather"]),
], ids=["dp2xtp4-rows-dp", "dp4xtp2-rows-tp"])
def test_one_row_per_data_parallel_block(fo, rng, mesh_shape, x_spec, out_spec, want_colls,
                                         gspmd):
    """M == the data-parallel size: Shardy's rule had a size-1 rows factor and the lowering
    failed ('dim mapping can't have a factor of size 1', an MLIR verifier error)."""
    mesh = make_mesh_2d(*mesh_shape)
    x = _put(mesh, rand(rng, (mesh_shape[0], 64), jnp.bfloat16), x_spec)
    w = _put(mesh, rand(rng, (64, 32), jnp.bfloat16, scale=64 ** -0.5), P(None, "tp"))
    old = bool(getattr(jax.config, "jax_use_shardy_partitioner", False))
    jax.config.update("jax_use_shardy_partitioner", not gspmd)
    try:
        y, colls = _run(fo, x, w, axis_name="tp")
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)
    assert y.sharding.spec == out_spec and colls == want_colls, (y.sharding.spec, colls)
    assert_close(y, jax.jit(_want)(x, w))


def test_local_dot_takes_any_n_per_device(fo, rng):
    """x's rows not over the gather axis: XLA's local dot, no per-device GEMM of ours, so an N
    of 5 per device is fine (the multiple-of-8 check belongs to the gathered path only)."""
    from _util import make_mesh_1d

    mesh = make_mesh_1d(8)
    x = jax.device_put(rand(rng, (16, 64), jnp.bfloat16), NamedSharding(mesh, P()))
    w = jax.device_put(rand(rng, (64, 40), jnp.bfloat16), NamedSharding(mesh, P(None, "tp")))
    out = jax.jit(fo.column_parallel_matmul)(x, w)
    assert tuple(out.sharding.spec) == (None, "tp"), out.sharding.spec
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(jax.jit(lambda a, b: a @ b)(x, w), np.float32))
