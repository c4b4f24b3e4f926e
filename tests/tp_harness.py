"""Several tensor-parallel ranks in one test: local processes joined in one gloo (or NCCL) group."""

from __future__ import annotations

import contextlib
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from eaglelab.engine.core.tp_group import TPError, init_tp


@dataclass(frozen=True)
class RankFailure:
    """What a rank's function raised, as :func:`spawn_ranks` returns it."""

    type_name: str
    message: str
    is_tp_error: bool


def spawn_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                timeout_s: float = 120.0, start_method: str | None = None) -> list[Any]:
    """Run ``fn(tp, *args)`` in ``world_size`` local processes joined in one TP group.

    Returns each rank's result in rank order (results must pickle); a rank whose ``fn`` raised
    gives a :class:`RankFailure`. ``start_method`` defaults to ``fork`` for gloo on Linux while
    CUDA is not initialised here (no re-import of torch per rank), else ``spawn`` (``fn`` must then
    be importable). Ranks still running after ``timeout_s`` are killed and an AssertionError raised.
    """
    import multiprocessing as mp
    import queue
    import socket
    import sys

    if start_method is None:  # CUDA in a forked child is undefined once the parent touched the driver
        start_method = "fork" if backend == "gloo" and sys.platform == "linux" and not torch.cuda.is_initialized() else "spawn"
    if start_method == "fork":  # pay torch's lazy meta-device set-up (seconds) once, not once per rank
        with torch.device("meta"):
            torch.empty(1).normal_()
    ctx = mp.get_context(start_method)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, backend, timeout_s, args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world_size:
            rank, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            out[rank] = pickle.loads(value)
    except queue.Empty:
        raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(out))} gave no result in {timeout_s} s") from None
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world_size)]


def _rank_main(fn, rank, world_size, port, backend, timeout_s, args, results) -> None:
    torch.set_num_threads(1)  # a forked child must not reuse the parent's OpenMP pool; 1 core each anyway
    tp = init_tp(backend, rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}",
                 timeout_s=timeout_s)
    try:
        value = fn(tp, *args)
    except Exception as exc:  # reported to the parent as data, not swallowed
        value = RankFailure(type(exc).__name__, str(exc), isinstance(exc, TPError))
    # by value: through the queue torch would share a tensor's storage by a file descriptor that the parent fetches
    # from this process's resource sharer, gone once this rank exits (CI saw "FileNotFoundError" on its socket)
    results.put((rank, pickle.dumps(value)))
    with contextlib.suppress(RuntimeError):
        tp.close()
