"""Per-group timeline of the overlapped calls (opt-in; xla_ffi/comm/trace.h).

For each overlapped all-reduce / reduce-scatter (and all-to-all) call on each GPU: when the
GEMM finished, and per communication group when its rows were ready (the comm stream's wait
on the group's counter finished), when its NCCL call finished and, for the all-reduce, when
its copy to the output finished; all in ms after the call's start. It shows where overlap is
lost without Nsight Systems, and calibrates the cost model (docs/overlap.md, "Tracing a call")::

    from jax_flashoverlap import trace
    with trace.recording():
        f(x, w).block_until_ready()
    records = trace.read()
    print(trace.summarize(records))

Off by default; on, each call records a few CUDA events per group. `FLASHOVERLAP_TRACE=1`
turns it on when the first communicator is made. Not traced: all_gather_matmul.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

TRACE_ENV = "FLASHOVERLAP_TRACE"
DEFAULT_CAPACITY = 256
MAX_CAPACITY = 1 << 20

_capacity = DEFAULT_CAPACITY
_env_read = False  # FLASHOVERLAP_TRACE is read once; an explicit enable()/disable() wins


def _extension(caller: str):
  from jax_flashoverlap import _ext
  if _ext.ext is None:
    raise RuntimeError(f"jax_flashoverlap.trace.{caller}: tracing needs the CUDA extension, "
                       f"which is not available ({_ext.EXT_IMPORT_ERROR}); only the "
                       "overlapped CUDA calls are traced")
  return _ext.ext


def _check_capacity(capacity) -> None:
  if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= MAX_CAPACITY:
    raise ValueError(f"jax_flashoverlap.trace: capacity must be an int in [1, {MAX_CAPACITY}], "
                     f"got {capacity!r}")


def enable(capacity: int = DEFAULT_CAPACITY) -> None:
  """Traces every overlapped call of this process from now on, keeping the last `capacity`
  calls per GPU (older ones are dropped; `dropped()` counts them)."""
  global _capacity, _env_read
  _check_capacity(capacity)
  _extension("enable").set_trace(True, capacity)
  _capacity, _env_read = capacity, True
  _warn_if_nothing_is_traced()


_warned_backends = set()


def _warn_if_nothing_is_traced() -> None:
  """Off GPU the ops run XLA's composition: tracing is on and records nothing (read() stays
  empty without a word); said once per backend."""
  import jax
  backend = jax.default_backend()
  if backend != "gpu" and backend not in _warned_backends:
    _warned_backends.add(backend)
    warnings.warn(f"jax_flashoverlap.trace: JAX's backend here is {backend!r}, where every op "
                  "runs XLA's composition: no call is traced (only our CUDA calls are)",
                  RuntimeWarning, stacklevel=3)


def disable() -> None:
  """Stops tracing; what was recorded stays readable. Nothing to do without the extension."""
  global _env_read
  from jax_flashoverlap import _ext
  _env_read = True
  if _ext.ext is not None:
    _ext.ext.set_trace(False, _capacity)


def available() -> bool:
  """Whether tracing can be turned on here (the CUDA extension is loaded); calls are recorded
  on GPUs only (enable() warns elsewhere)."""
  from jax_flashoverlap import _ext
  return _ext.ext is not None


def enabled() -> bool:
  from jax_flashoverlap import _ext
  return _ext.ext is not None and bool(_ext.ext.trace_enabled())


@contextlib.contextmanager
def recording(capacity: int = DEFAULT_CAPACITY) -> Iterator[None]:
  """Tracing on inside the block; afterwards off again (unless it was on before)."""
  was_on = enabled()
  enable(capacity)
  try:
    yield
  finally:
    if not was_on:
      disable()


def read(clear: bool = True) -> list:
  """The traced calls of every GPU (devices ascending, oldest call first), each a dict: op,
  device, rank, world_size, comm_sms, band_rows (group g = rows [band_rows[g],
  band_rows[g+1]) of the result), gemm_done_ms (None without a GEMM), per group ready_ms,
  comm_done_ms, copy_done_ms (None: no copies, the reduce-scatter) and the derived comm_ms
  (`group_comm_ms`). Waits for the calls to finish. clear: forget them afterwards.
  Without the extension: []."""
  if not isinstance(clear, bool):
    raise ValueError(f"jax_flashoverlap.trace.read: clear must be a bool, got {clear!r}")
  from jax_flashoverlap import _ext
  if _ext.ext is None:
    return []
  records = [dict(r) for r in _ext.ext.read_trace(clear)]
  for r in records:
    r["comm_ms"] = group_comm_ms(r["ready_ms"], r["comm_done_ms"])
  return records


def dropped() -> int:
  """Calls dropped because a GPU's ring was full, since the last read(clear=True)."""
  from jax_flashoverlap import _ext
  return 0 if _ext.ext is None else int(_ext.ext.trace_dropped())


def apply_env() -> None:
  """FLASHOVERLAP_TRACE=1 turns tracing on (read once, when the first communicator is made;
  an explicit enable() / disable() before that wins). Unset or 0: nothing happens."""
  global _env_read
  if _env_read:
    return
  from jax_flashoverlap import _ext
  on = _ext.env_switch(TRACE_ENV, False)  # a typo is an error, not silently off
  _env_read = True
  if on:
    enable(_capacity)


# --- derived times (pure) ------------------------------------------------------------------

def group_comm_ms(ready_ms, comm_done_ms) -> list:
  """Each group's own communication time: comm_done[g] - max(ready[g], comm_done[g-1]), i.e.
  from when both its rows and the comm stream were free until its NCCL call finished."""
  if len(ready_ms) != len(comm_done_ms):
    raise ValueError(f"ready_ms has {len(ready_ms)} groups, comm_done_ms {len(comm_done_ms)}")
  out, previous = [], None
  for ready, done in zip(ready_ms, comm_done_ms):
    begin = ready if previous is None else max(ready, previous)
    out.append(done - begin)
    previous = done
  return out


def call_end_ms(record) -> float:
  """When the call's last group was finished: its copy (all-reduce) or its NCCL call."""
  ends = record.get("copy_done_ms") or record["comm_done_ms"]
  return max(ends) if ends else 0.0


def exposed_tail_ms(record):
  """How long communication ran on after the GEMM: end - gemm_done (None without a GEMM)."""
  gemm = record.get("gemm_done_ms")
  return None if gemm is None else call_end_ms(record) - gemm


def summarize(records) -> str:
  """A text table, one line per call: its GEMM end, its last group's end and the exposed
  tail between them (ms after the call's start)."""
  if not records:
    return "no traced calls"
  def ms(v):
    return "-" if v is None else f"{v:.3f}"
  width = max(len("op"), *(len(str(r["op"])) for r in records))
  lines = [f"{'op':<{width}}  dev  rank  groups  gemm_done_ms  end_ms  tail_ms"]
  for r in records:
    lines.append(f"{r['op']:<{width}}  {r['device']:>3}  {r.get('rank', '-'):>4}  "
                 f"{len(r['comm_done_ms']):>6}  {ms(r.get('gemm_done_ms')):>12}  "
                 f"{ms(call_end_ms(r)):>6}  {ms(exposed_tail_ms(r)):>7}")
  return "\n".join(lines)


def _median(values):
  values = sorted(v for v in values if v is not None)
  if not values:
    return None
  mid = len(values) // 2
  return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def medians(records) -> dict:
  """Medians over several calls of one op on one device (records as `read` returns them, all
  with the same groups): calls, band_rows, gemm_done_ms, end_ms, and per group ready_ms,
  comm_done_ms, comm_ms and copy_done_ms (None without copies)."""
  if not records:
    raise ValueError("jax_flashoverlap.trace.medians: no records")
  groups = len(records[0]["band_rows"]) - 1
  if any(len(r["band_rows"]) - 1 != groups for r in records):
    raise ValueError("jax_flashoverlap.trace.medians: records of different group counts")
  def per_group(field):
    return [_median([r[field][g] for r in records if r.get(field) is not None])
            for g in range(groups)]
  return {"calls": len(records), "band_rows": list(records[0]["band_rows"]),
          "gemm_done_ms": _median([r.get("gemm_done_ms") for r in records]),
          "end_ms": _median([call_end_ms(r) for r in records]),
          "ready_ms": per_group("ready_ms"), "comm_done_ms": per_group("comm_done_ms"),
          "comm_ms": per_group("comm_ms"),
          "copy_done_ms": per_group("copy_done_ms") if records[0].get("copy_done_ms") else None}


def medians_table(m: dict) -> str:
  """`medians` as text: a line per group, then the GEMM's end, the call's end and the tail."""
  fmt = lambda v: "-" if v is None else f"{v:7.3f}"
  lines = ["group    rows   ready  comm_done  comm_ms  copy_done"]
  b = m["band_rows"]
  for g in range(len(b) - 1):
    copy = m["copy_done_ms"][g] if m["copy_done_ms"] else None
    lines.append(f"{g:5d} {b[g + 1] - b[g]:7d} {fmt(m['ready_ms'][g])} "
                 f"{fmt(m['comm_done_ms'][g])}    {fmt(m['comm_ms'][g])}  {fmt(copy)}")
  tail = (None if m["gemm_done_ms"] is None or m["end_ms"] is None
          else m["end_ms"] - m["gemm_done_ms"])
  lines.append(f"GEMM done {fmt(m['gemm_done_ms'])} ms, call end {fmt(m['end_ms'])} ms, "
               f"exposed tail {fmt(tail)} ms")
  return "\n".join(lines)
