"""`python -m jax_flashoverlap.launch` on CPU: it runs scripts and modules as python does,
stops every process (and what they started) when one fails, times out or it gets a signal,
names how a process ended, keeps its logs only after a failure, hands out its own
CUDA_VISIBLE_DEVICES, and holds the coordinator's port until process 0 has it. The launched
jobs' distributed setup is tests/test_multiprocess.py's."""
import os
import subprocess
import sys
import textwrap

import pytest

from _launch_util import REPO, launch as _launch


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


def test_launcher_timeout_stops_jax_distributed_processes_at_once(tmp_path):
    """JAX's preemption service catches SIGTERM once jax.distributed runs: every stop (a
    timeout, a failed process, Ctrl-C) waited out the launcher's 10 s grace for SIGKILL."""
    import time
    body = textwrap.dedent("""
        import time
        import jax
        from jax_flashoverlap import distributed
        distributed.initialize()
        assert jax.process_count() == 2
        print("INITIALIZED", flush=True)
        time.sleep(120)
    """)
    start = time.monotonic()
    r = _launch(tmp_path, body, "-n", "2", "--timeout", "12", timeout=90)
    took = time.monotonic() - start
    assert r.returncode == 124 and "INITIALIZED" in r.stdout, r.stdout + r.stderr
    assert took < 12 + 7, f"the stop took {took - 12:.1f} s after the timeout"


def test_launcher_names_a_process_whose_program_ended_early(tmp_path):
    """Process 1's program ends well after the first collective while process 0 waits in the
    next: process 1 sat in JAX's shutdown barrier and the launcher, at its timeout, said only
    'processes 0, 1 still running' (or, after JAX's 300 s barrier, 'process 0 was killed by
    SIGABRT'), never naming the process that had stopped early."""
    body = textwrap.dedent("""
        import sys
        import jax
        from jax.experimental import multihost_utils
        from jax_flashoverlap import distributed
        distributed.initialize()
        multihost_utils.sync_global_devices("first")
        print("FIRST COLLECTIVE DONE", flush=True)
        if jax.process_index() == 1:
            sys.exit(0)
        multihost_utils.sync_global_devices("second")  # process 1 never comes
    """)
    r = _launch(tmp_path, body, "-n", "2", "--timeout", "15", timeout=120)
    assert r.returncode == 124 and "FIRST COLLECTIVE DONE" in r.stdout, r.stdout + r.stderr
    assert ("the program of process 1 had ended (exit status 0) and waited in "
            "jax.distributed's shutdown for the others" in r.stdout), r.stdout


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


def test_launcher_takes_double_dash_before_the_program():
    """`launch -n 2 -- script.py --flag` was "unrecognized arguments: --"."""
    from jax_flashoverlap.launch import split_command
    assert split_command(["-n", "2", "--", "app.py", "--x", "1"]) == (["-n", "2"],
                                                                      ["app.py", "--x", "1"])
    assert split_command(["-n", "2", "--", "-m", "mod", "--"]) == (["-n", "2"],
                                                                   ["-m", "mod", "--"])
    assert split_command(["-n", "2", "app.py", "--", "x"]) == (["-n", "2"], ["app.py", "--", "x"])


# --- in-process checks of the launcher's parts (fast: no JAX in the launched processes) ------

from jax_flashoverlap import launch as launch_mod  # noqa: E402


def test_launcher_env_of_each_process(monkeypatch):
    """Each process's ids and variables; the user's NCCL_NVLS_ENABLE wins over the default;
    with an unknown GPU count, process i gets ordinals i*K .. (i+1)*K-1."""
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setenv("SOME_USER_VARIABLE", "kept")
    env = launch_mod._env(1, 3, "127.0.0.1:1234", 0)
    assert env["JAX_FLASHOVERLAP_COORDINATOR"] == "127.0.0.1:1234"
    assert env["JAX_FLASHOVERLAP_NUM_PROCESSES"] == "3"
    assert env["JAX_FLASHOVERLAP_PROCESS_ID"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
    assert env["JAX_ENABLE_PREEMPTION_SERVICE"] == "false"  # SIGTERM stops the process
    assert env["SOME_USER_VARIABLE"] == "kept"
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    assert launch_mod._env(0, 2, "h:1", 0)["NCCL_NVLS_ENABLE"] == "1"
    assert [launch_mod._env(i, 3, "h:1", 2)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == [
        "0,1", "2,3", "4,5"]
    gpus = ["7", "GPU-x", "5", "3"]
    assert [launch_mod._env(i, 2, "h:1", 2, gpus)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == [
        "7,GPU-x", "5,3"]


def test_launcher_visible_gpus(monkeypatch):
    """CUDA_VISIBLE_DEVICES's entries (blanks dropped), else nvidia-smi -L's GPU lines counted
    (not its other lines); MIG instances or no nvidia-smi: unknown."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 5,,6,")
    gpus, source = launch_mod.visible_gpus()
    assert gpus == ["4", "5", "6"] and "CUDA_VISIBLE_DEVICES" in source
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    listing = {"out": ""}

    def fake_run(cmd, **kwargs):
        assert cmd == ["nvidia-smi", "-L"]
        return subprocess.CompletedProcess(cmd, 0, stdout=listing["out"], stderr="")

    monkeypatch.setattr(launch_mod.subprocess, "run", fake_run)
    listing["out"] = ("GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n"
                      "No devices were found on the other bus\n")
    assert launch_mod.visible_gpus() == (["0", "1"], "nvidia-smi -L (2 GPUs)")
    listing["out"] = ("GPU 0: NVIDIA A100 (UUID: GPU-a)\n"
                      "  MIG 1g.10gb Device 0: (UUID: MIG-b)\n")
    assert launch_mod.visible_gpus() == (None, "")
    listing["out"] = ""
    assert launch_mod.visible_gpus() == (None, "")


@pytest.fixture
def main_calls(monkeypatch):
    """launch.main with launch() replaced by a recorder: what it would start."""
    calls = []
    monkeypatch.setattr(launch_mod, "launch", lambda *args: calls.append(args) or 0)
    return calls


@pytest.mark.parametrize("args, said", [
    (["-n", "0", "x.py"], "-n must be in [1, 256]"),
    (["-n", "257", "x.py"], "-n must be in [1, 256]"),
    (["-n", "1", "--timeout", "0", "x.py"], "--timeout must be a positive"),
    (["-n", "1", "--timeout", "nan", "x.py"], "--timeout must be a positive"),
    (["-n", "1", "--gpus-per-process", "-1", "x.py"], "--gpus-per-process must be >= 0"),
    (["-n", "1"], "missing the program"),
    (["-n", "1", "-m"], "missing the program"),
])
def test_launcher_refuses_bad_arguments(main_calls, capsys, args, said):
    with pytest.raises(SystemExit) as exc:
        launch_mod.main(args)
    assert exc.value.code == 2 and said in capsys.readouterr().err
    assert main_calls == []


def test_launcher_arguments_reach_the_launch(main_calls, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2,1,0")
    assert launch_mod.main(["-n", "256", "app.py", "-n", "9"]) == 0
    assert launch_mod.main(["--num-processes", "2", "--gpus-per-process", "2", "--timeout", "5",
                            "-m", "mod", "--timeout", "1"]) == 0
    exe = [sys.executable, launch_mod.CHILD]
    assert main_calls == [
        (256, exe + ["app.py", "-n", "9"], 600.0, 0, None),  # default timeout: 600 s
        (2, exe + ["-m", "mod", "--timeout", "1"], 5.0, 2, ["3", "2", "1", "0"])]


def _py(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.fixture
def logs_here(tmp_path, monkeypatch):
    """A failed launch's kept logs go under tmp_path, not /tmp."""
    monkeypatch.setattr(launch_mod.tempfile, "tempdir", str(tmp_path))


def test_launcher_waits_for_every_process_to_end(tmp_path):
    """Process 0 ending first (with 0) does not end the launch: process 1 still finishes."""
    done = tmp_path / "done1"
    code = launch_mod.launch(2, _py(f'''
        import os, time
        if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1":
            time.sleep(1.5)
            open({str(done)!r}, "w").write("finished")
    '''), 60)
    assert code == 0 and done.read_text() == "finished"


def test_launcher_reports_the_first_failing_process(tmp_path, monkeypatch, capfd, logs_here):
    """Two processes failed by the same look: the lowest-numbered one's status is the launch's."""
    real_sleep = launch_mod.time.sleep
    monkeypatch.setattr(launch_mod.time, "sleep", lambda s: real_sleep(3.0))  # both end by then
    code = launch_mod.launch(2, _py('''
        import os, sys, time
        time.sleep(0.5)
        sys.exit(3 if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "0" else 5)
    '''), 60)
    out = capfd.readouterr().out
    assert code == 3 and "process 0 exited with 3" in out, out


def test_launcher_prints_the_end_of_a_failed_process_log(capfd, logs_here):
    """The last 4000 characters of a failed process's output, its stderr (a traceback) too."""
    code = launch_mod.launch(2, _py('''
        import os, sys
        if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1":
            print("START_OF_LOG" + "x" * 6000)
            print("END_OF_LOG", file=sys.stderr)
            sys.exit(4)
    '''), 60)
    out = capfd.readouterr().out
    assert code == 4 and "END_OF_LOG" in out and "START_OF_LOG" not in out, out[-500:]


def test_launcher_log_folder_only_when_there_are_logs(tmp_path, monkeypatch, capfd):
    """The folder of the other processes' logs: removed after a success; one process (no
    logs) fails: nothing kept, no folder named."""
    monkeypatch.setattr(launch_mod.tempfile, "tempdir", str(tmp_path))
    assert launch_mod.launch(2, _py("print('fine')"), 60) == 0
    assert list(tmp_path.iterdir()) == []
    assert launch_mod.launch(1, _py("import sys; sys.exit(6)"), 60) == 6
    assert list(tmp_path.iterdir()) == [] and "[launch] logs:" not in capfd.readouterr().out


def _fail_after_starting(grandchild, ready):
    """launch() of 2 processes: process 1 starts `grandchild` (python source), waits for the
    file `ready`, exits with 9; process 0 sleeps until stopped. The launch's status."""
    return launch_mod.launch(2, _py(f'''
        import os, subprocess, sys, time
        if os.environ["JAX_FLASHOVERLAP_PROCESS_ID"] == "1":
            subprocess.Popen([sys.executable, "-c", {grandchild!r}])
            while not os.path.exists({str(ready)!r}):
                time.sleep(0.05)
            sys.exit(9)
        time.sleep(60)
    '''), 60)


def test_launcher_kills_what_ignores_sigterm_after_a_failure(tmp_path, logs_here):
    """A failed process's own child that ignores SIGTERM gets SIGKILL."""
    import signal
    import time
    pid_file = tmp_path / "grandchild"
    grandchild = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  f"open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
                  f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(60)")
    code = _fail_after_starting(grandchild, pid_file)
    pid = int(pid_file.read_text())
    time.sleep(0.5)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert code == 9 and not alive


def test_launcher_lets_what_a_failed_process_started_stop_gracefully(tmp_path, logs_here):
    """SIGTERM first, also to the group of a process that has already failed: its child gets
    up to 10 s to clean up (a SIGTERM handler, 2 s here: more than a short grace would give)
    before the SIGKILL. It got SIGKILL at once when the launched processes had ended (process 0
    stops at once here)."""
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned_up"
    grandchild = ("import signal, sys, time\n"
                  "def bye(*_):\n"
                  f"    time.sleep(2); open({str(cleaned)!r}, 'w').write('yes'); sys.exit(0)\n"
                  "signal.signal(signal.SIGTERM, bye)\n"
                  f"open({str(ready)!r}, 'w').write('up')\n"
                  "time.sleep(60)\n")
    code = _fail_after_starting(grandchild, ready)
    assert code == 9 and cleaned.read_text() == "yes"


def test_launcher_waits_for_process_groups_only_while_they_have_members(tmp_path, monkeypatch):
    """A group is alive until its last member is reaped; _kill waits for (reaps) a process slow
    to stop on SIGTERM, then, the groups empty, does not wait out the 10 s grace."""
    import time
    p = subprocess.Popen(_py("import time; time.sleep(60)"), start_new_session=True)
    try:
        assert launch_mod._group_alive(p)
    finally:
        p.kill()
        p.wait()
    assert not launch_mod._group_alive(p)
    ready = tmp_path / "ready"
    slow = subprocess.Popen(_py(f'''
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(0)))
        open({str(ready)!r}, "w").write("up")
        time.sleep(60)
    '''), start_new_session=True)
    while not ready.exists():
        assert slow.poll() is None
        time.sleep(0.05)
    checked, alive = [], launch_mod._group_alive
    monkeypatch.setattr(launch_mod, "_group_alive", lambda q: checked.append(q) or alive(q))
    launch_mod._kill([p, slow], groups=True)
    assert slow.returncode == 0 and checked == [p, slow]  # one look: both groups empty


def test_launcher_leaves_what_a_successful_process_started(tmp_path):
    """After a success only processes still running are stopped, not what they started in
    the background (groups are killed only when the launch failed or was stopped)."""
    import time
    marker = tmp_path / "background_done"
    code = launch_mod.launch(1, _py(f'''
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c",
                          "import time; time.sleep(1); open({str(marker)!r}, 'w').write('ok')"])
    '''), 60)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert code == 0 and marker.read_text() == "ok"
