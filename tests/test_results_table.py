"""benchmarks/results_table.py: README's results tables from a bench JSON."""
import copy
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "results_table.py"
RECORDED = ROOT / "benchmarks" / "results" / "h200x2.json"


def _run(path):
  return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True,
                        timeout=120, cwd=ROOT)


def _cells(line):
  return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_recorded_run_gives_readmes_hand_written_table():
  """Every row of README's 2 x H200 table, as written by hand from h200x2.json, is the
  script's row of that file (its last cell's note aside)."""
  readme = (ROOT / "README.md").read_text()
  section = readme[readme.index("## Results (2 x H200"):readme.index("## Results on 4 x H200")]
  start = section.index("| op | global M x N x K | XLA dot |")
  written = [_cells(l) for l in section[start:].splitlines()[2:] if l.startswith("| AR |")
             or l.startswith("| RS |")]
  r = _run(RECORDED)
  assert r.returncode == 0, r.stderr
  made = {tuple(c[:2]): c for c in map(_cells, r.stdout.splitlines()) if c[0] in ("AR", "RS")}
  assert len(written) == len(made) == 10
  for row in written:
    ours = made[tuple(row[:2])]
    assert ours[:12] == row[:12], (row, ours)
    assert row[12].startswith(ours[12].rstrip(")")), (row[12], ours[12])


def test_new_variants_failures_chains_and_targets_get_columns(tmp_path):
  data = json.loads(RECORDED.read_text())
  new = copy.deepcopy(data)
  row = new["rows"][0]
  row["times_ms"].update(ours_peer=0.5, xla_chain=8.0, ours_chain=4.0)
  row["chain_speedup"] = 2.0
  row["gpu"] = "NVIDIA H200"
  row["rounds"] = {"variants": 12, "samples": 20, "balanced": False}
  row["plan"]["source"] = "tuned"
  row["plan"]["predicted_ours_ms"] = 0.55
  new["rows"][1]["variant_failures"] = {"ours_peer": "RuntimeError: boom"}
  new["rows"][1]["rounds"] = {"variants": 12, "samples": 24, "balanced": True}
  path = tmp_path / "new.json"
  path.write_text(json.dumps(new))
  r = _run(path)
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert "rounds whole balanced squares in 1 of 2 rows" in lines[0]
  head = _cells(lines[2])
  assert head[-4:] == ["ours, peer stores", "chained (XLA / ours)", "predicted / measured",
                       "targets missed"]
  first, second = (_cells(l) for l in lines[4:6])
  assert first[-4:-1] == [f"{0.6459861000010392 / 0.5:.2f}x", "2.00x", "0.550 / 0.531 (+4%; tuned)"]
  assert second[-4] == "failed" and second[-3] == "-"
  assert "efficiency_at_least_0.5" in first[-1]


def test_a_file_of_another_kind_is_refused_by_name(tmp_path):
  path = tmp_path / "g.json"
  path.write_text(json.dumps({"kind": "gemm", "rows": []}))
  r = _run(path)
  assert r.returncode == 2 and "`bench overlap` or `bench a2a` JSON was expected" in r.stderr
  r = _run(tmp_path / "missing.json")
  assert r.returncode == 2 and "missing.json" in r.stderr
