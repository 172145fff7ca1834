"""The FFI handlers' error macros (xla_ffi/ffi/check.h) on the CPU: tests/cuda/error_message_test.cc
checks the code each macro returns and the message it builds, and the handlers' and the
calls' exception guards (built with g++ against the CUDA, NCCL and XLA FFI headers; skipped,
saying why, where g++ or the headers are missing). And no
handler source formats with iostreams: on the H200 machine a number formatted by
std::ostringstream in a handler's error message crashed the process
(benchmarks/results/logs/ffi_error_h200x1/)."""
import os
import re
import shutil
import subprocess

import pytest

from _util import REPO, cuda_include, nccl_include


def test_error_macros_codes_and_messages(tmp_path):
    import jax
    gxx, inc = shutil.which("g++"), cuda_include()
    if gxx is None or inc is None:
        pytest.skip(f"needs g++ ({gxx}) and the CUDA headers ({inc})")
    exe = tmp_path / "error_message_test"
    nccl = nccl_include()
    if nccl is None:
        pytest.skip("needs the NCCL headers (the nvidia-nccl wheel: scripts/setup_env.sh)")
    source = os.path.join(REPO, "tests", "cuda", "error_message_test.cc")
    build = subprocess.run([gxx, "-std=c++17", "-O1", f"-I{inc}", f"-I{nccl}",
                            f"-I{jax.ffi.include_dir()}", f"-I{REPO}", source, "-o", str(exe)],
                           capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK (0 failures)"), run.stdout


def test_no_iostreams_in_the_extension_sources():
    pattern = re.compile(r"#include\s*<(sstream|iostream|ostream)>|std::(o|i)?stringstream|std::ostream\b")
    found = []
    for folder, _, files in os.walk(os.path.join(REPO, "xla_ffi")):
        for name in files:
            if name.endswith((".cc", ".h", ".cu", ".cuh")):
                path = os.path.join(folder, name)
                with open(path) as f:
                    for i, line in enumerate(f, 1):
                        if pattern.search(line) and not line.lstrip().startswith("//"):
                            found.append(f"{os.path.relpath(path, REPO)}:{i}: {line.strip()}")
    assert not found, "iostreams in the extension (error paths must not use them):\n" + "\n".join(found)


def test_every_handler_symbol_lets_no_exception_out():
    """XLA calls a handler through a C function and catches nothing: each handler symbol is
    its implementation wrapped in check.h's NoThrow (a std::bad_alloc from an error message or
    a vector, a std::system_error from a mutex, would otherwise end the process)."""
    found, unwrapped = 0, []
    for folder, _, files in os.walk(os.path.join(REPO, "xla_ffi")):
        for name in files:
            if not name.endswith((".cc", ".cu")):
                continue
            text = open(os.path.join(folder, name)).read()
            for m in re.finditer(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+),\s*([^,]+)", text):
                found += 1
                if not m.group(2).strip().startswith("flashoverlap::NoThrow("):
                    unwrapped.append(f"{name}: {m.group(1)} -> {m.group(2).strip()}")
    assert found == 6 and not unwrapped, (found, unwrapped)


def test_every_call_sequence_joins_back_after_an_exception():
    """Between StartCall (our streams ordered after XLA's) and FinishCall (XLA's stream
    joined back to ours), every overlapped call's steps run inside call_frame.h's
    CatchExceptions: an exception unwound past FinishCall to the handler's NoThrow would let
    XLA's stream run ahead of our queued work (and leave a peer-store group waiting)."""
    calls, outside = 0, []
    folder = os.path.join(REPO, "xla_ffi", "comm")
    for name in sorted(os.listdir(folder)):
        if not name.endswith("_call.cc"):
            continue
        text = open(os.path.join(folder, name)).read()
        guarded = []  # (start, end) of each lambda body: to its "});" at the line's indent
        for m in re.finditer(r"\n( *)[^\n]*CatchExceptions\(\[&\]\(\) -> Status \{", text):
            guarded.append((m.end(), text.index("\n" + m.group(1) + "});\n", m.end())))
        for m in re.finditer(r"\bStartCall\(", text):
            calls += 1
            if not any(a <= m.start() < b for a, b in guarded):
                outside.append(f"{name}: StartCall at offset {m.start()}")
    assert calls == 5 and not outside, (calls, outside)
