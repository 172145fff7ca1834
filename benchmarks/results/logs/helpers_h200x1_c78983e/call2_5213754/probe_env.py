"""Does a call read FLASHOVERLAP_GEMM_HELPERS on the calling thread (or before the call returns)?
A bogus value set only around the call must raise (the C++ refuses unknown values)."""
import os
os.environ["JAX_FLASHOVERLAP_FALLBACK"] = "0"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo

mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
f = jax.jit(jax.shard_map(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), mesh=mesh,
                          in_specs=(P(None, "tp"), P("tp", None)), out_specs=P()))
x = jax.random.normal(jax.random.key(0), (2048, 1024), jnp.bfloat16)
w = jax.random.normal(jax.random.key(1), (1024, 2048), jnp.bfloat16)
print("custom call:", "flashoverlap_gemm_all_reduce" in f.lower(x, w).compile().as_text())
f(x, w).block_until_ready()
for trial in range(3):
  os.environ["FLASHOVERLAP_GEMM_HELPERS"] = "bogus"
  where = "none"
  try:
    out = f(x, w)
    del os.environ["FLASHOVERLAP_GEMM_HELPERS"]
    out.block_until_ready()
  except Exception as err:  # noqa: BLE001
    where = f"raised: {type(err).__name__}: {str(err)[:200]}"
  os.environ.pop("FLASHOVERLAP_GEMM_HELPERS", None)
  print(f"trial {trial}: {where}")
try:
  f(x, w).block_until_ready()
  print("after: a call with the switch unset runs")
except Exception as err:  # noqa: BLE001
  print("after: failed", type(err).__name__, str(err)[:200])
