"""Public per-device ops, for use inside `jax.shard_map`.

    y = matmul_all_reduce(x, w, "tp")       # == lax.psum(x @ w, "tp")
    y = matmul_reduce_scatter(x, w, "tp")   # == lax.psum_scatter(x @ w, "tp", scatter_dimension=0, tiled=True)
    y = matmul(x, w)                        # == x @ w, through the signaling GEMM on GPU

Inputs are validated at trace time. Gradients are those of the reference composition: the
backward of a row-parallel GEMM + all-reduce is two local GEMMs (the transposed psum moves no
data); the backward of GEMM + reduce-scatter all-gathers the cotangent, then two GEMMs.
"""

from __future__ import annotations

import functools

import jax

from jax_flashoverlap import _validation, primitives as prims


def matmul(x, w, *, comm_sms: int | None = None):
  """x [..., K] @ w [K, N] -> [..., N] through the signaling GEMM (plain `x @ w` on CPU).

  `comm_sms` (default 0) leaves that many SMs free, as the overlapped ops do.
  """
  op = "jax_flashoverlap.matmul"
  _, k, n = _validation.check_operands(op, x, w)
  _validation.check_comm_sms(op, comm_sms)
  lead = x.shape[:-1]
  out = _gemm(x.reshape(-1, k), w, 0 if comm_sms is None else int(comm_sms))
  return out.reshape(*lead, n)


def matmul_all_reduce(x, w, axis_name, *, comm_sms: int | None = None):
  """psum(x @ w, axis_name) with the all-reduce overlapped tile-by-tile with the GEMM.

  x: [..., K_local] (leading dims are flattened into M), w: [K_local, N]; bfloat16 or
  float16, N and K multiples of 8. Returns [..., N], invariant over `axis_name`.
  `comm_sms`: SMs left to NCCL (default: the plan's, see jax_flashoverlap.plan).
  """
  op = "jax_flashoverlap.matmul_all_reduce"
  _, k, n = _validation.check_operands(op, x, w)
  _validation.check_axis_name(op, axis_name)
  _validation.check_comm_sms(op, comm_sms)
  lead = x.shape[:-1]
  out = _gemm_all_reduce(x.reshape(-1, k), w, _hashable(axis_name), comm_sms)
  return out.reshape(*lead, n)


def matmul_reduce_scatter(x, w, axis_name, *, comm_sms: int | None = None):
  """psum_scatter(x @ w, axis_name, scatter_dimension=0, tiled=True), overlapped.

  x: [M, K_local], w: [K_local, N]; M divisible by the axis size n. Rank r gets rows
  [r*M/n, (r+1)*M/n) of the summed product, contiguous: [M/n, N].
  """
  op = "jax_flashoverlap.matmul_reduce_scatter"
  m, _, _ = _validation.check_operands(op, x, w, x_rank="2")
  world = _validation.check_axis_name(op, axis_name)
  _validation.check_comm_sms(op, comm_sms)
  if m % world:
    raise ValueError(f"{op}: M (first dim of x, shape {tuple(x.shape)}) must be divisible by "
                     f"the size {world} of axis {axis_name!r}, got M={m}")
  return _gemm_reduce_scatter(x, w, _hashable(axis_name), comm_sms)


def _hashable(axis_name):
  return tuple(axis_name) if isinstance(axis_name, list) else axis_name


# --- differentiation: custom_vjp whose backward is the reference's own VJP ---------------


def _reference_vjp(reference, x, w, ct):
  _, vjp = jax.vjp(reference, x, w)
  return vjp(ct)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gemm(x, w, comm_sms):
  return prims.gemm_p.bind(x, w, comm_sms=comm_sms)


def _gemm_fwd(x, w, comm_sms):
  return _gemm(x, w, comm_sms), (x, w)


def _gemm_bwd(comm_sms, res, ct):
  return _reference_vjp(prims.reference_gemm, *res, ct)


_gemm.defvjp(_gemm_fwd, _gemm_bwd)


def _collective_with_vjp(prim, reference):
  @functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
  def call(x, w, axis_name, comm_sms):
    return prim.bind(x, w, axis_name=axis_name, comm_sms=comm_sms)

  def fwd(x, w, axis_name, comm_sms):
    return call(x, w, axis_name, comm_sms), (x, w)

  def bwd(axis_name, comm_sms, res, ct):
    return _reference_vjp(functools.partial(reference, axis_name=axis_name), *res, ct)

  call.defvjp(fwd, bwd)
  return call


_gemm_all_reduce = _collective_with_vjp(prims.gemm_all_reduce_p,
                                        prims.reference_gemm_all_reduce)
_gemm_reduce_scatter = _collective_with_vjp(prims.gemm_reduce_scatter_p,
                                            prims.reference_gemm_reduce_scatter)
