"""jax_flashoverlap/_launch_child.py run directly: the program each launched process runs,
as python runs it (scripts, -m packages, zip apps), and its exit once jax.distributed is up:
at once on a failure (no exit handlers that would block on the others), Python's own on a
normal end. JAX is replaced by a stand-in whose distributed runtime is "running", so the fast
exit is tested without processes."""
import os
import subprocess
import sys
import textwrap

import pytest

from jax_flashoverlap import launch as launch_mod

FAKE_JAX_RUNNING = textwrap.dedent('''
    import atexit, sys, types
    jax = types.ModuleType("jax")
    jax.distributed = types.SimpleNamespace(is_initialized=lambda: RUNNING)
    sys.modules["jax"] = jax
    atexit.register(lambda: print("exit handlers ran", flush=True))
''')


def _child(tmp_path, *argv, cwd=None):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, launch_mod.CHILD, *argv], cwd=cwd or tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("running, end, status, handlers", [
    (True, "raise RuntimeError('boom')", 1, False),    # a failure: at once, no exit handlers
    (True, "sys.exit('failed: why')", 1, False),
    (True, "sys.exit(3)", 3, False),
    (True, "sys.exit()", 0, True),                     # a normal end: Python's own exit
    (True, "sys.exit(0)", 0, True),
    (True, "sys.exit(256)", 0, True),                  # status 256 & 0xFF: not a failure
    (False, "raise RuntimeError('boom')", 1, True),    # without jax.distributed: Python's own
    (False, "sys.exit('failed: why')", 1, True),
])
def test_launch_child_exit_status(tmp_path, running, end, status, handlers):
    script = tmp_path / "prog.py"
    script.write_text(FAKE_JAX_RUNNING.replace("RUNNING", str(running)) + f"import sys\n{end}\n")
    r = _child(tmp_path, str(script))
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert ("exit handlers ran" in r.stdout) == handlers, (r.stdout, r.stderr)
    if "boom" in end:  # the program's traceback, as python prints it (not the launcher's frame)
        assert "RuntimeError: boom" in r.stderr and 'prog.py", line' in r.stderr, r.stderr
        assert "_launch_child.py" not in r.stderr, r.stderr
    if "why" in end:
        assert "failed: why" in r.stderr, r.stderr


@pytest.mark.parametrize("running, handlers", [(True, False), (False, True)])
def test_launch_child_keyboard_interrupt_ends_by_sigint(tmp_path, running, handlers):
    import signal
    script = tmp_path / "prog.py"
    script.write_text(FAKE_JAX_RUNNING.replace("RUNNING", str(running)) +
                      "raise KeyboardInterrupt\n")
    r = _child(tmp_path, str(script))
    assert r.returncode == -signal.SIGINT, (r.returncode, r.stdout, r.stderr)
    assert ("exit handlers ran" in r.stdout) == handlers and "KeyboardInterrupt" in r.stderr


def test_launch_child_runs_modules_packages_and_zips_as_python_does(tmp_path):
    """-m of a package runs its __main__ (relative imports work, argv[0] is its path, the
    current folder is on sys.path); a zip app runs; the package's own trace.py does not
    shadow the standard library's; a missing module: Python's message and status 1."""
    import zipfile
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 'helped'\n")
    (pkg / "__main__.py").write_text(textwrap.dedent('''
        import sys
        from . import helper
        print("pkg ran", helper.VALUE, __name__, __package__, sys.argv)
    '''))
    r = _child(tmp_path, "-m", "mypkg", "a", "--b")
    main_py = str(pkg / "__main__.py")
    assert r.returncode == 0, r.stderr
    assert f"pkg ran helped __main__ mypkg {[main_py, 'a', '--b']}" in r.stdout, r.stdout
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", "import sys; print('zip ran', sys.argv[1:])\n")
    r = _child(tmp_path, str(tmp_path / "app.zip"), "x")
    assert r.returncode == 0 and "zip ran ['x']" in r.stdout, r.stdout + r.stderr
    (tmp_path / "std.py").write_text("import trace; print('stdlib trace', trace.Trace.__name__)\n")
    r = _child(tmp_path, str(tmp_path / "std.py"))
    assert r.returncode == 0 and "stdlib trace Trace" in r.stdout, r.stdout + r.stderr
    for missing in ([], ["-m"]):  # refused as python refuses them
        r = _child(tmp_path, *missing)
        assert r.returncode == 2 and "missing the program" in r.stderr, r.stderr
    r = _child(tmp_path, "-m", "no_such_module_here")
    assert r.returncode == 1 and "Error while finding module specification" in r.stderr, r.stderr
