"""Each example runs as a subprocess with tiny sizes (CPU, 8 simulated devices) and exits 0;
the transformer's two training runs (our layers / nnx.Linear + psum) print matching losses."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _util import repo_env
from jax_flashoverlap import bench_record

ROOT = Path(__file__).resolve().parent.parent
BLOCK_SIZES = ("--layers", "1", "--batch", "2", "--seq", "16", "--dim", "64", "--heads", "8",
               "--ffn", "128")


def run_example(name, *args, timeout=240, folder="examples", devices=None):
  env = repo_env()
  flags = env.get("XLA_FLAGS", "")
  if devices:  # replaces a count already set
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
    flags += f" --xla_force_host_platform_device_count={devices}"
  elif "xla_force_host_platform_device_count" not in flags:
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


@pytest.mark.parametrize("name,devices,args,expect", [
    ("quickstart.py", 3, ("--m", "32", "--iters", "1"), "N=512 K=1032 "),
    ("global_view_jit.py", 6, ("--d", "32", "--iters", "1"), "dp=2 x tp=3  M=258 D=32 F=528 "),
    ("tp_transformer_block.py", 3, ("--steps", "2", *BLOCK_SIZES),
     "note: tp=2 of the 3 devices (heads=8, dim=64, ffn=128 do not split over 3; --tp chooses)"),
    # the sizes split over 8: the note blamed them for --sequence-parallel's seq
    ("tp_transformer_block.py", 8, ("--steps", "1", *BLOCK_SIZES, "--seq", "12",
                                    "--sequence-parallel"),
     "note: tp=4 of the 8 devices (--sequence-parallel's seq=12 does not split over 8; --tp "
     "chooses)"),
])
def test_default_sizes_fit_any_device_count(name, devices, args, expect):
  """On 3 or 6 devices the examples' defaults (K, M, F, the transformer's tp) are made to fit
  instead of the run stopping at a divisibility error about sizes the user never gave."""
  if name == "global_view_jit.py" or name == "tp_transformer_block.py":
    pytest.importorskip("flax")
  out = run_example(name, *args, devices=devices)
  assert expect in out, out


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
  # the plan asked about is the one the op would lower with: this GPU's (its tuned entries)
  asked = []
  choose = fo.plan.choose_plan
  monkeypatch.setattr(fo.plan, "choose_plan", lambda *a, **k: asked.append(k) or choose(*a, **k))
  path.program_path("", "all_reduce", 256, 512, 256, 2)
  assert [k.get("gpu") for k in asked] == [path.jax.devices()[0].device_kind]
  # each op's own status: one built without the other
  monkeypatch.setattr(fo, "info", lambda: {"paths": {
      "matmul_all_reduce": {"cuda_custom_call": True, "why": "CUDA extension built"},
      "matmul_reduce_scatter": {"cuda_custom_call": False, "why": "target missing"}}})
  assert path.program_path("", "reduce_scatter", 256, 512, 256, 2) == (
      "XLA's dot + psum_scatter: target missing")


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
                                          ("reduce_scatter", True, 1), ("all_reduce", False, 1),
                                          ("all_reduce", True, 1)]:
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


@pytest.fixture(scope="module")
def replicated_block_run(tmp_path_factory):
  """(stdout, report) of the transformer example, replicated layout, backward overlapped, 3
  steps: run once (per test worker), read by the tests below (each run is ~15 s of CI)."""
  pytest.importorskip("flax")
  report = tmp_path_factory.mktemp("tp_block") / "tp.json"
  out = run_example("tp_transformer_block.py", "--steps", "3", *BLOCK_SIZES, "--tp", "8",
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
  # on CPU both models run XLA's ops: the step-time line says its difference is noise
  assert re.search(r"median step: .*no custom call here: both models run XLA's ops", out), out
  assert len(d["steps"]) == 3 and d["tp"] == 8
  assert set(d["row_parallel_ops"]) == {"attention_out", "mlp_down", "qkv_dx", "gate_up_dx"}
  assert all(o["xla_ms"] > 0 and o["fo_ms"] > 0 for o in d["row_parallel_ops"].values())
  assert d["median_step_ms"]["fo"] > 0 and d["median_step_ms"]["xla"] > 0
  # the saving the ops predict: XLA's time minus ours, per pair, times the layers
  ops = d["row_parallel_ops"].values()
  assert d["expected_saving_ms_from_ops"] == pytest.approx(
      d["config"]["layers"] * sum(o["xla_ms"] - o["fo_ms"] for o in ops))
  # recorded like bench's results (the report had neither: the runbook's flax step said so)
  # (+dirty aside: another test worker may write an untracked file in between)
  assert d["git_commit"].split("+")[0] == bench_record.git_commit(ROOT).split("+")[0]
  assert d["command"] == ("python examples/tp_transformer_block.py --steps 3 "
                          f"{' '.join(BLOCK_SIZES)} --tp 8 --overlap-backward --json "
                          f"{d['config']['json']}")


def test_tp_transformer_block_sequence_parallel(tmp_path, replicated_block_run, monkeypatch):
  """--sequence-parallel --overlap-backward: the same model with the tokens sharded between
  layers (all_gather_matmul / matmul_reduce_scatter, both directions overlapped); its losses
  equal XLA's all_gather / psum_scatter model's and, the model being the same, those of the
  replicated layout; the report times every forward and backward pair, and its saving line
  names every pair it sums (it said "expected from the row-parallel ops" whatever it summed:
  here the column layers' all-gathers too)."""
  report = tmp_path / "sp.json"
  monkeypatch.setenv("JAX_FLASHOVERLAP_GIT_COMMIT", "0123abc (as the GPU machine's runs pass it)")
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
  assert d["git_commit"] == "0123abc (as the GPU machine's runs pass it)"
  ops = list(d["row_parallel_ops"])
  assert set(ops) == {"attention_out", "mlp_down", "qkv", "gate_up", "attention_out_dx",
                      "mlp_down_dx", "qkv_dx", "gate_up_dx"}
  assert {o["collective"] for o in d["row_parallel_ops"].values()} == {"reduce_scatter",
                                                                      "all_gather"}
  assert all(o["xla_ms"] > 0 and o["fo_ms"] > 0 for o in d["row_parallel_ops"].values())
  assert "row-parallel ops" not in out, out
  assert f"expected from the ops' own times ({', '.join(ops)}; x 1 layers)" in out, out


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
    ("quickstart.py", ("--k", "32"), 2, "--k split over the 8 devices a multiple of 8"),
    ("quickstart.py", ("--iters", "0"), 2, "--m, --n, --k and --iters must be at least 1"),
    ("tp_transformer_block.py", ("--layers", "0"), 2, "--ffn and --layers must be at least 1"),
    ("tp_transformer_block.py", ("--sequence-parallel", "--seq", "12", "--tp", "8"), 1,
     "--sequence-parallel needs seq % tp == 0"),
    # reduce_scatter scatters the rows over dp * tp = 8: 20 rows do not split
    ("global_view_jit.py", ("--m", "20", "--reduce", "reduce_scatter"), 2,
     "need m divisible by dp (reduce_scatter: by dp * tp)"),
    ("global_view_jit.py", ("--f", "16"), 2, "f split over tp a multiple of 8"),  # 4 a device
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
    (("--json", "/nonexistent_folder/report.json"), "not a file in an existing, writable folder"),
    (("--json", ""), "--json: an empty path"),  # was: no report, exit 0
    (("--seed", str(10 ** 20)), "--seed must be in [0, 2**32)"),  # an OverflowError traceback
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


def test_devices_simulated_only_without_a_gpu_or_a_count(monkeypatch):
  """examples/_devices.py: with no GPU it asks XLA for 8 CPU devices, keeping the other XLA
  flags; a device count already set, or a GPU, leaves XLA_FLAGS as it is."""
  import os
  devices = load_example("_devices.py", monkeypatch)
  gpu = [False]
  monkeypatch.setattr(devices.os.path, "exists",
                      lambda p, exists=os.path.exists: gpu[0] if p == "/dev/nvidia0" else exists(p))
  count = "--xla_force_host_platform_device_count"
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  devices.simulate_cpu_devices_without_gpu()
  assert os.environ["XLA_FLAGS"] == f"{count}=8"
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
  devices.simulate_cpu_devices_without_gpu(2)
  assert os.environ["XLA_FLAGS"] == f"--xla_backend_optimization_level=0 {count}=2"
  monkeypatch.setenv("XLA_FLAGS", f"{count}=4")
  devices.simulate_cpu_devices_without_gpu()
  assert os.environ["XLA_FLAGS"] == f"{count}=4"
  gpu[0] = True
  monkeypatch.delenv("XLA_FLAGS")
  devices.simulate_cpu_devices_without_gpu()
  assert "XLA_FLAGS" not in os.environ


QUICK_ARGS = ["quickstart.py", "--m", "64", "--n", "64", "--k", "128", "--iters", "1"]


def test_quickstart_fails_on_a_wrong_result(monkeypatch, capsys):
  """The quickstart's check compares our op's output with XLA's psum(x @ w): an op off by half
  of its value is a relative error of 0.5 and a failing exit, not a printed number."""
  from jax import lax
  example = load_example("quickstart.py", monkeypatch)
  wrong = lambda x, w, axis: lax.psum(x @ w, axis) * 1.5
  monkeypatch.setattr(example.fo, "matmul_all_reduce", wrong)
  monkeypatch.setattr(sys, "argv", QUICK_ARGS)
  with pytest.raises(SystemExit, match=r"FAILED: relative error 5\.0\de-01 >= 1e-2"):
    example.main()
  assert "relative error vs XLA psum(x @ w): 5.0" in capsys.readouterr().out


def test_quickstart_defaults_shapes_and_shardings(monkeypatch, capsys):
  """With no flags on CPU: M=256 N=512 K=1024; the op gets its row-parallel shards (x [M, K/8],
  w [K/8, N]), its output is the whole [M, N] replicated, and the path line is asked about
  the per-device GEMM (K/8) over the 8 devices."""
  example = load_example("quickstart.py", monkeypatch)
  seen, outs, paths = [], [], []
  op = example.fo.matmul_all_reduce
  monkeypatch.setattr(example.fo, "matmul_all_reduce",
                      lambda x, w, axis: seen.append((x.shape, w.shape, axis)) or op(x, w, axis))
  timed = example.timed
  monkeypatch.setattr(example, "timed", lambda fn, *a, iters: outs.append(
      timed(fn, *a, iters=iters)) or outs[-1])
  path = example.program_path
  monkeypatch.setattr(example, "program_path", lambda *a: paths.append(a[1:]) or path(*a))
  monkeypatch.setattr(sys, "argv", ["quickstart.py"])
  example.main()
  assert "M=256 N=512 K=1024 dtype=bfloat16" in capsys.readouterr().out
  assert set(seen) == {((256, 128), (128, 512), "tp")}
  assert paths == [("all_reduce", 256, 512, 128, 8)]
  assert len(outs) == 2
  for out, _ in outs:  # XLA's and ours
    assert out.shape == (256, 512) and out.sharding.is_fully_replicated


def test_global_view_collectives_line(monkeypatch):
  """The collectives line counts XLA's collectives (an async one by its -start) and our custom
  calls."""
  pytest.importorskip("flax")
  example = load_example("global_view_jit.py", monkeypatch)
  text = ("%ars = f32[8]{0} all-reduce-start(%q), to_apply=%add\n"
          "%ar = f32[8]{0} all-reduce(%q), to_apply=%add\n"
          "%rs = bf16[2,4,64]{2,1,0} reduce-scatter(%y), dimensions={0}\n"
          '%cc = bf16[8]{0} custom-call(%a), custom_call_target="flashoverlap_gemm_all_reduce"\n'
          "%ag = bf16[16,4,64]{2,1,0} all-gather(%r), dimensions={0}\n")
  assert example.collectives(text) == ("all-reduce x2, reduce-scatter x1, all-gather x1, "
                                       "flashoverlap_gemm_all_reduce x1")
  assert example.collectives("%d = f32[8]{0} dot(%a, %b)") == "none"
  # tuple shapes (multi-operand, async): counted; a name or an operand named like one is not
  text = ("%a2a = (f32[16,1,32]{2,1,0}, f32[16,1,32]{2,1,0}) all-to-all(%x, %y), channel_id=1\n"
          "%ags = ((bf16[4]{0}), bf16[8]{0}) all-gather-start(%all-reduce.1), dimensions={0}\n"
          "%agd = bf16[8]{0} all-gather-done(%ags)\n")
  assert example.collectives(text) == "all-to-all x1, all-gather x1"


GV_ARGS = ["global_view_jit.py", "--m", "64", "--d", "64", "--f", "128", "--iters", "1"]


def test_global_view_jit_mesh_and_function_program(monkeypatch, capsys):
  """Default --reduce (all_reduce) on 8 devices: the mesh is dp=2 x tp=4 ('dp' rows of
  devices), the function MLP's program has one collective, the op's all-reduce (the weights'
  shardings need no other), and the path line is asked about the per-device GEMM over tp."""
  pytest.importorskip("flax")
  import jax
  import numpy as np
  example = load_example("global_view_jit.py", monkeypatch)
  paths, meshes = [], []
  path = example.program_path
  monkeypatch.setattr(example, "program_path", lambda *a: paths.append(a) or path(*a))
  # the sequence-parallel MLP is test_global_view_jit's: here only the mesh it is given
  monkeypatch.setattr(example, "sequence_parallel_mlp",
                      lambda args, mesh, dp, *rest: meshes.append((mesh, dp)) or 0.0)
  monkeypatch.setattr(sys, "argv", GV_ARGS)
  example.main()
  out = capsys.readouterr().out
  assert "mesh dp=2 x tp=4" in out and "reduce=all_reduce" in out, out
  (compiled, *shape), = paths
  assert shape == ["all_reduce", 32, 64, 32, 4]
  # every collective, a tuple-shaped one (an all-to-all) too
  assert example.collectives(compiled) == "all-reduce x1", example.collectives(compiled)
  (mesh, dp), = meshes
  assert dp == 2 and dict(mesh.shape) == {"dp": 2, "tp": 4}
  np.testing.assert_array_equal(mesh.devices, np.array(jax.devices()).reshape(2, 4))
  assert out.rstrip().endswith("OK")


def test_global_view_jit_fails_on_a_wrong_layer_or_a_later_nan(monkeypatch, capsys):
  """Each of the three MLPs' errors decides: the Flax layers' MLP off (its column layer's
  output x 1.5) fails with a finite error, as does a NaN error from the sequence-parallel MLP
  (the last of the three: Python's max() drops a NaN it meets after a number)."""
  pytest.importorskip("flax")
  example = load_example("global_view_jit.py", monkeypatch)
  monkeypatch.setattr(sys, "argv", GV_ARGS)

  class Off(example.ColumnParallelLinear):
    def __call__(self, x):
      return super().__call__(x) * 1.5

  monkeypatch.setattr(example, "sequence_parallel_mlp", lambda *a: 0.0)
  with monkeypatch.context() as m:
    m.setattr(example, "ColumnParallelLinear", Off)
    with pytest.raises(SystemExit, match=r"FAILED: relative error \d\.\d\de-01 >= 1e-2"):
      example.main()
  errs = re.findall(r"rel err vs x @ w (\S+)", capsys.readouterr().out)
  assert float(errs[0]) < 1e-2 and float(errs[1]) > 0.1, errs  # the function's is fine
  monkeypatch.setattr(example, "sequence_parallel_mlp", lambda *a: float("nan"))
  with pytest.raises(SystemExit, match="FAILED: relative error nan"):
    example.main()
  assert not capsys.readouterr().out.rstrip().endswith("OK")


def test_tp_block_fails_when_the_losses_differ(monkeypatch, capsys):
  """Our layers' loss 5% off XLA's at the first step only fails the run at the default --rtol
  (2e-2): the worst step decides, not the last."""
  pytest.importorskip("flax")
  example = load_example("tp_transformer_block.py", monkeypatch)
  make_step, steps = example.make_step, []

  def first_step_off(*a, **k):  # the first model built is ours ("fo"), then XLA's
    step = make_step(*a, **k)
    steps.append(step)
    if len(steps) > 1:
      return step
    calls = []

    def off(*args):
      params, opt_state, loss = step(*args)
      calls.append(1)
      return params, opt_state, loss * 1.05 if len(calls) == 1 else loss
    return off

  monkeypatch.setattr(example, "make_step", first_step_off)
  monkeypatch.setattr(sys, "argv", ["tp_transformer_block.py", "--steps", "2", *BLOCK_SIZES])
  failed = r"FAILED: losses differ by \d\.\d\de-02 \(relative\) > 0\.02"
  with pytest.raises(SystemExit, match=failed):
    example.main()
  out = capsys.readouterr().out
  assert len(steps) == 2 and "OK" not in out, out
  rels = [float(r) for r in re.findall(r"rel diff (\S+)", out)]
  assert len(rels) == 2 and rels[0] > 4e-2 and rels[1] < 2e-2, out


def test_tp_block_linears_and_rope(monkeypatch):
  """make_linears passes --overlap-backward and --sequence-parallel to our layers (the row
  layer reduce-scatters in the sequence-parallel layout), and rope is a rotation by position:
  position 0 unchanged, norms kept, q.k depending on the positions' difference only."""
  pytest.importorskip("flax")
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  block = load_example("tp_transformer_block.py", monkeypatch)
  for overlap, seq in [(True, True), (True, False), (False, True)]:
    col, row = block.make_linears("fo", overlap, seq)
    c, r = col(64, 128, nnx.Rngs(0)), row(128, 64, nnx.Rngs(0))
    assert (c.cfg.overlap_backward, c.cfg.sequence_parallel) == (overlap, seq)
    assert r.cfg.overlap_backward == overlap
    assert r.cfg.reduce == ("reduce_scatter" if seq else "all_reduce")
  kq, kk = jax.random.split(jax.random.key(3))
  x = jax.random.normal(kq, (2, 16, 4, 32), jnp.float32)
  y = block.rope(x)
  np.testing.assert_allclose(y[:, 0], x[:, 0], rtol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1),
                             rtol=1e-5)
  # the same q and k at every position: rope(q)_i . rope(k)_j is a function of i - j
  q, k = (jnp.broadcast_to(jax.random.normal(key, (1, 1, 1, 32)), (1, 16, 1, 32))
          for key in (kq, kk))
  scores = jnp.einsum("bihd,bjhd->ij", block.rope(q), block.rope(k))
  for d in (0, 3, -5):
    diag = jnp.diagonal(scores, d)
    np.testing.assert_allclose(diag, jnp.full_like(diag, diag[0]), rtol=1e-4, atol=1e-4)
  assert not np.allclose(scores[0, 0], scores[5, 0], atol=1e-3)


def test_tp_block_op_pairs_are_the_layers_gemms(monkeypatch):
  """Each timed pair of the JSON report is a GEMM of the block: [T, K] x [K, N] with the
  layer's kernel [K, N] (transposed, the backward's dx: the kernel as stored, [N, K])."""
  pytest.importorskip("flax")
  import argparse
  from flax import nnx
  block = load_example("tp_transformer_block.py", monkeypatch)
  blk = block.Block(64, 8, 96, "xla", rngs=nnx.Rngs(0))
  layers = {"attention_out": blk.wo, "mlp_down": blk.w_down, "qkv": blk.wqkv,
            "gate_up": blk.w_gate_up}
  for seq in (False, True):
    for overlap in (False, True):
      args = argparse.Namespace(dim=64, ffn=96, sequence_parallel=seq, overlap_backward=overlap)
      pairs = block._op_pairs(args)
      assert len(pairs) == 2 * (1 + seq) * (1 + overlap), pairs
      for name, (k, n, collective, transposed) in pairs.items():
        kernel = layers[name.removesuffix("_dx")].kernel[...].shape
        assert transposed == name.endswith("_dx")
        assert ((n, k) if transposed else (k, n)) == kernel, (name, kernel)
        row = name.startswith(("attention_out", "mlp_down"))
        # forward: row layers reduce, column layers gather; the backward's dx the other way
        reduce = "reduce_scatter" if seq else "all_reduce"
        assert collective == ("all_gather" if row == transposed else reduce), name


def test_global_view_jit_all_devices_on_dp(monkeypatch, capsys):
  """--dp 8, the largest --dp on 8 devices: a dp=8 x tp=1 mesh (the op over one device)."""
  pytest.importorskip("flax")
  example = load_example("global_view_jit.py", monkeypatch)
  monkeypatch.setattr(example, "sequence_parallel_mlp", lambda *a: 0.0)  # the MLPs' errors
  monkeypatch.setattr(sys, "argv", GV_ARGS + ["--dp", "8"])
  example.main()
  out = capsys.readouterr().out
  assert "mesh dp=8 x tp=1" in out and out.rstrip().endswith("OK"), out


@pytest.mark.parametrize("name", ["quickstart.py", "global_view_jit.py", "tp_transformer_block.py"])
def test_examples_refuse_to_run_as_several_processes(name):
  """Under jax_flashoverlap.launch (which sets JAX_FLASHOVERLAP_NUM_PROCESSES) each process ran
  a copy of its own over its own devices, none joined the others, and all exited 0."""
  env = dict(repo_env(), JAX_PLATFORMS="cpu", JAX_FLASHOVERLAP_NUM_PROCESSES="2")
  proc = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr[-2000:])
  assert ("this example runs in one process over all local devices; under "
          "jax_flashoverlap.launch each of the 2 processes would run a copy of its own"
          in proc.stderr), proc.stderr[-2000:]
