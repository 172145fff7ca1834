"""The global views on meshes with Explicit axes (what jax.make_mesh gives by default): JAX
types every value's sharding there, and a custom_partitioning op has no typing rule, so both
ops raised JAX's ShardingTypeError ('Contracting dimensions are sharded') from inside. They
now run with the axes Auto inside jax.sharding.auto_axes and type their output with the
layout the partitioner gives it (the README's table); values against float32, grads too."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_flashoverlap as fo


@pytest.fixture(scope="module")
def mesh():
  m = jax.make_mesh((2, 4), ("dp", "tp"))
  assert m.axis_types == (AxisType.Explicit,) * 2  # else this tests nothing new
  return m


def _put(mesh, shape, spec, key):
  value = jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(jnp.bfloat16)
  return jax.device_put(value, NamedSharding(mesh, spec))


def _f32(a):
  return np.asarray(a, np.float32)


def _rel(out, ref):
  return float(np.linalg.norm(_f32(out) - ref) / np.linalg.norm(ref))


CASES = {  # name: (x shape, x spec, w shape, w spec, op, output spec)
    "row-all-reduce": ((16, 64), P("dp", "tp"), (64, 32), P("tp", None),
                       lambda x, w: fo.row_parallel_matmul(x, w), P("dp", None)),
    "row-reduce-scatter": ((16, 64), P("dp", "tp"), (64, 32), P("tp", None),
                           lambda x, w: fo.row_parallel_matmul(x, w, "reduce_scatter"),
                           P(("dp", "tp"), None)),
    "row-transpose-w": ((16, 64), P("dp", "tp"), (32, 64), P(None, "tp"),
                        lambda x, w: fo.row_parallel_matmul(x, w, transpose_w=True),
                        P("dp", None)),
    "row-megatron-rank-3": ((8, 4, 64), P(None, "dp", "tp"), (64, 32), P("tp", None),
                            lambda x, w: fo.row_parallel_matmul(x, w, "reduce_scatter"),
                            P("tp", "dp", None)),
    "column-rows": ((32, 64), P(("dp", "tp"), None), (64, 32), P(None, "tp"),
                    lambda x, w: fo.column_parallel_matmul(x, w, axis_name="tp"),
                    P("dp", "tp")),
    "column-megatron-rank-3": ((8, 4, 64), P("tp", "dp", None), (32, 64), P("tp", None),
                               lambda x, w: fo.column_parallel_matmul(x, w, transpose_w=True),
                               P(None, "dp", "tp")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_typed_layout_on_an_explicit_mesh(mesh, name):
  x_shape, x_spec, w_shape, w_spec, op, out_spec = CASES[name]
  x, w = _put(mesh, x_shape, x_spec, 1), _put(mesh, w_shape, w_spec, 2)
  transpose = "transpose" in name or (name == "column-megatron-rank-3")
  ref = _f32(x) @ (_f32(w).T if transpose else _f32(w))
  with jax.sharding.set_mesh(mesh):
    y = jax.jit(op)(x, w)
    assert jax.typeof(y).sharding.spec == out_spec
  assert y.sharding.spec == out_spec
  assert _rel(y, ref) < 1e-2


@pytest.mark.parametrize("name", ["row-all-reduce", "row-reduce-scatter", "column-rows"])
def test_grads_on_an_explicit_mesh(mesh, name):
  x_shape, x_spec, w_shape, w_spec, op, _ = CASES[name]
  x, w = _put(mesh, x_shape, x_spec, 3), _put(mesh, w_shape, w_spec, 4)
  dy = np.asarray(jax.random.normal(jax.random.key(5), (x_shape[0], w_shape[1])), np.float32)
  with jax.sharding.set_mesh(mesh):
    loss = lambda x, w: jnp.sum(op(x, w).astype(jnp.float32) * jnp.asarray(dy).astype(
        jnp.float32))
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
  assert jax.typeof(gx).sharding.spec == x_spec and jax.typeof(gw).sharding.spec == w_spec
  assert _rel(gx, dy @ _f32(w).T) < 2e-2 and _rel(gw, _f32(x).T @ dy) < 2e-2


def test_without_set_mesh_the_types_mesh_is_used(mesh):
  """Explicit-typed operands and no jax.set_mesh around the call: auto_axes needs a mesh in
  context, the types' is entered (it raised the same ShardingTypeError)."""
  x_shape, x_spec, w_shape, w_spec, op, out_spec = CASES["row-reduce-scatter"]
  x, w = _put(mesh, x_shape, x_spec, 6), _put(mesh, w_shape, w_spec, 7)
  y = jax.jit(op)(x, w)
  assert jax.typeof(y).sharding.spec == out_spec
  assert _rel(y, _f32(x) @ _f32(w)) < 1e-2


def test_the_flax_layers_on_an_explicit_mesh(mesh):
  from flax import nnx
  from jax_flashoverlap.flax import ColumnParallelLinear, RowParallelLinear
  with jax.sharding.set_mesh(mesh):
    col = ColumnParallelLinear(64, 128, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    row = RowParallelLinear(128, 64, rngs=nnx.Rngs(1), param_dtype=jnp.bfloat16)
    x = _put(mesh, (8, 64), P("dp", None), 8)
    y = nnx.jit(lambda c, r, x: r(c(x)))(col, row, x)
    assert jax.typeof(y).sharding.spec == P("dp", None)
  h = _f32(x) @ _f32(col.kernel[...]) + _f32(col.bias[...])
  ref = _f32(np.asarray(h, np.float32).astype(jnp.bfloat16)) @ _f32(row.kernel[...])
  assert _rel(y, ref + _f32(row.bias[...])) < 2e-2


@pytest.mark.parametrize("logical", [False, True])
def test_the_linen_layers_init_and_apply_on_an_explicit_mesh(mesh, logical):
  """Linen's param boxes constrain each param to its spec when unboxed, and on Explicit axes
  with_sharding_constraint is an assert: a param fresh from its initializer (init under the
  mesh) failed it (`nn.Dense` with `nn.with_partitioning` still does). The layers reshard
  there instead: init, apply and grads run, values against float32."""
  import flax.linen as nn
  from jax_flashoverlap.flax import ColumnParallelDense, RowParallelDense
  axes = ({"kernel_axes": ("embed", "mlp")}, {"kernel_axes": ("mlp", "embed")}) if logical \
      else ({}, {})
  rules = (("embed", None), ("mlp", "tp"), ("batch", "dp"))

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = ColumnParallelDense(128, param_dtype=jnp.bfloat16, **axes[0])(x)
      return RowParallelDense(64, param_dtype=jnp.bfloat16, **axes[1])(h)

  with jax.sharding.set_mesh(mesh), nn.logical_axis_rules(rules):
    x = _put(mesh, (8, 64), P("dp", None), 9)
    variables = jax.jit(MLP().init)(jax.random.key(0), x)
    y = jax.jit(MLP().apply)(variables, x)
    grads = jax.jit(jax.grad(lambda v, x: MLP().apply(v, x).astype(jnp.float32).sum()))(
        variables, x)
  assert jax.typeof(y).sharding.spec == P("dp", None)
  params = nn.unbox(variables)["params"]
  col, row = params["ColumnParallelDense_0"], params["RowParallelDense_0"]
  h = _f32(x) @ _f32(col["kernel"]) + _f32(col["bias"])
  ref = _f32(np.asarray(h, np.float32).astype(jnp.bfloat16)) @ _f32(row["kernel"])
  assert _rel(y, ref + _f32(row["bias"])) < 2e-2
  g = nn.unbox(grads)["params"]["RowParallelDense_0"]["bias"]
  np.testing.assert_allclose(_f32(g), np.full(64, 8.0), rtol=1e-2)  # d(sum y)/d bias = rows


def test_inputs_on_no_mesh_with_axis_name_get_an_error_saying_so():
  """Uncommitted inputs (arrays fresh from init) under jax.set_mesh: JAX hands the
  partitioner an empty mesh, so a named axis names nothing. The error said "axis_name 'tp' is
  not an axis of the mesh ()" under a set mesh that has it; now what to do."""
  mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
  x = jax.random.normal(jax.random.key(0), (8, 64), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (64, 32), jnp.float32).astype(jnp.bfloat16)
  with jax.sharding.set_mesh(mesh):
    # raised in the partitioner's callback, so it reaches the caller as JAX's runtime error
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="the partitioner got no mesh: the jitted program's arguments are "
                             "on none"):
      jax.jit(lambda x, w: fo.row_parallel_matmul(x, w, axis_name="tp"))(x, w)
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))  # the advice works
    y = jax.jit(lambda x, w: fo.row_parallel_matmul(x, w, axis_name="tp"))(
        put(x, P(None, "tp")), put(w, P("tp", None)))
  assert _rel(y, _f32(x) @ _f32(w)) < 1e-2


def test_sharded_weights_closed_over_with_arguments_on_no_mesh_get_an_error_saying_so():
  """A layer's params on the mesh but closed over by the jitted function, its one argument a
  numpy array (the inference idiom `jax.jit(lambda x: model.apply(params, x))`): JAX hands
  the partitioner no mesh (only the arguments' meshes reach it). The error said "the jitted
  program's inputs are on none ... put them on the mesh" of arrays already there; it now
  names the closed-over arrays, and each fix it gives works."""
  mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
  x = np.asarray(jax.random.normal(jax.random.key(2), (8, 64), jnp.float32).astype(jnp.bfloat16))
  w = jax.device_put(jax.random.normal(jax.random.key(3), (64, 32), jnp.float32)
                     .astype(jnp.bfloat16), NamedSharding(mesh, P("tp", None)))
  want = _f32(x) @ _f32(w)
  op = lambda x, w: fo.row_parallel_matmul(x, w, axis_name="tp")  # noqa: E731
  with jax.sharding.set_mesh(mesh):
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="or the sharded arrays closed over by the jitted function instead "
                             "of passed to it"):
      jax.jit(lambda x: op(x, w))(x)
    assert _rel(jax.jit(op)(x, w), want) < 1e-2  # w passed
    x_on_mesh = jax.device_put(x, NamedSharding(mesh, P()))
    assert _rel(jax.jit(lambda x: op(x, w))(x_on_mesh), want) < 1e-2  # x put on the mesh


def test_reduce_scatter_rows_not_divisible_is_caught_at_trace_time(mesh):
  """With Explicit axes the types give the layout at trace time: rows of a shard that the
  contracting axis does not divide are refused there, with the sizes, before JAX types the
  output (no axis_name: the mesh axis is the one that shards K)."""
  x, w = _put(mesh, (12, 64), P("dp", "tp"), 9), _put(mesh, (64, 32), P("tp", None), 10)
  f = jax.jit(lambda x, w: fo.row_parallel_matmul(x, w, "reduce_scatter"))
  with pytest.raises(ValueError, match=r"reduce_scatter needs the rows of each shard \(6\) to "
                                       r"be divisible by the size 4 of axis 'tp'"):
    f.trace(x, w)
