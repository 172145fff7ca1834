"""A communication workspace that cannot be allocated (GPU: jax_flashoverlap.comm with the
extension's communicator API replaced here by a fake that fails like it does): the error says
what to do, and anything else the extension raises passes through unchanged."""
import pytest

from _util import FakeCommExtension, make_mesh_1d


class _FailingExtension(FakeCommExtension):
  """Creation fails (unless `create_ok`) as a failed workspace does: the group's communicators
  stay registered (communicator.h) and the error is raised; growth fails the same way."""
  def __init__(self, message, create_ok=False):
    super().__init__()
    self.message, self.create_ok, self.destroyed = message, create_ok, []

  def create_communicators(self, cid, *args, **kwargs):
    self.made.add(cid)
    if not self.create_ok:
      raise RuntimeError(self.message)

  def ensure_workspace(self, cid, nbytes):
    raise RuntimeError(self.message)

  def destroy_communicators(self, cid):
    self.destroyed.append(cid)
    self.made.discard(cid)


# What the GPU machine printed when a child process found the GPU taken by its parent's
# XLA pool (benchmarks/results/logs/review_h200x1_68f28fb/call1_cb43e13/).
NCCL_OOM = ("NCCL error in ncclMemAlloc(&c->workspace, bytes): unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details)")


@pytest.mark.parametrize("peer_to_peer, message", [
    (False, NCCL_OOM),
    (True, "CUDA error in cudaMalloc(&c->workspace, bytes): cudaErrorMemoryAllocation (out of "
           "memory)"),
])
def test_failed_workspace_says_what_to_do_at_creation_and_growth(monkeypatch, peer_to_peer,
                                                                  message):
  from jax_flashoverlap import _ext, comm
  mesh = make_mesh_1d(4)
  for attempt in ("create", "grow"):  # growth: the communicators made, the workspace not
    monkeypatch.setattr(_ext, "ext", _FailingExtension(message, create_ok=attempt == "grow"))
    if attempt == "grow":
      comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=8,
                                peer_to_peer=peer_to_peer)
    with pytest.raises(RuntimeError) as err:
      comm.ensure_communicators(mesh, "tp", workspace_bytes=3 << 30, comm_sms=8,
                                peer_to_peer=peer_to_peer)
    text = str(err.value)
    assert message in text, (attempt, text)
    assert "communication workspace (3072 MiB per GPU)" in text, (attempt, text)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in text and "PREALLOCATE=false" in text, text


@pytest.mark.parametrize("asked, peer_to_peer, mib", [
    (1 << 20, False, 8), (3 << 20, True, 8), (65 << 20, False, 72), (1 << 30, False, 1024),
])
def test_failed_workspace_names_the_size_allocated(monkeypatch, asked, peer_to_peer, mib):
  """The extension allocates in 8 MiB steps (RoundGrowth), so the size the hint names is the
  one that did not fit. Before, it named the bytes asked for (a 1 MiB request: "1 MiB")."""
  from jax_flashoverlap import _ext, comm
  monkeypatch.setattr(_ext, "ext", _FailingExtension(NCCL_OOM))
  with pytest.raises(RuntimeError) as err:
    comm.ensure_communicators(make_mesh_1d(2), "tp", workspace_bytes=asked, comm_sms=8,
                              peer_to_peer=peer_to_peer)
  assert f"communication workspace ({mib} MiB per GPU)" in str(err.value), str(err.value)


def test_other_extension_errors_pass_unchanged(monkeypatch):
  from jax_flashoverlap import _ext, comm
  monkeypatch.setattr(_ext, "ext", _FailingExtension("NCCL error in ncclCommInitRankConfig: x"))
  with pytest.raises(RuntimeError) as err:
    comm.ensure_communicators(make_mesh_1d(4), "tp", workspace_bytes=1 << 20, comm_sms=8)
  assert str(err.value) == "NCCL error in ncclCommInitRankConfig: x"


class _SecondGroupFails(FakeCommExtension):
  """Communicators per (comm_id, device); the creation of the second group of the first
  lowering fails as a failed workspace does (its communicators stay, the error is raised)."""
  def __init__(self):
    super().__init__()
    self.devices, self.creations = {}, 0

  def has_communicators(self, cid):
    return bool(self.devices.get(cid))

  def create_communicators(self, cid, uid, world, local, *args, **kwargs):
    self.creations += 1
    self.devices.setdefault(cid, set()).update(device for _, device in local)
    if self.creations == 2:
      raise RuntimeError("NCCL error in ncclMemAlloc(&c->workspace, bytes): out of memory")

  def destroy_communicators(self, cid):
    self.devices.pop(cid, None)


def test_a_group_that_fails_leaves_no_communicator_of_its_comm_id(monkeypatch):
  """2 x 2 mesh, communicators over 'tp': two groups. The second failed; the first's stayed,
  so the next lowering found "the" communicators and never made the second group's: its
  devices' calls were refused ("no communicator") until destroy_communicators. Now a failure
  leaves none, and the next lowering makes every group."""
  from jax_flashoverlap import _ext, comm
  from _util import make_mesh_2d
  fake = _SecondGroupFails()
  monkeypatch.setattr(_ext, "ext", fake)
  mesh = make_mesh_2d(2, 2)
  with pytest.raises(RuntimeError, match="ncclMemAlloc"):
    comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=8)
  assert not any(fake.devices.values()), fake.devices
  cid = comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=8)
  assert fake.devices[cid] == {int(d.local_hardware_id) for d in mesh.devices.flat}


class _ConnectFails(_SecondGroupFails):
  def __init__(self, error):
    super().__init__()
    self.creations, self.error = -100, error  # creation never fails

  def connect_peers(self, cid):
    raise self.error


@pytest.mark.parametrize("error, kept", [
    (RuntimeError("the group's other ranks did not join the peer connection"), False),
    # a process that never came: destroying communicators shared with it could wait for it
    (TimeoutError("jax_flashoverlap: waited 300 s for process 1"), True),
])
def test_a_failed_peer_connection_leaves_none_unless_a_peer_never_came(monkeypatch, error, kept):
  from jax_flashoverlap import _ext, comm
  fake = _ConnectFails(error)
  monkeypatch.setattr(_ext, "ext", fake)
  with pytest.raises(type(error)):
    comm.ensure_communicators(make_mesh_1d(4), "tp", workspace_bytes=1 << 20, comm_sms=8,
                              peer_to_peer=True)
  assert bool(any(fake.devices.values())) == kept, fake.devices
