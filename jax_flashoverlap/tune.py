"""`python -m jax_flashoverlap.tune`: measure group plans on this machine's GPUs and save the
best per (collective, shape) as a tuned config (jax_flashoverlap.tuning), which later
lowerings use before the cost model.

Candidates: comm_sms x group counts (0 = the cost model's bands for that comm_sms), each timed
against XLA's dot + collective, interleaved (the bench's method). Where XLA's serial path is
fastest, the entry says overlap=false. Needs GPUs (a 1-D mesh over --world of them).
"""

from __future__ import annotations

import argparse
import re
import sys

from jax_flashoverlap import bench, plan as plan_lib, tuning


def entries_from_sweep(rows, dtype: str) -> list:
  entries = []
  for r in rows:
    world, collective = r["world"], r["collective"]
    m, n, k = r["m"], r["n"], r["k"] // world  # per-device GEMM
    t = r["times_ms"]
    best = r["best"]
    sms, groups = (int(v) for v in re.fullmatch(r"sms(\d+)_g(\d+)", best).groups())
    if groups:
      bands = plan_lib.aligned_even_bands(collective, m, n, world, groups, sms)
    else:
      bands = plan_lib.choose_plan(collective, m, n, k, world, comm_sms=sms).band_rows
    entries.append({
        "collective": collective, "dtype": dtype, "m": m, "n": n, "k": k, "comm_sms": sms,
        "band_rows": list(bands), "overlap": t[best] < t["xla_dot_collective"],
        "measured_ms": t[best], "baseline_ms": t["xla_dot_collective"],
        "source": "python -m jax_flashoverlap.tune"})
  return entries


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_flashoverlap.tune",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", type=bench._parse_shape, nargs="+",
                      default=list(bench.DESIGN_SHAPES), help="global MxNxK shapes")
  parser.add_argument("--collectives", nargs="+", default=["all_reduce", "reduce_scatter"],
                      choices=("all_reduce", "reduce_scatter"))
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
  parser.add_argument("--world", type=int, default=0, help="GPUs in the mesh (0: all)")
  parser.add_argument("--comm-sms", type=int, nargs="+", default=[8, 12, 16])
  parser.add_argument("--groups", type=int, nargs="+", default=[0, 2, 4, 6, 8])
  parser.add_argument("--calls", type=int, default=10)
  parser.add_argument("--samples", type=int, default=10)
  parser.add_argument("--out", help="config file to merge into (default: the user config "
                                    "dir, <gpu>_x<world>.json)")
  args = parser.parse_args(argv)
  import jax
  if jax.default_backend() != "gpu":
    print("jax_flashoverlap.tune: needs GPUs (JAX's backend here is "
          f"{jax.default_backend()!r}); nothing to tune on the reference path", file=sys.stderr)
    return 2
  devices = jax.devices()[: args.world] if args.world else jax.devices()
  args.world = len(devices)
  gpu = devices[0].device_kind
  total = len(args.collectives) * len(args.shapes)
  print(f"tuning {total} problems x {len(args.comm_sms) * len(args.groups)} plans on "
        f"{args.world} x {gpu}", flush=True)
  result = bench.bench_sweep(args)
  entries = entries_from_sweep(result["rows"], args.dtype)
  slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
  out = args.out or tuning.user_config_dir() / f"{slug}_x{args.world}.json"
  path = tuning.write_entries(out, gpu, args.world, entries)
  print(f"wrote {len(entries)} tuned plans to {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
