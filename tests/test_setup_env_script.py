"""scripts/setup_env.sh, the README's setup command on a fresh machine: the venv it makes
(--system-site-packages, a parent venv's packages inherited), which packages it installs and
when (pytest-xdist only without a GPU, the .whl/ folder's wheels first and without their
dependencies, the rest from the index), the build switch passed on, the checkout made
importable, and a failed install failing the script. Run against fakes: a base python whose
`-m venv` makes a fake venv python that logs every call (pip only logged, setup.py not run,
`-c` snippets run by this interpreter with stub modules only), and a fake nvidia-smi."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

from _fake_tools import nvidia_smi, write_nvidia_smi

ROOT = pathlib.Path(__file__).resolve().parent.parent

_VENV_PYTHON = r'''#!%(py)s -S
import json, os, subprocess, sys
venv = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
  f.write(json.dumps({"venv": venv, "cwd": os.getcwd(), "args": args,
                      "cuda": os.environ.get("JAX_FLASHOVERLAP_BUILD_CUDA")}) + "\n")
if args[:1] == ["-c"]:
  if "purelib" in args[1]:  # the venv's site-packages: its own folder, never the real one
    site = os.path.join(venv, "site")
    os.makedirs(site, exist_ok=True)
    print(site)
    sys.exit(0)
  env = dict(os.environ, PYTHONPATH=os.environ["FAKE_STUBS"])
  pre = os.environ.get("FAKE_VENV_PRE", "")  # e.g. another sys.version_info
  sys.exit(subprocess.run([%(py)r, "-S", "-c", pre + args[1]], env=env).returncode)
if args[:3] == ["-m", "pip", "install"]:
  pkgs = [a for a in args[3:] if not a.startswith("-") and a != ".whl"]
  if "--no-index" in args:
    sys.exit(0 if set(pkgs) <= set(os.environ.get("FAKE_WHEELS", "").split()) else 1)
  sys.exit(int(os.environ.get("FAKE_PIP_RC", "0")))
if args[:1] == ["setup.py"]:
  sys.exit(0)
sys.exit(99)
'''

_BASE_PYTHON = r'''#!%(py)s -S
import json, os, shutil, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
  f.write(json.dumps({"base": True, "args": args}) + "\n")
if args[:2] == ["-m", "venv"]:
  venv = args[-1]
  os.makedirs(os.path.join(venv, "bin"))
  shutil.copy(os.environ["FAKE_VENV_PYTHON"], os.path.join(venv, "bin", "python"))
  sys.exit(0)
if args[:1] == ["-c"]:  # this interpreter as a venv (FAKE_IN_VENV=1) or as a base python
  pre = "import sys; sys.base_prefix = %%s\n" %% ("'/base'" if os.environ.get("FAKE_IN_VENV") else "sys.prefix")
  sys.exit(subprocess.run([%(py)r, "-c", pre + args[1]]).returncode)
sys.exit(99)
'''

ALL = ("jax", "pytest", "pybind11", "flax", "matplotlib", "nvidia.nccl", "cutlass_library",
       "setuptools", "xdist")


def _setup(tmp_path, *, have=(), gpu=False, wheels=(), pip_rc=0, in_venv=False, info=None,
           **env):
  """(returncode, stdout, stderr, logged calls, repo) of setup_env.sh copied into a repository
  of its own; have: the modules the venv already imports; wheels: the packages .whl/ holds;
  info: what the built package's info() says (default: built, on a CPU)."""
  repo = tmp_path / "repo"
  (repo / "scripts").mkdir(parents=True)
  for script in ("setup_env.sh", "_gpus.sh"):
    shutil.copy(ROOT / "scripts" / script, repo / "scripts")
  if wheels:
    (repo / ".whl").mkdir()
    for w in wheels:
      (repo / ".whl" / f"{w.replace('-', '_')}-1.0-py3-none-any.whl").write_bytes(b"x")
  stubs = tmp_path / "stubs"
  for mod in have:
    (stubs / mod.replace(".", "/")).mkdir(parents=True)
    (stubs / mod.replace(".", "/") / "__init__.py").write_text("")
  (stubs / "jax_flashoverlap").mkdir(parents=True)
  info = info or dict(extension_built=True, default_backend="cpu", gpus=0)
  (stubs / "jax_flashoverlap" / "__init__.py").write_text(f"def info():\n  return {info!r}\n")
  tools = tmp_path / "tools"
  tools.mkdir()
  py = {"py": sys.executable}
  (tools / "venv_python").write_text(_VENV_PYTHON % py)
  (tools / "base_python").write_text(_BASE_PYTHON % py)
  (tools / "python3").write_text("#!/bin/bash\nexit 97\n")  # never the machine's own
  # gpu: one GPU listed (a CUDA 13.0 driver's), or an nvidia-smi script's text
  smi = gpu if isinstance(gpu, str) else nvidia_smi()
  write_nvidia_smi(tools, smi if gpu else "echo 'No devices were found'; exit 6\n")
  for f in tools.iterdir():
    f.chmod(0o755)
  log = tmp_path / "calls.jsonl"
  full = {"PATH": f"{tools}:/usr/bin:/bin", "PYTHON": str(tools / "base_python"),
          "FAKE_LOG": str(log), "FAKE_STUBS": str(stubs),
          "FAKE_VENV_PYTHON": str(tools / "venv_python"), "FAKE_WHEELS": " ".join(wheels),
          "FAKE_PIP_RC": str(pip_rc), **({"FAKE_IN_VENV": "1"} if in_venv else {}), **env}
  r = subprocess.run(["bash", str(repo / "scripts" / "setup_env.sh")], env=full,
                     capture_output=True, text=True, timeout=60, cwd=tmp_path)
  calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
  return r.returncode, r.stdout, r.stderr, calls, repo


def _pip(calls):
  return [c["args"][3:] for c in calls if c["args"][:3] == ["-m", "pip", "install"]]


def test_a_fresh_cpu_machine_gets_everything_and_a_built_importable_checkout(tmp_path):
  code, out, err, calls, repo = _setup(tmp_path, JAX_FLASHOVERLAP_BUILD_CUDA="0")
  assert code == 0, (out, err)
  assert calls[0]["args"] == ["-m", "venv", "--system-site-packages", ".venv"]
  assert (repo / ".venv" / "bin" / "python").exists()  # made in the repository, not the caller's
  assert _pip(calls) == [["-q", "jax>=0.10", "pytest", "pybind11", "flax", "matplotlib",
                          "nvidia-nccl-cu13", "nvidia-cutlass", "setuptools", "pytest-xdist"]]
  (build,) = [c for c in calls if c["args"][:1] == ["setup.py"]]
  assert build["args"] == ["setup.py", "-q", "build_ext", "--inplace"]
  assert build["cuda"] == "0" and build["cwd"] == str(repo)  # the caller's switch, unchanged
  assert (repo / ".venv" / "site" / "jax_flashoverlap_checkout.pth").read_text() == f"{repo}\n"
  assert not (repo / ".venv" / "site" / "zz_parent_env.pth").exists()
  assert "[setup_env] extension built: True | backend: cpu | gpus: 0" in out


def test_gpus_without_the_extension_are_a_warning_saying_why(tmp_path):
  """A GPU machine where setup.py built no extension (no nvcc, say) runs every op as XLA's
  composition: the setup's last lines say so with setup.py's reason, which pip and the build
  log had let go by; with the extension built, or without GPUs, no warning."""
  why = ("not built (no jax_flashoverlap/_xla_ffi*.so; setup.py said: skipped: nvcc not found: "
         'set CUDA_HOME or put nvcc on PATH, or `pip install "cuda-toolkit[nvcc]"`, then reinstall)')
  gpus = ["NVIDIA H100 80GB HBM3"]
  code, out, err, _, _ = _setup(tmp_path, have=ALL, gpu=True, info=dict(
      extension_built=False, extension_error=why, default_backend="gpu", gpus=gpus))
  assert code == 0, (out, err)
  assert f"[setup_env] extension built: False | backend: gpu | gpus: {gpus}" in out
  warning = [line for line in out.splitlines() if "WARNING" in line]
  assert warning == ["[setup_env] WARNING: GPUs here but no CUDA extension, so every op runs as "
                     f"XLA dot + collective, with no overlap: {why}"], out
  for gpu, info in (
      (True, dict(extension_built=True, extension_error=None, default_backend="gpu", gpus=gpus)),
      (False, dict(extension_built=False, extension_error=why, default_backend="cpu", gpus=[]))):
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    code, out, err, _, _ = _setup(tmp_path, have=ALL, gpu=gpu, info=info)
    assert code == 0 and "WARNING" not in out, (out, err)


def test_a_fresh_gpu_machine_gets_the_jax_build_of_its_drivers_cuda(tmp_path):
  """Plain `jax` is the CPU build: on a machine whose driver lists GPUs the setup installs
  jax[cuda13] or jax[cuda12] (and the NCCL wheel of that release), by the CUDA release
  nvidia-smi says the driver runs; a driver for neither gets the CPU build, said on stderr."""
  have = set(ALL) - {"jax", "nvidia.nccl"}
  seen = dict(extension_built=True, default_backend="gpu", gpus=["NVIDIA H200"] * 2)
  for cuda, jax, nccl in (("13.0", "jax[cuda13]>=0.10", "nvidia-nccl-cu13"),
                          ("13.5", "jax[cuda13]>=0.10", "nvidia-nccl-cu13"),
                          ("12.8", "jax[cuda12]>=0.10", "nvidia-nccl-cu12")):
    code, out, err, calls, _ = _setup(tmp_path / cuda, have=have, gpu=nvidia_smi(2, cuda=cuda),
                                      info=seen)
    assert (code, _pip(calls)) == (0, [["-q", jax, nccl]]), (cuda, out, err)
    assert "WARNING" not in out + err, (cuda, out, err)
  for cuda, said in (("11.8", "11"), (None, "(not said)")):
    code, out, err, calls, _ = _setup(tmp_path / str(cuda), have=have, gpu=nvidia_smi(cuda=cuda))
    assert (code, _pip(calls)) == (0, [["-q", "jax>=0.10", "nvidia-nccl-cu13"]]), (cuda, out)
    assert (f"[setup_env] WARNING: nvidia-smi lists 1 GPU(s), but its driver runs CUDA {said}; "
            "JAX's CUDA builds need a CUDA 12 or 13 driver: installing the CPU build of jax") in err
  # JAX already there: never replaced, whatever its build (the last lines warn instead, below)
  code, out, err, calls, _ = _setup(tmp_path / "have", have=ALL, gpu=nvidia_smi())
  assert (code, _pip(calls)) == (0, []), (out, err)


def test_gpus_that_jax_cannot_see_are_a_warning_with_the_fix(tmp_path):
  """nvidia-smi lists GPUs but JAX runs on the CPU: the CPU build of jaxlib (the fix: the
  pip command for the driver's CUDA release), or a CUDA plugin that did not start (JAX's own
  warning says why). No warning where JAX_PLATFORMS leaves the GPU out on purpose."""
  info = dict(extension_built=True, extension_error=None, default_backend="cpu", gpus=[])
  start = "[setup_env] WARNING: nvidia-smi lists 2 GPU(s) but JAX sees none, so every op runs on cpu, not on the GPUs: "

  def warnings(name, cuda="13.0", have=ALL, **env):
    code, out, err, _, repo = _setup(tmp_path / name, have=have, gpu=nvidia_smi(2, cuda=cuda),
                                     info=info, **env)
    assert code == 0, (out, err)
    return [line for line in out.splitlines() if "WARNING" in line], repo

  got, repo = warnings("cpu_build")
  assert got == [start + "it is the CPU build (no jax-cuda13-plugin or jax-cuda12-plugin); for the "
                 f"GPUs: {repo / '.venv' / 'bin' / 'python'} -m pip install 'jax[cuda13]'"], got
  got, repo = warnings("cuda12", cuda="12.4")
  assert got and got[0].endswith("-m pip install 'jax[cuda12]'"), got
  got, _ = warnings("old_driver", cuda="11.8")
  assert got == [start + "it is the CPU build (no jax-cuda13-plugin or jax-cuda12-plugin); JAX's "
                 "CUDA builds need a CUDA 12 or 13 driver (nvidia-smi's CUDA version: 11)"], got
  got, _ = warnings("plugin", have=set(ALL) | {"jax_cuda13_plugin"})
  assert got == [start + "its CUDA plugin (jax_cuda13_plugin) did not start: JAX said why above"], got
  for platforms, warned in (("cpu", False), ("cuda,cpu", True), ("gpu", True)):
    got, _ = warnings(f"platforms_{platforms}", JAX_PLATFORMS=platforms)
    assert bool(got) == warned, (platforms, got)


def test_without_the_build_switch_setup_py_decides(tmp_path):
  code, out, err, calls, _ = _setup(tmp_path, have=ALL)
  assert code == 0, (out, err)
  assert [c["cuda"] for c in calls if c["args"][:1] == ["setup.py"]] == [None]


def test_nothing_missing_installs_nothing_and_one_missing_installs_just_it(tmp_path):
  code, out, err, calls, _ = _setup(tmp_path / "all", have=ALL)
  assert (code, _pip(calls)) == (0, []), (out, err)
  assert "installing" not in out
  code, out, err, calls, _ = _setup(tmp_path / "one", have=set(ALL) - {"flax"})
  assert (code, _pip(calls)) == (0, [["-q", "flax"]]), (out, err)


def test_a_gpu_machine_installs_no_xdist_and_a_cpu_one_does(tmp_path):
  """A GPU machine runs its tests one at a time (scripts/run_tests.sh) and may have no index."""
  have = set(ALL) - {"xdist"}
  code, out, err, calls, _ = _setup(tmp_path / "gpu", have=have, gpu=True)
  assert (code, _pip(calls)) == (0, []), (out, err)
  code, out, err, calls, _ = _setup(tmp_path / "cpu", have=have, gpu=False)
  assert (code, _pip(calls)) == (0, [["-q", "pytest-xdist"]]), (out, err)
  # GPUs listed one line at a time: `nvidia-smi -L | grep -q` under pipefail read them as none
  slow = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'; sleep 0.2\n" for i in range(3))
  code, out, err, calls, _ = _setup(tmp_path / "slow", have=have, gpu=slow)
  assert (code, _pip(calls)) == (0, []), (out, err)


def test_carried_wheels_first_without_their_dependencies_then_the_index(tmp_path):
  have = set(ALL) - {"cutlass_library", "flax"}
  code, out, err, calls, _ = _setup(tmp_path, have=have, wheels=("nvidia-cutlass",))
  assert code == 0, (out, err)
  assert _pip(calls) == [
      ["-q", "--no-index", "--no-deps", "--find-links", ".whl", "flax"],
      ["-q", "--no-index", "--no-deps", "--find-links", ".whl", "nvidia-cutlass"],
      ["-q", "flax"]]


def test_a_failed_install_fails_the_script_before_the_build(tmp_path):
  code, out, err, calls, _ = _setup(tmp_path, have=set(ALL) - {"pybind11"}, pip_rc=3)
  assert code != 0, (out, err)
  assert not [c for c in calls if c["args"][:1] == ["setup.py"]]


def test_venv_and_python_variables_and_a_parent_venvs_packages(tmp_path):
  """A $PYTHON that is itself a venv: --system-site-packages reaches only its base
  interpreter's packages, so its own are added by a .pth."""
  venv = tmp_path / "elsewhere"
  code, out, err, calls, repo = _setup(tmp_path, have=ALL, in_venv=True, VENV=str(venv))
  assert code == 0, (out, err)
  assert calls[0] == {"base": True, "args": ["-m", "venv", "--system-site-packages", str(venv)]}
  assert not (repo / ".venv").exists()
  paths = sysconfig.get_paths()
  want = "\n".join(sorted({paths["purelib"], paths["platlib"]})) + "\n"
  assert (venv / "site" / "zz_parent_env.pth").read_text() == want
  assert {c.get("venv") for c in calls if "base" not in c} == {str(venv)}


def test_an_existing_venv_is_reused(tmp_path):
  code, out, err, calls, repo = _setup(tmp_path / "a", have=ALL)
  assert code == 0, (out, err)
  (repo / ".venv" / "site" / "jax_flashoverlap_checkout.pth").unlink()
  log = tmp_path / "a" / "calls.jsonl"
  log.unlink()
  env = {"PATH": f"{tmp_path / 'a' / 'tools'}:/usr/bin:/bin", "PYTHON": "/nonexistent/python",
         "FAKE_LOG": str(log), "FAKE_STUBS": str(tmp_path / "a" / "stubs")}
  r = subprocess.run(["bash", str(repo / "scripts" / "setup_env.sh")], env=env,
                     capture_output=True, text=True, timeout=60, cwd=tmp_path)
  assert r.returncode == 0, (r.stdout, r.stderr)
  assert (repo / ".venv" / "site" / "jax_flashoverlap_checkout.pth").read_text() == f"{repo}\n"
  assert os.path.exists(log) and "base" not in log.read_text()


def test_a_python_older_than_3_11_is_refused_before_anything_is_installed(tmp_path):
  code, out, err, calls, _ = _setup(
      tmp_path, FAKE_VENV_PRE="import sys; sys.version_info = (3, 10, 13)\n")
  assert code == 1 and _pip(calls) == [], (out, err)
  assert ("[setup_env] .venv runs Python 3.10; jax_flashoverlap needs 3.11 or newer (as jax 0.10 "
          "and jaxlib do): remove .venv and run again with PYTHON=python3.11 (or newer)") in err
  for version in ("(3, 11, 0)", "(3, 13, 0)", "(4, 0, 0)"):
    code, out, err, calls, _ = _setup(tmp_path / version, have=ALL,
                                      FAKE_VENV_PRE=f"import sys; sys.version_info = {version}\n")
    assert code == 0, (version, out, err)
