"""jax_flashoverlap: tile-wise overlap of a tensor-parallel GEMM and its collective (FlashOverlap)
for JAX on NVIDIA GPUs.

Per-device ops (inside jax.shard_map): matmul_all_reduce, matmul_reduce_scatter, matmul,
matmul_all_to_all, all_gather_matmul.
Global view (under jax.jit with NamedSharding inputs): row_parallel_matmul,
column_parallel_matmul (sequence parallel: all_gather_matmul per device).
Per-group timeline of the overlapped calls: jax_flashoverlap.trace.
jax.checkpoint policies that keep the ops' results where they keep dots: ops_as_dots.
"""

from jax_flashoverlap.ops import matmul, matmul_all_reduce, matmul_reduce_scatter
from jax_flashoverlap.ops import all_gather_matmul, matmul_all_to_all
from jax_flashoverlap.sharding import row_parallel_matmul
from jax_flashoverlap.sharding_column import column_parallel_matmul
from jax_flashoverlap._info import info
from jax_flashoverlap.remat import ops_as_dots
from jax_flashoverlap._validation import AxisNameError
from jax_flashoverlap._version import __version__
from jax_flashoverlap import distributed, plan, trace

__all__ = [
    "matmul",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "matmul_all_to_all",
    "all_gather_matmul",
    "row_parallel_matmul",
    "column_parallel_matmul",
    "info",
    "ops_as_dots",
    "AxisNameError",
    "__version__",
]
