"""README.md's results tables from a `python -m jax_flashoverlap.bench overlap` (or `a2a`) JSON,
so a GPU session's numbers reach the README without copying them by hand.

    python benchmarks/results_table.py benchmarks/results/h200x2.json

Prints a header line (date, commit, GPU, command, whether each row's rounds were whole
balanced squares) and one Markdown table: per row the XLA variants' times and ours (ms), ours'
speedup over XLA's dot + collective and E, every other variant's speedup (a column where any
row has it; "-" where a row lacks it, "failed" where the bench recorded it failed), the chained
programs' speedup, the plan's predicted against the measured time (what `ours` ran: XLA's
composition where the op fell back; "tuned" where the prediction is the tuner's own
measurement) and the issue targets the row missed (bench_targets, evaluated again here for
files written before rows carried them).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jax_flashoverlap import bench_targets  # noqa: E402 (the checkout's, not an installed one)

OPS = {"all_reduce": "AR", "reduce_scatter": "RS", "all_to_all": "A2A", "all_gather": "AG"}
# The other variants' speedup columns, in README's order; unknown ones follow as named.
VARIANT_LABELS = {"two_chunk": "two-chunk", "ppermute_ring": "ppermute ring",
                  "xla_windowed": "XLA windowed", "ours_model": "ours, model plan",
                  "ours_helpers": "ours + helpers", "ours_peer": "ours, peer stores"}
FIRST = ("xla_dot", "xla_collective", "xla_dot_collective", "ours")
NOT_COLUMNS = FIRST + ("nccl_capped_alone", "xla_composition", "xla_chain", "ours_chain")


def _ms(x) -> str:
  return f"{x:.3f}" if isinstance(x, (int, float)) else "-"


def _prediction(row: dict) -> str:
  """'predicted / measured (+d%)' of what `ours` ran."""
  plan, t = row.get("plan") or {}, row["times_ms"]
  predicted = plan.get("predicted_ours_ms")
  if predicted is None:  # rows before predicted_ours_ms: the fallback ran XLA's composition
    predicted = plan.get("predicted_ms" if row.get("uses_custom_call", True)
                         else "predicted_baseline_ms")
  if not isinstance(predicted, (int, float)) or not t.get("ours"):
    return "-"
  tuned = "; tuned" if plan.get("source", "cost_model") != "cost_model" else ""
  return f"{predicted:.3f} / {t['ours']:.3f} ({(predicted - t['ours']) / t['ours']:+.0%}{tuned})"


def _missed(row: dict, kind: str) -> str:
  verdict = row.get("targets")
  if verdict is None:
    evaluate = bench_targets.evaluate_row if kind == "overlap" else bench_targets.evaluate_a2a_row
    verdict = evaluate(row)["targets"]
  missed = [t for t, met in verdict.items() if met is False]
  return ", ".join(missed) if missed else ("none" if any(verdict.values()) else "n/a")


def table(data: dict) -> str:
  kind = data.get("kind")
  if kind not in ("overlap", "a2a"):
    raise ValueError(f"a `bench overlap` or `bench a2a` JSON was expected, got kind {kind!r}")
  rows = data["rows"]
  seen = [v for row in rows for v in list(row["times_ms"]) + list(row.get("variant_failures") or {})
          if v not in NOT_COLUMNS]
  others = [v for v in VARIANT_LABELS if v in seen]
  others += [v for v in dict.fromkeys(seen) if v not in others]
  chains = any(row.get("chain_speedup") for row in rows)
  base = "xla_dot_collective" if kind == "overlap" else "xla_composition"
  head = (["op", "global M x N x K", "XLA dot", "XLA coll.",
           "XLA dot+coll." if kind == "overlap" else "XLA composition", "ours (ms)", "speedup", "E"]
          + [VARIANT_LABELS.get(v, v) for v in others]
          + (["chained (XLA / ours)"] if chains else [])
          + (["predicted / measured"] if kind == "overlap" else []) + ["targets missed"])
  lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
  for row in rows:
    t = row["times_ms"]
    op = OPS.get(row.get("collective") or row.get("op"), row.get("collective") or row.get("op"))
    ours = _ms(t.get("ours")) + ("" if row.get("uses_custom_call", True) else " (XLA path)")
    cells = [op, f"{row['m']} x {row['n']} x {row['k']}", _ms(t.get("xla_dot")),
             _ms(t.get("xla_collective")), _ms(t.get(base)), ours, f"{row['speedup']:.2f}x",
             f"{row['overlap_efficiency']:.2f}"]
    for v in others:
      if v in (row.get("variant_failures") or {}):
        cells.append("failed")
      else:
        cells.append(f"{t[base] / t[v]:.2f}x" if t.get(v) else "-")
    if chains:
      cells.append(f"{row['chain_speedup']:.2f}x" if row.get("chain_speedup") else "-")
    if kind == "overlap":
      cells.append(_prediction(row))
    cells.append(_missed(row, kind))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def header(data: dict) -> str:
  rows = data["rows"]
  gpus = sorted({row.get("gpu") for row in rows} - {None}) or [data.get("info", {}).get("gpu_name")]
  rounds = [row["rounds"]["balanced"] for row in rows if "rounds" in row]
  balance = (f"rounds whole balanced squares in {sum(rounds)} of {len(rounds)} rows"
             if rounds else "rounds in one fixed order (written before the balanced rounds)")
  return (f"{data.get('date')}, commit {data.get('git_commit')}, {', '.join(map(str, gpus))}; "
          f"`{data.get('command')}`; {balance}")


def main(argv) -> int:
  parser = argparse.ArgumentParser(prog="python benchmarks/results_table.py",
                                   description=__doc__.splitlines()[0].rstrip(",") + ".")
  parser.add_argument("results", metavar="RESULTS.json",
                      help="a `python -m jax_flashoverlap.bench overlap` (or `a2a`) JSON")
  path = parser.parse_args(argv).results
  try:
    data = json.loads(Path(path).read_text())
    text = table(data)
  except (OSError, ValueError, KeyError, TypeError) as err:
    print(f"results_table: {path}: {type(err).__name__}: {err}", file=sys.stderr)
    return 2
  print(header(data) + "\n\n" + text)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
