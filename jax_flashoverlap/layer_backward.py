"""The parallel layers' matmuls whose backward overlaps too (jax_flashoverlap.flax uses them;
they need no Flax): per-device functions for inside `jax.shard_map`, each a custom VJP whose
dx is one of our ops (the GEMM with its collective) and whose dw is XLA's own backward of the
plain composition.

    column_matmul(x, w, axis, 0)              x @ w, x replicated and w sharded on out over
                                              `axis`: dx = psum(dy @ w.T), matmul_all_reduce
    sequence_parallel_matmul(x, w, axis, dim) all_gather_matmul forward, dx by
                                              matmul_reduce_scatter over the sequence dim
    row_scatter_matmul(x, w, axis, dim)       matmul_reduce_scatter forward, dx by
                                              all_gather_matmul (dy gathered once, for dw too)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_flashoverlap import _compat, ops


def overlapped_dx(forward, dw_reference, dx_op, gathers_dy=False, reference=None):
  """forward(x, w, axis, sequence_dim) whose backward computes dx with our op `dx_op(dy, w,
  axis, sequence_dim)` (dy @ w.T and its collective, the kernel w [in, out/n] read in place
  as the [N, K] weight) and dw exactly as XLA's own backward of `dw_reference(x, w, axis,
  sequence_dim)`. gathers_dy: dx_op is all_gather_matmul, whose gathered dy (returned with
  dx, no second gather) is the cotangent of dw_reference. reference (default dw_reference):
  forward's plain composition, whose own backward serves where an operand is empty (nothing
  to overlap)."""
  reference = reference or dw_reference
  @functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
  def call(x, w, axis_name, sequence_dim):
    return forward(x, w, axis_name, sequence_dim)

  def fwd(x, w, axis_name, sequence_dim):
    return forward(x, w, axis_name, sequence_dim), (x, w)

  def bwd(axis_name, sequence_dim, res, dy):
    x, w = res
    if 0 in dy.shape or 0 in x.shape or 0 in w.shape:  # nothing to overlap
      _, vjp = jax.vjp(lambda x, w: reference(x, w, axis_name, sequence_dim), x, w)
      return vjp(dy)
    if gathers_dy:
      dx, dy = dx_op(dy, w, axis_name, sequence_dim, return_gathered=True)
    else:
      dx = dx_op(dy, w, axis_name, sequence_dim)
    _, w_vjp = jax.vjp(lambda w: dw_reference(x, w, axis_name, sequence_dim), w)
    (dw,) = w_vjp(dy)
    return dx.astype(x.dtype), dw

  call.defvjp(fwd, bwd)
  return call


def _local_matmul(x, w, axis_name, sequence_dim):
  return jnp.matmul(x, w)


def _gathered_matmul(x, w, axis_name, sequence_dim):
  return jnp.matmul(lax.all_gather(x, axis_name, axis=sequence_dim, tiled=True), w)


def _with_sequence_dim(op, **fixed):
  """op(a, w, axis, sequence_dim=..., **fixed) as f(a, w, axis, sequence_dim, **more)."""
  return lambda a, w, axis_name, dim, **more: op(a, w, axis_name, sequence_dim=dim, **fixed,
                                                 **more)


# x replicated, kernel sharded on out: dx = psum(dy @ w.T) is matmul_all_reduce.
_column_matmul = overlapped_dx(
    _local_matmul, _local_matmul,
    lambda dy, w, axis_name, _: ops.matmul_all_reduce(dy, w, axis_name, transpose_w=True))


def column_matmul(x, w, axis_name, sequence_dim=0):
  """x @ w for x replicated over `axis_name` and w sharded on its out dim, its dx one
  matmul_all_reduce. That typing must be known: inside a check_vma=True shard_map, x
  invariant and w varying over the axis. Under check_vma=False JAX itself sums a replicated
  input's cotangent over the axis at the shard_map's boundary, so an all-reduced dx would be
  counted axis-size times: refused there, naming what to use instead."""
  varying_w, varying_x = _compat.varying_axes(w), _compat.varying_axes(x)
  axes = set(axis_name) if isinstance(axis_name, (tuple, list)) else {axis_name}
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)  # hashable: a custom_vjp's static argument
  if not axes <= varying_w or axes & varying_x:
    raise ValueError(
        f"jax_flashoverlap column_matmul: needs x invariant and w varying over "
        f"{axis_name!r} (a check_vma=True shard_map); x varies over {sorted(varying_x)}, w over "
        f"{sorted(varying_w)}. Elsewhere (check_vma=False: JAX sums a replicated input's "
        f"gradient at the boundary itself) use x @ w")
  return _column_matmul(x, w, axis_name, sequence_dim)
# Sequence parallelism: the forward is all_gather_matmul, and its backward's dx =
# psum_scatter(dy @ w.T) over the sequence is matmul_reduce_scatter, overlapped like the
# forward (Megatron's sequence-parallel layer in both directions); dw = all_gather(x).T @ dy.
sequence_parallel_matmul = overlapped_dx(
    _with_sequence_dim(ops.all_gather_matmul), _gathered_matmul,
    _with_sequence_dim(ops.matmul_reduce_scatter, transpose_w=True))
# The row layer's reduce-scatter (x [S, ..., in/n] -> [S/n, ..., out]): its backward's dx =
# all_gather(dy) @ w.T is all_gather_matmul, which also returns all_gather(dy) for
# dw = x.T @ all_gather(dy), XLA's local dot: dy is gathered once, as in XLA's backward.
row_scatter_matmul = overlapped_dx(
    _with_sequence_dim(ops.matmul_reduce_scatter), _local_matmul,
    _with_sequence_dim(ops.all_gather_matmul, transpose_w=True), gathers_dy=True,
    reference=lambda x, w, axis_name, dim: lax.psum_scatter(
        jnp.matmul(x, w), axis_name, scatter_dimension=dim, tiled=True))
