"""Тесты очереди урока 12.3 (course_utils.multiproc.queue_loop): 3 процесса ОС.

Один настоящий запуск (тренер с очередью и два генератора, gloo на CPU, ~10–15 с на 2 ядрах)
с медленным тренером (train_delay_s), чтобы μ < λ и обратное давление наверняка сработало;
он общий для большинства проверок. Ещё один запуск с двумя процессами обязан завершиться
понятной русской ошибкой. Остальное — без процессов.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_utils import multiproc, tracing  # noqa: E402
from course_utils.multiproc import queue_loop, sync_loop, transport  # noqa: E402
from course_utils.multiproc.transport import ROLE_GENERATOR, ROLE_TRAINER  # noqa: E402

ENTRY = "course_utils.multiproc.queue_loop:queue_generators_trainer"
ARGS = {
    "duration_s": 3.0,
    "max_queue_tokens": 1024,
    "batch_tokens": 512,
    "group_size": 4,
    "max_new_tokens": 16,
    "train_delay_s": 0.4,  # μ ≈ 600 токенов / 0.5 с ≪ λ двух генераторов
    "seed": 0,
}
T = ARGS["max_queue_tokens"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    res = multiproc.launch(
        ENTRY, nprocs=3, args=ARGS, timeout_s=120, run_dir=tmp_path_factory.mktemp("queue")
    )
    assert res.ok, res.summary()
    print()
    print(res.summary())
    print(queue_loop.queue_summary_text(queue_loop.queue_summary(res)))
    return res


def _parts(res):
    trainer = next(r for r in res.results if r["role"] == ROLE_TRAINER)
    gens = sorted((r for r in res.results if r["role"] == ROLE_GENERATOR), key=lambda r: r["rank"])
    return trainer, gens


# ----------------------------------------------------------------------------- настоящие процессы


def test_roles_and_processes(run):
    trainer, gens = _parts(run)
    assert trainer["rank"] == 0 and [g["rank"] for g in gens] == [1, 2]
    assert len({trainer["pid"], *(g["pid"] for g in gens)}) == 3
    assert trainer["worker"] == "тренер"
    assert [g["worker"] for g in gens] == ["генератор 1", "генератор 2"]
    assert "крошечная модель" in trainer["model"]
    assert all(g["model"] == trainer["model"] for g in gens)
    assert trainer["config"]["max_queue_tokens"] == T


def test_queue_bound_overshoot_by_in_flight_work(run):
    trainer, gens = _parts(run)
    tl = trainer["timeline"]
    # Независимый пересчёт работы «в полёте» по журналам разрешений и приходов.
    arrived = {(a["generator"], a["request_id"]): a for a in trainer["arrivals"]}
    grants = [p for p in trainer["permissions"] if p["granted"]]
    assert {(p["generator"], p["request_id"]) for p in grants} == set(arrived)  # всё дошло

    def in_flight(seq):
        return sum(
            arrived[(p["generator"], p["request_id"])]["tokens"]
            for p in grants
            if p["seq"] < seq <= arrived[(p["generator"], p["request_id"])]["seq"]
        )

    prev, base, flying = 0, None, None
    for row in tl:
        assert row["in_flight_tokens"] == in_flight(row["seq"])
        if row["depth_tokens"] >= T:
            if prev < T:  # пересечение порога: дальше приходит только работа, начатая раньше
                flying = in_flight(row["seq"])
                base = prev + flying
            # Глубина выше порога не больше, чем T + работа в полёте в момент пересечения.
            assert row["depth_tokens"] <= base < T + flying
            assert row["bound_tokens"] == base
            assert row["crossing_in_flight_tokens"] == flying
        prev = row["depth_tokens"]
    # Разрешения выдаются только ниже порога; отказы — только на пороге и выше.
    for p in trainer["permissions"]:
        if p["decision"] == "grant":
            assert p["depth_tokens"] < T
        elif p["decision"] == "deny":
            assert p["depth_tokens"] >= T
    peak = max(r["depth_tokens"] for r in tl)
    assert trainer["peak_depth_tokens"] == peak
    assert trainer["overshoot_tokens"] == max(0, peak - T) >= 0
    assert trainer["bound_holds"] is True
    # У каждого генератора в полёте не больше одного запроса: превышение < 2 · max группы.
    biggest = max(a["tokens"] for a in trainer["arrivals"])
    assert trainer["overshoot_tokens"] < len(gens) * biggest
    assert trainer["overshoot_tokens"] < trainer["peak_in_flight_tokens"] <= len(gens) * biggest
    assert max(r["in_flight_requests"] for r in tl) <= len(gens)


def test_backpressure_when_trainer_slower_than_generators(run):
    trainer, gens = _parts(run)
    s = queue_loop.queue_summary(run)
    assert s["lambda_tokens_per_s"] > 0 and s["mu_tokens_per_s"] > 0
    assert s["offered_lambda_tokens_per_s"] > s["mu_tokens_per_s"]  # μ < λ
    assert s["rho"] > 1
    assert s["peak_depth_tokens"] >= T  # очередь дошла до порога
    assert s["denials"] > 0 and s["grants"] > 0  # и генераторы получили отказы
    assert sum(g["denials"] for g in gens) == s["denials"]
    assert sum(g["n_requests"] for g in gens) == s["grants"] == len(trainer["arrivals"])
    assert sum(g["backpressure_wait_s"] for g in gens) > 0
    assert 0 < s["busy_fraction"] <= 1
    # μ — токены пакетов на время занятости; проверяем по строкам пакетов.
    busy = sum(b["train_s"] + b["delay_s"] for b in trainer["batches"])
    assert s["mu_tokens_per_s"] == pytest.approx(trainer["tokens_consumed"] / busy)
    assert all(b["delay_s"] >= ARGS["train_delay_s"] for b in trainer["batches"])


def test_admitted_inflow_is_consumption_plus_accumulation(run):
    # Принятый приток λ и предложенная нагрузка — разные величины: допуск режет вторую до μ.
    trainer, gens = _parts(run)
    s = queue_loop.queue_summary(run)
    tl = trainer["timeline"]
    window = tl[-1]["time_s"] - tl[0]["time_s"]  # от события start до события end
    assert s["window_s"] == pytest.approx(window)
    arrived = sum(a["tokens"] for a in trainer["arrivals"])
    eaten = sum(b["tokens"] for b in trainer["batches"])
    assert s["lambda_tokens_per_s"] == pytest.approx(arrived / window)
    assert s["consumed_tokens_per_s"] == pytest.approx(eaten / window)
    assert s["consumed_tokens_per_s"] == pytest.approx(s["mu_tokens_per_s"] * s["busy_fraction"])
    assert s["accumulated_tokens_per_s"] == pytest.approx(tl[-1]["depth_tokens"] / window)
    assert s["lambda_tokens_per_s"] == pytest.approx(
        s["consumed_tokens_per_s"] + s["accumulated_tokens_per_s"]
    )
    # Накопленное ограничено порогом и работой в полёте; предложенное — много больше μ.
    assert tl[-1]["depth_tokens"] <= s["peak_depth_tokens"] < T + s["peak_in_flight_tokens"]
    assert s["offered_lambda_tokens_per_s"] > s["mu_tokens_per_s"] >= s["consumed_tokens_per_s"]
    # Время генераторов в обратном давлении — по их собственным интервалам backpressure_wait.
    waits = sum(
        ev["end_s"] - ev["start_s"]
        for g in gens
        for ev in g["events"]
        if ev["stage"] == "backpressure_wait"
    )
    assert s["generator_blocked_s"] == pytest.approx(waits, rel=1e-6, abs=1e-6)
    accepting = trainer["stop_s"] - trainer["start_s"]
    assert s["duration_s"] == pytest.approx(accepting)
    assert s["generator_blocked_share"] == pytest.approx(waits / (len(gens) * accepting))
    assert 0 < s["generator_blocked_share"] < 1


def test_versions_increase_and_lags_nonnegative(run):
    trainer, gens = _parts(run)
    batches = trainer["batches"]
    assert len(batches) >= 2
    assert [b["new_version"] for b in batches] == list(range(1, len(batches) + 1))
    assert [b["trainer_version"] for b in batches] == list(range(len(batches)))
    assert trainer["final_version"] == len(batches)
    for b in batches:
        assert b["tokens"] >= ARGS["batch_tokens"]
        assert b["lags"] == [b["trainer_version"] - v for v in b["behavior_versions"]]
        assert min(b["lags"]) >= 0
        assert all(w >= 0 for w in b["queue_wait_s"])
        for key in ("loss", "grad_norm", "clip_fraction"):
            assert math.isfinite(b[key])
    consumed = sum(b["tokens"] for b in batches)
    assert consumed + trainer["left_in_queue_tokens"] == trainer["tokens_arrived"]
    for g in gens:
        versions = [r["version"] for r in g["requests"]]
        assert versions == sorted(versions)  # генератор не откатывается на старые веса
        fetched = [f["version"] for f in g["weight_fetches"]]
        assert fetched == sorted(set(fetched)) and all(f > 0 for f in fetched)
        assert all(f["bytes"] == 4 * g["num_params"] for f in g["weight_fetches"])
        assert g["final_version"] <= trainer["final_version"]
        for r in g["requests"]:
            assert r["first_ask_s"] <= r["granted_s"] <= r["gen_start_s"] <= r["gen_end_s"]
            assert r["gen_end_s"] <= r["sent_s"]
    assert max(g["final_version"] for g in gens) >= 1  # новые веса дошли до генераторов
    s = queue_loop.queue_summary(run)
    assert s["max_lag"] >= 1  # асинхронность: есть данные старых версий
    assert 0 <= s["mean_lag"] <= s["max_lag"]


def test_frames(run):
    trainer, gens = _parts(run)
    tl = queue_loop.queue_timeline_frame(run)
    assert tl["event"].iloc[0] == "start" and tl["event"].iloc[-1] == "end"
    assert set(tl["event"]) == {"start", "arrival", "batch", "end"}
    assert tl["seq"].is_monotonic_increasing and tl["time_s"].is_monotonic_increasing
    assert (tl["depth_tokens"] >= 0).all() and (tl["threshold_tokens"] == T).all()
    assert tl["depth_tokens"].max() == trainer["peak_depth_tokens"]
    req = queue_loop.queue_requests_frame(run)
    assert set(req["worker"]) == {"генератор 1", "генератор 2"}
    assert len(req) == trainer["grants"]
    assert queue_loop.queue_timeline_frame(run.results).equals(tl)  # и из списка словарей


def test_events_frame_for_three_workers(run):
    ev = transport.events_frame(run)
    workers = set(ev["worker"])
    assert {"тренер", "генератор 1", "генератор 2"} <= workers
    assert workers <= {"тренер", "генератор 1", "генератор 2", queue_loop.WORKER_QUEUE_RU}
    assert (ev["end_s"] >= ev["start_s"]).all()
    assert set(ev["stage"]) <= set(transport.STAGE_KINDS_RU)
    kinds = transport.events_frame(run, by_kind=True)
    assert {"генерация", "обучение", "обратное давление"} <= set(kinds["stage"])
    # Генераторы работают одновременно с обучением: это асинхронный цикл.
    gen = ev[(ev["stage"] == "generate")]
    train = ev[(ev["worker"] == "тренер") & (ev["stage"] == "grpo_update")]
    overlap = any(
        (gen["start_s"] < t.end_s).any() and (gen["end_s"] > t.start_s).any()
        for t in train.itertuples()
    )
    assert overlap
    ax = tracing.gantt(kinds)
    assert len(ax.get_yticklabels()) == len(workers)
    plt.close(ax.figure)


def test_sync_frames_reject_queue_result(run):
    with pytest.raises(ValueError, match="queue_generators_trainer"):
        sync_loop.sync_steps_frame(run)


def test_two_processes_fail_with_russian_error(tmp_path):
    res = multiproc.launch(
        ENTRY, nprocs=2, args={"duration_s": 1.0}, timeout_s=60, run_dir=tmp_path
    )
    assert not res.ok and res.status == "failed"
    assert "нужно ровно 3 процесса" in res.summary()
    assert "world_size=2" in res.summary()


# ----------------------------------------------------------------------------- без процессов


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"world_size": 4}, "world_size"),
        ({"rank": 3}, "rank"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": float("inf")}, "duration_s"),
        ({"max_queue_tokens": 0}, "max_queue_tokens"),
        ({"batch_tokens": 1.5}, "batch_tokens"),
        ({"batch_tokens": 2048, "max_queue_tokens": 1024}, "batch_tokens"),
        ({"prompts_per_request": 0}, "prompts_per_request"),
        ({"group_size": True}, "group_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"train_delay_s": -0.1}, "train_delay_s"),
        ({"seed": -1}, "seed"),
        ({"model": " "}, "model"),
        ({"temperature": 0}, "temperature"),
        ({"lr": float("nan")}, "lr"),
        ({"retry_s": 0}, "retry_s"),
    ],
)
def test_queue_bad_arguments(kwargs, name):
    call = {"rank": 0, "world_size": 3, "backend": "gloo", **kwargs}
    with pytest.raises(ValueError, match=name):
        queue_loop.queue_generators_trainer(**call)


def test_in_flight_bound_on_hand_made_log():
    # Порог 10. Два разрешения (g1: 6 токенов, g2: 7), пока очередь пуста; оба приходят.
    perms = [
        {"seq": 2, "generator": 1, "request_id": 0, "decision": "grant"},
        {"seq": 3, "generator": 2, "request_id": 0, "decision": "grant"},
        {"seq": 6, "generator": 1, "request_id": 1, "decision": "deny"},
    ]
    arrivals = [
        {"seq": 4, "generator": 1, "request_id": 0, "tokens": 6},
        {"seq": 5, "generator": 2, "request_id": 0, "tokens": 7},
    ]
    timeline = [
        {"seq": 1, "depth_tokens": 0},
        {"seq": 4, "depth_tokens": 6},
        {"seq": 5, "depth_tokens": 13},
        {"seq": 7, "depth_tokens": 0},
    ]
    rows = queue_loop._with_in_flight(timeline, perms, arrivals, threshold=10)
    assert [r["in_flight_tokens"] for r in rows] == [0, 13, 7, 0]
    assert [r["in_flight_requests"] for r in rows] == [0, 2, 1, 0]
    # Пересечение на seq 5: до него глубина 6, в полёте 7 → граница 13, превышение 3 < 7.
    assert [r["bound_tokens"] for r in rows] == [None, None, 13, None]
    assert [r["crossing_in_flight_tokens"] for r in rows] == [None, None, 7, None]


def test_queue_frames_reject_bad_input():
    failed = multiproc.LaunchResult(
        ok=False, status="failed", nprocs=3, backend="gloo", wall_s=1.0, results=[None] * 3
    )
    with pytest.raises(ValueError, match="неуспешно"):
        queue_loop.queue_summary(failed)
    with pytest.raises(ValueError, match="launch_result"):
        queue_loop.queue_timeline_frame(42)
    with pytest.raises(ValueError, match="тренер"):
        queue_loop.queue_requests_frame([{"role": ROLE_GENERATOR}])


def test_summary_text_is_russian_with_units():
    summary = {k: 1.0 for k in queue_loop.QUEUE_SUMMARY_RU}
    summary.update(overshoot_bound_holds=True, max_lag=None, grants=3)
    summary.update(offered_lambda_tokens_per_s=8837.4, threshold_tokens=1024)
    text = queue_loop.queue_summary_text(summary)
    lines = text.splitlines()
    assert len(lines) == len(queue_loop.QUEUE_SUMMARY_RU)
    assert "ρ = λ_предл / μ, раз: 1.00" in lines
    assert "λ_предл, предложенная нагрузка генераторов, токенов/с: 8\u00a0837" in lines
    assert "порог очереди T, токенов: 1\u00a0024" in lines  # разряды без запятой
    assert "превышение порога max(0, пик − T), токенов: 1" in lines
    assert "граница пик < T + работа в полёте выполнена: да" in lines
    assert "максимальная задержка политики, версий: —" in lines
    assert "," not in "".join(x.split(":")[-1] for x in lines)  # числа без запятых


def test_stage_events_use_one_clock(monkeypatch):
    # Системные часы шагнули на час вперёд посреди этапа: начало и конец события берутся с одних
    # часов (perf_counter, привязанный к настенным один раз), поэтому события не разъезжаются.
    import time

    import torch

    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: None)  # один ранг
    stages = transport.shared_stages(torch.device("cpu"))
    wall = time.time
    with stages.stage("a"):
        monkeypatch.setattr(transport.time, "time", lambda: wall() + 3600.0)
    t0 = stages.now()
    stages.add("b", t0, 0.0)
    a, b = stages.events
    assert a["end_s"] >= a["start_s"] >= 0
    assert 0 <= b["start_s"] - a["end_s"] < 1.0  # старый код: сдвиг на 3600 с
    assert abs(stages.now() - (stages.clock() - stages.t0)) < 1.0
