"""Plans of the peer-store transport (JAX_FLASHOVERLAP_TRANSPORT=peer; docs/DESIGN.md, "Peer
stores"): GEMM + all-reduce / reduce-scatter over the 2 to 8 GPUs of a mesh axis in this
process, or one GPU per process of one host (the all-reduce then staged: each rank's block
mirror-stored into the others' staging areas and copied out there; staged in one process too
where XLA's memory is not writable by the other GPUs: stages_mirrors), with no NCCL call. Each
GPU's GEMM (on every SM) computes the other ranks' blocks of rows first, then its own,
reducing along a ring as it stores each tile: from the second block on it adds the running
sum its next rank passed it, and it passes its sums of the other blocks on to its previous
rank's memory (xla_ffi/comm/peer_reduce.h; docs/DESIGN.md, "Ring
reduction"). Nothing of it has run on more than one GPU yet: pairs and larger groups are
checked on one GPU by emulation.

Its plan is the bands of one rank's block (M / world rows, for both collectives): the groups
the other ranks' counters count. Bands change little here (nothing is exposed but the last band's
stores): 2 per block, the faster of 2 and 8 on one GPU (benchmarks/results/logs/
peer_stores_h200x1). Whether an op can take this path is `unavailable`'s answer; ops it
cannot take keep the NCCL path (primitives.py warns once per reason).
"""

from __future__ import annotations

from jax_flashoverlap import comm, plan as plan_lib, tile_schedule

BANDS_PER_BLOCK = 2
# kMaxPeerRanks (xla_ffi/comm/peer_reduce_args.h): the ranks of one node.
MAX_WORLD = 8
# The communicator the peer stores hang on (its call mutex, ordering, watchdog, teardown) is
# still an NCCL one, never used for NCCL calls on this path: its nominal CTA cap.
NCCL_CTAS = 8
# Time over our GEMM alone of the peer-store sequence, the slowest of the DESIGN.md shapes, by
# group size, as emulated on one GPU (everything but NVLink): 2 from session 19 (the add ring;
# benchmarks/results/logs/peer_stores_h200x1), 4 and 8 from session 23 (the ring reduction of
# session 22, the all-reduce's mirrors by bulk copies, a step's word operations in one stream
# operation), the slowest of a rank that is every rank on all SMs (bench_groups, three runs) and
# of separate ranks at once on SMs / world (bench_ring; benchmarks/results/logs/
# peer_bulk_h200x1, calls 4 and 5; rounded up). The all-reduce's own block stores into every other
# rank in the GEMM's last 1 / world, so it grows with the group. Other sizes take the next
# measured size up. NVLink is not measured: an assumed store bandwidth per direction (H200
# NVLink 4: 450 GB/s peak) bounds the bytes each GPU sends.
SEQUENCE_OVER_GEMM = {"reduce_scatter": {2: 1.03, 4: 1.09, 8: 1.10},
                      "all_reduce": {2: 1.06, 4: 1.15, 8: 1.23}}
ASSUMED_LINK_BYTES_PER_S = 3.0e11
# A device-to-device cudaMemcpyAsync on one H200 with the SMs free, bytes copied per second (a
# 64 MB copy in 0.035 ms; docs/DESIGN.md, the all-reduce's copy-out): a staged all-reduce
# (ranks in processes of their own) copies the other ranks' blocks out after its GEMM.
STAGED_COPY_BYTES_PER_S = 1.9e12


class PeerStoresWarning(UserWarning):
  """JAX_FLASHOVERLAP_TRANSPORT=peer was set but an op keeps the NCCL path (the reason says
  why)."""


def problem_unavailable(collective: str, world: int, m: int) -> str | None:
  """Why a problem (whatever the mesh) cannot take the peer stores (None: it can)."""
  if collective not in ("all_reduce", "reduce_scatter"):
    return f"peer stores do {{all_reduce, reduce_scatter}}, not {collective}"
  if not 2 <= world <= MAX_WORLD:
    return f"the mesh axis has {world} devices; peer stores need 2 to {MAX_WORLD}"
  if m % world:
    return (f"x has M={m} rows; peer stores split them into {world} equal blocks (M a multiple "
            f"of {world})")
  return None


def unavailable(collective: str, mesh, axis_name, world: int, m: int) -> str | None:
  """Why an op cannot take the peer stores (None: it can). Every process of the mesh gets the
  same answer (a group spanning processes asks where each process runs, collectively)."""
  why = problem_unavailable(collective, world, m)
  if why is not None:
    return why
  if not comm.mesh_is_local_gpu(mesh):
    return None  # cross-lowering: nothing runs here, the target machine decides nothing else
  groups = comm.axis_groups(mesh, axis_name)
  if any(len({(d.process_index, d.local_hardware_id) for d in g}) < len(g) for g in groups):
    return "two ranks of an axis group are on one GPU"
  spanning = [g for g in groups if comm.group_spans_processes(g)]
  if not spanning:
    return None
  if not all(map(comm.one_device_per_process, spanning)):
    return ("an axis group spans processes with several of its GPUs in one process; peer "
            "stores across processes take one GPU per process")
  if len(spanning) < len(groups):  # their buffers are exchanged across processes, by group
    return ("some axis groups span processes and others are inside one; peer stores across "
            "processes take one GPU of every group per process")
  from jax_flashoverlap import distributed
  hosts = distributed.process_hosts({d.process_index for g in spanning for d in g})
  if any(len({hosts[d.process_index] for d in g}) > 1 for g in spanning):
    return ("an axis group spans hosts; peer stores need its GPUs in one machine (NVLink "
            "stores through CUDA IPC)")
  return None


def stages_mirrors(mesh, axis_name) -> bool:
  """Whether an all-reduce by peer stores over this axis of a local GPU mesh is staged (each
  rank's block mirrored into the others' staging areas, copied out there: recv_bytes, plan):
  where an axis group spans processes (the others' results are in their processes), or where
  XLA's memory is not writable by the other GPUs of a group (comm.peer_results_writable).
  False when cross-lowering (no GPU of this machine to ask)."""
  if not comm.mesh_is_local_gpu(mesh):
    return False
  groups = comm.axis_groups(mesh, axis_name)
  return any(map(comm.group_spans_processes, groups)) or not comm.peer_results_writable(groups)


def sequence_over_gemm(collective: str, world: int) -> float:
  """SEQUENCE_OVER_GEMM at the smallest measured group size >= world."""
  by_world = SEQUENCE_OVER_GEMM[collective]
  return by_world[min(w for w in by_world if w >= world)]


def plan(collective: str, m: int, n: int, k: int, itemsize: int = 2,
         transpose_w: bool = False, world: int = 2, staged: bool = False) -> plan_lib.GroupPlan:
  """The peer-store plan of x [m, k] @ w [k, n] (per device) over `world` GPUs:
  BANDS_PER_BLOCK bands of each block of m / world rows on the GEMM's cluster-row
  boundaries, comm_sms 0, and the predicted time (the GEMM on all SMs x SEQUENCE_OVER_GEMM,
  at least the bytes each GPU stores into the others over an assumed NVLink bandwidth; not
  calibrated on 2 GPUs). `staged` (an all-reduce over processes): plus copying the other
  ranks' blocks out of the staging area after the GEMM (STAGED_COPY_BYTES_PER_S)."""
  rows = m // world
  kern = tile_schedule.kernel_geometry(m, n, 0, transpose_w)
  bands = plan_lib.even_bands(rows, BANDS_PER_BLOCK, kern.rows_per_unit)
  unit_time = 2.0 * kern.block_m * kern.block_n * k / plan_lib.DEFAULT_PROFILE.sm_flops
  gemm = tile_schedule.gemm_waves(m, n, 0, k, 1, transpose_w) * unit_time
  # The other ranks' blocks, and for an all-reduce our reduced block once per other rank.
  link_bytes = (world - 1) * rows * n * itemsize * (2 if collective == "all_reduce" else 1)
  predicted = max(gemm * sequence_over_gemm(collective, world), link_bytes / ASSUMED_LINK_BYTES_PER_S)
  if staged and collective == "all_reduce":
    predicted += (world - 1) * rows * n * itemsize / STAGED_COPY_BYTES_PER_S
  result = plan_lib.GroupPlan(
      collective, rows, tuple(int(b) for b in bands), 0, overlap=True, predicted_s=predicted,
      baseline_s=plan_lib.baseline_time(collective, m, n, k, world, itemsize),
      transport="peer")
  result.validate(world)
  return result


def tuned(collective: str, m: int, n: int, k: int, gpu: str | None,
          dtype: str = "bfloat16", world: int = 2) -> plan_lib.GroupPlan | None:
  """The tuned config's plan for this problem at this world size when its entry says peer
  (jax_flashoverlap.tuning; `python -m jax_flashoverlap.tune --peer` writes them), else None."""
  from jax_flashoverlap import tuning
  entry = tuning.lookup(gpu, world, collective, dtype, m, n, k)
  if entry is None or entry.get("transport", "nccl") != "peer":
    return None
  return plan_lib.plan_from_entry(collective, m, world, entry)


def recv_bytes(m: int, n: int, itemsize: int, world: int = 2, staged: bool = False) -> int:
  """Each GPU's buffer for the running sums its next rank passes it along the ring: a block
  of m / world x n for every block but that rank's own, laid out by block (a group of 2: one
  block; of more: world blocks, one unused; xla_ffi/comm/peer_reduce_args.h, PeerRecvBlocks);
  `staged` (an all-reduce over processes): then the world - 1 other blocks of its staging area
  (PeerStageBlocks)."""
  blocks = (1 if world == 2 else world) + (world - 1 if staged else 0)
  return blocks * (m // world) * n * itemsize

