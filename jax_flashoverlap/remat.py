"""Rematerialization policies that see the ops as the GEMMs they are.

`jax.checkpoint`'s policies decide per primitive what the backward may keep; the dot-based
ones (`dots_saveable`, `dots_with_no_batch_dims_saveable`, `offload_dot_with_no_batch_dims`)
keep `dot_general`'s results and nothing else, so our ops' results (a GEMM and its
collective, one primitive) were recomputed in the backward: one more GEMM and collective per
op than XLA's `psum(x @ w)` under the same policy, which keeps its dot (and recomputes only
the psum). `ops_as_dots(policy)` asks `policy` about each of our ops as the `dot_general` it
computes, and about everything else as before.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jax import lax

from jax_flashoverlap import _compat, primitives


@dataclasses.dataclass(frozen=True)
class OpsAsDots:
  """A `jax.checkpoint` policy: `policy`, with each of our primitives asked as its GEMM.

  Frozen (hashable, equal for equal `policy`), so jit's caches hit as with JAX's own."""
  policy: Callable

  def __call__(self, prim, *args, **params):
    ours = _our_equation(prim, args, params)
    if ours is None:
      return self.policy(prim, *args, **params)
    (x, w), transpose_w = ours
    contract_w = w.ndim - 1 if transpose_w else 0
    return self.policy(lax.dot_general_p, x, w,
                       dimension_numbers=(((x.ndim - 1,), (contract_w,)), ((), ())),
                       precision=None, preferred_element_type=x.dtype, out_sharding=None)


def _our_equation(prim, avals, params):
  """((x aval, w aval), transpose_w) where `prim` is one of our primitives, or the custom_jvp
  call wrapping one (ops.py: differentiated code meets the op as that call, whose body
  binds the primitive); else None."""
  if primitives.is_ours(prim):
    return tuple(avals[:2]), bool(params.get("transpose_w", False))
  body = _compat.custom_jvp_body(prim, params)
  for eqn in () if body is None else body.eqns:
    if primitives.is_ours(eqn.primitive):
      return (tuple(v.aval for v in eqn.invars[:2]),
              bool(eqn.params.get("transpose_w", False)))
  return None


def ops_as_dots(policy: Callable) -> OpsAsDots:
  """`policy` (a `jax.checkpoint` / `jax.remat` / `nnx.remat` / `nn.remat` policy, e.g.
  `jax.checkpoint_policies.dots_saveable`) with every per-device op (`matmul`,
  `matmul_all_reduce`, `matmul_reduce_scatter`, `matmul_all_to_all`, `all_gather_matmul`)
  asked as the dot_general x @ w (x @ w.T with transpose_w) it computes: where `policy`
  saves (or offloads) that dot, the op's result is kept for the backward instead of
  recomputed with its collective. Policies that never save dots are unchanged.

      f = jax.checkpoint(block, policy=fo.ops_as_dots(jax.checkpoint_policies.dots_saveable))
  """
  if not callable(policy):
    raise TypeError(f"jax_flashoverlap.ops_as_dots: policy must be a jax.checkpoint policy "
                    f"(a callable, e.g. jax.checkpoint_policies.dots_saveable), got "
                    f"{type(policy).__name__}")
  if isinstance(policy, OpsAsDots):
    return policy
  return OpsAsDots(policy)
