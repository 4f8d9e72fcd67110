"""Тесты цепочки трассировки (урок 12.5.2): построители таблиц, соединения, сироты, проверки, панель."""

import copy
import math
import os

import numpy as np
import pandas as pd
import pytest

from course_utils import pipeline, policy, tracing
from course_utils.tracing import (
    METRIC_GROUPS,
    METRIC_UNITS,
    ORPHAN_REASONS,
    TRACE_CHAIN,
    TraceTables,
    chain_for_rollout,
    check_chain,
    dashboard,
    find_orphans,
    full_chain,
    rollouts_for_step,
    trace_from_loop,
    trace_from_simulation,
    verifier_mismatches,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Прогон с отбрасыванием несвежих: есть отброшенные, ждущие в очереди, незавершённые роллауты
# и пакет шага, не завершённого к концу прогона.
SIM_CONFIG = pipeline.SimConfig(duration_s=60.0, max_policy_lag=1, drop_stale=True)


@pytest.fixture(scope="module")
def loop():
    model, tokenizer, info = policy.load_policy("tiny", device="cpu")
    return policy.sequential_loop(2, model=copy.deepcopy(model), tokenizer=tokenizer, info=info)


@pytest.fixture(scope="module")
def sim():
    return pipeline.simulate(SIM_CONFIG)


@pytest.fixture(scope="module")
def loop_tables(loop):
    return trace_from_loop(loop)


@pytest.fixture(scope="module")
def sim_tables(sim):
    return trace_from_simulation(sim)


def small_tables() -> TraceTables:
    """Согласованная трасса вручную: 2 запроса, 5 роллаутов (один сирота), 2 пакета, 2 шага."""
    prompts = pd.DataFrame({"prompt_id": ["p0", "p1"], "n_rollouts": [3, 2]})
    rollouts = pd.DataFrame(
        {
            "rollout_id": ["r0", "r1", "r2", "r3", "r4"],
            "prompt_id": ["p0", "p0", "p0", "p1", "p1"],
            "group_id": ["p0", "p0", "p0", "p1", "p1"],
            "behavior_policy_version": [0, 0, 0, 1, 1],
            "verifier_version": ["v1", "v1", "v1", "v1", "v1"],
            "reward": [1.0, 0.0, 1.0, 1.0, 1.0],
            "tokens": [10, 20, 30, 40, 50],
            "gen_start": [0.0, 0.0, 0.0, 2.0, 2.0],
            "enqueue_time": [1.0, 1.5, 2.5, 3.0, math.nan],
            "dequeue_time": [1.0, 1.5, 2.5, 3.0, math.nan],
            "dropped": [False] * 5,
            "training_batch_id": ["b0", "b0", "b1", "b1", None],
        }
    )
    batches = pd.DataFrame(
        {
            "training_batch_id": ["b0", "b1"],
            "optimizer_step": [0, 1],
            "trainer_policy_version": [0, 1],
            "n_rollouts": [2, 2],
            "tokens": [30, 70],
            "rollout_ids": [("r0", "r1"), ("r2", "r3")],
            "complete": [True, True],
        }
    )
    steps = pd.DataFrame(
        {
            "optimizer_step": [0, 1],
            "resulting_policy_version": [1, 2],
            "expected_verifier_version": ["v1", "v1"],
        }
    )
    return TraceTables(prompts, rollouts, batches, steps, source="вручную", horizon_s=10.0)


# --------------------------------------------------------------------------- цепочка и построители


def test_chain_constants():
    assert TRACE_CHAIN == (
        "prompt_id",
        "rollout_id",
        "behavior_policy_version",
        "verifier_version",
        "training_batch_id",
        "optimizer_step",
        "resulting_policy_version",
    )
    assert set(METRIC_GROUPS) == {"данные", "политика", "система", "надёжность"}
    names = [n for group in METRIC_GROUPS.values() for n in group]
    assert len(names) == len(set(names)) and set(names) == set(METRIC_UNITS)


def test_trace_from_loop_batches_are_steps(loop, loop_tables):
    t = loop_tables
    assert t.source == "loop" and t.horizon_s > 0
    assert check_chain(t) == []
    assert len(t.rollouts) == len(loop.records) == 32
    assert list(t.batches["optimizer_step"]) == [0, 1]
    assert t.batches["complete"].all()
    for k in (0, 1):
        expected = [r.sample_id for r in loop.records if r.policy_version == k]
        batch = t.batches[t.batches["optimizer_step"] == k].iloc[0]
        assert list(batch["rollout_ids"]) == expected
        assert batch["trainer_policy_version"] == k
    assert list(t.steps["resulting_policy_version"]) == [1, 2]
    assert list(t.batches["tokens"]) == list(loop.steps["output_tokens"])
    assert list(t.steps["loss"]) == list(loop.steps["loss"])
    assert len(t.prompts) == 8 and set(t.prompts["n_rollouts"]) == {4}
    assert find_orphans(t).empty


def test_trace_from_simulation_batches(sim, sim_tables):
    t = sim_tables
    assert t.source == "simulation" and t.horizon_s == SIM_CONFIG.duration_s
    assert check_chain(t) == []
    done = t.batches[t.batches["complete"]]
    assert list(done["optimizer_step"]) == list(sim.steps["step"])
    assert list(done["tokens"]) == list(sim.steps["tokens"])
    assert list(done["n_rollouts"]) == list(sim.steps["rollouts"])
    # Пакет шага, не завершённого к концу прогона, есть, но шага для него нет.
    unfinished = t.batches[~t.batches["complete"]]
    assert list(unfinished["optimizer_step"]) == [len(sim.steps)]
    assert len(t.rollouts) == len(sim.rollouts) == len(t.prompts)
    consumed = sim.rollouts["consumed_version"]
    batch = t.rollouts["training_batch_id"]
    assert list(batch.isna()) == list(consumed.isna())


def test_full_chain_columns_and_order(loop_tables, sim_tables):
    for t in (loop_tables, sim_tables):
        chain = full_chain(t)
        assert tuple(chain.columns[: len(TRACE_CHAIN)]) == TRACE_CHAIN
        assert len(chain) == len(t.rollouts)
        assert list(chain["rollout_id"]) == list(t.rollouts["rollout_id"])


def test_chain_for_rollout_loop_matches_records(loop, loop_tables):
    for rec in loop.records[::5]:
        row = chain_for_rollout(loop_tables, rec.sample_id)
        assert row["prompt_id"] == rec.prompt_id
        assert row["behavior_policy_version"] == rec.policy_version
        assert row["verifier_version"] == rec.verifier_version
        assert row["optimizer_step"] == rec.policy_version  # синхронный цикл: шаг k на версии k
        assert row["resulting_policy_version"] == rec.policy_version + 1
        assert row["trace_id"] == rec.trace_id


@pytest.mark.parametrize("which", ["loop_tables", "sim_tables"])
def test_joins_are_inverse(request, which):
    """Шаг s содержит роллаут r ⇔ цепочка r ведёт к шагу s (каждый роллаут — не более чем в одном)."""
    t = request.getfixturevalue(which)
    fed = {}
    for step, n in zip(t.batches["optimizer_step"], t.batches["n_rollouts"]):
        ids = list(rollouts_for_step(t, int(step))["rollout_id"])
        assert len(ids) == n
        fed[int(step)] = set(ids)
    for rid in t.rollouts["rollout_id"]:
        step = chain_for_rollout(t, rid)["optimizer_step"]
        holders = [s for s, ids in fed.items() if rid in ids]
        if pd.isna(step):
            assert holders == []
        else:
            assert holders == [int(step)]
    chain = full_chain(t)
    used = set(chain.loc[chain["optimizer_step"].notna(), "rollout_id"])
    assert set().union(*fed.values()) == used


def test_rollouts_for_step_has_prompt_fields(loop_tables):
    fed = rollouts_for_step(loop_tables, 1)
    assert {"prompt_id", "prompt_tokens", "prompt_rollouts"} <= set(fed.columns)
    assert (fed["resulting_policy_version"] == 2).all()


# --------------------------------------------------------------------------- сироты и верификатор


def test_orphans_in_simulation(sim, sim_tables):
    r = sim.rollouts
    orphans = find_orphans(sim_tables)
    expected = set(r.loc[r["dequeue_time"].isna(), "rollout_id"]) | set(
        r.loc[r["dropped"], "rollout_id"]
    )
    assert set(orphans["rollout_id"]) == expected
    assert len(orphans) == len(expected)
    reason = dict(zip(orphans["rollout_id"], orphans["reason"]))
    for row in r.itertuples():
        if row.dropped:
            assert reason[row.rollout_id] == "dropped"
        elif math.isnan(row.dequeue_time):
            want = "in_flight" if math.isnan(row.enqueue_time) else "queued"
            assert reason[row.rollout_id] == want
    counts = orphans["reason"].value_counts().to_dict()
    assert counts.get("dropped", 0) == sim.summary["dropped"] > 0
    assert counts.get("queued", 0) == sim.summary["queued_at_end"] > 0
    assert counts.get("in_flight", 0) == sim.summary["in_flight_at_end"] > 0
    assert set(orphans["reason_text"]) <= set(ORPHAN_REASONS.values())


def test_orphans_small_table():
    orphans = find_orphans(small_tables())
    assert list(orphans["rollout_id"]) == ["r4"]
    assert list(orphans["reason"]) == ["in_flight"]


def test_verifier_mismatches_crafted():
    t = small_tables()
    assert verifier_mismatches(t).empty
    assert verifier_mismatches(t, "v1").empty
    t.rollouts.loc[t.rollouts["rollout_id"] == "r1", "verifier_version"] = "v0"
    t.rollouts.loc[t.rollouts["rollout_id"] == "r4", "verifier_version"] = "v0"  # сирота
    bad = verifier_mismatches(t)
    assert list(bad["rollout_id"]) == ["r1"]  # сирота в обновление не попал: не сверяется
    assert list(bad["expected_verifier_version"]) == ["v1"]
    assert list(bad["optimizer_step"]) == [0]
    # Шаг 1 ждал v2 (steps.expected_verifier_version): несовпадения — оба его роллаута и r1.
    steps = t.steps.assign(expected_verifier_version=["v1", "v2"])
    bad = verifier_mismatches(_with(t, steps=steps))
    assert list(bad["rollout_id"]) == ["r1", "r2", "r3"]
    assert list(verifier_mismatches(t, "v0")["rollout_id"]) == ["r0", "r2", "r3"]


def test_verifier_mismatches_loop(loop_tables):
    assert verifier_mismatches(loop_tables).empty
    assert len(verifier_mismatches(loop_tables, "arith-v2")) == len(loop_tables.rollouts)


def test_verifier_mismatches_bad_input():
    t = small_tables()
    with pytest.raises(ValueError, match="expected_version"):
        verifier_mismatches(t, {0: "v1", 1: "v1"})
    with pytest.raises(ValueError, match="expected_version"):
        verifier_mismatches(t, 3)
    with pytest.raises(ValueError, match="expected_version"):
        verifier_mismatches(t, "")


# --------------------------------------------------------------------------- check_chain


def test_check_chain_clean():
    assert check_chain(small_tables()) == []


def _with(t: TraceTables, **frames) -> TraceTables:
    return TraceTables(
        frames.get("prompts", t.prompts),
        frames.get("rollouts", t.rollouts),
        frames.get("batches", t.batches),
        frames.get("steps", t.steps),
        t.source,
        t.horizon_s,
    )


def test_check_chain_duplicate_rollout_id():
    t = small_tables()
    rollouts = pd.concat([t.rollouts, t.rollouts.iloc[[0]]], ignore_index=True)
    bad = _with(t, rollouts=rollouts)
    msgs = check_chain(bad)
    assert any("повторяющиеся rollout_id" in m and "'r0'" in m for m in msgs)
    with pytest.raises(ValueError, match="rollout_id"):
        full_chain(bad)


def test_check_chain_duplicate_prompt_and_batch_ids():
    t = small_tables()
    prompts = pd.concat([t.prompts, t.prompts.iloc[[1]]], ignore_index=True)
    bad = _with(t, prompts=prompts)
    assert any("повторяющиеся prompt_id" in m for m in check_chain(bad))
    with pytest.raises(ValueError, match="prompt_id"):  # merge(validate="many_to_one")
        full_chain(bad)
    batches = pd.concat([t.batches, t.batches.iloc[[0]]], ignore_index=True)
    bad = _with(t, batches=batches)
    msgs = check_chain(bad)
    assert any("повторяющиеся training_batch_id" in m for m in msgs)
    with pytest.raises(ValueError, match="training_batch_id"):
        full_chain(bad)


def test_check_chain_batch_with_unknown_rollout():
    t = small_tables()
    batches = t.batches.copy()
    batches.at[1, "rollout_ids"] = ("r2", "r3", "r99")
    batches.at[1, "n_rollouts"] = 3
    msgs = check_chain(_with(t, batches=batches))
    assert any("неизвестные роллауты" in m and "'r99'" in m for m in msgs)


def test_check_chain_membership_disagreement():
    t = small_tables()
    batches = t.batches.copy()
    batches.at[0, "rollout_ids"] = ("r0",)  # r1 указывает на b0, но в составе b0 его нет
    msgs = check_chain(_with(t, batches=batches))
    assert any("'r1'" in m and "нет в его составе" in m for m in msgs)
    assert any("n_rollouts = 2, а в составе 1" in m for m in msgs)
    assert any("tokens = 30, а сумма по составу 10" in m for m in msgs)


def test_check_chain_reports_missing_tokens():
    t = small_tables()
    rollouts = t.rollouts.copy()
    rollouts.loc[1, "tokens"] = math.nan  # не ValueError, а сообщение о пакете b0
    msgs = check_chain(_with(t, rollouts=rollouts))
    assert any("пакет 'b0'" in m and "'r1'" in m and "не указано число токенов" in m for m in msgs)


def test_check_chain_unknown_prompt_and_batch():
    t = small_tables()
    rollouts = t.rollouts.copy()
    rollouts.loc[0, "prompt_id"] = "p9"
    rollouts.loc[4, "training_batch_id"] = "b7"
    msgs = check_chain(_with(t, rollouts=rollouts))
    assert any("неизвестные запросы" in m and "'p9'" in m for m in msgs)
    assert any("неизвестные пакеты" in m and "'b7'" in m for m in msgs)


def test_check_chain_versions_backwards():
    t = small_tables()
    steps = t.steps.copy()
    steps["resulting_policy_version"] = [2, 1]
    msgs = check_chain(_with(t, steps=steps))
    assert any("версии идут назад" in m for m in msgs)
    rollouts = t.rollouts.copy()
    rollouts.loc[0, "behavior_policy_version"] = 3  # сгенерирован «будущей» версией
    msgs = check_chain(_with(t, rollouts=rollouts))
    assert any("версии идут назад" in m and "'r0'" in m for m in msgs)


def test_check_chain_step_without_batch_and_batch_without_step():
    t = small_tables()
    steps = pd.concat(
        [t.steps, pd.DataFrame({"optimizer_step": [2], "resulting_policy_version": [3]})],
        ignore_index=True,
    )
    msgs = check_chain(_with(t, steps=steps))
    assert any("шаги без пакета" in m for m in msgs)
    msgs = check_chain(_with(t, steps=t.steps.iloc[[0]]))
    assert any("шага 1 нет в steps" in m for m in msgs)


def test_check_chain_loop_injection(loop_tables):
    rollouts = loop_tables.rollouts.copy()
    rollouts.loc[3, "rollout_id"] = rollouts.loc[2, "rollout_id"]
    msgs = check_chain(_with(loop_tables, rollouts=rollouts))
    assert any("повторяющиеся rollout_id" in m for m in msgs)
    assert check_chain(loop_tables) == []  # исходные таблицы не изменились


# --------------------------------------------------------------------------- панель наблюдения


def _value(dash, group, metric):
    return dash.loc[(group, metric), "значение"]


def test_dashboard_shape(sim, sim_tables):
    dash = dashboard(sim_tables, sim)
    expected = [(g, m) for g, names in METRIC_GROUPS.items() for m in names]
    assert list(dash.index) == expected
    assert list(dash.columns) == ["значение", "единицы"]
    assert all(dash["единицы"].astype(bool))


def test_dashboard_simulation_numbers(sim, sim_tables):
    dash = dashboard(sim_tables, sim)
    s, r = sim.summary, sim.rollouts
    latency = (r["enqueue_time"] - r["gen_start"]).dropna().to_numpy()
    for q in (50, 95, 99):
        got = _value(dash, "система", f"длительность роллаута, p{q}")
        assert got == pytest.approx(np.percentile(latency, q), rel=1e-12)
    # Среднее перцентилей сборщиков — не перцентиль общей выборки (поэтому считаем по объединению).
    ready = r[r["enqueue_time"].notna()]
    per_collector = [
        np.percentile(g["enqueue_time"] - g["gen_start"], 95) for _, g in ready.groupby("collector")
    ]
    assert np.mean(per_collector) != pytest.approx(np.percentile(latency, 95), rel=1e-6)
    assert _value(dash, "политика", "задержка политики, средняя") == pytest.approx(
        s["mean_policy_lag"]
    )
    assert _value(dash, "политика", "задержка политики, максимальная") == s["max_policy_lag"]
    assert _value(dash, "политика", "ESS/n, среднее по шагам") == pytest.approx(s["ess_norm"])
    assert _value(dash, "политика", "шагов оптимизатора") == s["optimizer_steps"]
    assert _value(dash, "система", "пропускная способность обучения") == pytest.approx(
        s["throughput_tokens_per_s"]
    )
    assert _value(dash, "система", "скорость генерации") == pytest.approx(
        s["generated_tokens_per_s"]
    )
    assert _value(dash, "система", "время в очереди, среднее") == pytest.approx(
        s["mean_queue_time_s"]
    )
    assert _value(dash, "система", "доля простоя тренера") == pytest.approx(s["trainer_idle_share"])
    assert _value(dash, "система", "синхронизация весов, среднее") == pytest.approx(
        SIM_CONFIG.weight_sync_s
    )
    n_orphans = s["dropped"] + s["queued_at_end"] + s["in_flight_at_end"]
    assert _value(dash, "надёжность", "осиротевших роллаутов") == n_orphans
    assert _value(dash, "надёжность", "доля осиротевших роллаутов") == pytest.approx(
        n_orphans / s["started"]
    )
    assert _value(dash, "надёжность", "отброшено как несвежие") == s["dropped"]
    assert _value(dash, "надёжность", "несовпадений версии верификатора") == 0
    assert _value(dash, "надёжность", "нарушений цепочки") == 0
    assert _value(dash, "данные", "токенов на роллаут, среднее") == pytest.approx(
        r["tokens"].mean()
    )
    assert math.isnan(_value(dash, "данные", "средняя награда"))  # в модели нет наград
    # Без исходного прогона метрик из events нет, остальные те же.
    bare = dashboard(sim_tables)
    assert math.isnan(_value(bare, "система", "доля простоя тренера"))
    assert _value(bare, "система", "длительность роллаута, p95") == _value(
        dash, "система", "длительность роллаута, p95"
    )


def test_dashboard_loop_numbers(loop, loop_tables):
    dash = dashboard(loop_tables, loop)
    recs = loop.records
    assert _value(dash, "данные", "доля информативных групп") == pytest.approx(
        policy.informative_group_fraction(recs)
    )
    assert _value(dash, "данные", "доля вырожденных групп") == pytest.approx(
        1 - policy.informative_group_fraction(recs)
    )
    mean_reward = np.mean([policy.scalar_reward(r.reward) for r in recs])
    assert _value(dash, "данные", "средняя награда") == pytest.approx(mean_reward)
    assert _value(dash, "данные", "запросов") == 8
    tokens = [len(r.response_tokens) for r in recs]
    assert _value(dash, "данные", "токенов на роллаут, среднее") == pytest.approx(np.mean(tokens))
    assert _value(dash, "данные", "токенов на роллаут, p95") == pytest.approx(
        np.percentile(tokens, 95)
    )
    assert _value(dash, "политика", "задержка политики, максимальная") == 0
    assert _value(dash, "политика", "итоговая версия политики") == 2
    assert _value(dash, "система", "пиковая память") == pytest.approx(
        loop.steps["peak_memory_bytes"].max() / 2**30
    )
    ev = loop.events[loop.events["stage"] == "weight_sync"]
    assert _value(dash, "система", "синхронизация весов, среднее") == pytest.approx(
        (ev["end_s"] - ev["start_s"]).mean()
    )
    assert _value(dash, "надёжность", "осиротевших роллаутов") == 0
    assert _value(dash, "надёжность", "нарушений цепочки") == 0


def test_dashboard_reports_broken_chain():
    t = small_tables()
    t.rollouts.loc[t.rollouts["rollout_id"] == "r2", "verifier_version"] = "v0"
    dash = dashboard(t)
    assert _value(dash, "надёжность", "несовпадений версии верификатора") == 1
    assert _value(dash, "надёжность", "осиротевших роллаутов") == 1
    assert _value(dash, "данные", "доля информативных групп") == pytest.approx(0.5)
    steps = t.steps.copy()
    steps["resulting_policy_version"] = [2, 1]
    assert _value(dash, "надёжность", "нарушений цепочки") == 0
    broken = dashboard(_with(t, steps=steps))
    assert _value(broken, "надёжность", "нарушений цепочки") >= 1


# --------------------------------------------------------------------------- плохой вход


def test_bad_inputs(sim_tables):
    with pytest.raises(ValueError, match="tables"):
        full_chain("таблицы")
    with pytest.raises(ValueError, match="rollout_id"):
        chain_for_rollout(sim_tables, -1)
    with pytest.raises(ValueError, match="optimizer_step"):
        rollouts_for_step(sim_tables, 10_000)
    with pytest.raises(ValueError, match="optimizer_step"):
        rollouts_for_step(sim_tables, "0")
    broken = _with(sim_tables, steps=sim_tables.steps.drop(columns="resulting_policy_version"))
    with pytest.raises(ValueError, match="resulting_policy_version"):
        check_chain(broken)
    with pytest.raises(ValueError, match="steps"):
        check_chain(_with(sim_tables, steps=[1, 2]))


def test_bad_loop_records(loop):
    fake = copy.copy(loop)
    fake.records = [copy.copy(loop.records[0])]
    fake.records[0].policy_version = 7
    with pytest.raises(ValueError, match="версия политики"):
        trace_from_loop(fake)


def test_module_api_kept():
    # Старый API модуля на месте (его проверяет tests/test_tracing.py).
    for name in ("StageTimer", "percentiles", "gantt", "cuda_sync_or_none"):
        assert hasattr(tracing, name)
