"""`python -m jax_flashoverlap.bench a2a`: the #9 ops against XLA, timed like `overlap`.

Global shapes M x N x K on a 1-D 'tp' mesh of n devices:

  all_gather          x [M, K] rows sharded, w [K, N] columns sharded: all_gather(x) @ w_local
                      (the sequence-parallel column layer; per device [M, K] @ [K, N/n])
  all_to_all          x [M, K] rows sharded, w [K, N] replicated: all_to_all(x_local @ w),
                      split and concat on rows (per device [M/n, K] @ [K, N])
  all_to_all_ulysses  the same product, split on columns, concat on rows (Ulysses heads)

Variants: XLA dot alone, XLA collective alone, XLA's composition (the baseline), for the
all-gather XLA's windowed-einsum (collective matmul) flags on the global-view program (GPU
only, own process), ours (the default plan: where the cost model predicts no gain, "ours" is XLA's composition and the row
says so).
"""

from __future__ import annotations

OPS = ("all_gather", "all_to_all", "all_to_all_ulysses")
TARGETS = {"all_gather": "flashoverlap_all_gather_gemm",
           "all_to_all": "flashoverlap_gemm_all_to_all",
           "all_to_all_ulysses": "flashoverlap_gemm_all_to_all"}


def ours_fn(op):
  """Our op as a per-device function of (x, w) for shard_map (bench_a2a's layouts)."""
  import jax_flashoverlap as fo
  if op == "all_gather":
    return lambda x, w: fo.all_gather_matmul(x, w, "tp")
  split = 1 if op == "all_to_all_ulysses" else 0
  return lambda x, w: fo.matmul_all_to_all(x, w, "tp", split_axis=split, concat_axis=0)


def _programs(op, mesh):
  """(in_specs, out_spec, dot-only program, its x spec, collective fn, baseline fn (per
  device, for shard_map), baseline program, our program, the shard_map+jit helper)."""
  import jax
  from jax import lax
  from jax.sharding import PartitionSpec as P

  if op == "all_gather":
    ins, out = (P("tp", None), P(None, "tp")), P(None, "tp")
    coll = lambda x: lax.all_gather(x, "tp", axis=0, tiled=True)
    base = lambda x, w: coll(x) @ w
    dot_x_spec = P(None, None)  # the gathered x, already everywhere
  else:
    split = 1 if op == "all_to_all_ulysses" else 0
    ins, out = (P("tp", None), P(None, None)), P("tp", None)
    coll = lambda y: lax.all_to_all(y, "tp", split, 0, tiled=True)
    base = lambda x, w: coll(x @ w)
    dot_x_spec = P("tp", None)
  smap = lambda f, i, o: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o))
  dot = smap(lambda x, w: x @ w, (dot_x_spec, ins[1]), P("tp", None))
  return (ins, out, dot, dot_x_spec, coll, base, smap(base, ins, out),
          smap(ours_fn(op), ins, out), smap)


def check_shape(op, m, n, world, k=None) -> None:
  """The global shape splits as the op needs over `world` devices, and (k given) the per-device
  GEMM's K and N are multiples of 8 (else a clear error)."""
  need = {"all_gather": (("M", m, world), ("N", n, world)),
          "all_to_all": (("M", m, world * world),),
          "all_to_all_ulysses": (("M", m, world), ("N", n, world))}[op]
  for name, size, by in need:
    if size % by:
      raise ValueError(f"bench a2a --shapes: {op} on {world} devices needs {name} divisible by "
                       f"{by}, got {name}={size}")
  n_local = n // world if op == "all_gather" else n  # w's columns are sharded there
  for name, size in (("K", k), ("N per device" if op == "all_gather" else "N", n_local)):
    if size is not None and size % 8:
      raise ValueError(f"bench a2a --shapes: {op} needs {name} to be a multiple of 8, got "
                       f"{size}")


def bench_a2a(args) -> dict:
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from jax_flashoverlap import bench, bench_problem, bench_record, bench_targets, bench_variants
  devices = jax.devices()[: args.world] if args.world else jax.devices()
  mesh = Mesh(np.array(devices), ("tp",))
  world = len(devices)
  dtype = jnp.dtype(args.dtype)
  key = jax.random.key(int(time.time()))
  rows = bench_record.RowLog(args)
  bench.warn_if_no_gpu("the GPU-only xla_windowed variant is left out")
  for op in args.ops:
    for m, n, k in args.shapes:
      check_shape(op, m, n, world)
      key, sub = jax.random.split(key)
      ins, out, dot, dot_x_spec, coll, base_fn, base, ours, smap = _programs(op, mesh)
      shard = lambda spec: NamedSharding(mesh, spec)
      gen = jax.jit(lambda key: bench_problem.random_inputs(key, m, n, k, dtype),
                    out_shardings=(shard(ins[0]), shard(ins[1])))
      x, w = gen(sub)
      x_dot = jax.jit(lambda a: a, out_shardings=shard(dot_x_spec))(x)
      y = dot(x_dot, w)  # the product the collective moves (all-to-all), or x (all-gather)
      coll_in, coll_spec = ((x, ins[0]) if op == "all_gather" else (y, P("tp", None)))
      # Timing only: each device's result stacked (an all-gather's is typed device-varying).
      coll_only = smap(coll, (coll_spec,), P("tp", None))
      f32 = smap(lambda a, b: base_fn(a.astype(jnp.float32), b.astype(jnp.float32)), ins, out)
      err = bench.relative_error(ours(x, w), base(x, w))
      err32 = bench.relative_error(ours(x, w), f32(x, w))
      custom_call = bench.uses_custom_call(ours, (x, w), TARGETS[op])
      bad = bench.failed_values({"ours": err32}, f"{op} {m}x{n}x{k}")  # timed, flagged
      timing = bench.time_variants(
          {"xla_dot": (dot, (x_dot, w)), "xla_collective": (coll_only, (coll_in,)),
           "xla_composition": (base, (x, w)), "ours": (ours, (x, w))},
          calls=args.calls, samples=args.samples)
      t = {v: r["median_ms"] for v, r in timing.items()}
      windowed, failures = None, {}
      if op == "all_gather" and jax.process_count() == 1:  # XLA's collective matmul (GPU only)
        windowed = bench.windowed_or_failure(
            t, failures, lambda: bench_variants.xla_windowed_for(
                "all_gather", m, n, k, world, dtype, args.calls, args.samples),
            f"all_gather {m}x{n}x{k}")
      ideal = max(t["xla_dot"], t["xla_collective"])
      denom = t["xla_composition"] - ideal
      row = {"op": op, "m": m, "n": n, "k": k, "world": world, "dtype": str(dtype),
             "times_ms": t, "speedup": t["xla_composition"] / t["ours"],
             "overlap_efficiency": ((t["xla_composition"] - t["ours"]) / denom if denom > 0
                                    else float("nan")),
             "rel_error": err, "rel_error_vs_f32": err32, "uses_custom_call": custom_call,
             "failed_value_check": bad, "variant_failures": failures,
             "xla_windowed": windowed}
      if "xla_windowed" in t:
        row["windowed_speedup"] = t["xla_composition"] / t["xla_windowed"]
      row.update(bench_targets.evaluate_a2a_row(row))
      rows.append(row)
      bench.say(f"{op:18s} {m}x{n}x{k}: dot {t['xla_dot']:.3f} coll {t['xla_collective']:.3f} "
                f"xla {t['xla_composition']:.3f} ours {t['ours']:.3f} ms  speedup "
                f"{row['speedup']:.3f}  E {row['overlap_efficiency']:.2f}  err {err:.1e} "
                f"(f32 {err32:.1e})" + ("" if custom_call else "  (ours = XLA's composition)"))
  targets = bench_targets.summary(rows, bench_targets.A2A_TARGETS)
  bench.say_targets(targets, "#9")
  return {"kind": "a2a", "rows": rows, "targets": targets}


def add_arguments(p) -> None:
  p.add_argument("--world", type=int, default=0, help="GPUs in the mesh (0: all)")
  p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS,
                 help="the ops measured at each shape (default: all of them)")
