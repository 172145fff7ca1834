"""Every private or moving JAX import, in one place.

Supported: JAX 0.10 (CPU machines, CI) and 0.11 (the GPU machine). When JAX moves an API,
this is the only file that changes.
"""

from __future__ import annotations

import jax
from jax import lax

# Primitives and their rule tables.
try:
  from jax.extend.core import Primitive
except ImportError:  # pragma: no cover - very old JAX
  from jax.core import Primitive  # type: ignore

from jax.interpreters import ad, batching, mlir  # noqa: F401  (re-exported)

from jax._src import api_util as _api_util
from jax._src.interpreters import partial_eval as _pe

# shard_map moved from jax.experimental to jax in 0.6/0.7.
if hasattr(jax, "shard_map"):
  shard_map = jax.shard_map
else:  # pragma: no cover
  from jax.experimental.shard_map import shard_map  # type: ignore

from jax.experimental.custom_partitioning import custom_partitioning  # noqa: F401

try:
  from jax.experimental.custom_partitioning import SdyShardingRule
except ImportError:  # pragma: no cover
  SdyShardingRule = None  # type: ignore


def abstract_eval_fun(fun, *avals):
  """Output avals of `fun(*avals)` traced abstractly.

  Our primitives take their output types from tracing the reference composition, so shape,
  dtype, sharding and the shard_map varying-axes type (vma / manual_axis_type, which differs
  between JAX versions) always match what `psum(x @ w)` would give.
  """
  debug = _api_util.debug_info("jax_flashoverlap", fun, avals, {})
  return _pe.abstract_eval_fun(fun, *avals, debug_info=debug)


def define_transpose(prim, rule) -> None:
  """rule(cotangents, x, w, **params) -> (ct_x, ct_w): prim's transpose; the operand being
  transposed is an UndefinedPrimal (is_undefined_primal), the other a value."""
  ad.primitive_transposes[prim] = rule


def is_undefined_primal(x) -> bool:
  return ad.is_undefined_primal(x)


def instantiate_zeros(ct):
  """A cotangent as an array (a symbolic zero made a zero array)."""
  return ad.instantiate_zeros(ct)


def aval_struct(aval):
  """A ShapeDtypeStruct of an aval, with its sharding and shard_map varying-axes type (what
  jax.linear_transpose needs to trace a function of it inside a check_vma shard_map)."""
  mat = getattr(aval, "manual_axis_type", None)
  extra = {"manual_axis_type": mat} if mat is not None else {}
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=getattr(aval, "sharding", None),
                              **extra)


def varying_axes(x) -> frozenset:
  """Mesh axes over which x's value varies inside a check_vma shard_map (empty elsewhere and
  under check_vma=False). ShapedArray.manual_axis_type.varying in JAX 0.10+, .vma before."""
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", ()))


def bound_axis_names() -> list:
  """Mesh axis names bound at the current trace point (shard_map / vmap axes)."""
  try:
    from jax.extend.core import unsafe_get_axis_names_DO_NOT_USE as names
  except ImportError:  # pragma: no cover
    from jax._src.core import unsafe_get_axis_names as names  # type: ignore
  return list(names())


def axis_size(axis_name) -> int:
  if hasattr(lax, "axis_size"):
    return int(lax.axis_size(axis_name))
  return int(lax.psum(1, axis_name))  # pragma: no cover


def lowering_mesh(ctx):
  """The mesh of the enclosing shard_map in a lowering rule: a concrete Mesh, an AbstractMesh
  (lowering without devices), or None."""
  axis_context = getattr(ctx.module_context, "axis_context", None)
  mesh = getattr(axis_context, "mesh", None)
  if mesh is None or not hasattr(mesh, "axis_names"):
    return None
  return mesh


def lowering_for_export(ctx) -> bool:
  """True in a lowering for `jax.export` (JAX lowers with LoweringParameters(for_export=True);
  plain `jit(...).lower(...)`, cross-lowering included, does not)."""
  params = getattr(ctx.module_context, "lowering_parameters", None)
  return bool(getattr(params, "for_export", False))


def custom_jvp_body(prim, params):
  """The jaxpr a custom_jvp call runs (its `call_jaxpr` parameter), or None for any other
  primitive: jax.checkpoint's policies meet a custom_jvp function as that call."""
  if getattr(prim, "name", None) != "custom_jvp_call":
    return None
  call = params.get("call_jaxpr")
  return getattr(call, "jaxpr", call)


def mesh_devices(mesh):
  """The mesh's devices as an ndarray, or None for an AbstractMesh (which raises on .devices)."""
  import numpy as np
  if mesh is None or isinstance(mesh, jax.sharding.AbstractMesh):
    return None
  try:
    return np.asarray(mesh.devices)
  except ValueError:
    return None


def partition_mesh(mesh, arg_shapes):
  """The mesh a custom partitioner was given, its devices put in the program's device order.
  JAX builds that mesh from the order when the jitted program has a mesh of its own; with
  arguments that carry GSPMD shardings only it passes the mesh of a `with mesh:` context,
  whatever order its devices are in. The per-device ops make their communicators from this
  mesh (rank = position along the axis), so a position must name the device that runs that
  partition: the arguments' undecoded shardings (decode_shardings=False) carry the order."""
  import numpy as np
  devices = mesh_devices(mesh)
  order = next((getattr(getattr(a, "sharding", None), "_device_assignment", None)
                for a in arg_shapes), None)
  if devices is None or order is None or list(order) == list(devices.flat):
    return mesh
  if len(order) != devices.size or set(order) != set(devices.flat):
    return mesh
  kwargs = {"axis_types": mesh.axis_types} if hasattr(mesh, "axis_types") else {}
  return jax.sharding.Mesh(np.array(order, dtype=object).reshape(devices.shape),
                           mesh.axis_names, **kwargs)


def ffi_lowering(target_name: str, **kwargs):
  return jax.ffi.ffi_lowering(target_name, **kwargs)


def register_ffi_target(name: str, capsule, platform: str) -> None:
  jax.ffi.register_ffi_target(name, capsule, platform=platform)


def apply_primitive(prim, *args, **params):
  """Eager evaluation of a primitive (compiles it on its own)."""
  from jax._src import dispatch
  return dispatch.apply_primitive(prim, *args, **params)


def lower_fun_per_device(fun, multiple_results=False):
  """mlir.lower_fun(fun), traced with every mesh axis manual.

  A primitive's reference lowering is the body of one device's program: the partitioning
  is done by then. JAX 0.11 annotates each op of such a body with its mesh's sharding when
  the mesh mixes manual with explicit axes (a global view's partitioner, an explicit mesh),
  the scalar add inside an all-reduce's or reduce-scatter's reduction too, and XLA's CPU
  compiler refuses that reduction ("Unsupported reduction computation"; JAX 0.10 emitted
  no annotation there). With every axis manual JAX annotates nothing (as inside a
  shard_map over all axes) and the body is the same. The mesh itself stays: a value's
  varying axes must be manual axes of its mesh."""
  from jax._src import mesh as mesh_lib
  lowered = mlir.lower_fun(fun, multiple_results=multiple_results)

  def all_manual(mesh):
    return mesh.update(axis_types=(mesh_lib.AxisType.Manual,) * len(mesh.axis_names))

  def per_device(aval):
    mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    if mesh is None or mesh.empty or mesh.are_all_axes_manual:
      return aval
    return aval.update(sharding=jax.sharding.NamedSharding(
        all_manual(mesh), jax.sharding.PartitionSpec(*[None] * aval.ndim)))

  def rule(ctx, *args, **params):  # lower_fun traces on avals_in (it reads no avals_out)
    ctx = ctx.replace(avals_in=[per_device(a) for a in ctx.avals_in])
    mesh = mesh_lib.get_abstract_mesh()
    if mesh.empty or mesh.are_all_axes_manual:
      return lowered(ctx, *args, **params)
    with mesh_lib.use_abstract_mesh(all_manual(mesh)):
      return lowered(ctx, *args, **params)
  return rule


def _abstract_mesh():
  """The current abstract mesh, or None when none is set (or this JAX has none)."""
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  mesh = get() if get is not None else None
  return None if mesh is None or getattr(mesh, "empty", False) else mesh


def mesh_axis_names():
  """Axis names of the current abstract mesh, or None when no mesh is set (then unknown)."""
  mesh = _abstract_mesh()
  return None if mesh is None else tuple(mesh.axis_names)


def manual_axis_names():
  """Mesh axes the enclosing shard_map (or pmap) made manual: () outside one; None when this
  JAX does not say."""
  if getattr(jax.sharding, "get_abstract_mesh", None) is None:  # pragma: no cover
    return None
  mesh = _abstract_mesh()
  return () if mesh is None else getattr(mesh, "manual_axes", None)


# vmap's marker for an unbatched operand (moved out of jax.interpreters.batching in 0.10).
try:
  from jax._src.interpreters.batching import not_mapped
except ImportError:  # pragma: no cover
  not_mapped = None


def ir_shape(ir_type) -> tuple:
  """Static shape of an MLIR ranked tensor type (custom_partitioning's Shardy callbacks)."""
  from jax._src.lib.mlir import ir
  return tuple(ir.RankedTensorType(ir_type).shape)


def distributed_client():
  """JAX's distributed runtime client, or None when jax.distributed is not initialized."""
  from jax._src import distributed
  return getattr(distributed.global_state, "client", None)


def traced_state(name: str, help: str):
  """A thread-local JAX config state that is part of jit's trace and cache keys (JAX's own
  switches are such states): a function traced under one value is traced again under
  another, instead of JAX's cache giving back what it lowered before. A context manager
  factory: `state(value)`; None where this JAX has no such states."""
  try:
    from jax._src import config as _config
    return _config.string_or_object_state(name, None, help, include_in_jit_key=True,
                                          include_in_trace_context=True)
  except (ImportError, AttributeError, TypeError):  # pragma: no cover
    return None


def persistent_cache_skips_custom_partitioning() -> bool:
  """Keeps every program holding a `custom_partitioning` call (our global views) out of JAX's
  persistent compilation cache in this process; True once in place.

  JAX keys such a call by the id() of the callback object it makes at each lowering. Once an
  executable and that object are freed, the id can come back for another partitioner whose
  program is otherwise the same text (another plan forced, the other collective at the same
  shapes), and the cache would hand back the first one's executable. Used by the test suite's
  shared cache (tests/conftest.py). False where this JAX has no such hook: the caller then
  leaves the cache off."""
  try:
    from jax._src import compilation_cache as _cache
    from jax._src.lib.mlir import ir
  except ImportError:  # pragma: no cover
    return False
  key_of = getattr(_cache, "get_cache_key", None)
  if key_of is None:  # pragma: no cover
    return False
  if getattr(key_of, "skips_custom_partitioning", False):
    return True

  def holds_custom_partitioning(module) -> bool:
    found = []

    def visit(op):
      target = op.attributes["call_target_name"] if "call_target_name" in op.attributes else None
      if isinstance(target, ir.StringAttr) and target.value == "CustomSPMDPartitioning":
        found.append(op.name)
        return ir.WalkResult.INTERRUPT
      return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return bool(found)

  def get_cache_key(module, *args, **kwargs):
    # None: JAX compiles without the cache (its path when no key can be made).
    return None if holds_custom_partitioning(module) else key_of(module, *args, **kwargs)

  get_cache_key.skips_custom_partitioning = True
  _cache.get_cache_key = get_cache_key
  return True
