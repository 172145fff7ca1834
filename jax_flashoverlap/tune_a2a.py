"""Tuning of the all-to-all and all-gather ops (issue #9), for `python -m jax_flashoverlap.tune
--ops ...`: their plan spaces are small (comm_sms x group counts, comm_sms x chunks), so every
plan of the grid is compiled, checked against float32 and timed against XLA's composition and
the cost model's default; the fastest becomes a config entry (jax_flashoverlap.tuning) with
the cost model's prediction for it (plan_a2a's guessed bandwidths: its error is reported).
Layouts are bench_a2a's (all_to_all: row blocks; all_to_all_ulysses: column blocks; both
concatenated on rows; all_gather: x's rows gathered, w's columns sharded).
"""

from __future__ import annotations

import dataclasses

from jax_flashoverlap import bench, bench_a2a, bench_problem, plan_a2a

A2A_GROUPS = (1, 2, 4, 8)
COLLECTIVE = {"all_gather": "all_gather", "all_to_all": "all_to_all",
              "all_to_all_ulysses": "all_to_all"}


CE_COMM_SMS = (1, 2, 4)  # the collective gather runs on copy engines: few SMs left free


@dataclasses.dataclass(frozen=True)
class GridPlan:
  name: str
  comm_sms: int
  groups: int            # all-to-all: even bands; all-gather: chunks
  gather: str = "p2p"    # all-gather: "p2p" | "collective" (plan_a2a.AllGatherPlan)


def local_problem(op: str, m: int, n: int, k: int, world: int) -> tuple:
  """The per-device GEMM (rows of x, columns of w, k) the op's plan is keyed by."""
  if op == "all_gather":
    return m // world, n // world, k
  return m // world, n, k


def unsupported(op: str, m: int, n: int, k: int, world: int) -> str | None:
  """Why our kernels cannot take this op and global shape (every plan would lower to XLA's
  composition: the tuner stopped at 'our custom call is not in the compiled program'), else
  None. E.g. the Ulysses all-to-all's column blocks need N divisible by 8 * world."""
  rows, n_local, k_local = local_problem(op, m, n, k, world)
  if op == "all_gather":
    why = plan_a2a.all_gather_supported(rows, n_local, world, k=k_local)
  else:
    why = plan_a2a.a2a_supported(rows, n_local, world, 1 if op == "all_to_all_ulysses" else 0,
                                 k_local)
  return None if why is None else f"--shapes {m}x{n}x{k}: {op} on {world} devices: {why}"


def grid(op: str, comm_sms_list, rows: int, world: int) -> list:
  plans = []
  for sms in comm_sms_list:
    if op == "all_gather":
      for chunks in plan_a2a.DEFAULT_PROFILE.chunk_candidates:
        if rows % chunks == 0 and world * chunks <= plan_a2a.MAX_GROUPS:
          plans.append(GridPlan(f"sms{sms}_chunks{chunks}", sms, chunks))
    else:
      for groups in A2A_GROUPS:
        plans.append(GridPlan(f"sms{sms}_g{groups}", sms, groups))
  if op == "all_gather":  # one ncclAllGather on copy engines (CTA policy ZERO)
    plans += [GridPlan(f"sms{sms}_collective", sms, 1, "collective") for sms in CE_COMM_SMS]
  return plans


def _forced(op, p: GridPlan):
  if op == "all_gather":
    return plan_a2a.forced(comm_sms=p.comm_sms, chunks=p.groups, gather=p.gather)
  return plan_a2a.forced(num_groups=p.groups, comm_sms=p.comm_sms)


def _chosen_plan(op, p, rows, n, k, world, itemsize):
  """The plan the op lowers with under `p` (what the entry records)."""
  with _forced(op, p):
    if op == "all_gather":
      return plan_a2a.choose_all_gather_plan(rows, n, k, world, itemsize)
    split = 1 if op == "all_to_all_ulysses" else 0
    return plan_a2a.choose_a2a_plan(rows, n, k, world, split, 0, itemsize)


def entry_for(op, dtype, rows, n, k, world, plan, measured_ms, baseline_ms) -> dict:
  """Config entry: `plan` (AllToAllPlan / AllGatherPlan, measured at measured_ms) or, when
  None, XLA's composition."""
  entry = {"collective": COLLECTIVE[op], "dtype": dtype, "m": rows, "n": n, "k": k,
           "baseline_ms": baseline_ms, "source": "python -m jax_flashoverlap.tune --ops"}
  if op != "all_gather":
    entry.update(split_axis=1 if op == "all_to_all_ulysses" else 0, concat_axis=0)
  if plan is None:
    entry.update(comm_sms=0, overlap=False, measured_ms=baseline_ms)
    if op == "all_gather":
      entry.update(chunks=1, gather="p2p")
    else:
      entry["band_rows"] = [0, plan_a2a.a2a_shape(rows, n, world, entry["split_axis"])[1]]
    return entry
  entry.update(comm_sms=plan.comm_sms, overlap=True, measured_ms=measured_ms,
               predicted_ms=plan.predicted_s * 1e3,
               model_error=plan.predicted_s * 1e3 / measured_ms - 1.0)
  if op == "all_gather":
    entry.update(chunks=plan.chunks, gather=plan.gather)
  else:
    entry["band_rows"] = list(plan.band_rows)
  return entry


def tune_op(op: str, shape, mesh, args, progress, key) -> tuple:
  """(config entry, report row) of one op and global shape."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding

  m, n, k = shape
  world = mesh.devices.size
  bench_a2a.check_shape(op, m, n, world)
  dtype = jnp.dtype(args.dtype)
  rows, n_local, k_local = local_problem(op, m, n, k, world)
  label = f"{op} {m}x{n}x{k}"
  ins, out, _, _, _, base_fn, base, _, smap = bench_a2a._programs(op, mesh)
  gen = jax.jit(lambda key: bench_problem.random_inputs(key, m, n, k, dtype),
                out_shardings=(NamedSharding(mesh, ins[0]), NamedSharding(mesh, ins[1])))
  x, w = gen(key)
  f32 = smap(lambda a, b: base_fn(a.astype(jnp.float32), b.astype(jnp.float32)), ins, out)
  ref32 = f32(x, w)
  plans = grid(op, args.comm_sms, rows, world)
  progress.show(f"{label}: compiling {len(plans)} plans")
  variants = {"xla_composition": (base, (x, w))}
  errors, chosen = {}, {}
  for p in plans:
    fn = smap(bench_a2a.ours_fn(op), ins, out)
    with _forced(op, p):
      errors[p.name] = bench.relative_error(fn(x, w), ref32)  # compiles here
      if not bench.uses_custom_call(fn, (x, w), bench_a2a.TARGETS[op]):
        raise RuntimeError(f"{label} {p.name}: our custom call is not in the compiled program")
    chosen[p.name] = _chosen_plan(op, p, rows, n_local, k_local, world, dtype.itemsize)
    variants[p.name] = (fn, (x, w))
  default_fn = smap(bench_a2a.ours_fn(op), ins, out)
  with bench.bench_variants.model_plans_only():  # as tune.py: the model's, not a config's
    default_fn(x, w)  # compiles here (a re-tune would otherwise time its earlier entry)
  variants["default"] = (default_fn, (x, w))
  t = {v: r["median_ms"] for v, r in
       bench.time_variants(variants, calls=args.calls, samples=args.samples).items()}
  progress.step(f"{label}: timed")
  from jax_flashoverlap import tune
  tune.check_values(label, errors, args.max_error)
  best = min(plans, key=lambda p: t[p.name])
  won = t[best.name] < t["xla_composition"]
  entry = entry_for(op, dtype.name, rows, n_local, k_local, world,
                    chosen[best.name] if won else None, t[best.name],
                    t["xla_composition"])
  row = {"op": op, "m": m, "n": n, "k": k, "world": world, "times_ms": t,
         "rel_error_vs_f32": errors, "entry": entry,
         "predicted_ms": {name: p.predicted_s * 1e3 for name, p in chosen.items()}}
  progress.say(f"{label}: xla {t['xla_composition']:.3f} ms, default {t['default']:.3f} ms, "
               + (f"tuned {t[best.name]:.3f} ms ({best.name}; predicted "
                  f"{entry['predicted_ms']:.3f} ms, error {entry['model_error']:+.1%})" if won
                  else "tuned: XLA's composition (no plan was faster)"))
  return entry, row
