"""Loads the compiled extension once and registers its XLA FFI targets.

The extension (`jax_flashoverlap._xla_ffi`, built by setup.py from xla_ffi/) is optional:
without it every op lowers to the reference composition (XLA's own dot + collective).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings

from jax_flashoverlap import _compat

FORCE_REFERENCE_ENV = "JAX_FLASHOVERLAP_FORCE_REFERENCE"
# "0" turns off the cost model's fallback to XLA's dot + collective for shapes where overlap
# is predicted not to pay: every shape then runs our kernels (tests, benchmarks).
FALLBACK_ENV = "JAX_FLASHOVERLAP_FALLBACK"
GEMM_EPILOGUE_ENV = "FLASHOVERLAP_GEMM_EPILOGUE"  # read by the kernel launcher at every launch
GEMM_QUEUE_ENV = "FLASHOVERLAP_GEMM_QUEUE"  # likewise
GEMM_TAIL_ENV = "FLASHOVERLAP_GEMM_TAIL"  # likewise
GEMM_SCHEDULE_ENV = "FLASHOVERLAP_GEMM_SCHEDULE"  # likewise (and tile_schedule.kernel_geometry)
# Read by the all-reduce / reduce-scatter calls at every call (xla_ffi/comm/call_frame.cc).
GEMM_HELPERS_ENV = "FLASHOVERLAP_GEMM_HELPERS"
ALL_REDUCE_BUFFER_ENV = "JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER"  # read at lowering
TRANSPORT_ENV = "JAX_FLASHOVERLAP_TRANSPORT"  # read at lowering (transport())
GRANT_PEER_ACCESS_ENV = "JAX_FLASHOVERLAP_GRANT_PEER_ACCESS"  # read at lowering (grant_peer_access())
# "spin": spin-kernel waits and flag writes (xla_ffi/comm/stream_wait.cc, stream_write.cc);
# unset or empty: stream memory operations. Anything else: an error at lowering
# (check_kernel_integers) and at communicator creation (ReadWaitEnv).
WAIT_ENV = "JAX_FLASHOVERLAP_WAIT"
# "1" (tests): every custom call fills its outputs (and its communicator's workspace) with NaN
# before it runs, so an element it leaves unwritten shows (read at lowering).
POISON_OUTPUTS_ENV = "JAX_FLASHOVERLAP_POISON_OUTPUTS"


# setup.py's note of why the install built no extension (its BUILD_NOTE): pip hides the build's
# output unless it fails.
BUILD_NOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_note.txt")


def not_built_reason(note_path: str = BUILD_NOTE) -> str:
  try:
    with open(note_path, encoding="utf-8", errors="replace") as f:
      said = f.read().strip()
  except OSError:
    said = ""
  where = "no jax_flashoverlap/_xla_ffi*.so"
  if said:
    return f"not built ({where}; setup.py said: {said})"
  return f"not built ({where}; see README: building on a GPU machine)"


def _load_extension():
  import importlib
  import importlib.util
  if importlib.util.find_spec("jax_flashoverlap._xla_ffi") is None:
    return None, not_built_reason()
  try:
    return importlib.import_module("jax_flashoverlap._xla_ffi"), None
  except ImportError as err:  # built, but a library it needs (NCCL, CUDA) is missing
    return None, f"built but failed to load: {type(err).__name__}: {err}"


ext, EXT_IMPORT_ERROR = _load_extension()
HAS_CUDA_EXT = ext is not None


@functools.cache  # fixed for the process; read at every tuned-plan lookup
def kernel_build() -> str | None:
  """The built extension's kernel build (setup.py's digest of xla_ffi/kernels and
  xla_ffi/comm: what a tuned plan's speed depends on), or None without the extension (or one
  built before it was recorded)."""
  if ext is None:
    return None
  return ext.build_info().get("kernel_build") or None

_lock = threading.Lock()
_registered = False
_warned_missing = False


class ExtensionMissingWarning(RuntimeWarning):
  """A GPU is in use but the CUDA extension is not built: ops run non-overlapped."""


class UnsupportedGPUWarning(RuntimeWarning):
  """The local GPU is not one the kernels are built for (sm_90: H100 / H200): ops run
  non-overlapped, through the reference path."""


# The signaling GEMM is compiled for sm_90a only (xla_ffi/kernels/signaling_gemm.cu refuses any
# other device with an Unimplemented error at run time); other GPUs take the reference path.
SUPPORTED_COMPUTE_CAPABILITIES = ("9.0",)
_warned_unsupported = False


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
OFF_WORDS = _FALSE  # also what turns JAX_FLASHOVERLAP_WATCHDOG_S off (comm.watchdog_seconds)


def env_switch(name: str, default: bool) -> bool:
  """The on/off switch `name` from the environment (unset or empty: `default`).

  Any other value than 1/true/yes/on or 0/false/no/off is an error naming the variable: a typo
  must not silently leave the switch in its default state.
  """
  raw = os.environ.get(name)
  if raw is None or not raw.strip():
    return default
  value = raw.strip().lower()
  if value in _TRUE:
    return True
  if value in _FALSE:
    return False
  raise ValueError(f"jax_flashoverlap: environment variable {name}={raw!r} is not an on/off "
                   f"switch; expected one of {', '.join(_TRUE + _FALSE)} (or unset)")


def force_reference() -> bool:
  """True when the env var asks for the reference path on every platform."""
  return env_switch(FORCE_REFERENCE_ENV, False)


def fallback_enabled() -> bool:
  return env_switch(FALLBACK_ENV, True)


def poison_outputs() -> bool:
  """JAX_FLASHOVERLAP_POISON_OUTPUTS: a test switch, off by default. On, each of our custom
  calls lowered from then on carries `poison_outputs = 1`, and its handler fills XLA's output
  buffers and the communicator's workspace with NaN (0xFF bytes) on the compute stream before
  the call, so a tile the kernels leave unwritten, or one the GEMM computes from rows that had
  not arrived, comes out NaN instead of stale memory. It costs a memset per buffer per call."""
  return env_switch(POISON_OUTPUTS_ENV, False)


def check_gemm_epilogue() -> None:
  """FLASHOVERLAP_GEMM_EPILOGUE is unset, 'overlap' (the default), 'sync' (the signaling
  GEMM's earlier epilogue) or 'halves' (overlapped, staged in halves),
  FLASHOVERLAP_GEMM_QUEUE unset, 'dynamic' or 'static',
  FLASHOVERLAP_GEMM_TAIL unset, 'split' or 'whole', FLASHOVERLAP_GEMM_SCHEDULE unset,
  'cooperative' or 'pingpong', and FLASHOVERLAP_GEMM_HELPERS unset, 'off' or 'on', exactly as
  the launcher and the calls read them;
  anything else is an error here, at lowering, instead of at the first launch. Then the
  integer variables and JAX_FLASHOVERLAP_WAIT (check_kernel_integers)."""
  for env, allowed, meaning in _GEMM_SWITCHES:
    raw = os.environ.get(env)
    if raw not in (None, "", *allowed):
      raise ValueError(f"jax_flashoverlap: environment variable {env}={raw!r} must be {meaning}")
  check_kernel_integers()


def check_kernel_integers() -> None:
  """The launcher's integer variables (_GEMM_INTEGERS) hold an accepted integer, and
  JAX_FLASHOVERLAP_WAIT is unset or 'spin'. The launcher refuses anything else at every launch
  (PlanLaunch; communicator creation for the wait) and says why; checked here too, so a typo is
  an error at lowering, naming the variable, not a failed call. (The C++ once read the integers
  with atoi: 'true' turned the serpentine order *off*.)"""
  for env, _, _ in _GEMM_INTEGERS:
    kernel_integer(env)
  raw = os.environ.get(WAIT_ENV)
  if raw not in (None, "", "spin"):
    raise ValueError(f"jax_flashoverlap: environment variable {WAIT_ENV}={raw!r} must be "
                     "'spin' (spin-kernel waits and flag writes) or unset (the default: CUDA "
                     "stream memory operations)")


def kernel_integer(env: str) -> int | None:
  """One of the launcher's integer variables (_GEMM_INTEGERS) as the launcher reads it: None
  where unset or empty (EnvInt: the launcher's default), else the accepted integer; anything
  else raises a ValueError naming the variable."""
  accepted, meaning = next((a, m) for e, a, m in _GEMM_INTEGERS if e == env)
  raw = os.environ.get(env)
  if raw is None or raw == "":
    return None
  # ASCII digits and spaces, as the launcher's strtol / isdigit: re's \d also took other
  # scripts' digits ('\u0661' passed here as 1, and every launch refused it: a failed call at
  # run time instead of this error at lowering)
  value = int(raw) if re.fullmatch(r"\s*[+-]?\d{1,10}\s*", raw, re.ASCII) else None
  if value not in accepted:
    raise ValueError(f"jax_flashoverlap: environment variable {env}={raw!r} must be "
                     f"{meaning} (the kernel reads an integer: a word would count as 0)")
  return value


# signaling_gemm.cu EnvInt / PlanLaunch: (variable, accepted integers, what they mean).
_GEMM_INTEGERS = (
    ("FLASHOVERLAP_GEMM_SERPENTINE", (0, 1),
     "0 (every panel walks its column tiles left to right) or 1 (the default: serpentine)"),
    ("FLASHOVERLAP_GEMM_LOG", (0, 1),
     "0 (the default) or 1 (one line on stderr per launch geometry)"),
    ("FLASHOVERLAP_GEMM_TILE", (0, 128, 256),
     "128 or 256 (forces the tile width), or 0 (the default: the launcher chooses)"),
    # panel < 1 was clamped to 1; beyond a wave's rows a larger panel changes nothing
    ("FLASHOVERLAP_GEMM_PANEL", range(1, 1025),
     "an integer in [1, 1024] (cluster rows per L2 panel; the default is 8)"),
)


# The signaling GEMM's switches (xla_ffi/kernels/signaling_gemm.cu reads them on every launch).
_GEMM_SWITCHES = (
    (GEMM_EPILOGUE_ENV, ("overlap", "sync", "halves"),
     "'overlap' (the default), 'sync' (the signaling GEMM's earlier epilogue) or 'halves' "
     "(the overlapped epilogue staged one warpgroup's rows at a time, 4 mainloop stages)"),
    (GEMM_QUEUE_ENV, ("dynamic", "static"),
     "'dynamic' (the default: the signaling GEMM's tile queue) or 'static' (its round-robin "
     "tile order)"),
    (GEMM_TAIL_ENV, ("split", "whole"),
     "'split' (the default: the signaling GEMM cuts its last two waves along K when the last "
     "one is partial) or 'whole' (whole tiles only)"),
    (GEMM_SCHEDULE_ENV, ("cooperative", "pingpong"),
     "'cooperative' (the default: both consumer warpgroups of the signaling GEMM compute "
     "each 128x256 tile together) or 'pingpong' (each computes 128x128 tiles of its own, in "
     "turn)"),
    (GEMM_HELPERS_ENV, ("off", "on"),
     "'off' (the default) or 'on' (the overlapped all-reduce / reduce-scatter lend the SMs "
     "left to NCCL to the signaling GEMM between their collectives: helper launches)"),
)


def all_reduce_in_place() -> bool:
  """JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER: 'workspace' (unset: the default) or 'output'.

  workspace: the GEMM writes into the communicator's registered M x N window, NCCL reduces
  there on few SMs, copies move each group to XLA's output (fast; one persistent M x N buffer
  per communicator). output: the GEMM writes into XLA's output and NCCL reduces it in place
  (no extra buffer, only the group counters and the communicator's fixed tile queue; NCCL on
  a plain buffer is slower per CTA, which the cost model knows)."""
  raw = os.environ.get(ALL_REDUCE_BUFFER_ENV)
  if raw in (None, "", "workspace"):
    return False
  if raw == "output":
    return True
  raise ValueError(f"jax_flashoverlap: environment variable {ALL_REDUCE_BUFFER_ENV}={raw!r} "
                   "must be 'workspace' (the default: a registered M x N window per "
                   "communicator) or 'output' (reduce in XLA's output, no extra buffer)")


TRANSPORTS = ("auto", "nccl", "peer")


def transport() -> str:
  """JAX_FLASHOVERLAP_TRANSPORT: how matmul_all_reduce / matmul_reduce_scatter move data.

  nccl: one NCCL call per group on a second stream, on the SMs the GEMM leaves free. peer
  (experimental; docs/DESIGN.md, "Peer stores", "Ring reduction"): over 2 to 8 GPUs of one
  host (all in this process, or one per process through CUDA IPC), the GEMM reduces along a
  ring as it stores each tile, adding the running sum its next rank passed it and passing the
  new sum to its previous rank's memory, its own rows last (no NCCL, every SM computing); ops
  it cannot take (more than 8 devices, an axis group across hosts or with several of its GPUs
  in one of several processes, M not a multiple of the world size; plan_peer.unavailable)
  keep the NCCL path, with a PeerStoresWarning. auto (unset: the default): NCCL, unless a
  tuned config entry for the op says peer (jax_flashoverlap.tuning)."""
  raw = os.environ.get(TRANSPORT_ENV)
  if raw in (None, ""):
    return "auto"
  if raw in TRANSPORTS:
    return raw
  raise ValueError(f"jax_flashoverlap: environment variable {TRANSPORT_ENV}={raw!r} must be "
                   "'auto' (the default: NCCL unless a tuned config says peer), 'nccl' (NCCL "
                   "calls beside the GEMM) or 'peer' (experimental: peer stores over groups of 2 "
                   "to 8 GPUs)")


def grant_peer_access() -> bool:
  """JAX_FLASHOVERLAP_GRANT_PEER_ACCESS (experimental, off by default): the peer-store
  all-reduce of GPUs in one process mirrors each rank's reduced block straight into the other
  ranks' XLA results, which needs each GPU allowed to write the others' XLA memory. XLA's
  allocator decides that (a virtual-memory mapping or a pool has an access list of its own);
  where it left the other GPUs out the group stages its mirrors in our buffers and copies them
  out after the GEMM (a few percent of the GEMM). On, the op instead gives the group's other
  GPUs read-write access to XLA's allocation (its whole mapping, or its pool) at lowering and
  at any call whose result they may not write (each call asks the driver, ~1 us per other
  GPU): a change to XLA's memory that XLA does not know of, hence opt-in (docs/DESIGN.md,
  "Granting access to XLA's memory")."""
  return env_switch(GRANT_PEER_ACCESS_ENV, False)


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


def local_gpus() -> list:
  """(device_kind, compute_capability) of each local GPU; the capability (e.g. "9.0") is None
  where JAX does not report it."""
  import jax
  try:
    devices = jax.devices("gpu")
  except RuntimeError:
    return []
  return [(str(getattr(d, "device_kind", "")), getattr(d, "compute_capability", None))
          for d in devices]


def local_gpu_sms() -> int | None:
  """The fewest SMs of a local GPU (JAX's core_count), or None: no GPU, or not reported. The
  planner's model is of a 132-SM part (tile_schedule.NUM_SMS); primitives.check_sm_count
  compares."""
  import jax
  try:
    devices = jax.devices("gpu")
  except RuntimeError:
    return None
  counts = [getattr(d, "core_count", None) for d in devices]
  counts = [int(c) for c in counts if isinstance(c, int) and c > 0]
  return min(counts) if counts else None


def local_gpu_present() -> bool:
  return bool(local_gpus())


def unsupported_gpu(gpus) -> tuple | None:
  """(device_kind, compute capability) of the first GPU in `gpus` the kernels do not support,
  or None (also when a capability is unknown: the extension then checks at run time)."""
  for kind, capability in gpus:
    if capability is not None and str(capability) not in SUPPORTED_COMPUTE_CAPABILITIES:
      return kind, str(capability)
  return None


def check_cuda_path(target: str, *, gpu_present: bool | None = None,
                    gpus: list | None = None) -> tuple[bool, str]:
  """Whether a CUDA lowering should emit `target` as a custom call, and why (or why not).

  Cross-lowering on a machine with no GPU (e.g. `lower(lowering_platforms=("cuda",))` in CI)
  emits the custom call whenever it cannot tell otherwise: the program is for another machine.
  With a local GPU the kernels do not support (not sm_90), or a local GPU and no extension,
  warns once and uses the reference composition. `gpus`: (device_kind, compute capability)
  pairs, default `local_gpus()`.
  """
  global _warned_missing, _warned_unsupported
  check_gemm_epilogue()
  poison_outputs()  # a typo is an error at every lowering, whichever path the plan takes
  fallback_enabled()  # likewise (else only read where a plan falls back)
  if force_reference():
    return False, f"{FORCE_REFERENCE_ENV} is set: using the reference path (XLA dot + collective)"
  if gpus is None and gpu_present is not False:
    gpus = local_gpus()
  if gpu_present is None:
    gpu_present = bool(gpus)
  if not gpu_present:
    return True, "cross-lowering for CUDA without a local GPU: custom call " + target
  bad = unsupported_gpu(gpus or [])
  if bad is not None:
    kind, capability = bad
    sm = "sm_" + capability.replace(".", "")
    if not _warned_unsupported:
      _warned_unsupported = True
      warnings.warn(
          f"jax_flashoverlap: the signaling GEMM needs an sm_90 GPU (H100/H200); this "
          f"machine's GPU {kind!r} is {sm} (compute capability {capability}): ops run through "
          "the reference path (XLA dot + collective), without overlap.",
          UnsupportedGPUWarning, stacklevel=3)
    return False, (f"GPU {kind!r} is {sm}; the kernels need sm_90 (H100/H200): reference path "
                   "(XLA dot + collective)")
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


# At import, not first at a lowering: a process that runs a program it never lowered (an
# executable from `jax.experimental.serialize_executable`) must find the handlers, to get
# their own error ("no communicator ... lower the same function in this process first")
# instead of XLA's "No FFI handler registered". Registering initializes no backend.
register_targets()
