"""The all-reduce in place on XLA's output (JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output, #8's
memory bound: no M x N workspace, only the group counters): values against float32 at aligned
and odd shapes over every GPU of the machine (one GPU: a 1-rank communicator, the same
handler and NCCL calls), fresh inputs per call, the output filled with NaN by the handler
before each call (conftest's JAX_FLASHOVERLAP_POISON_OUTPUTS=1) so unwritten rows show; no
communicator workspace allocated for it; the
trace shows no copies. The switch is read at lowering: each program is jitted after it is set."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = U.MARKS


@pytest.fixture(autouse=True)
def _in_place(monkeypatch):
    U.use_our_kernels(monkeypatch)
    monkeypatch.setenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", "output")


def _programs(mesh):
    import jax_flashoverlap as fo
    ins = (P(None, "tp"), P("tp", None))
    ours = jax.jit(shard_map(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), mesh, ins, P()))
    ref32 = jax.jit(shard_map(lambda x, w: lax.psum(U.dot32(x, w), "tp"), mesh, ins, P()))
    return ours, ref32, ins


@pytest.mark.parametrize("M,N,K", [(2048, 4096, 4096), (1000, 2056, 1032), (8192, 8192, 4096)])
def test_in_place_all_reduce_matches_float32(M, N, K):
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    ours, ref32, ins = _programs(mesh)
    K = K * U.N_GPUS
    key = jax.random.key(M + N)
    errors = []
    for call in range(3):
        key, kx, kw = jax.random.split(key, 3)
        x = jax.device_put(U.normal(kx, (M, K)), NamedSharding(mesh, ins[0]))
        w = jax.device_put(U.normal(kw, (K, N), 1.0 / np.sqrt(K)), NamedSharding(mesh, ins[1]))
        if call == 0:
            U.assert_custom_call(ours, (x, w), "flashoverlap_gemm_all_reduce")
            text = ours.lower(x, w).as_text()
            assert "in_place = 1" in text, "the all-reduce was not lowered in place"
        y = ours(x, w)
        assert y.shape == (M, N) and y.dtype == U.BF16
        assert bool(jnp.all(jnp.isfinite(y))), f"call {call}: unwritten (NaN) rows in the output"
        errors.append(U.rel_fro(y, ref32(x, w)))
    assert max(errors) < U.TOL, errors
    assert len(set(errors)) > 1, "identical errors: the inputs were not fresh"


def test_in_place_needs_no_workspace_and_copies_nothing():
    import jax_flashoverlap as fo
    from jax_flashoverlap import comm, trace
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    M, N, K = 2048, 2048, 2048 * U.N_GPUS
    ours, ref32, ins = _programs(mesh)
    kx, kw = jax.random.split(jax.random.key(3))
    x = jax.device_put(U.normal(kx, (M, K)), NamedSharding(mesh, ins[0]))
    w = jax.device_put(U.normal(kw, (K, N), 1.0 / np.sqrt(K)), NamedSharding(mesh, ins[1]))
    # comm_sms 7: a communicator no other test made (its workspace would be sized for them).
    f = jax.jit(shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=7), mesh, ins,
                          P()))
    with trace.recording():
        y = f(x, w)
        y.block_until_ready()
        records = trace.read(clear=True)
    assert U.rel_fro(y, ref32(x, w)) < U.TOL
    mine = [c for c in comm.list_communicators() if c["comm_sms"] == 7 and not c["peer_to_peer"]]
    assert len(mine) == U.N_GPUS and all(c["workspace_bytes"] == 0 for c in mine), mine
    ar = [r for r in records if r["op"] == "flashoverlap_gemm_all_reduce"]
    assert len(ar) == U.N_GPUS, records
    assert all(r["copy_done_ms"] is None for r in ar), ar
    assert all(r["gemm_done_ms"] > 0 and len(r["comm_done_ms"]) == len(r["band_rows"]) - 1
               for r in ar), ar
