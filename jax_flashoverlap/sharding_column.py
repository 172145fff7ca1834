"""Global-view column-parallel GEMM with sequence parallelism under plain `jax.jit` (no
shard_map), via custom_partitioning: the global view of `all_gather_matmul`.

    x: [M, K] rows sharded P((dp, tp), None)   w: [K, N] sharded P(None, tp)
    column_parallel_matmul(x, w)                   -> [M, N] sharded P(dp, tp)
    column_parallel_matmul(x, w, transpose_w=True)    w: [N, K] sharded P(tp, None); x @ w.T

Per device: all_gather_matmul(x_rows, w_columns, tp) (the rows gathered over tp while the
GEMM runs, overlapped on GPUs where the plan predicts a gain). The mesh axis `tp` is the one
that shards w's N (or `axis_name`); mesh axes that shard the rows besides it (data parallel)
pass through. When x's rows are not sharded over that axis there is nothing to gather and the
product is XLA's local dot.
"""

from __future__ import annotations

import functools

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_flashoverlap import _compat, _validation, ops, primitives as prims
from jax_flashoverlap.sharding import (_spec_axes, check_global_axis_name, decode_spec,
                                       define_partition, pick_axis, refuse_vmap, safe_infer,
                                       with_dot_gradient)

_OP = "jax_flashoverlap.column_parallel_matmul"


def column_parallel_matmul(x, w, axis_name=None, *, transpose_w: bool = False):
  """x [M, K] @ w [K, N] with N sharded over one mesh axis and x's rows sharded over it too
  (sequence parallelism): all_gather(x) @ w per device, overlapped.

  Returns the values of `x @ w`, with N sharded over the axis (and M over any other mesh
  axes that shard x's rows). `axis_name`: the mesh axis; by default the one that shards w's
  N. `transpose_w`: w is [N, K] (N sharded: P(tp, None)) and the product is x @ w.T.
  """
  transpose_w = _validation.check_transpose_w(_OP, transpose_w)
  _validation.check_operands(_OP, x, w, x_rank="2", transpose_w=transpose_w)
  check_global_axis_name(_OP, axis_name)
  return refuse_vmap(_OP, _column_parallel_ad, x, w, axis_name, transpose_w)


def _layout(mesh, x, w, axis_name, transpose_w):
  """(row axes besides the gather axis, the gather axis or None, whether x's rows are
  sharded over it) from the operands' shardings."""
  x_spec, w_spec = decode_spec(mesh, x), decode_spec(mesh, w)
  axis = pick_axis(_OP, mesh, axis_name, _spec_axes(w_spec[0 if transpose_w else 1]), "N")
  row_axes = _spec_axes(x_spec[0])
  return tuple(a for a in row_axes if a != axis), axis, axis is not None and axis in row_axes


def _out_sharding(mesh, m_axes, axis):
  return NamedSharding(mesh, P(m_axes or None, axis))


@functools.partial(_compat.custom_partitioning, static_argnums=(2, 3))
def _column_parallel(x, w, axis_name, transpose_w):
  return prims.dot(x, w, transpose_w)  # unpartitioned semantics


@safe_infer
def _infer(axis_name, transpose_w, mesh, arg_shapes, result_shape):
  x, w = arg_shapes
  m_axes, axis, _ = _layout(mesh, x, w, axis_name, transpose_w)
  return _out_sharding(mesh, m_axes, axis)


def _partition(axis_name, transpose_w, mesh, arg_shapes, result_shape):
  x, w = arg_shapes
  m_axes, axis, gathered = _layout(mesh, x, w, axis_name, transpose_w)
  if gathered:
    m_local = x.shape[0]
    for a in m_axes + (axis,):
      m_local //= mesh.shape[a]
    if m_local * int(np.prod([mesh.shape[a] for a in m_axes + (axis,)])) != x.shape[0]:
      raise ValueError(f"{_OP}: the rows of x ({x.shape[0]}) must be divisible by the size "
                       f"of the mesh axes {m_axes + (axis,)} that shard them")
  # The gather axis is the rows' minor axis: gathering over it leaves each data-parallel
  # block of rows whole and in order.
  rows = m_axes + ((axis,) if gathered else ())
  w_spec = P(axis, None) if transpose_w else P(None, axis)
  arg_shardings = (NamedSharding(mesh, P(rows or None, None)), NamedSharding(mesh, w_spec))

  @_validation.partitioner_lowering(mesh)
  def lower(x, w):
    if gathered:
      return ops.all_gather_matmul(x, w, axis, transpose_w=transpose_w)
    # Nothing to gather: a local dot, XLA's (the signaling GEMM pays off next to a
    # collective only).
    return prims.dot(x, w, transpose_w)

  return mesh, lower, _out_sharding(mesh, m_axes, axis), arg_shardings


def _sdy_rule(axis_name, transpose_w, mesh, value_types, result_types):
  """Shardy rule. x's rows and the output's rows are different factors except for the other
  mesh axes' share d (data parallel): the gather axis' share of x's rows must not propagate to
  the output (it is gathered inside the op), while w's N does:

      x: (d a) k,  w: k n  ->  out: (d b) n      (a, b: the rows of one data-parallel block)
  """
  w_factors = "n k" if transpose_w else "k n"
  m = _compat.ir_shape(value_types[0])[0]
  names = list(mesh.axis_names)
  if axis_name is None and len(names) == 1:
    axis_name = names[0]
  d = int(np.prod([mesh.shape[a] for a in names if a != axis_name], dtype=np.int64))
  if axis_name not in names or d == 1 or m % d:
    return (f"a k, {w_factors} -> b n", {})
  return (f"(d a) k, {w_factors} -> (d b) n", {"d": d, "a": m // d, "b": m // d})


define_partition(_column_parallel, _partition, _infer, _sdy_rule)
# The gradient is that of x @ w, XLA's sharded dots (as row_parallel_matmul's).
_column_parallel_ad = with_dot_gradient(_column_parallel, 2)
