"""Each example runs as a subprocess with tiny sizes (CPU, 8 simulated devices) and exits 0;
the transformer's two training runs (our layers / nnx.Linear + psum) print matching losses."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _util import repo_env

ROOT = Path(__file__).resolve().parent.parent


def run_example(name, *args, timeout=240, folder="examples"):
  env = repo_env()
  flags = env.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    flags += " --xla_force_host_platform_device_count=8"
  # Tiny programs: XLA:CPU's optimisation passes would be most of the run time.
  env["XLA_FLAGS"] = (flags + " --xla_backend_optimization_level=0").strip()
  env.setdefault("JAX_PLATFORMS", "cpu")
  proc = subprocess.run([sys.executable, str(ROOT / folder / name), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout


def load_example(name, monkeypatch):
  """An example file imported as a module (its folder on sys.path, for its own imports)."""
  import importlib.util
  monkeypatch.syspath_prepend(str(ROOT / "examples"))
  spec = importlib.util.spec_from_file_location(Path(name).stem, ROOT / "examples" / name)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_quickstart():
  out = run_example("quickstart.py", "--m", "64", "--n", "64", "--k", "128", "--iters", "1")
  err = float(re.search(r"relative error vs XLA psum\(x @ w\): (\S+)", out).group(1))
  assert err < 1e-2
  # On CPU the op is the reference composition, and the path line says so (GPU: test_gpu_examples).
  assert "path: XLA's dot + psum: no GPU" in out, out
  assert "no custom call here" in out, out


def test_program_path_reasons(monkeypatch):
  """The reasons the examples give when the CUDA path exists but a program has no custom
  call: one device, or a plan that predicts no gain (with the plan's own times)."""
  path = load_example("_path.py", monkeypatch)
  fo = path.fo
  monkeypatch.setattr(fo, "info", lambda: {"paths": {f"matmul_{c}": {
      "cuda_custom_call": True, "why": "CUDA extension built"}
      for c in ("all_reduce", "reduce_scatter")}})
  text = "custom-call(...), custom_call_target=\"flashoverlap_gemm_reduce_scatter\""
  assert path.program_path(text, "reduce_scatter", 256, 512, 256, 2).startswith(
      "our custom call flashoverlap_gemm_reduce_scatter")
  assert path.program_path("", "all_reduce", 256, 512, 256, 1) == (
      "XLA's dot + psum (one device: nothing to communicate)")
  plan = fo.plan.choose_plan("reduce_scatter", 256, 512, 256, 2, gpu="cpu")
  assert not plan.overlap
  line = path.program_path(text.replace("reduce_scatter", "all_reduce"), "reduce_scatter",
                           256, 512, 256, 2)
  assert line.startswith("XLA's dot + psum_scatter (the plan predicts no gain over XLA: "), line
  assert f"{plan.predicted_s * 1e3:.3f} ms vs {plan.baseline_s * 1e3:.3f} ms)" in line, line
  assert "noise" in path.timing_note(False) and path.timing_note(True) == ""


def test_tp_block_pair_programs_return_the_same_outputs(monkeypatch):
  """The example's per-pair timing compares like with like: where ours returns the gathered
  rows (the transposed all-gather of the row layer's backward), XLA's program returns them
  too, and both programs' outputs agree."""
  pytest.importorskip("flax")
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  block = load_example("tp_transformer_block.py", monkeypatch)
  mesh = Mesh(np.array(jax.devices()[:4]), (block.AXIS,))
  for collective, transposed, outputs in [("all_gather", True, 2), ("all_gather", False, 1),
                                          ("reduce_scatter", True, 1)]:
    xla, ours, x_spec, w_spec = block._pair_programs(mesh, collective, transposed)
    kx, kw = jax.random.split(jax.random.key(7))
    x = jax.random.normal(kx, (32, 64), block.DTYPE)
    w = jax.random.normal(kw, (64, 64), block.DTYPE)
    args = (jax.device_put(x, NamedSharding(mesh, x_spec)),
            jax.device_put(w, NamedSharding(mesh, w_spec)))
    got, want = jax.tree.leaves(ours(*args)), jax.tree.leaves(xla(*args))
    assert len(got) == len(want) == outputs, (collective, transposed)
    for a, b in zip(got, want):
      assert a.shape == b.shape
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 rtol=2e-2, atol=2e-2)


BLOCK_SIZES = ("--layers", "1", "--batch", "2", "--seq", "16", "--dim", "64", "--heads", "8",
               "--ffn", "128")


@pytest.fixture(scope="module")
def replicated_block_run(tmp_path_factory):
  """(stdout, report) of the transformer example, replicated layout, backward overlapped, 3
  steps: run once (per test worker), read by the tests below (each run is ~15 s of CI)."""
  pytest.importorskip("flax")
  report = tmp_path_factory.mktemp("tp_block") / "tp.json"
  out = run_example("tp_transformer_block.py", "--steps", "3", *BLOCK_SIZES,
                    "--overlap-backward", "--json", str(report))
  return out, json.loads(report.read_text())


def test_tp_transformer_block(replicated_block_run):
  out, d = replicated_block_run
  losses = re.findall(r"loss fo (\S+)\s+xla (\S+)", out)
  assert len(losses) == 3, out
  for fo_loss, xla_loss in losses:
    a, b = float(fo_loss), float(xla_loss)
    assert abs(a - b) <= 1e-2 * abs(b), out
  assert float(losses[-1][0]) < float(losses[0][0]), f"loss did not go down:\n{out}"
  assert re.search(r"time fo\s+\S+ ms\s+xla\s+\S+ ms", out)
  assert "OK: losses match" in out
  assert len(d["steps"]) == 3 and d["tp"] == 8
  assert set(d["row_parallel_ops"]) == {"attention_out", "mlp_down", "qkv_dx", "gate_up_dx"}
  assert all(o["xla_ms"] > 0 and o["fo_ms"] > 0 for o in d["row_parallel_ops"].values())
  assert d["median_step_ms"]["fo"] > 0 and d["median_step_ms"]["xla"] > 0


def test_tp_transformer_block_sequence_parallel(tmp_path, replicated_block_run):
  """--sequence-parallel --overlap-backward: the same model with the tokens sharded between
  layers (all_gather_matmul / matmul_reduce_scatter, both directions overlapped); its losses
  equal XLA's all_gather / psum_scatter model's and, the model being the same, those of the
  replicated layout; the report times every forward and backward pair, and its saving line
  names every pair it sums (it said "expected from the row-parallel ops" whatever it summed:
  here the column layers' all-gathers too)."""
  report = tmp_path / "sp.json"
  out = run_example("tp_transformer_block.py", "--steps", "2", *BLOCK_SIZES,
                    "--sequence-parallel", "--overlap-backward", "--json", str(report))
  assert "sequence_parallel" in out and "OK: losses match" in out, out
  replicated, _ = replicated_block_run
  sp_losses = [float(a) for a, _ in re.findall(r"loss fo (\S+)\s+xla (\S+)", out)]
  rep_losses = [float(a) for a, _ in re.findall(r"loss fo (\S+)\s+xla (\S+)", replicated)]
  assert len(sp_losses) == 2 and len(rep_losses) == 3
  for a, b in zip(sp_losses, rep_losses):  # the same seed: the same first two steps
    assert abs(a - b) <= 1e-3 * abs(b), (sp_losses, rep_losses)
  d = json.loads(report.read_text())
  ops = list(d["row_parallel_ops"])
  assert set(ops) == {"attention_out", "mlp_down", "qkv", "gate_up", "attention_out_dx",
                      "mlp_down_dx", "qkv_dx", "gate_up_dx"}
  assert {o["collective"] for o in d["row_parallel_ops"].values()} == {"reduce_scatter",
                                                                      "all_gather"}
  assert all(o["xla_ms"] > 0 and o["fo_ms"] > 0 for o in d["row_parallel_ops"].values())
  assert "row-parallel ops" not in out, out
  assert f"expected from the ops' own times ({', '.join(ops)}; x 1 layers)" in out, out


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
  env = dict(repo_env(), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
  proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=240)
  assert proc.returncode == 7, proc.stderr[-3000:]
  d = json.loads(report.read_text())
  assert d["complete"] is False and d["scan_model"] is None
  assert {op: s["calls"] for op, s in d["ops"].items()} == {"all_reduce": 2, "reduce_scatter": 2}
  assert all(s["mismatches"] == 0 for s in d["ops"].values())


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


@pytest.mark.parametrize("reduce,spec", [("all_reduce", "P('dp', None)"),
                                         ("reduce_scatter", "P(('dp', 'tp'),)")])
def test_global_view_jit(reduce, spec):
  pytest.importorskip("flax")
  out = run_example("global_view_jit.py", "--m", "64", "--d", "64", "--f", "128", "--iters", "1",
                    "--reduce", reduce)
  assert f"sharding {spec}" in out, out
  errs = [float(e) for e in re.findall(r"rel err vs x @ w (\S+)", out)]
  assert len(errs) == 3 and all(e < 1e-2 for e in errs), out  # max() would skip a NaN
  # the sequence-parallel MLP in [S, B, D] (B: 2 rows a device): the ops' collectives only
  assert ("sequence-parallel MLP:   x (16, 4, 64) P('tp', 'dp', None) -> out (16, 4, 64) "
          "sharding P('tp', 'dp')") in out, out
  assert "collectives: all-gather x1, reduce-scatter x1\n" in out, out
  psum = "psum" if reduce == "all_reduce" else "psum_scatter"
  assert f"path: XLA's dot + {psum}: no GPU" in out, out
  assert out.rstrip().endswith("OK")


@pytest.mark.parametrize("name,args,code,message", [
    ("tp_transformer_block.py", ("--tp", "16"), 2,
     "--tp must be between 0 (all devices) and the 8"),
    ("tp_transformer_block.py", ("--steps", "0"), 2, "--steps, --batch, --seq"),
    ("tp_transformer_block.py", ("--ffn", "132"), 1, "ffn/tp whole multiples of 8"),
    ("tp_transformer_block.py", ("--tp", "2", "--dim", "48", "--heads", "16"), 1,
     "an even head dim"),
    ("global_view_jit.py", ("--dp", "16"), 2, "--dp must be 0 (default) or divide the 8"),
    # 3 does not divide 8 (it said "need m divisible by dp", and with --m 240 ran on 6)
    ("global_view_jit.py", ("--dp", "3", "--m", "240"), 2,
     "--dp must be 0 (default) or divide the 8 devices"),
    ("quickstart.py", ("--k", "100"), 2, "--k split over the 8 devices a multiple of 8"),
])
def test_examples_reject_bad_arguments(name, args, code, message):
  """A bad argument is a clear message and a failing exit before anything runs, not a silent
  smaller run (--tp 16 on 8 devices ran tp=8), a vacuous 'OK' (--steps 0) or a traceback."""
  pytest.importorskip("flax")
  env = repo_env()
  flags = env.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
  env.setdefault("JAX_PLATFORMS", "cpu")
  proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
  assert message in proc.stdout + proc.stderr, proc.stderr
  assert "Traceback" not in proc.stderr and "OK" not in proc.stdout


def _run_example_raw(name, *args):
  """(returncode, stdout, stderr) of an example on 8 simulated CPU devices."""
  env = repo_env()
  env["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")
  env.setdefault("JAX_PLATFORMS", "cpu")
  proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=240)
  return proc.returncode, proc.stdout, proc.stderr


def test_tp_block_diverged_losses_fail_instead_of_ok():
  """--lr 1e30 makes both runs' losses NaN from step 1 on: the relative difference is NaN,
  which max() dropped, and the example printed "OK: losses match" (the check that our layers
  agree with XLA's passed on NaN losses, as it would on a NaN from our op)."""
  pytest.importorskip("flax")
  code, out, err = _run_example_raw(
      "tp_transformer_block.py", "--lr", "1e30", "--steps", "2", "--layers", "1", "--batch",
      "2", "--seq", "16", "--dim", "64", "--heads", "8", "--ffn", "128")
  assert "loss fo nan" in out, out  # the premise: the run diverged
  assert code == 1 and "OK" not in out, (code, out, err)
  assert "FAILED: a loss is not finite" in err, err


@pytest.mark.parametrize("args,message", [
    (("--lr", "nan"), "--lr must be finite"),
    (("--rtol", "-1"), "--rtol finite and >= 0"),  # always FAILED after the whole run
    (("--json", "/nonexistent_folder/report.json"), "not a file in an existing folder"),
    # the report's "median step" was step 0's time, compile included
    (("--json", "{tmp}/report.json", "--steps", "1"), "--json needs --steps >= 2"),
])
def test_tp_block_rejects_bad_float_flags_and_json_path_before_training(args, message,
                                                                         tmp_path):
  """Before: --lr nan trained NaNs, --rtol -1 failed every run after training, a --json in a
  missing folder raised FileNotFoundError's traceback after the whole run, and --json with
  --steps 1 reported step 0 (compile included) as the median step."""
  pytest.importorskip("flax")
  args = [a.replace("{tmp}", str(tmp_path)) for a in args]
  code, out, err = _run_example_raw("tp_transformer_block.py", *args)
  assert code == 2 and message in err, (code, out, err)
  assert "Traceback" not in err and "step" not in out


def test_global_view_jit_fails_on_a_nan_error(monkeypatch, capsys):
  """A NaN relative error (an op returning NaN) must fail the example: max() over the three
  errors dropped a NaN that was not first, and `NaN >= 1e-2` is False, so it printed "OK"."""
  pytest.importorskip("flax")
  import jax.numpy as jnp
  example = load_example("global_view_jit.py", monkeypatch)
  nan = lambda h, w, **kw: (h @ w) * jnp.nan  # laid out as XLA's dot
  monkeypatch.setattr(example.fo, "row_parallel_matmul", nan)  # the first of the three MLPs
  monkeypatch.setattr(sys, "argv", ["global_view_jit.py", "--m", "64", "--d", "64", "--f",
                                    "128", "--iters", "1"])
  with pytest.raises(SystemExit, match="FAILED: relative error nan"):
    example.main()
  assert not capsys.readouterr().out.rstrip().endswith("OK")
