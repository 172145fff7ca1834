"""Global-view column-parallel GEMM with sequence parallelism under plain `jax.jit` (no
shard_map), via custom_partitioning: the global view of `all_gather_matmul`.

    x: [M, K] rows sharded P((dp, tp), None)   w: [K, N] sharded P(None, tp)
    column_parallel_matmul(x, w)                   -> [M, N] sharded P(dp, tp)
    x: [S, B, K] sharded P(tp, dp, None)  (Megatron's sequence-parallel layout)
    column_parallel_matmul(x, w)                   -> [S, B, N] sharded P(None, dp, tp)
    column_parallel_matmul(x, w, transpose_w=True)    w: [N, K] sharded P(tp, None); x @ w.T

Per device: all_gather_matmul(x_local, w_columns, tp): x's sequence dim (its first dim, or
`sequence_dim`) gathered over tp while the GEMM runs, overlapped on GPUs where the plan
predicts a gain, as the local view gathers it. The mesh axis `tp` is the one that shards w's
N (or `axis_name`); the other mesh axes that shard x's leading dims (data parallel) pass
through. When the sequence dim is not sharded over that axis there is nothing to gather and
the product is XLA's local dot (after XLA makes x whole over tp where another of its dims is
sharded over it: e.g. [B, S, K] as P(dp, tp, None) needs sequence_dim=1 to overlap).

x is not flattened to rows: x [B*S, K] from [B, S] over (dp, tp) is not the rows
P((dp, tp)) once B has more than one row per device, and XLA would gather it first.
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_flashoverlap import _compat, _validation, ops, primitives as prims
from jax_flashoverlap.sharding import (_spec_axes, check_global_axis_name,
                                       check_not_in_shard_map, check_per_device_dim, decode_spec,
                                       define_partition,
                                       explicit_mesh, pick_axis, run_with_auto_axes,
                                       safe_infer, spec_entry, typed_spec, with_dot_gradient)

_OP = "jax_flashoverlap.column_parallel_matmul"


def column_parallel_matmul(x: ops.Operand, w: ops.Operand, axis_name: str | None = None, *,
                           transpose_w: bool = False, sequence_dim: int = 0) -> jax.Array:
  """x [S, ..., K] @ w [K, N] with N sharded over one mesh axis and x's first dim sharded
  over it too (sequence parallelism): all_gather(x, axis=sequence_dim) @ w per device,
  overlapped.

  Returns the values of `x @ w`, with N sharded over the axis, x's first dim over the other
  mesh axes that shard it and x's other leading dims as they were (data parallel). x [M, K]
  is rows; [S, B, K] with P(tp, dp, None) is the layout to give for a (dp, tp) mesh.
  `axis_name`: the mesh axis; by default the one that shards w's N. Name it for x [M, K] on
  a mesh of several axes: without it Shardy's rule does not know which share of x's rows is
  gathered and the output's rows come back replicated over the other axes, after another
  all-gather (values right; README). `transpose_w`: w is
  [N, K] (N sharded: P(tp, None)) and the product is x @ w.T. `sequence_dim`: the leading
  dim of x sharded over the axis, when not the first: 1 for x [B, S, K] as P(dp, tp, None)
  (the output then moved into place after the GEMM, a copy of each device's output unless
  B is 1 per device, see all_gather_matmul).
  """
  transpose_w = _validation.check_transpose_w(_OP, transpose_w)
  _validation.check_operands(_OP, x, w, transpose_w=transpose_w)
  sequence_dim = _validation.check_sequence_dim(_OP, sequence_dim, len(x.shape))
  check_not_in_shard_map(_OP, "all_gather_matmul")
  check_global_axis_name(_OP, axis_name)
  call = lambda x, w: _column_parallel_ad(x, w, axis_name, sequence_dim, transpose_w)
  if _validation.has_no_rows(x):  # nothing to overlap: XLA's dot, partitioned as XLA does
    call = lambda x, w: prims.dot(x, w, transpose_w)  # noqa: E731
  mesh = explicit_mesh(x, w)
  if mesh is None:
    return call(x, w)
  lead, axis, _ = _layout_from_specs(mesh, typed_spec(x), typed_spec(w), axis_name,
                                     transpose_w)
  return run_with_auto_axes(call, mesh, _out_spec(lead, axis), x, w)


def _layout(mesh, x, w, axis_name, transpose_w):
  """(the leading dims' spec entries without the gather axis, the gather axis or None, the
  leading dims of x sharded over it) from the operands' shardings."""
  return _layout_from_specs(mesh, decode_spec(mesh, x), decode_spec(mesh, w), axis_name,
                            transpose_w)


def _layout_from_specs(mesh, x_spec, w_spec, axis_name, transpose_w):
  """_layout from the operands' spec entries (XLA's shardings, or the types' with Explicit
  axes)."""
  axis = pick_axis(_OP, mesh, axis_name, _spec_axes(w_spec[0 if transpose_w else 1]), "N")
  lead = [tuple(a for a in _spec_axes(e) if a != axis) for e in x_spec[:-1]]
  over_axis = [d for d, e in enumerate(x_spec[:-1])
               if axis is not None and axis in _spec_axes(e)]
  return lead, axis, over_axis


def _out_spec(lead, axis):
  return P(*map(spec_entry, lead), axis)


def _out_sharding(mesh, lead, axis):
  return NamedSharding(mesh, _out_spec(lead, axis))


@functools.partial(_compat.custom_partitioning, static_argnums=(2, 3, 4))
def _column_parallel(x, w, axis_name, sequence_dim, transpose_w):
  return prims.dot(x, w, transpose_w)  # unpartitioned semantics


@safe_infer
def _infer(axis_name, sequence_dim, transpose_w, mesh, arg_shapes, result_shape):
  x, w = arg_shapes
  lead, axis, _ = _layout(mesh, x, w, axis_name, transpose_w)
  return _out_sharding(mesh, lead, axis)


def _partition(axis_name, sequence_dim, transpose_w, mesh, arg_shapes, result_shape):
  mesh = _compat.partition_mesh(mesh, arg_shapes)  # its communicators rank by position
  x, w = arg_shapes
  lead, axis, over_axis = _layout(mesh, x, w, axis_name, transpose_w)
  gathered = sequence_dim in over_axis
  x_lead = list(lead)
  if gathered:  # our op (XLA's local dot, below, takes any N)
    check_per_device_dim(_OP, "N", "first dim of w" if transpose_w else "last dim of w",
                         w.shape[0 if transpose_w else 1], mesh, axis)
    # The gather axis is the sequence dim's minor axis: gathering over it leaves each
    # data-parallel block of the sequence whole and in order.
    x_lead[sequence_dim] = lead[sequence_dim] + (axis,)
    shards = int(np.prod([mesh.shape[a] for a in x_lead[sequence_dim]]))
    if x.shape[sequence_dim] % shards:
      raise ValueError(f"{_OP}: dim {sequence_dim} of x (the sequence_dim, "
                       f"{x.shape[sequence_dim]}, shape {tuple(x.shape)}) must be divisible "
                       f"by the size {shards} of the mesh axes {x_lead[sequence_dim]} that "
                       "shard it")
  elif over_axis:
    _warn_other_dim(x, axis, sequence_dim, over_axis[0])
  w_spec = P(axis, None) if transpose_w else P(None, axis)
  arg_shardings = (NamedSharding(mesh, P(*map(spec_entry, x_lead), None)),
                   NamedSharding(mesh, w_spec))

  @_validation.partitioner_lowering(mesh)
  def lower(x, w):
    if gathered:
      return ops.all_gather_matmul(x, w, axis, transpose_w=transpose_w,
                                   sequence_dim=sequence_dim)
    # Nothing to gather: a local dot, XLA's (the signaling GEMM pays off next to a
    # collective only).
    return prims.dot(x, w, transpose_w)

  return mesh, lower, _out_sharding(mesh, lead, axis), arg_shardings


def _warn_other_dim(x, axis, sequence_dim, other):
  """x's sequence dim is not over the gather axis but its dim `other` is: XLA gathers x
  whole before a local dot, so nothing overlaps; say which sequence_dim would."""
  warnings.warn(f"{_OP}: x (shape {tuple(x.shape)}) has dim {other} sharded over "
                f"{axis!r}, not its sequence_dim {sequence_dim}: XLA gathers x before a "
                f"local dot and nothing overlaps; pass sequence_dim={other}", stacklevel=2)


def _sdy_rule(axis_name, sequence_dim, transpose_w, mesh, value_types, result_types):
  """Shardy rule. x's rows and the output's rows are different factors except for the other
  mesh axes' share d (data parallel): the gather axis' share of x's rows must not propagate to
  the output (it is gathered inside the op), while w's N does:

      x: (d a) k,  w: k n  ->  out: (d b) n      (a, b: the rows of one data-parallel block)

  With one row per data-parallel block (M == d) the rows are the factor d on both sides
  (Shardy refuses a size-1 factor in a compound dim).

  x [S, B, K] (any rank above 2): the sequence dims differ (s, t), the other leading dims
  pass through, so a data-parallel B propagates: `s b1 k, k n -> t b1 n` (`b0 s k, k n ->
  b0 t n` for sequence_dim=1). A data-parallel share of S itself is not propagated there: the
  rule sees shapes, not shardings, and `(d a) b1 k -> (d b) b1 n` would break Megatron's
  P(tp, dp, None) (S over tp alone: Shardy splits tp over d and a into sub-axes, and the
  output comes back gathered). The partitioner still keeps the share, XLA gathering the
  output after the op; a constraint on the output (P(dp, None, tp)) gives one all-gather
  (README).
  """
  w_factors = "n k" if transpose_w else "k n"
  shape = _compat.ir_shape(value_types[0])
  if len(shape) > 2:
    x_lead = [f"b{i}" for i in range(len(shape) - 1)]
    out_lead = list(x_lead)
    x_lead[sequence_dim], out_lead[sequence_dim] = "s", "t"
    return (f"{' '.join(x_lead)} k, {w_factors} -> {' '.join(out_lead)} n", {})
  m = shape[0]
  names = list(mesh.axis_names)
  if axis_name is None and len(names) == 1:
    axis_name = names[0]
  d = int(np.prod([mesh.shape[a] for a in names if a != axis_name], dtype=np.int64))
  if axis_name not in names or d == 1 or m % d:
    return (f"a k, {w_factors} -> b n", {})
  if m == d:
    return (f"d k, {w_factors} -> d n", {})
  return (f"(d a) k, {w_factors} -> (d b) n", {"d": d, "a": m // d, "b": m // d})


define_partition(_column_parallel, _partition, _infer, _sdy_rule)
# The gradient is that of x @ w, XLA's sharded dots (as row_parallel_matmul's).
_column_parallel_ad = with_dot_gradient(_OP, _column_parallel, 3)
