"""Замер времени по стадиям и трасса «роллаут → шаг оптимизатора» (уроки 12.1–12.5).

``StageTimer`` пишет события стадий, ``percentiles`` и ``gantt`` их сводят и рисуют. Цепочка
трассировки 12.5.2 (``TRACE_CHAIN``): запрос → роллаут → версия поведения → версия верификатора
→ пакет → шаг оптимизатора → версия после шага; таблицы ``TraceTables`` строят ``trace_from_*``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pandas as pd

from course_utils.args import integer, is_number, real, text
from course_utils.arith_task import VERIFIER_VERSION, is_informative_group, scalar_reward
from course_utils.csv_tables import DATA_DIR, read_exact_csv
from course_utils.fmt import listing
from course_utils.tracing_plots import (  # noqa: F401
    BASE_COLUMNS,
    _events_to_frame,
    _to_frame,
    gantt,
    stage_label,
    worker_label,
)


class _Event(dict):
    """Событие стадии (словарь) с длительностью duration_s = end_s − start_s, с."""

    @property
    def duration_s(self) -> float:
        return self["end_s"] - self["start_s"]


class StageTimer:
    """Таймер стадий: событие = (worker, stage, start_s, end_s), секунды от t0 (по умолчанию —
    создание таймера); step и worker стадии — необязательные поля события.

    ``sync`` (например, torch.cuda.synchronize) вызывается перед каждым чтением ``clock`` в
    ``stage``, иначе асинхронная работа GPU попала бы не в ту стадию. Стадии можно вкладывать.
    worker=None — события без исполнителя, если его не назвала стадия.
    """

    def __init__(
        self,
        worker: str | None = "main",
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        t0: float | None = None,
    ) -> None:
        self.worker = None if worker is None else text("worker", worker)
        self.sync, self.clock = sync, clock
        self._events: list[dict[str, Any]] = []  # в порядке начала; открытые — без end_s
        self.t0 = float(clock() if t0 is None else t0)

    def now(self) -> float:
        """Секунды от t0 по clock, без sync."""
        return float(self.clock()) - self.t0

    def _synced_now(self) -> float:
        if self.sync is not None:
            self.sync()
        return self.now()

    def _event(self, stage: str, step: Any, worker: str | None) -> _Event:
        fields = {"worker": worker or self.worker, "stage": stage, "step": step}
        event = _Event((k, v) for k, v in fields.items() if v is not None)
        self._events.append(event)  # list.append атомарен: события пишут и два потока
        return event

    def add(self, stage: str, start_s: float, duration_s: float, step=None, worker=None) -> None:
        """Событие замеренного снаружи интервала: end_s = start_s + duration_s, с."""
        self._event(stage, step, worker).update(start_s=start_s, end_s=start_s + duration_s)

    @contextlib.contextmanager
    def stage(self, name: str, step: Any = None, worker: str | None = None) -> Iterator[_Event]:
        """Замеряет блок ``with``: duration_s = end_s − start_s, с; пишется и при исключении."""
        event = self._event(text("name (имя этапа)", name), step, worker)
        event["start_s"] = self._synced_now()  # место — по началу, даже если внешняя открыта
        try:
            yield event
        finally:
            event["end_s"] = self._synced_now()

    @property
    def events(self) -> list[dict[str, Any]]:
        """Завершённые события (словари) в порядке начала стадий."""
        return [ev for ev in self._events if "end_s" in ev]

    def to_frame(self) -> pd.DataFrame:
        """Таблица событий: BASE_COLUMNS (duration_s = end_s − start_s, с)."""
        return _events_to_frame(self.events)

    def totals(self) -> dict[str, float]:
        """Время стадии T = Σ (end_s − start_s), с; вложенные стадии входят и во внешние."""
        out: dict[str, float] = {}
        for ev in self.events:
            out[ev["stage"]] = out.get(ev["stage"], 0.0) + ev.duration_s
        return out


def cuda_sync_or_none(device: Any) -> Callable[[], None] | None:
    """``sync`` для ``StageTimer``: torch.cuda.synchronize(device) для CUDA, иначе None."""
    if device is None:
        return None
    import torch

    dev = torch.device(device)
    return functools.partial(torch.cuda.synchronize, dev) if dev.type == "cuda" else None


def _numbers(name: str, values: Any, low: float | None = None, high: float | None = None):
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} должно быть последовательностью чисел, получено {type(values)}")
    return [real(f"{name}[{i}]", v, low, high) for i, v in enumerate(values)]


def percentiles(values: Iterable[float], qs: Iterable[float] = (50, 95, 99)) -> dict[str, float]:
    """Перцентили с линейной интерполяцией (как numpy.percentile): {"p50": …, "p95": …, "p99": …}.

    Для отсортированных x_0 ≤ … ≤ x_{n−1}: h = (n − 1)·q/100,
    p_q = x_⌊h⌋ + (h − ⌊h⌋)·(x_⌈h⌉ − x_⌊h⌋); единицы те же, что у values, q ∈ [0, 100].
    """
    xs = sorted(_numbers("values", values))
    if not xs:
        raise ValueError("values не должно быть пустым: перцентиль пустой выборки не определён")
    q_list = _numbers("qs", (qs,) if is_number(qs) else qs, 0.0, 100.0)
    if not q_list:
        raise ValueError("qs не должно быть пустым: укажите хотя бы один уровень из [0, 100]")
    out: dict[str, float] = {}
    for q in q_list:
        h = (len(xs) - 1) * q / 100.0
        lo = math.floor(h)
        hi = min(lo + 1, len(xs) - 1)
        out[f"p{q:g}"] = xs[lo] + (h - lo) * (xs[hi] - xs[lo])  # p_q = x_⌊h⌋ + (h − ⌊h⌋)·Δx
    return out


# ================================================================ цепочка трассировки (12.5.2)

TRACE_CHAIN = (
    "prompt_id",
    "rollout_id",
    "behavior_policy_version",
    "verifier_version",
    "training_batch_id",
    "optimizer_step",
    "resulting_policy_version",
)

# Обязательные столбцы таблиц трассы (дополнительные столбцы допустимы).
_TRACE_COLUMNS = {
    "prompts": ("prompt_id",),
    "rollouts": ("rollout_id", "prompt_id", "behavior_policy_version", "verifier_version")
    + ("reward", "tokens", "training_batch_id"),
    "batches": ("training_batch_id", "optimizer_step", "trainer_policy_version", "n_rollouts")
    + ("tokens", "rollout_ids", "complete"),
    "steps": ("optimizer_step", "resulting_policy_version", "expected_verifier_version"),
}

ORPHAN_REASONS = {
    "dropped": "отброшен как несвежий при извлечении из очереди",
    "queued": "ждал в очереди на конец прогона",
    "in_flight": "ещё генерировался или проверялся на конец прогона",
    "unknown": "причина неизвестна",
}

# Панель наблюдения: группа → {метрика: единицы} (KL, энтропии в таблицах трассы нет).
_METRICS_PATH = DATA_DIR / "dashboard_metrics.csv"
METRIC_GROUPS: dict[str, dict[str, str]] = {}
for _, _row in read_exact_csv(_METRICS_PATH, ("group", "metric", "unit"), "панель"):
    METRIC_GROUPS.setdefault(_row["group"], {})[_row["metric"]] = _row["unit"]
METRIC_UNITS = {name: unit for group in METRIC_GROUPS.values() for name, unit in group.items()}


@dataclasses.dataclass
class TraceTables:
    """Таблицы трассы (DataFrame) запросов, роллаутов, пакетов и шагов, связанные ``TRACE_CHAIN``.

    Отметки времени роллаутов (gen_start … dequeue_time) и horizon_s (длительность прогона) — с.
    """

    prompts: Any
    rollouts: Any
    batches: Any
    steps: Any
    source: str = ""
    horizon_s: float = math.nan


def _check_tables(tables: Any) -> TraceTables:
    if not isinstance(tables, TraceTables):
        raise ValueError(f"tables должно быть TraceTables, получено {type(tables).__name__}")
    for table, cols in _TRACE_COLUMNS.items():
        frame = getattr(tables, table)
        if not isinstance(frame, pd.DataFrame) or not set(cols) <= set(frame.columns):
            raise ValueError(f"tables.{table}: нужна таблица со столбцами {list(cols)}")
    return tables


def _is_missing(x: Any) -> bool:
    """None, NaN или pd.NA (скаляр); последовательности пропуском не считаются."""
    return x is None or (pd.api.types.is_scalar(x) and bool(pd.isna(x)))


def batch_id(k: int) -> str:
    """Идентификатор пакета шага k в трассе и журналах: "b0003"."""
    return f"b{int(k):04d}"


def _batches_frame(rollouts, trainer_version: Mapping[int, int], steps_done: set[int]):
    """Журнал пакетов по столбцу rollouts._step: пакет шага s — роллауты с _step = s."""
    rows = []
    for step in sorted(trainer_version):
        part = rollouts[rollouts["training_batch_id"].notna() & (rollouts["_step"] == step)]
        rows.append(
            {
                "training_batch_id": batch_id(step),
                "optimizer_step": int(step),
                "trainer_policy_version": int(trainer_version[step]),
                "n_rollouts": len(part),
                "tokens": int(part["tokens"].sum()),
                "rollout_ids": tuple(part["rollout_id"].tolist()),
                "complete": step in steps_done,
            }
        )
    return pd.DataFrame(rows, columns=list(_TRACE_COLUMNS["batches"]))


def _prompts_frame(rollouts) -> pd.DataFrame:
    counts = rollouts.groupby("prompt_id", sort=False).size()
    return pd.DataFrame({"prompt_id": counts.index.astype(object), "n_rollouts": counts.values})


# Отметки роллаута в синхронном цикле — границы стадий его шага: (стадия, столбец, агрегат).
_LOOP_STAMPS = {
    "gen_start": ("prepare", "start_s", "min"),
    "gen_end": ("decode", "end_s", "max"),
    "enqueue_time": ("reward", "end_s", "max"),
    "dequeue_time": ("logprob_recompute", "start_s", "min"),
}
_LOOP_STEP_EXTRA = ("loss", "mean_reward", "informative_groups", "clip_fraction", "grad_norm")
_LOOP_STEP_EXTRA += ("wall_s", "weight_sync_s", "peak_memory_bytes")


def _loop_step_times(events: pd.DataFrame) -> pd.DataFrame:
    """Строка на шаг: отметки _LOOP_STAMPS и границы шага start_s, end_s, с (NaN — стадии нет)."""
    by = events.groupby(["step", "stage"])
    out = pd.DataFrame(
        {
            key: by[col].agg(agg).unstack().reindex(columns=[stage])[stage]
            for key, (stage, col, agg) in _LOOP_STAMPS.items()
        }
    )
    out["start_s"] = events.groupby("step")["start_s"].min()
    out["end_s"] = events.groupby("step")["end_s"].max()
    return out.astype(float)


def trace_from_loop(loop_result: Any) -> TraceTables:
    """Таблицы трассы из ``policy.sequential_loop``: пакет k — записи шага k, версия после — k + 1.

    Записи шага k сгенерированы версией k; шаг k обучается на них и публикует версию k + 1
    (синхронный цикл, задержка 0). reward = Σ w·reward (``arith_task.scalar_reward``), tokens —
    токены ответа, отметки времени роллаута — стадии его шага, с; шаги ждут верификатор
    ``arith_task.VERIFIER_VERSION``.
    """
    steps, events, records = loop_result.steps, loop_result.events, list(loop_result.records)
    step_of_version = {int(v): int(s) for s, v in zip(steps["step"], steps["behavior_version"])}
    times = _loop_step_times(events)
    stamps = times.reindex(sorted(step_of_version.values()))[list(_LOOP_STAMPS)]
    stamp_of = stamps.to_dict("index")
    horizon = float(events["end_s"].max())  # с

    rows, prompt_tokens = [], {}
    for i, r in enumerate(records):
        version = r.policy_version
        if version is None or int(version) not in step_of_version:
            raise ValueError(
                f"loop_result.records[{i}]: версия политики {version!r} не совпадает ни с одной "
                "версией поведения шагов"
            )
        step = step_of_version[int(version)]
        prompt_tokens.setdefault(r.prompt_id, len(r.prompt_tokens))
        rows.append(
            {
                "rollout_id": r.sample_id,
                "trace_id": r.trace_id,
                "prompt_id": r.prompt_id,
                "group_id": r.group_id,
                "behavior_policy_version": int(version),
                "verifier_version": r.verifier_version,
                "reward": scalar_reward(r.reward),  # Σ w·reward
                "correctness": float(r.reward.get("correctness", math.nan)),
                "tokens": len(r.response_tokens),
                "stop_reason": r.stop_reason,
                **stamp_of[step],
                "dropped": False,
                "training_batch_id": batch_id(step),
                "_step": step,
            }
        )
    rollouts = pd.DataFrame(rows)
    trainer_version = {s: v for v, s in step_of_version.items()}
    batches = _batches_frame(rollouts, trainer_version, set(step_of_version.values()))
    rollouts = rollouts.drop(columns="_step")
    bounds = times.reindex(steps["step"].astype(int).tolist())
    step_rows = pd.DataFrame(
        {
            "optimizer_step": steps["step"].astype("int64").to_numpy(),
            "resulting_policy_version": (steps["behavior_version"].astype("int64") + 1).to_numpy(),
            "expected_verifier_version": VERIFIER_VERSION,
            "start_s": bounds["start_s"].to_numpy(),
            "end_s": bounds["end_s"].to_numpy(),
            **{c: steps[c].to_numpy() for c in _LOOP_STEP_EXTRA if c in steps},
        }
    )
    prompts = _prompts_frame(rollouts)
    prompts["prompt_tokens"] = prompts["prompt_id"].map(prompt_tokens)
    return TraceTables(prompts, rollouts, batches, step_rows, source="loop", horizon_s=horizon)


_SIM_STEP_EXTRA = ("collect_start", "mean_lag", "max_lag", "ess_norm")
_SIM_VERIFIER = "sim-verifier-v1"  # в модели конвейера верификатор не меняется


def trace_from_simulation(sim_result: Any) -> TraceTables:
    """Таблицы трассы из ``pipeline.simulate``: пакет шага s — роллауты с consumed_version = s.

    В модели нет запросов и наград: запрос ``sim-p{rollout_id}`` свой у каждого роллаута,
    reward = NaN, версия верификатора — «sim-verifier-v1». Роллаут с NaN в dequeue_time ни в один
    пакет не попал; пакет незавершённого шага записан с complete = False. horizon_s =
    config.duration_s, с.
    """
    src, st = sim_result.rollouts, sim_result.steps
    step = src["consumed_version"].astype("Int64")
    ids = src["rollout_id"].astype("int64")
    prompt_ids = ("sim-p" + ids.astype(str)).to_numpy()
    rollouts = pd.DataFrame(
        {
            "rollout_id": ids.to_numpy(),
            "collector": src["collector"].to_numpy(),
            "trace_id": ("r" + ids.astype(str)).to_numpy(),
            "prompt_id": prompt_ids,
            "group_id": prompt_ids,
            "behavior_policy_version": src["behavior_version"].astype("int64").to_numpy(),
            "verifier_version": _SIM_VERIFIER,
            "reward": math.nan,
            "tokens": src["tokens"].astype("int64").to_numpy(),
            **{c: src[c].to_numpy() for c in ("gen_start", "gen_end")},
            **{c: src[c].to_numpy() for c in ("enqueue_time", "dequeue_time")},
            "dropped": src["dropped"].astype(bool).to_numpy(),
            "training_batch_id": [None if _is_missing(s) else batch_id(s) for s in step],
        }
    )
    rollouts["training_batch_id"] = rollouts["training_batch_id"].astype(object)
    rollouts["_step"] = step.to_numpy()
    # Версия тренера при сборе пакета шага s равна s (версия публикуется после шага).
    trainer_version = {int(s): int(s) for s in step.dropna().unique()}
    trainer_version.update(
        {int(s): int(v) - 1 for s, v in zip(st["step"], st["version_published"])}
    )
    batches = _batches_frame(rollouts, trainer_version, {int(s) for s in st["step"]})
    rollouts = rollouts.drop(columns="_step")
    step_rows = pd.DataFrame(
        {
            "optimizer_step": st["step"].astype("int64").to_numpy(),
            "resulting_policy_version": st["version_published"].astype("int64").to_numpy(),
            "expected_verifier_version": _SIM_VERIFIER,
            "loss": math.nan,
            "start_s": st["start"].to_numpy(),
            "end_s": st["end"].to_numpy(),
            **{c: st[c].to_numpy() for c in _SIM_STEP_EXTRA},
        }
    )
    horizon = float(getattr(sim_result.config, "duration_s", math.nan))
    prompts = _prompts_frame(rollouts)
    return TraceTables(prompts, rollouts, batches, step_rows, "simulation", horizon)


def _merge(left, right, on: str, what: str):
    try:
        return left.merge(right, on=on, how="left", validate="many_to_one", suffixes=("", "_dup"))
    except pd.errors.MergeError as exc:
        raise ValueError(
            f"{what}: повторяющиеся {on}, цепочка неоднозначна (подробности — check_chain)"
        ) from exc


def full_chain(tables: TraceTables) -> pd.DataFrame:
    """Полная цепочка: строка на роллаут, столбцы ``TRACE_CHAIN``, затем остальные поля.

    rollouts ⟕ prompts по prompt_id ⟕ batches по training_batch_id ⟕ steps по optimizer_step
    (левые, validate="many_to_one": повтор id — ValueError, а не размноженные строки).
    Роллаут без пакета остаётся, дальше по цепочке — <NA>.
    """
    tables = _check_tables(tables)
    r = tables.rollouts
    dup = r["rollout_id"][r["rollout_id"].duplicated()].unique().tolist()
    if dup:
        raise ValueError(f"full_chain: повторяющиеся rollout_id в rollouts: {dup[:10]}")
    prompts = tables.prompts.rename(columns={"n_rollouts": "prompt_rollouts"})
    prompts = prompts.drop(columns=[c for c in prompts if c in r and c != "prompt_id"])
    out = _merge(r, prompts, "prompt_id", "full_chain: prompts")
    batches = tables.batches.drop(columns=["rollout_ids"])
    batches = batches.rename(columns={"n_rollouts": "batch_rollouts", "tokens": "batch_tokens"})
    out = _merge(out, batches, "training_batch_id", "full_chain: batches")
    steps = tables.steps.rename(columns={c: f"step_{c}" for c in tables.steps if c in out})
    steps = steps.rename(columns={"step_optimizer_step": "optimizer_step"})
    out = _merge(out, steps, "optimizer_step", "full_chain: steps")
    ints = ("behavior_policy_version", "optimizer_step", "resulting_policy_version")
    for c in (*ints, "trainer_policy_version", "batch_rollouts", "batch_tokens"):
        out[c] = out[c].astype("Int64")  # целые с пропусками: <NA> у роллаута без пакета
    return out[[*TRACE_CHAIN, *(c for c in out.columns if c not in TRACE_CHAIN)]]


def chain_for_rollout(tables: TraceTables, rollout_id: Any) -> pd.Series:
    """Цепочка одного роллаута: запрос → … → версия политики после шага (без пакета — <NA>)."""
    chain = full_chain(tables)
    hit = chain[chain["rollout_id"] == rollout_id]
    if len(hit) == 0:
        raise ValueError(f"rollout_id {rollout_id!r} нет в таблице rollouts")
    return hit.iloc[0]


def rollouts_for_step(tables: TraceTables, optimizer_step: Any) -> pd.DataFrame:
    """Роллауты пакета шага s — обратное соединение: r в ответе ⇔ цепочка r ведёт к шагу s.

    Шаг ищется в steps и в batches (пакет незавершённого шага тоже виден).
    """
    tables = _check_tables(tables)
    step = integer("optimizer_step", optimizer_step)
    known = set(tables.steps["optimizer_step"].dropna().astype(int))
    known |= set(tables.batches["optimizer_step"].dropna().astype(int))
    if step not in known:
        raise ValueError(f"optimizer_step {step} нет ни в steps, ни в batches")
    chain = full_chain(tables)
    return chain[chain["optimizer_step"] == step].reset_index(drop=True)


def find_orphans(tables: TraceTables) -> pd.DataFrame:
    """Осиротевшие роллауты — без пакета (training_batch_id пуст) — с причиной ``ORPHAN_REASONS``.

    reason — dropped, queued, in_flight или unknown, reason_text — по-русски.
    """
    r = _check_tables(tables).rollouts.copy()
    orphan = r["training_batch_id"].map(_is_missing).astype(bool)
    reason = pd.Series(None, index=r.index, dtype=object)
    reason[orphan] = "unknown"
    if {"enqueue_time", "dequeue_time"} <= set(r):
        waiting = orphan & r["dequeue_time"].map(_is_missing).astype(bool)
        in_flight = r["enqueue_time"].map(_is_missing).astype(bool)
        reason[waiting & in_flight] = "in_flight"
        reason[waiting & ~in_flight] = "queued"
    if "dropped" in r:
        reason[orphan & r["dropped"].astype(bool)] = "dropped"
    r["reason"] = reason
    out = r[r["reason"].notna()].reset_index(drop=True)
    out["reason_text"] = out["reason"].map(ORPHAN_REASONS)
    return out


def verifier_mismatches(tables: TraceTables, expected_version: Any = None) -> pd.DataFrame:
    """Роллауты из пакетов, чья версия верификатора ≠ ожидаемой их шагом.

    expected_version — строка (одна на все шаги) или None (steps.expected_verifier_version;
    шаг незавершённого пакета — версия последнего шага).
    Роллауты без пакета не сверяются (их ищет ``find_orphans``).
    """
    chain = full_chain(tables)  # проверяет tables
    used = chain[chain["optimizer_step"].notna()].copy()
    used_steps = [int(s) for s in used["optimizer_step"]]
    if isinstance(expected_version, str):
        expected = dict.fromkeys(used_steps, text("expected_version", expected_version))
    elif expected_version is None:
        steps = tables.steps.sort_values("optimizer_step")
        versions = steps["expected_verifier_version"]
        expected = dict(zip(steps["optimizer_step"].astype(int), versions))
        last = versions.iloc[-1] if len(steps) else None
        expected = {**dict.fromkeys(used_steps, last), **expected}
    else:
        raise ValueError(
            f"expected_version должно быть строкой или None, получено {expected_version!r}"
        )
    used["expected_verifier_version"] = [expected.get(s) for s in used_steps]
    ver, want = used["verifier_version"], used["expected_verifier_version"]
    out = used[ver.astype(object) != want.astype(object)]
    first = ["rollout_id", "optimizer_step", "verifier_version", "expected_verifier_version"]
    return out[first + [c for c in out.columns if c not in first]].reset_index(drop=True)


def _report(msgs: list[str], items: list, template: str) -> None:
    """Если items не пуст, добавляет template, где «{}» — первые пять items."""
    if items:
        msgs.append(template.replace("{}", listing(items, repr)))


def check_chain(tables: TraceTables) -> list[str]:
    """Разрывы цепочки трассы — список сообщений по-русски; пустой, если всё согласовано.

    Проверяется: уникальность идентификаторов и один пакет на шаг; ссылки роллаутов на известные
    запросы и пакеты; состав пакета (rollout_ids) = роллауты, указывающие на него, n_rollouts и
    tokens — по составу; у завершённого пакета есть шаг, у шага — пакет; версии не идут назад:
    resulting_policy_version растёт с шагом и = trainer_policy_version + 1, задержка ≥ 0.
    """
    tables = _check_tables(tables)
    p, r, b, s = tables.prompts, tables.rollouts, tables.batches, tables.steps
    msgs: list[str] = []
    ids = [("prompts", "prompt_id"), ("rollouts", "rollout_id"), ("batches", "training_batch_id")]
    for name, col in [*ids, ("steps", "optimizer_step"), ("batches", "optimizer_step")]:
        x = getattr(tables, name)[col]
        dups = x[x.duplicated() & x.notna()].unique().tolist()
        what = f"{name}: повторяющиеся {col}"
        if (name, col) == ("batches", "optimizer_step"):
            what = "batches: несколько пакетов на один шаг оптимизатора"
        _report(msgs, dups, what + ": {}")

    unknown = sorted({x for x in r["prompt_id"] if x not in set(p["prompt_id"].dropna())}, key=str)
    _report(msgs, unknown, "rollouts: ссылки на неизвестные запросы prompt_id: {}")
    linked = r[~r["training_batch_id"].map(_is_missing).astype(bool)]
    unknown = sorted(set(linked["training_batch_id"]) - set(b["training_batch_id"]), key=str)
    _report(msgs, unknown, "rollouts: ссылки на неизвестные пакеты training_batch_id: {}")

    batch_of: dict[Any, Any] = {}
    claims: dict[Any, list] = {}  # пакет → роллауты, которые на него указывают
    for rid, bid in zip(linked["rollout_id"], linked["training_batch_id"]):
        batch_of.setdefault(rid, bid)
        claims.setdefault(bid, []).append(rid)
    tokens_of = dict(zip(r["rollout_id"], r["tokens"]))
    step_ids = set(s["optimizer_step"].dropna().astype(int))
    trainer_of = {}  # пакет → версия тренера при его сборке
    for row in b.itertuples(index=False):
        bid, members, step = row.training_batch_id, row.rollout_ids, row.optimizer_step
        where = f"пакет {bid!r}"
        if isinstance(members, str) or not isinstance(members, Iterable):
            msgs.append(f"{where}: rollout_ids должно быть списком идентификаторов")
        else:
            members = list(members)
            ghost = [x for x in members if x not in tokens_of]
            _report(msgs, ghost, f"{where} ссылается на неизвестные роллауты: {{}}")
            other = [x for x in members if x in tokens_of and batch_of.get(x) != bid]
            _report(
                msgs, other, f"{where}: роллауты {{}} по таблице rollouts в этот пакет не входят"
            )
            claimed = [x for x in claims.get(bid, []) if x not in members]
            _report(
                msgs, claimed, f"{where}: роллауты {{}} указывают на пакет, но нет в его составе"
            )
            if row.n_rollouts != len(members):
                msgs.append(f"{where}: n_rollouts = {row.n_rollouts}, а в составе {len(members)}")
            unknown = [x for x in members if x in tokens_of and _is_missing(tokens_of[x])]
            _report(msgs, unknown, f"{where}: у роллаутов {{}} не указано число токенов")
            total = row.tokens if ghost or unknown else sum(int(tokens_of[x]) for x in members)
            if row.tokens != total:  # tokens пакета = Σ tokens роллаутов
                msgs.append(f"{where}: tokens = {row.tokens}, а сумма по составу {total}")
        if _is_missing(step):
            msgs.append(f"{where}: не указан optimizer_step")
            continue
        trainer_of[bid] = row.trainer_policy_version
        if bool(row.complete) and int(step) not in step_ids:
            msgs.append(f"{where} завершён, но шага {int(step)} нет в steps")
        elif not bool(row.complete) and int(step) in step_ids:
            msgs.append(f"{where} помечен незавершённым, но шаг {int(step)} есть в steps")
    lonely = sorted(step_ids - {int(x) for x in b["optimizer_step"].dropna()})
    _report(msgs, lonely, "steps: шаги без пакета: {}")

    ordered = s.dropna(subset=["optimizer_step"]).sort_values("optimizer_step")
    result_of = dict(
        zip(ordered["optimizer_step"].astype(int), ordered["resulting_policy_version"])
    )
    for (s0, v0), (s1, v1) in itertools.pairwise(result_of.items()):
        if not v1 > v0:
            msgs.append(f"версии идут назад: после шага {s0} версия {v0}, после шага {s1} — {v1}")
    for row in b.itertuples(index=False):
        res = None if _is_missing(row.optimizer_step) else result_of.get(int(row.optimizer_step))
        if res is not None and res != row.trainer_policy_version + 1:
            msgs.append(
                f"шаг {int(row.optimizer_step)}: версия после шага {res}, а версия тренера при "
                f"сборке пакета {row.trainer_policy_version} (ожидалось {res} = версия + 1)"
            )
    used = linked[["rollout_id", "training_batch_id", "behavior_policy_version"]]
    # задержка = trainer_policy_version − behavior_policy_version < 0
    future = [
        rid for rid, bid, v in used.itertuples(index=False) if v > trainer_of.get(bid, math.inf)
    ]
    newer = "версии идут назад: роллауты сгенерированы версией новее версии тренера"
    _report(msgs, future, newer + " (задержка < 0): {}")
    return msgs


def _pooled(values, q: str) -> float:
    """Перцентиль q ("p50"…) объединённой выборки без пропусков; NaN, если выборка пуста."""
    vals = [float(v) for v in values if not _is_missing(v)]
    return percentiles(vals)[q] if vals else math.nan


def _mean(values) -> float:
    vals = [float(v) for v in values if not _is_missing(v)]
    return math.fsum(vals) / len(vals) if vals else math.nan


def dashboard(tables: TraceTables, loop_or_sim: Any = None) -> pd.DataFrame:
    """Панель наблюдения: индекс (группа, метрика) ``METRIC_GROUPS``, «значение», «единицы».

    NaN — данных нет. Задержка = trainer_policy_version − behavior_policy_version, версий;
    длительность роллаута = enqueue_time − gen_start, с; пропускная способность = токены
    завершённых шагов / horizon_s, токенов/с. Перцентили — по объединённой выборке (перцентиль
    нелинеен: среднее p95 сборщиков — не p95). loop_or_sim (LoopResult, SimResult) даёт weight_sync
    и долю простоя тренера = Σ queue_wait тренеров / (число тренеров · horizon_s).
    """
    tables = _check_tables(tables)
    events = getattr(loop_or_sim, "events", None)
    r, b, s = tables.rollouts, tables.batches, tables.steps
    n, nan = len(r), math.nan
    m: dict[str, float] = {"роллаутов": float(n), "запросов": float(len(tables.prompts))}

    m["средняя награда"] = _mean(r["reward"])
    scored = r.assign(_g=r["group_id"] if "group_id" in r else r["prompt_id"])
    scored = scored[r["reward"].notna()]
    informative = scored.groupby("_g")["reward"].agg(lambda v: is_informative_group(v.tolist()))
    m["доля информативных групп"] = float(informative.mean()) if len(scored) else nan
    m["доля вырожденных групп"] = 1.0 - m["доля информативных групп"]
    m["токенов на роллаут, среднее"] = _mean(r["tokens"])
    m["токенов на роллаут, p95"] = _pooled(r["tokens"], "p95")

    trainer_of = dict(zip(b["training_batch_id"], b["trainer_policy_version"]))
    used = r[r["training_batch_id"].map(lambda x: not _is_missing(x) and x in trainer_of)]
    lag = used["training_batch_id"].map(trainer_of) - used["behavior_policy_version"]  # версий
    m["шагов оптимизатора"] = float(len(s))
    m["итоговая версия политики"] = float(s["resulting_policy_version"].max()) if len(s) else nan
    m["задержка политики, средняя"] = _mean(lag)
    m["задержка политики, максимальная"] = float(lag.max()) if len(lag) else nan
    m["доля несвежих роллаутов"] = float((lag >= 1).mean()) if len(lag) else nan
    m["ESS/n, среднее по шагам"] = _mean(s["ess_norm"]) if "ess_norm" in s else nan

    timed = {"gen_start", "enqueue_time"} <= set(r.columns)
    latency = r["enqueue_time"] - r["gen_start"] if timed else []  # с
    for q in ("p50", "p95", "p99"):
        m[f"длительность роллаута, {q}"] = _pooled(latency, q)
    queued = {"enqueue_time", "dequeue_time"} <= set(r.columns)
    wait = used["dequeue_time"] - used["enqueue_time"] if queued else []  # с
    m["время в очереди, среднее"] = _mean(wait)
    m["время в очереди, p95"] = _pooled(wait, "p95")
    h = float(tables.horizon_s) if is_number(tables.horizon_s) else nan
    done_tokens = float(b.loc[b["complete"].astype(bool), "tokens"].sum())
    ready = r["enqueue_time"].notna() if "enqueue_time" in r else pd.Series(True, index=r.index)
    m["пропускная способность обучения"] = done_tokens / h if h > 0 else nan  # токенов/с
    m["скорость генерации"] = float(r.loc[ready, "tokens"].sum()) / h if h > 0 else nan
    m["синхронизация весов, среднее"] = m["доля простоя тренера"] = nan
    if events is not None:
        dur = events["end_s"].astype(float) - events["start_s"].astype(float)
        m["синхронизация весов, среднее"] = _mean(dur[events["stage"] == "weight_sync"])
        is_tr = events["worker"].astype(str).str.startswith("trainer")
        n_tr = events.loc[is_tr, "worker"].nunique()
        if n_tr and h > 0:
            idle = float(dur[is_tr & (events["stage"] == "queue_wait")].sum())
            m["доля простоя тренера"] = idle / (n_tr * h)
    has_peak = "peak_memory_bytes" in s and len(s)
    m["пиковая память"] = float(s["peak_memory_bytes"].max()) / 2**30 if has_peak else nan  # ГиБ

    orphans = len(find_orphans(tables))
    dropped = int(r["dropped"].astype(bool).sum()) if "dropped" in r else 0
    m["осиротевших роллаутов"] = float(orphans)
    m["доля осиротевших роллаутов"] = orphans / n if n else nan
    m["отброшено как несвежие"] = float(dropped)
    m["доля отброшенных"] = dropped / n if n else nan
    try:
        m["несовпадений версии верификатора"] = float(len(verifier_mismatches(tables)))
    except ValueError:
        m["несовпадений версии верификатора"] = nan  # цепочка неоднозначна
    m["нарушений цепочки"] = float(len(check_chain(tables)))

    rows = [
        (g, name, m[name], unit)
        for g, units in METRIC_GROUPS.items()
        for name, unit in units.items()
    ]
    out = pd.DataFrame(rows, columns=["группа", "метрика", "значение", "единицы"])
    return out.set_index(["группа", "метрика"])
