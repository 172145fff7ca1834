"""Flax layers (jax_flashoverlap.flax): NNX and linen row/column-parallel layers against the same
layer built from nnx.Linear / nn.Dense + XLA collectives with the same params, inside shard_map
(per-device params) and under jit with sharding annotations (global params)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import assert_close, assert_rel_fro, f32, make_mesh_1d, make_mesh_2d, rand, shard_map

flax = pytest.importorskip("flax")
from flax import nnx  # noqa: E402
import flax.linen as nn  # noqa: E402

from jax_flashoverlap.flax import (SHARDING_KEY, ColumnParallelDense,  # noqa: E402
                                   ColumnParallelLinear, RowParallelDense, RowParallelLinear)

from _flax_util import BF16, exact as _exact, loss as _loss  # noqa: E402
from _flax_util import nonzero_bias as _nonzero_bias  # noqa: E402


# ----------------------------------------------------------------------------- NNX, shard_map

def _nnx_pair(kind, n, din, dout, reduce="all_reduce", use_bias=True):
  """(our layer, per-device reference fn(params, x)) with the same global params."""
  cls = RowParallelLinear if kind == "row" else ColumnParallelLinear
  ours = cls(din, dout, reduce=reduce, use_bias=use_bias, rngs=nnx.Rngs(0))
  _nonzero_bias(ours)
  if kind == "row":  # nnx.Linear on the local K shard, the collective, then the bias once
    ref = nnx.Linear(din // n, dout, use_bias=False, dtype=BF16, rngs=nnx.Rngs(1))

    def ref_fn(state, x):
      y = nnx.merge(gdef, nnx.State({"kernel": state["kernel"]}))(x)
      y = lax.psum(y, "tp") if reduce == "all_reduce" else \
          lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
      return y + state["bias"].astype(BF16) if use_bias else y
  else:  # nnx.Linear on the local output shard, bias included: no communication
    ref = nnx.Linear(din, dout // n, use_bias=use_bias, dtype=BF16, rngs=nnx.Rngs(1))

    def ref_fn(state, x):
      return nnx.merge(gdef, state)(x)
  gdef, _ = nnx.split(ref)
  return ours, ref_fn


@pytest.mark.parametrize("n", [2, 4], ids=lambda n: f"tp{n}")
@pytest.mark.parametrize("kind,reduce", [("row", "all_reduce"), ("row", "reduce_scatter"),
                                         ("col", None)])
def test_nnx_shard_map_matches_linear_plus_collective(kind, reduce, n, rng):
  mesh = make_mesh_1d(n)
  din, dout, m = 64, 32, 8
  ours, ref_fn = _nnx_pair(kind, n, din, dout, reduce or "all_reduce")
  gdef, state = nnx.split(ours)
  specs = nnx.get_partition_spec(state)
  assert specs["kernel"].get_value() == (P("tp", None) if kind == "row" else P(None, "tp"))
  x_spec = P(None, "tp") if kind == "row" else P()
  y_spec = {"all_reduce": P(), "reduce_scatter": P("tp"), None: P(None, "tp")}[reduce]
  x = rand(rng, (m, din), BF16)

  def run(fn):
    f = shard_map(fn, mesh, in_specs=(specs, x_spec), out_specs=y_spec)
    y = jax.jit(f)(state, x)
    grads = jax.jit(jax.grad(lambda s, x: _loss(f(s, x)), argnums=(0, 1)))(state, x)
    return y, grads

  y, (gs, gx) = run(lambda s, x: nnx.merge(gdef, s)(x))
  y_ref, (gs_ref, gx_ref) = run(ref_fn)
  assert y.shape == y_ref.shape and y.dtype == BF16
  _exact(y, y_ref)
  _exact(gx, gx_ref)
  for k in ("kernel", "bias"):
    assert gs[k].get_value().dtype == jnp.float32
    _exact(gs[k].get_value(), gs_ref[k].get_value())


def test_nnx_row_3d_input_reduce_scatter_and_bias_once(rng):
  """x [B, S, K]: scattered over the first dim; a zero kernel leaves exactly the bias (added
  once, not n times)."""
  mesh = make_mesh_1d(4)
  layer = RowParallelLinear(64, 16, reduce="reduce_scatter", rngs=nnx.Rngs(0))
  _nonzero_bias(layer)
  gdef, state = nnx.split(layer)
  specs = nnx.get_partition_spec(state)
  x = rand(rng, (8, 3, 64), BF16)
  f = jax.jit(shard_map(lambda s, x: nnx.merge(gdef, s)(x), mesh, (specs, P(None, None, "tp")),
                        P("tp")))
  y = f(state, x)
  w = state["kernel"][...].astype(BF16)
  assert y.shape == (8, 3, 16)
  assert_close(y, (x @ w) + state["bias"][...].astype(BF16))
  state["kernel"][...] = jnp.zeros_like(state["kernel"][...])
  _exact(f(state, x), jnp.broadcast_to(state["bias"][...].astype(BF16), (8, 3, 16)))


@pytest.mark.parametrize("check_vma", [True, False])
def test_column_backward_all_reduce_is_ours_only_under_check_vma(check_vma, rng):
  """Column layer, x replicated over tp: dx = psum(dy @ w.T). Under check_vma=True that psum
  is our overlapped matmul_all_reduce (in the grad's jaxpr); under check_vma=False JAX itself
  adds no psum (the user owns it), and neither do we."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 32), BF16)
  for overlap in (True, False):
    layer = ColumnParallelLinear(32, 64, overlap_backward=overlap, rngs=nnx.Rngs(0))
    gdef, state = nnx.split(layer)
    specs = nnx.get_partition_spec(state)
    f = jax.shard_map(lambda s, x: nnx.merge(gdef, s)(x), mesh=mesh, in_specs=(specs, P()),
                      out_specs=P(None, "tp"), check_vma=check_vma)
    grad = jax.grad(lambda s, x: _loss(f(s, x)), argnums=(0, 1))
    text = str(jax.make_jaxpr(grad)(state, x))
    assert ("flashoverlap_gemm_all_reduce" in text) == (check_vma and overlap), text
    assert ("flashoverlap_gemm_all_reduce" in str(jax.make_jaxpr(f)(state, x))) is False
    results = jax.jit(grad)(state, x)
    if overlap:
      on = results
  # dx: ours sums each rank's dy @ w.T unrounded, as XLA's own psum(dy @ w.T) does (the
  # same bits: test_cpu_reference.py). JAX's backward without our op was that too on JAX
  # 0.10; on 0.11 XLA's CPU program rounds each rank's product to bfloat16 before the sum
  # there (measured, benchmarks/results/logs/cpu_suite_jax0112_h100x1/), so the two differ
  # by that rounding. dw has no collective: the same bits either way.
  assert_close(on[1], results[1])
  _exact(on[0]["kernel"].get_value(), results[0]["kernel"].get_value())


def test_column_overlap_backward_with_x_varying_is_xlas(rng):
  """overlap_backward=True with x already varying over tp (its rows sharded): dx needs no
  all-reduce, so the layer is XLA's dot (column_matmul would refuse x varying); values and
  grads equal the layer with the flag off."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 32), BF16)
  out = []
  for overlap in (True, False):
    layer = ColumnParallelLinear(32, 64, overlap_backward=overlap, rngs=nnx.Rngs(0))
    _nonzero_bias(layer)
    gdef, state = nnx.split(layer)
    f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), mesh,
                  (nnx.get_partition_spec(state), P("tp")), P("tp"))
    out.append(jax.jit(lambda s, x: (f(s, x), jax.grad(lambda s, x: _loss(f(s, x)),
                                                       argnums=(0, 1))(s, x)))(state, x))
  (y, (gs, gx)), (y_ref, (gs_ref, gx_ref)) = out
  _exact(y, y_ref)
  _exact(gx, gx_ref)
  for k in ("kernel", "bias"):
    _exact(gs[k].get_value(), gs_ref[k].get_value())


def test_nnx_constructed_inside_shard_map_has_local_shapes(rng):
  """Layers made inside the body get local shapes, and compute what the same layers made
  outside (global params, the same rngs) compute: each device holds its own block of the
  params (test_flax_checks.py checks the blocks), so the row layer's all-reduce and the
  column layer's column blocks give the global product. A shape check alone passed with
  any values (the same block on every device, a missing all-reduce)."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 64), BF16)

  def body(x):
    row = RowParallelLinear(64, 32, rngs=nnx.Rngs(0))
    col = ColumnParallelLinear(32, 64, rngs=nnx.Rngs(0))
    assert row.kernel.shape == (16, 32) and col.kernel.shape == (32, 16)
    assert col.bias.shape == (16,)
    return col(row(x))
  y = jax.jit(shard_map(body, mesh, P(None, "tp"), P(None, "tp")))(x)
  assert y.shape == (8, 64) and y.dtype == BF16
  row = RowParallelLinear(64, 32, rngs=nnx.Rngs(0))
  col = ColumnParallelLinear(32, 64, rngs=nnx.Rngs(0))
  p32 = lambda a: f32(jnp.asarray(a, BF16))  # noqa: E731  (float32 on the bf16-rounded value)
  h = p32(f32(x) @ p32(row.kernel[...]) + p32(row.bias[...]))
  assert_rel_fro(y, h @ p32(col.kernel[...]) + p32(col.bias[...]))


# ----------------------------------------------------------------------------- NNX, global view

@pytest.mark.parametrize("reduce,out_spec", [("all_reduce", P()), ("reduce_scatter", P("tp"))])
def test_nnx_jit_global_view(reduce, out_spec, rng):
  """Under jax.set_mesh the params are sharded by their annotations; the forward is
  row_parallel_matmul; values and grads equal nnx.Linear's (XLA inserts its collectives)."""
  mesh = make_mesh_1d(4)
  x = jax.device_put(rand(rng, (16, 64), BF16), NamedSharding(mesh, P(None, "tp")))
  with jax.set_mesh(mesh):
    ours = RowParallelLinear(64, 32, reduce=reduce, rngs=nnx.Rngs(0))
    _nonzero_bias(ours)
    assert ours.kernel[...].sharding.spec == P("tp", None)
    ref = nnx.Linear(64, 32, dtype=BF16, rngs=nnx.Rngs(1))
    nnx.update(ref, nnx.state(ours))
    fwd = nnx.jit(lambda m, x: m(x))
    y, y_ref = fwd(ours, x), fwd(ref, x)
    assert y.sharding.spec == out_spec
    g = nnx.jit(nnx.grad(lambda m, x: _loss(m(x))))
    g_ours, g_ref = g(ours, x), g(ref, x)
  jaxpr = str(jax.make_jaxpr(lambda m, x: m(x))(ours, x))
  assert "custom_partitioning" in jaxpr  # the global-view op, not a plain dot
  assert_close(y, y_ref)
  for k in ("kernel", "bias"):
    np.testing.assert_allclose(f32(g_ours[k][...]), f32(g_ref[k][...]), rtol=2e-2, atol=2e-2)


def test_nnx_jit_global_view_2d_mesh_mlp(rng):
  """Column -> row on a (dp, tp) mesh with x sharded over dp, under plain jax.jit."""
  mesh = make_mesh_2d(2, 2)
  x = jax.device_put(rand(rng, (8, 32), BF16), NamedSharding(mesh, P("dp", None)))
  with jax.set_mesh(mesh):
    col = ColumnParallelLinear(32, 64, rngs=nnx.Rngs(0))
    row = RowParallelLinear(64, 32, rngs=nnx.Rngs(1))
    gc, sc = nnx.split(col)
    gr, sr = nnx.split(row)
    y = jax.jit(lambda sc, sr, x: nnx.merge(gr, sr)(jax.nn.relu(nnx.merge(gc, sc)(x))))(sc, sr, x)
  assert y.sharding.spec == P("dp")
  h = jax.nn.relu(x @ sc["kernel"][...].astype(BF16) + sc["bias"][...].astype(BF16))
  assert_close(y, h @ sr["kernel"][...].astype(BF16) + sr["bias"][...].astype(BF16))


# ----------------------------------------------------------------------------- linen

@pytest.mark.parametrize("kind,reduce,n", [("row", "all_reduce", 2), ("row", "reduce_scatter", 4),
                                           ("col", "all_reduce", 4)])
def test_linen_shard_map_matches_dense_plus_collective(kind, reduce, n, rng):
  mesh = make_mesh_1d(n)
  din, dout = 64, 32
  x = rand(rng, (8, din), BF16)
  layer = (RowParallelDense(dout, reduce=reduce) if kind == "row" else ColumnParallelDense(dout))
  variables = layer.init(jax.random.key(0), x)  # global params, partition-annotated
  specs = nn.get_partition_spec(variables)
  params = nn.unbox(variables)["params"]
  params["bias"] = jnp.linspace(-1.0, 1.0, params["bias"].shape[0])
  pspecs = specs["params"]
  x_spec = P(None, "tp") if kind == "row" else P()
  y_spec = P("tp") if reduce == "reduce_scatter" else (P() if kind == "row" else P(None, "tp"))

  def ours(p, x):
    return layer.apply({"params": p}, x)

  def ref(p, x):
    if kind == "col":
      return nn.Dense(dout // n, dtype=BF16).apply({"params": p}, x)
    y = nn.Dense(dout, use_bias=False, dtype=BF16).apply({"params": {"kernel": p["kernel"]}}, x)
    y = lax.psum(y, "tp") if reduce == "all_reduce" else \
        lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
    return y + p["bias"].astype(BF16)

  def run(fn):
    f = shard_map(fn, mesh, (pspecs, x_spec), y_spec)
    return jax.jit(f)(params, x), jax.jit(jax.grad(lambda p, x: _loss(f(p, x))))(params, x)
  (y, g), (y_ref, g_ref) = run(ours), run(ref)
  _exact(y, y_ref)
  for k in params:
    _exact(g[k], g_ref[k])


def test_linen_init_inside_shard_map_and_jit_global_view(rng):
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 64), BF16)
  layer = RowParallelDense(32, reduce="reduce_scatter")
  specs = nn.get_partition_spec(jax.eval_shape(layer.init, jax.random.key(0), x))
  local = jax.jit(shard_map(lambda x: layer.init(jax.random.key(0), x), mesh, P(None, "tp"),
                            specs))(x)
  assert nn.unbox(local)["params"]["kernel"].shape == (64, 32)
  with jax.set_mesh(mesh):
    variables = jax.jit(layer.init)(jax.random.key(0), x)
    kernel = nn.unbox(variables)["params"]["kernel"]
    assert kernel.sharding.spec == P("tp", None)
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "tp")))
    y = jax.jit(layer.apply)(variables, xs)
  assert y.sharding.spec == P("tp")
  assert_close(y, x @ kernel.astype(BF16))


# ----------------------------------------------------------------------------- logical axes

RULES = (("mlp", "tp"), ("embed", None))


def test_nnx_logical_axes_resolve_to_the_mesh_axis_and_match_explicit(rng):
  """kernel_axes + flax's logical axis rules give the same layer as axis_name="tp": params
  annotated with the logical names, the spec resolved by the rules, identical values."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 64), BF16)
  with nn.logical_axis_rules(RULES):
    row = RowParallelLinear(64, 32, kernel_axes=("mlp", "embed"), rngs=nnx.Rngs(0))
    assert row.cfg.axis_name == "tp"
    gdef, state = nnx.split(row)
    assert state["kernel"].get_metadata()[SHARDING_KEY] == ("mlp", "embed")
    specs = nnx.get_partition_spec(state)
  assert specs["kernel"].get_value() == P("tp", None) and specs["bias"].get_value() == P(None)
  explicit = RowParallelLinear(64, 32, axis_name="tp", rngs=nnx.Rngs(0))
  egdef, estate = nnx.split(explicit)
  run = lambda g, st, sp: jax.jit(shard_map(lambda s, x: nnx.merge(g, s)(x), mesh,
                                            (sp, P(None, "tp")), P()))(st, x)
  _exact(run(gdef, state, specs), run(egdef, estate, nnx.get_partition_spec(estate)))


def test_nnx_logical_axes_with_the_layers_own_rules():
  col = ColumnParallelLinear(32, 64, kernel_axes=("embed", "mlp"), sharding_rules=RULES,
                             rngs=nnx.Rngs(0))
  assert col.cfg.axis_name == "tp"
  specs = nnx.get_partition_spec(nnx.state(col))
  assert specs["kernel"].get_value() == P(None, "tp") and specs["bias"].get_value() == P("tp")


@pytest.mark.parametrize("kwargs,match", [
    (dict(kernel_axes=("heads", "embed")), "logical axis 'heads'\\) must map to one mesh axis"),
    (dict(kernel_axes=("mlp", "vocab"), sharding_rules=(("vocab", "dp"),)),
     "logical axis 'vocab'\\) maps to mesh axis 'dp'"),
    (dict(kernel_axes=("mlp", "embed"), axis_name="dp"), "disagrees with kernel_axes"),
    (dict(kernel_axes="mlp"), "kernel_axes must be two logical axis names"),
])
def test_nnx_logical_axes_errors(kwargs, match):
  with nn.logical_axis_rules(RULES):
    with pytest.raises((ValueError, TypeError), match=match):
      RowParallelLinear(64, 32, rngs=nnx.Rngs(0), **kwargs)


def test_linen_logical_axes_in_shard_map_and_global_view(rng):
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 64), BF16)
  layer = RowParallelDense(32, kernel_axes=("mlp", "embed"))
  explicit = RowParallelDense(32, axis_name="tp")
  with nn.logical_axis_rules(RULES):
    abstract = jax.eval_shape(layer.init, jax.random.key(0), x)
    assert isinstance(abstract["params"]["kernel"], nn.LogicallyPartitioned)
    specs = nn.logical_to_mesh(nn.get_partition_spec(abstract))
    assert specs["params"]["kernel"] == P("tp", None)
    with jax.set_mesh(mesh):
      variables = jax.jit(layer.init)(jax.random.key(0), x)
      kernel = nn.unbox(variables)["params"]["kernel"]
      assert kernel.sharding.spec == P("tp", None)
      xs = jax.device_put(x, NamedSharding(mesh, P(None, "tp")))
      y = jax.jit(layer.apply)(variables, xs)
      y_explicit = jax.jit(explicit.apply)(nn.unbox(variables), xs)
  _exact(y, y_explicit)
  assert_close(y, x @ kernel.astype(BF16))


# ----------------------------------------------------------------------------- dtypes

@pytest.mark.parametrize("dtype,param_dtype", [(jnp.float16, jnp.float32),
                                               (jnp.bfloat16, jnp.bfloat16),
                                               (jnp.float16, jnp.float16)])
def test_dtype_and_param_dtype(dtype, param_dtype, rng):
  mesh = make_mesh_1d(2)
  layer = RowParallelLinear(32, 16, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))
  assert layer.kernel[...].dtype == param_dtype and layer.bias[...].dtype == param_dtype
  gdef, state = nnx.split(layer)
  x = rand(rng, (4, 32), jnp.float32)  # cast to dtype by the layer
  y = jax.jit(shard_map(lambda s, x: nnx.merge(gdef, s)(x), mesh,
                        (nnx.get_partition_spec(state), P(None, "tp")), P()))(state, x)
  assert y.dtype == dtype
  w = state["kernel"][...].astype(dtype)
  assert_close(y, x.astype(dtype) @ w + state["bias"][...].astype(dtype))


# ----------------------------------------------------------------------------- checkpoints

def test_nnx_checkpoint_round_trip(tmp_path, rng):
  layer = RowParallelLinear(32, 16, rngs=nnx.Rngs(0))
  _nonzero_bias(layer)
  state = nnx.state(layer)
  fresh = RowParallelLinear(32, 16, rngs=nnx.Rngs(7))
  try:
    import orbax.checkpoint as ocp
  except ImportError:
    ocp = None
  if ocp is not None:
    with ocp.StandardCheckpointer() as ckpt:
      ckpt.save(tmp_path / "ckpt", nnx.to_pure_dict(state))
      ckpt.wait_until_finished()
      restored = ckpt.restore(tmp_path / "ckpt", nnx.to_pure_dict(nnx.state(fresh)))
    nnx.replace_by_pure_dict(target := nnx.state(fresh), restored)
    nnx.update(fresh, target)
  else:  # pragma: no cover
    from flax import serialization
    data = serialization.to_bytes(nnx.to_pure_dict(state))
    nnx.update(fresh, serialization.from_bytes(nnx.to_pure_dict(nnx.state(fresh)), data))
  for k in ("kernel", "bias"):
    _exact(getattr(fresh, k)[...], getattr(layer, k)[...])
  assert nnx.get_partition_spec(nnx.state(fresh))["kernel"].get_value() == P("tp", None)


def test_linen_serialization_round_trip(rng):
  from flax import serialization
  x = rand(rng, (4, 32), BF16)
  layer = ColumnParallelDense(16)
  variables = layer.init(jax.random.key(0), x)
  other = layer.init(jax.random.key(1), x)
  restored = serialization.from_bytes(other, serialization.to_bytes(variables))
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(variables)):
    _exact(a, b)


# ----------------------------------------------------------------------------- errors

def test_bad_config_errors(rng):
  with pytest.raises(ValueError, match="reduce must be one of"):
    RowParallelLinear(32, 16, reduce="all_gather", rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="only bfloat16 and float16"):
    RowParallelLinear(32, 16, dtype=jnp.float32, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="only bfloat16 and float16"):
    ColumnParallelLinear(32, 16, dtype=None, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="param_dtype"):
    RowParallelLinear(32, 16, param_dtype=jnp.int32, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="positive int"):
    RowParallelLinear(0, 16, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="axis_name"):
    RowParallelLinear(32, 16, axis_name=("tp",), rngs=nnx.Rngs(0))
  x = rand(rng, (4, 32), BF16)
  with pytest.raises(ValueError, match="reduce must be one of"):
    RowParallelDense(16, reduce="bogus").init(jax.random.key(0), x)
  with pytest.raises(TypeError, match="only bfloat16 and float16"):
    ColumnParallelDense(16, dtype=jnp.float32).init(jax.random.key(0), x)

  mesh = make_mesh_1d(4)
  with jax.set_mesh(mesh):  # the axis size is known: divisibility is checked at construction
    with pytest.raises(ValueError, match="in_features=34 is not divisible by the size 4"):
      RowParallelLinear(34, 16, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="out_features=18 is not divisible by the size 4"):
      ColumnParallelLinear(32, 18, rngs=nnx.Rngs(0))

  # Global (unsharded) params passed into shard_map: a shape error naming both views.
  layer = RowParallelLinear(32, 16, rngs=nnx.Rngs(0))
  gdef, state = nnx.split(layer)
  f = shard_map(lambda s, x: nnx.merge(gdef, s)(x), mesh, (P(), P(None, "tp")), P())
  with pytest.raises(ValueError, match="inside shard_map over 'tp'"):
    f(state, x)
  with pytest.raises(ValueError, match=r"expected x \[\.\.\., 32\]"):
    layer(rand(rng, (4, 24), BF16))
