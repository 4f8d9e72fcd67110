"""Точки входа для тестов запускателя: all-reduce с замером, ошибка на ранге, зависание.

Модуль вне пакета: ``launch`` добавляет его каталог в PYTHONPATH рангов (как для своего модуля).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from course_utils import atomic
from course_utils.args import choice, integer
from course_utils.multiproc.launcher import local_device
from course_utils.multiproc.transport import device_sync

FAIL_MODES = ("raise", "exit0", "sigkill")


def smoke_allreduce(
    rank: int, world_size: int, backend: str, numel: int = 1024, repeats: int = 5
) -> dict:
    """Проверка связи: all_reduce(SUM) тензора из (rank+1) = Σ_{r=1..W} r = W(W+1)/2; times_s —
    время каждого из repeats all_reduce, с (с синхронизацией CUDA); bytes = numel · 4 (float32)."""
    numel, repeats = integer("numel", numel, 1), integer("repeats", repeats, 1)
    import torch
    import torch.distributed as dist

    device = local_device(backend)
    base = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
    expected = world_size * (world_size + 1) / 2
    times_s = []
    for _ in range(repeats):
        t = base.clone()
        device_sync(device)
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        device_sync(device)
        times_s.append(time.perf_counter() - t0)
        if not bool(torch.all(t == expected)):
            raise RuntimeError(
                f"all_reduce дал неверную сумму на ранге {rank}: ожидалось {expected}, "
                f"получено от {t.min().item()} до {t.max().item()}"
            )
    return {
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "pid": os.getpid(),
        "device": str(device),
        "numel": numel,
        "bytes": numel * 4,
        "value": float(t[0].item()),
        "expected": expected,
        "times_s": times_s,
        "median_s": statistics.median(times_s),
    }


def fail_on_rank(
    rank: int, world_size: int, backend: str, bad_rank: int = 1, mode: str = "raise"
) -> dict:
    """Ранг bad_rank падает (mode: "raise" — RuntimeError, "exit0" — sys.exit(0) без результата,
    "sigkill" — SIGKILL себе, как OOM killer), остальные ждут в barrier, пока их не убьют."""
    bad_rank = integer("bad_rank", bad_rank, 0, world_size - 1)
    mode = choice("mode", mode, FAIL_MODES)
    import torch.distributed as dist

    if rank == bad_rank:
        if mode == "exit0":
            sys.exit(0)
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"намеренная ошибка на ранге {bad_rank}")
    dist.barrier()
    return {"rank": rank, "pid": os.getpid()}


def sleep_forever(rank: int, world_size: int, backend: str, spawn_grandchild: bool = False) -> dict:
    """Спит бесконечно (для таймаута); spawn_grandchild — с «внуком» (COURSE_RUN_DIR в его
    командной строке, pid — в ``COURSE_RUN_DIR/grandchild_<rank>.pid``): убит ли и он."""
    if spawn_grandchild:
        run_dir = os.environ.get("COURSE_RUN_DIR", "")
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)", run_dir],
            stdin=subprocess.DEVNULL,
        )
        if run_dir:
            atomic.write_text(Path(run_dir) / f"grandchild_{rank}.pid", str(child.pid))
    while True:
        time.sleep(1.0)
