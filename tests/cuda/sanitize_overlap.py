"""One overlapped call of each op under NVIDIA compute-sanitizer, 2 processes x 1 GPU.

    python -m jax_flashoverlap.launch -n 2 --gpus-per-process 1 \\
        tests/cuda/sanitize_overlap.py memcheck|racecheck|synccheck LOGDIR

Each process re-executes itself under `compute-sanitizer --tool TOOL` (one process per GPU:
a sanitizer serializes the kernels of its process, and NCCL needs both GPUs' kernels running
at once). memcheck checks every kernel of the program (ours, NCCL's, XLA's); racecheck and
synccheck check the signaling GEMM (NCCL's kernels are not ours to judge). Values are compared with XLA's; the
sanitizer's summary goes to LOGDIR/sanitize_TOOL_p<process>.log, and any error fails the
process (--error-exitcode).
"""
import os
import shutil
import sys

TOOLS = ("memcheck", "racecheck", "synccheck")
OUR_KERNEL = "kns=SignalingGemm"  # the signaling GEMM (its name in every instantiation)


def reexec_under_sanitizer(tool: str, logdir: str) -> None:
  exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
  me = os.environ.get("JAX_FLASHOVERLAP_PROCESS_ID", "0")
  cmd = [exe, "--tool", tool, "--error-exitcode", "9", "--log-file",
         os.path.join(logdir, f"sanitize_{tool}_p{me}.log")]
  if tool != "memcheck":
    cmd += ["--kernel-name", OUR_KERNEL]
  env = dict(os.environ, FO_UNDER_SANITIZER="1")
  os.execvpe(exe, cmd + [sys.executable, os.path.abspath(__file__), tool, logdir], env)


def main() -> int:
  tool, logdir = sys.argv[1], sys.argv[2]
  if tool not in TOOLS:
    raise SystemExit(f"tool must be one of {TOOLS}, got {tool!r}")
  if os.environ.get("FO_UNDER_SANITIZER") != "1":
    os.makedirs(logdir, exist_ok=True)
    reexec_under_sanitizer(tool, logdir)

  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  os.environ["JAX_FLASHOVERLAP_FALLBACK"] = "0"
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_flashoverlap as fo
  fo.distributed.initialize()
  mesh = Mesh(np.array(jax.devices()), ("tp",))
  m, n, k = 1024, 1024, 2048
  make = jax.jit(lambda key: (jax.random.normal(key, (m, k), jnp.bfloat16),
                              (jax.random.normal(key, (k, n)) / np.sqrt(k)).astype(jnp.bfloat16)),
                 out_shardings=(NamedSharding(mesh, P(None, "tp")),
                                NamedSharding(mesh, P("tp", None))))
  x, w = make(jax.random.key(1))
  for name, ours, ref, spec in (
      ("all_reduce", lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=16),
       lambda a, b: lax.psum(a @ b, "tp"), P()),
      ("reduce_scatter", lambda a, b: fo.matmul_reduce_scatter(a, b, "tp", comm_sms=16),
       lambda a, b: lax.psum_scatter(a @ b, "tp", scatter_dimension=0, tiled=True),
       P("tp", None))):
    smap = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)),
                                           out_specs=spec))
    f, g = smap(ours), smap(ref)
    assert "flashoverlap_gemm_" + name in f.lower(x, w).compile().as_text()
    a = np.asarray(f(x, w).addressable_data(0), np.float32)
    b = np.asarray(g(x, w).addressable_data(0), np.float32)
    err = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    assert err < 1e-2, (name, err)
    print(f"{tool} {name} process {jax.process_index()}: rel err {err:.1e}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
