"""A communication workspace that cannot be allocated (GPU: jax_flashoverlap.comm with the
extension's communicator API replaced here by a fake that fails like it does): the error says
what to do, and anything else the extension raises passes through unchanged."""
import pytest

from _util import FakeCommExtension, make_mesh_1d


class _FailingExtension(FakeCommExtension):
  def __init__(self, message):
    super().__init__()
    self.message = message

  def create_communicators(self, cid, *args, **kwargs):
    self.made.add(cid)  # a failed workspace keeps the communicators (communicator.h)
    raise RuntimeError(self.message)

  def ensure_workspace(self, cid, nbytes):
    raise RuntimeError(self.message)


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
  fake = _FailingExtension(message)
  monkeypatch.setattr(_ext, "ext", fake)
  mesh = make_mesh_1d(4)
  for attempt in ("create", "grow"):  # the second call finds the communicators made
    with pytest.raises(RuntimeError) as err:
      comm.ensure_communicators(mesh, "tp", workspace_bytes=3 << 30, comm_sms=8,
                                peer_to_peer=peer_to_peer)
    text = str(err.value)
    assert message in text, (attempt, text)
    assert "communication workspace (3072 MiB per GPU)" in text, (attempt, text)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in text and "PREALLOCATE=false" in text, text


def test_other_extension_errors_pass_unchanged(monkeypatch):
  from jax_flashoverlap import _ext, comm
  monkeypatch.setattr(_ext, "ext", _FailingExtension("NCCL error in ncclCommInitRankConfig: x"))
  with pytest.raises(RuntimeError) as err:
    comm.ensure_communicators(make_mesh_1d(4), "tp", workspace_bytes=1 << 20, comm_sms=8)
  assert str(err.value) == "NCCL error in ncclCommInitRankConfig: x"
