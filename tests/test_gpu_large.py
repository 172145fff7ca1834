"""Outputs of more than 2^31 elements (GPU machine): the offsets that grow with the output
(the kernel's output rows, the group spans handed to NCCL, the workspace's size, the copies
back) are 64-bit in the C++ (a review read them all); this runs them past 2^31 elements, where
a 32-bit offset would wrap and write (or reduce) the wrong rows. M = 135168 rows of N = 16384
bfloat16: 2.21e9 elements, 4.4 GB, with a small K so the GEMM itself is short.

Poisoned outputs (conftest: JAX_FLASHOVERLAP_POISON_OUTPUTS=1): a tile that was never written
stays NaN. The rows past element 2^31 are compared on their own, against XLA's dot in float32.
The all-reduce runs through a 1-rank communicator (our kernels forced: one device has nothing
to communicate), which takes the same offsets as on several GPUs."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from _util import shard_map
import _gpu_util as U

pytestmark = U.MARKS

M, N, K = 135168, 16384, 128
FIRST_ROW_PAST_2_31 = (1 << 31) // N  # 131072: rows from here start past element 2^31


@pytest.fixture(autouse=True)
def _our_kernels(monkeypatch):
    U.use_our_kernels(monkeypatch)


def _programs():
    import jax_flashoverlap as fo
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    return {
        "flashoverlap_gemm": jax.jit(fo.matmul),
        "flashoverlap_gemm_all_reduce": jax.jit(shard_map(
            lambda x, w: fo.matmul_all_reduce(x, w, "tp"), mesh, (P(None, "tp"), P("tp", None)),
            P())),
    }


@pytest.mark.parametrize("target", ["flashoverlap_gemm", "flashoverlap_gemm_all_reduce"])
def test_output_past_2_31_elements(target):
    assert M * N > 1 << 31 and FIRST_ROW_PAST_2_31 < M
    kx, kw = jax.random.split(jax.random.key(7))
    x, w = U.normal(kx, (M, K)), U.normal(kw, (K, N), K ** -0.5)
    f = _programs()[target]
    U.assert_custom_call(f, (x, w), target)
    y = f(x, w)
    assert y.shape == (M, N) and y.dtype == U.BF16

    @jax.jit
    def errors(y, x, w):
        def rel(rows):
            ref = U.dot32(x[rows], w)
            got = y[rows].astype(jnp.float32)
            return (jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref),
                    jnp.sum(~jnp.isfinite(got)))
        return rel(slice(0, FIRST_ROW_PAST_2_31)), rel(slice(FIRST_ROW_PAST_2_31, M))

    (head_err, head_bad), (tail_err, tail_bad) = jax.device_get(errors(y, x, w))
    assert int(head_bad) == 0 and int(tail_bad) == 0, (head_bad, tail_bad)
    assert float(head_err) < U.TOL and float(tail_err) < U.TOL, (head_err, tail_err)
