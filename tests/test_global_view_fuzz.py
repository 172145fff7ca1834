"""Randomized check of the global views' sharding rules (row_parallel_matmul,
column_parallel_matmul under plain jax.jit), on 8 simulated CPU devices.

On CPU the per-device ops lower to XLA's reference, but the Shardy rules, the GSPMD
infer / partition callbacks and the output layouts are the code GPUs run, so a wrong value or
a wrong layout here is a real bug. Each case, drawn with a fixed seed: a mesh of 8 devices
(1-D tp of 8 / 4 / 2; (dp, tp) of 2x4, 4x2, 1x8, 8x1, also as (tp, dp); (dp, tp, pp) of 2x2x2,
where Shardy splits axes into sub-axes), one op, x of rank 2..4 with fresh random values, x and
w laid out as README's table documents (or as it documents to cost an extra collective, or as
it documents to be refused), reduce, transpose_w, axis_name given or None, sequence_dim,
Shardy or GSPMD. Checked: values against float32 numpy; where README / the docstrings promise
it, the output's layout and the compiled program's collectives; a refused case raises its
error naming the problem.

Run more cases: FUZZ_GLOBAL_VIEW_CASES=500 pytest tests/test_global_view_fuzz.py
"""
import os
import random
import re
import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from _util import (COLLECTIVE_OPCODE, cpu_devices, f32, hlo_collectives, rand, rel_fro,
                   with_partitioner)

SEED = int(os.environ.get("FUZZ_GLOBAL_VIEW_SEED", "20261203"))
N_CASES = int(os.environ.get("FUZZ_GLOBAL_VIEW_CASES", "120"))

MESHES = [  # (shape, axis names); the contracting / gather axis is always "tp"
    ((8,), ("tp",)), ((4,), ("tp",)), ((2,), ("tp",)),
    ((2, 4), ("dp", "tp")), ((4, 2), ("dp", "tp")), ((1, 8), ("dp", "tp")),
    ((8, 1), ("dp", "tp")), ((4, 2), ("tp", "dp")), ((2, 4), ("tp", "dp")),
    ((2, 2, 2), ("dp", "tp", "pp")),
]

_MESH_CACHE = {}


def _mesh(shape, names, explicit=False):
    if (shape, names, explicit) not in _MESH_CACHE:
        n = int(np.prod(shape))
        if len(cpu_devices()) < n:
            pytest.skip(f"needs {n} CPU devices")
        types = (AxisType.Explicit if explicit else AxisType.Auto,) * len(names)
        _MESH_CACHE[shape, names, explicit] = Mesh(
            np.array(cpu_devices()[:n]).reshape(shape), names, axis_types=types)
    return _MESH_CACHE[shape, names, explicit]


def _explicit(c) -> bool:
    """A fifth of the cases on a mesh of Explicit axes (jax.make_mesh's default), from the
    case's own seed (the other draws stay as they were)."""
    return c.seed % 5 == 0


def _entry(axes):
    axes = tuple(axes)
    return None if not axes else (axes[0] if len(axes) == 1 else axes)


def _spec(entries):
    return tuple(_entry(e) for e in entries)


# ----------------------------------------------------------------------------- drawing


class Case(dict):
    __getattr__ = dict.__getitem__


def _sizes(mesh_shape, names):
    return dict(zip(names, mesh_shape))


_STRATIFIED = 28  # the first cases take each op's 7 families in turn (twice), then drawn


def _family(r, i, families, weights):
    if i < _STRATIFIED:
        return families[(i // 2) % len(families)]
    return r.choices(families, weights)[0]


def _draw(r: random.Random, i: int) -> Case:
    shape, names = MESHES[r.randrange(len(MESHES))]
    size = _sizes(shape, names)
    t = size["tp"]
    others = [a for a in names if a != "tp"]
    prod = lambda axes: int(np.prod([size[a] for a in axes], dtype=np.int64))  # noqa: E731
    # Data-parallel axes of x's leading dims: every other axis (the documented layout), one
    # of several, the other order, or none (x replicated over them).
    dps = [tuple(others)] * 3 + [()]
    if len(others) > 1:
        dps += [(others[0],), tuple(reversed(others))]
    D = dps[r.randrange(len(dps))]
    d = prod(D)
    one_d = len(names) == 1
    c = Case(i=i, mesh=(shape, names), dtype=r.choice(["bf16"] * 3 + ["f16"]),
             gspmd=r.random() < 0.5, transpose_w=r.random() < 0.5,
             axis_name=r.choice([None, "tp"]), sequence_dim=0, want=None, colls=None,
             error=None, seed=r.randrange(2**31), set_mesh=r.random() < 0.25)
    op = c["op"] = r.choice(["row", "column"]) if i >= _STRATIFIED else ["row", "column"][i % 2]
    K = 8 * t * r.randint(1, 3)
    full = d == prod(others)  # D covers every other axis: what the 2-D Shardy rules take
    known = one_d or c.axis_name is not None  # the Shardy rule knows the contracting axis
    if op == "row":
        N = 8 * r.randint(1, 4)
        reduce = c["reduce"] = r.choice(["all_reduce", "reduce_scatter"])
        rs = reduce == "reduce_scatter"
        fam = _family(r, i, ["rows", "lead", "s_over_dp", "k_unsharded", "w_only",
                             "other_axis", "refuse"], [4, 4, 1, 1, 1, 1, 2])
        if fam in ("s_over_dp", "other_axis") and not [a for a in D if size[a] > 1]:
            fam = "lead"
        w_spec = ((None, "tp") if c.transpose_w else ("tp", None))
        if fam in ("rows", "k_unsharded", "w_only", "other_axis"):
            M = d * (t * r.randint(1, 3) if rs else r.randint(1, 5))
            xs = (M, K)
            x_spec = _spec([D, ("tp",)])
            out = [D + (("tp",) if rs else ()), ()]
            c["want"] = _spec(out)
            c["colls"] = [reduce.replace("_", "-")] if t > 1 else []
            if fam == "rows" and not c.gspmd and rs and not (known and full):
                c["want"] = c["colls"] = None  # README: Shardy gathers the rows, values right
            if fam == "k_unsharded":  # nothing to reduce: a local dot
                x_spec, w_spec = _spec([D, ()]), (None, None)
                c["want"], c["colls"], c["axis_name"] = _spec([D, ()]), [], None
            if fam == "w_only":  # K of x whole, w's K over tp: x resharded (a slice)
                x_spec = _spec([D, ()])
                c["colls"] = None
                if not c.gspmd:
                    c["want"] = None
            if fam == "other_axis":  # contract over a data axis: XLA reshards x and w
                c["axis_name"] = [a for a in D if size[a] > 1][0]
                c["want"] = c["colls"] = None
                xs = (xs[0], 8 * int(np.prod(shape)))  # K a multiple of 8 per device
        elif fam in ("lead", "s_over_dp"):
            rank = r.randint(3, 4)
            s = r.randrange(rank - 1)
            dims = [r.randint(1, 3) for _ in range(rank - 1)]
            spec = [()] * (rank - 1)
            if fam == "lead":
                b = r.choice([j for j in range(rank - 1) if j != s])
                dims[b] *= d
                spec[b] = D
                dims[s] *= t if rs else 1
            else:
                spec[s] = D
                dims[s] *= d * (t if rs else 1)
            xs = tuple(dims) + (K,)
            x_spec = _spec(spec + [("tp",)])
            out = list(spec) + [()]
            if rs:
                out[s] = spec[s] + ("tp",)
                c["sequence_dim"] = r.choice([s, s - (rank - 1)])
            c["want"] = _spec(out)
            c["colls"] = [reduce.replace("_", "-")] if t > 1 else []
            if not c.gspmd and rs and (fam == "s_over_dp" or not known):
                c["want"] = c["colls"] = None  # README's Shardy notes: values right
        else:
            xs, x_spec, c = _refusal(r, c, size, D, K, N, rs)
        w_shape = (N, xs[-1]) if c.transpose_w else (xs[-1], N)
    else:
        N = 8 * t * r.randint(1, 3)
        fam = _family(r, i, ["rows", "lead", "s_over_dp", "rows_not_over_tp", "rows_tp_major",
                             "other_dim", "refuse"], [4, 4, 1, 1, 1, 1, 2])
        if fam in ("s_over_dp", "rows_tp_major") and not [a for a in D if size[a] > 1]:
            fam = "lead"
        w_spec = ("tp", None) if c.transpose_w else (None, "tp")
        c["colls"] = ["all-gather"] if t > 1 else []
        if fam in ("rows", "rows_not_over_tp", "rows_tp_major"):
            xs = (d * t * r.randint(1, 3), K)
            rows = {"rows": D + ("tp",), "rows_not_over_tp": D,
                    "rows_tp_major": ("tp",) + D}[fam]
            x_spec = _spec([rows, ()])
            c["want"] = _spec([D, ("tp",)])
            if fam == "rows_not_over_tp":
                c["colls"] = []
            if fam == "rows_tp_major":  # x resharded to rows (dp, tp) first
                c["colls"] = None
            if not c.gspmd and not (known and full):
                c["want"] = c["colls"] = None  # README: rows come back replicated
            if fam == "rows_tp_major" and not c.gspmd:
                c["want"] = None
        elif fam in ("lead", "s_over_dp", "other_dim"):
            rank = r.randint(3, 4)
            s = r.randrange(rank - 1)
            dims = [r.randint(1, 3) for _ in range(rank - 1)]
            spec = [()] * (rank - 1)
            b = r.choice([j for j in range(rank - 1) if j != s])
            if fam == "lead":
                spec[s], spec[b] = ("tp",), D
                dims[s] *= t
                dims[b] *= d
            elif fam == "s_over_dp":
                spec[s] = D + ("tp",)
                dims[s] *= d * t
            else:  # dim b over tp, not the sequence dim: XLA gathers x (a warning)
                spec[b] = ("tp",)
                dims[b] *= t
            c["sequence_dim"] = r.choice([s, s - (rank - 1)])
            xs = tuple(dims) + (K,)
            x_spec = _spec(spec + [()])
            out = [tuple(a for a in e if a != "tp") for e in spec] + [("tp",)]
            c["want"] = _spec(out)
            if fam == "s_over_dp" and not c.gspmd:
                c["want"] = c["colls"] = None  # README's Shardy note: values right
            if fam == "other_dim":
                c["want"] = c["colls"] = None
        else:
            xs, x_spec, c = _refusal(r, c, size, D, K, N, None)
        w_shape = (N, xs[-1]) if c.transpose_w else (xs[-1], N)
    if c.get("local_n"):
        w_shape = (c.local_n, xs[-1]) if c.transpose_w else (xs[-1], c.local_n)
    if c.error is None and r.random() < 0.15:  # w as README does not give it: resharded
        w_spec = r.choice([(None, None), w_spec[::-1]])
        c["family"] = fam = fam + "-w" + ("repl" if w_spec == (None, None) else "swap")
        # GSPMD: the axis from x's K (row) or axis_name (column) still gives the layout
        keep = c.gspmd and w_spec == (None, None) and (c.op == "row" or c.axis_name)
        c["want"] = c["want"] if keep else None
        c["colls"] = None
    c.update(family=fam, x_shape=xs, x_spec=x_spec, w_shape=w_shape, w_spec=w_spec)
    if c.error is not None:
        c["want"] = c["colls"] = None
    return c


def _refusal(r, c, size, D, K, N, rs):
    """A case README / the docstrings / docs/errors.md say is refused: (x shape, x spec, the
    case with its error regex)."""
    t = size["tp"]
    names = list(size)
    big = [a for a in names if a != "tp" and size[a] > 1]
    kinds = ["dtype", "dtype_mix", "axis_name", "k_align"]
    if big and t > 1:
        kinds.append("two_axes")
    if t > 1:
        kinds += ["local_align"] * 2
    if rs is not None:
        kinds.append("reduce_name")
        if rs and t > 1:
            kinds += ["rs_indivisible"] * 2
    kind = c["refusal"] = r.choice(kinds)
    xs, x_spec = (4 * t, K), (None, "tp")
    if c.op == "column":
        x_spec = ("tp", None)
    if kind == "dtype":
        c["dtype"], c["error"] = "f32", r"has dtype float32; expected one of"
    elif kind == "dtype_mix":
        c["dtype"], c["w_dtype"] = "bf16", "f16"
        c["error"] = r"x and w must have the same dtype, got x bfloat16"
    elif kind == "axis_name":
        c["axis_name"], c["error"] = "sp", r"axis_name 'sp' is not an axis of the mesh"
    elif kind == "k_align":
        xs, x_spec = (4, 12), (None, None)
        c["error"] = r"K \(last dim of x, .*\) must be a multiple of 8, got K=12"
    elif kind == "local_align":  # K (row) / N (column) a multiple of 8, not per device
        j = r.randrange(1, t)
        if c.op == "row":
            xs = (4 * t, 8 * j)
            c["error"] = (rf"K={8 * j} \(last dim of x\) sharded over '\w+' \(size {t}\) is "
                          rf"K={8 * j // t} per device; .* a multiple of 8")
        else:
            c["local_n"] = 8 * j
            what = "first" if c.transpose_w else "last"
            c["error"] = (rf"N={8 * j} \({what} dim of w\) sharded over '\w+' \(size {t}\) "
                          rf"is N={8 * j // t} per device; .* a multiple of 8")
    elif kind == "reduce_name":
        c["reduce"], c["error"] = "psum", r"reduce must be one of"
    elif kind == "rs_indivisible":  # x's scattered dim per shard not divisible by tp
        c["axis_name"] = r.choice([None, "tp"]) if len(names) == 1 else "tp"
        if r.random() < 0.5:
            xs = (3, K)
        else:
            xs, x_spec, c["sequence_dim"] = (2, 3, K), (None, None, "tp"), 1
        # at trace time when the axis size is known there (axis_name under a mesh), else
        # from the partitioner
        c["error"] = r"reduce_scatter needs .* of (each shard \(\d+\)|x \(shape \([\d, ]+\)\)) " \
                     r"to be divisible by the size \d+ of axis 'tp'"
    elif kind == "two_axes":  # the op's dim over two mesh axes and no axis_name
        c["axis_name"] = None
        both = tuple(names) if len(names) == 2 else (big[0], "tp")
        if c.op == "row":
            x_spec = (None, both)
            c["error"] = r"K is sharded over several mesh axes .*; pass axis_name"
        else:
            x_spec = (None, None)
            c["error"] = r"N is sharded over several mesh axes .*; pass axis_name"
        c["two_axes"] = both
    return xs, x_spec, c


def _cases():
    r = random.Random(SEED)
    return [_draw(r, i) for i in range(N_CASES)]


def _case_id(c):
    shape, names = c.mesh
    mesh = "x".join(f"{n}{s}" for n, s in zip(names, shape))
    red = {"all_reduce": "-ar", "reduce_scatter": "-rs"}.get(c.get("reduce"), "")
    return (f"{c.i:03d}-{c.op}{red}-{c.family}-{mesh}-{'gspmd' if c.gspmd else 'shardy'}"
            f"-x{'x'.join(map(str, c.x_shape))}")


CASES = _cases()

# ----------------------------------------------------------------------------- running

_DTYPES = {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32}
_TOL = {"bf16": 2.0**-5, "f16": 2.0**-8, "f32": 2.0**-8}
_COLLECTIVE = re.compile(COLLECTIVE_OPCODE + r".*replica_groups=(\S+)")


def _moves_data(groups: str) -> bool:
    """False for replica groups of one device each ({{0},{1},...} or [8,1]<=[8]): a collective
    over a mesh axis of size 1, which moves nothing."""
    iota = re.match(r"\[(\d+),(\d+)\]", groups)
    if iota:
        return int(iota.group(2)) > 1
    first = re.match(r"\{\{([^}]*)\}", groups)
    return first is None or "," in first.group(1)


def _inputs(c, mesh):
    rng = np.random.default_rng(c.seed)
    dt = _DTYPES[c.dtype]
    x = rand(rng, c.x_shape, dt)
    w = rand(rng, c.w_shape, _DTYPES[c.get("w_dtype", c.dtype)], scale=c.x_shape[-1] ** -0.5)
    w_spec = c.w_spec
    if c.get("refusal") == "two_axes":
        w_spec = (c.two_axes, None) if c.op == "row" else (None, c.two_axes)
        if c.transpose_w:
            w_spec = w_spec[::-1]
    if c.get("refusal") == "k_align":
        w_spec = (None, None)
    x = jax.device_put(x, NamedSharding(mesh, P(*c.x_spec)))
    w = jax.device_put(w, NamedSharding(mesh, P(*w_spec)))
    return x, w


def _fn(fo, c):
    kw = dict(axis_name=c.axis_name, transpose_w=c.transpose_w)
    if c.sequence_dim:
        kw["sequence_dim"] = c.sequence_dim
    if c.op == "row":
        return lambda a, b: fo.row_parallel_matmul(a, b, c.reduce, **kw)
    return lambda a, b: fo.column_parallel_matmul(a, b, **kw)


def run_case(fo, c):
    """(output, its compiled program's collectives) of case c."""
    mesh = _mesh(*c.mesh, explicit=_explicit(c))
    x, w = _inputs(c, mesh)
    f = jax.jit(_fn(fo, c))

    def go():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # other_dim: the partitioner's sequence_dim hint
            if c.set_mesh:  # the mesh known at trace time too (jax.set_mesh)
                with jax.set_mesh(mesh):
                    compiled = f.lower(x, w).compile()
            else:
                compiled = f.lower(x, w).compile()
            return compiled(x, w), compiled.as_text()

    out, hlo = with_partitioner(c.gspmd, go)
    colls = [m.group(1) for line in hlo.splitlines() for m in [_COLLECTIVE.search(line)]
             if m and _moves_data(m.group(2))]
    ref = np.matmul(f32(x), f32(w).T if c.transpose_w else f32(w))
    return x, out, colls, ref


def _padded(spec, ndim):
    return tuple(spec) + (None,) * (ndim - len(spec))


@pytest.mark.parametrize("c", CASES, ids=_case_id)
def test_global_view_fuzz(fo, c):
    if c.error is not None:
        with pytest.raises((TypeError, ValueError, jax.errors.JaxRuntimeError),
                           match=c.error):
            run_case(fo, c)
        return
    x, out, colls, ref = run_case(fo, c)
    assert out.shape == ref.shape and out.dtype == x.dtype, (out.shape, out.dtype)
    o = f32(out)
    assert np.all(np.isfinite(o)), "non-finite values"
    scale = max(1.0, float(np.max(np.abs(ref))))
    err = float(np.max(np.abs(o - ref)))
    assert err <= _TOL[c.dtype] * scale, f"max error {err:.3g} (scale {scale:.3g})"
    assert rel_fro(out, ref) < 1e-2
    if c.want is not None:
        want = NamedSharding(_mesh(*c.mesh), P(*c.want))
        assert out.sharding.is_equivalent_to(want, out.ndim), \
            f"output {_padded(out.sharding.spec, out.ndim)}, documented {c.want}"
    if c.colls is not None and not _explicit(c):  # explicit: the output's type decides
        assert colls == c.colls, f"collectives {colls}, documented {c.colls}"


@pytest.mark.parametrize("shape", [(16, 8), (8, 2, 8)], ids=["rows", "S-B"])
def test_reduce_scatter_one_k_per_device_gives_the_ops_error_under_shardy(fo, shape):
    """K == tp (1 per device, refused: docs/errors.md rp-local-k-not-multiple-of-8): Shardy's
    reduce-scatter rule had a size-1 factor kk in x's K (t kk) and lowering failed on an MLIR
    verifier error ("dim mapping can't have a factor of size 1") instead of our own error
    (the partitioner's, in global terms)."""
    mesh = _mesh((8,), ("tp",))
    rng = np.random.default_rng(0)
    x = jax.device_put(rand(rng, shape, jnp.bfloat16),
                       NamedSharding(mesh, P(*(None,) * (len(shape) - 1), "tp")))
    w = jax.device_put(rand(rng, (8, 16), jnp.bfloat16), NamedSharding(mesh, P("tp", None)))
    f = jax.jit(lambda a, b: fo.row_parallel_matmul(a, b, "reduce_scatter"))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"K=8 \(last dim of x\) sharded over 'tp' \(size 8\) is K=1 "
                             r"per device"):
        with_partitioner(False, f, x, w)


def test_the_collective_readers_count_tuple_shaped_and_async_collectives():
    """What the tests read "no extra collective" from: a collective whose shape is a tuple (a
    multi-operand all-to-all, an async all-gather) counts, its replica groups too; an
    instruction merely named like one does not (`= \\S+ op(` missed tuple shapes)."""
    hlo = ("%a2a = (f32[16,1,32]{2,1,0}, f32[16,1,32]{2,1,0}) all-to-all(%x, %y), "
           "channel_id=1, replica_groups={{0,1},{2,3}}, dimensions={0}\n"
           "%ags = ((bf16[4]{0}), bf16[8]{0}) all-gather-start(%all-reduce.1), "
           "replica_groups=[4,2]<=[8], dimensions={0}\n"
           "%agd = bf16[8]{0} all-gather-done(%ags)\n"
           "%ar = f32[8]{0} all-reduce(%agd), replica_groups={{0},{1}}, to_apply=%add\n"
           "%d = f32[8]{0} dot(%all-to-all.2, %b)\n")
    assert hlo_collectives(hlo) == ["all-to-all", "all-gather", "all-reduce"]
    found = [(m.group(1), _moves_data(m.group(2))) for line in hlo.splitlines()
             for m in [_COLLECTIVE.search(line)] if m]
    assert found == [("all-to-all", True), ("all-gather", True), ("all-reduce", False)]
