"""The README's main job (examples/quickstart.py) and the global-view example on GPUs: each
says which path its program took, and that line must match what it compiled to (the device
machine; never CI).

quickstart (shard_map): with the cost-model fallback on (the default), one device has nothing
to communicate and keeps XLA's dot + psum; two or more GPUs at the default shape run our
custom call (the plan overlaps there: benchmarks/results/h200x2.json); with
JAX_FLASHOVERLAP_FALLBACK=0 every device count runs our kernels. global_view_jit (plain jit):
over one device XLA does not partition, so it is XLA's dot whatever the fallback says; over
two or more, our custom call (fallback off). Each script fails when its error reaches 1e-2
(outputs poisoned: conftest sets JAX_FLASHOVERLAP_POISON_OUTPUTS=1)."""
import os
import re
import subprocess
import sys

import pytest

import _gpu_util as U
from _util import REPO, repo_env

pytestmark = U.MARKS

ONE_DEVICE = "(one device: nothing to communicate)"


def run_example(name, fallback: str | None, *args):
    # The pytest process may already hold 75% of the GPU (XLA's pool, from earlier tests):
    # the child's own pool would then leave no room for the communication workspace.
    env = repo_env(JAX_FLASHOVERLAP_FALLBACK=fallback, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    script = os.path.join(REPO, "examples", name)
    proc = subprocess.run([sys.executable, script, "--iters", "3", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    assert "backend=gpu" in proc.stdout, proc.stdout
    errs = [float(e) for e in re.findall(
        r"(?:relative error vs XLA psum\(x @ w\):|rel err vs x @ w) (\S+)", proc.stdout)]
    assert errs and all(e < U.TOL for e in errs), proc.stdout  # max() would skip a NaN
    return proc.stdout


def test_quickstart_path_line_default():
    out = run_example("quickstart.py", None)
    assert f"devices={U.N_GPUS}" in out, out
    if U.N_GPUS == 1:
        assert f"path: XLA's dot + psum {ONE_DEVICE}" in out, out
        assert "no custom call here" in out, out
    else:
        assert "path: our custom call flashoverlap_gemm_all_reduce" in out, out
        assert "no custom call here" not in out, out


def test_quickstart_path_line_without_fallback():
    out = run_example("quickstart.py", "0")
    assert "path: our custom call flashoverlap_gemm_all_reduce" in out, out
    assert "no custom call here" not in out, out


@pytest.mark.parametrize("reduce,xla", [("all_reduce", "psum"), ("reduce_scatter", "psum_scatter")])
def test_global_view_path_line_without_fallback(reduce, xla):
    pytest.importorskip("flax")
    out = run_example("global_view_jit.py", "0", "--reduce", reduce)
    if U.N_GPUS == 1:
        assert f"path: XLA's dot + {xla} {ONE_DEVICE}" in out, out
        assert "no custom call here" in out, out
    else:
        assert f"path: our custom call flashoverlap_gemm_{reduce}" in out, out
        assert "no custom call here" not in out, out
    assert out.rstrip().endswith("OK"), out
