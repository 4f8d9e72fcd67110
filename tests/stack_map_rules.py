"""Соглашения файлов карты стеков и ускорений (data/SOURCES.md) — проверяются в тестах.

Пакет читает свои файлы данных без этих проверок; здесь каждое правило сообщает файл, строку
(стек) и столбец, чтобы ошибку в data/ было легко найти.
"""

import datetime as dt
import re
from pathlib import Path

from course_utils import stack_map as sm
from course_utils.csv_tables import read_exact_csv

ASYNC_VARIANTS = ("one_step_off", "queue")  # «на шаг позади» — вариант асинхронного режима
SPEEDUP_KINDS = ("range", "up_to", "point", "approx")
AUTHORS_CLAIM = "заявление авторов"
_NA, _UNCONFIRMED = "n/a", "unconfirmed"
_EMPTY = "пустая ячейка (если параметра нет, пишите n/a)"
_NO_MARK_COLUMNS = ("placement", "synchrony", "async_variants", "evidence", "unconfirmed")
_ONE_STEP_HINT = (
    "; «на шаг позади» (one_step_off) — вариант асинхронного режима: пишите async,"
    " а one_step_off — в столбец async_variants"
)


class StackMapError(ValueError):
    """Ошибка в файле карты стеков: сообщение называет файл, строку (стек) и столбец."""


class SpeedupsError(ValueError):
    """Ошибка в таблице ускорений: сообщение называет файл, строку и столбец."""


class _Bad(ValueError):
    """Плохая ячейка: args = (столбец, пояснение)."""


def _parsed(parse, cells, error, where):
    try:
        return parse(cells)
    except _Bad as bad:
        column, message = bad.args
        raise error(f"{where}, столбец «{column}»: {message}") from None


def _disallowed(values, allowed, hint=""):
    bad = [v for v in values if v not in allowed]
    return f"недопустимые значения {bad}; разрешены {allowed}{hint}" if bad else ""


def _date(column, cell, partial=False):
    pattern, form = r"\d{4}-\d{2}-\d{2}", "ISO ГГГГ-ММ-ДД"
    if partial:
        pattern, form = r"\d{4}(-\d{2}(-\d{2})?)?", "ГГГГ-ММ-ДД, ГГГГ-ММ или ГГГГ"
    if not re.fullmatch(pattern, cell):
        raise _Bad(column, f"ожидается дата {form}, получено {cell!r}")
    year, month, day = [*map(int, cell.split("-")), 1, 1][:3]
    try:
        return dt.date(year, month, day)
    except ValueError:
        raise _Bad(column, f"несуществующая дата {cell!r}") from None


def _parse_pair(value):
    bare = value.removesuffix("?").rstrip()
    placement, sep, synchrony = bare.partition(":")
    if not sep or placement not in sm.PLACEMENTS or synchrony not in sm.SYNCHRONY:
        raise _Bad(
            "placement_synchrony", f"ожидалось «размещение:синхронность», получено {value!r}"
        )
    return placement, synchrony, not value.endswith("?")


def check_stack_map(path=sm.DEFAULT_PATH):
    """Проверяет все соглашения карты; StackMapError называет файл, стек и столбец."""
    path, seen = Path(path), {}
    for line, cells in read_exact_csv(path, sm.STACK_MAP_COLUMNS, "карта стеков", StackMapError):
        stack, where = cells["stack"], f"{path}: строка {line}"
        if not stack:
            raise StackMapError(f"{where}, столбец «stack»: пустое имя стека")
        if stack in seen:
            raise StackMapError(f"{where}, столбец «stack»: стек «{stack}» повторяется")
        seen[stack] = line
        _parsed(_check_row, cells, StackMapError, f"{where} (стек «{stack}»)")


def _check_row(cells):
    out = {}
    for column, cell in cells.items():
        if column in sm.LIST_COLUMNS:
            values = [part.strip() for part in cell.split("|")] if cell else []
            if "" in values:
                raise _Bad(column, f"пустой элемент в списке {cell!r} (разделитель «|»)")
            if len(set(values)) != len(values):
                raise _Bad(column, f"элементы повторяются: {cell!r}")
            if column in _NO_MARK_COLUMNS and any(v.endswith("?") for v in values):
                raise _Bad(column, f"пометка «?» здесь не допускается: {cell!r}")
            if not values and column == "evidence":
                raise _Bad(column, "пустая ячейка: нужен хотя бы один источник")
            if not values and column != "unconfirmed":
                raise _Bad(column, _EMPTY)
            out[column] = values
        elif column == "snapshot_date":
            out[column] = _date(column, cell)
        elif not cell:
            raise _Bad(column, _EMPTY)
        else:
            out[column] = cell
    for column, allowed in (("placement", sm.PLACEMENTS), ("synchrony", sm.SYNCHRONY)):
        hint = _ONE_STEP_HINT if column == "synchrony" else ""
        if problem := _disallowed(out[column], allowed, hint):
            raise _Bad(column, problem)
    pairs = [_parse_pair(value) for value in out["placement_synchrony"]]
    for column, index in (("placement", 0), ("synchrony", 1)):
        declared = set(out[column])
        if lost := sorted(declared - {pair[index] for pair in pairs}):
            message = f"значения {lost} из столбца «{column}» не встречаются ни в одном сочетании"
            raise _Bad("placement_synchrony", message)
        if extra := sorted({pair[index] for pair in pairs if pair[2]} - declared):
            raise _Bad(column, f"подтверждённые сочетания используют {extra}, а здесь этого нет")
    is_async = "async" in out["synchrony"]
    if is_async and (problem := _disallowed(out["async_variants"], ASYNC_VARIANTS)):
        raise _Bad("async_variants", problem)
    if not is_async and out["async_variants"] != [_NA]:
        raise _Bad("async_variants", "в столбце synchrony нет async, значит здесь n/a")
    unconfirmed = out["unconfirmed"]
    if unknown := [c for c in unconfirmed if c not in sm.STACK_MAP_COLUMNS]:
        raise _Bad("unconfirmed", f"неизвестные столбцы {unknown}")
    for column, value in out.items():
        items = value if isinstance(value, list) else []
        marked = value == _UNCONFIRMED or any(v.endswith("?") or v == _UNCONFIRMED for v in items)
        if marked and column not in unconfirmed:
            raise _Bad("unconfirmed", f"в «{column}» есть «?» или «unconfirmed», а в списке нет")
    if out["staleness_control_key"] == _NA and out["staleness_default"] != _NA:
        raise _Bad("staleness_default", "у стека нет ключа устаревания (n/a), значит и здесь n/a")
    for column in ("lora", "multi_turn"):
        if column not in unconfirmed and not out[column].startswith((sm.SUPPORTED_PREFIX, "нет")):
            raise _Bad(column, f"ячейка начинается с «да» или «нет», получено {out[column]!r}")


def check_speedups(path=sm.SPEEDUPS_PATH):
    """Проверяет таблицу ускорений; SpeedupsError называет файл, строку и столбец."""
    path = Path(path)
    rows = read_exact_csv(path, sm.SPEEDUP_COLUMNS, "таблица ускорений", SpeedupsError)
    for line, cells in rows:
        where = f"{path}: строка {line} (стек «{cells['stack']}»)"
        _parsed(_check_speedup, cells, SpeedupsError, where)


def _check_speedup(cells):
    if empty := [column for column, cell in cells.items() if not cell]:
        raise _Bad(empty[0], "пустая ячейка")
    bounds = []
    for column in ("speedup_low", "speedup_high"):
        try:
            number = float(cells[column].replace(",", "."))
        except ValueError:
            raise _Bad(column, f"ожидается число (кратность), получено {cells[column]!r}") from None
        if not 0 < number < float("inf"):
            raise _Bad(column, f"кратность должна быть положительным числом, получено {number}")
        bounds.append(number)
    (low, high), kind = bounds, cells["kind"]
    if low > high:
        raise _Bad("speedup_low", f"нижняя граница {low} больше верхней {high}")
    if kind not in SPEEDUP_KINDS:
        raise _Bad("kind", f"недопустимое значение {kind!r}; разрешены {SPEEDUP_KINDS}")
    if kind != "range" and low != high:
        raise _Bad("kind", f"для «{kind}» speedup_low и speedup_high должны совпадать")
    _date("date", cells["date"], partial=True)
    if cells["evidence_class"] != AUTHORS_CLAIM:
        raise _Bad(
            "evidence_class", f"ожидается «{AUTHORS_CLAIM}», получено {cells['evidence_class']!r}"
        )
