"""Shared pytest setup for jax_flashoverlap.

XLA_FLAGS must be set before JAX initialises its CPU backend, so this happens at the very top of
the conftest (pytest imports conftest.py before any test module). An existing XLA_FLAGS is kept
(the device-count flag is appended), and nothing is added when a GPU platform is requested
through JAX_PLATFORMS (the GPU tests then see the real devices).
"""
import os

_FORCE_FLAG = "--xla_force_host_platform_device_count=8"


def _gpu_platform_requested() -> bool:
    plats = (os.environ.get("JAX_PLATFORMS", "") + "," + os.environ.get("JAX_PLATFORM_NAME", "")).lower()
    return any(p in plats for p in ("cuda", "gpu", "rocm"))


if not _gpu_platform_requested():
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = (_flags + " " + _FORCE_FLAG).strip()

import jax  # noqa: E402  (must come after XLA_FLAGS)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import zlib  # noqa: E402

from _util import make_mesh_1d, make_mesh_2d, use_persistent_cache  # noqa: E402


def _use_the_runs_compile_cache():
    """scripts/run_tests.sh without a GPU names one directory for the whole run in
    JAX_FLASHOVERLAP_TEST_CACHE_DIR: every worker compiles through it (programs of any size),
    so a program several tests compile alike is compiled once. Programs holding our global
    views stay out of it (`_compat.persistent_cache_skips_custom_partitioning` says why).
    Subprocesses the tests start do not use it: they run without this conftest."""
    path = os.environ.get("JAX_FLASHOVERLAP_TEST_CACHE_DIR")
    if not path:
        return
    try:
        from jax_flashoverlap import _compat
        why = None if _compat.persistent_cache_skips_custom_partitioning() else (
            "this JAX has no hook to keep custom_partitioning programs out of it")
    except Exception as e:  # noqa: BLE001  (a broken package fails its tests, not this hook)
        why = f"{type(e).__name__}: {e}"
    if why:
        import warnings
        warnings.warn(f"JAX_FLASHOVERLAP_TEST_CACHE_DIR={path}: not used ({why})")
        return
    use_persistent_cache(path)


def pytest_configure(config):
    _use_the_runs_compile_cache()
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and the built CUDA extension")
    config.addinivalue_line("markers", "multigpu: needs >= 2 GPUs and the built CUDA extension")
    config.addinivalue_line("markers", "slow: slower CPU tests (subprocesses)")


@pytest.fixture(scope="session")
def fo():
    """The package under test, imported lazily so that a missing/broken package fails the tests
    that need it (loudly, as errors) instead of breaking collection of the whole suite."""
    import jax_flashoverlap

    return jax_flashoverlap


@pytest.fixture(autouse=True)
def _poison_outputs_on_gpu(request, monkeypatch):
    """GPU tests run with JAX_FLASHOVERLAP_POISON_OUTPUTS=1: every custom call lowered in them
    fills its outputs (and its communicator's workspace) with NaN before it runs, so a tile our
    kernels leave unwritten shows as NaN (XLA's output buffers cannot be pre-filled from JAX).
    Subprocesses they start inherit it. CPU tests keep the default (off)."""
    if request.node.get_closest_marker("gpu") or request.node.get_closest_marker("multigpu"):
        monkeypatch.setenv("JAX_FLASHOVERLAP_POISON_OUTPUTS", "1")


@pytest.fixture
def no_fallback(monkeypatch):
    """Every shape lowers to our kernels on CUDA (no cost-model fallback to XLA's ops)."""
    monkeypatch.setenv("JAX_FLASHOVERLAP_FALLBACK", "0")
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the test id: different inputs in every test, reproducible."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=[2, 4, 8], ids=lambda n: f"tp{n}")
def tp_mesh(request):
    """1-D mesh ('tp',) of 2, 4 and 8 devices."""
    return make_mesh_1d(request.param)


@pytest.fixture
def mesh4():
    return make_mesh_1d(4)


@pytest.fixture
def mesh2d():
    """2-D mesh (dp=2, tp=4); collectives run over 'tp' only."""
    return make_mesh_2d(2, 4)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """The tuned-config folder (JAX_FLASHOVERLAP_CONFIG_DIR's variable) is the test's own."""
    from jax_flashoverlap import tuning
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True, scope="session")
def _subprocess_tmpdir(tmp_path_factory):
    """Subprocesses' temporary files go under pytest's own folder (kept for its last 3 runs):
    the launcher keeps a failed launch's logs in a temporary folder, and the tests that fail
    launches on purpose left hundreds of them in /tmp."""
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("subprocess_tmp"))
    yield
