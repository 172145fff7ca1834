"""Our GEMM through JAX against the same kernel standalone: where a difference comes from.

On one GPU, per-device shapes, interleaved rounds in bench.round_order's balanced orders (as
bench.time_variants): XLA's dot and `fo.matmul` at comm_sms 0 and 16, each timed
  * per call: `--calls` back-to-back jitted calls between two syncs (the bench's method), and
  * in one program: `lax.map` over 8 different x (8 GEMMs, one dispatch),
with inputs drawn normal (as the bench) or uniform in [-1, 1) (as tests/cuda/sm_share_probe),
while a thread samples the SM clock and board power through NVML (pynvml) every 5 ms.

  python benchmarks/gemm_in_jax.py --out gemm_in_jax.json
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time


class ClockSampler:
  """SM clock (MHz) and power (W) samples with timestamps, from a background thread."""

  def __init__(self, period_s: float = 0.005):
    self.samples, self.period, self.stop = [], period_s, threading.Event()
    try:
      import pynvml
      pynvml.nvmlInit()
      self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as err:  # no NVML: times only
      print(f"no clock readings: {err}")
      self.nvml = None
    self.thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    while not self.stop.is_set():
      n = self.nvml
      self.samples.append((time.perf_counter(),
                           n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                           n.nvmlDeviceGetPowerUsage(self.handle) / 1e3))
      time.sleep(self.period)

  def __enter__(self):
    if self.nvml:
      self.thread.start()
    return self

  def __exit__(self, *exc):
    self.stop.set()

  def between(self, t0: float, t1: float):
    return [(c, p) for t, c, p in self.samples if t0 <= t <= t1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  from jax_flashoverlap import bench, bench_args, bench_problem
  parser.add_argument("--shapes", nargs="+", type=bench._parse_shape,
                      default=[(8192, 8192, 4096), (16384, 8192, 8192)],
                      help="per-device MxNxK (default: 8192x8192x4096 16384x8192x8192)")
  parser.add_argument("--calls", type=int, default=10,
                      help="back-to-back calls per sample (default: 10)")
  parser.add_argument("--samples", type=int, default=10,
                      help="timed samples, the median reported (default: 10)")
  parser.add_argument("--out", help="write the results as JSON here")
  args = parser.parse_args()
  for name in ("calls", "samples"):  # checked before any work (--calls 0 failed at the end)
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  bench_args.check_output_paths(parser, args)

  import jax
  import jax.numpy as jnp

  import jax_flashoverlap as fo
  if jax.default_backend() != "gpu":  # it compares our kernel with XLA's on one GPU
    parser.error(f"needs a GPU (JAX's backend here is {jax.default_backend()!r}; off GPU "
                 "fo.matmul is XLA's dot, nothing to compare)")

  rows = []
  with ClockSampler() as clock:
    for shape in args.shapes:
      m, n, k = shape
      shape = f"{m}x{n}x{k}"  # as recorded before (a string)
      key = jax.random.key(0)
      inputs = {}
      for dist in ("normal", "uniform"):
        kx, kw, key = jax.random.split(key, 3)
        if dist == "normal":
          x, w = bench_problem.random_inputs(kx, m, n, k, jnp.bfloat16)
          xs = jax.random.normal(kw, (8, m, k), jnp.bfloat16)
        else:
          x = jax.random.uniform(kx, (m, k), jnp.float32, -1, 1).astype(jnp.bfloat16)
          w = jax.random.uniform(kw, (k, n), jnp.float32, -1, 1).astype(jnp.bfloat16)
          xs = jax.random.uniform(kw, (8, m, k), jnp.float32, -1, 1).astype(jnp.bfloat16)
        inputs[dist] = (x, w, xs)
      gemms = {"xla": lambda x, w: x @ w,
               "ours_sms0": lambda x, w: fo.matmul(x, w, comm_sms=0),
               "ours_sms16": lambda x, w: fo.matmul(x, w, comm_sms=16)}
      variants = {}
      for dist, (x, w, xs) in inputs.items():
        for name, g in gemms.items():
          variants[f"{name}_{dist}_percall"] = (jax.jit(g), (x, w), 1)
          variants[f"{name}_{dist}_map8"] = (
              jax.jit(lambda xs, w, g=g: jax.lax.map(lambda xi: g(xi, w), xs)), (xs, w), 8)
      times = {v: [] for v in variants}
      windows = {v: [] for v in variants}
      for fn, a, _ in variants.values():
        for _ in range(3):
          fn(*a).block_until_ready()
      for rnd in range(args.samples):
        for name in bench.round_order(list(variants), rnd):  # no fixed place or predecessor
          fn, a, per = variants[name]
          calls = args.calls if per == 1 else 2
          fn(*a).block_until_ready()
          t0 = time.perf_counter()
          for _ in range(calls):
            out = fn(*a)
          out.block_until_ready()
          t1 = time.perf_counter()
          times[name].append((t1 - t0) / (calls * per) * 1e3)
          windows[name].append((t0, t1))
      for name in variants:
        readings = [r for t0, t1 in windows[name] for r in clock.between(t0, t1)]
        row = {"shape": shape, "variant": name,
               "median_ms_per_gemm": statistics.median(times[name]),
               "samples_ms": times[name],
               "tflops": 2 * m * n * k / statistics.median(times[name]) / 1e9,
               "sm_mhz_median": statistics.median(c for c, _ in readings) if readings else None,
               "watts_median": statistics.median(p for _, p in readings) if readings else None}
        rows.append(row)
        print(f"{shape:>16} {name:<26} {row['median_ms_per_gemm']:.3f} ms  "
              f"{row['tflops']:5.0f} TF/s  {row['sm_mhz_median']} MHz  {row['watts_median']} W",
              flush=True)
  if args.out:
    bench.write_json(args.out, {"kind": "gemm_in_jax", "device": jax.devices()[0].device_kind,
                                "git_commit": bench.git_commit(), "rows": rows})


if __name__ == "__main__":
  main()
