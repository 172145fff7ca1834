"""Several processes (one or many hosts): JAX's distributed runtime is the engine.

* `initialize()` starts jax.distributed from the launcher's environment
  (`python -m jax_flashoverlap.launch`), or from explicit arguments.
* NCCL unique ids travel through JAX's key-value store: the process holding a group's rank 0
  creates the id and publishes it; the others wait for it (no files, no extra ports).
* `check_identical` makes every process publish a value (a group plan) and compare it with
  everyone else's, so a mismatch is a clear error on every rank instead of a hang in NCCL.
* `publish` / `fetch` carry other per-process values (the peer stores' CUDA IPC records,
  comm.py); `process_hosts` says which processes share a machine; `all_succeed` runs a step
  on every process and fails it on all of them if it failed on one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import numbers
import os
import socket
import threading

from jax_flashoverlap import _compat

COORDINATOR_ENV = "JAX_FLASHOVERLAP_COORDINATOR"
NUM_PROCESSES_ENV = "JAX_FLASHOVERLAP_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_FLASHOVERLAP_PROCESS_ID"
TIMEOUT_ENV = "JAX_FLASHOVERLAP_KV_TIMEOUT_S"
_PREFIX = "jax_flashoverlap"

_check_counters = {}  # the set of processes checking (its scope key) -> their n-th check
_lock = threading.Lock()


class DistributedMismatchError(RuntimeError):
  """Processes disagree on something that must be identical (e.g. a group plan)."""


# The key-value store takes its timeout as an int of milliseconds (int64 in jaxlib 0.10; 2^31
# - 1 ms, ~24.8 days, fits every width): larger values were a TypeError from the store, which
# the waits below then reported as a timeout.
MAX_TIMEOUT_MS = 2**31 - 1


def timeout_ms() -> int:
  """How long a key-value get or barrier waits for the other processes ($TIMEOUT_ENV, seconds)."""
  raw = os.environ.get(TIMEOUT_ENV, "").strip() or "300"
  try:
    seconds = float(raw)
  except ValueError:
    seconds = float("nan")
  if not 0 < seconds <= MAX_TIMEOUT_MS / 1000:
    raise ValueError(f"jax_flashoverlap: environment variable {TIMEOUT_ENV}={raw!r} must be a "
                     f"positive number of seconds (default 300) of at most "
                     f"{MAX_TIMEOUT_MS // 1000} (the key-value store's wait is an int of "
                     "milliseconds)")
  return max(1, int(seconds * 1000))


def _env_int(name: str) -> int | None:
  raw = os.environ.get(name)
  if raw is None or not raw.strip():
    return None
  try:
    return int(raw.strip())
  except ValueError:
    raise ValueError(f"jax_flashoverlap: environment variable {name}={raw!r} must be an "
                     "integer (it is set by python -m jax_flashoverlap.launch)") from None


def launched_processes() -> int:
  """How many processes the launcher started (JAX_FLASHOVERLAP_NUM_PROCESSES), 1 when none:
  known before (and without) initialize()."""
  return _env_int(NUM_PROCESSES_ENV) or 1


def _waited(what: str, key: str, err: Exception, source: str = "another process"
            ) -> TimeoutError:
  return TimeoutError(f"jax_flashoverlap: waited {timeout_ms() / 1000:g} s for {what} "
                      f"({key!r}) from {source} ({type(err).__name__}: {err}); is every "
                      f"process running the same program? ({TIMEOUT_ENV} sets the wait)")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, **kwargs) -> None:
  """jax.distributed.initialize, by default from the launcher's environment variables.

  A no-op when JAX's distributed runtime is already up, when neither arguments nor the
  launcher's variables are given, or for one process. Some of the three given and not the
  others, num_processes < 1 or process_id outside [0, num_processes) is a ValueError: a
  process that ran alone there would wait for peers that never come, or never join them.
  """
  import jax
  if _compat.distributed_client() is not None:
    return
  launch = launch_settings(coordinator_address, num_processes, process_id)
  if launch is None or launch["num_processes"] == 1:
    return
  jax.distributed.initialize(**launch, **kwargs)


def launch_settings(coordinator_address: str | None = None, num_processes: int | None = None,
                    process_id: int | None = None) -> dict | None:
  """{coordinator_address, num_processes, process_id}: each argument, else its launcher
  variable (an empty one counts as unset); None when none is given. Checked as initialize()
  needs them (it and `python -m jax_flashoverlap.info` read them here): a ValueError naming
  what is wrong."""
  values = {  # (argument, variable) -> value
      ("coordinator_address", COORDINATOR_ENV):
          coordinator_address or os.environ.get(COORDINATOR_ENV, "").strip() or None,
      ("num_processes", NUM_PROCESSES_ENV):
          _env_int(NUM_PROCESSES_ENV) if num_processes is None else num_processes,
      ("process_id", PROCESS_ID_ENV):
          _env_int(PROCESS_ID_ENV) if process_id is None else process_id}
  missing = [f"{arg} ({env})" for (arg, env), v in values.items() if v is None]
  if len(missing) == len(values):
    return None
  if missing:
    given = [f"{arg} ({env})" for (arg, env), v in values.items() if v is not None]
    raise ValueError(f"jax_flashoverlap.distributed.initialize: {', '.join(given)} given but "
                     f"not {', '.join(missing)}: give all three (python -m "
                     "jax_flashoverlap.launch sets them) or none (one process)")
  launch = {arg: v for (arg, _), v in values.items()}
  for arg in ("num_processes", "process_id"):  # arguments (variables are parsed as ints)
    value = launch[arg]
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
      raise TypeError(f"jax_flashoverlap.distributed.initialize: {arg} must be an int, got "
                      f"{value!r} ({type(value).__name__})")
    launch[arg] = int(value)
  if not isinstance(launch["coordinator_address"], str):
    raise TypeError(f"jax_flashoverlap.distributed.initialize: coordinator_address must be a "
                    f"'HOST:PORT' string, got {launch['coordinator_address']!r}")
  _check_coordinator(launch["coordinator_address"])
  if launch["num_processes"] < 1:
    raise ValueError(f"jax_flashoverlap.distributed.initialize: num_processes "
                     f"({NUM_PROCESSES_ENV}) must be >= 1, got {launch['num_processes']}")
  if not 0 <= launch["process_id"] < launch["num_processes"]:
    raise ValueError(f"jax_flashoverlap.distributed.initialize: process_id ({PROCESS_ID_ENV}) "
                     f"must be in [0, {launch['num_processes']}) (num_processes), got "
                     f"{launch['process_id']}")
  return launch


def _check_coordinator(address: str) -> None:
  """HOST:PORT with a port in [1, 65535]: JAX's own handling of anything else was an IndexError
  from inside it (no port), a failed RPC server (a port that is no number) or a wait with no
  end (a port past 65535)."""
  host, sep, port = address.rpartition(":")
  if not (sep and host and port.isdigit() and 1 <= int(port) <= 65535):
    raise ValueError(f"jax_flashoverlap.distributed.initialize: coordinator_address "
                     f"({COORDINATOR_ENV}) must be HOST:PORT with a port in [1, 65535], got "
                     f"{address!r}")


def _client():
  client = _compat.distributed_client()
  if client is None:
    raise RuntimeError("jax_flashoverlap: this needs JAX's distributed runtime: call "
                       "jax.distributed.initialize() (or jax_flashoverlap.distributed."
                       "initialize()) in every process first")
  return client


def publish(key: str, value: str) -> None:
  """Sets `key` (once per process lifetime: keys are never overwritten) in JAX's key-value
  store for the other processes to `fetch`."""
  _client().key_value_set(f"{_PREFIX}/{key}", value)


def fetch(key: str, owner_process: int) -> str:
  """Waits for the value process `owner_process` publishes under `key` (a timeout names the
  owner)."""
  client = _client()
  full = f"{_PREFIX}/{key}"
  wait = timeout_ms()
  try:
    return client.blocking_key_value_get(full, wait)
  except TypeError:  # the store refused its arguments: not a peer that never came
    raise
  except Exception as err:  # the runtime raises its own error types; name what we waited for
    raise _waited("the shared value", full, err, f"process {owner_process}") from err


def share(key: str, owner_process: int, make) -> str:
  """Process `owner_process` computes `make()` (a str) and publishes it under `key`; the
  others wait for it (a timeout names the owner)."""
  import jax
  _client()
  if owner_process == jax.process_index():
    value = make()
    publish(key, value)
    return value
  return fetch(key, owner_process)


class CollectiveStepError(RuntimeError):
  """A step every process takes together failed on at least one of them (`all_succeed`)."""


_OK = "ok"


def all_succeed(key: str, fn, processes=None, what: str = "a step"):
  """Runs `fn()` here and lets every process of `processes` (all when None) know whether it
  succeeded, through the key-value store: if it failed anywhere, every one of them raises
  CollectiveStepError naming each failed process's error (this one's own chained), so none goes
  on to wait for a process that stopped. Waits for all of them (a barrier). Returns fn()'s value."""
  import jax
  me = jax.process_index()
  try:
    value, mine, raised = fn(), _OK, None
  except Exception as err:  # reported to every process below, then raised here too
    value, mine, raised = None, f"{type(err).__name__}: {err}", err
  publish(f"{key}/{me}", mine)
  failed = {}
  for p in _participants(processes):
    got = mine if p == me else fetch(f"{key}/{p}", p)
    if got != _OK:
      failed[p] = got
  if failed:
    raise CollectiveStepError(
        f"jax_flashoverlap: {what} failed on " + "; ".join(
            f"process {p}: {msg}" for p, msg in sorted(failed.items()))) from raised
  return value


def _this_host() -> str:
  """What tells this machine from another: the kernel's boot id (the same for every
  container of one host), else the host name."""
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      boot = f.read().strip()
  except OSError:
    boot = ""
  return f"boot:{boot}" if boot else f"host:{socket.gethostname()}"


_hosts = {}  # process -> its _this_host(), as fetched


def process_hosts(processes) -> dict:
  """{process: host identity} for `processes` (each publishes its own once, the first time
  it asks; processes on one machine have one identity): e.g. whether CUDA IPC can join them."""
  import jax
  me = jax.process_index()
  with _lock:
    if me not in _hosts:
      _hosts[me] = _this_host()
      publish(f"host/{me}", _hosts[me])
  for p in _participants(processes):
    if p not in _hosts:
      value = fetch(f"host/{p}", p)
      with _lock:
        _hosts[p] = value
  return {p: _hosts[p] for p in _participants(processes)}


def _participants(processes) -> list:
  """The processes taking part, sorted: `processes`, or every process when None."""
  import jax
  if processes is None:
    return list(range(jax.process_count()))
  return sorted({int(p) for p in processes})


def barrier(name: str, processes=None) -> None:
  """Waits for `processes` (every process when None: a mesh's processes when only they
  lower its program, e.g. one pipeline stage's) at the barrier `name`."""
  client, key = _client(), f"{_PREFIX}/barrier/{name}"
  kwargs = {} if processes is None else {"process_ids": _participants(processes)}
  wait = timeout_ms()
  try:
    client.wait_at_barrier(key, wait, **kwargs)
  except TypeError:
    raise
  except Exception as err:
    raise _waited("every process at the barrier", key, err) from err


def check_identical(what: str, value, processes=None) -> None:
  """Every process of `processes` (all when None) publishes `value` (JSON-able) and checks
  they all hold the same one; nothing to check in a process outside them, or alone.

  Processes must call it in the same order (they do: they lower the same program); the n-th
  call of each process for a set of processes is compared with the n-th call of the others
  for that set, so a program of one process's devices only, or of another set's, does not
  shift the count. Raises DistributedMismatchError on every process if any differs.
  """
  import jax
  client = _client()
  me = jax.process_index()
  procs = _participants(processes)
  if me not in procs or len(procs) < 2:
    return
  scope = "all" if procs == list(range(jax.process_count())) else hashlib.blake2b(
      repr(procs).encode(), digest_size=8).hexdigest()
  with _lock:
    seq = next(_check_counters.setdefault(scope, itertools.count()))
  mine = json.dumps(value, sort_keys=True, default=str)
  client.key_value_set(f"{_PREFIX}/check/{scope}/{seq}/{me}", mine)
  differing = {}
  wait = timeout_ms()
  for p in procs:
    key = f"{_PREFIX}/check/{scope}/{seq}/{p}"
    try:
      other = mine if p == me else client.blocking_key_value_get(key, wait)
    except TypeError:
      raise
    except Exception as err:  # a process that never gets here: an error, not a hang
      raise _waited(f"process {p}'s value of {what}", key, err) from err
    if other != mine:
      differing[p] = other
  if differing:
    raise DistributedMismatchError(
        f"jax_flashoverlap: {what} differs between processes: process {me} has {mine}, "
        + "; ".join(f"process {p} has {v}" for p, v in sorted(differing.items()))
        + ". Every process must use the same jax_flashoverlap version, tuned configs and "
        "environment switches.")
