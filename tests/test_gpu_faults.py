"""The error path of the overlapped ops on GPUs (#8): an NCCL or CUDA error inside the handler
(injected at the call's first communication step on every rank, comm.inject_faults) must come
out of JAX as an exception naming the op and the error, without a hang, and the next call on
the same communicators must give the right values (nothing left broken). The mesh is every GPU
of the machine (one GPU: 1-rank communicators, the same handlers and NCCL calls without peer
traffic; all-to-all and all-gather need 2 GPUs, over one device they are XLA's own
composition). A failure on one rank only is the watchdog's test (test_gpu_watchdog.py)."""
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


def _cases():
    import jax_flashoverlap as fo
    d32 = U.dot32
    return {  # op -> (ours, float32 reference, in specs, out spec, FFI target)
        "all_reduce": (lambda x, w: fo.matmul_all_reduce(x, w, "tp"),
                       lambda x, w: lax.psum(d32(x, w), "tp"),
                       (P(None, "tp"), P("tp", None)), P(), "flashoverlap_gemm_all_reduce"),
        "reduce_scatter": (lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"),
                           lambda x, w: lax.psum_scatter(d32(x, w), "tp", tiled=True),
                           (P(None, "tp"), P("tp", None)), P("tp", None),
                           "flashoverlap_gemm_reduce_scatter"),
        "all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, "tp", split_axis=0, concat_axis=0),
                       lambda x, w: lax.all_to_all(d32(x, w), "tp", 0, 0, tiled=True),
                       (P("tp", None), P()), P("tp", None), "flashoverlap_gemm_all_to_all"),
        "all_gather": (lambda x, w: fo.all_gather_matmul(x, w, "tp"),
                       lambda x, w: d32(lax.all_gather(x, "tp", axis=0, tiled=True), w),
                       (P("tp", None), P(None, "tp")), P(None, "tp"),
                       "flashoverlap_all_gather_gemm"),
    }


@pytest.mark.parametrize("kind", ["nccl", "cuda"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_to_all", "all_gather"])
def test_injected_error_raises_naming_op_then_next_call_is_right(op, kind):
    import jax_flashoverlap as fo
    if op in ("all_to_all", "all_gather") and U.N_GPUS < 2:
        pytest.skip("over one device these ops lower to XLA's composition (no custom call)")
    ours, ref32, ins, out, target = _cases()[op]
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    f = jax.jit(shard_map(ours, mesh, ins, out))
    g = jax.jit(shard_map(ref32, mesh, ins, out))
    m, k, n = 2048, 4096, 2048
    def inputs(seed):
        kx, kw = jax.random.split(jax.random.key(seed))
        x = jax.device_put(U.normal(kx, (m, k)), NamedSharding(mesh, ins[0]))
        w = jax.device_put(U.normal(kw, (k, n), 1.0 / np.sqrt(k)), NamedSharding(mesh, ins[1]))
        return x, w
    x, w = inputs(1)
    U.assert_custom_call(f, (x, w), target)
    f(x, w).block_until_ready()  # communicators made, program compiled: a normal call first

    fo.comm.inject_faults(kind, 1)
    try:
        with pytest.raises(jax.errors.JaxRuntimeError) as err:
            f(x, w).block_until_ready()
    finally:
        fo.comm.inject_faults("none")
    msg = str(err.value)
    assert target in msg, msg
    assert ("NCCL error" if kind == "nccl" else "CUDA error") in msg and "injected" in msg, msg

    x2, w2 = inputs(2)  # fresh inputs: the same communicators must work again
    got = f(x2, w2)
    assert not np.isnan(np.asarray(got, np.float32)).any()
    assert U.rel_fro(got, g(x2, w2)) < U.TOL


def test_handler_refusals_raise_and_leave_the_process_usable():
    """Every way a handler refuses a call (an attribute out of range, comm_sms < 0, an unknown
    communicator, communicators destroyed under a compiled program, the kernel launcher
    refusing its arguments after work was queued, an injected NCCL failure, a comm_sms other
    than the communicator's cap, a transport out of range or peer stores asked of a 1-rank
    communicator, a collective flag out of range) comes back as a
    JaxRuntimeError, and the same process then runs the GEMM and the all-reduce right. In child
    processes (scripts/diagnose_ffi_error.py): while the handlers built their messages with
    std::ostringstream, every one of these but the NCCL failure crashed the process (SIGSEGV
    formatting a number: xla_ffi/ffi/check.h says why)."""
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
               PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(repo, "scripts", "diagnose_ffi_error.py")],
                       capture_output=True, text=True, timeout=600, env=env)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "12 of 12 cases as expected" in r.stdout, r.stdout


_WORKSPACE_SCRIPT = '''
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo
from jax_flashoverlap import _ext
mesh = Mesh(np.array(jax.devices()), ("tp",))
n_dev = len(jax.devices())
make = lambda: jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                                     in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))
def inputs(seed):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (2048, 2048 * n_dev), jnp.bfloat16)
    w = (jax.random.normal(kw, (2048 * n_dev, 1024), jnp.float32) / 64).astype(jnp.bfloat16)
    return x, w
def err(y, x, w):
    ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
    return float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
f = make()
x, w = inputs(1)
f(x, w).block_until_ready()
(cid,) = {c["comm_id"] for c in fo.comm.list_communicators()}
try:
    _ext.ext.ensure_workspace(cid, 1 << 45)  # 32 TiB: no GPU has it
    print("GROW: no error")
except RuntimeError as e:
    print("GROW FAILED:", str(e)[:300].replace(chr(10), " "))
print("STATE:", sorted((c["workspace_bytes"], bool(c["workspace_error"]))
                       for c in fo.comm.list_communicators()))
try:
    f(x, w).block_until_ready()
    print("CALL: ran")
except Exception as e:  # noqa: BLE001
    print("CALL REFUSED:", str(e)[:600].replace(chr(10), " "))
x2, w2 = inputs(2)
y = make()(x2, w2)  # a new lowering grows the workspace again
print("RELOWERED ERR %.2e" % err(y, x2, w2))
print("OLD PROGRAM ERR %.2e" % err(f(x2, w2), x2, w2))
print("STATE:", sorted((c["workspace_bytes"], bool(c["workspace_error"]))
                       for c in fo.comm.list_communicators()))
'''


def test_workspace_that_cannot_be_allocated_is_refused_then_regrown(tmp_path):
    """Growing a workspace fails (no GPU has 32 TiB): every local communicator of the group is
    left without one (none keeps enqueueing NCCL calls its peers would never join), the call is
    refused naming the allocation's error, and the next lowering grows it again."""
    import subprocess
    import sys
    from _util import REPO, repo_env
    script = tmp_path / "workspace.py"
    script.write_text(_WORKSPACE_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True,
                       env=repo_env(XLA_PYTHON_CLIENT_PREALLOCATE="false",
                                    JAX_FLASHOVERLAP_FALLBACK="0"), timeout=300)
    out = r.stdout + r.stderr
    print(out[-4000:])
    assert r.returncode == 0, out[-6000:]
    assert "GROW FAILED:" in out and ("ncclMemAlloc" in out or "out of memory" in out), out
    import ast
    states = [ast.literal_eval(line[len("STATE:"):].strip()) for line in out.splitlines()
              if line.startswith("STATE:")]
    assert states[0] == [(0, True)] * U.N_GPUS, states  # all members alike: none, error kept
    assert "CALL REFUSED:" in out and "flashoverlap_gemm_all_reduce" in out, out
    assert "allocating it when the op was lowered failed" in out, out
    relowered = [line for line in out.splitlines() if line.startswith(("RELOWERED", "OLD PROGRAM"))]
    assert len(relowered) == 2 and all(float(line.split()[-1]) < 1e-2 for line in relowered), out
    assert len(states[1]) == U.N_GPUS and all(size > 0 and not failed
                                              for size, failed in states[1]), states
