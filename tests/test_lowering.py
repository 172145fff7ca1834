"""The ops are real JAX primitives, and their CUDA lowering is an XLA FFI custom call.

Cross-platform lowering works without a GPU on this JAX: `jax.jit(f).trace(*args)
.lower(lowering_platforms=("cuda",))` of a shard_map program over a mesh of *CPU* devices lowers
with the CUDA rules (checked here), and so does the same program over a
`jax.sharding.AbstractMesh` traced with `jax.ShapeDtypeStruct` arguments (no devices at all).
Both are tested. Nothing is compiled or run for CUDA.

The package lowers a shape at which its cost model predicts no gain from overlap to XLA's own
dot + collective even on CUDA (switch: JAX_FLASHOVERLAP_FALLBACK=0 turns that off; "for tests,
benchmarks" per jax_flashoverlap/_ext.py). So the custom-call checks use a real shape (global
M x N x K = 4096 x 8192 x 8192, the first DESIGN.md shape; abstract jax.ShapeDtypeStruct
arguments, nothing that size is allocated) with the fallback off, and one test checks the default
settings at that shape on 2 devices (the GPU machine's configuration), where overlap must be chosen.
"""
import dataclasses
import re

import pytest

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, PartitionSpec as P

from _util import (PRIMITIVE_NAMES, custom_call_lines, lower_for_cuda, make_mesh_1d,
                   make_mesh_2d, shard_map)

OPS = ["all_reduce", "reduce_scatter", "matmul"]
FALLBACK_ENV = "JAX_FLASHOVERLAP_FALLBACK"


SMALL = dict(M=5, K_local=16, N=24)        # jaxpr / eval_shape / CPU lowering
LARGE = dict(M=4096, K_local=2048, N=8192)  # CUDA lowering (global K = 8192 on 4 devices)


def _program(fo, name, mesh, tp_only_2d=False, size=SMALL):
    """(shard_map program, abstract args) using op `name` over axis 'tp' of `mesh`.

    all_reduce: x [M, K] on (dp,) tp;  reduce_scatter: x [M, K] (M rounded to a multiple of the
    axis size);  matmul: data-parallel, x rows sharded over tp, w replicated.
    """
    n = mesh.shape["tp"]
    dp = "dp" if tp_only_2d else None
    ndp = mesh.shape["dp"] if tp_only_2d else 1
    M, Kl, N = size["M"], size["K_local"], size["N"]
    if name == "all_reduce":
        body = lambda a, b: fo.matmul_all_reduce(a, b, "tp")
        x, w = (ndp * M, Kl * n), (Kl * n, N)
        specs = (P(dp, "tp"), P("tp", None)), P(dp, None)
    elif name == "reduce_scatter":
        body = lambda a, b: fo.matmul_reduce_scatter(a, b, "tp")
        Mr = -(-M // n) * n
        x, w = (ndp * Mr, Kl * n), (Kl * n, N)
        specs = (P(dp, "tp"), P("tp", None)), P((dp, "tp") if dp else "tp", None)
    else:
        body = lambda a, b: fo.matmul(a, b)
        x, w = (ndp * M * n, Kl), (Kl, N)
        specs = (P((dp, "tp") if dp else "tp", None), P()), P((dp, "tp") if dp else "tp", None)
    f = shard_map(body, mesh, specs[0], specs[1])
    args = (jax.ShapeDtypeStruct(x, jnp.bfloat16), jax.ShapeDtypeStruct(w, jnp.bfloat16))
    return f, args


def _prim_re(prim):
    # whole name: 'flashoverlap_gemm' must not match inside 'flashoverlap_gemm_all_reduce'
    return rf"(?<![A-Za-z0-9_]){re.escape(prim)}(?![A-Za-z0-9_])"


# ------------------------------------------------------------------ primitives in the jaxpr

def _primitive_names(jaxpr):
    """Names of all primitives in a (Closed)Jaxpr, recursing into sub-jaxprs in eqn params."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (list, tuple)) else (v,)):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    names.extend(_primitive_names(sub))
    return names


@pytest.mark.parametrize("name", OPS)
def test_jaxpr_shows_primitive(fo, name):
    f, args = _program(fo, name, make_mesh_1d(4))
    jaxpr = jax.make_jaxpr(f)(*args)
    text = str(jaxpr)
    assert re.search(_prim_re(PRIMITIVE_NAMES[name]), text), text
    # a real primitive (an equation whose primitive has that name), not just a name in a param
    assert PRIMITIVE_NAMES[name] in _primitive_names(jaxpr), (_primitive_names(jaxpr), text)


@pytest.mark.parametrize("name", OPS)
def test_eval_shape_of_program(fo, name):
    """Abstract evaluation (no lowering) gives the right global result shape and dtype."""
    f, args = _program(fo, name, make_mesh_1d(4))
    out = jax.eval_shape(f, *args)
    M, N = args[0].shape[0], args[1].shape[1]
    assert out.shape == (M, N) and out.dtype == jnp.bfloat16


# ------------------------------------------------------------------ CUDA lowering without a GPU

def _auto_abstract_mesh(sizes, names):
    """An AbstractMesh with Auto axes (newer JAX defaults to Explicit, under which shard_map
    checks the arguments' own shardings, which ShapeDtypeStructs do not carry)."""
    try:
        from jax.sharding import AxisType

        return AbstractMesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))
    except (ImportError, TypeError):  # older JAX: Auto is the only behaviour
        return AbstractMesh(sizes, names)


_cuda_text, _custom_call_lines = lower_for_cuda, custom_call_lines


def _check_cuda_lowering(text, name, per_device_out, world):
    target = PRIMITIVE_NAMES[name]
    lines = _custom_call_lines(text, target)
    assert lines, f"no custom_call to {target} in CUDA lowering:\n{text}"
    call = "\n".join(lines)
    required = (["comm_sms", "transpose_w", "poison_outputs"]
                + (["comm_id"] if name != "matmul" else []))
    for attr in required:
        assert re.search(rf"\b{attr}\b", call), f"attribute {attr} missing from:\n{call}"
    if name != "matmul":  # the ranks of the reduced axis, not of the whole mesh
        found = re.findall(r"\bworld_size\s*=\s*(\d+)", call)
        assert found == [str(world)] * len(lines), f"world_size {found} != {world}:\n{call}"
    M, N = per_device_out
    assert f"tensor<{M}x{N}xbf16>" in call, f"per-device result {M}x{N}xbf16 not in:\n{call}"


def _per_device_out(name, n, args):
    M, N = args[0].shape[0], args[1].shape[1]
    if name == "reduce_scatter":
        return M // n, N
    if name == "matmul":
        return M // n, N
    return M, N


@pytest.mark.parametrize("name", OPS)
def test_cuda_lowering_cpu_mesh(fo, no_fallback, name):
    mesh = make_mesh_1d(4)
    f, args = _program(fo, name, mesh, size=LARGE)
    text = _cuda_text(f, args)
    _check_cuda_lowering(text, name, _per_device_out(name, 4, args), 4)


@pytest.mark.parametrize("name", OPS)
def test_cuda_lowering_default_settings_two_devices(fo, monkeypatch, name):
    """Default settings (no switch), 2 devices, global 4096 x 8192 x 8192: overlap pays here."""
    monkeypatch.delenv(FALLBACK_ENV, raising=False)
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    size = dict(M=4096, K_local=4096, N=8192)
    f, args = _program(fo, name, make_mesh_1d(2), size=size)
    _check_cuda_lowering(_cuda_text(f, args), name, _per_device_out(name, 2, args), 2)


@pytest.mark.parametrize("name", OPS)
def test_cuda_lowering_abstract_mesh(fo, no_fallback, name):
    mesh = _auto_abstract_mesh((4,), ("tp",))
    f, args = _program(fo, name, mesh, size=LARGE)
    text = _cuda_text(f, args)
    _check_cuda_lowering(text, name, _per_device_out(name, 4, args), 4)


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_cuda_lowering_2d_mesh(fo, no_fallback, name):
    """Collective over 'tp' of a (dp=2, tp=4) mesh."""
    mesh = make_mesh_2d(2, 4)
    f, args = _program(fo, name, mesh, tp_only_2d=True, size=LARGE)
    text = _cuda_text(f, args)
    M, N = args[0].shape[0] // 2, args[1].shape[1]
    _check_cuda_lowering(text, name, (M // 4 if name == "reduce_scatter" else M, N), 4)


def test_cuda_lowering_distinct_comm_ids_per_axis(fo, no_fallback):
    """Two collectives over different mesh axes in one program must not share a communicator id."""
    mesh = make_mesh_2d(2, 4)

    def body(a, b, c, d):
        return fo.matmul_all_reduce(a, b, "tp"), fo.matmul_all_reduce(c, d, "dp")

    f = shard_map(body, mesh, (P(None, "tp"), P("tp", None), P(None, "dp"), P("dp", None)),
                  (P(), P()))
    args = tuple(jax.ShapeDtypeStruct(s, jnp.bfloat16)
                 for s in [(4096, 8192), (8192, 8192), (4096, 8192), (8192, 8192)])
    text = _cuda_text(f, args)
    lines = _custom_call_lines(text, PRIMITIVE_NAMES["all_reduce"])
    assert len(lines) == 2, text
    ids = [re.search(r"comm_id\s*=\s*([^,}\s]+)", ln) for ln in lines]
    assert all(ids), lines
    assert ids[0].group(1) != ids[1].group(1), lines


@pytest.mark.parametrize("name", OPS)
def test_cpu_lowering_has_no_custom_call(fo, name):
    """On CPU the primitives lower to the reference composition (DESIGN.md, primitives.py)."""
    f, args = _program(fo, name, make_mesh_1d(4))
    text = jax.jit(f).trace(*args).lower().as_text()
    assert "flashoverlap_gemm" not in text, text
    assert "dot_general" in text


@pytest.mark.parametrize("buffer", [None, "workspace", "output"])
def test_cuda_lowering_all_reduce_buffer_switch(fo, no_fallback, monkeypatch, buffer):
    """JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output lowers the all-reduce with in_place = 1 (the
    GEMM and NCCL work on XLA's output, no workspace); the reduce-scatter has no such mode."""
    if buffer is None:
        monkeypatch.delenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", raising=False)
    else:
        monkeypatch.setenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", buffer)
    mesh = make_mesh_1d(4)
    for name in ("all_reduce", "reduce_scatter"):
        f, args = _program(fo, name, mesh, size=LARGE)
        call = "\n".join(_custom_call_lines(_cuda_text(f, args), PRIMITIVE_NAMES[name]))
        found = re.search(r"in_place\s*=\s*(\d+)", call)
        if name == "reduce_scatter":
            assert found is None, call
        else:
            assert found is not None, call
            assert found.group(1) == ("1" if buffer == "output" else "0"), call


def _every_op_lowered_for_cuda(fo):
    """{target: its custom-call line} for each op (the plain GEMM and the four overlapped ops),
    cross-lowered for CUDA over 2 devices."""
    n, R, K, N = 2, 512, 1024, 1024
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)  # noqa: E731
    mesh = make_mesh_1d(n)
    programs = {
        "flashoverlap_gemm": (lambda x, w: fo.matmul(x, w), (P(), P()), P(), (R, K), (K, N)),
        "flashoverlap_gemm_all_reduce": (lambda x, w: fo.matmul_all_reduce(x, w, "tp"),
                                         (P(None, "tp"), P("tp", None)), P(), (R, n * K), (n * K, N)),
        "flashoverlap_gemm_reduce_scatter": (lambda x, w: fo.matmul_reduce_scatter(x, w, "tp"),
                                             (P(None, "tp"), P("tp", None)), P("tp", None),
                                             (R, n * K), (n * K, N)),
        "flashoverlap_gemm_all_to_all": (lambda x, w: fo.matmul_all_to_all(x, w, "tp"),
                                         (P(), P()), P("tp", None), (n * R, K), (K, N)),
        "flashoverlap_all_gather_gemm": (lambda x, w: fo.all_gather_matmul(x, w, "tp"),
                                         (P("tp", None), P(None, "tp")), P(None, "tp"),
                                         (n * R, K), (K, n * N)),
    }
    lines = {}
    for target, (body, ins, out, xs, ws) in programs.items():
        text = _cuda_text(shard_map(body, mesh, ins, out), (bf16(*xs), bf16(*ws)))
        found = _custom_call_lines(text, target)
        assert len(found) == 1, (target, text)
        lines[target] = found[0]
    return lines


@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_cuda_lowering_poison_outputs_switch(fo, no_fallback, monkeypatch, switch):
    """JAX_FLASHOVERLAP_POISON_OUTPUTS=1 (a test switch) gives every custom call
    poison_outputs = 1 (its handler then fills the outputs with NaN before the call); unset
    or 0, poison_outputs = 0."""
    if switch is None:
        monkeypatch.delenv("JAX_FLASHOVERLAP_POISON_OUTPUTS", raising=False)
    else:
        monkeypatch.setenv("JAX_FLASHOVERLAP_POISON_OUTPUTS", switch)
    want = "1" if switch == "1" else "0"
    for target, call in _every_op_lowered_for_cuda(fo).items():
        found = re.findall(r"poison_outputs\s*=\s*(\d+)", call)
        assert found == [want], (target, call)


def test_poison_outputs_switch_typo_is_an_error(fo, no_fallback, monkeypatch):
    monkeypatch.setenv("JAX_FLASHOVERLAP_POISON_OUTPUTS", "nan")
    with pytest.raises(ValueError, match="JAX_FLASHOVERLAP_POISON_OUTPUTS='nan' is not an on/off"):
        _every_op_lowered_for_cuda(fo)


def test_in_place_plan_uses_the_plain_buffer_model():
    """In place, the all-reduce is priced with plain-buffer NCCL (slower per CTA) and no copy;
    tuned entries (measured with the workspace) are not used for it."""
    from jax_flashoverlap import plan as P

    ws = P.choose_plan("all_reduce", 8192, 8192, 4096, 2, gpu="NVIDIA H200")
    ip = P.choose_plan("all_reduce", 8192, 8192, 4096, 2, gpu="NVIDIA H200", in_place=True)
    assert ip == P.default_plan("all_reduce", 8192, 8192, 4096, 2, 2, dataclasses.replace(
        P.DEFAULT_PROFILE, all_reduce_in_place=True))
    bands = (0, 4096, 8192)
    slow = P.plan_time("all_reduce", 8192, 8192, 4096, 2, bands, 8, 2, dataclasses.replace(
        P.DEFAULT_PROFILE, all_reduce_in_place=True))
    assert slow > P.plan_time("all_reduce", 8192, 8192, 4096, 2, bands, 8)
    assert ws.predicted_s > 0 and ip.predicted_s > 0
    # reduce-scatter ignores the switch
    assert P.choose_plan("reduce_scatter", 8192, 8192, 4096, 2, in_place=True) == \
        P.choose_plan("reduce_scatter", 8192, 8192, 4096, 2)


def test_cuda_lowering_cta_policy_selects_its_own_communicators(fo, no_fallback):
    """A plan's CTA policy is part of its communicators' identity (comm_id): the same program
    under plan.forced(cta_policy=...) calls another communicator."""
    from jax_flashoverlap import plan as P

    mesh = make_mesh_1d(4)
    ids = {}
    for policy in ("default", "efficiency"):
        f, args = _program(fo, "all_reduce", mesh, size=LARGE)
        with P.forced(comm_sms=16, cta_policy=policy):
            call = "\n".join(_custom_call_lines(_cuda_text(f, args), PRIMITIVE_NAMES["all_reduce"]))
        ids[policy] = re.search(r"comm_id\s*=\s*([^,}\s]+)", call).group(1)
    assert ids["default"] != ids["efficiency"], ids


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_cuda_lowering_fallback_and_its_overrides(fo, monkeypatch, name):
    """A small shape (the cost model predicts no gain): with default settings the CUDA lowering
    is XLA's own dot + collective; JAX_FLASHOVERLAP_FALLBACK=0 or an explicit comm_sms keeps
    our kernels (primitives.keep_reference). Unchecked before: making an explicit comm_sms
    fall back too passed every CPU test."""
    from jax_flashoverlap import plan as plan_lib

    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    monkeypatch.delenv(FALLBACK_ENV, raising=False)
    size = dict(M=64, K_local=64, N=64)
    assert not plan_lib.choose_plan(name, 64, 64, 64, 2, 2).overlap  # the premise: no gain
    target = PRIMITIVE_NAMES[name]
    mesh = make_mesh_1d(2)

    def calls(comm_sms=None):
        f, args = _program(fo, name, mesh, size=size)
        if comm_sms is not None:
            op = fo.matmul_all_reduce if name == "all_reduce" else fo.matmul_reduce_scatter
            out = P() if name == "all_reduce" else P("tp", None)
            f = shard_map(lambda a, b: op(a, b, "tp", comm_sms=comm_sms), mesh,
                          (P(None, "tp"), P("tp", None)), out)
        text = _cuda_text(f, args)
        return text, _custom_call_lines(text, target)

    text, found = calls()
    assert not found and "dot_general" in text, text  # the fallback: XLA's composition
    assert len(calls(comm_sms=8)[1]) == 1             # an explicit comm_sms: ours
    monkeypatch.setenv(FALLBACK_ENV, "0")
    assert len(calls()[1]) == 1                       # the fallback switched off: ours


@pytest.mark.parametrize("name, dim", [("all_reduce", "M"), ("reduce_scatter", "M"),
                                       ("all_reduce", "K"), ("reduce_scatter", "N"),
                                       ("matmul", "M"), ("matmul", "K")])
def test_dims_past_the_kernels_limit_take_xlas_path_or_raise(fo, monkeypatch, name, dim):
    """M, N or K >= 2^30: the kernel launcher refuses the call at run time (and M >= 2^31
    overflowed the int32 band_rows attribute: OverflowError). With the default settings XLA's
    composition takes it; with the fallback off (or an explicit comm_sms) a ValueError names
    the dimension. Abstract shapes: nothing of that size is allocated."""
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    monkeypatch.delenv(FALLBACK_ENV, raising=False)
    big = (1 << 31) + 256 if dim == "M" else 1 << 30
    size = dict(M=big if dim == "M" else 256, K_local=big if dim == "K" else 64,
                N=big if dim == "N" else 64)
    mesh = make_mesh_1d(2)
    text = _cuda_text(*_program(fo, name, mesh, size=size))
    assert not _custom_call_lines(text, PRIMITIVE_NAMES[name]) and "dot_general" in text
    monkeypatch.setenv(FALLBACK_ENV, "0")  # a new program each time: lowerings are cached
    f, args = _program(fo, name, mesh, size=size)
    with pytest.raises(ValueError, match=rf"{dim}=\d+ \(.*\) must be < 2\^30"):
        _cuda_text(f, args)
    if name != "matmul":  # an explicit comm_sms asks for our kernels too
        monkeypatch.delenv(FALLBACK_ENV)
        op = fo.matmul_all_reduce if name == "all_reduce" else fo.matmul_reduce_scatter
        g = shard_map(lambda a, b: op(a, b, "tp", comm_sms=8), mesh,
                      (P(None, "tp"), P("tp", None)), P() if name == "all_reduce" else P("tp"))
        with pytest.raises(ValueError, match=f"{dim}=.* must be < 2\\^30"):
            _cuda_text(g, args)


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_a_forced_plan_past_the_kernels_limit_raises(fo, monkeypatch, name):
    """A forced plan asks for our kernels, as the fallback switched off does: with the default
    settings otherwise, a dim past their limit is a ValueError naming it, not XLA's path."""
    from jax_flashoverlap import plan as plan_lib
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    monkeypatch.delenv(FALLBACK_ENV, raising=False)
    f, args = _program(fo, name, make_mesh_1d(2), size=dict(M=256, K_local=1 << 30, N=64))
    with plan_lib.forced(comm_sms=16):
        with pytest.raises(ValueError, match=r"K=\d+ \(.*\) must be < 2\^30"):
            _cuda_text(f, args)


@pytest.mark.parametrize("fallback", [None, "0"], ids=["default", "fallback_off"])
@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_forced_overlap_off_past_the_kernels_limit_is_xlas_path(fo, monkeypatch, name,
                                                                fallback):
    """forced(overlap=False) asks for XLA's dot + collective (keep_reference), not our
    kernels: a dim past their limit lowers to XLA's composition (it raised "a forced plan
    ... asked for our kernels"), also with the fallback switched off."""
    from jax_flashoverlap import plan as plan_lib
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    monkeypatch.delenv(FALLBACK_ENV, raising=False)
    if fallback is not None:
        monkeypatch.setenv(FALLBACK_ENV, fallback)
    f, args = _program(fo, name, make_mesh_1d(2), size=dict(M=256, K_local=1 << 30, N=64))
    with plan_lib.forced(overlap=False):
        text = _cuda_text(f, args)
    assert not _custom_call_lines(text, PRIMITIVE_NAMES[name]) and "dot_general" in text


@pytest.mark.parametrize("op", ["all_to_all", "all_gather"])
def test_all_to_all_and_all_gather_leave_a_huge_k_to_xla(fo, no_fallback, op):
    """Their shape checks (plan_a2a.a2a_supported / all_gather_supported) covered M and N
    only: K >= 2^30 emitted a custom call the launcher refuses at run time."""
    n, k = 2, 1 << 30
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)  # noqa: E731
    if op == "all_to_all":
        body, ins, out = lambda x, w: fo.matmul_all_to_all(x, w, "tp"), (P("tp"), P()), P("tp")
        args, target = (bf16(n * 512, k), bf16(k, 512)), "flashoverlap_gemm_all_to_all"
    else:
        body = lambda x, w: fo.all_gather_matmul(x, w, "tp")  # noqa: E731
        ins, out = (P("tp"), P(None, "tp")), P(None, "tp")
        args, target = (bf16(n * 512, k), bf16(k, n * 512)), "flashoverlap_all_gather_gemm"
    text = _cuda_text(shard_map(body, make_mesh_1d(n), ins, out), args)
    assert not _custom_call_lines(text, target) and "dot_general" in text


@pytest.mark.parametrize("env, value", [
    ("FLASHOVERLAP_GEMM_SERPENTINE", "0"), ("FLASHOVERLAP_GEMM_SERPENTINE", " 1"),
    ("FLASHOVERLAP_GEMM_LOG", "1"), ("FLASHOVERLAP_GEMM_TILE", "128"),
    ("FLASHOVERLAP_GEMM_TILE", "0"), ("FLASHOVERLAP_GEMM_PANEL", "12"),
    ("FLASHOVERLAP_GEMM_PANEL", ""), ("JAX_FLASHOVERLAP_WAIT", "spin")])
def test_kernel_integer_variables_accept_their_values(fo, no_fallback, monkeypatch, env, value):
    """The values the C++ reads as meant (atoi; exactly 'spin') still lower to our custom
    calls; words and out-of-range integers are bad-input rows (env-gemm-serpentine-word ...)."""
    monkeypatch.setenv(env, value)
    assert len(_every_op_lowered_for_cuda(fo)) == 5


@pytest.mark.parametrize("name", ["matmul", "all_reduce"])
def test_a_gpu_with_other_than_132_sms(fo, no_fallback, monkeypatch, name):
    """On a GPU of 114 SMs (an H100 PCIe) a comm_sms its launcher would refuse (more than
    sms - 2) is an error when lowering, naming the GPU's count, not at run time; a valid one
    lowers, with one warning that the default plans are modelled on 132 SMs. 132 SMs: no
    warning."""
    import warnings
    from jax_flashoverlap import _ext, primitives
    monkeypatch.setattr(primitives, "_warned_sm_count", set())
    mesh = make_mesh_1d(2)
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)  # noqa: E731
    if name == "matmul":
        program = lambda sms: (lambda x, w: fo.matmul(x, w, comm_sms=sms), (bf16(512, 1024),  # noqa: E731
                                                                             bf16(1024, 1024)))
    else:
        program = lambda sms: (shard_map(  # noqa: E731
            lambda x, w: fo.matmul_all_reduce(x, w, "tp", comm_sms=sms), mesh,
            (P(None, "tp"), P("tp", None)), P()), (bf16(512, 2048), bf16(2048, 1024)))
    monkeypatch.setattr(_ext, "local_gpu_sms", lambda: 114)
    with pytest.raises(ValueError, match=r"comm_sms=120 leaves fewer than 2 of this GPU's 114 "
                                         r"SMs to the GEMM \(at most 112\)"):
        lower_for_cuda(*program(120))
    with pytest.warns(primitives.SMCountWarning, match="this GPU has 114 SMs; the default "
                                                      "group plans are modelled on 132"):
        assert custom_call_lines(lower_for_cuda(*program(16)), "flashoverlap_" + (
            "gemm" if name == "matmul" else "gemm_all_reduce"))
    monkeypatch.setattr(_ext, "local_gpu_sms", lambda: 132)
    with warnings.catch_warnings():
        warnings.simplefilter("error", primitives.SMCountWarning)
        lower_for_cuda(*program(120))


@pytest.mark.parametrize("sms", [114, 78])
def test_the_sm_count_check_leaves_the_gemm_exactly_two_sms(monkeypatch, sms):
    """comm_sms = sms - 2 leaves the GEMM one 2-SM cluster and is taken; one more is not (the
    test above checks a comm_sms far past the limit only)."""
    import warnings
    from jax_flashoverlap import primitives
    monkeypatch.setattr(primitives, "_warned_sm_count", set())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", primitives.SMCountWarning)
        primitives.check_sm_count("op", sms - 2, sms=sms)
    with pytest.raises(ValueError, match=rf"comm_sms={sms - 1} leaves fewer than 2 of this "
                                         rf"GPU's {sms} SMs to the GEMM \(at most {sms - 2}\)"):
        primitives.check_sm_count("op", sms - 1, sms=sms)


@pytest.mark.parametrize("variable,value", [
    ("JAX_FLASHOVERLAP_TRANSPORT", "pear"), ("JAX_FLASHOVERLAP_WATCHDOG_S", "x"),
    ("JAX_FLASHOVERLAP_TUNED", "nah"), ("FLASHOVERLAP_TRACE", "maybe"),
    ("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", "out"), ("JAX_FLASHOVERLAP_GRANT_PEER_ACCESS", "y")])
@pytest.mark.parametrize("name", OPS)
def test_a_misspelt_switch_is_an_error_in_every_cuda_lowering(fo, monkeypatch, name, variable,
                                                              value):
    """Every CUDA lowering reads every switch, as the CPU lowering does: at a small shape the
    op falls back to XLA's composition and read none of these, so a typo passed silently
    (and the same program on CPU refused it)."""
    monkeypatch.setenv(variable, value)
    jax.clear_caches()
    f, args = _program(fo, name, make_mesh_1d(4))
    with pytest.raises(ValueError, match=rf"{variable}.*{re.escape(repr(value))}"):
        lower_for_cuda(f, args)


def test_a_misspelt_switch_is_an_error_in_the_other_ops_cuda_lowerings(fo, monkeypatch):
    """The same for the all-to-all and the all-gather (primitives_a2a.py)."""
    monkeypatch.setenv("JAX_FLASHOVERLAP_TRANSPORT", "pear")
    jax.clear_caches()
    mesh = make_mesh_1d(4)
    x, w = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16), jax.ShapeDtypeStruct((32, 64), jnp.bfloat16)
    programs = [
        shard_map(lambda a, b: fo.matmul_all_to_all(a, b, "tp"), mesh,
                  (P("tp", None), P()), P("tp", None)),
        shard_map(lambda a, b: fo.all_gather_matmul(a, b, "tp"), mesh,
                  (P("tp", None), P(None, "tp")), P(None, "tp")),
    ]
    for f in programs:
        with pytest.raises(ValueError, match="JAX_FLASHOVERLAP_TRANSPORT.*'pear'"):
            lower_for_cuda(f, (x, w))


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter"])
def test_cuda_lowering_world_size_over_two_axes(fo, no_fallback, name):
    """axis_name=('dp', 'tp'): the collective spans both axes of a (2, 4) mesh, so the custom
    call's world_size is their product, 8 (the tests above reduce over one axis only)."""
    mesh = make_mesh_2d(2, 4)
    axes = ("dp", "tp")
    M, Kl, N = LARGE["M"], LARGE["K_local"], LARGE["N"]
    if name == "all_reduce":
        body = lambda a, b: fo.matmul_all_reduce(a, b, axes)  # noqa: E731
        out_spec = P()
    else:
        body = lambda a, b: fo.matmul_reduce_scatter(a, b, axes)  # noqa: E731
        out_spec = P(axes, None)
    f = shard_map(body, mesh, (P(None, axes), P(axes, None)), out_spec)
    args = (jax.ShapeDtypeStruct((M, Kl * 8), jnp.bfloat16),
            jax.ShapeDtypeStruct((Kl * 8, N), jnp.bfloat16))
    _check_cuda_lowering(_cuda_text(f, args), name,
                         (M // 8 if name == "reduce_scatter" else M, N), 8)


@pytest.mark.parametrize("buffer", ["workspace", "output"])
def test_cuda_lowering_asks_for_each_reducing_ops_workspace(fo, no_fallback, monkeypatch,
                                                            buffer):
    """Lowered for this machine's GPUs (the communicator calls faked and recorded here), each
    reducing op asks for a workspace of its product, M x N bf16; the all-reduce in place
    (JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output) for none, and the reduce-scatter has no such
    mode."""
    from jax_flashoverlap import comm
    monkeypatch.setenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", buffer)
    made = []
    monkeypatch.setattr(comm, "mesh_is_local_gpu", lambda mesh: True)
    monkeypatch.setattr(comm, "ensure_communicators", lambda *a, **k: made.append(k))
    for name in ("all_reduce", "reduce_scatter"):
        made.clear()
        f, args = _program(fo, name, make_mesh_1d(4), size=LARGE)
        assert len(_custom_call_lines(_cuda_text(f, args), PRIMITIVE_NAMES[name])) == 1
        in_place = name == "all_reduce" and buffer == "output"
        product = LARGE["M"] * LARGE["N"] * 2
        assert [k["workspace_bytes"] for k in made] == [0 if in_place else product], made


@pytest.mark.parametrize("comm_sms", [None, 16])
def test_cuda_lowering_of_the_plain_gemm_passes_its_signal_groups(fo, no_fallback, comm_sms):
    """The plain GEMM's call: comm_sms (0 by default: every SM computes) and the row groups
    it signals (primitives.GEMM_SIGNAL_GROUPS, enough to exercise the signaling path)."""
    from jax_flashoverlap import primitives
    kw = {} if comm_sms is None else {"comm_sms": comm_sms}
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)  # noqa: E731
    text = _cuda_text(lambda x, w: fo.matmul(x, w, **kw), (bf16(512, 1024), bf16(1024, 1024)))
    (call,) = _custom_call_lines(text, PRIMITIVE_NAMES["matmul"])
    assert primitives.GEMM_SIGNAL_GROUPS > 1
    assert f"num_groups = {primitives.GEMM_SIGNAL_GROUPS} : i32" in call, call
    assert f"comm_sms = {comm_sms or 0} : i32" in call, call
