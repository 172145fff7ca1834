"""`python -m jax_flashoverlap.bench` / `.tune` as a user meets them beyond the bad-input table
(tests/_bad_rows_tools.py): default shapes on any device count, nothing left behind by a
refused run, an option named twice, the plot's folder and title, what --help says."""
import argparse
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("world", range(1, 9))
def test_the_no_gpu_default_shape_splits_over_any_device_count(world):
  """256x256x512 split over 1, 2, 4 and 8 devices only: on 3, 5, 6 or 7 every subcommand
  stopped at an error about a shape the user never named. Rounded up, it splits for every
  op; on 1, 2, 4 and 8 it is unchanged."""
  from jax_flashoverlap import bench, bench_a2a
  (shape,) = bench.no_gpu_shapes(world)
  if world in (1, 2, 4, 8):
    assert shape == (256, 256, 512)
  bench.check_tp_shape(shape, world, ("all_reduce", "reduce_scatter"))
  for op in bench_a2a.OPS:
    bench_a2a.check_shape(op, shape[0], shape[1], world, shape[2])


def test_overlap_on_three_devices_runs_its_default_shape(tmp_path):
  out = tmp_path / "r.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=3")
  r = subprocess.run([sys.executable, "-m", "jax_flashoverlap.bench", "overlap", "--variants",
                      "--trace", "0", "--samples", "1", "--calls", "1", "--out", str(out)],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = json.loads(out.read_text())["rows"]
  assert {(row["m"], row["n"], row["k"], row["world"]) for row in rows} == {
      (261, 264, 528, 3)}
  assert "--shapes defaults to 261x264x528" in r.stdout


def test_a_split_error_about_the_gpu_default_says_it_is_the_default(capsys):
  """On 3 GPUs DESIGN.md's shapes (the default) do not split: the error named --shapes the
  user never gave, with no word of where the shape came from."""
  from jax_flashoverlap import bench
  args = argparse.Namespace(kind="overlap", shapes=list(bench.DESIGN_SHAPES), world=3,
                            collectives=["all_reduce"])
  for defaulted, said in ((True, True), (False, False)):
    with pytest.raises(SystemExit):
      bench._check_shapes(argparse.ArgumentParser(), args, defaulted)
    err = capsys.readouterr().err
    assert "K=8192 must split over --world 3" in err
    assert ("the default shapes, DESIGN.md's, do not split over 3 GPUs: name shapes that do "
            "with --shapes, or a --world they split over" in err) == said, err


def test_a_refused_run_leaves_no_new_folders(tmp_path):
  """--out's and --plot's missing folders were made while the options were checked, before
  a later check (a shape, a plot format) refused the run: empty folders left behind."""
  from jax_flashoverlap import bench
  pytest.importorskip("matplotlib")
  for argv in (["--shapes", "64x64x12", "--out", str(tmp_path / "a" / "sub" / "x.json")],
               ["--shapes", "64x64x64", "--out", str(tmp_path / "b" / "x.json"), "--plot",
                str(tmp_path / "c" / "p.xyz")],
               ["--shapes", "64x64x12", "--plot", str(tmp_path / "d" / "p.png")]):
    with pytest.raises(SystemExit) as exit_:
      bench.main(["overlap", *argv])
    assert exit_.value.code == 2
  assert list(tmp_path.iterdir()) == []


def test_an_option_named_twice_is_measured_once(tmp_path, capsys):
  """`--collectives all_reduce all_reduce` measured and recorded every row twice (and the
  target tally counted both), where `--comm-sms 0 0` was already taken once; its folder is
  made when the first row is written."""
  from jax_flashoverlap import bench
  out = tmp_path / "new" / "r.json"
  assert bench.main(["overlap", "--collectives", "all_reduce", "all_reduce", "--variants",
                     "--trace", "0", "--shapes", "64x64x256", "--world", "4", "--samples", "1",
                     "--calls", "1", "--out", str(out)]) == 0
  rows = json.loads(out.read_text())["rows"]
  assert [row["collective"] for row in rows] == ["all_reduce"]


def test_the_plot_makes_its_folder_and_says_when_it_is_a_smoke_run(tmp_path, monkeypatch):
  """The plot's folder is made when it is drawn (no longer while the options are checked); on
  CPU its title says that every variant is XLA's composition, as the printed lines do."""
  pytest.importorskip("matplotlib")
  from matplotlib.axes import Axes
  from jax_flashoverlap import bench_variants
  titles = []
  real = Axes.set_title
  monkeypatch.setattr(Axes, "set_title", lambda ax, text, *a, **k: (titles.append(text),
                                                                    real(ax, text, *a, **k))[1])
  row = {"collective": "all_reduce", "m": 64, "n": 64, "k": 256, "world": 4,
         "dtype": "bfloat16", "times_ms": {"xla_dot_collective": 2.0, "ours": 1.0}}
  for backend, smoke in (("cpu", True), ("gpu", False)):
    path = tmp_path / backend / "deeper" / "p.png"
    result = {"rows": [row], "info": {"default_backend": backend}}
    assert bench_variants.plot(result, str(path)) == str(path) and path.stat().st_size > 1000
    assert titles[-1].startswith("4 devices, bfloat16")
    assert ("no GPU: every variant is XLA's composition (a smoke run)" in titles[-1]) == smoke


def test_a_closed_pipe_ends_the_run_quietly():
  """`bench ... | head -1`: the next line printed met a closed pipe, and the run ended in a
  BrokenPipeError traceback (rc 1); now quietly, with a shell's status for it (141)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.Popen([sys.executable, "-m", "jax_flashoverlap.bench", "overlap", "--shapes",
                           "64x64x256", "--variants", "--trace", "0", "--samples", "1",
                           "--calls", "1"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  first = proc.stdout.readline()  # the no-GPU warning, printed before anything is compiled
  proc.stdout.close()  # as `head -1` exits
  err = proc.stderr.read()
  assert proc.wait(timeout=300) == 141, err[-3000:]
  assert first.startswith("WARNING: no GPU") and "Traceback" not in err, err[-3000:]


def test_help_says_what_each_subcommand_measures(capsys):
  """`bench --help` listed the four subcommands' names only ({gemm,overlap,sweep,a2a}) and
  each one's --help opened with its usage: nothing said what any of them times."""
  from jax_flashoverlap import bench
  with pytest.raises(SystemExit) as exit_:
    bench.main(["--help"])
  assert exit_.value.code == 0
  text = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal's width
  for name, about in bench.SUBCOMMANDS.items():
    assert f"{name} {' '.join(about.split())}" in text, name
  assert "python -m jax_flashoverlap.launch -n 2" in text  # the module's docstring, whole
  for name, about in bench.SUBCOMMANDS.items():
    with pytest.raises(SystemExit):
      bench.main([name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{' '.join(about.split())}. options:" in text, name
    assert "--shapes" in text and "--samples" in text
    assert "(default: None)" not in text and "(default: 20)" in text, name  # --samples'
  with pytest.raises(SystemExit) as exit_:
    bench.main([])
  assert exit_.value.code == 2
  assert "the following arguments are required: {gemm,overlap,sweep,a2a}" in capsys.readouterr().err


def test_tune_help_prints_its_steps_as_written(capsys):
  """`tune --help` printed the docstring's first line: the four steps it takes (what it
  measures, for how long) were in the source only; options without a default said
  "(default: None)"."""
  from jax_flashoverlap import tune
  with pytest.raises(SystemExit) as exit_:
    tune.main(["--help"])
  assert exit_.value.code == 0
  out = capsys.readouterr().out
  for step in ("  1. calibrate: ", "  2. search: ", "  3. measure: ", "  4. keep the fastest: "):
    assert "\n" + step in out, step  # its own line, indented as in the docstring
  assert "(default: None)" not in out and "(default: bfloat16)" in out
