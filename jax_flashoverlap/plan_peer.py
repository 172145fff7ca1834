"""Plans of the peer-store transport (JAX_FLASHOVERLAP_TRANSPORT=peer; docs/DESIGN.md, "Peer
stores"): GEMM + all-reduce / reduce-scatter over the 2 GPUs of a mesh axis in this process,
with no NCCL call. Each GPU's GEMM (on every SM) computes the peer's block of rows first and
stores it into the peer's memory, then its own block, adding the peer's partial sums as each
tile is stored (xla_ffi/comm/peer_reduce.h).

Its plan is the bands of one rank's block (M / 2 rows, for both collectives): the groups the
peer's counters count. Bands change little here (nothing is exposed but the last band's
stores): 2 per block, the faster of 2 and 8 on one GPU (benchmarks/results/logs/
peer_stores_h200x1). Whether an op can take this path is `unavailable`'s answer; ops it
cannot take keep the NCCL path (primitives.py warns once per reason).
"""

from __future__ import annotations

from jax_flashoverlap import comm, plan as plan_lib

BANDS_PER_BLOCK = 2
# The communicator the peer stores hang on (its call mutex, ordering, watchdog, teardown) is
# still an NCCL one, never used for NCCL calls on this path: its nominal CTA cap.
NCCL_CTAS = 8
# Time over our GEMM alone on all SMs of the peer-store sequence with a rank as its own peer
# on one H200 (everything but NVLink), the slowest of the DESIGN.md shapes (session 19, the
# add ring; benchmarks/results/logs/peer_stores_h200x1). NVLink is not measured: an assumed
# store bandwidth per direction (H200 NVLink 4: 450 GB/s peak) bounds the peer's block.
SEQUENCE_OVER_GEMM = {"reduce_scatter": 1.03, "all_reduce": 1.06}
ASSUMED_LINK_BYTES_PER_S = 3.0e11


class PeerStoresWarning(UserWarning):
  """JAX_FLASHOVERLAP_TRANSPORT=peer was set but an op keeps the NCCL path (the reason says
  why)."""


def problem_unavailable(collective: str, world: int, m: int) -> str | None:
  """Why a problem (whatever the mesh) cannot take the peer stores (None: it can)."""
  if collective not in ("all_reduce", "reduce_scatter"):
    return f"peer stores do {{all_reduce, reduce_scatter}}, not {collective}"
  if world != 2:
    return f"the mesh axis has {world} devices; peer stores need exactly 2"
  if m % 2:
    return f"x has M={m} rows; peer stores split them into 2 equal blocks (M even)"
  return None


def unavailable(collective: str, mesh, axis_name, world: int, m: int) -> str | None:
  """Why an op cannot take the peer stores (None: it can)."""
  why = problem_unavailable(collective, world, m)
  if why is not None:
    return why
  if not comm.mesh_is_local_gpu(mesh):
    return None  # cross-lowering: nothing runs here, the target machine decides nothing else
  groups = comm.axis_groups(mesh, axis_name)
  if any(len({d.process_index for d in g}) > 1 for g in groups):
    return ("an axis group spans processes; peer stores need both GPUs of each group in one "
            "process")
  if any(g[0].local_hardware_id == g[1].local_hardware_id for g in groups):
    return "both ranks of an axis group are on one GPU"
  return None


def plan(collective: str, m: int, n: int, k: int, itemsize: int = 2,
         transpose_w: bool = False) -> plan_lib.GroupPlan:
  """The peer-store plan of x [m, k] @ w [k, n] (per device) over 2 GPUs: BANDS_PER_BLOCK
  bands of each block of m / 2 rows on the GEMM's cluster-row boundaries, comm_sms 0, and
  the predicted time (the GEMM on all SMs x SEQUENCE_OVER_GEMM, at least the peer's block
  over an assumed NVLink bandwidth; not calibrated on 2 GPUs)."""
  rows = m // 2
  kern = plan_lib.kernel_geometry(m, n, 0, transpose_w)
  bands = plan_lib.even_bands(rows, BANDS_PER_BLOCK, kern.rows_per_unit)
  unit_time = 2.0 * kern.block_m * kern.block_n * k / plan_lib.DEFAULT_PROFILE.sm_flops
  gemm = plan_lib.gemm_waves(m, n, 0, k, 1, transpose_w) * unit_time
  link_bytes = rows * n * itemsize * (2 if collective == "all_reduce" else 1)
  predicted = max(gemm * SEQUENCE_OVER_GEMM[collective], link_bytes / ASSUMED_LINK_BYTES_PER_S)
  result = plan_lib.GroupPlan(
      collective, rows, tuple(int(b) for b in bands), 0, overlap=True, predicted_s=predicted,
      baseline_s=plan_lib.baseline_time(collective, m, n, k, 2, itemsize),
      transport="peer")
  result.validate()
  return result


def tuned(collective: str, m: int, n: int, k: int, gpu: str | None,
          dtype: str = "bfloat16") -> plan_lib.GroupPlan | None:
  """The tuned config's plan for this problem at world size 2 when its entry says peer
  (jax_flashoverlap.tuning; `python -m jax_flashoverlap.tune --peer` writes them), else None."""
  from jax_flashoverlap import tuning
  entry = tuning.lookup(gpu, 2, collective, dtype, m, n, k)
  if entry is None or entry.get("transport", "nccl") != "peer":
    return None
  return plan_lib.plan_from_entry(collective, m, 2, entry)


def recv_bytes(m: int, n: int, itemsize: int) -> int:
  """Each GPU's buffer for the peer's partial sums of its rows (xla_ffi/comm/peer_stores.h)."""
  return (m // 2) * n * itemsize

