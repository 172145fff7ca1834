"""The README's main job (examples/quickstart.py) on GPUs: it says which path the program
took, and that line must match what it compiled to (the device machine; never CI).

With the cost-model fallback on (the default), one device has nothing to communicate and
keeps XLA's dot + psum; two or more GPUs at the default shape run our custom call (the plan
overlaps there: benchmarks/results/h200x2.json). With JAX_FLASHOVERLAP_FALLBACK=0 every
device count runs our kernels. The script itself fails when its error to XLA's psum(x @ w)
reaches 1e-2 (outputs poisoned: conftest sets JAX_FLASHOVERLAP_POISON_OUTPUTS=1)."""
import os
import re
import subprocess
import sys

import _gpu_util as U
from _util import REPO

pytestmark = U.MARKS

OURS = "path: our custom call flashoverlap_gemm_all_reduce"


def run_quickstart(fallback: str | None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.pop("JAX_FLASHOVERLAP_FALLBACK", None)
    if fallback is not None:
        env["JAX_FLASHOVERLAP_FALLBACK"] = fallback
    script = os.path.join(REPO, "examples", "quickstart.py")
    proc = subprocess.run([sys.executable, script, "--iters", "3"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"quickstart failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    assert f"backend=gpu devices={U.N_GPUS}" in proc.stdout, proc.stdout
    err = float(re.search(r"relative error vs XLA psum\(x @ w\): (\S+)", proc.stdout).group(1))
    assert err < U.TOL, proc.stdout
    return proc.stdout


def test_quickstart_path_line_default():
    out = run_quickstart(None)
    if U.N_GPUS == 1:
        assert "path: XLA's dot + psum (one device: nothing to communicate)" in out, out
        assert "no custom call here" in out, out
    else:
        assert OURS in out, out
        assert "no custom call here" not in out, out


def test_quickstart_path_line_without_fallback():
    out = run_quickstart("0")
    assert OURS in out, out
    assert "no custom call here" not in out, out
