"""The communicator's CTA policy (ncclConfig_t.CTAPolicy, chosen by the tuner) on GPUs: each
policy gets communicators of its own, made with that policy, and the overlapped ops give the
right values through them (mesh: every GPU of the machine; one GPU: 1-rank communicators)."""
import numpy as np
import pytest

import jax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = U.MARKS


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


@pytest.mark.parametrize("policy", ["efficiency", "zero"])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_ops_through_a_policy_communicator(collective, policy):
    import jax_flashoverlap as fo
    from jax_flashoverlap import comm, plan
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    M, N, K = 2048, 2048, 2048 * U.N_GPUS
    ins = (P(None, "tp"), P("tp", None))
    if collective == "all_reduce":
        body, ref, out = (lambda a, b: fo.matmul_all_reduce(a, b, "tp")), \
            (lambda a, b: lax.psum(U.dot32(a, b), "tp")), P()
    else:
        body, ref, out = (lambda a, b: fo.matmul_reduce_scatter(a, b, "tp")), \
            (lambda a, b: lax.psum_scatter(U.dot32(a, b), "tp", tiled=True)), P("tp", None)
    kx, kw = jax.random.split(jax.random.key(11))
    x = jax.device_put(U.normal(kx, (M, K)), NamedSharding(mesh, ins[0]))
    w = jax.device_put(U.normal(kw, (K, N), 1.0 / np.sqrt(K)), NamedSharding(mesh, ins[1]))
    f = jax.jit(shard_map(body, mesh, ins, out))
    with plan.forced(comm_sms=9, cta_policy=policy):  # comm_sms 9: no other test's communicator
        U.assert_custom_call(f, (x, w), "flashoverlap_gemm_" + collective)
        y = f(x, w)
    assert U.rel_fro(y, jax.jit(shard_map(ref, mesh, ins, out))(x, w)) < U.TOL
    made = [c for c in comm.list_communicators()
            if c["comm_sms"] == 9 and c["cta_policy"] == comm.CTA_POLICIES[policy]]
    assert len(made) == U.N_GPUS, comm.list_communicators()
