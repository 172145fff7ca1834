"""benchmarks/fuzz.py (the randomized kernel check) on CPU: its block check catches what a
whole-output error misses, its cases obey the ops' constraints, and a run over every op on
8 simulated devices passes the reference path and fails a wrong op."""
import dataclasses
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from _util import repo_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fuzz():
  spec = importlib.util.spec_from_file_location("fuzz", ROOT / "benchmarks" / "fuzz.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_one_wrong_block_fails_though_the_whole_output_is_within_tolerance(fuzz):
  ref = jax.random.normal(jax.random.key(0), (2048, 2048), jnp.float32)
  out = ref.astype(jnp.bfloat16).astype(jnp.float32)
  out = out.at[640:768, 1152:1280].multiply(0.9)  # one tile 10% off
  whole = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
  assert whole < fuzz.TOL  # what a whole-output check would have passed
  worst, bad, nonfinite = (float(v) for v in fuzz.block_errors(out, ref))
  assert bad == 1 and nonfinite == 0 and worst == pytest.approx(0.1, rel=0.05)
  good = fuzz.block_errors(ref.astype(jnp.bfloat16), ref)
  assert int(good[1]) == 0 and float(good[0]) < 5e-3  # bf16 rounding alone passes


def test_non_finite_values_and_partial_edge_blocks_count(fuzz):
  ref = jax.random.normal(jax.random.key(1), (300, 200), jnp.float32)  # partial edge blocks
  out = ref.at[299, 199].set(jnp.nan)
  worst, bad, nonfinite = (float(v) for v in fuzz.block_errors(out, ref))
  assert nonfinite == 1 and bad == 0  # the NaN is counted, not folded into the error
  out = ref.at[299, 199].add(100.0)  # the last (partial) block is checked too
  assert int(fuzz.block_errors(out, ref)[1]) == 1


@pytest.mark.parametrize("world", [1, 2, 8])
def test_cases_obey_the_ops_constraints(fuzz, world):
  rng = np.random.default_rng(world)
  seen_bands = seen_in_place = 0
  for i in range(300):
    op = fuzz.OPS[i % len(fuzz.OPS)]
    c = fuzz.sample_case(rng, op, world)
    assert c.m >= 1 and c.n % fuzz.ALIGN == 0 and c.k % fuzz.ALIGN == 0 and c.n and c.k
    assert c.m * c.n * c.k <= fuzz.MAX_FLOPS and c.m * c.n <= fuzz.MAX_OUTPUT
    if op == "reduce_scatter":
      assert c.m % world == 0
    if op == "all_to_all":
      assert (c.m % world == 0) if c.split_axis == 0 else (c.n % (world * fuzz.ALIGN) == 0)
    if op == "all_gather":
      assert c.gather in ("p2p", "collective")
      assert c.chunks is None or (c.m % c.chunks == 0 and world * c.chunks <= 64)
    if op in ("all_to_all", "all_gather"):
      assert c.comm_sms is None or c.comm_sms >= 1
    assert not c.in_place or op == "all_reduce"
    assert c.cta_policy in (None, "efficiency", "zero")
    assert c.cta_policy is None or op in ("all_reduce", "reduce_scatter")
    seen_in_place += c.in_place
    if c.bands is not None:
      seen_bands += 1
      rows = c.m // (world if op == "reduce_scatter" else 1)
      b = c.bands
      assert b[0] == 0 and b[-1] == rows and all(y > x for x, y in zip(b, b[1:]))
      assert len(b) - 1 <= 64
  assert seen_bands > 10 and seen_in_place > 5
  again = fuzz.sample_case(np.random.default_rng(5), "all_reduce", world)
  assert again == fuzz.sample_case(np.random.default_rng(5), "all_reduce", world)


def test_switch_settings_are_accepted_values(fuzz):
  from jax_flashoverlap import _ext
  sets = fuzz.sample_switches(np.random.default_rng(0), 30)
  assert sets[0] == {} and len(sets) == 30
  accepted = {env: allowed for env, allowed, _ in _ext._GEMM_SWITCHES}
  accepted.update({env: tuple(str(v) for v in vals) for env, vals, _ in _ext._GEMM_INTEGERS})
  for s in sets[1:]:
    assert set(s) == set(fuzz.SWITCHES)
    for env, value in s.items():
      assert value in accepted[env], (env, value)


def _mesh():
  return Mesh(np.array(jax.devices()), ("tp",))


def test_a_cpu_run_over_every_op_passes(fuzz):
  report = fuzz.fuzz(_mesh(), cases=10, seed=11, large=48, max_flops=1 << 16,
                     log=lambda s: None)
  assert report["total_failed"] == 0, report["failures"]
  assert all(s["cases"] == 2 and s["calls"] == 4 for s in report["ops"].values())


def test_a_wrong_op_fails(fuzz, monkeypatch):
  # every value right but one row: the run must say so, naming the case
  real = fuzz.fo.matmul_all_reduce
  monkeypatch.setattr(fuzz.fo, "matmul_all_reduce",
                      lambda x, w, axis, **kw: real(x, w, axis, **kw).at[0].multiply(2.0))
  report = fuzz.fuzz(_mesh(), cases=4, seed=3, ops=("all_reduce",), large=48,
                     max_flops=1 << 16, log=lambda s: None)
  assert report["total_failed"] == 4
  failure = report["failures"][0]
  assert failure["case"]["op"] == "all_reduce" and failure["calls"][0]["bad_blocks"] >= 1


def test_right_values_without_our_custom_call_fail_on_a_gpu(fuzz, monkeypatch):
  # On the GPU machine a case whose compiled program lacks our custom call ran XLA's own
  # dot + collective: its values are right, and it must still fail, or the GPU fuzz test
  # would pass on the reference path. On CPU every program is XLA's, so with the backend
  # reported as "gpu" (to fuzz.py alone) every case must fail on that ground alone.
  class _OnGpu:
    def __getattr__(self, name):
      return getattr(jax, name)

    @staticmethod
    def default_backend():
      return "gpu"

  monkeypatch.setattr(fuzz, "jax", _OnGpu())
  lines = []
  report = fuzz.fuzz(_mesh(), cases=4, seed=5, ops=("all_reduce", "matmul"), large=48,
                     max_flops=1 << 16, log=lines.append)
  assert report["total_failed"] == 4, report
  for failure in report["failures"]:
    assert failure["custom_call"] is False and failure["calls"] == [], failure
  assert sum("(not our custom call)" in line for line in lines) == 4, lines


def test_a_launch_error_is_a_failure_not_a_crash(fuzz, monkeypatch):
  def broken(x, w, **kw):
    return jax.pure_callback(_raise, jax.ShapeDtypeStruct((x.shape[0], w.shape[-1]), x.dtype))

  def _raise():
    raise RuntimeError("launch failed")

  monkeypatch.setattr(fuzz.fo, "matmul", broken)
  case = dataclasses.replace(fuzz.sample_case(np.random.default_rng(0), "matmul", 1),
                             m=8, n=8, k=8, transpose_w=False)
  result = fuzz.run_case(case, _mesh(), jax.random.key(0), [{}])
  assert result["calls"] == 1 and "launch failed" in result["failures"][0]["error"]


def test_the_script_writes_its_report_and_stops_at_its_time_limit(tmp_path):
  from test_examples import run_example
  report = tmp_path / "fuzz.json"
  out = run_example("fuzz.py", "--cases", "200", "--seconds", "0", "--seed", "1",
                    "--out", str(report), folder="benchmarks")
  data = json.loads(report.read_text())
  assert "stopping after 1 cases" in out and data["total_failed"] == 0
  assert sum(s["cases"] for s in data["ops"].values()) == 1 and data["seed"] == 1


def test_the_in_place_case_lowers_with_the_output_buffer_and_restores_it(fuzz, monkeypatch):
  from jax_flashoverlap import _ext
  monkeypatch.setenv(_ext.ALL_REDUCE_BUFFER_ENV, "workspace")
  case = dataclasses.replace(fuzz.sample_case(np.random.default_rng(0), "all_reduce", 1),
                             in_place=True)
  with fuzz._lowering_env(case):
    assert _ext.all_reduce_in_place()
  assert not _ext.all_reduce_in_place()
  with fuzz._lowering_env(dataclasses.replace(case, in_place=False)):
    assert not _ext.all_reduce_in_place()


def test_the_script_refuses_sizes_that_leave_no_problem_to_draw():
  import subprocess
  import sys
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz.py"), "--large", "0"],
                        capture_output=True, text=True, timeout=120, env=repo_env())
  assert proc.returncode == 2 and "--large must be >= 64" in proc.stderr


def test_dimensions_reach_one_row_tile_edges_and_many_bands(fuzz):
  # what the fuzz is for beyond the fixed-shape tests: 1-row problems, sizes a few rows
  # either side of a tile, both dtypes, transpose_w, and plans of many bands
  rng = np.random.default_rng(0)
  dims = [fuzz._dim(rng, 16, 128, 12288) for _ in range(1000)]
  assert min(dims) == 1 and len({d for d in dims if d <= 16}) > 10
  off_edge = [d for d in dims if d > 128 and d % 128 in (126, 127, 1, 3)]
  assert len(off_edge) > 100, len(off_edge)  # a quarter are near an edge: ~1 in 6 just off it
  rng = np.random.default_rng(1)
  cases = [fuzz.sample_case(rng, "all_reduce", 8) for _ in range(400)]
  assert {c.dtype for c in cases} == {"bfloat16", "float16"}
  assert {c.transpose_w for c in cases} == {False, True}
  assert max(len(c.bands) - 1 for c in cases if c.bands) > 8


def test_a_cta_policy_alone_forces_the_plan(fuzz):
  case = fuzz.Case(op="all_reduce", m=256, n=256, k=256, dtype="bfloat16", transpose_w=False,
                   comm_sms=None, cta_policy="zero")
  with fuzz._forced(case):
    assert fuzz.plan_lib.choose_plan("all_reduce", 256, 256, 256, 8).cta_policy == "zero"


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_to_all", "all_gather"])
def test_each_device_runs_the_case_gemm(fuzz, op):
  # the case's m, n, k are per device: the global inputs are sharded to exactly that
  case = fuzz.Case(op=op, m=16, n=64, k=24, dtype="bfloat16", transpose_w=False, comm_sms=None)
  world = len(jax.devices())
  _, problem = fuzz.programs(case, _mesh())
  x, w, want = problem(jax.random.key(0))
  m, n, k = ((case.m // world) if op == "reduce_scatter" else case.m), case.n, case.k
  assert x.addressable_shards[0].data.shape == (case.m, k)
  assert w.addressable_shards[0].data.shape[0] == k
  out_n = {"all_reduce": n, "reduce_scatter": n, "all_to_all": n, "all_gather": n * world}[op]
  out_m = {"all_reduce": m, "reduce_scatter": m * world, "all_to_all": m * world,
           "all_gather": m * world}[op]
  assert want.shape == (out_m, out_n), want.shape


def _recording_matmul(fuzz, monkeypatch, seen, nan=False):
  real = fuzz.fo.matmul

  def recorded(x, w, **kw):
    jax.debug.callback(lambda v: seen.append(np.asarray(v, np.float32)), x)
    out = real(x, w, **kw)
    return out.at[-1, -1].set(jnp.nan) if nan else out
  monkeypatch.setattr(fuzz.fo, "matmul", recorded)


def test_each_call_gets_fresh_inputs(fuzz, monkeypatch):
  seen = []
  _recording_matmul(fuzz, monkeypatch, seen)
  case = fuzz.Case(op="matmul", m=8, n=16, k=16, dtype="bfloat16", transpose_w=False,
                   comm_sms=None)
  result = fuzz.run_case(case, _mesh(), jax.random.key(0), [{}, {}, {}])
  assert result["calls"] == 3 and not result["failures"] and len(seen) == 3
  assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[1], seen[2])


def test_each_case_gets_its_own_inputs(fuzz, monkeypatch):
  # two cases of one shape: the seed gives each case its own key, so not the same x twice
  seen = []
  _recording_matmul(fuzz, monkeypatch, seen)
  case = fuzz.Case(op="matmul", m=8, n=16, k=16, dtype="bfloat16", transpose_w=False,
                   comm_sms=None)
  monkeypatch.setattr(fuzz, "sample_case", lambda *args: case)
  report = fuzz.fuzz(_mesh(), cases=2, seed=7, ops=("matmul",), switches_per_case=1,
                     log=lambda s: None)
  assert report["total_failed"] == 0 and len(seen) == 2
  assert not np.array_equal(seen[0], seen[1])


def test_one_non_finite_value_fails_the_call(fuzz, monkeypatch):
  _recording_matmul(fuzz, monkeypatch, [], nan=True)
  case = fuzz.Case(op="matmul", m=256, n=256, k=16, dtype="bfloat16", transpose_w=False,
                   comm_sms=None)
  result = fuzz.run_case(case, _mesh(), jax.random.key(0), [{}])
  (failure,) = result["failures"]  # the NaN's block still within TOL: counted on its own
  assert failure["nonfinite"] == 1 and failure["max_block_error"] < fuzz.TOL


def _main(fuzz, monkeypatch, *argv):
  """fuzz.main() in this process; the variables it sets (RUN_ENV) unset, restored after."""
  for env in fuzz.RUN_ENV:
    monkeypatch.setenv(env, "")
    monkeypatch.delenv(env)
  monkeypatch.setattr("sys.argv", ["fuzz.py", *argv])
  return fuzz.main()


def test_the_script_exits_1_on_a_failure_and_calls_each_case_twice(fuzz, monkeypatch, tmp_path):
  real = fuzz.fo.matmul
  monkeypatch.setattr(fuzz.fo, "matmul", lambda x, w, **kw: real(x, w, **kw) * 2)
  report = tmp_path / "r.json"
  assert _main(fuzz, monkeypatch, "--cases", "1", "--ops", "matmul", "--seed", "4",
               "--out", str(report)) == 1
  data = json.loads(report.read_text())
  assert data["total_failed"] == 1 and data["ops"]["matmul"]["calls"] == 2


def test_the_script_forces_our_kernels_and_poisons_outputs(fuzz, monkeypatch):
  seen = {}

  def fake(mesh, cases, seed, *args, **kw):
    seen.update({env: fuzz.os.environ.get(env) for env in fuzz.RUN_ENV})
    return {"ops": {}, "total_failed": 0, "seconds": 0.0, "failures": []}
  monkeypatch.setattr(fuzz, "fuzz", fake)
  assert _main(fuzz, monkeypatch, "--cases", "1", "--seed", "1") == 0
  assert seen == {"JAX_FLASHOVERLAP_FALLBACK": "0", "JAX_FLASHOVERLAP_POISON_OUTPUTS": "1"}


def test_the_script_refuses_a_seed_jax_cannot_take(fuzz, monkeypatch, capsys):
  with pytest.raises(SystemExit) as info:
    _main(fuzz, monkeypatch, "--seed", str(2 ** 32), "--cases", "1", "--ops", "matmul",
          "--large", "64", "--max-flops", str(64 ** 3))
  assert info.value.code == 2 and "--seed must be in [0, 2**32)" in capsys.readouterr().err
