"""benchmarks/stress.py on CPU (8 simulated devices, the reference path): its counts, its
report written op by op, and its checks failing on results made wrong on purpose."""
import json
import subprocess
import sys

from _util import repo_env
from test_examples import ROOT, run_example


def test_stress_script_checks_every_call(tmp_path):
  report = tmp_path / "stress.json"
  out = run_example("stress.py", "--calls", "6", "--scan-steps", "2", "--layers", "2",
                    "--out", str(report), folder="benchmarks")
  d = json.loads(report.read_text())
  ops = ("all_reduce", "reduce_scatter", "all_to_all", "all_gather", "all_gather_gathered")
  assert {op: d["ops"][op]["calls"] for op in ops} == {op: 6 for op in ops}
  assert d["scan_model"]["steps"] == 2 and d["total_mismatches"] == 0
  assert d["complete"] is True
  assert "OK: no mismatch" in out


def test_stress_run_cut_short_keeps_its_counts(tmp_path):
  """The report is written after each op, not only at the end (a device call's time limit
  cut the stress run once the script ran five ops): here the scan model fails, as a kill
  would stop it, and the ops' counts are there with "complete": false."""
  report = tmp_path / "stress.json"
  script = tmp_path / "cut.py"
  script.write_text(
      "import sys; sys.path.insert(0, 'benchmarks')\n"
      "import stress\n"
      "def cut(*a, **k): raise SystemExit(7)\n"
      "stress.scan_model = cut\n"
      f"sys.argv = ['stress.py', '--calls', '2', '--ops', 'all_reduce', 'reduce_scatter', "
      f"'--out', {str(report)!r}]\n"
      "stress.main()\n")
  env = repo_env(JAX_PLATFORMS="cpu",
                 XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
  proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=240)
  assert proc.returncode == 7, proc.stderr[-3000:]
  d = json.loads(report.read_text())
  assert d["complete"] is False and d["scan_model"] is None
  assert {op: s["calls"] for op, s in d["ops"].items()} == {"all_reduce": 2, "reduce_scatter": 2}
  assert all(s["mismatches"] == 0 for s in d["ops"].values())


def test_stress_runs_the_scan_model_alone_after_a_run_cut_in_it(tmp_path):
  """A run cut in the scan model had finished every op; `--ops` took at least one, so the scan
  model could not run again without another 2,000 calls of some op."""
  report = tmp_path / "stress.json"
  out = run_example("stress.py", "--ops", "--scan-steps", "2", "--layers", "2",
                    "--out", str(report), folder="benchmarks", devices=2)
  d = json.loads(report.read_text())
  assert d["ops"] == {} and d["scan_model"]["steps"] == 2 and d["complete"] is True
  assert "OK: no mismatch" in out


def test_stress_check_fails_on_a_wrong_result(tmp_path):
  """The stress run's per-call check: a product off by more than the tolerance, or gathered
  rows one bit off, is a mismatch (the checker can fail)."""
  script = tmp_path / "check.py"
  script.write_text(
      "import sys; sys.path.insert(0, 'benchmarks')\n"
      "import jax.numpy as jnp, stress\n"
      "a = jnp.linspace(1, 2, 64, dtype=jnp.bfloat16).reshape(8, 8)\n"
      "b = a.at[3, 5].set(a[3, 5] * 2)\n"
      "print('same', stress._check((a, a), (a, a)))\n"
      "print('gathered', stress._check((a, b), (a, a)))\n"
      "err, same, extra = stress._check(a * 2, a)\n"
      "print('product', err > stress.TOL, same, extra)\n"
      "nan = float('nan')\n"
      "print('worst', stress.worst(nan, 0.1), stress.worst(0.1, nan), stress.worst(0.1, 0.2))\n")
  out = run_example(str(script), folder=".")
  assert "same (0.0, True, True)" in out, out
  assert "gathered (0.0, False, False)" in out, out
  assert "product True False True" in out, out
  assert "worst nan nan 0.2" in out, out  # a NaN error is kept in the maximum



_STRESS_WRONG = """
import sys; sys.path.insert(0, 'benchmarks')
import jax, jax.numpy as jnp, numpy as np, stress
from jax.sharding import Mesh
mesh = Mesh(np.array(jax.devices()), ('tp',))
fo, real_ar, real_ag = stress.fo, stress.fo.matmul_all_reduce, stress.fo.all_gather_matmul

def ops(name, shapes, fn, calls=3, which='all_reduce'):
  setattr(fo, 'matmul_all_reduce' if which == 'all_reduce' else 'all_gather_matmul', fn)
  s = stress.stress_ops(mesh, shapes, calls, 1, ops=(which,))[which]
  fo.matmul_all_reduce, fo.all_gather_matmul = real_ar, real_ag
  print(name, s['mismatches'], s['bit_identical'], s['max_rel_error'], len(s['uses_custom_call']))

ops('shapes', stress.CPU_SHAPES, real_ar, calls=6)
ops('off5pc', [(64, 32, 128)], lambda x, w, a: real_ar(x, w, a) * 1.05)
ops('onevalue', [(64, 32, 128)], lambda x, w, a: real_ar(x, w, a).at[0, 0].add(0.1))
ops('nan', [(64, 32, 128)], lambda x, w, a: real_ar(x, w, a).at[0, 0].set(jnp.nan))

def gathered_off(x, w, a, return_gathered=False):
  out, g = real_ag(x, w, a, return_gathered=True)
  return out, g.at[0, 0].add(1.0)
ops('gathered', [(64, 64, 64)], gathered_off, which='all_gather_gathered')

seen = []

def recorded(x, w, a):  # each device's x, at every call / scan step
  jax.debug.callback(lambda v: seen.append(float(np.sum(np.asarray(v, np.float32)))), x)
  return real_ar(x, w, a)
ops('fresh', [(64, 32, 128)], recorded, calls=2)
fo.matmul_all_reduce = recorded
stress.scan_model(mesh, 1, 16, 64, 128, 2, 0)
jax.effects_barrier()
print('distinct inputs', len(seen[:16]), len(set(seen[:16])), len(seen[16:]), len(set(seen[16:])))
fo.matmul_all_reduce = lambda x, w, a: real_ar(x, w, a) * 1.5  # the scan model only
d = stress.scan_model(mesh, 2, 16, 64, 128, 2, 0)
print('scan', d['steps'], d['mismatches'])
sys.argv = ['stress.py', '--calls', '1', '--ops', 'reduce_scatter', '--scan-steps', '2',
            '--layers', '1', '--seed', '3']
print('exit', stress.main())
sys.argv = ['stress.py', '--scan-steps', '0']
try:
  stress.main()
except SystemExit as e:
  print('scan-steps 0 exit', e.code)
"""


def test_stress_counts_each_kind_of_wrong_result(tmp_path):
  """stress.py's counts on ops made wrong on purpose: a product 5% off, a NaN, gathered rows
  one value off and a scan model whose all-reduce is off are mismatches (and exit 1); one
  value off within the tolerance is no mismatch but not bit-identical either; the calls
  cycle through every shape, and every call and scan step gets fresh inputs."""
  script = tmp_path / "wrong.py"
  script.write_text(_STRESS_WRONG)
  out = run_example(str(script), folder=".")
  assert "shapes 0 6 0.0 3\n" in out, out  # bit-identical on the reference path, 3 shapes
  assert "off5pc 3 0 " in out, out
  assert "onevalue 0 0 " in out, out
  assert "nan 3 0 nan 1\n" in out, out  # a NaN error is kept in the maximum
  assert "gathered 3 0 0.0 1\n" in out, out
  assert "distinct inputs 16 16 16 16\n" in out, out  # fresh inputs per call and per step
  assert "scan 2 2\n" in out, out
  assert "FAILED: 2 mismatches" in out and "exit 1\n" in out, out
  assert "scan-steps 0 exit 2\n" in out, out
