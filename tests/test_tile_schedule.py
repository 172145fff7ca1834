"""The signaling GEMM's tile schedule (xla_ffi/kernels/tile_schedule.h) is host code too:
tests/cuda/schedule_test.cc checks on the CPU, for 3000 random layouts (rank blocks, bands,
tile shapes, panels, row rotations, flag blocks, serpentine on and off), that every output tile
is computed exactly once, stored where the group layout says, groups are handed out in order,
and the serpentine alternates column directions; and the split tail's pieces (every K tile
of every unit once, partial stores before the adds that wait for them) and that the cost
model's mirror of the launcher's split rule agrees with it. Built with g++ against the CUDA
headers; skipped (saying why) where either is missing."""
import os
import shutil
import subprocess

import pytest

from _util import REPO, cuda_include

@pytest.fixture(scope="module")
def schedule_test(tmp_path_factory):
    gxx = shutil.which("g++")
    inc = cuda_include()
    if gxx is None or inc is None:
        pytest.skip(f"needs g++ ({gxx}) and the CUDA headers ({inc})")
    exe = tmp_path_factory.mktemp("schedule") / "schedule_test"
    build = subprocess.run([gxx, "-std=c++17", "-O2", f"-I{inc}", f"-I{REPO}",
                            os.path.join(REPO, "tests", "cuda", "schedule_test.cc"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-4000:]
    return exe


def test_split_tail_model_matches_the_launcher(schedule_test):
    """tile_schedule.split_tail (the cost model's mirror) gives PlanSplitTail's answer (the
    launcher's rule, tile_schedule.h) on random grids and on the edges of its conditions."""
    import random

    from jax_flashoverlap import tile_schedule as ts
    rng = random.Random(7)
    cases = [(1024, 66, 64, 66), (512, 66, 64, 66), (1056, 66, 64, 66), (1024, 66, 15, 66),
             (1024, 66, 16, 66), (67, 66, 64, 66), (66, 66, 64, 66), (60, 66, 64, 66),
             (1024, 66, 64, 65), (1024, 66, 64, 64), (3, 2, 16, 1), (5, 1, 64, 66)]
    cases += [(rng.randint(1, 5000), rng.randint(1, 140), rng.randint(1, 400), rng.randint(0, 300))
              for _ in range(2000)]
    stdin = "".join(f"{u} {c} {k} {s}\n" for u, c, k, s in cases)
    run = subprocess.run([str(schedule_test), "split"], input=stdin, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = [tuple(map(int, line.split())) for line in run.stdout.splitlines()]
    assert len(got) == len(cases)
    split = 0
    for case, launcher in zip(cases, got):
        assert ts.split_tail(*case) == launcher, case
        split += launcher[0] > 0
    assert 300 < split < 1900  # both answers are well represented


def test_tile_schedule_host_checks(schedule_test):
    exe = schedule_test
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:]
    assert "3001 layouts, 0 failure(s)" in run.stdout, run.stdout[-2000:]
