"""Отдельные проверки шагов урока 12.4 (12.4.6–12.4.9); общие свойства — в test_exercises.py."""

import math
import re
from pathlib import Path

import pytest

from course_utils import grading

REPO = Path(__file__).resolve().parents[1]
IDS = grading.exercise_ids()
VARIANTS = range(4)
# Упражнения, чьи условия по делу содержат не-JSON объекты (таблицы pandas и т. п.); пока нет.
NOT_JSON: set[str] = set()
CYRILLIC = re.compile(r"[а-яё]", re.IGNORECASE)


@pytest.fixture(autouse=True)
def progress_path(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(path))
    return path


def _ex(exercise_id):
    return grading._get(exercise_id)


def _data(task):
    """Данные условия без текста формулировки."""
    return {k: v for k, v in task.items() if k != "statement"}


def _leaves(x):
    if isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _leaves(v)
    elif isinstance(x, (list, tuple, set)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _renderings(x):
    if isinstance(x, bool) or x is None:
        return set()
    if isinstance(x, str):
        return {x} if len(x.strip()) >= 3 else set()
    if isinstance(x, (int, float)) and math.isfinite(x):
        out = {str(x), f"{x:g}", f"{x:.2f}", f"{x:.3g}", f"{x:.1f}"}
        return {s for s in out if len(s) >= 2}
    return set()


# ---------------------------------------------------------------- 12.4.6–12.4.9: данные другой политики (урок 12.4)
def test_lesson_12_4_registered():
    from course_utils import exercises

    assert "lesson_12_4" in exercises.LOADED
    assert {"12.4.6", "12.4.7", "12.4.8", "12.4.9"} <= set(IDS)


@pytest.mark.parametrize("variant", range(8))
def test_12_4_6_reference_by_hand(variant):
    task, ref = grading.task("12.4.6", variant), grading.reference("12.4.6", variant)
    rows = list(zip(task["mask"], task["logp_target"], task["logp_behavior"]))
    assert 0 in task["mask"] and 1 in task["mask"]  # многоходовой ответ с токенами среды
    by_hand = [math.exp(a - b) for m, a, b in rows if m == 1]
    assert ref["ratios"] == pytest.approx(by_hand, rel=1e-12)
    assert ref["seq_log_ratio"] == pytest.approx(sum(a - b for m, a, b in rows if m), abs=1e-12)
    assert "1 %" in task["statement"] and "0.002" in task["statement"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_4_6_rounding_and_misconceptions_in_other_forms(variant):
    task, ref = grading.task("12.4.6", variant), grading.reference("12.4.6", variant)
    rounded = {"ratios": [round(r, 3) for r in ref["ratios"]],
               "seq_log_ratio": round(ref["seq_log_ratio"], 3)}  # fmt: skip
    assert grading.evaluate("12.4.6", rounded, variant)
    rows = list(zip(task["mask"], task["logp_target"], task["logp_behavior"]))
    unmasked = sum(a - b for _, a, b in rows)
    result = grading.evaluate("12.4.6", {**ref, "seq_log_ratio": unmasked}, variant)
    assert result.misconception == "env_tokens_included"
    all_ratios = [math.exp(a - b) for _, a, b in rows]
    result = grading.evaluate("12.4.6", {**ref, "ratios": all_ratios}, variant)
    assert result.misconception == "env_tokens_included"
    result = grading.evaluate("12.4.6", {**ref, "ratios": [1 / r for r in ref["ratios"]]}, variant)
    assert result.misconception == "ratio_inverted"
    n = sum(task["mask"])
    result = grading.evaluate("12.4.6", {**ref, "seq_log_ratio": ref["seq_log_ratio"] / n}, variant)
    assert result.misconception == "mean_not_sum"
    result = grading.evaluate("12.4.6", {**ref, "ratios": ref["ratios"][:-1]}, variant)
    assert result.status == "wrong" and f"Нужно {n} чисел" in result.message
    result = grading.evaluate("12.4.6", {"ratios": ref["ratios"]}, variant)
    assert result.status == "malformed" and "seq_log_ratio" in result.message


@pytest.mark.parametrize("variant", range(8))
def test_12_4_7_reference_by_hand(variant):
    task, ref = grading.task("12.4.7", variant), grading.reference("12.4.7", variant)
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


def test_12_4_7_asymmetric_band_and_feedback():
    assert {grading.task("12.4.7", v)["eps_high"] for v in range(8)} == {0.2, 0.28}
    ref = grading.reference("12.4.7")
    result = grading.evaluate("12.4.7", {**ref, "clip_fraction": 100 * ref["clip_fraction"]})
    assert result.status == "malformed" and "не проценты" in result.message
    result = grading.evaluate("12.4.7", {**ref, "max_abs_log_w": ref["max_abs_log_w"] * 1.2})
    assert result.status == "wrong" and "max_abs_log_w" in result.message
    assert grading.evaluate("12.4.7", {k: round(v, 3) for k, v in ref.items()})


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_4_7_misconceptions_in_other_forms(variant):
    task, ref = grading.task("12.4.7", variant), grading.reference("12.4.7", variant)
    w = task["weights"]
    result = grading.evaluate("12.4.7", {**ref, "ess": sum(w) / len(w)}, variant)
    assert result.misconception == "ess_mean_weight"
    result = grading.evaluate("12.4.7", {**ref, "ess_norm": ref["ess"]}, variant)
    assert result.misconception == "ess_not_normalized"


def _behaviour_by_hand(task):
    """log μ(y) без torch: z/T, ядро top-p (как policy.sampling_logprobs), перенормировка."""
    z = [x / task["temperature"] for x in task["logits"]]
    top = max(z)
    probs = [math.exp(x - top) for x in z]
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


@pytest.mark.parametrize("variant", range(8))
def test_12_4_8_reference_by_hand(variant):
    task, ref = grading.task("12.4.8", variant), grading.reference("12.4.8", variant)
    behaviour, raw = _behaviour_by_hand(task)
    assert ref["behavior_logprob"] == pytest.approx(behaviour, abs=1e-5)
    assert abs(raw - behaviour) > 0.02
    for name, rows in task["logs"].items():
        same = all(r["behavior_version"] == r["trainer_version"] for r in rows)
        assert ref["diagnosis"][name] == ("tim" if same else "lag")
        assert all(r["behavior_version"] <= r["trainer_version"] for r in rows)
    assert "tim" in ref["diagnosis"].values()  # иначе «всё — задержка» совпало бы с верным
    assert task["temperature"] != 1 and f"T = {task['temperature']}" in task["statement"]


def test_12_4_8_agrees_with_offpolicy_and_feedback():
    import numpy as np

    from course_utils import offpolicy

    task, ref = grading.task("12.4.8"), grading.reference("12.4.8")
    z, y = np.array(task["logits"]), task["token_index"]
    lp = offpolicy.behavior_logprob(z, y, task["temperature"], task["top_p"])
    assert ref["behavior_logprob"] == pytest.approx(float(lp), abs=1e-6)
    loose = {"Diagnosis": {k.lower(): v.upper() for k, v in ref["diagnosis"].items()},
             "behavior_logprob": round(ref["behavior_logprob"], 3)}  # fmt: skip
    assert grading.evaluate("12.4.8", loose)
    result = grading.evaluate("12.4.8", {**ref, "diagnosis": {"A": "задержка", "B": "tim"}})
    assert result.status == "malformed" and "«lag»" in result.message
    result = grading.evaluate("12.4.8", {**ref, "behavior_logprob": 0.5})
    assert result.status == "malformed" and "≤ 0" in result.message
    raw = offpolicy.raw_logprob(z, y, task["temperature"])
    all_lag = {k: "lag" for k in ref["diagnosis"]}
    result = grading.evaluate("12.4.8", {"diagnosis": all_lag, "behavior_logprob": float(raw)})
    assert result.misconception == "raw_softmax_under_top_p"  # первая по списку
    result = grading.evaluate("12.4.8", {**ref, "diagnosis": all_lag})
    assert result.misconception == "staleness_everywhere"


@pytest.mark.parametrize("variant", range(40))
def test_12_4_9_codes_match_injected_violations(variant):
    from course_utils import weight_sync
    from course_utils.exercises.lesson_12_4 import sync_audit

    plan = sync_audit.plan(variant)
    task, ref = grading.task("12.4.9", variant), grading.reference("12.4.9", variant)
    assert set(ref) == sync_audit.expected_codes(plan)
    assert len(ref) == len(set(ref)) and set(ref) <= set(weight_sync.AUDIT_RULES)
    assert task["rules"] == weight_sync.AUDIT_RULES
    replicas = {e["replica"] for e in task["events"]} - {"publisher"}
    assert 2 <= len(replicas) <= 3
    versions = {e["version"] for e in task["events"] if e["event"] == "barrier"}
    assert 1 <= len(versions) <= 2
    if variant < 4:  # на первых вариантах узнаются все типичные ошибки
        assert "checksum_mismatch" in ref and set(ref) & sync_audit.BARRIER_CODES


def test_12_4_9_variety_clean_logs_and_traps():
    refs = [grading.reference("12.4.9", v) for v in range(40)]
    assert [] in refs, "нужен хотя бы один чистый журнал"
    clean = refs.index([])
    assert grading.evaluate("12.4.9", [], clean)
    assert grading.evaluate("12.4.9", ["inplace_update"], clean).status == "wrong"
    found = {code for ref in refs for code in ref}
    assert len(found) >= 7
    events = [e for v in range(40) for e in grading.task("12.4.9", v)["events"]]
    assert any(e["event"] == "abort" for e in events)  # ловушка: отмена — это норма


def test_12_4_9_answer_forms_and_feedback():
    ref = grading.reference("12.4.9")
    assert grading.evaluate("12.4.9", list(reversed(ref)))
    assert grading.evaluate("12.4.9", set(ref))
    assert grading.evaluate("12.4.9", [f"[{c.upper()}]" for c in ref] + ref[:1])
    result = grading.evaluate("12.4.9", [*ref, "torn-read"])
    assert result.status == "malformed" and "AUDIT_RULES" in result.message
    result = grading.evaluate("12.4.9", {c: True for c in ref})
    assert result.status == "malformed"
    result = grading.evaluate("12.4.9", ref[:1])
    assert result.status == "wrong" and f"Нарушенных правил в журнале: {len(ref)}" in result.message
    text = _ex("12.4.9").solution(grading.task("12.4.9"))
    assert all(f"[{code}]" in text for code in ref)
