"""Реестр источников модуля 12 (``data/module_12_sources.csv``): загрузка и выборка по шагу.

Лекция ссылается на «Module_12_Sources»: одна строка CSV — одно утверждение одного шага урока;
столбцы ``SOURCES_COLUMNS`` описаны в ``data/SOURCES.md``.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from course_utils.csv_tables import DATA_DIR, read_exact_csv

SOURCES_COLUMNS = tuple(
    "claim_id lesson_step claim source evidence_class date_checked boundary".split()
)
EVIDENCE_LABELS: Mapping[str, str] = {
    "paper": "статья",
    "official_doc": "официальная документация",
    "code": "код",
    "authors_claim": "заявление авторов",
    "derived": "вывод курса",
}
DEFAULT_PATH = DATA_DIR / "module_12_sources.csv"

_STEP = re.compile(r"^12\.[1-5]\.([1-9]|1[0-3])$")
_LESSON = re.compile(r"^12\.[1-5]$")


def load_sources(path: str | Path | None = None) -> pd.DataFrame:
    """Реестр источников (по умолчанию ``data/module_12_sources.csv``); date_checked — date."""
    path = Path(path) if path is not None else DEFAULT_PATH
    rows = read_exact_csv(path, SOURCES_COLUMNS, "реестр источников")
    frame = pd.DataFrame.from_records([c for _, c in rows], columns=list(SOURCES_COLUMNS))
    frame["date_checked"] = [_dt.date.fromisoformat(d) for d in frame["date_checked"]]
    frame.attrs["source"] = str(path)
    return frame


def sources_for_step(frame: pd.DataFrame, step: str) -> pd.DataFrame:
    """Строки реестра для шага (``"12.2.2"``) или целого урока (``"12.2"``), порядок как в файле."""
    if missing := [c for c in SOURCES_COLUMNS if c not in getattr(frame, "columns", ())]:
        raise ValueError(f"frame: нет столбцов {missing}; передайте таблицу из load_sources()")
    if not isinstance(step, str) or not (_STEP.match(step) or _LESSON.match(step)):
        raise ValueError(
            f"step: ожидается шаг «12.x.y» (например, «12.2.2») или урок «12.x», получено {step!r}"
        )
    steps = frame["lesson_step"].astype(str)
    keep = steps == step if _STEP.match(step) else steps.str.startswith(step + ".")
    return frame[keep].reset_index(drop=True)
