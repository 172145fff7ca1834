"""The overlapped ops without JAX (tests/cuda/overlap_harness.cc) on every GPU, one process
each: the framework-free sequences the FFI handlers run, checked element by element against a
float32 host reference (fresh random inputs, poisoned outputs). Builds the harness from the
extension's objects (build/obj)."""
import os
import subprocess

import pytest

from test_gpu import requires_gpu, requires_multigpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.multigpu, requires_gpu, requires_multigpu]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    build = tmp_path_factory.mktemp("harness")
    r = subprocess.run(["bash", "tests/cuda/build_overlap_harness.sh", str(build)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return build / "overlap_harness"


@pytest.mark.parametrize("shape", [[], ["--m", "320", "--n", "272", "--k", "200"]],
                         ids=["aligned", "unaligned"])
def test_harness_every_op_matches(harness, tmp_path, shape):
    ops = "ar,ar_out,rs,a2a,a2a11,ag,ag_ce,ag_g,ag_ce_g"
    r = subprocess.run(["bash", "tests/cuda/run_overlap_harness.sh", "none", str(tmp_path),
                        "--calls", "2", "--ops", ops, *shape],
                       cwd=REPO, capture_output=True, text=True, timeout=400,
                       env=dict(os.environ, HARNESS_BIN=str(harness), HARNESS_TIMEOUT="300"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    ok_lines = [line for line in out.splitlines() if line.endswith(" OK")]
    world = out.count("): exit 0")
    assert world >= 2 and len(ok_lines) == world * len(ops.split(",")), out[-6000:]
