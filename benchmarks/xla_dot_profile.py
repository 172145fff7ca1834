"""XLA's dot at one shape, for a profiler: compile and autotune first, then run the dot three
times between cuProfilerStart and cuProfilerStop (`ncu --profile-from-start off` profiles only
those). Used by benchmarks/profile_gemms.sh.

    python benchmarks/xla_dot_profile.py MxNxK
"""
import argparse
import ctypes
import re

import jax
import jax.numpy as jnp


def main(shape: str) -> None:
    m, n, k = (int(v) for v in shape.split("x"))
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = jax.random.normal(kw, (k, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    print(f.lower(x, w).compile().as_text()[:4000])  # which custom call / fusion XLA chose
    for _ in range(3):
        f(x, w).block_until_ready()
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    cuda.cuCtxGetCurrent(ctypes.byref(ctx))
    if not ctx.value:  # JAX runs on the primary context; make it current on this thread
        dev = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), 0)
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        cuda.cuCtxSetCurrent(ctx)
    print("cuProfilerStart", cuda.cuProfilerStart())
    for _ in range(3):
        f(x, w).block_until_ready()
    print("cuProfilerStop", cuda.cuProfilerStop())


def _shape(text: str) -> str:
    if not re.fullmatch(r"[1-9]\d*x[1-9]\d*x[1-9]\d*", text):
        raise argparse.ArgumentTypeError(f"shape must be MxNxK with positive integers, got {text!r}")
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("shape", nargs="?", type=_shape, default="8192x8192x4096",
                        help="the dot's M x N x K (default: %(default)s)")
    shape = parser.parse_args().shape
    if jax.default_backend() != "gpu":  # it drives CUDA's profiler API (libcuda)
        parser.error(f"needs a GPU (JAX's backend here is {jax.default_backend()!r})")
    main(shape)
