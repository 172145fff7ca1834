"""GPU tests (2 GPUs, one process; the device machine, never CI) of which device each NCCL
rank is: a reduce-scatter lands rank r's rows on the device the communicator ranks r, so a
communicator ranked in another order than the program's partitions gives rows to the wrong
devices (silently wrong values, no error). The CPU suite checks the ranks it derives
(tests/test_comm_setup.py, tests/test_partition_mesh.py); these check the values.

* a mesh whose devices run in reverse order, through shard_map and through the global view;
* the global view with GSPMD-sharded arguments under a `with mesh:` context in the other
  order (JAX passes the partitioner the context's mesh: fixed by _compat.partition_mesh);
* shard_map given the AbstractMesh of a concrete mesh: the lowering sees no devices, so it
  cannot make communicators; it lowers XLA's composition with a warning (every call failed
  with "no communicator for comm_id ..." before).
"""
import zlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = [
    pytest.mark.gpu, pytest.mark.multigpu,
    pytest.mark.skipif(not U.ON_GPU or not U.extension_built(),
                       reason=f"needs a GPU and the built extension (platform {U.platform()!r})"),
    pytest.mark.skipif(U.N_GPUS < 2, reason=f"needs >= 2 GPUs, have {U.N_GPUS}"),
]

M, N, K = 4096, 8192, 8192
RS = "flashoverlap_gemm_reduce_scatter"


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _inputs(name):
    kx, kw = jax.random.split(jax.random.PRNGKey(zlib.crc32(name.encode())))
    return U.normal(kx, (M, K)), U.normal(kw, (K, N), K ** -0.5)


def _check(y, x, w):
    want = U.dot32(x, w)
    assert bool(jnp.all(jnp.isfinite(y)))
    assert U.rel_fro(y, want) < U.TOL


def _reversed():
    return Mesh(np.array(jax.devices()[:2])[::-1], ("tp",))


def test_shard_map_over_a_reversed_mesh():
    import jax_flashoverlap as fo
    mesh = _reversed()
    f = jax.jit(shard_map(lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), mesh,
                          (P(None, "tp"), P("tp", None)), P("tp", None)))
    x, w = _inputs("reversed")
    U.assert_custom_call(f, (x, w), RS)
    _check(f(x, w), x, w)


@pytest.mark.parametrize("context", [False, True])
def test_global_view_over_a_reversed_mesh(context):
    """context: the arguments carry GSPMD shardings (no mesh) and a `with mesh:` context
    lists the devices in the other order; failed before _compat.partition_mesh."""
    from jax._src.sharding_impls import GSPMDSharding
    import jax_flashoverlap as fo
    mesh = _reversed()
    x, w = _inputs(f"global {context}")
    xs, ws = NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P("tp", None))
    if context:
        xs, ws = (GSPMDSharding(tuple(mesh.devices.flat), s._to_xla_hlo_sharding(2))
                  for s in (xs, ws))
    x, w = jax.device_put(x, xs), jax.device_put(w, ws)
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, reduce="reduce_scatter",
                                                    axis_name="tp"))
    jax.clear_caches()
    if context:
        with Mesh(np.array(jax.devices()[:2]), ("tp",)):
            assert RS in f.lower(x, w).compile().as_text()
            y = f(x, w)
    else:
        assert RS in f.lower(x, w).compile().as_text()
        y = f(x, w)
    _check(y, x, w)


def test_shard_map_over_an_abstract_mesh_with_placed_arguments():
    """JAX runs this program (its own collectives need no devices at lowering); ours needs
    communicators the lowering cannot make without them: XLA's composition, warned."""
    import jax_flashoverlap as fo
    from jax_flashoverlap import primitives
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(primitives, "_warned_fallbacks", set())
    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    f = jax.jit(shard_map(lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), mesh.abstract_mesh,
                          (P(None, "tp"), P("tp", None)), P("tp", None)))
    x, w = _inputs("abstract")
    x = jax.device_put(x, NamedSharding(mesh, P(None, "tp")))
    w = jax.device_put(w, NamedSharding(mesh, P("tp", None)))
    with pytest.warns(primitives.AbstractMeshWithoutOverlapWarning):
        text = f.lower(x, w).compile().as_text()
    monkeypatch.undo()
    assert RS not in text
    _check(f(x, w), x, w)
