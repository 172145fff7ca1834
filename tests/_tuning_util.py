"""Shared by the tuned-config and tuner CLI tests: config entries and files with sensible
defaults (the `user_dir` fixture, a config folder of the test's own, is conftest.py's)."""
import json

from jax_flashoverlap import tuning

H200 = "NVIDIA H200"


def entry(**kw):
    e = dict(collective="all_reduce", dtype="bfloat16", m=1024, n=512, k=256, comm_sms=16,
             band_rows=[0, 512, 1024])
    e.update(kw)
    return e


def write_config(path, entries, **top):
    data = dict(schema=tuning.SCHEMA, gpu=H200, world_size=2, entries=entries)
    data.update(top)
    path.write_text(json.dumps(data))
    return path
