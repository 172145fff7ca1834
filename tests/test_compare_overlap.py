"""benchmarks/compare_overlap.py: two `bench overlap` JSONs row by row (the multi-GPU runbook's
check of a new run against the recorded one); it had no test of its own."""
import copy
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "compare_overlap.py"
RECORDED = ROOT / "benchmarks" / "results" / "h200x2.json"


def _run(*args):
  return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)


def _write(tmp_path, name, data):
  path = tmp_path / name
  path.write_text(json.dumps(data))
  return path


def test_ratios_per_row_and_rows_in_one_file_only(tmp_path):
  """A new run as the bench writes it now (each row's `gpu`, balanced `rounds`): ours twice
  as fast at the first shape, XLA's dot 1.25x slower; its last row's shape not in the old
  file, the old file's second row not in the new one."""
  old = json.loads(RECORDED.read_text())
  new = copy.deepcopy(old)
  new.update(git_commit="abc1234", date="2026-12-08")
  first = new["rows"][0]
  first["times_ms"]["ours"] /= 2
  first["times_ms"]["xla_dot"] *= 1.25
  first["speedup"] = first["times_ms"]["xla_dot_collective"] / first["times_ms"]["ours"]
  for row in new["rows"]:
    row.update(gpu="NVIDIA H200", rounds=20)
  dropped = new["rows"].pop(1)
  new["rows"][-1]["m"] = 12345
  out = _run(RECORDED, _write(tmp_path, "new.json", new))
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert "(abc1234, 2026-12-08)" in lines[0] and "(d5bff4d," in lines[0]
  assert "NVIDIA H200; new / old time:" in lines[0]
  row = old["rows"][0]
  shape = f"{row['m']}x{row['n']}x{row['k']}"
  mine = next(l for l in lines if f"all_reduce     {shape}:" in l)
  assert "xla_dot 1.250 xla_collective 1.000 xla_dot_collective 1.000 | ours 0.500 " in mine
  assert f"speedup {row['speedup']:.3f} -> {2 * row['speedup']:.3f} | rounds 20" in mine
  # every row in both (all but the renamed last): XLA's dot + collective unchanged
  assert sum("xla_dot_collective 1.000 |" in l for l in lines) == len(new["rows"]) - 1
  last = old["rows"][-1]
  assert f"{last['collective']} 12345x{last['n']}x{last['k']}: not in {RECORDED}" in out.stdout
  gone = f"{dropped['collective']} {dropped['m']}x{dropped['n']}x{dropped['k']}: not in"
  assert gone in out.stdout
  assert "rounds, one fixed order: xla_dot xla_collective" in lines[-1]  # the old file's


def test_refusals_exit_2_naming_why(tmp_path):
  old = json.loads(RECORDED.read_text())
  h100 = copy.deepcopy(old)
  for row in h100["rows"]:
    row["gpu"] = "NVIDIA H100 80GB HBM3"
  out = _run(RECORDED, _write(tmp_path, "h100.json", h100))
  assert out.returncode == 2 and "not comparable" in out.stderr
  assert "NVIDIA H200" in out.stderr and "NVIDIA H100 80GB HBM3" in out.stderr
  a2a = _write(tmp_path, "a2a.json", {"kind": "a2a", "rows": []})
  out = _run(RECORDED, a2a)
  assert out.returncode == 2 and "both files must be `bench overlap` results" in out.stderr
  out = _run(RECORDED, tmp_path / "missing.json")
  assert out.returncode == 2 and "missing.json" in out.stderr
  out = _run(RECORDED, _write(tmp_path, "empty.json", {}))
  assert out.returncode == 2 and "both files must be `bench overlap` results" in out.stderr
  (tmp_path / "text.json").write_text("not json")
  out = _run(tmp_path / "text.json", RECORDED)
  assert out.returncode == 2 and "JSONDecodeError" in out.stderr
  out = _run(RECORDED)
  assert out.returncode == 2 and "required: NEW.json" in out.stderr
  assert "Traceback" not in out.stderr


def test_no_row_in_common_exits_1(tmp_path):
  old = json.loads(RECORDED.read_text())
  other = copy.deepcopy(old)
  for row in other["rows"]:
    row["world"] = 4
  out = _run(RECORDED, _write(tmp_path, "x4.json", other))
  assert out.returncode == 1, (out.stdout, out.stderr)
  assert out.stdout.count(": not in") == 2 * len(old["rows"])


def test_help_exits_0():
  out = _run("--help")
  assert out.returncode == 0 and "OLD.json NEW.json" in out.stdout
  assert "Exit status 1 when no row is in both" in " ".join(out.stdout.split())
