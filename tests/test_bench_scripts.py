"""The benchmark scripts that need GPUs (or two processes) to run, on what CPU can check:
benchmarks/compile_variants.py's schedule reading of XLA's HLO text, the arguments
compile_variants.py, gemm_in_jax.py, epilogue_ab.py and xla_dot_profile.py refuse before any
work (the bad-input table has one row each; these are the other arguments its docs/errors.md
rows name)."""
import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from _util import repo_env

ROOT = Path(__file__).resolve().parent.parent


def _load(name):
  spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# A scheduled module as XLA:GPU prints it: a GEMM as cuBLAS's custom call, as a fusion named
# after it, as a fusion only its op_name metadata names; collectives sync, async (start / done)
# and through async-start; a computation after ENTRY whose dot is not the entry's.
_HLO = """HloModule jit_f, is_scheduled=true

%fused_dot (p0: bf16[64,64], p1: bf16[64,64]) -> bf16[64,64] {
  %dot.1 = bf16[64,64] dot(%p0, %p1), lhs_contracting_dims={1}
}

ENTRY %main.10 (Arg_0.1: bf16[64,64], Arg_1.2: bf16[64,64]) -> bf16[64,64] {
  %Arg_0.1 = bf16[64,64] parameter(0)
  %custom-call.3 = (bf16[64,64], s8[1024]{0}) custom-call(%Arg_0.1), custom_call_target="__cublas$gemm"
  %get-tuple-element.4 = bf16[64,64] get-tuple-element(%custom-call.3), index=0
  %gemm_fusion_dot.5 = bf16[64,64] fusion(%Arg_0.1, %Arg_1.2), kind=kCustom, calls=%fused_dot
  %loop_fusion.6 = bf16[64,64] fusion(%Arg_0.1), kind=kLoop, calls=%f, metadata={op_name="jit(f)/dot_general"}
  %wrapped_add.7 = bf16[64,64] fusion(%Arg_0.1), kind=kLoop, calls=%g, metadata={op_name="jit(f)/add"}
  %all-reduce-start = bf16[64,64] all-reduce-start(%get-tuple-element.4), replica_groups={}, to_apply=%add
  %all-reduce-done = bf16[64,64] all-reduce-done(%all-reduce-start)
  %reduce-scatter-start = ((bf16[64,64]), bf16[32,64]) async-start(%loop_fusion.6), calls=%rs
  %reduce-scatter-done = bf16[32,64] async-done(%reduce-scatter-start)
  %collective-permute.8 = bf16[64,64] collective-permute(%wrapped_add.7), source_target_pairs={{0,1},}
  ROOT %copy.9 = bf16[64,64] copy(%all-reduce-done)
}

%after (p: bf16[64,64]) -> bf16[64,64] {
  %dot.99 = bf16[64,64] dot(%p, %p), lhs_contracting_dims={1}
}
"""


def test_schedule_lists_the_entry_gemms_and_collectives_in_order():
  cv = _load("compile_variants")
  assert cv.schedule(_HLO) == [
      "__cublas$gemm:custom-call.3", "fusion:gemm_fusion_dot.5", "fusion:loop_fusion.6",
      "all-reduce-start:all-reduce-start", "all-reduce-done:all-reduce-done",
      "async-start:reduce-scatter-start", "async-done:reduce-scatter-done",
      "collective-permute:collective-permute.8"]


def test_compile_variants_prints_and_records_every_program_on_cpu(tmp_path):
  # two CPU processes: rank 0's output is what the launcher shows (rank 1's log is dropped)
  out = tmp_path / "cv.json"
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_variants.py"),
                         "--m", "64", "--n", "64", "--k", "64", "--json", str(out)], cwd=ROOT,
                        env=repo_env(XLA_FLAGS=None, JAX_PLATFORMS=None), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  programs = json.loads(out.read_text())["programs"]
  names = ("baseline", "two_chunk", "two_chunk_plain", "global_view")
  assert list(programs) == [f"{c}/{v}" for c in ("all_reduce", "reduce_scatter") for v in names]
  for key, value in programs.items():
    assert f"{key} (windowed loop: False):\n  " + " ".join(value["schedule"]) in proc.stdout
  for c, op in (("all_reduce", "all-reduce"), ("reduce_scatter", "reduce-scatter")):
    assert sum(s.startswith(op) for s in programs[f"{c}/two_chunk"]["schedule"]) == 2


@pytest.mark.parametrize("argv,message", [
    (["--k", "63"], "--k must be a positive even number (split over the 2 processes), got 63"),
    (["--n", "0"], "--n must be a positive number, got 0"),
    (["--m", "0"], "--m must be a positive even number"),
])
def test_compile_variants_refuses_sizes_before_starting_processes(argv, message, monkeypatch,
                                                                  capsys):
  cv = _load("compile_variants")
  monkeypatch.setattr("sys.argv", ["compile_variants.py", *argv])
  with pytest.raises(SystemExit) as info:
    cv.main()
  assert info.value.code == 2 and message in capsys.readouterr().err


def test_gemm_in_jax_refuses_zero_samples_before_any_work(monkeypatch, capsys):
  gj = _load("gemm_in_jax")
  monkeypatch.setattr("sys.argv", ["gemm_in_jax.py", "--samples", "0"])
  with pytest.raises(SystemExit) as info:
    gj.main()
  assert info.value.code == 2 and "--samples must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0x64x64", "64x0x64", "64x64x0", "064x64x64", "64x64", "8x8x8x8",
                                  "-8x8x8"])
def test_xla_dot_profile_takes_positive_mxnxk_only(text):
  xd = _load("xla_dot_profile")
  assert xd._shape("8192x1x64") == "8192x1x64"
  with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
    xd._shape(text)


@pytest.mark.parametrize("argv, message", [
    (["--calls", "0"], "--calls must be >= 1, got 0"),
    (["--samples", "0"], "--samples must be >= 1, got 0"),
    (["--comm-sms", "0", "-8"], "--comm-sms must be >= 0, got [0, -8]"),
])
def test_epilogue_ab_refuses_before_any_work(monkeypatch, capsys, argv, message):
  ab = _load("epilogue_ab")
  monkeypatch.delenv(ab.EPILOGUE_ENV, raising=False)
  monkeypatch.setattr("sys.argv", ["epilogue_ab.py", *argv])
  with pytest.raises(SystemExit) as info:
    ab.main()
  assert info.value.code == 2 and message in capsys.readouterr().err

