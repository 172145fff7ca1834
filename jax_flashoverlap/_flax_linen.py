"""The linen layers of jax_flashoverlap.flax (RowParallelDense, ColumnParallelDense; import
them from there, whose docstring describes both APIs). What they share with the NNX layers is
in _flax_common, which checks the flax version before any flax API is imported."""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jax_flashoverlap import sharding
from jax_flashoverlap._flax_common import (_Config, _default_bias_init, _default_kernel_init,
                                           _forward, _init_local, _logical_specs, _plain_init,
                                           _resolve_logical)
from jax_flashoverlap._flax_refusals import LINEN_FIELDS, refuse_linear_only

import flax.linen as nn  # after _flax_common's version check

__all__ = ["RowParallelDense", "ColumnParallelDense"]


# ----------------------------------------------------------------------------- Flax linen

class _LinenParallel(nn.Module):
  features: int  # global output size
  axis_name: str | None = None  # default "tp", or from kernel_axes + the logical axis rules
  reduce: str = "all_reduce"
  use_bias: bool = True
  dtype: tp.Any = jnp.bfloat16
  param_dtype: tp.Any = jnp.float32
  kernel_init: tp.Callable = _default_kernel_init
  bias_init: tp.Callable = _default_bias_init
  overlap_backward: bool = False  # see ColumnParallelLinear / RowParallelLinear
  sequence_parallel: bool = False  # column layer only: see ColumnParallelLinear
  sequence_dim: int = 0  # column with sequence_parallel, row with reduce_scatter: see there
  kernel_axes: tp.Any = None  # logical names of the kernel's (in, out) dims
  # nn.Dense's, refused when set (_flax_refusals.LINEN_FIELDS; it says why)
  precision: tp.Any = None
  dot_general: tp.Any = None
  dot_general_cls: tp.Any = None
  promote_dtype: tp.Any = None
  _row: tp.ClassVar[bool] = True

  @nn.compact
  def __call__(self, x: jax.typing.ArrayLike) -> jax.Array:
    layer = type(self).__name__
    refuse_linear_only(layer, {n: getattr(self, n) for n in LINEN_FIELDS})
    axis_name = _resolve_logical(layer, self._row, self.kernel_axes, self.axis_name,
                                 nnx_layer=False)
    cfg = _Config(layer, self._row, None, self.features, axis_name, self.reduce, self.dtype,
                  self.param_dtype, self.overlap_backward, self.sequence_parallel,
                  self.sequence_dim)
    cfg.check()
    shape = tuple(jnp.shape(x))
    if not shape or shape[-1] < 1:  # was an IndexError (rank 0) or, from the kernel's
      # lecun_normal init, a ZeroDivisionError (no features); the NNX layers check in_features
      raise ValueError(f"{layer}: in_features comes from the last dim of x [..., in_features] "
                       f"and must be a positive int; x has shape {shape}")
    k = shape[-1]  # the view's input size: local inside shard_map for the row layer
    in_features = k * (cfg.local_view() or 1) if self._row else k
    n = sharding.mesh_axis_size(axis_name)
    if self._row and not cfg.local_view() and n is not None:
      cfg.split(in_features, n)  # global view: the input dim is sharded over the axis
    kshape, bshape, kspec, bspec = cfg.shapes(in_features)
    partition = nn.with_partitioning
    if self.kernel_axes is not None:  # boxes with the logical names, resolved by the rules
      kspec, bspec = _logical_specs(self._row, self.kernel_axes)
      partition = nn.with_logical_partitioning
    kernel_init = _init_local(cfg, _plain_init(layer, "kernel_init", self.kernel_init, kspec),
                              0 if self._row else 1)
    bias_init = _init_local(cfg, _plain_init(layer, "bias_init", self.bias_init, bspec),
                            None if self._row else 0)
    kernel = self.param("kernel", partition(kernel_init, kspec), kshape,
                        self.param_dtype, unbox=False)
    bias = (self.param("bias", partition(bias_init, bspec), bshape,
                       self.param_dtype, unbox=False) if self.use_bias else None)
    return _forward(cfg, x, _unbox(cfg, kernel), _unbox(cfg, bias), in_features)


def _unbox(cfg: _Config, value):
  # Global view: unboxing a Partitioned param constrains it to its spec (when a mesh is set).
  # Per-device view: the value already is the local shard (a sharding constraint on a manual
  # axis is an error), so the box is only dropped.
  if cfg.local_view() and isinstance(value, nn.Partitioned):
    return value.unbox(apply_constraint=False)
  if isinstance(value, nn.Partitioned) and _all_axes_explicit():
    # There flax's constraint is an assert that the value already has the spec, and a value
    # fresh from the initializer (init under the mesh) has none: reshard it to the spec.
    spec = (nn.logical_to_mesh_axes(value.names, value.rules)
            if isinstance(value, nn.LogicallyPartitioned) else P(*value.names))
    return jax.sharding.reshard(value.unbox(apply_constraint=False), spec)
  return nn.meta.unbox(value)


def _all_axes_explicit() -> bool:
  """Whether the mesh in context has only Explicit axes (with_sharding_constraint asserts)."""
  mesh = jax.sharding.get_abstract_mesh()
  types = getattr(mesh, "axis_types", ()) if not getattr(mesh, "empty", True) else ()
  return bool(types) and all(t == jax.sharding.AxisType.Explicit for t in types)


class RowParallelDense(_LinenParallel):
  """Row-parallel `nn.Dense` (`features`: global output size; the input size comes from x):
  kernel sharded on its input dim over `axis_name`, y = reduce(x @ kernel) + bias, the bias
  added once. Same views, `reduce` and `overlap_backward` as `RowParallelLinear`."""
  _row: tp.ClassVar[bool] = True


class ColumnParallelDense(_LinenParallel):
  """Column-parallel `nn.Dense` (`features`: GLOBAL output size): kernel and bias sharded on
  the output dim; per device y_local [..., features/n] = x @ kernel_local + bias_local.
  `overlap_backward` as in `ColumnParallelLinear`."""
  _row: tp.ClassVar[bool] = False
