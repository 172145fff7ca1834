"""Benchmarks: `python -m jax_flashoverlap.bench gemm|overlap|sweep|a2a [options]`.

Every variant is timed the same way, interleaved, in one process: a sample is the mean of
`--calls` back-to-back calls (dispatch amortized), the figure is the median of `--samples`
samples after warm-up (DESIGN.md's method); the rounds' orders form a balanced Latin square
(round_order), so no variant keeps one place in the round or one predecessor (results before
2026-12-06's session 47 used one order, session 47's rotated one).
Inputs are fresh random values; every variant's result is checked against float32's before
it is timed: one off by more than VALUE_TOLERANCE is printed, recorded (`failed_value_check`)
and left untimed (ours: timed and flagged), and the run exits 1.

The subcommands are listed below (SUBCOMMANDS); `bench SUBCOMMAND --help` gives one's options.

`overlap` and `sweep` also run as several processes (one GPU each):
  python -m jax_flashoverlap.launch -n 2 --gpus-per-process 1 -m jax_flashoverlap.bench overlap
Every process times its own calls (the collectives keep them in step); process 0 prints and
writes the JSON. Inputs are made by jitted generators with global shardings, so one process x
2 GPUs and 2 processes x 1 GPU time the same values.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

from jax_flashoverlap import (bench_a2a, bench_args, bench_problem, bench_record, bench_targets,
                              bench_variants)
# git_commit stays importable as bench.git_commit (tune, benchmarks/, their tests)
from jax_flashoverlap.bench_record import RowLog, git_commit, is_stream, write_json  # noqa: F401

# Global shapes M x N x K of DESIGN.md; per GPU the GEMM is M x N x K/world.
DESIGN_SHAPES = ((4096, 8192, 8192), (8192, 8192, 8192), (16384, 8192, 16384),
                 (8192, 28672, 8192), (8192, 8192, 28672))
# Without a GPU, where every variant is XLA's composition on simulated devices (a smoke run),
# DESIGN.md's shapes took minutes per variant: a small one, rounded up (no_gpu_shapes) to
# split over any device count for every subcommand (as is on 1, 2, 4 and 8).
NO_GPU_SHAPES = ((256, 256, 512),)


def no_gpu_shapes(world: int) -> list:
  """NO_GPU_SHAPES rounded up to split over `world` devices: M by world^2 (the all-to-all's
  blocks), N and K into multiples of 8 per device (on 3 devices 256x256x512 split nowhere)."""
  up = lambda size, by: -(-size // by) * by
  return [(up(m, world * world), up(n, 8 * world), up(k, 8 * world))
          for m, n, k in NO_GPU_SHAPES]


def _parse_shape(text):
  fields = text.strip().lower().replace("x", ",").split(",")
  try:  # every field: '64xx64x64' or '64x64x64x' is a typo, not 64x64x64
    parts = [int(v) for v in fields]
  except ValueError:
    parts = []
  if len(parts) != 3 or min(parts) < 1:
    raise argparse.ArgumentTypeError(f"shape must be MxNxK (three positive integers, e.g. "
                                     f"8192x8192x8192), got {text!r}")
  return tuple(parts)


def check_tp_shape(shape, world: int, collectives=("all_reduce",), what="--world") -> None:
  """A global MxNxK of a row-parallel problem splits over `world` devices into a GEMM the ops
  take (K per device and N multiples of 8; reduce-scatter: M divisible), else a ValueError
  naming the option: checked at argument parsing, before any compile."""
  m, n, k = shape
  head = f"--shapes {m}x{n}x{k}"
  if k % world or (k // world) % 8:
    raise ValueError(f"{head}: K={k} must split over {what} {world} into a multiple of 8 per "
                     f"device (the GEMM's K), got K / {world} = {k / world:g}")
  if n % 8:
    raise ValueError(f"{head}: N={n} must be a multiple of 8")
  if "reduce_scatter" in collectives and m % world:
    raise ValueError(f"{head}: reduce_scatter over {what} {world} needs M divisible by "
                     f"{world}, got M={m}")


def resolve_world(parser, world: int) -> int:
  """--world (0: every device) checked against the devices JAX has: a parser error (exit 2)
  instead of silently slicing the device list (-1 dropped the last device)."""
  import jax
  count = len(jax.devices())
  if not 0 <= world <= count:
    parser.error(f"--world must be in [1, {count}] (the devices here; 0: all), got {world}")
  return world or count


def round_order(names: list, r: int) -> list:
  """The variants of round r: row r of a balanced Latin square (a Williams design) over them.
  Over n rounds (n variants; 2n where n is odd, the odd rounds' rows reversed) each variant
  takes each place in the round equally often and follows each other variant equally often.
  Rotating one order (session 47) balanced the places but kept every variant's predecessor:
  on an H100 the epilogue right after XLA's dot stayed 2-4% ahead whichever it was (session
  48, docs/signaling_gemm.md). Depends on r alone: every process takes the same order."""
  n = len(names)
  # the first row 0, 1, n-1, 2, n-2, ... (every difference between neighbours once), shifted by r
  first = [0 if p == 0 else (p + 1) // 2 if p % 2 else n - p // 2 for p in range(n)]
  row = [names[(i + r) % n] for i in first]
  return row[::-1] if n % 2 and (r // n) % 2 else row


def _square_rounds(count: int) -> int:
  """Rounds in one whole square of round_order over `count` variants: count, 2 x count for an
  odd count (1 where there is nothing to balance)."""
  return 1 if count < 2 else count if count % 2 == 0 else 2 * count


def balanced_rounds(count: int, samples: int) -> bool:
  """Whether `samples` rounds of round_order over `count` variants are whole squares: only
  then does each variant take each place and follow each other variant equally often. 20
  rounds over the 12 variants of a 2-GPU overlap row are one square and 8 rows of the next
  (each place and predecessor once or twice)."""
  return samples % _square_rounds(count) == 0


def square_rounds(count: int, at_least: int) -> int:
  """The fewest rounds, at least `at_least`, that are whole squares of round_order over
  `count` variants (balanced_rounds holds)."""
  size = _square_rounds(count)
  return size * -(-at_least // size)


def time_variants(variants: dict, *, calls: int, samples: int, warmup: int = 3) -> dict:
  """{name: (fn, args)} -> {name: {"median_ms", "samples_ms"}}, interleaved: every round times
  each variant once, in round_order's order, so each variant takes each place in the round and
  follows each other variant alike (`samples` a multiple of the count, twice it where the count
  is odd: exactly). With one fixed order the place alone moved a GEMM's time by up to 6% through
  JAX on an H100 (session 47), and with a rotated one its predecessor 2-4% (session 48;
  docs/signaling_gemm.md). Every process of a multi-process run takes the same order (it
  depends on r only)."""
  for fn, args in variants.values():
    for _ in range(warmup):
      fn(*args).block_until_ready()
  names = list(variants)
  times = {name: [] for name in names}
  for r in range(samples):
    for name in round_order(names, r):
      fn, args = variants[name]
      out = fn(*args)
      out.block_until_ready()
      start = time.perf_counter()
      for _ in range(calls):
        out = fn(*args)
      out.block_until_ready()
      times[name].append((time.perf_counter() - start) / calls * 1e3)
  # The median proper (mean of the two middle samples for an even count).
  return {name: {"median_ms": statistics.median(ts), "samples_ms": ts}
          for name, ts in times.items()}


def uses_custom_call(fn, args, target: str) -> bool:
  """Whether the compiled program of fn(*args) calls our FFI target (else it timed XLA)."""
  return target in fn.lower(*args).compile().as_text()


def relative_error(out, ref) -> float:
  import jax.numpy as jnp
  a = jnp.asarray(out, jnp.float32)
  b = jnp.asarray(ref, jnp.float32)
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


# Relative (Frobenius) error vs float32 above which a result is wrong, not rounded: a bf16 / f16
# product rounded once is ~1e-3..3e-3 (the ppermute ring's bf16 sums ~3e-3); an unwritten
# tile, a wrong block or a missing rank's share is ~1e-1 or more.
VALUE_TOLERANCE = 2e-2


def failed_values(errors: dict, what: str) -> dict:
  """{variant: error} of the results above VALUE_TOLERANCE (NaN too), each printed: timing
  them would rank a wrong program."""
  bad = {v: e for v, e in errors.items() if not e <= VALUE_TOLERANCE}
  for v, e in bad.items():
    say(f"VALUE CHECK FAILED: {what} {v}: relative error vs float32 {e:.2e} > "
        f"{VALUE_TOLERANCE:g}")
  return bad


def worst_error(errors) -> float:
  """The largest of the errors, NaN if any is (Python's max() drops a NaN it meets second):
  for the summary lines, which must not print a small error beside a failed value check."""
  errors = list(errors)
  return next((e for e in errors if e != e), max(errors, default=float("nan")))


def _drop_failed(variants: dict, bad: dict, keep=("ours",)) -> None:
  """Leaves the wrong variants out of the timing, except `keep` (timed, flagged)."""
  for v in bad:
    if v not in keep:
      variants.pop(v, None)


def is_main_process() -> bool:
  import jax
  return jax.process_index() == 0


def say(*args) -> None:
  """print, on process 0 only (every process runs the same benchmark)."""
  if is_main_process():
    print(*args, flush=True)


def _variant_failed(failures: dict, name: str, err: Exception, what: str) -> None:
  """Records (and says) a comparison program that raised: the run goes on without it, and
  exits 1 (as for a failed value check). The experimental ones (peer stores, helpers) may fail
  where they first meet new hardware; that must not cost the other variants' rows."""
  failures[name] = f"{type(err).__name__}: {err}"
  say(f"VARIANT FAILED: {what} {name}: {failures[name]}")


def windowed_or_failure(times: dict, failures: dict, measure, what: str):
  """bench_variants.add_windowed of measure()'s result; a failed subprocess is a failed
  variant (said, recorded, the run exits 1), not the end of the run."""
  try:
    measured = measure()
  except RuntimeError as err:
    _variant_failed(failures, "xla_windowed", err, what)
    return None
  return bench_variants.add_windowed(times, measured, what)


def _other_variants(pb, args, failures: dict) -> dict:
  """The comparison programs of bench_variants that run in this process (jitted, compiled)."""
  out = {}
  if "two_chunk" in args.variants:
    out["two_chunk"] = bench_variants.two_chunk(pb)
  if "ppermute_ring" in args.variants and pb.m % pb.world == 0:  # its ring moves row blocks
    out["ppermute_ring"] = bench_variants.ppermute_ring(pb)
  if "chain" in args.variants:
    out["xla_chain"] = bench_variants.chained(pb, lambda x, w: pb.coll(x @ w))
    out["ours_chain"] = bench_variants.chained(pb, pb.ours)
  if "ours_model" in args.variants:
    fn = pb.smap(pb.ours)
    with bench_variants.model_plans_only():
      fn(*pb.args)  # compiles (lowers) with the cost model's plan
    out["ours_model"] = fn
  if "helpers" in args.variants:
    out["ours_helpers"] = bench_variants.EnvPinned(pb.smap(pb.ours),
                                                   {bench_variants.HELPERS_ENV: "on"})
  from jax_flashoverlap import plan_peer
  if "peer" in args.variants and pb.world <= plan_peer.MAX_WORLD:  # peer stores: 2 to 8 GPUs
    fn = pb.smap(pb.ours)
    try:
      with bench_variants.overridden_env({bench_variants.TRANSPORT_ENV: "peer"}):
        fn(*pb.args)  # compiles (lowers) with the peer-store plan
      out["ours_peer"] = fn
    except Exception as err:  # noqa: BLE001 (any lowering / run error: recorded, exit 1)
      _variant_failed(failures, "ours_peer", err, f"{pb.collective} {pb.m}x{pb.n}x{pb.k}")
  return out


def _own_helpers_env() -> dict:
  """The user's FLASHOVERLAP_GEMM_HELPERS, to pin on every variant but ours_helpers."""
  return {bench_variants.HELPERS_ENV: os.environ.get(bench_variants.HELPERS_ENV)}


def _time_pinned(variants: dict, args, own: dict) -> dict:
  """time_variants, with every variant but a pinned one (ours_helpers) run under `own`, the
  environment's own FLASHOVERLAP_GEMM_HELPERS (restored after)."""
  if not any(isinstance(fn, bench_variants.EnvPinned) for fn, _ in variants.values()):
    return time_variants(variants, calls=args.calls, samples=args.samples)
  pinned = {v: (fn if isinstance(fn, bench_variants.EnvPinned)
                else bench_variants.EnvPinned(fn, own), a) for v, (fn, a) in variants.items()}
  try:
    return time_variants(pinned, calls=args.calls, samples=args.samples)
  finally:
    bench_variants.pin_env(own)


def traced_calls(fn, args, calls: int) -> dict:
  """{device: trace.medians} of `calls` isolated calls of fn (our overlapped op) under the
  per-group trace; {} where it cannot be traced (no extension)."""
  from jax_flashoverlap import trace
  if calls <= 0 or not trace.available():
    return {}
  trace.read(clear=True)
  with trace.recording():
    for _ in range(calls):
      fn(*args).block_until_ready()  # isolated: nothing queued ahead or behind
    records = trace.read(clear=True)
  by_device = {}
  for r in records:
    by_device.setdefault(str(r["device"]), []).append(r)
  return {d: trace.medians(rs) for d, rs in by_device.items()}


# The variants the per-shape line names by themselves; the rest follow it as "others".
_PRINTED = ("xla_dot", "xla_collective", "xla_dot_collective", "ours", "nccl_capped_alone")


def _xla_path_reason(plan) -> str:
  """Why `ours` ran XLA's composition rather than our custom call."""
  import jax
  if jax.default_backend() != "gpu":
    return f"no GPU, {jax.default_backend()}"
  return "cost-model fallback" if not plan.overlap else "extension not in use"


def warn_if_no_gpu(left_out: str) -> None:
  """The banner of a run without a GPU, where `ours` is XLA's composition."""
  import jax
  if jax.default_backend() != "gpu":
    say(f"WARNING: no GPU ({jax.default_backend()}): every variant runs XLA's composition "
        "on simulated devices, so the times, speedups and E below measure nothing of this "
        f"project (a smoke run of the CLI); {left_out}")


def say_targets(targets: dict, issues: str = "#4, #5") -> None:
  """The targets' summary line; off GPU it says the verdicts measure nothing."""
  import jax
  say(bench_targets.summary_line(targets, issues) + (
      "" if jax.default_backend() == "gpu" else " (no GPU: a smoke run, these say nothing)"))


def bench_overlap(args) -> dict:
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  from jax_flashoverlap import comm

  rows = RowLog(args)
  warn_if_no_gpu("the GPU-only parts (--trace, nccl_capped, the xla_windowed variant) are "
                 "left out")
  for pb in bench_problem.problems(args):
    collective = pb.collective
    m, n, k, world = pb.m, pb.n, pb.k, pb.world
    dot_only = pb.smap(lambda x, w: x @ w, out_specs=P("tp", None))
    # The collective alone, on a per-device [M, N] array (each device's partial product).
    y = jax.jit(lambda: jnp.ones((world * m, n), pb.dtype),
                out_shardings=NamedSharding(pb.mesh, P("tp", None)))()
    coll_only = pb.smap(pb.coll, in_specs=(P("tp", None),))
    baseline = pb.baseline()
    ours_fn = pb.smap(pb.ours)
    err = relative_error(ours_fn(*pb.args), baseline(*pb.args))
    err32 = relative_error(ours_fn(*pb.args), pb.reference_f32())
    custom_call = uses_custom_call(ours_fn, pb.args, pb.target)
    plan = bench_problem.lowered_plan(pb)
    variants = {"xla_dot": (dot_only, pb.args), "xla_collective": (coll_only, (y,)),
                "xla_dot_collective": (baseline, pb.args), "ours": (ours_fn, pb.args)}
    capped = bench_problem.nccl_capped_fn(pb, plan)
    if capped is not None:
      variants["nccl_capped_alone"] = (capped, (y,))
    errors, failures = {"ours": err32}, {}
    own_env = _own_helpers_env()
    for name, fn in _other_variants(pb, args, failures).items():
      try:
        if not name.endswith("_chain"):  # a chain returns x, not the product
          errors[name] = relative_error(fn(*pb.args), pb.reference_f32())
      except Exception as failure:  # noqa: BLE001 (not `err`: `except ... as` unbinds
        # its name afterwards, and `err` is ours' error, read for the row below)
        _variant_failed(failures, name, failure, f"{collective} {m}x{n}x{k}")
        continue
      variants[name] = (fn, pb.args)
    bench_variants.pin_env(own_env)  # an EnvPinned variant's check left its own values
    bad = failed_values(errors, f"{collective} {m}x{n}x{k}")
    _drop_failed(variants, bad)
    timing = _time_pinned(variants, args, own_env)
    t = {v: r["median_ms"] / (bench_variants.CHAIN if v.endswith("_chain") else 1)
         for v, r in timing.items()}
    windowed = None
    if "xla_windowed" in args.variants and jax.process_count() == 1:
      windowed = windowed_or_failure(
          t, failures, lambda: bench_variants.xla_windowed(pb, args.calls, args.samples),
          f"{collective} {m}x{n}x{k}")
    ideal = max(t["xla_dot"], t["xla_collective"])
    speedup = t["xla_dot_collective"] / t["ours"]
    denom = t["xla_dot_collective"] - ideal
    eff = (t["xla_dot_collective"] - t["ours"]) / denom if denom > 0 else float("nan")
    row = {"collective": collective, "m": m, "n": n, "k": k, "world": world,
           "processes": jax.process_count(), "dtype": str(pb.dtype),
           "gpu": comm.mesh_gpu_name(pb.mesh),  # as tuned configs are keyed; None off GPU
           "times_ms": t, "speedup": speedup,
           "overlap_efficiency": eff, "rel_error": err, "rel_error_vs_f32": err32,
           "variant_rel_error_vs_f32": errors, "failed_value_check": bad,
           "variant_failures": failures,
           "speedups": {v: t["xla_dot_collective"] / t[v] for v in t
                        if v not in ("xla_dot", "xla_collective", "nccl_capped_alone")
                        and not v.endswith("_chain")},
           "chain_speedup": (t["xla_chain"] / t["ours_chain"]) if "ours_chain" in t else None,
           "uses_custom_call": custom_call, "xla_windowed": windowed,
           "rounds": {"variants": len(variants), "samples": args.samples,
                      "balanced": balanced_rounds(len(variants), args.samples)},
           "plan": {"band_rows": list(plan.band_rows), "comm_sms": plan.comm_sms,
                    "overlap": plan.overlap, "transport": plan.transport,
                    "predicted_ms": plan.predicted_s * 1e3,
                    "predicted_baseline_ms": plan.baseline_s * 1e3,
                    # what `ours` ran: the plan, or (the fallback) XLA's composition
                    "predicted_ours_ms": (plan.predicted_s if custom_call
                                          else plan.baseline_s) * 1e3,
                    "source": plan.source}}
    row["trace"] = traced_calls(ours_fn, pb.args, args.trace) if custom_call else {}
    row.update(bench_targets.evaluate_row(row))
    rows.append(row)
    path = "" if custom_call else f" (XLA path: {_xla_path_reason(plan)})"
    others = " ".join(f"{v} {t[v]:.3f}" for v in t if v not in _PRINTED and not v.endswith("_chain"))
    say(f"{collective:14s} {m}x{n}x{k}: dot {t['xla_dot']:.3f} coll {t['xla_collective']:.3f} "
          f"dot+coll {t['xla_dot_collective']:.3f} ours {t['ours']:.3f} "
          f"nccl_capped {t.get('nccl_capped_alone', float('nan')):.3f} ms  "
          f"speedup {speedup:.3f}  E {eff:.2f}  err {err:.1e} (f32 {err32:.1e})  "
          f"groups {plan.num_groups} sms {plan.comm_sms}"
          f"{' peer stores' if plan.transport == 'peer' else ''}{path}"
          + (f"  others: {others} ms" if others else "")
          + (f"  chained: xla {t['xla_chain']:.3f} ours {t['ours_chain']:.3f} "
             f"({row['chain_speedup']:.3f}x)" if row["chain_speedup"] else ""))
    for device, medians in sorted(row["trace"].items())[:1]:  # one device's timeline
      from jax_flashoverlap import trace
      say(f"  trace, device {device}, median of {medians['calls']} isolated calls:\n    "
          + trace.medians_table(medians).replace("\n", "\n    "))
  targets = bench_targets.summary(rows)
  say_targets(targets)
  return {"kind": "overlap", "rows": rows, "targets": targets}


def _check_shapes(parser, args, defaulted: bool = False) -> None:
  """Every --shapes value splits over the mesh as the subcommand's ops need; where they are
  the defaults (DESIGN.md's on GPUs), the error says so: the user named none."""
  try:
    for m, n, k in args.shapes:
      if args.kind == "a2a":
        for op in args.ops:
          bench_a2a.check_shape(op, m, n, args.world, k)
      else:
        check_tp_shape((m, n, k), args.world, getattr(args, "collectives", ()))
  except ValueError as err:
    parser.error(str(err) + (default_shapes_hint(args.world) if defaulted else ""))


def default_shapes_hint(world: int) -> str:
  """Said after a split error about shapes the user never named (bench's and tune's default)."""
  return (f" (the default shapes, DESIGN.md's, do not split over {world} GPUs: name shapes "
          "that do with --shapes, or a --world they split over)")


# Each subcommand's line in `bench --help` and the opening of its own --help.
SUBCOMMANDS = {
    "gemm": "jax_flashoverlap.matmul (signals on) against XLA's dot on one GPU, at each "
            "--comm-sms (--transpose-w: w stored [N, K], ours with transpose_w=True against "
            "ours on an XLA transpose of w, i.e. what `matmul(x, w.T)` costs, and the [K, N] "
            "kernel on a weight stored [K, N])",
    "overlap": "matmul_all_reduce / matmul_reduce_scatter against XLA's dot, collective and "
               "dot + collective on a 1-D mesh over all GPUs, and the other --variants: "
               "speedup and overlap efficiency E = (baseline - ours) / (baseline - max(dot, "
               "collective)), undefined (null in the JSON) where the baseline is no slower "
               "than max(dot, collective)",
    "sweep": "the overlapped ops under forced plans (--comm-sms x --groups) against XLA's "
             "dot + collective (GPUs only)",
    "a2a": "matmul_all_to_all / all_gather_matmul against XLA's composition and its "
           "windowed-einsum flags (jax_flashoverlap.bench_a2a)",
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jax_flashoverlap.bench", description=__doc__,
                                   formatter_class=bench_args.DocHelpFormatter)
  # (the metavar: a missing subcommand's error names them all, not the dest "kind")
  sub = parser.add_subparsers(dest="kind", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}")
  for name, about in SUBCOMMANDS.items():
    p = sub.add_parser(name, help=about, description=about + ".",
                       formatter_class=bench_args.DefaultsHelpFormatter)
    p.add_argument("--shapes", type=_parse_shape, nargs="+", default=argparse.SUPPRESS,
                   help="global MxNxK shapes (default: DESIGN.md's table on GPUs, "
                        f"{' '.join('x'.join(map(str, s)) for s in NO_GPU_SHAPES)} without one, "
                        "rounded up to split over the devices)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                   help="dtype of x, w and the output")
    p.add_argument("--calls", type=int, default=10,
                   help="back-to-back calls per sample (a sample is their mean time)")
    p.add_argument("--samples", type=int, default=20,
                   help="samples per variant, interleaved across variants; the median is "
                        "reported")
    p.add_argument("--out", help="write results JSON here")
    if name == "gemm":
      p.add_argument("--world", type=int, default=2, help="per-GPU K = K / world")
      p.add_argument("--comm-sms", type=int, nargs="+", default=[0, 8, 16],
                     help="SMs left free for communication (0: the GEMM on every SM)")
      p.add_argument("--transpose-w", action="store_true",
                     help="w stored [N, K]: ours with transpose_w=True vs XLA's x @ w.T")
    elif name == "a2a":
      bench_a2a.add_arguments(p)
    else:
      p.add_argument("--world", type=int, default=0, help="GPUs in the mesh (0: all)")
      if name == "overlap":
        p.add_argument("--variants", nargs="*", choices=bench_variants.VARIANTS,
                       default=list(bench_variants.VARIANTS),
                       help="comparison programs (jax_flashoverlap.bench_variants)")
        p.add_argument("--plot", help="draw the speedups here (needs matplotlib; PNG, or the format its suffix names)")
        p.add_argument("--trace", type=int, default=5,
                       help="isolated calls of ours traced per shape (per-group medians in the "
                            "JSON, jax_flashoverlap.trace); 0: none")
      if name == "sweep":
        p.add_argument("--comm-sms", type=int, nargs="+", default=[4, 8, 16],
                       help="SMs left to NCCL in the forced plans")
        p.add_argument("--groups", type=int, nargs="+", default=[0, 2, 4, 8],
                       help="forced group counts (0: the cost model's plan)")
      p.add_argument("--collectives", nargs="+", default=["all_reduce", "reduce_scatter"],
                     choices=("all_reduce", "reduce_scatter"),
                     help="the ops measured at each shape (default: both)")
  args = parser.parse_args(argv)
  if getattr(args, "collectives", None):  # named twice: measured and recorded twice
    args.collectives = list(dict.fromkeys(args.collectives))
  bench_args.check_numbers(parser, args)
  bench_args.check_output_paths(parser, args)
  import jax_flashoverlap as fo
  bench_args.check_switches(parser)
  try:  # no-op unless started by jax_flashoverlap.launch
    fo.distributed.launch_settings()  # the launcher's variables set by hand, and wrong
  except ValueError as err:
    parser.error(str(err))
  fo.distributed.initialize()
  import jax
  if args.kind == "gemm" and jax.process_count() > 1:
    parser.error("gemm runs on one GPU in one process; launch it without jax_flashoverlap.launch")
  if args.kind == "sweep" and jax.default_backend() != "gpu":  # as tune: ours is XLA's there
    print("jax_flashoverlap.bench sweep: needs GPUs (JAX's backend here is "
          f"{jax.default_backend()!r}); off GPU every forced plan lowers to XLA's dot + "
          "collective", file=sys.stderr)
    return 2
  if args.kind != "gemm":  # gemm's --world only divides K
    args.world = resolve_world(parser, args.world)
  defaulted = not hasattr(args, "shapes")
  if defaulted:
    on_gpu = jax.default_backend() == "gpu"
    args.shapes = list(DESIGN_SHAPES) if on_gpu else no_gpu_shapes(args.world)
    if not on_gpu:
      say(f"no GPU ({jax.default_backend()}): --shapes defaults to "
          f"{' '.join('x'.join(map(str, s)) for s in args.shapes)} (DESIGN.md's take minutes "
          "per variant here; name them with --shapes)")
  _check_shapes(parser, args, defaulted and jax.default_backend() == "gpu")
  from jax_flashoverlap import bench_gemm
  about = {
      "command": "python -m jax_flashoverlap.bench " + " ".join(argv or sys.argv[1:]),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "git_commit": git_commit(),
      "env": {k: v for k, v in os.environ.items() if k.startswith(("JAX_FLASHOVERLAP", "FLASHOVERLAP_", "NCCL_"))},
      "method": f"median of {args.samples} samples, each the mean of {args.calls} "
                "back-to-back calls, variants interleaved (the rounds' orders rows of a "
                "balanced Latin square: each place and each predecessor alike over whole "
                "squares, samples a multiple of the variants timed, twice it for an odd count; "
                "an overlap row's `rounds` says), after 3 warm-up calls",
  }
  if args.out and is_main_process() and not is_stream(args.out):
    # rewritten after every row (a run cut short keeps its rows); a stream gets the end only
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    args.on_row = lambda rows: write_json(args.out, {"kind": args.kind, "rows": rows,
                                                      **about, "complete": False})
  result = {"gemm": bench_gemm.bench_gemm, "overlap": bench_overlap,
            "sweep": bench_gemm.bench_sweep,
            "a2a": bench_a2a.bench_a2a}[args.kind](args)
  result.update(about, info=fo.info(), complete=True)
  # Which way the peer-store all-reduce went in this process (staged or not, access granted).
  result["peer_communicators"] = [
      {k: c[k] for k in ("comm_id", "device", "rank", "peer_recv_bytes", "peer_staged",
                         "peer_grants", "peer_across_processes")}
      for c in fo.comm.list_communicators() if c.get("peer_recv_bytes")]
  failed = any(row.get("failed_value_check") or row.get("variant_failures")
               for row in result["rows"])
  if not is_main_process():
    return 1 if failed else 0
  if getattr(args, "plot", None):
    result["plot"] = bench_variants.plot(result, args.plot)
  if args.out:
    write_json(args.out, result)
  if failed:
    print("jax_flashoverlap.bench: a value check or a variant failed (VALUE CHECK FAILED / "
          "VARIANT FAILED above; `failed_value_check` / `variant_failures` in the rows): "
          "exit 1", file=sys.stderr, flush=True)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(bench_record.run_main(main))
