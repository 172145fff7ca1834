"""Per-device primitives: abstract evaluation, lowerings (CUDA custom call / reference), vmap.

Each primitive takes 2-D operands x [M, K], w [K, N] (ops.py flattens and validates), or
w [N, K] with the param transpose_w=True (the product is then x @ w.T):

    flashoverlap_gemm                 x @ w
    flashoverlap_gemm_all_reduce      psum(x @ w, axis_name)
    flashoverlap_gemm_reduce_scatter  psum_scatter(x @ w, axis_name, scatter_dimension=0, tiled=True)

Output types come from tracing that reference composition, so shard_map's varying-axes typing
(check_vma=True) is exactly XLA's own. On CPU (and wherever the CUDA path is unavailable) the
primitive lowers to the reference; on CUDA to the FFI target of the same name.
"""

from __future__ import annotations

import functools
import os
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_flashoverlap import _compat, _environment, _ext, comm, plan as plan_lib, plan_peer
from jax_flashoverlap import primitives_batching, tile_schedule

# --- reference compositions (also the CPU lowering) --------------------------------------


def dot(x, w, transpose_w=False):
  return jnp.matmul(x, w.T if transpose_w else w)


def bilinear_tangent(fn, primals, tangents):
  """The tangent of fn(x, w), linear in each argument, at primals: for a custom_jvp with
  symbolic_zeros=True. A tangent that is a symbolic zero (the argument not differentiated)
  gets no term: x @ 0 would be a wasted GEMM, and its sum with the other term, before the
  collective, rounds that term's product where XLA's own derivative (and the op itself) does
  not. With both tangents, fn's own derivative, as XLA's."""
  (x, w), (tx, tw) = primals, tangents
  x_zero, w_zero = (isinstance(t, jax.custom_derivatives.SymbolicZero) for t in tangents)
  if x_zero and not w_zero:
    return jax.jvp(lambda b: fn(x, b), (w,), (tw,))[1]
  if w_zero and not x_zero:
    return jax.jvp(lambda a: fn(a, w), (x,), (tx,))[1]
  if x_zero:  # (JAX calls the rule with at least one tangent; kept total)
    tx, tw = (jnp.zeros(t.shape, t.dtype) for t in tangents)
  return jax.jvp(fn, primals, (tx, tw))[1]


def reference_gemm(x, w, *, transpose_w=False):
  return dot(x, w, transpose_w)


def reference_gemm_all_reduce(x, w, *, axis_name, transpose_w=False, product=dot):
  return lax.psum(product(x, w, transpose_w), axis_name)


def reference_gemm_reduce_scatter(x, w, *, axis_name, transpose_w=False, product=dot):
  return lax.psum_scatter(product(x, w, transpose_w), axis_name, scatter_dimension=0,
                          tiled=True)


def _float32_product(x, w, transpose_w=False):
  return dot(x, w, transpose_w).astype(jnp.float32)


def reduced_in_float32(reference):
  """`reference` with a bfloat16 product reduced in float32 and rounded back once: the CPU
  lowering. XLA's CPU compiler does exactly this to a bfloat16 all-reduce / reduce-scatter
  itself (same bits: tests/test_cpu_reference.py), but inside a partly manual shard_map its
  own promotion aborts the process (JAX 0.10: "Invalid binary instruction opcode copy");
  promoting first avoids it. Not on GPUs: NCCL reduces bfloat16 as it is."""
  def on_cpu(x, w, **params):
    if jnp.result_type(x, w) != jnp.bfloat16:
      return reference(x, w, **params)
    return reference(x, w, product=_float32_product, **params).astype(jnp.bfloat16)
  return on_cpu


def on_each_platform(reference, cpu_reference):
  """reference(x, w, **params), computed as cpu_reference in a program lowered for CPU (the
  branch is chosen at lowering): the ops' derivatives, whose tangent is the reference's own
  collective, need the CPU lowering's promotion too (reduced_in_float32), but only inside a
  partly manual shard_map, where XLA's own promotion aborts. Elsewhere the reference as it
  is: the choice is a cond, whose transpose JAX mistypes under `vmap(shard_map(...),
  spmd_axis_name=...)` ("Expected cotangent type bfloat16[...] but got bfloat16[...]{V:dp}")."""
  def run(x, w, **params):
    if not partly_manual():
      return reference(x, w, **params)
    return lax.platform_dependent(x, w, cpu=functools.partial(cpu_reference, **params),
                                  default=functools.partial(reference, **params))
  return run


def partly_manual() -> bool:
  """Inside a shard_map that leaves some mesh axis automatic (True where JAX does not say)."""
  manual, axes = _compat.manual_axis_names(), _compat.mesh_axis_names()
  if manual is None or axes is None:
    return manual is None
  return bool(manual) and not set(axes) <= set(manual)


reference_all_reduce_any_platform = on_each_platform(
    reference_gemm_all_reduce, reduced_in_float32(reference_gemm_all_reduce))
reference_reduce_scatter_any_platform = on_each_platform(
    reference_gemm_reduce_scatter, reduced_in_float32(reference_gemm_reduce_scatter))


def switch_readers() -> dict:
  """{name: reader} of every environment switch the CUDA lowerings read, whichever op uses it;
  each reader returns the parsed value or raises a ValueError naming the variable."""
  from jax_flashoverlap import trace, tuning
  return {
      "force_reference": _ext.force_reference,
      "fallback": _ext.fallback_enabled,
      "transport": _ext.transport,
      "all_reduce_in_place": _ext.all_reduce_in_place,
      "grant_peer_access": _ext.grant_peer_access,
      "poison_outputs": _ext.poison_outputs,
      "gemm_switches": lambda: _ext.check_gemm_epilogue() or "valid",
      "watchdog_seconds": comm.watchdog_seconds,
      "tuned_configs_on": lambda: _ext.env_switch(tuning.TUNED_ENV, True),
      "trace_on_first_communicator": lambda: _ext.env_switch(trace.TRACE_ENV, False),
  }


def check_switches() -> None:
  """Reads every switch (switch_readers). The CPU lowering runs it too, so a misspelt switch
  shows on the machine where a program is written, not first on the GPU machine.
  Tuned-config files are not switches: only their folder's variable is checked, and only
  while tuned plans are on (JAX_FLASHOVERLAP_TUNED=0 reads no config)."""
  from jax_flashoverlap import tuning
  _environment.warn_unknown_variables()  # a misspelt name: its switch silently at its default
  readers = switch_readers()
  for read in readers.values():
    read()
  if os.environ.get(tuning.CONFIG_DIR_ENV) and readers["tuned_configs_on"]():
    tuning.config_files()  # a folder that is not one is an error (its plans would be lost)


class ExportedWithoutOverlapWarning(UserWarning):
  """`jax.export` of a program with our ops: the exported program runs XLA's composition."""


class AbstractMeshWithoutOverlapWarning(UserWarning):
  """A shard_map over an AbstractMesh run on this process's GPUs: XLA's composition."""


_warned_fallbacks: set = set()  # the warning classes of _without_overlap said so far


def _without_overlap(category, message: str, reason: str) -> tuple[bool, str]:
  """cuda_path's answer where the whole program takes XLA's composition: warned once per
  process and cause (`category`)."""
  if category not in _warned_fallbacks:
    _warned_fallbacks.add(category)
    warnings.warn(message, category, stacklevel=3)
  return False, reason


def _abstract_mesh_on_local_gpus(target: str, ctx) -> bool:
  """A collective lowered inside a shard_map whose mesh is an AbstractMesh (no devices: e.g.
  `mesh=mesh.abstract_mesh` with no `jax.set_mesh`) on a machine with GPUs, where it runs:
  the communicators are the devices' (rank = position along the axis), which the lowering
  cannot know, so every call failed with "no communicator". Without a local GPU the program
  is cross-lowered for another machine, as tests/test_lowering.py does."""
  if target == "flashoverlap_gemm":  # no collective, no communicator
    return False
  mesh = _compat.lowering_mesh(ctx)
  return mesh is not None and _compat.mesh_devices(mesh) is None and bool(_ext.local_gpus())


def cuda_path(target: str, ctx) -> tuple[bool, str]:
  """Every CUDA lowering's first step: all switches read (a typo is an error whichever path
  this op then takes: the fallback to XLA's composition read none of the ones it skips, so
  a misspelt transport passed where the CPU lowering refused it), then whether to emit the
  custom call: never for `jax.export` (below), else _ext.check_cuda_path.

  An exported program is XLA's composition. Our custom call names communicators that the
  lowering made in this process (by comm_id), which a process deserializing the program
  never made, and JAX refuses to serialize a custom call without its compatibility
  guarantee ("Cannot serialize code with custom calls ..."); so the export keeps the values
  (XLA's dot + collective) and loses the overlap, warned once per process."""
  check_switches()
  if _compat.lowering_for_export(ctx):
    return _without_overlap(
        ExportedWithoutOverlapWarning,
        "jax_flashoverlap: jax.export lowers the ops to XLA's composition (dot + "
        "collective, the same values, no overlap): the custom call needs communicators "
        "made by this process's lowering, and has no serialization guarantee. Run the "
        "model under jax.jit for the overlapped kernels.",
        f"jax.export: XLA's composition instead of {target}")
  use, why = _ext.check_cuda_path(target)
  if use and _abstract_mesh_on_local_gpus(target, ctx):
    return _without_overlap(
        AbstractMeshWithoutOverlapWarning,
        "jax_flashoverlap: a shard_map over an AbstractMesh runs the collective ops as "
        "XLA's composition (the same values, no overlap): their NCCL communicators are made "
        "from the mesh's devices, which an AbstractMesh does not name. Give shard_map the "
        "concrete jax.sharding.Mesh (or call it under jax.set_mesh(mesh)).",
        f"shard_map over an AbstractMesh: XLA's composition instead of {target}")
  return use, why


# --- primitive construction --------------------------------------------------------------


# primitive -> (its reference composition, the filter of the params that reference takes)
_REFERENCES = {}


def is_ours(prim) -> bool:
  """True for every primitive make_primitive made (remat.ops_as_dots asks)."""
  return prim in _REFERENCES


def reference_of(prim):
  """(reference composition, its params filter) of a primitive make_primitive made."""
  return _REFERENCES[prim]


def make_primitive(name, reference, reference_keys=("axis_name", "transpose_w"),
                   multiple_results=False, cpu_reference=None):
  """A primitive whose output type comes from tracing `reference(x, w, **params)` and whose
  default lowering is that reference; params outside `reference_keys` are tuning knobs the
  reference does not take. multiple_results: the reference returns a tuple of arrays.
  cpu_reference: the CPU lowering's composition, where it must differ (same values).
  Returns (primitive, reference lowering)."""
  def reference_params(params):
    return {k: v for k, v in params.items() if k in reference_keys}

  prim = _compat.Primitive(name)
  prim.multiple_results = multiple_results
  _REFERENCES[prim] = (reference, reference_params)
  prim.def_impl(functools.partial(_compat.apply_primitive, prim))

  def abstract_eval(x, w, **params):
    params = reference_params(params)
    if multiple_results:
      return list(_compat.abstract_eval_fun(lambda a, b: tuple(reference(a, b, **params)), x, w))
    (out,) = _compat.abstract_eval_fun(lambda a, b: (reference(a, b, **params),), x, w)
    return out

  prim.def_abstract_eval(abstract_eval)
  lowered_reference = _compat.lower_fun_per_device(
      lambda x, w, **params: reference(x, w, **reference_params(params)),
      multiple_results=multiple_results)
  _compat.mlir.register_lowering(prim, lowered_reference)
  lowered_on_cpu = lowered_reference if cpu_reference is None else _compat.lower_fun_per_device(
      lambda x, w, **params: cpu_reference(x, w, **reference_params(params)),
      multiple_results=multiple_results)

  def cpu_lowering(ctx, *args, **params):
    check_switches()  # a misspelt switch is an error here too, not first on a GPU
    return lowered_on_cpu(ctx, *args, **params)

  _compat.mlir.register_lowering(prim, cpu_lowering, platform="cpu")
  _compat.define_transpose(prim, functools.partial(transpose_by_reference, prim))
  return prim, lowered_reference


def transpose_by_reference(prim, cotangents, x, w, **params):
  """prim's transpose rule. Each op is linear in x for a fixed w and in w for a fixed x (a
  GEMM, then a linear collective), with its reference composition's values: so its transpose
  is the reference's, which jax.linear_transpose derives. JAX transposes (rather than
  differentiates) in jax.linear_transpose and custom_linear_solve (the gradients through
  jax.scipy.sparse.linalg's solvers); jax.grad goes through the ops' custom_jvp (ops.py)."""
  reference, reference_params = _REFERENCES[prim]
  ref = reference_params(params)
  x_unknown, w_unknown = _compat.is_undefined_primal(x), _compat.is_undefined_primal(w)
  if x_unknown and w_unknown:
    raise NotImplementedError(
        f"jax_flashoverlap: {prim.name} is linear in x and in w separately, not in both at "
        "once (x @ w is bilinear): transpose it in one of them, the other fixed")
  if prim.multiple_results:
    cotangents = tuple(_compat.instantiate_zeros(ct) for ct in cotangents)
  else:
    cotangents = _compat.instantiate_zeros(cotangents)
  if x_unknown:
    fn, unknown = (lambda a: reference(a, w, **ref)), x
  else:
    fn, unknown = (lambda b: reference(x, b, **ref)), w
  (ct,) = jax.linear_transpose(fn, _compat.aval_struct(unknown.aval))(cotangents)
  return (ct, None) if x_unknown else (None, ct)


gemm_p, _gemm_reference_lowering = make_primitive("flashoverlap_gemm", reference_gemm)
gemm_all_reduce_p, _ar_reference_lowering = make_primitive(
    "flashoverlap_gemm_all_reduce", reference_gemm_all_reduce,
    cpu_reference=reduced_in_float32(reference_gemm_all_reduce))
gemm_reduce_scatter_p, _rs_reference_lowering = make_primitive(
    "flashoverlap_gemm_reduce_scatter", reference_gemm_reduce_scatter,
    cpu_reference=reduced_in_float32(reference_gemm_reduce_scatter))

# --- CUDA lowerings ------------------------------------------------------------------------

# Groups the plain GEMM signals into: enough to exercise (and time) the signaling path.
GEMM_SIGNAL_GROUPS = 4


def too_large(name, m, n, k, fallback_allowed: bool) -> bool:
  """True when a dimension reaches the kernel's limit (plan.KERNEL_MAX_DIM; its launcher
  would refuse the call at run time) and XLA's composition may take the op; a ValueError
  naming the dimension when it may not (an explicit comm_sms, a forced plan,
  JAX_FLASHOVERLAP_FALLBACK=0: our kernels were asked for)."""
  for dim, value, what in (("M", m, "rows of x"), ("N", n, "columns of the output"),
                           ("K", k, "the per-device contraction")):
    if value >= plan_lib.KERNEL_MAX_DIM:
      if fallback_allowed:
        return True
      raise ValueError(
          f"jax_flashoverlap: {name}: {dim}={value} ({what}) must be < 2^30 = "
          f"{plan_lib.KERNEL_MAX_DIM} for the signaling GEMM (its launcher's limit); with "
          f"the default settings XLA's composition takes such a shape (here comm_sms, a "
          f"forced plan or {_ext.FALLBACK_ENV}=0 asked for our kernels)")
  return False


class SMCountWarning(UserWarning):
  """The local GPU has other than the 132 SMs the group plans are modelled on."""


_warned_sm_count = set()


def check_sm_count(name, comm_sms, sms=None):
  """The GEMM leaves comm_sms SMs free and keeps at least one 2-SM cluster: on a GPU with
  other than the 132 SMs of an H100 / H200 SXM (an H100 PCIe has 114), a comm_sms its
  launcher would refuse at run time is an error here, naming the GPU's count; and the plans'
  wave arithmetic (tile_schedule.NUM_SMS) is off there: warned once per count (tuning
  measures the real GPU). `sms`: the local GPUs' fewest (default: _ext.local_gpu_sms();
  None: unknown)."""
  sms = _ext.local_gpu_sms() if sms is None else sms
  if sms is None or sms == tile_schedule.NUM_SMS:
    return
  if comm_sms > sms - 2:
    raise ValueError(f"jax_flashoverlap: {name}: comm_sms={comm_sms} leaves fewer than 2 of "
                     f"this GPU's {sms} SMs to the GEMM (at most {sms - 2})")
  if sms not in _warned_sm_count:
    _warned_sm_count.add(sms)
    warnings.warn(
        f"jax_flashoverlap: this GPU has {sms} SMs; the default group plans are modelled on "
        f"{tile_schedule.NUM_SMS} (H100 / H200 SXM), so they may be far from the best here: "
        "`python -m jax_flashoverlap.tune` measures this GPU's and writes a tuned config "
        "(README, \"Group plans\")",
        SMCountWarning, stacklevel=2)


def _gemm_cuda_lowering(ctx, x, w, *, comm_sms, transpose_w):
  use_cuda, _ = cuda_path(gemm_p.name, ctx)
  if use_cuda:
    (m, k), n = ctx.avals_in[0].shape, ctx.avals_in[1].shape[0 if transpose_w else 1]
    use_cuda = not too_large(gemm_p.name, m, n, k, _ext.fallback_enabled())
  if not use_cuda:
    return _gemm_reference_lowering(ctx, x, w, transpose_w=transpose_w)
  check_sm_count(gemm_p.name, comm_sms)
  return _compat.ffi_lowering(gemm_p.name)(
      ctx, x, w, comm_sms=np.int32(comm_sms), num_groups=np.int32(GEMM_SIGNAL_GROUPS),
      transpose_w=np.int32(transpose_w), poison_outputs=np.int32(_ext.poison_outputs()))


def _collective_cuda_lowering(prim, reference_lowering, collective):
  def lowering(ctx, x, w, *, axis_name, comm_sms, transpose_w):
    use_cuda, _ = cuda_path(prim.name, ctx)
    if not use_cuda:
      publish_decision(prim.name, ctx, {"overlap": False})
      return reference_lowering(ctx, x, w, axis_name=axis_name, transpose_w=transpose_w)
    mesh, world, x_aval, w_aval, dtype, (m, n, k) = lowering_problem(ctx, axis_name,
                                                                     transpose_w)
    # forced(overlap=False) asks for XLA's composition (keep_reference), not our kernels
    if too_large(prim.name, m, n, k, plan_lib.is_forced_off() or (
        comm_sms is None and not plan_lib.is_forced() and _ext.fallback_enabled())):
      publish_decision(prim.name, ctx, {"overlap": False})
      return reference_lowering(ctx, x, w, axis_name=axis_name, transpose_w=transpose_w)
    transport = _ext.transport()
    if transport != "nccl" and not plan_lib.is_forced():  # a forced plan is an NCCL plan
      lowered = _peer_store_lowering(prim, ctx, x, w, collective, mesh, axis_name, world, dtype,
                                     (m, n, k), comm_sms, transpose_w, transport)
      if lowered is not None:
        return lowered
    in_place = collective == "all_reduce" and _ext.all_reduce_in_place()
    plan = plan_lib.choose_plan(collective, m, n, k, world, dtype.itemsize, comm_sms,
                                gpu=comm.mesh_gpu_name(mesh), dtype=dtype.name,
                                in_place=in_place, transpose_w=bool(transpose_w))
    comm_id = prepare_communicators(
        prim.name, mesh, axis_name,
        {"band_rows": list(plan.band_rows), "in_place": in_place, "cta_policy": plan.cta_policy},
        plan.comm_sms, 0 if in_place else m * n * dtype.itemsize, ctx,
        cta_policy=plan.cta_policy,
        overlap=not keep_reference(plan, comm_sms, plan_lib.is_forced()))
    if comm_id is None:
      return reference_lowering(ctx, x, w, axis_name=axis_name, transpose_w=transpose_w)
    attrs = {"in_place": np.int32(in_place)} if collective == "all_reduce" else {}
    return emit_call(prim, ctx, x, w, comm_id, world, plan.comm_sms, transpose_w,
                     band_rows=np.asarray(plan.band_rows, dtype=np.int32),
                     transport=np.int32(0), **attrs)
  return lowering


_warned_peer_stores = set()


def _peer_tile_inputs(mesh) -> dict:
  """What the launcher's tile shape depends on besides the problem (signaling_gemm.cu:
  ChooseTileShape), for the decision every process checks: a peer-store rank waits for as
  many of a source's tiles as its own tile shape makes, so a process with another forced
  tile, schedule or SM count would be waited for too early (a race, not an error)."""
  return {"FLASHOVERLAP_GEMM_TILE": str(_ext.kernel_integer("FLASHOVERLAP_GEMM_TILE") or 0),
          _ext.GEMM_SCHEDULE_ENV: os.environ.get(_ext.GEMM_SCHEDULE_ENV) or "cooperative",
          "sms": _ext.local_gpu_sms() if comm.mesh_is_local_gpu(mesh) else None}


def _peer_store_lowering(prim, ctx, x, w, collective, mesh, axis_name, world, dtype, mnk,
                         comm_sms, transpose_w, transport):
  """The custom call with a peer-store plan where JAX_FLASHOVERLAP_TRANSPORT asks for one:
  `peer`, or `auto` with a tuned config entry that says peer (its bands; plan_peer.plan's
  otherwise). None (NCCL then lowers the op) where it does not, or where the op cannot take
  it (with a PeerStoresWarning, once per cause: the reason with its M taken out)."""
  m, n, k = mnk
  tuned = None
  if comm_sms is None and not plan_lib.is_forced():
    tuned = plan_peer.tuned(collective, m, n, k, comm.mesh_gpu_name(mesh), dtype.name, world)
  if transport == "auto" and tuned is None:
    return None
  reason = plan_peer.unavailable(collective, mesh, axis_name, world, m)
  if reason is not None:
    # Once per cause, not per shape: the rows' reason names M, and a long-running process
    # lowering many sequence lengths warned (and kept an entry) for every one of them.
    cause = re.sub(r"\bM=\d+", "M", reason)
    if cause not in _warned_peer_stores:
      _warned_peer_stores.add(cause)
      asked = f"{_ext.TRANSPORT_ENV}=peer" if transport == "peer" else "a tuned config says peer"
      warnings.warn(f"jax_flashoverlap: {prim.name}: {asked}, but {reason}: this op keeps the "
                    "NCCL path", plan_peer.PeerStoresWarning, stacklevel=2)
    return None
  if comm_sms not in (None, 0):
    raise ValueError(f"jax_flashoverlap: {prim.name}: comm_sms={comm_sms}, but with "
                     f"{_ext.TRANSPORT_ENV}=peer the GEMM runs on every SM (no NCCL kernel "
                     "beside it): leave comm_sms unset (or 0)")
  staged = collective == "all_reduce" and plan_peer.stages_mirrors(mesh, axis_name)
  plan = tuned or plan_peer.plan(collective, m, n, k, dtype.itemsize, bool(transpose_w), world,
                                 staged=staged)
  comm_id = prepare_communicators(
      prim.name, mesh, axis_name,
      {"band_rows": list(plan.band_rows), "transport": "peer", "tiles": _peer_tile_inputs(mesh)},
      plan_peer.NCCL_CTAS, 0, ctx,
      peer_store_bytes=plan_peer.recv_bytes(m, n, dtype.itemsize, world, staged=staged))
  attrs = {"in_place": np.int32(0)} if collective == "all_reduce" else {}
  return emit_call(prim, ctx, x, w, comm_id, world, plan.comm_sms, transpose_w,
                   band_rows=np.asarray(plan.band_rows, dtype=np.int32), transport=np.int32(1),
                   **attrs)


def lowering_problem(ctx, axis_name, transpose_w):
  """(mesh, world size, x aval, w aval, dtype, (m, n, k)) of a CUDA lowering; m: rows of x."""
  mesh = _compat.lowering_mesh(ctx)
  x_aval, w_aval = ctx.avals_in
  (m, k), n = x_aval.shape, w_aval.shape[0 if transpose_w else 1]
  return mesh, world_size(mesh, axis_name), x_aval, w_aval, np.dtype(x_aval.dtype), (m, n, k)


def emit_call(prim, ctx, x, w, comm_id, world, comm_sms, transpose_w, **attrs):
  """The custom call of an overlapped op: the attributes every handler takes (poison_outputs:
  the JAX_FLASHOVERLAP_POISON_OUTPUTS test switch), and its own."""
  return _compat.ffi_lowering(prim.name)(
      ctx, x, w, comm_id=np.int64(comm_id), world_size=np.int32(world),
      comm_sms=np.int32(comm_sms), transpose_w=np.int32(transpose_w),
      poison_outputs=np.int32(_ext.poison_outputs()), **attrs)


def keep_reference(plan, comm_sms, forced: bool) -> bool:
  """No gain predicted (or forced off): XLA's own composition, never slower than XLA. An
  explicit comm_sms or JAX_FLASHOVERLAP_FALLBACK=0 keeps our kernels regardless."""
  return not plan.overlap and (forced or (comm_sms is None and _ext.fallback_enabled()))


def publish_decision(name, ctx, decision) -> None:
  """With several processes, every CUDA lowering of a collective op publishes its decision
  (our kernels or XLA's composition, and the plan) exactly once, whichever path it takes: the
  n-th check of each process is compared with the n-th of the others, so one process keeping
  XLA's path while another runs the kernels (a switch or tuned config set on one process
  only) is a DistributedMismatchError on both, not a peer waiting for a check that never
  comes, or for NCCL calls that never match."""
  if jax.process_count() > 1:
    from jax_flashoverlap import distributed
    x_aval, w_aval = ctx.avals_in
    # Among the processes of the mesh's devices, which lower this program: none to compare
    # with for one process's own devices; without devices (abstract mesh), every process.
    devices = _compat.mesh_devices(_compat.lowering_mesh(ctx))
    # The problem itself too: a dtype or an N that differs between processes can give the same
    # plan, and then NCCL calls of other types or counts (wrong numbers, or a hang).
    problem = {"op": name, "operands": [[list(a.shape), str(a.dtype)] for a in ctx.avals_in],
               "results": [[list(a.shape), str(a.dtype)] for a in ctx.avals_out]}
    distributed.check_identical(
        f"the group plan of {name} for x {tuple(x_aval.shape)} w {tuple(w_aval.shape)}",
        dict(decision, **problem),
        None if devices is None else {d.process_index for d in devices.flat})


def prepare_communicators(name, mesh, axis_name, plan_fields, comm_sms, workspace_bytes,
                          ctx, peer_to_peer=False, cta_policy="default", overlap=True,
                          peer_store_bytes=0):
  """At lowering: the decision and plan checked identical on every process (publish_decision),
  then None when `overlap` is False (XLA's composition runs), else the comm_id of the plan's
  communicators, made here when the program runs on this machine's GPUs (not when
  cross-lowering), with peer-store buffers of `peer_store_bytes` (0: none)."""
  comm_id = comm.comm_id_for(mesh, axis_name, comm_sms, peer_to_peer, cta_policy)
  publish_decision(name, ctx, dict(plan_fields, comm_id=comm_id, comm_sms=comm_sms,
                                   overlap=bool(overlap)))
  if not overlap:
    return None
  check_sm_count(name, comm_sms)  # before communicators are made with that CTA cap
  if comm.mesh_is_local_gpu(mesh):
    comm.ensure_communicators(mesh, axis_name, comm_sms=comm_sms,
                              workspace_bytes=workspace_bytes, peer_to_peer=peer_to_peer,
                              cta_policy=cta_policy, peer_store_bytes=peer_store_bytes)
  return comm_id


def world_size(mesh, axis_name):
  if mesh is None:
    raise ValueError("jax_flashoverlap: the CUDA lowering needs the concrete mesh of the "
                     "enclosing shard_map (got none)")
  return int(np.prod([mesh.shape[a] for a in comm.normalize_axes(axis_name)]))


_compat.mlir.register_lowering(gemm_p, _gemm_cuda_lowering, platform="cuda")
_compat.mlir.register_lowering(
    gemm_all_reduce_p,
    _collective_cuda_lowering(gemm_all_reduce_p, _ar_reference_lowering, "all_reduce"),
    platform="cuda")
_compat.mlir.register_lowering(
    gemm_reduce_scatter_p,
    _collective_cuda_lowering(gemm_reduce_scatter_p, _rs_reference_lowering, "reduce_scatter"),
    platform="cuda")

# --- batching (vmap): primitives_batching ---------------------------------------------------


def _collective_world(params):
  return _compat.axis_size(params["axis_name"])


primitives_batching.register_fold(gemm_p, reference_of(gemm_p), lambda params: 1)
primitives_batching.register_fold(gemm_all_reduce_p, reference_of(gemm_all_reduce_p),
                                  lambda params: 1)
primitives_batching.register_fold(gemm_reduce_scatter_p, reference_of(gemm_reduce_scatter_p),
                                  _collective_world)
