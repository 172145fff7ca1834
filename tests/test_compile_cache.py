"""JAX's persistent compilation cache and our ops (CPU; the GPU side is tests/test_gpu_cache.py).

The cache keys a program by its StableHLO text (with the devices, the compile options and
jaxlib's version), so a new process finds a program compiled before only if its lowering comes
out the same. Ours is: every attribute of our custom calls (comm_id a stable hash of the mesh and
the op's settings, the plan's group bounds, the CTA cap) is computed from the program alone, in
any process and under any PYTHONHASHSEED. The global views go through JAX's
`custom_partitioning`, whose call JAX keys by a per-process pointer: the cache misses them in a
new process (JAX's design; README says so).

Each check runs tests/_cache_child.py in fresh processes on 2 simulated CPU devices.
"""
import json
import os
import subprocess
import sys

import jax
import pytest

from _util import REPO, repo_env

CHILD = f"{REPO}/tests/_cache_child.py"


def _child(mode, workdir, **env) -> dict:
    env = repo_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
                   **env)
    env["PYTHONPATH"] = f"{REPO}/tests:{env['PYTHONPATH']}"
    r = subprocess.run([sys.executable, CHILD, mode, str(workdir)], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cuda_lowering_is_the_same_in_every_process(tmp_path):
    """What lets the persistent cache find a program compiled by another process (or by every
    rank of a multi-process job, each of which lowers it): the CUDA lowering of each op, custom
    call attributes included, is the same text in two processes with different hash seeds."""
    first, second = (_child("lower_cuda", tmp_path, JAX_FLASHOVERLAP_FALLBACK="0",
                            PYTHONHASHSEED=seed) for seed in ("1", "2"))
    assert set(first) == {"matmul", "all_reduce", "reduce_scatter", "all_to_all", "all_gather"}
    for op, text in first.items():
        assert "custom_call @flashoverlap_" in text, f"{op}: no custom call: nothing was checked"
        assert "comm_id" in text or op == "matmul", op
        assert second[op] == text, f"{op}: the lowering differs between processes"


def test_persistent_cache_hits_in_a_new_process(tmp_path):
    """A shard_map program with our all-reduce, compiled with the cache on, is found by the next
    process (a hit, no compile) and computes the same values."""
    first = _child("cache", tmp_path)
    second = _child("cache", tmp_path)
    assert (first["misses"], first["hits"]) == (1, 0), first
    assert (second["misses"], second["hits"]) == (0, 1), second
    for run in (first, second):
        assert run["finite"] and run["rel_err"] < 1e-2, run


def test_global_views_miss_the_persistent_cache_across_processes(tmp_path):
    """The premise of README's note: JAX keys `custom_partitioning` (the global views) by a
    per-process pointer, so the next process compiles `row_parallel_matmul` again. If JAX
    changes this, this test fails and the note must go."""
    first = _child("cache_global", tmp_path)
    second = _child("cache_global", tmp_path)
    assert (first["misses"], second["misses"], second["hits"]) == (1, 1, 0), (first, second)
    assert second["finite"] and second["rel_err"] < 1e-2, second


def test_importing_the_package_registers_the_handlers_and_starts_no_backend():
    """A process that runs a program it never lowered (a serialized executable) must find our
    FFI handlers: before, they were registered at the first lowering only, and such a process
    got XLA's "No FFI handler registered for flashoverlap_gemm_all_reduce" (H100, session 42).
    Registering at import must not start a backend (XLA_FLAGS set after the import still count)."""
    from jax_flashoverlap import _ext
    if not _ext.HAS_CUDA_EXT:
        pytest.skip(f"the CUDA extension is not built here ({_ext.EXT_IMPORT_ERROR})")
    code = ("import json, jax_flashoverlap\n"
            "from jax_flashoverlap import _ext\n"
            "from jax._src import xla_bridge\n"
            "print(json.dumps([_ext._registered, bool(xla_bridge._backends)]))\n")
    r = subprocess.run([sys.executable, "-c", code], env=repo_env(JAX_PLATFORMS="cpu"),
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, False]


def test_the_suites_shared_cache_keeps_global_views_out(tmp_path):
    """The cache tests/conftest.py gives a run (scripts/run_tests.sh without a GPU): with
    `_compat.persistent_cache_skips_custom_partitioning()`, a program compiled again after
    jax.clear_caches() comes from the cache, a global view is neither looked up nor stored
    (JAX keys it by an id that can come back for another partitioner: README). Without it (the
    control) the global view is looked up and stored."""
    seen = _child("guard", tmp_path)
    assert seen["installed"], seen
    assert seen["plain"] == [[0, 1], [1, 0]], seen
    assert seen["global"] == [[0, 0], [0, 0]], seen
    assert seen["global_entries"] == seen["plain_entries"] > 0, seen
    (tmp_path / "unguarded").mkdir()
    control = _child("guard", tmp_path / "unguarded")
    assert not control["installed"] and control["plain"] == [[0, 1], [1, 0]], control
    assert all(hits + misses == 1 for hits, misses in control["global"]), control
    assert control["global_entries"] > control["plain_entries"], control


def test_this_run_compiles_through_the_cache_it_was_given():
    """tests/conftest.py turns the run's cache on in every worker, guarded."""
    from jax._src import compilation_cache
    path = os.environ.get("JAX_FLASHOVERLAP_TEST_CACHE_DIR")
    if not path:
        pytest.skip("run without a cache for the run (scripts/run_tests.sh gives one without a GPU)")
    assert jax.config.jax_compilation_cache_dir == path
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert getattr(compilation_cache.get_cache_key, "skips_custom_partitioning", False)
