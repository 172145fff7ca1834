"""A GPU machine has the CUDA extension with every custom-call target. Every other GPU test
file skips itself where the extension is not built (test_gpu_a2a.py where it lacks the #9
targets), so on a GPU machine whose build failed or found no nvcc the whole GPU suite would be
skips and the run green; this file has no such skip and fails there instead."""
import pathlib
import re

import jax
import pytest

import _gpu_util as U

# Every target the extension registers (xla_ffi/ffi/handlers.h, FLASHOVERLAP_FFI_HANDLERS):
# the ops' five and bench's flashoverlap_collective (the capped collective timed alone; a
# build without it silently drops that column of `bench overlap`).
TARGETS = {"flashoverlap_gemm", "flashoverlap_gemm_all_reduce",
           "flashoverlap_gemm_reduce_scatter", "flashoverlap_collective",
           "flashoverlap_gemm_all_to_all", "flashoverlap_all_gather_gemm"}

HANDLERS_H = pathlib.Path(__file__).resolve().parents[1] / "xla_ffi" / "ffi" / "handlers.h"


def test_targets_are_the_extensions_registrations():
    """(CPU) TARGETS is the extension's handler list, so a GPU run checks every one of them
    (it lacked flashoverlap_collective)."""
    text = HANDLERS_H.read_text()
    table = text[text.index("#define FLASHOVERLAP_FFI_HANDLERS"):]
    registered = set(re.findall(r'X\("([A-Za-z0-9_]+)",', table))
    assert registered and TARGETS == registered, (sorted(TARGETS), sorted(registered))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="no GPU: the CPU path needs no extension")
def test_a_gpu_machine_has_the_extension_with_every_target():
    assert U.extension_built(), "a GPU is present but the CUDA extension is not built"
    missing = TARGETS - U.available_targets()
    assert not missing, f"custom-call targets not registered: {sorted(missing)}"
