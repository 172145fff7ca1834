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
  # setuptools builds in build/lib and copies only the module into the package: the note of why
  # it is missing is copied too, where the package reads it
  assert ((tmp_path / "jax_flashoverlap" / "_build_note.txt").read_text() ==
          "skipped: disabled by JAX_FLASHOVERLAP_BUILD_CUDA=0\n")


def _setup_module(root):
  """setup.py's namespace as if it sat in `root` (its ROOT, SRC), without running setup()."""
  import setuptools
  from pathlib import Path
  namespace = {"__file__": str(Path(root) / "setup.py"), "__name__": "setup_under_test"}
  code = compile(open(os.path.join(REPO, "setup.py")).read(), "setup.py", "exec")
  real = setuptools.setup
  setuptools.setup = lambda **kw: None
  try:
    exec(code, namespace)
  finally:
    setuptools.setup = real
  return namespace


def test_nvcc_threads_is_a_positive_integer_or_an_error_naming_it(monkeypatch):
  import pytest
  threads = _setup_module(REPO)["_nvcc_threads"]
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
  for folder in ("kernels", "comm", "ffi"):
    shutil.copytree(os.path.join(REPO, "xla_ffi", folder), tmp_path / "xla_ffi" / folder)
  digest = _setup_module(tmp_path)["kernel_build_digest"]
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
  keys = {}
  for where in ("a/checkout", "b/elsewhere"):
    root = (tmp_path / where).resolve()  # setup.py's ROOT is resolved
    src = root / "xla_ffi" / "kernels" / "gemm.cu"
    src.parent.mkdir(parents=True)
    src.write_text("__global__ void k() {}\n")
    key = _setup_module(root)["object_key"]
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
  mode = _setup_module(REPO)["_build_mode"]
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


def _executable(path, text=""):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text or "#!/bin/sh\nexit 0\n")
  path.chmod(0o755)
  return path


def test_nvcc_and_the_cuda_toolkit_are_found_where_they_are(tmp_path, monkeypatch):
  """nvcc: $CUDA_HOME (else $CUDA_PATH) if it has bin/nvcc, then PATH; the toolkit headers:
  $CUDA_HOME / $CUDA_PATH if they hold include/cuda_runtime.h, else the toolkit above nvcc."""
  mod = _setup_module(tmp_path)
  find, home = mod["_find_nvcc"], mod["_cuda_home"]
  on_path = _executable(tmp_path / "path_bin" / "nvcc")
  monkeypatch.setenv("PATH", str(on_path.parent))
  (tmp_path / "empty" / "bin").mkdir(parents=True)
  monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))  # no nvcc there: PATH's
  monkeypatch.delenv("CUDA_PATH", raising=False)
  assert find() == str(on_path)
  in_cuda_path = _executable(tmp_path / "cuda_path" / "bin" / "nvcc")
  monkeypatch.delenv("CUDA_HOME")
  monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda_path"))
  assert find() == str(in_cuda_path)
  # headers: not in $CUDA_HOME (no include/) nor $CUDA_PATH: the toolkit nvcc is in
  toolkit_nvcc = _executable(tmp_path / "toolkit" / "bin" / "nvcc")
  (tmp_path / "toolkit" / "include").mkdir()
  (tmp_path / "toolkit" / "include" / "cuda_runtime.h").write_text("")
  monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))
  assert home(str(toolkit_nvcc)) == tmp_path / "toolkit"
  (tmp_path / "cuda_path" / "include").mkdir()
  (tmp_path / "cuda_path" / "include" / "cuda_runtime.h").write_text("")
  assert home(str(toolkit_nvcc)) == tmp_path / "cuda_path"


def test_the_cuda_toolkit_pip_installs_is_found_after_path(tmp_path, monkeypatch):
  """`pip install "cuda-toolkit[nvcc,...]"` puts nvcc in site-packages/nvidia/cu13/bin, never
  on PATH, and its libcudart_static.a in nvidia/cu13/lib (the build looked in lib64 only, so
  a CUDA_HOME pointing there failed to link, session 54). Found after $CUDA_HOME and PATH;
  a CUDA 12 wheel's folder (ptxas only) is passed over."""
  mod = _setup_module(tmp_path)
  find, why = mod["_find_nvcc"], mod["_nvcc_not_found"]
  wheel = tmp_path / "site" / "nvidia" / "cu13"
  mod["_package_dir"] = {"nvidia.cu13": wheel}.get
  (tmp_path / "no_nvcc").mkdir()
  monkeypatch.setenv("PATH", str(tmp_path / "no_nvcc"))
  monkeypatch.delenv("CUDA_HOME", raising=False)
  monkeypatch.delenv("CUDA_PATH", raising=False)
  # what `jax[cuda13]` brings: nvcc and what its wheel requires (cudart, nvvm, crt), no cccl
  pip_nvcc = _executable(wheel / "bin" / "nvcc")
  for part in ("include/cuda_runtime.h", "lib/libcudart_static.a", "nvvm/bin/cicc",
               "include/crt/host_defines.h"):
    (wheel / part).parent.mkdir(parents=True, exist_ok=True)
    (wheel / part).write_text("")
  assert find() != str(pip_nvcc)
  assert why().endswith(f'`pip install "cuda-toolkit[nvcc,cudart,crt,nvvm,cccl]"`, then '
                        f"reinstall (pip's CUDA toolkit in {wheel} lacks cccl)")
  (wheel / "include/cccl/cuda/std").mkdir(parents=True)
  (wheel / "include/cccl/cuda/std/version").write_text("")
  assert find() == str(pip_nvcc)
  assert mod["_cuda_home"](find()) == wheel
  assert mod["_cuda_lib_dir"](wheel) == wheel / "lib"
  on_path = _executable(tmp_path / "path_bin" / "nvcc")  # PATH first
  monkeypatch.setenv("PATH", str(on_path.parent))
  assert find() == str(on_path)
  monkeypatch.setenv("PATH", str(tmp_path / "no_nvcc"))
  pip_nvcc.unlink()  # as CUDA 12's wheels: bin/ptxas only
  assert find() != str(pip_nvcc)
  assert why().endswith('`pip install "cuda-toolkit[nvcc,cudart,crt,nvvm,cccl]"`, then reinstall')


def test_dependency_dirs_and_versions(tmp_path, monkeypatch):
  """The include / library dirs of the build's dependencies (NCCL from a namespace package as
  the nvidia wheels are), each missing one named; NCCL's version from whichever wheel is in."""
  import pytest
  from importlib import metadata
  mod = _setup_module(tmp_path)
  # a namespace package (no __init__.py, as nvidia/nccl): its directory
  (tmp_path / "site" / "fo_ns_pkg" / "nccl" / "include").mkdir(parents=True)
  monkeypatch.syspath_prepend(str(tmp_path / "site"))
  assert mod["_package_dir"]("fo_ns_pkg.nccl") == tmp_path / "site" / "fo_ns_pkg" / "nccl"
  assert mod["_package_dir"]("fo_no_such_package.nccl") is None
  nccl = tmp_path / "site" / "fo_ns_pkg" / "nccl"
  cutlass = tmp_path / "cutlass_library"
  (cutlass / "source" / "include" / "cutlass").mkdir(parents=True)
  (cutlass / "source" / "include" / "cutlass" / "cutlass.h").write_text("")
  (nccl / "include" / "nccl.h").write_text("")
  mod["_cuda_home"] = lambda nvcc: tmp_path / "cuda"
  mod["_package_dir"] = {"nvidia.nccl": nccl, "cutlass_library": cutlass}.get
  # the static CUDA runtime the link takes: none, then in lib (pip's, conda's), then lib64 too
  with pytest.raises(RuntimeError, match=r"missing: the CUDA runtime's static library "
                     r"\(libcudart_static.a in .*/cuda/lib64 or lib\)"):
    mod["_dependency_dirs"]("nvcc")
  for name in ("lib", "lib64"):
    (tmp_path / "cuda" / name).mkdir(parents=True)
    (tmp_path / "cuda" / name / "libcudart_static.a").write_text("")
    dirs = mod["_dependency_dirs"]("nvcc")
    assert dirs["cuda_lib"] == tmp_path / "cuda" / name  # lib64 wherever it has one
  assert dirs["cuda_include"] == tmp_path / "cuda" / "include"
  assert (dirs["nccl_include"], dirs["nccl_lib"]) == (nccl / "include", nccl / "lib")
  assert dirs["cutlass"] == cutlass / "source" / "include"
  assert dirs["cutlass_util"] == cutlass / "source" / "tools" / "util" / "include"
  (nccl / "include" / "nccl.h").unlink()  # the package without its headers
  with pytest.raises(RuntimeError, match="missing: nvidia-nccl-cu13"):
    mod["_dependency_dirs"]("nvcc")
  (nccl / "include" / "nccl.h").write_text("")
  (cutlass / "source" / "include" / "cutlass" / "cutlass.h").unlink()
  # pip's default (isolated) build environment has none of them: the message says the fix
  with pytest.raises(RuntimeError, match=r"missing: nvidia-cutlass \(CUTLASS headers\) \(install "
                     r"them; pip sees them only with `pip install --no-build-isolation \.`"):
    mod["_dependency_dirs"]("nvcc")
  installed = {"jaxlib": "0.10.1", "nvidia-cutlass": "4.2.0", "nvidia-nccl-cu12": "2.27.3"}

  def version(dist):
    if dist not in installed:
      raise metadata.PackageNotFoundError(dist)
    return installed[dist]
  monkeypatch.setattr(metadata, "version", version)
  assert mod["_dependency_versions"]() == {"jax": "jaxlib-0.10.1", "cutlass": "cutlass-4.2.0",
                                           "nccl": "nccl-2.27.3"}


def test_sources_and_header_digest(tmp_path):
  """The sources compiled are every .cu and .cc under xla_ffi/; the headers' digest follows a
  header's content and its name (a renamed header is another include)."""
  from pathlib import Path
  src = tmp_path / "xla_ffi"
  for name in ("module.cc", "ffi/handler.cc", "kernels/gemm.cu", "kernels/gemm.cuh",
               "comm/call.h", "comm/notes.txt"):
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text(f"// {name}\n")
  mod = _setup_module(tmp_path)
  assert mod["_sources"]() == sorted(src / n for n in ("module.cc", "ffi/handler.cc",
                                                         "kernels/gemm.cu"))
  first = mod["_tree_digest"](src)
  (src / "comm" / "notes.txt").write_text("not a header")
  assert mod["_tree_digest"](src) == first
  (src / "comm" / "call.h").rename(src / "comm" / "call2.h")
  assert mod["_tree_digest"](src) != first
  assert isinstance(Path(src), Path)


_FAKE_COMPILER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args == ["--version"]:  # as nvcc's: "Cuda compilation tools, release 13.0, V13.0.88"
  print(os.environ.get("FAKE_CC_VERSION", "")); sys.exit(0)
with open(os.environ["FAKE_CC_LOG"], "a") as f:
  f.write(json.dumps([os.path.basename(sys.argv[0])] + args) + "\\n")
if any(os.environ.get("FAKE_CC_FAIL", "@never@") in a for a in args):
  print("error: it fails"); sys.exit(1)
if os.environ.get("FAKE_CC_SAY"):
  print(os.environ["FAKE_CC_SAY"])
open(args[args.index("-o") + 1], "w").write("object")
"""


class _FakeBuild:
  """setup.py's CudaBuildExt on a small xla_ffi/ tree with fake compilers that log each call."""

  def __init__(self, tmp_path, monkeypatch):
    import sys
    import types
    self.root, self.log = tmp_path / "checkout", tmp_path / "cc.log"
    for name in ("module.cc", "ffi/handler.cc", "comm/call.cc", "comm/call.h",
                 "kernels/gemm.cu", "kernels/gemm.cuh"):
      path = self.root / "xla_ffi" / name
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(f"// {name}\n")
    compiler = _FAKE_COMPILER.format(python=sys.executable)
    self.nvcc = str(_executable(tmp_path / "bin" / "nvcc", compiler))
    monkeypatch.setenv("CXX", str(_executable(tmp_path / "bin" / "g++", compiler)))
    monkeypatch.setenv("FAKE_CC_LOG", str(self.log))
    monkeypatch.setenv("JAX_FLASHOVERLAP_NVCC_THREADS", "2")
    self.mod = mod = _setup_module(self.root)
    dirs = {k: tmp_path / k for k in ("cuda_include", "cuda_lib", "xla", "pybind11", "python",
                                      "nccl_include", "nccl_lib", "cutlass", "cutlass_util")}
    mod["_dependency_dirs"] = lambda nvcc: dirs
    self.versions = {"jax": "jaxlib-0.10.1", "cutlass": "cutlass-4.2.0", "nccl": "nccl-2.27.3"}
    mod["_dependency_versions"] = lambda: dict(self.versions)
    mod["_find_nvcc"] = lambda: self.nvcc
    self.cmd = mod["CudaBuildExt"].__new__(mod["CudaBuildExt"])
    self.cmd.get_ext_fullpath = lambda name: str(self.root / "jax_flashoverlap" / "_xla_ffi.so")
    self.ext = types.SimpleNamespace(name=mod["EXT_NAME"])

  def build(self):
    """build_extension; returns {source name: its compile command} and the link command."""
    import json
    self.log.write_text("")
    self.mod["CudaBuildExt"].build_extension(self.cmd, self.ext)
    calls = [json.loads(line) for line in self.log.read_text().splitlines()]
    links = [c for c in calls if "-shared" in c]
    compiled = {os.path.basename(c[c.index("-c") + 1]): c for c in calls if "-c" in c}
    return compiled, links

  def objects(self):
    return sorted(p.name for p in (self.root / "build" / "obj").glob("*.o"))


def test_build_compiles_what_changed_with_its_flags(tmp_path, monkeypatch, capsys):
  """With nvcc found (auto), the build compiles device code with nvcc and the rest with $CXX,
  module.cc with the kernel build's digest, links; then recompiles only what a change touches:
  kernels/ not for other headers nor NCCL's version, host code for jaxlib's; stale objects of
  these sources go, other files stay."""
  import re
  monkeypatch.delenv("JAX_FLASHOVERLAP_BUILD_CUDA", raising=False)
  b = _FakeBuild(tmp_path, monkeypatch)
  everything = {"module.cc", "handler.cc", "call.cc", "gemm.cu"}
  compiled, links = b.build()
  assert set(compiled) == everything and len(links) == 1, (compiled, links)
  assert compiled["gemm.cu"][0] == "nvcc" and "-gencode=arch=compute_90a,code=sm_90a" in \
      compiled["gemm.cu"], compiled["gemm.cu"]
  assert all(compiled[s][0] == "g++" for s in everything - {"gemm.cu"}), compiled
  defines = {s: [a for a in c if a.startswith("-DFO_KERNEL_BUILD=")] for s, c in compiled.items()}
  assert [s for s, d in defines.items() if d] == ["module.cc"], defines
  define = defines["module.cc"][0]
  assert re.fullmatch(r'-DFO_KERNEL_BUILD="[0-9a-f]{16}"', define), define
  assert links[0][links[0].index("-o") + 1] == b.cmd.get_ext_fullpath(b.ext.name)
  assert len(b.objects()) == 4 and all(f"{o}" in " ".join(links[0]) for o in b.objects())
  (b.root / "build" / "obj" / "unrelated.0123.o").write_text("not ours")
  compiled, links = b.build()  # nothing changed: every object cached, linked again
  assert not compiled and len(links) == 1, compiled
  (b.root / "xla_ffi" / "comm" / "call.h").write_text("// changed\n")
  assert set(b.build()[0]) == everything - {"gemm.cu"}
  b.versions["nccl"] = "nccl-2.28.0"  # kernels/ does not include NCCL
  assert set(b.build()[0]) == everything - {"gemm.cu"}
  b.versions["jax"] = "jaxlib-0.11.0"  # the XLA FFI headers: host code only
  assert set(b.build()[0]) == everything - {"gemm.cu"}
  (b.root / "xla_ffi" / "kernels" / "gemm.cuh").write_text("// changed\n")
  assert set(b.build()[0]) == everything  # kernels/ headers: every source includes them
  b.versions["cutlass"] = "cutlass-4.3.0"  # the kernels' toolchain: a new kernel build
  compiled, _ = b.build()
  assert set(compiled) == {"gemm.cu", "module.cc"}, set(compiled)
  assert [a for a in compiled["module.cc"] if a.startswith("-DFO_KERNEL_BUILD=")] != [define]
  objects = b.objects()
  assert "unrelated.0123.o" in objects and len(objects) == 5, objects  # one per source
  assert "skipping" not in capsys.readouterr().out


def test_build_errors_and_the_build_cuda_switch(tmp_path, monkeypatch, capsys):
  """A failed compile or link, or a ptxas warning of a serialized wgmma (C75xx), fails the
  build: an error with JAX_FLASHOVERLAP_BUILD_CUDA=1, a logged skip with auto (the package
  then takes the reference path); =0 or no nvcc (auto) builds nothing."""
  import pytest
  b = _FakeBuild(tmp_path, monkeypatch)
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "1")
  for fail, say, match in [("gemm.cu", "", "compiling xla_ffi/kernels/gemm.cu failed"),
                           ("-shared", "", "linking failed"),
                           ("@never@", "ptxas warning : C7510-D: wgmma serialized",
                            "ptxas warning in")]:
    monkeypatch.setenv("FAKE_CC_FAIL", fail)
    monkeypatch.setenv("FAKE_CC_SAY", say)
    for obj in (b.root / "build" / "obj").glob("*.o"):
      obj.unlink()
    with pytest.raises(RuntimeError, match=match):
      b.build()
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "auto")
  capsys.readouterr()
  for obj in (b.root / "build" / "obj").glob("*.o"):
    obj.unlink()
  b.build()  # the same ptxas warning: not built, logged
  assert "CUDA extension NOT built: ptxas warning in" in capsys.readouterr().out
  monkeypatch.delenv("FAKE_CC_SAY")
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "0")
  assert b.build() == ({}, [])
  assert "disabled by JAX_FLASHOVERLAP_BUILD_CUDA=0" in capsys.readouterr().out
  b.mod["_find_nvcc"] = lambda: None
  b.mod["_pip_toolkit"] = lambda: (None, list(b.mod["PIP_TOOLKIT_PARTS"]))  # none in this env
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "auto")
  assert b.build() == ({}, [])
  assert "skipping the CUDA extension (nvcc not found: set CUDA_HOME" in capsys.readouterr().out
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "1")
  with pytest.raises(RuntimeError, match="JAX_FLASHOVERLAP_BUILD_CUDA=1 but nvcc not found: set "
                     "CUDA_HOME or put nvcc on PATH, or `pip install"):
    b.build()


def test_an_object_whose_compile_did_not_pass_is_never_cached(tmp_path, monkeypatch):
  """A ptxas warning of a serialized wgmma fails the build every time, not once: the object it
  was about had been written, so the next build took it as cached and linked it. A compile
  cut off (a timeout) leaves a .partial.o, which the next build drops, never links."""
  import pytest
  b = _FakeBuild(tmp_path, monkeypatch)
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "1")
  monkeypatch.setenv("FAKE_CC_SAY", "ptxas warning : C7510-D: wgmma serialized")
  for attempt in range(2):
    with pytest.raises(RuntimeError, match="ptxas warning in"):
      b.build()
    assert not [o for o in b.objects() if o.startswith("gemm.")], (attempt, b.objects())
  monkeypatch.delenv("FAKE_CC_SAY")
  compiled, links = b.build()
  assert "gemm.cu" in compiled and len(links) == 1
  objects = b.objects()
  assert len(objects) == 4 and not [o for o in objects if "partial" in o], objects
  cut = b.root / "build" / "obj" / objects[0].replace(".o", ".partial.o")
  cut.write_text("half an object")
  compiled, links = b.build()
  assert not compiled and not cut.exists() and "partial" not in " ".join(links[0])


def test_another_cuda_toolkit_or_compiler_compiles_again(tmp_path, monkeypatch):
  """The object cache (carried between machines) is keyed by the CUDA toolkit the headers
  belong to (CUDART_VERSION) and by each compiler's name: CUDA 12.8 -> 13.0 rebuilt nothing
  (every object reused, module.cc still reporting the old runtime), nor did a switch of $CXX."""
  import re
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "1")
  b = _FakeBuild(tmp_path, monkeypatch)
  header = tmp_path / "cuda_include" / "cuda_runtime_api.h"
  header.parent.mkdir(parents=True, exist_ok=True)
  everything = {"module.cc", "handler.cc", "call.cc", "gemm.cu"}

  def kernel_build(compiled):
    return [a for a in compiled["module.cc"] if re.match("-DFO_KERNEL_BUILD=", a)]
  header.write_text("#define CUDART_VERSION 12080\n")
  compiled, _ = b.build()
  assert set(compiled) == everything
  first = kernel_build(compiled)
  assert b.build()[0] == {}  # the same toolkit: all cached
  header.write_text("/* CUDA 13 */\n#define CUDART_VERSION  13000\n")
  compiled, _ = b.build()
  assert set(compiled) == everything and kernel_build(compiled) != first
  assert b.mod["_cuda_runtime_version"](header.parent) == "cuda-13000"
  assert b.mod["_cuda_runtime_version"](tmp_path / "nowhere") == "cuda-?"
  clang = _executable(tmp_path / "bin" / "clang++", (tmp_path / "bin" / "g++").read_text())
  monkeypatch.setenv("CXX", str(clang))
  compiled, links = b.build()
  assert set(compiled) == everything - {"gemm.cu"} and links[0][0] == "clang++"
  # the same compiler elsewhere (another machine's toolkit path): all cached
  moved = _executable(tmp_path / "elsewhere" / "clang++", clang.read_text())
  monkeypatch.setenv("CXX", str(moved))
  assert b.build()[0] == {}


def test_nvcc_and_headers_of_two_cuda_releases_are_refused(tmp_path, monkeypatch, capsys):
  """$CUDA_HOME with headers but no bin/nvcc, and nvcc found elsewhere (PATH, pip's toolkit),
  would compile one release's device code against another's headers, under an object key naming
  the headers' release only: now an error naming both (with auto, the note says why)."""
  import pytest
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "1")
  b = _FakeBuild(tmp_path, monkeypatch)
  header = tmp_path / "cuda_include" / "cuda_runtime_api.h"
  header.parent.mkdir(parents=True, exist_ok=True)
  header.write_text("#define CUDART_VERSION 13000\n")
  monkeypatch.setenv("FAKE_CC_VERSION", "nvcc: NVIDIA (R) Cuda compiler driver\n"
                     "Cuda compilation tools, release 13.5, V13.5.37")
  assert b.mod["_nvcc_release"](b.nvcc) == "13.5"
  with pytest.raises(RuntimeError, match=r"CUDA toolkit mismatch: .*nvcc is CUDA 13.5 but the "
                     r"headers in .*cuda_include are CUDA 13.0; point CUDA_HOME at one toolkit"):
    b.build()
  assert b.objects() == []  # refused before compiling anything
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "auto")
  capsys.readouterr()
  b.build()
  assert "CUDA extension NOT built: CUDA toolkit mismatch" in capsys.readouterr().out
  note = b.root / "jax_flashoverlap" / b.mod["BUILD_NOTE"]
  assert note.read_text().startswith("failed: CUDA toolkit mismatch")
  header.write_text("#define CUDART_VERSION 13050\n")  # one release: built
  compiled, links = b.build()
  assert "gemm.cu" in compiled and len(links) == 1 and not note.exists()
  # nothing to compare where either says no release: built as before
  monkeypatch.setenv("FAKE_CC_VERSION", "")
  header.write_text("#define CUDART_VERSION 12080\n")
  assert "gemm.cu" in b.build()[0]
  assert b.mod["_nvcc_release"](str(tmp_path / "no_such_nvcc")) is None


def test_an_unbuilt_extension_leaves_a_note_saying_why(tmp_path, monkeypatch, capsys):
  """pip shows a build's output only when it fails (or with -v): an extension skipped or failed
  under auto leaves setup.py's reason beside the package's modules, where the run-time message
  (the ExtensionMissingWarning on a GPU, `info`) reads it; a build that links removes it."""
  import importlib
  ext = importlib.import_module("jax_flashoverlap._ext")
  b = _FakeBuild(tmp_path, monkeypatch)
  note = b.root / "jax_flashoverlap" / "_build_note.txt"
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "auto")
  b.mod["_find_nvcc"] = lambda: None
  b.mod["_pip_toolkit"] = lambda: (None, list(b.mod["PIP_TOOLKIT_PARTS"]))  # none in this env
  b.build()
  said = ('skipped: nvcc not found: set CUDA_HOME or put nvcc on PATH, or `pip install '
          '"cuda-toolkit[nvcc,cudart,crt,nvvm,cccl]"`, then reinstall')
  assert note.read_text() == said + "\n"
  reason = ext.not_built_reason(str(note))
  assert reason == f"not built (no jax_flashoverlap/_xla_ffi*.so; setup.py said: {said})"
  b.mod["_find_nvcc"] = lambda: b.nvcc
  b.build()  # links
  assert not note.exists()
  monkeypatch.setenv("FAKE_CC_FAIL", "gemm.cu")
  for obj in (b.root / "build" / "obj").glob("*.o"):
    obj.unlink()
  b.build()
  assert note.read_text() == "failed: compiling xla_ffi/kernels/gemm.cu failed:\n"
  monkeypatch.setenv("JAX_FLASHOVERLAP_BUILD_CUDA", "0")
  b.build()
  assert note.read_text() == "skipped: disabled by JAX_FLASHOVERLAP_BUILD_CUDA=0\n"
  assert "see README" in ext.not_built_reason(str(tmp_path / "no_note.txt"))


def test_no_sources_is_an_error_not_an_empty_module(tmp_path):
  """A tree without xla_ffi's sources (a source distribution without MANIFEST.in's graft) is an
  error: the link alone made a module that failed at import."""
  import pytest
  (tmp_path / "xla_ffi").mkdir()
  with pytest.raises(RuntimeError, match="no CUDA sources under .*xla_ffi"):
    _setup_module(tmp_path)["_sources"]()


def test_the_source_distribution_carries_every_cuda_source(tmp_path):
  """`setup.py sdist` (what `python -m build` builds its wheel from) holds every tracked file
  of xla_ffi/: its Extension lists no sources, so without MANIFEST.in it held none."""
  import tarfile
  tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
  for name in tracked:
    if name.startswith(("xla_ffi/", "jax_flashoverlap/")) or name in (
        "setup.py", "MANIFEST.in", "README.md"):
      (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy(os.path.join(REPO, name), tmp_path / "src" / name)
  r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
                     cwd=tmp_path / "src", capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  (archive,) = (tmp_path / "dist").glob("*.tar.gz")
  with tarfile.open(archive) as tar:
    held = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
  wanted = {n for n in tracked if n.startswith("xla_ffi/")}
  assert len(wanted) > 50 and wanted <= held, sorted(wanted - held)
  assert "jax_flashoverlap/configs/h200_x2.json" in held
  assert "jax_flashoverlap/py.typed" in held


def test_the_built_package_carries_py_typed(tmp_path):
  """`build_py` (what a wheel and an install hold) copies jax_flashoverlap/py.typed, the PEP 561
  marker without which mypy and pyright take the installed package as untyped."""
  shutil.copy(os.path.join(REPO, "setup.py"), tmp_path)
  shutil.copytree(os.path.join(REPO, "jax_flashoverlap"), tmp_path / "jax_flashoverlap",
                  ignore=shutil.ignore_patterns("*.so", "__pycache__"))
  r = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path / "lib")],
                     cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  built = tmp_path / "lib" / "jax_flashoverlap"
  assert (built / "py.typed").is_file() and (built / "configs" / "h200_x2.json").is_file()


def test_every_kernel_instance_is_declared_and_prepared_up_front():
  """Each signaling_gemm_<dtype>_<tile>*.cu defines one InstanceOps getter; the launcher can
  pick it only if signaling_gemm_instances.h declares it, and PrepareSignalingGemms must load
  it when communicators are made (a lazy first load inside a call can block behind NCCL
  kernels that wait for a peer, where the watchdog never sees it). Session 46's four halves
  instances were first left out of that list."""
  import pathlib
  import re
  kernels = pathlib.Path(REPO) / "xla_ffi" / "kernels"
  defined = set()
  for path in sorted(kernels.glob("signaling_gemm_*_*.cu")):
    names = re.findall(r"FO_DEFINE_SIGNALING_GEMM_INSTANCE(?:_FOR)?\((\w+),", path.read_text())
    assert len(names) == 1, (path.name, names)
    defined.update(names)
  assert len(defined) >= 22
  declared = set(re.findall(r"const InstanceOps& (\w+)\(\);",
                            (kernels / "signaling_gemm_instances.h").read_text()))
  launcher = (kernels / "signaling_gemm.cu").read_text()
  prepared = re.search(r"kAll\[\] = \{(.*?)\};", launcher, re.S)
  assert prepared is not None, "PrepareSignalingGemms' kAll list not found"
  assert defined == declared
  assert defined == set(re.findall(r"\w+", prepared.group(1)))
