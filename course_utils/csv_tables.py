"""Данные курса: корень репозитория, каталог ``data/`` и чтение его маленьких CSV-таблиц со строгой
проверкой столбцов (карта стеков, реестр источников, русские подписи)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"


def read_exact_csv(
    path: Path, columns: tuple[str, ...], what: str, error: type[ValueError] = ValueError
) -> list[tuple[int, dict[str, str]]]:
    """Строки CSV в UTF-8 как [(номер строки файла, {столбец: значение без пробелов по краям})].

    Столбцы должны совпасть с ``columns`` ровно и в том же порядке, таблица — быть непустой;
    иначе ``error`` (подкласс ValueError) с именем файла и ``what`` («карта стеков» и т. п.).
    Нет файла — FileNotFoundError.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Файл ({what}) не найден: {path}")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise error(f"{path}: файл не читается как CSV в UTF-8: {exc}") from None
    found = [str(c).strip() for c in raw.columns]
    if tuple(found) != tuple(columns):
        missing = [c for c in columns if c not in found]
        extra = [c for c in found if c not in columns]
        detail = [f"не хватает столбцов: {', '.join(missing)}"] if missing else []
        detail += [f"лишние столбцы: {', '.join(extra)}"] if extra else []
        detail = detail or [f"порядок столбцов {', '.join(found)} не совпадает с ожидаемым"]
        raise error(f"{path}: {'; '.join(detail)}. Ожидаются ровно: {', '.join(columns)}")
    if raw.empty:
        raise error(f"{path}: {what}: нет ни одной строки")
    return [
        (line, {c: (v.strip() if isinstance(v, str) else "") for c, v in zip(columns, values)})
        for line, values in zip(range(2, len(raw) + 2), raw.itertuples(index=False, name=None))
    ]
