"""What the Flax layers of jax_flashoverlap.flax share, NNX (flax.py) and linen (_flax_linen.py):
the layer's configuration and its checks (_Config), the logical-axis resolution, the param
initialisers (per-device shards, sharding boxes taken off), and the forward that calls the ops.
Importing it checks the flax version first (older flax is refused, naming both versions)."""

from __future__ import annotations

import dataclasses
import operator
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_flashoverlap import _compat, _validation, ops, sharding, sharding_column
from jax_flashoverlap._flax_refusals import check_flax_version, flax_version
from jax_flashoverlap.layer_backward import column_matmul as _column_matmul
from jax_flashoverlap.layer_backward import row_scatter_matmul as _row_scatter_matmul
from jax_flashoverlap.layer_backward import sequence_parallel_matmul as _sequence_parallel_matmul

import flax

check_flax_version(flax.__version__)  # before flax.nnx, which older flax fails to import

import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from flax.core import spmd as _flax_spmd  # noqa: E402

REDUCTIONS = sharding.REDUCTIONS  # ("all_reduce", "reduce_scatter")
_OP_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_default_kernel_init = nn.initializers.lecun_normal()
_default_bias_init = nn.initializers.zeros_init()
# The nnx.Variable metadata key of a param's partition spec (what nnx.with_partitioning writes,
# nnx.get_partition_spec and eager sharding read): "out_sharding" since flax 0.12.4, which
# warns at the old name; "sharding_names" before, where "out_sharding" is just another
# metadata entry and the params were left unsharded and unannotated (spec P()).
SHARDING_KEY = "out_sharding" if flax_version(flax.__version__) >= (0, 12, 4) else "sharding_names"


@dataclasses.dataclass(frozen=True)
class _Config:
  layer: str
  row: bool  # row-parallel (contracting dim sharded) or column-parallel (output dim sharded)
  in_features: int | None  # None: linen, taken from x
  out_features: int
  axis_name: str
  reduce: str
  dtype: tp.Any
  param_dtype: tp.Any
  # Reverse mode only when True (custom_vjp: jax.jvp / jacfwd through the layer raise; README)
  overlap_backward: bool = False  # the backward's collective of dx overlapped too: column
  # layer: its all-reduce (sequence parallel: reduce-scatter) through matmul_all_reduce
  # (matmul_reduce_scatter), kernel read in place; row layer with reduce_scatter: dy's
  # all-gather through all_gather_matmul (which returns the gathered dy for dw)
  sequence_parallel: bool = False  # column layer: x sharded on its first dim, all_gather_matmul
  sequence_dim: int = 0  # the leading dim of x that is the sequence (gathered / scattered)
  mesh_shape: tuple = ()  # ((axis, size), ...) of the mesh given at construction (NNX mesh=)

  def __post_init__(self):
    # Sizes as Python ints (numpy integers too, as nnx.Linear / nn.Dense take them); anything
    # else is left for check() to report.
    for name in ("in_features", "out_features"):
      value = getattr(self, name)
      if not isinstance(value, (bool, np.bool_)) and hasattr(value, "__index__"):
        object.__setattr__(self, name, operator.index(value))

  def check(self, mesh=None):
    """Construction-time checks (the mesh ones when a mesh is known)."""
    if not isinstance(self.axis_name, str):
      raise TypeError(f"{self.layer}: axis_name must be a mesh axis name (str), "
                      f"got {self.axis_name!r}")
    for flag in ("overlap_backward", "sequence_parallel"):
      if not isinstance(getattr(self, flag), bool):
        raise TypeError(f"{self.layer}: {flag} must be a bool, got {getattr(self, flag)!r}")
    if self.row and self.sequence_parallel:
      raise ValueError(f"{self.layer}: sequence_parallel is for column layers; a row layer "
                       "returns sequence-sharded rows with reduce='reduce_scatter'")
    if not self.row and self.reduce != "all_reduce":  # silently unused before
      raise ValueError(f"{self.layer}: reduce is for row layers (a column layer reduces "
                       f"nothing; sequence_parallel=True gathers x's rows), got "
                       f"reduce={self.reduce!r}")
    _validation.check_sequence_dim(self.layer, self.sequence_dim)
    if self.sequence_dim and not (self.sequence_parallel or self.reduce == "reduce_scatter"):
      raise ValueError(f"{self.layer}: sequence_dim={self.sequence_dim} needs "
                       + ("reduce='reduce_scatter' (it names the dim that is scattered)"
                          if self.row else
                          "sequence_parallel=True (it names the dim that is gathered)"))
    mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    names = () if mesh is None or getattr(mesh, "empty", False) else tuple(mesh.axis_names)
    if names and self.axis_name not in names and not _validation.is_manual_axis(self.axis_name):
      raise ValueError(f"{self.layer}: axis_name {self.axis_name!r} is not an axis of the "
                       f"mesh {names}")
    if self.row and self.reduce not in REDUCTIONS:
      raise ValueError(f"{self.layer}: reduce must be one of {REDUCTIONS}, got {self.reduce!r}")
    for name, value in (("in_features", self.in_features), (self.out_name, self.out_features)):
      if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                or value <= 0):
        raise ValueError(f"{self.layer}: {name} must be a positive int, got {value!r}")
    try:
      dtype = jnp.dtype(self.dtype)
    except TypeError:
      dtype = None
    if dtype not in _OP_DTYPES:
      raise TypeError(f"{self.layer}: dtype={self.dtype!r} is not supported: the "
                      "jax_flashoverlap ops support only bfloat16 and float16 (params may be "
                      "float32 through param_dtype; they are cast to dtype for the op)")
    try:
      param_dtype = jnp.dtype(self.param_dtype)
    except TypeError:  # was numpy's bare "data type 'foo' not understood"
      param_dtype = None
    if param_dtype is None or not jnp.issubdtype(param_dtype, jnp.floating):
      raise TypeError(f"{self.layer}: param_dtype must be a floating dtype, "
                      f"got {self.param_dtype!r}")
    n = sharding.mesh_axis_size(self.axis_name, mesh)
    if n is not None:
      self.split(self.in_features if self.row else self.out_features, n)
    self.check_aligned(self.in_features, n)

  def check_aligned(self, in_features, n):
    """The sizes a jax_flashoverlap op of this layer gets (K and N of the GEMM: the dims as
    stored, per device) must be multiples of 8; named here as the layer's own arguments.
    A plain column layer runs no op (XLA's dot) and takes any size. n: the axis size, or None
    when not known yet (then only the unsplit dim and the necessary in_features % 8)."""
    if not (self.row or self.sequence_parallel or self.overlap_backward):
      return
    align = _validation.ALIGN
    split, other = ((("in_features", in_features), (self.out_name, self.out_features))
                    if self.row else
                    ((self.out_name, self.out_features), ("in_features", in_features)))
    why = (f"the jax_flashoverlap ops need multiples of {align} (16-byte rows); a plain "
           "column layer takes any size")
    for (name, size), per_device in ((other, False), (split, True)):
      if size is None:
        continue
      if per_device and n is not None and size % n == 0 and (size // n) % align:
        raise ValueError(f"{self.layer}: {name}={size} split over mesh axis "
                         f"{self.axis_name!r} (size {n}) is {size // n} per device; {why}")
      if size % align:
        raise ValueError(f"{self.layer}: {name}={size} must be a multiple of {align}; {why}")

  @property
  def out_name(self) -> str:
    return "out_features" if self.in_features is not None else "features"  # NNX / linen

  def split(self, size, n) -> int | None:
    """size / n (None for a size not known yet: linen's in_features), with an error naming
    the layer's dim when it does not divide."""
    dim = "in_features" if self.row else self.out_name
    if size is not None and size % n:
      raise ValueError(f"{self.layer}: {dim}={size} is not divisible by the size {n} of mesh "
                       f"axis {self.axis_name!r}")
    return None if size is None else size // n

  def mesh_axis_size(self) -> int | None:
    """The axis' size in the mesh in context, else in the construction mesh; None if unknown."""
    size = sharding.mesh_axis_size(self.axis_name)
    return size if size is not None else dict(self.mesh_shape).get(self.axis_name)

  def local_view(self) -> int | None:
    """The axis size when running per-device (inside shard_map over axis_name), else None
    (also under a jax.vmap whose axis_name is the same: that is not a mesh axis)."""
    if _validation.is_manual_axis(self.axis_name):
      return _compat.axis_size(self.axis_name)
    return None

  def shapes(self, in_features):
    """(kernel shape, bias shape, kernel spec, bias spec) in the current view."""
    n = self.local_view() or 1
    if self.row:
      return ((self.split(in_features, n), self.out_features), (self.out_features,),
              (self.axis_name, None), (None,))
    out = self.split(self.out_features, n)
    return (in_features, out), (out,), (None, self.axis_name), (self.axis_name,)


def _resolve_logical(layer: str, row: bool, kernel_axes, axis_name, rules=(), nnx_layer=True):
  """Mesh axis of the kernel's sharded dim from logical names (`kernel_axes` = names of the
  kernel's (in, out) dims) and the logical axis rules in effect (flax's
  `logical_axis_rules` context, then `rules`). Without kernel_axes: axis_name (default "tp")."""
  if kernel_axes is None:
    return "tp" if axis_name is None else axis_name
  if (not isinstance(kernel_axes, (tuple, list)) or len(kernel_axes) != 2 or
      not all(a is None or isinstance(a, str) for a in kernel_axes)):
    raise TypeError(f"{layer}: kernel_axes must be two logical axis names (str or None) for "
                    f"the kernel's (in, out) dims, got {kernel_axes!r}")
  table = dict(_flax_spmd.composite_rules(_flax_spmd.get_logical_axis_rules(), tuple(rules)))
  sharded, other = (kernel_axes[0], kernel_axes[1]) if row else (kernel_axes[1], kernel_axes[0])
  where = "input" if row else "output"
  mesh_axis = table.get(sharded) if sharded is not None else None
  if not isinstance(mesh_axis, str):
    raise ValueError(f"{layer}: the kernel's {where} dim (logical axis {sharded!r}) must map to "
                     f"one mesh axis through the logical axis rules, got {mesh_axis!r} (rules: "
                     f"{sorted(table.items(), key=str)}); set them with "
                     + ("flax.linen.logical_axis_rules(...) or sharding_rules=" if nnx_layer else
                        "`with flax.linen.logical_axis_rules(...):` around init and apply "
                        "(the layer resolves them at every call)"))
  if other is not None and table.get(other) is not None:
    raise ValueError(f"{layer}: the kernel's other dim (logical axis {other!r}) maps to mesh "
                     f"axis {table[other]!r}; only the {where} dim may be sharded")
  if axis_name is not None and axis_name != mesh_axis:
    raise ValueError(f"{layer}: axis_name={axis_name!r} disagrees with kernel_axes "
                     f"{tuple(kernel_axes)!r}, which the rules map to {mesh_axis!r}")
  return mesh_axis


def _init_local(cfg: _Config, init, dim: int | None):
  """init(key, shape, dtype), and in the per-device view (inside shard_map over the axis) this
  device's block along `dim` (the sharded dim; None: a replicated param) of init(key, global
  shape): the shard of the layer made outside shard_map with the same key. Initialising the
  local shape instead would give every device the same block and take the fan-in of the
  local shape. The global array exists only transiently, at initialisation."""
  def init_fn(key, shape, dtype):
    n = cfg.local_view()
    if not n or dim is None:
      return init(key, shape, dtype)
    size = shape[dim]
    full = init(key, tuple(s * n if d == dim else s for d, s in enumerate(shape)), dtype)
    return lax.dynamic_slice_in_dim(full, lax.axis_index(cfg.axis_name) * size, size, dim)
  return init_fn


def _plain_init(layer: str, name: str, init, spec):
  """init with the sharding box that nnx.with_partitioning / nn.with_partitioning (the
  nnx.Linear / nn.Dense idiom) wrap around its value taken off: the layer annotates its params
  itself, and the box would replace the NNX spec (its mesh=None too) or nest inside linen's.
  A box naming the layer's own spec (trailing Nones aside) is accepted; another is an error."""
  def trimmed(names):
    names = tuple(names)
    while names and names[-1] is None:
      names = names[:-1]
    return names

  def init_fn(key, shape, dtype):
    value = init(key, shape, dtype)
    if isinstance(value, nnx.VariableMetadata):
      got, value = value.metadata.get(SHARDING_KEY), value.raw_value
    elif isinstance(value, nn.meta.AxisMetadata):
      got, value = getattr(value, "names", None), nn.meta.unbox(value)
    else:
      return value
    if got is not None and trimmed(got) != trimmed(spec):
      raise ValueError(f"{layer}: {name} is wrapped with the sharding {tuple(got)!r}, but the "
                       f"layer shards its {name.split('_')[0]} as {tuple(spec)!r}; pass the plain "
                       "initializer (the layer annotates its params itself)")
    return value
  return init_fn


def _logical_specs(row: bool, kernel_axes):
  """(kernel, bias) annotations in logical names: the bias follows the output dim."""
  return tuple(kernel_axes), ((None,) if row else (kernel_axes[1],))


def _forward(cfg: _Config, x, kernel, bias, in_features: int):
  """The layer's forward for both NNX and linen; `kernel` / `bias` in param_dtype."""
  x = jnp.asarray(x)
  n = cfg.local_view()
  view = (f"inside shard_map over {cfg.axis_name!r} (size {n}) x and the params are the local "
          "shards: pass the params with their partition specs" if n else
          "outside shard_map x and the params are global arrays")
  expect = tuple(cfg.shapes(in_features)[0])
  if not n and _compat.manual_axis_names():
    manual = tuple(_compat.manual_axis_names())
    if cfg.axis_name not in (_compat.mesh_axis_names() or (cfg.axis_name,)):
      raise ValueError(
          f"{cfg.layer}: called inside jax.shard_map manual over {manual}, whose mesh has no "
          f"axis {cfg.axis_name!r} (its axes: {_compat.mesh_axis_names()}): build the layer "
          f"with the axis its kernel is sharded over, e.g. axis_name={manual[0]!r}")
    raise ValueError(
        f"{cfg.layer}: called inside jax.shard_map manual over {manual} but not over its axis "
        f"{cfg.axis_name!r}: add {cfg.axis_name!r} to the shard_map's axis_names (the layer "
        "then works on the local shards), or call it outside shard_map (global view under "
        "jax.jit)")
  cfg.check_aligned(in_features, n or cfg.mesh_axis_size())
  if x.ndim < 1 or x.shape[-1] != expect[0] or tuple(kernel.shape) != expect:
    raise ValueError(f"{cfg.layer}: x {tuple(x.shape)} and kernel {tuple(kernel.shape)} do not "
                     f"match: expected x [..., {expect[0]}] and kernel {expect}; {view}")
  squeeze = x.ndim == 1
  if squeeze and cfg.row and cfg.reduce == "reduce_scatter" and (n or cfg.mesh_axis_size() or 1) > 1:
    raise ValueError(f"{cfg.layer}: reduce='reduce_scatter' scatters x's rows over axis "
                     f"{cfg.axis_name!r}, and x of shape {tuple(x.shape)} has none: pass x of "
                     "rank >= 2 ([rows, in_features]) or use reduce='all_reduce'")
  x = (x[None] if squeeze else x).astype(cfg.dtype)
  w = kernel.astype(cfg.dtype)
  y = _row(cfg, x, w) if cfg.row else _column(cfg, x, w)
  if bias is not None:  # broadcast spelt out, as nnx.Linear / nn.Dense do: the add then
    # also works under jax_numpy_rank_promotion='raise'
    y = y + jnp.reshape(bias.astype(cfg.dtype), (1,) * (y.ndim - 1) + (-1,))
  return y[0] if squeeze else y


def _row(cfg: _Config, x, w):
  n = cfg.local_view()
  lead = x.shape[:-1]
  if not n:  # global view: x as it is, its leading dims' sharding kept
    if cfg.reduce == "reduce_scatter":  # at trace time (the partitioner's error is INTERNAL);
      # the mesh in context only: the arrays may live on another mesh than the NNX mesh= one
      dim = _validation.check_sequence_dim(cfg.layer, cfg.sequence_dim, x.ndim)
      sharding.check_scatter_size(cfg.layer, x.shape, cfg.reduce, dim, cfg.axis_name,
                                  sharding.mesh_axis_size(cfg.axis_name))
    # The axis named even with no mesh in context (linen applied under plain jit to sharded
    # arrays): Shardy then infers the reduce-scatter's layout on meshes of several axes.
    return sharding.row_parallel_matmul(x, w, cfg.reduce, cfg.axis_name,
                                        sequence_dim=cfg.sequence_dim)
  if cfg.reduce == "all_reduce":
    return ops.matmul_all_reduce(x, w, cfg.axis_name)
  # reduce_scatter: the first dim of x (or sequence_dim) is scattered over the axis (rank r
  # keeps [r*S/n, (r+1)*S/n)), as psum_scatter(x @ w, axis, scatter_dimension=0, tiled=True).
  dim = _validation.check_sequence_dim(cfg.layer, cfg.sequence_dim, x.ndim)
  if lead[dim] % n:
    which = "the first dim" if dim == 0 else f"dim {dim} (sequence_dim)"
    raise ValueError(f"{cfg.layer}: reduce='reduce_scatter' needs {which} of x (shape "
                     f"{tuple(x.shape)}) to be divisible by the size {n} of axis "
                     f"{cfg.axis_name!r}")
  if cfg.overlap_backward:
    return _row_scatter_matmul(x, w, cfg.axis_name, dim)
  return ops.matmul_reduce_scatter(x, w, cfg.axis_name, sequence_dim=dim)


def _column(cfg: _Config, x, w):
  """x @ w with XLA's dot. Inside a check_vma shard_map, when x is the same on every device
  of the axis and the kernel shard is not, the backward needs psum(dy @ w.T) for dx; with
  overlap_backward=True that is `matmul_all_reduce(..., transpose_w=True)` (the kernel read in
  place), so it overlaps too. Off by default: when several column layers read the same x
  (separate q/k/v), XLA adds their dx before one all-reduce, fewer bytes than one overlapped
  all-reduce per layer; fuse such layers (one q|k|v layer) first. Elsewhere (global view,
  check_vma=False, x varying) the backward is XLA's, exactly what nnx.Linear would do there;
  with sequence_parallel=True the global view is `column_parallel_matmul` (x's first dim
  sharded over the axis is gathered inside the op, overlapped with the GEMM)."""
  axis = cfg.axis_name
  if cfg.sequence_parallel and cfg.local_view():  # x: this device's rows of the sequence
    if cfg.overlap_backward:
      return _sequence_parallel_matmul(x, w, axis, cfg.sequence_dim)
    return ops.all_gather_matmul(x, w, axis, sequence_dim=cfg.sequence_dim)
  if cfg.sequence_parallel:  # global view: x's sequence dim sharded over the axis, or not
    return sharding_column.column_parallel_matmul(x, w, cfg.axis_name,
                                                  sequence_dim=cfg.sequence_dim)
  if cfg.overlap_backward and axis in _compat.varying_axes(w) and \
      axis not in _compat.varying_axes(x):
    return _column_matmul(x, w, axis, 0)
  return jnp.matmul(x, w)
