"""Several processes on CPU: `python -m jax_flashoverlap.launch` starts 2 processes x 2 CPU
devices with JAX's distributed runtime (gloo collectives). Checks the key-value exchange that
carries NCCL ids, the plan check that turns a cross-process mismatch into an error on every
rank (here through a CUDA cross-lowering, which is where plans are made), the reference path
across processes, and the launcher's failure and timeout handling."""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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

    def cuda_text(**kw):
        f = jax.shard_map(lambda a, b: fo.matmul_all_reduce(a, b, "tp", **kw), **spec)
        return jax.jit(f).trace(*big).lower(lowering_platforms=("cuda",)).as_text()

    # Same plan everywhere: the check passes and the custom call is there.
    assert "flashoverlap_gemm_all_reduce" in cuda_text()
    # A plan that differs between processes is an error on every process, not a hang.
    try:
        cuda_text(comm_sms=8 if me == 0 else 16)
        print("NO MISMATCH ERROR"); sys.exit(3)
    except distributed.DistributedMismatchError as err:
        assert "differs between processes" in str(err)
        print("MISMATCH OK", flush=True)

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


def _launch(tmp_path, body, *launch_args, timeout=240):
    script = tmp_path / "script.py"
    script.write_text(body)
    # CPU processes, also on GPU machines (where two processes would each grab the GPUs).
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", *launch_args,
                           str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_two_processes_kv_exchange_plan_check_and_values(tmp_path):
    r = _launch(tmp_path, SCRIPT, "-n", "2", "--timeout", "200")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "MISMATCH OK" in out and "VALUES OK" in out, out[-6000:]


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


def test_launcher_stops_the_others_when_one_fails(tmp_path):
    body = textwrap.dedent('''
        import os, sys, time
        if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1":
            print("process 1 failing"); sys.exit(7)
        time.sleep(120)
    ''')
    r = _launch(tmp_path, body, "-n", "2", "--timeout", "100", timeout=60)
    assert r.returncode == 7, r.stdout + r.stderr
    assert "process 1 exited with 7" in r.stdout and "process 1 failing" in r.stdout


@pytest.mark.parametrize("failure,status,said", [
    ("sys.exit(3)", 3, "process 1 exited with 3"),
    ("raise RuntimeError('boom in process 1')", 1, "RuntimeError: boom in process 1"),
])
def test_launcher_stops_the_others_when_one_fails_after_initialize(tmp_path, failure, status,
                                                                     said):
    """Once jax.distributed is up, a failing process used to sit in JAX's shutdown barrier
    (waiting for the others, up to 300 s) instead of exiting, so the launcher noticed nothing
    until its timeout and exited 124, or blamed process 0 when a gloo timeout ended it first.
    Now (jax_flashoverlap._launch_child) it exits at once with its own status."""
    import time
    left = tmp_path / "left_open.txt"
    body = textwrap.dedent(f'''
        import sys, time
        import jax, jax_flashoverlap as fo
        fo.distributed.initialize()
        if jax.process_index() == 1:
            f = open({str(left)!r}, "w")
            f.write("buffered")  # the fast exit still flushes open files
            print("process 1 failing", flush=True)
            {failure}
        time.sleep(120)
    ''')
    t0 = time.monotonic()
    r = _launch(tmp_path, body, "-n", "2", "--timeout", "100", timeout=150)
    took = time.monotonic() - t0
    assert r.returncode == status, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    assert "process 1 exited with" in r.stdout and said in r.stdout, r.stdout[-3000:]
    assert took < 60, took  # not the launcher's 100 s timeout
    assert left.read_text() == "buffered"


def test_launcher_runs_scripts_and_modules_as_python_does(tmp_path):
    """Through _launch_child the program still sees what `python script.py` / `python -m`
    give it: __name__, argv, its own folder on sys.path, JAX not imported before it (it may
    set JAX_* variables first), a real __main__ (a class it defines pickles in an exit
    handler), its files written at a normal end; a folder app runs; a normal end exits 0."""
    (tmp_path / "helper_mod.py").write_text("VALUE = 41\n")
    out_file = tmp_path / "written.txt"
    body = textwrap.dedent(f'''
        import atexit, os, pickle, sys
        assert "jax" not in sys.modules and "jax_flashoverlap" not in sys.modules
        import helper_mod  # found next to the script, as with `python script.py`
        assert __name__ == "__main__", __name__
        assert sys.argv[1:] == ["--flag", "x"], sys.argv
        assert os.path.basename(sys.argv[0]) == "script.py", sys.argv
        class Point:
            pass
        atexit.register(lambda: print("pickled", len(pickle.dumps(Point())) > 0, flush=True))
        f = open({str(out_file)!r} + os.environ["JAX_FLASHOVERLAP_PROCESS_ID"], "w")
        f.write("left unclosed")  # flushed at a normal exit, as by python
        print("script ran", helper_mod.VALUE + 1)
    ''')
    script = tmp_path / "script.py"
    script.write_text(body)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "2",
                        str(script), "--flag", "x"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "script ran 42" in r.stdout, r.stdout + r.stderr
    assert "pickled True" in r.stdout, r.stdout + r.stderr
    assert all((tmp_path / f"written.txt{i}").read_text() == "left unclosed" for i in (0, 1))
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("print('folder app ran')\n")
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "1", str(app)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "folder app ran" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "1", "-m",
                        "jax_flashoverlap.info"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and '"jax_flashoverlap":' in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "2",
                        str(tmp_path / "missing.py")], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "can't open file" in r.stdout + r.stderr, r.stdout + r.stderr


def test_launcher_timeout(tmp_path):
    r = _launch(tmp_path, "import time\ntime.sleep(120)\n", "-n", "2", "--timeout", "2",
                timeout=60)
    assert r.returncode == 124, r.stdout + r.stderr
    assert "timeout" in r.stdout and "processes 0, 1 still running" in r.stdout, r.stdout


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:  # a zombie (state Z) is gone for this purpose
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_launcher_signal_stops_its_processes(tmp_path, signame):
  # A scheduler's SIGTERM (or a closed terminal's SIGHUP, a SIGINT to the launcher alone)
  # must not leave the processes running without their launcher.
  import signal
  import time
  script = tmp_path / "script.py"
  script.write_text(textwrap.dedent(f'''
      import os, time
      with open(os.path.join({str(tmp_path)!r}, "pid" + os.environ["JAX_FLASHOVERLAP_PROCESS_ID"]),
                "w") as f:
          f.write(str(os.getpid()))
      time.sleep(120)
  '''))
  p = subprocess.Popen([sys.executable, "-m", "jax_flashoverlap.launch", "-n", "2", "--timeout",
                        "100", str(script)], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
  pid_files = [tmp_path / "pid0", tmp_path / "pid1"]
  pids = []
  try:
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in pid_files):
      assert time.monotonic() < deadline and p.poll() is None, p.communicate()[0]
      time.sleep(0.1)
    pids = [int(f.read_text()) for f in pid_files]
    p.send_signal(getattr(signal, signame))
    code = p.wait(timeout=30)
    time.sleep(0.5)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:  # before reading: they hold the output pipe open
      os.kill(pid, signal.SIGKILL)
    out = p.stdout.read()
    assert not left, (f"processes {left} still running after the launcher's {signame}", out)
    assert code == 128 + getattr(signal, signame), (code, out)
    assert f"got {signame}" in out, out
  finally:
    for pid in pids:
      if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    if p.poll() is None:
      p.kill()


@pytest.mark.parametrize("how", ["failure", "timeout"])
def test_launcher_stops_what_its_processes_started(tmp_path, how):
  # A process's own children (a data loader, a shell pipeline) are stopped with it: before,
  # only the direct children got the signal and their children ran on without a launcher.
  import signal
  import time
  body = textwrap.dedent(f'''
      import os, subprocess, sys, time
      me = os.environ["JAX_FLASHOVERLAP_PROCESS_ID"]
      child = subprocess.Popen(["sleep", "120"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
      with open(os.path.join({str(tmp_path)!r}, "grandchild" + me), "w") as f:
          f.write(str(child.pid))
      if me == "1" and {how!r} == "failure":
          time.sleep(2)
          sys.exit(7)
      time.sleep(120)
  ''')
  r = _launch(tmp_path, body, "-n", "2", "--timeout", "100" if how == "failure" else "6",
              timeout=90)
  pids = [int((tmp_path / f"grandchild{i}").read_text()) for i in range(2)]
  time.sleep(0.5)
  left = [pid for pid in pids if _alive(pid)]
  for pid in left:
    os.kill(pid, signal.SIGKILL)
  assert r.returncode == (7 if how == "failure" else 124), r.stdout + r.stderr
  assert not left, f"the processes' children {left} outlived the launcher"


def test_launcher_removes_its_log_folder_after_success_only(tmp_path):
  ok = _launch(tmp_path, "print('fine')\n", "-n", "2", "--timeout", "60", timeout=90)
  assert ok.returncode == 0 and "[launch] logs:" not in ok.stdout, ok.stdout
  body = textwrap.dedent('''
      import os, sys
      print("process", os.environ["JAX_FLASHOVERLAP_PROCESS_ID"], "output")
      sys.exit(3 if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1" else 0)
  ''')
  bad = _launch(tmp_path, body, "-n", "2", "--timeout", "60", timeout=90)
  assert bad.returncode == 3, bad.stdout
  kept = [line.split("[launch] logs: ", 1)[1].strip() for line in bad.stdout.splitlines()
          if line.startswith("[launch] logs: ")]
  assert kept and os.path.isfile(os.path.join(kept[0], "process1.log")), bad.stdout
  with open(os.path.join(kept[0], "process1.log")) as f:
    assert "process 1 output" in f.read()
  import shutil
  shutil.rmtree(kept[0])


def test_launcher_names_a_process_killed_by_a_signal(tmp_path):
  body = textwrap.dedent('''
      import os, signal, time
      if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1":
          os.kill(os.getpid(), signal.SIGSEGV)
      time.sleep(120)
  ''')
  r = _launch(tmp_path, body, "-n", "2", "--timeout", "100", timeout=60)
  assert r.returncode == 128 + 11, r.stdout + r.stderr
  assert "process 1 was killed by SIGSEGV" in r.stdout, r.stdout


def test_launcher_gpus_come_from_its_own_cuda_visible_devices(tmp_path):
  # Started with CUDA_VISIBLE_DEVICES=4,5,6,7 (the GPUs this job was given), the processes
  # must get 4,5 and 6,7, not GPUs 0-3 (another job's); more than listed is refused.
  script = tmp_path / "script.py"
  script.write_text(textwrap.dedent(f'''
      import os
      with open(os.path.join({str(tmp_path)!r}, "gpus" + os.environ["JAX_FLASHOVERLAP_PROCESS_ID"]),
                "w") as f:
          f.write(os.environ["CUDA_VISIBLE_DEVICES"])
  '''))
  run = lambda visible, *args: subprocess.run(
      [sys.executable, "-m", "jax_flashoverlap.launch", *args, str(script)], cwd=REPO,
      env=dict(os.environ, CUDA_VISIBLE_DEVICES=visible), capture_output=True, text=True,
      timeout=60)
  r = run("4,5,6,7", "-n", "2", "--gpus-per-process", "2")
  assert r.returncode == 0, r.stdout + r.stderr
  assert [(tmp_path / f"gpus{i}").read_text() for i in (0, 1)] == ["4,5", "6,7"]
  r = run("GPU-a,GPU-b", "-n", "2", "--gpus-per-process", "1")
  assert r.returncode == 0, r.stdout + r.stderr
  assert [(tmp_path / f"gpus{i}").read_text() for i in (0, 1)] == ["GPU-a", "GPU-b"]
  r = run("4,5,6", "-n", "2", "--gpus-per-process", "2")
  assert r.returncode == 2, r.stdout + r.stderr
  assert "needs 4 GPUs, but CUDA_VISIBLE_DEVICES='4,5,6' gives 3" in r.stderr, r.stderr


# The extension's communicator API, recording instead of calling NCCL (CPU), for the scripts
# below; `me` is the process index.
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


# The coordinator's port stays reserved from the launcher's choice until process 0's
# coordinator has it: another launch started meanwhile cannot be given it. Before, the port
# was let go at once; gRPC binds with SO_REUSEPORT, so a second launch's coordinator took it
# too, its process 1 joined the first job's coordinator and that job aborted (SIGABRT).
PORT_SCRIPT = textwrap.dedent('''
    import os, socket
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    host, port = os.environ["JAX_FLASHOVERLAP_COORDINATOR"].rsplit(":", 1)
    if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1":  # before process 0's coordinator
        s = socket.socket()
        try:
            s.bind((host, int(port)))
            print("PORT WAS FREE", flush=True)
            raise SystemExit(4)
        except OSError:
            pass
        finally:
            s.close()
    import jax
    from jax_flashoverlap import distributed
    distributed.initialize()
    me = jax.process_index()
    v = distributed.share("test/port", owner_process=0, make=lambda: "from 0")
    assert v == "from 0", v
    print("PORT OK", flush=True)
''')


def test_launcher_keeps_the_coordinator_port_reserved(tmp_path):
  r = _launch(tmp_path, PORT_SCRIPT, "-n", "2", "--timeout", "100", timeout=150)
  out = r.stdout + r.stderr
  assert r.returncode == 0 and "PORT OK" in out, out[-6000:]
