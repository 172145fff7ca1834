"""Runs a script under `python -m jax_flashoverlap.launch` as CPU processes (also on GPU
machines, where two processes would each take every GPU); shared by the launcher's tests and
the multi-process tests."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(tmp_path, body, *launch_args, timeout=240):
    script = tmp_path / "script.py"
    script.write_text(body)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "jax_flashoverlap.launch", *launch_args,
                           str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
