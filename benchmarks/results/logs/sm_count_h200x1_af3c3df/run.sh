#!/usr/bin/env bash
# Session 15, call 4: the SM count the lowering reads on a real H200 (must be 132: no
# warning), and the lowering / plain GEMM tests through the extension.
O=$OUT; export OUT=/tmp/o4; rm -rf $OUT; mkdir -p $OUT
rm -rf build/obj && mkdir -p build/obj && cp .gpu_obj/*.o build/obj/
export JAX_FLASHOVERLAP_GIT_COMMIT=$(git rev-parse HEAD) NCCL_NVLS_ENABLE=0
bash scripts/gpu_session.sh build > $OUT/session.txt 2>&1
python3 - > $OUT/sm_count.log 2>&1 <<'PY'
import warnings
warnings.simplefilter("error")  # an SMCountWarning on a 132-SM H200 would fail here
import jax, jax.numpy as jnp, numpy as np
import jax_flashoverlap as fo
from jax_flashoverlap import _ext, primitives
d = jax.devices()[0]
print("device", d.device_kind, "core_count", getattr(d, "core_count", None))
print("local_gpu_sms", _ext.local_gpu_sms())
x = jax.random.normal(jax.random.key(0), (4096, 4096), jnp.bfloat16)
w = jax.random.normal(jax.random.key(1), (4096, 4096), jnp.bfloat16)
f = jax.jit(lambda a, b: fo.matmul(a, b, comm_sms=16))
assert "flashoverlap_gemm" in f.lower(x, w).as_text()
y = f(x, w)
ref = jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32))
print("rel err", float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)))
assert _ext.local_gpu_sms() == 132, _ext.local_gpu_sms()
print("OK")
PY
JAX_FLASHOVERLAP_FALLBACK=0 timeout 200 python3 -m pytest -q tests/test_lowering.py > $OUT/lowering.log 2>&1
tail -3 $OUT/session.txt; cat $OUT/sm_count.log; tail -2 $OUT/lowering.log
tar -czf $O/logs.tgz -C $OUT .
