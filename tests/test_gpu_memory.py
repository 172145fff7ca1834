"""The memory `comm.op_memory` reports is what the extension allocates (the device machine;
never CI). The C++ grows a communicator's workspace in 8 MiB steps (RoundGrowth); the CPU
suite checks the formula against the header (tests/test_op_memory.py), this checks it against
the communicator the lowering really made: its `workspace_bytes` as the extension reports it,
after a first shape whose M x N is no multiple of 8 MiB and after growing to a larger one.
A CTA cap no other test uses (comm_sms=20) gives this test a communicator of its own (the
workspace is shared by every op on a communicator, grown to the largest). Every local GPU
(one GPU: a 1-rank communicator)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = U.MARKS
COMM_SMS = 20


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def test_workspace_is_what_op_memory_reports():
    import jax_flashoverlap as fo
    from jax_flashoverlap import comm
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    world, k_local = mesh.size, 256
    f = jax.jit(shard_map(lambda a, b: fo.matmul_reduce_scatter(a, b, "tp", comm_sms=COMM_SMS),
                          mesh, (P(None, "tp"), P("tp", None)), P("tp", None)))
    for m, n in ((1000 * world, 1024), (4104 * world, 8192)):  # 2 MB -> 8 MiB; 67 MB -> 72 MiB
        x = jax.ShapeDtypeStruct((m, k_local * world), jnp.bfloat16)
        w = jax.ShapeDtypeStruct((k_local * world, n), jnp.bfloat16)
        assert "flashoverlap_gemm_reduce_scatter" in f.lower(x, w).as_text()
        want = comm.op_memory("matmul_reduce_scatter", (m, k_local), (k_local, n), jnp.bfloat16,
                              world)["workspace_bytes"]
        assert want % comm.GROWTH_STEP_BYTES == 0 and want >= m * n * 2
        made = [c for c in comm.list_communicators() if c["comm_sms"] == COMM_SMS]
        assert len(made) == world, made
        assert {c["workspace_bytes"] for c in made} == {want}, (m, n, want, made)
