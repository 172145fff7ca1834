"""Several processes on CPU: `python -m jax_flashoverlap.launch` starts processes of 2 CPU
devices each with JAX's distributed runtime (gloo collectives). Checks the key-value exchange
that carries NCCL ids, the plan check that turns a cross-process mismatch into an error on
every rank (here through a CUDA cross-lowering, which is where plans are made), the reference
path across processes, communicator setup among a mesh's processes only (the launcher itself:
tests/test_launcher.py)."""
import textwrap

import pytest

from _launch_util import launch as _launch

SCRIPT = textwrap.dedent('''
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax_flashoverlap as fo
    from jax_flashoverlap import distributed
    distributed.initialize()
    me = jax.process_index()
    assert jax.process_count() == 2 and len(jax.devices()) == 4, jax.devices()

    # NCCL ids travel like this: the owner makes the value, the others wait for it.
    made = []
    v = distributed.share("test/uid", owner_process=0, make=lambda: made.append(1) or "id-%d" % me)
    assert v == "id-0" and len(made) == (1 if me == 0 else 0), (v, made)

    mesh = Mesh(np.array(jax.devices()), ("tp",))
    spec = dict(mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())
    big = (jax.ShapeDtypeStruct((4096, 8192), jnp.bfloat16),
           jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16))

    def cuda_text(args=big, **kw):
        f = jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", **kw), **spec)
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    # Same plan everywhere: the check passes and the custom call is there.
    assert "flashoverlap_gemm_all_reduce" in cuda_text()
    # A plan that differs between processes is an error on every process, not a hang.
    try:
        cuda_text(comm_sms=8 if me == 0 else 16)
        print("NO MISMATCH ERROR"); sys.exit(3)
    except distributed.DistributedMismatchError as err:
        assert "differs between processes" in str(err)
        print("MISMATCH OK", flush=True)
    # The same plan for another dtype or N on one process: NCCL calls of other types or
    # counts (wrong numbers, or a hang) passed the check, which compared the plans only.
    other = {"dtype": (big[0].update(dtype=jnp.float16), big[1].update(dtype=jnp.float16)),
             "N": (big[0], jax.ShapeDtypeStruct((8192, 8000), jnp.bfloat16))}
    for what, args in other.items():
        try:
            cuda_text(args if me == 1 else big)
            print("NO MISMATCH ERROR for", what); sys.exit(3)
        except distributed.DistributedMismatchError as err:
            assert "differs between processes" in str(err) and "operands" in str(err), err
            print("MISMATCH OK", what, flush=True)

    # The reference path across processes gives XLA's values.
    M, K, N = 16, 64, 32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    put = lambda a, s: jax.make_array_from_callback(
        a.shape, NamedSharding(mesh, s), lambda i: jnp.asarray(a[i], jnp.bfloat16))
    xs, ws = put(x, P(None, "tp")), put(w, P("tp", None))
    ours = jax.jit(jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), **spec))(xs, ws)
    ref = jax.jit(jax.shard_map(lambda a, b: lax.psum(a @ b, "tp"), **spec))(xs, ws)
    a = np.asarray(ours.addressable_data(0), np.float32)
    b = np.asarray(ref.addressable_data(0), np.float32)
    assert np.array_equal(a, b), np.abs(a - b).max()
    print("VALUES OK", flush=True)
''')


# Communicator setup on a 2-D mesh over 2 processes x 2 devices, with a recording stand-in for
# the CUDA extension (CPU): the 'tp' groups lie inside one process (the id is made locally,
# both ranks created together), the 'dp' groups span the processes (the id of each group comes
# from the process holding its rank 0, through JAX's key-value store; one rank per process).
COMM_2D_SCRIPT = textwrap.dedent('''
    import os, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax
    import numpy as np
    from jax.sharding import Mesh
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax_flashoverlap as fo
    from jax_flashoverlap import _ext, comm, distributed
    distributed.initialize()
    me = jax.process_index()

    class Recorder:  # the extension's communicator API, recording instead of calling NCCL
        def __init__(self):
            self.made, self.n, self.connected, self.policies = {}, 0, [], {}
        def has_communicators(self, cid):
            return any(c[0] == cid for c in self.made)
        def nccl_unique_id(self):
            self.n += 1
            return bytes([me, self.n]) * 64
        def create_communicators(self, cid, uid, world, local, comm_sms, nbytes, watchdog,
                                  peer_to_peer=False, cta_policy=0):
            self.made[(cid, tuple(local))] = uid.hex()
            self.policies[cid] = cta_policy
        def connect_peers(self, cid):
            self.connected.append(cid)
        def ensure_workspace(self, cid, nbytes):
            pass
        def destroy_communicators(self, cid):  # at exit
            pass
        # Peer stores (xla_ffi/comm/peer_stores.h): a record names its maker (process,
        # device, rank) and which growth of this process it follows.
        peer_sizes, imported, peer_steps = [], [], []
        def release_peer_stores(self, cid, nbytes):
            self.peer_steps.append("release")
        def peer_may_write(self, ptr, peer):  # groups inside a process are probed
            return True, "legacy"
        def ensure_peer_stores(self, cid, nbytes, stage_mirrors=False, grant_results=False):
            # Groups spanning processes are never probed (they always stage, in C++); those
            # inside one process found their XLA memory writable here.
            assert stage_mirrors is False, stage_mirrors
            self.peer_sizes.append((cid, nbytes))
            self.peer_steps.append("ensure")
        def export_peer_stores(self, cid):
            return [(dev, rank, bytes([me, dev, rank, len(self.peer_sizes)]) * 8)
                    for (c, local), _ in self.made.items() if c == cid for rank, dev in local]
        fail_import_on = None
        def import_peer_stores(self, cid, by_device):
            if self.fail_import_on == me:
                raise RuntimeError("no GPU here")
            self.peer_steps.append("import")
            self.imported.append((cid, {d: [r[:4].hex() for r in recs]
                                        for d, recs in by_device.items()}))

    rec = Recorder()
    _ext.ext = rec
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("dp", "tp"))  # rows: one process each
    for axis in ("tp", "dp"):
        cid = comm.ensure_communicators(mesh, axis, workspace_bytes=1 << 20, comm_sms=16)
        mine = {str(k[1]): v for k, v in rec.made.items() if k[0] == cid}
        print("RESULT", json.dumps({"axis": axis, "process": me, "made": mine}), flush=True)
        distributed.check_identical("the ids of " + axis, sorted(mine.values()) if axis == "dp"
                                    else len(mine))
    # Ops that use ncclSend/ncclRecv connect the peers at lowering, once asked, every time.
    cid = comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=16,
                                    peer_to_peer=True)
    assert rec.connected == [cid], rec.connected
    # ... on communicators of their own (unregistered workspace), not the collectives' ones.
    assert cid != comm.comm_id_for(mesh, "dp", 16), "p2p ops must not share the collectives' comm"
    # A CTA policy is fixed at creation: its communicators are others, made with it.
    cid = comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=16,
                                    cta_policy="zero")
    assert cid != comm.comm_id_for(mesh, "tp", 16) and rec.policies[cid] == 2, rec.policies
    assert rec.policies[comm.comm_id_for(mesh, "tp", 16)] == 0, rec.policies
    # Peer stores over 'dp' (one GPU of each group per process): each process's records go
    # through the key-value store; every device gets its group's, in rank order, each round.
    for round_ in (1, 2):
        cid = comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=8,
                                        peer_store_bytes=round_ << 20)
        got = rec.imported[-1]
        want = {dev: [bytes([p, dev, p, round_]).hex() for p in (0, 1)] for dev in (0, 1)}
        assert got == (cid, want), (got, want)
    assert len(rec.imported) == 2 and rec.peer_sizes == [(cid, 1 << 20), (cid, 2 << 20)]
    # Mappings closed (then a barrier) before any buffer is replaced, opened after.
    assert rec.peer_steps == ["release", "ensure", "import"] * 2, rec.peer_steps
    # 'tp' lies inside each process: buffers, no exchange.
    comm.ensure_communicators(mesh, "tp", workspace_bytes=1 << 20, comm_sms=8,
                              peer_store_bytes=1 << 20)
    assert len(rec.imported) == 2 and len(rec.peer_sizes) == 3 and len(rec.peer_steps) == 7, rec.peer_steps
    # A step that fails on one process fails on both, naming it: neither waits for the other.
    rec.fail_import_on = 1
    try:
        comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=8,
                                  peer_store_bytes=3 << 20)
        raise SystemExit("NO ERROR on process %d" % me)
    except distributed.CollectiveStepError as err:
        msg = str(err)
        assert "opening the others' buffers failed on process 1: RuntimeError: no GPU here" in msg, msg
        assert "process 0:" not in msg, msg
    rec.fail_import_on = None
    # Both processes run on this machine: one host identity.
    hosts = distributed.process_hosts([0, 1])
    assert len(set(hosts.values())) == 1 and set(hosts) == {0, 1}, hosts
    print("COMM2D OK", flush=True)
''')


def test_communicator_setup_on_a_2d_mesh_across_processes(tmp_path):
    r = _launch(tmp_path, COMM_2D_SCRIPT, "-n", "2", "--timeout", "200")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "COMM2D OK" in out, out[-6000:]
    import json
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines()
            if line.startswith("RESULT ")]
    tp, dp = (next(r for r in rows if r["axis"] == a) for a in ("tp", "dp"))
    # 'tp': one group of this process, both local ranks at once, an id made here.
    assert list(tp["made"]) == ["((0, 0), (1, 1))"], tp
    # 'dp': two groups, one local rank each (rank 0 on process 0's devices).
    assert sorted(dp["made"]) == ["((0, 0),)", "((0, 1),)"], dp
    # The ids of the spanning groups came from process 0 (first byte = maker's index) and are
    # the same on both processes (check_identical passed on both).
    assert all(bytes.fromhex(v)[0] == 0 for v in dp["made"].values()), dp


def test_two_processes_kv_exchange_plan_check_and_values(tmp_path):
    r = _launch(tmp_path, SCRIPT, "-n", "2", "--timeout", "200")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "MISMATCH OK" in out and "VALUES OK" in out, out[-6000:]
    assert "MISMATCH OK dtype" in out and "MISMATCH OK N" in out, out[-6000:]


# The fallback decision differs between the processes: process 1 keeps our kernels
# (JAX_FLASHOVERLAP_FALLBACK=0 there only), process 0 the cost model's choice, XLA's path at
# these small shapes. Both must raise DistributedMismatchError at once; before, process 0
# returned XLA's lowering without publishing anything and process 1 waited for its plan.
FALLBACK_SCRIPT = textwrap.dedent('''
    import os, sys, time
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_FLASHOVERLAP_KV_TIMEOUT_S"] = "40"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax_flashoverlap as fo
    from jax_flashoverlap import distributed
    distributed.initialize()
    me = jax.process_index()
    if me == 1:
        os.environ["JAX_FLASHOVERLAP_FALLBACK"] = "0"
    else:
        os.environ.pop("JAX_FLASHOVERLAP_FALLBACK", None)
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    sds = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    cases = [  # (op, per-device body, in_specs, out_specs, global x, global w)
        ("all_reduce", lambda a, b: fo.matmul_all_reduce(a, b, "tp"),
         (P(None, "tp"), P("tp", None)), P(), sds(256, 256), sds(256, 256)),
        ("reduce_scatter", lambda a, b: fo.matmul_reduce_scatter(a, b, "tp"),
         (P(None, "tp"), P("tp", None)), P("tp"), sds(256, 256), sds(256, 256)),
        ("all_to_all", lambda a, b: fo.matmul_all_to_all(a, b, "tp"),
         (P("tp", None), P()), P("tp", None), sds(256, 64), sds(64, 64)),
        ("all_gather", lambda a, b: fo.all_gather_matmul(a, b, "tp"),
         (P("tp", None), P(None, "tp")), P(None, "tp"), sds(256, 64), sds(64, 64)),
    ]
    for op, body, in_specs, out_specs, x, w in cases:
        f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
        start = time.monotonic()
        try:
            text = jax.jit(f).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
            print("NO MISMATCH", op, "custom call" if "flashoverlap_" in text else "XLA path",
                  flush=True)
            sys.exit(3)
        except distributed.DistributedMismatchError as err:
            msg = str(err)
            assert "differs between processes" in msg, msg
            assert '"overlap": false' in msg and '"overlap": true' in msg, msg
            took = time.monotonic() - start
            assert took < 20, f"{op}: the mismatch took {took:.0f} s (a peer waited)"
            print(f"MISMATCH OK {op} process {me}", flush=True)
            # the launcher streams process 0's output only: each process leaves a file too
            with open(os.path.join(os.path.dirname(__file__), f"p{me}.txt"), "a") as fh:
                fh.write(f"MISMATCH OK {op} process {me}\\n")
''')


def test_fallback_on_one_process_only_is_a_mismatch_on_both(tmp_path):
    r = _launch(tmp_path, FALLBACK_SCRIPT, "-n", "2", "--timeout", "200")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for me in (0, 1):
        got = (tmp_path / f"p{me}.txt").read_text()
        for op in ("all_reduce", "reduce_scatter", "all_to_all", "all_gather"):
            assert f"MISMATCH OK {op} process {me}" in got, (got, out[-6000:])


@pytest.mark.parametrize("env", [{}, {"COORDINATOR": "127.0.0.1:1", "NUM_PROCESSES": "1",
                                     "PROCESS_ID": "0"}, {"COORDINATOR": "", "NUM_PROCESSES": " "}])
def test_initialize_is_a_no_op_for_one_process(env, monkeypatch):
    """No launcher variables (empty ones count as unset), or `launch -n 1`'s: nothing starts
    (the partly set and out-of-range cases are rows of tests/test_bad_inputs.py)."""
    from jax_flashoverlap import _compat, distributed
    for name in ("COORDINATOR", "NUM_PROCESSES", "PROCESS_ID"):
        monkeypatch.delenv("JAX_FLASHOVERLAP_" + name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv("JAX_FLASHOVERLAP_" + name, value)
    assert _compat.distributed_client() is None
    distributed.initialize()
    assert _compat.distributed_client() is None


RECORDER = '''
class Recorder:
    def __init__(self):
        self.made, self.n = {}, 0
    def has_communicators(self, cid):
        return any(c[0] == cid for c in self.made)
    def nccl_unique_id(self):
        self.n += 1
        return bytes([me, self.n]) * 64
    def create_communicators(self, cid, uid, world, local, *args, **kwargs):
        self.made[(cid, tuple(local))] = uid.hex()
    def connect_peers(self, cid):
        pass
    def ensure_workspace(self, cid, nbytes):
        pass
    def destroy_communicators(self, cid):
        self.made = {k: v for k, v in self.made.items() if cid and k[0] != cid}
'''

PRELUDE = '''
import os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_FLASHOVERLAP_KV_TIMEOUT_S"] = "20"
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P
jax.config.update("jax_cpu_collectives_implementation", "gloo")
import jax_flashoverlap as fo
from jax_flashoverlap import _ext, comm, distributed
distributed.initialize()
me = jax.process_index()
'''


# 3 processes x 2 devices. A program on one process's own devices (process 0 alone) has no
# one to compare its plan with; a pipeline stage's mesh on processes 0 and 1 checks and sets
# up communicators among them, while process 2 runs a stage of its own. Before, process 0's
# local program waited for the others' n-th check (then compared it with their unrelated
# program: a false DistributedMismatchError), and the stage's communicator setup waited at a
# barrier for process 2 until the timeout.
SCOPE_SCRIPT = PRELUDE + RECORDER + textwrap.dedent('''
    big = (jax.ShapeDtypeStruct((4096, 9216), jnp.bfloat16),  # K: a multiple of 2, 4 and 6
           jax.ShapeDtypeStruct((9216, 8192), jnp.bfloat16))
    def cuda_text(mesh):
        f = jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp"), mesh=mesh,
                          in_specs=(P(None, "tp"), P("tp", None)), out_specs=P())
        return jax.jit(f).trace(*big).lower(lowering_platforms=("cuda",)).as_text()
    devs = jax.devices()
    start = time.monotonic()
    if me == 0:
        cuda_text(Mesh(np.array(jax.local_devices()), ("tp",)))
    if me in (0, 1):
        stage = Mesh(np.array(devs[:4]).reshape(2, 2), ("dp", "tp"))
        cuda_text(Mesh(np.array(devs[:4]), ("tp",)))
        _ext.ext = rec = Recorder()
        for _ in range(2):  # made, then found (and its workspace grown) among the stage
            comm.ensure_communicators(stage, "dp", workspace_bytes=1 << 20, comm_sms=16)
    else:
        cuda_text(Mesh(np.array(devs[4:]), ("tp",)))
    assert time.monotonic() - start < 15, "waited for a process outside the mesh"
    cuda_text(Mesh(np.array(devs), ("tp",)))  # every process: checked among all, in step
    print(f"SCOPE OK {me}", flush=True)
    with open(os.path.join(os.path.dirname(__file__), f"p{me}.txt"), "w") as fh:
        fh.write("SCOPE OK")
''')


def test_checks_and_barriers_are_among_the_mesh_processes_only(tmp_path):
    r = _launch(tmp_path, SCOPE_SCRIPT, "-n", "3", "--timeout", "150", timeout=200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for me in (0, 1, 2):
        assert (tmp_path / f"p{me}.txt").exists(), (me, out[-6000:])


# Communicators destroyed (destroy_communicators) and made again by a later lowering: the
# second creation must publish and read a new NCCL id. Before, the key of the first one was
# reused: the owner's write was refused (ALREADY_EXISTS), and a reader could take the old id.
RECREATE_SCRIPT = PRELUDE + RECORDER + textwrap.dedent('''
    _ext.ext = rec = Recorder()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("dp", "tp"))
    ids = []
    for round in range(2):
        comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=16)
        ids.append(sorted(rec.made.values()))
        comm.destroy_communicators()
        assert not rec.made
        if me == 1:
            time.sleep(1)  # process 0 creates first: process 1 must not read the old id
    assert ids[0] != ids[1] and all(bytes.fromhex(v)[0] == 0 for r in ids for v in r), ids
    distributed.check_identical("the ids", ids)
    print("RECREATE OK", flush=True)
''')


def test_communicators_made_again_after_destroy_get_a_new_id(tmp_path):
    r = _launch(tmp_path, RECREATE_SCRIPT, "-n", "2", "--timeout", "150", timeout=200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "RECREATE OK" in out, out[-6000:]


# 3 processes x 2 devices, a (2, 3) mesh, communicators over 'dp': groups g0 = [p0, p1],
# g1 = [p0, p2], g2 = [p1, p2]. g1's creation fails on its members (as a workspace failure
# does, agreed by the group's ranks). Before, p1 went on into g2's (blocking, timeout-less)
# NCCL init, whose other member p2 had already stopped: every process must stop at g1.
GROUP_FAILS_SCRIPT = PRELUDE + RECORDER + textwrap.dedent('''
    mesh = Mesh(np.array(jax.devices()).reshape(2, 3), ("dp", "tp"))
    groups = comm.axis_groups(mesh, "dp")
    assert [[d.process_index for d in g] for g in groups] == [[0, 1], [0, 2], [1, 2]]

    class FailingGroup1(Recorder):
        def create_communicators(self, cid, uid, world, local, *args, **kwargs):
            index = next(i for i, g in enumerate(groups)
                         if {(r, int(g[r].local_hardware_id)) for r in range(len(g))
                             if g[r].process_index == me} == set(local))
            with open(os.path.join(os.path.dirname(__file__), f"created{me}.txt"), "a") as f:
                f.write(f"{index}\\n")
            if index == 1:
                raise RuntimeError("NCCL error in ncclMemAlloc: out of memory")
            super().create_communicators(cid, uid, world, local, *args, **kwargs)

    _ext.ext = rec = FailingGroup1()
    start = time.monotonic()
    try:
        comm.ensure_communicators(mesh, "dp", workspace_bytes=1 << 20, comm_sms=16)
        raise SystemExit(f"process {me}: no error")
    except distributed.CollectiveStepError as err:
        assert "(axis group 1) failed on process 0" in str(err), str(err)
    assert time.monotonic() - start < 15, "a process waited"
    assert not rec.made, rec.made  # none of the comm_id's communicators left here
    with open(os.path.join(os.path.dirname(__file__), f"p{me}.txt"), "w") as fh:
        fh.write("STOPPED AT GROUP 1")
''')


def test_a_failed_group_stops_every_process_before_the_next_groups_init(tmp_path):
    r = _launch(tmp_path, GROUP_FAILS_SCRIPT, "-n", "3", "--timeout", "150", timeout=200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    for me in (0, 1, 2):
        assert (tmp_path / f"p{me}.txt").read_text() == "STOPPED AT GROUP 1", out[-6000:]
    # no process created a group after the failed one (p1 is in g0 and g2 only)
    created = {me: (tmp_path / f"created{me}.txt").read_text().split() for me in (0, 1, 2)}
    assert created == {0: ["0", "1"], 1: ["0"], 2: ["1"]}, created
