"""May the peer-store all-reduce mirror straight into the other GPUs' XLA results? CUDA leaves
that to the allocator (xla_ffi/comm/peer_access.h), so comm.peer_results_writable asks the
driver about a probe buffer XLA allocates on each GPU, and ensure_communicators has a group
stage its mirrors where the answer is no. Here the extension is a fake that answers per peer,
over the CPU's simulated devices (their buffers have addresses too): who is asked about
what, and what the answer makes the growth do. The driver's own answers run on the GPU
(tests/test_gpu_peer.py)."""
import types

import pytest

from _util import FakeCommExtension, make_mesh_1d, make_mesh_2d

from jax_flashoverlap import _ext, comm


class _Ext(FakeCommExtension):
    """The extension's communicator calls, recording the peer-store ones; `writable(peer)`
    answers peer_may_write until grant_peers_write gives that peer access (`grantable(peer)`:
    the driver accepts; else it raises as the extension does)."""

    def __init__(self, writable=lambda peer: True, grantable=lambda peer: True):
        super().__init__()
        self.writable, self.grantable = writable, grantable
        self.asked, self.grown, self.granted = [], [], []

    def peer_may_write(self, ptr, peer):
        self.asked.append((ptr, peer))
        return self.writable(peer) or (ptr, peer) in self.granted, "vmm"

    def grant_peers_write(self, ptr, peers):
        for peer in peers:
            if not self.grantable(peer):
                raise RuntimeError(f"cuMemSetAccess over the mapping failed with CUresult 1 (peer {peer})")
            self.granted.append((ptr, peer))
        return "vmm"

    def ensure_peer_stores(self, cid, recv_bytes, stage_mirrors=False, grant_results=False):
        self.grown.append((cid, recv_bytes, stage_mirrors, grant_results))


@pytest.fixture(autouse=True)
def _fresh_answers(monkeypatch):
    monkeypatch.setattr(comm, "_results_writable", {})


def test_every_gpu_is_asked_about_each_other_gpus_buffer_once(monkeypatch):
    ext = _Ext()
    monkeypatch.setattr(_ext, "ext", ext)
    groups = comm.axis_groups(make_mesh_2d(2, 2), "tp")
    assert comm.peer_results_writable(groups)
    expected = [int(o.local_hardware_id) for g in groups for d in g for o in g if o.id != d.id]
    assert [peer for _, peer in ext.asked] == expected
    pointers = [ptr for ptr, _ in ext.asked]
    assert all(isinstance(p, int) and p > 0 for p in pointers)
    ext.asked.clear()
    assert comm.peer_results_writable(groups) and ext.asked == []  # cached


@pytest.mark.parametrize("rank", [0, 2])
def test_one_gpu_that_may_not_write_makes_every_group_stage(monkeypatch, rank):
    """Rank 0 barred: its 'no's come first and the pairs asked after it all say yes; the
    answer is still no."""
    groups = comm.axis_groups(make_mesh_1d(4), "tp")
    barred = int(groups[0][rank].local_hardware_id)
    ext = _Ext(writable=lambda peer: peer != barred)
    monkeypatch.setattr(_ext, "ext", ext)
    assert not comm.peer_results_writable(groups)
    assert [peer for _, peer in ext.asked].count(barred) == 3


def test_groups_across_processes_and_single_gpus_are_not_asked(monkeypatch):
    ext = _Ext(writable=lambda peer: pytest.fail("asked"))
    monkeypatch.setattr(_ext, "ext", ext)
    gpu = lambda process, hw: types.SimpleNamespace(process_index=process, local_hardware_id=hw,  # noqa: E731
                                                    id=10 * process + hw)
    assert comm.peer_results_writable([[gpu(0, 0), gpu(1, 0)], [gpu(0, 1)]])
    assert ext.asked == []


@pytest.mark.parametrize("writable", [True, False])
def test_ensure_communicators_stages_where_the_others_may_not_write(monkeypatch, writable):
    ext = _Ext(writable=lambda peer: writable)
    monkeypatch.setattr(_ext, "ext", ext)
    mesh = make_mesh_1d(2)
    cid = comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=8,
                                    peer_store_bytes=3 << 20)
    assert ext.grown == [(cid, 3 << 20, not writable, False)]
    assert len(ext.asked) == 2 and ext.granted == []  # never granted unless asked to


def test_no_peer_stores_no_probe(monkeypatch):
    ext = _Ext(writable=lambda peer: pytest.fail("asked"))
    monkeypatch.setattr(_ext, "ext", ext)
    comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20, comm_sms=8)
    assert ext.asked == [] and ext.grown == []


def test_grant_gives_access_where_xla_did_not_and_keeps_the_group_unstaged(monkeypatch):
    """JAX_FLASHOVERLAP_GRANT_PEER_ACCESS=1: a GPU left out of XLA's access list is given
    access to the probed buffer's allocation, asked again, and the group mirrors straight into
    the results (no staging); the communicators are told to grant each new result's
    allocation too. Only the pairs that were refused are granted."""
    groups = comm.axis_groups(make_mesh_1d(2), "tp")
    barred = int(groups[0][1].local_hardware_id)
    ext = _Ext(writable=lambda peer: peer != barred)
    monkeypatch.setattr(_ext, "ext", ext)
    monkeypatch.setenv(_ext.GRANT_PEER_ACCESS_ENV, "1")
    cid = comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20, comm_sms=8,
                                    peer_store_bytes=3 << 20)
    assert [peer for _, peer in ext.granted] == [barred]
    assert ext.grown == [(cid, 3 << 20, False, True)]
    # asked, granted, asked again: three questions for the two (device, other) pairs
    assert [peer for _, peer in ext.asked].count(barred) == 2 and len(ext.asked) == 3


def test_a_refused_grant_stages_with_a_warning(monkeypatch):
    ext = _Ext(writable=lambda peer: False, grantable=lambda peer: False)
    monkeypatch.setattr(_ext, "ext", ext)
    monkeypatch.setenv(_ext.GRANT_PEER_ACCESS_ENV, "on")
    from jax_flashoverlap import plan_peer
    with pytest.warns(plan_peer.PeerStoresWarning, match="GRANT_PEER_ACCESS is on.*cuMemSetAccess"):
        cid = comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20,
                                        comm_sms=8, peer_store_bytes=3 << 20)
    assert ext.grown == [(cid, 3 << 20, True, True)]


def test_grant_answers_are_cached_apart_from_plain_ones(monkeypatch):
    """The cache is keyed by whether granting was allowed: a plain 'no' must not stand for a
    later lowering that may grant (nor a granted 'yes' for one that may not)."""
    groups = comm.axis_groups(make_mesh_1d(2), "tp")
    monkeypatch.setattr(_ext, "ext", _Ext(writable=lambda peer: False))
    assert not comm.peer_results_writable(groups)
    assert comm.peer_results_writable(groups, grant=True)


def test_grant_switch_typos_are_errors(monkeypatch):
    monkeypatch.setattr(_ext, "ext", _Ext())
    monkeypatch.setenv(_ext.GRANT_PEER_ACCESS_ENV, "maybe")
    with pytest.raises(ValueError, match="JAX_FLASHOVERLAP_GRANT_PEER_ACCESS='maybe'"):
        comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20, comm_sms=8,
                                  peer_store_bytes=3 << 20)


def test_without_the_extension_it_says_so(monkeypatch):
    """On a machine without the CUDA extension (CPU) there is no driver to ask: a clear
    error (it was an AttributeError on None), and no question at all for groups of one."""
    monkeypatch.setattr(_ext, "ext", None)
    with pytest.raises(RuntimeError, match="peer_results_writable: the CUDA extension is not "
                                           "built"):
        comm.peer_results_writable(comm.axis_groups(make_mesh_2d(2, 2), "tp"))
    assert comm.peer_results_writable(comm.axis_groups(make_mesh_2d(4, 1), "tp"))
