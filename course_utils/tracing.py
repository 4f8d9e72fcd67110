"""Замер времени по стадиям, перцентили и диаграмма Ганта (используются во всех уроках).

``StageTimer`` записывает события «стадия началась — закончилась» (секунды от создания таймера)
с идентификатором трассы и именем исполнителя. Перед каждым чтением часов он вызывает ``sync``
(например, ``torch.cuda.synchronize``), иначе асинхронная работа GPU попала бы не в ту стадию.
События превращаются в таблицу pandas (``to_frame``), сводку по стадиям (``stage_summary``)
и диаграмму Ганта (``gantt``: строка на исполнителя, цвет на стадию).

Цепочка трассировки (урок 12.5.2, ``TRACE_CHAIN``): запрос → роллаут → версия поведения → версия
верификатора → пакет → шаг оптимизатора → версия после шага. ``trace_from_loop`` и
``trace_from_simulation`` строят таблицы ``TraceTables``; ``full_chain``, ``chain_for_rollout`` и
``rollouts_for_step`` соединяют их в обе стороны; ``find_orphans``, ``verifier_mismatches`` и
``check_chain`` ищут разрывы; ``dashboard`` сводит метрики по группам ``METRIC_GROUPS``.

Пример::

    timer = StageTimer(worker="generator", sync=cuda_sync_or_none(device))
    with timer.stage("generate", trace_id="r-17", tokens=128):
        out = model.generate(...)
    print(percentiles(timer.to_frame()["duration_s"]))
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import math
import numbers
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from course_utils.args import is_number, text
from course_utils.arith_task import is_informative_group, scalar_reward
from course_utils.profile import STAGE_LABELS_RU as _LOOP_STAGE_LABELS, stage_colors

BASE_COLUMNS = ("trace_id", "worker", "stage", "start_s", "end_s", "duration_s")

# Единицы оси времени диаграммы Ганта: подпись -> множитель от секунд.
TIME_UNITS = {"с": 1.0, "мс": 1e3, "мкс": 1e6, "мин": 1.0 / 60.0}


def _check_time(name: str, value: Any) -> float:
    if not is_number(value) or not math.isfinite(float(value)):
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
        worker = text("worker", worker)
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
        name = text("name (имя этапа)", name)
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
        stage = text("stage (имя этапа)", stage)
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
    if is_number(qs):
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


# Подписи для студента: ключи стадий и имена исполнителей в коде остаются английскими
# (их используют таблицы и тесты), на рисунках и в легендах — русские подписи.
STAGE_LABELS_RU: dict[str, str] = {
    **_LOOP_STAGE_LABELS,
    "queue_wait": "ожидание пакета",
    "backpressure": "обратное давление",
    "verifier": "проверка ответа",
    "checkpoint": "контрольная точка",
}
WORKER_LABELS_RU = {
    "main": "главный поток",
    "collector": "сборщик",
    "trainer": "тренер",
    "gen": "генератор",
    "generator": "генератор",
    "verifier": "проверяющий",
}


def stage_label(stage: Any) -> str:
    """Русская подпись стадии для рисунка: "decode" → "декодирование"; незнакомая — как есть."""
    return STAGE_LABELS_RU.get(str(stage), str(stage))


def worker_label(worker: Any) -> str:
    """Русское имя исполнителя: "collector-3" → "сборщик 3", "main" → "главный поток".

    Имя вида «<роль>-<номер>» или «<роль>» с ролью из ``WORKER_LABELS_RU``; остальное — как есть.
    """
    name = str(worker)
    role, sep, number = name.rpartition("-")
    if sep and number.isdigit() and role in WORKER_LABELS_RU:
        return f"{WORKER_LABELS_RU[role]} {number}"
    return WORKER_LABELS_RU.get(name, name)


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

    Цвет — по имени стадии (легенда справа от осей, внутри рисунка); вложенные или
    одновременные события одного исполнителя рисуются поверх более узкими полосами. Ось x —
    время в единицах time_unit ("с", "мс", "мкс", "мин"). Подписи по-русски: стадии —
    ``stage_label``, исполнители — ``worker_label``. Возвращает matplotlib Axes.
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
    colors = stage_colors(stages)
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
    ax.set_yticklabels([worker_label(w) for w in workers])
    ax.set_ylim(len(workers) - 0.5, -0.5)  # первый исполнитель сверху
    ax.set_xlabel(f"время, {time_unit}")
    ax.set_ylabel("исполнитель")
    ax.grid(axis="x", linestyle=":", alpha=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.set_title(title if title is not None else "Диаграмма Ганта по этапам")
    handles = [Patch(facecolor=colors[s], label=stage_label(s)) for s in stages]
    ax.legend(
        handles=handles,
        title="этап",
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


# =========================================================================== цепочка трассировки
# Урок 12.5.2: «трассировка должна связывать данные с обновлением». Панель наблюдения отвечает
# «что изменилось», трасса — «через какие события прошёл конкретный пример». Минимальная цепочка
# идентификаторов: запрос → роллаут → версия поведения → версия верификатора → пакет → шаг
# оптимизатора → версия политики после шага.

TRACE_CHAIN = (
    "prompt_id",
    "rollout_id",
    "behavior_policy_version",
    "verifier_version",
    "training_batch_id",
    "optimizer_step",
    "resulting_policy_version",
)

TRACE_LABELS = {
    "prompt_id": "идентификатор запроса",
    "rollout_id": "идентификатор роллаута",
    "behavior_policy_version": "версия политики, сгенерировавшей роллаут",
    "verifier_version": "версия проверяющей системы (верификатора)",
    "training_batch_id": "идентификатор обучающего пакета",
    "optimizer_step": "номер шага оптимизатора",
    "resulting_policy_version": "версия политики после шага",
}

# Обязательные столбцы таблиц трассы (дополнительные столбцы допустимы).
TRACE_COLUMNS = {
    "prompts": ("prompt_id",),
    "rollouts": (
        "rollout_id",
        "prompt_id",
        "behavior_policy_version",
        "verifier_version",
        "reward",
        "tokens",
        "training_batch_id",
    ),
    "batches": (
        "training_batch_id",
        "optimizer_step",
        "trainer_policy_version",
        "n_rollouts",
        "tokens",
        "rollout_ids",
        "complete",
    ),
    "steps": ("optimizer_step", "resulting_policy_version", "expected_verifier_version"),
}

# Причины, по которым роллаут не попал в пакет (find_orphans).
ORPHAN_REASONS = {
    "dropped": "отброшен как несвежий при извлечении из очереди",
    "queued": "ждал в очереди на конец прогона",
    "in_flight": "ещё генерировался или проверялся на конец прогона",
    "unfinished": "в пакете шага, не завершённого к концу прогона",
    "unknown": "причина неизвестна",
}

# Группы панели наблюдения (урок 12.5.2) → метрики, которые считает ``dashboard`` из таблиц трассы.
# KL к базе, энтропия, утилизация пулов, время контрольных точек и т. п. из лекции требуют данных,
# которых в таблицах трассы нет, поэтому здесь их нет.
METRIC_GROUPS = {
    "данные": (
        "роллаутов",
        "запросов",
        "средняя награда",
        "доля информативных групп",
        "доля вырожденных групп",
        "токенов на роллаут, среднее",
        "токенов на роллаут, p95",
    ),
    "политика": (
        "шагов оптимизатора",
        "итоговая версия политики",
        "задержка политики, средняя",
        "задержка политики, максимальная",
        "доля несвежих роллаутов",
        "ESS/n, среднее по шагам",
    ),
    "система": (
        "длительность роллаута, p50",
        "длительность роллаута, p95",
        "длительность роллаута, p99",
        "время в очереди, среднее",
        "время в очереди, p95",
        "пропускная способность обучения",
        "скорость генерации",
        "синхронизация весов, среднее",
        "доля простоя тренера",
        "пиковая память",
    ),
    "надёжность": (
        "осиротевших роллаутов",
        "доля осиротевших роллаутов",
        "отброшено как несвежие",
        "доля отброшенных",
        "несовпадений версии верификатора",
        "нарушений цепочки",
    ),
}

METRIC_UNITS = {
    "роллаутов": "шт.",
    "запросов": "шт.",
    "средняя награда": "у. е.",
    "доля информативных групп": "доля",
    "доля вырожденных групп": "доля",
    "токенов на роллаут, среднее": "токенов",
    "токенов на роллаут, p95": "токенов",
    "шагов оптимизатора": "шт.",
    "итоговая версия политики": "версия",
    "задержка политики, средняя": "версий",
    "задержка политики, максимальная": "версий",
    "доля несвежих роллаутов": "доля",
    "ESS/n, среднее по шагам": "доля",
    "длительность роллаута, p50": "с",
    "длительность роллаута, p95": "с",
    "длительность роллаута, p99": "с",
    "время в очереди, среднее": "с",
    "время в очереди, p95": "с",
    "пропускная способность обучения": "токенов/с",
    "скорость генерации": "токенов/с",
    "синхронизация весов, среднее": "с",
    "доля простоя тренера": "доля",
    "пиковая память": "ГиБ (2³⁰ Б)",
    "осиротевших роллаутов": "шт.",
    "доля осиротевших роллаутов": "доля",
    "отброшено как несвежие": "шт.",
    "доля отброшенных": "доля",
    "несовпадений версии верификатора": "шт.",
    "нарушений цепочки": "шт.",
}


@dataclasses.dataclass
class TraceTables:
    """Таблицы трассы (pandas DataFrame), связанные идентификаторами цепочки ``TRACE_CHAIN``.

    * prompts — строка на запрос: prompt_id, n_rollouts (сколько роллаутов по нему), …;
    * rollouts — строка на роллаут: rollout_id, trace_id, prompt_id, group_id,
      behavior_policy_version, verifier_version, reward, tokens (токены ответа), отметки времени
      gen_start, gen_end, enqueue_time (роллаут готов), dequeue_time (секунды; NaN — не было),
      dropped и training_batch_id (None, если роллаут не попал ни в один пакет);
    * batches — строка на пакет (журнал тренера): training_batch_id, optimizer_step,
      trainer_policy_version (версия тренера при сборке пакета), n_rollouts, tokens, rollout_ids
      (кортеж идентификаторов — состав пакета со стороны тренера), complete (шаг завершён);
    * steps — строка на завершённый шаг: optimizer_step, resulting_policy_version,
      expected_verifier_version (какую версию верификатора ждал шаг), loss, start_s, end_s, ….

    source — откуда таблицы ("loop", "simulation" или своё), horizon_s — длительность прогона, с
    (знаменатель пропускной способности).
    """

    prompts: Any
    rollouts: Any
    batches: Any
    steps: Any
    source: str = ""
    horizon_s: float = math.nan


def _check_tables(tables: Any, name: str = "tables") -> TraceTables:
    import pandas as pd

    if not isinstance(tables, TraceTables):
        raise ValueError(
            f"{name} должно быть TraceTables (trace_from_loop, trace_from_simulation), "
            f"получено {type(tables).__name__}"
        )
    for table, cols in TRACE_COLUMNS.items():
        frame = getattr(tables, table)
        if not isinstance(frame, pd.DataFrame):
            raise ValueError(
                f"{name}.{table} должно быть pandas.DataFrame, получено {type(frame).__name__}"
            )
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{name}.{table}: нет столбцов {missing}")
    return tables


def _is_missing(x: Any) -> bool:
    """None, NaN или pd.NA (скаляр); последовательности пропуском не считаются."""
    if x is None:
        return True
    if isinstance(x, float):
        return math.isnan(x)
    import pandas as pd

    res = pd.isna(x)
    return bool(res) if isinstance(res, bool) or getattr(res, "ndim", 1) == 0 else False


def _batch_id(k: int) -> str:
    return f"b{int(k):04d}"


def _batches_frame(rollouts, trainer_version: Mapping[int, int], steps_done: set[int]):
    """Журнал пакетов из столбцов rollouts.training_batch_id / optimizer_step (для построителей)."""
    import pandas as pd

    rows = []
    used = rollouts[rollouts["training_batch_id"].notna()]
    for step in sorted(trainer_version):
        part = used[used["_step"] == step]
        rows.append(
            {
                "training_batch_id": _batch_id(step),
                "optimizer_step": int(step),
                "trainer_policy_version": int(trainer_version[step]),
                "n_rollouts": len(part),
                "tokens": int(part["tokens"].sum()),
                "rollout_ids": tuple(part["rollout_id"].tolist()),
                "complete": step in steps_done,
            }
        )
    return pd.DataFrame(rows, columns=list(TRACE_COLUMNS["batches"]))


def _prompts_frame(rollouts, extra: Mapping[str, Mapping[str, Any]] | None = None):
    import pandas as pd

    counts = rollouts.groupby("prompt_id", sort=False).size()
    prompts = pd.DataFrame({"prompt_id": counts.index.astype(object), "n_rollouts": counts.values})
    for col, values in (extra or {}).items():
        prompts[col] = prompts["prompt_id"].map(values)
    return prompts


def trace_from_loop(loop_result: Any, expected_verifier_version: str | None = None) -> TraceTables:
    """Таблицы трассы из ``policy.sequential_loop``: пакет k — записи шага k, версия после — k + 1.

    Записи шага k сгенерированы версией k (policy_version = behavior_version строки шага k);
    шаг k обучается на них и публикует версию k + 1 (синхронный цикл, задержка 0). rollout_id —
    sample_id записи, reward — скалярная награда Σ w·reward (как ``policy.scalar_reward``),
    correctness — компонента правильности, tokens — число токенов ответа. Отметки времени
    роллаута — стадии его шага (генерация пакетная: все ответы шага готовы одновременно), с.
    expected_verifier_version — какую версию верификатора ждёт тренер (по умолчанию
    ``arith_task.VERIFIER_VERSION``).
    """
    import pandas as pd

    for attr in ("steps", "events", "records"):
        if not hasattr(loop_result, attr):
            raise ValueError(
                f"loop_result должно быть результатом policy.sequential_loop (нет поля {attr}), "
                f"получено {type(loop_result).__name__}"
            )
    steps, events, records = loop_result.steps, loop_result.events, list(loop_result.records)
    if not isinstance(steps, pd.DataFrame) or not {"step", "behavior_version"} <= set(steps):
        raise ValueError(
            "loop_result.steps должно быть таблицей со столбцами step и behavior_version"
        )
    if len(steps) == 0 or not records:
        raise ValueError("loop_result: нет ни одного шага или ни одной записи роллаута")
    if expected_verifier_version is None:
        from course_utils.arith_task import VERIFIER_VERSION as expected_verifier_version
    if not isinstance(expected_verifier_version, str) or not expected_verifier_version:
        raise ValueError(
            "expected_verifier_version должно быть непустой строкой или None, "
            f"получено {expected_verifier_version!r}"
        )
    if steps["behavior_version"].duplicated().any():
        raise ValueError("loop_result.steps: версии поведения шагов повторяются")
    step_of_version = {int(v): int(s) for s, v in zip(steps["step"], steps["behavior_version"])}

    times: dict[int, dict[str, float]] = {}
    if isinstance(events, pd.DataFrame) and {"step", "stage", "start_s", "end_s"} <= set(events):
        for step, ev in events.groupby("step"):
            by_stage = dict(tuple(ev.groupby("stage")))

            def _t(stage: str, col: str, fn, by_stage=by_stage) -> float:
                """Время стадии шага, с: fn (min/max) по её событиям; NaN, если стадии нет."""
                return float(fn(by_stage[stage][col])) if stage in by_stage else math.nan

            times[int(step)] = {
                "gen_start": _t("prepare", "start_s", min),
                "gen_end": _t("decode", "end_s", max),
                "enqueue_time": _t("reward", "end_s", max),
                "dequeue_time": _t("logprob_recompute", "start_s", min),
                "start_s": float(ev["start_s"].min()),
                "end_s": float(ev["end_s"].max()),
            }
    horizon = (
        float(events["end_s"].max())
        if isinstance(events, pd.DataFrame) and len(events) and "end_s" in events
        else math.nan
    )

    rows, prompt_tokens = [], {}
    for i, r in enumerate(records):
        for attr in ("sample_id", "policy_version", "reward", "response_tokens"):
            if not hasattr(r, attr):
                raise ValueError(
                    f"loop_result.records[{i}]: нет поля {attr} (ожидается RolloutRecord)"
                )
        version = r.policy_version
        if version is None or int(version) not in step_of_version:
            raise ValueError(
                f"loop_result.records[{i}]: версия политики {version!r} не совпадает ни с одной "
                "версией поведения шагов"
            )
        step = step_of_version[int(version)]
        reward = r.reward if isinstance(r.reward, Mapping) else {}
        prompt_id = r.prompt_id or r.group_id or r.sample_id
        prompt_tokens.setdefault(prompt_id, len(r.prompt_tokens))
        t = times.get(step, {})
        rows.append(
            {
                "rollout_id": r.sample_id,
                "trace_id": r.trace_id,
                "prompt_id": prompt_id,
                "group_id": r.group_id or prompt_id,
                "behavior_policy_version": int(version),
                "verifier_version": r.verifier_version,
                "reward": scalar_reward(reward),
                "correctness": float(reward.get("correctness", math.nan)),
                "tokens": len(r.response_tokens),
                "stop_reason": r.stop_reason,
                **{
                    k: t.get(k, math.nan)
                    for k in ("gen_start", "gen_end", "enqueue_time", "dequeue_time")
                },
                "dropped": False,
                "training_batch_id": _batch_id(step),
                "_step": step,
            }
        )
    rollouts = pd.DataFrame(rows)
    batches = _batches_frame(
        rollouts,
        {s: v for v, s in step_of_version.items()},
        set(step_of_version.values()),
    )
    rollouts = rollouts.drop(columns="_step")
    extra_cols = [
        c
        for c in (
            "loss",
            "mean_reward",
            "informative_groups",
            "clip_fraction",
            "grad_norm",
            "wall_s",
            "weight_sync_s",
            "peak_memory_bytes",
        )
        if c in steps
    ]
    step_rows = pd.DataFrame(
        {
            "optimizer_step": steps["step"].astype("int64").to_numpy(),
            "resulting_policy_version": (steps["behavior_version"].astype("int64") + 1).to_numpy(),
            "expected_verifier_version": expected_verifier_version,
            "start_s": [times.get(int(s), {}).get("start_s", math.nan) for s in steps["step"]],
            "end_s": [times.get(int(s), {}).get("end_s", math.nan) for s in steps["step"]],
        }
    )
    for c in extra_cols:
        step_rows[c] = steps[c].to_numpy()
    prompts = _prompts_frame(rollouts, {"prompt_tokens": prompt_tokens})
    return TraceTables(prompts, rollouts, batches, step_rows, source="loop", horizon_s=horizon)


def trace_from_simulation(
    sim_result: Any, verifier_version: str = "sim-verifier-v1"
) -> TraceTables:
    """Таблицы трассы из ``pipeline.simulate``: пакет шага s — роллауты с consumed_version = s.

    В модели нет запросов и наград: у каждого роллаута свой синтетический запрос
    ``sim-p{rollout_id}``, reward = NaN, версия верификатора у всех — verifier_version (и её же
    ждут шаги). Роллауты с NaN в dequeue_time не попали ни в один пакет (в очереди или ещё
    генерировались на конец прогона); dropped — отброшенные как несвежие. Пакет шага, не
    завершённого к концу прогона, записан с complete = False, шага для него в steps нет.
    horizon_s = config.duration_s.
    """
    import pandas as pd

    for attr in ("rollouts", "steps", "config"):
        if not hasattr(sim_result, attr):
            raise ValueError(
                f"sim_result должно быть результатом pipeline.simulate (нет поля {attr}), "
                f"получено {type(sim_result).__name__}"
            )
    if not isinstance(verifier_version, str) or not verifier_version:
        raise ValueError(
            f"verifier_version должно быть непустой строкой, получено {verifier_version!r}"
        )
    src, st = sim_result.rollouts, sim_result.steps
    need_r = {"rollout_id", "gen_start", "gen_end", "enqueue_time", "dequeue_time", "tokens"}
    need_r |= {"behavior_version", "consumed_version", "dropped"}
    if not isinstance(src, pd.DataFrame) or not need_r <= set(src.columns):
        raise ValueError(f"sim_result.rollouts: нужны столбцы {sorted(need_r)}")
    if not isinstance(st, pd.DataFrame) or not {"step", "version_published"} <= set(st.columns):
        raise ValueError("sim_result.steps: нужны столбцы step и version_published")

    consumed = src["consumed_version"]
    step = consumed.astype("Int64")
    rollouts = pd.DataFrame(
        {
            "rollout_id": src["rollout_id"].astype("int64").to_numpy(),
            "trace_id": [f"r{int(i)}" for i in src["rollout_id"]],
            "prompt_id": [f"sim-p{int(i)}" for i in src["rollout_id"]],
            "group_id": [f"sim-p{int(i)}" for i in src["rollout_id"]],
            "behavior_policy_version": src["behavior_version"].astype("int64").to_numpy(),
            "verifier_version": verifier_version,
            "reward": math.nan,
            "tokens": src["tokens"].astype("int64").to_numpy(),
            "gen_start": src["gen_start"].to_numpy(),
            "gen_end": src["gen_end"].to_numpy(),
            "enqueue_time": src["enqueue_time"].to_numpy(),
            "dequeue_time": src["dequeue_time"].to_numpy(),
            "dropped": src["dropped"].astype(bool).to_numpy(),
            "training_batch_id": [None if _is_missing(s) else _batch_id(s) for s in step],
        }
    )
    if "collector" in src:
        rollouts.insert(1, "collector", src["collector"].to_numpy())
    rollouts["training_batch_id"] = rollouts["training_batch_id"].astype(object)
    rollouts["_step"] = step.to_numpy()
    done = {int(s) for s in st["step"]}
    # Версия весов у тренера во время сбора пакета шага s равна s (версия публикуется после шага).
    trainer_version = {int(s): int(s) for s in step.dropna().unique()}
    trainer_version.update(
        {int(s): int(v) - 1 for s, v in zip(st["step"], st["version_published"])}
    )
    batches = _batches_frame(rollouts, trainer_version, done)
    rollouts = rollouts.drop(columns="_step")
    step_rows = pd.DataFrame(
        {
            "optimizer_step": st["step"].astype("int64").to_numpy(),
            "resulting_policy_version": st["version_published"].astype("int64").to_numpy(),
            "expected_verifier_version": verifier_version,
            "loss": math.nan,
            "start_s": st["start"].to_numpy() if "start" in st else math.nan,
            "end_s": st["end"].to_numpy() if "end" in st else math.nan,
        }
    )
    for c in ("collect_start", "mean_lag", "max_lag", "ess_norm"):
        if c in st:
            step_rows[c] = st[c].to_numpy()
    horizon = float(getattr(sim_result.config, "duration_s", math.nan))
    prompts = _prompts_frame(rollouts)
    return TraceTables(
        prompts, rollouts, batches, step_rows, source="simulation", horizon_s=horizon
    )


_INT_CHAIN = ("behavior_policy_version", "optimizer_step", "resulting_policy_version")


def _merge(left, right, on: str, validate: str, what: str):
    import pandas as pd

    try:
        return left.merge(right, on=on, how="left", validate=validate, suffixes=("", "_dup"))
    except pd.errors.MergeError as exc:
        raise ValueError(
            f"{what}: повторяющиеся {on}, цепочка неоднозначна (подробности — check_chain)"
        ) from exc


def full_chain(tables: TraceTables):
    """Полная цепочка: строка на роллаут, столбцы ``TRACE_CHAIN``, затем остальные поля.

    rollouts ⟕ prompts по prompt_id ⟕ batches по training_batch_id ⟕ steps по optimizer_step
    (левые соединения pandas с validate="many_to_one": повтор идентификатора справа — ValueError,
    а не молча размноженные строки). Роллаут без пакета сохраняется: дальше по цепочке NaN/<NA>.
    Повтор rollout_id тоже ValueError: одна трасса не может вести к двум обновлениям.
    """
    tables = _check_tables(tables)
    r = tables.rollouts
    dup = r["rollout_id"][r["rollout_id"].duplicated()].unique().tolist()
    if dup:
        raise ValueError(f"full_chain: повторяющиеся rollout_id в rollouts: {dup[:10]}")
    prompts = tables.prompts.rename(columns={"n_rollouts": "prompt_rollouts"})
    prompts = prompts.drop(columns=[c for c in prompts if c in r and c != "prompt_id"])
    out = _merge(r, prompts, "prompt_id", "many_to_one", "full_chain: prompts")
    batches = tables.batches.drop(columns=["rollout_ids"])
    batches = batches.rename(columns={"n_rollouts": "batch_rollouts", "tokens": "batch_tokens"})
    out = _merge(out, batches, "training_batch_id", "many_to_one", "full_chain: batches")
    steps = tables.steps.rename(columns={c: f"step_{c}" for c in tables.steps if c in out})
    steps = steps.rename(columns={"step_optimizer_step": "optimizer_step"})
    out = _merge(out, steps, "optimizer_step", "many_to_one", "full_chain: steps")
    for c in _INT_CHAIN + ("trainer_policy_version", "batch_rollouts", "batch_tokens"):
        out[c] = out[c].astype("Int64")
    rest = [c for c in out.columns if c not in TRACE_CHAIN]
    return out[list(TRACE_CHAIN) + rest]


def chain_for_rollout(tables: TraceTables, rollout_id: Any):
    """Цепочка одного роллаута (pandas Series): запрос → … → версия политики после шага.

    Если роллаут не попал в пакет, поля от training_batch_id дальше — NaN/<NA>.
    """
    chain = full_chain(tables)
    hit = chain[chain["rollout_id"] == rollout_id]
    if len(hit) == 0:
        raise ValueError(f"rollout_id {rollout_id!r} нет в таблице rollouts")
    return hit.iloc[0]


def rollouts_for_step(tables: TraceTables, optimizer_step: Any):
    """Роллауты (с полями их запросов), из которых собран пакет шага optimizer_step.

    Обратное соединение к ``chain_for_rollout``: роллаут r входит в ответ для шага s тогда и только
    тогда, когда chain_for_rollout(r)["optimizer_step"] == s. Шаг ищется в steps и в batches
    (пакет незавершённого шага тоже виден).
    """
    tables = _check_tables(tables)
    if not isinstance(optimizer_step, numbers.Integral) or isinstance(optimizer_step, bool):
        raise ValueError(f"optimizer_step должно быть целым числом, получено {optimizer_step!r}")
    known = set(tables.steps["optimizer_step"].dropna().astype(int)) | set(
        tables.batches["optimizer_step"].dropna().astype(int)
    )
    if int(optimizer_step) not in known:
        raise ValueError(
            f"optimizer_step {optimizer_step} нет ни в steps, ни в batches "
            f"(известны шаги {sorted(known)[:5]}{'…' if len(known) > 5 else ''})"
        )
    chain = full_chain(tables)
    return chain[chain["optimizer_step"] == int(optimizer_step)].reset_index(drop=True)


def find_orphans(tables: TraceTables, include_unfinished: bool = False):
    """Осиротевшие роллауты: не попали ни в один пакет (training_batch_id пуст), с причиной.

    Причина (столбец reason, ключ в ``ORPHAN_REASONS``; reason_text — по-русски): dropped —
    отброшен как несвежий; queued — готов, но не извлечён из очереди к концу; in_flight — не успел
    закончить генерацию или проверку; unknown — отметок времени нет. include_unfinished=True
    добавляет роллауты из пакета шага, не завершённого к концу прогона (reason = unfinished):
    в пакет они попали, но к обновлению весов пока не привели.
    """
    tables = _check_tables(tables)
    if not isinstance(include_unfinished, bool):
        raise ValueError(
            f"include_unfinished должно быть True или False, получено {include_unfinished!r}"
        )
    r = tables.rollouts.copy()
    n = len(r)
    reason = [None] * n
    has = {c: c in r for c in ("dropped", "enqueue_time", "dequeue_time")}
    complete = dict(zip(tables.batches["training_batch_id"], tables.batches["complete"]))
    for i, row in enumerate(r.itertuples(index=False)):
        row = row._asdict()
        batch = row["training_batch_id"]
        if not _is_missing(batch):
            if include_unfinished and complete.get(batch) is False:
                reason[i] = "unfinished"
            continue
        if has["dropped"] and bool(row["dropped"]):
            reason[i] = "dropped"
        elif has["enqueue_time"] and has["dequeue_time"] and _is_missing(row["dequeue_time"]):
            reason[i] = "in_flight" if _is_missing(row["enqueue_time"]) else "queued"
        else:
            reason[i] = "unknown"
    r["reason"] = reason
    out = r[r["reason"].notna()].reset_index(drop=True)
    out["reason_text"] = out["reason"].map(ORPHAN_REASONS)
    return out


def verifier_mismatches(tables: TraceTables, expected_version: Any = None):
    """Роллауты, попавшие в пакет, чья версия верификатора не та, что ждал их шаг.

    expected_version — строка (одна версия для всех шагов), словарь {optimizer_step: версия} или
    None (брать steps.expected_verifier_version; шаг незавершённого пакета сверяется с версией
    последнего известного шага). Роллауты без пакета не сверяются — в обновление они не попали
    (их ищет ``find_orphans``). Возвращает rollout_id, optimizer_step, verifier_version,
    expected_verifier_version и остальные поля цепочки.
    """
    import pandas as pd

    tables = _check_tables(tables)
    chain = full_chain(tables)
    used = chain[chain["optimizer_step"].notna()].copy()
    if isinstance(expected_version, str):
        if not expected_version:
            raise ValueError("expected_version не должно быть пустой строкой")
        expected = {int(s): expected_version for s in used["optimizer_step"]}
    elif isinstance(expected_version, Mapping | pd.Series):
        mapping = dict(expected_version.items())
        bad_keys = [
            k for k in mapping if not isinstance(k, numbers.Integral) or isinstance(k, bool)
        ]
        if bad_keys:
            raise ValueError(
                f"expected_version: ключи словаря — номера шагов (целые), получено {_head(bad_keys)}"
            )
        missing = sorted({int(s) for s in used["optimizer_step"]} - {int(k) for k in mapping})
        if missing:
            raise ValueError(
                f"expected_version: нет ожидаемой версии для шагов {missing[:10]} "
                "(словарь {optimizer_step: версия} должен покрывать все шаги с пакетами)"
            )
        expected = {int(k): v for k, v in mapping.items()}
    elif expected_version is None:
        steps = tables.steps.sort_values("optimizer_step")
        expected = dict(
            zip(steps["optimizer_step"].astype(int), steps["expected_verifier_version"])
        )
        last = steps["expected_verifier_version"].iloc[-1] if len(steps) else None
        for s in used["optimizer_step"]:
            expected.setdefault(int(s), last)
    else:
        raise ValueError(
            "expected_version должно быть строкой, словарем {optimizer_step: версия} или None, "
            f"получено {type(expected_version).__name__}"
        )
    used["expected_verifier_version"] = [expected.get(int(s)) for s in used["optimizer_step"]]
    bad = used["verifier_version"].astype(object) != used["expected_verifier_version"].astype(
        object
    )
    out = used[bad]
    first = ["rollout_id", "optimizer_step", "verifier_version", "expected_verifier_version"]
    return out[first + [c for c in out.columns if c not in first]].reset_index(drop=True)


def _dups(frame, col: str) -> list:
    s = frame[col]
    return s[s.duplicated() & s.notna()].unique().tolist()


def _head(items: list, k: int = 5) -> str:
    shown = ", ".join(repr(x) for x in items[:k])
    return shown + (f" … (всего {len(items)})" if len(items) > k else "")


def check_chain(tables: TraceTables) -> list[str]:
    """Разрывы цепочки трассы — список сообщений по-русски; пустой список, если всё согласовано.

    Проверяется: уникальность prompt_id, rollout_id, training_batch_id, optimizer_step (в своих
    таблицах) и одного пакета на шаг; роллаут ссылается на известный запрос и известный пакет;
    пакет ссылается только на известные роллауты и его состав (rollout_ids) совпадает с
    training_batch_id роллаутов, n_rollouts и tokens — с составом; у завершённого пакета есть шаг,
    у шага — пакет; версии не идут назад: resulting_policy_version растёт с номером шага и равна
    trainer_policy_version + 1, а версия поведения роллаута не новее версии тренера (задержка ≥ 0).
    """
    tables = _check_tables(tables)
    p, r, b, s = tables.prompts, tables.rollouts, tables.batches, tables.steps
    msgs: list[str] = []
    for name, frame, col in (
        ("prompts", p, "prompt_id"),
        ("rollouts", r, "rollout_id"),
        ("batches", b, "training_batch_id"),
        ("steps", s, "optimizer_step"),
    ):
        dup = _dups(frame, col)
        if dup:
            msgs.append(f"{name}: повторяющиеся {col}: {_head(dup)}")
    dup = _dups(b, "optimizer_step")
    if dup:
        msgs.append(f"batches: несколько пакетов на один шаг оптимизатора: {_head(dup)}")

    prompt_ids = set(p["prompt_id"].dropna())
    unknown = sorted({x for x in r["prompt_id"] if _is_missing(x) or x not in prompt_ids}, key=str)
    if unknown:
        msgs.append(f"rollouts: ссылки на неизвестные запросы prompt_id: {_head(unknown)}")
    rollout_ids = set(r["rollout_id"])
    batch_ids = set(b["training_batch_id"])
    unknown = sorted(
        {x for x in r["training_batch_id"] if not _is_missing(x) and x not in batch_ids}, key=str
    )
    if unknown:
        msgs.append(f"rollouts: ссылки на неизвестные пакеты training_batch_id: {_head(unknown)}")

    batch_of: dict[Any, Any] = {}
    claims: dict[Any, list] = {}  # пакет → роллауты, которые на него указывают
    for rid, bid in zip(r["rollout_id"], r["training_batch_id"]):
        if not _is_missing(bid):
            batch_of.setdefault(rid, bid)
            claims.setdefault(bid, []).append(rid)
    tokens_of = dict(zip(r["rollout_id"], r["tokens"]))
    for row in b.itertuples(index=False):
        bid, members = row.training_batch_id, row.rollout_ids
        if isinstance(members, str) or not isinstance(members, Iterable):
            msgs.append(f"пакет {bid!r}: rollout_ids должно быть списком идентификаторов")
            continue
        members = list(members)
        ghost = [x for x in members if x not in rollout_ids]
        if ghost:
            msgs.append(f"пакет {bid!r} ссылается на неизвестные роллауты: {_head(ghost)}")
        other = [x for x in members if x in rollout_ids and batch_of.get(x) != bid]
        if other:
            msgs.append(
                f"пакет {bid!r}: роллауты {_head(other)} по таблице rollouts в этот пакет не входят"
            )
        member_set = set(members)
        claimed = [x for x in claims.get(bid, []) if x not in member_set]
        if claimed:
            msgs.append(
                f"пакет {bid!r}: роллауты {_head(claimed)} указывают на пакет, но нет в его составе"
            )
        if row.n_rollouts != len(members):
            msgs.append(f"пакет {bid!r}: n_rollouts = {row.n_rollouts}, а в составе {len(members)}")
        if not ghost:
            total = sum(int(tokens_of[x]) for x in members)
            if row.tokens != total:
                msgs.append(f"пакет {bid!r}: tokens = {row.tokens}, а сумма по составу {total}")

    step_ids = set(s["optimizer_step"].dropna().astype(int))
    batch_steps = {int(x) for x in b["optimizer_step"].dropna()}
    for row in b.itertuples(index=False):
        if _is_missing(row.optimizer_step):
            msgs.append(f"пакет {row.training_batch_id!r}: не указан optimizer_step")
        elif bool(row.complete) and int(row.optimizer_step) not in step_ids:
            msgs.append(
                f"пакет {row.training_batch_id!r} завершён, но шага {int(row.optimizer_step)} "
                "нет в steps"
            )
        elif not bool(row.complete) and int(row.optimizer_step) in step_ids:
            msgs.append(
                f"пакет {row.training_batch_id!r} помечен незавершённым, но шаг "
                f"{int(row.optimizer_step)} есть в steps"
            )
    lonely = sorted(step_ids - batch_steps)
    if lonely:
        msgs.append(f"steps: шаги без пакета: {_head(lonely)}")

    ordered = s.dropna(subset=["optimizer_step"]).sort_values("optimizer_step")
    vers = ordered["resulting_policy_version"].tolist()
    steps_list = ordered["optimizer_step"].astype(int).tolist()
    for k in range(1, len(vers)):
        if not vers[k] > vers[k - 1]:
            msgs.append(
                f"версии идут назад: после шага {steps_list[k - 1]} версия {vers[k - 1]}, "
                f"после шага {steps_list[k]} — {vers[k]}"
            )
    result_of = dict(zip(steps_list, vers))
    trainer_of = {}
    for row in b.itertuples(index=False):
        if _is_missing(row.optimizer_step):
            continue
        trainer_of[row.training_batch_id] = row.trainer_policy_version
        res = result_of.get(int(row.optimizer_step))
        if res is not None and res != row.trainer_policy_version + 1:
            msgs.append(
                f"шаг {int(row.optimizer_step)}: версия после шага {res}, а версия тренера при "
                f"сборке пакета {row.trainer_policy_version} (ожидалось {res} = версия + 1)"
            )
    future = [
        rid
        for rid, bid, v in zip(
            r["rollout_id"], r["training_batch_id"], r["behavior_policy_version"]
        )
        if not _is_missing(bid) and bid in trainer_of and v > trainer_of[bid]
    ]
    if future:
        msgs.append(
            "версии идут назад: роллауты сгенерированы версией новее версии тренера "
            f"(задержка < 0): {_head(future)}"
        )
    return msgs


def _pooled_percentiles(values) -> dict[str, float]:
    vals = [float(v) for v in values if not _is_missing(v)]
    return percentiles(vals) if vals else {"p50": math.nan, "p95": math.nan, "p99": math.nan}


def _mean(values) -> float:
    vals = [float(v) for v in values if not _is_missing(v)]
    return math.fsum(vals) / len(vals) if vals else math.nan


def _share(part: float, whole: float) -> float:
    return part / whole if whole else math.nan


def dashboard(tables: TraceTables, loop_or_sim: Any = None):
    """Панель наблюдения по группам ``METRIC_GROUPS`` (данные, политика, система, надёжность).

    Возвращает DataFrame с индексом (группа, метрика) и столбцами «значение», «единицы»;
    NaN — данных для метрики нет. Определения:
    * информативная группа — ``arith_task.is_informative_group`` скалярных наград reward
      ответов одного group_id (правильность и формат, как у преимуществ GRPO); вырожденная —
      все награды равны (градиента GRPO нет);
    * задержка политики роллаута из пакета = trainer_policy_version − behavior_policy_version,
      версий; несвежий роллаут — задержка ≥ 1;
    * длительность роллаута = enqueue_time − gen_start (от запуска до готовности с проверкой), с;
      время в очереди = dequeue_time − enqueue_time у роллаутов из пакетов, с;
    * пропускная способность = токены пакетов завершённых шагов / horizon_s, генерация = токены
      готовых роллаутов / horizon_s (токенов/с);
    * p50/p95/p99 считаются ``percentiles`` по объединённой выборке всех роллаутов. Усреднять
      перцентили подгрупп (сборщиков, шагов) нельзя: перцентиль нелинеен, и среднее p95 двух
      сборщиков — не p95 их общей выборки (редкие длинные хвосты одного сборщика «размываются»).
    loop_or_sim — исходный LoopResult или SimResult (необязательно): из его events берутся
    среднее время стадии weight_sync и доля простоя тренера (стадия queue_wait исполнителей
    trainer-*, от horizon_s на одного тренера).
    """
    import pandas as pd

    tables = _check_tables(tables)
    events = None
    if loop_or_sim is not None:
        events = getattr(loop_or_sim, "events", None)
        if not isinstance(events, pd.DataFrame) or not {"stage", "start_s", "end_s"} <= set(
            events.columns
        ):
            raise ValueError(
                "loop_or_sim должно быть результатом policy.sequential_loop или pipeline.simulate "
                f"(с таблицей events) либо None, получено {type(loop_or_sim).__name__}"
            )
    r, b, s = tables.rollouts, tables.batches, tables.steps
    n = len(r)
    m: dict[str, float] = {}

    # --- данные
    m["роллаутов"] = float(n)
    m["запросов"] = float(len(tables.prompts))
    m["средняя награда"] = _mean(r["reward"])
    groups = r["group_id"] if "group_id" in r else r["prompt_id"]
    scored = r.assign(_g=groups)[r["reward"].notna()]
    if len(scored):  # reward — скалярная награда, как в arith_task.is_informative_group
        informative = scored.groupby("_g")["reward"].agg(lambda v: is_informative_group(v.tolist()))
        m["доля информативных групп"] = float(informative.mean())
        m["доля вырожденных групп"] = 1.0 - float(informative.mean())
    else:
        m["доля информативных групп"] = m["доля вырожденных групп"] = math.nan
    m["токенов на роллаут, среднее"] = _mean(r["tokens"])
    m["токенов на роллаут, p95"] = _pooled_percentiles(r["tokens"])["p95"]

    # --- политика
    trainer_of = dict(zip(b["training_batch_id"], b["trainer_policy_version"]))
    used = r[r["training_batch_id"].map(lambda x: not _is_missing(x) and x in trainer_of)]
    lag = used["training_batch_id"].map(trainer_of) - used["behavior_policy_version"]
    m["шагов оптимизатора"] = float(len(s))
    m["итоговая версия политики"] = (
        float(s["resulting_policy_version"].max()) if len(s) else math.nan
    )
    m["задержка политики, средняя"] = _mean(lag)
    m["задержка политики, максимальная"] = float(lag.max()) if len(lag) else math.nan
    m["доля несвежих роллаутов"] = float((lag >= 1).mean()) if len(lag) else math.nan
    m["ESS/n, среднее по шагам"] = _mean(s["ess_norm"]) if "ess_norm" in s else math.nan

    # --- система
    if {"gen_start", "enqueue_time"} <= set(r.columns):
        lat = _pooled_percentiles(r["enqueue_time"] - r["gen_start"])
    else:
        lat = {"p50": math.nan, "p95": math.nan, "p99": math.nan}
    for q in ("p50", "p95", "p99"):
        m[f"длительность роллаута, {q}"] = lat[q]
    if {"enqueue_time", "dequeue_time"} <= set(r.columns):
        wait = used["dequeue_time"] - used["enqueue_time"]
        m["время в очереди, среднее"] = _mean(wait)
        m["время в очереди, p95"] = _pooled_percentiles(wait)["p95"]
    else:
        m["время в очереди, среднее"] = m["время в очереди, p95"] = math.nan
    h = float(tables.horizon_s) if is_number(tables.horizon_s) else math.nan
    done_tokens = float(b.loc[b["complete"].astype(bool), "tokens"].sum())
    m["пропускная способность обучения"] = done_tokens / h if h > 0 else math.nan
    ready = r["enqueue_time"].notna() if "enqueue_time" in r else pd.Series(True, index=r.index)
    m["скорость генерации"] = float(r.loc[ready, "tokens"].sum()) / h if h > 0 else math.nan
    m["синхронизация весов, среднее"] = math.nan
    m["доля простоя тренера"] = math.nan
    if events is not None:
        dur = events["end_s"].astype(float) - events["start_s"].astype(float)
        m["синхронизация весов, среднее"] = _mean(dur[events["stage"] == "weight_sync"])
        if "worker" in events:
            is_tr = events["worker"].astype(str).str.startswith("trainer")
            n_tr = events.loc[is_tr, "worker"].nunique()
            if n_tr and h > 0:
                idle = float(dur[is_tr & (events["stage"] == "queue_wait")].sum())
                m["доля простоя тренера"] = idle / (n_tr * h)
    m["пиковая память"] = (
        float(s["peak_memory_bytes"].max()) / 2**30
        if "peak_memory_bytes" in s and len(s)
        else math.nan
    )

    # --- надёжность
    orphans = find_orphans(tables)
    dropped = int(r["dropped"].astype(bool).sum()) if "dropped" in r else 0
    m["осиротевших роллаутов"] = float(len(orphans))
    m["доля осиротевших роллаутов"] = _share(len(orphans), n)
    m["отброшено как несвежие"] = float(dropped)
    m["доля отброшенных"] = _share(dropped, n)
    problems = check_chain(tables)
    try:
        m["несовпадений версии верификатора"] = float(len(verifier_mismatches(tables)))
    except ValueError:
        m["несовпадений версии верификатора"] = math.nan  # цепочка неоднозначна
    m["нарушений цепочки"] = float(len(problems))

    rows = [
        (group, name, m[name], METRIC_UNITS[name])
        for group, names in METRIC_GROUPS.items()
        for name in names
    ]
    out = pd.DataFrame(rows, columns=["группа", "метрика", "значение", "единицы"])
    return out.set_index(["группа", "метрика"])
