"""Flax layers with sequence parallelism (jax_flashoverlap.flax): the column layer with
sequence_parallel=True and the row layer with reduce="reduce_scatter", inside shard_map and
under plain jit on 1-D and (dp, tp) meshes, with the sequence as x's first dim or, with
sequence_dim=1, its second; values and grads against XLA's collectives."""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import assert_close, f32, hlo_collectives, make_mesh_1d, make_mesh_2d, rand, shard_map

flax = pytest.importorskip("flax")
from flax import nnx  # noqa: E402
import flax.linen as nn  # noqa: E402

from jax_flashoverlap.flax import (ColumnParallelDense, ColumnParallelLinear,  # noqa: E402
                                   RowParallelDense, RowParallelLinear)
from _flax_util import BF16, loss as _loss, nonzero_bias as _nonzero_bias  # noqa: E402


# ----------------------------------------------------------------------------- global view

@pytest.mark.parametrize("linen", [False, True], ids=["nnx", "linen"])
def test_sequence_parallel_column_global_view(linen, rng):
  """sequence_parallel=True under plain jit: x [S, B, in] with S sharded over tp is the
  column_parallel_matmul global view (one all-gather of x in the compiled program, inside the
  op); values and grads equal x @ kernel's, output S whole and out sharded over tp."""
  mesh = make_mesh_1d(4)
  S, B, din, dout = 16, 3, 32, 64
  x = jax.device_put(rand(rng, (S, B, din), BF16), NamedSharding(mesh, P("tp", None, None)))
  with jax.set_mesh(mesh):
    if linen:
      layer = ColumnParallelDense(dout, sequence_parallel=True)
      variables = layer.init(jax.random.key(0), x)
      apply = lambda v, x: layer.apply(v, x)  # noqa: E731
      params = variables
      kernel = lambda v: nn.unbox(v)["params"]["kernel"]  # noqa: E731
      bias = lambda v: nn.unbox(v)["params"]["bias"]  # noqa: E731
    else:
      model = ColumnParallelLinear(din, dout, sequence_parallel=True, rngs=nnx.Rngs(0))
      _nonzero_bias(model)
      gdef, params = nnx.split(model)
      apply = lambda st, x: nnx.merge(gdef, st)(x)  # noqa: E731
      kernel = lambda st: st["kernel"][...]  # noqa: E731
      bias = lambda st: st["bias"][...]  # noqa: E731

    def ref(st, x):
      return x @ kernel(st).astype(BF16) + bias(st).astype(BF16)

    f = jax.jit(apply)
    y = f(params, x)
    hlo = f.lower(params, x).compile().as_text()
    g = jax.jit(jax.grad(lambda st, x: _loss(apply(st, x)), argnums=(0, 1)))(params, x)
    g_ref = jax.jit(jax.grad(lambda st, x: _loss(ref(st, x)), argnums=(0, 1)))(params, x)
  jaxpr = str(jax.make_jaxpr(apply)(params, x))
  assert "custom_partitioning" in jaxpr, "not the global-view op"
  assert hlo_collectives(hlo).count("all-gather") == 1, hlo
  assert y.shape == (S, B, dout) and y.sharding.spec[0] is None and y.sharding.spec[-1] == "tp"
  assert_close(y, ref(params, x))
  for got, want in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(f32(got), f32(want), rtol=2e-2, atol=2e-2)


# On a (dp, tp) mesh x keeps its leading dims (no flattening to rows): the sequence dim over
# tp is gathered inside the op, B keeps its dp sharding. Before, x was flattened to rows, and
# [B, S] as P(dp, tp) (B over 2 devices in blocks of 2) is not P((dp, tp)) rows: XLA gathered
# x itself and the op was a local dot; [S, B] as P(tp, dp) came back replicated.
_DP_TP_LAYOUTS = [((16, 4, 32), P("tp", "dp", None), 0, P(None, "dp", "tp")),  # [S, B, in]
                  ((16, 4, 32), P("tp", None, None), 0, P(None, None, "tp")),  # S over tp only
                  ((4, 16, 32), P("dp", "tp", None), 1, P("dp", None, "tp"))]  # [B, S, in]
_DP_TP_IDS = ["S-tp_B-dp", "S-tp-only", "B-dp_S-tp_dim1"]


def _sequence_parallel_on_dp_tp(rng, x_shape, x_spec, sequence_dim, monkeypatch):
  """(y, x @ kernel, all-gathers in the compiled program, the sequence_dim of each
  all_gather_matmul the partitioner lowered) of the column layer with sequence_parallel=True
  under plain jit on a (dp, tp) mesh."""
  from jax_flashoverlap import ops
  lowered, real = [], ops.all_gather_matmul
  monkeypatch.setattr(ops, "all_gather_matmul",
                      lambda *a, **k: lowered.append(k.get("sequence_dim", 0)) or real(*a, **k))
  mesh = make_mesh_2d(2, 4)
  x = jax.device_put(rand(rng, x_shape, BF16), NamedSharding(mesh, x_spec))
  with jax.set_mesh(mesh):
    model = ColumnParallelLinear(32, 64, axis_name="tp", sequence_parallel=True, use_bias=False,
                                 sequence_dim=sequence_dim, rngs=nnx.Rngs(0))
    gdef, params = nnx.split(model)
    f = jax.jit(lambda st, x: nnx.merge(gdef, st)(x))
    y = f(params, x)
    hlo = f.lower(params, x).compile().as_text()
  gathers = hlo_collectives(hlo).count("all-gather")
  return y, x @ params["kernel"][...].astype(BF16), gathers, lowered


@pytest.mark.parametrize("x_shape,x_spec,sequence_dim,out_spec", _DP_TP_LAYOUTS, ids=_DP_TP_IDS)
def test_sequence_parallel_column_global_view_on_a_dp_tp_mesh(rng, monkeypatch, x_shape, x_spec,
                                                              sequence_dim, out_spec):
  """One all-gather, the op's own (all_gather_matmul lowered on the sequence dim), the output
  over dp and tp, values equal x @ kernel."""
  y, want, gathers, lowered = _sequence_parallel_on_dp_tp(rng, x_shape, x_spec, sequence_dim,
                                                          monkeypatch)
  assert lowered == [sequence_dim] and gathers == 1, (lowered, gathers)
  assert y.sharding.spec == out_spec, y.sharding.spec
  assert_close(y, want)


def test_sequence_parallel_column_global_view_wrong_sequence_dim_warns(rng, monkeypatch):
  """[B, S, in] as P(dp, tp, None) with the default sequence_dim=0: XLA gathers x before a
  local dot (no overlap); a warning names sequence_dim=1; values right."""
  with pytest.warns(UserWarning, match="pass sequence_dim=1"):
    y, want, _, lowered = _sequence_parallel_on_dp_tp(rng, (4, 16, 32), P("dp", "tp", None), 0,
                                                      monkeypatch)
  assert lowered == []
  assert_close(y, want)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(sequence_dim=1), ValueError, "sequence_dim=1 needs sequence_parallel=True"),
    (dict(sequence_dim=1, row=True), ValueError, "sequence_dim=1 needs reduce='reduce_scatter'"),
    (dict(sequence_parallel=True, sequence_dim=-1), TypeError,
     "sequence_dim must be a non-negative int"),
    (dict(sequence_parallel=True, sequence_dim=True), TypeError, "sequence_dim must be"),
])
def test_sequence_dim_bad_arguments(kwargs, exc, match):
  kind = "Row" if kwargs.pop("row", False) else "Column"
  linear, dense = ((RowParallelLinear, RowParallelDense) if kind == "Row" else
                   (ColumnParallelLinear, ColumnParallelDense))
  with pytest.raises(exc, match=kind + r"ParallelLinear: " + match):
    linear(32, 64, rngs=nnx.Rngs(0), **kwargs)
  with pytest.raises(exc, match=kind + r"ParallelDense: " + match):
    dense(64, **kwargs).init(jax.random.key(0), jnp.ones((8, 32), BF16))


_ROW_DP_TP_LAYOUTS = [
    # (x shape, x spec, reduce, sequence_dim, output spec)
    ((16, 4, 32), P(None, "dp", "tp"), "all_reduce", 0, P(None, "dp", None)),
    ((16, 4, 32), P(None, "dp", "tp"), "reduce_scatter", 0, P("tp", "dp", None)),
    ((4, 16, 32), P("dp", None, "tp"), "reduce_scatter", 1, P("dp", "tp", None)),
]


@pytest.mark.parametrize("mesh_via", ["set_mesh", "mesh_kwarg"])
@pytest.mark.parametrize("x_shape,x_spec,reduce,sequence_dim,out_spec", _ROW_DP_TP_LAYOUTS,
                         ids=["S-B-dp_all_reduce", "S-B-dp_reduce_scatter", "B-dp-S_dim1"])
def test_row_global_view_on_a_dp_tp_mesh(rng, x_shape, x_spec, reduce, sequence_dim, out_spec,
                                         mesh_via):
  """The row layer under plain jit keeps x's leading dims: one collective (the op's), B over
  dp kept, the sequence dim scattered over tp. (Flattened to rows, [S, B] over (None, dp)
  came back replicated after gathers.) The mesh given to the NNX layer (mesh=, no
  jax.set_mesh around the jit) does the same: before, the layer named no axis then, and the
  reduce-scatter's output came back gathered; its bias is on the mesh too."""
  import contextlib
  mesh = make_mesh_2d(2, 4)
  x = jax.device_put(rand(rng, x_shape, BF16), NamedSharding(mesh, x_spec))
  kwargs = dict(mesh=mesh) if mesh_via == "mesh_kwarg" else {}
  with jax.set_mesh(mesh) if mesh_via == "set_mesh" else contextlib.nullcontext():
    model = RowParallelLinear(32, 64, axis_name="tp", reduce=reduce, sequence_dim=sequence_dim,
                              rngs=nnx.Rngs(0), **kwargs)
    # the bias replicated over the mesh either way (with mesh= Flax left it on one device)
    assert model.bias[...].sharding == NamedSharding(mesh, P(None)), model.bias[...].sharding
    _nonzero_bias(model)
    gdef, params = nnx.split(model)
    f = jax.jit(lambda st, x: nnx.merge(gdef, st)(x))
    y = f(params, x)
    hlo = f.lower(params, x).compile().as_text()
  colls = hlo_collectives(hlo)
  assert colls == [reduce.replace("_", "-")], colls
  got = tuple(y.sharding.spec) + (None,) * (3 - len(y.sharding.spec))
  assert got == tuple(out_spec), y.sharding.spec
  assert_close(y, x @ params["kernel"][...].astype(BF16) + params["bias"][...].astype(BF16))


@pytest.mark.parametrize("layout", ["S-B", "B-S"])
def test_sequence_parallel_mlp_global_view_on_a_dp_tp_mesh(rng, layout):
  """Megatron's sequence-parallel MLP under plain jit: column (all_gather_matmul) -> gelu ->
  row (matmul_reduce_scatter), x [S, B, d] as P(tp, dp, None) (or [B, S, d] as P(dp, tp, None)
  with sequence_dim=1): two collectives in the program, the ops' own, and the output back in
  x's layout; values equal the XLA layers'."""
  mesh = make_mesh_2d(2, 4)
  dim = 0 if layout == "S-B" else 1
  shape, spec = ((16, 4, 32), P("tp", "dp", None)) if dim == 0 else ((4, 16, 32),
                                                                     P("dp", "tp", None))
  x = jax.device_put(rand(rng, shape, BF16), NamedSharding(mesh, spec))
  with jax.set_mesh(mesh):
    up = ColumnParallelLinear(32, 64, sequence_parallel=True, sequence_dim=dim, rngs=nnx.Rngs(0))
    down = RowParallelLinear(64, 32, reduce="reduce_scatter", sequence_dim=dim, rngs=nnx.Rngs(1))
    gu, su = nnx.split(up)
    gd, sd = nnx.split(down)
    f = jax.jit(lambda su, sd, x: nnx.merge(gd, sd)(jax.nn.gelu(nnx.merge(gu, su)(x))))
    y = f(su, sd, x)
    hlo = f.lower(su, sd, x).compile().as_text()
  colls = hlo_collectives(hlo)
  assert sorted(colls) == ["all-gather", "reduce-scatter"], colls
  assert tuple(y.sharding.spec) + (None,) * (3 - len(y.sharding.spec)) == tuple(spec), \
      y.sharding.spec
  h = jax.nn.gelu(x @ su["kernel"][...].astype(BF16) + su["bias"][...].astype(BF16))
  assert_close(y, h @ sd["kernel"][...].astype(BF16) + sd["bias"][...].astype(BF16))


def test_row_sequence_dim_inside_shard_map(rng):
  """Row layer, reduce_scatter with sequence_dim=1 in the local view: x [B, S, in/n] per
  device, psum_scatter along S."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (3, 8, 32), BF16)
  layer = RowParallelDense(64, reduce="reduce_scatter", sequence_dim=1, use_bias=False)
  variables = layer.init(jax.random.key(0), x)
  specs = nn.get_partition_spec(variables)
  params = nn.unbox(variables)
  f = jax.jit(shard_map(lambda p, x: layer.apply(p, x), mesh,
                        (specs, P(None, None, "tp")), P(None, "tp", None)))
  y = f(params, x)
  assert y.shape == (3, 8, 64)
  assert_close(y, x @ params["params"]["kernel"].astype(BF16))


def test_sequence_dim_inside_shard_map(rng):
  """sequence_dim=1 in the local view: x [B, S/n, in] per device, all_gather along S."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (3, 16, 32), BF16)
  layer = ColumnParallelDense(64, sequence_parallel=True, sequence_dim=1, use_bias=False)
  variables = layer.init(jax.random.key(0), x)
  specs = nn.get_partition_spec(variables)
  params = nn.unbox(variables)
  f = jax.jit(shard_map(lambda p, x: layer.apply(p, x), mesh,
                        (specs, P(None, "tp", None)), P(None, None, "tp")))
  y = f(params, x)
  assert y.shape == (3, 16, 64)
  assert_close(y, x @ params["params"]["kernel"].astype(BF16))


# ----------------------------------------------------------------------------- shard_map

@pytest.mark.parametrize("sequence_dim", [0, 1], ids=["S-B", "B-S"])
@pytest.mark.parametrize("overlap_backward", [False, True])
def test_sequence_parallel_mlp_matches_xla_collectives(rng, overlap_backward, sequence_dim):
  """Megatron-style sequence parallelism: x sharded on its first dim (sequence_dim=1: its
  second, x [B, S, d]), column layer with sequence_parallel=True (all_gather_matmul), row
  layer with reduce='reduce_scatter' back to the sharded layout; values and grads equal
  all_gather / nnx.Linear / psum_scatter. With overlap_backward=True the column layer's dx (a
  reduce-scatter of dy @ kernel.T) is matmul_reduce_scatter on the kernel read in place, and
  the row layer's dx (all_gather(dy) @ kernel.T) is all_gather_matmul, whose gathered dy also
  makes dw."""
  mesh = make_mesh_1d(4)
  d = sequence_dim
  x = rand(rng, (8, 3, 32) if d == 0 else (3, 8, 32), BF16)
  x_spec = P("tp") if d == 0 else P(None, "tp")
  up = ColumnParallelLinear(32, 64, sequence_parallel=True, overlap_backward=overlap_backward,
                            sequence_dim=d, rngs=nnx.Rngs(0))
  down = RowParallelLinear(64, 32, reduce="reduce_scatter", overlap_backward=overlap_backward,
                           sequence_dim=d, rngs=nnx.Rngs(1))
  _nonzero_bias(up)
  _nonzero_bias(down)
  (g_up, s_up), (g_down, s_down) = nnx.split(up), nnx.split(down)
  state = {"up": s_up, "down": s_down}
  specs = {"up": nnx.get_partition_spec(s_up), "down": nnx.get_partition_spec(s_down)}

  def ours(st, x):
    return nnx.merge(g_down, st["down"])(jax.nn.gelu(nnx.merge(g_up, st["up"])(x)))

  def ref(st, x):
    u, dn = st["up"], st["down"]
    h = lax.all_gather(x, "tp", axis=d, tiled=True) @ u["kernel"][...].astype(BF16)
    h = jax.nn.gelu(h + u["bias"][...].astype(BF16))
    y = lax.psum_scatter(h @ dn["kernel"][...].astype(BF16), "tp", scatter_dimension=d,
                         tiled=True)
    return y + dn["bias"][...].astype(BF16)

  def run(fn):
    f = shard_map(fn, mesh, (specs, x_spec), x_spec)
    return jax.jit(f)(state, x), jax.jit(jax.grad(lambda s, x: _loss(f(s, x)),
                                                  argnums=(0, 1)))(state, x)
  (y, (gs, gx)), (y_ref, (gs_ref, gx_ref)) = run(ours), run(ref)
  assert y.shape == x.shape
  # Up to bf16 rounding: the ops run XLA's dot on [rows, K] (flattened), the reference on
  # the 3-D array, and XLA:CPU may sum those in another order.
  assert_close(y, y_ref)
  assert_close(gx, gx_ref)
  for layer in ("up", "down"):
    for k in ("kernel", "bias"):
      assert_close(gs[layer][k].get_value(), gs_ref[layer][k].get_value(), BF16)
  text = str(jax.make_jaxpr(shard_map(ours, mesh, (specs, x_spec), x_spec))(state, x))
  assert "flashoverlap_all_gather_gemm" in text and "flashoverlap_gemm_reduce_scatter" in text
  # The backward: the row layer's reduce-scatter transposes to XLA's all_gather (with
  # overlap_backward: our all-gather + GEMM returning the gathered dy); the column layer's dx
  # is our reduce-scatter (on w as stored) only with overlap_backward.
  f = shard_map(ours, mesh, (specs, x_spec), x_spec)
  grad_text = str(jax.make_jaxpr(jax.grad(lambda s, x: _loss(f(s, x)), argnums=(0, 1)))(
      state, x))
  rs_params = re.findall(r"flashoverlap_gemm_reduce_scatter\[(.*?)\]", grad_text, re.S)
  # the forward's row layer, plus (overlap_backward) the column layer's dx, transpose_w=True
  assert len(rs_params) == (2 if overlap_backward else 1), grad_text
  assert any("transpose_w=True" in p for p in rs_params) == overlap_backward, rs_params
  ag_params = re.findall(r"flashoverlap_all_gather_gemm\[(.*?)\]", grad_text, re.S)
  # the forward's column layer, plus (overlap_backward) the row layer's dx
  assert len(ag_params) == (2 if overlap_backward else 1), grad_text
  gathering = [p for p in ag_params if "return_gathered=True" in p]
  assert len(gathering) == overlap_backward, ag_params
  assert all("transpose_w=True" in p for p in gathering), ag_params


def test_sequence_parallel_is_for_column_layers():
  with pytest.raises(ValueError, match="sequence_parallel is for column layers"):
    RowParallelLinear(64, 32, sequence_parallel=True, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match="sequence_parallel must be a bool"):
    ColumnParallelLinear(64, 32, sequence_parallel="yes", rngs=nnx.Rngs(0))
