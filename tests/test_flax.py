"""Flax layers (jax_flashoverlap.flax): NNX and linen row/column-parallel layers against the same
layer built from nnx.Linear / nn.Dense + XLA collectives with the same params, inside shard_map
(per-device params) and under jit with sharding annotations (global params)."""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import assert_close, f32, make_mesh_1d, make_mesh_2d, rand, shard_map

flax = pytest.importorskip("flax")
from flax import nnx  # noqa: E402
import flax.linen as nn  # noqa: E402

from jax_flashoverlap.flax import (ColumnParallelDense, ColumnParallelLinear,  # noqa: E402
                                   RowParallelDense, RowParallelLinear)

BF16 = jnp.bfloat16


def _loss(y):
  return jnp.sum(jnp.sin(y.astype(jnp.float32)))


def _exact(a, b):
  np.testing.assert_array_equal(f32(a), f32(b))


def _nonzero_bias(model):
  if getattr(model, "bias", None) is not None:
    model.bias[...] = jnp.linspace(-1.0, 1.0, model.bias.shape[0], dtype=model.bias.dtype)


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
  # Same gradients either way (the CPU reference path sums in the same order).
  _exact(on[1], results[1])
  _exact(on[0]["kernel"].get_value(), results[0]["kernel"].get_value())


def test_nnx_constructed_inside_shard_map_has_local_shapes(rng):
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
  assert len(re.findall(r"= \S+ all-gather\(", hlo)) + len(re.findall(r"all-gather-start\(", hlo)) == 1, hlo
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
  gathers = len(re.findall(r"= \S+ all-gather\(", hlo)) + len(re.findall(r"all-gather-start\(", hlo))
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
    (dict(sequence_dim=1, row=True, reduce="reduce_scatter", overlap_backward=True), ValueError,
     "overlap_backward=True needs sequence_dim=0 \\(its backward's all-gather"),
    (dict(sequence_parallel=True, sequence_dim=-1), TypeError,
     "sequence_dim must be a non-negative int"),
    (dict(sequence_parallel=True, sequence_dim=True), TypeError, "sequence_dim must be"),
    (dict(sequence_parallel=True, sequence_dim=1, overlap_backward=True), ValueError,
     "overlap_backward=True needs sequence_dim=0"),
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


@pytest.mark.parametrize("x_shape,x_spec,reduce,sequence_dim,out_spec", _ROW_DP_TP_LAYOUTS,
                         ids=["S-B-dp_all_reduce", "S-B-dp_reduce_scatter", "B-dp-S_dim1"])
def test_row_global_view_on_a_dp_tp_mesh(rng, x_shape, x_spec, reduce, sequence_dim, out_spec):
  """The row layer under plain jit keeps x's leading dims: one collective (the op's), B over
  dp kept, the sequence dim scattered over tp. (Flattened to rows, [S, B] over (None, dp)
  came back replicated after gathers.)"""
  mesh = make_mesh_2d(2, 4)
  x = jax.device_put(rand(rng, x_shape, BF16), NamedSharding(mesh, x_spec))
  with jax.set_mesh(mesh):
    model = RowParallelLinear(32, 64, axis_name="tp", reduce=reduce, sequence_dim=sequence_dim,
                              rngs=nnx.Rngs(0))
    _nonzero_bias(model)
    gdef, params = nnx.split(model)
    f = jax.jit(lambda st, x: nnx.merge(gdef, st)(x))
    y = f(params, x)
    hlo = f.lower(params, x).compile().as_text()
  colls = re.findall(r"= \S+ (all-gather|all-to-all|all-reduce|reduce-scatter)(?:-start)?\(", hlo)
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
  colls = re.findall(r"= \S+ (all-gather|all-to-all|all-reduce|reduce-scatter)(?:-start)?\(", hlo)
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


# ----------------------------------------------------------------------------- sequence parallel

@pytest.mark.parametrize("overlap_backward", [False, True])
def test_sequence_parallel_mlp_matches_xla_collectives(rng, overlap_backward):
  """Megatron-style sequence parallelism: x sharded on its first dim, column layer with
  sequence_parallel=True (all_gather_matmul), row layer with reduce='reduce_scatter' back to
  the sharded layout; values and grads equal all_gather / nnx.Linear / psum_scatter. With
  overlap_backward=True the column layer's dx (a reduce-scatter of dy @ kernel.T) is
  matmul_reduce_scatter on the kernel read in place, and the row layer's dx (all_gather(dy)
  @ kernel.T) is all_gather_matmul, whose gathered dy also makes dw."""
  mesh = make_mesh_1d(4)
  x = rand(rng, (8, 3, 32), BF16)
  up = ColumnParallelLinear(32, 64, sequence_parallel=True, overlap_backward=overlap_backward,
                            rngs=nnx.Rngs(0))
  down = RowParallelLinear(64, 32, reduce="reduce_scatter", overlap_backward=overlap_backward,
                           rngs=nnx.Rngs(1))
  _nonzero_bias(up)
  _nonzero_bias(down)
  (g_up, s_up), (g_down, s_down) = nnx.split(up), nnx.split(down)
  state = {"up": s_up, "down": s_down}
  specs = {"up": nnx.get_partition_spec(s_up), "down": nnx.get_partition_spec(s_down)}

  def ours(st, x):
    return nnx.merge(g_down, st["down"])(jax.nn.gelu(nnx.merge(g_up, st["up"])(x)))

  def ref(st, x):
    u, d = st["up"], st["down"]
    h = lax.all_gather(x, "tp", axis=0, tiled=True) @ u["kernel"][...].astype(BF16)
    h = jax.nn.gelu(h + u["bias"][...].astype(BF16))
    y = lax.psum_scatter(h @ d["kernel"][...].astype(BF16), "tp", scatter_dimension=0,
                         tiled=True)
    return y + d["bias"][...].astype(BF16)

  def run(fn):
    f = shard_map(fn, mesh, (specs, P("tp")), P("tp"))
    return jax.jit(f)(state, x), jax.jit(jax.grad(lambda s, x: _loss(f(s, x)),
                                                  argnums=(0, 1)))(state, x)
  (y, (gs, gx)), (y_ref, (gs_ref, gx_ref)) = run(ours), run(ref)
  assert y.shape == (8, 3, 32)
  # Up to bf16 rounding: the ops run XLA's dot on [rows, K] (flattened), the reference on
  # the 3-D array, and XLA:CPU may sum those in another order.
  assert_close(y, y_ref)
  assert_close(gx, gx_ref)
  for layer in ("up", "down"):
    for k in ("kernel", "bias"):
      assert_close(gs[layer][k].get_value(), gs_ref[layer][k].get_value(), BF16)
  text = str(jax.make_jaxpr(shard_map(ours, mesh, (specs, P("tp")), P("tp")))(state, x))
  assert "flashoverlap_all_gather_gemm" in text and "flashoverlap_gemm_reduce_scatter" in text
  # The backward: the row layer's reduce-scatter transposes to XLA's all_gather (with
  # overlap_backward: our all-gather + GEMM returning the gathered dy); the column layer's dx
  # is our reduce-scatter (on w as stored) only with overlap_backward.
  f = shard_map(ours, mesh, (specs, P("tp")), P("tp"))
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
    assert state["kernel"].get_metadata()["out_sharding"] == ("mlp", "embed")
    specs = nnx.get_partition_spec(state)
  assert specs["kernel"].get_value() == P("tp", None) and specs["bias"].get_value() == P()
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
