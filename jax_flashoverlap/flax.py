"""Tensor-parallel linear layers for Flax (NNX and linen) on top of jax_flashoverlap's ops.

    RowParallelLinear / RowParallelDense        kernel [in, out] sharded on `in` over `axis_name`;
        y = reduce(x_local @ kernel_local) + bias   (reduce: "all_reduce" | "reduce_scatter")
    ColumnParallelLinear / ColumnParallelDense  kernel [in, out] and bias sharded on `out`;
        y_local = x @ kernel_local + bias_local     (no communication)

A tensor-parallel MLP is `ColumnParallel -> activation -> RowParallel`; nothing else is needed.

Sizes are always GLOBAL (the unsharded layer's `in_features` / `out_features`, linen's
`features`), and the view is decided by where the layer runs, with no flag to keep in sync:

* Inside `jax.shard_map` over `axis_name` (per-device view): arrays are the local shards. The
  row layer takes x [..., in/n] and a kernel shard [in/n, out] and calls `matmul_all_reduce`
  (or `matmul_reduce_scatter`); the column layer takes x [..., in] and a kernel shard
  [in, out/n] and is XLA's `x @ kernel`; with overlap_backward=True (off by default) its
  backward's all-reduce of dx (x replicated over the axis, check_vma=True) is
  `matmul_all_reduce`, so it overlaps too. Params made there (linen `init`, or an NNX
  layer constructed there) get the local shapes: this device's shard of the params the same
  key gives outside shard_map; params made outside carry the global shapes
  and their partition specs, so pass them in with `in_specs=nnx.get_partition_spec(state)`
  (NNX) or `nn.get_partition_spec(variables)` (linen).
* Anywhere else, e.g. plain `jax.jit` with NamedSharding inputs (global view): arrays are
  global. The row layer calls `row_parallel_matmul` on x as it is (leading dims kept, the
  reduce-scatter's over the sequence dim); the column layer is a plain `x @ kernel`
  that XLA partitions with no communication (the signaling GEMM only pays off next to a
  collective, and an FFI call cannot be partitioned by XLA), or, with sequence_parallel=True,
  `column_parallel_matmul`: x's first dim sharded over the axis (what a row layer with
  reduce="reduce_scatter" returns) is gathered inside the op, overlapped with the GEMM, and
  x's other leading dims keep their sharding: on a (dp, tp) mesh give x [S, B, in] as
  P(tp, dp, None) (output P(None, dp, tp)), or [B, S, in] as P(dp, tp, None) with
  sequence_dim=1 (output P(dp, None, tp), each device's output block moved after the GEMM).

Sharding annotations: NNX params are `nnx.Param(..., out_sharding=spec)` (what
`nnx.with_partitioning` makes; `sharding_names=` before flax 0.12.4: SHARDING_KEY): kernel
(axis_name, None) for row, (None, axis_name) for column; bias (None,) for row (replicated: it
is added once, after the reduction; one name per dim, as nnx.scan / nnx.vmap's
transform_metadata need to add and remove a layer axis), (axis_name,) for column. They are
sharded eagerly when a mesh is known at construction (`mesh=` or `jax.set_mesh`), else only
annotated. Linen params are `nn.with_partitioning` boxes with the same specs.

Params may be float32 (`param_dtype`); they are cast to `dtype` for the op, which must be
bfloat16 or float16 (the only dtypes the jax_flashoverlap ops support). The sizes an op gets
(row layers; column layers with sequence_parallel or overlap_backward) must be multiples of 8
per device, checked at construction when the mesh is known, else at the call; a plain column
layer (XLA's dot) takes any size.

Logical axis names: `kernel_axes=("embed", "mlp")` (names of the kernel's (in, out) dims)
instead of `axis_name`. The params are annotated with those names (and, when a mesh is known
at construction, sharded by the mesh axes they map to), and the mesh axis the op
reduces over is what flax's logical axis rules (`flax.linen.logical_axis_rules(...)` around
construction / apply, or the NNX layer's `sharding_rules=`) map the sharded dim to: the input
dim for row layers, the output dim for column layers. The other dim must map to None.
"""

from __future__ import annotations

import typing as tp

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jax_flashoverlap import sharding
# _flax_common checks the flax version on import, before flax.nnx (which older flax fails to
# import) and before any flax API is used. It holds what the NNX layers (here) and the linen
# layers (_flax_linen) share; the linen layers are public here.
from jax_flashoverlap._flax_common import (REDUCTIONS, SHARDING_KEY, _Config,
                                           _default_bias_init, _default_kernel_init, _flax_spmd,
                                           _forward, _init_local, _logical_specs, _plain_init,
                                           _resolve_logical)
from jax_flashoverlap._flax_linen import ColumnParallelDense, RowParallelDense
from jax_flashoverlap._flax_refusals import refuse_linear_only

from flax import nnx  # after _flax_common's version check

__all__ = ["RowParallelLinear", "ColumnParallelLinear", "RowParallelDense",
           "ColumnParallelDense", "REDUCTIONS"]


# ----------------------------------------------------------------------------- Flax NNX

class _NNXParallel(nnx.Module):
  _row: bool = True

  def __init__(self, in_features: int, out_features: int, *, axis_name: str | None = None,
               reduce: str = "all_reduce", use_bias: bool = True, dtype=jnp.bfloat16,
               param_dtype=jnp.float32, kernel_init=_default_kernel_init,
               bias_init=_default_bias_init, mesh: jax.sharding.Mesh | None = None,
               overlap_backward: bool = False,
               sequence_parallel: bool = False, sequence_dim: int = 0, kernel_axes=None,
               sharding_rules=(), rngs: nnx.Rngs, **linear_only):
    layer = type(self).__name__
    refuse_linear_only(layer, linear_only)
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
      # was an AttributeError ('str' object has no attribute 'shape'), or for an AbstractMesh
      # JAX's TypeError about the params' device_put
      raise TypeError(f"{layer}: mesh must be a jax.sharding.Mesh (the devices the params are "
                      f"put on) or None, got {type(mesh).__name__}" +
                      (": an AbstractMesh has no devices; pass the concrete Mesh it came from, or "
                       "build the layer under jax.set_mesh with that Mesh"
                       if isinstance(mesh, jax.sharding.AbstractMesh) else ""))
    axis_name = _resolve_logical(layer, self._row, kernel_axes, axis_name, sharding_rules)
    self.cfg = _Config(layer, self._row, in_features, out_features, axis_name, reduce, dtype,
                       param_dtype, overlap_backward, sequence_parallel, sequence_dim,
                       () if mesh is None else tuple(mesh.shape.items()))
    self.cfg.check(mesh)
    kshape, bshape, kspec, bspec = self.cfg.shapes(in_features)
    # Sharded now when a mesh is known (and the params are global); else only annotated.
    eager = self.cfg.local_view() is None and (mesh is not None or
                                               sharding.mesh_axis_size(axis_name) is not None)
    meta = dict(eager_sharding=eager, **({"mesh": mesh} if mesh is not None else {}))
    # what a with_partitioning box around an initializer may name: the layer's annotations
    kbox, bbox = ((kspec, bspec) if kernel_axes is None
                  else _logical_specs(self._row, kernel_axes))
    kinit = _plain_init(layer, "kernel_init", kernel_init, kbox)
    binit = _plain_init(layer, "bias_init", bias_init, bbox)
    kernel = _init_local(self.cfg, kinit, 0 if self._row else 1)(
        rngs.params(), kshape, param_dtype)
    bias = (_init_local(self.cfg, binit, None if self._row else 0)(
        rngs.params(), bshape, param_dtype) if use_bias else None)
    if kernel_axes is not None:  # annotated with the logical names (+ the layer's own rules)
      if eager:  # sharded by the mesh axes the names resolved to (as axis_name would be)
        kernel, bias = (None if v is None else _flax_spmd.shard_value(v, P(*spec), None, mesh)
                        for v, spec in ((kernel, kspec), (bias, bspec)))
      kspec, bspec = _logical_specs(self._row, kernel_axes)
      meta.update(eager_sharding=False,
                  **({"sharding_rules": tuple(sharding_rules)} if sharding_rules else {}))
    if bias is not None and eager and mesh is not None and not tuple(bspec):
      # Replicated over the mesh given, as under jax.set_mesh (Flax leaves a value annotated
      # () with mesh= on one device, so each jitted call would copy it over first).
      bias = jax.device_put(bias, jax.sharding.NamedSharding(mesh, P()))
    self.kernel = nnx.Param(kernel, **{SHARDING_KEY: kspec}, **meta)
    self.bias = nnx.Param(bias, **{SHARDING_KEY: bspec}, **meta) if use_bias else None

  def __call__(self, x: jax.typing.ArrayLike) -> jax.Array:
    in_features = tp.cast(int, self.cfg.in_features)  # NNX: given at construction (linen: None)
    return _forward(self.cfg, x, self.kernel[...],
                    None if self.bias is None else self.bias[...], in_features)


class RowParallelLinear(_NNXParallel):
  """Row-parallel `nnx.Linear`: kernel [in_features, out_features] sharded on its input dim over
  `axis_name`; y = reduce(x @ kernel) + bias, the bias added once after the reduction.

  reduce="all_reduce": y [..., out] (`matmul_all_reduce` / `row_parallel_matmul`);
  "reduce_scatter": the first dim of y is scattered over the axis (per-device [S/n, ..., out];
  `sequence_dim=1`: the second, for x [B, S, ...]). Under plain jit x keeps its leading dims'
  sharding: [S, B, in] as P(None, dp, tp) gives P(tp, dp, None) (reduce_scatter).
  Inside shard_map x is [..., in_features / n]; see the module docstring for the two views.
  overlap_backward=True with reduce="reduce_scatter" (inside shard_map): the backward's
  dx = all_gather(dy) @ kernel.T is `all_gather_matmul(..., transpose_w=True,
  return_gathered=True)`, overlapped, and dw = x.T @ all_gather(dy) reuses its gathered dy
  (XLA's dot). With reduce="all_reduce" the backward has no collective and the flag changes
  nothing.
  """
  _row = True


class ColumnParallelLinear(_NNXParallel):
  """Column-parallel `nnx.Linear`: kernel [in_features, out_features] and bias sharded on the
  output dim over `axis_name`; per device y_local [..., out/n] = x @ kernel_local + bias_local
  (XLA's dot), no communication in the forward. overlap_backward=True: inside a check_vma
  shard_map with x replicated, the backward's all-reduce of dx is `matmul_all_reduce`
  (overlapped); worth it when this layer is x's only reader (fused q|k|v).
  sequence_parallel=True: inside shard_map, x is this device's share of the first dim (the
  sequence-parallel layout a row layer with reduce="reduce_scatter" returns), and the layer is
  `all_gather_matmul`: y_local [B, ..., out/n] = all_gather(x) @ kernel_local (overlapped on
  GPUs where the cost model predicts a gain, else XLA's all_gather + dot); with
  overlap_backward=True its backward's dx (a reduce-scatter of dy @ kernel.T) is
  `matmul_reduce_scatter(..., transpose_w=True)`, overlapped too. Under plain jit (global
  view) it is `column_parallel_matmul` on x [..., in] whose first dim is sharded over the axis
  (the output's first dim is whole, its last sharded; other leading dims keep their
  data-parallel sharding: [S, B, in] as P(tp, dp, None) gives P(None, dp, tp)); the backward
  is XLA's. `sequence_dim=1` (with sequence_parallel) gathers x's second dim instead, for x
  [B, S, in] as P(dp, tp, None), in both views: the output's blocks are then moved into place
  after the GEMM (a copy, unless B is 1 per device; with overlap_backward the backward's
  reduce-scatter scatters that dim too). `reduce` is for row layers: a column layer
  refuses any other value than its default."""
  _row = False
