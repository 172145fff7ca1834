"""The row-parallel problem every overlap benchmark times (bench overlap / sweep / gemm, the
tuner, benchmarks/): fresh sharded random inputs on a 1-D 'tp' mesh, XLA's collective, our op,
the plan its CUDA lowering takes, and that plan's capped NCCL collective alone."""

from __future__ import annotations

import time


def random_inputs(key, m, n, k, dtype):
  """x [m, k] and w [k, n] of fresh normal values, w scaled by 1/sqrt(k) so that x @ w stays
  of order one in bf16."""
  import jax
  import jax.numpy as jnp
  kx, kw = jax.random.split(key)
  x = jax.random.normal(kx, (m, k), jnp.float32).astype(dtype)
  w = (jax.random.normal(kw, (k, n), jnp.float32) / (k ** 0.5)).astype(dtype)
  return x, w


class TpProblem:
  """One row-parallel problem on a 1-D 'tp' mesh: sharded random inputs, the XLA collective,
  our op, and a jit(shard_map) helper; shared by `overlap` and `sweep`."""

  def __init__(self, args, collective, shape, key):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_flashoverlap as fo
    devices = jax.devices()[: args.world] if args.world else jax.devices()
    self.world = len(devices)
    self.mesh = Mesh(np.array(devices), ("tp",))
    self.dtype = jnp.dtype(args.dtype)
    self.collective = collective
    self.m, self.n, self.k = shape
    # Generated in place with global shardings (works across processes too).
    gen = jax.jit(lambda key: random_inputs(key, self.m, self.n, self.k, self.dtype),
                  out_shardings=(NamedSharding(self.mesh, P(None, "tp")),
                                 NamedSharding(self.mesh, P("tp", None))))
    self.x, self.w = gen(key)
    rs = collective == "reduce_scatter"
    self.out_spec = P("tp", None) if rs else P(None, None)
    self.in_specs = (P(None, "tp"), P("tp", None))
    if rs:
      self.coll = lambda y: lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
      self.ours = lambda x, w: fo.matmul_reduce_scatter(x, w, "tp")
    else:
      self.coll = lambda y: lax.psum(y, "tp")
      self.ours = lambda x, w: fo.matmul_all_reduce(x, w, "tp")
    self.target = "flashoverlap_gemm_" + collective

  def smap(self, fn, in_specs=None, out_specs=None, check_vma=True):
    import jax
    return jax.jit(jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs or self.in_specs,
                                 out_specs=out_specs or self.out_spec, check_vma=check_vma))

  def baseline(self):
    return self.smap(lambda x, w: self.coll(x @ w))

  def reference_f32(self):
    import jax.numpy as jnp
    f = self.smap(lambda x, w: self.coll(x.astype(jnp.float32) @ w.astype(jnp.float32)))
    return f(self.x, self.w)

  @property
  def args(self):
    return (self.x, self.w)


def lowered_plan(pb):
  """The plan pb's op lowers with (the arguments of primitives.py's CUDA lowering): a forced
  plan, else a tuned config entry for the mesh's GPU (not for an all-reduce in place on XLA's
  output), else the cost model."""
  from jax_flashoverlap import _ext, comm, plan as plan_lib
  in_place = pb.collective == "all_reduce" and _ext.all_reduce_in_place()
  return plan_lib.choose_plan(pb.collective, pb.m, pb.n, pb.k // pb.world, pb.world,
                              pb.dtype.itemsize, gpu=comm.mesh_gpu_name(pb.mesh),
                              dtype=pb.dtype.name, in_place=in_place)


def problems(args):
  """A TpProblem with fresh random inputs for each (collective, shape) of the arguments."""
  import jax
  key = jax.random.key(int(time.time()))
  for collective in args.collectives:
    for shape in args.shapes:
      key, sub = jax.random.split(key)
      yield TpProblem(args, collective, shape, sub)


def nccl_capped_fn(pb, plan):
  """The communication half of our op alone (no GEMM) on the plan's capped communicator and
  registered workspace: XLA FFI target flashoverlap_collective, timing only (its output is
  the workspace's stale contents). None where the CUDA path is not available, and for a
  peer-store plan (transport "peer": no NCCL call to compare with)."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import jax_flashoverlap as fo
  from jax_flashoverlap import _ext
  target = "flashoverlap_collective"
  groups = capped_groups(pb.m, pb.world, plan.num_groups)
  if groups is None or getattr(plan, "transport", "nccl") != "nccl":  # before any communicator
    return None
  if not fo.comm.mesh_is_local_gpu(pb.mesh) or target not in _ext.available_targets():
    return None
  _ext.register_targets()
  m, n, world = pb.m, pb.n, pb.world
  rs = pb.collective == "reduce_scatter"
  cid = fo.comm.ensure_communicators(pb.mesh, "tp", comm_sms=plan.comm_sms,
                                     workspace_bytes=m * n * pb.dtype.itemsize,
                                     cta_policy=getattr(plan, "cta_policy", "default"))
  out_rows = m // world if rs else m

  def body(y):
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((out_rows, n), y.dtype))
    return call(y, comm_id=np.int64(cid), world_size=np.int32(world),
                reduce_scatter=np.int32(rs), num_groups=np.int32(groups))

  return jax.jit(jax.shard_map(body, mesh=pb.mesh, in_specs=P("tp", None),
                               out_specs=P("tp", None), check_vma=False))


def capped_groups(m: int, world: int, num_groups: int) -> int | None:
  """Groups of the capped collective alone on a per-device [m, n] buffer: its handler
  (xla_ffi/ffi/collective.cc) needs m % (groups * world) == 0, even for one group, so the
  plan's count or the largest below it that splits m; None (no such variant) when m % world."""
  for g in range(max(1, num_groups), 0, -1):
    if m % (g * world) == 0:
      return g
  return None
