"""Global view of the sequence-parallel column GEMM: column_parallel_matmul under jax.jit with
NamedSharding inputs, no shard_map.

x [M, K] with its rows sharded over tp (and any data-parallel axes), w [K, N] with N sharded
over tp (w [N, K] sharded on its first dim with transpose_w=True): per device
all_gather_matmul, the output [M, N] with N over tp and the rows over the other axes. Values
equal x @ w computed by XLA; the compiled program gathers x once and moves nothing else.
"""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, assert_close, assert_rel_fro, make_mesh_1d,
                   make_mesh_2d, rand, upcast)

_COLLECTIVE = re.compile(r"= \S+ (all-gather|all-to-all|collective-permute|all-reduce|"
                         r"reduce-scatter)(-start)?\(")


def _put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def _collectives(f, *args):
    hlo = f.lower(*args).compile().as_text()
    return [m.group(1) for line in hlo.splitlines() for m in [_COLLECTIVE.search(line)] if m]


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
    with pytest.raises(ValueError, match="x must be 2-D"):
        jax.jit(fo.column_parallel_matmul).trace(sds((2, 8, 32), jnp.bfloat16),
                                                 sds((32, 64), jnp.bfloat16))


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


def test_vmap_is_refused_naming_the_function(fo, rng):
    mesh = make_mesh_1d(4)
    x = _put(mesh, rand(rng, (3, 8, 32), jnp.bfloat16), P(None, "tp", None))
    w = _put(mesh, rand(rng, (32, 64), jnp.bfloat16), P(None, "tp"))
    f = jax.vmap(fo.column_parallel_matmul, in_axes=(0, None))
    with pytest.raises(NotImplementedError, match=r"column_parallel_matmul: jax.vmap of the "
                       r"global view is not supported"):
        jax.jit(f)(x, w)


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
