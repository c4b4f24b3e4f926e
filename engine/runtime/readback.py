"""What the observer reads back of a cycle: one device-to-host copy per cycle, read one cycle later.

Building a cycle's stats needs a few small device tensors on the host (rows still active, accepted
lengths, paths, sibling ranks). Reading each with ``.tolist()`` costs a host sync apiece, and on a
GPU every sync drains the queue of graph replays. Instead the engine packs them into one int64
tensor ``[B, W]`` per cycle (:meth:`Stager.stage`), copied with ``non_blocking=True`` into pinned
host memory behind an event, and builds the stats once the *next* cycle has been launched
(:meth:`Staged.read`), so the host's work on them (stats, events, sinks) overlaps the device's work.

Example: ``stage({"active": done [B] bool, "path": [B, 3]})`` packs ``[B, 4]``; ``read()`` gives
``{"active": [[1], [0]], "path": [[0, 1, -1], [0, 2, 3]]}`` for B = 2.

The other way, :func:`upload` puts a few host ints on the device from pinned memory, queued behind the steps in
flight instead of waiting for them (a served loop's new prompts).

The loop's own stop check reads back the same way (:class:`StepReader`): each step's "done" flags
(and, for a stream, the emitted tokens) copied without blocking, read once the next step is launched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Staged:
    """One cycle's packed tensors on their way to the host."""

    host: torch.Tensor  # [B, W] int64; pinned host memory on CUDA
    columns: dict[str, tuple[int, int]]  # name -> (first column, width)
    ready: torch.cuda.Event | None  # recorded after the copy (None on CPU: nothing in flight)

    def read(self) -> dict[str, list[list[int]]]:
        """Per name, per row, that tensor's values: the cycle's one readback (on CUDA it waits for the
        copy, which a cycle later has long finished)."""
        if self.ready is not None:
            self.ready.synchronize()
        rows = self.host.tolist()
        return {name: [row[a: a + w] for row in rows] for name, (a, w) in self.columns.items()}


class Stager:
    """Packs a cycle's tensors and starts their copy to the host; counts the copies it made."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.copies = 0

    def stage(self, tensors: dict[str, torch.Tensor]) -> Staged:
        """``tensors``: each [B] or [B, k], integer or bool, on the engine's device."""
        columns: dict[str, tuple[int, int]] = {}
        parts, at = [], 0
        for name, t in tensors.items():
            part = t.reshape(t.shape[0], -1).long()  # [B, k]
            columns[name] = (at, part.shape[1])
            parts.append(part)
            at += part.shape[1]
        packed = torch.cat(parts, dim=1)  # [B, W], a snapshot: graph outputs are overwritten next cycle
        self.copies += 1
        if not self.cuda:
            return Staged(packed, columns, None)
        host = torch.empty(packed.shape, dtype=torch.long, pin_memory=True)  # the caching host allocator reuses it
        host.copy_(packed, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return Staged(host, columns, ready)


@dataclass(frozen=True)
class StepView:
    """The host's view of the loop's state after one launched step: "done" [B], and, for a stream,
    "n_out" [B] and "out" [B, W]. Lagged: host copies that ``ready`` marks complete; direct: the
    device tensors themselves (``ready`` None), read at once."""

    tensors: dict[str, torch.Tensor]
    ready: torch.cuda.Event | None

    def read(self) -> dict[str, torch.Tensor]:
        if self.ready is not None:
            self.ready.synchronize()  # waits for this step only: the device is busy with the next one
        return self.tensors

    def all_done(self) -> bool:
        return bool(self.read()["done"].all())


class StepReader:
    """How the generation loop sees each step it launched, to stop and to stream.

    ``lag`` 0 (CPU, and tensor parallelism): the state is read directly after each step. ``lag`` 1
    (CUDA): the state is copied without blocking into one of three host buffers (pinned on CUDA) behind
    an event and read one step later, so the host queues step i+1 while the device runs step i; the
    step launched after the one that finished every row is an extra one, which changes nothing. (The engine
    avoids it where it can: near a speculative run's budget it reads the step in flight before queuing one more.)
    """

    def __init__(self, lag: int, like: dict[str, torch.Tensor]) -> None:
        assert lag in (0, 1), f"stop lag {lag}: the loop reads one step late at most"
        self.lag = lag
        device = next(iter(like.values())).device
        self.cuda = device.type == "cuda"
        # lag + 2 buffers: the step read, the step in flight, and the one just launched (a read step's tokens
        # are streamed after the next launch, so its buffer must outlive that launch's copy)
        self._ring = [{k: torch.empty(v.shape, dtype=v.dtype, pin_memory=self.cuda) for k, v in like.items()}
                      for _ in range(lag + 2 if lag else 0)]
        self._events = [torch.cuda.Event() for _ in self._ring] if self.cuda else []
        self._next = 0

    def view(self, tensors: dict[str, torch.Tensor]) -> StepView:
        """The state after the step just launched (call in launch order)."""
        if not self.lag:
            return StepView(tensors, None)
        i, self._next = self._next, (self._next + 1) % len(self._ring)
        host = self._ring[i]  # its previous view was read before this step was launched
        for name, t in tensors.items():
            host[name].copy_(t, non_blocking=self.cuda)
        if not self.cuda:
            return StepView(host, None)
        self._events[i].record()
        return StepView(host, self._events[i])


def upload(values: list, device: torch.device) -> torch.Tensor:
    """A small int64 tensor of ``values`` on ``device`` without a host sync (from pinned memory on CUDA: a copy from
    pageable memory waits for the steps already queued, which would stall a served loop's lag at every refill)."""
    host = torch.tensor(values, dtype=torch.long)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
