"""Environment variables with the project's prefixes that nothing reads.

Each switch validates its own value (a value it does not take is an error naming it), but a
misspelt *name* (the watchdog's variable without its `_S`, FALBACK for FALLBACK) would leave
the switch at its default without a word: a watchdog the user believes on, a hang. So every
lowering warns once per process about each such name, naming the closest real one, and
`python -m jax_flashoverlap.info` lists them (and exits 1).
"""

from __future__ import annotations

import difflib
import os
import threading
import warnings

PREFIXES = ("JAX_FLASHOVERLAP_", "FLASHOVERLAP_")

# Every variable with those prefixes that the package, its build (setup.py), its scripts or its
# C++ read (tests/test_environment.py checks this list against the sources, with the scanner
# of tests/test_docs.py).
KNOWN = frozenset({
    # Python, at lowering or setup
    "JAX_FLASHOVERLAP_FORCE_REFERENCE", "JAX_FLASHOVERLAP_FALLBACK",
    "JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", "JAX_FLASHOVERLAP_TRANSPORT",
    "JAX_FLASHOVERLAP_GRANT_PEER_ACCESS", "JAX_FLASHOVERLAP_POISON_OUTPUTS",
    "JAX_FLASHOVERLAP_WAIT", "JAX_FLASHOVERLAP_WATCHDOG_S", "JAX_FLASHOVERLAP_TUNED",
    "JAX_FLASHOVERLAP_CONFIG_DIR", "FLASHOVERLAP_TRACE",
    # several processes (jax_flashoverlap.launch sets the first three and the last)
    "JAX_FLASHOVERLAP_COORDINATOR", "JAX_FLASHOVERLAP_NUM_PROCESSES",
    "JAX_FLASHOVERLAP_PROCESS_ID", "JAX_FLASHOVERLAP_KV_TIMEOUT_S",
    "JAX_FLASHOVERLAP_LAUNCH_NOTES",
    # the signaling GEMM's launcher and the calls (C++)
    "FLASHOVERLAP_GEMM_EPILOGUE", "FLASHOVERLAP_GEMM_QUEUE", "FLASHOVERLAP_GEMM_TAIL",
    "FLASHOVERLAP_GEMM_SCHEDULE", "FLASHOVERLAP_GEMM_HELPERS", "FLASHOVERLAP_GEMM_SERPENTINE",
    "FLASHOVERLAP_GEMM_LOG", "FLASHOVERLAP_GEMM_TILE", "FLASHOVERLAP_GEMM_PANEL",
    # build, benchmark records and test scripts
    "JAX_FLASHOVERLAP_BUILD_CUDA", "JAX_FLASHOVERLAP_NVCC_THREADS",
    "JAX_FLASHOVERLAP_GIT_COMMIT", "JAX_FLASHOVERLAP_TEST_WORKERS",
    "JAX_FLASHOVERLAP_TEST_CACHE_DIR",
})


class UnknownVariableWarning(UserWarning):
  """An environment variable with the project's prefix that nothing reads (a misspelt switch)."""


def _unknown_names(environ=None) -> list[str]:
  environ = os.environ if environ is None else environ
  return sorted(n for n in environ if n.startswith(PREFIXES) and n not in KNOWN)


def _message(name: str) -> str:
  close = closest_known(name)
  hint = f"did you mean {close}? " if close else ""
  return (f"environment variable {name} is not one jax_flashoverlap reads ({hint}"
          "it has no effect; README.md and docs/ document every variable)")


def unknown_variables(environ=None) -> list[str]:
  """Messages for each set variable with a project prefix that is not a known one."""
  return [_message(name) for name in _unknown_names(environ)]


def _suffix(name: str) -> str:
  return name[len(next(p for p in PREFIXES if name.startswith(p))):]


def closest_known(name: str) -> str | None:
  """The known variable `name` most likely meant, compared after the prefixes (which every
  name shares, and which would make any two look alike); None if none is close."""
  by_suffix = {}
  for known in sorted(KNOWN):
    by_suffix.setdefault(_suffix(known), known)
  close = difflib.get_close_matches(_suffix(name), list(by_suffix), n=1, cutoff=0.75)
  return by_suffix[close[0]] if close else None


_warned: set = set()
_lock = threading.Lock()


def warn_unknown_variables() -> None:
  """One UnknownVariableWarning per such variable per process (called at every lowering: a
  name warned about already costs no closest-name search)."""
  with _lock:
    new = [name for name in _unknown_names() if name not in _warned]
    _warned.update(new)
  for name in new:
    warnings.warn(f"jax_flashoverlap: {_message(name)}", UnknownVariableWarning, stacklevel=3)
