"""Group plans: how the GEMM's output rows are split into communication groups.

A plan is a pure function of (collective, shape, dtype, world size) so every rank of an axis
derives the same one (DESIGN.md, "Communicators"). It travels to the FFI handler as custom-call
attributes, i.e. it is part of the compiled program, identical on every device.

`band_rows` are boundaries inside one rank block of rows (the whole M for all-reduce, M / n
rows for reduce-scatter; see xla_ffi/kernels/signaling_gemm.h).
"""

from __future__ import annotations

import dataclasses
import math

# Measured on 2 x H200 (DESIGN.md): 8 SMs left free with symmetric NCCL windows overlapped
# best among 8/16/24; 16 did not overlap at one shape. Tuned configs override this.
DEFAULT_COMM_SMS = 8
# Tile height of the signaling GEMM; bands are aligned to it so no tile is partial inside.
ROW_ALIGN = 128
MAX_GROUPS = 64  # xla_ffi/kernels/signaling_gemm.h: kMaxGroups


@dataclasses.dataclass(frozen=True)
class GroupPlan:
  collective: str  # "all_reduce" | "reduce_scatter" | "none"
  rows_per_block: int
  band_rows: tuple  # 0 = b_0 < ... < b_G = rows_per_block
  comm_sms: int

  @property
  def num_groups(self) -> int:
    return len(self.band_rows) - 1

  def validate(self) -> None:
    b = self.band_rows
    if len(b) < 2 or b[0] != 0 or b[-1] != self.rows_per_block:
      raise ValueError(f"plan band_rows {b} must start at 0 and end at {self.rows_per_block}")
    if any(b1 <= b0 for b0, b1 in zip(b, b[1:])):
      raise ValueError(f"plan band_rows {b} must be strictly increasing")
    if self.num_groups > MAX_GROUPS:
      raise ValueError(f"plan has {self.num_groups} groups; at most {MAX_GROUPS} are supported")
    if not 0 <= self.comm_sms < 132:
      raise ValueError(f"plan comm_sms={self.comm_sms} must be in [0, 132)")


def even_bands(rows: int, num_groups: int, align: int = ROW_ALIGN) -> tuple:
  """Splits `rows` into at most `num_groups` bands whose boundaries are multiples of `align`."""
  tiles = max(1, math.ceil(rows / align))
  num_groups = max(1, min(num_groups, tiles))
  bounds = [0]
  for g in range(1, num_groups):
    bounds.append(min(rows, (tiles * g // num_groups) * align))
  bounds.append(rows)
  return tuple(sorted(set(bounds)))


def default_plan(collective: str, m: int, n: int, k: int, world_size: int,
                 itemsize: int = 2) -> GroupPlan:
  """Deterministic default plan.

  Heuristic until the cost model lands: about one group per 2 MiB of output per rank block,
  between 1 and 8 groups (small first groups start communication early; many groups pay NCCL
  launch latency).
  """
  blocks = world_size if collective == "reduce_scatter" else 1
  rows = m // blocks
  out_bytes = m * n * itemsize
  groups = int(min(8, max(1, out_bytes // (2 << 20))))
  plan = GroupPlan(collective, rows, even_bands(rows, groups), DEFAULT_COMM_SMS)
  plan.validate()
  return plan
