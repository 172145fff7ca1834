"""The randomized kernel check (benchmarks/fuzz.py) on the GPU machine, with a fixed seed:
random shapes (partial tiles in M, N and K, 1-row problems, the split tail), bfloat16 and
float16, transpose_w, any comm_sms, forced group plans with band boundaries off the tile
rows, and the signaling GEMM's launch-time switches, each output poisoned first and checked
per 128 x 128 block against float32. Over all local GPUs: at world size 1 the all-to-all and
all-gather have nothing to exchange (XLA's path) and are left out; with 2+ GPUs every op
runs. `python benchmarks/fuzz.py --cases N` draws more cases (a seed of its own each run)."""
import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import _gpu_util as U

pytestmark = U.MARKS
ROOT = Path(__file__).resolve().parent.parent
SEED = 20261202


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)  # poisoned outputs: conftest


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("fuzz", ROOT / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("ops", [("matmul",), ("all_reduce", "reduce_scatter"),
                                 ("all_to_all", "all_gather")])
def test_random_cases_match_float32_block_by_block(ops):
    fuzz = _fuzz_module()
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    if mesh.size == 1 and "all_to_all" in ops:
        pytest.skip("the all-to-all and all-gather need 2+ GPUs (one device: XLA's path)")
    lines = []
    report = fuzz.fuzz(mesh, cases=16, seed=SEED + len(ops[0]), ops=ops, log=lines.append)
    assert report["total_failed"] == 0, "\n".join(
        [line for line in lines if " FAIL " in line] + [str(f) for f in report["failures"]])
    assert sum(s["cases"] for s in report["ops"].values()) == 16
    assert all(s["calls"] == 2 * s["cases"] for s in report["ops"].values())
