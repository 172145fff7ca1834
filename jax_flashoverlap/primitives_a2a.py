"""Per-device primitives of the all-to-all and all-gather ops (issue #9).

    flashoverlap_gemm_all_to_all   all_to_all(x @ w, axis_name, split_axis, concat_axis, tiled=True)
    flashoverlap_all_gather_gemm   all_gather(x, axis_name, axis=0, tiled=True) @ w
                                   (a list of results: [out], or with return_gathered=True
                                   [out, all_gather(x)])

x [M, K], w [K, N] (or [N, K] with transpose_w=True; ops.py flattens and validates). As in
primitives.py: output types come from tracing the reference composition (so shard_map's
varying-axes typing is XLA's own), the CPU lowering is that reference, and the CUDA lowering is
the FFI target of the same name, or the reference where the shape is not supported or the plan
(plan_a2a.py) predicts no gain.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_flashoverlap import _compat, comm, plan_a2a, primitives_batching
from jax_flashoverlap.primitives import (cuda_path, dot, emit_call, keep_reference,
                                         lowering_problem, make_primitive, on_each_platform,
                                         prepare_communicators, publish_decision, reference_of)

# --- reference compositions (also the CPU lowering) --------------------------------------


def reference_gemm_all_to_all(x, w, *, axis_name, split_axis=0, concat_axis=0,
                              transpose_w=False):
  return lax.all_to_all(dot(x, w, transpose_w), axis_name, split_axis, concat_axis, tiled=True)


def reference_all_gather_gemm(x, w, *, axis_name, transpose_w=False, return_gathered=False,
                              gather=lax.all_gather):
  """(out,) or, with return_gathered, (out, gathered): the rows the product read."""
  gathered = gather(x, axis_name, axis=0, tiled=True)
  out = dot(gathered, w, transpose_w)
  return (out, gathered) if return_gathered else (out,)


def _gathered_in_float32(x, axis_name, **kw):
  """lax.all_gather of a bfloat16 x through float32 (exact both ways): its transpose, the x
  gradient's reduce-scatter, then reduces in float32, as XLA's CPU compiler would itself but
  for a partly manual shard_map, where its own promotion aborts the process."""
  if x.dtype != jnp.bfloat16:
    return lax.all_gather(x, axis_name, **kw)
  return lax.all_gather(x.astype(jnp.float32), axis_name, **kw).astype(x.dtype)


# The derivative's reference (ops._all_gather_gemm): promoted on CPU in a partly manual
# shard_map (primitives.on_each_platform), XLA's own composition elsewhere.
reference_all_gather_any_platform = on_each_platform(
    reference_all_gather_gemm,
    functools.partial(reference_all_gather_gemm, gather=_gathered_in_float32))

gemm_all_to_all_p, _a2a_reference_lowering = make_primitive(
    "flashoverlap_gemm_all_to_all", reference_gemm_all_to_all,
    ("axis_name", "split_axis", "concat_axis", "transpose_w"))
all_gather_gemm_p, _ag_reference_lowering = make_primitive(
    "flashoverlap_all_gather_gemm", reference_all_gather_gemm,
    ("axis_name", "transpose_w", "return_gathered"), multiple_results=True)

# --- CUDA lowerings ------------------------------------------------------------------------


def _prepare_comm(prim, mesh, axis_name, plan_fields, comm_sms, workspace_bytes, ctx,
                  overlap, collective_gather=False):
  # ncclSend/ncclRecv: their peer connections are made at lowering too (ConnectPeers). The
  # collective gather: a collective communicator (registered window) with CTA policy ZERO.
  if collective_gather:
    return prepare_communicators(prim.name, mesh, axis_name, plan_fields, comm_sms,
                                 workspace_bytes, ctx, cta_policy="zero", overlap=overlap)
  return prepare_communicators(prim.name, mesh, axis_name, plan_fields, comm_sms,
                               workspace_bytes, ctx, peer_to_peer=True, overlap=overlap)


def _a2a_cuda_lowering(ctx, x, w, *, axis_name, split_axis, concat_axis, comm_sms,
                       transpose_w):
  prim = gemm_all_to_all_p
  reference = functools.partial(_a2a_reference_lowering, ctx, x, w, axis_name=axis_name,
                                split_axis=split_axis, concat_axis=concat_axis,
                                transpose_w=transpose_w)
  use_cuda, _ = cuda_path(prim.name, ctx)
  if not use_cuda:
    publish_decision(prim.name, ctx, {"overlap": False})
    return reference()
  mesh, world, x_aval, w_aval, dtype, (m, n, k) = lowering_problem(ctx, axis_name, transpose_w)
  if plan_a2a.a2a_supported(m, n, world, split_axis, k) is not None:
    publish_decision(prim.name, ctx, {"overlap": False})
    return reference()
  plan = plan_a2a.choose_a2a_plan(m, n, k, world, split_axis, concat_axis, dtype.itemsize,
                                  comm_sms, gpu=comm.mesh_gpu_name(mesh), dtype=dtype.name,
                                  transpose_w=bool(transpose_w))
  workspace = m * n * dtype.itemsize * (2 if concat_axis == 1 else 1)
  comm_id = _prepare_comm(prim, mesh, axis_name,
                          {"band_rows": list(plan.band_rows), "comm_sms": plan.comm_sms},
                          plan.comm_sms, workspace, ctx,
                          overlap=not keep_reference(plan, comm_sms, plan_a2a.is_forced()))
  if comm_id is None:
    return reference()
  return emit_call(prim, ctx, x, w, comm_id, world, plan.comm_sms, transpose_w,
                   split_axis=np.int32(split_axis), concat_axis=np.int32(concat_axis),
                   band_rows=np.asarray(plan.band_rows, dtype=np.int32))


def _ag_cuda_lowering(ctx, x, w, *, axis_name, comm_sms, transpose_w, return_gathered):
  prim = all_gather_gemm_p
  reference = functools.partial(_ag_reference_lowering, ctx, x, w, axis_name=axis_name,
                                transpose_w=transpose_w, return_gathered=return_gathered)
  use_cuda, _ = cuda_path(prim.name, ctx)
  if not use_cuda:
    publish_decision(prim.name, ctx, {"overlap": False})
    return reference()
  mesh, world, x_aval, w_aval, dtype, (rows, n, k) = lowering_problem(ctx, axis_name,
                                                                      transpose_w)
  # One rank has nothing to gather: XLA's composition, unless forced (tests run the whole
  # call, its flags and copies, through a 1-rank communicator).
  if plan_a2a.all_gather_supported(rows, n, world, one_rank=plan_a2a.is_forced(), k=k):
    publish_decision(prim.name, ctx, {"overlap": False})
    return reference()
  plan = plan_a2a.choose_all_gather_plan(rows, n, k, world, dtype.itemsize, comm_sms,
                                         gpu=comm.mesh_gpu_name(mesh), dtype=dtype.name,
                                         transpose_w=bool(transpose_w))
  # Peer-to-peer with the gathered rows returned: they are received straight into that
  # output, no workspace.
  collective = plan.gather == "collective"
  workspace = 0 if return_gathered and not collective else world * rows * k * dtype.itemsize
  comm_id = _prepare_comm(prim, mesh, axis_name,
                          {"chunks": plan.chunks, "comm_sms": plan.comm_sms,
                           "gather": plan.gather}, plan.comm_sms, workspace, ctx,
                          overlap=not keep_reference(plan, comm_sms, plan_a2a.is_forced()),
                          collective_gather=collective)
  if comm_id is None:
    return reference()
  return emit_call(prim, ctx, x, w, comm_id, world, plan.comm_sms, transpose_w,
                   chunks=np.int32(plan.chunks))


_compat.mlir.register_lowering(gemm_all_to_all_p, _a2a_cuda_lowering, platform="cuda")
_compat.mlir.register_lowering(all_gather_gemm_p, _ag_cuda_lowering, platform="cuda")

# --- batching (vmap): one call per batch element (primitives_batching) --------------------
primitives_batching.register_map(gemm_all_to_all_p, reference_of(gemm_all_to_all_p))
primitives_batching.register_map(all_gather_gemm_p, reference_of(all_gather_gemm_p))
