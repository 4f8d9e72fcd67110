"""Датированная карта стеков RL для LLM (шаги 12.1.3, 12.5.4, 12.5.12): загрузка, фильтр, рисунок.

Карта — снимок кода и документации семи стеков на указанные даты, а не рейтинг. Факты — в ``data/``:
``stack_map.csv`` (карта), ``stack_speedups.csv`` (ускорения — заявления авторов),
``stack_limits.csv`` (ограничения сочетаний), ``stack_multi_node.csv`` (многоузловые запуски),
русские подписи — ``stack_map_labels.csv``; формат и источники — ``data/SOURCES.md`` (соблюдение
соглашений проверяют тесты). В ячейках ``|`` разделяет элементы, ``?`` на конце — не подтверждено,
``n/a`` — параметра нет. Осей две: размещение ``PLACEMENTS`` и синхронность ``SYNCHRONY``.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from course_utils import args, fmt
from course_utils.csv_tables import DATA_DIR, read_exact_csv
from course_utils.plots import get_axes

STACK_MAP_COLUMNS: tuple[str, ...] = tuple(
    "stack placement synchrony async_variants placement_synchrony staleness_control_key"
    " staleness_default generation_engines training_backends weight_sync lora multi_turn"
    " off_policy_correction evidence snapshot_date snapshot_note unconfirmed".split()
)
LIST_COLUMNS: tuple[str, ...] = tuple(
    "placement synchrony async_variants placement_synchrony generation_engines"
    " training_backends evidence unconfirmed".split()
)
PLACEMENTS: tuple[str, ...] = ("colocated", "disaggregated")
SYNCHRONY: tuple[str, ...] = ("sync", "async")  # два режима шага 12.1.3 лекции
SUPPORTED_PREFIX = "да"  # ячейки lora и multi_turn начинаются с «да» или «нет»
# Дата «фактического снимка» лекции модуля 12: от неё считаются возраст строк и пометки.
LECTURE_SNAPSHOT = _dt.date(2026, 8, 6)
STALE_AFTER_DAYS = 180  # строка старше стольких дней на LECTURE_SNAPSHOT помечается

DEFAULT_PATH = DATA_DIR / "stack_map.csv"
SPEEDUPS_PATH = DATA_DIR / "stack_speedups.csv"
_NA, _UNCONFIRMED = "n/a", "unconfirmed"
_ONE_STEP_HINT = "; «на шаг позади» (one_step_off) — вариант асинхронного режима: пишите async, а one_step_off — в столбец async_variants"
_ONLY_LOOSE = " (засчитывается только с include_unconfirmed=True)"


def _table(name: str, columns: str, what: str) -> list[dict[str, str]]:
    """Служебная таблица ``data/<name>`` (имена столбцов через пробел) — список строк-словарей."""
    return [row for _, row in read_exact_csv(DATA_DIR / name, tuple(columns.split()), what)]


# Русские подписи: заголовки столбцов и значения-коды (одна таблица на карту, выбор и ускорения).
_LABELS = _table("stack_map_labels.csv", "kind code label", "подписи карты")
COLUMN_LABELS: Mapping[str, str] = {r["code"]: r["label"] for r in _LABELS if r["kind"] == "column"}
VALUE_LABELS: Mapping[str, str] = {r["code"]: r["label"] for r in _LABELS if r["kind"] == "value"}


def _strip_mark(value: str) -> tuple[str, bool]:
    """(значение без «?» на конце, подтверждено ли оно)."""
    return (value[:-1].rstrip(), False) if value.endswith("?") else (value, True)


def _parse_pair(value: str) -> tuple[str, str, bool]:
    """«размещение:синхронность» с возможным «?» → (размещение, синхронность, подтверждено)."""
    bare, confirmed = _strip_mark(value)
    placement, _, synchrony = bare.partition(":")
    return placement, synchrony, confirmed


def load_stack_map(path: str | Path | None = None) -> pd.DataFrame:
    """Карта стеков (по умолчанию ``data/stack_map.csv``): строка на стек, ``STACK_MAP_COLUMNS``.

    Столбцы ``LIST_COLUMNS`` — списки строк (элементы с «?» как есть), ``snapshot_date`` —
    ``datetime.date``.
    """
    rows = read_exact_csv(path or DEFAULT_PATH, STACK_MAP_COLUMNS, "карта стеков")
    records = [
        {
            c: [v.strip() for v in cell.split("|")] if c in LIST_COLUMNS and cell else cell
            for c, cell in cells.items()
        }
        for _, cells in rows
    ]
    frame = pd.DataFrame.from_records(records, columns=list(STACK_MAP_COLUMNS))
    frame["unconfirmed"] = [v or [] for v in frame["unconfirmed"]]
    frame["snapshot_date"] = [_dt.date.fromisoformat(d) for d in frame["snapshot_date"]]
    return frame


def _stack_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Строка на стек в клетке карты: ``stack, placement, synchrony, confirmed`` (False — «?»)."""
    rows = [
        (stack, *_parse_pair(value))
        for stack, pairs in zip(frame["stack"], frame["placement_synchrony"])
        for value in pairs
    ]
    return pd.DataFrame(rows, columns=["stack", "placement", "synchrony", "confirmed"])


def _require_columns(frame: pd.DataFrame, columns: Iterable[str]) -> None:
    if missing := [c for c in columns if c not in frame.columns]:
        raise ValueError(f"frame: нет столбцов {missing}; передайте таблицу из load_stack_map()")


def _as_tuple(name: str, value, allowed=None, hint: str = "") -> tuple[str, ...]:
    """Строка или список непустых строк → кортеж (None → пустой); ``allowed`` — допустимые."""
    if value is None:
        return ()
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise ValueError(f"{name}: ожидается непустая строка или список строк, получено {value!r}")
    if allowed is not None and (bad := [v for v in values if v not in allowed]):
        raise ValueError(f"{name}: недопустимые значения {bad}; разрешены {allowed}{hint}")
    return values


def _hits(needle: str, items: Iterable[str]) -> bool:
    """Есть ли подстрока ``needle`` (без учёта регистра) хотя бы в одном элементе."""
    return any(needle.casefold() in item.casefold() for item in items)


def supports(
    frame: pd.DataFrame,
    placement: str | Iterable[str] | None = None,
    synchrony: str | Iterable[str] | None = None,
    **column_contains: str | Iterable[str],
) -> pd.DataFrame:
    """Стеки карты, удовлетворяющие всем требованиям сразу (факты с «?» не засчитываются).

    Заданы обе оси — нужно каждое сочетание из ``placement_synchrony``, одна ось — значения
    её столбца; ``столбец="подстрока"`` (или список — нужны все) ищется без учёта регистра,
    в списках — в элементах (``training_backends="Megatron"``, ``lora="да"``); столбцы из
    ``unconfirmed`` не засчитываются.
    """
    _require_columns(frame, STACK_MAP_COLUMNS)
    placements = _as_tuple("placement", placement, PLACEMENTS)
    synchronies = _as_tuple("synchrony", synchrony, SYNCHRONY, _ONE_STEP_HINT)
    needles: dict[str, tuple[str, ...]] = {}
    for column, value in column_contains.items():
        if column not in STACK_MAP_COLUMNS:
            message = f"{column}: такого столбца в карте нет; есть {', '.join(STACK_MAP_COLUMNS)}"
            raise ValueError(message)
        needles[column] = _as_tuple(column, value)

    keep = []
    for _, row in frame.iterrows():
        pairs = {(p, s) for p, s, ok in map(_parse_pair, row["placement_synchrony"]) if ok}
        if placements and synchronies:
            ok = set(itertools.product(placements, synchronies)) <= pairs
        else:  # одна ось: значения её столбца
            ok = {*placements, *synchronies} <= {*row["placement"], *row["synchrony"]}
        keep.append(ok and all(_matches(row, c, n) for c, n in needles.items()))
    return frame[keep].reset_index(drop=True)


def _matches(row: pd.Series, column: str, needles: tuple[str, ...]) -> bool:
    """Есть ли в ячейке каждая подстрока; элементы с «?» и столбцы из unconfirmed не в счёт."""
    cell = row[column]
    if isinstance(cell, list):
        texts = [bare for bare, ok in map(_strip_mark, map(str, cell)) if ok]
    elif column in row["unconfirmed"]:
        return False
    else:
        texts = [cell.isoformat() if isinstance(cell, _dt.date) else str(cell)]
    return all(_hits(needle, texts) for needle in needles)


def _snapshot_relation(date: _dt.date) -> str:
    """Дата снимка относительно снимка лекции словами; старше ``STALE_AFTER_DAYS`` — с пометкой."""
    days = (LECTURE_SNAPSHOT - date).days
    where = f"снимка лекции {LECTURE_SNAPSHOT.isoformat()}"
    if days < 0:
        return f"на {fmt.count(-days, 'день', 'дня', 'дней')} позже {where}"
    if days == 0:
        return f"в день {where}"
    text = f"за {fmt.count(days, 'день', 'дня', 'дней')} до {where}"
    if days > STALE_AFTER_DAYS:
        text += f" — старше {STALE_AFTER_DAYS} дн.: сверьте с текущей версией стека"
    return text


def _cell_text(column: str, value: object) -> str:
    """Ячейка карты, выбора или ускорений словами: коды — по-русски, «?» — «(не подтверждено)»."""
    if isinstance(value, list):
        return "; ".join(_cell_text(column, v) for v in value) or "—"
    if isinstance(value, bool):
        return "да" if value else "нет"
    if isinstance(value, _dt.date):
        return value.isoformat()
    bare, confirmed = _strip_mark(str(value))
    if column == "placement_synchrony" and ":" in bare:
        bare = " × ".join(VALUE_LABELS.get(axis, axis) for axis in bare.split(":", 1))
    else:
        bare = (COLUMN_LABELS if column == "unconfirmed" else VALUE_LABELS).get(bare, bare)
    return bare if confirmed else f"{bare} (не подтверждено)"


def display_table(frame: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Таблица для показа: заголовки ``COLUMN_LABELS``, ячейки ``_cell_text``, числа — числами.

    Годится для карты, выбора (``choose_stacks``) и ускорений (``load_speedups``); рядом с
    ``snapshot_date`` — столбец «относительно снимка лекции» (``_snapshot_relation``).
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
        out[label] = list(values) if numeric else [_cell_text(column, v) for v in values]
        if column == "snapshot_date":
            out[f"относительно снимка лекции {LECTURE_SNAPSHOT.isoformat()}"] = [
                _snapshot_relation(d) for d in values
            ]
    return pd.DataFrame(out)


def plot_stack_map(frame: pd.DataFrame, ax=None):
    """Рисует карту «размещение × синхронность» (2×2 клетки со стеками) и возвращает ``Axes``.

    «?» — сочетание не подтверждено; в заголовке — даты снимков и снимок лекции,
    внизу — дата каждого стека с пометкой «позже лекции» или «старше 180 дн.».
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    _require_columns(frame, ("stack", "placement_synchrony", "snapshot_date"))
    ax = get_axes(ax, (10, 6.6), layout="constrained")
    cells = _stack_cells(frame)
    stacks = list(frame["stack"])
    colors = plt.get_cmap("tab10").colors
    n_rows, n_cols = len(PLACEMENTS), len(SYNCHRONY)
    step = min(0.12, 0.86 / max([*cells.groupby(["placement", "synchrony"]).size(), 1]))
    # Кегль по размеру клетки: строка ≈ 1,35 кегля по высоте, буква ≈ 0,75 кегля по ширине.
    # Положение осей до компоновки чуть больше итогового, отсюда запас 0,8.
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    cell_w_pt = 0.8 * box.width * fig_w * 72 / n_cols
    cell_h_pt = 0.8 * box.height * fig_h * 72 / n_rows
    longest = max([len(str(x)) + 1 for x in stacks] + [1])
    name_size = max(5.0, min(11.0, step * cell_h_pt / 1.35, 0.9 * cell_w_pt / (0.75 * longest)))

    ax.set(xlim=(0, n_cols), ylim=(0, n_rows))
    center = {"ha": "center", "va": "center"}
    for (i, p), (j, s) in itertools.product(enumerate(PLACEMENTS), enumerate(SYNCHRONY)):
        y0 = n_rows - 1 - i  # «совместное» сверху
        shade = "#f7f7f7" if (i + j) % 2 else "white"
        ax.add_patch(Rectangle((j, y0), 1, 1, facecolor=shade, edgecolor="0.55", lw=1.0))
        here = cells[(cells["placement"] == p) & (cells["synchrony"] == s)]  # в порядке карты
        if here.empty:
            ax.text(j + 0.5, y0 + 0.5, "—", color="0.6", fontsize=12, **center)
        top = y0 + 0.5 + step * (len(here) - 1) / 2
        for k, (stack, confirmed) in enumerate(zip(here["stack"], here["confirmed"])):
            name = stack if confirmed else f"{stack}?"
            style = {"fontweight": "bold"} if confirmed else {"fontstyle": "italic"}
            color = colors[stacks.index(stack) % len(colors)]
            ax.text(
                j + 0.5, top - k * step, name, fontsize=name_size, color=color, **center, **style
            )
    tick = {code: f"{VALUE_LABELS[code]}\n({code})" for code in (*PLACEMENTS, *SYNCHRONY)}
    ax.set_xticks([j + 0.5 for j in range(n_cols)], [tick[s] for s in SYNCHRONY])
    ax.set_yticks([n_rows - 0.5 - i for i in range(n_rows)], [tick[p] for p in PLACEMENTS])
    ax.tick_params(length=0, labelsize=10)
    ax.set_xlabel("синхронность («на шаг позади» — частный случай асинхронной)", fontsize=11)
    ax.set_ylabel("размещение генерации и обучения", fontsize=11)
    ax.spines[:].set_visible(False)
    dates = sorted(set(frame["snapshot_date"]))
    lecture = LECTURE_SNAPSHOT.isoformat()
    span = f"{dates[0].isoformat()} – {dates[-1].isoformat()}" if dates else "нет строк"
    ax.set_title(
        "Карта стеков RL: размещение × синхронность\n"
        f"снимки {span} (снимок лекции {lecture})\n"
        "датированный снимок, не рейтинг; «?» — сочетание не подтверждено",
        fontsize=12,
    )
    entries = []
    for stack, date in zip(stacks, frame["snapshot_date"]):
        days = (LECTURE_SNAPSHOT - date).days
        mark = " (позже лекции)" if days < 0 else ""
        mark = f" (старше {STALE_AFTER_DAYS} дн.)" if days > STALE_AFTER_DAYS else mark
        entries.append(f"{stack} {date.isoformat()}{mark}")
    per_stack = "\n".join("   ".join(entries[i : i + 4]) for i in range(0, len(entries), 4))
    ax.annotate(
        f"Даты снимков (возраст — на {lecture}):\n{per_stack}",
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

CHOICE_COLUMNS = ("stack", "matches", "failed", "unconfirmed", "snapshot_date", "age_days")
# Бэкенды обучения, которые сами шардируют состояние между процессами на разных узлах.
SHARDED_BACKENDS: tuple[str, ...] = ("FSDP", "ZeRO", "Megatron")
_FLAGS = ("lora", "multi_turn", "asynchronous", "lag_bound")
_NEEDLES = {  # требование-подстрока → (столбец карты, что ищем)
    "training_backend": ("training_backends", "бэкенда обучения"),
    "generation_engine": ("generation_engines", "движка генерации"),
}
_CONDITION = re.compile(rf"({'|'.join((*_FLAGS, *_NEEDLES))})\s*(=|not in|in)\s*(.+)")


class _StackLimit(NamedTuple):
    """Ограничение *сочетания* требований у стека (строка ``data/stack_limits.csv``): kind —
    ``fails`` или ``unconfirmed``; задето, если выполнены все условия ``when`` (требование,
    ``=`` | ``in`` | ``not in``, значения; ``in`` — требование есть подстрокой одного из них)."""

    stack: str
    kind: str
    requirements: tuple[str, ...]
    when: tuple[tuple[str, str, tuple[str, ...]], ...]
    message: str

    def violated(self, req: Mapping[str, object]) -> bool:
        return all(
            str(req[name]) == values[0]
            if op == "="
            else req[name] is not None and _hits(req[name], values) == (op == "in")
            for name, op, values in self.when
        )


def _limit(row: dict[str, str]) -> _StackLimit:
    """Строка ``stack_limits.csv``; ``when``: «lora=True; generation_engine not in vLLM|SGLang»."""
    found = [_CONDITION.fullmatch(c.strip()) for c in row["when"].split(";")]
    if row["kind"] not in ("fails", "unconfirmed") or not all(found):
        raise ValueError(f"stack_limits.csv: не читается kind или when в строке {row}")
    when = tuple((m[1], m[2], tuple(m[3].split("|"))) for m in found)
    names = tuple(dict.fromkeys(name for name, _, _ in when))
    return _StackLimit(row["stack"], row["kind"], names, when, row["message"])


_LIMITS = _table("stack_limits.csv", "stack kind when message", "ограничения сочетаний")
STACK_LIMITS: tuple[_StackLimit, ...] = tuple(map(_limit, _LIMITS))
# Многоузловой запуск: стек → (подтверждён ли, чем); подтверждение — только опубликованный
# авторами запуск на заведомо нескольких узлах, прочих стеков касается вывод по training_backends.
MULTI_NODE_EVIDENCE: Mapping[str, tuple[bool, str]] = {
    r["stack"]: (r["confirmed"] == "да", r["note"])
    for r in _table("stack_multi_node.csv", "stack confirmed note", "многоузловые запуски")
}


def _list_requirement(row, column: str, needle: str, what: str) -> tuple[str, str]:
    """Подстрока в элементах списка: ("ok" | "unconfirmed" | "fails", пояснение)."""
    items = [_strip_mark(str(item)) for item in row[column]]
    confirmed = [bare for bare, ok in items if ok]
    marked = [bare for bare, ok in items if not ok]
    if _hits(needle, confirmed):
        return "ok", ""
    if _hits(needle, marked):
        found = ", ".join(f"{m}?" for m in marked if _hits(needle, [m]))
        return "unconfirmed", f"{what} «{needle}» есть только с пометкой «?»: {found}"
    return "fails", f"нет {what} «{needle}»; есть: {', '.join(confirmed) or 'нет'}"


def _text_requirement(row, column: str, what: str) -> tuple[str, str]:
    """Ячейка вида «да (…)»: поддержка подтверждена, не подтверждена или отсутствует."""
    cell = str(row[column])
    if column in row["unconfirmed"] or cell == _UNCONFIRMED:
        return "unconfirmed", f"ячейка «{COLUMN_LABELS[column]}» не подтверждена: «{cell}»"
    return ("ok", "") if cell.startswith(SUPPORTED_PREFIX) else ("fails", f"{what} нет: «{cell}»")


def _synchrony_requirement(row, mode: str) -> tuple[str, str]:
    label = VALUE_LABELS[mode]
    if mode in row["synchrony"]:
        return "ok", ""
    marked = [v for v in row["placement_synchrony"] if v.endswith("?")]
    if any(_parse_pair(v)[1] == mode for v in marked):
        return "unconfirmed", f"режим «{label}» есть только в неподтверждённых сочетаниях"
    have = ", ".join(f"«{VALUE_LABELS[m]}»" for m in row["synchrony"])
    return "fails", f"нет режима «{label}»; есть: {have}"


def _nodes_requirement(row) -> tuple[str, str]:
    """Опубликованный многоузловой запуск, иначе вывод курса по шардирующему бэкенду обучения."""
    if row["stack"] in MULTI_NODE_EVIDENCE:
        confirmed, note = MULTI_NODE_EVIDENCE[row["stack"]]
        if confirmed:
            return "ok", ""
        return "unconfirmed", f"многоузловой запуск не подтверждён: {note}"
    backends = [b for b in row["training_backends"] if not b.endswith("?")]
    if sharded := [b for b in backends if any(_hits(n, [b]) for n in SHARDED_BACKENDS)]:
        guess = f"многоузловой RL-запуск стека исследованием не подтверждён; вывод курса: бэкенд обучения ({'; '.join(sharded)}) сам шардирует состояние между узлами"
        return "unconfirmed", guess
    none = f"нет ни опубликованного многоузлового запуска, ни шардирующего бэкенда обучения ({', '.join(SHARDED_BACKENDS)})"
    return "fails", none


def _checks(row, req: Mapping[str, object]):
    """(требование, "ok" | "fails" | "unconfirmed" | "note", пояснение) по одной строке карты."""
    if req["nodes"] == "many":
        yield "nodes", *_nodes_requirement(row)
    if req["lora"]:
        yield "lora", *_text_requirement(row, "lora", "LoRA")
    if req["multi_turn"]:
        yield "multi_turn", *_text_requirement(row, "multi_turn", "многоходовых роллаутов")
    if req["asynchronous"] is not None:
        mode = "async" if req["asynchronous"] else "sync"
        yield "asynchronous", *_synchrony_requirement(row, mode)
    key, unconfirmed = row["staleness_control_key"], row["unconfirmed"]
    if req["lag_bound"] and key == _NA:
        yield "lag_bound", "fails", "нет ключа ограничения устаревания (n/a)"
    elif req["lag_bound"] and (key == _UNCONFIRMED or "staleness_control_key" in unconfirmed):
        yield "lag_bound", "unconfirmed", f"ключ «{key}» не подтверждён"
    elif req["lag_bound"]:
        yield "lag_bound", "ok", ""
        if row["staleness_default"] == _UNCONFIRMED or "staleness_default" in unconfirmed:
            label = COLUMN_LABELS["staleness_default"]
            note = f"значение ключа «{key}» по умолчанию не подтверждено (ячейка «{label}»)"
            yield "lag_bound", "note", note
    for name, (column, what) in _NEEDLES.items():
        if req[name] is not None:
            yield name, *_list_requirement(row, column, req[name], what)


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
    """Выбор стеков по требованиям (шаг 12.5.4): строка на стек, порядок карты, ``CHOICE_COLUMNS``.

    ``None`` — требование не важно: ``nodes`` ("one" | "many"), флаги ``lora``, ``multi_turn``,
    ``asynchronous``, ``lag_bound``, подстроки ``training_backend`` / ``generation_engine``,
    ``max_age_days``; затем ограничения сочетаний ``STACK_LIMITS`` (правила — data/SOURCES.md).
    ``age_days`` = today − snapshot_date, дни (``today`` по умолчанию — сегодня). Требование,
    выполненное лишь неподтверждённым фактом, стоит в ``unconfirmed``, а без
    ``include_unconfirmed`` — ещё и в ``failed``.
    """
    frame = load_stack_map() if frame is None else frame
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"frame: ожидается таблица из load_stack_map(), получено {type(frame)}")
    _require_columns(frame, STACK_MAP_COLUMNS)
    args.choice("nodes", nodes, (None, "one", "many"))
    flags = dict(zip(_FLAGS, (lora, multi_turn, asynchronous, lag_bound)))
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{name}: ожидается True, False или None, получено {value!r}")
    args.flag("include_unconfirmed", include_unconfirmed)
    needles = dict(zip(_NEEDLES, (training_backend, generation_engine)))
    needles = {k: v if v is None else args.text(k, v).strip() for k, v in needles.items()}
    max_age_days = args.optional_integer("max_age_days", max_age_days, 0)
    today = _dt.date.today() if today is None else today
    if not isinstance(today, _dt.date):
        raise ValueError(f"today: ожидается datetime.date, получено {today!r}")
    today = today.date() if isinstance(today, _dt.datetime) else today
    req = {"nodes": nodes, **flags, **needles}

    rows = []
    for _, row in frame.iterrows():
        snapshot = row["snapshot_date"]
        age = (today - snapshot).days
        if age < 0:
            message = f"today: {today.isoformat()} раньше даты снимка стека «{row['stack']}» ({snapshot.isoformat()})"
            raise ValueError(message)
        checks = list(_checks(row, req))
        if max_age_days is not None and age > max_age_days:
            too_old = f"снимок {snapshot.isoformat()} старше {max_age_days} дн. (возраст {age} дн.)"
            checks.append(("max_age_days", "fails", too_old))
        failed_names = {name for name, status, _ in checks if status == "fails"}
        checks += [
            ("+".join(limit.requirements), limit.kind, limit.message)
            for limit in STACK_LIMITS
            if limit.stack == row["stack"]
            and not failed_names & set(limit.requirements)
            and limit.violated(req)
        ]
        failed = [
            f"{name}: {message}" + ("" if status == "fails" else _ONLY_LOOSE)
            for name, status, message in checks
            if status == "fails" or (status == "unconfirmed" and not include_unconfirmed)
        ]
        unconfirmed = [f"{n}: {m}" for n, s, m in checks if s in ("unconfirmed", "note")]
        rows.append((row["stack"], not failed, failed, unconfirmed, snapshot, age))

    result = pd.DataFrame(rows, columns=list(CHOICE_COLUMNS))
    result.attrs.update(include_unconfirmed=include_unconfirmed, today=today)
    return result


# --- опубликованные ускорения ------------------------------------------------------

SPEEDUP_COLUMNS: tuple[str, ...] = tuple(
    "stack claim speedup_low speedup_high kind baseline setup source date evidence_class".split()
)


def load_speedups(path: str | Path | None = None) -> pd.DataFrame:
    """Опубликованные ускорения (по умолчанию ``data/stack_speedups.csv``) — заявления авторов.

    Кратность ``speedup_low`` ≤ ``speedup_high``, раз (float): во сколько быстрее базы ``baseline``
    (меньше 1 — медленнее); ``kind``: range — диапазон, up_to — «до X раз», point — одно число,
    approx — «примерно в X раз»; ``date`` — строка ГГГГ-ММ-ДД, ГГГГ-ММ или ГГГГ.
    """
    rows = read_exact_csv(path or SPEEDUPS_PATH, SPEEDUP_COLUMNS, "таблица ускорений")
    frame = pd.DataFrame.from_records([cells for _, cells in rows], columns=list(SPEEDUP_COLUMNS))
    for column in ("speedup_low", "speedup_high"):
        frame[column] = frame[column].str.replace(",", ".").astype(float)
    return frame
