"""jax_flashoverlap.comm on CPU, with the CUDA extension replaced by recording fakes
(tests/_util.py's FakeCommExtension) and, for meshes spanning processes, fake GPU devices of
several processes and distributed's collective steps recorded instead of run: which
communicators a comm_id names, which devices form a group and in what rank order, what each
creation is given, which barrier / key names the processes meet at, and the switches read on
the way (JAX_FLASHOVERLAP_WATCHDOG_S). These are what two processes must compute alike
without talking; the steps themselves across real processes: tests/test_multiprocess.py."""
import collections
import types

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, Mesh

from _util import FakeCommExtension, make_mesh_1d, make_mesh_2d, set_env

from jax_flashoverlap import _ext, comm, distributed


# ----------------------------------------------------------------------------- comm_id_for

def test_comm_ids_tell_apart_axes_devices_caps_and_kinds():
  """Every input that makes other communicators makes another comm_id: two ids equal would
  make two different groups' calls share (and corrupt) one communicator."""
  mesh = make_mesh_2d(2, 4)
  devs = jax.devices("cpu")
  first, second = Mesh(np.array(devs[:4]), ("tp",)), Mesh(np.array(devs[4:8]), ("tp",))
  ids = {
      "tp": comm.comm_id_for(mesh, "tp", 16),
      "dp": comm.comm_id_for(mesh, "dp", 16),
      "dp,tp": comm.comm_id_for(mesh, ("dp", "tp"), 16),
      "tp,dp": comm.comm_id_for(mesh, ("tp", "dp"), 16),
      "tp 8 SMs": comm.comm_id_for(mesh, "tp", 8),
      "tp p2p": comm.comm_id_for(mesh, "tp", 16, peer_to_peer=True),
      "tp zero": comm.comm_id_for(mesh, "tp", 16, cta_policy="zero"),
      "devices 0-3": comm.comm_id_for(first, "tp", 16),
      "devices 4-7": comm.comm_id_for(second, "tp", 16),
  }
  assert len(set(ids.values())) == len(ids), ids
  assert all(0 < i < 2**63 for i in ids.values()), ids  # an int64 attribute, never 0
  # a list of axis names is the same axes as their tuple
  assert comm.comm_id_for(mesh, ["dp", "tp"], 16) == ids["dp,tp"]


def test_abstract_mesh_ids_tell_apart_caps_and_axes():
  """An AbstractMesh (no devices: names and sizes only) still gives each cap, axis and shape
  its own id."""
  mesh = AbstractMesh((2, 4), ("dp", "tp"))
  ids = [comm.comm_id_for(mesh, "tp", 16), comm.comm_id_for(mesh, "tp", 8),
         comm.comm_id_for(mesh, "dp", 16), comm.comm_id_for(AbstractMesh((4, 2), ("dp", "tp")),
                                                            "tp", 16)]
  assert len(set(ids)) == len(ids), ids


# ----------------------------------------------------------------------------- axis_groups

def _ids(groups):
  return [[int(d.id) for d in g] for g in groups]


def test_axis_groups_and_their_rank_order():
  """2 x 4 mesh of devices 0..7 (row-major): 'tp' groups are the rows, 'dp' groups the columns,
  both axes one group whose ranks run row-major over the axes in the order given."""
  mesh = make_mesh_2d(2, 4)
  d = [[int(x.id) for x in row] for row in mesh.devices]
  assert _ids(comm.axis_groups(mesh, "tp")) == d
  assert _ids(comm.axis_groups(mesh, "dp")) == [list(c) for c in zip(*d)]
  assert _ids(comm.axis_groups(mesh, ("dp", "tp"))) == [d[0] + d[1]]
  assert _ids(comm.axis_groups(mesh, ["tp", "dp"])) == [[x for c in zip(*d) for x in c]]


def test_axis_groups_refuse_an_axis_not_of_the_mesh():
  with pytest.raises(ValueError, match=r"axis 'sp' is not an axis of the mesh \('dp', 'tp'\)"):
    comm.axis_groups(make_mesh_2d(2, 4), ("tp", "sp"))


# ----------------------------------------------------------------------------- devices

def _gpu(id, process=0, hw=None, kind="NVIDIA H200", platform="gpu"):
  return types.SimpleNamespace(id=id, process_index=process,
                               local_hardware_id=id if hw is None else hw,
                               platform=platform, device_kind=kind)


def _mesh(devices, names):
  devices = np.array(devices, dtype=object)
  return types.SimpleNamespace(axis_names=names, devices=devices,
                               shape=dict(zip(names, devices.shape)))


@pytest.mark.parametrize("platform", ["gpu", "cuda"])
def test_a_gpu_mesh_is_local_and_named_by_its_device_kind(platform):
  mesh = _mesh([_gpu(0, platform=platform), _gpu(1, platform=platform)], ("tp",))
  assert comm.mesh_is_local_gpu(mesh)
  assert comm.mesh_gpu_name(mesh) == "NVIDIA H200"
  assert comm.mesh_gpu_name(_mesh([_gpu(0, kind="")], ("tp",))) is None  # no name: no key
  cpu = make_mesh_1d(2)
  assert not comm.mesh_is_local_gpu(cpu) and comm.mesh_gpu_name(cpu) is None
  assert not comm.mesh_is_local_gpu(AbstractMesh((2,), ("tp",)))


# ----------------------------------------------------------------------------- switches

@pytest.mark.parametrize("raw, seconds", [(None, 0.0), ("", 0.0), ("off", 0.0), ("No", 0.0),
                                          ("false", 0.0), ("0", 0.0), ("0.0", 0.0),
                                          (" 2.5 ", 2.5), ("600", 600.0)])
def test_watchdog_seconds(monkeypatch, raw, seconds):
  set_env(monkeypatch, comm.WATCHDOG_ENV, raw)
  assert comm.watchdog_seconds() == seconds


@pytest.mark.parametrize("raw", ["inf", "-0.5", "nan", "-inf", "5s"])
def test_watchdog_seconds_refuses_what_is_not_a_time(monkeypatch, raw):
  monkeypatch.setenv(comm.WATCHDOG_ENV, raw)
  with pytest.raises(ValueError, match=f"JAX_FLASHOVERLAP_WATCHDOG_S must be a number of "
                                       f"seconds > 0.*got '{raw}'"):
    comm.watchdog_seconds()


class _Faults:
  def __init__(self):
    self.armed = []

  def set_fault_injection(self, kind, calls):
    self.armed.append((kind, calls))


def test_inject_faults_arms_the_extension_with_its_arguments(monkeypatch):
  """What reaches the extension is what was asked for; a bad count never reaches it (here
  the extension is a fake that would take anything: the check is Python's own)."""
  fake = _Faults()
  monkeypatch.setattr(_ext, "ext", fake)
  comm.inject_faults("cuda", 3)
  comm.inject_faults("none", 0)
  assert fake.armed == [("cuda", 3), ("none", 0)]
  for calls in (-1, True, 1.0):
    with pytest.raises(ValueError, match=f"calls must be an int >= 0, got {calls!r}"):
      comm.inject_faults("nccl", calls)
  assert fake.armed == [("cuda", 3), ("none", 0)]


# ----------------------------------------------------------------------------- creation

class _Recorder(FakeCommExtension):
  """The extension's communicator calls, each recorded with its arguments."""

  def __init__(self):
    super().__init__()
    self.created, self.grown, self.connected, self.destroyed = [], [], [], []

  def create_communicators(self, cid, uid, world, local, comm_sms, nbytes, watchdog,
                           peer_to_peer=False, cta_policy=0):
    super().create_communicators(cid, uid, world, local, comm_sms, nbytes, watchdog)
    self.created.append(dict(cid=cid, uid=uid, world=world, local=list(local),
                             comm_sms=comm_sms, nbytes=nbytes, watchdog=watchdog,
                             peer_to_peer=peer_to_peer, cta_policy=cta_policy))

  def ensure_workspace(self, cid, nbytes):
    self.grown.append((cid, nbytes))

  def connect_peers(self, cid):
    self.connected.append(cid)

  def destroy_communicators(self, cid):
    self.destroyed.append(cid)
    if cid:
      self.made.discard(cid)
    else:
      self.made.clear()


@pytest.fixture
def rec(monkeypatch):
  """A recording extension, and fresh per-comm_id counts (they live for the process)."""
  fake = _Recorder()
  monkeypatch.setattr(_ext, "ext", fake)
  monkeypatch.setattr(comm, "_creations", collections.Counter())
  monkeypatch.setattr(comm, "_ensure_counts", collections.Counter())
  monkeypatch.delenv(comm.WATCHDOG_ENV, raising=False)
  return fake


def test_creation_passes_the_callers_settings_to_each_communicator(rec, monkeypatch):
  """One process, 2 x 2 mesh over 'tp': a group per row, each created with its world size,
  its (rank, device) pairs, the cap, the workspace, the watchdog, the peer-to-peer flag and
  the CTA policy's code; found again, it is grown and (point-to-point) connected again."""
  monkeypatch.setenv(comm.WATCHDOG_ENV, "7.5")
  mesh = make_mesh_2d(2, 2)
  cid = comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=8,
                                  peer_to_peer=True, cta_policy="zero")
  assert cid == comm.comm_id_for(mesh, "tp", 8, True, "zero")
  hw = [[int(d.local_hardware_id) for d in row] for row in mesh.devices]
  assert [(c["world"], c["local"]) for c in rec.created] == [
      (2, [(0, hw[0][0]), (1, hw[0][1])]), (2, [(0, hw[1][0]), (1, hw[1][1])])]
  for c in rec.created:
    assert (c["cid"], c["uid"], c["comm_sms"], c["nbytes"], c["watchdog"], c["peer_to_peer"],
            c["cta_policy"]) == (cid, bytes(128), 8, 1 << 20, 7.5, True, 2), c
  assert rec.connected == [cid] and rec.grown == []
  comm.ensure_communicators(mesh, "tp", workspace_bytes=3 << 20, comm_sms=8,
                            peer_to_peer=True, cta_policy="zero")
  assert len(rec.created) == 2 and rec.grown == [(cid, 3 << 20)]
  assert rec.connected == [cid, cid]  # the grown workspace carries the handshake: again


def test_without_the_extension_communicators_cannot_be_made(monkeypatch):
  monkeypatch.setattr(_ext, "ext", None)
  with pytest.raises(RuntimeError, match="jax_flashoverlap: the CUDA extension is not built"):
    comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20, comm_sms=8)


class _Steps:
  """distributed's collective steps, recorded in order; the other processes are taken to
  succeed, and a shared value not made here is the owner's index repeated."""

  def __init__(self, monkeypatch, me):
    self.log = []
    monkeypatch.setattr(jax, "process_index", lambda *a, **k: me)
    monkeypatch.setattr(distributed, "barrier", lambda name, processes=None: self.log.append(
        ("barrier", name, sorted(processes))))

    def all_succeed(key, fn, processes=None, what="a step"):
      self.log.append(("step", key, sorted(processes)))
      return fn()

    def share(key, owner_process, make):
      self.log.append(("share", key, owner_process))
      return make() if owner_process == me else bytes([owner_process] * 4).hex()
    monkeypatch.setattr(distributed, "all_succeed", all_succeed)
    monkeypatch.setattr(distributed, "share", share)


def _two_processes():
  """2 processes x 2 GPUs, mesh ('dp', 'tp'): each row is one process's GPUs (ordinals 0, 1)."""
  return _mesh([[_gpu(0, 0, 0), _gpu(1, 0, 1)], [_gpu(2, 1, 0), _gpu(3, 1, 1)]], ("dp", "tp"))


def test_groups_across_processes_take_their_id_from_rank_0s_process(rec, monkeypatch):
  """Process 1's view of 'dp' (each group one GPU per process): every process meets at a
  barrier before NCCL's init, each group is one all-or-nothing step whose NCCL id comes from
  the process of its rank 0 (process 0) under a key of this creation, each communicator is one
  rank of a world of 2, and a barrier ends the creation. Names carry the creation's number:
  the same on every process, never reused after destroy_communicators."""
  steps = _Steps(monkeypatch, me=1)
  mesh = _two_processes()
  cid = comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=8)
  both = [0, 1]
  assert steps.log == [
      ("barrier", f"preinit/{cid}/1", both),
      ("step", f"create/{cid}/1/0", both), ("share", f"uid/{cid}/1/0", 0),
      ("step", f"create/{cid}/1/1", both), ("share", f"uid/{cid}/1/1", 0),
      ("barrier", f"init/{cid}/1", both)]
  assert [(c["uid"], c["world"], c["local"]) for c in rec.created] == [
      (bytes(4), 2, [(1, 0)]), (bytes(4), 2, [(1, 1)])]
  # found: a growth is collective too (a barrier of its own number), then made again
  steps.log.clear()
  for _ in range(2):
    comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=8)
  assert steps.log == [("barrier", f"ensure/{cid}/1", both), ("barrier", f"ensure/{cid}/2", both)]
  comm.destroy_communicators()
  assert rec.destroyed == [0]  # 0: every communicator of this process
  steps.log.clear()
  comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=8)
  assert steps.log[:3] == [("barrier", f"preinit/{cid}/2", both),
                           ("step", f"create/{cid}/2/0", both), ("share", f"uid/{cid}/2/0", 0)]


def test_a_group_inside_each_process_needs_no_other_process(rec, monkeypatch):
  """'tp' of the same mesh: process 0 makes its own group's id and both ranks at once, and
  meets no other process; the other process's group is not its business."""
  steps = _Steps(monkeypatch, me=0)
  comm.ensure_communicators(_two_processes(), "tp", workspace_bytes=1 << 20, comm_sms=8)
  assert steps.log == []
  assert [(c["world"], c["local"]) for c in rec.created] == [(2, [(0, 0), (1, 1)])]


# ----------------------------------------------------------------------------- failures

class _CreateFails(_Recorder):
  def __init__(self, destroy_error=None):
    super().__init__()
    self.destroy_error = destroy_error

  def create_communicators(self, *args, **kwargs):
    raise RuntimeError("NCCL error in ncclMemAlloc(&c->workspace, bytes): out of memory")

  def destroy_communicators(self, cid):
    super().destroy_communicators(cid)
    if self.destroy_error:
      raise self.destroy_error


def test_a_failed_cleanup_is_a_note_on_the_error_reported(monkeypatch):
  """The creation's error is what is raised (with the workspace hint, chained to the
  extension's own error); destroying what was made failing too is added as a note."""
  fake = _CreateFails(RuntimeError("ncclCommDestroy: unhandled system error"))
  monkeypatch.setattr(_ext, "ext", fake)
  # 1 MiB asked for, allocated in 8 MiB steps (comm.allocated_bytes): the hint names what failed
  with pytest.raises(RuntimeError, match="communication workspace \\(8 MiB per GPU\\)") as err:
    comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20, comm_sms=8)
  cid = comm.comm_id_for(make_mesh_1d(2), "tp", 8)
  assert fake.destroyed == [cid]
  assert isinstance(err.value.__cause__, RuntimeError)
  assert str(err.value.__cause__).startswith("NCCL error in ncclMemAlloc")
  if hasattr(err.value, "add_note"):  # Python >= 3.11
    assert err.value.__notes__ == [
        f"jax_flashoverlap: then destroying comm_id {cid}'s communicators failed: "
        "ncclCommDestroy: unhandled system error"]


# ----------------------------------------------------------------------------- exit and listing

def test_communicators_are_destroyed_at_exit_once_registered(rec, monkeypatch):
  registered = []
  monkeypatch.setattr(comm, "atexit", types.SimpleNamespace(register=registered.append))
  monkeypatch.setattr(comm, "_atexit_registered", False)
  comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=1 << 20, comm_sms=8)
  comm.ensure_communicators(make_mesh_1d(4), "tp", workspace_bytes=1 << 20, comm_sms=8)
  assert registered == [comm._destroy_at_exit]
  registered[0]()
  assert rec.destroyed == [0]


def test_exit_reports_a_failed_destroy_and_goes_on(monkeypatch, capsys):
  fake = _CreateFails(RuntimeError("comm_id 7: calls still in flight"))
  monkeypatch.setattr(_ext, "ext", fake)
  comm._destroy_at_exit()  # does not raise
  assert capsys.readouterr().err == ("jax_flashoverlap: communicators not cleanly destroyed at "
                                     "exit: comm_id 7: calls still in flight\n")


def test_list_communicators_without_the_extension_is_empty(monkeypatch):
  monkeypatch.setattr(_ext, "ext", None)
  assert comm.list_communicators() == []
  comm.destroy_communicators()  # nothing to destroy: no error
