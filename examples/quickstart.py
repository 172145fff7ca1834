"""Quickstart: replace `psum(x @ w)` in a shard_map program with jax_flashoverlap.

Runs anywhere: on a GPU machine the real overlapped kernels run over all local GPUs; on a CPU
machine it simulates 8 devices and runs the reference path. Prints the path taken, the
relative error against XLA's own `psum(x @ w)` and the time of both.

    python examples/quickstart.py [--m 4096 --n 8192 --k 8192 --iters 20]
"""

import argparse
import time

import _devices  # examples/_devices.py (this script's folder is on sys.path)

_devices.simulate_cpu_devices_without_gpu()

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flashoverlap as fo


def timed(fn, *args, iters):
  out = fn(*args)
  out.block_until_ready()
  start = time.perf_counter()
  for _ in range(iters):
    out = fn(*args)
  out.block_until_ready()
  return out, (time.perf_counter() - start) / iters * 1e3


def path_taken(custom_call, args, n_dev):
  """What this program compiled to, and why: the extension's general status is not enough
  (one device, or a shape the cost model keeps on XLA's path, has no custom call)."""
  if custom_call:
    return "our custom call flashoverlap_gemm_all_reduce (signaling GEMM + NCCL, overlapped)"
  status = fo.info()["paths"]["matmul_all_reduce"]
  if not status["cuda_custom_call"]:
    return f"XLA's dot + psum: {status['why']}"
  plan = fo.plan.choose_plan("all_reduce", args.m, args.n, args.k // n_dev, n_dev,
                             gpu=jax.devices()[0].device_kind)
  reason = ("one device: nothing to communicate" if n_dev == 1 else
            f"the plan predicts no gain over XLA ({plan.predicted_s * 1e3:.3f} ms vs "
            f"{plan.baseline_s * 1e3:.3f} ms)")
  return f"XLA's dot + psum ({reason})"


def main():
  gpu = jax.default_backend() == "gpu"
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--m", type=int, default=4096 if gpu else 256)
  parser.add_argument("--n", type=int, default=8192 if gpu else 512)
  parser.add_argument("--k", type=int, default=8192 if gpu else 1024, help="global K")
  parser.add_argument("--iters", type=int, default=20 if gpu else 3)
  args = parser.parse_args()

  devices = jax.devices()
  mesh = Mesh(np.array(devices), ("tp",))
  n_dev = len(devices)
  print(f"backend={jax.default_backend()} devices={n_dev}")

  kx, kw = jax.random.split(jax.random.key(int(time.time())))
  x = jax.random.normal(kx, (args.m, args.k), jnp.float32).astype(jnp.bfloat16)
  w = (jax.random.normal(kw, (args.k, args.n), jnp.float32) / np.sqrt(args.k)).astype(
      jnp.bfloat16)
  x = jax.device_put(x, NamedSharding(mesh, P(None, "tp")))  # row-parallel: K is sharded
  w = jax.device_put(w, NamedSharding(mesh, P("tp", None)))

  specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P(None, None))
  xla = jax.jit(jax.shard_map(lambda x, w: lax.psum(x @ w, "tp"), **specs))
  ours = jax.jit(jax.shard_map(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), **specs))

  custom_call = "flashoverlap_gemm_all_reduce" in ours.lower(x, w).compile().as_text()
  print(f"path: {path_taken(custom_call, args, n_dev)}")

  ref, t_xla = timed(xla, x, w, iters=args.iters)
  out, t_ours = timed(ours, x, w, iters=args.iters)
  ref32 = ref.astype(jnp.float32)
  err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref32) / jnp.linalg.norm(ref32))
  print(f"M={args.m} N={args.n} K={args.k} dtype=bfloat16")
  print(f"relative error vs XLA psum(x @ w): {err:.2e}")
  note = ("" if custom_call else "  (no custom call here: both run XLA's dot + psum, so the "
          "difference is noise, not a speedup)")
  print(f"XLA dot+psum: {t_xla:.3f} ms   jax_flashoverlap: {t_ours:.3f} ms   "
        f"ratio {t_xla / t_ours:.2f}x{note}")
  if not err < 1e-2:
    raise SystemExit(f"FAILED: relative error {err:.2e} >= 1e-2")


if __name__ == "__main__":
  main()
