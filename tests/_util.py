"""Helpers shared by the CPU tests: meshes, shard_map wrapper, inputs, references, comparisons."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh

DTYPES = [jnp.bfloat16, jnp.float16]
DTYPE_IDS = ["bf16", "f16"]

# Tolerances for comparing against the *same* computation done by XLA in the same dtype.
# The op may accumulate / reduce in a different order or precision than XLA's reference, so
# allow a few units in the last place of the largest output value.
_SAME_DTYPE_TOL = {jnp.dtype(jnp.bfloat16): 2.0**-5, jnp.dtype(jnp.float16): 2.0**-8}
# Relative Frobenius error bound against the float32 reference (spec: < 1e-2).
REL_FRO_TOL = 1e-2


# ----------------------------------------------------------------------------- compile cache

CACHE_HITS, CACHE_MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"


def use_persistent_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path` for this process, every program in it
  whatever its compile time or size (the tests' programs are small)."""
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def compile_events() -> list:
  """A list JAX's monitoring events are appended to from now on (CACHE_HITS, CACHE_MISSES...)."""
  events = []
  jax.monitoring.register_event_listener(lambda name, **_: events.append(name))
  return events


# ----------------------------------------------------------------------------- meshes

def cpu_devices():
    """The CPU suite runs on (simulated) CPU devices everywhere, GPU machines included, so the
    reference path and the sharding logic are tested at every mesh size there too."""
    return jax.devices("cpu")


def _need_devices(n: int):
    have = len(cpu_devices())
    if have < n:
        pytest.skip(f"needs {n} CPU devices, have {have} (XLA_FLAGS host device count)")


def _mesh(devs, names):
    try:
        from jax.sharding import AxisType

        return Mesh(devs, names, axis_types=(AxisType.Auto,) * len(names))
    except (ImportError, TypeError):  # older JAX: no axis types, Auto is the only behaviour
        return Mesh(devs, names)


def make_mesh_1d(n: int, name: str = "tp") -> Mesh:
    _need_devices(n)
    return _mesh(np.array(cpu_devices()[:n]), (name,))


def make_mesh_2d(dp: int, tp: int) -> Mesh:
    _need_devices(dp * tp)
    return _mesh(np.array(cpu_devices()[: dp * tp]).reshape(dp, tp), ("dp", "tp"))


# ----------------------------------------------------------------------------- shard_map

def shard_map(body, mesh, in_specs, out_specs):
    """jax.shard_map with the replication/varying-axes check ON (the default; stated explicitly).

    Falls back to jax.experimental.shard_map (check_rep=True) on a JAX that lacks jax.shard_map.
    """
    if hasattr(jax, "shard_map"):
        return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=True)
    from jax.experimental.shard_map import shard_map as _sm  # pragma: no cover (old JAX)

    return _sm(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=True)


# ----------------------------------------------------------------------------- inputs

def rand(rng: np.random.Generator, shape, dtype, scale: float = 1.0):
    """Fresh standard-normal input (never zeros) in `dtype`."""
    a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    if a.size:
        assert np.count_nonzero(a) > 0
    return jnp.asarray(a, dtype=dtype)


def f32(a):
    return np.asarray(jnp.asarray(a, jnp.float32), dtype=np.float64)


# ----------------------------------------------------------------------------- references

def ref_all_reduce(x, w, axis_name):
    return lax.psum(x @ w, axis_name)


def ref_reduce_scatter(x, w, axis_name):
    return lax.psum_scatter(x @ w, axis_name, scatter_dimension=0, tiled=True)


def ref_matmul(x, w):
    return x @ w


def op_fn(fo, name: str, axis_name: str = "tp"):
    """(our per-device function, reference per-device function) for op `name`."""
    if name == "all_reduce":
        return (lambda x, w: fo.matmul_all_reduce(x, w, axis_name),
                lambda x, w: ref_all_reduce(x, w, axis_name))
    if name == "reduce_scatter":
        return (lambda x, w: fo.matmul_reduce_scatter(x, w, axis_name),
                lambda x, w: ref_reduce_scatter(x, w, axis_name))
    if name == "matmul":
        return (lambda x, w: fo.matmul(x, w), ref_matmul)
    raise ValueError(name)


PRIMITIVE_NAMES = {
    "all_reduce": "flashoverlap_gemm_all_reduce",
    "reduce_scatter": "flashoverlap_gemm_reduce_scatter",
    "matmul": "flashoverlap_gemm",
}


# ----------------------------------------------------------------------------- comparisons

def rel_fro(out, ref) -> float:
    o, r = f32(out), f32(ref)
    return float(np.linalg.norm((o - r).ravel()) / max(np.linalg.norm(r.ravel()), 1e-30))


def assert_close(out, ref, dtype=None):
    """`out` equals `ref` (same computation by XLA in the same dtype) up to low-precision rounding."""
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    assert out.dtype == ref.dtype, f"dtype {out.dtype} != reference {ref.dtype}"
    tol = _SAME_DTYPE_TOL[jnp.dtype(dtype or ref.dtype)]
    r = f32(ref)
    scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
    np.testing.assert_allclose(f32(out), r, rtol=tol, atol=tol * scale)


def assert_rel_fro(out, ref32, tol: float = REL_FRO_TOL):
    """Relative Frobenius error of a low-precision result against the float32 reference."""
    assert out.shape == ref32.shape, f"shape {out.shape} != reference {ref32.shape}"
    assert np.all(np.isfinite(f32(out))), "non-finite values in output"
    err = rel_fro(out, ref32)
    assert err < tol, f"relative Frobenius error {err:.3e} >= {tol}"


def check_against_refs(out, ref_same, ref32):
    """Both checks from the spec: same-dtype XLA reference and float32-upcast reference."""
    assert_close(out, ref_same)
    assert_rel_fro(out, ref32)


def upcast(*arrays):
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def spec_axes(entry):
    """Mesh axis names in one PartitionSpec entry (None, 'a' or ('a', 'b')) as a tuple."""
    if entry is None:
        return ()
    if isinstance(entry, (tuple, list)):
        return tuple(entry)
    return (entry,)


def all_spec_axes(spec):
    return tuple(a for e in spec for a in spec_axes(e))


# A collective's opcode in HLO text: after a space, right before its operands. The shape in
# front of it may be a tuple with spaces in it (multi-operand and async collectives:
# `(f32[8]{0}, f32[8]{0}) all-to-all(`), which `= \S+ all-to-all(` missed; instruction names
# (`%all-reduce.1`) never stand right before a parenthesis.
COLLECTIVE_OPCODE = (r"(?<= )(all-gather|all-to-all|collective-permute|all-reduce|"
                     r"reduce-scatter)(?:-start)?\(")
_COLLECTIVE = re.compile(COLLECTIVE_OPCODE)


def hlo_collectives(hlo: str) -> list:
    """XLA's collectives in HLO text, in program order (an async one once, by its -start)."""
    return _COLLECTIVE.findall(hlo)


def collectives(f, *args):
    """The collectives of jit-ed f's compiled program for args, in program order."""
    return hlo_collectives(f.lower(*args).compile().as_text())


VMAPS = ["direct", "of_jit", "of_checkpoint", "nested"]


def vmapped(fn, how):
    """jax.vmap of fn(x, w) over x only: directly, of jax.jit(fn), of jax.checkpoint(fn), or
    nested (x with two batch dims)."""
    over_x = lambda f: jax.vmap(f, in_axes=(0, None))  # noqa: E731
    inner = {"of_jit": jax.jit, "of_checkpoint": jax.checkpoint}.get(how, lambda f: f)(fn)
    return over_x(over_x(inner)) if how == "nested" else over_x(inner)


def with_partitioner(gspmd, fn, *args):
    """fn(*args) with GSPMD (gspmd=True) or Shardy as the partitioner, the setting restored."""
    old = bool(getattr(jax.config, "jax_use_shardy_partitioner", False))
    jax.config.update("jax_use_shardy_partitioner", not gspmd)
    try:
        return fn(*args)
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


# ----------------------------------------------------------------------------- CUDA lowering

def lower_for_cuda(f, args) -> str:
    """StableHLO text of jit(f) lowered for CUDA (no GPU needed: cross-lowering)."""
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_call_lines(text: str, target: str) -> list:
    """The lines of `text` that call the custom-call target `target` (either spelling)."""
    import re
    pat = re.compile(
        rf'(stablehlo\.custom_call\s+@{re.escape(target)}(?![A-Za-z0-9_])'
        rf'|custom_call_target\s*=\s*"{re.escape(target)}")')
    return [ln for ln in text.splitlines() if pat.search(ln)]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_env(**changes):
    """This process's environment for a child Python that imports the checkout: REPO first on
    PYTHONPATH; each change set (a value) or removed (None)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def set_env(monkeypatch, name: str, value) -> None:
    """A switch's value for this test: set, or unset where value is None."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def cuda_include():
    """The CUDA headers' include folder (a CUDA install or the pip wheel), or None."""
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr/cuda", "/opt/cuda"):
        if base and os.path.exists(os.path.join(base, "include", "cuda_runtime.h")):
            return os.path.join(base, "include")
    try:  # the pip wheel of the CUDA runtime headers
        import nvidia.cuda_runtime as rt
        inc = os.path.join(list(rt.__path__)[0], "include")
        if os.path.exists(os.path.join(inc, "cuda_runtime.h")):
            return inc
    except ImportError:
        pass
    return None


def nccl_include():
    """The NCCL headers' include folder (the nvidia-nccl wheel setup.py builds with), or None."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except ModuleNotFoundError:  # no nvidia package at all
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(os.path.join(base, "include", "nccl.h")):
            return os.path.join(base, "include")
    return None


# ----------------------------------------------------------------------------- fake extension

class FakeCommExtension:
    """The extension's communicator calls that ensure_communicators makes, doing nothing but
    remembering which comm_ids were made (tests replace _ext.ext with a subclass)."""

    def __init__(self):
        self.made = set()

    def has_communicators(self, cid):
        return cid in self.made

    def nccl_unique_id(self):
        return bytes(128)

    def create_communicators(self, cid, uid, world, local, comm_sms, nbytes, watchdog,
                             peer_to_peer=False, cta_policy=0):
        self.made.add(cid)

    def ensure_workspace(self, cid, nbytes):
        pass

    def connect_peers(self, cid):
        pass
