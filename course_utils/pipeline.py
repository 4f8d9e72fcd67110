"""Конвейер RL-цикла (урок 12.3): формулы двух этапов, модель асинхронного цикла, временная шкала.

Формулы последовательного и конвейерного цикла (G — сбор роллаутов, T — обучение, с); ``simulate``
— модель на SimPy (коэффициенты иллюстративны); ``critical_path``, ``sum_of_work``,
``pool_utilization`` читают интервалы стадий. ``python -m course_utils.pipeline benchmark`` —
замер скорости, ``… validate --json`` — проверка на настоящем цикле (``pipeline_validate``).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from course_utils.args import choice, flag, integer, is_int, nonnegative, positive, real
from course_utils.csv_tables import DATA_DIR, read_exact_csv
from course_utils.fmt import num
from course_utils.offpolicy import normalized_ess
from course_utils.plots import finish_axes, get_axes
from course_utils.tracing_plots import _to_frame

# Стадии ожидания: не работа, а простой исполнителя (не входят в сумму работы и загрузку пулов).
WAIT_STAGES = ("queue_wait", "backpressure")


def _reals(name: str, values: Any) -> np.ndarray:
    """Непустая последовательность конечных чисел ≥ 0 → массив float64."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise ValueError(f"{name} должно быть последовательностью чисел, получено {values!r}")
    out = np.array([nonnegative(f"{name}[{i}]", v) for i, v in enumerate(values)], dtype=float)
    if not out.size:
        raise ValueError(f"{name} не должно быть пустым")
    return out


# --------------------------------------------------------------------------- замкнутые формулы


def sequential_cycle(G: float, T: float) -> float:
    """Цикл последовательного режима: C_seq = G + T, с (G — сбор роллаутов, T — обучение)."""
    return nonnegative("G", G) + nonnegative("T", T)


def pipelined_period(G: float, T: float) -> float:
    """Период заполненного двухступенчатого конвейера: C_pipe = max(G, T), с."""
    return max(nonnegative("G", G), nonnegative("T", T))


def pipeline_total_time(G: float, T: float, n: int) -> float:
    """Время n пакетов в идеальном конвейере: T_n = G + T + (n − 1)·max(G, T), с; n ≥ 1."""
    return sequential_cycle(G, T) + (integer("n", n, 1, strict=True) - 1) * pipelined_period(G, T)


def speedup(G: float, T: float, n: int | None = None) -> float:
    """Ускорение конвейера: n·(G + T) / T_n, при n = None (n → ∞) — (G + T) / max(G, T) ≤ 2, раз."""
    if pipelined_period(G, T) == 0:
        raise ValueError(f"G и T не могут быть оба нулевыми: {G=}, {T=}")
    if n is None:
        return sequential_cycle(G, T) / pipelined_period(G, T)
    return integer("n", n, 1, strict=True) * sequential_cycle(G, T) / pipeline_total_time(G, T, n)


def group_utilization(durations: Iterable[float]) -> float:
    """Утилизация группы: U = Σ d_i / (n · max d_i), доля; d_i — времена роллаутов группы, с."""
    d = _reals("durations", durations)
    if d.max() <= 0:
        raise ValueError("durations: хотя бы одно время должно быть > 0")
    return float(d.sum() / (len(d) * d.max()))


def truncate_durations(durations: Iterable[float], timeout: float) -> tuple[np.ndarray, np.ndarray]:
    """Обрезка хвоста по тайм-ауту: d_i' = min(d_i, timeout), с; плюс маска «обрезан» d_i > timeout."""
    d = _reals("durations", durations)
    timeout = positive("timeout", timeout)
    return np.minimum(d, timeout), d > timeout


def best_device_split(
    K: int, gen_rate_per_device: float, train_rate_per_device: float
) -> tuple[int, int, float]:
    """(k_gen, k_train, токенов/с) = argmax min(k_gen·r_g, k_train·r_t), k_gen + k_train = K ≥ 2;
    r_g, r_t — токенов/с на устройство (линейное масштабирование), при ничьей — меньший k_gen."""
    K = integer("K", K, 2, strict=True)
    r_g = positive("gen_rate_per_device", gen_rate_per_device)
    r_t = positive("train_rate_per_device", train_rate_per_device)
    rates = {k: min(k * r_g, (K - k) * r_t) for k in range(1, K)}  # k_gen → токенов/с
    top = max(rates.values())
    k_gen = next(k for k, rate in rates.items() if math.isclose(rate, top, rel_tol=1e-12))
    return k_gen, K - k_gen, rates[k_gen]


# --------------------------------------------------------------------------- конфигурация

_COUNTS = {"seed": 0, "num_collectors": 1, "batch_tokens": 1, "max_tokens": 1}
_LIMITS = {"max_queue_tokens": 1, "max_policy_lag": 0}  # None — без предела
_POSITIVE = ("duration_s", "decode_tokens_per_s", "train_tokens_per_s")
_NONNEG = ("length_sigma", "prefill_s", "train_fixed_s", "weight_sync_s", "is_sigma_per_lag")


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Параметры модели асинхронного RL-цикла (время — виртуальные секунды, объём — токены).

    Роллаут: prefill_s + tokens / decode_tokens_per_s; длина — length_dist ("lognormal": среднее
    mean_tokens, σ логарифма length_sigma; "deterministic"; "uniform": 1…2·mean_tokens − 1), не
    больше max_tokens; measured_rollouts — пары (токены, с) вместо них. Шаг тренера: tokens /
    train_tokens_per_s + train_fixed_s + weight_sync_s, версия + 1. Обратное давление (None — нет)
    запрещает ЗАПУСК роллаута при очереди ≥ max_queue_tokens или задержке > max_policy_lag = η;
    шаг s ждёт все версии ≤ s − η (drop_stale=True — выбрасывает lag > η). Пакет — FIFO до
    batch_tokens (batch_when_ready — разом, как уровень C); log w ~ N(0, (is_sigma_per_lag·lag)²).
    """

    duration_s: float = 120.0
    seed: int = 0
    num_collectors: int = 8
    batch_tokens: int = 4096
    max_queue_tokens: int | None = None
    max_policy_lag: int | None = None
    drop_stale: bool = False
    length_dist: str = "lognormal"
    mean_tokens: float = 512.0
    length_sigma: float = 0.6
    max_tokens: int = 2048
    decode_tokens_per_s: float = 128.0
    prefill_s: float = 0.2
    train_tokens_per_s: float = 1200.0
    train_fixed_s: float = 0.3
    weight_sync_s: float = 0.5
    is_sigma_per_lag: float = 0.3
    batch_when_ready: bool = False
    measured_rollouts: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        for name, low in (_COUNTS | _LIMITS).items():
            if name in _COUNTS or getattr(self, name) is not None:
                integer(name, getattr(self, name), low, strict=True)
        for name in _POSITIVE:
            positive(name, getattr(self, name))
        for name in _NONNEG:
            nonnegative(name, getattr(self, name))
        flag("drop_stale", self.drop_stale)
        flag("batch_when_ready", self.batch_when_ready)
        pairs = self.measured_rollouts
        if pairs is not None and not (
            isinstance(pairs, tuple) and pairs and {*map(len, pairs)} == {2}
        ):
            raise ValueError(f"measured_rollouts: нужны пары (токены, с), получено {pairs!r}")
        for i, (tokens, seconds) in enumerate(pairs or ()):
            integer(f"measured_rollouts[{i}][0]", tokens, 1, strict=True)
            nonnegative(f"measured_rollouts[{i}][1]", seconds)
        choice("length_dist", self.length_dist, ("lognormal", "deterministic", "uniform"))
        real("mean_tokens", self.mean_tokens, 1.0, self.max_tokens)


# --------------------------------------------------------------------------- модель на SimPy


@dataclasses.dataclass
class SimResult:
    """Итог ``simulate``: rollouts (строка на роллаут, NaN — стадия не пройдена), queue (глубина и
    in_flight_tokens после изменений), steps (шаги), events (интервалы стадий), summary."""

    config: SimConfig
    rollouts: pd.DataFrame
    queue: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame
    summary: dict

    def dependencies(self) -> dict[int, list[int]]:
        """Зависимости для ``critical_path``: строка → предшественники (forward_backward шага ждёт
        своих роллаутов, prefill роллаута версии v ≥ 1 — weight_sync, опубликовавшего v)."""
        ev = self.events
        work = ev[ev["worker"].str.startswith("collector") & ~ev["stage"].isin(WAIT_STAGES)]
        rows = work.index.to_series().groupby(work["trace_id"])
        first, last = rows.min().to_dict(), rows.max().to_dict()  # стадии роллаута trace_id
        tr = ev[ev["worker"] == "trainer-0"]
        trainer = dict(zip(zip(tr["stage"], tr["trace_id"]), tr.index))
        deps: dict[int, list[int]] = {}
        r = self.rollouts
        for rid, v, cv in zip(r["rollout_id"], r["behavior_version"], r["consumed_version"]):
            tid = f"r{rid}"
            sync = trainer.get(("weight_sync", f"s{v - 1}"))  # опубликовал версию v
            fb = trainer.get(("forward_backward", f"s{cv:.0f}"))  # шаг, взявший роллаут
            if tid in first and sync is not None:
                deps.setdefault(first[tid], []).append(sync)
            if tid in last and fb is not None:
                deps.setdefault(fb, []).append(last[tid])
        return deps


class _Loop:
    """Состояние системы: очередь, версия весов, фаза тренера; процессы сборщиков и тренера."""

    def __init__(self, cfg: SimConfig) -> None:
        import simpy

        self.cfg, self.env = cfg, simpy.Environment()
        self.version = 0  # опубликованная версия = номер шага, который сейчас делает тренер
        self.collecting = True  # тренер набирает пакет (False: обучение / синхронизация весов)
        self.batch_collected = 0  # токены, уже взятые тренером в текущий пакет
        self.queue: deque[dict] = deque()
        self.queued_tokens = self.in_flight_tokens = 0
        self.in_flight_by_version: Counter[int] = Counter()  # версия → незавершённых роллаутов
        self.rollouts, self.steps, self.events = [], [], []  # строки таблиц результата
        self.queue_log = [(0.0, 0, 0, 0)]
        self.open: dict[str, tuple] = {}  # исполнитель → (стадия, начало, trace_id)
        self.z: list[float] = []  # по номеру роллаута: z ~ N(0, 1) для log w = σ0·lag·z
        self._changed = self.env.event()

    def notify(self) -> None:
        """Будит всех, кто ждёт изменения состояния."""
        self._changed.succeed()
        self._changed = self.env.event()

    def begin(self, worker: str, stage: str, trace_id: str | None = None) -> None:
        """Закрывает текущий интервал исполнителя (если он не нулевой) и открывает стадию stage."""
        now = self.env.now
        if worker in self.open:
            w_stage, start, tid = self.open[worker]
            if now > start:
                self.events.append((worker, w_stage, start, now, tid))
        self.open[worker] = (stage, now, trace_id)

    def work(self, worker: str, stage: str, trace_id: str, seconds: float):
        """Стадия работы длиной seconds у исполнителя worker (процесс SimPy: ``yield from``)."""
        self.begin(worker, stage, trace_id)
        yield self.env.timeout(seconds)

    def log_queue(self) -> None:
        row = (self.env.now, len(self.queue), self.queued_tokens, self.in_flight_tokens)
        self.queue_log.append(row)

    def may_start(self) -> bool:
        """Обратное давление: можно ли начать новый роллаут (все заданные пороги соблюдены)."""
        cfg = self.cfg
        if cfg.max_queue_tokens is not None and self.queued_tokens >= cfg.max_queue_tokens:
            return False
        if cfg.max_policy_lag is not None:  # остаток ёмкости шагов v…v+η, токенов
            eta, B = cfg.max_policy_lag, cfg.batch_tokens
            capacity = (eta + 1) * B - self.batch_collected if self.collecting else eta * B
            in_flight = sum(self.in_flight_by_version.values()) * cfg.mean_tokens  # оценка
            if self.queued_tokens + in_flight >= capacity:
                return False
        return True

    def draw_tokens(self, rng: np.random.Generator) -> tuple[int, float]:
        """(токены, время decode, с): измеренная пара или length_dist и decode_tokens_per_s."""
        cfg = self.cfg
        if cfg.measured_rollouts is not None:
            return cfg.measured_rollouts[rng.integers(len(cfg.measured_rollouts))]
        if cfg.length_dist == "deterministic":
            x = cfg.mean_tokens
        elif cfg.length_dist == "uniform":
            x = rng.integers(1, max(2, round(2 * cfg.mean_tokens)))
        else:
            x = rng.lognormal(math.log(cfg.mean_tokens) - cfg.length_sigma**2 / 2, cfg.length_sigma)
        tokens = int(min(max(round(x), 1), cfg.max_tokens))
        return tokens, tokens / cfg.decode_tokens_per_s

    def collector(self, c: int):
        """Сборщик c: допуск → prefill → decode → в очередь."""
        cfg, env, worker, nan = self.cfg, self.env, f"collector-{c}", math.nan
        rng = np.random.default_rng([cfg.seed, c])
        while True:
            self.begin(worker, "backpressure")
            while not self.may_start():
                yield self._changed
            tokens, decode_s = self.draw_tokens(rng)
            self.z.append(rng.standard_normal())  # шум синтетического веса важности
            truncated = tokens >= cfg.max_tokens and cfg.length_dist != "deterministic"
            truncated &= cfg.measured_rollouts is None
            values = (len(self.rollouts), c, env.now, nan, nan, nan, tokens, truncated)
            row = dict(zip(_ROLLOUT_COLUMNS, (*values, self.version, nan, False, nan)))
            self.rollouts.append(row)
            tid = f"r{row['rollout_id']}"
            self.in_flight_tokens += tokens
            self.in_flight_by_version[self.version] += 1
            yield from self.work(worker, "prefill", tid, cfg.prefill_s)
            yield from self.work(worker, "decode", tid, decode_s)
            row["gen_end"] = row["enqueue_time"] = env.now
            self.queue.append(row)
            self.queued_tokens += tokens
            self.in_flight_tokens -= tokens
            self.in_flight_by_version[row["behavior_version"]] -= 1
            self.log_queue()
            self.notify()

    def overdue(self, version: int, s: int) -> bool:
        """Роллаут версии version обязан войти в шаг s: задан η, drop_stale=False, version ≤ s − η."""
        eta = self.cfg.max_policy_lag
        return eta is not None and not self.cfg.drop_stale and version <= s - eta

    def next_for_batch(self, s: int) -> dict | None:
        """Следующий роллаут для пакета шага s или None (пакет готов либо очередь пуста)."""
        if self.batch_collected < self.cfg.batch_tokens:
            return self.queue[0] if self.queue else None
        return next((r for r in self.queue if self.overdue(r["behavior_version"], s)), None)

    def batch_ready(self, s: int) -> bool:
        """Пакет набран, и ни один незавершённый роллаут не обязан войти в шаг s."""
        pending = any(n and self.overdue(v, s) for v, n in self.in_flight_by_version.items())
        return self.batch_collected >= self.cfg.batch_tokens and not pending

    def trainer(self):
        """Тренер: набор пакета → forward_backward → optimizer_step → weight_sync → версия + 1."""
        cfg, env = self.cfg, self.env
        while True:
            s, collect_start, batch = self.version, env.now, []
            self.begin("trainer-0", "queue_wait")
            while cfg.batch_when_ready and self.queued_tokens < cfg.batch_tokens:
                yield self._changed
            while (r := self.next_for_batch(s)) is not None or not self.batch_ready(s):  # набор
                if r is None:
                    yield self._changed
                    continue
                self.queue.remove(r)
                self.queued_tokens -= r["tokens"]
                r["dequeue_time"] = env.now
                lag = s - r["behavior_version"]
                if cfg.drop_stale and cfg.max_policy_lag is not None and lag > cfg.max_policy_lag:
                    r["dropped"] = True
                else:
                    r["consumed_version"] = s
                    r["log_weight"] = cfg.is_sigma_per_lag * lag * self.z[r["rollout_id"]]
                    batch.append(r)
                    self.batch_collected += r["tokens"]
                self.log_queue()
                self.notify()
            self.collecting = False
            self.notify()
            tokens, train_start, tid = self.batch_collected, env.now, f"s{s}"
            fb_s = tokens / cfg.train_tokens_per_s
            yield from self.work("trainer-0", "forward_backward", tid, fb_s)
            yield from self.work("trainer-0", "optimizer_step", tid, cfg.train_fixed_s)
            yield from self.work("trainer-0", "weight_sync", tid, cfg.weight_sync_s)
            lags = np.array([s - r["behavior_version"] for r in batch], dtype=float)
            ess_norm = normalized_ess(np.array([r["log_weight"] for r in batch]), log=True)
            values = (s, collect_start, train_start, env.now, tokens, len(batch), lags.mean())
            self.steps.append(dict(zip(_STEP_COLUMNS, (*values, lags.max(), ess_norm, s + 1))))
            self.version += 1
            self.collecting = True
            self.batch_collected = 0
            self.notify()


def simulate(config: SimConfig | None = None) -> SimResult:
    """Прогон модели на config.duration_s виртуальных секунд (тот же seed — те же таблицы).
    summary: throughput = токены завершённых шагов / duration_s, lag = consumed_version −
    behavior_version (версий), ess_norm — среднее по шагам ESS/n = (Σw)² / (n·Σw²)."""
    cfg = SimConfig() if config is None else config
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"config должно быть SimConfig или None, получено {type(cfg)}")
    loop = _Loop(cfg)
    for c in range(cfg.num_collectors):
        loop.env.process(loop.collector(c))
    loop.env.process(loop.trainer())
    loop.env.run(until=cfg.duration_s)
    for worker in list(loop.open):
        loop.begin(worker, "end")  # закрываем незавершённые интервалы на границе прогона
    rollouts = pd.DataFrame(loop.rollouts, columns=list(_ROLLOUT_COLUMNS)).astype(_ROLLOUT_COLUMNS)
    queue_columns = ["time", "depth_rollouts", "depth_tokens", "in_flight_tokens"]
    queue = pd.DataFrame(loop.queue_log, columns=queue_columns)
    steps = pd.DataFrame(loop.steps, columns=list(_STEP_COLUMNS)).astype(_STEP_COLUMNS)
    events = pd.DataFrame(loop.events, columns=["worker", "stage", "start_s", "end_s", "trace_id"])
    events = events.sort_values(["start_s", "worker"], kind="stable").reset_index(drop=True)
    summary = _summary(cfg, rollouts, queue, steps, events)
    return SimResult(cfg, rollouts, queue, steps, events, summary)


_ROLLOUT_COLUMNS = {
    **dict.fromkeys(["rollout_id", "collector"], "int64"),
    **dict.fromkeys(["gen_start", "gen_end", "enqueue_time", "dequeue_time"], "float64"),
    **{"tokens": "int64", "truncated": "bool", "behavior_version": "int64"},
    **{"consumed_version": "float64", "dropped": "bool", "log_weight": "float64"},
}
_STEP_COLUMNS = {
    **{"step": "int64", "collect_start": "float64", "start": "float64", "end": "float64"},
    **{"tokens": "int64", "rollouts": "int64", "mean_lag": "float64", "max_lag": "int64"},
    **{"ess_norm": "float64", "version_published": "int64"},
}


def _summary(cfg, rollouts, queue, steps, events) -> dict:
    H = cfg.duration_s
    taken = rollouts[rollouts["consumed_version"].notna()]
    lag = taken["consumed_version"] - taken["behavior_version"]
    busy = events["end_s"] - events["start_s"]
    trainer_wait = busy[(events["worker"] == "trainer-0") & (events["stage"] == "queue_wait")]
    enqueued = rollouts["enqueue_time"].notna()
    backpressure = busy[events["stage"] == "backpressure"].sum()
    out = {"duration_s": H, "throughput_tokens_per_s": float(steps["tokens"].sum() / H)}
    out["generated_tokens_per_s"] = float(rollouts.loc[enqueued, "tokens"].sum() / H)
    out["optimizer_steps"] = len(steps)
    out["mean_policy_lag"] = float(lag.mean())  # NaN, если роллауты не взяты
    out["max_policy_lag"] = int(lag.max()) if len(lag) else 0
    out["ess_norm"] = float(steps["ess_norm"].mean())
    out["trainer_idle_share"] = float(trainer_wait.sum() / H)
    out["collector_idle_share"] = float(backpressure / (cfg.num_collectors * H))
    out["peak_queue_tokens"] = int(queue["depth_tokens"].max())
    out["mean_queue_time_s"] = float((taken["dequeue_time"] - taken["enqueue_time"]).mean())
    out |= {"started": len(rollouts), "consumed": len(taken)}
    out["dropped"] = int(rollouts["dropped"].sum())
    out["queued_at_end"] = int((enqueued & rollouts["dequeue_time"].isna()).sum())
    return out | {"in_flight_at_end": int((~enqueued).sum())}


# Столбцы profile_over_lag: заголовок, ключ summary, множитель, знаков после запятой (пусто —
# целое без округления) и что столбец значит (ноутбук печатает пояснения из PROFILE_COLUMNS).
_PROFILE = [
    row
    for _, row in read_exact_csv(
        DATA_DIR / "pipeline_profile_columns.csv",
        ("column", "summary_key", "scale", "digits", "note"),
        "столбцы профиля",
    )
]
PROFILE_COLUMNS = {row["column"]: row["note"] for row in _PROFILE}
PROFILE_INDEX = "предел задержки η"
PROFILE_INDEX_NOTE = (
    "`max_policy_lag`: сборщик не начинает роллаут, который попал бы в шаг с задержкой больше η "
    "версий; «∞» — без предела"
)
# Профиль лекции: 120 виртуальных секунд, seed 0, 8 сборщиков, пакет 4096 токенов, 1 тренер.
# Генерация (≈ 8 · 512 / 3.4 с ≈ 1200 токенов/с) быстрее обучения (≈ 970 токенов/с), поэтому
# без предела η очередь и задержка растут, и строка «∞» отличается от строк с пределом.
PROFILE_BASE = SimConfig(decode_tokens_per_s=160.0)


def profile_over_lag(base: SimConfig | None = None) -> pd.DataFrame:
    """Профиль по глубине перекрытия: строка на max_policy_lag = η ∈ 0, 1, 2, 4, «∞» (None),
    остальное — из base (``PROFILE_BASE``); столбцы — ``PROFILE_COLUMNS``."""
    base = PROFILE_BASE if base is None else base
    lags, rows = (0, 1, 2, 4, None), []
    for eta in lags:
        s = simulate(dataclasses.replace(base, max_policy_lag=eta)).summary
        row = {}
        for column, key, scale, digits, _ in (r.values() for r in _PROFILE):
            row[column] = round(float(scale) * s[key], int(digits)) if digits else s[key]
        rows.append(row)
    index = pd.Index(["∞" if eta is None else str(eta) for eta in lags], name=PROFILE_INDEX)
    return pd.DataFrame(rows, index=index)


def _queue_steps(result: Any, threshold_tokens: float | None):
    """Порог θ (threshold_tokens или max_queue_tokens прогона, None — нет) и ступени очереди:
    моменты t (с концом прогона, на один длиннее) и глубины d, токенов."""
    thr = result.config.max_queue_tokens if threshold_tokens is None else threshold_tokens
    q = result.queue.drop_duplicates("time", keep="last")
    t = np.append(q["time"].to_numpy(dtype=float), result.config.duration_s)
    thr = None if thr is None else positive("threshold_tokens", thr)
    return thr, t, q["depth_tokens"].to_numpy(dtype=float)


def queue_above_threshold(result: SimResult, threshold_tokens: float | None = None) -> dict:
    """Время выше порога θ и превышение: share_above = Σ dt·[d > θ] / H (H — прогон, с),
    share_after_first — от первого достижения θ; overshoot_tokens = max(0, пик − θ),
    overshoot_share = overshoot / θ; max_in_flight_tokens — пик начатых роллаутов, токенов."""
    thr, t, d = _queue_steps(result, threshold_tokens)
    if thr is None:
        raise ValueError("threshold_tokens: у прогона нет max_queue_tokens — укажите порог")
    H = result.config.duration_s
    above_s = np.diff(t)[d > thr].sum()
    reached = np.flatnonzero(d >= thr)
    first = t[reached[0]] if len(reached) else H
    peak = float(d.max())
    overshoot = max(0.0, peak - thr)
    return {
        "threshold_tokens": thr,
        "share_above": float(above_s / H),
        "first_reached_s": float(first),
        "share_after_first": float(above_s / (H - first)) if H > first else 0.0,
        "peak_tokens": int(peak),
        "overshoot_tokens": int(overshoot),
        "overshoot_share": overshoot / thr,
        "max_in_flight_tokens": int(result.queue["in_flight_tokens"].max()),
    }


# --------------------------------------------------------------------------- временная шкала


def _intervals(intervals: Any, exclude_stages: Iterable[str]) -> pd.DataFrame:
    try:
        df = _to_frame(intervals, "intervals").reset_index(drop=True)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith("intervals") else f"intervals: {msg}") from None
    df = df.assign(start_s=df["start_s"].astype(float), end_s=df["end_s"].astype(float))
    return df[~df["stage"].isin(list(exclude_stages))]


def sum_of_work(intervals: Any, exclude_stages: Iterable[str] = WAIT_STAGES) -> float:
    """Сумма работы: W = Σ (end_s − start_s) по интервалам без стадий ожидания, с (GPU-секунды)."""
    df = _intervals(intervals, exclude_stages)
    return float((df["end_s"] - df["start_s"]).sum())


def critical_path(
    intervals: Any, deps: Mapping | None = None, unlimited_workers=()
) -> tuple[float, pd.DataFrame]:
    """Критический путь: L = max по цепочкам зависимых интервалов Σ (end_s − start_s), с →
    (L, цепочка). Интервал зависит от прошлого интервала своего исполнителя (кроме
    unlimited_workers — пул без предела размера) и от строк deps[номер строки]."""
    if isinstance(unlimited_workers, str):
        raise ValueError(f"unlimited_workers должно быть списком имён: {unlimited_workers!r}")
    unlimited = {str(w) for w in unlimited_workers}
    df = _intervals(intervals, WAIT_STAGES)
    if df.empty:
        raise ValueError("intervals: нет ни одного интервала работы")
    preds = {i: list(d) for i, d in (deps or {}).items()}  # строка → предшественники
    if bad := [j for i, d in preds.items() for j in [i, *d] if not is_int(j) or j not in df.index]:
        raise ValueError(f"deps: номера строк вне intervals (или этапы ожидания): {bad}")
    start, end = df["start_s"].to_dict(), df["end_s"].to_dict()
    for worker, g in df.groupby(df["worker"].astype(str), sort=False):
        if worker in unlimited:
            continue
        ends: list[tuple[float, int]] = []  # (end_s, строка) раньше начавшихся, по возрастанию
        for i in sorted(g.index, key=lambda j: (start[j], end[j])):
            pos = bisect.bisect_right(ends, (start[i] + 1e-9, math.inf))  # допуск округления
            if pos:  # предыдущий интервал того же исполнителя: самый поздний конец ≤ start_s
                preds.setdefault(i, []).append(ends[pos - 1][1])
            bisect.insort(ends, (end[i], i))
    best: dict[int, tuple[float, int | None]] = {}  # строка -> (длина пути до её конца, пред.)
    for i in sorted(df.index, key=lambda j: (end[j], start[j])):
        prev = (0.0, None)
        for j in preds.get(i, []):
            if j not in best:
                raise ValueError(f"deps: строка {i} зависит от строки {j}, которая кончается позже")
            prev = max(prev, (best[j][0], j), key=lambda x: x[0])
        best[i] = (prev[0] + end[i] - start[i], prev[1])
    last = max(best, key=lambda j: best[j][0])
    length, chain = best[last][0], []
    while last is not None:
        chain.append(last)
        last = best[last][1]
    return float(length), df.loc[chain[::-1]]


def pool_utilization(
    intervals: Any, pools: Mapping[str, str], horizon: float | None = None
) -> pd.Series:
    """Загрузка пулов: U = Σ занятое время / (исполнителей пула · H), доля; pools — «исполнитель
    → пул», занятое время — объединение интервалов на [0, H], H = horizon или max end_s, с."""
    if not isinstance(pools, Mapping) or not pools:
        raise ValueError(f"pools должно быть непустым словарём «исполнитель → пул»: {pools!r}")
    df = _intervals(intervals, WAIT_STAGES)
    if df.empty and horizon is None:
        raise ValueError("intervals: нет интервалов работы, а horizon не задан")
    if unknown := sorted(set(df["worker"].astype(str)) - set(map(str, pools))):
        raise ValueError(f"pools: не указан пул для исполнителей {unknown}")
    H = positive("horizon", df["end_s"].max() if horizon is None else horizon)
    busy: Counter[str] = Counter()
    for w, g in df.sort_values("start_s").groupby(df["worker"].astype(str)):
        start, end = g["start_s"].clip(0, H), g["end_s"].clip(0, H)
        covered = end.cummax().shift(fill_value=0.0)  # конец объединения прошлых интервалов
        busy[w] = (end - np.maximum(start, covered)).clip(lower=0).sum()  # новое занятое, с
    size = Counter(pools.values())
    out = {
        p: sum(busy[str(w)] for w, q in pools.items() if q == p) / (n * H) for p, n in size.items()
    }
    return pd.Series(out, name="загрузка")


# --------------------------------------------------------------------------- график


def plot_queue(result: SimResult, ax=None, threshold_tokens: float | None = None):
    """График: токены в очереди во времени (с), порог θ (по умолчанию max_queue_tokens) и
    превышение (закрашено: начатые до порога роллауты всё равно приходят)."""
    from matplotlib.ticker import MaxNLocator

    thr, t, d = _queue_steps(result, threshold_tokens)
    d = np.append(d, d[-1])
    ax = get_axes(ax, (10, 3.8))
    ax.step(t, d, where="post", color="tab:blue", lw=1.4, label="токены в очереди")
    if thr is not None:
        ax.axhline(thr, color="black", ls="--", lw=1.0, label=f"порог запуска: {num(thr)} токенов")
        label = "выше порога: роллауты, начатые до его достижения"
        ax.fill_between(  # ниже порога полоса нулевой высоты
            t, thr, np.maximum(d, thr), step="post", color="tab:red", alpha=0.35, lw=0, label=label
        )
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.yaxis.set_major_formatter(lambda y, _: num(int(y)))
    ax.grid(linestyle=":", alpha=0.6)  # поверх заливки: без set_axisbelow
    return finish_axes(
        ax,
        xlim=(0, result.config.duration_s),
        ylim=(0, 1.45 * max(d.max(), thr or 0, 1)),  # место для легенды над данными
        xlabel="время, с (виртуальное)",
        ylabel="глубина очереди, токенов",
        title="Глубина очереди роллаутов",
        legend={"loc": "upper left", "fontsize": "small", "frameon": True, "framealpha": 0.9},
    )


def _benchmark() -> None:
    t0 = time.perf_counter()
    table = profile_over_lag()
    t1 = time.perf_counter()
    for eta in (0, 1, 2, 4, 8, None):
        for n in (2, 4, 8, 16):
            simulate(SimConfig(num_collectors=n, max_policy_lag=eta))
    t2 = time.perf_counter()
    print(table.to_string())
    print(f"профиль 120 с по задержке ({len(table)} конфигураций): {t1 - t0:.3f} с (цель < 0,5 с)")
    print(f"перебор 24 конфигураций: {t2 - t1:.3f} с (цель < 10 с)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["validate"]:
        from course_utils.pipeline_validate import main

        sys.exit(main(sys.argv[2:]))
    if sys.argv[1:] != ["benchmark"]:
        raise SystemExit("использование: python -m course_utils.pipeline benchmark | validate …")
    _benchmark()
