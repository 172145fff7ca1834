"""Run one call of an op in a child process and, if it does not finish in time, show where it
blocks: GPU utilisation (busy = device-side wait, idle = host-side), every thread's kernel wait
channel and, where gdb exists, native backtraces; the child's Python stacks (faulthandler) and
NCCL's INIT/P2P log. For debugging first-call hangs on the GPU machine (#9).

  python scripts/diagnose_hang.py {a2a,a2a_cols,ag,ar} [--wait S]
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

CHILD = r'''
import faulthandler, sys, time
faulthandler.dump_traceback_later(%(dump)r, exit=False)
import numpy as np, jax, jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo
op = sys.argv[1]
mesh = Mesh(np.array(jax.devices()), ("tp",))
n = len(jax.devices())
M, N, K = 4096, 8192, 4096
if op == "a2a":
    f = lambda x, w: fo.matmul_all_to_all(x, w, "tp", split_axis=0, concat_axis=0)
    ins, out, xs, ws = (P("tp", None), P()), P("tp", None), (M, K), (K, N)
elif op == "a2a_cols":
    f = lambda x, w: fo.matmul_all_to_all(x, w, "tp", split_axis=1, concat_axis=0)
    ins, out, xs, ws = (P("tp", None), P()), P("tp", None), (M, K), (K, N)
elif op == "ag":
    f = lambda x, w: fo.all_gather_matmul(x, w, "tp")
    ins, out, xs, ws = (P("tp", None), P(None, "tp")), P(None, "tp"), (M, K), (K, N)
else:
    f = lambda x, w: fo.matmul_all_reduce(x, w, "tp")
    ins, out, xs, ws = (P(None, "tp"), P("tp", None)), P(), (M, K), (K, N)
g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=ins, out_specs=out))
x = jax.random.normal(jax.random.key(0), xs, jnp.bfloat16)
w = jax.random.normal(jax.random.key(1), ws, jnp.bfloat16)
t0 = time.time()
text = g.lower(x, w).compile().as_text()
print("compiled in %%.1f s; custom calls:" %% (time.time() - t0),
      sorted({l.split('custom_call_target="')[1].split('"')[0] for l in text.splitlines()
              if 'custom_call_target="flashoverlap' in l}), flush=True)
y = g(x, w)
print("dispatched", flush=True)
y.block_until_ready()
print("first call done in %%.1f s" %% (time.time() - t0), flush=True)
for _ in range(3):
    g(x, w).block_until_ready()
print("4 calls done", flush=True)
'''


def _threads(pid: int) -> None:
    task = f"/proc/{pid}/task"
    for tid in sorted(os.listdir(task), key=int):
        try:
            name = open(f"{task}/{tid}/comm").read().strip()
            wchan = open(f"{task}/{tid}/wchan").read().strip()
        except OSError:
            continue
        print(f"  thread {tid:>7} {name:<20} wchan={wchan}")


def _wait_seconds(text: str) -> float:
    """--wait: finite and > 5 s (the child dumps its stacks 5 s before the deadline)."""
    import math
    value = float(text)
    if not math.isfinite(value) or value <= 5:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 5, got {text!r}")
    return value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("op", choices=("a2a", "a2a_cols", "ag", "ar"))
    p.add_argument("--wait", type=_wait_seconds, default=45,
                   help="seconds before the child counts as hung (default 45)")
    args = p.parse_args()
    env = dict(os.environ, NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "INFO"),
               NCCL_DEBUG_SUBSYS=os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,P2P"),
               JAX_FLASHOVERLAP_FALLBACK="0",
               PYTHONUNBUFFERED="1")
    child = subprocess.Popen([sys.executable, "-c", CHILD % {"dump": args.wait - 5}, args.op],
                             env=env)
    try:  # the child never outlives this script, whatever fails below
        t0 = time.time()
        while child.poll() is None and time.time() - t0 < args.wait:
            time.sleep(0.5)
        if child.poll() is not None:
            print(f"[diagnose] {args.op}: child exited {child.returncode} after "
                  f"{time.time() - t0:.1f} s")
            return child.returncode
        print(f"[diagnose] {args.op}: still running after {args.wait:.0f} s", flush=True)
        if shutil.which("nvidia-smi"):
            subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                            "--format=csv"], timeout=60)
        else:
            print("[diagnose] no nvidia-smi on this machine: GPU utilisation not shown")
        _threads(child.pid)
        if shutil.which("gdb"):
            subprocess.run(["gdb", "-p", str(child.pid), "-batch", "-ex", "thread apply all bt 25"],
                           timeout=60)
        else:
            print("[diagnose] no gdb on this machine")
        sys.stdout.flush()
        return 124
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()

if __name__ == "__main__":
    sys.exit(main())
