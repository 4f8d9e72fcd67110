"""Таблица событий стадий и диаграмма Ганта к ``tracing`` (уроки 12.1, 12.3).

``_to_frame`` приводит события (DataFrame, ``StageTimer`` или список словарей) к таблице BASE_COLUMNS и
проверяет её; ``gantt`` рисует её: строка на исполнителя, цвет на стадию, подписи по-русски
(``stage_label``, ``worker_label``). Модуль ``tracing`` их реэкспортирует.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from course_utils.plots import LEGEND_RIGHT, finish_axes, get_axes
from course_utils.profile import EXTRA_STAGE_LABELS_RU, STAGE_LABELS_RU, stage_colors

BASE_COLUMNS = ("trace_id", "worker", "stage", "start_s", "end_s", "duration_s")
_REQUIRED = ("worker", "stage", "start_s", "end_s")


def _event_row(i: int, ev: Any) -> dict[str, Any]:
    if not isinstance(ev, Mapping):
        raise ValueError(f"событие №{i} должно быть словарём, получено {type(ev)}")
    if missing := [c for c in _REQUIRED if c not in ev]:
        raise ValueError(f"в событии №{i} нет полей {missing}")
    return {"trace_id": None, **ev, "duration_s": float(ev["end_s"]) - float(ev["start_s"])}


def _events_to_frame(events: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [_event_row(i, ev) for i, ev in enumerate(events)]
    extra = [c for c in dict.fromkeys(k for row in rows for k in row) if c not in BASE_COLUMNS]
    return pd.DataFrame(rows, columns=[*BASE_COLUMNS, *extra])


def _to_frame(data: Any, name: str) -> pd.DataFrame:
    """DataFrame событий из DataFrame, StageTimer или списка словарей; проверяет столбцы."""
    from course_utils.tracing import StageTimer  # tracing импортирует этот модуль

    if isinstance(data, StageTimer):
        frame = data.to_frame()
    elif isinstance(data, pd.DataFrame):
        frame = data
    elif isinstance(data, Iterable) and not isinstance(data, str | bytes | Mapping):
        frame = _events_to_frame(list(data))
    else:
        raise ValueError(
            f"{name} должно быть DataFrame, StageTimer или списком событий-словарей, "
            f"получено {type(data)}"
        )
    if missing := [c for c in _REQUIRED if c not in frame.columns]:
        raise ValueError(f"{name}: нет столбцов {missing}")
    if len(frame) == 0:
        raise ValueError(f"{name}: нет ни одного события")
    times = {c: pd.to_numeric(frame[c], errors="coerce") for c in ("start_s", "end_s")}
    for col, vals in times.items():
        if not np.isfinite(vals).all():  # NaN — не число
            raise ValueError(f"{name}: столбец {col} должен содержать конечные числа секунд")
    if (times["end_s"] < times["start_s"]).any():
        raise ValueError(f"{name}: есть события с end_s < start_s")
    return frame


# Подписи на рисунках по-русски; ключи стадий и имена исполнителей в данных — английские.
_STAGE_LABELS = {**STAGE_LABELS_RU, **EXTRA_STAGE_LABELS_RU}
_WORKER_LABELS = {
    "main": "главный поток",
    "collector": "сборщик",
    "trainer": "тренер",
    "gen": "генератор",
    "generator": "генератор",
    "verifier": "проверяющий",
}


def stage_label(stage: Any) -> str:
    """Русская подпись стадии для рисунка: "decode" → "декодирование"; незнакомая — как есть."""
    return _STAGE_LABELS.get(str(stage), str(stage))


def worker_label(worker: Any) -> str:
    """Русское имя исполнителя «<роль>[-<номер>]»: "collector-3" → "сборщик 3"; иное — как есть."""
    name = str(worker)
    role, sep, number = name.rpartition("-")
    if sep and number.isdigit() and role in _WORKER_LABELS:
        return f"{_WORKER_LABELS[role]} {number}"
    return _WORKER_LABELS.get(name, name)


def _nesting_levels(starts: list[float], ends: list[float]) -> list[int]:
    """Уровень вложенности события: число ранее начатых и ещё открытых событий строки."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))
    levels = [0] * len(starts)
    open_ends: list[float] = []
    for i in order:
        open_ends = [e for e in open_ends if e > starts[i]]
        levels[i] = len(open_ends)
        open_ends.append(ends[i])
    return levels


def gantt(frame_or_events: Any, ax=None, title: str | None = None):
    """Диаграмма Ганта: строка на исполнителя, полоса на событие [start_s, end_s], с.

    Цвет — по стадии (легенда справа, внутри рисунка); вложенные события — поверх более узкими
    полосами; подписи — ``stage_label`` и ``worker_label``. Возвращает matplotlib Axes.
    """
    from matplotlib.patches import Patch

    df = _to_frame(frame_or_events, "frame_or_events").reset_index(drop=True)
    start, end = df["start_s"].astype(float), df["end_s"].astype(float)  # с
    worker, stage = df["worker"].astype(str), df["stage"].astype(str)
    workers, stages = list(pd.unique(worker)), list(pd.unique(stage))
    colors = stage_colors(stages)
    level = pd.Series(0, index=df.index)
    for rows in worker.groupby(worker, sort=False).groups.values():
        level[rows] = _nesting_levels(start[rows].tolist(), end[rows].tolist())
    ax = get_axes(ax, (10, min(1.5 + 0.55 * len(workers), 12.0)))

    row_of = {w: i for i, w in enumerate(workers)}
    for s in stages:
        rows = stage == s
        bars = ax.barh(
            worker[rows].map(row_of).tolist(),
            (end - start)[rows].tolist(),
            left=start[rows].tolist(),
            height=[max(0.8 * (0.7**lv), 0.15) for lv in level[rows]],
            color=colors[s],
            edgecolor="white",
            linewidth=0.5 if len(df) <= 150 else 0.0,
            zorder=2,
        )
        for patch, lv in zip(bars.patches, level[rows]):
            patch.set_zorder(2 + lv)  # вложенные полосы поверх внешних

    ax.set_yticks(range(len(workers)), [worker_label(w) for w in workers])
    ax.set_ylim(len(workers) - 0.5, -0.5)  # первый исполнитель сверху
    legend = [Patch(facecolor=colors[s], label=stage_label(s)) for s in stages]
    return finish_axes(
        ax,
        xlabel="время, с",
        ylabel="исполнитель",
        title=title if title is not None else "Диаграмма Ганта по этапам",
        grid="x",
        legend={
            "handles": legend,
            "title": "этап",
            **LEGEND_RIGHT,
            "borderaxespad": 0.0,
            "fontsize": "small",
            "ncols": 1 if len(stages) <= 16 else 2,
        },
    )
