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
_devices.one_process_only()

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flashoverlap as fo
from _path import program_path, timing_note, uses_custom_call


def timed(fn, *args, iters):
  out = fn(*args)
  out.block_until_ready()
  start = time.perf_counter()
  for _ in range(iters):
    out = fn(*args)
  out.block_until_ready()
  return out, (time.perf_counter() - start) / iters * 1e3


def main():
  gpu = jax.default_backend() == "gpu"
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--m", type=int, default=4096 if gpu else 256,
                      help="rows of x and y (default: 4096 on GPUs, 256 on CPU)")
  parser.add_argument("--n", type=int, default=8192 if gpu else 512,
                      help="columns of w and y (default: 8192 on GPUs, 512 on CPU)")
  parser.add_argument("--k", type=int, default=None,
                      help="global K (default: 8192 on GPUs, 1024 on CPU, rounded up to split "
                      "into multiples of 8 over the devices)")
  parser.add_argument("--iters", type=int, default=20 if gpu else 3,
                      help="timed calls per program (default: 20 on GPUs, 3 on CPU)")
  args = parser.parse_args()

  devices = jax.devices()
  mesh = Mesh(np.array(devices), ("tp",))
  n_dev = len(devices)
  if args.k is None:
    args.k = _devices.round_up(8192 if gpu else 1024, 8 * n_dev)
  if min(args.m, args.n, args.k, args.iters) < 1:
    parser.error("--m, --n, --k and --iters must be at least 1")
  if args.n % 8 or args.k % n_dev or (args.k // n_dev) % 8:
    parser.error(f"--n must be a multiple of 8 and --k split over the {n_dev} devices a "
                 f"multiple of 8 per device (n={args.n}, k={args.k})")
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

  compiled = ours.lower(x, w).compile().as_text()
  custom_call = uses_custom_call(compiled, "all_reduce")
  print(f"path: {program_path(compiled, 'all_reduce', args.m, args.n, args.k // n_dev, n_dev)}")

  ref, t_xla = timed(xla, x, w, iters=args.iters)
  out, t_ours = timed(ours, x, w, iters=args.iters)
  ref32 = ref.astype(jnp.float32)
  err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref32) / jnp.linalg.norm(ref32))
  print(f"M={args.m} N={args.n} K={args.k} dtype=bfloat16")
  print(f"relative error vs XLA psum(x @ w): {err:.2e}")
  print(f"XLA dot+psum: {t_xla:.3f} ms   jax_flashoverlap: {t_ours:.3f} ms   "
        f"ratio {t_xla / t_ours:.2f}x{timing_note(custom_call)}")
  if not err < 1e-2:
    raise SystemExit(f"FAILED: relative error {err:.2e} >= 1e-2")


if __name__ == "__main__":
  main()
