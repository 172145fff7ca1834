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
