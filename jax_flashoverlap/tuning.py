"""Tuned group plans: JSON config files, validated, looked up before the cost model.

A config file (never pickle) holds measured-best plans for one GPU model and world size:

    {"schema": "jax_flashoverlap.plans/1", "gpu": "NVIDIA H200", "world_size": 2,
     "entries": [{"collective": "all_reduce", "dtype": "bfloat16", "m": 8192, "n": 8192,
                  "k": 4096, "comm_sms": 16, "band_rows": [0, 1280, ..., 8192],
                  "overlap": true, "measured_ms": 1.039, "baseline_ms": 1.236,
                  "predicted_ms": 1.01, "model_error": -0.028,
                  "source": "python -m jax_flashoverlap.tune"}]}

Optional: cta_policy ("default" | "efficiency" | "zero": the communicator's
ncclConfig_t.CTAPolicy the plan runs with); transport ("nccl", the default, or "peer": the
peer stores of plan_peer.py, world size 2 to 8, comm_sms 0, band_rows over one block of m / world
rows for both collectives; taken with JAX_FLASHOVERLAP_TRANSPORT unset or auto). Informative: measured_ms / baseline_ms (ours and
XLA's dot + collective when tuned), predicted_ms and model_error (the tuner's measured cost
model for the kept plan: predicted / measured - 1), cta_policy_ms (the kept plan's time under
each policy tried), source (the command that wrote it), kernel (the extension's kernel build
the plan was measured on, `_ext.kernel_build()`: a lookup of an entry measured on another build
warns once, KernelBuildWarning, and still uses it, since the plan must not depend on what each
rank happened to build). Any other key is an error (a typo),
and so is another collective's (COLLECTIVE_KEYS: band_rows for all but all_gather,
cta_policy / cta_policy_ms / transport for all_reduce and reduce_scatter, split_axis / concat_axis for
all_to_all, chunks / gather for all_gather).

m, n, k are the per-device GEMM's (x [m, k], w [k, n]). Files are read from the package's
`configs/` folder, then from the user's config dir ($JAX_FLASHOVERLAP_CONFIG_DIR, default
$XDG_CACHE_HOME/jax_flashoverlap, else ~/.cache/jax_flashoverlap; when set, it must be a
directory), whose entries win;
$JAX_FLASHOVERLAP_TUNED=0 (an on/off switch) ignores them all. A file that does not validate
is an error that names the file and the field: silently ignoring it could give ranks
different plans.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import threading
from pathlib import Path

from jax_flashoverlap import _ext

SCHEMA = "jax_flashoverlap.plans/1"
CONFIG_DIR_ENV = "JAX_FLASHOVERLAP_CONFIG_DIR"
TUNED_ENV = "JAX_FLASHOVERLAP_TUNED"  # an off switch (0/false/no/off): the cost model decides
PACKAGE_DIR = Path(__file__).resolve().parent / "configs"
_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_to_all", "all_gather")
_DTYPES = ("bfloat16", "float16")
# The keys an entry may hold, by collective (what tune.py and tune_a2a.py write): an unknown one
# is a typo whose field would silently keep its default (a misspelled "overlap": false would
# overlap), another collective's a mix-up that would be ignored.
_COMMON_KEYS = frozenset((
    "collective", "dtype", "m", "n", "k", "comm_sms", "overlap",
    "measured_ms", "baseline_ms", "predicted_ms", "model_error", "source",
    "kernel"))  # + informative
_COLLECTIVE_RS_KEYS = _COMMON_KEYS | {"band_rows", "cta_policy", "cta_policy_ms", "transport"}
COLLECTIVE_KEYS = {
    "all_reduce": _COLLECTIVE_RS_KEYS, "reduce_scatter": _COLLECTIVE_RS_KEYS,
    "all_to_all": _COMMON_KEYS | {"band_rows", "split_axis", "concat_axis"},
    "all_gather": _COMMON_KEYS | {"chunks", "gather"}}
ENTRY_KEYS = frozenset().union(*COLLECTIVE_KEYS.values())

_lock = threading.Lock()
_cache: dict = {}
_warned_builds: set = set()
_KERNEL_BUILD_CHARS = frozenset("0123456789abcdef")


# A config file's top level: what the tuner writes ("note": free text, e.g. where the plans
# were measured).
TOP_LEVEL_KEYS = frozenset({"schema", "gpu", "world_size", "entries", "note"})


class ConfigError(ValueError):
  """A tuned-config file is not valid."""


class KernelBuildWarning(UserWarning):
  """A tuned plan was measured on another build of the kernels: still valid and used (every
  rank must pick the same plan), but maybe no longer the fastest."""


def user_config_dir() -> Path:
  env = os.environ.get(CONFIG_DIR_ENV)
  if env:
    return Path(os.path.expanduser(env))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "jax_flashoverlap"


def _fail(path, what):
  raise ConfigError(f"jax_flashoverlap: invalid tuned-config file {path}: {what}")


def _int(path, where, entry, field, low=None, high=None):
  value = entry.get(field)
  if not isinstance(value, int) or isinstance(value, bool):
    _fail(path, f"{where}: '{field}' must be an integer, got {value!r}")
  if (low is not None and value < low) or (high is not None and value > high):
    _fail(path, f"{where}: '{field}'={value} outside [{low}, {high}]")
  return value


def entry_key(e: dict) -> tuple:
  """(collective, dtype, m, n, k, variant) of an entry: variant is (split_axis, concat_axis)
  for all-to-all, () otherwise."""
  variant = ((e.get("split_axis"), e.get("concat_axis")) if e.get("collective") == "all_to_all"
             else ())
  return (e.get("collective"), e.get("dtype"), e.get("m"), e.get("n"), e.get("k"), variant)


def _finite(value) -> bool:
  if not isinstance(value, (int, float)) or isinstance(value, bool):
    return False
  try:  # an integer too large for a float (10**400) overflowed later, in choose_plan
    return math.isfinite(float(value))
  except OverflowError:
    return False


def _number(path, where, e, field, signed=False):
  value = e.get(field, 0.0)
  if not _finite(value) or (not signed and value < 0):
    kind = "a finite number" if signed else "a finite non-negative number of milliseconds"
    text = repr(value)
    text = text if len(text) <= 40 else text[:20] + f"... ({len(text)} characters)"
    _fail(path, f"{where}: '{field}' must be {kind}, got {text}")


def _check_keys(path, where, e):
  for key in e:
    if key not in ENTRY_KEYS:
      close = difflib.get_close_matches(str(key), ENTRY_KEYS, n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      _fail(path, f"{where}: unknown key {key!r}{hint}; an entry's keys are "
                  f"{', '.join(sorted(ENTRY_KEYS))}")


def _check_bands(path, where, e, rows, world=2):
  from jax_flashoverlap.plan import GroupPlan
  bands = e.get("band_rows")
  if (not isinstance(bands, list) or len(bands) < 2 or
      any(not isinstance(b, int) or isinstance(b, bool) for b in bands)):
    _fail(path, f"{where}: 'band_rows' must be a list of at least 2 integers")
  try:  # the same checks as every plan the ops lower with
    GroupPlan(e["collective"], rows, tuple(bands), e["comm_sms"],
              transport=e.get("transport", "nccl")).validate(world)
  except ValueError as err:
    _fail(path, f"{where}: {err}")


def _check_plan(path, where, e, world, m):
  """The collective's own plan fields: band_rows over the right rows, or chunks."""
  from jax_flashoverlap.plan import MAX_GROUPS, rank_blocks
  collective = e["collective"]
  if collective in ("all_reduce", "reduce_scatter"):
    transport = e.get("transport", "nccl")
    if transport not in ("nccl", "peer"):
      _fail(path, f"{where}: 'transport' must be 'nccl' or 'peer', got {transport!r}")
    from jax_flashoverlap.plan_peer import MAX_WORLD
    if transport == "peer" and not 2 <= world <= MAX_WORLD:
      _fail(path, f"{where}: transport 'peer' needs world_size 2 to {MAX_WORLD}, the file is for {world}")
    # Peer stores: both collectives' bands cover one rank's block (plan_peer.py).
    blocks = world if transport == "peer" else rank_blocks(collective, world)
    if m % blocks:
      _fail(path, f"{where}: m={m} is not divisible by world_size {world}")
    _check_bands(path, where, e, m // blocks, world)
  elif collective == "all_to_all":
    split = _int(path, where, e, "split_axis", 0, 1)
    _int(path, where, e, "concat_axis", 0, 1)
    if split == 0 and m % world:
      _fail(path, f"{where}: m={m} is not divisible by world_size {world} (split_axis 0)")
    _check_bands(path, where, e, m // world if split == 0 else m)
  else:  # all_gather: m is the local rows of x
    chunks = _int(path, where, e, "chunks", 1, MAX_GROUPS)
    if m % chunks or world * chunks > MAX_GROUPS:
      _fail(path, f"{where}: chunks={chunks} must divide m={m} and world_size * chunks must "
                  f"be <= {MAX_GROUPS}")
    gather = e.get("gather", "p2p")
    if gather not in ("p2p", "collective"):
      _fail(path, f"{where}: 'gather' must be 'p2p' or 'collective', got {gather!r}")
    if gather == "collective" and chunks != 1:
      _fail(path, f"{where}: the collective gather takes whole blocks: chunks must be 1, "
                  f"got {chunks}")


def validate(data, path="<config>") -> dict:
  """Checks a parsed config; returns {key: entry}, key = (gpu, world) + entry_key(entry)."""
  from jax_flashoverlap.plan import MAX_COMM_SMS
  if not isinstance(data, dict):
    _fail(path, "top level must be a JSON object")
  if data.get("schema") != SCHEMA:
    _fail(path, f"'schema' must be {SCHEMA!r}, got {data.get('schema')!r}")
  unknown = sorted(set(data) - TOP_LEVEL_KEYS)
  if unknown:  # a misspelt key ("wrold_size") would otherwise just be ignored
    _fail(path, f"unknown top-level key(s) {', '.join(map(repr, unknown))}; the keys are "
                f"{', '.join(sorted(TOP_LEVEL_KEYS))}")
  if not isinstance(data.get("note", ""), str):
    _fail(path, f"'note' must be a string, got {data.get('note')!r}")
  gpu = data.get("gpu")
  if not isinstance(gpu, str) or not gpu.strip():
    _fail(path, f"'gpu' must be the GPU's device_kind (e.g. 'NVIDIA H200'), got {gpu!r}")
  world = _int(path, "top level", data, "world_size", 1, 1 << 16)
  entries = data.get("entries")
  if not isinstance(entries, list):
    _fail(path, "'entries' must be a list")
  out = {}
  for i, e in enumerate(entries):
    where = f"entries[{i}]"
    if not isinstance(e, dict):
      _fail(path, f"{where} must be an object")
    _check_keys(path, where, e)
    if e.get("collective") not in _COLLECTIVES:
      _fail(path, f"{where}: 'collective' must be one of {_COLLECTIVES}, got {e.get('collective')!r}")
    allowed = COLLECTIVE_KEYS[e["collective"]]
    for key in e:
      if key not in allowed:
        _fail(path, f"{where}: key {key!r} is not a key of {e['collective']} entries (it is "
                    f"another collective's); theirs are {', '.join(sorted(allowed))}")
    if e.get("dtype") not in _DTYPES:
      _fail(path, f"{where}: 'dtype' must be one of {_DTYPES}, got {e.get('dtype')!r}")
    m, n, k = (_int(path, where, e, f, 1) for f in ("m", "n", "k"))
    sms = _int(path, where, e, "comm_sms", 0, MAX_COMM_SMS)
    if e["collective"] == "all_gather" and e.get("overlap", True) is True and sms == 0:
      # its receives run beside the GEMM (all_gather_matmul: comm_sms >= 1); 0 was read as 1
      _fail(path, f"{where}: an overlapped all_gather entry needs comm_sms >= 1, got 0 (0 "
                  "only with \"overlap\": false, XLA's composition)")
    _check_plan(path, where, e, world, m)
    if not isinstance(e.get("overlap", True), bool):
      _fail(path, f"{where}: 'overlap' must be true or false")
    if e.get("cta_policy", "default") not in ("default", "efficiency", "zero"):
      _fail(path, f"{where}: 'cta_policy' must be 'default', 'efficiency' or 'zero', got "
                  f"{e.get('cta_policy')!r}")
    for field in ("measured_ms", "baseline_ms", "predicted_ms"):  # optional; informative
      _number(path, where, e, field)
    _number(path, where, e, "model_error", signed=True)
    policy_ms = e.get("cta_policy_ms", {})
    if not isinstance(policy_ms, dict):
      _fail(path, f"{where}: 'cta_policy_ms' must be an object {{policy: ms}}")
    for policy in policy_ms:
      if policy not in ("default", "efficiency", "zero"):
        _fail(path, f"{where}: 'cta_policy_ms' keys must be 'default', 'efficiency' or "
                    f"'zero', got {policy!r}")
      _number(path, f"{where}: cta_policy_ms", policy_ms, policy)
    if not isinstance(e.get("source", ""), str):
      _fail(path, f"{where}: 'source' must be a string, got {e.get('source')!r}")
    build = e.get("kernel", "0")
    if not (isinstance(build, str) and 0 < len(build) <= 64 and set(build) <= _KERNEL_BUILD_CHARS):
      _fail(path, f"{where}: 'kernel' must be the kernel build the plan was measured on "
                  f"(lowercase hex, as build_info()['kernel_build'] gives it), got {build!r}")
    key = (gpu, world) + entry_key(e)
    if key in out:
      _fail(path, f"{where}: duplicate entry for {key[2:]}")
    out[key] = e
  return out


class _DuplicateKey(Exception):
  pass


def _unique_keys(pairs):
  """json's object_pairs_hook: a key given twice in one object is an error (json keeps the
  last one silently: '"overlap": false, "overlap": true' would overlap)."""
  seen = set()
  for key, _ in pairs:
    if key in seen:
      raise _DuplicateKey(key)
    seen.add(key)
  return dict(pairs)


def _read_json(path: Path):
  if path.exists() and not path.is_file() and not path.is_dir():  # a directory: OSError below
    # a FIFO (or a device) named *.json would block the read, or never end
    raise ConfigError(f"jax_flashoverlap: cannot read tuned-config file {path}: not a "
                      "regular file")
  try:
    text = path.read_text(encoding="utf-8")
  except OSError as err:
    raise ConfigError(f"jax_flashoverlap: cannot read tuned-config file {path}: {err}") from err
  except UnicodeDecodeError as err:
    _fail(path, f"not UTF-8 text, so not JSON ({err})")
  try:
    return json.loads(text, object_pairs_hook=_unique_keys)
  except json.JSONDecodeError as err:
    _fail(path, f"not JSON ({err})")
  except _DuplicateKey as err:
    _fail(path, f"duplicate key {err.args[0]!r} in a JSON object (one value would silently "
                "win)")
  except (ValueError, RecursionError) as err:  # nested past the parser's depth, an integer
    _fail(path, f"not JSON that can be read ({type(err).__name__}: {err})")  # of > 4300 digits


def load_file(path) -> dict:
  path = Path(path)
  return validate(_read_json(path), path)


def config_files() -> list:
  """The config files read, in order (the package's, then the user dir's; later ones win).
  Hidden files are not configs: an editor's lock or backup (Emacs' `.#plans.json`, a broken
  link while the file is open; macOS's `._plans.json`) must not break every lookup."""
  def found(folder):
    return sorted(f for f in folder.glob("*.json") if not f.name.startswith("."))
  files = found(PACKAGE_DIR) if PACKAGE_DIR.is_dir() else []
  user = user_config_dir()
  try:  # Path.is_dir raises, not returns False, for a name too long, a folder without access
    user_is_dir = user.is_dir()
    if user_is_dir:
      files += found(user)
  except OSError as err:
    raise ConfigError(f"jax_flashoverlap: cannot read the tuned-config folder {user} "
                      f"({CONFIG_DIR_ENV} or the user config dir): {err}") from err
  # set on purpose: a typo must not drop its plans
  if not user_is_dir and os.environ.get(CONFIG_DIR_ENV):
    raise ConfigError(f"jax_flashoverlap: environment variable {CONFIG_DIR_ENV}="
                      f"{os.environ[CONFIG_DIR_ENV]!r} must be a directory of tuned-config "
                      f"files; {user} " + ("is not a directory" if user.exists()
                                           else "does not exist"))
  return files


def _stamp(path: Path) -> tuple:
  """What says a file changed: its mtime, size and inode (write_entries renames a new file in
  place, so a rewrite within one tick of a coarse clock still shows)."""
  try:  # a broken *.json link (or any stat failure) must name the file like a bad one does
    st = path.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino
  except OSError as err:
    raise ConfigError(f"jax_flashoverlap: cannot read tuned-config file {path}: {err}") from err


def load_all() -> dict:
  """Every entry of every config file (later files win), cached by (path, _stamp)."""
  files = config_files()
  stamp = tuple((str(f), _stamp(f)) for f in files)
  with _lock:
    if _cache.get("stamp") == stamp:
      return _cache["entries"]
    entries, origins = {}, {}
    for f in files:
      loaded = load_file(f)
      entries.update(loaded)
      origins.update(dict.fromkeys(loaded, f))
    _cache.update(stamp=stamp, entries=entries, origins=origins)
    return entries


def kernel_build_status(entry: dict, build: str | None) -> str:
  """'current' (measured on this build), 'other' (on another one), 'unrecorded' (the entry
  does not say: written before builds were recorded, or by hand) or 'unknown' (no build to
  compare with: the extension is missing)."""
  if "kernel" not in entry:
    return "unrecorded"
  if not build:
    return "unknown"
  return "current" if entry["kernel"] == build else "other"


def _warn_if_other_build(key: tuple, entry: dict) -> None:
  """Once per (problem, file, recorded build): a rewritten or another file's stale entry is
  named again. Marked after the warning, so one raised as an error (-W error) raises at every
  lookup, as it would on every rank."""
  build = _ext.kernel_build()
  path = _cache.get("origins", {}).get(key, "a tuned-config file")
  seen = (key, str(path), entry.get("kernel"))
  if kernel_build_status(entry, build) != "other" or seen in _warned_builds:
    return
  import warnings
  _, _, collective, dtype, m, n, k, _ = key
  warnings.warn(
      f"jax_flashoverlap: the tuned plan for {collective} {dtype} {m}x{n}x{k} in {path} was "
      f"measured on kernel build {entry['kernel']}, this extension is build {build}: it is "
      "still used (correct, and the same on every rank) but may no longer be the fastest. "
      "Rerun `python -m jax_flashoverlap.tune` for this shape, or set "
      f"{TUNED_ENV}=0 to use the cost model's plans.", KernelBuildWarning, stacklevel=3)
  _warned_builds.add(seen)


def lookup(gpu: str | None, world: int, collective: str, dtype: str, m: int, n: int, k: int,
           split_axis: int | None = None, concat_axis: int | None = None):
  """The tuned entry for this problem, or None (split_axis / concat_axis: all-to-all only)."""
  if not gpu or not _ext.env_switch(TUNED_ENV, True):
    return None
  variant = (split_axis, concat_axis) if collective == "all_to_all" else ()
  key = (gpu, world, collective, dtype, m, n, k, variant)
  entry = load_all().get(key)
  if entry is not None:
    _warn_if_other_build(key, entry)
  return entry


def kernel_builds_by_file(files) -> dict:
  """{file: {status: entries}} of kernel_build_status against this extension (for info); each
  file's own entries, those a later file overrides included."""
  build = _ext.kernel_build()
  out = {}
  for f in files:
    counts = {}
    for entry in load_file(f).values():
      status = kernel_build_status(entry, build)
      counts[status] = counts.get(status, 0) + 1
    out[str(f)] = counts
  return out


def merge_base(path, gpu: str, world: int) -> dict:
  """The config that write_entries merges into: the file at `path` (valid, of this GPU and
  world size) or a new, empty one; else a ConfigError (the tuner asks before any GPU time)."""
  path = Path(path)
  if not path.exists():
    return {"schema": SCHEMA, "gpu": gpu, "world_size": world, "entries": []}
  old = _read_json(path)
  validate(old, path)
  if old["gpu"] != gpu or old["world_size"] != world:
    raise ConfigError(f"jax_flashoverlap: {path} holds plans for {old['gpu']} x "
                      f"{old['world_size']}, not {gpu} x {world}")
  return old


def write_entries(path, gpu: str, world: int, entries: list) -> Path:
  """Merges `entries` into the config file at `path` (validated before it is written).

  Two tuner runs may merge into one file at once (e.g. on GPUs 0-1 and 2-3 of a machine, both
  <gpu>_x2.json): the read-merge-write holds an exclusive lock on <path>.lock, and the text
  goes to <path>.<pid>.tmp (not *.json: never loaded), synced, then renamed over `path`. One
  shared temporary name lost entries, failed a writer (its file renamed away) and could put
  a half-written file in place."""
  import fcntl
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path.with_name(path.name + ".lock"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
    data = merge_base(path, gpu, world)
    keyed = {entry_key(e): e for e in data["entries"]}
    for e in entries:
      keyed[entry_key(e)] = e
    data["entries"] = list(keyed.values())
    validate(data, path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
      with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())  # a crash after the rename must not leave an empty file
      os.replace(tmp, path)
    except BaseException:
      tmp.unlink(missing_ok=True)
      raise
  return path
