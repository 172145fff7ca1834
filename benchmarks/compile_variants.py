"""What XLA compiles for the bench's baselines across 2 ranks, without 2 GPUs.

Two processes share one GPU (jax.distributed, each with the same local device): XLA compiles
each rank's program as on 2 GPUs, and nothing is run that needs NCCL (only the inputs'
generation, which has no collective). For each collective it prints, in the compiled entry
computation's schedule order, the dots and the collectives' start / done, for:

  baseline         XLA's dot + collective
  two_chunk        bench_variants.two_chunk (chunk 2's collective depends on chunk 1's result)
  two_chunk_plain  the two halves with independent collectives (the bench before 2a7defe)
  global_view      jit(x @ w) on the global-view shardings (the xla_windowed variant's program;
                   run with --windowed to add XLA's windowed-einsum flags), and whether XLA
                   built a windowed loop (bench_variants.has_windowed_loop)

  python benchmarks/compile_variants.py [--windowed] [--m 8192 --n 8192 --k 8192] [--json F]
Needs no GPU on CPU either (2 CPU processes): then the programs are XLA:CPU's.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

_OPCODE = re.compile(r"\s([a-z][a-z0-9_\-]*)\(")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_COLLECTIVE = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute")
_GEMM = ("gemm", "dot", "matmul", "cublas")


def schedule(hlo: str) -> list:
  """The entry computation's GEMMs and collectives as "opcode:name" in schedule order (XLA
  prints a scheduled module in order): dots, cuBLAS custom calls, fusions named after a GEMM,
  collectives and their async start / done (a fusion counts as a GEMM when its name or its
  op_name metadata says dot_general)."""
  lines, inside = [], False
  for line in hlo.splitlines():
    if line.startswith("ENTRY"):
      inside = True
      continue
    if inside and line.startswith("}"):
      break
    if not inside or " = " not in line:
      continue
    lhs, rhs = line.split(" = ", 1)
    name = lhs.replace("ROOT", "").strip().lstrip("%")
    found = _OPCODE.search(" " + rhs)
    if found is None:
      continue
    op = found.group(1)
    if op == "custom-call":
      target = _TARGET.search(rhs)
      op = target.group(1) if target else op
    collective = any(c in op for c in _COLLECTIVE) or (
        op in ("async-start", "async-done") and any(c in name for c in _COLLECTIVE))
    gemm = op == "dot" or any(g in op.lower() for g in _GEMM) or (
        op == "fusion" and (any(g in name for g in _GEMM) or "/dot_general" in rhs))
    if collective or gemm:
      lines.append(f"{op}:{name}")
  return lines


def _programs(collective: str, m: int, n: int, k: int):
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from jax_flashoverlap import bench_problem, bench_variants

  class Args:
    world, dtype = 2, "bfloat16"
  pb = bench_problem.TpProblem(Args, collective, (m, n, k), jax.random.key(0))

  def plain_halves():
    if collective == "all_reduce":
      return pb.smap(lambda x, w: jnp.concatenate(
          [pb.coll(x[: x.shape[0] // 2] @ w), pb.coll(x[x.shape[0] // 2:] @ w)], axis=0))
    return pb.smap(lambda x, w: jnp.concatenate(
        [pb.coll(x @ w[:, : w.shape[1] // 2]), pb.coll(x @ w[:, w.shape[1] // 2:])], axis=1))

  mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
  out = P("tp", None) if collective == "reduce_scatter" else P()
  global_view = jax.jit(jnp.matmul, out_shardings=NamedSharding(mesh, out))
  return pb.args, {"baseline": pb.baseline(), "two_chunk": bench_variants.two_chunk(pb),
                   "two_chunk_plain": plain_halves(), "global_view": global_view}


def child(args) -> None:
  """One of the two processes (started by jax_flashoverlap.launch)."""
  import jax

  from jax_flashoverlap import bench_variants, distributed
  distributed.initialize()  # from the launcher's environment
  from jax_flashoverlap import bench
  result = {"backend": jax.default_backend(), "windowed_flags": args.windowed, "programs": {},
            "git_commit": bench.git_commit()}
  for collective in ("all_reduce", "reduce_scatter"):
    inputs, programs = _programs(collective, args.m, args.n, args.k)
    for name, fn in programs.items():
      hlo = fn.lower(*inputs).compile().as_text()
      result["programs"][f"{collective}/{name}"] = {
          "schedule": schedule(hlo), "windowed_loop": bench_variants.has_windowed_loop(hlo)}
  if jax.process_index() == 0:
    if args.json:
      from jax_flashoverlap import bench_record
      bench_record.write_json(args.json, result)
    for key, value in result["programs"].items():
      print(f"{key} (windowed loop: {value['windowed_loop']}):\n  " + " ".join(value["schedule"]))
  jax.distributed.shutdown()


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--m", type=int, default=8192, help="global M (default: 8192)")
  parser.add_argument("--n", type=int, default=8192, help="global N (default: 8192)")
  parser.add_argument("--k", type=int, default=8192, help="global K (default: 8192)")
  parser.add_argument("--windowed", action="store_true", help="add XLA's windowed-einsum flags")
  parser.add_argument("--json", help="write each program's schedule as JSON here")
  args = parser.parse_args()
  from jax_flashoverlap import bench_args, bench_variants, distributed, launch
  # Checked here, before two processes start (a bad one was a child's traceback after them).
  # Only XLA's programs are compiled: M (reduce-scattered) and K (split) over the 2 ranks.
  for name, even in (("m", True), ("n", False), ("k", True)):
    value = getattr(args, name)
    if value < 1 or (even and value % 2):
      parser.error(f"--{name} must be a positive " + ("even number (split over the 2 "
                   "processes)" if even else "number") + f", got {value}")
  if args.json:
    bench_args.check_writable(parser, "--json", os.path.realpath(args.json))
  if os.environ.get(distributed.PROCESS_ID_ENV) is not None:
    child(args)
    return 0
  gpus, _ = launch.visible_gpus()
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # two processes on one GPU
  if not gpus:
    os.environ.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  if args.windowed:
    flags = os.environ.get("XLA_FLAGS", "") + " " + bench_variants.WINDOWED_FLAGS
    os.environ["XLA_FLAGS"] = flags.strip()
  # Both processes on the first GPU (one each), or on the CPU.
  return launch.launch(2, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], 600,
                       gpus_per_process=1 if gpus else 0, gpus=[gpus[0]] * 2 if gpus else None)


if __name__ == "__main__":
  sys.exit(main())
