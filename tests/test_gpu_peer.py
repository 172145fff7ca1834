"""The peer-store transport on 2 GPUs (JAX_FLASHOVERLAP_TRANSPORT=peer, experimental;
docs/DESIGN.md, "Peer stores"): matmul_all_reduce / matmul_reduce_scatter over a mesh axis of
the first 2 GPUs with no NCCL call, against float32 and XLA's own psum / psum_scatter of the
bf16 product, on fresh random inputs with the outputs poisoned first (conftest), including
odd shapes, 200 back-to-back calls, both ops inside lax.scan next to XLA's psum / all_gather,
and a 2 x 2 mesh where only the 2-GPU axis takes the peer stores. The switch is read at
lowering: every program here is jitted after it is set."""
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from _util import repo_env, shard_map
import _gpu_util as U

pytestmark = U.MARKS
TWO_GPUS = [pytest.mark.multigpu,
            pytest.mark.skipif(U.N_GPUS < 2, reason=f"needs >= 2 GPUs, have {U.N_GPUS}")]


def two_gpus(test):
    for mark in reversed(TWO_GPUS):
        test = mark(test)
    return test

IN_SPECS = (P(None, "tp"), P("tp", None))


@pytest.fixture(autouse=True)
def _peer(monkeypatch):
    U.use_our_kernels(monkeypatch)
    monkeypatch.setenv("JAX_FLASHOVERLAP_TRANSPORT", "peer")


def _mesh2():
    return Mesh(np.array(jax.devices()[:2]), ("tp",))


def _programs(kind, mesh):
    """(ours, XLA's bf16 composition, float32 reference, out spec) as jitted shard_map programs."""
    import jax_flashoverlap as fo
    if kind == "all_reduce":
        fns = (lambda a, b: fo.matmul_all_reduce(a, b, "tp"), lambda a, b: lax.psum(a @ b, "tp"),
               lambda a, b: lax.psum(U.dot32(a, b), "tp"))
        out = P()
    else:
        scatter = lambda y: lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)  # noqa: E731
        fns = (lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), lambda a, b: scatter(a @ b),
               lambda a, b: scatter(U.dot32(a, b)))
        out = P("tp", None)
    return tuple(jax.jit(shard_map(f, mesh, IN_SPECS, out)) for f in fns) + (out,)


def _inputs(key, mesh, m, n, k):
    kx, kw = jax.random.split(key)
    x = jax.device_put(U.normal(kx, (m, k)), NamedSharding(mesh, IN_SPECS[0]))
    w = jax.device_put(U.normal(kw, (k, n), 1.0 / np.sqrt(k)), NamedSharding(mesh, IN_SPECS[1]))
    return x, w


def _assert_peer_lowering(jitted, args, kind):
    target = "flashoverlap_gemm_" + kind
    U.assert_custom_call(jitted, args, target)
    text = jitted.lower(*args).as_text()
    lines = [ln for ln in text.splitlines() if f"@{target}" in ln]
    assert lines and all("transport = 1" in ln and "comm_sms = 0" in ln for ln in lines), lines


# Global M x N x K (K split over the 2 GPUs): the DESIGN.md shapes' first two, M not a multiple
# of the 128-row tile, N not a multiple of the 256-column tile, small M.
SHAPES = [(4096, 8192, 8192), (8192, 8192, 8192), (1000, 2056, 2064), (258, 520, 1024)]


@two_gpus
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_peer_matches_xla_and_float32(kind, m, n, k):
    mesh = _mesh2()
    ours, xla, ref32, _ = _programs(kind, mesh)
    errors = []
    for call in range(3):
        x, w = _inputs(jax.random.key(m + n + k + call), mesh, m, n, k)
        if call == 0:
            _assert_peer_lowering(ours, (x, w), kind)
        y = ours(x, w)
        assert y.shape == xla(x, w).shape and y.dtype == U.BF16
        assert bool(jnp.all(jnp.isfinite(y))), f"call {call}: unwritten (NaN) elements"
        errors.append(U.rel_fro(y, ref32(x, w)))
        assert U.rel_fro(y, xla(x, w)) < U.TOL
    assert max(errors) < U.TOL, errors
    assert len(set(errors)) > 1, "identical errors: the inputs were not fresh"


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("m,n,k", [(8192, 8192, 8192), (1000, 2056, 4160)])
def test_peer_group_matches_xla_and_float32(world, kind, m, n, k):
    """A group of 4 or 8 GPUs (nvidia-h200-x4 / -x8): the ring in the epilogue, every rank
    passing its running sums to the previous rank; values against XLA's composition and
    float32 on fresh inputs, no NaN."""
    if U.N_GPUS < world:
        pytest.skip(f"a group of {world} needs {world} GPUs, have {U.N_GPUS}")
    mesh = Mesh(np.array(jax.devices()[:world]), ("tp",))
    ours, xla, ref32, _ = _programs(kind, mesh)
    for call in range(2):
        x, w = _inputs(jax.random.key(world + m + call), mesh, m, n, k)
        if call == 0:
            _assert_peer_lowering(ours, (x, w), kind)
        y = ours(x, w)
        assert bool(jnp.all(jnp.isfinite(y))), f"call {call}: unwritten (NaN) elements"
        assert U.rel_fro(y, xla(x, w)) < U.TOL
        assert U.rel_fro(y, ref32(x, w)) < U.TOL


@two_gpus
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_peer_stress_200_calls_fresh_inputs(kind):
    """200 back-to-back calls (no host sync between them), fresh inputs each, every output
    checked: the credits and counters of one call never leak into the next."""
    m, n, k = 2048, 4096, 4096
    mesh = _mesh2()
    ours, _, ref32, _ = _programs(kind, mesh)

    @jax.jit
    def step(key):
        kx, kw = jax.random.split(key)
        x = jax.random.normal(kx, (m, k), jnp.float32).astype(U.BF16)
        w = (jax.random.normal(kw, (k, n), jnp.float32) * k ** -0.5).astype(U.BF16)
        y, r = ours(x, w), ref32(x, w)
        return jnp.linalg.norm(y.astype(jnp.float32) - r) / jnp.linalg.norm(r)

    keys = jax.random.split(jax.random.key(11), 200)
    _assert_peer_lowering(step, (keys[0],), kind)  # else NCCL's or XLA's path passes as well
    errs = np.asarray(jax.device_get(jnp.stack([step(key) for key in keys])))
    assert np.all(np.isfinite(errs)), errs
    assert errs.max() < U.TOL, f"worst call {errs.argmax()}: {errs.max():.3e}"
    assert len(set(np.round(errs, 8))) > 1, "all errors identical: inputs were not fresh"


@two_gpus
def test_peer_ops_in_scan_beside_xla_collectives():
    """8 layers in lax.scan, each: our all-reduce, XLA's psum, our reduce-scatter, XLA's
    all_gather; against the same program with XLA's compositions (float32 products)."""
    import jax_flashoverlap as fo
    mesh = _mesh2()
    layers, m, d = 8, 1024, 1024
    kx, kw = jax.random.split(jax.random.key(5))
    x = U.normal(kx, (m, d))
    ws = U.normal(kw, (layers, 2, d, d), 1.0 / np.sqrt(d))

    def body(ours):
        def layer(h, w):
            y = fo.matmul_all_reduce(h, w[0], "tp") if ours else lax.psum(U.dot32(h, w[0]).astype(U.BF16), "tp")
            y = (lax.psum(y.astype(jnp.float32), "tp") / 2).astype(U.BF16)[:, :d // 2]
            z = fo.matmul_reduce_scatter(y, w[1], "tp") if ours else lax.psum_scatter(
                U.dot32(y, w[1]).astype(U.BF16), "tp", scatter_dimension=0, tiled=True)
            h = lax.all_gather(z, "tp", axis=0, tiled=True)[:, :d // 2]
            return jnp.tanh(h.astype(jnp.float32)).astype(U.BF16), None
        return lambda h, w: lax.scan(layer, h, w)[0]

    specs = (P(None, "tp"), P(None, None, "tp", None))
    run = {o: jax.jit(shard_map(body(o), mesh, specs, P(None, "tp"))) for o in (True, False)}
    xs = jax.device_put(x, NamedSharding(mesh, specs[0]))
    wsd = jax.device_put(ws, NamedSharding(mesh, specs[1]))
    for kind in ("all_reduce", "reduce_scatter"):  # each op's call, not one of them
        _assert_peer_lowering(run[True], (xs, wsd), kind)
    got, want = run[True](xs, wsd), run[False](xs, wsd)
    assert bool(jnp.all(jnp.isfinite(got)))
    assert U.rel_fro(got, want) < 3 * U.TOL


@two_gpus
def test_all_reduce_stages_exactly_where_xla_memory_is_not_writable():
    """In one process the all-reduce mirrors straight into the other GPU's XLA result only where
    the driver says that GPU may write XLA's memory (comm.peer_results_writable); else the
    group stages its mirrors (list_communicators' peer_staged). Either way the values are
    right. Prints which way this machine's XLA went (-s)."""
    from jax_flashoverlap import comm
    mesh = _mesh2()
    writable = comm.peer_results_writable(comm.axis_groups(mesh, "tp"))
    ours, _, ref32, _ = _programs("all_reduce", mesh)
    x, w = _inputs(jax.random.key(23), mesh, 2048, 2048, 2048)
    _assert_peer_lowering(ours, (x, w), "all_reduce")  # the registry holds earlier tests' too
    assert U.rel_fro(ours(x, w), ref32(x, w)) < U.TOL
    mine = [c for c in comm.list_communicators() if c["peer_recv_bytes"] > 0]
    assert len(mine) == 2 and all(c["peer_staged"] == (not writable) for c in mine), (writable, mine)
    print(f"XLA's memory writable by the other GPU: {writable}; all-reduce staged: {not writable}")


@two_gpus
def test_all_reduce_with_granted_access_mirrors_into_xla_results(monkeypatch):
    """JAX_FLASHOVERLAP_GRANT_PEER_ACCESS=1: where XLA's allocator left the other GPU out, the
    op gives it access to XLA's allocation (at lowering the probe's, in the handler each new
    result's), so the group does not stage; 20 calls with fresh inputs (results in several
    allocations) right, every communicator granting and unstaged. Prints whether XLA had
    granted it already (-s)."""
    from jax_flashoverlap import comm
    mesh = _mesh2()
    before = comm.peer_results_writable(comm.axis_groups(mesh, "tp"))
    monkeypatch.setenv("JAX_FLASHOVERLAP_GRANT_PEER_ACCESS", "1")
    ours, _, ref32, _ = _programs("all_reduce", mesh)
    for i in range(20):
        x, w = _inputs(jax.random.key(100 + i), mesh, 2048, 2048 + 256 * (i % 3), 2048)
        if i < 3:  # each shape's program takes the peer stores
            _assert_peer_lowering(ours, (x, w), "all_reduce")
        assert U.rel_fro(ours(x, w), ref32(x, w)) < U.TOL, i
    mine = [c for c in comm.list_communicators() if c["peer_recv_bytes"] > 0]
    assert len(mine) == 2 and all(c["peer_grants"] and not c["peer_staged"] for c in mine), mine
    print(f"XLA's memory writable by the other GPU before any grant: {before}")


@two_gpus
def test_peer_buffers_listed_once_per_device():
    from jax_flashoverlap import comm
    mesh = _mesh2()
    ours, _, ref32, _ = _programs("reduce_scatter", mesh)
    m, n, k = 2048, 2048, 2048
    x, w = _inputs(jax.random.key(21), mesh, m, n, k)
    _assert_peer_lowering(ours, (x, w), "reduce_scatter")  # the registry holds earlier tests' too
    assert U.rel_fro(ours(x, w), ref32(x, w)) < U.TOL
    mine = [c for c in comm.list_communicators() if c["peer_recv_bytes"] > 0]
    assert sorted(c["rank"] for c in mine) == [0, 1], mine
    assert all(c["peer_recv_bytes"] >= m // 2 * n * 2 and not c["peer_broken"] for c in mine), mine


@two_gpus
@pytest.mark.skipif(U.N_GPUS < 4, reason=f"a 2 x 2 mesh needs 4 GPUs, have {U.N_GPUS}")
def test_2x2_mesh_peer_axis_of_two():
    """dp x tp = 2 x 2: the tp axis (2 GPUs) takes the peer stores, each dp row its own pair."""
    import jax_flashoverlap as fo
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
    specs = (P("dp", "tp"), P("tp", None))
    ours = jax.jit(shard_map(lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), mesh, specs,
                             P(("dp", "tp"), None)))
    ref = jax.jit(shard_map(lambda a, b: lax.psum_scatter(U.dot32(a, b), "tp", scatter_dimension=0,
                                                          tiled=True), mesh, specs, P(("dp", "tp"), None)))
    kx, kw = jax.random.split(jax.random.key(9))
    x = jax.device_put(U.normal(kx, (4096, 4096)), NamedSharding(mesh, specs[0]))
    w = jax.device_put(U.normal(kw, (4096, 4096), 1 / 64), NamedSharding(mesh, specs[1]))
    assert "transport = 1" in ours.lower(x, w).as_text()
    assert U.rel_fro(ours(x, w), ref(x, w)) < U.TOL


# What comm.peer_results_writable asks of each XLA buffer it probes, in a process of its own per
# allocator setting (read when the client starts).
_KIND_OF_XLA_BUFFER = """
import jax, numpy as np
from jax_flashoverlap import _ext
x = jax.device_put(np.zeros(256, np.float32), jax.devices()[0])
x.block_until_ready()
print("KIND", *_ext.ext.peer_may_write(x.unsafe_buffer_pointer(), 0))
# What JAX_FLASHOVERLAP_GRANT_PEER_ACCESS would do to it, here for the GPU itself (already
# allowed: a mapping's access list rewritten to what it was), then XLA computing on as before.
try:
    print("GRANT", _ext.ext.grant_peers_write(x.unsafe_buffer_pointer(), [0]), "ok")
except RuntimeError as e:
    print("GRANT refused", str(e).replace(chr(10), " "))
y = (x + 1).block_until_ready()
print("AFTER", bool((np.asarray(y) == 1).all()), *_ext.ext.peer_may_write(x.unsafe_buffer_pointer(), 0))
"""


@pytest.mark.parametrize("allocator", [None, "platform", "cuda_async"])
def test_xla_buffers_are_asked_about_by_kind(allocator):
    """The driver's answer for a buffer XLA allocated (one GPU: asked about that GPU itself,
    which may always write it): how it was allocated, under each XLA allocator setting. On 2
    GPUs that kind decides whether the others were granted access (a pool or a virtual-memory
    mapping: only if XLA's allocator granted it; else the all-reduce stages its mirrors)."""
    # Preallocating as by default, but little: this pytest process holds most of the GPU.
    env = repo_env(XLA_PYTHON_CLIENT_ALLOCATOR=allocator, XLA_PYTHON_CLIENT_MEM_FRACTION="0.05")
    r = subprocess.run([sys.executable, "-c", _KIND_OF_XLA_BUFFER], env=env, capture_output=True,
                       text=True, timeout=240)
    said = {line.split()[0]: line for line in r.stdout.splitlines()
            if line.startswith(("KIND ", "GRANT ", "AFTER "))}
    assert r.returncode == 0 and len(said) == 3, r.stdout[-3000:] + r.stderr[-3000:]
    _, writable, kind = said["KIND"].split()
    assert writable == "True" and kind in ("legacy", "pool", "vmm"), said
    if allocator == "cuda_async":
        assert kind == "pool", said
    # The grant: over a mapping, cuMemSetAccess must take the range the driver reports for it
    # (one whole mapping); a pool may refuse its own GPU as a "peer" (it always has access).
    grant = said["GRANT"]
    if kind == "pool":
        assert grant == "GRANT pool ok" or "cuMemPoolSetAccess" in grant, said
    else:
        assert grant == f"GRANT {kind} ok", said
    assert said["AFTER"] == f"AFTER True True {kind}", said
    print(f"XLA allocator {allocator or 'default'}: {kind} memory; {grant}")  # for the GPU run's log


def test_peer_stores_refuse_a_group_of_one():
    """One GPU (any machine): the buffers of a 1-rank group are refused at once, naming why;
    the op itself keeps the NCCL path there (PeerStoresWarning), and is right."""
    import jax_flashoverlap as fo
    from jax_flashoverlap import comm, plan_peer, primitives
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    with pytest.raises(RuntimeError, match="peer stores need a group of 2 to 8 ranks .*holds 1 of a group of 1"):
        comm.ensure_communicators(mesh, "tp", workspace_bytes=0, comm_sms=plan_peer.NCCL_CTAS,
                                  peer_store_bytes=1 << 20)
    primitives._warned_peer_stores.clear()
    f = jax.jit(shard_map(lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"), mesh, IN_SPECS,
                          P("tp", None)))
    x, w = _inputs(jax.random.key(2), mesh, 512, 1024, 1024)
    with pytest.warns(plan_peer.PeerStoresWarning, match="has 1 devices"):
        y = f(x, w)
    U.assert_custom_call(f, (x, w), "flashoverlap_gemm_reduce_scatter")  # NCCL's, not XLA's
    ref = jax.jit(shard_map(lambda a, b: lax.psum_scatter(U.dot32(a, b), "tp", scatter_dimension=0,
                                                          tiled=True), mesh, IN_SPECS, P("tp", None)))
    assert U.rel_fro(y, ref(x, w)) < U.TOL


# Two processes, one GPU each: both ops take the peer stores across them (each process's
# buffers opened by the other through CUDA IPC, the handles through JAX's key-value store;
# xla_ffi/comm/peer_ipc.h; the all-reduce staged: mirrors into the other's staging area, copied
# out), over three shapes each, growing the buffers twice (8 to 16 MiB for the reduce-scatter's
# last shape, to 32 MiB for the all-reduce's: closed, freed and re-opened each time).
_TWO_PROCESS_SCRIPT = '''
import re, sys, warnings
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_flashoverlap as fo
from jax_flashoverlap import comm, plan_peer
fo.distributed.initialize()
assert jax.process_count() == 2 and len(jax.local_devices()) == 1, jax.devices()
me = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("tp",))
ins = (P(None, "tp"), P("tp", None))
rng = np.random.default_rng(int(sys.argv[1]))
put = lambda a, s: jax.make_array_from_callback(
    a.shape, NamedSharding(mesh, s), lambda i: jnp.asarray(a[i], jnp.bfloat16))
scatter = lambda y: lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
cases = [("reduce_scatter", lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"),
          lambda a, b: scatter(a @ b), P("tp", None), True),
         ("all_reduce", lambda a, b: fo.matmul_all_reduce(a, b, "tp"),
          lambda a, b: lax.psum(a @ b, "tp"), P(), True)]
for name, op, ref, out, peer in cases:
    f = jax.jit(jax.shard_map(op, mesh=mesh, in_specs=ins, out_specs=out))
    g = jax.jit(jax.shard_map(ref, mesh=mesh, in_specs=ins, out_specs=out))
    for m, n, k in [(600, 272, 400), (2048, 1024, 2048), (4096, 4096, 2048)]:
        for call in range(3):
            x = rng.standard_normal((m, k), dtype=np.float32)
            w = rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)
            xs, ws = put(x, ins[0]), put(w, ins[1])
            if call == 0:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    text = f.lower(xs, ws).as_text()
                took_peer = re.search(r"transport\\s*=\\s*1\\b", text) is not None
                warned = [str(c.message) for c in caught if c.category is plan_peer.PeerStoresWarning]
                assert took_peer == peer and bool(warned) != peer, (name, took_peer, warned)
            got = np.asarray(f(xs, ws).addressable_data(0), np.float32)
            want = np.asarray(g(xs, ws).addressable_data(0), np.float32)
            # float32 of the bf16 inputs, our rows (the reduce-scatter's block `me`)
            xb = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)
            wb = np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32)
            full = xb @ wb
            exact = full[me * m // 2:(me + 1) * m // 2] if name == "reduce_scatter" else full
            assert np.all(np.isfinite(got)), (name, m, call)
            err = np.linalg.norm(got - exact) / np.linalg.norm(exact)
            err_xla = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err < 1e-2 and err_xla < 1e-2, (name, m, n, k, call, err, err_xla)
    mine = [c for c in comm.list_communicators() if c["peer_recv_bytes"] > 0]
    staged = 2 if name == "all_reduce" else 1  # the staging area's block too
    assert len(mine) == 1 and mine[0]["peer_recv_bytes"] >= staged * 2048 * 4096 * 2, mine
    assert mine[0]["peer_across_processes"] and mine[0]["peer_connected"], mine
    print(name, "OK", "peer" if peer else "nccl", err, flush=True)
'''


@two_gpus
def test_peer_stores_across_two_processes(tmp_path):
    out = U.launch_two_processes(tmp_path, _TWO_PROCESS_SCRIPT, 1, 11)
    assert "reduce_scatter OK peer" in out and "all_reduce OK peer" in out, out[-6000:]
