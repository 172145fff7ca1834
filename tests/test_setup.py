"""setup.py on a machine that does not build the CUDA extension (README: the setup command
works on a CPU machine, where the ops take the reference path)."""
import os
import shutil
import subprocess
import sys

from _util import REPO


def test_build_ext_inplace_without_the_cuda_extension(tmp_path):
    """`setup.py build_ext --inplace` (what scripts/setup_env.sh runs) with the extension not
    built (JAX_FLASHOVERLAP_BUILD_CUDA=0; the same path as no nvcc) succeeds and leaves no
    extension: setuptools failed copying the missing .so into the package (exit 1)."""
    shutil.copy(os.path.join(REPO, "setup.py"), tmp_path)
    shutil.copytree(os.path.join(REPO, "jax_flashoverlap"), tmp_path / "jax_flashoverlap",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = dict(os.environ, JAX_FLASHOVERLAP_BUILD_CUDA="0")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipping the CUDA extension" in r.stdout + r.stderr
    assert not list((tmp_path / "jax_flashoverlap").glob("_xla_ffi*"))


def _setup_function(name):
    """One top-level function of setup.py, without running setup() (importing it would)."""
    import ast
    with open(os.path.join(REPO, "setup.py")) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {"os": os}
    exec(compile(ast.Module([fn], type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace[name]


def test_nvcc_threads_is_a_positive_integer_or_an_error_naming_it(monkeypatch):
    import pytest
    threads = _setup_function("_nvcc_threads")
    monkeypatch.delenv("JAX_FLASHOVERLAP_NVCC_THREADS", raising=False)
    assert threads() == (os.cpu_count() or 2)
    monkeypatch.setenv("JAX_FLASHOVERLAP_NVCC_THREADS", " 3 ")
    assert threads() == 3
    for bad in ("two", "0", "-3", "1.5"):  # was a bare int() error, or silently 1
        monkeypatch.setenv("JAX_FLASHOVERLAP_NVCC_THREADS", bad)
        with pytest.raises(ValueError, match=f"JAX_FLASHOVERLAP_NVCC_THREADS={bad!r} must be a "
                                             "positive integer"):
            threads()
