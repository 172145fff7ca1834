"""Does the first overlapped call of a process overlap? One GPU (a 1-rank communicator),
matmul_all_reduce 8192^3 bf16 with 8 groups, traced (FLASHOVERLAP_TRACE=1): for each of 4
calls, when the GEMM finished and when group 0's rows were ready (the comm stream's wait
ended). Under CUDA's lazy loading a kernel's module loads at its first launch and that load
waits for the kernels running then: with the spin wait (JAX_FLASHOVERLAP_WAIT=spin), the
first call's waits began only after its GEMM until the communicator loaded them up front.

    JAX_FLASHOVERLAP_FALLBACK=0 JAX_FLASHOVERLAP_WAIT=spin FLASHOVERLAP_TRACE=1 \
      python3 scripts/first_call_overlap.py      (optionally CUDA_MODULE_LOADING=EAGER)
"""
import argparse, os, json, sys
# Arguments first, before JAX starts: --help answers on any machine (the probe takes none).
argparse.ArgumentParser(description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo
from jax_flashoverlap import _ext, plan, trace
if jax.default_backend() != "gpu" or not _ext.env_switch(trace.TRACE_ENV, False):
    sys.exit("first_call_overlap.py: needs a GPU and FLASHOVERLAP_TRACE=1 (backend here: "
             f"{jax.default_backend()!r}; off GPU the op is XLA's and leaves no trace records)")
mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
f = jax.jit(jax.shard_map(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), mesh=mesh,
                          in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))
kx, kw = jax.random.split(jax.random.key(0))
x = jax.random.normal(kx, (8192, 8192), jnp.bfloat16)
w = (jax.random.normal(kw, (8192, 8192), jnp.float32) / 90).astype(jnp.bfloat16)
x.block_until_ready(); w.block_until_ready()
rows = []
for i in range(4):
    with plan.forced(num_groups=8, comm_sms=16):  # the first call lowers here; then cached
        f(x, w).block_until_ready()
    recs = trace.read()
    if not recs:
        sys.exit("first_call_overlap.py: the call left no trace record: it took XLA's path "
                 "(set JAX_FLASHOVERLAP_FALLBACK=0)")
    r = recs[-1]
    rows.append(dict(call=i, records=len(recs), gemm_done_ms=round(r["gemm_done_ms"], 3),
                     ready0_ms=round(r["ready_ms"][0], 3), groups=len(r["ready_ms"]),
                     end_ms=round(trace.call_end_ms(r), 3)))
print("PROBE", os.environ.get("CUDA_MODULE_LOADING", "default(lazy)"), json.dumps(rows))
