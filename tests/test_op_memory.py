"""Memory an op takes on a GPU (`comm.op_memory`: workspace, counters, the GEMM's tile queue,
peer-store receive buffers), and the Python constants that mirror the C++ headers' layouts
(the signal words, the tile queue), so that a change on one side fails here first.
(From tests/test_info.py, which had passed 600 lines.)"""
import pytest


def test_op_memory_reports_workspace_and_counters(monkeypatch):
  from jax_flashoverlap import comm
  import jax.numpy as jnp
  monkeypatch.delenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", raising=False)
  ar = comm.op_memory("matmul_all_reduce", (8192, 4096), (4096, 8192), jnp.bfloat16, 2)
  q = comm.GEMM_QUEUE_BYTES  # the GEMM's tile queue (kGemmQueueBytes; checked below)
  assert 16 << 20 < q < 17 << 20
  assert ar == {"workspace_bytes": 8192 * 8192 * 2, "counter_bytes": 256, "queue_bytes": q,
                "peer_recv_bytes": 0}
  monkeypatch.setenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", "output")  # in place: counters only
  ar = comm.op_memory("matmul_all_reduce", (8192, 4096), (4096, 8192), jnp.bfloat16, 2)
  assert ar == {"workspace_bytes": 0, "counter_bytes": 256, "queue_bytes": q, "peer_recv_bytes": 0}
  monkeypatch.delenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER")
  rs = comm.op_memory("matmul_reduce_scatter", (4, 2048, 4096), (4096, 1024), jnp.float16, 2)
  assert rs["workspace_bytes"] == 4 * 2048 * 1024 * 2
  ag = comm.op_memory("all_gather_matmul", (1024, 4096), (4096, 512), jnp.bfloat16, 4)
  assert ag["workspace_bytes"] == 4 * 1024 * 4096 * 2
  with pytest.raises(ValueError, match="op must be one of"):
    comm.op_memory("psum", (8, 8), (8, 8), jnp.bfloat16, 2)
  assert isinstance(comm.list_communicators(), list)


def test_op_memory_transpose_w_and_concat_axis():
  """op_memory mirrors the handlers' workspace checks: an [N, K] weight (transpose_w) makes an
  M x N product, not M x K, and matmul_all_to_all with concat_axis=1 stages what it receives in
  a second half (gemm_all_to_all.cc: 2 x M x N elements). Before, both were under-reported
  (the transposed reduce-scatter by N/K, the concat-1 all-to-all by half)."""
  from jax_flashoverlap import comm
  import jax.numpy as jnp
  m, k, n = 4096, 1024, 8192
  rs = comm.op_memory("matmul_reduce_scatter", (m, k), (n, k), jnp.bfloat16, 2, transpose_w=True)
  assert rs["workspace_bytes"] == m * n * 2
  a2a = comm.op_memory("matmul_all_to_all", (m, k), (k, n), jnp.bfloat16, 2, concat_axis=1)
  assert a2a["workspace_bytes"] == 2 * m * n * 2
  a2a = comm.op_memory("matmul_all_to_all", (m, k), (n, k), jnp.bfloat16, 2, transpose_w=True)
  assert a2a["workspace_bytes"] == m * n * 2
  ag = comm.op_memory("all_gather_matmul", (m, k), (n, k), jnp.bfloat16, 2, transpose_w=True)
  assert ag["workspace_bytes"] == 2 * m * k * 2  # the gathered x: K either way
  with pytest.raises(ValueError, match="concat_axis must be 0 or 1"):
    comm.op_memory("matmul_all_to_all", (m, k), (k, n), jnp.bfloat16, 2, concat_axis=2)


def test_op_memory_peer_transport():
  """With transport='peer' the op keeps no workspace but a buffer for the running sums its
  next rank passes it (M / world x N for 2 ranks, M x N for more: one block per block) and the group's signal words; problems the
  peer stores cannot take are refused naming why, as the lowering would keep the NCCL path
  for them."""
  from jax_flashoverlap import comm
  import jax.numpy as jnp
  q = comm.GEMM_QUEUE_BYTES
  for op in ("matmul_all_reduce", "matmul_reduce_scatter"):
    got = comm.op_memory(op, (2, 4096, 1024), (1024, 8192), jnp.bfloat16, 2, transport="peer")
    assert got == {"workspace_bytes": 0, "counter_bytes": 256 + 452, "queue_bytes": q,
                   "peer_recv_bytes": 4096 * 8192 * 2}, (op, got)
    got = comm.op_memory(op, (2, 4096, 1024), (1024, 8192), jnp.bfloat16, 8, transport="peer")
    assert got["peer_recv_bytes"] == 8 * 1024 * 8192 * 2, (op, got)
  got = comm.op_memory("matmul_reduce_scatter", (1000, 512), (2048, 512), jnp.float16, 2,
                       transpose_w=True, transport="peer")
  assert got["peer_recv_bytes"] == 8 << 20  # 500 x 2048 x 2 bytes, allocated in 8 MiB steps
  with pytest.raises(ValueError, match="peer stores need 2 to 8"):
    comm.op_memory("matmul_all_reduce", (64, 64), (64, 64), jnp.bfloat16, 16, transport="peer")
  with pytest.raises(ValueError, match="M=66 rows.*multiple of 4"):
    comm.op_memory("matmul_all_reduce", (66, 64), (64, 64), jnp.bfloat16, 4, transport="peer")
  with pytest.raises(ValueError, match="M=63 rows"):
    comm.op_memory("matmul_reduce_scatter", (63, 64), (64, 64), jnp.bfloat16, 2, transport="peer")
  with pytest.raises(ValueError, match="not all_gather_matmul"):
    comm.op_memory("all_gather_matmul", (64, 64), (64, 64), jnp.bfloat16, 2, transport="peer")
  with pytest.raises(ValueError, match="transport must be 'nccl' or 'peer', got 'auto'"):
    comm.op_memory("matmul_all_reduce", (64, 64), (64, 64), jnp.bfloat16, 2, transport="auto")


def test_op_memory_of_no_rows_is_nothing():
  """x with no rows (an empty batch of a serving step) returns XLA's empty result before
  anything is lowered (ops.py, has_no_rows): no communicator, so no workspace, counters or
  tile queue. op_memory reported the ~16.6 MiB queue for every op, and 8 MiB more for the
  point-to-point ones' handshake (all-to-all, all-gather), whatever the transport."""
  from jax_flashoverlap import comm
  import jax.numpy as jnp
  none = {"workspace_bytes": 0, "counter_bytes": 0, "queue_bytes": 0, "peer_recv_bytes": 0}
  for op in ("matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_to_all",
             "all_gather_matmul"):
    for x_shape in ((0, 64), (4, 0, 64)):
      assert comm.op_memory(op, x_shape, (64, 128), jnp.bfloat16, 4) == none, (op, x_shape)
  for op in ("matmul_all_reduce", "matmul_reduce_scatter"):
    assert comm.op_memory(op, (0, 64), (64, 128), jnp.bfloat16, 4, transport="peer") == none
  # arguments are still checked
  with pytest.raises(ValueError, match="op must be one of"):
    comm.op_memory("psum", (0, 64), (64, 128), jnp.bfloat16, 4)
  with pytest.raises(ValueError, match="transport must be 'nccl' or 'peer'"):
    comm.op_memory("matmul_all_reduce", (0, 64), (64, 128), jnp.bfloat16, 4, transport="x")


def test_peer_signal_bytes_match_the_header():
  """comm.PEER_SIGNAL_BYTES mirrors kPeerSignalWords (xla_ffi/comm/peer_reduce_args.h)."""
  import pathlib
  import re
  from jax_flashoverlap import comm
  root = pathlib.Path(__file__).parent.parent
  args = (root / "xla_ffi/comm/peer_reduce_args.h").read_text()
  gemm = (root / "xla_ffi/kernels/signaling_gemm.h").read_text()
  max_groups = int(re.search(r"\bkMaxGroups = (\d+);", gemm).group(1))
  max_sources = int(re.search(r"\bkMaxAddSources = (\d+);", gemm).group(1))
  # The layout's words in order: arrived counters, then per rank slot a credit, a done word
  # and a mailbox of kPeerMailboxWords, then the failed word.
  for line in ("constexpr int kPeerArrivedWords = kMaxGroups;",
               "constexpr int kMaxPeerRanks = kMaxAddSources + 1;",
               "constexpr int kPeerCredit = kPeerArrived + kPeerArrivedWords;",
               "constexpr int kPeerDone = kPeerCredit + kMaxPeerRanks;",
               "constexpr int kPeerMailbox = kPeerDone + kMaxPeerRanks;",
               "constexpr int kPeerMailboxWords = 4;",
               "constexpr int kPeerFailed = kPeerMailbox + kPeerMailboxWords * kMaxPeerRanks;",
               "constexpr int kPeerSignalWords = kPeerFailed + 1;"):
    assert line in args, line
  ranks = max_sources + 1
  assert comm.PEER_SIGNAL_BYTES == (max_groups + ranks + ranks + 4 * ranks + 1) * 4
  assert comm.COUNTER_BYTES == max_groups * 4


def test_queue_bytes_match_the_kernel_header():
  """comm.GEMM_QUEUE_BYTES mirrors kGemmQueueBytes (xla_ffi/kernels/signaling_gemm.h)."""
  import pathlib
  import re
  from jax_flashoverlap import comm
  header = (pathlib.Path(__file__).parent.parent / "xla_ffi/kernels/signaling_gemm.h").read_text()
  def const(name):
    return int(re.search(rf"\b{name} = (\d+);", header).group(1))
  slots, clusters, flags = const("kQueueRingSlots"), const("kQueueMaxClusters"), const("kSplitMaxFlags")
  # The layout's formulas as the header spells them; then the same arithmetic here.
  for line in ("kQueueFlagsOffset = 16;",
               "kQueueRingOffset = kQueueFlagsOffset + size_t(kSplitMaxFlags) * 4;",
               "(kQueueRingOffset + size_t(kQueueMaxClusters) * kQueueRingSlots * 8 + 255) / 256 * 256;",
               "kSplitPartialBytes = size_t(66) * 2 * 128 * 256 * 4;",
               "kGemmQueueBytes = kQueuePartialsOffset + kSplitPartialBytes;"):
    assert line in header, line
  ring_offset = 16 + flags * 4
  partials_offset = (ring_offset + clusters * slots * 8 + 255) // 256 * 256
  assert comm.GEMM_QUEUE_BYTES == partials_offset + 66 * 2 * 128 * 256 * 4


def test_op_memory_reports_what_is_allocated():
  """The workspace and the peer-store buffer are allocated in 8 MiB steps (RoundGrowth), which
  list_communicators() shows. Before, op_memory reported the bytes asked for: 64.002 MiB where
  72 MiB are allocated at M = 4097 x N = 8192, 1.95 MiB where 8 MiB are at 1000 x 1024."""
  from jax_flashoverlap import comm
  import jax.numpy as jnp
  mib = 1 << 20
  odd = comm.op_memory("matmul_reduce_scatter", (4097, 4096), (4096, 8192), jnp.bfloat16, 2)
  assert odd["workspace_bytes"] == 72 * mib  # 4097 x 8192 x 2 = 64.002 MiB
  for op in ("matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_to_all"):
    small = comm.op_memory(op, (1000, 512), (512, 1024), jnp.bfloat16, 4)
    assert small["workspace_bytes"] == 8 * mib, (op, small)  # 1000 x 1024 x 2 = 1.95 MiB
  for world in (2, 4, 8):
    peer = comm.op_memory("matmul_reduce_scatter", (1000 // 8 * 8, 512), (512, 1024),
                          jnp.bfloat16, world, transport="peer")
    assert peer["peer_recv_bytes"] == 8 * mib, (world, peer)
  assert comm.allocated_bytes(0) == 0 and comm.allocated_bytes(1) == 8 * mib
  assert comm.allocated_bytes(8 * mib) == 8 * mib and comm.allocated_bytes(8 * mib + 1) == 16 * mib


def test_op_memory_all_gather_returning_the_gathered_rows():
  """all_gather_matmul(return_gathered=True) on the point-to-point gather (the default plans)
  receives the rows into that second result: the lowering asks for no workspace, only the
  connection handshake (2 x 4 x world bytes, allocated as 8 MiB); the collective gather still
  gathers into its window. Before, op_memory had no such keyword and reported world x M x K
  for every all-gather."""
  from jax_flashoverlap import comm
  import jax.numpy as jnp
  rows, k, n = 4096, 8192, 4096
  full = 4 * rows * k * 2
  assert comm.op_memory("all_gather_matmul", (rows, k), (k, n), jnp.bfloat16, 4)[
      "workspace_bytes"] == full
  got = comm.op_memory("all_gather_matmul", (rows, k), (k, n), jnp.bfloat16, 4,
                       return_gathered=True)
  assert got["workspace_bytes"] == 8 << 20, got
  got = comm.op_memory("all_gather_matmul", (rows, k), (k, n), jnp.bfloat16, 4,
                       return_gathered=True, gather="collective")
  assert got["workspace_bytes"] == full, got
  with pytest.raises(ValueError, match="gather must be 'p2p' or 'collective'"):
    comm.op_memory("all_gather_matmul", (rows, k), (k, n), jnp.bfloat16, 4, gather="ring")


def test_growth_step_matches_the_header():
  """comm.GROWTH_STEP_BYTES mirrors RoundGrowth's kStep (xla_ffi/comm/communicator.h), which
  both the workspace (communicator.cc) and the peer-store buffers (peer_stores.cc) go through."""
  import pathlib
  import re
  from jax_flashoverlap import comm
  root = pathlib.Path(__file__).parent.parent
  header = (root / "xla_ffi/comm/communicator.h").read_text()
  step = re.search(r"kStep = size_t\{(\d+)\} << (\d+);", header)
  assert step and int(step.group(1)) << int(step.group(2)) == comm.GROWTH_STEP_BYTES
  assert "return (bytes + kStep - 1) / kStep * kStep;" in header
  allocs = (root / "xla_ffi/comm/communicator.cc").read_text()
  assert allocs.count("AllocateWorkspaces(members, RoundGrowth(workspace_bytes))") == 1
  assert allocs.count("AllocateWorkspaces(comms, RoundGrowth(bytes))") == 1
  stores = (root / "xla_ffi/comm/peer_stores.cc").read_text()
  assert "GrowGroup(members, RoundGrowth(recv_bytes > 0 ? recv_bytes : 1)" in stores


def test_in_place_all_reduce_docs_name_the_tile_queue(monkeypatch):
  """With JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output op_memory reports no workspace but the
  communicator's ~16.6 MiB tile queue, which every call uses; the README, docs/overlap.md and
  the docstrings said "only the (group) counters", an under-statement by 16.6 MiB per
  communicator. Every such statement now names the queue within the same sentence."""
  import pathlib
  import re
  from jax_flashoverlap import _ext, comm
  import jax.numpy as jnp
  monkeypatch.setenv("JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER", "output")
  got = comm.op_memory("matmul_all_reduce", (8192, 4096), (4096, 8192), jnp.bfloat16, 2)
  assert got["workspace_bytes"] == 0 and got["queue_bytes"] > 16 << 20
  root = pathlib.Path(__file__).parent.parent
  texts = {name: (root / name).read_text() for name in ("README.md", "docs/overlap.md")}
  texts.update({"_ext.all_reduce_in_place": _ext.all_reduce_in_place.__doc__,
                "comm.op_memory": comm.op_memory.__doc__})
  found = 0
  for name, text in texts.items():
    flat = " ".join(text.split())
    for hit in re.finditer(r"only the (group )?counters", flat):
      found += 1
      sentence = flat[hit.start():hit.start() + 160].split(". ")[0]
      assert "queue" in sentence, (name, sentence)
  assert found >= 4, found
