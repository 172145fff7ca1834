"""info(), `python -m jax_flashoverlap.info`, and the switches (force-reference env var, the
one-time warning when a GPU is present but the extension is not built).

Things that depend on import-time/process state run in a fresh subprocess.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import jax

from _util import REPO, repo_env

FORCE_ENV = "JAX_FLASHOVERLAP_FORCE_REFERENCE"


def _env(**overrides):
    return repo_env(**{FORCE_ENV: None, **overrides})


def _py(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          env=_env(**env), capture_output=True, text=True, timeout=240)


def _walk(d, prefix=""):
    """(dotted key, value) for every entry of a nested dict."""
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            yield key, v
            yield from _walk(v, key)


def _find(d, *words):
    """Values of keys whose last component contains any of `words` (case-insensitive)."""
    return [v for k, v in _walk(d) if any(w in k.rsplit(".", 1)[-1].lower() for w in words)]


# ------------------------------------------------------------------ info()

def test_info_is_a_json_able_dict(fo):
    d = fo.info()
    assert isinstance(d, dict) and d
    json.dumps(d, default=str)  # printable by the CLI


@pytest.mark.parametrize("variable,value", [
    (FORCE_ENV, "ture"), ("FLASHOVERLAP_GEMM_EPILOGUE", "bogus"),
    ("JAX_FLASHOVERLAP_TRANSPORT", "nvlink"), ("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", "in_place"),
    ("JAX_FLASHOVERLAP_GRANT_PEER_ACCESS", "maybe"), ("JAX_FLASHOVERLAP_WATCHDOG_S", "soon"),
    ("JAX_FLASHOVERLAP_TUNED", "fasle"), ("JAX_FLASHOVERLAP_KV_TIMEOUT_S", "abc"),
    ("FLASHOVERLAP_TRACE", "bogus"), ("JAX_FLASHOVERLAP_CONFIG_DIR", "/no/such/dir"),
    ("JAX_FLASHOVERLAP_NUM_PROCESSES", "two")])
def test_info_cli_reports_a_setting_that_does_not_parse(variable, value):
    """A mistyped switch is what `info` is run to find: it prints the whole report, names
    the variable and its value (in the report and on stderr) and exits 1, no traceback."""
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.info"], cwd=REPO,
                       env=_env(**{variable: value}), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    report = json.loads(r.stdout)
    assert report["invalid_settings"] and all(
        variable in p and (repr(value) in p or value in p) for p in report["invalid_settings"]
    ), report["invalid_settings"]
    assert "invalid setting: " in r.stderr and variable in r.stderr, r.stderr
    assert report["paths"] and report["jax"] == jax.__version__


def test_info_reports_the_launchers_variables_as_initialize_takes_them(fo, monkeypatch):
    """The launcher's three variables (distributed.initialize reads them): unset is None,
    all three are reported parsed, some without the others are reported invalid (info
    exited 0 while initialize() raised)."""
    names = ("JAX_FLASHOVERLAP_COORDINATOR", "JAX_FLASHOVERLAP_NUM_PROCESSES",
             "JAX_FLASHOVERLAP_PROCESS_ID")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    d = fo.info()
    assert d["settings"]["launch"] is None and not d["invalid_settings"], d["settings"]
    for name, value in zip(names, ("localhost:1234", " 2 ", "1")):
        monkeypatch.setenv(name, value)
    d = fo.info()
    assert d["settings"]["launch"] == {"coordinator_address": "localhost:1234",
                                       "num_processes": 2, "process_id": 1}, d["settings"]
    monkeypatch.setenv("JAX_FLASHOVERLAP_PROCESS_ID", "2")
    d = fo.info()
    assert any("process_id (JAX_FLASHOVERLAP_PROCESS_ID) must be in [0, 2)" in p
               for p in d["invalid_settings"]), d["invalid_settings"]
    monkeypatch.delenv("JAX_FLASHOVERLAP_COORDINATOR")
    d = fo.info()
    assert any("not coordinator_address (JAX_FLASHOVERLAP_COORDINATOR)" in p
               for p in d["invalid_settings"]), d["invalid_settings"]


def test_info_reports_settings_and_tuned_configs(fo, tmp_path, monkeypatch):
    """The parsed value of every switch, and the tuned-config files in effect: the shipped
    one, then a user dir's (a bad file there is reported, naming it)."""
    monkeypatch.setenv("JAX_FLASHOVERLAP_CONFIG_DIR", str(tmp_path))  # not the developer's own
    d = fo.info()
    assert d["settings"]["transport"] == "auto" and d["settings"]["fallback"] is True
    shipped = d["tuned_configs"]["files"]
    assert shipped and all(f.endswith(".json") for f in shipped), d["tuned_configs"]
    by_build = d["tuned_configs"]["entries_by_kernel_build"]
    assert set(by_build) == set(shipped), by_build
    assert sum(sum(c.values()) for c in by_build.values()) == d["tuned_configs"]["entries"]
    assert d["tuned_configs"]["kernel_build"] == (d["build"] or {}).get("kernel_build")
    monkeypatch.setenv("JAX_FLASHOVERLAP_CONFIG_DIR", str(tmp_path))
    (tmp_path / "mine.json").write_text("{not json")
    d = fo.info()
    assert "mine.json" in d["tuned_configs"]["error"], d["tuned_configs"]
    assert any("mine.json" in p for p in d["invalid_settings"]), d["invalid_settings"]
    monkeypatch.setenv("JAX_FLASHOVERLAP_TUNED", "0")  # no plan lookup reads them then
    d = fo.info()
    assert "mine.json" in d["tuned_configs"]["error"] and not d["tuned_configs"]["in_use"]
    assert not d["invalid_settings"], d["invalid_settings"]


def test_info_reports_versions(fo):
    d = fo.info()
    values = [v for _, v in _walk(d)]
    assert jax.__version__ in values, f"jax version {jax.__version__} not reported: {d}"
    assert any("version" in k.lower() or k.lower() in ("jax", "jaxlib", "jax_flashoverlap")
               for k, _ in _walk(d))


def test_info_reports_extension_build_state(fo):
    d = fo.info()
    built = [v for v in _find(d, "built", "has_cuda_ext", "extension") if isinstance(v, bool)]
    assert built, f"no boolean 'extension built' entry in {d}"


def test_info_reports_gpu_and_nccl(fo):
    d = fo.info()
    assert _find(d, "gpu"), f"no GPU entry in {d}"
    assert _find(d, "nccl"), f"no NCCL version entry in {d}"
    if jax.devices()[0].platform == "cpu":
        names = [v for v in _find(d, "gpu_name") if v]
        assert not names, f"GPU name reported on a CPU-only machine: {names}"


def test_info_explains_cuda_path(fo):
    """For each op (or globally), whether the CUDA path is in use and a human-readable reason."""
    d = fo.info()
    reasons = [v for v in _find(d, "why", "reason") if isinstance(v, str) and v.strip()]
    assert reasons, f"no reason for the CUDA path in {d}"
    if jax.devices()[0].platform == "cpu":
        use = [v for v in _find(d, "cuda_custom_call", "cuda_path", "use_cuda") if isinstance(v, bool)]
        assert use and not any(use), f"CUDA path reported in use on CPU: {d}"


def test_info_reports_the_path_of_every_public_op(fo):
    """README: info() says "which path each op takes and why": all five per-device ops, each
    with its FFI target among the extension's (matmul_all_to_all and all_gather_matmul were
    left out)."""
    paths = fo.info()["paths"]
    ops = {"matmul", "matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_to_all",
           "all_gather_matmul"}
    assert set(paths) == ops, sorted(paths)
    for op in ops:
        assert isinstance(paths[op]["cuda_custom_call"], bool) and paths[op]["why"].strip()


def test_info_module_cli():
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.info"], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip(), "nothing printed"
    assert jax.__version__ in r.stdout


# ------------------------------------------------------------------ force-reference switch

_INFO_JSON = """
import json, jax_flashoverlap as fo
print(json.dumps(fo.info(), default=str))
"""


def test_force_reference_env_reported_by_info():
    on = _py(_INFO_JSON, **{FORCE_ENV: "1"})
    off = _py(_INFO_JSON)
    assert on.returncode == 0, on.stderr
    assert off.returncode == 0, off.stderr
    d_on, d_off = json.loads(on.stdout.strip().splitlines()[-1]), json.loads(off.stdout.strip().splitlines()[-1])
    flags_on = [v for v in _find(d_on, "force") if isinstance(v, bool)]
    flags_off = [v for v in _find(d_off, "force") if isinstance(v, bool)]
    assert flags_on and all(flags_on), f"force-reference not reported: {d_on}"
    assert flags_off and not any(flags_off), f"force-reference reported without the env var: {d_off}"


_CUDA_LOWER = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import jax_flashoverlap as fo
mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("tp",))
f = jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                  in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())
# a real shape (abstract, nothing allocated): small ones may go to XLA's ops by the cost model
args = (jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16),
        jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16))
text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
print("CUSTOM_CALL" if "flashoverlap_gemm_all_reduce" in text else "REFERENCE")
"""


def test_force_reference_env_changes_cuda_lowering():
    """The only observable on CPU: with the switch, even a CUDA lowering uses the reference path."""
    # JAX_FLASHOVERLAP_FALLBACK=0: no cost-model fallback to XLA's ops, so only FORCE differs
    on = _py(_CUDA_LOWER, JAX_PLATFORMS="cpu", JAX_FLASHOVERLAP_FALLBACK="0", **{FORCE_ENV: "1"})
    off = _py(_CUDA_LOWER, JAX_PLATFORMS="cpu", JAX_FLASHOVERLAP_FALLBACK="0")
    assert on.returncode == 0, on.stderr
    assert off.returncode == 0, off.stderr
    assert on.stdout.strip().splitlines()[-1] == "REFERENCE", on.stdout
    assert off.stdout.strip().splitlines()[-1] == "CUSTOM_CALL", off.stdout


# ------------------------------------------------------------------ missing-extension warning

def test_missing_extension_warning_once(fo, tmp_path):
    """A GPU present without the built extension warns once (RuntimeWarning subclass).

    A real GPU cannot be faked on CPU; the package exposes `_ext.check_cuda_path(target,
    gpu_present=...)` as the hook. It runs in a fresh process on a copy of the package without
    its compiled modules (*.so), i.e. really "not built", so the once-only state is clean and the
    test runs whether or not the extension was built on this machine. The hook is the
    package's own (jax_flashoverlap/_ext.py): its absence is a failure, not a skip, since a
    skip here would hide the whole check on every machine once the hook were renamed.
    """
    ext = getattr(fo, "_ext", None)
    hook = getattr(ext, "check_cuda_path", None)
    assert callable(hook), "jax_flashoverlap._ext.check_cuda_path (the warning's hook) is gone"
    pkg = os.path.dirname(os.path.abspath(fo.__file__))
    shutil.copytree(pkg, tmp_path / "jax_flashoverlap",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.dylib", "__pycache__"))
    code = """
    import json, warnings
    import jax_flashoverlap
    from jax_flashoverlap import _ext
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        first = _ext.check_cuda_path("flashoverlap_gemm_all_reduce", gpu_present=True)
        second = _ext.check_cuda_path("flashoverlap_gemm", gpu_present=True)
    print(json.dumps({
        "file": jax_flashoverlap.__file__,
        "has_ext": bool(getattr(_ext, "HAS_CUDA_EXT", False)),
        "first": list(first), "second": list(second),
        "warnings": [[w.category.__name__, issubclass(w.category, RuntimeWarning), str(w.message)]
                     for w in rec]}))
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(tmp_path),
                       env=_env(PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(tmp_path)), out["file"]
    assert out["has_ext"] is False, "the copy without *.so still reports the extension as built"
    assert len(out["warnings"]) == 1, out["warnings"]
    name, is_runtime, message = out["warnings"][0]
    assert is_runtime, f"{name} is not a RuntimeWarning subclass"
    assert "extension" in message.lower() and "gpu" in message.lower(), message
    # without the extension the CUDA path is not taken, and a reason is given
    assert out["first"][0] is False and out["second"][0] is False, out
    assert out["first"][1], out


def test_info_cli_help_and_unknown_options():
    """`info --help` describes it (it printed the whole report); an option it does not take
    is an error (it was ignored)."""
    from jax_flashoverlap import _info
    import pytest
    with pytest.raises(SystemExit) as done:
        _info.main(["--help"])
    assert done.value.code == 0
    with pytest.raises(SystemExit) as done:
        _info.main(["--json"])
    assert done.value.code == 2


# ------------------------------------------------------------------ GPUs, targets, a broken build

class _FakeGpu:
    def __init__(self, kind, capability, cores):
        self.device_kind, self.compute_capability, self.core_count = kind, capability, cores


def _fake_gpus(monkeypatch, gpus):
    """jax.devices("gpu") answers `gpus` (what a machine with those GPUs would report)."""
    real = jax.devices

    def devices(backend=None):
        return list(gpus) if backend == "gpu" else real(backend)
    monkeypatch.setattr(jax, "devices", devices)


def test_local_gpus_their_sms_and_the_first_unsupported_one(fo, monkeypatch):
    """local_gpus / local_gpu_sms read JAX's devices (the fewest SMs of any, ignoring an unknown
    or zero count); unsupported_gpu names the first GPU the kernels are not built for, whichever
    position it has, and none whose capability is unknown."""
    from jax_flashoverlap import _ext
    _fake_gpus(monkeypatch, [_FakeGpu("NVIDIA H100 80GB HBM3", "9.0", 132),
                             _FakeGpu("NVIDIA H100 PCIe", "9.0", 114),
                             _FakeGpu("NVIDIA H100 MIG", "9.0", 0), _FakeGpu("odd", "9.0", None)])
    assert _ext.local_gpus()[:2] == [("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA H100 PCIe", "9.0")]
    assert _ext.local_gpu_present() and _ext.local_gpu_sms() == 114
    _fake_gpus(monkeypatch, [])
    assert _ext.local_gpu_sms() is None and not _ext.local_gpu_present()
    h100, a100, b200 = ("NVIDIA H100", "9.0"), ("NVIDIA A100", "8.0"), ("NVIDIA B200", "10.0")
    assert _ext.unsupported_gpu([h100, a100, b200]) == a100
    assert _ext.unsupported_gpu([h100, ("unknown", None), h100]) is None
    assert _ext.unsupported_gpu([h100, b200]) == b200


def test_check_cuda_path_decisions(fo, monkeypatch):
    """Without a local GPU a CUDA lowering emits the custom call even without the extension
    (cross-lowering); with one, a target the extension lacks takes the reference path; a GPU
    the kernels do not support warns once; the targets are registered once."""
    import warnings
    from jax_flashoverlap import _compat, _ext
    monkeypatch.delenv(FORCE_ENV, raising=False)
    monkeypatch.setattr(_ext, "ext", None)
    monkeypatch.setattr(_ext, "_warned_missing", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        use, why = _ext.check_cuda_path("flashoverlap_gemm", gpus=[])
    assert use and "cross-lowering" in why, why
    monkeypatch.undo()
    monkeypatch.delenv(FORCE_ENV, raising=False)
    if _ext.ext is None:
        pytest.skip("the rest needs the built extension")
    h200 = [("NVIDIA H200", "9.0")]
    use, why = _ext.check_cuda_path("flashoverlap_no_such_target", gpus=h200)
    assert not use and "does not provide 'flashoverlap_no_such_target'" in why, why
    monkeypatch.setattr(_ext, "_warned_unsupported", False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(2):
            use, _why = _ext.check_cuda_path("flashoverlap_gemm", gpus=[("NVIDIA A100", "8.0")])
            assert not use
    assert [w.category for w in rec] == [_ext.UnsupportedGPUWarning], [str(w.message) for w in rec]
    # gpu_present=True (info()'s call) still checks the local GPUs' capability
    monkeypatch.setattr(_ext, "local_gpus", lambda: [("NVIDIA A100", "8.0")])
    use, why = _ext.check_cuda_path("flashoverlap_gemm", gpu_present=True)
    assert not use and "sm_80" in why, why
    for env, typo in [(_ext.POISON_OUTPUTS_ENV, "nan"), (_ext.FALLBACK_ENV, "of")]:
        monkeypatch.setenv(env, typo)  # read at every decision, whichever path it takes
        with pytest.raises(ValueError, match=f"{env}={typo!r}"):
            _ext.check_cuda_path("flashoverlap_gemm", gpus=[])
        monkeypatch.delenv(env)
    registered = []
    monkeypatch.setattr(_compat, "register_ffi_target",
                        lambda name, capsule, platform: registered.append((name, platform)))
    monkeypatch.setattr(_ext, "_registered", False)
    for _ in range(2):
        assert _ext.check_cuda_path("flashoverlap_gemm", gpus=h200)[0]
    assert sorted(registered) == sorted((t, "CUDA") for t in _ext.available_targets()), registered


def test_info_with_gpus_reports_them_and_each_ops_path(fo, monkeypatch):
    """On a machine with GPUs (faked: JAX's devices), info() lists them, names the first, and
    each op's path is the one check_cuda_path decides; the extension's state is reported as
    _ext has it."""
    from jax_flashoverlap import _ext
    monkeypatch.delenv(FORCE_ENV, raising=False)
    _fake_gpus(monkeypatch, [_FakeGpu("NVIDIA H200", "9.0", 132),
                             _FakeGpu("NVIDIA H100 80GB HBM3", "9.0", 132)])
    d = fo.info()
    assert d["gpus"] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"] and d["gpu_name"] == "NVIDIA H200"
    assert d["extension_built"] is _ext.HAS_CUDA_EXT
    assert d["extension_error"] == _ext.EXT_IMPORT_ERROR
    assert d["ffi_targets"] == sorted(_ext.available_targets())
    if _ext.ext is not None:
        assert set(d["ffi_targets"]) >= set(fo._info.OP_TARGETS.values()), d["ffi_targets"]
        assert d["nccl_version"] == _ext.ext.nccl_version()
    for op, target in fo._info.OP_TARGETS.items():
        assert d["paths"][op]["cuda_custom_call"] is (_ext.ext is not None), d["paths"][op]
        assert target in d["paths"][op]["why"] or _ext.ext is None, d["paths"][op]
    monkeypatch.setenv(FORCE_ENV, "ture")  # not decided: the reason, not a guess
    d = fo.info()
    assert all(p["cuda_custom_call"] is None and FORCE_ENV in p["why"]
               for p in d["paths"].values()), d["paths"]
    assert d["force_reference"].startswith("invalid: ") and FORCE_ENV in d["force_reference"]


def test_an_extension_that_does_not_load_is_reported_not_raised(fo, tmp_path):
    """A built extension that fails to import (a library it needs missing; here a file that is
    no shared object) leaves the package importable on the reference path: info() says why, no
    targets, no kernel build; a GPU then warns with that reason."""
    import importlib.machinery
    pkg = os.path.dirname(os.path.abspath(fo.__file__))
    shutil.copytree(pkg, tmp_path / "jax_flashoverlap",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.dylib", "__pycache__"))
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / "jax_flashoverlap" / f"_xla_ffi{suffix}").write_bytes(b"not a shared object\n")
    code = """
    import json, warnings
    import jax_flashoverlap as fo
    from jax_flashoverlap import _ext
    with warnings.catch_warnings(record=True) as rec:
      warnings.simplefilter("always")
      use, why = _ext.check_cuda_path("flashoverlap_gemm", gpus=[("NVIDIA H200", "9.0")])
    d = fo.info()
    print(json.dumps({"file": fo.__file__, "use": use, "why": why,
                      "warnings": [str(w.message) for w in rec],
                      "kernel_build": _ext.kernel_build(),
                      **{k: d[k] for k in ("extension_built", "extension_error", "ffi_targets",
                                           "build", "nccl_version")}}))
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(tmp_path),
                       env=_env(PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(tmp_path)), out["file"]
    assert out["extension_built"] is False and out["extension_error"].startswith(
        "built but failed to load: ImportError"), out
    assert out["ffi_targets"] == [] and out["build"] is None and out["nccl_version"] is None, out
    assert out["kernel_build"] is None and not out["use"], out
    assert "built but failed to load" in out["why"], out
    assert len(out["warnings"]) == 1 and "built but failed to load" in out["warnings"][0], out


def test_switches_take_their_words_and_empty_is_the_default(fo, monkeypatch):
    """Each switch read at lowering: unset or empty (or blank) is its default, the words in any
    case and with spaces, and the variables the launcher reads take what the launcher takes."""
    from jax_flashoverlap import _ext
    name = "JAX_FLASHOVERLAP_TEST_SWITCH"
    for raw, default, want in [(None, True, True), ("", True, True), ("  ", False, False),
                               (" ON ", False, True), ("Yes", False, True), ("TRUE", False, True),
                               ("on", False, True), ("Off", True, False), ("NO", True, False)]:
        if raw is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, raw)
        assert _ext.env_switch(name, default) is want, (raw, default)
    for env in (_ext.GEMM_EPILOGUE_ENV, _ext.GEMM_QUEUE_ENV, _ext.GEMM_TAIL_ENV,
                _ext.GEMM_SCHEDULE_ENV, _ext.GEMM_HELPERS_ENV, "FLASHOVERLAP_GEMM_SERPENTINE",
                "FLASHOVERLAP_GEMM_LOG", "FLASHOVERLAP_GEMM_TILE", "FLASHOVERLAP_GEMM_PANEL",
                _ext.WAIT_ENV):
        monkeypatch.setenv(env, "")  # unset for the launcher too
    _ext.check_gemm_epilogue()
    for env, value in [("FLASHOVERLAP_GEMM_PANEL", "1024"), ("FLASHOVERLAP_GEMM_PANEL", "+1"),
                       ("FLASHOVERLAP_GEMM_TILE", "0"), ("FLASHOVERLAP_GEMM_TILE", "256")]:
        monkeypatch.setenv(env, value)
        _ext.check_gemm_epilogue()
    for env, value in [("FLASHOVERLAP_GEMM_PANEL", "1025"), ("FLASHOVERLAP_GEMM_TILE", "129")]:
        monkeypatch.setenv(env, value)
        with pytest.raises(ValueError, match=f"{env}={value!r}"):
            _ext.check_gemm_epilogue()
        monkeypatch.setenv(env, "")
    for raw, want in [(None, False), ("", False), ("workspace", False), ("output", True)]:
        if raw is None:
            monkeypatch.delenv(_ext.ALL_REDUCE_BUFFER_ENV, raising=False)
        else:
            monkeypatch.setenv(_ext.ALL_REDUCE_BUFFER_ENV, raw)
        assert _ext.all_reduce_in_place() is want, raw
    for raw, want in [(None, "auto"), ("", "auto"), ("peer", "peer"), ("nccl", "nccl")]:
        if raw is None:
            monkeypatch.delenv(_ext.TRANSPORT_ENV, raising=False)
        else:
            monkeypatch.setenv(_ext.TRANSPORT_ENV, raw)
        assert _ext.transport() == want, raw
    for env, default in [(_ext.GRANT_PEER_ACCESS_ENV, False), (_ext.POISON_OUTPUTS_ENV, False),
                         (_ext.FORCE_REFERENCE_ENV, False), (_ext.FALLBACK_ENV, True)]:
        monkeypatch.delenv(env, raising=False)
    assert (_ext.grant_peer_access(), _ext.poison_outputs(), _ext.force_reference(),
            _ext.fallback_enabled()) == (False, False, False, True)


def test_info_reports_every_invalid_setting(fo, tmp_path, monkeypatch):
    """Several settings that do not parse are all reported, each once; a mistyped
    JAX_FLASHOVERLAP_TUNED counts as on for the tuned configs (as the first lookup would raise),
    so a bad config file is reported too."""
    monkeypatch.setenv("JAX_FLASHOVERLAP_CONFIG_DIR", str(tmp_path))
    (tmp_path / "mine.json").write_text("{not json")
    monkeypatch.setenv("JAX_FLASHOVERLAP_TUNED", "fasle")
    monkeypatch.setenv("JAX_FLASHOVERLAP_TRANSPORT", "nvlink")
    d = fo.info()
    problems = d["invalid_settings"]
    assert d["tuned_configs"]["in_use"] is True and "mine.json" in d["tuned_configs"]["error"]
    for needle in ("JAX_FLASHOVERLAP_TUNED='fasle'", "JAX_FLASHOVERLAP_TRANSPORT='nvlink'",
                   "mine.json"):
        assert any(needle in p for p in problems), (needle, problems)
    assert len(problems) == len(set(problems)) == 3, problems
