"""Randomized kernel check (issues #3 / #8): the ops at random shapes, plans and kernel
switches, every output compared with float32 block by block.

    python benchmarks/fuzz.py [--cases 120] [--seed S] [--ops matmul all_reduce ...]
                              [--switches-per-case 2] [--seconds S] [--out r.json]

The fixed-shape tests and `stress.py` check a few shapes with the default kernel; this draws
what they do not: M, N, K anywhere in their range (1-row problems, partial tiles in every
dimension, K below one k-tile and long enough for the split tail), bfloat16 and float16,
`transpose_w`, any `comm_sms`, forced group plans (even bands, and band boundaries anywhere,
not on tile rows, so tiles straddle groups; the in-place all-reduce; CTA-policy
communicators), the all-to-all's four layouts and the
all-gather's chunkings, and per call the signaling GEMM's launch-time switches
(`FLASHOVERLAP_GEMM_TILE / _SCHEDULE / _EPILOGUE / _QUEUE / _TAIL / _SERPENTINE / _PANEL /
_HELPERS`, read at every launch or call, so one compiled program runs under several).

Every output is poisoned first (JAX_FLASHOVERLAP_POISON_OUTPUTS=1: an unwritten tile is NaN),
our kernels are forced (JAX_FLASHOVERLAP_FALLBACK=0) and each compiled program must contain
our custom call (on GPU). The check is per 128 x 128 block of the output: its relative
Frobenius error against float32 below `TOL`, every value finite. A whole-output error would
hide one wrong tile in a large output (one tile of 4096 computed from half its K moves the
whole-output error by ~1e-2); a block cannot. At world size 1 the all-to-all and all-gather
have nothing to exchange and lower to XLA's composition: they need 2+ devices. Exit status 1
on any failure; `--out` writes the counts, the failures (case, call, switches, errors) and
the seed.
"""

import argparse
import contextlib
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import _devices  # noqa: E402  (examples/_devices.py: simulated CPU devices without a GPU)

_devices.simulate_cpu_devices_without_gpu()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_flashoverlap as fo  # noqa: E402
from jax_flashoverlap import bench, bench_args, bench_record  # noqa: E402
from jax_flashoverlap import plan as plan_lib, plan_a2a  # noqa: E402

AXIS = "tp"
TOL = 1e-2     # per-block relative Frobenius error (bf16 rounding alone: ~2e-3)
BLOCK = 128    # rows and columns of a checked block (a kernel tile covers one or two)
ALIGN = 8      # N and K: multiples of 8 (16-byte rows for TMA)
MAX_FLOPS = 1 << 37   # per-device m * n * k: each case stays a fraction of a millisecond
MAX_OUTPUT = 1 << 26  # per-device m * n elements
REFERENCE_OPTIONS = {"xla_gpu_autotune_level": 0}
# Set by main() unless set otherwise (read at lowering; a test sets them itself).
RUN_ENV = {"JAX_FLASHOVERLAP_FALLBACK": "0", "JAX_FLASHOVERLAP_POISON_OUTPUTS": "1"}
OPS = ("matmul", "all_reduce", "reduce_scatter", "all_to_all", "all_gather")
TARGETS = {"matmul": "flashoverlap_gemm", "all_reduce": "flashoverlap_gemm_all_reduce",
           "reduce_scatter": "flashoverlap_gemm_reduce_scatter",
           "all_to_all": "flashoverlap_gemm_all_to_all",
           "all_gather": "flashoverlap_all_gather_gemm"}
# The launch-time switches of the signaling GEMM (jax_flashoverlap/_ext.py lists them).
SWITCHES = {
    "FLASHOVERLAP_GEMM_TILE": ("0", "0", "128", "256"),
    "FLASHOVERLAP_GEMM_SCHEDULE": ("cooperative", "cooperative", "pingpong"),
    "FLASHOVERLAP_GEMM_EPILOGUE": ("overlap", "overlap", "sync"),
    "FLASHOVERLAP_GEMM_QUEUE": ("dynamic", "dynamic", "static"),
    "FLASHOVERLAP_GEMM_TAIL": ("split", "split", "whole"),
    "FLASHOVERLAP_GEMM_SERPENTINE": ("1", "1", "0"),
    "FLASHOVERLAP_GEMM_PANEL": ("8", "8", "1", "3", "64"),
    "FLASHOVERLAP_GEMM_HELPERS": ("off", "on"),  # read by the all-reduce / reduce-scatter calls
}


@dataclasses.dataclass(frozen=True)
class Case:
  """One problem. m, n, k: the GEMM each device runs (x [m, k] @ w [k, n]; [n, k] with
  transpose_w). Collectives: `bands` (boundaries in one rank block's rows) or `num_groups`
  forced, else the cost model's plan; `comm_sms` None: the plan's."""
  op: str
  m: int
  n: int
  k: int
  dtype: str
  transpose_w: bool
  comm_sms: int | None
  num_groups: int | None = None
  bands: tuple | None = None
  split_axis: int = 0
  concat_axis: int = 0
  chunks: int | None = None
  gather: str | None = None
  in_place: bool = False          # all-reduce: JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output
  cta_policy: str | None = None   # all-reduce / reduce-scatter: the communicator's policy


def _dim(rng, small, tile, large, multiple=1):
  """A dimension: tiny, at a tile boundary +- a little, or anywhere up to `large`."""
  kind = rng.integers(4)
  if kind == 0:
    v = rng.integers(1, small + 1)
  elif kind == 1:
    v = tile * rng.integers(1, max(1, large // tile) + 1) + rng.choice([-2, -1, 0, 1, 3]) * multiple
  else:
    v = rng.integers(1, large + 1)
  return int(max(multiple, -(-v // multiple) * multiple))


def _bands(rng, rows):
  """Band boundaries anywhere in [0, rows] (not on tile rows), up to the groups' cap."""
  groups = int(rng.integers(1, min(rows, plan_lib.MAX_GROUPS) + 1))
  inner = rng.choice(np.arange(1, rows), size=groups - 1, replace=False) if groups > 1 else []
  return tuple(int(b) for b in sorted({0, rows, *map(int, inner)}))


def sample_case(rng, op: str, world: int, large: int = 12288,
                max_flops: int = MAX_FLOPS) -> Case:
  """A random valid problem for `op` at `world` devices (the ops' own constraints); dims up
  to `large`, m * n * k up to `max_flops`."""
  while True:
    m = _dim(rng, 16, BLOCK, large)
    n = _dim(rng, 64, 256, large, ALIGN)
    k = _dim(rng, 64, 64, large, ALIGN)
    if m * n * k <= max_flops and m * n <= MAX_OUTPUT:
      break
  dtype = "float16" if rng.random() < 0.3 else "bfloat16"
  transpose_w = bool(rng.random() < 0.3)
  comm_sms = None if rng.random() < 0.3 else int(rng.choice([0, 1, 2, 8, 10, 16, 33, 64, 120]))
  case = dict(op=op, m=m, n=n, k=k, dtype=dtype, transpose_w=transpose_w, comm_sms=comm_sms)
  if op == "reduce_scatter":
    case["m"] = m = -(-m // world) * world
  if op in ("all_reduce", "reduce_scatter"):
    rows = m // (world if op == "reduce_scatter" else 1)
    pick = rng.integers(3)
    if pick == 1:
      case["num_groups"] = int(rng.integers(1, plan_lib.MAX_GROUPS + 1))
    elif pick == 2 and rows > 1:
      case["bands"] = _bands(rng, rows)
    case["cta_policy"] = None if rng.random() < 0.6 else str(rng.choice(["efficiency", "zero"]))
    case["in_place"] = op == "all_reduce" and bool(rng.random() < 0.3)
  if op == "all_to_all":
    case["split_axis"], case["concat_axis"] = (int(a) for a in rng.integers(2, size=2))
    if case["split_axis"] == 0:
      case["m"] = -(-m // world) * world
    else:
      case["n"] = -(-n // (world * ALIGN)) * world * ALIGN
    if rng.random() < 0.5:
      case["num_groups"] = int(rng.integers(1, 17))
    case["comm_sms"] = None if comm_sms is None else max(1, comm_sms)
  if op == "all_gather":
    case["comm_sms"] = None if comm_sms is None else max(1, comm_sms)
    gather = rng.choice(["p2p", "p2p", "collective"])
    case["gather"] = str(gather)
    if gather == "p2p":
      divisors = [c for c in range(1, 17) if m % c == 0 and world * c <= plan_lib.MAX_GROUPS]
      case["chunks"] = int(rng.choice(divisors))
  return Case(**case)


def describe(case: Case) -> str:
  """The case's fields that differ from their defaults, for the log."""
  fields = dataclasses.asdict(case)
  defaults = {f.name: f.default for f in dataclasses.fields(Case)}
  shown = {k: v for k, v in fields.items() if k in ("op", "m", "n", "k") or v != defaults.get(k)}
  return " ".join(f"{k}={v}" for k, v in shown.items() if k not in ("op",))


def sample_switches(rng, count: int) -> list:
  """`count` settings of the launch-time switches: the defaults first, then random ones."""
  out = [{}]
  while len(out) < count:
    out.append({env: str(rng.choice(values)) for env, values in SWITCHES.items()})
  return out[:count]


def _forced(case: Case):
  """The case's forced plan; none forced: the plan the op chooses itself (cost model or a
  tuned config), as a user gets it."""
  if case.op in ("all_reduce", "reduce_scatter") and (case.bands or case.num_groups
                                                      or case.cta_policy):
    return plan_lib.forced(num_groups=case.num_groups, band_rows=case.bands,
                           cta_policy=case.cta_policy)
  if case.op in ("all_to_all", "all_gather") and (case.num_groups or case.chunks
                                                  or case.gather):
    return plan_a2a.forced(num_groups=case.num_groups, chunks=case.chunks, gather=case.gather)
  return contextlib.nullcontext()


def _lowering_env(case: Case):
  """The variables read at lowering that the case sets (the in-place all-reduce)."""
  return bench.bench_variants.overridden_env(
      {"JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER": "output" if case.in_place else "workspace"})


def _dot32(x, w, transpose_w):
  x, w = x.astype(jnp.float32), w.astype(jnp.float32)
  return jnp.matmul(x, w.T if transpose_w else w, precision=lax.Precision.HIGHEST)


def programs(case: Case, mesh):
  """(ours, problem maker: key -> (x, w, float32 reference)): jitted programs over `mesh`
  for `case`."""
  world, t = mesh.size, case.transpose_w
  kw = dict(comm_sms=case.comm_sms, transpose_w=t)
  w_k = P(None, AXIS) if t else P(AXIS, None)  # w sharded on its K dim
  w_n = P(AXIS, None) if t else P(None, AXIS)  # w sharded on its N dim
  gather = lambda v: lax.all_gather(v, AXIS, axis=0, tiled=True)
  if case.op == "matmul":
    ours, ref = lambda x, w: fo.matmul(x, w, **kw), lambda x, w: _dot32(x, w, t)
    specs, out_spec, rows_global, k_global, n_global = None, None, case.m, case.k, case.n
  elif case.op == "all_reduce":
    ours = lambda x, w: fo.matmul_all_reduce(x, w, AXIS, **kw)
    ref = lambda x, w: lax.psum(_dot32(x, w, t), AXIS)
    specs, out_spec = (P(None, AXIS), w_k), P()
    rows_global, k_global, n_global = case.m, case.k * world, case.n
  elif case.op == "reduce_scatter":
    ours = lambda x, w: fo.matmul_reduce_scatter(x, w, AXIS, **kw)
    ref = lambda x, w: lax.psum_scatter(_dot32(x, w, t), AXIS, scatter_dimension=0, tiled=True)
    specs, out_spec = (P(None, AXIS), w_k), P(AXIS, None)
    rows_global, k_global, n_global = case.m, case.k * world, case.n
  elif case.op == "all_to_all":
    s, c = case.split_axis, case.concat_axis
    ours = lambda x, w: fo.matmul_all_to_all(x, w, AXIS, split_axis=s, concat_axis=c, **kw)
    ref = lambda x, w: lax.all_to_all(_dot32(x, w, t), AXIS, s, c, tiled=True)
    specs, out_spec = (P(AXIS, None), P()), P(AXIS, None)
    rows_global, k_global, n_global = case.m * world, case.k, case.n
  else:  # all_gather: rows of x over the axis, w's columns over it
    ours = lambda x, w: fo.all_gather_matmul(x, w, AXIS, **kw)
    ref = lambda x, w: _dot32(gather(x), w, t)
    specs, out_spec = (P(AXIS, None), w_n), P(None, AXIS)
    rows_global, k_global, n_global = case.m * world, case.k, case.n * world
  if specs is None:
    shard = lambda f: jax.jit(f)
    in_shardings = (None, None)
  else:
    # check_vma off: the all-gather's and all-to-all's results are typed device-varying
    shard = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=specs, out_specs=out_spec,
                                            check_vma=False))
    in_shardings = tuple(NamedSharding(mesh, s) for s in specs)
  dtype = jnp.dtype(case.dtype)
  w_shape = (n_global, k_global) if t else (k_global, n_global)
  ref = shard(ref)

  def make_problem(key):  # inputs and their float32 reference: one program, one compile
    x = jax.random.normal(jax.random.fold_in(key, 0), (rows_global, k_global), jnp.float32)
    w = jax.random.normal(jax.random.fold_in(key, 1), w_shape, jnp.float32) / np.sqrt(k_global)
    x, w = x.astype(dtype), w.astype(dtype)
    return x, w, ref(x, w)

  jitted, compiled = jax.jit(make_problem, out_shardings=(*in_shardings, None)), []

  def problem(key):
    if not compiled:  # the reference's XLA dot is not autotuned: most of a case's compile
      compiled.append(jitted.lower(key).compile(compiler_options=REFERENCE_OPTIONS))
    return compiled[0](key)

  return shard(ours), problem


@jax.jit
def block_errors(out, ref):
  """(largest per-block relative error, blocks over TOL, non-finite values) of a 2-D output
  against its float32 reference, in BLOCK x BLOCK blocks (partial at the edges)."""
  out, ref = out.astype(jnp.float32), ref.astype(jnp.float32)
  rows, cols = out.shape
  pad = ((0, -rows % BLOCK), (0, -cols % BLOCK))
  blocks = lambda a: jnp.pad(a, pad).reshape(-(-rows // BLOCK), BLOCK, -(-cols // BLOCK), BLOCK)
  finite = jnp.isfinite(out)
  diff = jnp.where(finite, out - ref, 0.0)
  num = jnp.sqrt(jnp.sum(blocks(diff) ** 2, axis=(1, 3)))
  den = jnp.sqrt(jnp.sum(blocks(ref) ** 2, axis=(1, 3)))
  rel = num / jnp.maximum(den, 1e-30)
  return jnp.max(rel), jnp.sum(rel >= TOL), jnp.sum(~finite)


def run_case(case: Case, mesh, key, switch_sets) -> dict:
  """Compiles `case` under its forced plan, runs it once per switch setting on fresh inputs,
  checks each output. Returns {calls, failures: [...], custom_call}."""
  ours, make_problem = programs(case, mesh)
  x, w, want = make_problem(key)
  with _forced(case), _lowering_env(case):
    compiled = ours.lower(x, w).compile()  # the plan is chosen here, at lowering
  custom_call = TARGETS[case.op] in compiled.as_text()
  result = {"calls": 0, "failures": [], "custom_call": custom_call}
  for i, switches in enumerate(switch_sets):
    if i:  # fresh inputs per call: a stale tile from the previous call must not pass
      x, w, want = make_problem(jax.random.fold_in(key, i))
    try:
      # Read at every launch / call: wait for the call inside, should XLA run the handler
      # off this thread.
      with bench.bench_variants.overridden_env(switches):
        out = jax.block_until_ready(compiled(x, w))
      worst, bad_blocks, nonfinite = (float(v) for v in block_errors(out, want))
      error = None
    except Exception as err:  # noqa: BLE001  (a launch that fails is a finding, reported)
      worst, bad_blocks, nonfinite, error = float("nan"), -1, -1, f"{type(err).__name__}: {err}"
    result["calls"] += 1
    if error or not (worst < TOL) or nonfinite:
      result["failures"].append({"call": i, "switches": switches, "max_block_error": worst,
                                 "bad_blocks": int(bad_blocks), "nonfinite": int(nonfinite),
                                 "error": error})
  return result


def fuzz(mesh, cases: int, seed: int, ops=OPS, switches_per_case: int = 2, log=print,
         large: int = 12288, max_flops: int = MAX_FLOPS, seconds: float | None = None) -> dict:
  """Runs `cases` random cases spread over `ops` (none started after `seconds`); the report
  of main()."""
  world = mesh.size
  ops = [op for op in ops if world > 1 or op not in ("all_to_all", "all_gather")]
  rng = np.random.default_rng(seed)
  on_gpu = jax.default_backend() == "gpu"
  report = {"seed": seed, "world": world, "ops": {op: {"cases": 0, "calls": 0, "failed": 0}
                                                  for op in ops}, "failures": []}
  t0 = time.perf_counter()
  for i in range(cases):
    if i and seconds is not None and time.perf_counter() - t0 > seconds:  # one case at least
      log(f"stopping after {i} cases: --seconds {seconds:g} passed")
      break
    op = ops[i % len(ops)]
    case = sample_case(rng, op, world, large, max_flops)
    switch_sets = sample_switches(rng, switches_per_case)
    result = run_case(case, mesh, jax.random.key(seed * 1_000_003 + i), switch_sets)
    stats = report["ops"][op]
    stats["cases"] += 1
    stats["calls"] += result["calls"]
    not_ours = on_gpu and not result["custom_call"]
    if result["failures"] or not_ours:
      stats["failed"] += 1
      report["failures"].append({"case": dataclasses.asdict(case), "index": i,
                                 "custom_call": result["custom_call"],
                                 "calls": result["failures"]})
    status = "FAIL" if result["failures"] or not_ours else "ok"
    log(f"[{i + 1}/{cases}] {status} {op} {describe(case)}" + (" (not our custom call)" if not_ours else ""))
  report["seconds"] = time.perf_counter() - t0
  report["total_failed"] = sum(s["failed"] for s in report["ops"].values())
  return report


def main():
  gpu = jax.default_backend() == "gpu"
  ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
  ap.add_argument("--cases", type=int, default=120, help="random cases drawn (default: 120)")
  ap.add_argument("--seed", type=int, default=int(time.time()),
                  help="the draws' seed, printed and recorded (default: the current time)")
  ap.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS),
                  help="ops the cases draw from (default: all)")
  ap.add_argument("--switches-per-case", type=int, default=2,
                  help="calls per compiled case, each under other launch-time switches "
                       "(the first: the defaults; default: 2)")
  ap.add_argument("--large", type=int, default=12288 if gpu else 96,
                  help="largest M, N, K drawn, per device (default: 12288 on GPUs, 96 on CPU)")
  ap.add_argument("--max-flops", type=int, default=MAX_FLOPS if gpu else 1 << 20,
                  help=f"largest per-device M * N * K drawn (default: {MAX_FLOPS} on GPUs, "
                       f"{1 << 20} on CPU)")
  ap.add_argument("--seconds", type=float,
                  help="start no case after this many seconds (the report covers those run)")
  ap.add_argument("--out", help="write the report as JSON here")
  args = ap.parse_args()
  for env, value in RUN_ENV.items():
    os.environ.setdefault(env, value)
  if args.cases < 1 or args.switches_per_case < 1:
    ap.error("--cases and --switches-per-case must be >= 1")
  if args.large < 64 or args.max_flops < 64 ** 3:  # room for a problem of each op
    ap.error(f"--large must be >= 64 and --max-flops >= {64 ** 3}, got {args.large} and "
             f"{args.max_flops}")
  if args.seconds is not None and not args.seconds >= 0:  # NaN too (0: one case)
    ap.error(f"--seconds must be a number >= 0, got {args.seconds}")
  if not 0 <= args.seed < 2 ** 32:
    ap.error(f"--seed must be in [0, 2**32), got {args.seed}")
  bench_args.check_output_paths(ap, args)
  mesh = Mesh(np.array(jax.devices()), (AXIS,))
  if mesh.size == 1 and set(args.ops) <= {"all_to_all", "all_gather"}:
    ap.error(f"--ops {' '.join(args.ops)}: these ops need 2 or more devices, this run has 1")
  print(f"backend={jax.default_backend()} devices={mesh.size} seed={args.seed}", flush=True)
  report = fuzz(mesh, args.cases, args.seed, args.ops, args.switches_per_case,
                log=lambda s: print(s, flush=True), large=args.large, max_flops=args.max_flops,
                seconds=args.seconds)
  report.update(args=vars(args), backend=jax.default_backend(),
                devices=[d.device_kind for d in mesh.devices.flat],
                git_commit=bench.git_commit())
  if args.out:  # strict JSON: a failed call's error is NaN, written as null
    bench_record.write_json(args.out, report)
  for op, s in report["ops"].items():
    print(f"{op:15s} {s['cases']:4d} cases {s['calls']:5d} calls {s['failed']:3d} failed")
  bad = report["total_failed"]
  print(f"OK: no failure in {report['seconds']:.0f} s" if not bad else f"FAILED: {bad} cases")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
