"""Two `python -m jax_flashoverlap.bench overlap` JSONs of one GPU model, row by row: each
variant's time in NEW over its time in OLD, and ours' speedup in each.

    python benchmarks/compare_overlap.py OLD.json NEW.json

Made for the first 2-GPU run with balanced rounds against the recorded one of 2026-11-30
(benchmarks/results/h200x2.json, d5bff4d: every round in one fixed order, the order of its
rows' times_ms, printed; its median of 20 samples was the upper middle one, now the mean of
the two). XLA's own variants (xla_dot, xla_collective, xla_dot_collective) ran the same
programs both times where JAX and NCCL are the same (0.11.2 and 2.28.9 then: `info` in each
file), so their ratios are the order and the machine; ours' also hold every kernel and plan
change since. Runs on different GPU models (an H100 pair lent for nvidia-h200-x2) are refused,
exit 2: their times say nothing about each other.
"""

import argparse
import json
import sys

XLA_OWN = ("xla_dot", "xla_collective", "xla_dot_collective")


def gpu_model(data: dict):
  """The run's GPU model: its rows' `gpu` (bench records it since session 45), else `info`'s."""
  models = {row.get("gpu") for row in data["rows"]} - {None}
  return models.pop() if len(models) == 1 else None if models else data["info"].get("gpu_name")


def main(argv) -> int:
  parser = argparse.ArgumentParser(
      prog="python benchmarks/compare_overlap.py",
      description=" ".join(__doc__.split("\n\n")[0].split()) + " Exit status 1 when no row "
      "is in both, 2 when the files cannot be compared.")
  parser.add_argument("old", metavar="OLD.json", help="the earlier `bench overlap` JSON")
  parser.add_argument("new", metavar="NEW.json", help="the later one, on the same GPU model")
  args = parser.parse_args(argv)
  old_path, new_path = args.old, args.new
  try:
    old, new = (json.loads(open(path).read()) for path in (old_path, new_path))
  except (OSError, ValueError) as err:
    print(f"compare_overlap: {type(err).__name__}: {err}", file=sys.stderr)
    return 2
  if not isinstance(old, dict) or not isinstance(new, dict) or \
      old.get("kind") != "overlap" or new.get("kind") != "overlap":
    print("compare_overlap: both files must be `bench overlap` results", file=sys.stderr)
    return 2
  if gpu_model(old) is None or gpu_model(old) != gpu_model(new):
    print(f"compare_overlap: not comparable: {old_path} ran on {gpu_model(old)}, {new_path} on "
          f"{gpu_model(new)}", file=sys.stderr)
    return 2
  key = lambda row: (row["collective"], row["m"], row["n"], row["k"], row["world"])
  before = {key(row): row for row in old["rows"]}
  print(f"{new_path} ({new.get('git_commit')}, {new.get('date')}) over {old_path} "
        f"({old.get('git_commit')}, {old.get('date')}), {gpu_model(new)}; new / old time:")
  matched = 0
  for row in new["rows"]:
    was = before.pop(key(row), None)
    if was is None:
      print(f"  {row['collective']} {row['m']}x{row['n']}x{row['k']}: not in {old_path}")
      continue
    matched += 1
    ratio = lambda names: " ".join(f"{v} {row['times_ms'][v] / was['times_ms'][v]:.3f}"
                                   for v in names if v in row["times_ms"] and v in was["times_ms"])
    ours = [v for v in row["times_ms"] if v not in XLA_OWN]
    print(f"  {row['collective']:14s} {row['m']}x{row['n']}x{row['k']}: XLA's own: "
          f"{ratio(XLA_OWN)} | {ratio(ours)} | speedup {was['speedup']:.3f} -> "
          f"{row['speedup']:.3f}" + (f" | rounds {row['rounds']}" if "rounds" in row else ""))
  for k in before:
    print(f"  {k[0]} {k[1]}x{k[2]}x{k[3]}: not in {new_path}")
  fixed = not any("rounds" in row for row in old["rows"]) and not any(
      word in old.get("method", "") for word in ("Latin", "rotat"))
  if fixed and old["rows"]:  # before session 47: the order of times_ms, every round
    print(f"{old_path}'s rounds, one fixed order: " + " ".join(
        v for v in old["rows"][0]["times_ms"] if v != "xla_windowed"))
  return 0 if matched else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
