"""Реестр источников модуля 12 (``data/module_12_sources.csv``): загрузка, проверка, выборка.

Лекция ссылается на «Module_12_Sources»: одна строка CSV — одно утверждение одного шага урока.
Столбцы ``SOURCES_COLUMNS``: ``claim_id`` (строчные латинские буквы, цифры, ``-_.``),
``lesson_step`` (``12.<урок>.<шаг>``), ``claim`` (утверждение по-русски), ``source`` (название
и адрес), ``evidence_class`` (из ``EVIDENCE_CLASSES``: статья, официальная документация, код,
заявление авторов, вывод курса), ``date_checked`` (ISO ``ГГГГ-ММ-ДД``, дата прочитанного
снимка), ``boundary`` (чего утверждение *не* говорит).
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from course_utils.csv_tables import read_exact_csv

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
EVIDENCE_CLASSES: tuple[str, ...] = tuple(EVIDENCE_LABELS)
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "module_12_sources.csv"

_STEP = re.compile(r"^12\.[1-5]\.([1-9]|1[0-3])$")
_LESSON = re.compile(r"^12\.[1-5]$")
_CLAIM_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class SourcesError(ValueError):
    """Ошибка в реестре источников: сообщение называет файл, строку и столбец."""


def load_sources(path: str | Path | None = None) -> pd.DataFrame:
    """Читает и проверяет реестр источников (по умолчанию ``data/module_12_sources.csv``).

    Проверяет: ровно столбцы ``SOURCES_COLUMNS`` в этом порядке; непустые ячейки;
    уникальный ``claim_id``; шаг вида ``12.x.y``; класс из ``EVIDENCE_CLASSES``; дату ISO.
    ``date_checked`` возвращается как ``datetime.date``. Любое нарушение — ``SourcesError``
    (подкласс ``ValueError``) с именем файла, номером строки и столбцом.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    rows = read_exact_csv(path, SOURCES_COLUMNS, SourcesError, "реестр источников")

    records = []
    seen: dict[str, int] = {}
    for line, cells in rows:
        where = f"{path}: строка {line}"
        if cells["claim_id"]:
            where += f" (утверждение «{cells['claim_id']}»)"

        def fail(column: str, message: str, where=where) -> SourcesError:
            return SourcesError(f"{where}, столбец «{column}»: {message}")

        for column in SOURCES_COLUMNS:
            if not cells[column]:
                raise fail(column, "пустая ячейка")
        claim_id = cells["claim_id"]
        if not _CLAIM_ID.match(claim_id):
            raise fail(
                "claim_id",
                f"ожидаются строчные латинские буквы, цифры, «-», «_», «.»; получено {claim_id!r}",
            )
        if claim_id in seen:
            raise fail("claim_id", f"«{claim_id}» повторяется (уже был в строке {seen[claim_id]})")
        seen[claim_id] = line
        if not _STEP.match(cells["lesson_step"]):
            raise fail(
                "lesson_step",
                f"ожидается шаг вида 12.<1–5>.<1–13>, например 12.2.2; получено "
                f"{cells['lesson_step']!r}",
            )
        if cells["evidence_class"] not in EVIDENCE_CLASSES:
            raise fail(
                "evidence_class",
                f"недопустимое значение {cells['evidence_class']!r}; разрешены {EVIDENCE_CLASSES}",
            )
        date = cells["date_checked"]
        if not _ISO_DATE.match(date):
            raise fail("date_checked", f"ожидается дата ISO ГГГГ-ММ-ДД, получено {date!r}")
        try:
            checked = _dt.date.fromisoformat(date)
        except ValueError:
            raise fail("date_checked", f"несуществующая дата {date!r}") from None
        records.append({**cells, "date_checked": checked})
    frame = pd.DataFrame.from_records(records, columns=list(SOURCES_COLUMNS))
    frame.attrs["source"] = str(path)
    return frame


def sources_for_step(frame: pd.DataFrame, step: str) -> pd.DataFrame:
    """Строки реестра для шага (``"12.2.2"``) или целого урока (``"12.2"``), порядок как в файле."""
    missing = [c for c in SOURCES_COLUMNS if c not in getattr(frame, "columns", ())]
    if missing:
        raise ValueError(f"frame: нет столбцов {missing}; передайте таблицу из load_sources()")
    if not isinstance(step, str) or not (_STEP.match(step) or _LESSON.match(step)):
        raise ValueError(
            f"step: ожидается шаг «12.x.y» (например, «12.2.2») или урок «12.x», получено {step!r}"
        )
    steps = frame["lesson_step"].astype(str)
    keep = steps == step if _STEP.match(step) else steps.str.startswith(step + ".")
    return frame[keep].reset_index(drop=True)
