"""Урок 12.5, уровень C: тренер с контрольными точками, kill -9 и восстановление."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

from course_utils import atomic
from course_utils.args import (
    integer,
    optional_integer,
)
from course_utils.checkpoint import (
    COMPONENTS,
    EVENTS_FILE,
    ToyRLRun,
    _path,
    checkpoint_name,
    latest_checkpoint,
    remove_incomplete,
    resume_full,
    save_checkpoint,
)

# ----------------------------------------------------------------------------- уровень C


def _append_event(path: Path, record: dict) -> None:
    line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _kill_self_once(run_dir: Path, tag: str) -> None:
    """kill -9 самого себя, но один раз на run_dir: метка-файл не даёт повторно убить перезапуск."""
    marker = run_dir / f".killed-{tag}"
    if marker.exists():
        return
    atomic.write_synced(marker, str(os.getpid()).encode())
    atomic.fsync_dir(run_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def checkpointed_trainer(
    rank: int,
    world_size: int,
    backend: str,
    run_dir: str,
    total_steps: int = 20,
    checkpoint_every: int = 5,
    seed: int = 0,
    kill_at_step: int | None = None,
    kill_during_write_at_step: int | None = None,
) -> dict:
    """Уровень C: настоящий процесс ToyRLRun(seed) с контрольными точками в run_dir.

    При старте: ``remove_incomplete(run_dir)`` (недописанные временные каталоги удаляются,
    полные копии прерванной замены ставятся на место) и продолжает с
    ``latest_checkpoint(run_dir, components=COMPONENTS)`` — новейшей полной контрольной
    точки, если она есть. Каждый шаг дописывает строку
    {"pid": ..., "event": ...} в run_dir/events.jsonl (fsync), после шагов, кратных
    checkpoint_every, пишет run_dir/step-NNNNNN. kill_at_step=k — после шага k (и его
    контрольной точки, если она положена) процесс посылает себе SIGKILL (kill -9);
    kill_during_write_at_step=k (k кратно checkpoint_every) — SIGKILL посреди записи
    контрольной точки шага k: два файла данных уже во временном каталоге, manifest ещё нет.
    Каждое убийство срабатывает один раз на run_dir (метка .killed-…), так что тот же вызов
    при перезапуске доработает до конца. Для запуска: ``multiproc.launch(
    "course_utils.multiproc.checkpointed_trainer:checkpointed_trainer", 1, args={"run_dir": ...})``; один процесс.
    """
    if world_size != 1:
        raise ValueError(f"checkpointed_trainer рассчитан на один процесс: world_size={world_size}")
    run_dir_p = _path("run_dir", run_dir)
    total_steps = integer("total_steps", total_steps, 1)
    checkpoint_every = integer("checkpoint_every", checkpoint_every, 1)
    kill_at_step = optional_integer("kill_at_step", kill_at_step, 1)
    kill_write = optional_integer("kill_during_write_at_step", kill_during_write_at_step, 1)
    if kill_write is not None and kill_write % checkpoint_every:
        raise ValueError(
            f"kill_during_write_at_step должно быть кратно checkpoint_every: на шаге "
            f"{kill_write} контрольная точка не пишется ({checkpoint_every=})"
        )
    run_dir_p.mkdir(parents=True, exist_ok=True)
    removed = remove_incomplete(run_dir_p)
    run = ToyRLRun(seed)
    resumed_from = None
    ckpt = latest_checkpoint(run_dir_p, components=COMPONENTS)
    if ckpt is not None:  # чужая конфигурация (другой seed) — CheckpointError, а не тихий старт
        run = resume_full(functools.partial(ToyRLRun, seed), ckpt)
        resumed_from = run.global_step
    events, written = [], []
    log = run_dir_p / EVENTS_FILE
    while run.global_step < total_steps:
        event = run.step()
        t = event["step"]
        _append_event(log, {"pid": os.getpid(), "event": event})
        events.append(event)
        if t % checkpoint_every == 0:
            hook = None
            if t == kill_write:
                count = [0]

                def hook(fname: str, count=count, tag=f"write-{t}") -> None:
                    count[0] += 1
                    if count[0] == 2:
                        _kill_self_once(run_dir_p, tag)

            save_checkpoint(
                run.state_dict(),
                run_dir_p / checkpoint_name(t),
                run.config,
                overwrite=True,
                after_file=hook,
            )
            written.append(checkpoint_name(t))
        if t == kill_at_step:
            _kill_self_once(run_dir_p, f"step-{t}")
    from course_utils.multiproc.transport import state_checksum

    return {
        "rank": rank,
        "pid": os.getpid(),
        "resumed_from": resumed_from,
        "removed_temp_dirs": removed,
        "checkpoints_written": written,
        "events": events,
        "final_step": run.global_step,
        "policy_checksum": state_checksum(run.policy),
    }


def events_from_run_dir(run_dir: str | os.PathLike):
    """Журнал run_dir/events.jsonl как таблица pandas: по строке на шаг (последнее событие шага).

    Шаги, пересчитанные после восстановления, встречаются в журнале несколько раз; остаётся
    последнее вычисление. Столбцы: step, поля события, pid, computations (сколько раз шаг
    считали). В frame.attrs: lines, processes (число разных pid), recomputed (сколько лишних
    вычислений), recomputed_steps, recomputed_identical (все повторы совпали с первым
    вычислением), torn_lines (недописанные строки — процесс убит посреди записи).
    """
    import pandas as pd

    path = _path("run_dir", run_dir) / EVENTS_FILE
    if not path.is_file():
        raise ValueError(f"в {run_dir} нет журнала {EVENTS_FILE}")
    by_step: dict[int, list[tuple[int, dict]]] = {}
    torn = lines = 0
    pids = set()
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not raw.strip():
            continue
        lines += 1
        try:
            rec = json.loads(raw)
            ev = rec["event"]
            step = int(ev["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            torn += 1
            continue
        pids.add(rec.get("pid"))
        by_step.setdefault(step, []).append((rec.get("pid"), ev))
    rows, recomputed_steps, identical = [], [], True
    for step in sorted(by_step):
        versions = by_step[step]
        if len(versions) > 1:
            recomputed_steps.append(step)
            identical &= all(ev == versions[0][1] for _, ev in versions[1:])
        pid, ev = versions[-1]
        rows.append({**ev, "pid": pid, "computations": len(versions)})
    frame = pd.DataFrame(rows)
    frame.attrs.update(
        lines=lines,
        processes=len(pids),
        recomputed=sum(len(v) - 1 for v in by_step.values()),
        recomputed_steps=recomputed_steps,
        recomputed_identical=identical,
        torn_lines=torn,
    )
    return frame
