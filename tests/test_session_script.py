"""scripts/gpu_session.sh runs the GPU tests in three parts (step gpu_part): every
tests/test_gpu*.py file must be in exactly one, or a new file's tests would never run on the
GPU machine. Read from the script itself (bash expands its GPU_PARTS array)."""
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _parts():
    script = (ROOT / "scripts" / "gpu_session.sh").read_text()
    start = script.index("GPU_PARTS=(")
    block = script[start:script.index("\n)\n", start) + 2]
    out = subprocess.run(["bash", "-c", block + '\nfor p in "${GPU_PARTS[@]}"; do echo "$p"; done'],
                         capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines()]


def test_every_gpu_test_file_is_in_exactly_one_part():
    parts = _parts()
    assert len(parts) == 3 and all(parts)
    listed = [f for part in parts for f in part]
    assert len(listed) == len(set(listed)), "a file in two parts"
    on_disk = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_gpu*.py"))
    assert sorted(listed) == on_disk


def test_gpu_part_refuses_a_part_it_does_not_have(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "gpu_part"],
                       env={"PATH": "/usr/bin:/bin", "GPU_PART": "4", "OUT": str(tmp_path)},
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "gpu_part: set GPU_PART=1, 2 or 3" in r.stdout
