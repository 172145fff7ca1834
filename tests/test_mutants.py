"""tests/cuda/mutants/: each patch reverts one fix, so a check can be shown to fail without it
(build_mutants.sh builds the programs from the patched copies). A patch that no longer applies
to the source it names would make that showing impossible the next time a GPU is lent:
checked here, on CPU, without touching the tree."""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "tests" / "cuda" / "mutants"
PATCHES = sorted(MUTANTS.glob("*.patch"))


def test_there_are_patches_and_the_build_script_names_each():
  assert PATCHES, MUTANTS
  script = (MUTANTS / "build_mutants.sh").read_text()
  for patch in PATCHES:
    assert patch.name in script, f"{patch.name} is not built by build_mutants.sh"


@pytest.mark.skipif(shutil.which("patch") is None, reason="no `patch` program on this machine")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_mutant_patch_applies_to_its_source(patch, tmp_path):
  header = [line for line in patch.read_text().splitlines() if line.startswith("--- a/")]
  assert len(header) == 1, f"{patch.name}: one file per patch"
  source = ROOT / header[0][len("--- a/"):].split("\t")[0]
  assert source.is_file(), source
  out = tmp_path / source.name
  r = subprocess.run(["patch", "-s", "-p1", "-o", str(out), str(source)], stdin=patch.open(),
                     capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "MUTANT" in out.read_text() and out.read_text() != source.read_text()
