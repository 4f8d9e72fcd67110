"""Данные курса: корень репозитория, каталог ``data/`` и чтение его маленьких CSV-таблиц со строгой
проверкой столбцов (карта стеков, реестр источников, русские подписи). Только стандартная
библиотека: модули, которые читают подписи при импорте (ранги уровня C), не тянут pandas."""

from __future__ import annotations

import csv
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"


def read_exact_csv(
    path: Path, columns: tuple[str, ...], what: str, error: type[ValueError] = ValueError
) -> list[tuple[int, dict[str, str]]]:
    """Строки CSV в UTF-8 как [(номер строки файла, {столбец: значение без пробелов по краям})].

    Столбцы должны совпасть с ``columns`` ровно и в том же порядке, таблица — быть непустой;
    иначе ``error`` (подкласс ValueError) с именем файла и ``what`` («карта стеков» и т. п.).
    Пустые строки файла пропускаются, недостающие поля строки — пустые. Нет файла —
    FileNotFoundError.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Файл ({what}) не найден: {path}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            found = [c.strip() for c in next(reader, [])]
            rows = [(reader.line_num, row) for row in reader if row]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise error(f"{path}: файл не читается как CSV в UTF-8: {exc}") from None
    if tuple(found) != tuple(columns):
        missing = [c for c in columns if c not in found]
        extra = [c for c in found if c not in columns]
        detail = [f"не хватает столбцов: {', '.join(missing)}"] if missing else []
        detail += [f"лишние столбцы: {', '.join(extra)}"] if extra else []
        detail = detail or [f"порядок столбцов {', '.join(found)} не совпадает с ожидаемым"]
        raise error(f"{path}: {'; '.join(detail)}. Ожидаются ровно: {', '.join(columns)}")
    if not rows:
        raise error(f"{path}: {what}: нет ни одной строки")
    for line, row in rows:
        if len(row) > len(columns):
            raise error(f"{path}, строка {line}: полей {len(row)}, а столбцов {len(columns)}")
    return [
        (line, {c: (row[i].strip() if i < len(row) else "") for i, c in enumerate(columns)})
        for line, row in rows
    ]
