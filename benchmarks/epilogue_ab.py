"""The signaling GEMM's epilogues through JAX, A/B in one process: which one `fo.matmul` gets.

`FLASHOVERLAP_GEMM_EPILOGUE` is read by the kernel launcher at every launch, so one process
can time the same jitted `fo.matmul` under each value: per shape (per-device MxNxK) and
comm_sms, interleaved rounds (each round times every variant once: `--calls` back-to-back
calls between two syncs; the median of `--samples` rounds; bench.time_variants orders the
rounds by a balanced Latin square), XLA's dot among them as the yardstick. Separate processes
cannot settle a few percent: XLA's own time moved up to 4% between two processes on one
H100 (session 47, benchmarks/results/logs/halves_speed_*).

Before timing, every variant's output is checked against XLA's dot and a float32 product
(a buffer of NaNs is allocated and freed first, so a reused output buffer holds NaNs, not
the previous call's right answer). With FLASHOVERLAP_GEMM_LOG=1 (set here unless given)
the launcher prints one line per launch geometry on stderr, whose stage count tells the
instances apart (at 128 x 256: 3 stages whole-tile overlapped, 4 halves or sync).

  python benchmarks/epilogue_ab.py --out epilogue_ab.json
"""

from __future__ import annotations

import argparse
import os
import sys

EPILOGUE_ENV = "FLASHOVERLAP_GEMM_EPILOGUE"
EPILOGUES = ("overlap", "halves", "sync")


def main() -> None:
  from jax_flashoverlap import bench, bench_args, bench_problem, bench_variants
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", nargs="+", type=bench._parse_shape,
                      default=[(4096, 8192, 4096), (8192, 8192, 4096), (16384, 8192, 8192),
                               (8192, 28672, 4096), (8192, 8192, 14336)],
                      help="per-device MxNxK (default: DESIGN.md's per-GPU shapes)")
  parser.add_argument("--comm-sms", nargs="+", type=int, default=[0, 8, 16],
                      help="comm_sms: SMs the GEMM leaves free (default: 0 8 16)")
  parser.add_argument("--epilogues", nargs="+", choices=EPILOGUES, default=list(EPILOGUES),
                      help="(default: all)")
  parser.add_argument("--calls", type=int, default=10,
                      help="back-to-back calls per sample (default: 10)")
  parser.add_argument("--samples", type=int,
                      help="rounds (default: the fewest whole balanced squares of at least 15: "
                           "a multiple of the variant count, twice it for an odd count, puts "
                           "each variant at each place in the round and after each other "
                           "variant equally often; 20 for the default 10 variants)")
  parser.add_argument("--out")
  args = parser.parse_args()
  count = 1 + len(set(args.comm_sms)) * len(set(args.epilogues))  # XLA's dot, ours per pair
  args.samples = bench.square_rounds(count, 15) if args.samples is None else args.samples
  for name in ("calls", "samples"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  if any(c < 0 for c in args.comm_sms):
    parser.error(f"--comm-sms must be >= 0, got {args.comm_sms}")
  if os.environ.get(EPILOGUE_ENV):
    parser.error(f"{EPILOGUE_ENV} is set ({os.environ[EPILOGUE_ENV]!r}): this script sets it "
                 "per variant; unset it")
  bench_args.check_output_paths(parser, args)
  os.environ.setdefault("FLASHOVERLAP_GEMM_LOG", "1")

  import jax
  import jax.numpy as jnp

  import jax_flashoverlap as fo
  if jax.default_backend() != "gpu":
    parser.error(f"needs a GPU (JAX's backend here is {jax.default_backend()!r}; off GPU "
                 "fo.matmul is XLA's dot, there is no epilogue to compare)")

  rows, failures = [], []
  for m, n, k in args.shapes:
    shape = f"{m}x{n}x{k}"
    x, w = bench_problem.random_inputs(jax.random.key(m + n + k), m, n, k, jnp.bfloat16)
    ref = (x @ w).block_until_ready()
    ref32 = jnp.dot(x.astype(jnp.float32), w.astype(jnp.float32))
    variants = {"xla": (jax.jit(lambda x, w: x @ w), None)}
    for cs in args.comm_sms:
      ours = jax.jit(lambda x, w, cs=cs: fo.matmul(x, w, comm_sms=cs))
      for ep in args.epilogues:
        variants[f"ours_sms{cs}_{ep}"] = (ours, ep)
    timed, checked, shape_rows = {}, set(), []
    for name, (fn, ep) in variants.items():
      run = bench_variants.EnvPinned(fn, {EPILOGUE_ENV: ep})  # XLA's: None (unset)
      if ep is not None and fn not in checked:  # one compile per comm_sms
        if not bench.uses_custom_call(fn, (x, w), "flashoverlap_gemm"):
          parser.error(f"{name}: the compiled program does not call our kernel")
        checked.add(fn)
      del_me = jnp.full((m, n), jnp.nan, jnp.bfloat16).block_until_ready()
      del del_me
      out = run(x, w).block_until_ready()
      err, err32 = bench.relative_error(out, ref), bench.relative_error(out, ref32)
      if not err32 <= bench.VALUE_TOLERANCE:
        failures.append(f"{shape} {name}: relative error {err32:.3g} vs float32")
      timed[name] = (run, (x, w))
      shape_rows.append({"shape": shape, "variant": name, "epilogue": ep, "rel_error_vs_xla": err,
                   "rel_error_vs_f32": err32})
    times = bench.time_variants(timed, calls=args.calls, samples=args.samples)
    os.environ.pop(EPILOGUE_ENV, None)
    xla = times["xla"]["median_ms"]
    for row in shape_rows:
      t = times[row["variant"]]
      row.update(median_ms=t["median_ms"], samples_ms=t["samples_ms"],
                 xla_over_this=xla / t["median_ms"])
    rows += shape_rows
    line = "  ".join(f"{r['variant'].removeprefix('ours_')}={r['xla_over_this']:.3f}"
                     for r in shape_rows if r["variant"] != "xla")
    print(f"{shape}: xla {xla:.3f} ms  xla/this: {line}", flush=True)
  for f in failures:
    print("VALUE FAILURE:", f)
  if args.out:
    bench.write_json(args.out, {"kind": "epilogue_ab", "device": jax.devices()[0].device_kind,
                                "git_commit": bench.git_commit(), "command": " ".join(
                                    ["python", "benchmarks/epilogue_ab.py", *sys.argv[1:]]),
                                "samples": args.samples, "balanced_rounds":
                                    bench.balanced_rounds(count, args.samples),
                                "failures": failures, "rows": rows})
  print(f"epilogue_ab: {len(failures)} value failure(s)")
  raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
  main()
