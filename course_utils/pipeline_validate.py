"""Симулятор против настоящего асинхронного цикла (урок 12.3): предсказание и замер.

``validate`` запускает цикл уровня C, подгоняет ``SimConfig`` по трассе, предсказывает
``METRICS`` и сравнивает (для порога × 0,5 и × 2 — предсказание до прогона); роллаут симулятора =
группа одного запроса. Запуск: ``python -m course_utils.pipeline validate --json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

from course_utils.args import integer, positive
from course_utils.fmt import num
from course_utils.pipeline import SimConfig, SimResult, simulate

ENTRY = "course_utils.multiproc.queue_loop:queue_generators_trainer"
# Величина → (вид ошибки, цель): relative — (предсказание − замер) / замер, absolute — разность.
METRICS = {
    "throughput_rollouts_per_s": ("relative", 0.15),
    "trainer_busy_fraction": ("relative", 0.15),
    "queue_tokens_mean": ("relative", 0.25),
    "queue_tokens_p95": ("relative", None),
    "policy_lag_mean": ("absolute", 0.5),
}
_SERIES_POINTS = 200  # точек ряда глубины очереди в JSON


@dataclasses.dataclass
class Trace:
    """Прогон на отрезке [0, horizon_s], с: queue (time_s, depth_tokens — глубина после события),
    steps (start_s, end_s — шаги тренера), groups (dequeue_s, lag — группы, взятые в пакеты)."""

    queue: pd.DataFrame
    steps: pd.DataFrame
    groups: pd.DataFrame
    horizon_s: float


def _depth_steps(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Ступени глубины на [0, H): начала t (с 0) и глубины d, токенов; до первого события — 0."""
    q = trace.queue[trace.queue["time_s"] < trace.horizon_s].drop_duplicates("time_s", keep="last")
    t = np.concatenate([[0.0], q["time_s"].clip(lower=0).to_numpy(float)])
    return t, np.concatenate([[0.0], q["depth_tokens"].to_numpy(float)])


def trace_metrics(trace: Trace) -> dict[str, float]:
    """Величины ``METRICS`` прогона (одни формулы для замера и симуляции): throughput = групп после
    первого снятия / (t последнего − t первого снятия), групп/с; busy = Σ|[start, end] ∩ [0, H]| /
    H; среднее и p95 глубины по времени, токенов; policy_lag_mean — по группам до H, версий."""
    H = trace.horizon_s
    t, d = _depth_steps(trace)
    dt = np.diff(np.append(t, H))  # с, сколько держалась каждая глубина
    order = np.argsort(d, kind="stable")
    share = np.cumsum(dt[order]) / H  # доля времени с глубиной ≤ d[order]
    steps = trace.steps
    busy = (steps["end_s"].clip(0, H) - steps["start_s"].clip(0, H)).sum()
    taken = trace.groups[trace.groups["dequeue_s"] <= H]
    first, last = taken["dequeue_s"].min(), taken["dequeue_s"].max()  # NaN, если групп нет
    return {
        "throughput_rollouts_per_s": (taken["dequeue_s"] > first).sum() / (last - first)
        if last > first
        else math.nan,
        "trainer_busy_fraction": float(busy / H),
        "queue_tokens_mean": float(np.sum(d * dt) / H),
        "queue_tokens_p95": float(d[order][np.searchsorted(share, 0.95 - 1e-12)]),
        "policy_lag_mean": float(taken["lag"].mean()),  # NaN, если групп нет
    }


def simulated_trace(result: SimResult) -> Trace:
    """``Trace`` симуляции: очередь, интервалы работы тренера и взятые роллауты (группы)."""
    r = result.rollouts.dropna(subset=["consumed_version"])
    groups = pd.DataFrame(
        {"dequeue_s": r["dequeue_time"], "lag": r["consumed_version"] - r["behavior_version"]}
    )
    queue = result.queue.rename(columns={"time": "time_s"})[["time_s", "depth_tokens"]]
    ev = result.events  # стадии шагов тренера, включая шаг, не законченный к концу прогона
    steps = ev[(ev["worker"] == "trainer-0") & (ev["stage"] != "queue_wait")]
    return Trace(queue, steps[["start_s", "end_s"]], groups, result.config.duration_s)


def _trainer(launch_result: Any, generators: bool = False) -> Any:
    """Словарь тренера прогона очереди (generators=True — список словарей генераторов)."""
    from course_utils.multiproc import queue_loop, transport

    ranks = transport.rank_results(launch_result, queue_loop.QUEUE_EXPERIMENT)
    mine = [r for r in ranks if (r["role"] == transport.ROLE_GENERATOR) == generators]
    return mine if generators else mine[0]


def measured_trace(launch_result: Any, horizon_s: float) -> Trace:
    """``Trace`` настоящего прогона: время — с от отметки «start» тренера, горизонт horizon_s."""
    tr = _trainer(launch_result)
    t0, H = float(tr["start_s"]), positive("horizon_s", horizon_s)
    queue = pd.DataFrame(tr["timeline"], columns=["time_s", "depth_tokens"])
    batches = pd.DataFrame(tr["batches"], columns=["pop_s", "end_s", "lags"])
    groups = batches.explode("lags").astype({"lags": float})
    steps = pd.DataFrame({"start_s": batches["pop_s"] - t0, "end_s": batches["end_s"] - t0})
    groups = pd.DataFrame({"dequeue_s": groups["pop_s"] - t0, "lag": groups["lags"]})
    return Trace(queue.assign(time_s=queue["time_s"] - t0), steps, groups, H)


def fit_config(launch_result: Any, horizon_s: float) -> tuple[SimConfig, dict]:
    """SimConfig прогона по его трассе и описание подгонки (с, токены/с): роллаут — пара (токены
    группы, с от разрешённого вопроса до очереди); шаг — токены / (Σ токенов / Σ train_s) +
    train_fixed_s (задержка) + weight_sync_s (остаток шага)."""
    tr = _trainer(launch_result)
    asked = {  # (генератор, запрос) → начало последнего вопроса о разрешении, с
        (g["rank"], ev["step"]): ev["start_s"]
        for g in _trainer(launch_result, generators=True)
        for ev in g["events"]
        if ev["stage"] == "permission"
    }
    pairs = tuple(
        (int(a["tokens"]), a["time_s"] - asked[a["generator"], a["request_id"]])
        for a in tr["arrivals"]
    )
    b = pd.DataFrame(tr["batches"])
    if b.empty or not pairs:
        raise ValueError("launch_result: в прогоне нет ни одного шага тренера — подгонять нечего")
    rest = b["end_s"] - b["pop_s"] - b["train_s"] - b["delay_s"]
    cfg = SimConfig(
        duration_s=horizon_s,
        num_collectors=2,
        batch_tokens=int(tr["batch_tokens"]),
        max_queue_tokens=int(tr["threshold_tokens"]),
        batch_when_ready=True,
        measured_rollouts=pairs,
        prefill_s=0.0,
        train_tokens_per_s=float(b["tokens"].sum() / b["train_s"].sum()),
        train_fixed_s=float(b["delay_s"].mean()),
        weight_sync_s=float(rest.clip(lower=0).mean()),
    )
    tokens, service_s = np.array(pairs).T
    fit = {k: getattr(cfg, k) for k in ("train_tokens_per_s", "train_fixed_s", "weight_sync_s")}
    fit.update(rollout_samples=len(pairs), rollout_tokens_mean=tokens.mean())
    fit.update(rollout_service_s_mean=service_s.mean(), train_update_s_mean=b["train_s"].mean())
    return cfg, {**fit, **_generate_contention(launch_result, b)}


def _generate_contention(launch_result: Any, batches: pd.DataFrame) -> dict:
    """Среднее время генерации группы, с: > половины его на grpo_update тренера — и остальные."""
    from course_utils.multiproc import queue_loop

    req = queue_loop.queue_requests_frame(launch_result)
    s, e = (req[c].to_numpy()[:, None] for c in ("gen_start_s", "gen_end_s"))  # группа × шаг
    us, ue = batches["pop_s"].to_numpy(), (batches["pop_s"] + batches["train_s"]).to_numpy()
    gen_s = (e - s)[:, 0]
    during = (np.minimum(e, ue) - np.maximum(s, us)).clip(min=0).sum(axis=1) > 0.5 * gen_s
    means = [float(gen_s[m].mean()) if m.any() else None for m in (during, ~during)]
    return dict(zip(["generate_s_during_update", "generate_s_otherwise"], means))


def _series(trace: Trace, grid: np.ndarray) -> list[float]:
    """Глубина очереди в моменты grid, токенов (ступенчатая: последнее событие ≤ t)."""
    t, d = _depth_steps(trace)
    return d[np.searchsorted(t, grid, side="right") - 1].tolist()


def _predict(cfg: SimConfig, sim_seeds: int) -> tuple[dict, Trace]:
    """Средние величин по sim_seeds симуляциям (ожидание модели) и трасса seed 0."""
    traces = [simulated_trace(simulate(dataclasses.replace(cfg, seed=s))) for s in range(sim_seeds)]
    rows = pd.DataFrame([trace_metrics(t) for t in traces])
    return rows.mean().to_dict(), traces[0]


def _compare(predicted: dict, measured: dict) -> list[dict]:
    """Строки metrics: ошибка по виду из ``METRICS``; NaN (нет данных) → None в JSON."""
    rows = []
    for name, (kind, target) in METRICS.items():
        p, m = predicted[name], measured[name]
        err = p - m if kind == "absolute" else (p - m) / m if m else math.nan
        values = [None if math.isnan(x) else float(x) for x in (p, m, err)]
        keys = ["name", "predicted", "measured", "error", "error_kind", "target"]
        rows.append(dict(zip(keys, [name, *values, kind, target])))
    return rows


def _run(threshold: int, run_args: dict, timeout_s: float) -> Any:
    from course_utils import multiproc

    args = {**run_args, "max_queue_tokens": threshold}
    return multiproc.launch(ENTRY, nprocs=3, args=args, timeout_s=timeout_s).raise_for_status()


def _case(cfg: SimConfig, sim_seeds: int, launch) -> dict:
    """Сначала предсказание симулятора, потом launch() — настоящий прогон; величины и ряды."""
    predicted, sim_trace = _predict(cfg, sim_seeds)
    real = measured_trace(launch(), cfg.duration_s)
    grid = np.linspace(0, cfg.duration_s, _SERIES_POINTS, endpoint=False)
    series = {"time_s": grid.round(4).tolist(), "predicted_tokens": _series(sim_trace, grid)}
    series["measured_tokens"] = _series(real, grid)
    return {"metrics": _compare(predicted, trace_metrics(real)), "series": series}


_RUN_KEYS = "duration_s max_queue_tokens batch_tokens train_delay_s group_size max_new_tokens seed"


def validate(
    duration_s: float = 6.0,
    threshold: int = 1024,
    batch_tokens: int = 512,
    train_delay_s: float = 0.4,
    factors: tuple[float, ...] = (0.5, 2.0),
    sim_seeds: int = 20,
    seed: int = 0,
    timeout_s: float = 300.0,
) -> dict:
    """Предсказание против замера: базовый прогон, ``fit_config``, затем what-if → {"config",
    "fit", "metrics", "series", "what_if", "machine"}; metrics — predicted (среднее sim_seeds
    симуляций), measured, error (``METRICS``); series — глубина очереди, токенов, по времени, с."""
    run_args = {"duration_s": positive("duration_s", duration_s), "seed": integer("seed", seed, 0)}
    run_args["train_delay_s"] = positive("train_delay_s", train_delay_s)
    run_args["batch_tokens"] = batch_tokens = integer("batch_tokens", batch_tokens, 1)
    threshold = integer("threshold", threshold, batch_tokens)  # очередь требует порог ≥ пакета
    thresholds = [round(threshold * positive("factors[...]", f)) for f in factors]
    for f, t in zip(factors, thresholds):
        integer(f"threshold × {f:g}", t, batch_tokens)
    sim_seeds, timeout_s = integer("sim_seeds", sim_seeds, 1), positive("timeout_s", timeout_s)
    wall0, load = time.perf_counter(), os.getloadavg()[0]
    base = _run(threshold, run_args, timeout_s)
    cfg, fit = fit_config(base, duration_s)
    config = {k: _trainer(base)["config"][k] for k in _RUN_KEYS.split()} | {"generators": 2}
    config.update(backend=base.backend, model=_trainer(base)["model"], sim_seeds=sim_seeds)
    out = {"config": config, "fit": fit, "sim_config": dataclasses.asdict(cfg)}
    out.update(_case(cfg, sim_seeds, lambda: base), what_if=[])
    for f, t in zip(factors, thresholds):
        what = dataclasses.replace(cfg, max_queue_tokens=t)
        case = _case(what, sim_seeds, lambda t=t: _run(t, run_args, timeout_s))
        change = f"порог очереди × {f:g}: {num(t)} токенов вместо {num(threshold)}"
        out["what_if"].append({"change": change, "threshold_tokens": t, **case})
    wall_s = time.perf_counter() - wall0
    return out | {
        "machine": {"cpu_count": os.cpu_count(), "loadavg_1min_before": load, "wall_s": wall_s}
    }


_FRAME_COLUMNS = "прогон величина предсказание замер ошибка вид_ошибки цель,_± в_пределах_цели"


def comparison_frame(result: dict) -> pd.DataFrame:
    """Таблица для студента: строка на (прогон, величину) с русскими заголовками."""
    rows = []
    for run, case in [("базовый", result), *((w["change"], w) for w in result["what_if"])]:
        for m in case["metrics"]:
            kind = "отн." if m["error_kind"] == "relative" else "абс."
            ok = None if None in (m["target"], m["error"]) else abs(m["error"]) <= m["target"]
            values = (m["predicted"], m["measured"], m["error"])
            rows.append((run, m["name"], *values, kind, m["target"], ok))
    return pd.DataFrame(rows, columns=[c.replace("_", " ") for c in _FRAME_COLUMNS.split()])


# Ключ командной строки → (аргумент validate, тип, подсказка); умолчания — у validate.
_OPTIONS = {
    "--duration": ("duration_s", float, "длительность каждого прогона, с"),
    "--threshold": ("threshold", int, "порог очереди, токенов"),
    "--batch-tokens": ("batch_tokens", int, "размер пакета, токенов"),
    "--train-delay": ("train_delay_s", float, "задержка шага тренера, с"),
    "--sim-seeds": ("sim_seeds", int, "симуляций на одно предсказание"),
}


def main(argv: list[str] | None = None) -> int:
    """``python -m course_utils.pipeline validate [--json] [--out файл] …``; 2 — ошибка."""
    ap = argparse.ArgumentParser(prog="python -m course_utils.pipeline validate")
    ap.add_argument("--json", action="store_true", help="напечатать один объект JSON")
    ap.add_argument("--out", help="ещё и записать JSON в файл (атомарно)")
    for flag, (dest, kind, help_text) in _OPTIONS.items():
        ap.add_argument(flag, dest=dest, type=kind, default=argparse.SUPPRESS, help=help_text)
    ap.add_argument("--what-if", dest="factors", type=float, nargs="*", default=argparse.SUPPRESS)
    kwargs = vars(ap.parse_args(argv))
    as_json, out = kwargs.pop("json"), kwargs.pop("out")
    try:
        result = validate(**kwargs)  # умолчания — у validate
    except (ValueError, RuntimeError) as exc:  # неверный аргумент или неуспешный запуск
        print(f"validate: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, ensure_ascii=False, indent=1, allow_nan=False)
    if out:
        from course_utils.atomic import write_text

        write_text(out, text + "\n")
    print(text if as_json else comparison_frame(result).round(3).to_string(index=False))
    return 0
