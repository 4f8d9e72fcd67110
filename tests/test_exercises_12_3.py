"""Отдельные проверки шагов урока 12.3 (12.3.6–12.3.9); общие свойства — в test_exercises.py.

Типичные ошибки здесь собраны вручную из данных задачи (не через ловушки шага) и во всех
вариантах 0–49 должны узнаваться своим ключом.
"""

import pytest

from course_utils import grading

VARIANTS_0_49 = range(50)


# ---------------------------------------------------------------- 12.3.6–12.3.9: конвейер (урок 12.3)
def test_lesson_12_3_registered():
    from course_utils import exercises

    assert "lesson_12_3" in exercises.LOADED
    assert {"12.3.6", "12.3.7", "12.3.8", "12.3.9"} <= set(grading.exercise_ids())


@pytest.mark.parametrize("variant", range(8))
def test_12_3_6_reference_by_hand(variant):
    task, ref = grading.task("12.3.6", variant), grading._reference("12.3.6", variant)
    G, T, n, K = task["G_s"], task["T_s"], task["n_batches"], task["K"]
    r_g, r_t = task["gen_tokens_per_s_per_device"], task["train_tokens_per_s_per_device"]
    assert ref["C_seq"] == G + T and ref["C_pipe"] == max(G, T)
    assert ref["T_n"] == G + T + (n - 1) * max(G, T)
    assert ref["speedup"] == pytest.approx(n * (G + T) / ref["T_n"])
    assert n * max(G, T) < ref["T_n"] * (1 - 0.02)  # «первый пакет бесплатно» заметно отличается
    rates = {k: min(k * r_g, (K - k) * r_t) for k in range(1, K)}
    assert ref["k_gen"] == max(rates, key=rates.get) and ref["k_gen"] + ref["k_train"] == K
    assert sorted(rates.values())[-2] < rates[ref["k_gen"]]  # лучшее разбиение единственно
    assert ref["k_gen"] != K // 2 and f"{G} с" in task["statement"] and "1 %" in task["statement"]


def test_12_3_6_forms_and_feedback():
    ref = grading._reference("12.3.6")
    assert grading.evaluate("12.3.6", {**ref, "k_gen": float(ref["k_gen"])})
    assert grading.evaluate("12.3.6", {**ref, "T_n": ref["T_n"] * 1.005})
    result = grading.evaluate("12.3.6", {**ref, "k_gen": ref["k_gen"] - 1})
    assert result.status == "malformed" and "K =" in result.message
    result = grading.evaluate("12.3.6", {**ref, "T_n": ref["T_n"] * 1.2})
    assert result.status == "wrong" and "T_n" in result.message and "C_seq" not in result.message
    # ошибки узнаются и по одному ключу: асимптотическое ускорение = «забыли заполнение»
    task = grading.task("12.3.6")
    limit = (task["G_s"] + task["T_s"]) / max(task["G_s"], task["T_s"])
    result = grading.evaluate("12.3.6", {**ref, "speedup": limit})
    assert result.misconception == "first_batch_free"
    result = grading.evaluate("12.3.6", {**ref, "C_pipe": task["G_s"] + task["T_s"]})
    assert result.misconception == "sum_not_max"


@pytest.mark.parametrize("variant", range(8))
def test_12_3_7_reference_by_hand(variant):
    task, ref = grading.task("12.3.7", variant), grading._reference("12.3.7", variant)
    d, tau = [r["duration_s"] for r in task["rollouts"]], task["timeout_s"]
    assert ref["T_group"] == max(d) and ref["U"] == pytest.approx(sum(d) / (len(d) * max(d)))
    capped = [min(x, tau) for x in d]
    assert ref["U_timeout"] == pytest.approx(sum(capped) / (len(d) * tau))
    assert ref["U"] < ref["U_timeout"] < 0.9
    assert ref["truncated"] == [i for i, x in enumerate(d) if x > tau] != []
    hard = [i for i, r in enumerate(task["rollouts"]) if r["difficulty"] == "hard"]
    easy = [i for i, r in enumerate(task["rollouts"]) if r["difficulty"] == "easy"]
    cut = set(ref["truncated"])
    assert ref["hard_share_truncated"] == pytest.approx(len(cut & set(hard)) / len(hard))
    assert ref["easy_share_truncated"] == pytest.approx(len(cut & set(easy)) / len(easy))
    assert ref["hard_share_truncated"] > ref["easy_share_truncated"]  # тайм-аут смещает данные
    assert ref["hard_share_truncated"] < 1


def test_12_3_7_forms_and_feedback():
    ref = grading._reference("12.3.7")
    assert grading.evaluate("12.3.7", {**ref, "truncated": ref["truncated"][::-1]})
    assert grading.evaluate("12.3.7", {**ref, "truncated": set(ref["truncated"])})
    result = grading.evaluate("12.3.7", {**ref, "U": 100 * ref["U"]})
    assert result.status == "malformed" and "проценты" in result.message
    result = grading.evaluate("12.3.7", {**ref, "truncated": ["q1"]})
    assert result.status == "malformed" and "truncated" in result.message
    result = grading.evaluate("12.3.7", {**ref, "truncated": ref["truncated"][1:]})
    assert result.status == "wrong" and "truncated" in result.message
    result = grading.evaluate("12.3.7", {**ref, "U": 1.0, "U_timeout": 1.0})
    assert result.misconception == "mean_not_max"


@pytest.mark.parametrize("variant", range(8))
def test_12_3_8_reference_by_hand(variant):
    task, ref = grading.task("12.3.8", variant), grading._reference("12.3.8", variant)
    mu = task["batch_tokens"] / task["step_s"]
    per = task["rollouts_per_s_per_collector"] * task["mean_tokens"]
    lam = {c: n * per for c, n in task["collectors"].items()}
    signs = sorted((lam[c] > mu + 1e-6) - (lam[c] < mu - 1e-6) for c in lam)
    assert signs == [-1, 0, 1]  # ровно одна конфигурация с λ = μ
    assert ref["stable"] == {c: lam[c] < mu - 1e-6 for c in lam}
    for c in lam:
        assert ref["growth_tokens_per_s"][c] == pytest.approx(max(lam[c] - mu, 0), abs=1e-6)
    big = task["backpressure_config"]
    assert lam[big] > mu
    L, B = task["max_lag_steps"], task["batch_tokens"]
    assert ref["threshold_tokens"] == L * B - task["collectors"][big] * task["max_tokens"] > 0


@pytest.mark.parametrize("variant", range(4))
def test_12_3_8_threshold_bounds_simulated_queue(variant):
    """Симулятор с порогом из ответа: очередь перелетает порог, но не превышает L·B."""
    from course_utils import pipeline

    task, ref = grading.task("12.3.8", variant), grading._reference("12.3.8", variant)
    big = task["backpressure_config"]
    cfg = pipeline.SimConfig(
        num_collectors=task["collectors"][big], batch_tokens=task["batch_tokens"],
        max_queue_tokens=ref["threshold_tokens"], length_dist="uniform",
        mean_tokens=task["mean_tokens"], max_tokens=task["max_tokens"],
        decode_tokens_per_s=4000.0, train_tokens_per_s=task["batch_tokens"] / task["step_s"],
        train_fixed_s=0.0, weight_sync_s=0.0, duration_s=60.0,
    )  # fmt: skip
    peak = pipeline.simulate(cfg).summary["peak_queue_tokens"]
    assert ref["threshold_tokens"] < peak <= task["max_lag_steps"] * task["batch_tokens"]


def test_12_3_8_forms_and_feedback():
    ref = grading._reference("12.3.8")
    result = grading.evaluate("12.3.8", {**ref, "threshold_tokens": ref["threshold_tokens"] + 0.5})
    assert result.status == "malformed" and "целое" in result.message
    result = grading.evaluate("12.3.8", {**ref, "stable": True})
    assert result.status == "malformed" and "stable" in result.message
    all_stable = {**ref, "stable": dict.fromkeys(ref["stable"], True)}
    assert grading.evaluate("12.3.8", all_stable).misconception == "stable_if_equal"


@pytest.mark.parametrize("variant", range(8))
def test_12_3_9_trace_and_reference(variant):
    from course_utils import pipeline

    task, ref = grading.task("12.3.9", variant), grading._reference("12.3.9", variant)
    trace = task["trace"]
    assert [r["row"] for r in trace] == list(range(len(trace)))
    for r in trace:
        assert r["end_s"] > r["start_s"]
        assert all(trace[j]["end_s"] <= r["start_s"] + 1e-9 for j in r["depends_on"])
    by_worker = {}
    for r in trace:
        by_worker.setdefault(r["worker"], []).append((r["start_s"], r["end_s"]))
    for spans in by_worker.values():  # у исполнителя интервалы не перекрываются
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(sorted(spans), sorted(spans)[1:]))
    work = [r for r in trace if r["stage"] not in ("queue_wait", "backpressure")]
    assert ref["sum_of_work"] == pytest.approx(sum(r["end_s"] - r["start_s"] for r in work))
    assert ref["critical_path"] < ref["sum_of_work"]
    horizon = max(r["end_s"] for r in trace)
    for pool, workers in task["pools"].items():
        busy = sum(r["end_s"] - r["start_s"] for r in work if r["worker"] in workers)
        assert ref["utilization"][pool] == pytest.approx(busy / (len(workers) * horizon))
    totals = {}
    for r in work:
        totals[r["stage"]] = totals.get(r["stage"], 0) + r["end_s"] - r["start_s"]
    assert max(totals, key=totals.get) == "decode" != ref["speed_up"]
    deps = {r["row"]: r["depends_on"] for r in trace if r["depends_on"]}
    intervals = [{k: r[k] for k in ("worker", "stage", "start_s", "end_s")} for r in trace]
    _, chain = pipeline.critical_path(intervals, deps)
    assert ref["speed_up"] in set(chain["stage"]) and "decode" not in set(chain["stage"])


def test_12_3_9_speed_up_varies_and_feedback():
    assert len({grading._reference("12.3.9", v)["speed_up"] for v in range(8)}) >= 3
    ref = grading._reference("12.3.9")
    assert grading.evaluate("12.3.9", {**ref, "speed_up": ref["speed_up"].upper()})
    result = grading.evaluate("12.3.9", {**ref, "speed_up": "обучение"})
    assert result.status == "malformed" and "forward_backward" in result.message
    pct = {**ref, "utilization": {p: 100 * u for p, u in ref["utilization"].items()}}
    assert grading.evaluate("12.3.9", pct).status == "malformed"
    mean = sum(ref["utilization"].values()) / 3
    flat = {**ref, "utilization": dict.fromkeys(ref["utilization"], mean), "speed_up": "decode"}
    assert grading.evaluate("12.3.9", flat).misconception == "off_critical_path"  # первая по списку
    one = {**ref, "utilization": dict.fromkeys(ref["utilization"], mean)}
    assert grading.evaluate("12.3.9", one).misconception == "average_utilization"


# ---------------------------------------------------------------- ошибки, собранные вручную, 0–49
def _named(exercise_id, wrong_answers):
    """Сбои: (вариант, ошибка, вердикт) для ответов, которые не узнаны как своя ошибка."""
    failures = []
    for variant in VARIANTS_0_49:
        task, ref = grading.task(exercise_id, variant), grading._reference(exercise_id, variant)
        for key, answer in wrong_answers(task, ref).items():
            got = grading.evaluate(exercise_id, answer, variant)
            if (got.status, got.misconception) != ("misconception", key.split(":")[0]):
                failures.append((variant, key, got.status, got.misconception))
    return failures


def _wrong_12_3_6(task, ref):
    G, T, n, K = task["G_s"], task["T_s"], task["n_batches"], task["K"]
    r_g, r_t = task["gen_tokens_per_s_per_device"], task["train_tokens_per_s_per_device"]
    k_prop = min(max(round(K * r_g / (r_g + r_t)), 1), K - 1)  # «пропорционально скорости»
    return {
        "sum_not_max": {**ref, "C_pipe": G + T, "T_n": n * (G + T), "speedup": 1.0},
        "sum_not_max:only_period": {**ref, "C_pipe": G + T},
        "first_batch_free": {**ref, "T_n": n * max(G, T), "speedup": (G + T) / max(G, T)},
        "first_batch_free:only_speedup": {**ref, "speedup": (G + T) / max(G, T)},
        "equal_split": {**ref, "k_gen": K // 2, "k_train": K - K // 2},
        "faster_gets_more": {**ref, "k_gen": k_prop, "k_train": K - k_prop},
    }


def _wrong_12_3_7(task, ref):
    rows, tau = task["rollouts"], task["timeout_s"]
    d = [r["duration_s"] for r in rows]
    capped = [min(x, tau) for x in d]
    cut = [i for i, x in enumerate(d) if x > tau]
    hard_among_cut = sum(rows[i]["difficulty"] == "hard" for i in cut) / len(cut)
    mean, mean_c = sum(d) / len(d), sum(capped) / len(d)
    return {
        "mean_not_max": {
            **ref,
            "T_group": mean,
            "U": sum(d) / (len(d) * mean),
            "U_timeout": sum(capped) / (len(d) * mean_c),
        },  # fmt: skip
        "mean_not_max:only_T": {**ref, "T_group": mean},
        "truncation_free": {
            **ref,
            "truncated": [],
            "hard_share_truncated": 0.0,
            "easy_share_truncated": 0.0,
        },  # fmt: skip
        "conditional_reversed": {
            **ref,
            "hard_share_truncated": hard_among_cut,
            "easy_share_truncated": 1 - hard_among_cut,
        },  # fmt: skip
        "old_max_denominator": {**ref, "U_timeout": sum(capped) / (len(d) * max(d))},
    }


def _wrong_12_3_8(task, ref):
    mu = task["batch_tokens"] / task["step_s"]
    per = task["rollouts_per_s_per_collector"] * task["mean_tokens"]
    lam = {c: n * per for c, n in task["collectors"].items()}
    L, B = task["max_lag_steps"], task["batch_tokens"]
    C = task["collectors"][task["backpressure_config"]]
    return {
        "stable_if_equal": {**ref, "stable": {c: lam[c] <= mu * (1 + 1e-9) for c in lam}},
        "stable_if_equal:all": {**ref, "stable": dict.fromkeys(lam, True)},
        "negative_growth": {**ref, "growth_tokens_per_s": {c: lam[c] - mu for c in lam}},
        "ignore_inflight": {**ref, "threshold_tokens": L * B},
        "count_not_tokens": {**ref, "threshold_tokens": L * B - C * task["mean_tokens"]},
    }


def _wrong_12_3_9(task, ref):
    rows = task["trace"]
    length = {r["row"]: r["end_s"] - r["start_s"] for r in rows}
    work = [r for r in rows if r["stage"] not in ("queue_wait", "backpressure")]
    per_stage = {}
    for r in work:
        per_stage[r["stage"]] = per_stage.get(r["stage"], 0.0) + length[r["row"]]
    horizon = max(r["end_s"] for r in rows)
    n_workers = sum(len(w) for w in task["pools"].values())
    overall = sum(length[r["row"]] for r in work) / (n_workers * horizon)
    mean = sum(ref["utilization"].values()) / len(ref["utilization"])
    return {
        "off_critical_path": {**ref, "speed_up": max(per_stage, key=per_stage.get)},
        "sum_as_critical": {**ref, "critical_path": sum(length[r["row"]] for r in work)},
        "average_utilization": {**ref, "utilization": dict.fromkeys(task["pools"], overall)},
        "average_utilization:mean": {**ref, "utilization": dict.fromkeys(task["pools"], mean)},
        "wait_as_work": {**ref, "sum_of_work": sum(length.values())},
    }


@pytest.mark.parametrize(
    "exercise_id, wrong",
    [("12.3.6", _wrong_12_3_6), ("12.3.7", _wrong_12_3_7), ("12.3.8", _wrong_12_3_8),
     ("12.3.9", _wrong_12_3_9)],
)  # fmt: skip
def test_hand_built_wrong_answers_named_in_variants_0_49(exercise_id, wrong):
    failures = _named(exercise_id, wrong)
    assert not failures, f"{exercise_id}: {len(failures)} сбоев, например {failures[:5]}"
