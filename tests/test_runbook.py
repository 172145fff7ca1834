"""docs/multi_gpu_runbook.md's literal commands, run here as far as they go without GPUs: the
plan of a rare 2-GPU session must not meet a broken command of its own there."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK = (ROOT / "docs" / "multi_gpu_runbook.md").read_text()


def _snippet(start: str) -> str:
  """The inline `code` of the runbook that begins with `start`, its line breaks joined."""
  text = " ".join(RUNBOOK.split())
  i = text.index("`" + start) + 1
  return text[i:text.index("`", i)]


def _bring_back(tmp_path, built, kept):
  """The runbook's object snippet in a tree with build/obj/<built> and .gpu_obj/<kept>:
  (exit status, names in $OUT/obj.tgz or None)."""
  import tarfile
  for folder, names in (("build/obj", built), (".gpu_obj", kept)):
    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for name in names:
      (tmp_path / folder / name).write_bytes(b"o")
  (tmp_path / "out").mkdir(exist_ok=True)
  r = subprocess.run(["bash", "-uc", _snippet("new=();")], cwd=tmp_path, capture_output=True,
                     text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
  archive = tmp_path / "out" / "obj.tgz"
  return r.returncode, (sorted(tarfile.open(archive).getnames()) if archive.exists() else None)


def test_the_object_snippet_brings_back_the_new_objects_only(tmp_path):
  assert _bring_back(tmp_path / "a", ["k.1.o", "h.2.o"], ["k.1.o"]) == (0, ["h.2.o"])


def test_the_object_snippet_succeeds_when_nothing_is_new(tmp_path):
  """The usual case (every object carried): tar refused an empty archive, exit 2."""
  assert _bring_back(tmp_path, ["k.1.o"], ["k.1.o"]) == (0, None)


SESSION = (ROOT / "scripts" / "gpu_session.sh").read_text()


def _step_seconds(step: str, step_timeout: int, gpus: int = 2) -> int:
  """The longest one gpu_session.sh step takes under STEP_TIMEOUT on `gpus` GPUs: each
  run_step / gpu_pytest of its arm (a shell function it calls expanded; a for loop's body once
  per word, a loop over GPU counts only for those the machine has) at STEP_TIMEOUT, or at the
  fixed `STEP_TIMEOUT=N` it gives one."""
  arm = re.search(rf"^    {step}\)(.*?);;[ \t]*$", SESSION, flags=re.M | re.S)
  assert arm, step
  text = arm.group(1)
  for name, body in re.findall(r"^(\w+)\(\) \{[^\n]*\n(.*?)^\}", SESSION, flags=re.M | re.S):
    if name not in ("run_step", "gpu_pytest"):
      text = re.sub(rf"^(\s*){name}\b.*$", lambda m: body, text, flags=re.M)
  total, loops = 0, []
  for line in text.splitlines():
    code = line.split(" # ")[0].strip()
    loop = re.match(r"for (\w+) in ([^;]+); do", code)
    if loop:
      loops.append((loop.group(1), loop.group(2).split()))
      continue
    if code.startswith("done"):
      loops.pop()
      continue
    runs = len(re.findall(r"\b(?:run_step|gpu_pytest) ", code))
    for var, words in loops:
      counted = [w for w in words if not re.search(rf'-ge "\${var}"', code) or int(w) <= gpus]
      runs *= len(counted)
    fixed = re.search(r"STEP_TIMEOUT=(\d+) run_step", code)
    total += runs * (int(fixed.group(1)) if fixed else step_timeout)
  return total


def _commands():
  """(STEP_TIMEOUT, steps) of every gpu_session.sh command the runbook gives, and each
  command that names steps but no STEP_TIMEOUT."""
  text = " ".join(RUNBOOK.split())
  spans = re.findall(r"`([^`]*gpu_session\.sh [^`]*)`", text)
  bounded = [re.search(r"STEP_TIMEOUT=(\d+)[^`]*?gpu_session\.sh ((?:[a-z_0-9]+ ?)+)", c)
             for c in spans]
  steps = [re.search(r"bash scripts/gpu_session\.sh ((?:[a-z_0-9]+ ?)+)", c) for c in spans]
  return ([(int(m.group(1)), m.group(2).split()) for m in bounded if m],
          [c for c, m, named in zip(spans, bounded, steps)
           if not m and named and set(named.group(1).split()) - {"build"}])


def test_every_call_fits_the_wrapper_timeout():
  """Each call runs `timeout 570 bash scripts/gpu_session.sh STEPS` with STEP_TIMEOUT bounding
  every run inside a step: build + the steps' runs past 570 s let the wrapper cut the last one
  (call C's three steps at 200 s, call B's 560 s after build; the second session's
  sanitize_overlap, three runs, and `build peer`, nine, had no STEP_TIMEOUT at all)."""
  commands, unbounded = _commands()
  assert len(commands) >= 9, commands  # calls A, B, C and the second session's
  for timeout, steps in commands:
    seconds = sum(_step_seconds(s, timeout) for s in steps if s != "build")
    assert seconds <= 540, (timeout, steps, seconds)
  assert unbounded == [], unbounded


def test_the_step_counter_counts_runs_loops_and_functions():
  """_step_seconds against steps whose runs are known by hand."""
  assert _step_seconds("overlap_all", 100) == 100
  assert _step_seconds("sanitize_overlap", 100) == 300  # a loop over three tools
  assert _step_seconds("peer_spin", 100) == 180  # two runs at a fixed 90 s
  assert _step_seconds("peer_programs", 10) == 70  # a function; no 4- or 8-GPU run on 2
  assert _step_seconds("peer_programs", 10, gpus=8) == 90
  assert _step_seconds("peer", 10) == 80  # its tests and the same function


def _call_budgets() -> dict:
  """{call: seconds its script takes after build, at most}: STEP_TIMEOUT x its steps after
  build, plus the `timeout` of each command it runs besides gpu_session.sh."""
  sections = re.split(r"^## ", RUNBOOK, flags=re.M)
  calls = {s[len("Call "):s.index(":")]: s for s in sections if s.startswith("Call ")}
  assert set(calls) >= {"A", "B", "C"}, list(calls)
  budgets = {}
  for name, text in calls.items():
    found = re.findall(r"STEP_TIMEOUT=(\d+)[^`\n]*?gpu_session\.sh ((?:[a-z_0-9]+ ?)+)", text)
    assert len(found) == 1, (name, found)
    timeout, steps = found[0]
    steps = [s for s in steps.split() if s != "build"]
    own = sum(int(t) for t in re.findall(r"(?<![\w-])timeout (\d+) ", text) if t != "570")
    budgets[name] = own + sum(_step_seconds(s, int(timeout)) for s in steps)
  return budgets


def test_each_calls_own_commands_count_against_its_budget():
  """A command a call's script runs besides gpu_session.sh (call A's bounded peer-store check)
  takes its `timeout` out of the same 600 s: call A's 90 s check before a 480 s tune left the
  wrapper's 570 s no room, and where the check hung the device tool's 600 s cut the tune
  before gpu_session.sh copied the tuned config into $OUT (lost with the device's tree)."""
  for name, seconds in _call_budgets().items():
    assert seconds <= 540, (name, seconds)


def test_no_work_is_added_to_a_call_its_steps_fill():
  """Calls A, B and C take their 540 s: the runbook also asked for test_gpu_peer.py's staging
  tests 'in call C' (past 570 s: the device tool's 600 s would cut the call, its archive lost)."""
  text = " ".join(RUNBOOK.split())
  for name, seconds in _call_budgets().items():
    if seconds >= 540:
      assert f"in call {name}" not in text, name


def test_a_cut_tune_or_bench_is_resumed_per_collective(monkeypatch):
  """The tuner and the bench take every shape of one collective, then the next's
  (bench_problem.problems): `--shapes` alone for the rest of a cut run tuned the finished
  collective's shapes again and never the other collective's earlier ones. The runbook's
  resume commands name the collective."""
  import types
  from jax_flashoverlap import bench_problem
  monkeypatch.setattr(bench_problem, "TpProblem", lambda args, c, shape, key: (c, shape))
  args = types.SimpleNamespace(collectives=["all_reduce", "reduce_scatter"], shapes=["s1", "s2"])
  assert list(bench_problem.problems(args)) == [("all_reduce", "s1"), ("all_reduce", "s2"),
                                                ("reduce_scatter", "s1"), ("reduce_scatter", "s2")]
  for variable in ("TUNE_ARGS", "OVERLAP_ARGS"):
    assert _snippet(f'{variable}="--collectives reduce_scatter --shapes ')


def test_call_b_is_compared_with_the_recorded_fixed_order_run(tmp_path):
  """Call B's rows differ from the recorded 2026-11-30 h200x2.json in their rounds' order (one
  fixed order then) and also in the kernel and plans: the runbook names the comparison, and it
  runs on the recorded file against a run of the same GPU model, refusing an H100 pair's."""
  import copy
  import json
  import sys
  command = _snippet("python benchmarks/compare_overlap.py ").split()
  assert command[1:3] == ["benchmarks/compare_overlap.py", "benchmarks/results/h200x2.json"]
  recorded = json.loads((ROOT / command[2]).read_text())
  new = copy.deepcopy(recorded)
  new["method"] = "... a balanced Latin square ..."
  for row in new["rows"]:
    row["rounds"] = {"variants": 12, "samples": 20, "balanced": False}
    row["times_ms"] = {v: t * (1.05 if v == "xla_dot" else 1.0)
                       for v, t in row["times_ms"].items()}
    row["times_ms"]["ours_peer"] = 1.0
  out = {}
  for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
    for row in new["rows"]:
      row["gpu"] = gpu
    (tmp_path / "new.json").write_text(json.dumps(new))
    out[gpu] = subprocess.run([sys.executable, command[1], command[2], str(tmp_path / "new.json")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
  same, other = out.values()
  assert same.returncode == 0, same.stderr
  assert same.stdout.count("XLA's own: xla_dot 1.050 xla_collective 1.000") == 10, same.stdout
  assert ("rounds, one fixed order: xla_dot xla_collective xla_dot_collective ours "
          "nccl_capped_alone two_chunk ppermute_ring ours_model\n") in same.stdout
  assert other.returncode == 2 and "not comparable" in other.stderr, other.stderr


def test_call_bs_rounds_are_counted_as_the_bench_times_them():
  """The runbook's count of a 2-GPU row's variants (what its note on balanced rounds rests on):
  XLA's three, ours, nccl_capped_alone, and every --variants name run in process (the chain
  two programs; xla_windowed its own process)."""
  from jax_flashoverlap import bench, bench_variants
  count = 5 + sum({"chain": 2, "xla_windowed": 0}.get(v, 1) for v in bench_variants.VARIANTS)
  assert f"a row here times {count} variants" in " ".join(RUNBOOK.split())
  assert not bench.balanced_rounds(count, 20) and bench.balanced_rounds(count, 24)


def test_the_object_counts_are_the_sources():
  """What the runbook says a carried build holds: one object per kernel source (it said 19
  after four more instances came: 23) and one per host source."""
  text = " ".join(RUNBOOK.split())
  sources = [p for p in (ROOT / "xla_ffi").rglob("*") if p.suffix in (".cu", ".cc")]
  kernels = sum("kernels" in p.parts for p in sources)
  assert f"The kernels' objects ({kernels})" in text
  assert f"compiles there (all {len(sources) - kernels}:" in text
