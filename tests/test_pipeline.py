"""Тесты course_utils.pipeline: формулы лекции, модель очереди на SimPy, временная шкала."""

import dataclasses
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from course_utils import pipeline as pl
from course_utils.pipeline import SimConfig, simulate

matplotlib.use("Agg")

REPO = Path(__file__).resolve().parent.parent
CYRILLIC = "[а-яё]"


def _two_stage(G_longer: bool, max_policy_lag, duration_s):
    """1 сборщик, детерминированные длины, пакет = один роллаут: G = 4 с, T = 3 или 5 с."""
    return SimConfig(
        duration_s=duration_s,
        num_collectors=1,
        batch_tokens=256,
        length_dist="deterministic",
        mean_tokens=256,
        max_tokens=256,
        decode_tokens_per_s=64.0,  # G = 256 / 64 = 4 с
        prefill_s=0.0,
        train_tokens_per_s=128.0 if G_longer else 64.0,  # 2 или 4 с
        train_fixed_s=0.5,
        weight_sync_s=0.5,  # T = 3 или 5 с
        max_policy_lag=max_policy_lag,
    )


# --------------------------------------------------------------------------- замкнутые формулы


def test_closed_forms_lecture_numbers():
    assert pl.sequential_cycle(90, 10) == 100
    assert pl.pipelined_period(90, 10) == 90
    assert pl.pipeline_total_time(90, 10, 1) == 100
    assert pl.pipeline_total_time(90, 10, 3) == 100 + 2 * 90
    assert round(pl.speedup(90, 10), 2) == 1.11  # пример лекции: 100 с → 90 с
    assert pl.speedup(5, 5) == 2.0  # предел двух этапов при G = T
    assert pl.speedup(90, 10, n=1) == 1.0
    assert pl.speedup(90, 10, n=10) == pytest.approx(1000 / 910)
    assert pl.speedup(90, 10, n=10**6) == pytest.approx(pl.speedup(90, 10), rel=1e-5)


def test_group_utilization_and_truncation():
    group = [4, 4, 5, 5, 5, 6, 6, 20]
    assert pl.group_utilization(group) == 55 / 160 == 0.34375
    assert round(pl.group_utilization(group), 3) == 0.344
    assert pl.group_utilization([3, 3]) == 1.0
    cut, mask = pl.truncate_durations(group, 10)
    assert cut.tolist() == [4, 4, 5, 5, 5, 6, 6, 10]
    assert mask.tolist() == [False] * 7 + [True]
    assert pl.group_utilization(cut) == pytest.approx(45 / 80)


def test_best_device_split():
    assert pl.best_device_split(8, 1.0, 3.0) == (6, 2, 6.0)  # генерация втрое медленнее
    assert pl.best_device_split(2, 5.0, 1.0) == (1, 1, 1.0)
    k_gen, k_train, rate = pl.best_device_split(10, 2.0, 3.0)
    assert (k_gen, k_train, rate) == (6, 4, 12.0)
    brute = max(min(k * 2.0, (10 - k) * 3.0) for k in range(1, 10))
    assert rate == brute
    assert pl.best_device_split(3, 1.0, 1.0) == (1, 2, 1.0)  # ничья: меньший k_gen


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: pl.sequential_cycle(-1, 2), "G"),
        (lambda: pl.pipelined_period(1, math.nan), "T"),
        (lambda: pl.pipeline_total_time(1, 2, 0), "n"),
        (lambda: pl.speedup(0, 0), "G и T"),
        (lambda: pl.speedup(1, 2, n=1.5), "n"),
        (lambda: pl.group_utilization([]), "durations"),
        (lambda: pl.group_utilization([0, 0]), "durations"),
        (lambda: pl.group_utilization([1, -2]), "durations"),
        (lambda: pl.group_utilization("455"), "durations"),
        (lambda: pl.truncate_durations([1, 2], 0), "timeout"),
        (lambda: pl.best_device_split(1, 1, 1), "K"),
        (lambda: pl.best_device_split(4, 0, 1), "gen_rate_per_device"),
        (lambda: pl.best_device_split(4, 1, True), "train_rate_per_device"),
        (lambda: pl.pool_utilization([("a", "x", 0, 1)], {"a": "p"}), "intervals"),
        (lambda: simulate({"duration_s": 10}), "config"),
    ],
)
def test_helpers_reject_bad_input(call, name):
    with pytest.raises(ValueError, match=name) as err:
        call()
    assert re.search(CYRILLIC, str(err.value))


# --------------------------------------------------------------------------- конфигурация


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("duration_s", 0),
        ("duration_s", math.inf),
        ("seed", -1),
        ("num_collectors", 0),
        ("num_collectors", 2.0),
        ("batch_tokens", 0),
        ("max_queue_tokens", 0),
        ("max_policy_lag", -1),
        ("drop_stale", 1),
        ("length_dist", "pareto"),
        ("mean_tokens", 0.5),
        ("length_sigma", -0.1),
        ("max_tokens", 0),
        ("decode_tokens_per_s", 0),
        ("prefill_s", -1),
        ("train_tokens_per_s", -5),
        ("weight_sync_s", math.nan),
        ("is_sigma_per_lag", -0.3),
        ("batch_when_ready", 1),
        ("measured_rollouts", ()),
        ("measured_rollouts", [(100, 1.0)]),  # список, а не кортеж: конфигурация неизменяема
        ("measured_rollouts", ((100, 1.0, 2.0),)),
        ("measured_rollouts", ((0, 1.0),)),
        ("measured_rollouts", ((100, -1.0),)),
    ],
)
def test_bad_config_names_the_field_in_russian(field, value):
    with pytest.raises(ValueError, match=field) as err:
        SimConfig(**{field: value})
    assert re.search(CYRILLIC, str(err.value))


def test_mean_tokens_above_max_tokens_rejected():
    with pytest.raises(ValueError, match=r"mean_tokens .*\[1, 512\]"):
        SimConfig(mean_tokens=600, max_tokens=512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SimConfig().num_collectors = 0  # проверенную конфигурацию нельзя испортить после


# --------------------------------------------------------------------------- модель против формул


@pytest.mark.parametrize("G_longer", [True, False])
@pytest.mark.parametrize("eta", [None, 1])
def test_two_stage_simulation_matches_pipeline_formula(G_longer, eta):
    G, T = 4.0, (3.0 if G_longer else 5.0)
    n = 8
    res = simulate(_two_stage(G_longer, eta, pl.pipeline_total_time(G, T, n) + 0.25))
    ends = res.steps["end"].to_numpy()
    assert len(ends) == n
    expected = [pl.pipeline_total_time(G, T, k) for k in range(1, n + 1)]
    np.testing.assert_allclose(ends, expected, rtol=0, atol=1e-9)
    rate = res.steps["tokens"].iloc[1:].sum() / (ends[-1] - ends[0])  # после первого шага
    assert rate == pytest.approx(256 / pl.pipelined_period(G, T), rel=1e-12)


@pytest.mark.parametrize("G_longer", [True, False])
def test_synchronous_simulation_is_sequential(G_longer):
    G, T = 4.0, (3.0 if G_longer else 5.0)
    n = 5
    res = simulate(_two_stage(G_longer, 0, n * pl.sequential_cycle(G, T) + 0.5))
    np.testing.assert_allclose(res.steps["end"], [k * (G + T) for k in range(1, n + 1)], atol=1e-9)
    assert res.summary["max_policy_lag"] == 0
    assert res.summary["ess_norm"] == 1.0
    # без ожиданий критический путь — вся длительность; работа одна, зависимости цепочкой
    length, chain = pl.critical_path(res.events, res.dependencies())
    assert length == pytest.approx(res.config.duration_s, abs=1e-9)
    assert list(chain["stage"][:4]) == [
        "decode",
        "forward_backward",
        "optimizer_step",
        "weight_sync",
    ]
    assert pl.sum_of_work(res.events) == pytest.approx(res.config.duration_s, abs=1e-9)


# --------------------------------------------------------------------------- инварианты модели

CONFIGS = [
    SimConfig(duration_s=400.0, max_queue_tokens=6000),
    SimConfig(duration_s=400.0, seed=1, max_policy_lag=2),
    SimConfig(duration_s=400.0, seed=2, max_policy_lag=1, drop_stale=True, length_dist="uniform"),
    SimConfig(duration_s=400.0, seed=3, num_collectors=3),
    SimConfig(duration_s=400.0, seed=4, max_policy_lag=0),
    SimConfig(
        duration_s=400.0,
        seed=5,
        num_collectors=2,
        max_queue_tokens=1500,
        batch_when_ready=True,
        measured_rollouts=((100, 0.5), (300, 2.0), (50, 0.1)),
    ),
]


def test_measured_rollouts_and_batch_when_ready():
    pairs = ((100, 0.5), (300, 2.0), (50, 0.1))
    cfg = SimConfig(duration_s=200.0, num_collectors=2, batch_tokens=400, max_queue_tokens=800)
    cfg = dataclasses.replace(cfg, measured_rollouts=pairs, prefill_s=0.0, batch_when_ready=True)
    res = simulate(cfg)
    r = res.rollouts.dropna(subset=["gen_end"])
    assert set(r["tokens"]) == {100, 300, 50}  # только измеренные пары, и все встречаются
    assert np.allclose(r["gen_end"] - r["gen_start"], r["tokens"].map(dict(pairs)))
    for eager in (False, True):  # как уровень C: пакет снят разом, когда набралось ≥ пакета
        cfg = dataclasses.replace(cfg, batch_when_ready=not eager)
        res = simulate(cfg)
        taken = res.rollouts.dropna(subset=["consumed_version"])
        pops = taken.groupby("consumed_version")["dequeue_time"]
        if eager:  # без флага тренер забирает роллауты по мере прихода
            assert (pops.nunique() > 1).any()
            continue
        assert (pops.nunique() == 1).all() and len(pops) > 10


@pytest.mark.parametrize("cfg", CONFIGS)
def test_conservation(cfg):
    res = simulate(cfg)
    r = res.rollouts
    consumed = r["consumed_version"].notna().sum()
    dropped = r["dropped"].sum()
    queued = res.queue["depth_rollouts"].iloc[-1]  # из таблицы очереди, независимо от rollouts
    in_flight = r["enqueue_time"].isna().sum()
    assert len(r) == consumed + dropped + queued + in_flight
    assert not (r["dropped"] & r["consumed_version"].notna()).any()
    s = res.summary
    assert s["started"] == len(r) and s["dropped"] == dropped and s["queued_at_end"] == queued
    assert res.steps["tokens"].sum() <= r.loc[r["consumed_version"].notna(), "tokens"].sum()
    assert (res.steps["tokens"] >= cfg.batch_tokens).all()
    assert not (r["gen_start"] > r["gen_end"]).any()  # сравнения с NaN ложны: NaN пропускаются
    assert not (r["enqueue_time"] > r["dequeue_time"]).any()
    assert r["rollout_id"].tolist() == list(range(len(r)))
    assert (r.loc[r["truncated"], "tokens"] == cfg.max_tokens).all()
    assert (r["tokens"].between(1, cfg.max_tokens)).all()


def _time_average(queue: pd.DataFrame, column: str, horizon: float) -> float:
    t = np.append(queue["time"].to_numpy(), horizon)
    return float((queue[column].to_numpy() * np.diff(t)).sum() / horizon)


@pytest.mark.parametrize("cfg", CONFIGS[:4])
def test_littles_law_on_simulator_tables(cfg):
    cfg = dataclasses.replace(cfg, duration_s=3000.0)
    res = simulate(cfg)
    H = cfg.duration_s
    r = res.rollouts[res.rollouts["enqueue_time"].notna()]
    L = _time_average(res.queue, "depth_rollouts", H)
    lam = len(r) / H
    # тождество: ∫L dt = Σ времени в очереди в пределах [0, H]
    W_cut = (r["dequeue_time"].fillna(H) - r["enqueue_time"]).mean()
    assert L == pytest.approx(lam * W_cut, rel=1e-9)
    # закон Литтла по ушедшим из очереди: L ≈ λ·W в пределах нескольких процентов
    done = r[r["dequeue_time"].notna()]
    W = (done["dequeue_time"] - done["enqueue_time"]).mean()
    assert L == pytest.approx(lam * W, rel=0.05)
    # в токенах: L_ток ≈ λ_ток · W (среднее по токенам)
    Lt = _time_average(res.queue, "depth_tokens", H)
    Wt = ((done["dequeue_time"] - done["enqueue_time"]) * done["tokens"]).sum() / done[
        "tokens"
    ].sum()
    assert Lt == pytest.approx(r["tokens"].sum() / H * Wt, rel=0.05)


@pytest.mark.parametrize("threshold", [1000, 3000, 8000])
@pytest.mark.parametrize("seed", [0, 5])
def test_backpressure_bound(threshold, seed):
    cfg = SimConfig(duration_s=300.0, seed=seed, max_queue_tokens=threshold)
    res = simulate(cfg)
    q, r = res.queue, res.rollouts
    peak = res.summary["peak_queue_tokens"]
    assert peak == q["depth_tokens"].max()
    assert peak <= threshold + cfg.num_collectors * cfg.max_tokens
    # точнее: после последнего момента τ с глубиной < порога новых запусков нет, поэтому
    # глубина(t) ≤ глубина(τ) + токены роллаутов, начатых до τ и пришедших в (τ, t]
    below = -1
    for i, (t, depth) in enumerate(zip(q["time"], q["depth_tokens"])):
        if depth < threshold:
            below = i
            continue
        tau = q["time"].iloc[below]
        late = r[(r["gen_start"] <= tau) & (r["enqueue_time"] >= tau) & (r["enqueue_time"] <= t)]
        assert depth <= q["depth_tokens"].iloc[below] + late["tokens"].sum()
        assert depth < threshold + q["in_flight_tokens"].iloc[below] + late["tokens"].sum() + 1
    # запуск новых работ не начинается при полной очереди
    # (в один момент может быть несколько изменений: достаточно, чтобы одно было ниже порога)
    for start in r["gen_start"]:
        before = q.loc[q["time"] < start, "depth_tokens"]
        at = q.loc[q["time"] == start, "depth_tokens"]
        assert (before.iloc[-1] if len(before) else 0) < threshold or (at < threshold).any()


def test_threshold_overshoot_happens():
    res = simulate(SimConfig(duration_s=300.0, max_queue_tokens=1000))
    assert res.summary["peak_queue_tokens"] > 1000  # переходный процесс, а не ошибка счётчика


@pytest.mark.parametrize("eta", [0, 1, 2, 3])
@pytest.mark.parametrize("drop", [False, True])
def test_policy_lag_bound(eta, drop):
    res = simulate(SimConfig(duration_s=300.0, seed=eta, max_policy_lag=eta, drop_stale=drop))
    r = res.rollouts
    lag = r["consumed_version"] - r["behavior_version"]
    assert lag.max() <= eta
    assert res.summary["max_policy_lag"] <= eta
    assert (res.steps["max_lag"] <= eta).all()
    if not drop:
        assert res.summary["dropped"] == 0
    if drop and eta == 0:
        assert res.summary["dropped"] > 0  # закрыли пакет, не дождавшись начатых: они пропали


def test_synchronous_trains_only_current_version():
    r = simulate(SimConfig(max_policy_lag=0)).rollouts
    taken = r[r["consumed_version"].notna()]
    assert (taken["consumed_version"] == taken["behavior_version"]).all()


def test_determinism_and_seed_sensitivity():
    cfg = SimConfig(max_queue_tokens=5000, max_policy_lag=2)
    a, b = simulate(cfg), simulate(cfg)
    for name in ("rollouts", "queue", "steps", "events"):
        assert getattr(a, name).equals(getattr(b, name)), name
    assert a.summary == b.summary
    c = simulate(dataclasses.replace(cfg, seed=1))
    assert not a.rollouts.equals(c.rollouts)


def test_summary_and_tables_are_consistent():
    res = simulate()
    s, steps = res.summary, res.steps
    for key in (
        "throughput_tokens_per_s",
        "optimizer_steps",
        "mean_policy_lag",
        "max_policy_lag",
        "ess_norm",
        "trainer_idle_share",
        "collector_idle_share",
        "peak_queue_tokens",
        "dropped",
    ):
        assert key in s
    assert s["throughput_tokens_per_s"] == pytest.approx(steps["tokens"].sum() / 120.0)
    assert s["optimizer_steps"] == len(steps) > 0
    assert (steps["version_published"] == steps["step"] + 1).all()
    assert ((steps["ess_norm"] > 0) & (steps["ess_norm"] <= 1 + 1e-12)).all()
    assert set(res.events.columns) >= {"worker", "stage", "start_s", "end_s"}
    assert set(res.events["stage"]) <= {
        "backpressure",
        "prefill",
        "decode",
        "queue_wait",
        "forward_backward",
        "optimizer_step",
        "weight_sync",
    }
    pools = {f"collector-{i}": "генерация" for i in range(8)} | {"trainer-0": "обучение"}
    util = pl.pool_utilization(res.events, pools, horizon=120.0)
    assert util["генерация"] == pytest.approx(1 - s["collector_idle_share"], abs=1e-9)
    assert util["обучение"] == pytest.approx(1 - s["trainer_idle_share"], abs=1e-9)
    length, _ = pl.critical_path(res.events, res.dependencies())
    busiest = max(pl.sum_of_work(g) for _, g in res.events.groupby("worker"))
    assert busiest <= length <= 120.0 + 1e-9


def test_profile_over_lag_shape():
    table = pl.profile_over_lag()
    assert list(table.index) == ["0", "1", "2", "4", "∞"]
    assert table.index.name == pl.PROFILE_INDEX == "предел задержки η"
    assert list(table.columns) == list(pl.PROFILE_COLUMNS)  # у каждого столбца есть пояснение
    assert all(re.search(CYRILLIC, c) or c == "ESS/n" for c in table.columns)
    thr = table["пропускная способность, токенов/с"]
    assert thr.iloc[-1] > thr.iloc[0]  # перекрытие даёт скорость...
    assert table["средняя задержка, версий"].iloc[0] == 0
    assert table["средняя задержка, версий"].iloc[-1] > 1  # ...ценой свежести
    assert table["ESS/n"].iloc[0] == 1.0 > table["ESS/n"].iloc[-1]
    assert (table["макс. задержка, версий"].iloc[:4].astype(int) <= [0, 1, 2, 4]).all()


def test_profile_unbounded_row_differs_from_bounded():
    # Профиль урока: генерация быстрее обучения, поэтому без предела задержка растёт дальше η = 4
    # (старый профиль печатал строки «4» и «∞» одинаковыми).
    table = pl.profile_over_lag()
    assert not table.loc["4"].equals(table.loc["∞"])
    free = simulate(dataclasses.replace(pl.PROFILE_BASE, max_policy_lag=None))
    used = free.rollouts.dropna(subset=["consumed_version"])
    lag = used["consumed_version"] - used["behavior_version"]  # пересчёт по таблице роллаутов
    assert lag.max() > 4 == table.loc["4", "макс. задержка, версий"]
    assert table.loc["∞", "макс. задержка, версий"] == lag.max()
    assert table.loc["∞", "пик очереди, токенов"] == free.queue["depth_tokens"].max()
    assert table.loc["∞", "пик очереди, токенов"] > table.loc["4", "пик очереди, токенов"]
    generated = free.rollouts.loc[free.rollouts["enqueue_time"].notna(), "tokens"].sum() / 120.0
    assert table.loc["∞", "сгенерировано, токенов/с"] == pytest.approx(generated, abs=0.05)
    # λ > μ: генерация ∞-строки быстрее, чем тренер успевает съесть
    assert generated > table.loc["∞", "пропускная способность, токенов/с"]


# --------------------------------------------------------------------------- временная шкала


def test_timeline_helpers_on_hand_made_intervals():
    iv = pd.DataFrame(
        [
            ("gen", "decode", 0.0, 4.0),
            ("gen", "decode", 4.0, 8.0),
            ("train", "queue_wait", 0.0, 4.0),
            ("train", "forward_backward", 4.0, 7.0),
            ("train", "forward_backward", 8.0, 11.0),
        ],
        columns=["worker", "stage", "start_s", "end_s"],
    )
    assert pl.sum_of_work(iv) == 14.0
    assert pl.sum_of_work(iv, exclude_stages=()) == 18.0
    # без объявленных зависимостей: самая длинная цепочка одного исполнителя
    assert pl.critical_path(iv)[0] == 8.0
    length, chain = pl.critical_path(iv, {3: [0], 4: [1]})  # обучение ждёт свою генерацию
    assert length == 11.0 and chain.index.tolist() == [0, 1, 4]
    util = pl.pool_utilization(iv, {"gen": "g", "train": "t"}, horizon=11.0)
    assert util["g"] == pytest.approx(8 / 11) and util["t"] == pytest.approx(6 / 11)
    nested = [
        {"worker": "a", "stage": "step", "start_s": 0.0, "end_s": 4.0},
        {"worker": "a", "stage": "inner", "start_s": 1.0, "end_s": 2.0},
    ]
    assert pl.pool_utilization(nested, {"a": "p", "b": "p"}, horizon=8.0)["p"] == 4 / 16
    with pytest.raises(ValueError, match="pools"):
        pl.pool_utilization(iv, {"gen": "g"})
    with pytest.raises(ValueError, match="deps"):
        pl.critical_path(iv, {3: [99]})
    with pytest.raises(ValueError, match="deps"):
        pl.critical_path(iv, {0: [4]})  # зависимость от более позднего интервала


def test_critical_path_with_unlimited_workers_by_hand():
    # gen делает два роллаута подряд; каждый шаг тренера ждёт свой роллаут.
    iv = pd.DataFrame(
        [
            ("gen", "decode", 0.0, 4.0),
            ("gen", "decode", 4.0, 8.0),
            ("train", "forward_backward", 4.0, 7.0),
            ("train", "forward_backward", 8.0, 11.0),
        ],
        columns=["worker", "stage", "start_s", "end_s"],
    )
    deps = {2: [0], 3: [1]}
    length, chain = pl.critical_path(iv, deps)
    assert length == 11.0 and chain.index.tolist() == [0, 1, 3]  # 4 + 4 + 3
    # Сборщиков сколько угодно: второй роллаут не ждёт первого, путь идёт через тренера.
    length, chain = pl.critical_path(iv, deps, unlimited_workers=["gen"])
    assert length == 10.0 and chain.index.tolist() == [0, 2, 3]  # 4 + 3 + 3
    with pytest.raises(ValueError, match="unlimited_workers"):
        pl.critical_path(iv, deps, unlimited_workers="gen")


def test_critical_path_unlimited_collectors_on_simulation():
    res = simulate(SimConfig(duration_s=40.0, num_collectors=4, max_policy_lag=1))
    full, _ = pl.critical_path(res.events, res.dependencies())
    collectors = [w for w in res.events["worker"].unique() if w.startswith("collector")]
    data, chain = pl.critical_path(res.events, res.dependencies(), unlimited_workers=collectors)
    trainer_work = pl.sum_of_work(res.events[res.events["worker"] == "trainer-0"])
    assert full == pytest.approx(40.0)  # замкнутый цикл: кто-то занят всё время
    assert trainer_work <= data < full  # без очереди на сборщиков путь короче прогона
    assert data == pytest.approx(float((chain["end_s"] - chain["start_s"]).sum()))
    assert chain["end_s"].is_monotonic_increasing


def _queue_result(times, depths, in_flight, duration_s, threshold):
    queue = pd.DataFrame({"time": times, "depth_rollouts": [0] * len(times)})
    queue = queue.assign(depth_tokens=depths, in_flight_tokens=in_flight)
    cfg = SimConfig(duration_s=duration_s, max_queue_tokens=threshold)
    empty = pd.DataFrame()
    return pl.SimResult(cfg, empty, queue, empty, empty, {})


def test_queue_above_threshold_by_hand():
    # Порог 10; глубина 12 на [1, 3), 8 на [3, 4), 15 на [4, 5): выше порога 3 с из 5.
    res = _queue_result([0.0, 1.0, 3.0, 4.0], [0, 12, 8, 15], [20, 8, 7, 0], 5.0, 10)
    out = pl.queue_above_threshold(res)
    assert out["share_above"] == pytest.approx(3 / 5)
    assert out["first_reached_s"] == 1.0 and out["share_after_first"] == pytest.approx(3 / 4)
    assert out["peak_tokens"] == 15 and out["overshoot_tokens"] == 5
    assert out["overshoot_share"] == pytest.approx(0.5) and out["max_in_flight_tokens"] == 20
    assert pl.queue_above_threshold(res, threshold_tokens=20)["share_above"] == 0.0
    with pytest.raises(ValueError, match="threshold_tokens"):
        pl.queue_above_threshold(_queue_result([0.0], [0], [0], 1.0, None))


def test_queue_above_threshold_matches_fine_grid():
    res = simulate(SimConfig(duration_s=120.0, train_tokens_per_s=500.0, max_queue_tokens=8192))
    out = pl.queue_above_threshold(res)
    q = res.queue.drop_duplicates("time", keep="last")
    grid = np.arange(0.0, 120.0, 0.001) + 0.0005  # середины миллисекундных ячеек
    depth = q["depth_tokens"].to_numpy()[np.searchsorted(q["time"].to_numpy(), grid, "right") - 1]
    assert out["share_above"] == pytest.approx(np.mean(depth > 8192), abs=2e-3)
    assert out["share_above"] > 0.5  # медленный тренер: выше порога бо́льшую часть прогона
    assert out["peak_tokens"] == res.summary["peak_queue_tokens"]
    assert out["overshoot_share"] == pytest.approx((out["peak_tokens"] - 8192) / 8192)


# --------------------------------------------------------------------------- график и скорость


def test_plot_queue_saves_png(tmp_path):
    import matplotlib.pyplot as plt

    res = simulate(SimConfig(max_queue_tokens=3000))
    ax = pl.plot_queue(res)
    assert ax.get_xlabel() == "время, с (виртуальное)"
    assert ax.get_ylabel() == "глубина очереди, токенов"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "порог запуска: 3\u00a0000 токенов" in labels and any("выше порога" in x for x in labels)
    out = tmp_path / "queue.png"
    ax.figure.savefig(out, dpi=80)
    assert out.stat().st_size > 5000
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="threshold_tokens"):
        pl.plot_queue(res, threshold_tokens=-1)


def test_plot_queue_legend_inside_narrow_panel_and_integer_ticks():
    import matplotlib.pyplot as plt

    res = simulate(SimConfig(train_tokens_per_s=500.0, max_queue_tokens=8192))
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.8))  # как в уроке 12.3.4
    try:
        ax = pl.plot_queue(res, ax=axes[1])
        fig.canvas.draw()
        legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert frame.x0 <= legend.x0 and legend.x1 <= frame.x1  # легенда не вылезает из осей
        assert frame.y0 <= legend.y0 and legend.y1 <= frame.y1
        ticks = ax.get_yticks()
        assert np.allclose(ticks, np.round(ticks))
        assert all("," not in t.get_text() for t in ax.get_yticklabels())  # не запятые
        assert any("\u00a0" in t.get_text() for t in ax.get_yticklabels())
    finally:
        plt.close(fig)


def test_performance_bounds():
    t0 = time.perf_counter()
    pl.profile_over_lag()
    assert time.perf_counter() - t0 < 3.0
    t0 = time.perf_counter()
    for eta in (0, 1, 2, 4, 8, None):
        for n in (2, 4, 8, 16):
            simulate(SimConfig(num_collectors=n, max_policy_lag=eta))
    assert time.perf_counter() - t0 < 60.0


def test_benchmark_entry_point():
    res = subprocess.run(
        [sys.executable, "-m", "course_utils.pipeline", "benchmark"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "профиль 120 с" in res.stdout and "перебор 24 конфигураций" in res.stdout
