"""Loads the compiled extension once and registers its XLA FFI targets.

The extension (`jax_flashoverlap._xla_ffi`, built by setup.py from xla_ffi/) is optional:
without it every op lowers to the reference composition (XLA's own dot + collective).
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

from jax_flashoverlap import _compat

FORCE_REFERENCE_ENV = "JAX_FLASHOVERLAP_FORCE_REFERENCE"
# "0" turns off the cost model's fallback to XLA's dot + collective for shapes where overlap
# is predicted not to pay: every shape then runs our kernels (tests, benchmarks).
FALLBACK_ENV = "JAX_FLASHOVERLAP_FALLBACK"


def _load_extension():
  import importlib
  import importlib.util
  if importlib.util.find_spec("jax_flashoverlap._xla_ffi") is None:
    return None, "not built (no jax_flashoverlap/_xla_ffi*.so; see README: building on a GPU machine)"
  try:
    return importlib.import_module("jax_flashoverlap._xla_ffi"), None
  except ImportError as err:  # built, but a library it needs (NCCL, CUDA) is missing
    return None, f"built but failed to load: {type(err).__name__}: {err}"


ext, EXT_IMPORT_ERROR = _load_extension()
HAS_CUDA_EXT = ext is not None

_lock = threading.Lock()
_registered = False
_warned_missing = False


class ExtensionMissingWarning(RuntimeWarning):
  """A GPU is in use but the CUDA extension is not built: ops run non-overlapped."""


def force_reference() -> bool:
  """True when the env var asks for the reference path on every platform."""
  return os.environ.get(FORCE_REFERENCE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def fallback_enabled() -> bool:
  return os.environ.get(FALLBACK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=None)
def available_targets() -> frozenset:
  """Names of the FFI targets the built extension provides (empty without it)."""
  if ext is None:
    return frozenset()
  return frozenset(ext.registrations().keys())


def register_targets() -> None:
  """Registers every FFI target of the extension with XLA's CUDA platform (idempotent)."""
  global _registered
  if ext is None or _registered:
    return
  with _lock:
    if _registered:
      return
    for name, capsule in ext.registrations().items():
      _compat.register_ffi_target(name, capsule, platform="CUDA")
    _registered = True


def local_gpu_present() -> bool:
  import jax
  try:
    return len(jax.devices("gpu")) > 0
  except RuntimeError:
    return False


def check_cuda_path(target: str, *, gpu_present: bool | None = None) -> tuple[bool, str]:
  """Whether a CUDA lowering should emit `target` as a custom call, and why (or why not).

  Cross-lowering on a machine with no GPU (e.g. `lower(lowering_platforms=("cuda",))` in CI)
  emits the custom call whenever it cannot tell otherwise: the program is for another machine.
  With a local GPU and no extension, warns once and uses the reference composition.
  """
  global _warned_missing
  if force_reference():
    return False, f"{FORCE_REFERENCE_ENV} is set: using the reference path (XLA dot + collective)"
  if gpu_present is None:
    gpu_present = local_gpu_present()
  if not gpu_present:
    return True, "cross-lowering for CUDA without a local GPU: custom call " + target
  if ext is None:
    if not _warned_missing:
      _warned_missing = True
      warnings.warn(
          "jax_flashoverlap: a GPU is present but the CUDA extension is not built "
          f"({EXT_IMPORT_ERROR}); ops run through the reference path, without overlap. "
          "Build it with `pip install --no-build-isolation -e .` on a machine with nvcc.",
          ExtensionMissingWarning, stacklevel=3)
    return False, f"CUDA extension not built ({EXT_IMPORT_ERROR}): reference path"
  if target not in available_targets():
    return False, (f"the CUDA extension does not provide {target!r}: reference path "
                   "(XLA dot + collective)")
  register_targets()
  return True, "CUDA extension built: custom call " + target
