"""Where an overlapped call's time goes, per group (jax_flashoverlap.trace): run one op with
a plan (the default, or forced groups / comm_sms) as isolated calls under the trace, and print
the medians of when the GEMM finished, when each group's rows were ready on the comm stream,
when its NCCL call and its copy finished, next to our GEMM alone and XLA's dot + collective.

  python benchmarks/trace_op.py --collective all_reduce --shape 8192x8192x8192 \
      [--comm-sms 16] [--groups 6] [--calls 20] [--out trace.json]

Needs GPUs and the CUDA extension (the mesh is every GPU, or --world of them).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import types


def main(argv=None) -> int:
  from jax_flashoverlap import bench, bench_problem
  parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
  parser.add_argument("--collective", default="all_reduce",
                      choices=("all_reduce", "reduce_scatter"), help="(default: all_reduce)")
  parser.add_argument("--shape", type=bench._parse_shape, default=(8192, 8192, 8192),
                      help="global MxNxK (default: 8192x8192x8192)")
  parser.add_argument("--world", type=int, default=0,
                      help="GPUs in the mesh (default: 0, every GPU)")
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                      help="(default: bfloat16)")
  parser.add_argument("--comm-sms", type=int, help="SMs left to NCCL (default: the op's own plan)")
  parser.add_argument("--groups", type=int, help="even bands (default: the op's own plan)")
  parser.add_argument("--calls", type=int, default=20,
                      help="isolated calls traced; the medians are printed (default: 20)")
  parser.add_argument("--out", help="write the trace's report as JSON here")
  args = parser.parse_args(argv)
  from jax_flashoverlap import bench_args, plan as plan_lib
  if args.calls < 1:
    parser.error(f"--calls must be >= 1, got {args.calls}")
  # plan.forced()'s bounds, here: past them it raised a traceback after the GPU check
  if args.groups is not None and not 1 <= args.groups <= plan_lib.MAX_GROUPS:
    parser.error(f"--groups must be >= 1 and <= {plan_lib.MAX_GROUPS} (leave it out for the "
                 f"op's own plan), got {args.groups}")
  if args.comm_sms is not None and not 0 <= args.comm_sms <= plan_lib.MAX_COMM_SMS:
    parser.error(f"--comm-sms must be >= 0 and <= {plan_lib.MAX_COMM_SMS}, got {args.comm_sms}")
  bench_args.check_output_paths(parser, args)
  import jax

  import jax_flashoverlap as fo
  from jax_flashoverlap import trace
  if jax.default_backend() != "gpu":
    print("trace_op.py needs GPUs", file=sys.stderr)
    return 2
  args.world = bench.resolve_world(parser, args.world)  # -3 sliced the devices; 20 used 8
  try:
    bench.check_tp_shape(args.shape, args.world, (args.collective,))
  except ValueError as err:
    parser.error(str(err).replace("--shapes", "--shape", 1))
  pb = bench_problem.TpProblem(types.SimpleNamespace(world=args.world, dtype=args.dtype),
                        args.collective, args.shape, jax.random.key(0))
  fn = pb.smap(pb.ours)
  forced = (plan_lib.forced(num_groups=args.groups, comm_sms=args.comm_sms)
            if args.groups or args.comm_sms is not None else contextlib.nullcontext())
  with forced:
    fn(*pb.args).block_until_ready()  # compiles with the plan
    plan = bench_problem.lowered_plan(pb)  # a tuned entry where the op used one
  if not bench.uses_custom_call(fn, pb.args, pb.target):
    print("our custom call is not in the program (the plan fell back to XLA?)", file=sys.stderr)
    return 1
  for _ in range(3):
    fn(*pb.args).block_until_ready()
  medians = bench.traced_calls(fn, pb.args, args.calls)  # {device: per-group medians}
  x0 = jax.device_put(pb.x.addressable_shards[0].data, pb.mesh.devices.flat[0])
  w0 = jax.device_put(pb.w.addressable_shards[0].data, pb.mesh.devices.flat[0])
  gemm = jax.jit(lambda x, w: fo.matmul(x, w, comm_sms=plan.comm_sms))
  timing = bench.time_variants({"gemm_alone": (gemm, (x0, w0)),
                                "xla_dot_collective": (pb.baseline(), pb.args),
                                "ours": (fn, pb.args)}, calls=10, samples=10)
  t = {v: r["median_ms"] for v, r in timing.items()}
  result = {"collective": args.collective, "shape": list(args.shape), "world": pb.world,
            "plan": {"band_rows": list(plan.band_rows), "comm_sms": plan.comm_sms,
                     "predicted_ms": plan.predicted_s * 1e3},
            "times_ms": t, "devices": medians,
            "command": "python benchmarks/trace_op.py " + " ".join(argv or sys.argv[1:]),
            "git_commit": bench.git_commit()}
  print(f"{args.collective} {'x'.join(map(str, args.shape))} on {pb.world} GPUs, comm_sms "
        f"{plan.comm_sms}, {plan.num_groups} groups (predicted {plan.predicted_s * 1e3:.3f} ms)")
  print(f"back to back: our GEMM alone {t['gemm_alone']:.3f} ms, ours {t['ours']:.3f} ms, "
        f"XLA dot + collective {t['xla_dot_collective']:.3f} ms")
  for d, s in result["devices"].items():
    print(f"device {d}, median of {s['calls']} isolated calls:")
    print(trace.medians_table(s))
  if args.out:
    bench.write_json(args.out, result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
