"""Замер времени по стадиям, перцентили и диаграмма Ганта (используются во всех уроках).

``StageTimer`` записывает события «стадия началась — закончилась» (секунды от создания таймера)
с идентификатором трассы и именем исполнителя. Перед каждым чтением часов он вызывает ``sync``
(например, ``torch.cuda.synchronize``), иначе асинхронная работа GPU попала бы не в ту стадию.
События превращаются в таблицу pandas (``to_frame``), сводку по стадиям (``stage_summary``)
и диаграмму Ганта (``gantt``: строка на исполнителя, цвет на стадию).

Пример::

    timer = StageTimer(worker="generator", sync=cuda_sync_or_none(device))
    with timer.stage("generate", trace_id="r-17", tokens=128):
        out = model.generate(...)
    print(percentiles(timer.to_frame()["duration_s"]))
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
import numbers
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

BASE_COLUMNS = ("trace_id", "worker", "stage", "start_s", "end_s", "duration_s")

# Единицы оси времени диаграммы Ганта: подпись -> множитель от секунд.
TIME_UNITS = {"с": 1.0, "мс": 1e3, "мкс": 1e6, "мин": 1.0 / 60.0}


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_time(name: str, value: Any) -> float:
    if not _is_real(value) or not math.isfinite(float(value)):
        raise ValueError(f"{name} должно быть конечным числом секунд, получено {value!r}")
    return float(value)


def _check_extra(extra: Mapping[str, Any]) -> None:
    clash = sorted(set(extra) & set(BASE_COLUMNS))
    if clash:
        raise ValueError(
            f"дополнительные поля события не могут называться как основные столбцы {BASE_COLUMNS}: "
            f"{clash}"
        )


class StageTimer:
    """Таймер стадий: событие = (trace_id, worker, stage, start_s, end_s), время в секундах от t0.

    ``t0`` — показание часов ``clock`` при создании таймера. ``sync`` (если задан) вызывается
    перед чтением часов в начале и в конце каждой стадии, чтобы учесть асинхронную работу
    устройства. Стадии можно вкладывать; вложенное время входит и во внешнюю стадию.
    """

    def __init__(
        self,
        worker: str = "main",
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(worker, str) or not worker:
            raise ValueError(f"worker должен быть непустой строкой, получено {worker!r}")
        if sync is not None and not callable(sync):
            raise ValueError(
                f"sync должен быть функцией без аргументов или None, получено {sync!r}"
            )
        if not callable(clock):
            raise ValueError(
                f"clock должен быть функцией, возвращающей секунды, получено {clock!r}"
            )
        self.worker = worker
        self.sync = sync
        self.clock = clock
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._keys: list[int] = []  # порядковый номер начала события: events упорядочены по нему
        self._next_key = 0
        self.t0 = float(clock())

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return float(self.clock()) - self.t0

    def _reserve_key(self) -> int:
        with self._lock:
            key = self._next_key
            self._next_key += 1
            return key

    def _insert(self, key: int, event: dict[str, Any]) -> None:
        with self._lock:
            pos = bisect.bisect_right(self._keys, key)
            self._keys.insert(pos, key)
            self._events.insert(pos, event)

    @contextlib.contextmanager
    def stage(self, name: str, trace_id: str | None = None, **extra: Any) -> Iterator[None]:
        """Замеряет блок ``with``: duration_s = end_s − start_s, секунды (sync до и после).

        Событие записывается и тогда, когда блок завершился исключением: время потрачено.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"name (имя стадии) должно быть непустой строкой, получено {name!r}")
        _check_extra(extra)
        key = self._reserve_key()
        start = self._now()
        try:
            yield
        finally:
            end = self._now()
            event = {"trace_id": trace_id, "worker": self.worker, "stage": name}
            event.update(start_s=start, end_s=end, **extra)
            self._insert(key, event)

    def record(
        self,
        stage: str,
        start_s: float,
        end_s: float,
        trace_id: str | None = None,
        worker: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Добавляет событие, замеренное снаружи (например, в другом процессе); время в секундах.

        start_s и end_s — секунды в той же шкале, что и у таймера (от t0); нужно end_s ≥ start_s.
        """
        if not isinstance(stage, str) or not stage:
            raise ValueError(f"stage (имя стадии) должно быть непустой строкой, получено {stage!r}")
        start = _check_time("start_s", start_s)
        end = _check_time("end_s", end_s)
        if end < start:
            raise ValueError(f"end_s должно быть не меньше start_s: {start_s=}, {end_s=}")
        if worker is not None and (not isinstance(worker, str) or not worker):
            raise ValueError(f"worker должен быть непустой строкой или None, получено {worker!r}")
        _check_extra(extra)
        event = {"trace_id": trace_id, "worker": worker or self.worker, "stage": stage}
        event.update(start_s=start, end_s=end, **extra)
        self._insert(self._reserve_key(), event)
        return event

    @property
    def events(self) -> list[dict[str, Any]]:
        """Список событий (словари) в порядке начала стадий."""
        return self._events

    def __len__(self) -> int:
        return len(self._events)

    def to_frame(self):
        """Таблица событий: trace_id, worker, stage, start_s, end_s, duration_s (с) и доп. поля."""
        return _events_to_frame(self._events)

    def totals(self) -> dict[str, float]:
        """Суммарное время каждой стадии, с: Σ (end_s − start_s), в порядке первого появления.

        Вложенные стадии перекрываются с внешними, поэтому сумма значений может превышать
        время работы.
        """
        out: dict[str, float] = {}
        for ev in self._events:
            out[ev["stage"]] = out.get(ev["stage"], 0.0) + (ev["end_s"] - ev["start_s"])
        return out


def cuda_sync_or_none(device: Any) -> Callable[[], None] | None:
    """Функция синхронизации для ``StageTimer``: torch.cuda.synchronize(device) для CUDA, иначе None.

    device — строка ("cpu", "cuda", "cuda:1"), torch.device или None (тогда None).
    """
    if device is None:
        return None
    import torch

    if not isinstance(device, str | torch.device) or isinstance(device, bool):
        raise ValueError(
            f"device должно быть строкой вроде 'cpu' или 'cuda:0' либо torch.device, "
            f"получено {device!r}"
        )
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: неизвестное устройство {device!r}") from exc
    if dev.type != "cuda":
        return None
    return functools.partial(torch.cuda.synchronize, dev)


def _as_float_list(name: str, values: Any) -> list[float]:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} должно быть последовательностью чисел, получено {type(values)}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"{name} должно содержать только числа, встретилось {v!r}")
        fv = float(v)
        if not math.isfinite(fv):
            raise ValueError(f"{name} должно содержать только конечные числа, встретилось {v!r}")
        out.append(fv)
    return out


def _q_label(q: float) -> str:
    return f"p{q:g}"


def percentiles(values: Iterable[float], qs: Iterable[float] = (50, 95, 99)) -> dict[str, float]:
    """Перцентили с линейной интерполяцией (как numpy.percentile по умолчанию).

    Для отсортированных x_0 ≤ … ≤ x_{n−1}: h = (n − 1)·q/100, p_q = x_⌊h⌋ + (h − ⌊h⌋)·(x_⌈h⌉ − x_⌊h⌋).
    Единицы те же, что у values. Возвращает {"p50": …, "p95": …, "p99": …}; q ∈ [0, 100].
    """
    xs = sorted(_as_float_list("values", values))
    if not xs:
        raise ValueError("values не должно быть пустым: перцентиль пустой выборки не определён")
    if _is_real(qs):
        qs = (qs,)
    q_list = _as_float_list("qs", qs)
    if not q_list:
        raise ValueError("qs не должно быть пустым: укажите хотя бы один уровень из [0, 100]")
    out: dict[str, float] = {}
    n = len(xs)
    for q in q_list:
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"qs: уровень перцентиля должен лежать в [0, 100], получено {q}")
        h = (n - 1) * q / 100.0
        lo = math.floor(h)
        hi = min(lo + 1, n - 1)
        frac = h - lo
        out[_q_label(q)] = xs[lo] + frac * (xs[hi] - xs[lo])
    return out


def _events_to_frame(events: Iterable[Mapping[str, Any]]):
    import pandas as pd

    rows = []
    extra_cols: list[str] = []
    for i, ev in enumerate(events):
        if not isinstance(ev, Mapping):
            raise ValueError(f"событие №{i} должно быть словарём, получено {type(ev)}")
        missing = [c for c in ("worker", "stage", "start_s", "end_s") if c not in ev]
        if missing:
            raise ValueError(f"в событии №{i} нет полей {missing}")
        row = dict(ev)
        row.setdefault("trace_id", None)
        row["duration_s"] = float(ev["end_s"]) - float(ev["start_s"])
        for key in row:
            if key not in BASE_COLUMNS and key not in extra_cols:
                extra_cols.append(key)
        rows.append(row)
    columns = list(BASE_COLUMNS) + extra_cols
    if not rows:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame(rows, columns=columns)


def _to_frame(data: Any, name: str):
    """DataFrame событий из DataFrame, StageTimer или списка словарей; проверяет столбцы."""
    import pandas as pd

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
    missing = [c for c in ("worker", "stage", "start_s", "end_s") if c not in frame.columns]
    if missing:
        raise ValueError(f"{name}: нет столбцов {missing}")
    if len(frame) == 0:
        raise ValueError(f"{name}: нет ни одного события")
    times = {}
    for col in ("start_s", "end_s"):
        vals = pd.to_numeric(frame[col], errors="coerce")
        if vals.isna().any() or not vals.map(math.isfinite).all():
            raise ValueError(f"{name}: столбец {col} должен содержать конечные числа секунд")
        times[col] = vals
    if (times["end_s"] < times["start_s"]).any():
        raise ValueError(f"{name}: есть события с end_s < start_s")
    return frame


def stage_summary(frame: Any):
    """Сводка по стадиям: count, total_s, mean_s, p50_s, p95_s (секунды) и share_pct.

    share_pct = 100 · total_s(стадии) / Σ total_s (%, в сумме 100; при нулевом общем времени NaN).
    Вложенные стадии считаются отдельно, поэтому доли — от суммы времён стадий, а не от времени
    работы. Строки — стадии в порядке первого появления (индекс ``stage``).
    """
    import pandas as pd

    df = _to_frame(frame, "frame")
    durations = df["end_s"].astype(float) - df["start_s"].astype(float)
    rows = []
    for stage_name in pd.unique(df["stage"]):
        d = durations[df["stage"] == stage_name].tolist()
        p = percentiles(d, (50, 95))
        rows.append(
            {
                "stage": stage_name,
                "count": len(d),
                "total_s": math.fsum(d),
                "mean_s": math.fsum(d) / len(d),
                "p50_s": p["p50"],
                "p95_s": p["p95"],
            }
        )
    out = pd.DataFrame(rows).set_index("stage")
    grand = math.fsum(out["total_s"])
    out["share_pct"] = 100.0 * out["total_s"] / grand if grand > 0 else float("nan")
    return out


def _stage_colors(stages: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(stages) <= 10 else "tab20"]
    return {s: cmap(i % cmap.N) for i, s in enumerate(stages)}


def _nesting_levels(starts: list[float], ends: list[float]) -> list[int]:
    """Уровень вложенности события в строке: число ранее начатых и ещё открытых событий."""
    order = sorted(range(len(starts)), key=lambda i: (starts[i], -ends[i]))
    levels = [0] * len(starts)
    open_ends: list[float] = []
    for i in order:
        open_ends = [e for e in open_ends if e > starts[i]]
        levels[i] = len(open_ends)
        open_ends.append(ends[i])
    return levels


def gantt(frame_or_events: Any, ax=None, title: str | None = None, time_unit: str = "с"):
    """Диаграмма Ганта: строка на исполнителя (worker), полоса на событие [start_s, end_s].

    Цвет — по имени стадии (легенда справа); вложенные или одновременные события одного
    исполнителя рисуются поверх более узкими полосами. Ось x — время в единицах time_unit
    ("с", "мс", "мкс", "мин"). Возвращает matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    import pandas as pd
    from matplotlib.patches import Patch

    if time_unit not in TIME_UNITS:
        raise ValueError(
            f"time_unit должно быть одним из {list(TIME_UNITS)}, получено {time_unit!r}"
        )
    if title is not None and not isinstance(title, str):
        raise ValueError(f"title должно быть строкой или None, получено {title!r}")
    df = _to_frame(frame_or_events, "frame_or_events")
    scale = TIME_UNITS[time_unit]
    workers = [str(w) for w in pd.unique(df["worker"].astype(str))]
    stages = [str(s) for s in pd.unique(df["stage"].astype(str))]
    colors = _stage_colors(stages)
    row_of = {w: i for i, w in enumerate(workers)}

    if ax is None:
        height = min(1.5 + 0.55 * len(workers), 12.0)
        _, ax = plt.subplots(figsize=(10, height))

    starts = (df["start_s"].astype(float) * scale).tolist()
    ends = (df["end_s"].astype(float) * scale).tolist()
    worker_col = df["worker"].astype(str).tolist()
    stage_col = df["stage"].astype(str).tolist()
    levels = [0] * len(df)
    for w in workers:
        idx = [i for i, x in enumerate(worker_col) if x == w]
        for i, lv in zip(idx, _nesting_levels([starts[i] for i in idx], [ends[i] for i in idx])):
            levels[i] = lv

    edge = 0.5 if len(df) <= 150 else 0.0
    for s in stages:
        idx = [i for i, x in enumerate(stage_col) if x == s]
        heights = [max(0.8 * (0.7 ** levels[i]), 0.15) for i in idx]
        bars = ax.barh(
            [row_of[worker_col[i]] for i in idx],
            [ends[i] - starts[i] for i in idx],
            left=[starts[i] for i in idx],
            height=heights,
            color=colors[s],
            edgecolor="white",
            linewidth=edge,
            zorder=2,
        )
        for patch, i in zip(bars.patches, idx):
            patch.set_zorder(2 + levels[i])  # вложенные полосы поверх внешних

    ax.set_yticks(range(len(workers)))
    ax.set_yticklabels(workers)
    ax.set_ylim(len(workers) - 0.5, -0.5)  # первый исполнитель сверху
    ax.set_xlabel(f"время, {time_unit}")
    ax.set_ylabel("исполнитель")
    ax.grid(axis="x", linestyle=":", alpha=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.set_title(title if title is not None else "Диаграмма Ганта по стадиям")
    handles = [Patch(facecolor=colors[s], label=s) for s in stages]
    ax.legend(
        handles=handles,
        title="стадия",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize="small",
        ncols=1 if len(stages) <= 16 else 2,
    )
    if ax.figure is not None:
        with contextlib.suppress(Exception):
            ax.figure.tight_layout()
    return ax
