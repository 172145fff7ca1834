"""Flax layers (jax_flashoverlap.flax): params made inside shard_map equal the shards of the
same layer made outside; sharding at construction (mesh=, kernel_axes) and the construction-time
checks that name the layer's own arguments."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from _util import make_mesh_1d, shard_map

flax = pytest.importorskip("flax")
from flax import nnx  # noqa: E402
import flax.linen as nn  # noqa: E402

from jax_flashoverlap.flax import (SHARDING_KEY, ColumnParallelDense,  # noqa: E402
                                   ColumnParallelLinear, RowParallelDense, RowParallelLinear)

BF16 = jnp.bfloat16
RULES = (("mlp", "tp"), ("embed", None))


def _nonzero_bias_init(key, shape, dtype):
  return jax.random.normal(key, shape, dtype)


@pytest.mark.parametrize("cls", [RowParallelLinear, ColumnParallelLinear])
def test_nnx_made_inside_shard_map_is_the_shard_of_the_global_layer(cls):
  """Each device's params are its block of the layer made outside with the same rngs (not the
  same block on every device, and for the row layer not a kernel initialised with the local
  fan-in, sqrt(n) times too large)."""
  mesh = make_mesh_1d(4)
  kw = dict(bias_init=_nonzero_bias_init)
  outside = cls(256, 64, rngs=nnx.Rngs(0), **kw)
  specs = nnx.get_partition_spec(nnx.state(outside))

  def body():
    return nnx.state(cls(256, 64, rngs=nnx.Rngs(0), **kw))
  inside = jax.jit(shard_map(body, mesh, (), specs))()
  for k in ("kernel", "bias"):
    np.testing.assert_array_equal(np.asarray(inside[k][...]), np.asarray(getattr(outside, k)[...]))


@pytest.mark.parametrize("cls", [RowParallelDense, ColumnParallelDense])
def test_linen_init_inside_shard_map_is_the_shard_of_the_global_init(cls):
  mesh = make_mesh_1d(4)
  layer = cls(64, bias_init=_nonzero_bias_init)
  x = jnp.ones((8, 256), BF16)
  outside = layer.init(jax.random.key(0), x)
  specs = nn.get_partition_spec(outside)
  x_spec = P(None, "tp") if cls is RowParallelDense else P()
  inside = jax.jit(shard_map(lambda x: layer.init(jax.random.key(0), x), mesh, x_spec, specs))(x)
  for a, b in zip(jax.tree.leaves(nn.unbox(inside)), jax.tree.leaves(nn.unbox(outside))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("cls,features,dim", [(RowParallelLinear, (34, 16), "in_features=34"),
                                              (ColumnParallelLinear, (32, 18),
                                               "out_features=18")])
def test_mesh_argument_is_checked_like_set_mesh(cls, features, dim):
  """mesh= (no jax.set_mesh): the same divisibility error as under jax.set_mesh, not JAX's
  IndivisibleError from the eager sharding."""
  with pytest.raises(ValueError, match=f"{dim} is not divisible by the size 4 of mesh axis"):
    cls(*features, mesh=make_mesh_1d(4), rngs=nnx.Rngs(0))


def test_kernel_axes_params_are_sharded_at_construction():
  """Under jax.set_mesh, logical names shard the params at construction as axis_name does (and
  as nnx.Linear with nnx.with_partitioning does), keeping the logical annotations."""
  mesh = make_mesh_1d(4)
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    row = RowParallelLinear(64, 32, kernel_axes=("mlp", "embed"), rngs=nnx.Rngs(0))
  with jax.set_mesh(mesh):
    col = ColumnParallelLinear(32, 64, kernel_axes=("embed", "mlp"), sharding_rules=RULES,
                               rngs=nnx.Rngs(0))
  col_mesh = ColumnParallelLinear(32, 64, kernel_axes=("embed", "mlp"), sharding_rules=RULES,
                                  mesh=mesh, rngs=nnx.Rngs(0))
  assert row.kernel[...].sharding.spec == P("tp", None)
  assert row.kernel.get_metadata()[SHARDING_KEY] == ("mlp", "embed")
  for layer in (col, col_mesh):
    assert layer.kernel[...].sharding.spec == P(None, "tp")
    assert layer.bias[...].sharding.spec == P("tp")
  explicit = RowParallelLinear(64, 32, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(np.asarray(row.kernel[...]), np.asarray(explicit.kernel[...]))


def _call_in_shard_map(layer):
  gdef, state = nnx.split(layer)
  f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), make_mesh_1d(4),
                (nnx.get_partition_spec(state), P(None, "tp")), P())
  return jax.eval_shape(f, state, jax.ShapeDtypeStruct((8, layer.cfg.in_features), BF16))


@pytest.mark.parametrize("make,match", [
    (lambda: RowParallelLinear(64, 20, rngs=nnx.Rngs(0)),
     "RowParallelLinear: out_features=20 must be a multiple of 8"),
    (lambda: RowParallelLinear(80, 32, mesh=make_mesh_1d(4), rngs=nnx.Rngs(0)),
     r"RowParallelLinear: in_features=80 split over mesh axis 'tp' \(size 4\) is 20 per device"),
    (lambda: ColumnParallelLinear(36, 32, sequence_parallel=True, rngs=nnx.Rngs(0)),
     "ColumnParallelLinear: in_features=36 must be a multiple of 8"),
    (lambda: ColumnParallelLinear(32, 80, overlap_backward=True, mesh=make_mesh_1d(4),
                                  rngs=nnx.Rngs(0)),
     r"out_features=80 split over mesh axis 'tp' \(size 4\) is 20 per device"),
    (lambda: RowParallelDense(20).init(jax.random.key(0), jnp.ones((4, 32), BF16)),
     "RowParallelDense: features=20 must be a multiple of 8"),
    (lambda: _call_in_shard_map(RowParallelLinear(80, 32, rngs=nnx.Rngs(0))),  # no mesh yet
     r"RowParallelLinear: in_features=80 split over mesh axis 'tp' \(size 4\) is 20 per device"),
])
def test_sizes_the_ops_cannot_take_are_named_at_construction(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_column_layer_without_an_op_takes_any_size(rng):
  """No jax_flashoverlap op in a plain column layer: odd sizes work as in nnx.Linear."""
  layer = ColumnParallelLinear(37, 21, rngs=nnx.Rngs(0))
  x = jnp.asarray(rng.standard_normal((3, 37)), BF16)
  ref = x @ layer.kernel[...].astype(BF16) + layer.bias[...].astype(BF16)
  np.testing.assert_array_equal(np.asarray(layer(x), np.float32), np.asarray(ref, np.float32))


def test_numpy_integer_sizes():
  layer = RowParallelLinear(np.int64(64), np.int32(32), rngs=nnx.Rngs(0))
  assert layer.kernel.shape == (64, 32) and type(layer.cfg.in_features) is int
  with pytest.raises(ValueError, match="in_features must be a positive int, got True"):
    RowParallelLinear(True, 32, rngs=nnx.Rngs(0))


def test_linen_errors_name_features():
  x = jnp.ones((4, 32), BF16)
  with pytest.raises(ValueError, match="ColumnParallelDense: features must be a positive int"):
    ColumnParallelDense(0).init(jax.random.key(0), x)
  with jax.set_mesh(make_mesh_1d(4)):
    with pytest.raises(ValueError, match="ColumnParallelDense: features=18 is not divisible"):
      ColumnParallelDense(18).init(jax.random.key(0), x)
  variables = RowParallelDense(np.int64(16)).init(jax.random.key(0), x)
  assert nn.unbox(variables)["params"]["kernel"].shape == (32, 16)


def test_inits_wrapped_with_partitioning_are_unwrapped():
  """kernel_init=nnx.with_partitioning(init, spec) / nn.with_partitioning, the nnx.Linear /
  nn.Dense idiom: the layer's own spec is kept (before: NNX took the box's spec and mesh=None,
  failing with mesh=, inside shard_map, with kernel_axes; linen nested the boxes and apply
  crashed in the partitioner); a box naming another spec is an error, not silently used."""
  mesh = make_mesh_1d(4)
  init = nn.initializers.lecun_normal()
  plain = ColumnParallelLinear(32, 64, mesh=mesh, rngs=nnx.Rngs(0))
  boxed = ColumnParallelLinear(32, 64, mesh=mesh, rngs=nnx.Rngs(0),
                               kernel_init=nnx.with_partitioning(init, (None, "tp")))
  assert boxed.kernel[...].sharding.spec == P(None, "tp")
  np.testing.assert_array_equal(np.asarray(boxed.kernel[...]), np.asarray(plain.kernel[...]))
  logical = RowParallelLinear(64, 32, kernel_axes=("mlp", "embed"), sharding_rules=RULES,
                              kernel_init=nnx.with_partitioning(init, ("mlp", "embed")),
                              rngs=nnx.Rngs(0))
  assert logical.kernel.get_metadata()[SHARDING_KEY] == ("mlp", "embed")
  outside = RowParallelLinear(64, 32, rngs=nnx.Rngs(0))
  inside = jax.jit(shard_map(lambda: nnx.state(RowParallelLinear(
      64, 32, kernel_init=nnx.with_partitioning(init, ("tp", None)), rngs=nnx.Rngs(0))),
      mesh, (), nnx.get_partition_spec(nnx.state(outside))))()
  for layer in (inside, logical):
    np.testing.assert_array_equal(np.asarray(layer["kernel"][...] if layer is inside else
                                             layer.kernel[...]), np.asarray(outside.kernel[...]))
  with pytest.raises(ValueError, match=r"RowParallelLinear: bias_init is wrapped with the "
                                       r"sharding \('tp',\), but the layer shards its bias as"):
    RowParallelLinear(64, 32, rngs=nnx.Rngs(0),
                      bias_init=nnx.with_partitioning(nn.initializers.zeros_init(), ("tp",)))

  x = jnp.ones((8, 64), BF16)
  dense = RowParallelDense(32, kernel_init=nn.with_partitioning(init, ("tp", None)))
  variables = dense.init(jax.random.key(0), x)
  assert isinstance(variables["params"]["kernel"].value, jax.Array)
  y = jax.jit(dense.apply)(variables, x)
  ref = RowParallelDense(32).init(jax.random.key(0), x)
  np.testing.assert_array_equal(np.asarray(nn.unbox(variables)["params"]["kernel"]),
                                np.asarray(nn.unbox(ref)["params"]["kernel"]))
  assert y.shape == (8, 32)
  with pytest.raises(ValueError, match="ColumnParallelDense: kernel_init is wrapped with"):
    ColumnParallelDense(32, kernel_init=nn.with_partitioning(init, ("tp", None))).init(
        jax.random.key(0), x)


# -------------------------------------------------- a user's review (session 30)

def _auto_mesh(shape, names=("tp",)):
  shape = (shape,) if isinstance(shape, int) else shape
  return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def test_nnx_scan_over_stacked_row_layers_with_bias(rng):
  """NNX's scan-over-layers recipe (nnx.vmap to stack, nnx.scan to run, transform_metadata):
  the row bias was annotated () and nnx.scan failed removing the layer axis nnx.vmap had not
  added (IndexError in flax's spmd.remove_field); as (None,) it runs, equal to the layers one
  by one."""
  mesh = _auto_mesh(4)
  meta = {"transform_metadata": {nnx.PARTITION_NAME: None}}
  x = jnp.asarray(rng.standard_normal((16, 64)), BF16)
  with jax.set_mesh(mesh):
    make = nnx.vmap(lambda r: RowParallelLinear(64, 64, bias_init=_nonzero_bias_init, rngs=r),
                    in_axes=0, out_axes=0, **meta)
    stack = nnx.split_rngs(splits=3)(make)(nnx.Rngs(0))

    def run(s, x):
      return nnx.scan(lambda x, layer: (layer(x), None), in_axes=(nnx.Carry, 0),
                      out_axes=(nnx.Carry, 0), **meta)(x, s)[0]
    y = nnx.jit(run)(stack, x)
    kernel, bias = np.asarray(stack.kernel[...], np.float32), np.asarray(stack.bias[...], np.float32)
  want = np.asarray(x, np.float32)
  for i in range(3):  # the layers one by one, in float32 on the bf16-rounded params
    want = want @ np.asarray(jnp.asarray(kernel[i], BF16), np.float32) + np.asarray(
        jnp.asarray(bias[i], BF16), np.float32)
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=5e-2, atol=5e-2)
  assert np.linalg.norm(np.asarray(y, np.float32) - want) <= 2e-2 * np.linalg.norm(want)


@pytest.mark.parametrize("shape, sequence_dim", [((2, 7, 64), 0), ((1, 7, 64), 1)])
def test_global_reduce_scatter_that_does_not_divide_is_a_trace_time_error(shape, sequence_dim):
  """Under plain jit the row layer's reduce-scatter dim must divide over the axis: a ValueError
  naming the layer and the shape at trace time (it was the partitioner's INTERNAL error at
  compile time)."""
  with jax.set_mesh(_auto_mesh(8)):
    layer = RowParallelLinear(64, 64, reduce="reduce_scatter", sequence_dim=sequence_dim,
                              rngs=nnx.Rngs(0))
    import re
    with pytest.raises(ValueError, match=re.escape(
        f"RowParallelLinear: reduce_scatter needs dim {sequence_dim} (the sequence_dim) of x "
        f"(shape {shape}) to be divisible by the size 8 of axis 'tp'")):
      nnx.jit(lambda l, x: l(x))(layer, jnp.ones(shape, BF16))


def test_row_parallel_matmul_scatter_size_is_checked_at_trace_time():
  from jax_flashoverlap import row_parallel_matmul
  with jax.set_mesh(_auto_mesh(8)):
    with pytest.raises(ValueError, match=r"row_parallel_matmul: reduce_scatter needs the rows "
                                         r"of x \(shape \(12, 64\)\) to be divisible by the size 8"):
      jax.jit(lambda x, w: row_parallel_matmul(x, w, "reduce_scatter", "tp"))(
          jnp.ones((12, 64), BF16), jnp.ones((64, 32), BF16))


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_row_parallel_matmul_k_per_device_is_checked_at_trace_time(reduce):
  """K split over the named axis of the mesh in context must be a multiple of 8 per device: a
  ValueError at trace time (without a mesh in context, the partitioner's, inside XLA's
  JaxRuntimeError at compile time)."""
  from jax_flashoverlap import row_parallel_matmul
  fn = jax.jit(lambda x, w: row_parallel_matmul(x, w, reduce, "tp"))
  with jax.set_mesh(_auto_mesh((2, 4), ("dp", "tp"))):
    with pytest.raises(ValueError, match=r"row_parallel_matmul: K=48 \(last dim of x\) sharded "
                                         r"over 'tp' \(size 4\) is K=12 per device"):
      fn.trace(jnp.ones((16, 48), BF16), jnp.ones((48, 32), BF16))
    fn.trace(jnp.ones((16, 64), BF16), jnp.ones((64, 32), BF16))  # 16 per device: fine
    fn.trace(jnp.ones((0, 48), BF16), jnp.ones((48, 32), BF16))  # no rows: XLA's dot, any K


def test_rank1_x_cannot_be_scattered():
  mesh = make_mesh_1d(8)
  layer = RowParallelLinear(64, 64, reduce="reduce_scatter", rngs=nnx.Rngs(0))
  g, state = nnx.split(layer)
  fn = shard_map(lambda s, x: nnx.merge(g, s)(x), mesh,
                 (nnx.get_partition_spec(state), P("tp")), P("tp"))
  with pytest.raises(ValueError, match=r"RowParallelLinear: reduce='reduce_scatter' scatters x's "
                                       r"rows over axis 'tp', and x of shape \(8,\) has none"):
    jax.jit(fn)(state, jnp.ones((64,), BF16))


def test_linen_logical_rules_error_gives_linen_advice():
  with pytest.raises(ValueError, match="around init and apply") as err:
    RowParallelDense(64, kernel_axes=("mlp", "embed")).init(jax.random.key(0),
                                                            jnp.ones((8, 128), BF16))
  assert "sharding_rules=" not in str(err.value)  # an NNX argument: linen layers refuse it
  with pytest.raises(ValueError, match=r"or sharding_rules="):
    RowParallelLinear(128, 64, kernel_axes=("mlp", "embed"), rngs=nnx.Rngs(0))


def test_shard_map_over_a_mesh_without_the_layers_axis_names_the_axis_to_use():
  mesh = make_mesh_1d(8, "model")
  layer = RowParallelLinear(64, 64, rngs=nnx.Rngs(0))
  g, state = nnx.split(layer)
  fn = shard_map(lambda s, x: nnx.merge(g, s)(x), mesh, (P(), P(None, "model")), P())
  with pytest.raises(ValueError, match=r"whose mesh has no axis 'tp' .*axis_name='model'"):
    jax.jit(fn)(state, jnp.ones((16, 64), BF16))


@pytest.mark.filterwarnings("ignore:jax_flashoverlap.row_parallel_matmul. the reduce-scatter")
def test_nnx_layer_made_with_one_mesh_runs_on_another_without_a_mesh_in_context(rng):
  """The trace-time reduce-scatter check takes the mesh in context only: a layer built with
  mesh= (tp = 8) whose state was moved to a (dp 2, tp 4) mesh, called under jit without
  jax.set_mesh, runs (12 rows divide over tp = 4) with XLA's values."""
  from jax.sharding import NamedSharding
  layer = RowParallelLinear(64, 32, reduce="reduce_scatter", mesh=_auto_mesh(8),
                            bias_init=_nonzero_bias_init, rngs=nnx.Rngs(0))
  g, state = nnx.split(layer)
  mesh = _auto_mesh((2, 4), ("dp", "tp"))
  state = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), state,
                       nnx.get_partition_spec(state))
  x = jax.device_put(jnp.asarray(rng.standard_normal((12, 64)), BF16),
                     NamedSharding(mesh, P(None, "tp")))
  y = jax.jit(lambda s, x: nnx.merge(g, s)(x))(state, x)
  want = (np.asarray(x, np.float32) @ np.asarray(state["kernel"][...].astype(BF16), np.float32)
          + np.asarray(state["bias"][...].astype(BF16), np.float32))
  assert np.linalg.norm(np.asarray(y, np.float32) - want) <= 1e-2 * np.linalg.norm(want)


def test_linen_reduce_scatter_under_plain_jit_without_a_mesh_in_context_keeps_its_layout(rng):
  """linen applied under jax.jit to arrays sharded on a (dp, tp) mesh, no jax.set_mesh: the
  layer names its axis, so the reduce-scatter's output stays scattered over (dp, tp) with no
  warning (it came back P('dp'): gathered over tp after the op, with a layout warning)."""
  import warnings
  from jax.sharding import NamedSharding
  mesh = _auto_mesh((2, 4), ("dp", "tp"))
  layer = RowParallelDense(64, reduce="reduce_scatter", bias_init=_nonzero_bias_init)
  x = jnp.asarray(rng.standard_normal((16, 128)), BF16)
  variables = layer.init(jax.random.key(0), x)
  specs = nn.get_partition_spec(variables)
  params = jax.device_put(nn.meta.unbox(variables),
                          jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
  xs = jax.device_put(x, NamedSharding(mesh, P("dp", "tp")))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no layout warning
    y = jax.jit(layer.apply)(params, xs)
  p = params["params"]
  want = (np.asarray(x, np.float32) @ np.asarray(p["kernel"].astype(BF16), np.float32)
          + np.asarray(p["bias"].astype(BF16), np.float32))
  assert np.linalg.norm(np.asarray(y, np.float32) - want) <= 1e-2 * np.linalg.norm(want)
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(("dp", "tp"))), 2), y.sharding


def test_linen_sequence_parallel_mlp_under_plain_jit_without_a_mesh_in_context(rng):
  """column (sequence_parallel) -> gelu -> row (reduce_scatter), linen, applied under jax.jit
  to arrays on a (dp, tp) mesh with no jax.set_mesh: one all-gather and one reduce-scatter,
  the ops' own, output (dp, tp); before the layers named their axis only with a mesh in
  context it compiled to 7 all-gathers and a replicated output."""
  from _util import collectives
  from jax.sharding import NamedSharding

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = ColumnParallelDense(256, sequence_parallel=True, bias_init=_nonzero_bias_init)(x)
      return RowParallelDense(128, reduce="reduce_scatter", bias_init=_nonzero_bias_init)(
          jax.nn.gelu(h))
  mesh = _auto_mesh((2, 4), ("dp", "tp"))
  model = MLP()
  x = jnp.asarray(rng.standard_normal((32, 128)), BF16)
  variables = model.init(jax.random.key(0), x)
  params = jax.device_put(nn.meta.unbox(variables), jax.tree.map(
      lambda s: NamedSharding(mesh, s), nn.get_partition_spec(variables)))
  xs = jax.device_put(x, NamedSharding(mesh, P(("dp", "tp"))))
  apply = jax.jit(model.apply)
  y = apply(params, xs)
  assert sorted(collectives(apply, params, xs)) == ["all-gather", "reduce-scatter"]
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(("dp", "tp"))), 2), y.sharding
  want = np.asarray(jax.jit(model.apply)(nn.meta.unbox(variables), x), np.float32)  # 1 device
  assert np.linalg.norm(np.asarray(y, np.float32) - want) <= 1e-2 * np.linalg.norm(want)


def test_layer_applied_to_params_sharded_over_another_axis_names_both(rng):
  """The layer names its axis (default 'tp') to the global view: params sharded by hand over
  another mesh axis ('model'), no mesh in context, are an error naming the axis and the mesh's
  axes (raised in the partitioner: no mesh is known at trace time), not a silent inference."""
  from jax.sharding import NamedSharding
  mesh = _auto_mesh((2, 4), ("data", "model"))
  layer = RowParallelDense(64)
  x = jnp.asarray(rng.standard_normal((16, 128)), BF16)
  params = nn.meta.unbox(layer.init(jax.random.key(0), x))
  params = jax.device_put(params, {"params": {"kernel": NamedSharding(mesh, P("model", None)),
                                              "bias": NamedSharding(mesh, P())}})
  xs = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match=r"axis_name 'tp' is not an axis of the mesh \('data', 'model'\)"):
    jax.jit(layer.apply)(params, xs)


@pytest.mark.parametrize("layer", ["nnx_row", "nnx_column", "linen_row"])
def test_a_vmap_axis_named_like_the_layers_axis_is_not_the_mesh_axis(layer, rng):
  """Under jax.vmap(axis_name='tp') outside any shard_map, the layer took the vmap axis for its
  tensor-parallel one (the per-device view): 'in_features=64 is not divisible by the size 3
  of mesh axis tp'. It is the global view there, as under any other vmap name."""
  x = jnp.asarray(rng.standard_normal((3, 8, 64)), BF16)
  if layer == "linen_row":
    module = RowParallelDense(32)
    params = module.init(jax.random.key(0), x[0])
    call = lambda a: module.apply(params, a)  # noqa: E731
  else:
    cls = RowParallelLinear if layer == "nnx_row" else ColumnParallelLinear
    module = cls(64, 32, rngs=nnx.Rngs(0))
    call = lambda a: module(a)  # noqa: E731
  want = jax.vmap(call, axis_name="batch")(x)
  got = jax.vmap(call, axis_name="tp")(x)
  assert got.shape == want.shape == (3, 8, 32)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


# -------------------------------------------------- mutation-testing gaps (session 36)

def test_default_params_are_nnx_linear_and_nn_dense_ones():
  """With the defaults (lecun_normal kernel, zero bias, float32 params, kernel drawn before the
  bias) the global params are exactly nnx.Linear's / nn.Dense's for the same rngs, so a model
  switched to these layers starts from the same weights."""
  for cls in (RowParallelLinear, ColumnParallelLinear):
    ours, ref = cls(64, 32, rngs=nnx.Rngs(3)), nnx.Linear(64, 32, rngs=nnx.Rngs(3))
    for k in ("kernel", "bias"):
      assert getattr(ours, k)[...].dtype == jnp.float32
      np.testing.assert_array_equal(np.asarray(getattr(ours, k)[...]),
                                    np.asarray(getattr(ref, k)[...]))
  x = jnp.ones((8, 64), BF16)
  for cls in (RowParallelDense, ColumnParallelDense):
    ours = nn.unbox(cls(32).init(jax.random.key(3), x))["params"]
    ref = nn.Dense(32).init(jax.random.key(3), x)["params"]
    for k in ("kernel", "bias"):
      assert ours[k].dtype == jnp.float32
      np.testing.assert_array_equal(np.asarray(ours[k]), np.asarray(ref[k]))


@pytest.mark.parametrize("cls", [RowParallelDense, ColumnParallelDense])
def test_linen_param_dtype(cls, rng):
  """linen's param_dtype is the dtype of both params (as nn.Dense's), dtype the output's."""
  dtype, param_dtype = jnp.float16, jnp.bfloat16
  x = jnp.asarray(rng.standard_normal((8, 64)), jnp.float32)
  layer = cls(32, dtype=dtype, param_dtype=param_dtype, bias_init=_nonzero_bias_init)
  variables = layer.init(jax.random.key(0), x)
  p = nn.unbox(variables)["params"]
  assert p["kernel"].dtype == param_dtype and p["bias"].dtype == param_dtype
  y = layer.apply(variables, x)
  assert y.dtype == dtype
  want = np.asarray(x.astype(dtype) @ p["kernel"].astype(dtype) + p["bias"].astype(dtype),
                    np.float32)
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=2e-2, atol=2e-2)


def test_inits_wrapped_with_a_spec_without_trailing_nones_are_accepted():
  """A box naming the layer's own spec minus its trailing Nones (("tp",) for the row kernel's
  ("tp", None), as with_partitioning(init, P("tp")) gives) is the same sharding: accepted."""
  init = nn.initializers.lecun_normal()
  boxed = RowParallelLinear(64, 32, kernel_init=nnx.with_partitioning(init, ("tp",)),
                            rngs=nnx.Rngs(0))
  plain = RowParallelLinear(64, 32, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(np.asarray(boxed.kernel[...]), np.asarray(plain.kernel[...]))
  assert nnx.get_partition_spec(nnx.state(boxed))["kernel"].get_value() == P("tp", None)
  x = jnp.ones((8, 64), BF16)
  dense = RowParallelDense(32, kernel_init=nn.with_partitioning(init, ("tp",)))
  got = nn.unbox(dense.init(jax.random.key(0), x))["params"]["kernel"]
  want = nn.unbox(RowParallelDense(32).init(jax.random.key(0), x))["params"]["kernel"]
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_row_bias_logical_annotation_is_replicated():
  """With kernel_axes the row layer's bias (added once, after the reduction) is annotated
  (None,), not with the output dim's logical name, in NNX and linen alike."""
  with nn.logical_axis_rules(RULES):
    row = RowParallelLinear(64, 32, kernel_axes=("mlp", "embed"), rngs=nnx.Rngs(0))
    abstract = jax.eval_shape(RowParallelDense(32, kernel_axes=("mlp", "embed")).init,
                              jax.random.key(0), jnp.ones((8, 64), BF16))
  assert row.bias.get_metadata()[SHARDING_KEY] == (None,)
  assert tuple(abstract["params"]["bias"].names) == (None,)
  assert tuple(abstract["params"]["kernel"].names) == ("mlp", "embed")


def test_global_view_per_device_size_is_checked_at_the_call():
  """A row layer made with no mesh known, called under jax.set_mesh: in_features 80 over
  tp = 4 is 20 per device, a ValueError naming the layer at trace time (not the partitioner's
  INTERNAL error at compile time), NNX and linen."""
  x = jnp.ones((8, 80), BF16)
  layer = RowParallelLinear(80, 32, rngs=nnx.Rngs(0))
  dense = RowParallelDense(32)
  variables = dense.init(jax.random.key(0), x)
  match = r"in_features=80 split over mesh axis 'tp' \(size 4\) is 20 per device"
  with jax.set_mesh(make_mesh_1d(4)):
    with pytest.raises(ValueError, match="RowParallelLinear: " + match):
      nnx.jit(lambda m, x: m(x))(layer, x)
    with pytest.raises(ValueError, match="RowParallelDense: " + match):
      jax.jit(dense.apply)(variables, x)


def test_rank1_x_is_one_row(rng):
  """x [in] is one row: y [out] = x @ kernel + bias, in both views and with reduce_scatter
  when nothing is scattered (no mesh); with a mesh given at construction (mesh=, none in
  context), reduce_scatter refuses it as inside shard_map."""
  mesh = make_mesh_1d(4)
  x = jnp.asarray(rng.standard_normal(64), BF16)
  for reduce in ("all_reduce", "reduce_scatter"):
    layer = RowParallelLinear(64, 32, reduce=reduce, bias_init=_nonzero_bias_init,
                              rngs=nnx.Rngs(0))
    want = x @ layer.kernel[...].astype(BF16) + layer.bias[...].astype(BF16)
    y = layer(x)
    assert y.shape == (32,)
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(want, np.float32),
                               rtol=2e-2, atol=2e-2)
  layer = RowParallelLinear(64, 32, bias_init=_nonzero_bias_init, rngs=nnx.Rngs(0))
  g, state = nnx.split(layer)
  y = jax.jit(shard_map(lambda s, x: nnx.merge(g, s)(x), mesh,
                        (nnx.get_partition_spec(state), P("tp")), P()))(state, x)
  assert y.shape == (32,)
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(want, np.float32),
                             rtol=2e-2, atol=2e-2)
  col = ColumnParallelLinear(64, 32, rngs=nnx.Rngs(0))
  assert col(x).shape == (32,)
  layer = RowParallelLinear(64, 32, reduce="reduce_scatter", mesh=mesh, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"RowParallelLinear: reduce='reduce_scatter' scatters "
                                       r"x's rows over axis 'tp', and x of shape \(64,\) has none"):
    jax.jit(lambda x: layer(x))(x)


@pytest.mark.parametrize("linen", [False, True], ids=["nnx", "linen"])
def test_column_backward_is_xlas_by_default(linen, rng):
  """overlap_backward is off by default: under check_vma with x replicated, the column
  layer's backward all-reduce of dx is XLA's psum, not matmul_all_reduce."""
  mesh = make_mesh_1d(4)
  x = jnp.asarray(rng.standard_normal((8, 32)), BF16)
  if linen:
    layer = ColumnParallelDense(64)
    variables = nn.unbox(layer.init(jax.random.key(0), x))
    specs = nn.get_partition_spec(layer.init(jax.random.key(0), x))
    body = lambda p, x: layer.apply(p, x)  # noqa: E731
  else:
    g, variables = nnx.split(ColumnParallelLinear(32, 64, rngs=nnx.Rngs(0)))
    specs = nnx.get_partition_spec(variables)
    body = lambda s, x: nnx.merge(g, s)(x)  # noqa: E731
  f = shard_map(body, mesh, (specs, P()), P(None, "tp"))
  text = str(jax.make_jaxpr(jax.grad(lambda p, x: jnp.sum(f(p, x).astype(jnp.float32)),
                                     argnums=(0, 1)))(variables, x))
  assert "flashoverlap_gemm_all_reduce" not in text
  assert "psum" in text


@pytest.mark.parametrize("cls", [RowParallelDense, ColumnParallelDense])
def test_linen_use_bias_false_makes_no_bias(cls, rng):
  """use_bias=False: no bias param at all (as nn.Dense), and y = x @ kernel."""
  x = jnp.asarray(rng.standard_normal((8, 64)), BF16)
  layer = cls(32, use_bias=False)
  variables = layer.init(jax.random.key(0), x)
  assert set(variables["params"]) == {"kernel"}
  kernel = nn.unbox(variables)["params"]["kernel"].astype(BF16)
  np.testing.assert_allclose(np.asarray(layer.apply(variables, x), np.float32),
                             np.asarray(x @ kernel, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("reduce", ["all_reduce", "reduce_scatter"])
def test_layers_under_rank_promotion_raise(reduce, rng):
  """jax_numpy_rank_promotion='raise' (which nnx.Linear / nn.Dense work under: their bias
  add spells the broadcast out): the layers' bias add raised "Operands could not be
  broadcast together for add on shapes (8, 32) (32,)". Each layer (NNX and linen, row and
  column, per device in shard_map and as the global view) gives the same values and grads
  under 'raise' as without it."""
  mesh = make_mesh_1d(4)
  x = jnp.asarray(rng.standard_normal((8, 64)), BF16)
  row = RowParallelLinear(64, 32, reduce=reduce, bias_init=_nonzero_bias_init,
                          rngs=nnx.Rngs(0))
  col = ColumnParallelLinear(64, 32, bias_init=_nonzero_bias_init, rngs=nnx.Rngs(1))
  linen_row = RowParallelDense(32, reduce=reduce, bias_init=_nonzero_bias_init)
  linen_col = ColumnParallelDense(32, bias_init=_nonzero_bias_init)
  y_spec = P("tp") if reduce == "reduce_scatter" else P()

  def nnx_in_shard_map(layer, x_spec, out_spec):
    g, state = nnx.split(layer)
    f = shard_map(lambda s, x: nnx.merge(g, s)(x), mesh,
                  (nnx.get_partition_spec(state), x_spec), out_spec)
    return lambda: (f(state, x), jax.grad(lambda s: jnp.sum(f(s, x).astype(jnp.float32)))(state))

  def linen_in_shard_map(layer, x_spec, out_spec):
    v = layer.init(jax.random.key(2), x)
    specs, p = nn.get_partition_spec(v), nn.unbox(v)
    f = shard_map(lambda p, x: layer.apply(p, x), mesh, (specs, x_spec), out_spec)
    return lambda: (f(p, x), jax.grad(lambda p: jnp.sum(f(p, x).astype(jnp.float32)))(p))

  def nnx_global():
    from jax.sharding import NamedSharding
    with jax.sharding.set_mesh(mesh):  # params sharded by their annotations
      layer = RowParallelLinear(64, 32, reduce=reduce, bias_init=_nonzero_bias_init,
                                rngs=nnx.Rngs(3))
    xg = jax.device_put(x, NamedSharding(mesh, P(None, "tp")))

    def run():
      with jax.sharding.set_mesh(mesh):
        return nnx.jit(lambda m, x: (m(x), nnx.grad(
            lambda m: jnp.sum(m(x).astype(jnp.float32)))(m)))(layer, xg)
    return run

  programs = {
      "nnx row": nnx_in_shard_map(row, P(None, "tp"), y_spec),
      "nnx column": nnx_in_shard_map(col, P(), P(None, "tp")),
      "linen row": linen_in_shard_map(linen_row, P(None, "tp"), y_spec),
      "linen column": linen_in_shard_map(linen_col, P(), P(None, "tp")),
      "nnx row global view": nnx_global(),
  }
  as_np = lambda tree: jax.tree.map(lambda a: np.asarray(a, np.float32), tree)  # noqa: E731
  for name, run in programs.items():
    want = as_np(run())
    with jax.numpy_rank_promotion("raise"):
      got = as_np(run())
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert np.abs(jax.tree.leaves(got)[0]).max() > 0, name
