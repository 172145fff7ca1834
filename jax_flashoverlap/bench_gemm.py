"""`python -m jax_flashoverlap.bench gemm` and `... sweep` (the CLI lives in bench.py): our GEMM
alone against XLA's dot on one GPU, and our overlapped op under forced plans."""

from __future__ import annotations

import time

from jax_flashoverlap import bench, bench_problem, bench_record


def bench_gemm(args) -> dict:
  import jax
  import jax.numpy as jnp

  import jax_flashoverlap as fo
  dtype = jnp.dtype(args.dtype)
  world = args.world
  rows = bench_record.RowLog(args)
  key = jax.random.key(int(time.time()))
  for (m, n, k) in args.shapes:
    key, sub = jax.random.split(key)
    x, w = bench_problem.random_inputs(sub, m, n, k // world, dtype)
    tw = args.transpose_w
    if tw:  # the weight as stored [N, K]; XLA's dot reads it transposed natively
      w = jnp.asarray(w.T)
    xla = jax.jit(lambda x, w: jnp.matmul(x, w.T if tw else w))
    variants = {"xla_dot": (xla, (x, w))}
    ref = xla(x, w)
    ref32 = jnp.matmul(x.astype(jnp.float32), (w.T if tw else w).astype(jnp.float32))
    errors = {}
    errors_f32 = {}
    custom_call = {}
    ours = {f"ours_sms{sms}": jax.jit(lambda x, w, sms=sms: fo.matmul(x, w, comm_sms=sms,
                                                                      transpose_w=tw))
            for sms in args.comm_sms}
    inputs = {name: (x, w) for name in ours}
    if tw:
      sms = args.comm_sms[0]
      # The path before transpose_w: XLA materializes w.T in the program, then our GEMM.
      ours[f"ours_sms{sms}_on_w_T_copy"] = jax.jit(
          lambda x, w, sms=sms: fo.matmul(x, w.T, comm_sms=sms))
      inputs[f"ours_sms{sms}_on_w_T_copy"] = (x, w)
      # The [K, N] kernel on a weight already stored [K, N]: the kernels compared alone.
      ours[f"ours_sms{sms}_kn_kernel"] = jax.jit(lambda x, w, sms=sms: fo.matmul(x, w, comm_sms=sms))
      inputs[f"ours_sms{sms}_kn_kernel"] = (x, jnp.asarray(w.T))
    for name, fn in ours.items():
      out = fn(*inputs[name])
      errors[name] = bench.relative_error(out, ref)
      errors_f32[name] = bench.relative_error(out, ref32)
      custom_call[name] = bench.uses_custom_call(fn, inputs[name], "flashoverlap_gemm")
      variants[name] = (fn, inputs[name])
    bad = bench.failed_values(errors_f32, f"gemm {m}x{n}x{k // world}")
    bench._drop_failed(variants, bad, keep=())
    if not all(custom_call.values()):
      print("WARNING: 'ours' runs XLA's dot, not the signaling GEMM (extension not in use?): "
            f"{fo.info()['paths']['matmul']['why']}", flush=True)
    timing = bench.time_variants(variants, calls=args.calls, samples=args.samples)
    row = {"m": m, "n": n, "k": k // world, "global_k": k, "dtype": str(dtype),
           "transpose_w": tw,
           "times_ms": {v: t["median_ms"] for v, t in timing.items()},
           "rel_error": errors, "rel_error_vs_f32": errors_f32,
           "uses_custom_call": custom_call, "failed_value_check": bad}
    row["ratio_xla_over_ours"] = {v: timing["xla_dot"]["median_ms"] / t["median_ms"]
                                  for v, t in timing.items() if v != "xla_dot"}
    rows.append(row)
    print(_gemm_line(row), flush=True)
  return {"kind": "gemm", "rows": rows}


def _gemm_line(row):
  ratios = " ".join(f"{v}={r:.3f}" for v, r in row["ratio_xla_over_ours"].items())
  errs = bench.worst_error(row["rel_error"].values())
  errs32 = bench.worst_error(row["rel_error_vs_f32"].values())
  return (f"{row['m']}x{row['n']}x{row['k']}: xla {row['times_ms']['xla_dot']:.3f} ms  "
          f"xla/ours {ratios}  max rel err vs XLA {errs:.1e}, vs f32 {errs32:.1e}")



def bench_sweep(args) -> dict:
  """Our op under forced plans (comm_sms x num_groups; 0 groups = cost model) vs XLA."""
  import jax_flashoverlap as fo
  rows = bench_record.RowLog(args)
  for pb in bench_problem.problems(args):
    collective = pb.collective
    baseline = pb.baseline()
    ref32 = pb.reference_f32()
    variants = {"xla_dot_collective": (baseline, pb.args)}
    errors = {}
    for sms in args.comm_sms:
      for groups in args.groups:
        fn = pb.smap(pb.ours)
        name = f"sms{sms}_g{groups}"
        bench.say(f"  [{collective} {pb.m}x{pb.n}x{pb.k}] compiling {name}")
        with fo.plan.forced(num_groups=groups or None, comm_sms=sms):
          errors[name] = bench.relative_error(fn(*pb.args), ref32)  # compiles here
          if not bench.uses_custom_call(fn, pb.args, pb.target):
            raise RuntimeError(f"{name}: our custom call is not in the compiled program: "
                               f"{fo.info()['paths']['matmul_' + collective]['why']}")
        variants[name] = (fn, pb.args)
    bad = bench.failed_values(errors, f"{collective} {pb.m}x{pb.n}x{pb.k}")
    bench._drop_failed(variants, bad, keep=())
    timing = bench.time_variants(variants, calls=args.calls, samples=args.samples)
    t = {v: r["median_ms"] for v, r in timing.items()}
    best = min((v for v in t if v != "xla_dot_collective"), key=t.get)
    row = {"collective": collective, "m": pb.m, "n": pb.n, "k": pb.k, "world": pb.world,
           "times_ms": t, "rel_error_vs_f32": errors, "failed_value_check": bad, "best": best,
           "best_speedup": t["xla_dot_collective"] / t[best]}
    rows.append(row)
    bench.say(f"{collective:14s} {pb.m}x{pb.n}x{pb.k}: xla {t['xla_dot_collective']:.3f} ms | " +
          " ".join(f"{v}={t[v]:.3f}" for v in t if v != "xla_dot_collective") +
          f" | best {best} x{row['best_speedup']:.3f} | max err vs f32 "
          f"{bench.worst_error(errors.values()):.1e}")
  return {"kind": "sweep", "rows": rows}
