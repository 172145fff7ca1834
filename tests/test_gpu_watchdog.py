"""The watchdog (JAX_FLASHOVERLAP_WATCHDOG_S) on GPUs: a call whose peer never joins becomes
an error naming the op within the timeout instead of a hang. 2 processes x 1 GPU: both run the
op once, then process 1 skips the second call; process 0 must get an exception (after the
watchdog's message) and every process must exit. Plus the env var's validation (CPU)."""
import os
import subprocess
import sys
import time

import pytest

from _util import repo_env
from test_gpu import ON_GPU, requires_gpu, requires_multigpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = '''
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_flashoverlap as fo
fo.distributed.initialize()
me = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("tp",))
make = jax.jit(lambda k: (jax.random.normal(k, (2048, 4096), jnp.bfloat16),
                          jax.random.normal(k, (4096, 4096), jnp.bfloat16)),
               out_shardings=(NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P("tp", None))))
x, w = make(jax.random.key(0))
f = jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=16), mesh=mesh,
                          in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))
f(x, w).block_until_ready()  # both processes: communicators made, one good call
print("first call OK", me, flush=True)
if me == 1:  # never takes part in the second call (the launcher stops it at the end)
    time.sleep(120)
    os._exit(0)
t0 = time.time()
try:
    f(x, w).block_until_ready()
    print("NO ERROR after", time.time() - t0, flush=True)
    os._exit(3)
except Exception as err:  # noqa: BLE001
    print("CAUGHT after %.1f s: %s" % (time.time() - t0, str(err)[:400].replace(chr(10), " ")),
          flush=True)
    os._exit(0)
'''


@pytest.mark.multigpu
@requires_gpu
@requires_multigpu
def test_watchdog_turns_a_missing_peer_into_an_error(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_FLASHOVERLAP_WATCHDOG_S="3")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "2",
                        "--gpus-per-process", "1", "--timeout", "150", str(script)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    out = r.stdout + r.stderr
    elapsed = time.time() - t0
    print(out[-3000:])
    assert "first call OK 0" in out, out[-6000:]
    assert "jax_flashoverlap watchdog: flashoverlap_gemm_all_reduce" in out, out[-6000:]
    assert "must be restarted" in out
    caught = [line for line in out.splitlines() if line.startswith("CAUGHT after")]
    if caught:  # NCCL stopped after ncclCommAbort: the check kernel trapped, JAX raised
      assert r.returncode == 0 and float(caught[0].split()[2]) < 3 + 12, out[-6000:]
    else:  # NCCL's kernel kept waiting: the watchdog's deadline ended the process
      assert r.returncode == 134, out[-6000:]
      assert "exiting the process (status 134)" in out, out[-6000:]
    assert elapsed < 100, elapsed


_BACKLOG_SCRIPT = '''
import time
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo
mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
f = jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=16), mesh=mesh,
                          in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))
busy = jax.jit(lambda a: lax.fori_loop(0, 2500, lambda i, v: jnp.tanh(v @ v), a))
kx, kw, ka = jax.random.split(jax.random.key(7), 3)
x = jax.random.normal(kx, (2048, 4096), jnp.bfloat16)
w = (jax.random.normal(kw, (4096, 2048), jnp.float32) / 64).astype(jnp.bfloat16)
a = (jax.random.normal(ka, (8192, 8192), jnp.float32) / 90).astype(jnp.bfloat16)
assert "flashoverlap_gemm_all_reduce" in f.lower(x, w).compile().as_text()
f(x, w).block_until_ready()  # communicator made, watched once
busy(a).block_until_ready()  # compiled
t0 = time.time()
busy(a)                        # seconds of GPU work, dispatched without waiting...
y = f(x, w)                    # ...so this call is enqueued (and watched) long before it runs
y.block_until_ready()
took = time.time() - t0
ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
err = float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
print("BACKLOG %.2f s ERR %.2e" % (took, err), flush=True)
'''


@pytest.mark.gpu
@requires_gpu
def test_watchdog_times_a_call_from_when_the_gpu_reaches_it(tmp_path):
    """JAX dispatches ahead: a call can wait seconds behind earlier work without anything
    hanging. With a 1 s watchdog and ~3 s of queued work before the call, the call must not be
    reported (the clock once started when the handler enqueued it: a healthy job was aborted)."""
    script = tmp_path / "backlog.py"
    script.write_text(_BACKLOG_SCRIPT)
    env = repo_env(XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_FLASHOVERLAP_WATCHDOG_S="1",
                   JAX_FLASHOVERLAP_FALLBACK="0")
    r = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    out = r.stdout + r.stderr
    print(out[-3000:])
    assert "jax_flashoverlap watchdog" not in out, out[-6000:]
    assert r.returncode == 0, out[-6000:]
    line = [s for s in out.splitlines() if s.startswith("BACKLOG")][0]
    took, err = float(line.split()[1]), float(line.split()[4])
    assert took > 2.0, f"the queued work took {took:.2f} s: not enough to test a 1 s watchdog"
    assert err < 1e-2, line


@pytest.mark.skipif(ON_GPU, reason="CPU check of the env var (the GPU test above uses it)")
@pytest.mark.parametrize("value", ["abc", "-1", "inf", "nan", "on", "true"])
def test_watchdog_env_var_is_validated(monkeypatch, value):
    from jax_flashoverlap import comm
    monkeypatch.setenv(comm.WATCHDOG_ENV, value)
    with pytest.raises(ValueError, match="JAX_FLASHOVERLAP_WATCHDOG_S must be a number of "
                                         "seconds > 0"):
        comm.watchdog_seconds()


@pytest.mark.parametrize("value,expected", [
    ("", 0.0), ("0", 0.0), ("2.5", 2.5),
    # env_switch's off words and numbers equal to 0 (were errors, "off" only in lower case)
    ("off", 0.0), ("OFF", 0.0), ("false", 0.0), ("no", 0.0), ("0.0", 0.0), ("-0", 0.0),
    (" 0e3 ", 0.0)])
def test_watchdog_env_var_values(monkeypatch, value, expected):
    from jax_flashoverlap import comm
    monkeypatch.setenv(comm.WATCHDOG_ENV, value)
    assert comm.watchdog_seconds() == expected
