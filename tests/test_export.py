"""jax.export of programs with the per-device ops.

Our custom call names communicators that this process's lowering made (by comm_id), which a
process deserializing the program never made, and JAX refuses to serialize a custom call
without a compatibility guarantee ("Cannot serialize code with custom calls whose targets
have no compatibility guarantees"). So `jax.export` lowers every op to XLA's composition
for CUDA (the same values, no overlap; an ExportedWithoutOverlapWarning says so once per
process) while `jit(...).lower(...)` keeps the custom call. Before, the export of any shape
whose plan overlapped raised JAX's error, which names neither the op nor a way out.
"""
import re
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import export, lax
from jax.sharding import NamedSharding, PartitionSpec as P

from _util import custom_call_lines, lower_for_cuda, make_mesh_1d, rand, shard_map

N, R, K, COLS = 2, 64, 128, 96
BF16 = jnp.bfloat16
TARGETS = ["flashoverlap_gemm", "flashoverlap_gemm_all_reduce",
           "flashoverlap_gemm_reduce_scatter", "flashoverlap_gemm_all_to_all",
           "flashoverlap_all_gather_gemm"]


def _programs(fo):
    """target -> (our op, XLA's composition, in specs, out spec, x shape, w shape, the
    collective XLA's composition lowers to)."""
    return {
        "flashoverlap_gemm": (lambda x, w: fo.matmul(x, w), lambda x, w: x @ w,
                              (P(), P()), P(), (R, K), (K, COLS), None),
        "flashoverlap_gemm_all_reduce": (
            lambda x, w: fo.matmul_all_reduce(x, w, "tp"), lambda x, w: lax.psum(x @ w, "tp"),
            (P(None, "tp"), P("tp", None)), P(), (R, N * K), (N * K, COLS), "all_reduce"),
        "flashoverlap_gemm_reduce_scatter": (
            lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"),
            lambda x, w: lax.psum_scatter(x @ w, "tp", tiled=True),
            (P(None, "tp"), P("tp", None)), P("tp", None), (R, N * K), (N * K, COLS),
            "reduce_scatter"),
        "flashoverlap_gemm_all_to_all": (
            lambda x, w: fo.matmul_all_to_all(x, w, "tp"),
            lambda x, w: lax.all_to_all(x @ w, "tp", 0, 0, tiled=True),
            (P(), P()), P("tp", None), (N * R, K), (K, COLS), "all_to_all"),
        "flashoverlap_all_gather_gemm": (
            lambda x, w: fo.all_gather_matmul(x, w, "tp"),
            lambda x, w: lax.all_gather(x, "tp", tiled=True) @ w,
            (P("tp", None), P(None, "tp")), P(None, "tp"), (N * R, K), (K, N * COLS),
            "all_gather"),
    }


def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, BF16)


@pytest.fixture
def fresh_warning(monkeypatch):
    from jax_flashoverlap import primitives
    monkeypatch.setattr(primitives, "_warned_fallbacks", set())
    return primitives.ExportedWithoutOverlapWarning


@pytest.mark.parametrize("target", TARGETS)
def test_export_for_cuda_lowers_to_xla_composition(fo, no_fallback, fresh_warning, target):
    """With our kernels asked for (JAX_FLASHOVERLAP_FALLBACK=0), jit's lowering for CUDA emits
    the custom call (the premise), jax.export's does not: the exported module has XLA's dot
    and collective, and a warning says why, once."""
    ours, _, ins, out, xs, ws, collective = _programs(fo)[target]
    f = jax.jit(shard_map(ours, make_mesh_1d(N), ins, out))
    args = (_sds(*xs), _sds(*ws))
    assert len(custom_call_lines(lower_for_cuda(f, args), target)) == 1
    with pytest.warns(fresh_warning, match="jax.export lowers the ops to XLA's composition"):
        exported = export.export(f, platforms=("cuda",))(*args)
    text = exported.mlir_module()
    assert "custom_call" not in text
    assert "stablehlo.dot_general" in text
    if collective is not None:
        assert f"stablehlo.{collective}" in text
    assert exported.platforms == ("cuda",)
    with warnings.catch_warnings():  # once per process
        warnings.simplefilter("error", fresh_warning)
        export.export(f, platforms=("cuda",))(*args)


def test_export_at_a_shape_the_default_plan_overlaps(fo, fresh_warning, monkeypatch):
    """The default settings at the first DESIGN.md shape on 2 GPUs (the plan overlaps there:
    jit's CUDA lowering has the custom call): jax.export raised JAX's 'Cannot serialize code
    with custom calls' before; it exports XLA's composition now."""
    monkeypatch.delenv("JAX_FLASHOVERLAP_FALLBACK", raising=False)
    mesh = make_mesh_1d(2)
    f = jax.jit(shard_map(lambda x, w: fo.matmul_all_reduce(x, w, "tp"), mesh,
                          (P(None, "tp"), P("tp", None)), P()))
    args = (_sds(4096, 8192), _sds(8192, 8192))
    assert custom_call_lines(lower_for_cuda(f, args), "flashoverlap_gemm_all_reduce")
    with pytest.warns(fresh_warning):
        text = export.export(f, platforms=("cuda",))(*args).mlir_module()
    assert "custom_call" not in text
    assert len(re.findall(r"stablehlo\.all_reduce", text)) == 1


@pytest.mark.parametrize("target", ["flashoverlap_gemm_all_reduce",
                                    "flashoverlap_gemm_reduce_scatter",
                                    "flashoverlap_all_gather_gemm"])
def test_exported_for_cpu_and_cuda_runs_on_cpu_as_the_op(fo, no_fallback, fresh_warning, rng,
                                                         target):
    """One export for both platforms; called here (CPU) it gives the op's own values bit for
    bit, and XLA's composition's within bfloat16 rounding, on fresh random inputs."""
    ours, xla, ins, out, xs, ws, _ = _programs(fo)[target]
    mesh = make_mesh_1d(N)
    f = jax.jit(shard_map(ours, mesh, ins, out))
    x, w = rand(rng, xs, BF16), rand(rng, ws, BF16)
    with pytest.warns(fresh_warning):
        exported = export.export(f, platforms=("cpu", "cuda"))(_sds(*xs), _sds(*ws))
    placed = [jax.device_put(a, NamedSharding(mesh, spec)) for a, spec in zip((x, w), ins)]
    got = np.asarray(jax.jit(exported.call)(*placed), np.float32)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, np.asarray(f(x, w), np.float32))
    want = np.asarray(jax.jit(shard_map(xla, mesh, ins, out))(x, w), np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_plain_cross_lowering_warns_nothing(fo, no_fallback, fresh_warning):
    """Only jax.export takes XLA's composition: jit(...).lower for CUDA emits the custom call
    and no export warning."""
    ours, _, ins, out, xs, ws, _ = _programs(fo)["flashoverlap_gemm_all_reduce"]
    f = jax.jit(shard_map(ours, make_mesh_1d(N), ins, out))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fresh_warning)
        text = lower_for_cuda(f, (_sds(*xs), _sds(*ws)))
    assert custom_call_lines(text, "flashoverlap_gemm_all_reduce")
