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


def _setup_function(name, **namespace):
    """One top-level function of setup.py, without running setup() (importing it would)."""
    import ast
    with open(os.path.join(REPO, "setup.py")) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace["os"] = os
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


def test_kernel_build_digest_follows_the_kernels_and_the_call_sequences(tmp_path):
    """The build a tuned plan records (tuning.py warns on another one): it changes with any
    source of xla_ffi/kernels or xla_ffi/comm, and not with the FFI handlers' decoding."""
    import hashlib
    for folder in ("kernels", "comm", "ffi"):
        shutil.copytree(os.path.join(REPO, "xla_ffi", folder), tmp_path / "xla_ffi" / folder)
    from pathlib import Path
    tree = _setup_function("_tree_digest", hashlib=hashlib, ROOT=tmp_path, Path=Path)
    digest = _setup_function("kernel_build_digest", hashlib=hashlib, ROOT=tmp_path,
                             SRC=tmp_path / "xla_ffi", _tree_digest=tree)
    first = digest()
    assert len(first) == 16 and set(first) <= set("0123456789abcdef") and digest() == first
    assert digest("-O3 cutlass-4.2.0.0") != digest("-O0 cutlass-4.2.0.0") != first  # toolchain
    ffi = next((tmp_path / "xla_ffi" / "ffi").glob("*.cc"))
    ffi.write_text(ffi.read_text() + "// a comment\n")
    assert digest() == first
    for changed in (next((tmp_path / "xla_ffi" / "kernels").glob("*.cuh")),
                    next((tmp_path / "xla_ffi" / "comm").glob("*.cc"))):
        before = digest()
        changed.write_text(changed.read_text() + "// a comment\n")
        assert digest() != before, changed
    # the extension built here (if it is) reports one, of the same form
    from jax_flashoverlap import _ext
    if _ext.kernel_build() is not None:
        build = _ext.kernel_build()
        assert len(build) == 16 and set(build) <= set("0123456789abcdef"), build


def test_object_keys_do_not_depend_on_where_the_checkout_is(tmp_path):
    """The object cache (build/obj) is carried between checkouts and machines: the same source,
    headers, flags and versions give the same key wherever the checkout is (the key held the
    source's absolute path, so another checkout recompiled everything), and any of them
    changing gives another key."""
    import hashlib
    from pathlib import Path
    keys = {}
    for where in ("a/checkout", "b/elsewhere"):
        root = tmp_path / where
        src = root / "xla_ffi" / "kernels" / "gemm.cu"
        src.parent.mkdir(parents=True)
        src.write_text("__global__ void k() {}\n")
        key = _setup_function("object_key", hashlib=hashlib, ROOT=root, Path=Path)
        flags = ["-O3", f"-I{root}/include", "-c", str(src), "-o", "OBJ"]
        keys[where] = key(src, flags, "headers", "cutlass-4.2")
        assert key(src, [*flags, "-DX"], "headers", "cutlass-4.2") != keys[where]
        assert key(src, flags, "other headers", "cutlass-4.2") != keys[where]
        assert key(src, flags, "headers", "cutlass-4.3") != keys[where]
        src.write_text("__global__ void k() { }\n")
        assert key(src, flags, "headers", "cutlass-4.2") != keys[where]
    assert keys["a/checkout"] == keys["b/elsewhere"]


def test_build_mode_reads_the_switch_words_and_empty_as_the_default(monkeypatch):
    """JAX_FLASHOVERLAP_BUILD_CUDA takes the words every other switch takes, and unset or empty
    is auto (empty stopped setup.py with an error); a typo is an error naming the variable."""
    import pytest
    mode = _setup_function("_build_mode")
    for value, want in [(None, "auto"), ("", "auto"), ("  ", "auto"), ("AUTO", "auto"),
                        ("1", "1"), ("yes", "1"), ("On", "1"), ("0", "0"), ("no", "0"),
                        ("false", "0")]:
        if value is None:
            monkeypatch.delenv("JAX_FLASHOVERLAP_BUILD_CUDA", raising=False)
        else:
            monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", value)
        assert mode() == want, value
    monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "ye")
    with pytest.raises(SystemExit, match="JAX_FLASHOVERLAP_BUILD_CUDA must be auto, 1 .* got 'ye'"):
        mode()
