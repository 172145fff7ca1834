"""Probe (session 25): can another process map XLA's own buffers through CUDA IPC?
Process "export": a JAX array's pointer -> its allocation (cuMemGetAddressRange) -> an IPC
handle of the allocation's base (cuIpcGetMemHandle), written to a file with the offset; a
later, larger array: same allocation? Process "import" opens the handle
(cuIpcOpenMemHandle) and reads the array's bytes back through the mapping."""
import ctypes, os, sys, time, json
import numpy as np

cuda = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
  if r != 0:
    s = ctypes.c_char_p(); cuda.cuGetErrorString(r, ctypes.byref(s))
    raise RuntimeError(f"{what}: {r} {s.value}")

class Handle(ctypes.Structure):
  _fields_ = [("reserved", ctypes.c_char * 64)]

cuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), Handle, ctypes.c_uint]
cuda.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(Handle), ctypes.c_uint64]


def ctx():
  ck(cuda.cuInit(0), "cuInit")
  dev = ctypes.c_int(); ck(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
  c = ctypes.c_void_p(); ck(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev), "retain")
  ck(cuda.cuCtxSetCurrent(c), "setcurrent")

def export(path):
  import jax, jax.numpy as jnp
  x = jax.device_put(np.arange(1024, dtype=np.float32)); x.block_until_ready()
  y = jnp.ones((64 << 20,), jnp.float32) * 3; y.block_until_ready()  # 256 MB, later
  ctx()
  out = {"allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
         "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default")}
  z = ctypes.c_uint64()  # control: a legacy cuMemAlloc buffer of 3.0f, which IPC must take
  ck(cuda.cuMemAlloc_v2(ctypes.byref(z), ctypes.c_size_t(4096)), "alloc")
  ck(cuda.cuMemsetD32_v2(z, ctypes.c_uint(0x40400000), ctypes.c_size_t(1024)), "memset")
  ck(cuda.cuCtxSynchronize(), "sync")
  class Ptr:
    def __init__(self, v): self.v = v
    def unsafe_buffer_pointer(self): return self.v
  for name, a in (("x", x), ("y", y), ("z", Ptr(z.value))):
    p = a.unsafe_buffer_pointer()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    ck(cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(p)), "range")
    h = Handle()
    r = cuda.cuIpcGetMemHandle(ctypes.byref(h), base)
    out[name] = {"ptr": p, "base": base.value, "size": size.value, "offset": p - base.value,
                 "ipc_rc": r, "handle": ctypes.string_at(ctypes.addressof(h), 64).hex()}
  json.dump(out, open(path + ".tmp", "w")); os.replace(path + ".tmp", path)
  print("export", json.dumps({k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "handle"}) for k, v in out.items()}), flush=True)
  for _ in range(600):
    if os.path.exists(path + ".done"): break
    time.sleep(0.1)
  print("export: importer done:", open(path + ".done").read() if os.path.exists(path + ".done") else "TIMEOUT", flush=True)

def imp(path):
  for _ in range(600):
    if os.path.exists(path): break
    time.sleep(0.1)
  d = json.load(open(path)); ctx(); res = []
  for name, want, n in (("x", np.arange(1024, dtype=np.float32), 1024), ("y", np.full(1024, 3, np.float32), 1024),
                        ("z", np.full(1024, 3, np.float32), 1024)):
    e = d[name]
    if e["ipc_rc"] != 0:
      res.append(f"{name}: no handle (rc {e['ipc_rc']})"); continue
    h = Handle(); raw = bytes.fromhex(e["handle"]); ctypes.memmove(ctypes.addressof(h), raw, 64)
    mapped = ctypes.c_uint64()
    r = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(mapped), h, ctypes.c_uint(1))
    if r != 0:
      res.append(f"{name}: open rc {r}"); continue
    host = np.zeros(n, np.float32)
    ck(cuda.cuMemcpyDtoH_v2(host.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(mapped.value + e["offset"]), ctypes.c_size_t(host.nbytes)), "dtoh")
    res.append(f"{name}: mapped, values {'EQUAL' if np.array_equal(host, want) else 'DIFFER'}")
    ck(cuda.cuIpcCloseMemHandle(mapped), "close")
  print("import", res, flush=True)
  open(path + ".done", "w").write("; ".join(res))

if __name__ == "__main__":
  {"export": export, "import": imp}[sys.argv[1]](sys.argv[2])
