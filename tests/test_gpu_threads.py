"""Lowering on one thread while another runs programs on the same mesh (GPU machine): lowering
a larger shape grows the communicators' workspaces, which swaps their buffers. Each call
takes its workspace under its communicator's call mutex and the growth waits until no call
is in flight and holds calls off meanwhile (xla_ffi/comm/quiesce.h), so every call of the
running thread must still give the right values, nothing may hang, and the workspace must
end up grown. Before that, a handler read the workspace before taking the mutex: a growth
between the read and the enqueue left the GEMM writing a freed buffer.

In a child process (a failure there could leave the GPU context broken). The mesh is every
GPU of the machine: on one GPU 1-rank communicators (the same handlers, NCCL without peer
traffic); on several, single-process collectives whose per-device handlers run on XLA's
threads, where a growth may come between device 0's handler and device 1's."""
import ast
import subprocess
import sys

from _util import REPO, repo_env
import _gpu_util as U

pytestmark = U.MARKS

_SCRIPT = r'''
import threading, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_flashoverlap as fo

mesh = Mesh(np.array(jax.devices()), ("tp",))
n_dev = len(jax.devices())
K, N, M0, STEP_ROWS, GROWTHS = 1024 * n_dev, 4096, 2048, 1024, 12  # 8 MiB more per growth
ins = (P(None, "tp"), P("tp", None))
ops = {"all_reduce": (fo.matmul_all_reduce, P()),
       "reduce_scatter": (fo.matmul_reduce_scatter, P("tp", None))}
def program(op):
    fn, out_spec = ops[op]
    return jax.jit(jax.shard_map(lambda x, w: fn(x, w, "tp"), mesh=mesh, in_specs=ins,
                                 out_specs=out_spec))

@jax.jit
def rel_err(y, x, w):  # global view: x @ w in float32 is what both ops compute (RS: tiled rows)
    ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
    y = y.astype(jnp.float32)
    return jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref)

make = jax.jit(lambda key: (jax.random.normal(key, (M0, K), jnp.bfloat16),
                            (jax.random.normal(jax.random.fold_in(key, 1), (K, N), jnp.float32)
                             / np.sqrt(K)).astype(jnp.bfloat16)),
               out_shardings=(NamedSharding(mesh, ins[0]), NamedSharding(mesh, ins[1])))
running = {op: program(op) for op in ops}
x, w = make(jax.random.key(0))
for f in running.values():  # communicators made, every program of the loop below compiled
    rel_err(f(x, w), x, w).block_until_ready()
before = max(c["workspace_bytes"] for c in fo.comm.list_communicators())

grow_window, grow_error = [None, None], []
def grow():  # lowers (and compiles) ever larger all-reduces: each grows the workspaces
    grow_window[0] = time.perf_counter()
    try:
        for step in range(1, GROWTHS + 1):
            m = M0 + step * STEP_ROWS
            shapes = (jax.ShapeDtypeStruct((m, K), jnp.bfloat16, sharding=NamedSharding(mesh, ins[0])),
                      jax.ShapeDtypeStruct((K, N), jnp.bfloat16, sharding=NamedSharding(mesh, ins[1])))
            program("all_reduce").lower(*shapes).compile()
            time.sleep(0.05)  # the running thread gets the interpreter between growths
    except Exception as e:  # noqa: BLE001
        grow_error.append(repr(e)[:500])
    grow_window[1] = time.perf_counter()

errors, dispatched = [], []
grower = threading.Thread(target=grow)
t_start = time.perf_counter()
grower.start()
i = 0
while grower.is_alive() or i < 200:
    op = "all_reduce" if i % 2 == 0 else "reduce_scatter"
    xi, wi = make(jax.random.key(i + 1))  # fresh inputs every call
    dispatched.append(time.perf_counter())
    errors.append(rel_err(running[op](xi, wi), xi, wi))
    if i % 16 == 15:
        errors[-1].block_until_ready()  # keep the queue short: calls and growths interleave
    i += 1
    if time.perf_counter() - t_start > 240:
        break
grower.join(timeout=60)
errs = np.array([float(e) for e in errors])
during = sum(grow_window[0] <= t <= grow_window[1] for t in dispatched)
after = max(c["workspace_bytes"] for c in fo.comm.list_communicators())
print("RESULT", dict(calls=len(errs), during=during, max_err=float(np.nanmax(errs)),
                     nan=int(np.isnan(errs).sum()), bad=int((~(errs < 1e-2)).sum()),
                     grow_error=grow_error, grower_alive=grower.is_alive(),
                     before=int(before), after=int(after),
                     want=int((M0 + GROWTHS * STEP_ROWS) * N * 2)))
'''


def _run_script(path, text, timeout):
    """Runs `text` as a child process (our kernels, outputs poisoned); its last RESULT line."""
    path.write_text(text)
    r = subprocess.run([sys.executable, str(path)], cwd=REPO, capture_output=True, text=True,
                       env=repo_env(XLA_PYTHON_CLIENT_PREALLOCATE="false",
                                    JAX_FLASHOVERLAP_FALLBACK="0",
                                    JAX_FLASHOVERLAP_POISON_OUTPUTS="1"),
                       timeout=timeout)
    out = r.stdout + r.stderr
    print(out[-4000:])
    assert r.returncode == 0, out[-6000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out[-6000:]
    return ast.literal_eval(lines[-1][len("RESULT "):])


def test_lowering_on_another_thread_grows_the_workspace_while_calls_run(tmp_path):
    res = _run_script(tmp_path / "threads.py", _SCRIPT, timeout=420)
    assert res["grow_error"] == [] and not res["grower_alive"], res
    assert res["before"] < res["want"] <= res["after"], res  # the growths really happened
    assert res["during"] >= 20, res  # and calls were dispatched while they did
    assert res["nan"] == 0 and res["bad"] == 0 and res["max_err"] < U.TOL, res


_DESTROY_SCRIPT = r'''
import threading, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_flashoverlap as fo

mesh = Mesh(np.array(jax.devices()), ("tp",))
n_dev = len(jax.devices())
M, K, N = 2048, 1024 * n_dev, 4096
ins = (P(None, "tp"), P("tp", None))
def program(m):
    return jax.jit(jax.shard_map(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), mesh=mesh,
                                 in_specs=ins, out_specs=P()))

@jax.jit
def rel_err(y, x, w):
    ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
    return jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)

def make(key, m):
    return (jax.device_put(jax.random.normal(key, (m, K), jnp.bfloat16), NamedSharding(mesh, ins[0])),
            jax.device_put((jax.random.normal(jax.random.fold_in(key, 1), (K, N), jnp.float32)
                            / np.sqrt(K)).astype(jnp.bfloat16), NamedSharding(mesh, ins[1])))

f = program(M)
x, w = make(jax.random.key(0), M)
print("FIRST", float(rel_err(f(x, w), x, w)), flush=True)

stop, results = threading.Event(), []  # (time, "ok", err) or (time, "error", message)
def run():
    i = 0
    while not stop.is_set():
        xi, wi = make(jax.random.key(i + 1), M)
        try:
            results.append((time.perf_counter(), "ok", float(rel_err(f(xi, wi), xi, wi))))
        except Exception as e:  # noqa: BLE001
            results.append((time.perf_counter(), "error", str(e)[:400]))
        i += 1

runner = threading.Thread(target=run)
runner.start()
time.sleep(1.0)
t0 = time.perf_counter()
fo.comm.destroy_communicators()  # while the runner's calls are in flight
t1 = time.perf_counter()
left = fo.comm.list_communicators()
time.sleep(1.0)
stop.set()
runner.join(timeout=120)
oks = [r for r in results if r[1] == "ok"]
errs = [r[2] for r in results if r[1] == "error"]
# A new lowering makes the communicators again.
g = program(M + 512)
x2, w2 = make(jax.random.key(99), M + 512)
print("RESULT", dict(destroy_s=t1 - t0, left=len(left), runner_alive=runner.is_alive(),
                     ok_before=sum(r[0] < t0 for r in oks), ok_after=sum(r[0] > t1 for r in oks),
                     max_err=float(np.nanmax([r[2] for r in oks])),
                     bad=sum(not r[2] < 1e-2 for r in oks), errors=len(errs),
                     unexpected=[e for e in errs if "destroyed" not in e
                                 and "no communicator" not in e][:3],
                     relowered=float(rel_err(g(x2, w2), x2, w2))))
'''


def test_destroying_communicators_while_another_thread_runs_calls(tmp_path):
    """`comm.destroy_communicators()` while another thread runs overlapped calls: it waits
    until no call is in flight and holds new ones off while it frees what they use; calls
    after it refuse (no communicator, or destroyed if the handler found it just before), none
    crashes the process or returns wrong values, and a new lowering makes communicators
    again. Before, destroy freed streams, counters and the communicator objects under a
    running handler."""
    res = _run_script(tmp_path / "destroy.py", _DESTROY_SCRIPT, timeout=300)
    assert res["left"] == 0 and not res["runner_alive"], res
    assert res["ok_before"] >= 5, res  # calls really ran when destroy came
    assert res["errors"] >= 1 and res["unexpected"] == [], res  # later calls refused cleanly
    assert res["bad"] == 0 and res["max_err"] < U.TOL and res["relowered"] < U.TOL, res
