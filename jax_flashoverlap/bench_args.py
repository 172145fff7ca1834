"""Checks of `python -m jax_flashoverlap.bench`'s arguments that need no devices: run before
any device work, each a parser error (exit 2) naming the option."""

from __future__ import annotations

import os


def check_numbers(parser, args) -> None:
  """Numbers the benchmarks divide by or pass to the ops, as parser errors (exit 2) naming the
  option, before any device work (they were tracebacks: --samples 0, --world 0, ...)."""
  from jax_flashoverlap.plan import MAX_COMM_SMS, MAX_GROUPS
  for name in ("calls", "samples"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  if args.kind == "gemm" and args.world < 1:
    parser.error(f"--world must be >= 1 (per-GPU K = K / world), got {args.world}")
  for sms in getattr(args, "comm_sms", ()):
    if not 0 <= sms <= MAX_COMM_SMS:
      parser.error(f"--comm-sms values must be in [0, {MAX_COMM_SMS}], got {sms}")
  for groups in getattr(args, "groups", ()):
    if not 0 <= groups <= MAX_GROUPS:
      parser.error(f"--groups values must be in [0, {MAX_GROUPS}] (0: the cost model's), "
                   f"got {groups}")
  if getattr(args, "trace", 0) < 0:
    parser.error(f"--trace must be >= 0, got {args.trace}")


def check_output_paths(parser, args) -> None:
  """--out (rewritten after every row) and --plot (drawn at the end) can be written, checked
  before any device work: a directory, or a folder that cannot be made or written, was a
  traceback after the first row's (or, for --plot, the whole run's) measurements."""
  for option, path in (("--out", args.out), ("--plot", getattr(args, "plot", None))):
    if not path:
      continue
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
      parser.error(f"{option} {path}: cannot write there (a directory)")
    try:
      os.makedirs(parent, exist_ok=True)
    except OSError as err:
      existing = parent
      while not os.path.exists(existing):
        existing = os.path.dirname(existing)
      parser.error(f"{option} {path}: cannot write there (" + (
          f"{existing} is not a directory" if not os.path.isdir(existing) else str(err)) + ")")
    if not os.access(parent, os.W_OK):
      parser.error(f"{option} {path}: cannot write there ({parent} is not a writable "
                   "directory)")
