"""Датированная карта стеков RL для LLM (шаги 12.1.3 и 12.5.4): загрузка, фильтр, рисунок.

Карта — это снимок кода и документации семи стеков на указанные даты, а не рейтинг.
Источник фактов — ``data/stack_map.csv``, описание и порядок обновления — ``data/SOURCES.md``.

Соглашения файла:

* многозначные ячейки разделяются ``|``; загрузчик возвращает их списками
  (столбцы ``LIST_COLUMNS``);
* ``placement`` — подтверждённые размещения из ``PLACEMENTS``, ``synchrony`` — подтверждённые
  режимы из ``SYNCHRONY``;
* ``placement_synchrony`` — какие *сочетания* размещения и синхронности стек поддерживает,
  элементы вида ``disaggregated:async``. Оси независимы, но стек не обязан поддерживать
  их декартово произведение: например, асинхронный тренер может требовать раздельных GPU;
* элемент списка с ``?`` на конце (``disaggregated:sync?``) — исследование его не подтвердило;
  такой столбец обязан стоять в ``unconfirmed``;
* ``unconfirmed`` — столбцы строки, значения которых исследование пометило как
  неподтверждённые; ячейка со значением ``unconfirmed`` тоже требует этой пометки;
* ``n/a`` — у стека нет такого параметра.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

STACK_MAP_COLUMNS: tuple[str, ...] = (
    "stack",
    "placement",
    "synchrony",
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
    "unconfirmed",
)
PLACEMENTS: tuple[str, ...] = ("colocated", "disaggregated")
SYNCHRONY: tuple[str, ...] = ("sync", "one_step_off", "async")
LIST_COLUMNS: tuple[str, ...] = (
    "placement",
    "synchrony",
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

PLACEMENT_LABELS: Mapping[str, str] = {
    "colocated": "совместное\n(colocated)",
    "disaggregated": "раздельное\n(disaggregated)",
}
SYNCHRONY_LABELS: Mapping[str, str] = {
    "sync": "синхронно\n(sync)",
    "one_step_off": "на шаг позади\n(one-step-off)",
    "async": "асинхронно\n(async)",
}

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "data" / "stack_map.csv"

# В этих списках «?» не допускается: значения либо из фиксированного набора,
# либо служебные (источники и имена столбцов).
_NO_MARK_COLUMNS = ("placement", "synchrony", "evidence", "unconfirmed")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


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
    if not path.is_file():
        raise FileNotFoundError(f"Файл карты стеков не найден: {path}")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise StackMapError(f"{path}: файл не читается как CSV в UTF-8: {exc}") from None

    columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in STACK_MAP_COLUMNS if c not in columns]
    extra = [c for c in columns if c not in STACK_MAP_COLUMNS]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"не хватает столбцов: {', '.join(missing)}")
        if extra:
            parts.append(f"лишние столбцы: {', '.join(extra)}")
        raise StackMapError(
            f"{path}: {'; '.join(parts)}. Ожидаются ровно: {', '.join(STACK_MAP_COLUMNS)}"
        )
    if tuple(columns) != STACK_MAP_COLUMNS:
        raise StackMapError(
            f"{path}: порядок столбцов {', '.join(columns)} "
            f"не совпадает с ожидаемым: {', '.join(STACK_MAP_COLUMNS)}"
        )
    if raw.empty:
        raise StackMapError(f"{path}: в карте нет ни одной строки (столбец stack пуст)")

    records = []
    seen: dict[str, int] = {}
    for line, row in zip(range(2, len(raw) + 2), raw.itertuples(index=False, name=None)):
        cells = {
            col: value.strip() if isinstance(value, str) else ""
            for col, value in zip(STACK_MAP_COLUMNS, row)
        }
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
            raise fail(column, f"недопустимые значения {bad}; разрешены {allowed}")

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


def _as_tuple(name: str, value: str | Iterable[str] | None, allowed=None) -> tuple[str, ...]:
    if value is None:
        return ()
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise ValueError(f"{name}: ожидается непустая строка или список строк, получено {value!r}")
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: недопустимые значения {bad}; разрешены {allowed}")
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
      ``training_backends="Megatron"``, ``lora="yes"``.

    По умолчанию засчитываются только подтверждённые факты: элементы с «?» и ячейки
    столбцов из ``unconfirmed`` требование не выполняют. ``include_unconfirmed=True``
    засчитывает и их.
    """
    _require_columns(frame, STACK_MAP_COLUMNS)
    placements = _as_tuple("placement", placement, PLACEMENTS)
    synchronies = _as_tuple("synchrony", synchrony, SYNCHRONY)
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


def _dates_caption(frame: pd.DataFrame) -> str:
    dates = sorted(set(frame["snapshot_date"]))
    if not dates:
        return "нет строк"
    if len(dates) == 1:
        return f"снимок {dates[0].isoformat()}"
    return f"снимки от {dates[0].isoformat()} до {dates[-1].isoformat()}"


def plot_stack_map(frame: pd.DataFrame, ax=None):
    """Рисует карту «размещение × синхронность» (2×3 клетки) и возвращает ``Axes``.

    В каждой клетке перечислены стеки, поддерживающие это сочетание; «?» — сочетание
    исследование не подтвердило. В заголовке — даты снимков, внизу — дата каждого стека.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    _require_columns(frame, ("stack", "placement_synchrony", "snapshot_date"))
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 6.6), layout="constrained")
    cells = stack_cells(frame, include_unconfirmed=True)
    stacks = list(frame["stack"])
    colors = plt.get_cmap("tab10").colors
    color_of = {stack: colors[i % len(colors)] for i, stack in enumerate(stacks)}
    n_rows, n_cols = len(PLACEMENTS), len(SYNCHRONY)
    per_cell = max(
        [
            int(((cells["placement"] == p) & (cells["synchrony"] == s)).sum())
            for p in PLACEMENTS
            for s in SYNCHRONY
        ]
        + [1]
    )
    step = min(0.12, 0.86 / per_cell)  # шаг строк в долях высоты клетки
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
            ax.add_patch(
                Rectangle(
                    (j, y0),
                    1,
                    1,
                    facecolor="#f7f7f7" if (i + j) % 2 else "white",
                    edgecolor="0.55",
                    linewidth=1.0,
                )
            )
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
    ax.set_xlabel("синхронность (порядок данных и обновлений)", fontsize=11)
    ax.set_ylabel("размещение (где генерация и обучение)", fontsize=11)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(
        "Карта стеков RL: размещение × синхронность\n"
        f"{_dates_caption(frame)}: датированный снимок, не рейтинг\n"
        "«?» — сочетание не подтверждено исследованием",
        fontsize=12,
    )
    entries = [
        f"{stack} {date.isoformat()}" for stack, date in zip(frame["stack"], frame["snapshot_date"])
    ]
    per_stack = "\n".join("   ".join(entries[i : i + 4]) for i in range(0, len(entries), 4))
    ax.annotate(
        f"Даты снимков:\n{per_stack}",
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
