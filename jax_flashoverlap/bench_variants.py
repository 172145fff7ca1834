"""Other ways to run a row-parallel GEMM + collective, timed by `python -m jax_flashoverlap.bench
overlap` next to ours:

  two_chunk      the paper's "decomposition" baseline: the GEMM in two halves, each followed by
                 its own collective, in one program (XLA may run the first collective during the
                 second half)
  ppermute_ring  JAX's collective-matmul recipe (shard_map + ppermute): a ring of partial
                 products, each step's send overlapping the next step's GEMM; all-gather after it
                 for the all-reduce
  xla_windowed   XLA's own windowed-einsum passes on the global-view program, in a subprocess
                 (XLA reads its flags at start); GPU only. Reported as a variant only where
                 XLA built a windowed loop (collective-permutes in the compiled program): it
                 windows all-gather and reduce-scatter einsums, never an all-reduce, and a
                 flag it accepts can still change nothing
  ours_model     our op with the cost model's plan even where a tuned config exists
  ours_helpers   our op (the same program as ours) with FLASHOVERLAP_GEMM_HELPERS=on: between
                 its collectives the GEMM borrows the SMs left to NCCL (helper launches,
                 xla_ffi/kernels/signaling_gemm.h); an experiment, off by default
  ours_peer      our op lowered with JAX_FLASHOVERLAP_TRANSPORT=peer (2 to 8 local GPUs; an
                 experiment: the GEMM stores into the other ranks' memory and reduces in its
                 epilogue, no NCCL; docs/DESIGN.md, "Peer stores")
  xla_chain,     XLA's dot + collective and ours as a chain of CHAIN dependent calls in one
  ours_chain     program (each call's x waits for one element of the previous output), timed
                 per call: a layer chain, where nothing overlaps across calls. Back-to-back
                 independent calls let XLA's collective overlap the next call's dot a little
                 (its dot + collective measured ~10% under the two alone), ours joins its
                 streams before returning: the chain compares both without that.

Also the PNG plot of the speedups.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

CHAIN = 8  # dependent calls per chained program
# `bench overlap --variants` names (chain: xla_chain and ours_chain).
VARIANTS = ("two_chunk", "ppermute_ring", "xla_windowed", "ours_model", "chain", "helpers",
            "peer")
HELPERS_ENV = "FLASHOVERLAP_GEMM_HELPERS"  # _ext.GEMM_HELPERS_ENV (read by the calls)
TRANSPORT_ENV = "JAX_FLASHOVERLAP_TRANSPORT"  # _ext.TRANSPORT_ENV (read at lowering)

WINDOWED_FLAGS = ("--xla_gpu_threshold_for_windowed_einsum_mib=0 "
                  "--xla_gpu_multi_streamed_windowed_einsum=true")
# The windowed program's subprocess: its compile and samples at DESIGN.md's largest shapes
# take well under a minute; ten is a hang.
WINDOWED_TIMEOUT_S = 600


def two_chunk(pb):
  """GEMM halves, each reduced on its own (rows for all-reduce, columns for reduce-scatter,
  so each rank still gets its contiguous rows). Chunk 2's product takes a dependence on
  chunk 1's reduced result (0 * one element, added in place) before its own collective:
  without it XLA:CPU's collective combiner merged the two independent collectives into one
  after both GEMMs, leaving nothing to overlap (an optimization barrier did not stop it);
  XLA:GPU kept them apart (benchmarks/compile_variants.py), and with the dependence both
  compile to GEMM 1, collective 1 started, GEMM 2, collective 1 done, collective 2. Chunk 2's
  GEMM itself needs nothing of chunk 1's collective, so it can run during it."""
  import jax.numpy as jnp

  def halves(y1, y2, axis):
    c1 = pb.coll(y1)
    y2 = y2.at[0, 0].add((c1[0, 0] * 0).astype(y2.dtype))
    return jnp.concatenate([c1, pb.coll(y2)], axis=axis)

  if pb.collective == "all_reduce":
    def body(x, w):
      h = x.shape[0] // 2
      return halves(x[:h] @ w, x[h:] @ w, 0)
  else:
    def body(x, w):
      h = w.shape[1] // 2
      return halves(x @ w[:, :h], x @ w[:, h:], 1)
  return pb.smap(body)


def chained(pb, op):
  """CHAIN dependent calls of op(x, w) in one program: x[0, 0] += 0 * out[0, 0] between calls
  (in place in the loop carry), so call i+1's GEMM cannot start before call i's collective is
  done. Divide its time by CHAIN."""
  from jax import lax
  from jax.sharding import PartitionSpec as P

  def body(x, w):
    def step(_, x):
      y = op(x, w)
      return x.at[0, 0].add((y[0, 0] * 0).astype(x.dtype))
    return lax.fori_loop(0, CHAIN, step, x)
  return pb.smap(body, out_specs=P(None, "tp"))


def ppermute_ring(pb):
  """Reduce-scatter as a ring: device i adds its partial product of block (i - 1 - s) mod n at
  step s to the accumulator received from device i - 1, so after n - 1 steps it holds the sum
  of block i. The all-reduce all-gathers that."""
  from jax import lax

  n = pb.world

  def reduce_scatter(x, w):
    rows = x.shape[0] // n
    idx = lax.axis_index("tp")
    block = lambda b: lax.dynamic_slice_in_dim(x, (b % n) * rows, rows, axis=0) @ w
    acc = block(idx - 1)
    for s in range(1, n):
      acc = lax.ppermute(acc, "tp", perm=[(j, (j + 1) % n) for j in range(n)])
      acc = acc + block(idx - 1 - s)
    return acc

  if pb.collective == "reduce_scatter":
    return pb.smap(reduce_scatter)
  # all_gather's result is the same on every device but typed as varying: no vma check here.
  return pb.smap(lambda x, w: lax.all_gather(reduce_scatter(x, w), "tp", axis=0, tiled=True),
                 check_vma=False)


@contextlib.contextmanager
def overridden_env(values: dict):
  """os.environ with `values` set inside, restored after (unset ones unset again)."""
  old = {name: os.environ.get(name) for name in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for name, value in old.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


def pin_env(values: dict) -> None:
  """Sets os.environ to `values` (None: unset), no restore (EnvPinned)."""
  for name, value in values.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value


class EnvPinned:
  """`fn` called with the environment `values` set (None: unset) and left so: for variables
  our calls read when they run (FLASHOVERLAP_GEMM_HELPERS), not at lowering. time_variants
  waits for each variant's calls before the next one's start, so when every variant pins its
  own values, each runs under them, even should XLA run the handlers off the calling thread."""

  def __init__(self, fn, values: dict):
    self.fn, self.values = fn, dict(values)

  def __call__(self, *args):
    pin_env(self.values)
    return self.fn(*args)

  def lower(self, *args):
    return self.fn.lower(*args)


def model_plans_only():
  """Lowerings inside take the cost model's NCCL plan: no tuned config
  (jax_flashoverlap.tuning), and the NCCL transport whatever JAX_FLASHOVERLAP_TRANSPORT says
  (under `peer` the variant timed the peer stores while reporting the model's NCCL plan)."""
  from jax_flashoverlap import tuning
  return overridden_env({tuning.TUNED_ENV: "0", TRANSPORT_ENV: "nccl"})


def xla_windowed(pb, calls: int, samples: int):
  """xla_windowed_for's result for this problem, or None off GPU."""
  return xla_windowed_for(pb.collective, pb.m, pb.n, pb.k, pb.world, pb.dtype, calls, samples)


def xla_windowed_for(collective, m, n, k, world, dtype, calls: int, samples: int):
  """{"median_ms", "windowed_loop"} of the global-view program for a collective ("all_reduce",
  "reduce_scatter", "all_gather") and global shape under XLA's windowed-einsum flags, or None
  off GPU. windowed_loop False: XLA compiled it without a windowed loop, the flags changed
  nothing. A subprocess that fails, runs past WINDOWED_TIMEOUT_S or prints no result raises a
  RuntimeError saying which (the bench records it as a failed variant, the row kept)."""
  import jax
  if jax.default_backend() != "gpu":
    return None
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + WINDOWED_FLAGS).strip()
  cmd = [sys.executable, "-m", "jax_flashoverlap.bench_variants", collective,
         str(m), str(n), str(k), str(world), str(dtype), str(calls), str(samples)]
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=WINDOWED_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    raise RuntimeError(f"its subprocess ran past {WINDOWED_TIMEOUT_S} s") from None
  if proc.returncode != 0:
    raise RuntimeError(f"its subprocess exited {proc.returncode}: {proc.stderr[-2000:]}")
  last = (proc.stdout.strip().splitlines() or [""])[-1]
  try:
    result = json.loads(last)
    return {"median_ms": float(result["median_ms"]),
            "windowed_loop": bool(result["windowed_loop"])}
  except (ValueError, TypeError, KeyError):
    raise RuntimeError(f"its subprocess printed no result (last line {last!r}; stderr: "
                       f"{proc.stderr[-500:]})") from None


def add_windowed(times: dict, windowed, what: str):
  """times["xla_windowed"] = its median where XLA built a windowed loop; else a printed
  notice and no variant (the time would be the plain global-view program's under that name).
  Returns what the row records (None: not run)."""
  if windowed is None:
    return None
  if windowed["windowed_loop"]:
    times["xla_windowed"] = windowed["median_ms"]
  else:
    print(f"xla_windowed {what}: XLA built no windowed-einsum loop under {WINDOWED_FLAGS} "
          f"(no collective-permute in the compiled program): the flags changed nothing, so it "
          f"is not reported as a variant ({windowed['median_ms']:.3f} ms)", flush=True)
  return windowed


def has_windowed_loop(hlo_text: str) -> bool:
  """Whether a compiled program holds XLA's windowed einsum: its loops pass blocks with
  collective-permutes (the plain programs have none) in computations named
  windowed_dot_general_body_*."""
  return "collective-permute" in hlo_text or "windowed_dot_general" in hlo_text


def _windowed_main(collective, m, n, k, world, dtype, calls, samples) -> None:
  """Subprocess body: time the global-view x @ w the way XLA's passes see it: x's columns and
  w's rows sharded over 'tp', the output replicated (all-reduce) or row-sharded
  (reduce-scatter); or (all-gather) x's rows and w's columns sharded, the output column-sharded."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from jax_flashoverlap import bench, bench_problem
  mesh = Mesh(np.array(jax.devices()[:world]), ("tp",))
  x, w = bench_problem.random_inputs(jax.random.key(0), m, n, k, jnp.dtype(dtype))
  gather = collective == "all_gather"
  x = jax.device_put(x, NamedSharding(mesh, P("tp", None) if gather else P(None, "tp")))
  w = jax.device_put(w, NamedSharding(mesh, P(None, "tp") if gather else P("tp", None)))
  out = {"reduce_scatter": P("tp", None), "all_gather": P(None, "tp")}.get(collective, P())
  fn = jax.jit(jnp.matmul, out_shardings=NamedSharding(mesh, out))
  loop = has_windowed_loop(fn.lower(x, w).compile().as_text())
  timing = bench.time_variants({"xla_windowed": (fn, (x, w))}, calls=calls, samples=samples)
  print(json.dumps({"median_ms": timing["xla_windowed"]["median_ms"], "windowed_loop": loop}))


def plot(result: dict, path: str):
  """Grouped bars: speedup over XLA's dot + collective per shape and variant. None (and a
  message) when matplotlib is not installed."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib is not installed: no plot", flush=True)
    return None
  rows = result["rows"]
  skip = {"xla_dot", "xla_collective", "xla_dot_collective", "nccl_capped_alone", "xla_chain"}
  base = lambda v: "xla_chain" if v == "ours_chain" else "xla_dot_collective"  # like for like
  variants = sorted({v for r in rows for v in r["times_ms"] if v not in skip})
  short = {"all_reduce": "AR", "reduce_scatter": "RS"}
  labels = [f"{short[r['collective']]} {r['m']}x{r['n']}x{r['k']}" for r in rows]
  fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.6), 4.5))
  width = 0.8 / max(1, len(variants))
  for i, v in enumerate(variants):
    # Not run at that shape: no bar (NaN), not a bar of height 0 that reads as "0x".
    ys = [r["times_ms"][base(v)] / r["times_ms"][v] if v in r["times_ms"] else float("nan")
          for r in rows]
    ax.bar([j + i * width for j in range(len(rows))], ys, width, label=v)
  ax.axhline(1.0, color="black", linewidth=0.8)
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, rotation=30,
                ha="right", fontsize=8)
  ax.set_ylabel("speedup over XLA dot + collective\n(ours_chain: over XLA's chain)")
  backend = result.get("info", {}).get("default_backend", "gpu")
  ax.set_title((f"{rows[0]['world']} devices, {rows[0]['dtype']}" if rows else "") + (
      "" if backend == "gpu" else f" - {backend}, no GPU: every variant is XLA's composition "
      "(a smoke run)"))
  ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


if __name__ == "__main__":
  c, m, n, k, world, dtype, calls, samples = sys.argv[1:9]
  _windowed_main(c, int(m), int(n), int(k), int(world), dtype, int(calls), int(samples))
