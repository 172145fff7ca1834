"""Peer stores across processes, checked on CPU through a CUDA cross-lowering (as
tests/test_multiprocess.py checks the NCCL plans): a peer-store rank waits for as many of a
source's tiles as its own tile shape makes, so processes whose launchers would pick other
tiles (FLASHOVERLAP_GEMM_TILE or FLASHOVERLAP_GEMM_SCHEDULE set in one process only) must
not run together: a DistributedMismatchError on every process at lowering, naming the
switch, where nothing had compared them (a silent race on the GPUs)."""
import textwrap

import pytest

from _launch_util import launch as _launch

SCRIPT = textwrap.dedent('''
    import os, sys, time
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ["JAX_FLASHOVERLAP_KV_TIMEOUT_S"] = "40"
    os.environ["JAX_FLASHOVERLAP_TRANSPORT"] = "peer"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax_flashoverlap as fo
    from jax_flashoverlap import distributed
    distributed.initialize()
    me = jax.process_index()
    name, value = os.environ.pop("FO_TEST_SWITCH").split("=")
    if me == 1 and name != "none":
        os.environ[name] = value
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    sds = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    f = jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                      in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())
    start = time.monotonic()
    try:
        text = jax.jit(f).trace(sds(4096, 8192), sds(8192, 8192)).lower(
            lowering_platforms=("cuda",)).as_text()
        result = "NO MISMATCH " + ("peer" if "transport = 1 : i32" in text else "other")
    except distributed.DistributedMismatchError as err:
        assert time.monotonic() - start < 20, "a peer waited"
        shown = f'"{name}": "{value}"' in str(err)  # process 1's value, in the message
        result = "MISMATCH " + ("names it" if shown else "silent: " + str(err))
    with open(os.path.join(os.path.dirname(__file__), f"p{me}.txt"), "w") as fh:
        fh.write(result)
''')


@pytest.mark.parametrize("name, value, want", [
    ("none", "", "NO MISMATCH peer"),
    ("FLASHOVERLAP_GEMM_TILE", "0", "NO MISMATCH peer"),  # the default, spelt out
    ("FLASHOVERLAP_GEMM_TILE", "128", "MISMATCH names it"),
    ("FLASHOVERLAP_GEMM_SCHEDULE", "pingpong", "MISMATCH names it"),
])
def test_peer_stores_refuse_processes_whose_tiles_differ(tmp_path, monkeypatch, name, value,
                                                        want):
  monkeypatch.setenv("FO_TEST_SWITCH", f"{name}={value}")  # set in process 1 only
  r = _launch(tmp_path, SCRIPT, "-n", "2", "--timeout", "200")
  out = r.stdout + r.stderr
  assert r.returncode == 0, out[-6000:]
  for me in (0, 1):
    assert (tmp_path / f"p{me}.txt").read_text() == want, ((tmp_path / f"p{me}.txt").read_text(),
                                                          out[-4000:])
