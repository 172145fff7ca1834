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
