"""Global-view row-parallel GEMM under plain `jax.jit` (no shard_map), via custom_partitioning.

    x: [M, K] sharded P(dp, tp)   w: [K, N] sharded P(tp, None)
    row_parallel_matmul(x, w, reduce="all_reduce")     -> [M, N] sharded P(dp, None)
    row_parallel_matmul(x, w, reduce="reduce_scatter") -> [M, N] sharded P((dp, tp), None)
    row_parallel_matmul(x, w, transpose_w=True)         w: [N, K] sharded P(None, tp); x @ w.T
    x: [S, B, K] sharded P(None, dp, tp)  (Megatron's layout; any rank)
    row_parallel_matmul(x, w, reduce="reduce_scatter") -> [S, B, N] sharded P(tp, dp, None)

The partitioner picks the contracting mesh axis from x's sharding on K (or `axis_name`),
keeps the mesh axes that shard x's leading dims (data parallel), and runs the per-device op
on each shard; the reduce-scatter scatters x's sequence dim (its first, or `sequence_dim`).
x is not flattened to rows: [B*S] from [B, S] over dp is not rows over dp once B has more than
one row per device (XLA would reshard it).
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jax_flashoverlap import _compat, _validation, ops, primitives as prims

REDUCTIONS = ("all_reduce", "reduce_scatter")


def row_parallel_matmul(x: ops.Operand, w: ops.Operand, reduce: str = "all_reduce",
                        axis_name: str | None = None, *, transpose_w: bool = False,
                        sequence_dim: int = 0) -> jax.Array:
  """x [..., K] @ w [K, N] with K sharded over one mesh axis, reduced by `reduce`.

  Returns the same values as `x @ w` under XLA's sharding; the output is replicated over the
  contracting axis ("all_reduce") or has x's first leading dim (`sequence_dim`: another one,
  e.g. 1 for x [B, S, K]) sharded over it too ("reduce_scatter"); x's leading dims keep their
  other mesh axes. `axis_name`: the contracting mesh axis; by default, the one that shards
  x's last dim. Name it for the reduce-scatter on a mesh of several axes: Shardy's rule
  knows the contracting axis only then, and without it (or jit's out_shardings) the output
  comes back gathered over that axis after the reduce-scatter (values right; GSPMD infers
  the layout either way; README). `transpose_w`: w is [N, K] (K sharded: P(None, tp)) and the
  product is x @ w.T.
  """
  op = "jax_flashoverlap.row_parallel_matmul"
  if reduce not in REDUCTIONS:
    raise ValueError(f"{op}: reduce must be one of {REDUCTIONS}, got {reduce!r}")
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  _validation.check_operands(op, x, w, transpose_w=transpose_w)
  sequence_dim = _validation.check_sequence_dim(op, sequence_dim, len(x.shape))
  check_not_in_shard_map(op, f"matmul_{reduce}")
  check_global_axis_name(op, axis_name)
  axis_size = None if axis_name is None else mesh_axis_size(axis_name)
  if axis_size:  # a mesh in context gives the axis' size: the errors at trace time
    check_scatter_size(op, x.shape, reduce, sequence_dim, axis_name, axis_size)
    if not _validation.has_no_rows(x):  # K is split over the axis
      check_per_device_dim(op, "K", "last dim of x", x.shape[-1],
                           jax.sharding.get_abstract_mesh(), axis_name)
  call = lambda x, w: _row_parallel_ad(x, w, reduce, axis_name, sequence_dim, transpose_w)
  if _validation.has_no_rows(x):  # nothing to overlap: XLA's dot, partitioned as XLA does
    call = lambda x, w: prims.dot(x, w, transpose_w)  # noqa: E731
  mesh = explicit_mesh(x, w)
  if mesh is None:
    return call(x, w)
  lead, k_axis = layout_from_specs(mesh, typed_spec(x), typed_spec(w), axis_name, transpose_w)
  check_scatter(mesh, x.shape, lead, k_axis, reduce, sequence_dim)  # before JAX's typing
  return run_with_auto_axes(call, mesh, _out_spec(lead, k_axis, reduce, sequence_dim), x, w)


def check_not_in_shard_map(op, per_device):
  """The global views are for jax.jit without shard_map. Inside one, XLA never partitions
  their custom_partitioning: fully manual, each device would run the whole op's dot on its
  own block (wrong values or shapes, silently); manual over some axes, the partitioner
  fails inside XLA."""
  manual = _compat.manual_axis_names()
  if manual:
    raise ValueError(
        f"{op} is the global view for jax.jit without shard_map, but it was called inside "
        f"jax.shard_map (manual over {tuple(manual)}); there call the per-device op "
        f"jax_flashoverlap.{per_device}(x_block, w_block, axis_name), with its axis among "
        "the shard_map's axis_names")


def check_global_axis_name(op, axis_name):
  """axis_name of a global view: None or a str; checked against the mesh here when one is
  set (jax.set_mesh), else by the partitioner, the first to know the mesh."""
  if axis_name is not None and not isinstance(axis_name, str):
    raise TypeError(f"{op}: axis_name must be a mesh axis name (str) or None, got {axis_name!r}")
  mesh_axes = _compat.mesh_axis_names()
  if axis_name is not None and mesh_axes is not None and axis_name not in mesh_axes:
    raise ValueError(f"{op}: axis_name {axis_name!r} is not an axis of the mesh {mesh_axes}")


def with_dot_gradient(op, fn, num_static):
  """fn(x, w, *static) (a custom_partitioning function; its static arguments end with
  sequence_dim, transpose_w) with the derivative of x @ w and a batching rule.

  custom_partitioning has no autodiff rule, and the collective only decides the output's
  sharding, so the tangent (and, transposed, the backward) is XLA's own sharded dots: a
  custom_jvp, so forward mode works too. It has no batching rule either: inside the
  custom_jvp (so autodiff never meets it) a custom_vmap batches x by calling the global view
  again on x with the batch as a new leading dim (sequence_dim one further); nested vmaps
  come back through it. A batched w is refused naming the op."""
  @functools.partial(jax.custom_jvp, nondiff_argnums=tuple(range(2, 2 + num_static)))
  def call(x, w, *static):
    return batchable(static)(x, w)

  @functools.lru_cache(maxsize=None)
  def batchable(static):
    @jax.custom_batching.custom_vmap
    def unbatched(x, w):
      return fn(x, w, *static)

    @unbatched.def_vmap
    def rule(axis_size, in_batched, x, w):
      x_batched, w_batched = in_batched
      if w_batched:
        raise NotImplementedError(
            f"{op}: jax.vmap over w is not supported (the global view takes one weight "
            "for every x); vmap over x only (in_axes=(0, None)), or keep the batch as a "
            "leading dim of x")
      if not x_batched:
        return call(x, w, *static), False
      *rest, sequence_dim, transpose_w = static
      return call(x, w, *rest, sequence_dim + 1, transpose_w), True

    return unbatched

  def jvp(*args):
    *static, primals, tangents = args
    out = call(*primals, *static)
    tangent = prims.bilinear_tangent(functools.partial(prims.dot, transpose_w=static[-1]),
                                     primals, tangents)
    return out, tangent.astype(out.dtype)

  call.defjvp(jvp, symbolic_zeros=True)  # an argument not differentiated: no term
  return call


def define_partition(fn, partition, infer, sdy_rule):
  """fn.def_partition, with the Shardy rule where this JAX has Shardy.

  The callbacks get XLA's shardings undecoded (`decode_shardings=False`) and decode them
  with `decode_spec`: Shardy may split a mesh axis into sub-axes (a rule's factor smaller
  than the axis), which no PartitionSpec expresses and JAX's own decoding fails on
  (`custom_partitioner: KeyError` before our callback runs)."""
  kwargs = dict(partition=partition, infer_sharding_from_operands=infer,
                decode_shardings=False)
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


def decode_spec(mesh, value) -> tuple:
  """The PartitionSpec entries (one per dim) of `value.sharding`, an XLA sharding over
  `mesh`; all None (read as unsharded) when no PartitionSpec expresses it (a sub-axis) or
  it is unknown. The partitioner then asks for the layout it needs and XLA reshards to it,
  so a layout read as unsharded costs a reshard, never a wrong value."""
  ndim, sharding = len(value.shape), value.sharding
  unknown = (None,) * ndim
  if sharding is None:
    return unknown
  if isinstance(sharding, NamedSharding):
    return _spec(sharding, ndim)
  try:  # from where each device's shard starts: public API only
    index = sharding.devices_indices_map(tuple(value.shape))
    devices = np.asarray(mesh.devices)
    starts = [sorted({idx[i].start or 0 for idx in index.values()}) for i in range(ndim)]

    def block(coord, i):  # which block of dim i the device at mesh coordinate `coord` holds
      return starts[i].index(index[devices[coord]][i].start or 0)

    spec = []
    for i in range(ndim):
      steps = []  # (blocks moved by one step along the mesh axis, axis): major axes first
      for a, name in enumerate(mesh.axis_names):
        if devices.shape[a] > 1:
          one = tuple(int(j == a) for j in range(devices.ndim))
          step = block(one, i) - block((0,) * devices.ndim, i)
          if step:
            steps.append((step, name))
      axes = tuple(name for _, name in sorted(steps, reverse=True))
      spec.append(axes[0] if len(axes) == 1 else (axes or None))
    if NamedSharding(mesh, P(*spec)).is_equivalent_to(sharding, ndim):
      return tuple(spec)
  except (KeyError, ValueError, TypeError, IndexError):
    pass
  return unknown


def _layout(mesh, x, w, reduce, axis_name, transpose_w):
  """Chooses (the axes of each leading dim of x besides the contracting one, k_axis) from
  the operands' shardings."""
  return layout_from_specs(mesh, decode_spec(mesh, x), decode_spec(mesh, w), axis_name,
                           transpose_w)


def layout_from_specs(mesh, x_spec, w_spec, axis_name, transpose_w):
  """_layout from the operands' spec entries (XLA's shardings, or the types' with Explicit
  axes)."""
  k_axes = _spec_axes(x_spec[-1]) or _spec_axes(w_spec[1 if transpose_w else 0])
  k_axis = pick_axis("jax_flashoverlap.row_parallel_matmul", mesh, axis_name, k_axes, "K")
  lead = [tuple(a for a in _spec_axes(e) if a != k_axis) for e in x_spec[:-1]]
  return lead, k_axis


def pick_axis(op, mesh, axis_name, sharded_over, dim):
  """The op's mesh axis: `axis_name` (checked against the mesh), else the one axis that shards
  `dim` (`sharded_over`; None when nothing does)."""
  if axis_name is not None:
    if not mesh.axis_names:
      # JAX gives the partitioner the mesh of the jitted program's arguments only: none when
      # they are on none (numpy arrays, arrays fresh from init), even under jax.set_mesh and
      # with sharded arrays closed over by the function (a layer's params, say)
      raise ValueError(f"{op}: axis_name {axis_name!r}, but the partitioner got no mesh: "
                       "the jitted program's arguments are on none (numpy arrays, arrays "
                       "fresh from init, or the sharded arrays closed over by the jitted "
                       "function instead of passed to it; jax.set_mesh alone does not place "
                       "them); pass the sharded arrays (a layer's params too) as arguments, "
                       "or put them on the mesh (jax.device_put with a NamedSharding, or "
                       "jit's in_shardings)")
    if axis_name not in mesh.axis_names:
      raise ValueError(f"{op}: axis_name {axis_name!r} is not an axis of the mesh "
                       f"{tuple(mesh.axis_names)}")
    return axis_name
  if len(sharded_over) > 1:
    raise ValueError(f"{op}: {dim} is sharded over several mesh axes {sharded_over}; pass "
                     "axis_name to pick one")
  return sharded_over[0] if sharded_over else None


def _out_spec(lead, k_axis, reduce, sequence_dim):
  lead = list(lead)
  if reduce == "reduce_scatter" and k_axis:
    lead[sequence_dim] = lead[sequence_dim] + (k_axis,)
  return P(*map(spec_entry, lead), None)


def spec_entry(axes):
  """A PartitionSpec entry for a dim sharded over `axes` (major first)."""
  return axes[0] if len(axes) == 1 else (axes or None)


@functools.partial(_compat.custom_partitioning, static_argnums=(2, 3, 4, 5))
def _row_parallel(x, w, reduce, axis_name, sequence_dim, transpose_w):
  # Unpartitioned semantics (what a 1-device program runs: XLA does not partition it).
  return prims.dot(x, w, transpose_w)


def check_per_device_dim(op, name, where, size, mesh, axis):
  """A dim sharded over `axis` splits into whole multiples of 8 per device (the per-device
  GEMM's 16-byte rows), said in the global terms the caller used (the per-device op's own
  error would name only the shard's size)."""
  if axis is None:
    return
  t = int(mesh.shape[axis])
  align = _validation.ALIGN
  if size % t or (size // t) % align:
    per = size // t if size % t == 0 else f"{size / t:g}"
    raise ValueError(f"{op}: {name}={size} ({where}) sharded over {axis!r} (size {t}) is "
                     f"{name}={per} per device; the per-device GEMM needs a multiple of {align} "
                     f"there (global {name} a multiple of {align * t})")


def mesh_axis_size(axis_name, mesh=None) -> int | None:
  """Size of the mesh axis in `mesh` (e.g. an NNX layer's mesh=), else in the mesh in
  context; None when unknown."""
  mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
  if mesh is None or getattr(mesh, "empty", True) or axis_name not in mesh.axis_names:
    return None
  return int(mesh.shape[axis_name])


def check_scatter_size(op, x_shape, reduce, sequence_dim, axis_name, axis_size):
  """The reduce-scatter's dim of x (global) divides over the contracting axis (its size when
  known): what check_scatter asks of each shard, checked at trace time, where the partitioner
  would raise it at compile time inside an INTERNAL error."""
  if reduce != "reduce_scatter" or not axis_size or x_shape[sequence_dim] % axis_size == 0:
    return
  what = "the rows" if len(x_shape) == 2 else f"dim {sequence_dim} (the sequence_dim)"
  hint = ("" if len(x_shape) == 2 else
          "; sequence_dim names the leading dim of x to scatter (e.g. 1 for [B, S, K])")
  raise ValueError(f"{op}: reduce_scatter needs {what} of x (shape {tuple(x_shape)}) to be "
                   f"divisible by the size {axis_size} of axis {axis_name!r}{hint}")


def check_scatter(mesh, x_shape, lead, k_axis, reduce, sequence_dim):
  """The reduce-scatter's dim of each shard divides over the contracting axis."""
  if reduce != "reduce_scatter" or k_axis is None:
    return
  local = x_shape[sequence_dim] // int(np.prod([mesh.shape[a] for a in lead[sequence_dim]]))
  what = "the rows" if len(x_shape) == 2 else f"dim {sequence_dim} (the sequence_dim)"
  if local % mesh.shape[k_axis]:
    hint = ("" if len(x_shape) == 2 else
            "; sequence_dim names the leading dim of x to scatter (e.g. 1 for [B, S, K])")
    raise ValueError(f"jax_flashoverlap.row_parallel_matmul: reduce_scatter needs {what} of "
                     f"each shard ({local}) to be divisible by the size "
                     f"{mesh.shape[k_axis]} of axis {k_axis!r}{hint}")


def safe_infer(layout_out):
  """An infer_sharding_from_operands callback that never raises: under GSPMD an exception
  there aborts the process (XLA CHECK-fails on it), while the same exception raised by the
  partition callback reaches the caller as JaxRuntimeError. So a bad input gets a replicated
  output here and its error from the partition callback, which runs the same checks."""
  def infer(*args):
    mesh = args[-3]
    try:
      return layout_out(*args)
    except Exception:  # noqa: BLE001  (raised again by the partition callback)
      return NamedSharding(mesh, P())
  return infer


@safe_infer
def _infer(reduce, axis_name, sequence_dim, transpose_w, mesh, arg_shapes, result_shape):
  x, w = arg_shapes
  lead, k_axis = _layout(mesh, x, w, reduce, axis_name, transpose_w)
  return NamedSharding(mesh, _out_spec(lead, k_axis, reduce, sequence_dim))


def _partition(reduce, axis_name, sequence_dim, transpose_w, mesh, arg_shapes, result_shape):
  mesh = _compat.partition_mesh(mesh, arg_shapes)  # its communicators rank by position
  x, w = arg_shapes
  lead, k_axis = _layout(mesh, x, w, reduce, axis_name, transpose_w)
  check_per_device_dim("jax_flashoverlap.row_parallel_matmul", "K", "last dim of x",
                       x.shape[-1], mesh, k_axis)
  check_scatter(mesh, x.shape, lead, k_axis, reduce, sequence_dim)
  arg_shardings = (NamedSharding(mesh, P(*map(spec_entry, lead), k_axis)),
                   NamedSharding(mesh, P(None, k_axis) if transpose_w else P(k_axis, None)))
  out_sharding = NamedSharding(mesh, _out_spec(lead, k_axis, reduce, sequence_dim))

  @_validation.partitioner_lowering(mesh)
  def lower(x, w):
    if k_axis is None:
      # K not sharded: nothing to reduce, XLA's local dot (the signaling GEMM pays off next
      # to a collective only; alone it is 0-7% slower than XLA's, README).
      return prims.dot(x, w, transpose_w)
    if reduce == "all_reduce":
      return ops.matmul_all_reduce(x, w, k_axis, transpose_w=transpose_w)
    out = ops.matmul_reduce_scatter(x, w, k_axis, transpose_w=transpose_w,
                                    sequence_dim=sequence_dim)
    _warn_if_moved_after(k_axis, mesh, out_sharding, result_shape,  # once the op took x
                         sequence_dim)
    return out

  return mesh, lower, out_sharding, arg_shardings


def _warn_if_moved_after(k_axis, mesh, produced, result_shape, sequence_dim):
  """The program wants the reduce-scatter's output laid out so that a device needs rows it
  did not reduce (x's rows not over the other mesh axes, where Shardy's rule cannot shard the
  output over the contracting axis, README; or a constraint that asks for it): XLA then moves
  the output with more collectives after the op. Say so, and how to keep one reduce-scatter."""
  wanted = getattr(result_shape, "sharding", None)
  if mesh.shape[k_axis] == 1 or wanted is None or not _needs_data_from_others(
      produced, wanted, tuple(result_shape.shape)):
    return
  spec = [repr(e) for e in produced.spec]  # the layout the op leaves: no move after it
  spec += ["None"] * (len(result_shape.shape) - len(spec))
  whole = ("; use reduce='all_reduce' if every device needs all of it"
           if wanted.is_fully_replicated else "")
  warnings.warn(
      f"jax_flashoverlap.row_parallel_matmul: the reduce-scatter's output (shape "
      f"{tuple(result_shape.shape)}) is wanted in a layout ({wanted}) that XLA makes with more "
      f"collectives after the op (it leaves rows scattered over {k_axis!r}); constrain it "
      f"(jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P({', '.join(spec)})))) to "
      f"keep one reduce-scatter{whole}", stacklevel=2)


def _needs_data_from_others(produced, wanted, shape) -> bool:
  """Whether some device's block in `wanted` is not inside its block in `produced` (a local
  slice is free; anything else is communication)."""
  have = _blocks(produced, shape)
  for device, want in _blocks(wanted, shape).items():
    for (w0, w1), (h0, h1) in zip(want, have[device]):
      if w1 > w0 and (w0 < h0 or w1 > h1):
        return True
  return False


def _blocks(sharding, shape) -> dict:
  """Each device's block of `shape` under `sharding`, as (start, stop) per dim, uneven
  layouts included: a dim its tiles do not divide is padded by XLA to whole blocks of
  ceil(size / tiles), the last ones partly or wholly empty (`devices_indices_map` raises
  IndivisibleError there, which failed the whole partitioner with JAX's INTERNAL error)."""
  probe = sharding.devices_indices_map((len(sharding.device_set),) * len(shape))
  tiles = [len({index[i].start or 0 for index in probe.values()}) for i in range(len(shape))]
  padded = tuple(t * -(-n // t) for t, n in zip(tiles, shape))
  return {device: tuple((min(s.indices(p)[0], n), min(s.indices(p)[1], n))
                        for s, p, n in zip(index, padded, shape))
          for device, index in sharding.devices_indices_map(padded).items()}


def _sdy_rule(reduce, axis_name, sequence_dim, transpose_w, mesh, value_types, result_types):
  """Shardy rule, built at lowering time when the mesh is known.

  all_reduce: `m k, k n -> m n`, K a reduction factor. reduce_scatter: the contracting axis'
  share t of K reappears as the middle factor of the output rows, between the factor d of the
  other mesh axes (data parallel) and the rows of one shard:

      x: (d m2) (t kk),  w: (t kk) n  ->  out: (d t m3) n

  so Shardy itself propagates P(dp, tp) inputs to a P((dp, tp), None) output: the layout the
  reduce-scatter produces, with no gather after it. With transpose_w, w's two factors swap.
  x of rank 3 or more: the leading dims pass through (b0 b1 ...), and for the reduce-scatter
  the sequence dim is a factor s of x's and the output's is (t s3), t shared with K:

      x: s b1 (t kk),  w: (t kk) n  ->  out: (t s3) b1 n

  There the data-parallel axes are taken to shard another leading dim (Megatron's
  P(None, dp, tp), [B, S, K] as P(dp, None, tp) with sequence_dim=1): the rule sees shapes,
  not shardings, and the 2-D form `(d s2) b1 (t kk) -> (d t s3) b1 n` would keep the output's
  S from being sharded over tp whenever d (S's data-parallel share) is not sharded, as in
  those layouts. With S itself over dp the output loses that share (XLA gathers it after the
  reduce-scatter); a constraint on the output (P((dp, tp), None, None)) gives one
  reduce-scatter (README).
  """
  def w_factors(k):
    return f"n {k}" if transpose_w else f"{k} n"

  shape = _compat.ir_shape(value_types[0])
  if len(shape) > 2:
    return _sdy_rule_leading_dims(reduce, axis_name, sequence_dim, w_factors, mesh, shape)
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
  # K == t: kk would be a size-1 factor, refused by Shardy (an MLIR verifier error); the
  # simple rule lets the per-device op's own error (K of 1 per device) reach the user.
  if t == 1 or k % t or k == t or m % (d * t):
    return simple
  # One row per device (m == d * t): no m3 factor, Shardy refuses a size-1 factor in a
  # compound dim ("dim mapping can't have a factor of size 1").
  m3 = m // (d * t)
  rows, sizes = (" m3", {"m3": m3}) if m3 > 1 else ("", {})
  if d == 1:
    if not rows:  # out rows: t alone, a whole dim (its size is not given)
      return (f"m (t kk) , {w_factors('(t kk)')} -> t n", {"kk": k // t})
    return (f"m (t kk) , {w_factors('(t kk)')} -> (t{rows}) n",
            {"t": t, "kk": k // t, **sizes})
  return (f"(d m2) (t kk), {w_factors('(t kk)')} -> (d t{rows}) n",
          {"d": d, "t": t, "m2": m // d, "kk": k // t, **sizes})


def _sdy_rule_leading_dims(reduce, axis_name, sequence_dim, w_factors, mesh, shape):
  """_sdy_rule for x [..., K] of rank 3 or more (see there)."""
  lead = [f"b{i}" for i in range(len(shape) - 1)]
  simple = (f"{' '.join(lead)} k, {w_factors('k')} -> {' '.join(lead)} n",
            {"reduction_factors": ("k",)})
  names = list(mesh.axis_names)
  if reduce != "reduce_scatter":
    return simple
  if axis_name is None and len(names) == 1:
    axis_name = names[0]
  if axis_name not in names:
    return simple  # contracting axis unknown until partitioning: see README (Shardy note)
  t = int(mesh.shape[axis_name])
  k, s = shape[-1], shape[sequence_dim]
  if t == 1 or k % t or k == t or s % t:  # k == t: a size-1 kk, see _sdy_rule
    return simple
  x_lead, out_lead = list(lead), list(lead)
  x_lead[sequence_dim] = "s"
  sizes = {"t": t, "kk": k // t}
  if s // t > 1:
    out_lead[sequence_dim] = "(t s3)"
    sizes["s3"] = s // t
  else:  # Shardy refuses a size-1 factor in a compound dim
    out_lead[sequence_dim] = "t"
    del sizes["t"]
  return (f"{' '.join(x_lead)} (t kk), {w_factors('(t kk)')} -> {' '.join(out_lead)} n", sizes)


define_partition(_row_parallel, _partition, _infer, _sdy_rule)
_row_parallel_ad = with_dot_gradient("jax_flashoverlap.row_parallel_matmul", _row_parallel, 4)


# --- meshes with Explicit axes (jax.make_mesh's default) ------------------------------------


def explicit_mesh(x, w):
  """The abstract mesh when x or w is typed as sharded over a mesh with Explicit axes
  (jax.make_mesh's default), else None."""
  for v in (x, w):
    mesh = getattr(getattr(jax.typeof(v), "sharding", None), "mesh", None)
    if any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
      return mesh
  return None


def typed_spec(v) -> tuple:
  """The spec entries of v's type (Explicit axes only), one per dim."""
  return _spec(jax.typeof(v).sharding, len(v.shape))


def run_with_auto_axes(call, mesh, out_spec, x, w):
  """call(x, w) with the mesh's axes Auto inside (jax.sharding.auto_axes) and its result typed
  `out_spec` (its Explicit axes). With Explicit axes JAX types every result's sharding, and a
  custom_partitioning op has no typing rule: traced as is, its reference dot of K-sharded
  operands raised ShardingTypeError ('Contracting dimensions are sharded')."""
  explicit = {a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit}
  spec = P(*(spec_entry(tuple(a for a in _spec_axes(e) if a in explicit)) for e in out_spec))
  # auto_axes needs the mesh in context: the types' when no jax.set_mesh is around the call
  context = (jax.sharding.use_abstract_mesh(mesh) if jax.sharding.get_abstract_mesh().empty
             else contextlib.nullcontext())
  with context:
    return jax.sharding.auto_axes(call, out_sharding=spec)(x, w)
