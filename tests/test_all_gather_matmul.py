"""all_gather_matmul (issue #9) on CPU devices: values, gradients, vmap, errors, CUDA lowering.

Reference: lax.all_gather(x, axis, axis=0, tiled=True) @ w, the sequence-parallel
column-parallel layer: x rows sharded over tp, w columns sharded over tp.
"""
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from _util import (DTYPES, DTYPE_IDS, FakeCommExtension, assert_close, assert_rel_fro,
                   custom_call_lines, lower_for_cuda, make_mesh_1d, make_mesh_2d,
                   rand, shard_map, upcast)

SPECS = (P("tp", None), P(None, "tp")), P(None, "tp")


def _ref(axis="tp"):
    return lambda x, w: lax.all_gather(x, axis, axis=0, tiled=True) @ w


def _ours(fo, axis="tp", **kw):
    return lambda x, w: fo.all_gather_matmul(x, w, axis, **kw)


def _run(body, mesh, x, w, specs=SPECS):
    return jax.jit(shard_map(body, mesh, *specs))(x, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_values(fo, tp_mesh, dtype, rows, rng):
    n = tp_mesh.shape["tp"]
    x = rand(rng, (n * rows, 24), dtype)
    w = rand(rng, (24, n * 16), dtype, scale=24 ** -0.5)
    got = _run(_ours(fo), tp_mesh, x, w)
    assert got.shape == (n * rows, n * 16)
    assert_close(got, _run(_ref(), tp_mesh, x, w))
    assert_rel_fro(got, _run(_ref(), tp_mesh, *upcast(x, w)))


def test_leading_dims(fo, rng):
    """x [B, S, K]: gathered along B (the first dim), as lax.all_gather(axis=0) does."""
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 2, 3, 16), jnp.bfloat16)
    w = rand(rng, (16, 32), jnp.bfloat16)
    specs = (P("tp", None, None), P(None, "tp")), P(None, None, "tp")
    body = lambda a, b: fo.all_gather_matmul(a, b, "tp")
    ref = lambda a, b: lax.all_gather(a, "tp", axis=0, tiled=True) @ b
    got = jax.jit(shard_map(body, mesh, *specs))(x, w)
    assert got.shape == (8, 3, 32)
    assert_close(got, jax.jit(shard_map(ref, mesh, *specs))(x, w))


@pytest.mark.parametrize("transpose_w", [False, True], ids=["w_kn", "w_nk"])
@pytest.mark.parametrize("shape,spec,dim", [
    ((3, 4 * 5, 16), P(None, "tp", None), 1),            # [B, S, K]: S gathered
    ((3, 4 * 5, 16), P(None, "tp", None), -1),
    ((2, 3, 4 * 2, 16), P(None, None, "tp", None), 2),
    ((4 * 2, 3, 16), P("tp", None, None), 0),            # the default, stated
], ids=["dim1", "dim-1", "dim2_of_4d", "dim0"])
def test_sequence_dim(fo, rng, shape, spec, dim, transpose_w):
    """sequence_dim=d: lax.all_gather(x, axis=d, tiled=True) @ w, and the gathered x too."""
    mesh = make_mesh_1d(4)
    x = rand(rng, shape, jnp.bfloat16)
    w = rand(rng, (32, 16) if transpose_w else (16, 32), jnp.bfloat16, scale=0.25)
    d = dim % (len(shape) - 1)
    out_spec = P(*(None,) * (len(shape) - 1), "tp")  # the sequence whole, N over tp
    # each device's gathered x (all of it) stacked along the sequence dim
    gathered_spec = P(*(None,) * d, "tp")
    specs = (spec, P("tp", None) if transpose_w else P(None, "tp")), (out_spec, gathered_spec)

    def ours(a, b):
        return fo.all_gather_matmul(a, b, "tp", sequence_dim=dim, transpose_w=transpose_w,
                                    return_gathered=True)

    def ref(a, b):
        g = lax.all_gather(a, "tp", axis=d, tiled=True)
        return (g @ b.T if transpose_w else g @ b), g

    got, gathered = jax.jit(shard_map(ours, mesh, *specs))(x, w)
    want, want_gathered = jax.jit(shard_map(ref, mesh, *specs))(x, w)
    assert got.shape == (*shape[:-1], 32)
    assert_close(got, want)
    stacked = np.concatenate([np.asarray(x, np.float32)] * 4, axis=d)
    np.testing.assert_array_equal(np.asarray(gathered, np.float32), stacked)
    np.testing.assert_array_equal(np.asarray(want_gathered, np.float32), stacked)


def test_2d_mesh_over_tp(fo, rng):
    mesh = make_mesh_2d(2, 4)
    x = rand(rng, (2 * 4 * 5, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)
    specs = (P(("dp", "tp"), None), P(None, "tp")), P("dp", "tp")
    assert_close(_run(_ours(fo), mesh, x, w, specs), _run(_ref(), mesh, x, w, specs))


def test_grads(fo, rng):
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 6, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal((24, 32)), jnp.float32)

    def grads(body):
        f = shard_map(body, mesh, *SPECS)
        return jax.jit(jax.grad(lambda a, b: jnp.sum(f(a, b).astype(jnp.float32) * ct),
                                argnums=(0, 1)))(x, w)

    for g, r in zip(grads(_ours(fo)), grads(_ref())):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


def test_grad_inside_shard_map(fo, rng):
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 6, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)

    def wrap(op):
        def body(a, b):
            return jax.grad(lambda a, b: jnp.sum(op(a, b).astype(jnp.float32) ** 2),
                            argnums=(0, 1))(a, b)
        return jax.jit(shard_map(body, mesh, SPECS[0], SPECS[0]))

    for g, r in zip(wrap(_ours(fo))(x, w), wrap(_ref())(x, w)):
        assert_close(g, r)


@pytest.mark.parametrize("w_batched", [False, True], ids=["x_batched", "both_batched"])
def test_vmap(fo, w_batched, rng):
    mesh = make_mesh_1d(4)
    B = 3
    x = rand(rng, (B, 4 * 5, 16), jnp.bfloat16)
    w = rand(rng, (B, 16, 32), jnp.bfloat16) if w_batched else rand(rng, (16, 32), jnp.bfloat16)
    in_axes = (0, 0 if w_batched else None)
    specs = (P(None, "tp", None), P(None, None, "tp") if w_batched else P(None, "tp")), P(None, None, "tp")
    run = lambda op: jax.jit(shard_map(jax.vmap(op, in_axes=in_axes), mesh, *specs))(x, w)
    assert_close(run(_ours(fo)), run(_ref()))


# ------------------------------------------------------------------ return_gathered

GATHERED_SPECS = (P("tp", None), P(None, "tp")), (P(None, "tp"), P("tp", None))


def _ours_gathered(fo, **kw):
    return lambda x, w: fo.all_gather_matmul(x, w, "tp", return_gathered=True, **kw)


def _ref_gathered(transpose_w=False):
    def ref(x, w):
        g = lax.all_gather(x, "tp", axis=0, tiled=True)
        return g @ (w.T if transpose_w else w), g
    return ref


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("transpose_w", [False, True], ids=["kn", "nk"])
def test_return_gathered_values(fo, n, transpose_w, rng):
    """(out, gathered): out as without the flag, gathered == all_gather(x) bit for bit, on
    every device (the out_spec stacks the n devices' copies)."""
    mesh = make_mesh_1d(n)
    x = rand(rng, (n * 5, 24), jnp.bfloat16)
    w = rand(rng, (n * 16, 24) if transpose_w else (24, n * 16), jnp.bfloat16, scale=24 ** -0.5)
    w_spec = P("tp", None) if transpose_w else P(None, "tp")
    specs = (P("tp", None), w_spec), (P(None, "tp"), P("tp", None))
    out, gathered = _run(_ours_gathered(fo, transpose_w=transpose_w), mesh, x, w, specs)
    ref_out, ref_gathered = _run(_ref_gathered(transpose_w), mesh, x, w, specs)
    assert out.shape == (n * 5, n * 16) and gathered.shape == (n * n * 5, 24)
    np.testing.assert_array_equal(np.asarray(gathered), np.tile(np.asarray(x), (n, 1)))
    np.testing.assert_array_equal(np.asarray(gathered), np.asarray(ref_gathered))
    assert_close(out, ref_out)
    plain = _run(_ours(fo, transpose_w=transpose_w), mesh, x, w, ((P("tp", None), w_spec),
                                                                   P(None, "tp")))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))


def test_return_gathered_leading_dims(fo, rng):
    """x [B, S, K]: gathered [n*B, S, K], as lax.all_gather(axis=0, tiled=True)."""
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 2, 3, 16), jnp.bfloat16)
    w = rand(rng, (16, 32), jnp.bfloat16)
    specs = (P("tp", None, None), P(None, "tp")), (P(None, None, "tp"), P("tp", None, None))
    out, gathered = _run(_ours_gathered(fo), mesh, x, w, specs)
    assert out.shape == (8, 3, 32) and gathered.shape == (4 * 8, 3, 16)
    np.testing.assert_array_equal(np.asarray(gathered), np.tile(np.asarray(x), (4, 1, 1)))


def test_return_gathered_grads_flow_through_both_results(fo, rng):
    """A loss on both results: grads equal those of the reference composition (the
    gathered rows' cotangent reduce-scatters back onto x)."""
    mesh = make_mesh_1d(4)
    x = rand(rng, (4 * 6, 32), jnp.bfloat16)
    w = rand(rng, (32, 4 * 8), jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal((24, 32)), jnp.float32)
    ct_g = jnp.asarray(rng.standard_normal((4 * 24, 32)), jnp.float32)

    def grads(body):
        f = shard_map(body, mesh, *GATHERED_SPECS)

        def loss(a, b):
            out, g = f(a, b)
            return jnp.sum(out.astype(jnp.float32) * ct) + jnp.sum(g.astype(jnp.float32) * ct_g)
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)

    for g, r in zip(grads(_ours_gathered(fo)), grads(_ref_gathered())):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, r)


def test_return_gathered_vmap(fo, rng):
    mesh = make_mesh_1d(4)
    x = rand(rng, (3, 4 * 5, 16), jnp.bfloat16)
    w = rand(rng, (16, 32), jnp.bfloat16)
    specs = (P(None, "tp", None), P(None, "tp")), (P(None, None, "tp"), P(None, "tp", None))
    run = lambda op: jax.jit(shard_map(jax.vmap(op, in_axes=(0, None)), mesh, *specs))(x, w)
    (out, g), (ref_out, ref_g) = run(_ours_gathered(fo)), run(_ref_gathered())
    assert g.shape == (3, 4 * 4 * 5, 16)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(ref_g))
    assert_close(out, ref_out)


@pytest.mark.parametrize("value", [1, "yes", None, np.array(True)])
def test_return_gathered_must_be_a_bool(fo, value):
    with pytest.raises(TypeError, match="return_gathered must be a bool"):
        _trace(fo, (32, 16), (16, 32), return_gathered=value)


# ------------------------------------------------------------------ errors (trace time)

def _trace(fo, x_shape, w_shape, dtype=jnp.bfloat16, axis="tp", **kw):
    f = shard_map(lambda a, b: fo.all_gather_matmul(a, b, axis, **kw), make_mesh_1d(4), *SPECS)
    return jax.jit(f).trace(jax.ShapeDtypeStruct(x_shape, dtype), jax.ShapeDtypeStruct(w_shape, dtype))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(comm_sms=0), ValueError, "comm_sms must be >= 1"),
    (dict(comm_sms=-3), ValueError, "comm_sms"),
    (dict(comm_sms="8"), TypeError, "comm_sms"),
    (dict(dtype=jnp.float32), TypeError, "dtype"),
    (dict(axis="sp"), NameError, "'sp'"),
    (dict(sequence_dim=1), ValueError, r"sequence_dim=1 is not a leading dim of x \(2-D"),
    (dict(sequence_dim=False), TypeError, "sequence_dim must be an int"),
])
def test_bad_arguments(fo, kw, exc, match):
    with pytest.raises(exc, match=match):
        _trace(fo, (32, 16), (16, 32), **kw)


def test_bad_shapes(fo):
    with pytest.raises(ValueError, match="contracting dims differ"):
        _trace(fo, (32, 16), (24, 32))
    with pytest.raises(ValueError, match="N .* multiple of 8"):
        _trace(fo, (32, 16), (16, 4 * 3))


# ------------------------------------------------------------------ lowering

TARGET = "flashoverlap_all_gather_gemm"


def _cuda_text(fo, n, x_local, w_local, **kw):
    f = shard_map(_ours(fo, **kw), make_mesh_1d(n), *SPECS)
    args = (jax.ShapeDtypeStruct((n * x_local[0], x_local[1]), jnp.bfloat16),
            jax.ShapeDtypeStruct((w_local[0], n * w_local[1]), jnp.bfloat16))
    return lower_for_cuda(f, args)


def _calls(text):
    return custom_call_lines(text, TARGET)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_cuda_lowering_custom_call(fo, no_fallback, n):
    R, K, N = 2048, 8192, 4096  # per device: x [R, K], w [K, N]
    calls = _calls(_cuda_text(fo, n, (R, K), (K, N)))
    assert len(calls) == 1
    call = calls[0]
    for attr in ("comm_id", "world_size", "chunks"):
        assert re.search(rf"\b{attr}\b", call), call
    sms = int(re.search(r"comm_sms = (\d+) : i32", call).group(1))
    assert sms >= 1
    assert f"tensor<{n * R}x{N}xbf16>" in call and f"tensor<{R}x{K}xbf16>" in call, call


def test_cuda_lowering_explicit_comm_sms(fo, no_fallback):
    call = _calls(_cuda_text(fo, 2, (1024, 4096), (4096, 4096), comm_sms=12))[0]
    assert "comm_sms = 12 : i32" in call


def test_forced_chunks(fo, monkeypatch):
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    with plan_a2a.forced(chunks=4, comm_sms=16):
        call = _calls(_cuda_text(fo, 2, (2048, 4096), (4096, 4096)))[0]
    assert "chunks = 4 : i32" in call and "comm_sms = 16 : i32" in call
    with plan_a2a.forced(overlap=False):
        assert not _calls(_cuda_text(fo, 2, (2048, 4096), (4096, 4096)))


def test_forced_comm_sms_and_chunks_reach_the_plans():
    """forced(comm_sms=...) sets both ops' plans (neither default here is 12), and forced
    chunks past the kernel's 64 flags (2 ranks x 64) are refused, not lowered."""
    from jax_flashoverlap import plan_a2a
    with plan_a2a.forced(comm_sms=12):
        assert plan_a2a.choose_a2a_plan(4096, 8192, 4096, 2, 0, 0).comm_sms == 12
        assert plan_a2a.choose_all_gather_plan(4096, 8192, 8192, 2).comm_sms == 12
    with plan_a2a.forced(chunks=64):
        with pytest.raises(ValueError, match=r"world \* chunks must be <= 64"):
            plan_a2a.choose_all_gather_plan(4096, 8192, 8192, 2)


def test_forced_collective_gather_uses_its_own_communicators(fo, monkeypatch):
    """The collective gather lowers with chunks 1 onto a collective CTA-policy-ZERO
    communicator: another comm_id than the point-to-point one of the same comm_sms."""
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    ids = {}
    for gather in ("p2p", "collective"):
        with plan_a2a.forced(gather=gather, comm_sms=2, chunks=1):
            call = _calls(_cuda_text(fo, 2, (2048, 4096), (4096, 4096)))[0]
        assert "chunks = 1 : i32" in call and "comm_sms = 2 : i32" in call, call
        ids[gather] = re.search(r"comm_id = (-?\d+)", call).group(1)
    assert ids["p2p"] != ids["collective"], ids


@pytest.mark.parametrize("gather", ["p2p", "collective"])
def test_cuda_lowering_return_gathered_is_a_second_result(fo, monkeypatch, gather):
    """return_gathered: one custom call with two results, out [n*R, N] and gathered
    [n*R, K] (no separate all-gather in the program)."""
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    n, (R, K), N = 2, (2048, 4096), 4096
    f = shard_map(_ours_gathered(fo), make_mesh_1d(n), *GATHERED_SPECS)
    args = (jax.ShapeDtypeStruct((n * R, K), jnp.bfloat16),
            jax.ShapeDtypeStruct((K, n * N), jnp.bfloat16))
    with plan_a2a.forced(gather=gather, comm_sms=8, chunks=1):
        text = lower_for_cuda(f, args)
    calls = _calls(text)
    assert len(calls) == 1, calls
    assert re.search(rf"-> \(tensor<{n * R}x{N}xbf16>, tensor<{n * R}x{K}xbf16>\)", calls[0]), \
        calls[0]
    assert "all_gather" not in text.replace(TARGET, "")


@pytest.mark.parametrize("return_gathered", [False, True], ids=["out", "gathered"])
@pytest.mark.parametrize("gather", ["p2p", "collective"])
def test_cuda_lowering_asks_for_the_gathered_rows_workspace(fo, monkeypatch, gather,
                                                            return_gathered):
    """Lowered for this machine's GPUs (the communicator calls faked and recorded here), the
    gathered rows (n x R x K bf16) take a workspace, except peer-to-peer with return_gathered,
    which receives them straight into that output; the collective gather's communicator is a
    collective one with CTA policy zero, the peer-to-peer gather's a peer-to-peer one."""
    from jax_flashoverlap import comm, plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    made = []
    monkeypatch.setattr(comm, "mesh_is_local_gpu", lambda mesh: True)
    monkeypatch.setattr(comm, "ensure_communicators", lambda *a, **k: made.append(k))
    n, (R, K), N = 2, (2048, 4096), 4096
    body, specs = ((_ours_gathered(fo), GATHERED_SPECS) if return_gathered else
                   (_ours(fo), SPECS))
    f = shard_map(body, make_mesh_1d(n), *specs)
    args = (jax.ShapeDtypeStruct((n * R, K), jnp.bfloat16),
            jax.ShapeDtypeStruct((K, n * N), jnp.bfloat16))
    with plan_a2a.forced(gather=gather, comm_sms=8, chunks=1):
        assert len(_calls(lower_for_cuda(f, args))) == 1
    p2p = gather == "p2p"
    want = (0 if p2p and return_gathered else n * R * K * 2, p2p, "default" if p2p else "zero")
    assert [(k["workspace_bytes"], k["peer_to_peer"], k["cta_policy"]) for k in made] == [want]


def test_one_rank_lowers_to_the_reference_unless_forced(fo, monkeypatch):
    """One rank has nothing to gather: XLA's composition; forced, the custom call (so one
    GPU can run the whole call through a 1-rank communicator)."""
    from jax_flashoverlap import plan_a2a
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)
    monkeypatch.setenv("JAX_FLASHOVERLAP_FALLBACK", "0")
    assert not _calls(_cuda_text(fo, 1, (2048, 4096), (4096, 4096)))
    with plan_a2a.forced(comm_sms=8):
        assert len(_calls(_cuda_text(fo, 1, (2048, 4096), (4096, 4096)))) == 1


def test_cpu_lowering_is_reference(fo):
    f = shard_map(_ours(fo), make_mesh_1d(4), *SPECS)
    text = jax.jit(f).trace(jax.ShapeDtypeStruct((32, 16), jnp.bfloat16),
                            jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)).lower().as_text()
    assert TARGET not in text and "all_gather" in text


# ------------------------------------------------------------------ plan

@pytest.mark.parametrize("rows,n,k,world", [(2048, 4096, 8192, 2), (4096, 14336, 4096, 2),
                                            (1000, 1024, 256, 4), (512, 8192, 8192, 8),
                                            # 4 chunks would not divide the rows
                                            (4098, 16384, 16384, 2)])
def test_plan_is_valid_and_deterministic(rows, n, k, world):
    from jax_flashoverlap import plan_a2a
    p = plan_a2a.choose_all_gather_plan(rows, n, k, world)
    assert p == plan_a2a.choose_all_gather_plan(rows, n, k, world)
    assert rows % p.chunks == 0 and world * p.chunks <= 64
    assert p.comm_sms >= 1 and p.predicted_s > 0 and p.baseline_s > 0


def test_more_ranks_than_the_kernels_flags_are_not_supported():
    """One flag per row block: 64 ranks are the most (kMaxGroups); 65 take XLA's path."""
    from jax_flashoverlap import plan_a2a
    assert plan_a2a.all_gather_supported(8, 64, 64) is None
    assert plan_a2a.all_gather_supported(8, 64, 65) == "more than 64 ranks"


@pytest.mark.parametrize("m,n,k,overlap", [
    (4096, 8192, 8192, False), (8192, 8192, 8192, False),       # lost on 2 x H200: XLA's path
    (16384, 8192, 16384, True), (8192, 8192, 28672, True)])     # won on 2 x H200
def test_plan_overlaps_only_where_measured_to_win(m, n, k, overlap):
    """Global M x N x K of benchmarks/results/a2a_h200x2.json on 2 GPUs (per device rows M/2,
    columns N/2): the default plan overlaps exactly where that run measured a gain."""
    from jax_flashoverlap import plan_a2a
    p = plan_a2a.choose_all_gather_plan(m // 2, n // 2, k, 2)
    assert p.overlap is overlap, p


# ------------------------------------------------------------------ communicator setup

class _RecordingExtension(FakeCommExtension):
    """The extension's communicator API, recording workspaces and connections."""
    def __init__(self):
        super().__init__()
        self.workspace, self.connected = {}, []

    def create_communicators(self, cid, uid, world, local, comm_sms, nbytes, *args, **kwargs):
        super().create_communicators(cid, uid, world, local, comm_sms, nbytes, *args, **kwargs)
        self.workspace[cid] = nbytes

    def ensure_workspace(self, cid, nbytes):
        self.workspace[cid] = max(self.workspace[cid], nbytes)

    def connect_peers(self, cid):
        self.connected.append(cid)

    def destroy_communicators(self, cid):
        pass


def test_peer_to_peer_communicator_gets_its_handshake_workspace(monkeypatch):
    """return_gathered on a peer-to-peer plan needs no workspace for the data (NCCL receives
    into the op's output), but ConnectPeers exchanges one int32 per peer through it: asked
    for 0 bytes, the communicators still get those (on GPU, 0 failed 'ConnectPeers needs the
    workspace allocated first')."""
    from jax_flashoverlap import _ext, comm
    rec = _RecordingExtension()
    monkeypatch.setattr(_ext, "ext", rec)
    mesh = make_mesh_1d(4)
    cid = comm.ensure_communicators(mesh, "tp", workspace_bytes=0, comm_sms=8,
                                    peer_to_peer=True)
    assert rec.workspace[cid] == comm.peer_handshake_bytes(4) == 2 * 4 * 4
    assert rec.connected == [cid]
    collective = comm.ensure_communicators(mesh, "tp", workspace_bytes=0, comm_sms=8)
    assert rec.workspace[collective] == 0  # a collective communicator makes no handshake
