"""Trace-time checks of user input: clear exceptions that name the argument and what was
expected, before anything reaches a kernel."""

from __future__ import annotations

import contextlib
import functools
import threading

import jax.numpy as jnp
import numpy as np

from jax_flashoverlap import _compat, comm

SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
ALIGN = 8  # N and K: 16-byte rows for TMA in 2-byte dtypes


class AxisNameError(NameError, ValueError):
  """`axis_name` is not a mesh axis bound by an enclosing shard_map."""


def _shape_dtype(op, name, value):
  shape = getattr(value, "shape", None)
  dtype = getattr(value, "dtype", None)
  if shape is None or dtype is None:
    raise TypeError(f"{op}: {name} must be an array, got {type(value).__name__}")
  symbolic = [str(d) for d in shape if not isinstance(d, (int, np.integer))]
  if symbolic:  # jax.export's shape polymorphism: the plan and the kernels need the sizes
    raise ValueError(f"{op}: {name} has symbolic dimension(s) {', '.join(symbolic)} (shape "
                     f"{tuple(str(d) for d in shape)}); jax_flashoverlap's ops need static "
                     "shapes: export with concrete shapes (jax.export without "
                     "symbolic_shape)")
  return tuple(shape), jnp.dtype(dtype)


def check_operands(op: str, x, w, *, x_rank: str = ">=2", transpose_w: bool = False,
                   x_rank_why: str = "") -> tuple:
  """Validates x [..., K] (or exactly [M, K] when x_rank == "2", the message then adding
  x_rank_why) and w [K, N] (or [N, K] when transpose_w).

  Returns (m, k, n) with m the product of x's leading dims: 0 for x with no rows (an empty
  batch), which the ops give XLA's own composition (`has_no_rows`).
  """
  xs, xd = _shape_dtype(op, "x", x)
  ws, wd = _shape_dtype(op, "w", w)
  names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
  for name, dtype in (("x", xd), ("w", wd)):
    if dtype not in SUPPORTED_DTYPES:
      raise TypeError(f"{op}: {name} has dtype {dtype}; expected one of {names}")
  if xd != wd:
    raise TypeError(f"{op}: x and w must have the same dtype, got x {xd} and w {wd}")
  product = jnp.result_type(x, w)
  if product != xd:  # both weakly typed: JAX types x @ w as its default float, which the CPU
    # path then gave, while the GPU kernels write xd (the handler refused it at run time)
    raise TypeError(f"{op}: x and w are both weakly typed {xd}, whose product x @ w JAX "
                    f"types as {product}; make one of them strongly typed, e.g. "
                    f"x.astype(jnp.{xd.name})")
  # Where K and N sit in w, for the messages: [K, N], or [N, K] with transpose_w=True.
  layout, k_dim, n_dim = (("[N, K] (transpose_w=True)", "last", "first") if transpose_w
                          else ("[K, N]", "first", "last"))
  if len(ws) != 2:
    raise ValueError(f"{op}: w must be a 2-D weight {layout}, got shape {ws}")
  if x_rank == "2" and len(xs) != 2:
    raise ValueError(f"{op}: x must be 2-D [M, K]{x_rank_why}, got shape {xs}")
  if len(xs) < 2:
    raise ValueError(f"{op}: x must have at least 2 dims [..., K], got shape {xs}")
  n, k = ws if transpose_w else ws[::-1]
  if xs[-1] != k:
    hint = (f"; w looks like {'[K, N]' if transpose_w else '[N, K]'}: pass "
            f"transpose_w={not transpose_w}" if xs[-1] == n else "")
    raise ValueError(f"{op}: contracting dims differ: x has K={xs[-1]} (last dim of x, shape "
                     f"{xs}) but w has K={k} ({k_dim} dim of w {layout}, shape {ws}){hint}")
  if xs[-1] == 0:  # (rows of K = 0 elements; no rows, a leading dim of 0, are fine)
    raise ValueError(f"{op}: x must not be empty, got shape {xs}")
  if 0 in ws:
    raise ValueError(f"{op}: w must not be empty, got shape {ws}")
  if k % ALIGN:
    raise ValueError(f"{op}: K (last dim of x, {k_dim} dim of w) must be a multiple of {ALIGN}, "
                     f"got K={k} (x shape {xs}, w shape {ws})")
  if n % ALIGN:
    raise ValueError(f"{op}: N ({n_dim} dim of w) must be a multiple of {ALIGN}, got N={n} "
                     f"(w shape {ws})")
  return int(np.prod(xs[:-1])), int(k), int(n)


def has_no_rows(x) -> bool:
  """x [..., K] has no rows (a leading dim of 0, an empty batch): nothing to compute or overlap,
  so the ops return XLA's own composition, whose empty result and gradients JAX types as
  usual (as `nnx.Linear` / `nn.Dense` do)."""
  return 0 in tuple(x.shape)[:-1]


def check_flag(op: str, name: str, value, meaning: str = "") -> bool:
  # Only a real bool: a 0/1 int or an array would be a silent guess (of a layout, of how
  # many results come back).
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{op}: {name} must be a bool{meaning}, got {value!r}")
  return bool(value)


def check_transpose_w(op: str, transpose_w) -> bool:
  return check_flag(op, "transpose_w", transpose_w, " (True: w is [N, K])")


def check_sequence_dim(op: str, sequence_dim, x_ndim: int | None = None) -> int:
  """sequence_dim: which leading dim of x [..., K] is sharded over the axis (gathered or
  scattered); an int in [-(ndim - 1), ndim - 2] (negative counts from K's end, as numpy's, K
  excluded: -1 is the last leading dim). Returns it non-negative. x_ndim None (x not known
  yet, e.g. a layer's construction): any non-negative int."""
  kind = "an int" if x_ndim is not None else "a non-negative int"
  if isinstance(sequence_dim, (bool, np.bool_)) or \
      not isinstance(sequence_dim, (int, np.integer)) or (x_ndim is None and sequence_dim < 0):
    raise TypeError(f"{op}: sequence_dim must be {kind} (a leading dim of x), "
                    f"got {sequence_dim!r}")
  if x_ndim is None:
    return int(sequence_dim)
  lead = x_ndim - 1
  if not -lead <= sequence_dim < lead:
    raise ValueError(f"{op}: sequence_dim={sequence_dim} is not a leading dim of x "
                     f"({x_ndim}-D: [..., K] has leading dims 0..{lead - 1}, or -{lead}..-1)")
  return int(sequence_dim) % lead


_partitioner = threading.local()


@contextlib.contextmanager
def partitioner_axes(axis_names):
  """Inside a custom partitioner's per-device function (the global views): JAX binds the
  mesh axes there through an axis env, with no shard_map around, so they count as manual."""
  outer = getattr(_partitioner, "axes", ())
  _partitioner.axes = outer + tuple(axis_names)
  try:
    yield
  finally:
    _partitioner.axes = outer


def partitioner_lowering(mesh):
  """Decorates a partition callback's per-device function: runs it under partitioner_axes."""
  def wrap(fn):
    @functools.wraps(fn)
    def lower(*args):
      with partitioner_axes(mesh.axis_names):
        return fn(*args)
    return lower
  return wrap


def _manual_axes():
  """Mesh axes made manual by the enclosing shard_map (or pmap, or a global view's
  partitioner), () outside one; None when this JAX does not say (then only boundness is
  checked)."""
  manual = _compat.manual_axis_names()
  if manual is None:
    return None
  return tuple(manual) + getattr(_partitioner, "axes", ())


def is_manual_axis(name) -> bool:
  """Whether `name` is bound here as a manual mesh axis (shard_map, pmap, a global view's
  partitioner), which the per-device view needs; a vmap axis of the same name is not."""
  if name not in _compat.bound_axis_names():
    return False
  manual = _manual_axes()
  if manual is not None:
    return name in manual
  mesh_axes = _compat.mesh_axis_names()  # this JAX does not say: as check_axis_name
  return mesh_axes is None or name in mesh_axes


def check_axis_name(op: str, axis_name) -> int:
  """Checks every axis in `axis_name` is a bound, manual mesh axis of the enclosing
  shard_map; returns the group size. A vmap axis name is bound too, but the ops' collectives
  (and their kernels) run over mesh devices only: JAX fails on it later with a bare
  AssertionError / NameError, so it is refused here."""
  axes = comm.normalize_axes(axis_name)
  if not axes:
    raise AxisNameError(f"{op}: axis_name must name at least one mesh axis, got {axis_name!r}")
  bound = _compat.bound_axis_names()
  mesh_axes = _compat.mesh_axis_names()
  manual = _manual_axes()
  for i, a in enumerate(axes):
    if not isinstance(a, str):
      raise TypeError(f"{op}: axis_name must be a mesh axis name (str) or a tuple of them, "
                      f"got {axis_name!r}")
    if a in axes[:i]:  # JAX: "repeated axis in `source` argument", at lowering
      raise AxisNameError(f"{op}: axis_name {axis_name!r} names axis {a!r} more than once; "
                          "each mesh axis may appear once")
    if a not in bound:
      where = (f"the bound axes are {tuple(bound)}" if bound
               else "no axis is bound here: call it inside jax.shard_map")
      raise AxisNameError(f"{op}: axis_name {a!r} is not bound; {where}")
    if mesh_axes is not None and a not in mesh_axes:
      raise AxisNameError(f"{op}: axis_name {a!r} is not an axis of the enclosing mesh "
                          f"{tuple(mesh_axes)}; vmap axis names are not supported")
    if manual is not None and a not in manual:
      where = (f"its manual axes are {manual}" if manual
               else "no jax.shard_map encloses this call")
      raise AxisNameError(f"{op}: axis_name {a!r} is not a mesh axis of an enclosing "
                          f"jax.shard_map ({where}); vmap axis names are not supported")
  return int(np.prod([_compat.axis_size(a) for a in axes]))


def check_comm_sms(op: str, comm_sms) -> None:
  if comm_sms is None:
    return
  if not isinstance(comm_sms, (int, np.integer)) or isinstance(comm_sms, bool):
    raise TypeError(f"{op}: comm_sms must be an int or None, got {comm_sms!r}")
  from jax_flashoverlap.plan import MAX_COMM_SMS
  if not 0 <= int(comm_sms) <= MAX_COMM_SMS:
    raise ValueError(f"{op}: comm_sms must be in [0, {MAX_COMM_SMS}] (the GEMM keeps at least "
                     f"one 2-SM cluster), got {comm_sms}")
