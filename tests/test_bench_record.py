"""What the bench CLIs record and refuse without devices (jax_flashoverlap.bench_record,
jax_flashoverlap.bench_args): the rows rewritten as they finish, which paths are streams, strict
JSON, the commit recorded, the option checks at their bounds, and --out / --plot where they are
links, FIFOs, a redirected stdout or a stream."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rows_log_every_row_so_far():
    """Each finished row rewrites --out with all the rows so far (not the last one alone)."""
    import types
    from jax_flashoverlap import bench_record
    seen = []
    rows = bench_record.RowLog(types.SimpleNamespace(on_row=seen.append))
    rows.append({"m": 1})
    rows.append({"m": 2})
    assert seen == [[{"m": 1}], [{"m": 1}, {"m": 2}]] and rows == [{"m": 1}, {"m": 2}]
    quiet = bench_record.RowLog(types.SimpleNamespace())  # no --out: nothing written
    quiet.append({"m": 3})
    assert quiet == [{"m": 3}]


def test_streams_are_dev_proc_and_special_files_only(tmp_path):
    from jax_flashoverlap import bench_record
    (tmp_path / "f.json").write_text("{}")
    os.mkfifo(tmp_path / "fifo")
    for path, stream in (("/dev/stdout", True), ("/proc/self/fd/1", True),
                         (tmp_path / "fifo", True), (tmp_path / "f.json", False),
                         (tmp_path, False), (tmp_path / "new.json", False)):
        assert bench_record.is_stream(str(path)) is stream, path


def test_json_safe_nulls_every_nan_and_infinity(tmp_path):
    from jax_flashoverlap import bench_record
    value = {"a": (1.0, float("nan")), "b": [float("inf"), -float("inf")], "c": {"d": 2}}
    assert bench_record.json_safe(value) == {"a": [1.0, None], "b": [None, None], "c": {"d": 2}}
    bench_record.write_json(tmp_path / "v.json", value)
    assert json.loads((tmp_path / "v.json").read_text())["b"] == [None, None]


def test_a_failed_json_write_leaves_no_temporary_file(tmp_path):
    from jax_flashoverlap import bench_record
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        bench_record.write_json(tmp_path / "d", {"a": 1})  # replacing a folder fails
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_plain_file_under_dev_is_a_file_and_a_link_there_a_stream(tmp_path, capsys):
    """/dev/shm/r.json is a file: --out there is accepted when new (it was refused as "not
    writable": every /dev path was a stream) and replaced whole; a link under /dev (as
    /dev/stdout is) stays a stream, appended to, never replaced."""
    import argparse
    from jax_flashoverlap import bench_args, bench_record
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    path = f"/dev/shm/jax_flashoverlap_test_{os.getpid()}.json"
    link = f"/dev/shm/jax_flashoverlap_test_{os.getpid()}_link.json"
    log = tmp_path / "log.txt"
    log.write_text("log\n")
    try:
        assert not bench_record.is_stream(path)
        bench_args.check_output_paths(argparse.ArgumentParser(prog="bench"),
                                      argparse.Namespace(out=path, plot=None))
        bench_record.write_json(path, {"row": 1})
        bench_record.write_json(path, {"row": 2})
        assert json.loads(open(path).read()) == {"row": 2}
        os.symlink(log, link)
        assert bench_record.is_stream(link)
        bench_record.write_json(link, {"row": 3})
        text = log.read_text()
        assert text.startswith("log\n") and '"row": 3' in text, text
        assert os.path.islink(link)
    finally:
        for p in (path, link):
            if os.path.lexists(p):
                os.remove(p)


def _refused(check, args, capsys):
    """The parser error (exit 2) a bench_args check gives, as its message."""
    import argparse
    with pytest.raises(SystemExit) as exc:
        check(argparse.ArgumentParser(prog="bench"), args)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_number_options_are_checked_at_their_bounds(capsys):
    """--comm-sms 0 and MAX_COMM_SMS and --groups 0 and MAX_GROUPS are legal, one past either
    end is refused, as is a negative --trace (0: no trace)."""
    import argparse
    from jax_flashoverlap import bench_args
    from jax_flashoverlap.plan import MAX_COMM_SMS, MAX_GROUPS
    ok = dict(kind="sweep", calls=1, samples=1, world=2, comm_sms=[0, MAX_COMM_SMS],
              groups=[0, MAX_GROUPS], trace=0)
    bench_args.check_numbers(argparse.ArgumentParser(), argparse.Namespace(**ok))
    for bad, says in (({"comm_sms": [MAX_COMM_SMS + 1]}, "--comm-sms values must be in"),
                      ({"comm_sms": [-1]}, "--comm-sms values must be in"),
                      ({"groups": [MAX_GROUPS + 1]}, "--groups values must be in"),
                      ({"groups": [-1]}, "--groups values must be in"),
                      ({"trace": -1}, "--trace must be >= 0, got -1")):
        err = _refused(bench_args.check_numbers, argparse.Namespace(**dict(ok, **bad)), capsys)
        assert says in err, (bad, err)


def test_output_paths_a_plot_stream_an_upper_case_suffix_and_new_folders(tmp_path, capsys):
    """--plot to a FIFO is refused (a plot is a file); '.PNG' is matplotlib's png; --out in
    folders not made yet passes the check, which makes none (a later refusal left them
    empty); the writer makes them (through a link, the target's)."""
    import argparse
    from jax_flashoverlap import bench_args, bench_record
    pytest.importorskip("matplotlib")
    os.mkfifo(tmp_path / "p.png")
    err = _refused(bench_args.check_output_paths,
                   argparse.Namespace(out=None, plot=str(tmp_path / "p.png")), capsys)
    assert "a plot is a file, not a stream" in err
    args = argparse.Namespace(out=str(tmp_path / "new" / "r.json"), plot=str(tmp_path / "P.PNG"))
    bench_args.check_output_paths(argparse.ArgumentParser(), args)
    assert args.plot == str(tmp_path / "P.PNG") and not (tmp_path / "new").exists()
    bench_record.write_json(args.out, {"rows": []})
    assert json.loads((tmp_path / "new" / "r.json").read_text()) == {"rows": []}
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere" / "r.json")
    bench_args.check_output_paths(argparse.ArgumentParser(),
                                  argparse.Namespace(out=str(tmp_path / "link.json"), plot=None))
    assert not (tmp_path / "elsewhere").exists()
    bench_record.write_json(str(tmp_path / "link.json"), {"rows": [1]})  # the link's target
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "elsewhere" / "r.json").read_text()) == {"rows": [1]}


def test_an_empty_commit_variable_is_not_a_commit(tmp_path, monkeypatch):
    """JAX_FLASHOVERLAP_GIT_COMMIT set but empty (an unset shell variable passed through)
    records git's HEAD, not an empty commit."""
    from jax_flashoverlap import bench_record
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True,
                                    capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setenv("JAX_FLASHOVERLAP_GIT_COMMIT", "")
    assert bench_record.git_commit(tmp_path) == git("rev-parse", "HEAD")


def test_git_commit_says_dirty_when_the_tree_is_not_heads(tmp_path, monkeypatch):
    """Results run from a changed tree (or, on the GPU machine, a tree beside an older git
    directory) must not be recorded as HEAD's."""
    from jax_flashoverlap import bench
    monkeypatch.delenv("JAX_FLASHOVERLAP_GIT_COMMIT", raising=False)
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True,
                                    capture_output=True)
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert bench.git_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert bench.git_commit(tmp_path) == head + "+dirty"
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "new.py").write_text("y = 1\n")  # an untracked file ran too
    assert bench.git_commit(tmp_path) == head + "+dirty"
    monkeypatch.setenv("JAX_FLASHOVERLAP_GIT_COMMIT", "abc123")
    assert bench.git_commit(tmp_path) == "abc123"
    assert bench.git_commit(tmp_path / "nowhere") == "abc123"
    monkeypatch.delenv("JAX_FLASHOVERLAP_GIT_COMMIT")
    assert bench.git_commit(tmp_path / "nowhere") == "unknown"


def test_json_out_follows_links_and_writes_through_fifos(tmp_path):
    """--out replaced a link by a file (the link's target left stale) and a FIFO or device
    (/dev/stdout, /dev/null as root) by a regular file."""
    import threading
    from jax_flashoverlap import bench_record
    target = tmp_path / "real.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    bench_record.write_json(tmp_path / "link.json", {"a": float("nan"), "b": 1})
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads(target.read_text()) == {"a": None, "b": 1}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    bench_record.write_json(fifo, {"c": 2})
    reader.join(timeout=30)
    assert fifo.is_fifo() and json.loads(got[0]) == {"c": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.json", "link.json", "real.json"]


@pytest.mark.parametrize("given, kept", [("plot", "plot.png"), ("plot.svg", "plot.svg")])
def test_plot_path_gets_png_without_a_suffix(tmp_path, given, kept):
    """matplotlib added '.png' to a suffixless --plot while the JSON recorded the path given."""
    import argparse
    from jax_flashoverlap import bench_args
    pytest.importorskip("matplotlib")
    args = argparse.Namespace(out=None, plot=str(tmp_path / given))
    bench_args.check_output_paths(argparse.ArgumentParser(), args)
    assert args.plot == str(tmp_path / kept)
    (tmp_path / "plots").mkdir()
    args.plot = str(tmp_path / "plots")  # a folder is refused, not made into plots.png
    with pytest.raises(SystemExit):
        bench_args.check_output_paths(argparse.ArgumentParser(), args)


def test_json_out_to_a_redirected_stdout_keeps_the_log(tmp_path):
    """--out /dev/stdout with stdout redirected to a file: the file was replaced (what the
    process printed after it lost), or, opened anew, overwritten at its own offset."""
    log = tmp_path / "run.log"
    code = ("from jax_flashoverlap import bench_record as b\n"
            "print('before', flush=True)\n"
            "b.write_json('/dev/stdout', {'row': 1})\n"
            "print('between', flush=True)\n"
            "b.write_json('/proc/self/fd/1', {'row': 2})\n"
            "print('after')\n")
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", code], cwd=REPO, stdout=f, check=True,
                       env=dict(os.environ, PYTHONPATH=REPO))
    text = log.read_text()
    assert [line for line in text.splitlines() if line in ("before", "between", "after")] == [
        "before", "between", "after"], text
    assert text.index('"row": 1') < text.index("between") < text.index('"row": 2'), text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.log"]


def test_a_stream_out_gets_one_document_at_the_end(tmp_path):
    """--out rewrites the file after every row; a stream got one document per row."""
    r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.bench", "gemm", "--shapes",
                        "64x64x64", "128x64x64", "--comm-sms", "0", "--samples", "2", "--calls",
                        "1", "--out", "/dev/stdout"], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count('"kind": "gemm"') == 1, r.stdout[-3000:]
    assert '"complete": true' in r.stdout
