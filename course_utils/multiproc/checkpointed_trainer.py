"""Урок 12.5, уровень C: тренер с контрольными точками, kill -9 и восстановление.

``checkpointed_trainer`` — точка входа ``multiproc.launch`` (один процесс), ``events_from_run_dir``
— его журнал шагов как таблица.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

from course_utils import atomic
from course_utils.args import integer, optional_integer, path
from course_utils.checkpoint import (
    COMPONENTS,
    EVENTS_FILE,
    checkpoint_name,
    latest_checkpoint,
    remove_incomplete,
    resume_full,
    save_checkpoint,
)
from course_utils.multiproc.transport import state_checksum
from course_utils.toy_run import ToyRLRun


def append_event(log: Path, *records: dict) -> None:
    """Дописывает записи строками JSON в конец log и ждёт диска (fsync)."""
    with open(log, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def kill_self_once(run_dir: Path, tag: str) -> None:
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
    """Настоящий процесс ToyRLRun(seed) с контрольными точками в run_dir (один процесс).

    При старте — ``remove_incomplete(run_dir)`` и продолжение с новейшей полной точки
    (``latest_checkpoint(..., components=COMPONENTS)``). Каждый шаг дописывает строку
    {"pid", "event"} в run_dir/events.jsonl (fsync), шаги, кратные checkpoint_every, пишут
    run_dir/step-NNNNNN. kill_at_step=k — SIGKILL себе после шага k (и его точки);
    kill_during_write_at_step=k — SIGKILL посреди записи точки шага k (два файла данных уже
    во временном каталоге, manifest ещё нет). Каждое убийство — один раз на run_dir (метка
    .killed-…), так что тот же вызов при перезапуске доработает до конца.
    """
    if world_size != 1:
        raise ValueError(f"checkpointed_trainer рассчитан на один процесс: world_size={world_size}")
    run_dir_p = path("run_dir", run_dir)
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
    events, written, data_files = [], [], []

    def kill_mid_write(fname: str) -> None:  # SIGKILL после второго файла данных точки
        data_files.append(fname)
        if len(data_files) == 2:
            kill_self_once(run_dir_p, f"write-{kill_write}")

    log = run_dir_p / EVENTS_FILE
    while run.global_step < total_steps:
        event = run.step()
        t = event["step"]
        append_event(log, {"pid": os.getpid(), "event": event})
        events.append(event)
        if t % checkpoint_every == 0:
            target = run_dir_p / checkpoint_name(t)
            hook = kill_mid_write if t == kill_write else None
            save_checkpoint(run.state_dict(), target, run.config, overwrite=True, after_file=hook)
            written.append(target.name)
        if t == kill_at_step:
            kill_self_once(run_dir_p, f"step-{t}")
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


def step_lines(run_dir: str | os.PathLike) -> tuple[dict[int, list[dict]], int, int]:
    """Строки run_dir/events.jsonl по шагам (в порядке записи), число непустых строк, недописанных."""
    log = path("run_dir", run_dir) / EVENTS_FILE
    if not log.is_file():
        raise ValueError(f"в {run_dir} нет журнала {EVENTS_FILE}")
    text = log.read_text(encoding="utf-8", errors="replace")
    lines = [raw for raw in text.splitlines() if raw.strip()]
    by_step: dict[int, list[dict]] = {}
    for raw in lines:
        try:
            rec = json.loads(raw)
            by_step.setdefault(int(rec["event"]["step"]), []).append(rec)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
    n_ok = sum(len(runs) for runs in by_step.values())
    return dict(sorted(by_step.items())), len(lines), len(lines) - n_ok


def events_from_run_dir(run_dir: str | os.PathLike):
    """Журнал run_dir/events.jsonl (pandas): строка на шаг — его последнее вычисление.

    Столбцы: поля события, pid, computations (сколько раз шаг считали). frame.attrs: lines,
    processes (разных pid), recomputed (лишних вычислений), recomputed_steps,
    recomputed_identical (повторы совпали с первым), torn_lines (недописанные строки).
    """
    import pandas as pd

    by_step, n_lines, torn = step_lines(run_dir)
    runs = list(by_step.values())
    again = [step for step, rs in by_step.items() if len(rs) > 1]
    frame = pd.DataFrame(
        [{**rs[-1]["event"], "pid": rs[-1].get("pid"), "computations": len(rs)} for rs in runs]
    )
    frame.attrs.update(
        lines=n_lines,
        processes=len({r.get("pid") for rs in runs for r in rs}),
        recomputed=sum(map(len, runs)) - len(runs),
        recomputed_steps=again,
        recomputed_identical=all(
            r["event"] == by_step[s][0]["event"] for s in again for r in by_step[s]
        ),
        torn_lines=torn,
    )
    return frame
