"""Helpers shared by the GPU test files (the device machine; never CI): what the machine has,
fresh bf16 inputs, float32 references, relative errors and the custom-call check."""
import functools

import jax
import jax.numpy as jnp
import pytest
from jax import lax

TOL = 1e-2          # relative Frobenius error bound against float32 (and against XLA's bf16)
BF16 = jnp.bfloat16


def platform() -> str:
    try:
        return jax.devices()[0].platform
    except RuntimeError:
        return "none"


ON_GPU = platform() == "gpu"
N_GPUS = len(jax.devices()) if ON_GPU else 0


def extension_built() -> bool:
    try:
        import jax_flashoverlap as fo
    except Exception:  # noqa: BLE001  (a broken package must not break collection)
        return False
    ext = getattr(fo, "_ext", None)
    if ext is not None and hasattr(ext, "HAS_CUDA_EXT"):
        return bool(ext.HAS_CUDA_EXT)
    d = fo.info()
    return any(v is True for k, v in d.items() if "built" in k.lower())


def available_targets() -> frozenset:
    try:
        from jax_flashoverlap import _ext
        return _ext.available_targets()
    except Exception:  # noqa: BLE001
        return frozenset()


@functools.partial(jax.jit, static_argnums=(1, 2))
def normal(key, shape, scale=1.0):
    """Fresh random bf16 values (never zeros)."""
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(BF16)


def rel_fro(out, ref) -> float:
    out, ref = jnp.asarray(out, jnp.float32), jnp.asarray(ref, jnp.float32)
    return float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))


def dot32(x, w):
    return jnp.matmul(x.astype(jnp.float32), w.astype(jnp.float32), precision=lax.Precision.HIGHEST)


def assert_poisoned(lowered_text, target):
    """Every call to `target` in the lowered (StableHLO) text carries poison_outputs = 1: its
    handler fills the outputs with NaN before the call (conftest turns the switch on for GPU
    tests), so an unwritten element cannot pass as a value."""
    import re
    lines = [ln for ln in lowered_text.splitlines() if re.search(rf"@{target}(?![A-Za-z0-9_])", ln)]
    assert lines, f"no call to {target} in the lowered program"
    for ln in lines:
        assert re.search(r"poison_outputs\s*=\s*1\b", ln), f"{target} not poisoned: {ln}"


def assert_custom_call(jitted, args, target):
    lowered = jitted.lower(*args)
    text = lowered.compile().as_text()
    assert target in text, f"compiled program has no custom call {target}: the CUDA path is not used"
    assert_poisoned(lowered.as_text(), target)


def launch_two_processes(tmp_path, script_text: str, gpus_per_process: int, *args,
                         timeout: float = 240) -> str:
    """Runs `script_text` as 2 processes through jax_flashoverlap.launch; asserts they exit 0
    and returns their output. Children do not preallocate: this pytest process may already
    hold most of the GPUs' memory (JAX preallocates)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "two_processes.py"
    script.write_text(script_text)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "2",
                        "--gpus-per-process", str(gpus_per_process), "--timeout", str(timeout),
                        str(script), *map(str, args)],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=timeout + 60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    return out


# The GPU test files' marks: run on a GPU with the extension built, skipped (saying why) elsewhere.
MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not ON_GPU, reason=f"no GPU (platform {platform()!r})"),
    pytest.mark.skipif(ON_GPU and not extension_built(), reason="CUDA extension not built"),
]


def use_our_kernels(monkeypatch):
    """Our kernels at every shape (no cost-model fallback), whatever the environment says."""
    monkeypatch.setenv("JAX_FLASHOVERLAP_FALLBACK", "0")
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
