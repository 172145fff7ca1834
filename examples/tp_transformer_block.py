"""A Llama-style tensor-parallel transformer trained with jax_flashoverlap's Flax NNX layers.

Each block: RMSNorm -> attention (heads split over 'tp': column-parallel q/k/v, row-parallel
output projection) -> RMSNorm -> SwiGLU MLP (column-parallel gate/up, row-parallel down), with
residuals; no biases. The same model is built twice from the same parameters:

  fo : ColumnParallelLinear / RowParallelLinear (XLA dot; with --overlap-backward its backward
       all-reduce overlapped / jax_flashoverlap.matmul_all_reduce)
  xla: nnx.Linear on the local shards + lax.psum after each row-parallel projection

--sequence-parallel (Megatron's sequence parallelism): activations are [S, B, dim] with the
sequence sharded over 'tp' between the layers; column layers all-gather it (fo:
all_gather_matmul; xla: lax.all_gather + nnx.Linear), row layers reduce-scatter back to it
(fo: matmul_reduce_scatter; xla: lax.psum_scatter). With --overlap-backward the backward's
collectives overlap too (the column layers' dx reduce-scatter, the row layers' dy all-gather).

and both are trained side by side (optax AdamW if installed, else SGD) on synthetic data,
forward and backward inside one jax.shard_map over a 'tp' mesh of all devices (check_vma=True).
Each step prints both losses (they must match closely) and both step times.

    python examples/tp_transformer_block.py [--steps 5 --batch 4 --seq 2048 --dim 4096 ...]

On a CPU machine it simulates 8 devices (reference path, small sizes); on GPUs it runs the real
kernels with Llama-3-8B-like layer sizes.
"""

import argparse
import json
import os
import sys
import time

import _devices  # examples/_devices.py (this script's folder is on sys.path)

_devices.simulate_cpu_devices_without_gpu()
_devices.one_process_only()

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_flashoverlap.bench import worst_error
from jax_flashoverlap.bench_record import git_commit
from jax_flashoverlap.flax import SHARDING_KEY, ColumnParallelLinear, RowParallelLinear

try:
  import optax
except ImportError:  # plain SGD below
  optax = None

AXIS = "tp"
DTYPE = jnp.bfloat16


class XlaLinear(nnx.Linear):
  """Reference: nnx.Linear with the given partition spec on its kernel (global shapes). Inside
  shard_map it sees the local shard; row-parallel (spec (tp, None)) adds a psum over tp.
  Sequence parallel: a column layer all-gathers its input's first dim first, a row layer
  reduce-scatters its output's first dim instead of the psum."""

  def __init__(self, din, dout, spec, sequence_parallel=False, *, rngs):
    super().__init__(din, dout, use_bias=False, dtype=DTYPE, rngs=rngs,
                     kernel_metadata={SHARDING_KEY: spec, "eager_sharding": False})
    self.row, self.sequence_parallel = spec[0] == AXIS, sequence_parallel

  def __call__(self, x):
    if self.sequence_parallel and not self.row:
      x = lax.all_gather(x, AXIS, axis=0, tiled=True)
    y = super().__call__(x)
    if not self.row:
      return y
    if self.sequence_parallel:
      return lax.psum_scatter(y, AXIS, scatter_dimension=0, tiled=True)
    return lax.psum(y, AXIS)


def make_linears(impl, overlap_backward=False, sequence_parallel=False):
  if impl == "fo":  # overlap_backward: the backward's collectives overlapped too
    common = dict(use_bias=False, dtype=DTYPE, axis_name=AXIS, overlap_backward=overlap_backward)
    col = lambda din, dout, rngs: ColumnParallelLinear(
        din, dout, sequence_parallel=sequence_parallel, rngs=rngs, **common)
    row = lambda din, dout, rngs: RowParallelLinear(
        din, dout, reduce="reduce_scatter" if sequence_parallel else "all_reduce", rngs=rngs,
        **common)
    return col, row
  return (lambda din, dout, rngs: XlaLinear(din, dout, (None, AXIS), sequence_parallel,
                                            rngs=rngs),
          lambda din, dout, rngs: XlaLinear(din, dout, (AXIS, None), sequence_parallel,
                                            rngs=rngs))


def rope(x, base=10000.0):
  """Rotary position embedding on x [B, S, H, hd]."""
  s, hd = x.shape[1], x.shape[-1]
  freq = base ** (-jnp.arange(0, hd // 2, dtype=jnp.float32) / (hd // 2))
  ang = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None]  # [S, hd/2]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)


class Block(nnx.Module):
  def __init__(self, dim, heads, ffn, impl, overlap_backward=False, sequence_parallel=False, *,
               rngs):
    col, row = make_linears(impl, overlap_backward, sequence_parallel)
    self.heads, self.head_dim = heads, dim // heads
    self.sequence_parallel = sequence_parallel
    self.attn_norm = nnx.RMSNorm(dim, dtype=DTYPE, rngs=rngs)
    # Fused projections, as in most Llama implementations: one q|k|v and one gate|up layer.
    # Each device's output shard holds its heads' q, k, v (and its slice of gate, up) side by
    # side, so a local split recovers them. Which kernel columns are q, k or v thus depends on
    # the tp size: the same weights are another network at another --tp (a checkpoint moved
    # between tp sizes must permute these columns).
    self.wqkv = col(dim, 3 * dim, rngs)
    self.wo = row(dim, dim, rngs)
    self.mlp_norm = nnx.RMSNorm(dim, dtype=DTYPE, rngs=rngs)
    self.w_gate_up = col(dim, 2 * ffn, rngs)
    self.w_down = row(ffn, dim, rngs)

  def __call__(self, x):
    # x [B, S, dim] replicated over tp; sequence parallel: [S/tp, B, dim], this device's
    # tokens (the column layers gather them: their outputs are [S, B, ...]).
    h = self.attn_norm(x)
    qkv = self.wqkv(h)
    if self.sequence_parallel:
      qkv = jnp.swapaxes(qkv, 0, 1)  # [B, S, 3 dim / tp] for the attention
    b, s, _ = qkv.shape
    # Per device: the local heads (heads / tp of them); q/k/v are [B, S, dim / tp].
    q, k, v = (t.reshape(b, s, -1, self.head_dim) for t in jnp.split(qkv, 3, -1))
    o = jax.nn.dot_product_attention(rope(q), rope(k), v, is_causal=True).reshape(b, s, -1)
    if self.sequence_parallel:
      o = jnp.swapaxes(o, 0, 1)
    x = x + self.wo(o)  # row-parallel: all-reduce (sequence parallel: reduce-scatter) over tp
    h = self.mlp_norm(x)
    gate, up = jnp.split(self.w_gate_up(h), 2, -1)
    return x + self.w_down(nnx.silu(gate) * up)


class Model(nnx.Module):
  def __init__(self, layers, dim, heads, ffn, impl, overlap_backward=False,
               sequence_parallel=False, *, rngs):
    self.blocks = nnx.List([Block(dim, heads, ffn, impl, overlap_backward, sequence_parallel,
                                  rngs=rngs) for _ in range(layers)])

  def __call__(self, x):
    for blk in self.blocks:
      x = blk(x)
    return x


def make_step(graphdef, specs, mesh, tx, params, opt_state, sequence_parallel=False):
  """One jitted training step: forward + backward inside shard_map, update in the global view.
  Sequence parallel: x and y [S, B, dim] sharded on S, the loss the mean over the devices'."""
  data = P(AXIS) if sequence_parallel else P()

  def per_device_loss(params, x, y):
    out = nnx.merge(graphdef, params)(x)
    loss = jnp.mean(jnp.square(out.astype(jnp.float32) - y))
    return lax.pmean(loss, AXIS) if sequence_parallel else loss  # replicated over tp

  loss_fn = jax.shard_map(per_device_loss, mesh=mesh, in_specs=(specs, data, data),
                          out_specs=P(), check_vma=True)

  def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    if optax is None:
      return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), opt_state, loss
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  # Outputs keep the inputs' shardings, so the second step does not compile again.
  shardings = lambda tree: jax.tree.map(lambda a: a.sharding, tree)
  return jax.jit(step, out_shardings=(shardings(params), shardings(opt_state), None))


def fits(args, tp):
  """Whether the model's sizes split over tp devices: whole heads per device, an even head
  dim (rope) and dim / tp, ffn / tp multiples of 8 (the ops' alignment)."""
  return not (args.heads % tp or args.dim % args.heads or (args.dim // args.heads) % 2 or
              args.dim % tp or args.ffn % tp or (args.dim // tp) % 8 or (args.ffn // tp) % 8
              or (args.sequence_parallel and args.seq % tp))


def main():
  gpu = jax.default_backend() == "gpu"
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=10 if gpu else 5,
                  help="training steps per model (default: 10 on GPUs, 5 on CPU)")
  ap.add_argument("--batch", type=int, default=4, help="sequences per step (default: 4)")
  ap.add_argument("--seq", type=int, default=2048 if gpu else 32,
                  help="tokens per sequence (default: 2048 on GPUs, 32 on CPU)")
  ap.add_argument("--dim", type=int, default=4096 if gpu else 128,
                  help="model width (default: 4096 on GPUs, 128 on CPU)")
  ap.add_argument("--heads", type=int, default=32 if gpu else 8,
                  help="attention heads, split over tp (default: 32 on GPUs, 8 on CPU)")
  ap.add_argument("--ffn", type=int, default=14336 if gpu else 256,
                  help="SwiGLU hidden width (default: 14336 on GPUs, 256 on CPU)")
  ap.add_argument("--layers", type=int, default=2, help="transformer blocks (default: 2)")
  # Small enough that training is stable at the GPU sizes: then the two models' losses (equal
  # up to bf16 summation order in the backward) stay comparable step after step.
  ap.add_argument("--lr", type=float, default=1e-4 if gpu else 1e-3,
                  help="learning rate (default: 1e-4 on GPUs, 1e-3 on CPU)")
  ap.add_argument("--tp", type=int, default=0,
                  help="devices on the 'tp' axis (default: all, or the most the sizes split over)")
  ap.add_argument("--seed", type=int, default=0, help="parameters' and data's seed (default: 0)")
  ap.add_argument("--rtol", type=float, default=2e-2,
                  help="allowed relative loss difference between the two models (default: 0.02)")
  ap.add_argument("--overlap-backward", action="store_true",
                  help="also overlap the backward's collectives (the column layers' all-reduce; "
                  "on 2 x H200 at the default sizes it was slower: see benchmarks/results)")
  ap.add_argument("--sequence-parallel", action="store_true",
                  help="Megatron sequence parallelism: tokens sharded over tp between layers "
                  "(all_gather_matmul / matmul_reduce_scatter)")
  ap.add_argument("--json", help="write step times, losses and the GEMM + collective pairs' "
                  "own times (ours vs XLA's dot + collective at this model's shapes: the "
                  "row-parallel ones, and with --sequence-parallel / --overlap-backward the "
                  "column layers' and the backward's too) to this file")
  args = ap.parse_args()

  if not 0 <= args.tp <= len(jax.devices()):
    ap.error(f"--tp must be between 0 (all devices) and the {len(jax.devices())} devices, "
             f"got {args.tp}")
  if min(args.steps, args.batch, args.seq, args.dim, args.heads, args.ffn, args.layers) < 1:
    ap.error("--steps, --batch, --seq, --dim, --heads, --ffn and --layers must be at least 1")
  if not (np.isfinite(args.lr) and np.isfinite(args.rtol) and args.rtol >= 0):
    ap.error(f"--lr must be finite and --rtol finite and >= 0, got --lr {args.lr} "
             f"--rtol {args.rtol}")
  if not 0 <= args.seed < 2 ** 32:  # an OverflowError traceback in the initializers
    ap.error(f"--seed must be in [0, 2**32), got {args.seed}")
  if args.json is not None and not args.json.strip():  # `--json "$UNSET"`: not "no report"
    ap.error("--json: an empty path (leave --json out for no report)")
  if args.json and args.steps < 2:  # the median step would be step 0, compile included
    ap.error("--json needs --steps >= 2 (step 0 includes compiling; the report's median "
             "step is over steps 1..)")
  folder = os.path.dirname(os.path.abspath(args.json or "."))
  if args.json and (os.path.isdir(args.json) or not os.path.isdir(folder) or
                    not os.access(folder, os.W_OK | os.X_OK)):
    ap.error(f"--json {args.json}: not a file in an existing, writable folder (checked before "
             "training, not after it)")
  n_devices = len(jax.devices())
  tp = args.tp or n_devices
  if not args.tp and not fits(args, tp):  # e.g. 8 heads over 3 GPUs: the largest tp that fits
    tp = max((t for t in range(1, tp) if fits(args, t)), default=tp)
    if tp < n_devices:
      sizes_split = fits(argparse.Namespace(**{**vars(args), "sequence_parallel": False}),
                         n_devices)
      why = (f"--sequence-parallel's seq={args.seq} does" if sizes_split else
             f"heads={args.heads}, dim={args.dim}, ffn={args.ffn}"
             + (f", seq={args.seq}" if args.sequence_parallel else "") + " do")
      print(f"note: tp={tp} of the {n_devices} devices ({why} not split over {n_devices}; "
            "--tp chooses)")
  if args.sequence_parallel and args.seq % tp:
    raise SystemExit(f"--sequence-parallel needs seq % tp == 0 (seq={args.seq}, tp={tp})")
  if not fits(args, tp):
    raise SystemExit(f"need heads % tp == 0, dim % heads == 0, an even head dim (rope) and "
                     f"dim/tp, ffn/tp whole multiples of 8 (tp={tp}, dim={args.dim}, "
                     f"heads={args.heads}, ffn={args.ffn})")
  devices = jax.devices()[:tp]
  mesh = Mesh(np.array(devices), (AXIS,))
  print(f"backend={jax.default_backend()} tp={tp} layers={args.layers} batch={args.batch} "
        f"seq={args.seq} dim={args.dim} heads={args.heads} ffn={args.ffn} dtype=bfloat16 "
        f"optimizer={'adamw' if optax else 'sgd'}"
        + (" sequence_parallel" if args.sequence_parallel else ""))

  dims = (args.layers, args.dim, args.heads, args.ffn)
  models = {impl: Model(*dims, impl, args.overlap_backward, args.sequence_parallel,
                        rngs=nnx.Rngs(args.seed)) for impl in ("fo", "xla")}
  # Same initial parameters for both (the state trees have the same paths and specs).
  nnx.update(models["xla"], nnx.state(models["fo"], nnx.Param))

  kx, kt = jax.random.split(jax.random.key(args.seed + 1))
  x = jax.random.normal(kx, (args.batch, args.seq, args.dim), jnp.float32)
  teacher = jax.random.normal(kt, (args.dim, args.dim), jnp.float32) / np.sqrt(args.dim)
  y = jnp.tanh(x @ teacher)  # synthetic regression target
  if args.sequence_parallel:  # [S, B, dim], the sequence sharded over tp
    x, y = (jnp.swapaxes(a, 0, 1) for a in (x, y))
  x, y = jax.device_put((x.astype(DTYPE), y),
                        NamedSharding(mesh, P(AXIS) if args.sequence_parallel else P()))

  tx = optax.adamw(args.lr) if optax else None
  runs = {}
  for impl, model in models.items():
    graphdef, params = nnx.split(model, nnx.Param)
    specs = nnx.get_partition_spec(params)
    params = jax.device_put(params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    replicated = NamedSharding(mesh, P())
    opt_state = jax.tree.map(  # moments follow the params; the step count goes on every device
        lambda a: a if isinstance(a.sharding, NamedSharding) else jax.device_put(a, replicated),
        tx.init(params)) if tx else None
    runs[impl] = [make_step(graphdef, specs, mesh, tx, params, opt_state,
                            args.sequence_parallel), params, opt_state]

  worst = 0.0
  history = []
  for i in range(args.steps):
    loss, ms = {}, {}
    for impl, run in runs.items():
      step, params, opt_state = run
      t0 = time.perf_counter()
      params, opt_state, l = step(params, opt_state, x, y)
      l = float(l)  # waits for the step
      ms[impl] = (time.perf_counter() - t0) * 1e3
      run[1:] = [params, opt_state]
      loss[impl] = l
    rel = abs(loss["fo"] - loss["xla"]) / max(abs(loss["xla"]), 1e-12)
    # a NaN (a loss NaN or inf) is kept: Python's max(0.1, nan) is 0.1, an "OK" over NaN losses
    worst = worst_error((worst, rel))
    history.append({"step": i, "loss": loss, "ms": ms})
    print(f"step {i:3d}  loss fo {loss['fo']:.6f}  xla {loss['xla']:.6f}  rel diff {rel:.1e}  "
          f"time fo {ms['fo']:9.2f} ms  xla {ms['xla']:9.2f} ms"
          + ("  (includes compile)" if i == 0 else ""))
  if not np.isfinite(worst):
    raise SystemExit(f"FAILED: a loss is not finite (NaN or inf: the relative difference is "
                     f"{worst}); the two runs cannot be compared (diverged? lower --lr)")
  if worst > args.rtol:
    raise SystemExit(f"FAILED: losses differ by {worst:.2e} (relative) > {args.rtol}")
  print(f"OK: losses match (max relative difference {worst:.1e})")
  if args.json:
    write_report(args, mesh, history, worst)


def _op_pairs(args):
  """The block's GEMM + collective pairs at this model's shapes, T = batch * seq tokens:
  {name: (K, N, collective, transposed)}. The GEMM is [T, K] x [K, N] globally; transposed:
  the weight as stored [N, K] (a backward's dx through `transpose_w=True`, as the layers do).
  Forward: attention output (K = dim) and MLP down (K = ffn) end in the all-reduce
  (sequence parallel: reduce-scatter); sequence parallel adds q|k|v and gate|up, which start
  with an all-gather. With --overlap-backward, the backward's dx pairs: the column layers'
  all-reduce (reduce-scatter) of dy @ w.T, and, sequence parallel, the row layers' all-gather
  of dy before dy @ w.T."""
  d, f = args.dim, args.ffn
  if not args.sequence_parallel:
    pairs = {"attention_out": (d, d, "all_reduce", False), "mlp_down": (f, d, "all_reduce", False)}
    if args.overlap_backward:
      pairs.update(qkv_dx=(3 * d, d, "all_reduce", True), gate_up_dx=(2 * f, d, "all_reduce", True))
    return pairs
  pairs = {"attention_out": (d, d, "reduce_scatter", False),
           "mlp_down": (f, d, "reduce_scatter", False),
           "qkv": (d, 3 * d, "all_gather", False), "gate_up": (d, 2 * f, "all_gather", False)}
  if args.overlap_backward:
    pairs.update(qkv_dx=(3 * d, d, "reduce_scatter", True),
                 gate_up_dx=(2 * f, d, "reduce_scatter", True),
                 attention_out_dx=(d, d, "all_gather", True),
                 mlp_down_dx=(d, f, "all_gather", True))
  return pairs


def _pair_programs(mesh, collective, transposed):
  """(xla, ours, x spec, w spec) of one pair, per device inside shard_map. In the all-gather's
  transposed form both programs return the gathered dy too, as the row layer's backward
  uses it."""
  import jax_flashoverlap as fo
  dot = (lambda a, b: a @ b.T) if transposed else (lambda a, b: a @ b)
  if collective == "all_gather":  # x rows sharded, w sharded on N (the weight's columns)
    x_spec, out = P(AXIS, None), P(None, AXIS)
    w_spec = P(AXIS, None) if transposed else P(None, AXIS)
    gather = lambda a: lax.all_gather(a, AXIS, axis=0, tiled=True)
    # Both return the gathered rows when ours does: the layer's backward uses them for dw.
    xla = ((lambda a, b: (dot(g := gather(a), b), g)) if transposed else
           (lambda a, b: dot(gather(a), b)))
    ours = lambda a, b: fo.all_gather_matmul(a, b, AXIS, transpose_w=transposed,
                                             return_gathered=transposed)
  else:  # x sharded on K, w sharded on K
    x_spec, w_spec = P(None, AXIS), (P(None, AXIS) if transposed else P(AXIS, None))
    if collective == "all_reduce":
      out, reduce = P(), lambda y: lax.psum(y, AXIS)
      op = fo.matmul_all_reduce
    else:
      out, reduce = P(AXIS, None), lambda y: lax.psum_scatter(y, AXIS, scatter_dimension=0,
                                                             tiled=True)
      op = fo.matmul_reduce_scatter
    xla = lambda a, b: reduce(dot(a, b))
    ours = lambda a, b: op(a, b, AXIS, transpose_w=transposed)
  smap = lambda f, outs: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(x_spec, w_spec),
                                               out_specs=outs))
  gathered = collective == "all_gather" and transposed
  outs = (out, P(AXIS, None)) if gathered else out
  return smap(xla, outs), smap(ours, outs), x_spec, w_spec


def row_parallel_op_times(args, mesh):
  """Median ms of each pair of `_op_pairs`: ours vs XLA's dot + collective, timed like the
  benchmark."""
  from jax_flashoverlap.bench import time_variants
  tokens = args.batch * args.seq
  out = {}
  for name, (k, n, collective, transposed) in _op_pairs(args).items():
    xla, ours, x_spec, w_spec = _pair_programs(mesh, collective, transposed)
    kx, kw = jax.random.split(jax.random.key(k + n))
    x = jax.device_put(jax.random.normal(kx, (tokens, k), DTYPE), NamedSharding(mesh, x_spec))
    w = jax.device_put((jax.random.normal(kw, (n, k) if transposed else (k, n)) /
                        np.sqrt(k)).astype(DTYPE), NamedSharding(mesh, w_spec))
    first = lambda f: (lambda a, b: jax.tree.leaves(f(a, b))[0])
    t = time_variants({"xla": (first(xla), (x, w)), "fo": (first(ours), (x, w))}, calls=10,
                      samples=10)
    out[name] = {"collective": collective, "weight_as_stored": transposed,
                 "gemm_global": [tokens, k, n],
                 "xla_ms": t["xla"]["median_ms"], "fo_ms": t["fo"]["median_ms"]}
  return out


def write_report(args, mesh, history, worst):
  """Step times (median over steps 1.., step 0 compiles) and what the overlap should save: the
  time difference of the block's GEMM + collective pairs (`_op_pairs`), ours vs XLA's, x
  layers. The pairs are under "row_parallel_ops" (the key of earlier reports; with
  --sequence-parallel or --overlap-backward it holds the column layers' and the backward's
  pairs too)."""
  steady = history[1:]  # --json needs --steps >= 2
  med = {impl: float(np.median([h["ms"][impl] for h in steady])) for impl in ("fo", "xla")}
  ops = row_parallel_op_times(args, mesh)
  expected = args.layers * sum(o["xla_ms"] - o["fo_ms"] for o in ops.values())
  report = {"config": vars(args), "backend": jax.default_backend(), "tp": mesh.size,
            "devices": [d.device_kind for d in mesh.devices.flat],
            "median_step_ms": med, "step_ratio_xla_over_fo": med["xla"] / med["fo"],
            "step_saving_ms": med["xla"] - med["fo"],
            "row_parallel_ops": ops, "expected_saving_ms_from_ops": expected,
            "max_rel_loss_diff": worst, "steps": history,
            # what bench / tune record too: the results' commit and how to rerun them
            "git_commit": git_commit(),
            "command": " ".join(["python", "examples/tp_transformer_block.py", *sys.argv[1:]])}
  with open(args.json, "w") as f:
    json.dump(report, f, indent=1, default=str)
  print(f"median step: fo {med['fo']:.2f} ms, xla {med['xla']:.2f} ms (xla/fo "
        f"{report['step_ratio_xla_over_fo']:.3f}); saving {report['step_saving_ms']:.2f} ms, "
        f"expected from the ops' own times ({', '.join(ops)}; x {args.layers} layers) "
        f"{expected:.2f} ms" + _timing_note())


def _timing_note() -> str:
  """As the quickstart says: where our ops are not custom calls, both models run XLA's ops."""
  import jax_flashoverlap as fo
  if fo.info()["paths"]["matmul_all_reduce"]["cuda_custom_call"]:
    return ""
  return ("  (no custom call here: both models run XLA's ops, so the difference is noise, "
          "not a speedup)")


if __name__ == "__main__":
  main()
