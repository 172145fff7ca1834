"""Misspelt variable names (jax_flashoverlap/_environment.py): a variable with the project's
prefix that nothing reads warns once per process at lowering, naming the closest real one, and
`python -m jax_flashoverlap.info` lists it and exits 1. The known list is the sources' own."""
import json
import warnings

import pytest

import jax
from jax.sharding import PartitionSpec as P

from _util import make_mesh_1d, shard_map
from test_docs import switches_read


@pytest.fixture
def env(monkeypatch):
    """No project variable but those a test sets; no name warned yet in this process."""
    import os
    from jax_flashoverlap import _environment
    for name in list(os.environ):
        if name.startswith(_environment.PREFIXES) and name not in _environment.KNOWN:
            monkeypatch.delenv(name)
    monkeypatch.setattr(_environment, "_warned", set())
    return monkeypatch


def _lower(fo):
    mesh = make_mesh_1d(2)
    f = shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh,
                  (P(None, "tp"), P("tp", None)), P())
    x, w = jax.ShapeDtypeStruct((8, 64), "bfloat16"), jax.ShapeDtypeStruct((64, 32), "bfloat16")
    return jax.jit(f).trace(x, w).lower()


def _ours(record):
    from jax_flashoverlap import _environment
    return [str(w.message) for w in record if issubclass(w.category,
                                                          _environment.UnknownVariableWarning)]


def test_the_known_list_is_every_variable_the_sources_read():
    from jax_flashoverlap import _environment
    assert _environment.KNOWN == set(switches_read())


def test_a_misspelt_name_warns_once_naming_the_real_one(fo, env):
    env.setenv("JAX_FLASHOVERLAP_WATCHDOG", "30")  # meant: JAX_FLASHOVERLAP_WATCHDOG_S
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _lower(fo)
        _lower(fo)  # once per process
    assert _ours(record) == [
        "jax_flashoverlap: environment variable JAX_FLASHOVERLAP_WATCHDOG is not one "
        "jax_flashoverlap reads (did you mean JAX_FLASHOVERLAP_WATCHDOG_S? it has no effect; "
        "README.md and docs/ document every variable)"]
    env.setenv("FLASHOVERLAP_GEMM_TILES", "256")  # a second name: its own warning
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _lower(fo)
    assert len(_ours(record)) == 1 and "did you mean FLASHOVERLAP_GEMM_TILE?" in _ours(record)[0]


def test_known_names_and_other_prefixes_do_not_warn(fo, env):
    env.setenv("JAX_FLASHOVERLAP_FALLBACK", "1")
    env.setenv("JAX_FLASHOVERLAP_GIT_COMMIT", "abc")  # build and record variables are known too
    env.setenv("MY_JAX_FLASHOVERLAP_NOTES", "x")     # the prefix must lead the name
    env.setenv("JAX_PLATFORM_NAME", "cpu")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _lower(fo)
    assert _ours(record) == []


def test_a_name_far_from_any_gets_no_guess(env):
    from jax_flashoverlap import _environment
    env.setenv("JAX_FLASHOVERLAP_ZZZZZZZZZZZZ", "1")
    (message,) = _environment.unknown_variables()
    assert "JAX_FLASHOVERLAP_ZZZZZZZZZZZZ is not one" in message and "did you mean" not in message


def test_info_lists_unknown_names_and_exits_1(fo, env, capsys):
    from jax_flashoverlap import _info
    assert _info.main([]) == 0  # the premise: nothing else makes it exit 1 here
    report = json.loads(capsys.readouterr().out)
    assert report["unknown_variables"] == []
    env.setenv("JAX_FLASHOVERLAP_FALBACK", "0")
    assert _info.main([]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["invalid_settings"] == [] and report["settings"]["fallback"] is True
    (message,) = report["unknown_variables"]
    assert "JAX_FLASHOVERLAP_FALBACK" in message and "JAX_FLASHOVERLAP_FALLBACK?" in message
    assert f"jax_flashoverlap.info: {message}" in captured.err


@pytest.mark.parametrize("name, meant", [
    ("JAX_FLASHOVERLAP_FALBACK", "JAX_FLASHOVERLAP_FALLBACK"),
    ("FLASHOVERLAP_FALLBACK", "JAX_FLASHOVERLAP_FALLBACK"),      # the other prefix
    ("JAX_FLASHOVERLAP_GEMM_TILE", "FLASHOVERLAP_GEMM_TILE"),
    ("JAX_FLASHOVERLAP_WATCHDOG_SECONDS", "JAX_FLASHOVERLAP_WATCHDOG_S"),
    ("JAX_FLASHOVERLAP_KV_TIMEOUT", "JAX_FLASHOVERLAP_KV_TIMEOUT_S"),
    ("JAX_FLASHOVERLAP_EXPERIMENTAL", None),  # a switch of old versions: nothing like it now
])
def test_the_closest_known_name(name, meant):
    from jax_flashoverlap import _environment
    assert _environment.closest_known(name) == meant
