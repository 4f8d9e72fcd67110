"""Тесты course_utils.incidents_sync: лаборатории инцидентов TRL #5312 и miles #2372 (урок 12.4).

Всё на крошечной модели курса на CPU: GRPO со сном движка (4 прогона по 2 шага) и режимы паузы
(16 запросов, публикация на такте 6). Проверки курса должны срабатывать на сломанном варианте
и молчать на исправленном.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from course_utils import policy
from course_utils.contract import validate_rollout, violated_rules
from course_utils.incidents_sync import (
    PAUSE_MODES,
    _zero_lag_probe,
    in_flight_check,
    run_pause_mode,
    sleep_wake_run,
    tim_alarm_threshold,
)
from course_utils.weight_sync import InProcessEngine

LENGTHS = [8 + (5 * i) % 17 for i in range(16)]  # 8…24 токенов: все в полёте на такте 6
PUBLISH_AT = 6


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = policy.load_policy("tiny", device="cpu")
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return model, tokenizer, new


# ----------------------------------------------------------------------------- устаревшие веса


def test_threshold_rule_and_bad_inputs():
    assert tim_alarm_threshold([1e-7, 3e-7, 2e-7]) == pytest.approx(3e-6)
    assert tim_alarm_threshold([0.01], factor=3) == pytest.approx(0.03)
    for bad in ([], "0.1", [-1.0], [float("nan")]):
        with pytest.raises(ValueError, match="healthy_gaps"):
            tim_alarm_threshold(bad)
    with pytest.raises(ValueError, match="factor"):
        tim_alarm_threshold([0.1], factor=0)


def test_probe_gap_is_mean_abs_difference_and_fires_above_threshold():
    engine = [np.log([0.5, 0.25, 0.8]), np.log([0.1, 0.9])]
    trainer = [np.log([0.4, 0.25, 0.8]), np.log([0.2, 0.9])]
    expected = np.mean(np.abs(np.concatenate(trainer) - np.concatenate(engine)))  # 5 токенов
    quiet = _zero_lag_probe(engine, trainer)
    assert quiet["gap"] == pytest.approx(expected) and not quiet["fired"]
    assert quiet["max_gap"] == pytest.approx(np.log(2))
    assert _zero_lag_probe(engine, trainer, expected * 1.01)["fired"] is False
    loud = _zero_lag_probe(engine, trainer, expected * 0.99)
    assert loud["fired"] and "нат" in loud["message"] and "не те веса" in loud["message"]
    with pytest.raises(ValueError, match="threshold"):
        _zero_lag_probe(engine, trainer, -1.0)


@pytest.fixture(scope="module")
def sleep_runs(tiny):
    model, tokenizer, _ = tiny
    tasks = policy.make_tasks(8, seed=5, mix={2: 0.5, 3: 0.5})[:4]
    kw = {"steps": 2, "group_size": 4, "max_new_tokens": 16}
    healthy = sleep_wake_run(model, tokenizer, tasks, "healthy", seed=100, **kw)
    tau = tim_alarm_threshold([r["gap"] for r in healthy])
    runs = {
        v: sleep_wake_run(model, tokenizer, tasks, v, threshold=tau, **kw)
        for v in ("fixed", "broken")
    }
    runs["healthy_same_seed"] = sleep_wake_run(model, tokenizer, tasks, "healthy", **kw)
    return tau, healthy, runs


def test_probe_is_quiet_on_fixed_and_fires_on_stale_engine(sleep_runs):
    tau, healthy, runs = sleep_runs
    assert all(r["weights_match"] for r in healthy) and 0 < tau < 1e-4  # float32: шум ядер
    fixed, broken = runs["fixed"], runs["broken"]
    # метка версии движка всегда равна версии тренера: по ней стейл не виден
    assert all(r["engine_version"] == r["trainer_version"] for r in fixed + broken)
    assert not any(r["fired"] for r in fixed) and all(r["weights_match"] for r in fixed)
    assert broken[0]["gap"] == fixed[0]["gap"] and not broken[0]["fired"]  # до первого сна
    for row in broken[1:]:
        assert row["fired"] and not row["weights_match"] and row["gap"] > 1e-2 > 100 * tau


def test_fixed_sleep_wake_path_is_bitwise_the_healthy_run(sleep_runs):
    _, _, runs = sleep_runs
    fixed, plain = runs["fixed"], runs["healthy_same_seed"]
    assert [r["gap"] for r in fixed] == [r["gap"] for r in plain]


def test_sleep_wake_run_bad_inputs(tiny):
    model, tokenizer, _ = tiny
    tasks = policy.make_tasks(2, seed=1)
    with pytest.raises(ValueError, match="variant"):
        sleep_wake_run(model, tokenizer, tasks, "level1")
    with pytest.raises(ValueError, match="steps"):
        sleep_wake_run(model, tokenizer, tasks, steps=0)


# ----------------------------------------------------------------------------- режимы паузы


@pytest.fixture(scope="module")
def pause_runs(tiny):
    model, _, new = tiny
    runs = {
        m: run_pause_mode(InProcessEngine(model), new, m, LENGTHS, PUBLISH_AT) for m in PAUSE_MODES
    }
    engine = InProcessEngine(model)
    runs["keep_forced"] = run_pause_mode(
        engine, new, "keep", LENGTHS, PUBLISH_AT, abort_all_requests=True
    )
    return runs


def test_abort_wastes_every_in_flight_token(pause_runs):
    run = pause_runs["abort"]
    assert run.in_flight == run.aborted == len(LENGTHS) and run.aborted_fraction == 1.0
    assert run.wasted_tokens == len(LENGTHS) * PUBLISH_AT  # каждый успел PUBLISH_AT токенов
    assert run.delay_ticks == 0 and run.ticks == PUBLISH_AT + max(LENGTHS) - 1
    assert all(r.policy_version == 1 and not validate_rollout(r) for r in run.records)
    assert not in_flight_check(run)["fired"]  # цена заявлена режимом


def test_wait_finishes_on_old_weights_and_delays_publish(pause_runs):
    run = pause_runs["wait"]
    assert run.aborted == run.wasted_tokens == 0
    assert run.delay_ticks == max(LENGTHS) - PUBLISH_AT  # ждём самый длинный ответ
    assert all(r.policy_version == 0 for r in run.records)  # у тренера уже 1: задержка +1
    assert not in_flight_check(run)["fired"]


def test_keep_records_mixed_versions_that_are_valid_only_per_token(tiny, pause_runs):
    model, _, new = tiny
    run = pause_runs["keep"]
    assert run.aborted == run.wasted_tokens == run.delay_ticks == 0
    for rec, length in zip(run.records, LENGTHS):
        assert rec.token_policy_versions == [0] * PUBLISH_AT + [1] * (length - PUBLISH_AT)
        assert rec.policy_version is None and validate_rollout(rec) == []
    assert not in_flight_check(run)["fired"]
    rec = run.records[0]
    # версии токенов правдивы: пересчёт весами своей версии даёт log μ движка
    old, fresh = (policy.recompute_logprobs(m, [rec])[0].numpy() for m in (model, new))
    mu = np.array(rec.behavior_logprobs)
    np.testing.assert_allclose(mu[:PUBLISH_AT], old[:PUBLISH_AT], atol=1e-4)
    np.testing.assert_allclose(mu[PUBLISH_AT:], fresh[PUBLISH_AT:], atol=1e-4)
    assert np.abs(mu[PUBLISH_AT:] - old[PUBLISH_AT:]).mean() > 1e-3
    # одна метка версии на смешанный ответ: контракт ловит, если версии токенов есть…
    labelled = copy.deepcopy(rec)
    labelled.policy_version = 0
    assert violated_rules(labelled) == ["mixed_versions"]
    # …и молчит, если их выбросили: токены версии 1 тихо приписаны версии 0
    labelled.token_policy_versions = None
    assert validate_rollout(labelled) == []


def test_tokens_before_publish_are_identical_across_keep_and_wait(pause_runs):
    keep, wait = pause_runs["keep"].records, pause_runs["wait"].records
    for a, b in zip(keep, wait):
        assert a.response_tokens[:PUBLISH_AT] == b.response_tokens[:PUBLISH_AT]


def test_check_fires_when_publish_aborts_work_the_mode_promised_to_keep(pause_runs):
    run = pause_runs["keep_forced"]
    assert run.abort_all_requests and run.aborted_fraction == 1.0
    check = in_flight_check(run)
    assert check["fired"] and "16 из 16" in check["message"]
    assert run.row()["режим"] == "keep + abort_all_requests"


def test_only_requests_still_decoding_are_in_flight(tiny):
    model, _, new = tiny
    run = run_pause_mode(InProcessEngine(model), new, "abort", [3, 10], 5)
    assert run.in_flight == run.aborted == 1 and run.wasted_tokens == 5
    assert run.records[0].policy_version == 0 and run.records[1].policy_version == 1


def test_pause_mode_bad_inputs(tiny):
    model, _, new = tiny
    engine = InProcessEngine(model)
    with pytest.raises(ValueError, match="mode"):
        run_pause_mode(engine, new, "retract", LENGTHS, PUBLISH_AT)
    with pytest.raises(ValueError, match="publish_at"):
        run_pause_mode(engine, new, "keep", [4, 5], 5)
    with pytest.raises(ValueError, match="lengths"):
        run_pause_mode(engine, new, "keep", [], 1)
    with pytest.raises(ValueError, match="abort_all_requests"):
        run_pause_mode(engine, new, "keep", LENGTHS, PUBLISH_AT, abort_all_requests=1)
    with pytest.raises(ValueError, match="engine"):
        run_pause_mode(model, new, "keep", LENGTHS, PUBLISH_AT)
