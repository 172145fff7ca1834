"""The mesh a global view's partitioner hands its per-device ops is the mesh their
communicators are made from (comm.axis_groups: rank = position along the axis), so its device
at each position must be the device that runs that partition. JAX builds that mesh from the
program's device order when the program has a mesh of its own; with arguments that carry
GSPMD shardings only, it passes the mesh of a `with mesh:` context instead, whatever order its
devices are in. Values on CPU stay right (the reference collective ranks by partition); on
GPUs a context mesh in another order ranked the NCCL communicator's devices wrongly: the
reduce-scatter's rows landed on the wrong devices (and the all-gather's came back permuted).

A shard_map over an AbstractMesh names no devices at all: on a machine with GPUs (where the
program runs) the collectives lower to XLA's composition, warned; cross-lowered without a
GPU they stay our custom call (tests/test_lowering.py)."""
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import cpu_devices, make_mesh_1d

from jax_flashoverlap import _validation, comm

try:
  from jax._src.sharding_impls import GSPMDSharding
except ImportError:  # pragma: no cover
  GSPMDSharding = None


def _gspmd(mesh, spec, ndim):
  return GSPMDSharding(tuple(mesh.devices.flat),
                       NamedSharding(mesh, spec)._to_xla_hlo_sharding(ndim))


@pytest.mark.skipif(GSPMDSharding is None, reason="this JAX has no GSPMDSharding")
@pytest.mark.parametrize("op", ["row_reduce_scatter", "row_all_reduce", "column"])
def test_partitioner_ranks_the_devices_that_run_each_partition(fo, monkeypatch, op):
  make_mesh_1d(4)
  devs = np.array(cpu_devices()[:4])
  context, placed = Mesh(devs, ("tp",)), Mesh(devs[::-1], ("tp",))
  seen = []
  real = _validation.partitioner_lowering
  monkeypatch.setattr(_validation, "partitioner_lowering",
                      lambda mesh: seen.append(mesh) or real(mesh))
  rng = np.random.default_rng(0)
  if op == "column":
    f = lambda x, w: fo.column_parallel_matmul(x, w, axis_name="tp")  # noqa: E731
    specs = (P("tp", None), P(None, "tp"))
  else:
    reduce = op[len("row_"):]
    f = lambda x, w: fo.row_parallel_matmul(x, w, reduce=reduce, axis_name="tp")  # noqa: E731
    specs = (P(None, "tp"), P("tp", None))
  x = jax.device_put(jnp.asarray(rng.standard_normal((64, 128)), jnp.bfloat16),
                     _gspmd(placed, specs[0], 2))
  w = jax.device_put(jnp.asarray(rng.standard_normal((128, 32)), jnp.bfloat16),
                     _gspmd(placed, specs[1], 2))
  jax.clear_caches()
  with context:  # the legacy mesh context: devices 0..3, the program's order is 3..0
    y = jax.jit(f)(x, w)
  want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=0.05, atol=0.5)
  assert seen, "the partitioner did not run"
  for mesh in seen:
    # partition i runs on the program's i-th device: rank i of each axis group must be it
    ranks = {d.id: r for g in comm.axis_groups(mesh, "tp") for r, d in enumerate(g)}
    assert ranks == {d.id: i for i, d in enumerate(placed.devices.flat)}, (
        [d.id for d in np.asarray(mesh.devices).flat])


def _reduce_scatter_program(fo, mesh):
  """shard_map(matmul_reduce_scatter) over `mesh`, arguments placed on 2 devices (a shape the
  plan overlaps)."""
  from _util import shard_map
  f = shard_map(lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), mesh,
                (P(None, "tp"), P("tp", None)), P("tp", None))
  placed = Mesh(np.array(cpu_devices()[:2]), ("tp",))
  return f, tuple(jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16,
                                       sharding=NamedSharding(placed, spec))
                  for spec in (P(None, "tp"), P("tp", None)))


@pytest.mark.parametrize("gpu_here", [True, False])
def test_shard_map_over_an_abstract_mesh(fo, monkeypatch, gpu_here):
  """On GPUs every call of such a program failed with the handler's "no communicator"."""
  from jax_flashoverlap import _ext, primitives
  from _util import custom_call_lines, lower_for_cuda
  make_mesh_1d(2)
  monkeypatch.setattr(_ext, "check_cuda_path", lambda target, **_: (True, "test"))
  monkeypatch.setattr(_ext, "local_gpus", lambda: [("NVIDIA H200", "9.0")] if gpu_here else [])
  monkeypatch.setattr(primitives, "_warned_fallbacks", set())
  target = "flashoverlap_gemm_reduce_scatter"
  mesh = Mesh(np.array(cpu_devices()[:2]), ("tp",))
  f, args = _reduce_scatter_program(fo, mesh.abstract_mesh)
  if gpu_here:
    with pytest.warns(primitives.AbstractMeshWithoutOverlapWarning, match="jax.set_mesh"):
      text = lower_for_cuda(f, args)
    assert not custom_call_lines(text, target) and "reduce_scatter" in text
  else:
    assert custom_call_lines(lower_for_cuda(f, args), target)  # cross-lowering: ours
  # the concrete mesh, on the same machine: our custom call, no warning
  f, args = _reduce_scatter_program(fo, mesh)
  with warnings.catch_warnings():
    warnings.simplefilter("error", primitives.AbstractMeshWithoutOverlapWarning)
    assert custom_call_lines(lower_for_cuda(f, args), target)
