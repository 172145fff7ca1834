"""Communicator identity: which NCCL communicator a custom call uses.

One communicator exists per (mesh, collective axes, group of devices along those axes, device).
A custom call carries only `comm_id`, the same on every device of the SPMD program; the FFI
handler looks up (comm_id, its device ordinal) -> that device's communicator in its group
(DESIGN.md, "Communicators"). `comm_id` is a stable hash, so every process computes the same
one without talking to the others.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import hashlib
import sys
import threading

import numpy as np

from jax_flashoverlap import _compat


def normalize_axes(axis_name) -> tuple:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


CTA_POLICIES = {"default": 0, "efficiency": 1, "zero": 2}  # ncclConfig_t.CTAPolicy values


def cta_policy_code(name: str) -> int:
  if name not in CTA_POLICIES:
    raise ValueError(f"cta_policy must be one of {sorted(CTA_POLICIES)}, got {name!r}")
  return CTA_POLICIES[name]


def comm_id_for(mesh, axis_name, comm_sms: int = 0, peer_to_peer: bool = False,
                cta_policy: str = "default") -> int:
  """Stable non-zero 63-bit id of the communicators of `axis_name` over `mesh` whose NCCL
  kernels are capped to `comm_sms` CTAs under `cta_policy` (both fixed when a communicator
  is created). Point-to-point ops (ncclSend/ncclRecv) get communicators of their own: their
  workspace is not registered with NCCL, the collectives' is (xla_ffi/comm/communicator.h)."""
  axes = normalize_axes(axis_name)
  devices = _compat.mesh_devices(mesh)
  extra = (("p2p",) if peer_to_peer else ()) + (
      (("policy", cta_policy_code(cta_policy)),) if cta_policy != "default" else ())
  if devices is None:  # no devices known: names and sizes only (never run as is)
    shape = tuple(mesh.shape.items()) if mesh is not None else ()
    key = repr(("abstract", shape, axes, int(comm_sms)) + extra)
  else:
    ids = [int(d.id) for d in devices.flat]
    key = repr((tuple(mesh.axis_names), tuple(devices.shape), ids, axes, int(comm_sms))
               + extra)
  digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
  return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1


def axis_groups(mesh, axis_name) -> list:
  """Device groups that communicate: for each index of the other mesh axes, the devices
  along `axis_name` in rank order (rank = position along the collective axes, row-major)."""
  axes = normalize_axes(axis_name)
  names = list(mesh.axis_names)
  for a in axes:
    if a not in names:
      raise ValueError(f"axis {a!r} is not an axis of the mesh {tuple(names)}")
  devices = np.asarray(mesh.devices)
  order = [names.index(a) for a in names if a not in axes] + [names.index(a) for a in axes]
  moved = np.transpose(devices, order)
  group_size = int(np.prod([devices.shape[names.index(a)] for a in axes]))
  return [list(row) for row in moved.reshape(-1, group_size)]


# --- communicator creation (CUDA extension) ------------------------------------------------

_lock = threading.Lock()
_atexit_registered = False
# Barrier and key names of a comm_id: its processes lower in the same order, so the n-th
# growth of a comm_id and its n-th creation (again after destroy_communicators) have the same
# number on each; a key is never written twice (the KV store refuses it) nor read stale.
_ensure_counts = collections.Counter()
_creations = collections.Counter()


def group_spans_processes(group) -> bool:
  """Whether an axis group's devices (axis_groups) belong to more than one process."""
  return len({d.process_index for d in group}) > 1


def one_device_per_process(group) -> bool:
  """Whether no two of an axis group's devices belong to one process."""
  return len({d.process_index for d in group}) == len(group)


def mesh_is_local_gpu(mesh) -> bool:
  """True when the mesh's devices are GPUs (this lowering is for this machine)."""
  devices = _compat.mesh_devices(mesh)
  if devices is None:
    return False
  first = devices.flat[0]
  return getattr(first, "platform", "") in ("gpu", "cuda")


def mesh_gpu_name(mesh) -> str | None:
  """device_kind of the mesh's GPUs (e.g. 'NVIDIA H200'): the key of tuned configs."""
  if not mesh_is_local_gpu(mesh):
    return None
  return str(getattr(_compat.mesh_devices(mesh).flat[0], "device_kind", "")) or None


WATCHDOG_ENV = "JAX_FLASHOVERLAP_WATCHDOG_S"


def watchdog_seconds() -> float:
  """JAX_FLASHOVERLAP_WATCHDOG_S: seconds after which a hung overlapped call is aborted with
  an error (xla_ffi/comm/watchdog.h); unset, any number equal to 0 ("0.0") or an off word
  of _ext.env_switch (0 / false / no / off): off. Read when communicators are made."""
  from jax_flashoverlap import _ext
  raw = os.environ.get(WATCHDOG_ENV, "").strip()
  if raw.lower() in ("",) + _ext.OFF_WORDS:
    return 0.0
  try:
    value = float(raw)
  except ValueError:
    value = float("nan")
  if value == 0:
    return 0.0
  if not value > 0 or value == float("inf"):
    raise ValueError(f"{WATCHDOG_ENV} must be a number of seconds > 0 (or 0 / false / no / "
                     f"off / unset: off), got {raw!r}")
  return value


FAULT_KINDS = ("none", "nccl", "cuda")


def inject_faults(kind: str, calls: int = 1) -> None:
  """For testing the error path only: the next `calls` overlapped calls on every GPU of this
  process fail at their first communication step with an injected NCCL ("nccl") or CUDA
  ("cuda") error, raised by JAX as an exception naming the op and the error; kind "none" (or
  calls=0) disarms. Every rank fails alike, so no peer is left waiting, and the calls after
  them run normally (xla_ffi/comm/fault_injection.h). Several processes: call it in each."""
  if kind not in FAULT_KINDS:
    raise ValueError(f"inject_faults: kind must be one of {FAULT_KINDS}, got {kind!r}")
  if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
    raise ValueError(f"inject_faults: calls must be an int >= 0, got {calls!r}")
  from jax_flashoverlap import _ext
  if _ext.ext is None:
    raise RuntimeError("jax_flashoverlap.comm.inject_faults: the CUDA extension is not built "
                       "(faults are injected into the CUDA path only)")
  _ext.ext.set_fault_injection(kind, calls)


def ensure_communicators(mesh, axis_name, *, workspace_bytes: int, comm_sms: int,
                         peer_to_peer: bool = False, cta_policy: str = "default",
                         peer_store_bytes: int = 0) -> int:
  """Creates (once) this process's NCCL communicators for `axis_name` over `mesh`, each with
  a registered workspace of at least `workspace_bytes`; returns their comm_id.

  Called on the host when an op is lowered, i.e. before any handler can run: never lazily
  inside an execute handler (DESIGN.md). Single process: every group's local ranks are
  initialized together. peer_to_peer=True (ops using ncclSend/ncclRecv) also sets up NCCL's
  point-to-point connections now, once per communicator (every process must ask for it).
  peer_store_bytes > 0 (JAX_FLASHOVERLAP_TRANSPORT=peer): each group's 2 to 8 local ranks also
  get peer-store buffers of at least that many bytes, peer access enabled between every two
  (xla_ffi/comm/peer_stores.h); a group spanning processes (one GPU per process, one host)
  gets each process's buffer, and every process opens the others' (CUDA IPC handles through
  JAX's key-value store, after every lowering that asks: collective, like the growth).
  """
  from jax_flashoverlap import _ext
  ext = _ext.ext
  if ext is None:
    raise RuntimeError("jax_flashoverlap: the CUDA extension is not built")
  from jax_flashoverlap import trace
  trace.apply_env()  # FLASHOVERLAP_TRACE: on before the first call can run
  cid = comm_id_for(mesh, axis_name, comm_sms, peer_to_peer, cta_policy)
  watchdog = watchdog_seconds()
  groups = axis_groups(mesh, axis_name)
  if peer_to_peer:  # the peer connection's handshake (ConnectPeers) uses the workspace too
    workspace_bytes = max(int(workspace_bytes), peer_handshake_bytes(len(groups[0])))
  spans_processes = any(map(group_spans_processes, groups))
  # The processes lowering this program: the mesh's (a pipeline stage's mesh may hold a few).
  processes = sorted({d.process_index for g in groups for d in g})
  if peer_store_bytes and spans_processes and not all(map(one_device_per_process, groups)):
    raise ValueError("jax_flashoverlap: peer stores across processes need one GPU of each axis "
                     "group per process (plan_peer.unavailable)")
  # Asked before _lock (it runs a small XLA program per GPU); the answer is cached.
  grant = bool(peer_store_bytes) and _ext.grant_peer_access()
  stage_mirrors = bool(peer_store_bytes) and not peer_results_writable(groups, grant=grant)
  with _lock:
    cid = _ensure_locked(ext, cid, groups, processes, spans_processes, workspace_bytes,
                         comm_sms, watchdog, peer_to_peer, cta_policy)
    if peer_store_bytes and spans_processes:
      _grow_and_connect_peer_stores(ext, cid, groups, processes, int(peer_store_bytes),
                                    stage_mirrors)
    elif peer_store_bytes:
      ext.ensure_peer_stores(cid, int(peer_store_bytes), stage_mirrors=stage_mirrors,
                             grant_results=grant)
  return cid


_results_writable = {}  # (grant, the groups' device ids) -> peer_results_writable's answer


def peer_results_writable(groups, *, grant: bool = False) -> bool:
  """Whether, in each axis group whose GPUs are all in this process, every GPU may write the
  others' XLA buffers: the peer-store all-reduce mirrors each rank's reduced block straight
  into the other ranks' results. CUDA leaves that to the allocator (legacy memory: peer access;
  a memory pool or a virtual-memory mapping: its own access list, which XLA's allocator sets or
  not by version and settings; xla_ffi/comm/peer_access.h), so the driver is asked about a
  small buffer XLA allocates on each GPU, once per set of groups. grant=True
  (JAX_FLASHOVERLAP_GRANT_PEER_ACCESS): a GPU left out is given access to that buffer's
  allocation, then asked again; a grant the driver refuses counts as not writable, with a
  PeerStoresWarning saying why. False: such a group's all-reduce mirrors into the others'
  staging areas (our buffers) and each copies them out.
  Groups spanning processes are not asked (they always stage), nor other processes' groups;
  without a group of this process's GPUs, True."""
  import jax

  from jax_flashoverlap import _ext
  me = jax.process_index()
  local = [g for g in groups if len(g) > 1 and all(d.process_index == me for d in g)]
  if local and _ext.ext is None:
    raise RuntimeError("jax_flashoverlap.comm.peer_results_writable: the CUDA extension is "
                       "not built (only GPUs' memory can be asked)")
  key = (bool(grant), tuple(tuple(int(d.id) for d in g) for g in local))
  if key not in _results_writable:
    import numpy as np
    writable = True
    with jax.transfer_guard("allow"):  # the probe's few bytes, whatever the caller's guard
      for group in local:
        for device in group:
          probe = jax.device_put(np.zeros(256, np.float32), device)
          probe.block_until_ready()
          ptr = probe.unsafe_buffer_pointer()
          for other in group:
            if other.id != device.id:
              peer = int(other.local_hardware_id)
              ok, kind = _ext.ext.peer_may_write(ptr, peer)
              if not ok and grant:
                ok = _grant_peer_write(_ext.ext, ptr, device, peer, kind)
              writable = writable and bool(ok)
    _results_writable[key] = writable
  return _results_writable[key]


def _grant_peer_write(ext, ptr, device, peer: int, kind: str) -> bool:
  """Gives GPU `peer` access to the allocation of `device`'s XLA buffer at `ptr`; whether it
  may write it then (a refusal is a PeerStoresWarning: the group stages)."""
  import warnings

  from jax_flashoverlap import _ext, plan_peer
  try:
    ext.grant_peers_write(ptr, [peer])
    ok, _ = ext.peer_may_write(ptr, peer)
  except RuntimeError as e:
    reason = str(e)
  else:
    if ok:
      return True
    reason = "the driver accepted the grant, yet the GPU still may not write it"
  warnings.warn(f"jax_flashoverlap: {_ext.GRANT_PEER_ACCESS_ENV} is on, but GPU {peer} could not be given "
                f"access to XLA's {kind} memory on {device} ({reason}); the all-reduce stages "
                "its mirrors instead", plan_peer.PeerStoresWarning, stacklevel=3)
  return False


_peer_exchanges = collections.Counter()


def _grow_and_connect_peer_stores(ext, cid, groups, processes, recv_bytes,
                                  stage_mirrors=False) -> None:
  """Groups spanning processes: every process closes its mappings of buffers about to be
  replaced, then (a barrier: CUDA leaves freeing an exported buffer before its importers close
  it undefined) grows its own; then its peer-store records (CUDA IPC handles of each member's
  buffers, xla_ffi/comm/peer_ipc.h) go to the other processes through JAX's key-value store
  and each member opens its group's. Every process of the mesh comes here in the same order (it
  lowers the same programs), so the n-th exchange of one meets the n-th of the others.
  Each step fails on every process if it failed on one (distributed.all_succeed): none waits
  for another that stopped."""
  import jax
  from jax_flashoverlap import distributed
  _peer_exchanges[cid] += 1
  round_key = f"peer/{cid}/{_creations[cid]}/{_peer_exchanges[cid]}"
  what = f"peer stores across processes (comm_id {cid})"
  distributed.all_succeed(f"{round_key}/released", lambda: ext.release_peer_stores(cid, recv_bytes),
                          processes, what + ", closing the others' buffers")
  def grow_and_export():
    ext.ensure_peer_stores(cid, recv_bytes, stage_mirrors=stage_mirrors)
    return ext.export_peer_stores(cid)
  records = distributed.all_succeed(f"{round_key}/grown", grow_and_export, processes,
                                    what + ", allocating")
  me = jax.process_index()
  group_of = {}  # this process's device ordinal -> its group's index
  for index, group in enumerate(groups):
    for d in group:
      if d.process_index == me:
        group_of[int(d.local_hardware_id)] = index
  for device, rank, record in records:  # ours first: nobody waits on us
    distributed.publish(f"{round_key}/{group_of[device]}/{rank}", bytes(record).hex())
  by_device = {
      device: [bytes.fromhex(distributed.fetch(f"{round_key}/{index}/{rank}", d.process_index))
               for rank, d in enumerate(groups[index])]
      for device, index in group_of.items()}
  distributed.all_succeed(f"{round_key}/opened", lambda: ext.import_peer_stores(cid, by_device),
                          processes, what + ", opening the others' buffers")


def _ensure_locked(ext, cid, groups, processes, spans_processes, workspace_bytes, comm_sms,
                   watchdog, peer_to_peer, cta_policy) -> int:
  """ensure_communicators' creation or growth, under _lock."""
  import jax

  if spans_processes:
    from jax_flashoverlap import distributed
  if ext.has_communicators(cid):
    if spans_processes:  # growing the window and connecting peers are collective too
      _ensure_counts[cid] += 1
      distributed.barrier(f"ensure/{cid}/{_ensure_counts[cid]}", processes)
    with _workspace_hint(workspace_bytes):
      ext.ensure_workspace(cid, int(workspace_bytes))
    if peer_to_peer:
      ext.connect_peers(cid)
    return cid
  me = jax.process_index()
  _creations[cid] += 1
  generation = _creations[cid]
  _register_atexit()  # before creating: the communicators made are destroyed at exit
  if spans_processes:
    # Every process must reach NCCL's init (which blocks until all ranks join): one that
    # never comes is a timeout error here (JAX_FLASHOVERLAP_KV_TIMEOUT_S), not a hang.
    distributed.barrier(f"preinit/{cid}/{generation}", processes)

  def create(index, group):
    local = [(rank, int(d.local_hardware_id)) for rank, d in enumerate(group)
             if d.process_index == me]
    if not local:
      return
    if len(local) == len(group):
      unique_id = ext.nccl_unique_id()
    else:  # rank 0's process makes the id; it reaches the others through JAX's KV store
      unique_id = bytes.fromhex(distributed.share(
          f"uid/{cid}/{generation}/{index}", owner_process=group[0].process_index,
          make=lambda: ext.nccl_unique_id().hex()))
    with _workspace_hint(workspace_bytes):
      ext.create_communicators(cid, unique_id, len(group), local, int(comm_sms),
                               int(workspace_bytes), watchdog, peer_to_peer=peer_to_peer,
                               cta_policy=cta_policy_code(cta_policy))

  # Groups in one fixed order on every process: NCCL init blocks until a group's ranks join.
  # All or nothing: a failure leaves none of this comm_id's communicators here (the next
  # lowering makes them all; finding some made, it made none of the rest). Across processes
  # every process learns of a group's failure before any goes on to the next group's init,
  # which would block for ever on a peer that stopped (NCCL init has no timeout).
  try:
    for index, group in enumerate(groups):
      if spans_processes:
        distributed.all_succeed(f"create/{cid}/{generation}/{index}",
                                lambda index=index, group=group: create(index, group),
                                processes,
                                f"creating the communicators of comm_id {cid} (axis group "
                                f"{index})")
      else:
        create(index, group)
    if spans_processes:
      distributed.barrier(f"init/{cid}/{generation}", processes)
    if peer_to_peer:
      ext.connect_peers(cid)
  except TimeoutError:
    # A process that never came: destroying communicators shared with it could wait for it
    # (ncclCommDestroy), before this error is even reported. Kept; restart the processes.
    raise
  except Exception as err:
    _discard_communicators(ext, cid, err)
    raise
  return cid


def _discard_communicators(ext, cid, err) -> None:
  """After a failed creation: this process's communicators of `cid` destroyed (a failed
  workspace keeps its group's in the extension, communicator.h), so the state is none of
  them, not some. A failure of that is added to `err`, the error reported."""
  try:
    ext.destroy_communicators(cid)
  except Exception as destroy_err:  # noqa: BLE001
    note = f"jax_flashoverlap: then destroying comm_id {cid}'s communicators failed: {destroy_err}"
    if hasattr(err, "add_note"):
      err.add_note(note)


_ALLOCATORS = ("ncclMemAlloc", "cudaMalloc")  # how the workspace is allocated (communicator.cc)


@contextlib.contextmanager
def _workspace_hint(workspace_bytes):
  """A failed workspace allocation (the extension's RuntimeError names the allocator) gets
  what to do added: the buffer lives outside XLA's memory pool, which by default takes 75%
  of the GPU when the process starts, so a large one finds too little left."""
  try:
    yield
  except RuntimeError as err:
    if not any(name in str(err) for name in _ALLOCATORS):
      raise
    raise RuntimeError(
        f"{err}\njax_flashoverlap: the communication workspace ({allocated_bytes(workspace_bytes) / 2**20:.0f} "
        "MiB per GPU) is allocated outside XLA's memory pool and did not fit: leave it room "
        "(XLA_PYTHON_CLIENT_MEM_FRACTION below its 0.75 default, or "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false), or use a smaller M x N per call") from err


# RoundGrowth's kStep (xla_ffi/comm/communicator.h): workspaces and peer-store buffers are
# allocated in these steps, so a request is not what the GPU gives up.
GROWTH_STEP_BYTES = 8 << 20


def allocated_bytes(nbytes: int) -> int:
  """The bytes the extension allocates for a buffer request of `nbytes` (RoundGrowth)."""
  return -(-int(nbytes) // GROWTH_STEP_BYTES) * GROWTH_STEP_BYTES


def peer_handshake_bytes(world: int) -> int:
  """Workspace a point-to-point communicator needs at least: ConnectPeers sends and receives
  one int32 per peer through it (an op whose data bypass the workspace still connects)."""
  return 2 * 4 * world


COUNTER_BYTES = 64 * 4  # kMaxGroups int32 counters per communicator (signaling_gemm.h)
# kPeerSignalWords int32 (xla_ffi/comm/peer_reduce_args.h): a peer-store group member's signal
# words (arrived counters per slot and band, then per slot (8) a credit, a done word and a
# 4-word mailbox, then the failed word).
PEER_SIGNAL_BYTES = (64 + 8 + 8 + 4 * 8 + 1) * 4
# kGemmQueueBytes (xla_ffi/kernels/signaling_gemm.h), the GEMM's tile queue per communicator:
# claim counter, split-tail flags, the clusters' claim rings, then the split tail's fp32
# partial tiles (66 cluster tiles of 2 x 128 x 256: ~16.5 MiB, most of it).
_QUEUE_PARTIALS_OFFSET = -(-(16 + 512 * 4 + 256 * 16 * 8) // 256) * 256
SPLIT_PARTIAL_BYTES = 66 * 2 * 128 * 256 * 4
GEMM_QUEUE_BYTES = _QUEUE_PARTIALS_OFFSET + SPLIT_PARTIAL_BYTES


def op_memory(op: str, x_shape, w_shape, dtype, world: int, *, transpose_w: bool = False,
              concat_axis: int = 0, transport: str = "nccl",
              across_processes: bool = False, return_gathered: bool = False,
              gather: str = "p2p") -> dict:
  """Device memory an overlapped call's communicator allocates beyond its inputs and output,
  per GPU, as allocated: buffers grow in 8 MiB steps (allocated_bytes), so a shape whose
  buffer is no multiple of 8 MiB costs up to 8 MiB more than its M x N.

  `workspace_bytes`: the communicator's workspace the call uses (shared by every call and op
  on that communicator, grown to the largest; DESIGN.md says why the all-reduce has one too).
  A communicator is one per axis and plan kind: its `comm_sms`, CTA policy and whether it is
  point-to-point (comm_id_for), so collectives planned with other `comm_sms` (8 or 16), the
  collective all-gather (CTA policy zero) and the point-to-point ops (all-to-all, the default
  all-gather; at least their connection handshake) each hold a workspace, queue and counters
  of their own. NCCL's own buffers per communicator (its channels', NCCL_BUFFSIZE) are not
  counted here.
  `counter_bytes`: the group counters; `queue_bytes`: the GEMM's tile queue (per
  communicator, like the counters; a fixed ~16.6 MiB, nearly all of it the split tail's
  partial tiles, docs/signaling_gemm.md). x_shape / w_shape are per device; `transpose_w`:
  w is [N, K], as the ops' keyword; `concat_axis` (matmul_all_to_all): 1 receives into a
  staging half, twice the workspace (the handler's check, xla_ffi/ffi/gemm_all_to_all.cc).
  all_gather_matmul: `return_gathered` receives the rows straight into that second result, no
  workspace (only the handshake) with `gather` "p2p" (the default plans'); "collective" (a
  tuned or forced plan) still gathers into its workspace and copies out. The
  all-reduce lowered with JAX_FLASHOVERLAP_ALL_REDUCE_BUFFER=output (read here as at lowering)
  needs no workspace: only the counters (and the communicator's queue).
  `transport`: "nccl" (the path above) or "peer" (JAX_FLASHOVERLAP_TRANSPORT=peer; only
  matmul_all_reduce / matmul_reduce_scatter at world sizes 2 to 8): no workspace, and instead
  `peer_recv_bytes`, the buffer each GPU keeps for the running sums its next rank passes it
  along the ring (M / world x N for 2 ranks, M x N for more; grown like the workspace), its
  signal words counted in `counter_bytes`; an all-reduce `across_processes` (its axis
  groups one GPU per process) adds its staging area, (world - 1) / world x M x N, as does one
  in a process whose XLA memory the other GPUs may not write (peer_results_writable False:
  pass across_processes=True for it).
  `peer_recv_bytes` is 0 on the NCCL path.
  x with no rows (an empty batch): all 0, no kernel runs. The plan is not consulted: a shape
  whose plan falls back to XLA's composition (decode-sized M, README "Small M") allocates
  nothing either, unless comm_sms= or JAX_FLASHOVERLAP_FALLBACK=0 keeps the kernels.
  """
  import numpy as np

  from jax_flashoverlap import _ext
  itemsize = np.dtype(dtype).itemsize
  m, k = int(np.prod(x_shape[:-1])), int(x_shape[-1])
  n = int(w_shape[0] if transpose_w else w_shape[-1])
  if concat_axis not in (0, 1):
    raise ValueError(f"concat_axis must be 0 or 1, got {concat_axis!r}")
  if gather not in ("p2p", "collective"):
    raise ValueError(f"gather must be 'p2p' or 'collective', got {gather!r}")
  p2p_gather = gather == "p2p"
  workspace = {
      "matmul_all_reduce": 0 if _ext.all_reduce_in_place() else m * n,  # reduced, copied out
      "matmul_reduce_scatter": m * n,       # the full local product in the group layout
      "matmul_all_to_all": m * n * (2 if concat_axis == 1 else 1),  # + staging half (concat 1)
      # the gathered x, unless received into the returned rows (all_gather_gemm_call.cc)
      "all_gather_matmul": 0 if return_gathered and p2p_gather else world * m * k,
  }
  if op not in workspace:
    raise ValueError(f"op must be one of {sorted(workspace)}, got {op!r}")
  if transport not in ("nccl", "peer"):
    raise ValueError(f"transport must be 'nccl' or 'peer', got {transport!r}")
  if m == 0:  # no rows: the op returns XLA's empty result unlowered (ops.py), no communicator
    return {"workspace_bytes": 0, "counter_bytes": 0, "queue_bytes": 0, "peer_recv_bytes": 0}
  if transport == "nccl":
    need = workspace[op] * itemsize
    if op == "matmul_all_to_all" or (op == "all_gather_matmul" and p2p_gather):
      need = max(need, peer_handshake_bytes(world))  # as ensure_communicators asks
    return {"workspace_bytes": allocated_bytes(need), "counter_bytes": COUNTER_BYTES,
            "queue_bytes": GEMM_QUEUE_BYTES, "peer_recv_bytes": 0}
  from jax_flashoverlap import plan_peer
  collective = {"matmul_all_reduce": "all_reduce", "matmul_reduce_scatter": "reduce_scatter"}
  why = plan_peer.problem_unavailable(collective.get(op, op), world, m)
  if why is not None:
    raise ValueError(f"op_memory: {op} with transport='peer': {why}")
  return {"workspace_bytes": 0, "counter_bytes": COUNTER_BYTES + PEER_SIGNAL_BYTES,
          "queue_bytes": GEMM_QUEUE_BYTES,
          "peer_recv_bytes": allocated_bytes(plan_peer.recv_bytes(
              m, n, itemsize, world, staged=across_processes and op == "matmul_all_reduce"))}


def list_communicators() -> list:
  """This process's communicators: comm_id, device, rank, world_size, comm_sms,
  workspace_bytes, wait_method ('stream_op' or 'spin': how its calls wait for the GEMM's
  signals), write_method ('stream_op' or 'kernel': how they write flags; both chosen when the
  communicator is made, JAX_FLASHOVERLAP_WAIT), watchdog_seconds, aborted, peer_to_peer, cta_policy (0
  default, 1 efficiency, 2 zero), workspace_error (why allocating the workspace last failed;
  '' if it did not: such a communicator's calls are refused until a lowering grows it),
  peer_recv_bytes (its peer-store buffer, JAX_FLASHOVERLAP_TRANSPORT=peer; 0: none),
  peer_broken (a peer-store call of its group failed: the group refuses calls, restart),
  peer_across_processes (its peer-store group spans processes: buffers shared by CUDA IPC),
  peer_staged (its all-reduce mirrors into the others' staging areas, copied out there: across
  processes, or where XLA's memory is not writable by the other GPUs, peer_results_writable),
  peer_connected (its peer stores point at every other rank's current buffers; calls refuse
  until they do) (empty without the extension)."""
  from jax_flashoverlap import _ext
  return [] if _ext.ext is None else list(_ext.ext.list_communicators())


def destroy_communicators() -> None:
  """Destroys every communicator of this process (also done at exit).

  Safe while other threads run calls: it waits (at most 60 s, kDestroyWaitSeconds) until none
  is in flight and holds new ones off, then frees what calls use; calls still running then
  are a RuntimeError naming the comm_id, nothing freed (after a watchdog abort it frees what
  it can). Later calls of an already compiled program are refused; a new lowering makes the
  communicators again (docs/errors.md, "Hang protection"). JAX caches a jitted function's
  program per function and shapes: `jax.clear_caches()` after this makes the next call of
  the same function lower again."""
  from jax_flashoverlap import _ext
  if _ext.ext is not None:
    _ext.ext.destroy_communicators(0)


def _destroy_at_exit() -> None:
  try:
    destroy_communicators()
  except RuntimeError as err:  # e.g. after the watchdog aborted one: say so, exit anyway
    print(f"jax_flashoverlap: communicators not cleanly destroyed at exit: {err}",
          file=sys.stderr)


def _register_atexit() -> None:
  global _atexit_registered
  if not _atexit_registered:
    atexit.register(_destroy_at_exit)
    _atexit_registered = True
