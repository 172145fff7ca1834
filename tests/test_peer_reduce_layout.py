"""The peer-reduce launch (xla_ffi/comm/peer_reduce_args.h: which rows of the one GEMM launch
go to the peer's recv, our result, the peer's result; which counters each band signals and
waits for) is host code: tests/cuda/peer_reduce_layout_test.cc walks the kernel's tile
schedule on the CPU for 1,600 random cases (shapes, band layouts, both tile shapes, both
ranks, reduce-scatter and all-reduce) and checks every tile's addresses. Built with g++
against the CUDA headers; skipped (saying why) where either is missing."""
import os
import shutil
import subprocess

import pytest

from _util import REPO, cuda_include


def test_peer_reduce_launch_addresses(tmp_path):
    gxx = shutil.which("g++")
    inc = cuda_include()
    if gxx is None or inc is None:
        pytest.skip(f"needs g++ ({gxx}) and the CUDA headers ({inc})")
    exe = tmp_path / "peer_reduce_layout_test"
    build = subprocess.run([gxx, "-std=c++17", "-O2", f"-I{inc}", f"-I{REPO}",
                            os.path.join(REPO, "tests", "cuda", "peer_reduce_layout_test.cc"),
                            "-o", str(exe)], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:]
    assert "1600 cases, 0 failure(s)" in run.stdout, run.stdout[-2000:]
