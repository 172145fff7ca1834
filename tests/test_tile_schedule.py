"""The signaling GEMM's tile schedule (xla_ffi/kernels/tile_schedule.h) is host code too:
tests/cuda/schedule_test.cc checks on the CPU, for 3000 random layouts (rank blocks, bands,
tile shapes, panels, row rotations, flag blocks, serpentine on and off), that every output tile
is computed exactly once, stored where the group layout says, groups are handed out in order,
and the serpentine alternates column directions. Built with g++ against the CUDA headers;
skipped (saying why) where either is missing."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cuda_include():
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr/cuda", "/opt/cuda"):
        if base and os.path.exists(os.path.join(base, "include", "cuda_runtime.h")):
            return os.path.join(base, "include")
    try:  # the pip wheel of the CUDA runtime headers
        import nvidia.cuda_runtime as rt
        inc = os.path.join(list(rt.__path__)[0], "include")
        if os.path.exists(os.path.join(inc, "cuda_runtime.h")):
            return inc
    except ImportError:
        pass
    return None


def test_tile_schedule_host_checks(tmp_path):
    gxx = shutil.which("g++")
    inc = _cuda_include()
    if gxx is None or inc is None:
        pytest.skip(f"needs g++ ({gxx}) and the CUDA headers ({inc})")
    exe = tmp_path / "schedule_test"
    build = subprocess.run([gxx, "-std=c++17", "-O2", f"-I{inc}", f"-I{REPO}",
                            os.path.join(REPO, "tests", "cuda", "schedule_test.cc"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:]
    assert "3001 layouts, 0 failure(s)" in run.stdout, run.stdout[-2000:]
