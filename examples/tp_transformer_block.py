"""A Llama-style tensor-parallel transformer trained with jax_flashoverlap's Flax NNX layers.

Each block: RMSNorm -> attention (heads split over 'tp': column-parallel q/k/v, row-parallel
output projection) -> RMSNorm -> SwiGLU MLP (column-parallel gate/up, row-parallel down), with
residuals; no biases. The same model is built twice from the same parameters:

  fo : ColumnParallelLinear / RowParallelLinear (XLA dot; with --overlap-backward its backward
       all-reduce overlapped / jax_flashoverlap.matmul_all_reduce)
  xla: nnx.Linear on the local shards + lax.psum after each row-parallel projection

and both are trained side by side (optax AdamW if installed, else SGD) on synthetic data,
forward and backward inside one jax.shard_map over a 'tp' mesh of all devices (check_vma=True).
Each step prints both losses (they must match closely) and both step times.

    python examples/tp_transformer_block.py [--steps 5 --batch 4 --seq 2048 --dim 4096 ...]

On a CPU machine it simulates 8 devices (reference path, small sizes); on GPUs it runs the real
kernels with Llama-3-8B-like layer sizes.
"""

import argparse
import json
import time

import _devices  # examples/_devices.py (this script's folder is on sys.path)

_devices.simulate_cpu_devices_without_gpu()

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_flashoverlap.flax import ColumnParallelLinear, RowParallelLinear

try:
  import optax
except ImportError:  # plain SGD below
  optax = None

AXIS = "tp"
DTYPE = jnp.bfloat16


class XlaLinear(nnx.Linear):
  """Reference: nnx.Linear with the given partition spec on its kernel (global shapes). Inside
  shard_map it sees the local shard; row-parallel (spec (tp, None)) adds a psum over tp."""

  def __init__(self, din, dout, spec, *, rngs):
    super().__init__(din, dout, use_bias=False, dtype=DTYPE, rngs=rngs,
                     kernel_metadata=dict(out_sharding=spec, eager_sharding=False))
    self.row = spec[0] == AXIS

  def __call__(self, x):
    y = super().__call__(x)
    return lax.psum(y, AXIS) if self.row else y


def make_linears(impl, overlap_backward=False):
  if impl == "fo":  # overlap_backward: the column layers' dx all-reduce overlapped too
    col = lambda din, dout, rngs: ColumnParallelLinear(din, dout, use_bias=False, dtype=DTYPE,
                                                       axis_name=AXIS,
                                                       overlap_backward=overlap_backward,
                                                       rngs=rngs)
    row = lambda din, dout, rngs: RowParallelLinear(din, dout, use_bias=False, dtype=DTYPE,
                                                    axis_name=AXIS, rngs=rngs)
    return col, row
  return (lambda din, dout, rngs: XlaLinear(din, dout, (None, AXIS), rngs=rngs),
          lambda din, dout, rngs: XlaLinear(din, dout, (AXIS, None), rngs=rngs))


def rope(x, base=10000.0):
  """Rotary position embedding on x [B, S, H, hd]."""
  s, hd = x.shape[1], x.shape[-1]
  freq = base ** (-jnp.arange(0, hd // 2, dtype=jnp.float32) / (hd // 2))
  ang = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None]  # [S, hd/2]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)


class Block(nnx.Module):
  def __init__(self, dim, heads, ffn, impl, overlap_backward=False, *, rngs):
    col, row = make_linears(impl, overlap_backward)
    self.heads, self.head_dim = heads, dim // heads
    self.attn_norm = nnx.RMSNorm(dim, dtype=DTYPE, rngs=rngs)
    # Fused projections, as in most Llama implementations: one q|k|v and one gate|up layer.
    # Each device's output shard holds its heads' q, k, v (and its slice of gate, up) side by
    # side, so a local split recovers them.
    self.wqkv = col(dim, 3 * dim, rngs)
    self.wo = row(dim, dim, rngs)
    self.mlp_norm = nnx.RMSNorm(dim, dtype=DTYPE, rngs=rngs)
    self.w_gate_up = col(dim, 2 * ffn, rngs)
    self.w_down = row(ffn, dim, rngs)

  def __call__(self, x):  # x [B, S, dim], replicated over tp
    b, s, _ = x.shape
    h = self.attn_norm(x)
    # Per device: the local heads (heads / tp of them); q/k/v are [B, S, dim / tp].
    q, k, v = (t.reshape(b, s, -1, self.head_dim) for t in jnp.split(self.wqkv(h), 3, -1))
    o = jax.nn.dot_product_attention(rope(q), rope(k), v, is_causal=True)
    x = x + self.wo(o.reshape(b, s, -1))  # row-parallel: all-reduce over tp
    h = self.mlp_norm(x)
    gate, up = jnp.split(self.w_gate_up(h), 2, -1)
    return x + self.w_down(nnx.silu(gate) * up)


class Model(nnx.Module):
  def __init__(self, layers, dim, heads, ffn, impl, overlap_backward=False, *, rngs):
    self.blocks = nnx.List([Block(dim, heads, ffn, impl, overlap_backward, rngs=rngs)
                            for _ in range(layers)])

  def __call__(self, x):
    for blk in self.blocks:
      x = blk(x)
    return x


def make_step(graphdef, specs, mesh, tx, params, opt_state):
  """One jitted training step: forward + backward inside shard_map, update in the global view."""

  def per_device_loss(params, x, y):
    out = nnx.merge(graphdef, params)(x)
    return jnp.mean(jnp.square(out.astype(jnp.float32) - y))  # replicated over tp

  loss_fn = jax.shard_map(per_device_loss, mesh=mesh, in_specs=(specs, P(), P()),
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


def main():
  gpu = jax.default_backend() == "gpu"
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=10 if gpu else 5)
  ap.add_argument("--batch", type=int, default=4 if gpu else 4)
  ap.add_argument("--seq", type=int, default=2048 if gpu else 32)
  ap.add_argument("--dim", type=int, default=4096 if gpu else 128)
  ap.add_argument("--heads", type=int, default=32 if gpu else 8)
  ap.add_argument("--ffn", type=int, default=14336 if gpu else 256)
  ap.add_argument("--layers", type=int, default=2)
  # Small enough that training is stable at the GPU sizes: then the two models' losses (equal
  # up to bf16 summation order in the backward) stay comparable step after step.
  ap.add_argument("--lr", type=float, default=1e-4 if gpu else 1e-3)
  ap.add_argument("--tp", type=int, default=0, help="devices on the 'tp' axis (default: all)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--rtol", type=float, default=2e-2, help="allowed relative loss difference")
  ap.add_argument("--overlap-backward", action="store_true",
                  help="also overlap the column layers' backward all-reduce (on 2 x H200 at "
                  "the default sizes it was slower: see benchmarks/results)")
  ap.add_argument("--json", help="write step times, losses and the row-parallel ops' own "
                  "times (ours vs XLA dot + psum at this model's shapes) to this file")
  args = ap.parse_args()

  devices = jax.devices()[:args.tp or None]
  tp = len(devices)
  mesh = Mesh(np.array(devices), (AXIS,))
  if args.heads % tp or args.dim % args.heads or (args.dim // tp) % 8 or (args.ffn // tp) % 8:
    raise SystemExit(f"need heads % tp == 0, dim % heads == 0 and dim/tp, ffn/tp multiples of "
                     f"8 (tp={tp}, dim={args.dim}, heads={args.heads}, ffn={args.ffn})")
  print(f"backend={jax.default_backend()} tp={tp} layers={args.layers} batch={args.batch} "
        f"seq={args.seq} dim={args.dim} heads={args.heads} ffn={args.ffn} dtype=bfloat16 "
        f"optimizer={'adamw' if optax else 'sgd'}")

  dims = (args.layers, args.dim, args.heads, args.ffn)
  models = {impl: Model(*dims, impl, args.overlap_backward, rngs=nnx.Rngs(args.seed))
            for impl in ("fo", "xla")}
  # Same initial parameters for both (the state trees have the same paths and specs).
  nnx.update(models["xla"], nnx.state(models["fo"], nnx.Param))

  kx, kt = jax.random.split(jax.random.key(args.seed + 1))
  x = jax.random.normal(kx, (args.batch, args.seq, args.dim), jnp.float32)
  teacher = jax.random.normal(kt, (args.dim, args.dim), jnp.float32) / np.sqrt(args.dim)
  y = jnp.tanh(x @ teacher)  # synthetic regression target
  x, y = jax.device_put((x.astype(DTYPE), y), NamedSharding(mesh, P()))

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
    runs[impl] = [make_step(graphdef, specs, mesh, tx, params, opt_state), params, opt_state]

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
    worst = max(worst, rel)
    history.append({"step": i, "loss": loss, "ms": ms})
    print(f"step {i:3d}  loss fo {loss['fo']:.6f}  xla {loss['xla']:.6f}  rel diff {rel:.1e}  "
          f"time fo {ms['fo']:9.2f} ms  xla {ms['xla']:9.2f} ms"
          + ("  (includes compile)" if i == 0 else ""))
  if not np.isfinite(worst) or worst > args.rtol:
    raise SystemExit(f"FAILED: losses differ by {worst:.2e} (relative) > {args.rtol}")
  print(f"OK: losses match (max relative difference {worst:.1e})")
  if args.json:
    write_report(args, mesh, history, worst)


def row_parallel_op_times(args, mesh):
  """The GEMM + all-reduce pairs of one block at this model's shapes, T = batch*seq: forward
  attention output x [T, dim/tp] @ w [dim/tp, dim] and MLP down x [T, ffn/tp] @ w [ffn/tp, dim];
  with --overlap-backward also the backward dx of q|k|v dy [T, 3dim/tp] @ w.T (the kernel
  w [dim, 3dim/tp] read in place: transpose_w=True, as the layer does) and of gate|up.
  Median ms of ours vs XLA's dot + psum, timed like the benchmark."""
  from jax_flashoverlap.bench import time_variants
  from jax_flashoverlap.ops import matmul_all_reduce
  tokens = args.batch * args.seq
  out = {}
  pairs = [("attention_out", args.dim, False), ("mlp_down", args.ffn, False)]
  if args.overlap_backward:
    pairs += [("qkv_dx", 3 * args.dim, True), ("gate_up_dx", 2 * args.ffn, True)]
  for name, k, transposed in pairs:
    kx, kw = jax.random.split(jax.random.key(k))
    x = jax.device_put(jax.random.normal(kx, (tokens, k), DTYPE), NamedSharding(mesh, P(None, AXIS)))
    w_shape, w_spec = ((args.dim, k), P(None, AXIS)) if transposed else \
        ((k, args.dim), P(AXIS, None))
    w = jax.device_put((jax.random.normal(kw, w_shape) / np.sqrt(k)).astype(DTYPE),
                       NamedSharding(mesh, w_spec))
    smap = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(None, AXIS), w_spec),
                                           out_specs=P()))
    t = time_variants({"xla": (smap(lambda a, b: lax.psum(a @ (b.T if transposed else b), AXIS)),
                               (x, w)),
                       "fo": (smap(lambda a, b: matmul_all_reduce(a, b, AXIS,
                                                                  transpose_w=transposed)),
                              (x, w))},
                      calls=10, samples=10)
    out[name] = {"shape_per_device": [tokens, k // mesh.size, args.dim],
                 "xla_ms": t["xla"]["median_ms"], "fo_ms": t["fo"]["median_ms"]}
  return out


def write_report(args, mesh, history, worst):
  """Step times (median over steps 1.., step 0 compiles) and what the overlap should save: the
  time difference of the block's GEMM + all-reduce pairs, ours vs XLA's, x layers."""
  steady = history[1:] or history
  med = {impl: float(np.median([h["ms"][impl] for h in steady])) for impl in ("fo", "xla")}
  ops = row_parallel_op_times(args, mesh)
  expected = args.layers * sum(o["xla_ms"] - o["fo_ms"] for o in ops.values())
  report = {"config": vars(args), "backend": jax.default_backend(), "tp": mesh.size,
            "devices": [d.device_kind for d in mesh.devices.flat],
            "median_step_ms": med, "step_ratio_xla_over_fo": med["xla"] / med["fo"],
            "step_saving_ms": med["xla"] - med["fo"],
            "row_parallel_ops": ops, "expected_saving_ms_from_ops": expected,
            "max_rel_loss_diff": worst, "steps": history}
  with open(args.json, "w") as f:
    json.dump(report, f, indent=1, default=str)
  print(f"median step: fo {med['fo']:.2f} ms, xla {med['xla']:.2f} ms (xla/fo "
        f"{report['step_ratio_xla_over_fo']:.3f}); saving {report['step_saving_ms']:.2f} ms, "
        f"expected from the row-parallel ops {expected:.2f} ms")


if __name__ == "__main__":
  main()
