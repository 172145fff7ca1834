"""vmap rules of the per-device primitives; primitives.py and primitives_a2a.py register them.

The GEMM, all-reduce and reduce-scatter fold a one-sided batch into the GEMM (fold rules):
x batched, w not: the batch goes into M (for reduce-scatter rank-major, so each rank still
gets its own rows of every batch element). w batched, x not: into N (w [B, K, N] -> [K, B*N];
transposed, w [B, N, K] -> [B*N, K] is a free reshape). Both batched, and every batch of the
all-to-all and the all-gather (their rows are laid out per rank): one call per batch element
(lax.map, map rules). A batch of size 0 is XLA's composition, vmapped.

`reference` below is the pair primitives.make_primitive keeps per primitive: the reference
composition and the filter of the params it takes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_flashoverlap import _compat


def fold_x_rows(x, world):
  """x [B, M, K] -> [B*M, K] ordered [world, B, M/world] so a tiled scatter stays per batch."""
  b, m, k = x.shape
  if world == 1:
    return x.reshape(b * m, k)
  return x.reshape(b, world, m // world, k).transpose(1, 0, 2, 3).reshape(b * m, k)


def empty_batch(prim, reference, args, dims, params):
  """The batching rule's answer for a batch of size 0, else None. Nothing to compute or
  overlap (and folding would divide by 0): XLA's composition, vmapped, returns the empty
  result with the primitive's own output type."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _compat.not_mapped)
  if size:
    return None
  composition, reference_params = reference
  in_axes = tuple(None if d is _compat.not_mapped else d for d in dims)
  out = jax.vmap(lambda x, w: composition(x, w, **reference_params(params)), in_axes)(*args)
  return (list(out), [0] * len(out)) if prim.multiple_results else (out, 0)


def _map_each(prim, x, w, bx, bw, params):
  """One call per batch element (either operand or both batched)."""
  not_mapped = _compat.not_mapped
  if bw is not_mapped:
    return lax.map(lambda a: prim.bind(a, w, **params), jnp.moveaxis(x, bx, 0))
  if bx is not_mapped:
    return lax.map(lambda b: prim.bind(x, b, **params), jnp.moveaxis(w, bw, 0))
  pairs = (jnp.moveaxis(x, bx, 0), jnp.moveaxis(w, bw, 0))
  return lax.map(lambda ab: prim.bind(ab[0], ab[1], **params), pairs)


def register_fold(prim, reference, world_of):
  """prim's vmap rule: a one-sided batch folded into M or N; world_of(params) is the number of
  ranks the result's rows are scattered over (1 where nothing is scattered)."""
  def rule(args, dims, **params):
    empty = empty_batch(prim, reference, args, dims, params)
    if empty is not None:
      return empty
    x, w = args
    bx, bw = dims
    not_mapped = _compat.not_mapped
    if bx is not not_mapped and bw is not_mapped:
      x = jnp.moveaxis(x, bx, 0)
      b = x.shape[0]
      out = prim.bind(fold_x_rows(x, world_of(params)), w, **params)
      return out.reshape(b, out.shape[0] // b, out.shape[1]), 0
    if bx is not_mapped and bw is not not_mapped:
      w = jnp.moveaxis(w, bw, 0)
      if params["transpose_w"]:
        b, n, k = w.shape
        folded = w.reshape(b * n, k)
      else:
        b, k, n = w.shape
        folded = w.transpose(1, 0, 2).reshape(k, b * n)
      out = prim.bind(x, folded, **params)
      return out.reshape(out.shape[0], b, n).transpose(1, 0, 2), 0
    return _map_each(prim, x, w, bx, bw, params), 0
  _compat.batching.primitive_batchers[prim] = rule


def register_map(prim, reference):
  """prim's vmap rule: one call per batch element, whichever operand is batched."""
  def rule(args, dims, **params):
    empty = empty_batch(prim, reference, args, dims, params)
    if empty is not None:
      return empty
    out = _map_each(prim, *args, *dims, params)
    return out, ([0] * len(out) if prim.multiple_results else 0)
  _compat.batching.primitive_batchers[prim] = rule
