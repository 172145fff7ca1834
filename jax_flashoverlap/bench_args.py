"""Checks of `python -m jax_flashoverlap.bench`'s arguments that need no devices: run before
any device work, each a parser error (exit 2) naming the option; the --help formatters of
bench and tune."""

from __future__ import annotations

import argparse
import os

from jax_flashoverlap.bench_record import is_stream


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Each option's default in --help, but not "(default: None)" (an option that is off or
  whose help says what stands in for it)."""

  def _get_help_string(self, action):
    return action.help if action.default is None else super()._get_help_string(action)


class DocHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
  """As DefaultsHelpFormatter, with the description (a module docstring) as written."""


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


def check_switches(parser) -> None:
  """Every JAX_FLASHOVERLAP_* switch parses, else a parser error naming it (exit 2) before any
  work: it was a traceback at the first lowering (bench, tune)."""
  from jax_flashoverlap import primitives
  try:
    primitives.check_switches()
  except ValueError as err:
    parser.error(str(err))


def check_output_paths(parser, args) -> None:
  """--out (rewritten after every row) and --plot (drawn at the end) can be written, checked
  before any device work: a directory, a folder that cannot be made or written, or a plot
  format matplotlib cannot draw was a traceback after the first row's (or, for --plot, the
  whole run's) measurements; so was a --plot without matplotlib installed (a note at the end,
  exit 0). A --plot without a suffix gets '.png' (matplotlib's default,
  which it added without saying so); an --out stream (/dev/stdout, a FIFO: is_stream) is
  written through, so only it must be writable. An empty path (`--out "$UNSET"`) is refused,
  not read as the option left out; so are --out and --plot naming one file (the JSON,
  written last, replaced the plot)."""
  files = {}
  for option in ("--out", "--plot"):
    path = getattr(args, option[2:], None)
    if path is None:
      continue
    if not path.strip():
      parser.error(f"{option}: an empty path (leave {option} out to write nothing)")
    if option == "--plot":
      path = args.plot = _plot_path(parser, path)
    if is_stream(path):  # /dev/stdout, a FIFO: written through, once at the end
      if option == "--plot":
        parser.error(f"--plot {path}: a plot is a file, not a stream")
      if not os.access(path, os.W_OK):
        parser.error(f"{option} {path}: cannot write there (not writable)")
      continue
    files[option] = os.path.realpath(path)  # a link's target gets written
    check_writable(parser, option, files[option])
  if len(files) == 2 and files["--out"] == files["--plot"]:
    parser.error(f"--out and --plot name the same file {files['--out']}: the JSON would "
                 "replace the plot; give them different paths")


def check_writable(parser, option: str, path: str) -> None:
  """A regular file at `path` can be written, its missing folders made (by the writer, once
  the run has something to write: a refused run leaves no new empty folders), else a parser
  error naming `option` (exit 2)."""
  if os.path.isdir(path):
    parser.error(f"{option} {path}: cannot write there (a directory)")
  existing = os.path.dirname(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    parser.error(f"{option} {path}: cannot write there ({existing} is not a directory)")
  if not os.access(existing, os.W_OK | os.X_OK):
    parser.error(f"{option} {path}: cannot write there ({existing} is not a writable "
                 "directory)")


def _plot_path(parser, path: str) -> str:
  suffix = os.path.splitext(path)[1][1:].lower()
  if os.path.isdir(path):  # not made into <dir>.png
    parser.error(f"--plot {os.path.abspath(path)}: cannot write there (a directory)")
  try:
    from matplotlib.figure import Figure
  except ImportError:  # refused now, not after the whole run's measurements (a note, exit 0)
    parser.error(f"--plot {path}: drawing needs matplotlib, which is not installed here "
                 "(pip install matplotlib), or leave --plot out")
  if not suffix:
    return path + ".png"
  formats = Figure().canvas.get_supported_filetypes()
  if suffix not in formats:
    parser.error(f"--plot {path}: matplotlib cannot write '.{suffix}' files; use one of "
                 + ", ".join("." + f for f in sorted(formats)))
  return path
