"""Stress run (issue #8): many calls with fresh inputs, every output checked against XLA.

    python benchmarks/stress.py [--calls 2000] [--scan-steps 200] [--layers 32] [--out r.json]

1. `--calls` calls of each op (matmul_all_reduce, matmul_reduce_scatter, matmul_all_to_all,
   all_gather_matmul, and all_gather_matmul with return_gathered=True) on a 1-D mesh over
   all devices, cycling through shapes of different sizes (odd M included), each call with
   fresh random inputs, compared with XLA's composition of the same inputs (psum(x @ w),
   psum_scatter, all_to_all, all_gather; the gathered rows must be equal bit for bit). A
   tile the GEMM failed to write, a stale counter or flag, or a group reduced / a chunk read
   before it was complete shows as a mismatch: the output memory held another call's values.
2. A `--layers`-layer model under lax.scan whose every layer uses both ops next to XLA's own
   psum and all_gather, with its input donated, run `--scan-steps` steps on fresh inputs
   against the same model built from XLA collectives only, both measured against that model
   in float32: a step is a mismatch when ours is further from float32 than
   max(2 x XLA's distance, the tolerance). (32 residual layers amplify bf16 rounding: two
   correct bf16 models differ by ~1e-2, so bf16 against bf16 alone says little.)

Our kernels are forced (JAX_FLASHOVERLAP_FALLBACK=0) so no shape silently takes XLA's path,
and poisoned (JAX_FLASHOVERLAP_POISON_OUTPUTS=1, unless set otherwise: each call's outputs and
workspace hold NaN before it runs, so an unwritten tile is a NaN, never a stale value),
and each compiled program is checked to contain our custom call (on GPU; at world size 1
the all-to-all and all-gather lower to XLA's composition: nothing to exchange). Prints a
summary and writes the counts as JSON. Exit status 1 on any mismatch. `--ops` picks ops
(`--ops` alone: none, the scan model only).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_FLASHOVERLAP_FALLBACK", "0")
os.environ.setdefault("JAX_FLASHOVERLAP_POISON_OUTPUTS", "1")
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

AXIS = "tp"
DTYPE = jnp.bfloat16
TOL = 1e-2  # relative Frobenius error; ours has matched XLA bit for bit so far
# Global (M, N, K); per device the GEMM is M x N x K/n. M values include odd ones.
GPU_SHAPES = ((127, 1024, 1024), (1000, 2048, 2048), (4096, 4096, 4096), (2048, 8192, 4096),
              (4096, 8192, 8192), (8192, 1024, 2048), (520, 7168, 1024))
CPU_SHAPES = ((7, 16, 64), (40, 64, 128), (64, 32, 128))


def rel_error(a, b):
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30)


compare = jax.jit(lambda a, b: (rel_error(a, b), jnp.all(a == b)))


def worst(a, b):
  """The larger error; NaN if either is (bench.worst_error)."""
  return bench.worst_error((a, b))


def has_custom_call(fn, args, target):
  return target in fn.lower(*args).compile().as_text()


def _op_table(n):
  """{op: (ours, XLA's, (x spec, w spec), out spec, custom call, rows multiple, cols
  multiple)} per device; rows / cols: what global M / N must be multiples of."""
  rs = lambda y: lax.psum_scatter(y, AXIS, scatter_dimension=0, tiled=True)
  gather = lambda x: lax.all_gather(x, AXIS, axis=0, tiled=True)
  k_sharded, rows_sharded = (P(None, AXIS), P(AXIS, None)), (P(AXIS, None), P(None, AXIS))
  return {
      "all_reduce": (lambda x, w: fo.matmul_all_reduce(x, w, AXIS),
                     lambda x, w: lax.psum(x @ w, AXIS), k_sharded, P(),
                     "flashoverlap_gemm_all_reduce", 1, 1),
      "reduce_scatter": (lambda x, w: fo.matmul_reduce_scatter(x, w, AXIS),
                         lambda x, w: rs(x @ w), k_sharded, P(AXIS, None),
                         "flashoverlap_gemm_reduce_scatter", n, 1),
      # rows of x over tp, w replicated: each device's product rows go to their ranks
      "all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, AXIS),
                     lambda x, w: lax.all_to_all(x @ w, AXIS, 0, 0, tiled=True),
                     (P(AXIS, None), P()), P(AXIS, None), "flashoverlap_gemm_all_to_all",
                     n * n, 1),
      "all_gather": (lambda x, w: fo.all_gather_matmul(x, w, AXIS),
                     lambda x, w: gather(x) @ w, rows_sharded, P(None, AXIS),
                     "flashoverlap_all_gather_gemm", n, 8 * n),
      "all_gather_gathered": (lambda x, w: fo.all_gather_matmul(x, w, AXIS,
                                                                return_gathered=True),
                              lambda x, w: (gather(x) @ w, gather(x)), rows_sharded,
                              (P(None, AXIS), P(AXIS, None)), "flashoverlap_all_gather_gemm",
                              n, 8 * n),
  }


OPS = ("all_reduce", "reduce_scatter", "all_to_all", "all_gather", "all_gather_gathered")


def _check(ours_out, xla_out):
  """(relative error of the product, bit-identical, every further result bit-identical)."""
  ours_out, xla_out = jax.tree.leaves(ours_out), jax.tree.leaves(xla_out)
  err, same = compare(ours_out[0], xla_out[0])
  extra_ok = all(bool(jnp.all(a == b)) for a, b in zip(ours_out[1:], xla_out[1:]))
  return float(err), bool(same) and extra_ok, extra_ok


def stress_ops(mesh, shapes, calls, seed, ops=OPS, on_op=None):
  """Each op's counts; on_op(results so far) after each op."""
  n = mesh.size
  results = {}
  for op in ops:
    ours_op, xla_op, (x_spec, w_spec), out_spec, target, rows, cols = _op_table(n)[op]
    # all_gather's result is typed device-varying though its values agree (out_spec P()).
    smap = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(x_spec, w_spec),
                                           out_specs=out_spec, check_vma=False))
    ours, xla = smap(ours_op), smap(xla_op)
    xs, ws = NamedSharding(mesh, x_spec), NamedSharding(mesh, w_spec)
    programs = {}
    for m, nn, k in shapes:
      m, nn = -(-m // rows) * rows, -(-nn // cols) * cols  # what the op's layout needs
      programs[(m, nn, k)] = jax.jit(
          lambda key, m=m, nn=nn, k=k: (
              jax.random.normal(jax.random.fold_in(key, 0), (m, k), jnp.float32).astype(DTYPE),
              (jax.random.normal(jax.random.fold_in(key, 1), (k, nn), jnp.float32)
               / np.sqrt(k)).astype(DTYPE)),
          out_shardings=(xs, ws))
    stats = {"calls": 0, "mismatches": 0, "bit_identical": 0, "max_rel_error": 0.0,
             "shapes": [list(s) for s in programs], "uses_custom_call": {}, "failures": []}
    shape_list = list(programs)
    t0 = time.perf_counter()
    for i in range(calls):
      shape = shape_list[i % len(shape_list)]
      x, w = programs[shape](jax.random.key(seed * 1_000_003 + i))
      if str(shape) not in stats["uses_custom_call"]:
        stats["uses_custom_call"][str(shape)] = (
            has_custom_call(ours, (x, w), target) if jax.default_backend() == "gpu" else None)
      err, same, extra_ok = _check(ours(x, w), xla(x, w))
      stats["calls"] += 1
      stats["bit_identical"] += same
      stats["max_rel_error"] = worst(stats["max_rel_error"], err)
      if not (err < TOL and extra_ok):  # also catches NaN
        stats["mismatches"] += 1
        if len(stats["failures"]) < 10:
          stats["failures"].append({"call": i, "shape": list(shape), "rel_error": err,
                                    "further_results_equal": extra_ok})
    stats["seconds"] = time.perf_counter() - t0
    results[op] = stats
    print(f"{op:19s}: {stats['calls']} calls, {stats['mismatches']} mismatches, "
          f"{stats['bit_identical']} bit-identical, max rel err {stats['max_rel_error']:.1e}, "
          f"{stats['seconds']:.1f} s", flush=True)
    if on_op is not None:
      on_op(results)
  return results


SCAN_SPECS = (P(None, None, AXIS), P(None, AXIS, None), P(None, AXIS, None))


def scan_layer(impl):
  """One layer of the scan model (x [T, D] replicated over tp): a = gelu(x @ w1)
  (column-parallel, [T, F/n]); y = matmul_all_reduce(a, w2); z =
  all_gather(matmul_reduce_scatter(a, w3)); a psum'd norm; x <- x + 0.5 * (y + z) / norm. The
  reference ('xla') uses psum / psum_scatter instead of our ops."""
  def body(x, p):
    w1, w2, w3 = p
    a = jax.nn.gelu(x @ w1)
    if impl == "fo":
      y = fo.matmul_all_reduce(a, w2, AXIS)
      z = fo.matmul_reduce_scatter(a, w3, AXIS)
    else:
      y = lax.psum(a @ w2, AXIS)
      z = lax.psum_scatter(a @ w3, AXIS, scatter_dimension=0, tiled=True)
    z = lax.all_gather(z, AXIS, tiled=True)  # XLA's own collective, in the same program
    norm = jnp.sqrt(lax.psum(jnp.sum(jnp.square(a.astype(jnp.float32))), AXIS) / a.size
                    / lax.axis_size(AXIS))
    x = x + (0.5 * (y + z).astype(jnp.float32) / (norm + 1.0)).astype(x.dtype)
    return x, None
  return body


def scan_program(mesh, impl):
  """The scan model over stacked layers' params, jitted, x donated."""
  def f(params, x):
    out, _ = lax.scan(scan_layer(impl), x, params)
    return out
  # check_vma=False: all_gather's result is typed device-varying though its values agree.
  return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(SCAN_SPECS, P()), out_specs=P(),
                               check_vma=False), donate_argnums=(1,))


def check_scan_shapes(mesh, layers, tokens, dim, ffn) -> None:
  """Traces the scan model at these sizes: an op's own error (a size it cannot take) before
  part 1 runs, not after it."""
  sds = lambda *shape: jax.ShapeDtypeStruct(shape, DTYPE)
  params = (sds(layers, dim, ffn), sds(layers, ffn, dim), sds(layers, ffn, dim))
  scan_program(mesh, "fo").trace(params, sds(tokens, dim))


def scan_model(mesh, layers, tokens, dim, ffn, steps, seed):
  """`steps` steps of the scan model (scan_layer), ours against XLA's and float32's."""
  key = jax.random.key(seed)
  k1, k2, k3 = jax.random.split(key, 3)
  scale = lambda k, shape, fan_in: (jax.random.normal(k, shape) / np.sqrt(fan_in)).astype(DTYPE)
  params = (scale(k1, (layers, dim, ffn), dim), scale(k2, (layers, ffn, dim), ffn),
            scale(k3, (layers, ffn, dim), ffn))
  params = jax.device_put(params, tuple(NamedSharding(mesh, s) for s in SCAN_SPECS))
  make_x = jax.jit(lambda k: jax.random.normal(k, (tokens, dim), jnp.float32).astype(DTYPE),
                   out_shardings=NamedSharding(mesh, P()))
  fns = {impl: scan_program(mesh, impl) for impl in ("fo", "xla")}
  params32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
  stats = {"layers": layers, "tokens": tokens, "dim": dim, "ffn": ffn, "steps": 0,
           "mismatches": 0, "bit_identical": 0, "max_rel_error": 0.0,
           "max_rel_error_vs_f32": {"fo": 0.0, "xla": 0.0},
           "uses_custom_call": None, "donated_input_deleted": None}
  if jax.default_backend() == "gpu":
    text = fns["fo"].lower(params, make_x(key)).compile().as_text()
    stats["uses_custom_call"] = ("flashoverlap_gemm_all_reduce" in text and
                                 "flashoverlap_gemm_reduce_scatter" in text)
  t0 = time.perf_counter()
  for step in range(steps):
    k = jax.random.fold_in(key, step + 1)
    x_fo, x_xla = make_x(k), make_x(k)
    out_fo = fns["fo"](params, x_fo)
    out_xla = fns["xla"](params, x_xla)
    with jax.default_matmul_precision("highest"):  # the float32 reference (no TF32)
      out_32 = fns["xla"](params32, make_x(k).astype(jnp.float32))
    if stats["donated_input_deleted"] is None:
      stats["donated_input_deleted"] = bool(x_fo.is_deleted())
    err, same = compare(out_fo, out_xla)
    err = float(err)
    err_fo, err_xla = float(rel_error(out_fo, out_32)), float(rel_error(out_xla, out_32))
    stats["steps"] += 1
    stats["bit_identical"] += bool(same)
    stats["max_rel_error"] = worst(stats["max_rel_error"], err)
    for impl, e in (("fo", err_fo), ("xla", err_xla)):
      stats["max_rel_error_vs_f32"][impl] = worst(stats["max_rel_error_vs_f32"][impl], e)
    stats["mismatches"] += not err_fo < max(2 * err_xla, TOL)  # also catches NaN
  stats["seconds"] = time.perf_counter() - t0
  f32 = stats["max_rel_error_vs_f32"]
  print(f"scan model         : {layers} layers x {stats['steps']} steps, {stats['mismatches']} "
        f"mismatches, {stats['bit_identical']} bit-identical, max rel err "
        f"{stats['max_rel_error']:.1e} (vs float32: ours {f32['fo']:.1e}, XLA "
        f"{f32['xla']:.1e}), {stats['seconds']:.1f} s", flush=True)
  return stats


def main():
  gpu = jax.default_backend() == "gpu"
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--calls", type=int, default=2000 if gpu else 12,
                  help="calls of each op in part 1 (default: 2000 on GPUs, 12 on CPU)")
  ap.add_argument("--scan-steps", type=int, default=200 if gpu else 3,
                  help="steps of the scan model, part 2 (default: 200 on GPUs, 3 on CPU)")
  ap.add_argument("--layers", type=int, default=32 if gpu else 4,
                  help="the scan model's layers (default: 32 on GPUs, 4 on CPU)")
  ap.add_argument("--tokens", type=int, default=2048 if gpu else 16,
                  help="the scan model's rows (default: 2048 on GPUs, 16 on CPU)")
  ap.add_argument("--dim", type=int, default=2048 if gpu else 64,
                  help="the scan model's width (default: 2048 on GPUs, 64 on CPU)")
  ap.add_argument("--ffn", type=int, default=4096 if gpu else 128,
                  help="the scan model's hidden width (default: 4096 on GPUs, 128 on CPU)")
  ap.add_argument("--seed", type=int, default=int(time.time()),
                  help="inputs' seed, printed and recorded (default: the current time)")
  # none: the scan model alone (a run cut in it had finished every op; it runs after them)
  ap.add_argument("--ops", nargs="*", choices=OPS, default=list(OPS),
                  help="the ops of part 1 (default: all; none: the scan model only)")
  ap.add_argument("--out", help="write the counts as JSON here")
  args = ap.parse_args()
  for name in ("calls", "scan_steps", "layers", "tokens", "dim", "ffn"):
    if getattr(args, name) < 1:  # zero work would print "OK: no mismatch"
      ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
  if not 0 <= args.seed < 2 ** 32:
    ap.error(f"--seed must be in [0, 2**32), got {args.seed}")
  bench_args.check_output_paths(ap, args)
  mesh = Mesh(np.array(jax.devices()), (AXIS,))
  try:
    check_scan_shapes(mesh, args.layers, args.tokens, args.dim, args.ffn)
  except (ValueError, TypeError) as err:
    ap.error(f"--tokens {args.tokens} --dim {args.dim} --ffn {args.ffn} on {mesh.size} "
             f"devices: {err}")
  print(f"backend={jax.default_backend()} devices={mesh.size} seed={args.seed}", flush=True)
  report = {"ops": {}, "scan_model": None, "args": vars(args), "backend": jax.default_backend(),
            "devices": [d.device_kind for d in mesh.devices.flat],
            "git_commit": bench.git_commit(),
            "env": {k: v for k, v in os.environ.items() if k.startswith(("JAX_FLASHOVERLAP",
                                                                         "NCCL_"))},
            "complete": False}

  def write():  # after each part: a run cut short (a device call's limit) keeps its counts
    if args.out and (report["complete"] or not bench_record.is_stream(args.out)):
      bench_record.write_json(args.out, report)  # (a stream: once, at the end)
  report["ops"] = stress_ops(mesh, GPU_SHAPES if gpu else CPU_SHAPES, args.calls, args.seed,
                             args.ops, on_op=lambda ops: (report.update(ops=ops), write()))
  report["scan_model"] = scan_model(mesh, args.layers, args.tokens, args.dim, args.ffn,
                                    args.scan_steps, args.seed)
  bad = (sum(s["mismatches"] for s in report["ops"].values())
         + report["scan_model"]["mismatches"])
  report.update(total_mismatches=bad, complete=True)
  write()
  print("OK: no mismatch" if bad == 0 else f"FAILED: {bad} mismatches", flush=True)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
