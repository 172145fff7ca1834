"""Global-view row-parallel GEMM under plain `jax.jit` (no shard_map), via custom_partitioning.

    x: [M, K] sharded P(dp, tp)   w: [K, N] sharded P(tp, None)
    row_parallel_matmul(x, w, reduce="all_reduce")     -> [M, N] sharded P(dp, None)
    row_parallel_matmul(x, w, reduce="reduce_scatter") -> [M, N] sharded P((dp, tp), None)
    row_parallel_matmul(x, w, transpose_w=True)         w: [N, K] sharded P(None, tp); x @ w.T

The partitioner picks the contracting mesh axis from x's sharding on K (or `axis_name`),
keeps any mesh axes that shard M (data parallel), and runs the per-device op on each shard.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_flashoverlap import _compat, _validation, ops, primitives as prims

REDUCTIONS = ("all_reduce", "reduce_scatter")


def row_parallel_matmul(x, w, reduce: str = "all_reduce", axis_name=None, *,
                        transpose_w: bool = False):
  """x [M, K] @ w [K, N] with K sharded over one mesh axis, reduced by `reduce`.

  Returns the same values as `x @ w` under XLA's sharding; the output is replicated over the
  contracting axis ("all_reduce") or has its rows sharded over it ("reduce_scatter").
  `axis_name`: the contracting mesh axis; by default, the one that shards x's last dim.
  `transpose_w`: w is [N, K] (K sharded: P(None, tp)) and the product is x @ w.T.
  """
  op = "jax_flashoverlap.row_parallel_matmul"
  if reduce not in REDUCTIONS:
    raise ValueError(f"{op}: reduce must be one of {REDUCTIONS}, got {reduce!r}")
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  _validation.check_operands(op, x, w, x_rank="2", transpose_w=transpose_w)
  if axis_name is not None and not isinstance(axis_name, str):
    raise TypeError(f"{op}: axis_name must be a mesh axis name (str) or None, got {axis_name!r}")
  return _row_parallel_vjp(x, w, reduce, axis_name, transpose_w)


def with_dot_gradient(fn, num_static):
  """fn(x, w, *static) (a custom_partitioning function; transpose_w its last static
  argument) with the gradient of x @ w: custom_partitioning has no autodiff rule, and the
  collective only decides the output's sharding, so the backward is left to XLA's own
  sharded dots."""
  @functools.partial(jax.custom_vjp, nondiff_argnums=tuple(range(2, 2 + num_static)))
  def call(x, w, *static):
    return fn(x, w, *static)

  def fwd(x, w, *static):
    return fn(x, w, *static), (x, w)

  def bwd(*args):
    *static, (x, w), ct = args
    _, vjp = jax.vjp(functools.partial(prims.dot, transpose_w=static[-1]), x, w)
    return vjp(ct.astype(x.dtype))

  call.defvjp(fwd, bwd)
  return call


def define_partition(fn, partition, infer, sdy_rule):
  """fn.def_partition, with the Shardy rule where this JAX has Shardy."""
  kwargs = dict(partition=partition, infer_sharding_from_operands=infer)
  if _compat.SdyShardingRule is not None:
    kwargs["sharding_rule"] = sdy_rule
  fn.def_partition(**kwargs)


def _spec_axes(entry) -> tuple:
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _spec(sharding, ndim) -> tuple:
  spec = tuple(getattr(sharding, "spec", P()))
  return spec + (None,) * (ndim - len(spec))


def _layout(mesh, x_sharding, w_sharding, reduce, axis_name, transpose_w):
  """Chooses (m_axes, k_axis) from the operands' shardings."""
  x_spec = _spec(x_sharding, 2)
  w_spec = _spec(w_sharding, 2)
  k_axes = _spec_axes(x_spec[1]) or _spec_axes(w_spec[1 if transpose_w else 0])
  k_axis = pick_axis("jax_flashoverlap.row_parallel_matmul", mesh, axis_name, k_axes, "K")
  m_axes = tuple(a for a in _spec_axes(x_spec[0]) if a != k_axis)
  return m_axes, k_axis


def pick_axis(op, mesh, axis_name, sharded_over, dim):
  """The op's mesh axis: `axis_name` (checked against the mesh), else the one axis that shards
  `dim` (`sharded_over`; None when nothing does)."""
  if axis_name is not None:
    if axis_name not in mesh.axis_names:
      raise ValueError(f"{op}: axis_name {axis_name!r} is not an axis of the mesh "
                       f"{tuple(mesh.axis_names)}")
    return axis_name
  if len(sharded_over) > 1:
    raise ValueError(f"{op}: {dim} is sharded over several mesh axes {sharded_over}; pass "
                     "axis_name to pick one")
  return sharded_over[0] if sharded_over else None


def _out_spec(m_axes, k_axis, reduce):
  rows = m_axes + ((k_axis,) if reduce == "reduce_scatter" and k_axis else ())
  return P(rows if rows else None, None)


def _m_entry(m_axes):
  return m_axes if m_axes else None


@functools.partial(_compat.custom_partitioning, static_argnums=(2, 3, 4))
def _row_parallel(x, w, reduce, axis_name, transpose_w):
  # Unpartitioned semantics (what a 1-device program runs: XLA does not partition it).
  return prims.dot(x, w, transpose_w)


def _infer(reduce, axis_name, transpose_w, mesh, arg_shapes, result_shape):
  x, w = arg_shapes
  m_axes, k_axis = _layout(mesh, x.sharding, w.sharding, reduce, axis_name, transpose_w)
  return NamedSharding(mesh, _out_spec(m_axes, k_axis, reduce))


def _partition(reduce, axis_name, transpose_w, mesh, arg_shapes, result_shape):
  x, w = arg_shapes
  m_axes, k_axis = _layout(mesh, x.sharding, w.sharding, reduce, axis_name, transpose_w)
  op = "jax_flashoverlap.row_parallel_matmul"
  if reduce == "reduce_scatter" and k_axis is not None:
    m_local = x.shape[0]
    for a in m_axes:
      m_local //= mesh.shape[a]
    if m_local % mesh.shape[k_axis]:
      raise ValueError(f"{op}: reduce_scatter needs the rows of each shard ({m_local}) to be "
                       f"divisible by the size {mesh.shape[k_axis]} of axis {k_axis!r}")
  arg_shardings = (NamedSharding(mesh, P(_m_entry(m_axes), k_axis)),
                   NamedSharding(mesh, P(None, k_axis) if transpose_w else P(k_axis, None)))
  out_sharding = NamedSharding(mesh, _out_spec(m_axes, k_axis, reduce))

  def lower(x, w):
    if k_axis is None:
      # K not sharded: nothing to reduce, XLA's local dot (the signaling GEMM pays off next
      # to a collective only; alone it is 0-7% slower than XLA's, README).
      return prims.dot(x, w, transpose_w)
    if reduce == "all_reduce":
      return ops.matmul_all_reduce(x, w, k_axis, transpose_w=transpose_w)
    return ops.matmul_reduce_scatter(x, w, k_axis, transpose_w=transpose_w)

  return mesh, lower, out_sharding, arg_shardings


def _sdy_rule(reduce, axis_name, transpose_w, mesh, value_types, result_types):
  """Shardy rule, built at lowering time when the mesh is known.

  all_reduce: `m k, k n -> m n`, K a reduction factor. reduce_scatter: the contracting axis'
  share t of K reappears as the middle factor of the output rows, between the factor d of the
  other mesh axes (data parallel) and the rows of one shard:

      x: (d m2) (t kk),  w: (t kk) n  ->  out: (d t m3) n

  so Shardy itself propagates P(dp, tp) inputs to a P((dp, tp), None) output: the layout the
  reduce-scatter produces, with no gather after it. With transpose_w, w's two factors swap.
  """
  def w_factors(k):
    return f"n {k}" if transpose_w else f"{k} n"

  simple = (f"m k, {w_factors('k')} -> m n", {"reduction_factors": ("k",)})
  if reduce != "reduce_scatter":
    return simple
  names = list(mesh.axis_names)
  if axis_name is None:
    if len(names) != 1:
      return simple  # contracting axis unknown until partitioning: see README (Shardy note)
    axis_name = names[0]
  if axis_name not in names:
    return simple
  t = int(mesh.shape[axis_name])
  d = int(np.prod([mesh.shape[a] for a in names if a != axis_name], dtype=np.int64))
  m, k = _compat.ir_shape(value_types[0])
  if t == 1 or k % t or m % (d * t):
    return simple
  if d == 1:
    return (f"m (t kk) , {w_factors('(t kk)')} -> (t m3) n",
            {"t": t, "kk": k // t, "m3": m // t})
  return (f"(d m2) (t kk), {w_factors('(t kk)')} -> (d t m3) n",
          {"d": d, "t": t, "m2": m // d, "kk": k // t, "m3": m // (d * t)})


define_partition(_row_parallel, _partition, _infer, _sdy_rule)
_row_parallel_vjp = with_dot_gradient(_row_parallel, 3)
