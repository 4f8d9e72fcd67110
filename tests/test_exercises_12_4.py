"""Проверки шагов урока 12.4 (12.4.6–12.4.9); общие свойства — в test_exercises.py.

Типичные ошибки здесь собраны вручную из данных задачи (не через Trap) и должны узнаваться своим
ключом в каждом варианте 0–49.
"""

import math

import pytest

from course_utils import fmt, grading, weight_audit
from course_utils.exercises.lesson_12_4 import lag_or_mismatch, sync_audit

VARIANTS = range(50)
ref_of = grading._reference


def _named(exercise_id, answer, variant):
    return grading.evaluate(exercise_id, answer, variant).misconception


def test_lesson_12_4_registered():
    from course_utils import exercises

    assert "lesson_12_4" in exercises.LOADED
    assert {"12.4.6", "12.4.7", "12.4.8", "12.4.9"} <= set(grading.exercise_ids())


# ---------------------------------------------------------------- 12.4.6
def _rows_12_4_6(task):
    return list(zip(task["mask"], task["logp_target"], task["logp_behavior"]))


@pytest.mark.parametrize("variant", range(8))
def test_12_4_6_reference_by_hand(variant):
    task, ref = grading.task("12.4.6", variant), ref_of("12.4.6", variant)
    rows = _rows_12_4_6(task)
    assert 0 in task["mask"] and 1 in task["mask"]  # многоходовой ответ с токенами среды
    assert ref["ratios"] == pytest.approx([math.exp(a - b) for m, a, b in rows if m], rel=1e-12)
    assert ref["seq_log_ratio"] == pytest.approx(sum(a - b for m, a, b in rows if m), abs=1e-12)
    assert "1 %" in task["statement"] and "0.002" in task["statement"]


def test_12_4_6_wrong_answers_built_by_hand_are_named_in_every_variant():
    for variant in VARIANTS:
        task, ref = grading.task("12.4.6", variant), ref_of("12.4.6", variant)
        rows = _rows_12_4_6(task)
        seq, n = sum(a - b for m, a, b in rows if m), sum(task["mask"])
        rounded = {"ratios": [round(r, 3) for r in ref["ratios"]], "seq_log_ratio": round(seq, 3)}
        assert grading.evaluate("12.4.6", rounded, variant), variant
        cases = {
            "env_tokens_included": [{**ref, "seq_log_ratio": sum(a - b for _, a, b in rows)},
                                    {**ref, "ratios": [math.exp(a - b) for _, a, b in rows]}],
            "ratio_inverted": [{**ref, "ratios": [math.exp(b - a) for m, a, b in rows if m]}],
            "mean_not_sum": [{**ref, "seq_log_ratio": seq / n}],
            "w_seq_not_log": [{**ref, "seq_log_ratio": math.exp(seq)}],
        }  # fmt: skip
        for key, answers in cases.items():
            for answer in answers:
                assert _named("12.4.6", answer, variant) == key, (variant, key)


def test_12_4_6_feedback():
    task, ref = grading.task("12.4.6"), ref_of("12.4.6")
    n = sum(task["mask"])
    result = grading.evaluate("12.4.6", {**ref, "ratios": ref["ratios"][:-1]})
    assert (
        result.status == "wrong"
        and f"Нужно {fmt.count(n, 'число', 'числа', 'чисел')}" in result.message
    )
    result = grading.evaluate("12.4.6", {"ratios": ref["ratios"]})
    assert result.status == "malformed" and "seq_log_ratio" in result.message
    result = grading.evaluate("12.4.6", {**ref, "ratios": [1.0, "x"]})
    assert result.status == "malformed" and "ratios" in result.message


# ---------------------------------------------------------------- 12.4.7
@pytest.mark.parametrize("variant", range(8))
def test_12_4_7_reference_by_hand(variant):
    task, ref = grading.task("12.4.7", variant), ref_of("12.4.7", variant)
    w, a = task["weights"], task["advantages"]
    low, high = 1 - task["eps_low"], 1 + task["eps_high"]
    ess = sum(w) ** 2 / sum(x * x for x in w)
    assert ref["ess"] == pytest.approx(ess, rel=1e-12)
    assert ref["ess_norm"] == pytest.approx(ess / len(w), rel=1e-12)
    binding = [(x > high and s > 0) or (x < low and s < 0) for x, s in zip(w, a)]
    outside = [x > high or x < low for x in w]
    assert ref["clip_fraction"] == pytest.approx(sum(binding) / len(w))
    assert 0 < sum(binding) < sum(outside)  # есть и срабатывание, и выход «не того знака»
    assert ref["max_abs_log_w"] == pytest.approx(max(abs(math.log(x)) for x in w))


def test_12_4_7_wrong_answers_built_by_hand_are_named_in_every_variant():
    for variant in VARIANTS:
        task, ref = grading.task("12.4.7", variant), ref_of("12.4.7", variant)
        w = task["weights"]
        low, high = 1 - task["eps_low"], 1 + task["eps_high"]
        assert grading.evaluate("12.4.7", {k: round(v, 3) for k, v in ref.items()}, variant)
        cases = {
            "clip_ignores_sign": [{**ref, "clip_fraction": sum(x > high or x < low for x in w) / len(w)}],
            "ess_mean_weight": [{**ref, "ess": len(w), "ess_norm": 1.0}, {**ref, "ess": sum(w) / len(w)},
                                {**ref, "ess": sum(w)}],
            "ess_not_normalized": [{**ref, "ess_norm": sum(w) ** 2 / sum(x * x for x in w)}],
            "mean_abs_not_max": [{**ref, "max_abs_log_w": sum(abs(math.log(x)) for x in w) / len(w)}],
        }  # fmt: skip
        for key, answers in cases.items():
            for answer in answers:
                assert _named("12.4.7", answer, variant) == key, (variant, key)


def test_12_4_7_asymmetric_band_and_feedback():
    assert {grading.task("12.4.7", v)["eps_high"] for v in range(8)} == {0.2, 0.28}
    ref = ref_of("12.4.7")
    result = grading.evaluate("12.4.7", {**ref, "clip_fraction": 100 * ref["clip_fraction"]})
    assert result.status == "malformed" and "похоже на проценты" in result.message
    result = grading.evaluate("12.4.7", {**ref, "ess": -1.0})
    assert result.status == "malformed" and "неотрицательна" in result.message
    result = grading.evaluate("12.4.7", {**ref, "max_abs_log_w": ref["max_abs_log_w"] * 1.2})
    assert result.status == "wrong" and "max_abs_log_w" in result.message


# ---------------------------------------------------------------- 12.4.8
def _nucleus_by_hand(task, temperature):
    """log μ(y) и log softmax(z/T)_y без torch: z/T, ядро top-p, перенормировка."""
    z = [x / temperature for x in task["logits"]]
    probs = [math.exp(x - max(z)) for x in z]
    probs = [q / sum(probs) for q in probs]
    kept, mass = set(), 0.0
    for i in sorted(range(len(z)), key=lambda i: -probs[i]):
        kept.add(i)
        mass += probs[i]
        if mass >= task["top_p"]:
            break
    y = task["token_index"]
    assert y in kept and len(kept) < len(z)
    return math.log(probs[y] / mass), math.log(probs[y])


def _diagnosis_by_hand(task):
    """Доля |log w|, которая остаётся на пробе с нулевой задержкой: ≥ 1/2 — TIM."""
    out = {}
    for name, rows in task["logs"].items():
        train = [r["mean_abs_log_w"] for r in rows if r["behavior_version"] < r["trainer_version"]]
        probe = [r["mean_abs_log_w"] for r in rows if r["behavior_version"] == r["trainer_version"]]
        assert len(train) == 3 and len(probe) == 1 and rows[-1]["kind"] == "probe_lag0"
        out[name] = "tim" if probe[0] / (sum(train) / len(train)) >= 0.5 else "lag"
    return out


@pytest.mark.parametrize("variant", range(8))
def test_12_4_8_reference_by_hand(variant):
    task, ref = grading.task("12.4.8", variant), ref_of("12.4.8", variant)
    behaviour, raw = _nucleus_by_hand(task, task["temperature"])
    assert ref["behavior_logprob"] == pytest.approx(behaviour, abs=1e-5)
    assert abs(raw - behaviour) > 0.02
    assert ref["diagnosis"] == _diagnosis_by_hand(task)
    assert task["temperature"] != 1 and f"T = {task['temperature']}" in task["statement"]


def test_12_4_8_zero_lag_probe_decides_and_versions_do_not():
    """В каждом журнале v < u во всех строках обучения, а диагнозы бывают обоими."""
    for variant in VARIANTS:
        task, ref = grading.task("12.4.8", variant), ref_of("12.4.8", variant)
        assert set(ref["diagnosis"].values()) == {"lag", "tim"}, variant
        for name, rows in task["logs"].items():
            assert all(r["behavior_version"] < r["trainer_version"] for r in rows[:-1])
            share = lag_or_mismatch.share_at_zero_lag(rows)
            assert share <= 0.2 or share >= 0.75, (variant, name, share)  # диагноз не на границе


def test_12_4_8_wrong_answers_built_by_hand_are_named_in_every_variant():
    for variant in VARIANTS:
        task, ref = grading.task("12.4.8", variant), ref_of("12.4.8", variant)
        _, raw = _nucleus_by_hand(task, task["temperature"])
        no_temp, no_temp_raw = _nucleus_by_hand(task, 1.0)
        by_versions = {name: "lag" if any(r["behavior_version"] < r["trainer_version"] for r in rows)
                       else "tim" for name, rows in task["logs"].items()}  # fmt: skip
        probe_nonzero = {name: "tim" if rows[-1]["mean_abs_log_w"] > 0 else "lag"
                         for name, rows in task["logs"].items()}  # fmt: skip
        cases = {
            "raw_softmax_under_top_p": [{**ref, "behavior_logprob": raw}],
            "no_temperature": [{**ref, "behavior_logprob": no_temp}, {**ref, "behavior_logprob": no_temp_raw}],
            "staleness_everywhere": [{**ref, "diagnosis": by_versions}],
            "probe_nonzero_is_tim": [{**ref, "diagnosis": probe_nonzero}],
        }  # fmt: skip
        for key, answers in cases.items():
            for answer in answers:
                assert _named("12.4.8", answer, variant) == key, (variant, key)


def test_12_4_8_agrees_with_offpolicy_and_feedback():
    import numpy as np

    from course_utils import offpolicy

    task, ref = grading.task("12.4.8"), ref_of("12.4.8")
    z, y = np.array(task["logits"]), task["token_index"]
    lp = offpolicy.behavior_logprob(z, y, task["temperature"], task["top_p"])
    assert ref["behavior_logprob"] == pytest.approx(float(lp), abs=1e-6)
    loose = {"Diagnosis": {k.lower(): v.upper() for k, v in ref["diagnosis"].items()},
             "behavior_logprob": round(ref["behavior_logprob"], 3)}  # fmt: skip
    assert grading.evaluate("12.4.8", loose)
    result = grading.evaluate("12.4.8", {**ref, "diagnosis": {**ref["diagnosis"], "A": "задержка"}})
    assert result.status == "malformed" and "«lag»" in result.message
    result = grading.evaluate("12.4.8", {**ref, "diagnosis": {"A": "lag", "B": "tim"}})
    assert result.status == "malformed" and "C" in result.message
    result = grading.evaluate("12.4.8", {**ref, "behavior_logprob": 0.5})
    assert result.status == "malformed" and "≤ 0" in result.message
    raw = offpolicy.raw_logprob(z, y, task["temperature"])
    all_lag = {k: "lag" for k in ref["diagnosis"]}
    result = grading.evaluate("12.4.8", {"diagnosis": all_lag, "behavior_logprob": float(raw)})
    assert result.misconception == "raw_softmax_under_top_p"  # первая по списку


# ---------------------------------------------------------------- 12.4.9
@pytest.mark.parametrize("variant", range(50))
def test_12_4_9_codes_match_injected_violations(variant):
    plan = sync_audit.plan(variant)
    task, ref = grading.task("12.4.9", variant), ref_of("12.4.9", variant)
    assert set(ref) == sync_audit.expected_codes(plan)
    assert len(ref) == len(set(ref)) and set(ref) <= set(weight_audit.AUDIT_RULES)
    assert task["rules"] == weight_audit.AUDIT_RULES
    replicas = {e["replica"] for e in task["events"]} - {"publisher"}
    assert 2 <= len(replicas) <= 3
    assert 1 <= len({e["version"] for e in task["events"] if e["event"] == "barrier"}) <= 2
    assert "checksum_mismatch" in ref and set(ref) & sync_audit.BARRIER_CODES  # ловушки держатся


def test_12_4_9_variety_and_decoy():
    refs = [ref_of("12.4.9", v) for v in range(50)]
    assert len({code for ref in refs for code in ref}) >= 8
    assert len({tuple(ref) for ref in refs}) >= 10
    assert grading.evaluate("12.4.9", [], 0).status == "wrong"
    events = [e for v in range(50) for e in grading.task("12.4.9", v)["events"]]
    assert any(e["event"] == "abort" for e in events)  # ловушка: отмена — это норма


def test_12_4_9_wrong_answers_built_by_hand_are_named_in_every_variant():
    for variant in VARIANTS:
        task = grading.task("12.4.9", variant)
        codes = {m[1 : m.index("]")] for m in weight_audit.audit_log(task["events"])}
        blind = [{**e, "checksum": None, "expected_checksum": None} for e in task["events"]]
        no_sums = {m[1 : m.index("]")] for m in weight_audit.audit_log(blind)}  # суммы не сверены
        no_barrier = codes - {"serve_before_barrier", "commit_before_barrier", "barrier_not_ready"}
        cases = {"everything_wrong": sorted(task["rules"]), "commit_is_enough": sorted(no_barrier),
                 "checksum_ignored": sorted(no_sums)}  # fmt: skip
        for key, answer in cases.items():
            assert _named("12.4.9", answer, variant) == key, (variant, key)


def test_12_4_9_answer_forms_and_feedback():
    ref = ref_of("12.4.9")
    assert grading.evaluate("12.4.9", list(reversed(ref)))
    assert grading.evaluate("12.4.9", set(ref))
    assert grading.evaluate("12.4.9", [f"[{c.upper()}]" for c in ref] + ref[:1])
    result = grading.evaluate("12.4.9", [*ref, "torn-read"])
    assert result.status == "malformed" and "torn-read" in result.message
    assert all(
        code in result.message for code in weight_audit.AUDIT_RULES
    )  # допустимые коды названы
    result = grading.evaluate("12.4.9", {c: True for c in ref})
    assert result.status == "malformed"
    result = grading.evaluate("12.4.9", ref[:1])
    assert (
        result.status == "wrong"
        and f"Не хватает кодов нарушений: {len(ref) - 1}," in result.message
    )
    text = grading._get("12.4.9").solution(grading.task("12.4.9"))
    assert all(f"[{code}]" in text for code in ref)
