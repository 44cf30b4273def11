"""Host-to-device uploads of the small tensors a cycle builds on the host (tree tokens and parents, kept cache rows).

A tensor made from host values on a CUDA device is copied from pageable memory with ``non_blocking=False``:
PyTorch then synchronises the stream after the copy (``memcpy_and_sync``), so the host waits for every kernel
already enqueued, and ``torch.cuda.set_sync_debug_mode`` flags it.  Built in page-locked (pinned) host memory
and copied with ``non_blocking=True``, the copy is only enqueued and the host goes on.  The pinned block comes
from PyTorch's caching host allocator, which records an event on the copy's stream and reuses the block only
after it, so the host tensor may be dropped at once.  Source: PyTorch docs, "CUDA semantics" (Use pinned memory
buffers; asynchronous execution) and ``torch.Tensor.pin_memory``.

On every other device (the CPU) the tensor is made where it is used: no pinning, no copy, the exact tensor
``torch.tensor(values, dtype=dtype, device=device)`` gives.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def upload(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``values`` (a nested sequence of numbers, rectangular) as a tensor of ``dtype`` on ``device``.

    CUDA: made on the host in pinned memory and copied with ``non_blocking=True``: no host sync; kernels that
    read the result are ordered after the copy on the current stream (use it on that stream).  Any other
    device: ``torch.tensor(values, dtype=dtype, device=device)``.

    Args:
        values: e.g. ``[[1, 2, 3], [0, 0, 1]]``; its shape is the tensor's shape.
        dtype: e.g. ``torch.long``.
        device: the device the tensor is used on (a model's device, a cache layer's device).

    Returns:
        the tensor on ``device``.

    Raises:
        ValueError / TypeError: ``values`` is not a rectangular sequence of numbers (as ``torch.tensor``).
        RuntimeError: pinned memory cannot be allocated (CUDA only).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def upload_into(dst: torch.Tensor, values: Sequence) -> torch.Tensor:
    """Copy ``values`` (a flat or nested sequence of numbers of ``dst``'s shape) into the existing tensor ``dst``
    (kept at its address, as a captured CUDA graph reads it): on CUDA from pinned host memory with
    ``non_blocking=True`` (one copy, enqueued on the current stream, no host sync; the caching host allocator keeps
    the pinned block until the copy is done: PyTorch docs, "CUDA semantics"); elsewhere a plain ``copy_``.

    Returns:
        ``dst``.

    Raises:
        RuntimeError: ``values`` has another number of elements than ``dst`` (as ``copy_``).
    """
    host = torch.tensor(values, dtype=dst.dtype).reshape(dst.shape)
    if dst.device.type == "cuda":
        return dst.copy_(host.pin_memory(), non_blocking=True)
    return dst.copy_(host)
