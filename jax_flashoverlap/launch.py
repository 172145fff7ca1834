"""`python -m jax_flashoverlap.launch -n N [options] script.py [args...]`: N local processes.

Starts N copies of the script with a coordinator on 127.0.0.1 (a free port), each told its
process id through JAX_FLASHOVERLAP_{COORDINATOR,NUM_PROCESSES,PROCESS_ID} (the script calls
`jax_flashoverlap.distributed.initialize()`). Streams process 0's output; keeps the others' in
log files, printed (their last 4000 characters) when the launch fails: any process failing,
the timeout, or a signal. When any process fails or the timeout passes, the rest are
killed and the launcher exits non-zero (the failing code, 128 + N for a process killed by
signal N, or 124 on timeout). SIGTERM, SIGHUP or SIGINT sent to the launcher stops them too
(exit status 128 + the signal's number). Each process runs in a process group of its own:
stopping it stops what it started too (a data loader, a shell pipeline). The other processes'
logs are removed after a successful launch and kept (their folder printed) otherwise.
A process whose program fails while jax.distributed runs exits at once with its status,
without the interpreter's exit handlers (`_launch_child.py`): JAX's distributed shutdown would
keep it waiting for the others, so a failure would have ended only at the timeout.
With --gpus-per-process K, process i sees GPUs [i*K, (i+1)*K) through CUDA_VISIBLE_DEVICES
(of the launcher's own CUDA_VISIBLE_DEVICES when it is set: entries i*K .. (i+1)*K-1 of it);
more GPUs than there are is refused, and so are more than MAX_PROCESSES (256) processes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from jax_flashoverlap import distributed


def reserve_port() -> socket.socket:
  """A socket bound (not listening) to a free port of 127.0.0.1, held while the launch runs:
  a free port let go at once could be handed to another launch started meanwhile, before
  process 0's coordinator binds it, and gRPC binds with SO_REUSEPORT, so both coordinators
  would take it and one job's processes join the other's (which aborts). Held with
  SO_REUSEPORT too, it leaves the coordinator free to bind it."""
  s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  try:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
  except BaseException:
    s.close()
    raise
  return s


def visible_gpus() -> tuple[list | None, str]:
  """(the GPUs the processes may be given, where that list comes from): the entries of
  CUDA_VISIBLE_DEVICES when it is set (indices or UUIDs), else 0..count-1 from `nvidia-smi -L`;
  None when the count cannot be known (no nvidia-smi; MIG instances, which it lists apart)."""
  raw = os.environ.get("CUDA_VISIBLE_DEVICES")
  if raw is not None:
    return [g.strip() for g in raw.split(",") if g.strip()], f"CUDA_VISIBLE_DEVICES={raw!r}"
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                         timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return None, ""
  lines = out.splitlines()
  if "MIG" in out or not lines:
    return None, ""
  gpus = [line for line in lines if line.startswith("GPU ")]
  return [str(g) for g in range(len(gpus))], f"nvidia-smi -L ({len(gpus)} GPUs)"


# Every process is a JAX runtime on this one machine: -n 100000 (a typo) started processes
# until the machine or the timeout gave out. A node has at most 8-16 GPUs.
MAX_PROCESSES = 256


def _env(i: int, n: int, coordinator: str, gpus_per_process: int, gpus=None,
         notes: str | None = None) -> dict:
  env = dict(os.environ)
  env.update({distributed.COORDINATOR_ENV: coordinator, distributed.NUM_PROCESSES_ENV: str(n),
              distributed.PROCESS_ID_ENV: str(i), "PYTHONUNBUFFERED": "1"})
  if notes:  # where _launch_child notes a program that ended well (_returned_early)
    env[NOTES_ENV] = notes
  env.setdefault("NCCL_NVLS_ENABLE", "0")
  # JAX's preemption service catches SIGTERM once jax.distributed runs: the launcher's stop
  # (a timeout, a failed process, Ctrl-C) then always waited out its 10 s grace for SIGKILL.
  env.setdefault("JAX_ENABLE_PREEMPTION_SERVICE", "false")
  if gpus_per_process:
    if gpus is None:  # count unknown: ordinals
      gpus = [str(g) for g in range(n * gpus_per_process)]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        gpus[i * gpus_per_process:(i + 1) * gpus_per_process])
  return env


NOTES_ENV = "JAX_FLASHOVERLAP_LAUNCH_NOTES"


def _returned_early(logdir: str, procs) -> str:
  """Why the others may have waited, where a failed or timed-out launch had processes whose
  program had ended well (noted by _launch_child) and then waited in JAX's shutdown barrier:
  a program that stops early on one process leaves the others in a collective with no peer,
  and the launcher saw only who ran out of time (before: 'process 0 was killed by SIGABRT'
  when JAX's 300 s barrier gave up, the early one never named)."""
  done = [i for i in range(len(procs))
          if os.path.exists(os.path.join(logdir, f"process{i}.returned"))]
  if not done or len(done) == len(procs):
    return ""
  which = ", ".join(map(str, done))
  return (f"[launch] the program of process{'es' if len(done) > 1 else ''} {which} had ended "
          "(exit status 0) and waited in jax.distributed's shutdown for the others: if the "
          "others were in a collective, the program ended early there")


def _signal_group(p, signum) -> None:
  """Sends `signum` to p's process group (p leads it: start_new_session), so what p started
  gets it too, even after p itself has exited."""
  try:
    os.killpg(p.pid, signum)
  except (ProcessLookupError, PermissionError):
    pass


def _group_alive(p) -> bool:
  """Whether anything is left in p's process group (p reaped or not)."""
  try:
    os.killpg(p.pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # a member we may not signal: still there
    pass
  return True


def _kill(procs, groups: bool) -> None:
  """Stops the processes still running (SIGTERM, then SIGKILL after 10 s); with `groups`,
  everything in their process groups as well (the launch failed or was stopped), whose
  members get the same 10 s to end on SIGTERM (they got SIGKILL at once once the processes
  we launched had exited, which a failed one already had: a child's cleanup was cut off)."""
  for p in procs:
    if p.poll() is None or groups:
      _signal_group(p, signal.SIGTERM)
  deadline = time.monotonic() + 10
  for p in procs:
    try:
      p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pass
  while groups and time.monotonic() < deadline and any(_group_alive(p) for p in procs):
    time.sleep(0.05)
  for p in procs:
    if p.poll() is None or groups:
      _signal_group(p, signal.SIGKILL)  # also a group member that ignored SIGTERM
    try:
      p.wait(timeout=10)
    except subprocess.TimeoutExpired:  # stuck in the kernel (a GPU driver teardown): leave it
      print(f"[launch] process {procs.index(p)} (pid {p.pid}) did not exit after SIGKILL",
            flush=True)


class _Stopped(Exception):
  """The launcher got a termination signal: its processes must be stopped too."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _raise_stopped(signum, frame):
  raise _Stopped(signum)


def _exit_status(code: int) -> tuple[int, str]:
  """(launcher exit status, why) of a child's return code (negative: killed by a signal)."""
  if code >= 0:
    return code, f"exited with {code}"
  try:
    name = signal.Signals(-code).name
  except ValueError:
    name = f"signal {-code}"
  return 128 - code, f"was killed by {name}"


def launch(n: int, command: list, timeout: float, gpus_per_process: int = 0,
           gpus: list | None = None) -> int:
  reservation = reserve_port()
  coordinator = f"127.0.0.1:{reservation.getsockname()[1]}"
  logdir = tempfile.mkdtemp(prefix="jax_flashoverlap_launch_")
  procs, logs = [], []
  # SIGTERM / SIGHUP (a scheduler, `timeout`, a closed terminal) and SIGINT sent to the
  # launcher alone stop the processes too, instead of leaving them running without it.
  previous = {}
  if threading.current_thread() is threading.main_thread():  # where Python runs handlers
    previous = {s: signal.signal(s, _raise_stopped)
                for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
  code = 0
  try:
    for i in range(n):
      log = None if i == 0 else open(os.path.join(logdir, f"process{i}.log"), "w")
      logs.append(log)
      procs.append(subprocess.Popen(command,
                                    env=_env(i, n, coordinator, gpus_per_process, gpus, logdir),
                                    stdout=log, stderr=subprocess.STDOUT if log else None,
                                    start_new_session=True))
    deadline = time.monotonic() + timeout
    while True:
      codes = [p.poll() for p in procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:
        i, child_code = failed[0]
        code, why = _exit_status(child_code)
        print(f"[launch] process {i} {why}; stopping the others", flush=True)
        break
      if all(c == 0 for c in codes):
        break
      if time.monotonic() > deadline:
        running = [i for i, c in enumerate(codes) if c is None]
        print(f"[launch] timeout after {timeout:g} s (process{'es' if len(running) > 1 else ''} "
              f"{', '.join(map(str, running))} still running); stopping all processes",
              flush=True)
        code = 124
        break
      time.sleep(0.2)
  except _Stopped as stop:
    code = 128 + stop.signum
    print(f"[launch] got {signal.Signals(stop.signum).name}; stopping all processes",
          flush=True)
  finally:
    for s in previous:  # a second signal while stopping: the children are being killed
      signal.signal(s, signal.SIG_IGN)
    _kill(procs, groups=code != 0)
    reservation.close()
    early = _returned_early(logdir, procs) if code != 0 else ""
    if early:
      print(early, flush=True)
    for s, handler in previous.items():
      signal.signal(s, handler)
    for i, log in enumerate(logs):
      if log is None:
        continue
      log.close()
      if code != 0:
        with open(log.name) as f:
          tail = f.read()[-4000:]
        print(f"[launch] ---- process {i} output (last 4000 chars) ----\n{tail}", flush=True)
    if code != 0 and len(logs) > 1:
      print(f"[launch] logs: {logdir}", flush=True)
    else:
      shutil.rmtree(logdir, ignore_errors=True)
  return code


_VALUE_OPTIONS = ("-n", "--num-processes", "--timeout", "--gpus-per-process")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launch_child.py")


def split_command(argv: list) -> tuple[list, list]:
  """(launcher options, command): the command starts at `-m` or at the first token that is
  neither an option nor an option's value, so the program's own options pass through; or
  after `--`, as argparse would have it."""
  i = 0
  while i < len(argv):
    tok = argv[i]
    if tok == "--":
      return argv[:i], argv[i + 1:]
    if tok == "-m" or not tok.startswith("-"):
      return argv[:i], argv[i:]
    i += 2 if tok in _VALUE_OPTIONS else 1
  return argv, []


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m jax_flashoverlap.launch",
      usage="python -m jax_flashoverlap.launch -n N [options] (script.py | -m module) [args...]",
      description="Starts N local processes of a script (or -m module) that calls "
                  "jax_flashoverlap.distributed.initialize(); stops them all when one fails.",
      allow_abbrev=False)  # `--time 5 script.py` must not take "5" for the program
  parser.add_argument("-n", "--num-processes", type=int, required=True,
                      help="processes to start (process ids 0 .. N-1)")
  parser.add_argument("--timeout", type=float, default=600.0,
                      help="seconds before every process is stopped (exit 124; default 600)")
  parser.add_argument("--gpus-per-process", type=int, default=0,
                      help="K: process i sees GPUs i*K .. (i+1)*K-1 (CUDA_VISIBLE_DEVICES); "
                           "0 (default): every process sees every GPU")
  options, command = split_command(list(sys.argv[1:] if argv is None else argv))
  args = parser.parse_args(options)
  if not 1 <= args.num_processes <= MAX_PROCESSES:
    parser.error(f"-n must be in [1, {MAX_PROCESSES}] (processes on this machine), got "
                 f"{args.num_processes}")
  if not args.timeout > 0:
    parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
  if args.gpus_per_process < 0:
    parser.error(f"--gpus-per-process must be >= 0, got {args.gpus_per_process}")
  if not command or command == ["-m"]:
    parser.error("missing the program: a script path or -m module")
  gpus = None
  if args.gpus_per_process:
    gpus, source = visible_gpus()
    need = args.num_processes * args.gpus_per_process
    if gpus is not None and need > len(gpus):
      parser.error(f"-n {args.num_processes} x --gpus-per-process {args.gpus_per_process} "
                   f"needs {need} GPUs, but {source} gives {len(gpus)}")
  # Through _launch_child (by its path: the package, and JAX, are not imported before the
  # program): a process whose program fails while jax.distributed runs exits at once (JAX's
  # shutdown would otherwise keep it waiting for the others, and so the launcher too).
  return launch(args.num_processes, [sys.executable, CHILD, *command], args.timeout,
                args.gpus_per_process, gpus)


if __name__ == "__main__":
  sys.exit(main())
