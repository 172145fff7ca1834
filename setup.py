"""Build of jax_flashoverlap and its optional CUDA extension `jax_flashoverlap._xla_ffi`.

The extension is built when nvcc is found (JAX_FLASHOVERLAP_BUILD_CUDA=auto, the default),
always (=1: a build failure is an error, as in CI) or never (=0). Headers come from:
  XLA FFI   jax.ffi.include_dir()
  NCCL      the nvidia-nccl-cu13 / -cu12 wheel (nvidia/nccl/include)
  CUTLASS   the nvidia-cutlass wheel (cutlass_library/source/include)
Objects are cached under build/obj by a hash of their source, the project's headers, the
compiler's name and flags, the dependencies' versions and the CUDA toolkit's (CUDART_VERSION,
which must be nvcc's own release), so a rebuild (or a build on the GPU machine with build/
carried over) only compiles what changed; an object enters the cache only once its compile
passed.
JAX_FLASHOVERLAP_NVCC_THREADS sets parallel compile jobs.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SRC = ROOT / "xla_ffi"
EXT_NAME = "jax_flashoverlap._xla_ffi"
CUDA_ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]


def _nvcc_threads() -> int:
  """JAX_FLASHOVERLAP_NVCC_THREADS: parallel nvcc jobs (default: the CPU count); a value that
  is not a positive integer is an error naming the variable (it was a bare int() error, or
  silently 1 for 0 / -3)."""
  raw = os.environ.get("JAX_FLASHOVERLAP_NVCC_THREADS", "").strip()
  if not raw:
    return os.cpu_count() or 2
  try:
    threads = int(raw)
  except ValueError:
    threads = 0
  if threads < 1:
    raise ValueError(f"environment variable JAX_FLASHOVERLAP_NVCC_THREADS={raw!r} must be a "
                     "positive integer (parallel nvcc jobs; unset: the CPU count)")
  return threads


def _log(msg: str) -> None:
  print(f"[jax_flashoverlap build] {msg}", flush=True)


def _build_mode() -> str:
  # Unset or empty is the default, as for every other switch; the on/off words are theirs too.
  mode = (os.environ.get("JAX_FLASHOVERLAP_BUILD_CUDA") or "auto").strip().lower() or "auto"
  words = {"1": "1", "on": "1", "true": "1", "yes": "1", "0": "0", "off": "0", "false": "0",
           "no": "0", "auto": "auto"}
  if mode not in words:
    raise SystemExit("JAX_FLASHOVERLAP_BUILD_CUDA must be auto, 1 (on / true / yes) or 0 "
                     f"(off / false / no), got {mode!r}")
  return words[mode]


# The CUDA toolkit pip installs (`pip install "cuda-toolkit[nvcc,cudart,crt,nvvm,cccl]"`) lands
# in site-packages/nvidia/cu13, one wheel per part; `jax[cuda13]` requires nvcc (with cudart, nvvm
# and crt), and cccl, whose headers CUTLASS includes, only through another package (nvshmem 3.8
# on 2026-12-07; not every environment has it). CUDA 12's nvcc wheels hold no nvcc.
PIP_TOOLKIT_PARTS = {"nvcc": "bin/nvcc", "cudart": "lib/libcudart_static.a",
                     "crt": "include/crt/host_defines.h", "nvvm": "nvvm/bin/cicc",
                     "cccl": "include/cccl/cuda/std/version"}
PIP_TOOLKIT = f"cuda-toolkit[{','.join(PIP_TOOLKIT_PARTS)}]"


def _pip_toolkit() -> tuple[Path | None, list]:
  """(nvidia/cu13 in this environment or None, the parts of PIP_TOOLKIT it lacks)."""
  home = _package_dir("nvidia.cu13")
  if home is None:
    return None, list(PIP_TOOLKIT_PARTS)
  return home, [part for part, path in PIP_TOOLKIT_PARTS.items() if not (home / path).exists()]


def _find_nvcc() -> str | None:
  """$CUDA_HOME / $CUDA_PATH, then PATH, then the CUDA toolkit pip installed into this
  environment where it is whole (its nvcc is never on PATH), then /usr/local/cuda."""
  cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
  if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
    return str(Path(cuda_home) / "bin" / "nvcc")
  found = shutil.which("nvcc")
  if found:
    return found
  home, lacking = _pip_toolkit()
  if home is not None and not lacking:
    return str(home / "bin" / "nvcc")
  default = Path("/usr/local/cuda/bin/nvcc")
  return str(default) if default.exists() else None


def _nvcc_not_found() -> str:
  """Why no nvcc was found, with the fix; names what pip's toolkit here lacks, if it is here."""
  home, lacking = _pip_toolkit()
  why = ("nvcc not found: set CUDA_HOME or put nvcc on PATH, or `pip install "
         f"\"{PIP_TOOLKIT}\"`, then reinstall")
  if home is not None and "nvcc" not in lacking:
    why += f" (pip's CUDA toolkit in {home} lacks {', '.join(lacking)})"
  return why


def _nvcc_release(nvcc: str) -> str | None:
  """The CUDA release nvcc reports (`nvcc --version`: "release 13.0, V13.0.88" -> "13.0");
  None where it says none or does not run."""
  try:
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.SubprocessError):
    return None
  found = re.search(r"release (\d+)\.(\d+)", proc.stdout)
  return f"{found.group(1)}.{found.group(2)}" if found else None


def _check_toolkit_matches(nvcc: str, cuda_include: Path) -> None:
  """nvcc and the headers (and static runtime) the build takes must be one CUDA release:
  $CUDA_HOME / $CUDA_PATH holding headers but no bin/nvcc, with nvcc found elsewhere (PATH,
  pip's toolkit), would compile one release's device code against another's runtime API,
  under an object key that names the headers' release only."""
  release, version = _nvcc_release(nvcc), _cudart_version(cuda_include)
  if release is None or version is None:
    return  # one of them names no release (an unusual toolkit): nothing to compare
  headers = f"{version // 1000}.{version % 1000 // 10}"
  if headers != release:
    raise RuntimeError(
        f"CUDA toolkit mismatch: {nvcc} is CUDA {release} but the headers in {cuda_include} "
        f"are CUDA {headers}; point CUDA_HOME at one toolkit (its bin/nvcc, include/ and "
        "lib64/ or lib/)")


def _cuda_lib_dir(cuda_home: Path) -> Path | None:
  """Where the toolkit keeps libcudart_static.a, which the extension links: lib64 in NVIDIA's
  installers, lib in pip's toolkit (nvidia/cu13/lib) and conda's; None where neither has it."""
  for name in ("lib64", "lib"):
    if (cuda_home / name / "libcudart_static.a").exists():
      return cuda_home / name
  return None


def _cuda_home(nvcc: str) -> Path:
  candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                str(Path(nvcc).resolve().parent.parent), "/usr/local/cuda"]
  for c in candidates:
    if c and (Path(c) / "include" / "cuda_runtime.h").exists():
      return Path(c)
  raise RuntimeError(f"no CUDA toolkit headers found next to {nvcc} (set CUDA_HOME)")


def _package_dir(name: str) -> Path | None:
  try:
    spec = importlib.util.find_spec(name)
  except ModuleNotFoundError:
    return None
  if spec is None:
    return None
  locations = list(spec.submodule_search_locations or [])
  return Path(locations[0]) if locations else Path(spec.origin).parent


def _dependency_dirs(nvcc: str) -> dict:
  """Include and library dirs of every dependency; raises with a clear message if missing."""
  cuda_home = _cuda_home(nvcc)
  missing = []
  try:
    import jax.ffi
    xla_include = Path(jax.ffi.include_dir())
  except ImportError:
    xla_include = None
    missing.append("jax (for the XLA FFI headers: pip install jax)")
  try:
    import pybind11
    pybind_include = Path(pybind11.get_include())
  except ImportError:
    pybind_include = None
    missing.append("pybind11")
  nccl = _package_dir("nvidia.nccl")
  if nccl is None or not (nccl / "include" / "nccl.h").exists():
    missing.append("nvidia-nccl-cu13 (or -cu12) for NCCL headers and libnccl.so.2")
  cuda_lib = _cuda_lib_dir(cuda_home)
  if cuda_lib is None:
    missing.append(f"the CUDA runtime's static library (libcudart_static.a in {cuda_home}/lib64 "
                   "or lib)")
  cutlass = _package_dir("cutlass_library")
  cutlass_include = cutlass / "source" / "include" if cutlass else None
  if cutlass_include is None or not (cutlass_include / "cutlass" / "cutlass.h").exists():
    missing.append("nvidia-cutlass (CUTLASS headers)")
  if missing:
    raise RuntimeError("cannot build the CUDA extension; missing: " + "; ".join(missing) +
                       " (install them; pip sees them only with `pip install "
                       "--no-build-isolation .`: its default build environment has none)")
  return {
      "cuda_include": cuda_home / "include",
      "cuda_lib": cuda_lib,
      "xla": xla_include,
      "pybind11": pybind_include,
      "python": Path(sysconfig.get_paths()["include"]),
      "nccl_include": nccl / "include",
      "nccl_lib": nccl / "lib",
      "cutlass": cutlass_include,
      "cutlass_util": cutlass / "source" / "tools" / "util" / "include",
  }


def _dependency_versions() -> dict:
  from importlib import metadata

  def version(dist):
    try:
      return metadata.version(dist)
    except metadata.PackageNotFoundError:
      return "?"
  nccl = next((version(d) for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12") if version(d) != "?"),
              "?")
  return {"jax": "jaxlib-" + version("jaxlib"), "cutlass": "cutlass-" + version("nvidia-cutlass"),
          "nccl": "nccl-" + nccl}


def _cudart_version(cuda_include: Path) -> int | None:
  """CUDART_VERSION as the headers define it (e.g. 13000); None where no header says."""
  try:
    text = (Path(cuda_include) / "cuda_runtime_api.h").read_text(errors="replace")
  except OSError:
    return None
  found = re.search(r"^#define\s+CUDART_VERSION\s+(\d+)", text, re.M)
  return int(found.group(1)) if found else None


def _cuda_runtime_version(cuda_include: Path) -> str:
  """The CUDA toolkit the build compiles against, as its headers say (CUDART_VERSION, e.g.
  13000; module.cc reports it): part of every object's key, so that another toolkit (CUDA 12
  -> 13 with build/ carried over) compiles everything again. "cuda-?" where no header says."""
  version = _cudart_version(cuda_include)
  return f"cuda-{'?' if version is None else version}"


def _sources() -> list:
  found = sorted(p for p in SRC.rglob("*") if p.suffix in (".cu", ".cc"))
  if not found:  # else the link makes an empty module that fails at import
    raise RuntimeError(f"no CUDA sources under {SRC} (a source distribution made without "
                       "MANIFEST.in, which carries xla_ffi/?)")
  return found


def _tree_digest(folder: Path, suffixes=(".h", ".cuh", ".hpp", ".inl")) -> str:
  """Digest of the files under `folder` with these suffixes (by default the headers), each
  named relative to the checkout."""
  h = hashlib.sha256()
  for p in sorted(folder.rglob("*")):
    if p.suffix in suffixes:
      h.update(str(p.relative_to(ROOT)).encode())
      h.update(p.read_bytes())
  return h.hexdigest()


def kernel_build_digest(toolchain: str = "") -> str:
  """What a tuned plan's speed depends on in the build: every source and header of the kernels
  and the overlapped-call sequences (xla_ffi/kernels, xla_ffi/comm: all of them, the error
  paths' too, so any edit there counts), and `toolchain` (the device code's flags and the
  CUTLASS version: what the kernels' object keys hold). Baked into the extension (build_info()["kernel_build"]); the tuner
  records it in each entry, and a lookup of an entry measured on another build warns
  (jax_flashoverlap.tuning). NCCL is loaded at run time: info() reports its version."""
  h = hashlib.sha256(toolchain.encode() + b"\0")
  for folder in (SRC / "kernels", SRC / "comm"):
    h.update(_tree_digest(folder, (".cu", ".cc", ".h", ".cuh")).encode())
  return h.hexdigest()[:16]


def object_key(src: Path, flags: list, headers: str, deps: str) -> str:
  """An object's cache key: what it depends on (its source, the headers' digest, the flags,
  `deps`: dependency versions), not where things are: include dirs are dropped and the source
  is named relative to the checkout, so objects built in one checkout or on one machine are
  reused in another (build/ carried to the GPU machine)."""
  where = str(src)
  flags = [str(src.relative_to(ROOT)) if str(c) == where else str(c)
           for c in flags if not str(c).startswith("-I")]
  return hashlib.sha256(src.read_bytes() + headers.encode() + " ".join(flags).encode() +
                        deps.encode()).hexdigest()[:20]


# Written beside the package's modules when the extension is not built, saying why: pip shows
# a build's output only on failure or with -v, so the reason reaches the user at run time
# (jax_flashoverlap._ext: the ExtensionMissingWarning on a GPU, `python -m jax_flashoverlap.info`).
BUILD_NOTE = "_build_note.txt"


class CudaBuildExt(build_ext):
  """Compiles xla_ffi/ with nvcc (device code) and the host compiler, links one module."""

  def build_extension(self, ext):
    mode = _build_mode()
    nvcc = _find_nvcc()
    note = Path(self.get_ext_fullpath(ext.name)).parent / BUILD_NOTE
    note.unlink(missing_ok=True)
    if mode == "0" or (mode == "auto" and nvcc is None):
      why = "disabled by JAX_FLASHOVERLAP_BUILD_CUDA=0" if mode == "0" else _nvcc_not_found()
      _log(f"skipping the CUDA extension ({why}); ops will use the reference path")
      self._write_note(note, f"skipped: {why}")
      return
    try:
      if nvcc is None:
        raise RuntimeError("JAX_FLASHOVERLAP_BUILD_CUDA=1 but " + _nvcc_not_found())
      self._build(ext, nvcc)
    except Exception as err:
      if mode == "1":
        raise
      _log(f"CUDA extension NOT built: {err}")
      # The first line: a compiler's whole output stays in the build log.
      self._write_note(note, "failed: " + str(err).splitlines()[0])

  def run(self):
    super().run()
    # --inplace (setup_env.sh, editable installs): setuptools builds in build/lib and copies only
    # the module into the package; the note (or its absence) goes there too.
    if self.inplace or getattr(self, "editable_mode", False):
      package = Path(self.get_finalized_command("build_py").get_package_dir("jax_flashoverlap"))
      built, source = Path(self.build_lib) / "jax_flashoverlap" / BUILD_NOTE, package / BUILD_NOTE
      if built.exists() and built.resolve() != source.resolve():
        shutil.copyfile(built, source)
      elif not built.exists():
        source.unlink(missing_ok=True)

  @staticmethod
  def _write_note(note: Path, text: str) -> None:
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(text + "\n")

  def _build(self, ext, nvcc: str) -> None:
    dirs = _dependency_dirs(nvcc)
    includes = [ROOT, dirs["xla"], dirs["cuda_include"], dirs["nccl_include"], dirs["cutlass"],
                dirs["cutlass_util"], dirs["pybind11"], dirs["python"]]
    inc_flags = [f"-I{p}" for p in includes]
    common = ["-O3", "-DNDEBUG", "-std=c++17", "-fPIC"]
    cu_flags = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
                "-Xcompiler=-fPIC", "-Xptxas=--warn-on-spills", *CUDA_ARCH_FLAGS]
    cxx = os.environ.get("CXX", "g++")
    obj_dir = ROOT / "build" / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)
    # Kernels include only kernels/ headers: other headers changing does not rebuild them.
    headers_all, headers_kernels = _tree_digest(SRC), _tree_digest(SRC / "kernels")

    versions = _dependency_versions()
    cuda = _cuda_runtime_version(dirs["cuda_include"])
    _check_toolkit_matches(nvcc, dirs["cuda_include"])
    # module.cc reports it; as a flag it is in module.cc's object key, so that rebuilds. The
    # toolchain as the kernels' object keys see it (their flags, CUTLASS, the CUDA toolkit), so
    # a digest matches the objects in use wherever they were compiled (build/ carried to the
    # GPU machine).
    toolchain = " ".join([*cu_flags, versions["cutlass"], cuda])
    build_define = f'-DFO_KERNEL_BUILD="{kernel_build_digest(toolchain)}"'

    def command(src: Path, obj: Path) -> list:
      if src.suffix == ".cu":
        return [nvcc, *cu_flags, *inc_flags, "-c", str(src), "-o", str(obj)]
      extra = [build_define] if src.name == "module.cc" else []
      return [cxx, *common, *extra, *inc_flags, "-c", str(src), "-o", str(obj)]

    jobs = []
    for src in _sources():
      deps = (versions["cutlass"] if src.suffix == ".cu" else versions["jax"]) + cuda
      if src.name == "module.cc":
        deps += sys.version
      if "kernels" not in src.parts:  # kernels/ does not include NCCL
        deps += versions["nccl"]
      headers = headers_kernels if "kernels" in src.parts else headers_all
      # The compiler by its name (nvcc, g++, clang++), not its path: carried objects stay valid
      # on a machine whose toolkit sits elsewhere; the toolkit's version is in `deps`.
      compiler, *flags = command(src, Path("OBJ"))
      key = object_key(src, [Path(compiler).name, *flags], headers, deps)
      obj = obj_dir / f"{src.stem}.{key}.o"
      jobs.append((src, obj, command(src, obj.with_suffix(".partial.o"))))

    # Drop stale objects of these sources (other keys) so the cache stays small to carry.
    current = {o.name for _, o, _ in jobs}
    stems = {src.stem for src, _, _ in jobs}
    for old in obj_dir.glob("*.o"):
      if old.name not in current and old.name.split(".")[0] in stems:
        old.unlink()

    def compile_one(job):
      # Compiled to a .partial.o, renamed to the cached name only once it passed: an object
      # whose compile failed, warned of a serialized wgmma or was cut off (a timeout) is never
      # taken as cached by the next build (a stale .partial.o goes with the stale objects).
      src, obj, cmd = job
      if obj.exists():
        return f"cached {src.relative_to(ROOT)}"
      partial = obj.with_suffix(".partial.o")  # what cmd writes
      try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
          raise RuntimeError(f"compiling {src.relative_to(ROOT)} failed:\n{' '.join(cmd)}\n{out}")
        # A wgmma serialized by ptxas (C75xx) silently costs most of the GEMM's speed.
        if "C75" in out:
          raise RuntimeError(f"ptxas warning in {src.relative_to(ROOT)} (treated as error):\n{out}")
        os.replace(partial, obj)
      finally:
        partial.unlink(missing_ok=True)
      return f"compiled {src.relative_to(ROOT)}" + (f"\n{out}" if out.strip() else "")

    threads = _nvcc_threads()
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
      for msg in pool.map(compile_one, jobs):
        _log(msg)

    target = Path(self.get_ext_fullpath(ext.name))
    target.parent.mkdir(parents=True, exist_ok=True)
    nccl_lib = dirs["nccl_lib"]
    link = [cxx, "-shared", "-o", str(target), *[str(o) for _, o, _ in jobs],
            f"-L{dirs['cuda_lib']}", "-lcudart_static", "-ldl", "-lrt", "-lpthread",
            f"-L{nccl_lib}", "-l:libnccl.so.2",
            # The wheel's NCCL, wherever the venv is; and the one next to an installed package.
            f"-Wl,-rpath,{nccl_lib}", "-Wl,-rpath,$ORIGIN/../nvidia/nccl/lib"]
    proc = subprocess.run(link, capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f"linking failed:\n{' '.join(link)}\n{proc.stdout}{proc.stderr}")
    _log(f"built {target}")


setup(
    name="jax_flashoverlap",
    version="0.1.0",
    description="Tile-wise overlap of tensor-parallel GEMMs and their collectives "
                "(FlashOverlap) for JAX on NVIDIA GPUs",
    packages=find_packages(include=["jax_flashoverlap", "jax_flashoverlap.*"]),
    # py.typed: the package's hints are for type checkers too (PEP 561; without it mypy and
    # pyright take the whole package as untyped)
    package_data={"jax_flashoverlap": ["configs/*.json", "py.typed"]},
    python_requires=">=3.11",  # jax 0.10 (the floor below) and jaxlib need 3.11: no 3.10 wheels
    install_requires=["jax>=0.10", "numpy"],
    extras_require={
        "cuda12": ["jax[cuda12]", "nvidia-nccl-cu12", "nvidia-cutlass", "pybind11"],
        "cuda13": ["jax[cuda13]", "nvidia-nccl-cu13", "nvidia-cutlass", "pybind11"],
        "build": ["pybind11", "nvidia-nccl-cu13", "nvidia-cutlass"],
        # jax_flashoverlap/_flax_refusals.py MIN_FLAX: older flax does not run on jax >= 0.10
        "flax": ["flax>=0.12.2"],
        "test": ["pytest", "flax>=0.12.2"],
    },
    # optional: when the extension is not built (no nvcc, =0), --inplace copies nothing.
    ext_modules=[Extension(EXT_NAME, sources=[], optional=True)],
    cmdclass={"build_ext": CudaBuildExt},
    zip_safe=False,
)
