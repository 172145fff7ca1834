"""`python -m jax_flashoverlap.tune`: measure this machine, search group plans, save the best.

Per problem (collective, global shape) on a 1-D mesh over --world GPUs:

  1. calibrate: our GEMM alone at each --comm-sms (its wave time; each value raised to the
     most SMs that cost the GEMM no extra wave), and our capped collective
     alone at several group counts (latency and bandwidth per group; tune_model.CommCurve);
  2. search: every candidate plan predicted with those measurements (dynamic programming,
     even bands, every composition for small problems; tune_model.candidates);
  3. measure: the --top best predicted (at least the best of every comm_sms), the cost model's
     default plan and XLA's dot + collective, interleaved, each checked against float32 first;
  4. keep the fastest: a config entry (jax_flashoverlap.tuning) with its measured and
     predicted time, or overlap=false where XLA's serial path was fastest. With --peer (world
     size 2 to 8, one process) the peer-store transport is timed in step 3 too (experimental;
     plan_peer.py) and kept, "transport": "peer", where it beats every NCCL plan and XLA.

The config goes to the user config dir (<gpu>_x<world>.json) or --out, each problem's entry as
soon as it is tuned (a later failure keeps it); --report writes every measurement and
candidate as JSON, rewritten after each problem ("complete": true once all are). Needs GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import pathlib
import re
import sys
import time
import types

from jax_flashoverlap import (_ext, bench, bench_a2a, bench_args, bench_problem, plan as plan_lib,
                              tile_schedule, tune_a2a, tune_model, tuning)

CALIBRATION_GROUPS = (1, 2, 4, 8)
# The op itself with even bands, few and many groups: fits the GEMM's slowdown beside NCCL and
# what each group costs (tune_model.fit_op_runs).
CALIBRATION_PLAN_GROUPS = (3, 12)


class Progress:
  """A one-line progress bar on a terminal, plain lines otherwise (logs)."""

  def __init__(self, total: int, stream=None, width: int = 24):
    self.total, self.done, self.width = max(1, total), 0, width
    self.stream = stream or sys.stderr
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.start = time.monotonic()
    self.what = ""

  def line(self, what: str) -> str:
    filled = self.width * self.done // self.total
    bar = "#" * filled + "." * (self.width - filled)
    elapsed = time.monotonic() - self.start
    return f"[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {what}"

  def show(self, what: str) -> None:
    self.what = what
    text = self.line(what)
    if self.tty:
      self.stream.write("\r\033[K" + text)
    else:
      self.stream.write(text + "\n")
    self.stream.flush()

  def step(self, what: str = "") -> None:
    self.done = min(self.total, self.done + 1)
    self.show(what)
    if self.tty and self.done == self.total:
      self.stream.write("\n")

  def say(self, text: str) -> None:
    """A result line (bench.say): on a terminal it replaces the bar's line and the bar is drawn
    again below it (printed after the bar, it was glued to the bar's text)."""
    if self.tty:
      self.stream.write("\r\033[K")
      self.stream.flush()
    bench.say(text)
    if self.tty and self.done < self.total:
      self.show(self.what)


def entry_for(collective: str, dtype: str, m: int, n: int, k: int, world: int, chosen,
              measured_ms: float, baseline_ms: float, transport: str = "nccl") -> dict:
  """The config entry of the fastest measured variant: `chosen` (a tune_model.Candidate,
  measured at measured_ms; transport "peer": the peer-store plan, plan_peer.py), or XLA's
  dot + collective when chosen is None."""
  entry = {"collective": collective, "dtype": dtype, "m": m, "n": n, "k": k,
           "baseline_ms": baseline_ms, "source": "python -m jax_flashoverlap.tune"}
  if chosen is None:  # a valid plan for the record: one group
    rows = m // plan_lib.rank_blocks(collective, world)
    entry.update(comm_sms=0, band_rows=[0, rows], overlap=False, measured_ms=baseline_ms)
    return entry
  entry.update(comm_sms=chosen.comm_sms, band_rows=list(chosen.band_rows), overlap=True,
               measured_ms=measured_ms, predicted_ms=chosen.predicted_s * 1e3,
               model_error=chosen.predicted_s * 1e3 / measured_ms - 1.0)
  if transport != "nccl":
    entry["transport"] = transport
  return entry


def fastest(measured: dict, xla_ms: float):
  """The candidate measured fastest (a peer-store candidate among them, if timed), or None
  where XLA's dot + collective (xla_ms) was at least as fast."""
  best = min(measured, key=measured.get)
  return best if measured[best] < xla_ms else None


def peer_candidate(pb, ref32, errors: dict, variants: dict):
  """--peer (world size 2 to 8, one process): our op lowered with JAX_FLASHOVERLAP_TRANSPORT=peer timed as
  one more variant ("peer"), its values checked like the others'; returns its plan as a
  tune_model.Candidate (how "peer")."""
  from jax_flashoverlap import plan_peer
  fn = pb.smap(pb.ours)
  with bench.bench_variants.overridden_env({bench.bench_variants.TRANSPORT_ENV: "peer"}):
    errors["peer"] = bench.relative_error(fn(*pb.args), ref32)  # compiles here
    text = fn.lower(*pb.args).as_text()
  if "transport = 1" not in text:
    raise RuntimeError("peer: the op did not lower with the peer stores (PeerStoresWarning?)")
  variants["peer"] = (fn, pb.args)
  p = plan_peer.plan(pb.collective, pb.m, pb.n, pb.k // pb.world, pb.dtype.itemsize, world=pb.world)
  return tune_model.Candidate(0, p.band_rows, p.predicted_s, "peer")


def problem_comm_sms(m: int, n: int, requested, align: bool = True, k: int | None = None,
                     blocks: int = 1) -> list:
  """The --comm-sms values tuned for one GEMM of m x n: each raised to the most SMs that cost
  the GEMM no extra wave of its persistent grid (tile_schedule.wave_aligned_comm_sms; blocks:
  the op's rank blocks, the world size for reduce-scatter), staying below the next requested
  value (the largest: at most 8 more), so the SMs the last, partial wave
  would leave idle are NCCL's. align=False: as requested."""
  values = sorted(set(requested))
  if not align:
    return values
  limits = [nxt - 1 for nxt in values[1:]] + [values[-1] + 8]
  return sorted({tile_schedule.wave_aligned_comm_sms(m, n, c, limit, k, blocks)
                 for c, limit in zip(values, limits)})


def calibration_shape_error(shape, world: int) -> str | None:
  """Why calibrate cannot fit the collective's curve for this global shape (it needs >= 2 of
  CALIBRATION_GROUPS dividing M / world: 1 and 2), else None; then no plan could be predicted."""
  if shape[0] % (2 * world) == 0:
    return None
  return (f"--shapes {'x'.join(map(str, shape))}: tuning a GEMM + collective needs M divisible "
          f"by 2 * world = {2 * world} (the collective's calibration runs 1 and 2 groups per "
          f"rank block), got M={shape[0]}")


def check_values(label: str, errors: dict, max_error: float) -> None:
  """Refuses to save plans when a timed program's result is off float32 by more than
  max_error, NaN included (an unwritten, NaN-poisoned tile: `nan > max_error` is False, so
  such a plan used to pass and could be saved)."""
  bad = {name: e for name, e in errors.items() if not e <= max_error}
  if bad:
    name, worst = next(iter(bad.items()))
    raise RuntimeError(f"{label}: {name}'s result is off float32 by {worst:.2e} (> "
                       f"{max_error}; {len(bad)} of {len(errors)} plans); not saving plans "
                       "from a broken build")


def _name(index: int, c) -> str:
  return f"plan{index}_sms{c.comm_sms}_g{c.num_groups}_{c.how}"


def calibrate(pb, comm_sms_list, calls: int, samples: int, cta_policy=None) -> tuple:
  """(Calibration, raw times in ms, the op runs {name: (comm_sms, band_rows, compiled fn)})
  for one problem: our GEMM alone on one device at each
  comm_sms, our capped collective alone at CALIBRATION_GROUPS group counts, and the op itself
  with CALIBRATION_PLAN_GROUPS even groups (the GEMM's slowdown beside NCCL, the per-group
  cost); communicators under `cta_policy` (None: the default)."""
  import jax
  import jax.numpy as jnp

  import jax_flashoverlap as fo
  m, n, world = pb.m, pb.n, pb.world
  k_local = pb.k // world
  device = pb.mesh.devices.flat[0]
  x, w = jax.device_put(bench_problem.random_inputs(jax.random.key(1), m, n, k_local, pb.dtype),
                        device)
  variants = {}
  for sms in comm_sms_list:
    fn = jax.jit(lambda x, w, sms=sms: fo.matmul(x, w, comm_sms=sms))
    if not bench.uses_custom_call(fn, (x, w), "flashoverlap_gemm"):
      raise RuntimeError("the signaling GEMM is not in use (is the CUDA extension built?): "
                         f"{fo.info()['paths']['matmul']['why']}")
    variants[f"gemm_sms{sms}"] = (fn, (x, w))
  y = jax.jit(lambda: jnp.ones((world * m, n), pb.dtype),
              out_shardings=jax.sharding.NamedSharding(
                  pb.mesh, jax.sharding.PartitionSpec("tp", None)))()
  coll_groups = [g for g in CALIBRATION_GROUPS if m % (g * world) == 0]
  for sms in comm_sms_list:
    for g in coll_groups:
      fn = bench_problem.nccl_capped_fn(pb, types.SimpleNamespace(
          comm_sms=sms, num_groups=g, cta_policy=cta_policy or "default"))
      if fn is None:
        raise RuntimeError("our capped collective is not available (CUDA extension)")
      variants[f"coll_sms{sms}_g{g}"] = (fn, (y,))
  op_runs = {}  # variant name -> (comm_sms, band_rows)
  for sms in comm_sms_list:
    for count in CALIBRATION_PLAN_GROUPS:
      bands = plan_lib.aligned_even_bands(pb.collective, m, n, world, count, sms)
      name = f"op_sms{sms}_g{len(bands) - 1}"
      if name in variants:  # too few rows for this many groups
        continue
      fn = pb.smap(pb.ours)
      with plan_lib.forced(band_rows=bands, comm_sms=sms, cta_policy=cta_policy):
        fn(*pb.args).block_until_ready()  # compiles with the calibration plan
        if not bench.uses_custom_call(fn, pb.args, pb.target):
          raise RuntimeError("our overlapped op is not in the compiled program")
      op_runs[name] = (sms, bands, fn)
      variants[name] = (fn, pb.args)
  t = {v: r["median_ms"] for v, r in
       bench.time_variants(variants, calls=calls, samples=samples).items()}
  nbytes = m * n * pb.dtype.itemsize
  wave = {sms: tune_model.wave_time(t[f"gemm_sms{sms}"] / 1e3, m, n, sms, k_local)
          for sms in comm_sms_list}
  comm = {}
  for sms in comm_sms_list:
    points = [(g, nbytes, t[f"coll_sms{sms}_g{g}"] / 1e3) for g in coll_groups]
    if len(points) >= 2:
      comm[sms] = tune_model.fit_comm_curve(points)
  return fit_op(pb, tune_model.Calibration(wave, comm, k=k_local), op_runs, t), t, op_runs


def fit_op(pb, cal, op_runs, times_ms):
  """`cal` with the GEMM's slowdown and the per-group cost fitted to the op runs' times."""
  slowdown, overhead = {}, {}
  for sms in cal.comm:
    runs = [(bands, times_ms[name] / 1e3) for name, (s, bands, _) in op_runs.items()
            if s == sms]
    slowdown[sms], overhead[sms] = tune_model.fit_op_runs(
        pb.collective, pb.m, pb.n, pb.world, sms, runs, cal, pb.dtype.itemsize)
  return dataclasses.replace(cal, interference=slowdown, group_overhead_s=overhead)


def time_cta_policies(pb, cand, args, baseline) -> tuple:
  """({policy: ms}, XLA's ms) of one plan with its communicator under each of --cta-policies
  (each a communicator of its own) and of XLA's dot + collective (`baseline`), interleaved:
  times of one round, compared with each other only (clocks drift between rounds)."""
  variants = {"xla_dot_collective": (baseline, pb.args)}
  for policy in args.cta_policies:
    fn = pb.smap(pb.ours)
    with plan_lib.forced(band_rows=cand.band_rows, comm_sms=cand.comm_sms, cta_policy=policy):
      fn(*pb.args).block_until_ready()  # compiles (and makes the communicator) here
    variants[policy] = (fn, pb.args)
  t = {v: r["median_ms"] for v, r in
       bench.time_variants(variants, calls=args.calls, samples=args.samples).items()}
  return {p: t[p] for p in args.cta_policies}, t["xla_dot_collective"]


def tune_problem(pb, args, progress) -> tuple:
  """(config entry, report row) of one problem."""
  label = f"{pb.collective} {pb.m}x{pb.n}x{pb.k}"
  m, n, world = pb.m, pb.n, pb.world
  k_local = pb.k // world
  why = calibration_shape_error((m, n, pb.k), world)
  if why:  # main() refuses such shapes; this guards other callers, before any GPU time
    raise ValueError(why)
  progress.show(f"{label}: calibrating")
  comm_sms = problem_comm_sms(m, n, args.comm_sms, args.wave_align, k_local,
                              plan_lib.rank_blocks(pb.collective, world))
  # One --cta-policies value: every plan is calibrated and timed under it (several: the kept
  # plan is timed under each, below).
  policy = args.cta_policies[0] if len(args.cta_policies) == 1 else None
  cal, cal_ms, op_runs = calibrate(pb, comm_sms, args.calls, args.samples, policy)
  progress.step(f"{label}: calibrated")
  cands = tune_model.candidates(pb.collective, m, n, world, cal, pb.dtype.itemsize)
  picked = tune_model.shortlist(cands, args.top)
  if not picked:
    raise RuntimeError(f"{label}: the calibration gave no candidate plan to time")
  progress.show(f"{label}: {len(cands)} candidates predicted, timing {len(picked)}")
  baseline = pb.baseline()
  ref32 = pb.reference_f32()
  variants = {"xla_dot_collective": (baseline, pb.args)}
  errors = {}
  names = [_name(i, c) for i, c in enumerate(picked)]
  for name, c in zip(names, picked):
    fn = pb.smap(pb.ours)
    with plan_lib.forced(band_rows=c.band_rows, comm_sms=c.comm_sms, cta_policy=policy):
      errors[name] = bench.relative_error(fn(*pb.args), ref32)  # compiles here
      if not bench.uses_custom_call(fn, pb.args, pb.target):
        raise RuntimeError(f"{name}: our custom call is not in the compiled program")
    variants[name] = (fn, pb.args)
  model_fn = pb.smap(pb.ours)
  with bench.bench_variants.model_plans_only():
    model_fn(*pb.args)  # compiles with the cost model's plan (no tuned config)
  variants["cost_model_default"] = (model_fn, pb.args)
  peer, peer_failure = None, None
  if args.peer:  # experimental: its failure is reported, and costs the NCCL plans nothing
    try:
      peer = peer_candidate(pb, ref32, errors, variants)
    except Exception as err:  # noqa: BLE001 (any lowering / run error of the peer stores)
      peer_failure = f"{type(err).__name__}: {err}"
      errors.pop("peer", None)
      variants.pop("peer", None)
  # The calibration runs again in this round: clocks drift between rounds by several %, so
  # the model is refitted to them here before it predicts the timed plans (its error).
  for name, (_, _, fn) in op_runs.items():
    variants["calibration_" + name] = (fn, pb.args)
  t = {v: r["median_ms"] for v, r in
       bench.time_variants(variants, calls=args.calls, samples=args.samples).items()}
  refit = fit_op(pb, cal, op_runs, {name: t["calibration_" + name] for name in op_runs})
  picked = [dataclasses.replace(c, predicted_s=tune_model.predict(
      pb.collective, m, n, world, c.band_rows, c.comm_sms, refit, pb.dtype.itemsize))
      for c in picked]
  if peer is not None and not errors["peer"] <= args.max_error:  # NaN too
    peer_failure = f"result off float32 by {errors['peer']:.2e} (> {args.max_error})"
    peer = None  # never saved; the NCCL plans were checked on their own
  check_values(label, {v: e for v, e in errors.items() if v != "peer"}, args.max_error)
  if peer_failure:
    progress.say(f"{label}: PEER STORES FAILED, not kept: {peer_failure}")
  measured = {c: t[name] for name, c in zip(names, picked)}
  if peer is not None:
    measured[peer] = t["peer"]
  best = fastest(measured, t["xla_dot_collective"])
  entry = entry_for(pb.collective, pb.dtype.name, m, n, k_local, world, best,
                    measured.get(best, 0.0), t["xla_dot_collective"],
                    transport="peer" if best is not None and best is peer else "nccl")
  policy_ms, xla_ms = {}, t["xla_dot_collective"]
  if best is not None and best is not peer and policy is not None:
    entry["cta_policy"] = policy
  if best is not None and best is not peer and len(args.cta_policies) > 1:
    progress.show(f"{label}: CTA policies {args.cta_policies}")
    policy_ms, xla_ms = time_cta_policies(pb, best, args, baseline)
    chosen = min(policy_ms, key=policy_ms.get)
    if policy_ms[chosen] >= xla_ms:  # XLA's path won this round: the entry must not overlap
      best = None
    entry = entry_for(pb.collective, pb.dtype.name, m, n, k_local, world, best,
                      policy_ms[chosen], xla_ms)
    if best is not None:
      entry.update(cta_policy=chosen, cta_policy_ms=policy_ms)
  progress.step(f"{label}: timed")  # after the CTA-policy round: the bar ended before it
  with bench.bench_variants.model_plans_only():  # the model's plan, not a shipped config's
    default = plan_lib.choose_plan(pb.collective, m, n, k_local, world, pb.dtype.itemsize)
  row = {"collective": pb.collective, "m": pb.m, "n": pb.n, "k": pb.k, "world": world,
         "comm_sms": comm_sms,
         "calibration": cal.to_json(), "calibration_ms": cal_ms,
         "calibration_refit": refit.to_json(),
         "candidates_predicted": len(cands),
         "timed": [{"name": name, "comm_sms": c.comm_sms, "band_rows": list(c.band_rows),
                    "how": c.how, "predicted_ms": c.predicted_s * 1e3,
                    "measured_ms": t[name], "rel_error_vs_f32": errors[name]}
                   for name, c in zip(names, picked)],
         "times_ms": t, "entry": entry, "cta_policy_ms": policy_ms,
         "peer": ({"failed": peer_failure} if peer_failure else
                  None if peer is None else {"band_rows": list(peer.band_rows),
                                             "predicted_ms": peer.predicted_s * 1e3,
                                             "measured_ms": t["peer"],
                                             "rel_error_vs_f32": errors["peer"]}),
         "cta_policy_round_xla_ms": xla_ms if policy_ms else None,
         # the kept plan is one the model was fitted to: its model error is in-sample
         "kept_is_calibration_plan": best is not None and any(
             tuple(best.band_rows) == plan_lib.aligned_even_bands(
                 pb.collective, m, n, world, g, best.comm_sms)
             for g in CALIBRATION_PLAN_GROUPS),
         "cost_model_default": {"band_rows": list(default.band_rows),
                                "comm_sms": default.comm_sms, "overlap": default.overlap}}
  progress.say(f"{label}: xla {t['xla_dot_collective']:.3f} ms, cost-model default "
               f"{t['cost_model_default']:.3f} ms, tuned "
               + (f"{entry['measured_ms']:.3f} ms ({best.num_groups} groups, comm_sms "
                  f"{best.comm_sms}, {best.how}; predicted {entry['predicted_ms']:.3f} ms, error "
                  f"{entry['model_error']:+.1%})" if best else "XLA's path (no plan was faster)")
               + (f"; CTA policies {policy_ms} ms vs xla {xla_ms:.3f} ms" if policy_ms else ""))
  return entry, row


def check_output_paths(parser, out, report, gpu: str, world: int, what: str = "--out") -> None:
  """The config to merge into and the --report file can be written, checked before any GPU
  time: an --out of another GPU or world size, not JSON or a directory, or a --report in a
  missing folder used to fail only after every problem was tuned, losing the results."""
  try:
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)  # as write_entries does
    tuning.merge_base(out, gpu, world)
  except (OSError, tuning.ConfigError) as err:
    parser.error(f"{what}: {err}")
  for name, path in ((what, pathlib.Path(out)), ("--report", report and pathlib.Path(report))):
    if path and (path.is_dir() or not os.access(path.parent, os.W_OK)):
      parser.error(f"{name} {path}: cannot write there (" + (
          "a directory" if path.is_dir() else f"{path.parent} is not a writable directory") + ")")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_flashoverlap.tune", description=__doc__,
                                   formatter_class=bench_args.DocHelpFormatter)
  parser.add_argument("--shapes", type=bench._parse_shape, nargs="+",
                      help="global MxNxK shapes (default: DESIGN.md's table, "
                           f"{' '.join('x'.join(map(str, s)) for s in bench.DESIGN_SHAPES)})")
  parser.add_argument("--collectives", nargs="*", default=["all_reduce", "reduce_scatter"],
                      choices=("all_reduce", "reduce_scatter"),
                      help="GEMM + collective ops to tune (none: give --collectives alone)")
  parser.add_argument("--ops", nargs="*", default=[], choices=bench_a2a.OPS,
                      help="also tune these all-to-all / all-gather ops (every plan of a "
                           "comm_sms x groups / chunks grid; jax_flashoverlap.tune_a2a)")
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                      help="dtype of x, w and the output")
  parser.add_argument("--world", type=int, default=0, help="GPUs in the mesh (0: all)")
  parser.add_argument("--comm-sms", type=int, nargs="+", default=[8, 12, 16],
                      help="SMs left to NCCL to calibrate and search over (each raised, per "
                           "shape, to the most that cost the GEMM no extra wave; see "
                           "--no-wave-align)")
  # default SUPPRESS, the value from set_defaults: the help then shows no "(default: True)"
  # for a flag that is off unless given
  parser.set_defaults(wave_align=True)
  parser.add_argument("--no-wave-align", dest="wave_align", action="store_false",
                      default=argparse.SUPPRESS,
                      help="tune exactly the --comm-sms values given (without it they are raised)")
  parser.add_argument("--cta-policies", nargs="+", default=["default", "efficiency"],
                      choices=("default", "efficiency", "zero"),
                      help="the communicator's ncclConfig_t.CTAPolicy values the kept plan is "
                           "timed under (the fastest is kept, each one's time reported); one "
                           "value: every plan is calibrated and timed under it")
  parser.add_argument("--peer", action="store_true",
                      help="at world size 2 to 8 (one process), also time the peer-store transport "
                           "(experimental, JAX_FLASHOVERLAP_TRANSPORT=peer) and keep it where it "
                           "beats every NCCL plan and XLA (the entry's transport: peer)")
  parser.add_argument("--top", type=int, default=6,
                      help="candidate plans timed per problem (at least one per comm_sms)")
  parser.add_argument("--calls", type=int, default=10,
                      help="back-to-back calls per timing sample")
  parser.add_argument("--samples", type=int, default=10,
                      help="timing samples per candidate (the median is kept)")
  parser.add_argument("--max-error", type=float, default=bench.VALUE_TOLERANCE,
                      help="largest relative error vs float32 accepted from a candidate")
  parser.add_argument("--out", help="config file to merge into (None: <gpu>_x<world>.json in "
                                    "the user config dir)")
  parser.add_argument("--report", help="write every calibration and timing here (JSON)")
  args = parser.parse_args(argv)
  shapes_defaulted = args.shapes is None
  if shapes_defaulted:
    args.shapes = list(bench.DESIGN_SHAPES)
  args.collectives = list(dict.fromkeys(args.collectives))  # named twice: tuned twice
  args.ops = list(dict.fromkeys(args.ops))
  for option, path in (("--out", args.out), ("--report", args.report)):
    if path is not None and not path.strip():  # `--out "$UNSET"` merged into the user config dir
      parser.error(f"{option}: an empty path (leave {option} out for "
                   + ("the user config dir's file)" if option == "--out" else "no report)"))
  for sms in args.comm_sms:
    if not 1 <= sms <= plan_lib.MAX_COMM_SMS:
      parser.error(f"--comm-sms values must be in [1, {plan_lib.MAX_COMM_SMS}], got {sms}")
  for name in ("top", "calls", "samples"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  if not (math.isfinite(args.max_error) and args.max_error > 0):  # nan disabled the check
    parser.error(f"--max-error must be a finite number > 0 (the largest relative error vs "
                 f"float32 accepted), got {args.max_error}")
  import jax
  if jax.default_backend() != "gpu":
    print("jax_flashoverlap.tune: needs GPUs (JAX's backend here is "
          f"{jax.default_backend()!r}); nothing to tune on the reference path", file=sys.stderr)
    return 2
  from jax_flashoverlap import distributed
  try:
    processes = max(jax.process_count(), distributed.launched_processes())
  except ValueError as err:  # the launcher's variable set by hand, not an integer
    parser.error(str(err))
  if processes > 1:  # calibration runs on one process's devices; every process would write
    # the config: refused rather than half-working (under the launcher: before any process
    # starts jax.distributed, which the tuner never does)
    parser.error(f"the tuner runs in one process over this machine's GPUs (this is one of "
                 f"{processes} processes): run it without jax_flashoverlap.launch / "
                 "jax.distributed; its config serves any process count with the same GPU and "
                 "world size")
  args.world = bench.resolve_world(parser, args.world)
  from jax_flashoverlap import plan_peer
  if args.peer and not 2 <= args.world <= plan_peer.MAX_WORLD:
    parser.error(f"--peer: the peer stores take a mesh of 2 to {plan_peer.MAX_WORLD} GPUs, "
                 f"--world is {args.world}")
  devices = jax.devices()[: args.world]
  gpu = devices[0].device_kind
  hint = bench.default_shapes_hint(args.world) if shapes_defaulted else ""
  for shape in args.shapes if args.collectives else ():
    try:
      bench.check_tp_shape(shape, args.world, args.collectives)
    except ValueError as err:
      parser.error(str(err) + hint)
    why = calibration_shape_error(shape, args.world)
    if why:
      parser.error(why + hint)
  if args.out is None:  # made now: a config dir set but missing fails every tuned-plan lookup
    try:
      tuning.user_config_dir().mkdir(parents=True, exist_ok=True)
    except OSError as err:
      parser.error(f"cannot make the config dir {tuning.user_config_dir()} "
                   f"(${tuning.CONFIG_DIR_ENV}): {err}")
  bench_args.check_switches(parser)  # before any GPU time (once the dir is made)
  slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
  out = (args.out if args.out is not None
         else tuning.user_config_dir() / f"{slug}_x{args.world}.json")
  check_output_paths(parser, out, args.report, gpu, args.world,
                     "--out" if args.out is not None else "the config file")
  problems = list(bench_problem.problems(args))
  if args.ops and args.world < 2:
    parser.error(f"--ops needs a mesh of >= 2 GPUs (over one device the all-to-all / "
                 f"all-gather ops are XLA's own composition), have {args.world}")
  op_problems = [(op, shape) for op in args.ops for shape in args.shapes]
  for op, (m, n, k) in op_problems:  # before any GPU time is spent
    try:
      bench_a2a.check_shape(op, m, n, args.world, k)
    except ValueError as err:
      parser.error(str(err).replace("bench a2a", "tune") + hint)
    why = tune_a2a.unsupported(op, m, n, k, args.world)
    if why:
      parser.error(why)
  if not problems and not op_problems:
    parser.error("nothing to tune: give --collectives and/or --ops")
  print(f"tuning {len(problems) + len(op_problems)} problems on {args.world} x {gpu}: "
        f"comm_sms {args.comm_sms}, {args.top} timed plans each (ops: every plan of the grid)",
        flush=True)
  progress = Progress(2 * len(problems) + len(op_problems))
  entries, rows = [], []
  command = "python -m jax_flashoverlap.tune " + " ".join(argv or sys.argv[1:])

  def save(entry, row):
    """Each problem's plan (and the report so far) is written as soon as it is tuned: a
    failure in a later problem, or a stopped run, keeps what was measured before it."""
    build = _ext.kernel_build()
    if build:  # what the plan was measured on: a later build's lookups warn (tuning.py)
      entry = dict(entry, kernel=build)
    entries.append(entry)
    rows.append(row)
    path = tuning.write_entries(out, gpu, args.world, [entry])
    if args.report:
      report = {"kind": "tune", "rows": rows, "config": str(path), "gpu": gpu,
                "world": args.world, "command": command, "git_commit": bench.git_commit(),
                "kernel_build": _ext.kernel_build(),
                "complete": len(rows) == len(problems) + len(op_problems),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
      bench.write_json(args.report, report)  # strict JSON (a failed candidate's NaN: null)
    return path

  path = out
  for pb in problems:
    path = save(*tune_problem(pb, args, progress))
  if op_problems:
    import numpy as np
    from jax.sharding import Mesh
    mesh = Mesh(np.array(devices), ("tp",))
    key = jax.random.key(int(time.time()))
    for op, shape in op_problems:
      key, sub = jax.random.split(key)
      path = save(*tune_a2a.tune_op(op, shape, mesh, args, progress, sub))
  errors = [abs(e["model_error"]) for e in entries if "model_error" in e]
  print(f"wrote {len(entries)} tuned plans to {path}"
        + (f"; model error of the kept plans: max {max(errors):.1%}, mean "
           f"{sum(errors) / len(errors):.1%}" if errors else ""))
  peer_failed = [f"{r['collective']} {r['m']}x{r['n']}x{r['k']}" for r in rows
                 if isinstance(r.get("peer"), dict) and "failed" in r["peer"]]
  if peer_failed:
    print(f"jax_flashoverlap.tune: the peer stores failed on {len(peer_failed)} problem(s) "
          f"({', '.join(peer_failed)}; `peer.failed` in the report): their NCCL plans were "
          "saved, no peer entry: exit 1", file=sys.stderr, flush=True)
    return 1
  return 0


if __name__ == "__main__":
  from jax_flashoverlap import bench_record
  sys.exit(bench_record.run_main(main))
