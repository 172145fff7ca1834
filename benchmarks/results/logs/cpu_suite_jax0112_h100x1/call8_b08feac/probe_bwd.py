"""Session 39: what XLA's CPU program computes for JAX's own psum in a column layer's backward
(dx = psum_r(dy_r @ w_r.T), bf16) against ours, on this JAX: mismatch counts against two models,
(a) each rank's bf16 product summed in float32, rounded once (our reference's design) and
(b) each rank's float32 product summed in float32, rounded once."""
import os
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import jax_flashoverlap as fo

mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("tp",))  # as tests/_util.make_mesh_1d
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((8, 32)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((32, 64)), jnp.bfloat16)
dy = jnp.asarray(rng.standard_normal((8, 64)), jnp.bfloat16)
print("jax", jax.__version__)

def report(name, got, parts_bf16, parts_f32):
  a = np.asarray(sum(np.asarray(p, np.float32) for p in parts_bf16).astype(jnp.bfloat16), np.float32)
  b = np.asarray(sum(np.asarray(p, np.float32) for p in parts_f32).astype(jnp.bfloat16), np.float32)
  g = np.asarray(got, np.float32)
  print(f"{name}: mismatches vs model a (bf16 partials) {int((g != a).sum())}, vs model b (f32 partials) {int((g != b).sum())} of {g.size}")
  return g

ws = [w[:, 16 * r:16 * (r + 1)] for r in range(4)]
dys = [dy[:, 16 * r:16 * (r + 1)] for r in range(4)]
pb = [jax.jit(lambda a, b: a @ b.T)(d, v) for d, v in zip(dys, ws)]
pf = [jax.jit(lambda a, b: jnp.matmul(a, b.T, preferred_element_type=jnp.float32))(d, v) for d, v in zip(dys, ws)]
for check_vma in (True, False):
  f = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P(), P(None, "tp")),
                    out_specs=P(None, "tp"), check_vma=check_vma)
  _, vjp = jax.vjp(lambda x: f(x, w), x)
  (dx,) = jax.jit(vjp)(dy)
  xla = report(f"JAX's backward psum (check_vma={check_vma})", dx, pb, pf)
  print("  its program:", [l.strip()[:160] for l in jax.jit(vjp).lower(dy).compile().as_text().splitlines() if "all-reduce" in l or "dot(" in l][:4])
g = jax.shard_map(lambda d, v: jax.lax.psum(d @ v.T, "tp"), mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp")), out_specs=P())
report("lax.psum(dy @ w.T) in shard_map", jax.jit(g)(dy, w), pb, pf)
h = jax.shard_map(lambda d, v: fo.matmul_all_reduce(d, v, "tp", transpose_w=True), mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp")), out_specs=P())
report("ours matmul_all_reduce(dy, w, transpose_w=True)", jax.jit(h)(dy, w), pb, pf)
