"""Конвейер RL-цикла: формулы двух этапов, очередь роллаутов и дискретно-событийная модель (урок 12.3).

* Замкнутые формулы: ``sequential_cycle`` (G + T), ``pipelined_period`` (max(G, T)),
  ``pipeline_total_time``, ``speedup``, ``group_utilization``, ``truncate_durations``,
  ``best_device_split`` (как поделить K устройств между генерацией и обучением).
* ``SimConfig`` и ``simulate``: модель асинхронного цикла на SimPy. Сборщики (collectors) берут
  опубликованную версию весов, генерируют роллаут и кладут его в очередь; тренер набирает пакет
  из очереди, обучается и публикует новую версию. Результат ``SimResult`` — таблицы pandas:
  роллауты, глубина очереди, шаги оптимизатора, интервалы стадий (для ``tracing.gantt``).
* ``profile_over_lag``: профиль 120 виртуальных секунд по глубине перекрытия (как в лекции).
* Временная шкала: ``sum_of_work``, ``critical_path``, ``pool_utilization``,
  ``steady_state_throughput``; график ``plot_queue``.

Коэффициенты модели (скорости, разброс длин, рост разброса весов важности с задержкой) выбраны
для демонстрации механизма, а не измерены: универсального «лучшего» режима из них не вывести.
Замер скорости: ``python -m course_utils.pipeline benchmark``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import numbers
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from course_utils.args import is_int
from course_utils.offpolicy import normalized_ess

__all__ = [
    "LENGTH_DISTS",
    "WAIT_STAGES",
    "SimConfig",
    "SimResult",
    "best_device_split",
    "critical_path",
    "group_utilization",
    "pipeline_total_time",
    "pipelined_period",
    "plot_queue",
    "pool_utilization",
    "PROFILE_BASE",
    "PROFILE_COLUMNS",
    "PROFILE_INDEX",
    "PROFILE_INDEX_NOTE",
    "profile_over_lag",
    "queue_above_threshold",
    "sequential_cycle",
    "simulate",
    "speedup",
    "steady_state_throughput",
    "sum_of_work",
    "truncate_durations",
]

LENGTH_DISTS = ("lognormal", "deterministic", "uniform")
# Стадии ожидания: не работа, а простой исполнителя (не входят в сумму работы и загрузку пулов).
WAIT_STAGES = ("queue_wait", "backpressure")
_EPS = 1e-9


# --------------------------------------------------------------------------- проверки входа


def _real(name: str, value: Any, low: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and math.isfinite(float(value))
    if not ok or float(value) < low or (strict and float(value) == low):
        rel = ">" if strict else "≥"
        raise ValueError(f"{name} должно быть конечным числом {rel} {low:g}, получено {value!r}")
    return float(value)


def _int(name: str, value: Any, low: int) -> int:
    if not is_int(value) or value < low:
        raise ValueError(f"{name} должно быть целым числом ≥ {low}, получено {value!r}")
    return int(value)


def _reals(name: str, values: Any) -> np.ndarray:
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise ValueError(f"{name} должно быть последовательностью чисел, получено {values!r}")
    out = [_real(f"{name}[{i}]", v) for i, v in enumerate(values)]
    if not out:
        raise ValueError(f"{name} не должно быть пустым")
    return np.asarray(out, dtype=float)


# --------------------------------------------------------------------------- замкнутые формулы


def sequential_cycle(G: float, T: float) -> float:
    """Цикл последовательного режима: C_seq = G + T, с (G — сбор роллаутов, T — обучение)."""
    return _real("G", G) + _real("T", T)


def pipelined_period(G: float, T: float) -> float:
    """Период заполненного двухступенчатого конвейера: C_pipe = max(G, T), с."""
    return max(_real("G", G), _real("T", T))


def pipeline_total_time(G: float, T: float, n: int) -> float:
    """Время n пакетов в идеальном конвейере: T_n = G + T + (n − 1)·max(G, T), с; n ≥ 1."""
    n = _int("n", n, 1)
    return sequential_cycle(G, T) + (n - 1) * pipelined_period(G, T)


def speedup(G: float, T: float, n: int | None = None) -> float:
    """Ускорение конвейера: n·(G + T) / T_n, при n = None (n → ∞) — (G + T) / max(G, T), раз.

    Предел не больше 2 и достигается только при G ≈ T; пример лекции G = 90 с, T = 10 с даёт 1,11×.
    """
    if pipelined_period(G, T) == 0:
        raise ValueError(f"G и T не могут быть оба нулевыми: {G=}, {T=}")
    if n is None:
        return sequential_cycle(G, T) / pipelined_period(G, T)
    return _int("n", n, 1) * sequential_cycle(G, T) / pipeline_total_time(G, T, n)


def group_utilization(durations: Iterable[float]) -> float:
    """Утилизация группы: U = Σ d_i / (n · max d_i), доля; d_i — времена роллаутов группы, с.

    Группа ждёт самого медленного: [4, 4, 5, 5, 5, 6, 6, 20] с → 55 / 160 ≈ 0,344.
    """
    d = _reals("durations", durations)
    if d.max() <= 0:
        raise ValueError("durations: хотя бы одно время должно быть > 0")
    return float(d.sum() / (len(d) * d.max()))


def truncate_durations(durations: Iterable[float], timeout: float) -> tuple[np.ndarray, np.ndarray]:
    """Обрезка хвоста по тайм-ауту: d_i' = min(d_i, timeout), с; плюс маска d_i > timeout.

    Возвращает (обрезанные времена, булев массив «обрезан»). Долю обрезанных стоит указывать в
    отчёте: если сложные задачи дольше, обрезка смещает данные к простым примерам.
    """
    d = _reals("durations", durations)
    timeout = _real("timeout", timeout, strict=True)
    return np.minimum(d, timeout), d > timeout


def best_device_split(
    K: int, gen_rate_per_device: float, train_rate_per_device: float
) -> tuple[int, int, float]:
    """Целое разбиение K устройств: max min(k_gen·r_g, k_train·r_t) при k_gen + k_train = K.

    r_g, r_t — скорости одного устройства (токенов/с). Каждому этапу нужно ≥ 1 устройства, K ≥ 2.
    Возвращает (k_gen, k_train, скорость конвейера в токенах/с). При равенстве скоростей
    (относительная точность 1e−12) выбирается вариант с меньшим k_gen. Масштабирование считается
    линейным — это приближение: сеть, проверяющая система или память могут стать узким местом.
    """
    K = _int("K", K, 2)
    r_g = _real("gen_rate_per_device", gen_rate_per_device, strict=True)
    r_t = _real("train_rate_per_device", train_rate_per_device, strict=True)
    best = (0, 0, -1.0)
    for k_gen in range(1, K):
        rate = min(k_gen * r_g, (K - k_gen) * r_t)
        if rate > best[2] and not math.isclose(rate, best[2], rel_tol=1e-12):
            best = (k_gen, K - k_gen, rate)
    return best


# --------------------------------------------------------------------------- конфигурация


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Параметры модели асинхронного RL-цикла (время — виртуальные секунды, объём — токены).

    Генерация: ``num_collectors`` сборщиков, у каждого роллаут стоит prefill_s + tokens /
    decode_tokens_per_s (+ reward_s на проверку). Длина — из ``length_dist``: "lognormal" (среднее
    mean_tokens до обрезки, σ логарифма length_sigma), "deterministic" (ровно mean_tokens),
    "uniform" (целые от 1 до 2·mean_tokens − 1); всё обрезается по max_tokens.
    Обучение: шаг на пакете из tokens токенов длится tokens / (train_tokens_per_s·num_trainers)
    (forward_backward, идеальное масштабирование) + train_fixed_s (optimizer_step) +
    weight_sync_s (weight_sync); после этого публикуется версия v + 1.

    Обратное давление ограничивает ЗАПУСК новых роллаутов, а не начатые работы; сборщик начинает,
    только если выполнены все заданные пороги (None — без ограничения):
    * max_queue_tokens / max_queue_rollouts — в очереди меньше стольких токенов / роллаутов;
    * max_age_s — самый старый роллаут в очереди ждёт меньше max_age_s секунд;
    * max_policy_lag = η — задержка политики (lag = версия шага − версия генерации) ≤ η:
      новый роллаут версии v допускается, если очередь меньше остатка ёмкости шагов v…v+η
      ((η+1)·batch_tokens − уже набрано тренером, пока шаг v собирается; η·batch_tokens, когда
      пакет шага v закрыт); незавершённые роллауты входят в счёт по mean_tokens каждый (их
      длина ещё неизвестна, как running в AReaL). Оценка может ошибаться, поэтому гарантию даёт
      тренер: при drop_stale=False шаг s ждёт и забирает все роллауты
      версий ≤ s − η (пакет может превысить batch_tokens); при drop_stale=True пакет закрывается
      по batch_tokens, а роллауты с lag > η выбрасываются при извлечении из очереди.
      η = 0 — строго синхронный режим: генерация только текущей версией, тренер обучается только
      на данных текущей версии и ждёт всех начатых роллаутов.
    Пакет: тренер берёт роллауты из очереди по порядку (FIFO), пока не наберёт batch_tokens.
    Версию весов сборщик берёт в момент запуска роллаута (смена весов посреди роллаута и пауза
    сборщиков на загрузку весов не моделируются: weight_sync_s тратит только тренер).
    is_sigma_per_lag — синтетические веса важности: log w ~ N(0, (σ0·lag)²), σ0 иллюстративна.
    """

    duration_s: float = 120.0
    seed: int = 0
    num_collectors: int = 8
    batch_tokens: int = 4096
    num_trainers: int = 1
    max_queue_tokens: int | None = None
    max_queue_rollouts: int | None = None
    max_age_s: float | None = None
    max_policy_lag: int | None = None
    drop_stale: bool = False
    length_dist: str = "lognormal"
    mean_tokens: float = 512.0
    length_sigma: float = 0.6
    max_tokens: int = 2048
    decode_tokens_per_s: float = 128.0
    prefill_s: float = 0.2
    reward_s: float = 0.0
    train_tokens_per_s: float = 1200.0
    train_fixed_s: float = 0.3
    weight_sync_s: float = 0.5
    is_sigma_per_lag: float = 0.3

    def __post_init__(self) -> None:
        _real("duration_s", self.duration_s, strict=True)
        _int("seed", self.seed, 0)
        for name in ("num_collectors", "batch_tokens", "num_trainers", "max_tokens"):
            _int(name, getattr(self, name), 1)
        for name in ("max_queue_tokens", "max_queue_rollouts"):
            if getattr(self, name) is not None:
                _int(name, getattr(self, name), 1)
        if self.max_policy_lag is not None:
            _int("max_policy_lag", self.max_policy_lag, 0)
        if self.max_age_s is not None:
            _real("max_age_s", self.max_age_s, strict=True)
        if not isinstance(self.drop_stale, bool):
            raise ValueError(f"drop_stale должно быть True или False, получено {self.drop_stale!r}")
        if self.length_dist not in LENGTH_DISTS:
            raise ValueError(
                f"length_dist должно быть одним из {LENGTH_DISTS}: {self.length_dist!r}"
            )
        _real("mean_tokens", self.mean_tokens, low=1.0)
        for name in ("length_sigma", "prefill_s", "reward_s", "train_fixed_s", "weight_sync_s"):
            _real(name, getattr(self, name))
        _real("is_sigma_per_lag", self.is_sigma_per_lag)
        for name in ("decode_tokens_per_s", "train_tokens_per_s"):
            _real(name, getattr(self, name), strict=True)
        if self.mean_tokens > self.max_tokens:
            raise ValueError(
                f"mean_tokens не может превышать max_tokens: {self.mean_tokens=}, {self.max_tokens=}"
            )


# --------------------------------------------------------------------------- модель на SimPy


@dataclasses.dataclass
class SimResult:
    """Итог ``simulate``: таблицы rollouts, queue, steps, events и словарь summary.

    rollouts — строка на начатый роллаут (NaN: ещё не дошёл до этой стадии к концу прогона);
    queue — глубина очереди после каждого изменения (time, depth_rollouts, depth_tokens) и токены
    незавершённых роллаутов в этот момент (in_flight_tokens); steps — строка на завершённый шаг
    оптимизатора; events — интервалы стадий (worker, stage, start_s, end_s, trace_id).
    """

    config: SimConfig
    rollouts: pd.DataFrame
    queue: pd.DataFrame
    steps: pd.DataFrame
    events: pd.DataFrame
    summary: dict

    def dependencies(self) -> dict[int, list[int]]:
        """Зависимости для ``critical_path(result.events, deps)``: номер строки → предшественники.

        forward_backward шага s зависит от последней стадии каждого его роллаута; prefill роллаута
        версии v ≥ 1 — от weight_sync, опубликовавшего v. Порядок на одном исполнителе добавляет
        ``critical_path`` сам.
        """
        ev, first, last, trainer = self.events, {}, {}, {}
        for i, (w, st, tid) in enumerate(zip(ev["worker"], ev["stage"], ev["trace_id"])):
            if w.startswith("collector") and st not in WAIT_STAGES:
                first.setdefault(tid, i)  # первая и последняя стадии роллаута tid
                last[tid] = i
            elif w == "trainer-0":
                trainer[(st, tid)] = i
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

        self.cfg = cfg
        self.env = simpy.Environment()
        self.version = 0  # опубликованная версия = номер шага, который сейчас делает тренер
        self.collecting = True  # тренер набирает пакет (False: обучение / синхронизация весов)
        self.batch_collected = 0  # токены, уже взятые тренером в текущий пакет
        self.queue: deque[dict] = deque()
        self.queued_tokens = 0
        self.in_flight_tokens = 0
        self.in_flight_by_version: Counter[int] = Counter()
        self.rollouts: list[dict] = []
        self.queue_log = [(0.0, 0, 0, 0)]
        self.steps: list[dict] = []
        self.events: list[tuple] = []
        self.open: dict[str, tuple] = {}
        self.trainers = [f"trainer-{i}" for i in range(cfg.num_trainers)]
        self.z: list[float] = []  # по номеру роллаута: z ~ N(0, 1) для log w = σ0·lag·z
        self._changed = self.env.event()

    # ---- служебное: «что-то изменилось» и журнал стадий
    def notify(self) -> None:
        self._changed.succeed()
        self._changed = self.env.event()

    def begin(self, worker: str, stage: str, trace_id: str | None = None) -> None:
        now = self.env.now
        if worker in self.open:
            w_stage, start, tid = self.open[worker]
            if now > start:
                self.events.append((worker, w_stage, start, now, tid))
        self.open[worker] = (stage, now, trace_id)

    def log_queue(self) -> None:
        row = (self.env.now, len(self.queue), self.queued_tokens, self.in_flight_tokens)
        self.queue_log.append(row)

    # ---- обратное давление: можно ли начать новый роллаут
    def may_start(self) -> bool:
        cfg = self.cfg
        if cfg.max_queue_tokens is not None and self.queued_tokens >= cfg.max_queue_tokens:
            return False
        if cfg.max_queue_rollouts is not None and len(self.queue) >= cfg.max_queue_rollouts:
            return False
        if cfg.max_age_s is not None and self.queue:
            if self.env.now - self.queue[0]["enqueue_time"] >= cfg.max_age_s:
                return False
        if cfg.max_policy_lag is not None:
            eta, B = cfg.max_policy_lag, cfg.batch_tokens
            capacity = (eta + 1) * B - self.batch_collected if self.collecting else eta * B
            in_flight = sum(self.in_flight_by_version.values()) * cfg.mean_tokens  # оценка
            if self.queued_tokens + in_flight >= capacity:
                return False
        return True

    def draw_tokens(self, rng: np.random.Generator) -> int:
        cfg = self.cfg
        if cfg.length_dist == "deterministic":
            x = cfg.mean_tokens
        elif cfg.length_dist == "uniform":
            x = rng.integers(1, max(2, round(2 * cfg.mean_tokens)))
        else:
            x = rng.lognormal(math.log(cfg.mean_tokens) - cfg.length_sigma**2 / 2, cfg.length_sigma)
        return int(min(max(round(x), 1), cfg.max_tokens))

    # ---- сборщик: допуск → prefill → decode → (reward) → в очередь
    def collector(self, c: int):
        cfg, env, worker, nan = self.cfg, self.env, f"collector-{c}", math.nan
        rng = np.random.default_rng([cfg.seed, c])
        while True:
            self.begin(worker, "backpressure")
            while not self.may_start():
                yield self._changed
            tokens = self.draw_tokens(rng)
            z = rng.standard_normal()  # шум синтетического веса важности (общий для всех lag)
            truncated = tokens >= cfg.max_tokens and cfg.length_dist != "deterministic"
            values = (len(self.rollouts), c, env.now, nan, nan, nan, tokens, truncated)
            row = dict(zip(_ROLLOUT_COLUMNS, (*values, self.version, nan, False, nan)))
            self.rollouts.append(row)
            self.z.append(z)
            tid = f"r{row['rollout_id']}"
            self.in_flight_tokens += tokens
            self.in_flight_by_version[self.version] += 1
            for stage, dt in (
                ("prefill", cfg.prefill_s),
                ("decode", tokens / cfg.decode_tokens_per_s),
            ):
                self.begin(worker, stage, tid)
                yield env.timeout(dt)
            row["gen_end"] = env.now
            if cfg.reward_s > 0:
                self.begin(worker, "reward", tid)
                yield env.timeout(cfg.reward_s)
            row["enqueue_time"] = env.now
            self.queue.append(row)
            self.queued_tokens += tokens
            self.in_flight_tokens -= tokens
            self.in_flight_by_version[row["behavior_version"]] -= 1
            self.log_queue()
            self.notify()

    # ---- тренер: набор пакета → forward_backward → optimizer_step → weight_sync → версия + 1
    def next_for_batch(self, s: int) -> dict | None:
        """Следующий роллаут для пакета шага s или None (пакет готов либо очередь пуста)."""
        cfg = self.cfg
        if self.batch_collected < cfg.batch_tokens:
            return self.queue[0] if self.queue else None
        if cfg.max_policy_lag is None or cfg.drop_stale:
            return None
        oldest_ok = s - cfg.max_policy_lag  # версии ≤ oldest_ok обязаны войти в шаг s
        return next((r for r in self.queue if r["behavior_version"] <= oldest_ok), None)

    def batch_ready(self, s: int) -> bool:
        cfg = self.cfg
        if self.batch_collected < cfg.batch_tokens:
            return False
        if cfg.max_policy_lag is None or cfg.drop_stale:
            return True
        oldest_ok = s - cfg.max_policy_lag
        return all(n == 0 for v, n in self.in_flight_by_version.items() if v <= oldest_ok)

    def trainer(self):
        cfg, env = self.cfg, self.env
        while True:
            s = self.version
            collect_start = env.now
            batch: list[dict] = []
            for w in self.trainers:
                self.begin(w, "queue_wait")
            while True:
                r = self.next_for_batch(s)
                if r is None:
                    if self.batch_ready(s):
                        break
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
            tokens = self.batch_collected
            train_start = env.now
            for stage, dt in (
                ("forward_backward", tokens / (cfg.train_tokens_per_s * cfg.num_trainers)),
                ("optimizer_step", cfg.train_fixed_s),
                ("weight_sync", cfg.weight_sync_s),
            ):
                for w in self.trainers:
                    self.begin(w, stage, f"s{s}")
                yield env.timeout(dt)
            lags = np.array([s - r["behavior_version"] for r in batch], dtype=float)
            logw = np.array([r["log_weight"] for r in batch])
            ess_norm = normalized_ess(logw, log=True)  # ESS/n пакета
            values = (s, collect_start, train_start, env.now, tokens, len(batch), lags.mean())
            self.steps.append(dict(zip(_STEP_COLUMNS, (*values, lags.max(), ess_norm, s + 1))))
            self.version += 1
            self.collecting = True
            self.batch_collected = 0
            self.notify()


def simulate(config: SimConfig | None = None) -> SimResult:
    """Прогон модели асинхронного цикла на config.duration_s виртуальных секунд (SimPy).

    summary: throughput_tokens_per_s = токены завершённых шагов / duration_s; задержки политики
    (lag = consumed_version − behavior_version, версий) по взятым в пакеты роллаутам; ess_norm —
    среднее по шагам ESS/n = (Σw)² / (n·Σw²) синтетических весов; доли простоя — время стадий
    queue_wait (тренер) и backpressure (сборщики) от полного времени; peak_queue_tokens — пик
    очереди (может превышать max_queue_tokens на объём незавершённых работ). Одинаковый seed —
    одинаковые таблицы.
    """
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

    rollouts = pd.DataFrame(loop.rollouts, columns=list(_ROLLOUT_COLUMNS))
    rollouts = rollouts.astype(_ROLLOUT_COLUMNS)
    queue = pd.DataFrame(
        loop.queue_log, columns=["time", "depth_rollouts", "depth_tokens", "in_flight_tokens"]
    )
    steps = pd.DataFrame(loop.steps, columns=list(_STEP_COLUMNS)).astype(_STEP_COLUMNS)
    events = pd.DataFrame(loop.events, columns=["worker", "stage", "start_s", "end_s", "trace_id"])
    events = events.sort_values(["start_s", "worker"], kind="stable").reset_index(drop=True)
    return SimResult(
        cfg, rollouts, queue, steps, events, _summary(cfg, rollouts, queue, steps, events)
    )


_ROLLOUT_COLUMNS = {
    **dict.fromkeys(["rollout_id", "collector"], "int64"),
    **dict.fromkeys(["gen_start", "gen_end", "enqueue_time", "dequeue_time"], "float64"),
    **{"tokens": "int64", "truncated": "bool", "behavior_version": "int64"},
    **{"consumed_version": "float64", "dropped": "bool", "log_weight": "float64"},
}
_STEP_COLUMNS = {
    **dict.fromkeys(["step"], "int64"),
    **dict.fromkeys(["collect_start", "start", "end"], "float64"),
    **dict.fromkeys(["tokens", "rollouts"], "int64"),
    **{"mean_lag": "float64", "max_lag": "int64", "ess_norm": "float64"},
    **{"version_published": "int64"},
}


def _summary(cfg, rollouts, queue, steps, events) -> dict:
    H = cfg.duration_s
    taken = rollouts[rollouts["consumed_version"].notna()]
    lag = taken["consumed_version"] - taken["behavior_version"]
    busy = events["end_s"] - events["start_s"]
    is_trainer = events["worker"] == "trainer-0"
    trainer_wait = busy[is_trainer & (events["stage"] == "queue_wait")].sum()
    collector_wait = busy[events["stage"] == "backpressure"].sum()
    in_queue = rollouts["enqueue_time"].notna() & rollouts["dequeue_time"].isna()
    return {
        "duration_s": H,
        "throughput_tokens_per_s": float(steps["tokens"].sum() / H),
        "generated_tokens_per_s": float(
            rollouts.loc[rollouts["enqueue_time"].notna(), "tokens"].sum() / H
        ),
        "optimizer_steps": len(steps),
        "mean_policy_lag": float(lag.mean()) if len(lag) else math.nan,
        "max_policy_lag": int(lag.max()) if len(lag) else 0,
        "ess_norm": float(steps["ess_norm"].mean()) if len(steps) else math.nan,
        "trainer_idle_share": float(trainer_wait / H),
        "collector_idle_share": float(collector_wait / (cfg.num_collectors * H)),
        "peak_queue_tokens": int(queue["depth_tokens"].max()),
        "peak_queue_rollouts": int(queue["depth_rollouts"].max()),
        "mean_queue_time_s": float((taken["dequeue_time"] - taken["enqueue_time"]).mean()),
        "started": len(rollouts),
        "consumed": len(taken),
        "dropped": int(rollouts["dropped"].sum()),
        "queued_at_end": int(in_queue.sum()),
        "in_flight_at_end": int(rollouts["enqueue_time"].isna().sum()),
        "truncated_share": float(rollouts["truncated"].mean()) if len(rollouts) else 0.0,
    }


# Столбцы profile_over_lag: заголовок → что он значит (ноутбук печатает пояснения из словаря).
PROFILE_COLUMNS = {
    "пропускная способность, токенов/с": "токены завершённых шагов оптимизатора / длительность "
    "прогона (при конечном η пакет бывает больше batch_tokens: шаг s забирает все роллауты версий "
    "≤ s − η)",
    "сгенерировано, токенов/с": "токены роллаутов, дошедших до очереди, / длительность прогона",
    "шагов оптимизатора": "сколько шагов тренер завершил за прогон",
    "средняя задержка, версий": "среднее по взятым в пакеты роллаутам: версия шага − версия "
    "генерации",
    "макс. задержка, версий": "наибольшая такая задержка за прогон",
    "ESS/n": "среднее по шагам (Σw)² / (n·Σw²) синтетических весов важности, доля от 1",
    "простой тренера, %": "доля времени прогона, когда тренер ждал пакет (`queue_wait`)",
    "простой сборщиков, %": "доля времени сборщиков в обратном давлении (`backpressure`)",
    "пик очереди, токенов": "наибольшая глубина очереди за прогон",
}
PROFILE_INDEX = "предел задержки η"
PROFILE_INDEX_NOTE = (
    "`max_policy_lag`: сборщик не начинает роллаут, который попал бы в шаг с задержкой больше η "
    "версий; «∞» — без предела"
)
# Профиль лекции: 120 виртуальных секунд, seed 0, 8 сборщиков, пакет 4096 токенов, 1 тренер.
# Декодирование 160 токенов/с на сборщик: генерация (≈ 8 · 512 / 3.4 с ≈ 1200 токенов/с) быстрее
# обучения (4096 токенов за 4096 / 1200 + 0.8 с ≈ 970 токенов/с), поэтому без предела η очередь
# и задержка растут со временем, и строка «∞» отличается от строк с пределом.
PROFILE_BASE = SimConfig(decode_tokens_per_s=160.0)


def profile_over_lag(
    base: SimConfig | None = None, lags: Iterable[int | None] = (0, 1, 2, 4, None)
):
    """Профиль по глубине перекрытия: строка на max_policy_lag = η (None — без предела, «∞»).

    Остальные параметры — из base (по умолчанию ``PROFILE_BASE``: 120 виртуальных секунд,
    8 сборщиков, пакет 4096 токенов, 1 тренер, seed 0, генерация быстрее обучения). Столбцы и
    их смысл — ``PROFILE_COLUMNS``, индекс ``PROFILE_INDEX`` («0», «1», …, «∞»). Коэффициенты
    модели иллюстративны: таблица показывает механизм, а не «лучший» интервал.
    """
    base = PROFILE_BASE if base is None else base
    if not isinstance(base, SimConfig):
        raise ValueError(f"base должно быть SimConfig или None, получено {type(base)}")
    if isinstance(lags, str | bytes) or not isinstance(lags, Iterable):
        raise ValueError(f"lags должно быть последовательностью целых ≥ 0 или None: {lags!r}")
    rows, index = [], []
    for eta in list(lags):
        if eta is not None:
            _int("lags[...]", eta, 0)
        s = simulate(dataclasses.replace(base, max_policy_lag=eta)).summary
        index.append("∞" if eta is None else str(eta))
        values = (
            round(s["throughput_tokens_per_s"], 1),
            round(s["generated_tokens_per_s"], 1),
            s["optimizer_steps"],
            round(s["mean_policy_lag"], 2),
            s["max_policy_lag"],
            round(s["ess_norm"], 3),
            round(100 * s["trainer_idle_share"], 1),
            round(100 * s["collector_idle_share"], 1),
            s["peak_queue_tokens"],
        )
        rows.append(dict(zip(PROFILE_COLUMNS, values)))
    if not rows:
        raise ValueError("lags не должно быть пустым")
    return pd.DataFrame(rows, index=pd.Index(index, name=PROFILE_INDEX))


def queue_above_threshold(result: SimResult, threshold_tokens: float | None = None) -> dict:
    """Сколько очередь провела выше порога θ и насколько его превысила (токены, доли).

    share_above — доля времени прогона H с глубиной > θ: Σ dt·[d > θ] / H; share_after_first —
    та же доля от первого достижения θ до конца; peak_tokens и overshoot_tokens = max(0, пик −
    θ); overshoot_share = overshoot_tokens / θ; max_in_flight_tokens — наибольший объём начатых,
    но не дошедших до очереди роллаутов (порог их не останавливает). θ по умолчанию —
    result.config.max_queue_tokens.
    """
    if not isinstance(result, SimResult):
        raise ValueError(f"result должно быть SimResult, получено {type(result)}")
    thr = result.config.max_queue_tokens if threshold_tokens is None else threshold_tokens
    thr = _real("threshold_tokens", thr, strict=True) if thr is not None else None
    if thr is None:
        raise ValueError("threshold_tokens: у прогона нет max_queue_tokens — укажите порог")
    q = result.queue.drop_duplicates("time", keep="last")
    t = np.append(q["time"].to_numpy(dtype=float), result.config.duration_s)
    d, dt = q["depth_tokens"].to_numpy(dtype=float), np.diff(t)
    reached = np.flatnonzero(d >= thr)
    first = t[reached[0]] if len(reached) else result.config.duration_s
    after = result.config.duration_s - first
    peak = float(d.max())
    return {
        "threshold_tokens": thr,
        "share_above": float(dt[d > thr].sum() / result.config.duration_s),
        "first_reached_s": float(first),
        "share_after_first": float(dt[d > thr].sum() / after) if after > 0 else 0.0,
        "peak_tokens": int(peak),
        "overshoot_tokens": int(max(0.0, peak - thr)),
        "overshoot_share": max(0.0, peak - thr) / thr,
        "max_in_flight_tokens": int(result.queue["in_flight_tokens"].max()),
    }


# --------------------------------------------------------------------------- временная шкала


def _intervals(intervals: Any, exclude_stages: Iterable[str]) -> pd.DataFrame:
    from course_utils.tracing import _to_frame

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
    intervals: Any,
    deps: Mapping[int, Iterable[int]] | None = None,
    exclude_stages: Iterable[str] = WAIT_STAGES,
    unlimited_workers: Iterable[str] = (),
) -> tuple[float, pd.DataFrame]:
    """Критический путь: самая длинная по сумме длительностей цепочка зависимых интервалов, с.

    Модель зависимостей: интервал зависит (1) от предыдущего интервала того же исполнителя —
    последнего закончившегося не позже его начала, и (2) от интервалов из deps[номер строки]
    (номера — позиции строк intervals). Стадии ожидания не считаются работой и пропускаются.
    Исполнители из unlimited_workers правило (1) не соблюдают: как будто у каждой их работы
    свой исполнитель (пул без ограничения размера), остаются только зависимости по данным.
    Длина пути — нижняя граница времени той же работы при этих ресурсах; возвращает
    (длина, цепочка).
    """
    if isinstance(unlimited_workers, str) or not isinstance(unlimited_workers, Iterable):
        raise ValueError(f"unlimited_workers должно быть списком имён: {unlimited_workers!r}")
    unlimited = {str(w) for w in unlimited_workers}
    df = _intervals(intervals, exclude_stages)
    if df.empty:
        raise ValueError("intervals: нет ни одного интервала работы")
    deps = {} if deps is None else deps
    if not isinstance(deps, Mapping):
        raise ValueError(f"deps должно быть словарём «номер строки → предшественники»: {deps!r}")
    preds: dict[int, list[int]] = {}
    for i, d in deps.items():
        d = list(d) if isinstance(d, Iterable) else [d]
        bad = [j for j in [i, *d] if not is_int(j) or j not in df.index]
        if bad:
            raise ValueError(f"deps: номера строк вне intervals (или этапы ожидания): {bad}")
        preds[i] = d
    start, end = df["start_s"].to_dict(), df["end_s"].to_dict()
    for worker, g in df.groupby(df["worker"].astype(str), sort=False):
        if worker in unlimited:
            continue
        ends: list[tuple[float, int]] = []  # (end_s, строка) раньше начавшихся, по возрастанию
        for i in sorted(g.index, key=lambda j: (start[j], end[j])):
            pos = bisect.bisect_right(ends, (start[i] + _EPS, math.inf))
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
    intervals: Any,
    pools: Mapping[str, str],
    horizon: float | None = None,
    exclude_stages: Iterable[str] = WAIT_STAGES,
) -> pd.Series:
    """Загрузка пулов: U_пула = Σ_исполнителей занятое время / (число исполнителей · horizon), доля.

    pools — «исполнитель → пул»; занятое время исполнителя — объединение его интервалов работы
    на [0, horizon] (вложенные не считаются дважды). horizon по умолчанию — max end_s, с.
    """
    if not isinstance(pools, Mapping) or not pools:
        raise ValueError(f"pools должно быть непустым словарём «исполнитель → пул»: {pools!r}")
    df = _intervals(intervals, exclude_stages)
    if df.empty and horizon is None:
        raise ValueError("intervals: нет интервалов работы, а horizon не задан")
    unknown = sorted(set(df["worker"].astype(str)) - set(map(str, pools)))
    if unknown:
        raise ValueError(f"pools: не указан пул для исполнителей {unknown}")
    H = float(df["end_s"].max()) if horizon is None else _real("horizon", horizon, strict=True)
    if H <= 0:
        raise ValueError(f"horizon должно быть > 0, получено {H}")
    busy: Counter[str] = Counter()
    for w, g in df.groupby(df["worker"].astype(str)):
        cur_s, cur_e = None, None
        for s, e in sorted(zip(g["start_s"].clip(0, H), g["end_s"].clip(0, H))):
            if cur_e is None or s > cur_e:
                busy[w] += 0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy[w] += cur_e - cur_s
    size = Counter(pools.values())
    out = {
        p: sum(busy[str(w)] for w, q in pools.items() if q == p) / (n * H) for p, n in size.items()
    }
    return pd.Series(out, name="загрузка")


def steady_state_throughput(
    times: Iterable[float], amounts: Iterable[float], warmup: int = 1
) -> float:
    """Скорость в устойчивом режиме: Σ_{i ≥ w} a_i / (t_last − t_{w−1}), единиц/с.

    times — моменты завершения (с), amounts — объём каждого (например, токены шага). Первые
    warmup ≥ 1 завершений — прогрев: счёт идёт от последнего из них. Для периода P и объёма B
    даёт ровно B / P.
    """
    t, a = _reals("times", times), _reals("amounts", amounts)
    if len(t) != len(a):
        raise ValueError(f"times и amounts должны быть одной длины: {len(t)} и {len(a)}")
    warmup = _int("warmup", warmup, 1)
    if len(t) <= warmup:
        raise ValueError(f"нужно больше {warmup} завершений (warmup), получено {len(t)}")
    order = np.argsort(t, kind="stable")
    t, a = t[order], a[order]
    if t[-1] <= t[warmup - 1]:
        raise ValueError("times: после прогрева время не идёт (все завершения одновременны)")
    return float(a[warmup:].sum() / (t[-1] - t[warmup - 1]))


# --------------------------------------------------------------------------- график


def plot_queue(result: SimResult, ax=None, threshold_tokens: float | None = None):
    """График: токены в очереди во времени, порог и превышение порога (закрашено), ось x — с.

    threshold_tokens по умолчанию — result.config.max_queue_tokens (None — линии нет).
    Превышение порога — нормальный переходный процесс: порог останавливает запуск новых работ,
    а уже начатые роллауты всё равно приходят в очередь. Возвращает matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from course_utils.fmt import num

    if not isinstance(result, SimResult):
        raise ValueError(f"result должно быть SimResult, получено {type(result)}")
    thr = result.config.max_queue_tokens if threshold_tokens is None else threshold_tokens
    if thr is not None:
        thr = _real("threshold_tokens", thr, strict=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8))
    q = result.queue.drop_duplicates("time", keep="last")
    t = np.append(q["time"].to_numpy(), result.config.duration_s)
    d = np.append(q["depth_tokens"].to_numpy(), q["depth_tokens"].iloc[-1])
    ax.step(t, d, where="post", color="tab:blue", lw=1.4, label="токены в очереди")
    if thr is not None:
        label = f"порог запуска: {num(thr)} токенов"
        ax.axhline(thr, color="black", ls="--", lw=1.0, label=label)
        ax.fill_between(
            t,
            thr,
            np.maximum(d, thr),  # ниже порога полоса нулевой высоты
            step="post",
            color="tab:red",
            alpha=0.35,
            lw=0,
            label="выше порога: роллауты, начатые до его достижения",
        )
    ax.set_xlim(0, result.config.duration_s)
    ax.set_ylim(0, 1.45 * max(d.max(), thr or 0, 1))  # место для легенды над данными
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.yaxis.set_major_formatter(lambda y, _: num(int(y)))
    ax.set_xlabel("время, с (виртуальное)")
    ax.set_ylabel("глубина очереди, токенов")
    ax.set_title("Глубина очереди роллаутов")
    ax.grid(linestyle=":", alpha=0.6)
    ax.legend(loc="upper left", fontsize="small", ncols=1, frameon=True, framealpha=0.9)
    if ax.figure is not None:
        ax.figure.tight_layout()
    return ax


# --------------------------------------------------------------------------- замер скорости


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
    if sys.argv[1:] != ["benchmark"]:
        raise SystemExit("использование: python -m course_utils.pipeline benchmark")
    _benchmark()
