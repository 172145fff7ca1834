"""Communicator identity: which NCCL communicator a custom call uses.

One communicator exists per (mesh, collective axes, group of devices along those axes, device).
A custom call carries only `comm_id`, the same on every device of the SPMD program; the FFI
handler looks up (comm_id, its device ordinal) -> that device's communicator in its group
(DESIGN.md, "Communicators"). `comm_id` is a stable hash, so every process computes the same
one without talking to the others.
"""

from __future__ import annotations

import hashlib

import numpy as np


def normalize_axes(axis_name) -> tuple:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def comm_id_for(mesh, axis_name) -> int:
  """Stable non-zero 63-bit id of the communicators of `axis_name` over `mesh`."""
  axes = normalize_axes(axis_name)
  if mesh is None:
    key = repr(("abstract", axes))
  else:
    ids = [int(d.id) for d in np.asarray(mesh.devices).flat]
    key = repr((tuple(mesh.axis_names), tuple(np.asarray(mesh.devices).shape), ids, axes))
  digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
  return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1


def axis_groups(mesh, axis_name) -> list:
  """Device groups that communicate: for each index of the other mesh axes, the devices
  along `axis_name` in rank order (rank = position along the collective axes, row-major)."""
  axes = normalize_axes(axis_name)
  names = list(mesh.axis_names)
  for a in axes:
    if a not in names:
      raise ValueError(f"axis {a!r} is not an axis of the mesh {tuple(names)}")
  devices = np.asarray(mesh.devices)
  order = [names.index(a) for a in names if a not in axes] + [names.index(a) for a in axes]
  moved = np.transpose(devices, order)
  group_size = int(np.prod([devices.shape[names.index(a)] for a in axes]))
  return [list(row) for row in moved.reshape(-1, group_size)]
