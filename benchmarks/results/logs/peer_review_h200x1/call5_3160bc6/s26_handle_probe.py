"""Session 26 probe (one GPU): what handles XLA's own buffers carry (they are cuMemMap
mappings here, benchmarks/results/logs/peer_review_h200x1): the allowed shareable handle types
of a result's allocation, and whether it exports as a POSIX file descriptor (which another
process could import and map: the staged all-reduce's copy-out would go)."""
import ctypes
import json
import os
import sys

import jax
import numpy as np

cuda = ctypes.CDLL("libcuda.so.1")
x = jax.device_put(np.arange(1 << 20, dtype=np.float32), jax.devices()[0])
y = (x * 2).block_until_ready()  # an executable's result, not only a transfer's
out = {"allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")}
for name, arr in (("device_put", x), ("result", y)):
    ptr = ctypes.c_uint64(arr.unsafe_buffer_pointer())
    r = {}
    for attr, code in (("allowed_handle_types", 14), ("legacy_ipc_capable", 10), ("mapped", 13)):
        v = ctypes.c_uint64(0)
        r[attr] = [cuda.cuPointerGetAttribute(ctypes.byref(v), code, ptr), v.value]
    handle = ctypes.c_uint64(0)
    r["retain"] = cuda.cuMemRetainAllocationHandle(ctypes.byref(handle), ctypes.c_void_p(ptr.value))
    if r["retain"] == 0:
        fd = ctypes.c_int(-1)
        r["export_posix_fd"] = [cuda.cuMemExportToShareableHandle(ctypes.byref(fd), handle, 1, 0), fd.value]
        cuda.cuMemRelease(handle)
    out[name] = r
print("PROBE", json.dumps(out))
sys.stdout.flush()
