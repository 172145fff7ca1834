"""Public per-device ops, for use inside `jax.shard_map`.

    y = matmul_all_reduce(x, w, "tp")       # == lax.psum(x @ w, "tp")
    y = matmul_reduce_scatter(x, w, "tp")   # == lax.psum_scatter(x @ w, "tp", scatter_dimension=0, tiled=True)
    y = matmul_reduce_scatter(x, w, "tp", sequence_dim=1)  # x [B, S, K]: scatter_dimension=1
    y = matmul(x, w)                        # == x @ w, through the signaling GEMM on GPU
    y = matmul_all_to_all(x, w, "tp", split_axis=0)  # == lax.all_to_all(x @ w, "tp", 0, 0, tiled=True)
    y = all_gather_matmul(x, w, "tp")       # == lax.all_gather(x, "tp", tiled=True) @ w
    y, xg = all_gather_matmul(x, w, "tp", return_gathered=True)  # also xg == all_gather(x)
    y = all_gather_matmul(x, w, "tp", sequence_dim=1)  # x [B, S/n, K]: all_gather(axis=1)

Every op takes `transpose_w=True` for a weight stored [N, K] (a PyTorch-style [out, in]
weight, or a column-parallel kernel in its backward): the product is then x @ w.T, with w read
in place by the kernel (no transpose pass).

Inputs are validated at trace time. Gradients are those of the reference composition: the
backward of a row-parallel GEMM + all-reduce is two local GEMMs (the transposed psum moves no
data); the backward of GEMM + reduce-scatter all-gathers the cotangent, then two GEMMs.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_flashoverlap import _validation, primitives as prims, primitives_a2a as prims_a2a

# What the ops take (for type checkers): x and w are arrays, a numpy one too (checked at
# trace time: _validation.check_operands); axis_name one mesh axis or several.
Operand = jax.Array | np.ndarray
AxisName = str | Sequence[str]


def matmul(x: Operand, w: Operand, *, comm_sms: int | None = None,
           transpose_w: bool = False) -> jax.Array:
  """x [..., K] @ w [K, N] -> [..., N] through the signaling GEMM (plain `x @ w` on CPU).

  `comm_sms` (default 0) leaves that many SMs free, as the overlapped ops do.
  `transpose_w`: w is [N, K] and the product is x @ w.T, with no transpose pass.
  """
  op = "jax_flashoverlap.matmul"
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  _, k, n = _validation.check_operands(op, x, w, transpose_w=transpose_w)
  _validation.check_comm_sms(op, comm_sms)
  if _validation.has_no_rows(x):
    return prims.dot(x, w, transpose_w)
  lead = x.shape[:-1]
  out = _gemm(x.reshape(-1, k), w, _params(transpose_w=transpose_w),
              _params(comm_sms=0 if comm_sms is None else int(comm_sms)))
  return out.reshape(*lead, n)


def matmul_all_reduce(x: Operand, w: Operand, axis_name: AxisName, *,
                      comm_sms: int | None = None, transpose_w: bool = False) -> jax.Array:
  """psum(x @ w, axis_name) with the all-reduce overlapped tile-by-tile with the GEMM.

  x: [..., K_local] (leading dims are flattened into M), w: [K_local, N] ([N, K_local] with
  `transpose_w=True`: the product is then x @ w.T); bfloat16 or float16, N and K multiples
  of 8. Returns [..., N], invariant over `axis_name`.
  `comm_sms`: SMs left to NCCL (default: the plan's, see jax_flashoverlap.plan).
  """
  op = "jax_flashoverlap.matmul_all_reduce"
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  _, k, n = _validation.check_operands(op, x, w, transpose_w=transpose_w)
  _validation.check_axis_name(op, axis_name)
  _validation.check_comm_sms(op, comm_sms)
  if _validation.has_no_rows(x):
    return lax.psum(prims.dot(x, w, transpose_w), axis_name)
  lead = x.shape[:-1]
  out = _gemm_all_reduce(x.reshape(-1, k), w,
                         _params(axis_name=_hashable(axis_name), transpose_w=transpose_w),
                         _params(comm_sms=comm_sms))
  return out.reshape(*lead, n)


def matmul_reduce_scatter(x: Operand, w: Operand, axis_name: AxisName, *,
                          comm_sms: int | None = None, transpose_w: bool = False,
                          sequence_dim: int = 0) -> jax.Array:
  """psum_scatter(x @ w, axis_name, scatter_dimension=sequence_dim, tiled=True), overlapped.

  x: [M, K_local] (or [S, ..., K_local]: scattered along the first dim), w: [K_local, N]
  ([N, K_local] with `transpose_w=True`); M divisible by the axis size n. Rank r gets rows
  [r*M/n, (r+1)*M/n) of the summed product, contiguous: [M/n, N].
  `sequence_dim`: another leading dim of x to scatter, e.g. 1 for x [B, S, K_local] (rank r
  gets [B, S/n, N]): x's blocks are moved into rank order before the GEMM, a copy of x unless
  the dims before sequence_dim are 1.
  """
  op = "jax_flashoverlap.matmul_reduce_scatter"
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  _, _, n = _validation.check_operands(op, x, w, transpose_w=transpose_w)
  world = _validation.check_axis_name(op, axis_name)
  _validation.check_comm_sms(op, comm_sms)
  dim = _validation.check_sequence_dim(op, sequence_dim, len(x.shape))
  lead = x.shape[:-1]
  if lead[dim] % world:
    what, got = (("M (first dim of x", f"M={lead[0]}") if len(lead) == 1 else
                 (f"dim {dim} of x (the scattered dim, sequence_dim={sequence_dim}",
                  f"{lead[dim]}"))
    raise ValueError(f"{op}: {what}, shape {tuple(x.shape)}) must be divisible by the size "
                     f"{world} of axis {axis_name!r}, got {got}")
  if _validation.has_no_rows(x):  # (XLA's psum_scatter of no rows fails to lower: its
    # verifier wants a scattered dim > 0) the empty result, typed as the product: varying
    product = prims.dot(x, w, transpose_w)
    return lax.slice_in_dim(product, 0, product.shape[dim] // world, axis=dim)
  out = _gemm_reduce_scatter(_dim_blocks_to_rows(x, world, dim), w,
                             _params(axis_name=_hashable(axis_name), transpose_w=transpose_w),
                             _params(comm_sms=comm_sms))
  return out.reshape(*lead[:dim], lead[dim] // world, *lead[dim + 1:], n)


def _dim_blocks_to_rows(x, world, dim):
  """x [*lead, K] as rows [prod(lead), K] ordered by the rank whose block of `dim` they are
  in (the reduce-scatter hands rank r the r-th contiguous block of rows): a reshape for dim 0
  or when the dims before it are 1, a transpose pass otherwise."""
  lead, k = x.shape[:-1], x.shape[-1]
  if dim:
    blocks = x.reshape(*lead[:dim], world, lead[dim] // world, *lead[dim + 1:], k)
    x = jnp.moveaxis(blocks, dim, 0)
  return x.reshape(-1, k)


def _hashable(axis_name):
  return tuple(axis_name) if isinstance(axis_name, list) else axis_name


def _params(**params):
  """Static keyword arguments as a hashable tuple (a nondiff argument of the custom_jvp)."""
  return tuple(sorted(params.items()))


# --- differentiation: custom_jvp whose tangent is the reference's own ---------------------


def _with_reference_jvp(prim, reference):
  """prim.bind(x, w, **ref, **knobs) whose derivative is that of reference(x, w, **ref): `ref`
  are the reference's own parameters (axis_name, transpose_w, ...), `knobs` the tuning ones
  it does not take (comm_sms). A custom_jvp, so forward mode (jvp, jacfwd, linearize,
  Hessian-vector products) works too; reverse mode transposes the reference's linear
  tangent, which is its own VJP: e.g. the transposed psum moves no data, the transpose of an
  all-to-all is the inverse all-to-all, that of the all-gather a reduce-scatter of dx."""
  @functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
  def call(x, w, ref, knobs):
    out = prim.bind(x, w, **dict(ref), **dict(knobs))
    return tuple(out) if prim.multiple_results else out  # the reference's own structure

  def jvp(ref, knobs, primals, tangents):
    tangent = prims.bilinear_tangent(functools.partial(reference, **dict(ref)), primals,
                                     tangents)
    return call(*primals, ref, knobs), tangent

  call.defjvp(jvp, symbolic_zeros=True)  # an argument not differentiated: no term
  return call


_gemm = _with_reference_jvp(prims.gemm_p, prims.reference_gemm)
_gemm_all_reduce = _with_reference_jvp(prims.gemm_all_reduce_p,
                                       prims.reference_all_reduce_any_platform)
_gemm_reduce_scatter = _with_reference_jvp(prims.gemm_reduce_scatter_p,
                                           prims.reference_reduce_scatter_any_platform)
_gemm_all_to_all = _with_reference_jvp(prims_a2a.gemm_all_to_all_p,
                                       prims_a2a.reference_gemm_all_to_all)
_all_gather_gemm = _with_reference_jvp(prims_a2a.all_gather_gemm_p,
                                       prims_a2a.reference_all_gather_any_platform)


# --- all-to-all and all-gather (issue #9; primitives_a2a.py) ------------------------------


def _check_axis_arg(op, name, value):
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
    raise TypeError(f"{op}: {name} must be an int (0 or 1), got {value!r}")
  if int(value) not in (0, 1):
    raise ValueError(f"{op}: {name} must be 0 (rows) or 1 (columns) of the 2-D product "
                     f"x @ w, got {value}")
  return int(value)


def matmul_all_to_all(x: Operand, w: Operand, axis_name: AxisName, *, split_axis: int = 0,
                      concat_axis: int | None = None, comm_sms: int | None = None,
                      transpose_w: bool = False) -> jax.Array:
  """all_to_all(x @ w, axis_name, split_axis, concat_axis, tiled=True), overlapped.

  x: [M, K], w: [K, N] ([N, K] with `transpose_w=True`: the product is x @ w.T; bfloat16 or
  float16, N and K multiples of 8); concat_axis defaults to split_axis. The product's
  n = axis-size blocks along `split_axis` go to ranks 0..n-1; the blocks received from ranks
  0..n-1 are concatenated along `concat_axis`:
    split 0, concat 0: [M, N]      (M divisible by n; e.g. expert-parallel token exchange)
    split 1, concat 0: [n*M, N/n]  (N divisible by n; Ulysses: heads out, sequence in)
    split 0, concat 1: [M/n, n*N]
    split 1, concat 1: [M, N]
  With split_axis == concat_axis == 0, x may be [..., K] (rows are the flattened leading
  dims, split along the first one, which must then be divisible by n).
  """
  op = "jax_flashoverlap.matmul_all_to_all"
  split_axis = _check_axis_arg(op, "split_axis", split_axis)
  concat_axis = split_axis if concat_axis is None else _check_axis_arg(op, "concat_axis",
                                                                         concat_axis)
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  rowwise = split_axis == 0 and concat_axis == 0
  # Only (0, 0) takes x [..., K] (its rows the flattened leading dims); say why the others
  # do not, as the op takes [..., K] elsewhere (the message named no split / concat axis).
  _, k, n = _validation.check_operands(
      op, x, w, x_rank=">=2" if rowwise else "2", transpose_w=transpose_w,
      x_rank_why=(f" with split_axis={split_axis}, concat_axis={concat_axis} (only "
                  "split_axis=concat_axis=0 takes x [..., K])"))
  world = _validation.check_axis_name(op, axis_name)
  _validation.check_comm_sms(op, comm_sms)
  if split_axis == 0 and x.shape[0] % world:
    raise ValueError(f"{op}: split_axis=0 needs the first dim of x (shape {tuple(x.shape)}) to "
                     f"be divisible by the size {world} of axis {axis_name!r}")
  if split_axis == 1 and n % world:
    n_dim = "first" if transpose_w else "last"
    raise ValueError(f"{op}: split_axis=1 needs N ({n_dim} dim of w, shape {tuple(w.shape)}) "
                     f"to be divisible by the size {world} of axis {axis_name!r}")
  if _validation.has_no_rows(x):
    return lax.all_to_all(prims.dot(x, w, transpose_w), axis_name, split_axis, concat_axis,
                          tiled=True)
  lead = x.shape[:-1]
  out = _gemm_all_to_all(x.reshape(-1, k), w,
                         _params(axis_name=_hashable(axis_name), split_axis=split_axis,
                                 concat_axis=concat_axis, transpose_w=transpose_w),
                         _params(comm_sms=comm_sms))
  return out.reshape(*lead, n) if len(lead) > 1 else out


# return_gathered picks the result's type: out, or (out, gathered)
@typing.overload
def all_gather_matmul(x: Operand, w: Operand, axis_name: AxisName, *,
                      comm_sms: int | None = ..., transpose_w: bool = ...,
                      return_gathered: typing.Literal[False] = ...,
                      sequence_dim: int = ...) -> jax.Array: ...
@typing.overload
def all_gather_matmul(x: Operand, w: Operand, axis_name: AxisName, *,
                      comm_sms: int | None = ..., transpose_w: bool = ...,
                      return_gathered: typing.Literal[True],
                      sequence_dim: int = ...) -> tuple[jax.Array, jax.Array]: ...
@typing.overload
def all_gather_matmul(x: Operand, w: Operand, axis_name: AxisName, *,
                      comm_sms: int | None = ..., transpose_w: bool = ...,
                      return_gathered: bool, sequence_dim: int = ...
                      ) -> jax.Array | tuple[jax.Array, jax.Array]: ...


def all_gather_matmul(x: Operand, w: Operand, axis_name: AxisName, *,
                      comm_sms: int | None = None, transpose_w: bool = False,
                      return_gathered: bool = False, sequence_dim: int = 0
                      ) -> jax.Array | tuple[jax.Array, jax.Array]:
  """all_gather(x, axis_name, axis=sequence_dim, tiled=True) @ w, overlapped
  (sequence-parallel column-parallel layer): the GEMM starts on the local rows at once and
  takes each other rank's rows as they arrive.

  x: [M_local, K] (or [S_local, ..., K]: gathered along the first dim), w: [K, N] ([N, K]
  with `transpose_w=True`: the product is then all_gather(x) @ w.T); returns [n*M_local, N].
  `sequence_dim`: another leading dim of x to gather, e.g. 1 for x [B, S_local, K]: the ranks'
  blocks are gathered whole (along the first dim) and the output's blocks moved into place
  after the GEMM, a copy of the output unless the dims before sequence_dim are 1 locally.
  `comm_sms` (>= 1; default: the plan's) SMs are left to NCCL, which must run while the
  GEMM waits for its rows.
  `return_gathered=True` returns `(out, gathered)`, gathered = all_gather(x, axis=sequence_dim)
  ([n*M_local, ..., K] for sequence_dim=0), the rows the GEMM read, for a caller that needs
  them too (the backward of a sequence-parallel row layer: dx = all_gather(dy) @ w.T and
  dw = x.T @ all_gather(dy)); on GPUs the rows are received straight into that output, no
  second gather and no copy.
  """
  op = "jax_flashoverlap.all_gather_matmul"
  transpose_w = _validation.check_transpose_w(op, transpose_w)
  return_gathered = _validation.check_flag(op, "return_gathered", return_gathered)
  _, k, n = _validation.check_operands(op, x, w, transpose_w=transpose_w)
  world = _validation.check_axis_name(op, axis_name)
  _validation.check_comm_sms(op, comm_sms)
  if comm_sms is not None and int(comm_sms) < 1:
    raise ValueError(f"{op}: comm_sms must be >= 1 (NCCL needs SMs while the GEMM waits for "
                     f"the gathered rows), got {comm_sms}")
  sequence_dim = _validation.check_sequence_dim(op, sequence_dim, len(x.shape))
  lead = x.shape[:-1]
  if _validation.has_no_rows(x):  # (XLA's all_gather of no rows fails to lower) the empty
    # gathered rows, typed as x (varying, as all_gather's), and their product
    gathered = _gathered_blocks_to_dim(x.reshape(-1, k), world, lead, sequence_dim)
    out = prims.dot(gathered, w, transpose_w)
    return (out, gathered) if return_gathered else out
  outs = _all_gather_gemm(x.reshape(-1, k), w,
                          _params(axis_name=_hashable(axis_name), transpose_w=transpose_w,
                                  return_gathered=return_gathered),
                          _params(comm_sms=comm_sms))
  out = _gathered_blocks_to_dim(outs[0], world, lead, sequence_dim)
  if return_gathered:
    return out, _gathered_blocks_to_dim(outs[1], world, lead, sequence_dim)
  return out


def _gathered_blocks_to_dim(rows, world, lead, dim):
  """rows [world * prod(lead), C]: the ranks' blocks x_r [*lead, C] one after the other, as
  [*lead with lead[dim] * world, C], i.e. concatenated along `dim` (a reshape for dim 0 or
  when the dims before it are 1; a transpose pass otherwise)."""
  blocks = rows.reshape(world, *lead, rows.shape[-1])
  if dim:
    blocks = jnp.moveaxis(blocks, 0, dim)
  return blocks.reshape(*lead[:dim], world * lead[dim], *lead[dim + 1:], rows.shape[-1])
