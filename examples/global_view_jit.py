"""Global view: a tensor-parallel 2-layer MLP under plain jax.jit (no shard_map).

x [M, D] sharded over 'dp' (rows) and the weights over 'tp' (w1 [D, F] on F, w2 [F, D] on F):

  h = gelu(x @ w1)                                 column-parallel: XLA's dot, no communication
  y = row_parallel_matmul(h, w2, reduce=...)       row-parallel: jax_flashoverlap under jit

written twice: with the function `jax_flashoverlap.row_parallel_matmul` on NamedSharding arrays,
and with the Flax NNX layers (ColumnParallelLinear -> RowParallelLinear) built under
`jax.set_mesh`, whose params are sharded by their annotations. Both are compared with plain
`gelu(x @ w1) @ w2`; the output shardings are printed.

Then the same MLP with sequence parallelism (Megatron's layout): x as [S, B, D] with S over
'tp' and B over 'dp'; the column layer (sequence_parallel=True) gathers S inside the op
(all_gather_matmul, overlapped with its GEMM on GPUs), the row layer reduce-scatters it back
(reduce="reduce_scatter"); the compiled program's collectives are printed (one all-gather and
one reduce-scatter: the ops' own).

    python examples/global_view_jit.py [--m 8192 --d 4096 --f 14336 --reduce reduce_scatter]
"""

import argparse
import collections
import re
import time

import _devices  # examples/_devices.py (this script's folder is on sys.path)

_devices.simulate_cpu_devices_without_gpu()
_devices.one_process_only()

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_flashoverlap as fo
from _path import program_path, timing_note, uses_custom_call
from jax_flashoverlap.bench import worst_error
from jax_flashoverlap.flax import ColumnParallelLinear, RowParallelLinear


def timed(fn, *args, iters):
  out = fn(*args)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(iters):
    out = fn(*args)
  jax.block_until_ready(out)
  return out, (time.perf_counter() - start) / iters * 1e3


def rel_err(out, ref):
  out, ref = (np.asarray(a, np.float32) for a in (out, ref))
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def main():
  gpu = jax.default_backend() == "gpu"
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=int, default=None, help="rows (tokens; default: 8192 on GPUs, "
                  "256 on CPU, rounded up to a multiple of the devices)")
  ap.add_argument("--d", type=int, default=4096 if gpu else 128,
                  help="model dim (default: 4096 on GPUs, 128 on CPU)")
  ap.add_argument("--f", type=int, default=None, help="hidden dim (default: 14336 on GPUs, "
                  "512 on CPU, rounded up to split into multiples of 8 over tp)")
  ap.add_argument("--dp", type=int, default=0,
                  help="size of 'dp' (default: 2 on an even count of >= 4 devices, else 1)")
  ap.add_argument("--reduce", choices=("all_reduce", "reduce_scatter"), default="all_reduce",
                  help="the row-parallel layer's collective (default: all_reduce)")
  ap.add_argument("--iters", type=int, default=20 if gpu else 3,
                  help="timed calls per program (default: 20 on GPUs, 3 on CPU)")
  args = ap.parse_args()

  devices = jax.devices()
  if not 0 <= args.dp <= len(devices) or (args.dp and len(devices) % args.dp):
    ap.error(f"--dp must be 0 (default) or divide the {len(devices)} devices (the mesh is "
             f"dp x tp over all of them), got {args.dp}")
  dp = args.dp or (2 if len(devices) >= 4 and len(devices) % 2 == 0 else 1)
  tp = len(devices) // dp
  if args.m is None:  # a multiple of dp * tp: reduce_scatter and the sequence-parallel part
    args.m = _devices.round_up(8192 if gpu else 256, dp * tp)
  if args.f is None:
    args.f = _devices.round_up(14336 if gpu else 512, 8 * tp)
  rows = args.m // dp if args.reduce == "all_reduce" else args.m // (dp * tp)
  if min(args.m, args.d, args.f, args.iters) < 1:  # --iters 0 printed times of nothing
    ap.error("--m, --d, --f and --iters must be at least 1")
  if args.m % (dp if args.reduce == "all_reduce" else dp * tp) or args.d % 8 or \
      args.f % tp or (args.f // tp) % 8 or rows < 1:
    ap.error(f"need m divisible by dp (reduce_scatter: by dp * tp), d a multiple of 8 and f "
             f"split over tp a multiple of 8 (m={args.m}, d={args.d}, f={args.f}, dp={dp}, "
             f"tp={tp})")
  mesh = Mesh(np.array(devices[:dp * tp]).reshape(dp, tp), ("dp", "tp"))
  print(f"backend={jax.default_backend()} mesh dp={dp} x tp={tp}  M={args.m} D={args.d} "
        f"F={args.f} reduce={args.reduce} dtype=bfloat16")

  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, (args.m, args.d), jnp.float32).astype(jnp.bfloat16)
  w1 = (jax.random.normal(k2, (args.d, args.f)) / np.sqrt(args.d)).astype(jnp.bfloat16)
  w2 = (jax.random.normal(k3, (args.f, args.d)) / np.sqrt(args.f)).astype(jnp.bfloat16)

  # Reference: plain x @ w, unsharded (one device).
  ref = jax.jit(lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2)(x, w1, w2)

  # 1) The function, on NamedSharding inputs.
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  xs, w1s, w2s = put(x, "dp", None), put(w1, None, "tp"), put(w2, "tp", None)

  @jax.jit
  def mlp(x, w1, w2):
    h = jax.nn.gelu(x @ w1)  # [M, F] sharded P(dp, tp): F is the next contracting dim
    return fo.row_parallel_matmul(h, w2, reduce=args.reduce, axis_name="tp")

  @jax.jit
  def mlp_xla(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2  # XLA inserts its own all-reduce

  compiled = mlp.lower(xs, w1s, w2s).compile().as_text()
  custom_call = uses_custom_call(compiled, args.reduce)
  print(f"path: {program_path(compiled, args.reduce, args.m // dp, args.d, args.f // tp, tp)}")
  y, t_ours = timed(mlp, xs, w1s, w2s, iters=args.iters)
  y_xla, t_xla = timed(mlp_xla, xs, w1s, w2s, iters=args.iters)
  err_fn = rel_err(y, ref)
  print(f"row_parallel_matmul MLP: out {y.shape} sharding {y.sharding.spec}  "
        f"rel err vs x @ w {err_fn:.2e}  time {t_ours:.3f} ms (XLA {t_xla:.3f} ms, "
        f"out sharding {y_xla.sharding.spec}){timing_note(custom_call)}")

  # 2) The Flax NNX layers, params sharded by their annotations under jax.set_mesh.
  class MLP(nnx.Module):
    def __init__(self, rngs):
      self.up = ColumnParallelLinear(args.d, args.f, use_bias=False, rngs=rngs)
      self.down = RowParallelLinear(args.f, args.d, reduce=args.reduce, use_bias=False,
                                    rngs=rngs)

    def __call__(self, x):
      return self.down(jax.nn.gelu(self.up(x)))

  with jax.set_mesh(mesh):
    model = MLP(nnx.Rngs(0))
    model.up.kernel[...] = put(w1, None, "tp")  # same weights as above
    model.down.kernel[...] = put(w2, "tp", None)
    print(f"layer params: up.kernel {model.up.kernel[...].sharding.spec}  "
          f"down.kernel {model.down.kernel[...].sharding.spec}")
    forward = nnx.jit(lambda m, x: m(x))
    y2, t_layers = timed(forward, model, xs, iters=args.iters)
  err_layers = rel_err(y2, ref)
  print(f"Flax NNX layers MLP:     out {y2.shape} sharding {y2.sharding.spec}  "
        f"rel err vs x @ w {err_layers:.2e}  time {t_layers:.3f} ms")

  # 3) Sequence parallelism: x [S, B, D] as P(tp, dp, None), kept [S, B] end to end.
  errs = [err_fn, err_layers]
  if args.m % (dp * tp):
    print(f"sequence-parallel MLP:   skipped (m={args.m} is not divisible by dp * tp = "
          f"{dp * tp})")
  else:
    errs.append(sequence_parallel_mlp(args, mesh, dp, x, w1, w2, ref))
  worst = worst_error(errs)  # a NaN error is the worst (Python's max() may drop it)
  if not worst < 1e-2:
    raise SystemExit(f"FAILED: relative error {worst:.2e} >= 1e-2 (or NaN)")
  print("OK")


def collectives(compiled_text: str) -> str:
  """The collectives of a compiled program: XLA's own and our custom calls, counted."""
  # The opcode: after a space, right before its operands. The shape before it may be a tuple
  # with spaces in it (multi-operand and async collectives); names (`%all-reduce.1`) never
  # stand right before a parenthesis.
  found = re.findall(r"(?<= )(all-gather|all-reduce|reduce-scatter|all-to-all|"
                     r"collective-permute)(?:-start)?\(", compiled_text)
  found += re.findall(r'custom_call_target="(flashoverlap_\w+)"', compiled_text)
  return ", ".join(f"{name} x{n}" for name, n in collections.Counter(found).items()) or "none"


def sequence_parallel_mlp(args, mesh, dp, x, w1, w2, ref):
  """ColumnParallelLinear(sequence_parallel=True) -> gelu -> RowParallelLinear(reduce=
  "reduce_scatter") on x [S, B, D] as P(tp, dp, None); returns the relative error."""
  batch = 2 * dp if args.m % (2 * dp * mesh.shape["tp"]) == 0 else dp  # 2 rows of B a device
  seq = args.m // batch
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))

  class SequenceParallelMLP(nnx.Module):
    def __init__(self, rngs):
      self.up = ColumnParallelLinear(args.d, args.f, use_bias=False, sequence_parallel=True,
                                     rngs=rngs)
      self.down = RowParallelLinear(args.f, args.d, reduce="reduce_scatter", use_bias=False,
                                    rngs=rngs)

    def __call__(self, x):
      return self.down(jax.nn.gelu(self.up(x)))

  with jax.set_mesh(mesh):
    model = SequenceParallelMLP(nnx.Rngs(0))
    model.up.kernel[...] = put(w1, None, "tp")
    model.down.kernel[...] = put(w2, "tp", None)
    graph, state = nnx.split(model)
    forward = jax.jit(lambda st, x: nnx.merge(graph, st)(x))
    xs = put(x.reshape(seq, batch, args.d), "tp", "dp", None)
    compiled = forward.lower(state, xs).compile().as_text()
    y, t_sp = timed(forward, state, xs, iters=args.iters)
  err = rel_err(y, ref.reshape(seq, batch, args.d))
  print(f"sequence-parallel MLP:   x {xs.shape} {xs.sharding.spec} -> out {y.shape} sharding "
        f"{y.sharding.spec}  rel err vs x @ w {err:.2e}  time {t_sp:.3f} ms  collectives: "
        f"{collectives(compiled)}")
  return err


if __name__ == "__main__":
  main()
