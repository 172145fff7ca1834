"""JAX_FLASHOVERLAP_TRANSPORT=peer (experimental; docs/DESIGN.md, "Peer stores"): the switch,
the peer-store plan, and what the CUDA lowering emits, checked without a GPU by cross-lowering
(tests/test_lowering.py says how). The peer stores themselves run only on 2 GPUs
(tests/test_gpu_collectives.py's peer cases, tests/cuda/peer_reduce_test on one GPU)."""
import dataclasses
import re
import types
import warnings

import pytest

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from _util import PRIMITIVE_NAMES, custom_call_lines, lower_for_cuda, make_mesh_1d, make_mesh_2d, set_env, shard_map

from jax_flashoverlap import _ext, comm, distributed, plan as plan_lib, plan_peer
from jax_flashoverlap import tile_schedule as ts

TRANSPORT_ENV = "JAX_FLASHOVERLAP_TRANSPORT"


# ------------------------------------------------------------------ the switch

@pytest.mark.parametrize("raw, expected", [(None, "auto"), ("", "auto"), ("auto", "auto"),
                                           ("nccl", "nccl"), ("peer", "peer")])
def test_transport_switch_values(monkeypatch, raw, expected):
    set_env(monkeypatch, TRANSPORT_ENV, raw)
    assert _ext.transport() == expected


@pytest.mark.parametrize("raw", ["PEER", "nvlink", "peer "])
def test_transport_switch_typo_is_an_error_naming_it(monkeypatch, raw):
    monkeypatch.setenv(TRANSPORT_ENV, raw)
    with pytest.raises(ValueError, match=rf"{TRANSPORT_ENV}=.*must be 'auto'.*'nccl'.*or 'peer'"):
        _ext.transport()


# ------------------------------------------------------------------ the plan

@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("m, n, k", [(4096, 8192, 4096), (8192, 8192, 4096), (16384, 8192, 8192),
                                     (8192, 28672, 4096), (8192, 8192, 14336), (600, 272, 200),
                                     (2, 8, 8)])
def test_peer_plan_covers_one_block_on_unit_boundaries(collective, m, n, k):
    p = plan_peer.plan(collective, m, n, k)
    rows = m // 2
    assert p.transport == "peer" and p.comm_sms == 0 and p.overlap
    assert p.rows_per_block == rows and p.band_rows[0] == 0 and p.band_rows[-1] == rows
    assert 1 <= p.num_groups <= plan_peer.BANDS_PER_BLOCK
    unit = ts.kernel_geometry(m, n, 0).rows_per_unit
    assert all(b % unit == 0 for b in p.band_rows[1:-1]), (p.band_rows, unit)
    assert p.predicted_s > 0 and p.baseline_s > 0
    # The all-reduce also mirror-stores its reduced rows: never predicted faster than the RS.
    other = plan_peer.plan("reduce_scatter" if collective == "all_reduce" else "all_reduce", m, n, k)
    ar, rs = (p, other) if collective == "all_reduce" else (other, p)
    assert ar.predicted_s >= rs.predicted_s


def test_group_plan_validates_the_transport():
    base = plan_peer.plan("reduce_scatter", 4096, 8192, 4096)
    with pytest.raises(ValueError, match="transport='nvlink' must be 'nccl' or 'peer'"):
        dataclasses.replace(base, transport="nvlink").validate()
    with pytest.raises(ValueError, match="every SM .comm_sms 0, got 8"):
        dataclasses.replace(base, comm_sms=8).validate()
    # 32 bands per block: both blocks' are 64 groups, one launch's most; 33 are too many.
    dataclasses.replace(base, band_rows=tuple(range(0, 2048 + 1, 64))).validate()
    bands = tuple(range(0, 2048, 62)) + (2048,)
    assert len(bands) - 1 == 34
    with pytest.raises(ValueError, match="at most 32 bands per block"):
        dataclasses.replace(base, band_rows=bands).validate()


@pytest.mark.parametrize("collective, world, m, fragment", [
    ("all_reduce", 16, 4096, "has 16 devices; peer stores need 2 to 8"),
    ("reduce_scatter", 4, 4098, "M=4098 rows; peer stores split them into 4 equal blocks"),
    ("reduce_scatter", 1, 4096, "has 1 devices"),
    ("all_reduce", 2, 4095, "M=4095 rows"),
    ("all_to_all", 2, 4096, "not all_to_all"),
])
def test_unavailable_names_the_reason(collective, world, m, fragment):
    assert fragment in plan_peer.unavailable(collective, None, "tp", world, m)


def test_available_for_two_devices_and_even_rows():
    # A mesh of CPU devices is no local GPU mesh: nothing more to check here (cross-lowering).
    assert plan_peer.unavailable("all_reduce", make_mesh_1d(2), "tp", 2, 4096) is None


# ------------------------------------------------------------------ groups spanning processes

def _gpu(process, hw):
    return types.SimpleNamespace(process_index=process, local_hardware_id=hw)


@pytest.fixture
def gpu_groups(monkeypatch):
    """plan_peer.unavailable on a GPU mesh of the given axis groups ([(process, GPU ordinal in
    that process), ...] per group) and the given host of each process; `writable`: what
    comm.peer_results_writable answers (XLA's memory writable by the other GPUs)."""
    def use(groups, hosts=None, writable=True):
        monkeypatch.setattr(plan_peer.comm, "mesh_is_local_gpu", lambda mesh: True)
        monkeypatch.setattr(plan_peer.comm, "peer_results_writable", lambda groups: writable)
        monkeypatch.setattr(plan_peer.comm, "axis_groups",
                            lambda mesh, axis: [[_gpu(*d) for d in g] for g in groups])
        asked = []

        def process_hosts(processes):
            asked.append(sorted(processes))
            return {p: (hosts or {}).get(p, "boot:same") for p in processes}
        monkeypatch.setattr(distributed, "process_hosts", process_hosts)
        return asked
    return use


def test_one_gpu_per_process_on_one_host_takes_the_peer_stores(gpu_groups):
    # 2 processes x 2 GPUs, the axis across them: each process's GPU 0 and GPU 1 are different
    # GPUs of their groups (ordinals repeat across processes: not one GPU).
    asked = gpu_groups([[(0, 0), (1, 0)], [(0, 1), (1, 1)]])
    assert plan_peer.unavailable("reduce_scatter", "mesh", "dp", 2, 4096) is None
    assert asked == [[0, 1]]
    assert plan_peer.stages_mirrors("mesh", "dp")


def test_all_reduce_across_processes_is_staged(gpu_groups):
    """Across processes the all-reduce's mirrors go into each rank's staging area (its recv,
    after the running sums: the other world - 1 blocks), copied out after the GEMM."""
    gpu_groups([[(0, 0), (1, 0)]])
    assert plan_peer.unavailable("all_reduce", "mesh", "dp", 2, 4096) is None
    assert plan_peer.stages_mirrors("mesh", "dp")
    m, n, k = 8192, 8192, 4096
    for world, blocks in [(2, 1), (4, 4), (8, 8)]:
        rows = m // world
        assert plan_peer.recv_bytes(m, n, 2, world) == blocks * rows * n * 2
        assert plan_peer.recv_bytes(m, n, 2, world, staged=True) == (blocks + world - 1) * rows * n * 2
        plain = plan_peer.plan("all_reduce", m, n, k, world=world)
        staged = plan_peer.plan("all_reduce", m, n, k, world=world, staged=True)
        copy_s = (world - 1) * rows * n * 2 / plan_peer.STAGED_COPY_BYTES_PER_S
        assert staged.predicted_s == pytest.approx(plain.predicted_s + copy_s)
        assert staged.band_rows == plain.band_rows
        # the reduce-scatter has nothing to stage
        assert plan_peer.plan("reduce_scatter", m, n, k, world=world, staged=True).predicted_s == \
            plan_peer.plan("reduce_scatter", m, n, k, world=world).predicted_s
    memory = comm.op_memory("matmul_all_reduce", (m, k), (k, n), "bfloat16", 2, transport="peer",
                            across_processes=True)
    assert memory["peer_recv_bytes"] == 2 * (m // 2) * n * 2
    assert comm.op_memory("matmul_reduce_scatter", (m, k), (k, n), "bfloat16", 2, transport="peer",
                          across_processes=True)["peer_recv_bytes"] == (m // 2) * n * 2


def test_groups_partly_inside_a_process_and_partly_across_take_nccl(gpu_groups):
    """3 processes x 2 GPUs: one group inside process 0, two with one GPU per process. The
    planner took the peer stores (it checked the spanning groups only) and the lowering then
    raised comm's ValueError ("one GPU of each axis group per process") instead of keeping
    the NCCL path, as an op the peer stores cannot take does."""
    gpu_groups([[(0, 0), (0, 1)], [(1, 0), (2, 0)], [(1, 1), (2, 1)]])
    why = plan_peer.unavailable("reduce_scatter", "mesh", "tp", 2, 4096)
    assert why and "others are inside one" in why, why


def test_groups_inside_processes_ask_nothing_of_the_others(gpu_groups):
    asked = gpu_groups([[(0, 0), (0, 1)], [(1, 0), (1, 1)]])
    for collective in ("all_reduce", "reduce_scatter"):
        assert plan_peer.unavailable(collective, "mesh", "tp", 2, 4096) is None
    assert asked == [] and not plan_peer.stages_mirrors("mesh", "tp")


def test_groups_inside_processes_stage_where_xla_memory_is_not_writable(gpu_groups):
    """In one process the all-reduce mirrors straight into the other GPUs' XLA results only
    where the driver says they may write them (comm.peer_results_writable); else it stages, as
    across processes."""
    gpu_groups([[(0, 0), (0, 1)]], writable=False)
    assert plan_peer.unavailable("all_reduce", "mesh", "tp", 2, 4096) is None
    assert plan_peer.stages_mirrors("mesh", "tp")


def test_cross_lowering_stages_nothing(monkeypatch):
    """Not this machine's GPUs (cross-lowering): nothing to ask, not staged."""
    monkeypatch.setattr(plan_peer.comm, "mesh_is_local_gpu", lambda mesh: False)
    monkeypatch.setattr(plan_peer.comm, "peer_results_writable",
                        lambda groups: pytest.fail("asked while cross-lowering"))
    assert not plan_peer.stages_mirrors("mesh", "tp")


@pytest.mark.parametrize("groups, hosts, fragment", [
    ([[(0, 0), (0, 1), (1, 0), (1, 1)]], None, "several of its GPUs in one process"),
    ([[(0, 0), (1, 0)]], {1: "boot:other"}, "spans hosts"),
    ([[(0, 0), (0, 0)]], None, "on one GPU"),
])
def test_spanning_groups_peer_stores_cannot_take(gpu_groups, groups, hosts, fragment):
    gpu_groups(groups, hosts)
    assert fragment in plan_peer.unavailable("reduce_scatter", "mesh", "dp", len(groups[0]), 4096)


def test_ensure_refuses_peer_stores_for_several_gpus_per_process_across_processes(monkeypatch):
    monkeypatch.setattr(_ext, "ext", types.SimpleNamespace())
    monkeypatch.setattr(comm, "axis_groups",
                        lambda mesh, axis: [[_gpu(0, 0), _gpu(0, 1), _gpu(1, 0), _gpu(1, 1)]])
    monkeypatch.setattr(comm, "comm_id_for", lambda *a, **k: 7)
    with pytest.raises(ValueError, match="one GPU of each axis group per process"):
        comm.ensure_communicators("mesh", "dp", workspace_bytes=1, comm_sms=0,
                                  peer_store_bytes=1 << 20)


# ------------------------------------------------------------------ the CUDA lowering

def _program(fo, collective, mesh, m=4096, k_local=4096, n=8192, comm_sms=None):
    tp = mesh.shape["tp"]
    if collective == "all_reduce":
        body = lambda a, b: fo.matmul_all_reduce(a, b, "tp", comm_sms=comm_sms)  # noqa: E731
        out = P()
    else:
        body = lambda a, b: fo.matmul_reduce_scatter(a, b, "tp", comm_sms=comm_sms)  # noqa: E731
        out = P("tp", None)
    f = shard_map(body, mesh, (P(None, "tp"), P("tp", None)), out)
    args = (jax.ShapeDtypeStruct((m, k_local * tp), jnp.bfloat16),
            jax.ShapeDtypeStruct((k_local * tp, n), jnp.bfloat16))
    return f, args


def _attrs(fo, collective, mesh, **kw):
    f, args = _program(fo, collective, mesh, **kw)
    lines = custom_call_lines(lower_for_cuda(f, args), PRIMITIVE_NAMES[collective])
    assert len(lines) == 1, lines
    line = lines[0]
    transport = re.search(r"\btransport\s*=\s*(\d+)", line)
    comm_sms = re.search(r"\bcomm_sms\s*=\s*(\d+)", line)
    bands = re.search(r"\bband_rows\s*=\s*dense<\[?([0-9, ]+)\]?>", line)
    assert transport and comm_sms and bands, line
    return (int(transport.group(1)), int(comm_sms.group(1)),
            tuple(int(v) for v in bands.group(1).split(",")), line)


@pytest.fixture
def no_fallback(monkeypatch):
    monkeypatch.setenv("JAX_FLASHOVERLAP_FALLBACK", "0")
    monkeypatch.delenv("JAX_FLASHOVERLAP_FORCE_REFERENCE", raising=False)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_peer_lowering_emits_the_peer_plan(fo, no_fallback, monkeypatch, collective):
    """Two devices, transport=peer: transport = 1, the GEMM on every SM (comm_sms 0), band_rows
    of one block (M / 2 rows) for both collectives, the all-reduce not in place."""
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    transport, comm_sms, bands, line = _attrs(fo, collective, make_mesh_1d(2))
    assert transport == 1 and comm_sms == 0, line
    assert bands == plan_peer.plan(collective, 4096, 8192, 4096).band_rows
    assert bands[-1] == 2048
    if collective == "all_reduce":
        assert re.search(r"\bin_place\s*=\s*0\b", line), line


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_an_explicit_comm_sms_under_transport_peer(fo, no_fallback, monkeypatch, collective):
    """The peer stores run the GEMM on every SM: comm_sms=0 says just that and takes them;
    any other explicit comm_sms is a ValueError at lowering (docs/errors.md)."""
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    mesh = make_mesh_1d(2)
    transport, comm_sms, bands, line = _attrs(fo, collective, mesh, comm_sms=0)
    assert (transport, comm_sms) == (1, 0), line
    f, args = _program(fo, collective, mesh, comm_sms=16)
    with pytest.raises(ValueError, match=r"comm_sms=16, but with JAX_FLASHOVERLAP_TRANSPORT=peer "
                                         r"the GEMM runs on every SM"):
        lower_for_cuda(f, args)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_a_forced_plan_takes_the_nccl_path_under_transport_peer(fo, no_fallback, monkeypatch,
                                                                 collective):
    """plan.forced(...) under JAX_FLASHOVERLAP_TRANSPORT=peer emitted the peer-store call with
    plan_peer's bands, its bands, comm_sms and overlap=False ignored (a tuner run in that
    environment would have saved NCCL entries timed on the peer stores)."""
    from jax_flashoverlap import plan as plan_lib
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    mesh = make_mesh_1d(2)
    rows = 4096 if collective == "all_reduce" else 2048
    with plan_lib.forced(band_rows=(0, 256, rows), comm_sms=16):
        transport, comm_sms, bands, line = _attrs(fo, collective, mesh)
    assert (transport, comm_sms, bands) == (0, 16, (0, 256, rows)), line
    with plan_lib.forced(overlap=False):
        f, args = _program(fo, collective, mesh)
        assert not custom_call_lines(lower_for_cuda(f, args), PRIMITIVE_NAMES[collective])


def test_the_cost_model_variant_is_the_nccl_plan_under_transport_peer(fo, no_fallback,
                                                                      monkeypatch):
    """The bench's ours_model and the tuner's cost_model_default lower inside
    model_plans_only(): under JAX_FLASHOVERLAP_TRANSPORT=peer they timed the peer stores while
    reporting the cost model's NCCL plan."""
    from jax_flashoverlap import bench_variants, plan
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    with bench_variants.model_plans_only():
        transport, comm_sms, bands, line = _attrs(fo, "reduce_scatter", make_mesh_1d(2))
    assert transport == 0, line
    want = plan.default_plan("reduce_scatter", 4096, 8192, 4096, 2)
    assert (comm_sms, bands) == (want.comm_sms, want.band_rows), line


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("env", [None, "auto", "nccl"])
def test_default_lowering_is_nccl(fo, no_fallback, monkeypatch, collective, env):
    """Unset (auto) with no tuned peer entry, or nccl: the NCCL path."""
    if env is None:
        monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    else:
        monkeypatch.setenv(TRANSPORT_ENV, env)
    transport, comm_sms, bands, line = _attrs(fo, collective, make_mesh_1d(2))
    assert transport == 0 and comm_sms > 0, line
    assert bands[-1] == (4096 if collective == "all_reduce" else 2048)


def test_peer_calls_name_the_communicators_of_the_nominal_cap(fo, no_fallback, monkeypatch):
    """The peer path hangs its buffers on the axis's communicators of a nominal NCCL cap
    (plan_peer.NCCL_CTAS; shared with the NCCL path's where its plan has that cap): the
    comm_id attribute names them."""
    mesh = make_mesh_1d(2)
    ids = {}
    for transport in ("peer", "nccl"):
        monkeypatch.setenv(TRANSPORT_ENV, transport)
        line = _attrs(fo, "reduce_scatter", mesh)[3]
        ids[transport] = re.search(r"\bcomm_id\s*=\s*(\d+)", line).group(1)
    from jax_flashoverlap import comm
    assert int(ids["peer"]) == comm.comm_id_for(mesh, "tp", plan_peer.NCCL_CTAS)
    nccl_sms = _attrs(fo, "reduce_scatter", mesh)[1]  # the NCCL path's plan (transport=nccl)
    assert (ids["nccl"] == ids["peer"]) == (nccl_sms == plan_peer.NCCL_CTAS)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("mesh_of", [lambda: make_mesh_1d(4), lambda: make_mesh_1d(8),
                                     lambda: make_mesh_2d(2, 2), lambda: make_mesh_2d(2, 4)])
def test_every_group_size_up_to_8_takes_the_peer_stores(fo, no_fallback, monkeypatch, mesh_of,
                                                        collective):
    """A mesh axis of 2, 4 or 8 devices (1-D, or the tp axis of a 2-D mesh): transport = 1,
    band_rows of one block of M / world rows (plan_peer.plan at that world size), no warning."""
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    from jax_flashoverlap import primitives
    primitives._warned_peer_stores.clear()
    mesh = mesh_of()
    tp = mesh.shape["tp"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if "dp" in mesh.shape:
            out = P("dp", None) if collective == "all_reduce" else P(("dp", "tp"), None)
            op = fo.matmul_all_reduce if collective == "all_reduce" else fo.matmul_reduce_scatter
            f = shard_map(lambda a, b: op(a, b, "tp"), mesh, (P("dp", "tp"), P("tp", None)), out)
            args = (jax.ShapeDtypeStruct((8192, 4096 * tp), jnp.bfloat16),
                    jax.ShapeDtypeStruct((4096 * tp, 8192), jnp.bfloat16))
            line = custom_call_lines(lower_for_cuda(f, args), PRIMITIVE_NAMES[collective])[0]
            transport = int(re.search(r"\btransport\s*=\s*(\d+)", line).group(1))
            bands = tuple(int(v) for v in re.search(r"\bband_rows\s*=\s*dense<\[?([0-9, ]+)\]?>",
                                                    line).group(1).split(","))
            m_local = 8192 // mesh.shape["dp"]
        else:
            transport, _, bands, line = _attrs(fo, collective, mesh)
            m_local = 4096
    assert transport == 1, line
    assert bands == plan_peer.plan(collective, m_local, 8192, 4096, world=tp).band_rows
    assert bands[-1] == m_local // tp
    assert not [w for w in caught if issubclass(w.category, plan_peer.PeerStoresWarning)]


def test_rows_not_a_multiple_of_the_group_keep_nccl_with_a_warning(fo, no_fallback, monkeypatch):
    """An all-reduce of M = 4100 rows over 8 devices: no equal row blocks, so the NCCL path,
    with a warning naming why (4100 is even: at world size 2 it would take the peer stores)."""
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    from jax_flashoverlap import primitives
    primitives._warned_peer_stores.clear()
    with pytest.warns(plan_peer.PeerStoresWarning, match="M=4100 rows; peer stores split them into 8"):
        transport = _attrs(fo, "all_reduce", make_mesh_1d(8), m=4100)[0]
    assert transport == 0



def test_rows_warning_is_once_per_group_size_not_per_shape(fo, no_fallback, monkeypatch):
    """A long-running process lowers many M (sequence lengths): M not a multiple of the group
    is one cause, warned once per group size, not once per M (which kept a set entry per M
    for good and warned at every new length)."""
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    from jax_flashoverlap import primitives
    primitives._warned_peer_stores.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (4095, 4097, 4099):
            assert _attrs(fo, "all_reduce", make_mesh_1d(2), m=m)[0] == 0
        assert _attrs(fo, "all_reduce", make_mesh_1d(4), m=4098)[0] == 0  # another group size
    warned = [str(w.message) for w in caught if issubclass(w.category, plan_peer.PeerStoresWarning)]
    assert len(warned) == 2 and "M=4095 rows" in warned[0] and "into 4 equal" in warned[1], warned
    assert len(primitives._warned_peer_stores) == 2

@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
def test_peer_plan_of_larger_groups(collective, world):
    """World 4 and 8: bands of one block of M / world rows on unit boundaries, at most
    MAX_GROUPS / world of them; the bytes each GPU stores grow with the group."""
    m, n, k = 8192, 8192, 4096
    p = plan_peer.plan(collective, m, n, k, world=world)
    assert p.rows_per_block == m // world and p.band_rows[-1] == m // world
    assert p.num_groups * world <= plan_lib.MAX_GROUPS
    unit = ts.kernel_geometry(m, n, 0).rows_per_unit
    assert all(b % unit == 0 for b in p.band_rows[1:-1]), (p.band_rows, unit)
    two = plan_peer.plan(collective, m, n, k, world=2)
    assert p.predicted_s >= two.predicted_s
    # The one-GPU measurement of a group's sequence (the ring's adds; the all-reduce's mirrors).
    assert plan_peer.sequence_over_gemm(collective, world) > plan_peer.sequence_over_gemm(collective, 2)
    assert plan_peer.sequence_over_gemm(collective, 3) == plan_peer.sequence_over_gemm(collective, 4)
    assert plan_peer.sequence_over_gemm(collective, 5) == plan_peer.sequence_over_gemm(collective, 8)
    with pytest.raises(ValueError, match=f"at most {plan_lib.MAX_GROUPS // world} bands per block "
                                         f"at world size {world}"):
        bands = tuple(range(0, m // world, 16))[: plan_lib.MAX_GROUPS // world + 1] + (m // world,)
        dataclasses.replace(p, band_rows=bands).validate(world)


def test_odd_rows_all_reduce_keeps_nccl(fo, no_fallback, monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    from jax_flashoverlap import primitives
    primitives._warned_peer_stores.clear()
    with pytest.warns(plan_peer.PeerStoresWarning, match="M=4095 rows"):
        transport = _attrs(fo, "all_reduce", make_mesh_1d(2), m=4095)[0]
    assert transport == 0


def test_comm_sms_with_peer_transport_is_an_error(fo, no_fallback, monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "peer")
    with pytest.raises(ValueError, match=r"comm_sms=16, but with JAX_FLASHOVERLAP_TRANSPORT=peer"):
        _attrs(fo, "all_reduce", make_mesh_1d(2), comm_sms=16)


def test_transport_typo_fails_the_lowering(fo, no_fallback, monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "nvlink")
    with pytest.raises(ValueError, match=TRANSPORT_ENV):
        _attrs(fo, "reduce_scatter", make_mesh_1d(2))


def test_recv_bytes_is_a_block_per_block_the_ring_passes():
    # 2 ranks: the one block the other rank passes; more: laid out by block, every block
    # (the next rank's own is never passed, its rows stay unused).
    assert plan_peer.recv_bytes(4096, 8192, 2) == 2048 * 8192 * 2
    assert plan_peer.recv_bytes(2, 8, 2) == 16
    assert plan_peer.recv_bytes(4096, 8192, 2, world=3) == 3 * 1365 * 8192 * 2
    assert plan_peer.recv_bytes(4096, 8192, 2, world=4) == 4 * 1024 * 8192 * 2
    assert plan_peer.recv_bytes(4096, 8192, 2, world=8) == 8 * 512 * 8192 * 2


def _tuned_peer_entry(tmp_path, monkeypatch, collective="reduce_scatter"):
    """A tuned config (user dir) whose entry for the 2-device test problem says peer, with
    bands of its own; the CPU mesh named as the H200 whose config it is."""
    import json
    from jax_flashoverlap import comm, tuning
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(tuning.TUNED_ENV, raising=False)
    monkeypatch.setattr(comm, "mesh_gpu_name", lambda mesh: "NVIDIA H200")
    entry = dict(collective=collective, dtype="bfloat16", m=4096, n=8192, k=4096, comm_sms=0,
                 band_rows=[0, 512, 1024, 2048], transport="peer", overlap=True)
    (tmp_path / "h200_x2.json").write_text(json.dumps(dict(
        schema=tuning.SCHEMA, gpu="NVIDIA H200", world_size=2, entries=[entry])))
    return tuple(entry["band_rows"])


@pytest.mark.parametrize("env, expected", [(None, 1), ("auto", 1), ("peer", 1), ("nccl", 0)])
def test_tuned_peer_entry_is_taken_unless_nccl_is_asked(fo, no_fallback, monkeypatch, tmp_path,
                                                        env, expected):
    bands = _tuned_peer_entry(tmp_path, monkeypatch)
    if env is None:
        monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    else:
        monkeypatch.setenv(TRANSPORT_ENV, env)
    transport, comm_sms, got, line = _attrs(fo, "reduce_scatter", make_mesh_1d(2))
    assert transport == expected, line
    if expected:
        assert got == bands and comm_sms == 0, line  # the tuned entry's bands, not plan_peer's
    else:
        assert comm_sms > 0 and got[-1] == 2048, line


def test_tuned_peer_entry_off_with_the_tuned_switch(fo, no_fallback, monkeypatch, tmp_path):
    _tuned_peer_entry(tmp_path, monkeypatch)
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    monkeypatch.setenv("JAX_FLASHOVERLAP_TUNED", "0")
    assert _attrs(fo, "reduce_scatter", make_mesh_1d(2))[0] == 0


def test_a_link_bound_peer_plan_is_its_stored_bytes_over_the_link():
    """With a short K the stores bound the predicted time: the reduce-scatter stores the other
    ranks' blocks, the all-reduce also its reduced block into each of them (twice the bytes)."""
    m, n, k, world = 8192, 8192, 64, 4
    for collective, times in (("reduce_scatter", 1), ("all_reduce", 2)):
        p = plan_peer.plan(collective, m, n, k, world=world)
        assert p.predicted_s == pytest.approx(
            times * (world - 1) * (m // world) * n * 2 / plan_peer.ASSUMED_LINK_BYTES_PER_S)


def test_a_compute_bound_peer_plan_is_the_gemm_with_its_split_tail_times_the_sequence():
    """With a long K the GEMM bounds the predicted time: its waves on all SMs with K's split
    tail (ts.gemm_waves given k: 15.52 waves at 8192 x 8192, not 16 whole ones) times the
    measured sequence-over-GEMM factor."""
    m, n, k = 8192, 8192, 4096
    waves = ts.gemm_waves(m, n, 0, k)
    assert waves != ts.gemm_waves(m, n, 0)  # the premise: the split tail counts here
    kern = ts.kernel_geometry(m, n, 0)
    unit = 2.0 * kern.block_m * kern.block_n * k / plan_lib.DEFAULT_PROFILE.sm_flops
    for collective in ("reduce_scatter", "all_reduce"):
        p = plan_peer.plan(collective, m, n, k)
        gemm_bound = waves * unit * plan_peer.sequence_over_gemm(collective, 2)
        assert gemm_bound > (m // 2) * n * 2 * 2 / plan_peer.ASSUMED_LINK_BYTES_PER_S
        assert p.predicted_s == pytest.approx(gemm_bound, rel=1e-12)
