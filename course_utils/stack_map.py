"""Датированная карта стеков RL для LLM (шаги 12.1.3 и 12.5.4): загрузка, фильтр, рисунок.

Карта — это снимок кода и документации семи стеков на указанные даты, а не рейтинг.
Источник фактов — ``data/stack_map.csv``, описание и порядок обновления — ``data/SOURCES.md``.
Кроме загрузки, фильтра ``supports`` и рисунка модуль даёт ``display_table`` (таблица карты,
выбора или ускорений с русскими заголовками и ячейками), ``choose_stacks`` (выбор по требованиям
шага 12.5.4) и ``load_speedups`` (опубликованные ускорения — заявления авторов).

Словарь осей один на весь курс (карта, упражнения 12.1.7 и 12.5.12, проверка CSV): размещение
``PLACEMENTS`` и синхронность ``SYNCHRONY`` — два режима лекции, «синхронно» и «асинхронно».
«На шаг позади» (one-step-off) — не третий режим, а асинхронный с задержкой ровно 1: он записан
в ``async_variants`` (``ASYNC_VARIANTS``). Соглашения файла: многозначные ячейки разделяются
``|`` (столбцы ``LIST_COLUMNS``); ``placement_synchrony`` — поддержанные *сочетания* осей вида
``disaggregated:async``; элемент с ``?`` на конце исследование не подтвердило, и такой столбец
обязан стоять в ``unconfirmed`` (как и ячейка со значением ``unconfirmed``); ``n/a`` — параметра
у стека нет; ``snapshot_note`` объясняет дату снимка относительно ``LECTURE_SNAPSHOT``.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from course_utils import fmt
from course_utils.csv_tables import read_exact_csv

STACK_MAP_COLUMNS: tuple[str, ...] = (
    "stack",
    "placement",
    "synchrony",
    "async_variants",
    "placement_synchrony",
    "staleness_control_key",
    "staleness_default",
    "generation_engines",
    "training_backends",
    "weight_sync",
    "lora",
    "multi_turn",
    "off_policy_correction",
    "evidence",
    "snapshot_date",
    "snapshot_note",
    "unconfirmed",
)
PLACEMENTS: tuple[str, ...] = ("colocated", "disaggregated")
SYNCHRONY: tuple[str, ...] = ("sync", "async")  # два режима шага 12.1.3 лекции
# Варианты асинхронного режима: «на шаг позади» — задержка ровно 1; очередь — до K версий.
ASYNC_VARIANTS: tuple[str, ...] = ("one_step_off", "queue")
LIST_COLUMNS: tuple[str, ...] = (
    "placement",
    "synchrony",
    "async_variants",
    "placement_synchrony",
    "generation_engines",
    "training_backends",
    "evidence",
    "unconfirmed",
)
LIST_SEP = "|"
UNCONFIRMED_MARK = "?"
UNCONFIRMED_VALUE = "unconfirmed"
NOT_APPLICABLE = "n/a"
SUPPORTED_PREFIX = "да"  # ячейки lora и multi_turn начинаются с «да» или «нет»
# Дата «фактического снимка» лекции модуля 12: от неё считаются возраст строк и пометки.
LECTURE_SNAPSHOT = _dt.date(2026, 8, 6)
STALE_AFTER_DAYS = 180  # строка старше стольких дней на LECTURE_SNAPSHOT помечается

# Русские подписи: заголовки столбцов и значения-коды (одна таблица на карту, выбор и ускорения).
COLUMN_LABELS: Mapping[str, str] = {
    "stack": "стек",
    "placement": "размещение",
    "synchrony": "синхронность",
    "async_variants": "варианты асинхронности",
    "placement_synchrony": "сочетания размещения и синхронности",
    "staleness_control_key": "ключ ограничения задержки",
    "staleness_default": "значение ключа по умолчанию",
    "generation_engines": "движки генерации",
    "training_backends": "бэкенды обучения",
    "weight_sync": "синхронизация весов",
    "lora": "LoRA",
    "multi_turn": "многоходовые роллауты",
    "off_policy_correction": "поправка на данные другой политики",
    "evidence": "источники",
    "snapshot_date": "дата снимка",
    "snapshot_note": "пояснение к дате",
    "unconfirmed": "не подтверждено",
    # choose_stacks
    "matches": "подходит",
    "failed": "не выполнено",
    "age_days": "возраст снимка, дн.",
    # load_speedups
    "claim": "заявление",
    "speedup_low": "ускорение от, раз",
    "speedup_high": "ускорение до, раз",
    "kind": "вид числа",
    "baseline": "с чем сравнивали",
    "setup": "конфигурация",
    "source": "источник",
    "date": "дата заявления",
    "evidence_class": "класс доказательства",
}
VALUE_LABELS: Mapping[str, str] = {
    "colocated": "совместное",
    "disaggregated": "раздельное",
    "sync": "синхронно",
    "async": "асинхронно",
    "one_step_off": "на шаг позади (задержка ровно 1)",
    "queue": "очередь (задержка до K версий)",
    NOT_APPLICABLE: "нет",
    UNCONFIRMED_VALUE: "не подтверждено",
    "range": "диапазон",
    "up_to": "«до X раз»",
    "point": "одно число",
    "approx": "«примерно в X раз»",
}
PLACEMENT_LABELS: Mapping[str, str] = {p: f"{VALUE_LABELS[p]}\n({p})" for p in PLACEMENTS}
SYNCHRONY_LABELS: Mapping[str, str] = {s: f"{VALUE_LABELS[s]}\n({s})" for s in SYNCHRONY}

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "stack_map.csv"

# В этих списках «?» не допускается: значения либо из фиксированного набора,
# либо служебные (источники и имена столбцов).
_NO_MARK_COLUMNS = ("placement", "synchrony", "async_variants", "evidence", "unconfirmed")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ONE_STEP_HINT = (
    "; «на шаг позади» (one_step_off) — вариант асинхронного режима: пишите async, "
    "а one_step_off — в столбец async_variants"
)


class StackMapError(ValueError):
    """Ошибка в файле карты стеков: сообщение называет файл, строку (стек) и столбец."""


def _split(cell: str) -> list[str]:
    if cell == "":
        return []
    return [part.strip() for part in cell.split(LIST_SEP)]


def _strip_mark(value: str) -> tuple[str, bool]:
    """Возвращает (значение без «?», подтверждено ли оно)."""
    if value.endswith(UNCONFIRMED_MARK):
        return value[: -len(UNCONFIRMED_MARK)].rstrip(), False
    return value, True


def _parse_pair(value: str) -> tuple[str, str, bool]:
    bare, confirmed = _strip_mark(value)
    placement, sep, synchrony = bare.partition(":")
    if not sep or placement not in PLACEMENTS or synchrony not in SYNCHRONY:
        raise ValueError(
            f"ожидалось «размещение:синхронность» с размещением из {PLACEMENTS} "
            f"и синхронностью из {SYNCHRONY}, получено {value!r}"
        )
    return placement, synchrony, confirmed


def load_stack_map(path: str | Path | None = None) -> pd.DataFrame:
    """Читает и проверяет карту стеков; по умолчанию ``<репозиторий>/data/stack_map.csv``.

    Возвращает таблицу с одной строкой на стек. Столбцы ``LIST_COLUMNS`` — списки строк
    (элементы с «?» сохраняются как есть), ``snapshot_date`` — ``datetime.date``.
    Любое нарушение формата — ``StackMapError`` (подкласс ``ValueError``) с именем файла,
    стека и столбца.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    rows = read_exact_csv(path, STACK_MAP_COLUMNS, StackMapError, "карта стеков")

    records = []
    seen: dict[str, int] = {}
    for line, cells in rows:
        stack = cells["stack"]
        if not stack:
            raise StackMapError(f"{path}: строка {line}, столбец «stack»: пустое имя стека")
        if stack in seen:
            raise StackMapError(
                f"{path}: строка {line}, столбец «stack»: стек «{stack}» повторяется "
                f"(уже был в строке {seen[stack]})"
            )
        seen[stack] = line
        records.append(_parse_row(cells, path, line))
    frame = pd.DataFrame.from_records(records, columns=list(STACK_MAP_COLUMNS))
    frame.attrs["source"] = str(path)
    return frame


def _parse_row(cells: dict[str, str], path: Path, line: int) -> dict[str, object]:
    stack = cells["stack"]

    def fail(column: str, message: str) -> StackMapError:
        return StackMapError(
            f"{path}: строка {line} (стек «{stack}»), столбец «{column}»: {message}"
        )

    out: dict[str, object] = {}
    for column in STACK_MAP_COLUMNS:
        cell = cells[column]
        if column in LIST_COLUMNS:
            values = _split(cell)
            if any(not v for v in values):
                raise fail(column, f"пустой элемент в списке {cell!r} (разделитель «{LIST_SEP}»)")
            if len(set(values)) != len(values):
                raise fail(column, f"элементы повторяются: {cell!r}")
            if column in _NO_MARK_COLUMNS and any(v.endswith(UNCONFIRMED_MARK) for v in values):
                raise fail(column, f"пометка «{UNCONFIRMED_MARK}» здесь не допускается: {cell!r}")
            if not values and column == "evidence":
                raise fail(column, "пустая ячейка: нужен хотя бы один источник")
            if not values and column != "unconfirmed":
                raise fail(column, "пустая ячейка (если параметра нет, пишите n/a)")
            out[column] = values
        elif column == "snapshot_date":
            if not _ISO_DATE.match(cell):
                raise fail(column, f"ожидается дата ISO ГГГГ-ММ-ДД, получено {cell!r}")
            try:
                out[column] = _dt.date.fromisoformat(cell)
            except ValueError:
                raise fail(column, f"несуществующая дата {cell!r}") from None
        else:
            if not cell:
                raise fail(column, "пустая ячейка (если параметра нет, пишите n/a)")
            out[column] = cell

    for column, allowed in (("placement", PLACEMENTS), ("synchrony", SYNCHRONY)):
        bad = [v for v in out[column] if v not in allowed]
        if bad:
            hint = _ONE_STEP_HINT if column == "synchrony" else ""
            raise fail(column, f"недопустимые значения {bad}; разрешены {allowed}{hint}")

    pairs = []
    for value in out["placement_synchrony"]:
        try:
            pairs.append(_parse_pair(value))
        except ValueError as exc:
            raise fail("placement_synchrony", str(exc)) from None
    confirmed_pairs = [(p, s) for p, s, ok in pairs if ok]
    for column, index in (("placement", 0), ("synchrony", 1)):
        in_pairs = {pair[index] for pair in pairs}
        confirmed = {pair[index] for pair in confirmed_pairs}
        declared = set(out[column])
        if not declared <= in_pairs:
            raise fail(
                "placement_synchrony",
                f"значения {sorted(declared - in_pairs)} из столбца «{column}» "
                "не встречаются ни в одном сочетании",
            )
        if not confirmed <= declared:
            raise fail(
                column,
                f"подтверждённые сочетания используют {sorted(confirmed - declared)}, "
                f"а в столбце «{column}» этого нет",
            )

    if "async" in out["synchrony"]:
        bad = [v for v in out["async_variants"] if v not in ASYNC_VARIANTS]
        if bad:
            raise fail("async_variants", f"недопустимые значения {bad}; разрешены {ASYNC_VARIANTS}")
    elif out["async_variants"] != [NOT_APPLICABLE]:
        raise fail("async_variants", "в столбце synchrony нет async, значит здесь n/a")

    unconfirmed = out["unconfirmed"]
    unknown = [c for c in unconfirmed if c not in STACK_MAP_COLUMNS]
    if unknown:
        raise fail("unconfirmed", f"неизвестные столбцы {unknown}")
    for column in STACK_MAP_COLUMNS:
        value = out[column]
        marked = (
            any(v.endswith(UNCONFIRMED_MARK) or v == UNCONFIRMED_VALUE for v in value)
            if isinstance(value, list)
            else value == UNCONFIRMED_VALUE
        )
        if marked and column not in unconfirmed:
            raise fail(
                "unconfirmed",
                f"в столбце «{column}» есть неподтверждённое значение "
                f"(«{UNCONFIRMED_MARK}» или «{UNCONFIRMED_VALUE}»), но «{column}» "
                "не перечислен в unconfirmed",
            )
    if (
        out["staleness_control_key"] == NOT_APPLICABLE
        and out["staleness_default"] != NOT_APPLICABLE
    ):
        raise fail("staleness_default", "у стека нет ключа устаревания (n/a), значит и здесь n/a")
    for column in ("lora", "multi_turn"):
        if column not in unconfirmed and not out[column].startswith((SUPPORTED_PREFIX, "нет")):
            raise fail(
                column,
                f"ячейка начинается с «{SUPPORTED_PREFIX}» или «нет» (иначе внесите столбец в "
                f"unconfirmed), получено {out[column]!r}",
            )
    return out


def stack_cells(frame: pd.DataFrame, include_unconfirmed: bool = True) -> pd.DataFrame:
    """Длинная таблица сочетаний ``stack, placement, synchrony, confirmed``.

    Одна строка — один стек в одной клетке карты; ``confirmed=False`` — элемент с «?».
    """
    _require_columns(frame, ("stack", "placement_synchrony"))
    rows = []
    for stack, pairs in zip(frame["stack"], frame["placement_synchrony"]):
        for value in pairs:
            placement, synchrony, confirmed = _parse_pair(value)
            if confirmed or include_unconfirmed:
                rows.append((stack, placement, synchrony, confirmed))
    return pd.DataFrame(rows, columns=["stack", "placement", "synchrony", "confirmed"])


def _require_columns(frame: pd.DataFrame, columns: Iterable[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"frame: нет столбцов {missing}; передайте таблицу из load_stack_map()")


def _as_tuple(
    name: str, value: str | Iterable[str] | None, allowed=None, hint: str = ""
) -> tuple[str, ...]:
    if value is None:
        return ()
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise ValueError(f"{name}: ожидается непустая строка или список строк, получено {value!r}")
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: недопустимые значения {bad}; разрешены {allowed}{hint}")
    return values


def supports(
    frame: pd.DataFrame,
    placement: str | Iterable[str] | None = None,
    synchrony: str | Iterable[str] | None = None,
    *,
    include_unconfirmed: bool = False,
    **column_contains: str | Iterable[str],
) -> pd.DataFrame:
    """Стеки карты, удовлетворяющие всем требованиям сразу.

    * ``placement`` / ``synchrony`` — значение или список значений; если заданы оба, стек
      должен поддерживать каждое сочетание (по столбцу ``placement_synchrony``), а не просто
      каждое значение по отдельности; если задана одна ось — по столбцу этой оси;
    * ``столбец="подстрока"`` (или список подстрок — нужны все) — поиск без учёта регистра;
      в списочных столбцах подстрока ищется в элементах, например
      ``training_backends="Megatron"``, ``lora="да"``, ``async_variants="one_step_off"``.

    По умолчанию засчитываются только подтверждённые факты: элементы с «?» и ячейки
    столбцов из ``unconfirmed`` требование не выполняют. ``include_unconfirmed=True``
    засчитывает и их.
    """
    _require_columns(frame, STACK_MAP_COLUMNS)
    placements = _as_tuple("placement", placement, PLACEMENTS)
    synchronies = _as_tuple("synchrony", synchrony, SYNCHRONY, _ONE_STEP_HINT)
    needles: dict[str, tuple[str, ...]] = {}
    for column, value in column_contains.items():
        if column not in STACK_MAP_COLUMNS:
            raise ValueError(
                f"{column}: такого столбца в карте нет; есть {', '.join(STACK_MAP_COLUMNS)}"
            )
        needles[column] = tuple(v.casefold() for v in _as_tuple(column, value))

    keep = []
    for _, row in frame.iterrows():
        pairs = set()
        for value in row["placement_synchrony"]:
            p, s, confirmed = _parse_pair(value)
            if confirmed or include_unconfirmed:
                pairs.add((p, s))
        if placements and synchronies:
            ok = all((p, s) in pairs for p in placements for s in synchronies)
        else:
            # Одна ось: подтверждённые значения столбца, а с include_unconfirmed — ещё и
            # значения из неподтверждённых сочетаний.
            have_p = set(row["placement"]) | (
                {q for q, _ in pairs} if include_unconfirmed else set()
            )
            have_s = set(row["synchrony"]) | (
                {t for _, t in pairs} if include_unconfirmed else set()
            )
            ok = all(p in have_p for p in placements) and all(s in have_s for s in synchronies)
        for column, wanted in needles.items():
            ok = ok and _matches(row, column, wanted, include_unconfirmed)
        keep.append(ok)
    return frame[keep].reset_index(drop=True)


def _matches(
    row: pd.Series, column: str, needles: tuple[str, ...], include_unconfirmed: bool
) -> bool:
    """Есть ли в ячейке каждая из подстрок (без учёта регистра).

    Без ``include_unconfirmed`` элементы списка с «?» не учитываются, а текстовая ячейка
    столбца из ``unconfirmed`` не подходит целиком.
    """
    cell = row[column]
    if isinstance(cell, list):
        texts = []
        for item in cell:
            bare, confirmed = _strip_mark(str(item))
            if confirmed or include_unconfirmed:
                texts.append(bare.casefold())
    else:
        if column in row["unconfirmed"] and not include_unconfirmed:
            return False
        texts = [(cell.isoformat() if isinstance(cell, _dt.date) else str(cell)).casefold()]
    return all(any(needle in text for text in texts) for needle in needles)


def snapshot_relation(date: _dt.date, reference: _dt.date = LECTURE_SNAPSHOT) -> str:
    """Дата снимка относительно ``reference`` (по умолчанию снимок лекции 2026-08-06), по-русски.

    Возраст = reference − date в днях; строка старше ``STALE_AFTER_DAYS`` = 180 дн. помечается.
    """
    if not isinstance(date, _dt.date) or not isinstance(reference, _dt.date):
        raise ValueError(
            f"date, reference: ожидаются datetime.date, получено {date!r}, {reference!r}"
        )
    days = (reference - date).days
    where = f"снимка лекции {reference.isoformat()}"
    if days < 0:
        return f"на {fmt.count(-days, 'день', 'дня', 'дней')} позже {where}"
    if days == 0:
        return f"в день {where}"
    text = f"за {fmt.count(days, 'день', 'дня', 'дней')} до {where}"
    if days > STALE_AFTER_DAYS:
        text += f" — старше {STALE_AFTER_DAYS} дн.: сверьте с текущей версией стека"
    return text


def cell_text(column: str, value: object) -> str:
    """Ячейка карты (или таблиц выбора и ускорений) для студента: коды осей — словами.

    Списки — через «; », «?» — «(не подтверждено)», сочетание ``disaggregated:async`` —
    «раздельное × асинхронно», имена столбцов в ``unconfirmed`` — их русские заголовки,
    ``n/a`` — «нет», даты — ISO, ``True``/``False`` — «да»/«нет».
    """
    if isinstance(value, list):
        return "; ".join(cell_text(column, v) for v in value) or "—"
    if isinstance(value, bool):
        return "да" if value else "нет"
    if isinstance(value, _dt.date):
        return value.isoformat()
    text = str(value)
    bare, confirmed = _strip_mark(text)
    if column == "placement_synchrony" and ":" in bare:
        placement, _, synchrony = bare.partition(":")
        bare = (
            f"{VALUE_LABELS.get(placement, placement)} × {VALUE_LABELS.get(synchrony, synchrony)}"
        )
    elif column == "unconfirmed":
        bare = COLUMN_LABELS.get(bare, bare)
    else:
        bare = VALUE_LABELS.get(bare, bare)
    return bare if confirmed else f"{bare} (не подтверждено)"


def display_table(
    frame: pd.DataFrame,
    columns: Iterable[str] | None = None,
    reference: _dt.date = LECTURE_SNAPSHOT,
) -> pd.DataFrame:
    """Таблица для показа: русские заголовки (``COLUMN_LABELS``) и ячейки (``cell_text``).

    Годится для карты (``load_stack_map``), выбора (``choose_stacks``) и ускорений
    (``load_speedups``); ``columns`` — какие столбцы показать (по умолчанию все). Рядом с
    ``snapshot_date`` добавляется столбец «относительно снимка лекции» (``snapshot_relation``).
    Числа (ускорения, возраст) остаются числами.
    """
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"frame: ожидается таблица pandas, получено {type(frame).__name__}")
    columns = list(frame.columns) if columns is None else list(columns)
    _require_columns(frame, columns)
    out = {}
    for column in columns:
        values = frame[column]
        numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
        label = COLUMN_LABELS.get(column, column)
        out[label] = list(values) if numeric else [cell_text(column, v) for v in values]
        if column == "snapshot_date":
            out[f"относительно снимка лекции {reference.isoformat()}"] = [
                snapshot_relation(d, reference) for d in values
            ]
    return pd.DataFrame(out)


def plot_stack_map(frame: pd.DataFrame, ax=None, reference: _dt.date = LECTURE_SNAPSHOT):
    """Рисует карту «размещение × синхронность» (2×2 клетки) и возвращает ``Axes``.

    В каждой клетке перечислены стеки, поддерживающие это сочетание; «?» — сочетание
    исследование не подтвердило. В заголовке — даты снимков и снимок лекции ``reference``,
    внизу — дата каждого стека с пометкой «позже лекции» или «старше 180 дн.».
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    _require_columns(frame, ("stack", "placement_synchrony", "snapshot_date"))
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 6.6), layout="constrained")
    cells = stack_cells(frame, include_unconfirmed=True)
    stacks = list(frame["stack"])
    colors = plt.get_cmap("tab10").colors
    color_of = {stack: colors[i % len(colors)] for i, stack in enumerate(stacks)}
    n_rows, n_cols = len(PLACEMENTS), len(SYNCHRONY)
    in_cell = cells.groupby(["placement", "synchrony"]).size()
    step = min(0.12, 0.86 / max([*in_cell, 1]))  # шаг строк в долях высоты клетки
    # Кегль по размеру клетки: строка ≈ 1,35 кегля по высоте, буква ≈ 0,75 кегля по ширине.
    # Положение осей до компоновки чуть больше итогового, отсюда запас 0,8.
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    cell_w_pt = 0.8 * box.width * fig_w * 72 / n_cols
    cell_h_pt = 0.8 * box.height * fig_h * 72 / n_rows
    longest = max([len(str(x)) + 1 for x in frame["stack"]] + [1])
    name_size = max(5.0, min(11.0, step * cell_h_pt / 1.35, 0.9 * cell_w_pt / (0.75 * longest)))

    ax.set_xlim(0, n_cols)
    ax.set_ylim(0, n_rows)
    for i, p in enumerate(PLACEMENTS):
        y0 = n_rows - 1 - i  # «совместное» сверху
        for j, s in enumerate(SYNCHRONY):
            shade = "#f7f7f7" if (i + j) % 2 else "white"
            ax.add_patch(Rectangle((j, y0), 1, 1, facecolor=shade, edgecolor="0.55", lw=1.0))
            here = cells[(cells["placement"] == p) & (cells["synchrony"] == s)]
            here = here.assign(order=[stacks.index(x) for x in here["stack"]]).sort_values("order")
            if here.empty:
                ax.text(j + 0.5, y0 + 0.5, "—", ha="center", va="center", color="0.6", fontsize=12)
                continue
            top = y0 + 0.5 + step * (len(here) - 1) / 2
            for k, (stack, confirmed) in enumerate(zip(here["stack"], here["confirmed"])):
                ax.text(
                    j + 0.5,
                    top - k * step,
                    stack if confirmed else f"{stack}?",
                    ha="center",
                    va="center",
                    fontsize=name_size,
                    color=color_of[stack],
                    fontweight="bold" if confirmed else "normal",
                    fontstyle="normal" if confirmed else "italic",
                )
    ax.set_xticks([j + 0.5 for j in range(n_cols)], [SYNCHRONY_LABELS[s] for s in SYNCHRONY])
    ax.set_yticks(
        [n_rows - 1 - i + 0.5 for i in range(n_rows)], [PLACEMENT_LABELS[p] for p in PLACEMENTS]
    )
    ax.tick_params(length=0, labelsize=10)
    ax.set_xlabel("синхронность («на шаг позади» — частный случай асинхронной)", fontsize=11)
    ax.set_ylabel("размещение генерации и обучения", fontsize=11)
    for side in ax.spines.values():
        side.set_visible(False)
    dates = sorted(set(frame["snapshot_date"]))
    span = f"{dates[0].isoformat()} – {dates[-1].isoformat()}" if dates else "нет строк"
    ax.set_title(
        "Карта стеков RL: размещение × синхронность\n"
        f"снимки {span} (снимок лекции {reference.isoformat()})\n"
        "датированный снимок, не рейтинг; «?» — сочетание не подтверждено",
        fontsize=12,
    )
    entries = []
    for stack, date in zip(frame["stack"], frame["snapshot_date"]):
        days = (reference - date).days
        mark = " (позже лекции)" if days < 0 else ""
        mark = f" (старше {STALE_AFTER_DAYS} дн.)" if days > STALE_AFTER_DAYS else mark
        entries.append(f"{stack} {date.isoformat()}{mark}")
    per_stack = "\n".join("   ".join(entries[i : i + 4]) for i in range(0, len(entries), 4))
    ax.annotate(
        f"Даты снимков (возраст — на {reference.isoformat()}):\n{per_stack}",
        xy=(0.5, 0),
        xycoords="axes fraction",
        xytext=(0, -58),
        textcoords="offset points",
        ha="center",
        va="top",
        fontsize=8.5,
        color="0.3",
        linespacing=1.3,
    )
    return ax


# --- выбор стеков по требованиям (шаги 12.5.4 и 12.5.12) ---------------------------

NODES: tuple[str, ...] = ("one", "many")
CHOICE_COLUMNS: tuple[str, ...] = (
    "stack",
    "matches",
    "failed",
    "unconfirmed",
    "snapshot_date",
    "age_days",
)
# Бэкенды обучения, которые сами шардируют состояние между процессами на разных узлах.
SHARDED_BACKENDS: tuple[str, ...] = ("FSDP", "ZeRO", "Megatron")

# Многоузловой запуск: (подтверждён ли, чем). Подтверждением считается только опубликованный
# авторами запуск на заведомо нескольких узлах. Стеков, которых здесь нет, касается вывод
# по ``training_backends`` (см. ``choose_stacks``). Источники — в data/SOURCES.md.
MULTI_NODE_EVIDENCE: Mapping[str, tuple[bool, str]] = {
    "verl": (
        True,
        "опубликованные запуски полностью асинхронного рецепта на 128 GPU H20 "
        "(docs/advance/fully_async.md, снимок b178a3c)",
    ),
    "NeMo RL": (
        True,
        "таблица производительности v0.6: DeepSeek-V3 на 512 H100, Qwen3-235B на 256 H100 "
        "(docs/about/performance-summary.md, снимок 7ea279a)",
    ),
    "PRIME-RL": (
        False,
        "запуск на 28 узлах H200 известен только из стороннего пересказа, "
        "документацией проекта не подтверждён",
    ),
}


def _hits(needle: str, items: Iterable[str]) -> bool:
    """Есть ли подстрока ``needle`` (без учёта регистра) хотя бы в одном элементе."""
    needle = needle.casefold()
    return any(needle in item.casefold() for item in items)


class StackLimit(NamedTuple):
    """Известное ограничение *сочетания* требований у одного стека.

    Оси карты независимы, но отдельные сочетания стек не поддерживает (``kind="fails"``)
    или исследование их не подтвердило (``kind="unconfirmed"``). ``requirements`` — имена
    аргументов ``choose_stacks``; ``violated(req)`` получает словарь всех требований и
    возвращает ``True``, если сочетание задето.
    """

    stack: str
    requirements: tuple[str, ...]
    kind: str
    message: str
    violated: Callable[[Mapping[str, object]], bool]


STACK_LIMITS: tuple[StackLimit, ...] = (
    StackLimit(
        "TRL",
        ("lora", "asynchronous"),
        "unconfirmed",
        "LoRA описан для синхронного GRPOTrainer; в экспериментальном AsyncGRPOTrainer "
        "пути PEFT/LoRA не найдено (снимок f2cd577)",
        lambda r: r["lora"] is True and r["asynchronous"] is True,
    ),
    StackLimit(
        "TRL",
        ("asynchronous", "training_backend"),
        "fails",
        "асинхронный AsyncGRPOTrainer поддерживает только FSDP2, DeepSpeed ZeRO — нет "
        "(docs/source/async_grpo_trainer.md)",
        lambda r: (
            r["asynchronous"] is True
            and r["training_backend"] is not None
            and not _hits(r["training_backend"], ("FSDP2",))
        ),
    ),
    StackLimit(
        "TRL",
        ("asynchronous", "generation_engine"),
        "fails",
        "AsyncGRPOTrainer генерирует через сервер vLLM (vllm>=0.22.0)",
        lambda r: (
            r["asynchronous"] is True
            and r["generation_engine"] is not None
            and not _hits(r["generation_engine"], ("vLLM",))
        ),
    ),
    StackLimit(
        "verl",
        ("asynchronous", "generation_engine"),
        "fails",
        "полностью асинхронный рецепт требует vLLM или SGLang в серверном режиме AgentLoop "
        "(docs/advance/fully_async.md)",
        lambda r: (
            r["asynchronous"] is True
            and r["generation_engine"] is not None
            and not _hits(r["generation_engine"], ("vLLM", "SGLang"))
        ),
    ),
    StackLimit(
        "verl",
        ("lora", "generation_engine"),
        "unconfirmed",
        "синхронизация адаптеров LoRA описана для vLLM; для SGLang документация LoRA пишет "
        "«sglang support coming soon» (docs/advance/ppo_lora.rst)",
        lambda r: (
            r["lora"] is True
            and r["generation_engine"] is not None
            and not _hits(r["generation_engine"], ("vLLM",))
        ),
    ),
    StackLimit(
        "AReaL",
        ("lora", "training_backend"),
        "fails",
        "LoRA есть для FSDP2 и Megatron, для Archon — нет (docs/en/reference/lora.md)",
        lambda r: (
            r["lora"] is True
            and r["training_backend"] is not None
            and not _hits(r["training_backend"], ("Megatron", "FSDP2"))
        ),
    ),
    StackLimit(
        "AReaL",
        ("lora", "training_backend", "generation_engine"),
        "fails",
        "LoRA на Megatron работает только с vLLM (docs/en/reference/lora.md)",
        lambda r: (
            r["lora"] is True
            and r["training_backend"] is not None
            and r["generation_engine"] is not None
            and _hits(r["training_backend"], ("Megatron",))
            and not _hits(r["training_backend"], ("FSDP2",))
            and not _hits(r["generation_engine"], ("vLLM",))
        ),
    ),
)


def _check_flag(name: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name}: ожидается True, False или None, получено {value!r}")


def _check_needle(name: str, value: object) -> None:
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise ValueError(
            f"{name}: ожидается непустая строка (подстрока) или None, получено {value!r}"
        )


def _list_requirement(row, column: str, needle: str, what: str):
    """Подстрока в списочном столбце: ("ok" | "unconfirmed" | "fails", пояснение)."""
    confirmed, marked = [], []
    for item in row[column]:
        bare, ok = _strip_mark(str(item))
        (confirmed if ok else marked).append(bare)
    if _hits(needle, confirmed):
        return "ok", ""
    if _hits(needle, marked):
        found = [f"{m}?" for m in marked if needle.casefold() in m.casefold()]
        return "unconfirmed", f"{what} «{needle}» есть только с пометкой «?»: {', '.join(found)}"
    have = ", ".join(confirmed) if confirmed else "нет"
    return "fails", f"нет {what} «{needle}»; есть: {have}"


def _text_requirement(row, column: str, what: str):
    """Ячейка вида «да (…)»: поддержка подтверждена, не подтверждена или отсутствует."""
    cell = str(row[column])
    if column in row["unconfirmed"] or cell == UNCONFIRMED_VALUE:
        return "unconfirmed", f"ячейка «{COLUMN_LABELS[column]}» не подтверждена: «{cell}»"
    if cell.startswith(SUPPORTED_PREFIX):
        return "ok", ""
    return "fails", f"{what} нет: «{cell}»"


def _synchrony_requirement(row, mode: str):
    if mode in row["synchrony"]:
        return "ok", ""
    marked = [v for v in row["placement_synchrony"] if v.endswith(UNCONFIRMED_MARK)]
    label = VALUE_LABELS[mode]
    if any(_parse_pair(v)[1] == mode for v in marked):
        return "unconfirmed", f"режим «{label}» есть только в неподтверждённых сочетаниях"
    have = ", ".join(f"«{VALUE_LABELS[m]}»" for m in row["synchrony"])
    return "fails", f"нет режима «{label}»; есть: {have}"


def _nodes_requirement(row):
    known = MULTI_NODE_EVIDENCE.get(row["stack"])
    if known is not None:
        confirmed, note = known
        if confirmed:
            return "ok", ""
        return "unconfirmed", f"многоузловой запуск не подтверждён: {note}"
    sharded = [
        b
        for b in row["training_backends"]
        if not b.endswith(UNCONFIRMED_MARK) and any(_hits(n, (b,)) for n in SHARDED_BACKENDS)
    ]
    if sharded:
        return "unconfirmed", (
            "многоузловой RL-запуск стека исследованием не подтверждён; вывод курса: "
            f"бэкенд обучения ({'; '.join(sharded)}) сам шардирует состояние между узлами"
        )
    return "fails", (
        "нет ни опубликованного многоузлового запуска, ни шардирующего бэкенда обучения "
        f"({', '.join(SHARDED_BACKENDS)})"
    )


def choose_stacks(
    frame: pd.DataFrame | None = None,
    *,
    nodes: str | None = None,
    lora: bool | None = None,
    multi_turn: bool | None = None,
    asynchronous: bool | None = None,
    lag_bound: bool | None = None,
    training_backend: str | None = None,
    generation_engine: str | None = None,
    include_unconfirmed: bool = False,
    max_age_days: int | None = None,
    today: _dt.date | None = None,
) -> pd.DataFrame:
    """Выбор стеков по требованиям (шаг 12.5.4): одна строка на стек, порядок как в карте.

    Требования (``None`` — не важно):

    * ``nodes`` — ``"one"`` (один узел: ни один стек карты не требует нескольких, фильтра нет)
      или ``"many"``: подтверждено, если авторы опубликовали запуск на нескольких узлах
      (``MULTI_NODE_EVIDENCE``: verl, NeMo RL); иначе, если в ``training_backends`` есть
      шардирующий бэкенд (``SHARDED_BACKENDS``), — «не подтверждено» (вывод курса, не факт);
    * ``lora`` — ``True``: ячейка ``lora`` начинается с «да» и не помечена в ``unconfirmed``;
      ``False`` (полное обучение) поддерживают все стеки — фильтра нет;
    * ``multi_turn`` — ``True``: так же по ячейке ``multi_turn``; ``False`` — фильтра нет;
    * ``asynchronous`` — ``True``: в ``synchrony`` есть ``async`` (любой вариант, и «на шаг
      позади» тоже); ``False``: есть синхронный режим ``sync``;
    * ``lag_bound`` — ``True``: есть ключ ограничения устаревания (``staleness_control_key``
      не ``n/a``); если не подтверждено значение по умолчанию, это попадает в ``unconfirmed``;
    * ``training_backend`` / ``generation_engine`` — подстрока (без учёта регистра) в элементах
      ``training_backends`` / ``generation_engines``, например ``"Megatron"``, ``"SGLang"``;
    * ``max_age_days`` — снимок строки не старше стольких дней на дату ``today``.

    Известные ограничения *сочетаний* (``STACK_LIMITS``: например, асинхронный тренер TRL
    работает только с FSDP2) проверяются после отдельных требований.

    Столбцы результата (``CHOICE_COLUMNS``): ``matches`` — подходит ли стек; ``failed`` —
    список невыполненных требований по-русски; ``unconfirmed`` — неподтверждённые ячейки,
    на которые опирается ответ; ``snapshot_date`` и ``age_days`` — дата снимка строки и её
    возраст в днях на ``today`` (по умолчанию сегодня). Без ``include_unconfirmed``
    требование, выполненное лишь неподтверждённым фактом, считается невыполненным и стоит
    в обоих списках; с ``include_unconfirmed=True`` — только в ``unconfirmed``.
    """
    if frame is None:
        frame = load_stack_map()
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"frame: ожидается таблица из load_stack_map(), получено {type(frame)}")
    _require_columns(frame, STACK_MAP_COLUMNS)
    if nodes is not None and nodes not in NODES:
        raise ValueError(f"nodes: ожидается одно из {NODES} или None, получено {nodes!r}")
    for name, value in (
        ("lora", lora),
        ("multi_turn", multi_turn),
        ("asynchronous", asynchronous),
        ("lag_bound", lag_bound),
    ):
        _check_flag(name, value)
    if not isinstance(include_unconfirmed, bool):
        raise ValueError(
            f"include_unconfirmed: ожидается True или False, получено {include_unconfirmed!r}"
        )
    _check_needle("training_backend", training_backend)
    _check_needle("generation_engine", generation_engine)
    if max_age_days is not None and (
        isinstance(max_age_days, bool) or not isinstance(max_age_days, int) or max_age_days < 0
    ):
        raise ValueError(
            f"max_age_days: ожидается целое число дней ≥ 0 или None, получено {max_age_days!r}"
        )
    if today is None:
        today = _dt.date.today()
    elif isinstance(today, _dt.datetime):
        today = today.date()
    elif not isinstance(today, _dt.date):
        raise ValueError(f"today: ожидается datetime.date, получено {today!r}")

    req = {
        "nodes": nodes,
        "lora": lora,
        "multi_turn": multi_turn,
        "asynchronous": asynchronous,
        "lag_bound": lag_bound,
        "training_backend": training_backend.strip() if training_backend else None,
        "generation_engine": generation_engine.strip() if generation_engine else None,
    }

    rows = []
    for _, row in frame.iterrows():
        snapshot = row["snapshot_date"]
        age = (today - snapshot).days
        if age < 0:
            raise ValueError(
                f"today: {today.isoformat()} раньше даты снимка стека «{row['stack']}» "
                f"({snapshot.isoformat()})"
            )
        checks = []  # (имя требования, статус, пояснение)
        if nodes == "many":
            checks.append(("nodes", *_nodes_requirement(row)))
        if lora is True:
            checks.append(("lora", *_text_requirement(row, "lora", "LoRA")))
        if multi_turn is True:
            checks.append(
                ("multi_turn", *_text_requirement(row, "multi_turn", "многоходовых роллаутов"))
            )
        if asynchronous is not None:
            mode = "async" if asynchronous else "sync"
            checks.append(("asynchronous", *_synchrony_requirement(row, mode)))
        if lag_bound is True:
            key = row["staleness_control_key"]
            if key == NOT_APPLICABLE:
                checks.append(("lag_bound", "fails", "нет ключа ограничения устаревания (n/a)"))
            elif key == UNCONFIRMED_VALUE or "staleness_control_key" in row["unconfirmed"]:
                checks.append(("lag_bound", "unconfirmed", f"ключ «{key}» не подтверждён"))
            else:
                checks.append(("lag_bound", "ok", ""))
                default = row["staleness_default"]
                if default == UNCONFIRMED_VALUE or "staleness_default" in row["unconfirmed"]:
                    checks.append(
                        (
                            "lag_bound",
                            "note",
                            f"значение ключа «{key}» по умолчанию не подтверждено "
                            f"(ячейка «{COLUMN_LABELS['staleness_default']}»)",
                        )
                    )
        if req["training_backend"] is not None:
            checks.append(
                (
                    "training_backend",
                    *_list_requirement(
                        row, "training_backends", req["training_backend"], "бэкенда обучения"
                    ),
                )
            )
        if req["generation_engine"] is not None:
            checks.append(
                (
                    "generation_engine",
                    *_list_requirement(
                        row, "generation_engines", req["generation_engine"], "движка генерации"
                    ),
                )
            )
        if max_age_days is not None and age > max_age_days:
            checks.append(
                (
                    "max_age_days",
                    "fails",
                    f"снимок {snapshot.isoformat()} старше {max_age_days} дн. (возраст {age} дн.)",
                )
            )
        failed_names = {name for name, status, _ in checks if status == "fails"}
        for limit in STACK_LIMITS:
            if limit.stack != row["stack"] or failed_names & set(limit.requirements):
                continue
            if limit.violated(req):
                checks.append(("+".join(limit.requirements), limit.kind, limit.message))

        failed, unconfirmed = [], []
        for name, status, message in checks:
            if status == "fails":
                failed.append(f"{name}: {message}")
            elif status in ("unconfirmed", "note"):
                unconfirmed.append(f"{name}: {message}")
                if status == "unconfirmed" and not include_unconfirmed:
                    failed.append(
                        f"{name}: {message} (засчитывается только с include_unconfirmed=True)"
                    )
        rows.append((row["stack"], not failed, failed, unconfirmed, snapshot, age))

    result = pd.DataFrame(rows, columns=list(CHOICE_COLUMNS))
    result.attrs["requirements"] = {k: v for k, v in req.items() if v is not None}
    if max_age_days is not None:
        result.attrs["requirements"]["max_age_days"] = max_age_days
    result.attrs["include_unconfirmed"] = include_unconfirmed
    result.attrs["today"] = today
    return result


# --- опубликованные ускорения ------------------------------------------------------

SPEEDUP_COLUMNS: tuple[str, ...] = (
    "stack",
    "claim",
    "speedup_low",
    "speedup_high",
    "kind",
    "baseline",
    "setup",
    "source",
    "date",
    "evidence_class",
)
# range — диапазон авторов; up_to — «до X раз» (верхняя граница); point — одно число;
# approx — качественное «примерно в X раз».
SPEEDUP_KINDS: tuple[str, ...] = ("range", "up_to", "point", "approx")
AUTHORS_CLAIM = "заявление авторов"
SPEEDUPS_PATH = DEFAULT_PATH.parent / "stack_speedups.csv"
# Дата заявления с той точностью, с какой она известна: день, месяц или год.
_PARTIAL_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")


class SpeedupsError(ValueError):
    """Ошибка в таблице ускорений: сообщение называет файл, строку и столбец."""


def _check_partial_date(value: str) -> str | None:
    """Пустая строка, если дата ГГГГ, ГГГГ-ММ или ГГГГ-ММ-ДД корректна, иначе причина."""
    if not _PARTIAL_DATE.match(value):
        return f"ожидается дата ГГГГ-ММ-ДД, ГГГГ-ММ или ГГГГ, получено {value!r}"
    parts = [int(p) for p in value.split("-")]
    try:
        _dt.date(parts[0], parts[1] if len(parts) > 1 else 1, parts[2] if len(parts) > 2 else 1)
    except ValueError:
        return f"несуществующая дата {value!r}"
    return None


def load_speedups(path: str | Path | None = None) -> pd.DataFrame:
    """Читает и проверяет таблицу опубликованных ускорений (по умолчанию ``data/stack_speedups.csv``).

    Каждая строка — заявление авторов (``evidence_class`` = «заявление авторов») о *своей*
    конфигурации: ``baseline`` — с чем сравнивали, ``setup`` — модель, оборудование, задача.
    ``speedup_low`` ≤ ``speedup_high`` — кратность (во сколько раз быстрее базы; меньше 1 —
    медленнее); для ``kind`` ``up_to``, ``point``, ``approx`` они равны. ``date`` — дата
    заявления с известной точностью (строка ГГГГ-ММ-ДД, ГГГГ-ММ или ГГГГ).
    Любое нарушение — ``SpeedupsError`` (подкласс ``ValueError``).
    """
    path = Path(path) if path is not None else SPEEDUPS_PATH
    rows = read_exact_csv(path, SPEEDUP_COLUMNS, SpeedupsError, "таблица ускорений")

    records = []
    for line, cells in rows:

        def fail(column: str, message: str, line=line, cells=cells) -> SpeedupsError:
            return SpeedupsError(
                f"{path}: строка {line} (стек «{cells['stack']}»), столбец «{column}»: {message}"
            )

        for column in SPEEDUP_COLUMNS:
            if not cells[column]:
                raise fail(column, "пустая ячейка")
        out: dict[str, object] = dict(cells)
        for column in ("speedup_low", "speedup_high"):
            try:
                number = float(cells[column].replace(",", "."))
            except ValueError:
                raise fail(
                    column, f"ожидается число (кратность), получено {cells[column]!r}"
                ) from None
            if not (number > 0 and number < float("inf")):
                raise fail(column, f"кратность должна быть положительным числом, получено {number}")
            out[column] = number
        if out["speedup_low"] > out["speedup_high"]:
            raise fail(
                "speedup_low",
                f"нижняя граница {out['speedup_low']} больше верхней {out['speedup_high']}",
            )
        if cells["kind"] not in SPEEDUP_KINDS:
            raise fail(
                "kind", f"недопустимое значение {cells['kind']!r}; разрешены {SPEEDUP_KINDS}"
            )
        if cells["kind"] != "range" and out["speedup_low"] != out["speedup_high"]:
            raise fail(
                "kind",
                f"для «{cells['kind']}» speedup_low и speedup_high должны совпадать",
            )
        problem = _check_partial_date(cells["date"])
        if problem:
            raise fail("date", problem)
        if cells["evidence_class"] != AUTHORS_CLAIM:
            raise fail(
                "evidence_class",
                f"ожидается «{AUTHORS_CLAIM}»: таблица хранит только заявления авторов, "
                f"получено {cells['evidence_class']!r}",
            )
        records.append(out)
    frame = pd.DataFrame.from_records(records, columns=list(SPEEDUP_COLUMNS))
    frame.attrs["source"] = str(path)
    return frame
