"""Отдельные проверки шагов урока 12.5: 12.5.6–12.5.9; общие свойства — в test_exercises.py.

Типичные ошибки здесь собираются вручную из данных условия (не через ловушки шага) и должны
узнаваться своим ключом в каждом варианте 0–49.
"""

import math

import numpy as np
import pytest
from exercise_helpers import _ex

from course_utils import checkpoint, grading

ALL = range(50)
COMPS = list(checkpoint.COMPONENTS)


def _key(exercise_id, answer, variant):
    result = grading.evaluate(exercise_id, answer, variant)
    return result.misconception if result.status == "misconception" else result.status


def test_lesson_12_5_registered():
    from course_utils import exercises

    assert "lesson_12_5" in exercises.LOADED
    assert {"12.5.6", "12.5.7", "12.5.8", "12.5.9"} <= set(grading.exercise_ids())


def _by_hand_12_5_6(task):
    """(нет в манифесте, нужные из них, условных компонентов у запуска нет) — без кода шага."""
    run = task["run"]
    has = {"queue": run["asynchronous"], "curriculum": run["curriculum"],
           "normalizer": run["running_reward_norm"]}  # fmt: skip
    have = {e["component"] for e in task["manifest"]}
    absent = [c for c in COMPS if c not in have]
    return (
        absent,
        [c for c in absent if has.get(c, True)],
        [c for c in absent if not has.get(c, True)],
    )


@pytest.mark.parametrize("variant", ALL)
def test_12_5_6_manifest_and_reference_by_hand(variant):
    task, ref = grading.task("12.5.6", variant), grading._reference("12.5.6", variant)
    have = [e["component"] for e in task["manifest"]]
    assert len(set(have)) == len(have) and set(have) <= set(COMPS)
    assert {"policy", "optimizer"} <= set(have) and task["components"] == COMPS
    assert all(e["file"] in task["statement"] and e["bytes"] > 0 for e in task["manifest"])
    assert all(e["file"].startswith(e["component"] + ".") for e in task["manifest"])
    absent, needed, na = _by_hand_12_5_6(task)
    assert dict(ref) == {"missing": needed, "can_resume": False}
    assert task["run"]["asynchronous"] and "queue" in needed and na  # каждая ловушка различима
    assert set(needed) & {"rng", "data_cursor"} and 2 <= len(needed) <= 5
    params = {e["component"]: e["bytes"] for e in task["manifest"]}
    n = task["run"]["num_params"]
    assert abs((params["policy"] + params["optimizer"]) / (14 * n) - 1) < 1e-4  # 2 + 12 Б/параметр


@pytest.mark.parametrize("variant", ALL)
def test_12_5_6_wrong_answers_built_by_hand_named_in_every_variant(variant):
    task = grading.task("12.5.6", variant)
    absent, needed, na = _by_hand_12_5_6(task)

    def key(missing, can=False):
        return _key("12.5.6", {"missing": missing, "can_resume": can}, variant)

    assert key(needed) == "correct"
    assert key(needed, True) == "list_right_verdict_wrong"
    assert key(list(reversed(needed)), True) == "list_right_verdict_wrong"
    assert key([], True) == key([]) == "weights_only_resume"
    assert key([c for c in needed if c not in ("rng", "data_cursor")]) == "rng_not_needed"
    for lost in {"rng", "data_cursor"} & set(needed):  # без одного из двух — та же ошибка
        assert key([c for c in needed if c != lost]) == "rng_not_needed"
    assert key([c for c in needed if c != "queue"]) == "queue_irrelevant"
    assert key(absent) == key([*needed, na[0]]) == "not_applicable_listed"
    have = sorted({e["component"] for e in task["manifest"]})
    assert key([*needed, have[variant % len(have)]]) == "present_listed"


def test_12_5_6_right_list_with_wrong_verdict_has_its_own_feedback():
    ref = grading._reference("12.5.6")
    result = grading.evaluate("12.5.6", {"missing": ref["missing"], "can_resume": True})
    assert result.misconception == "list_right_verdict_wrong"
    assert "верный" in result.message and "can_resume" in result.message
    assert "только весов" not in result.message and "False" not in result.message
    weights = grading.evaluate("12.5.6", {"missing": [], "can_resume": True})
    assert weights.misconception == "weights_only_resume" and weights.message != result.message


def test_12_5_6_answer_forms_and_mismatch_feedback():
    ref = grading._reference("12.5.6")
    loose = {"Missing": [f" `{c.upper()}` " for c in reversed(ref["missing"])], "can_resume": False}
    assert grading.evaluate("12.5.6", loose)
    assert grading.evaluate("12.5.6", {"missing": set(ref["missing"]), "can_resume": False})
    result = grading.evaluate("12.5.6", {"missing": ["веса"], "can_resume": False})
    assert result.status == "malformed" and "data_cursor" in result.message
    assert "rng_states" not in result.message  # один словарь: checkpoint.COMPONENTS
    assert grading.evaluate("12.5.6", ref["missing"]).status == "malformed"
    result = grading.evaluate("12.5.6", {"missing": ref["missing"], "can_resume": "нет"})
    assert result.status == "malformed" and "can_resume" in result.message
    result = grading.evaluate("12.5.6", {**ref, "missing": [*ref["missing"], "policy"]})
    assert result.misconception == "present_listed" and "policy" not in result.message
    rng = [c for c in ("rng", "data_cursor") if c in ref["missing"]]
    partial = [rng[0], "queue"] if len(ref["missing"]) > 2 else ["queue"]  # не одна из ловушек
    result = grading.evaluate("12.5.6", {**ref, "missing": partial})
    assert result.status == "wrong" and "missing" in result.message, result
    assert (
        f"Не хватает компонентов: {len(ref['missing']) - len(partial)}, лишних: 0" in result.message
    )
    assert not any(c in result.message for c in set(ref["missing"]) - set(partial))
    both = grading.evaluate("12.5.6", {"missing": partial, "can_resume": True})
    assert both.misconception == "weights_only_resume"


@pytest.mark.parametrize("variant", ALL)
def test_12_5_7_wrong_answers_built_by_hand_named_in_every_variant(variant):
    task, ref = grading.task("12.5.7", variant), grading._reference("12.5.7", variant)
    c, m_h, i = task["write_s"], task["mtbf_h"], task["interval_min"] * 60
    m, star = m_h * 3600, math.sqrt(2 * task["write_s"] * task["mtbf_h"] * 3600)
    assert (
        _key("12.5.7", {**ref, "I_star_min": math.sqrt(2 * c * m_h) / 60}, variant) == "units_mixed"
    )
    assert (
        _key("12.5.7", {**ref, "I_star_min": star}, variant) == "units_mixed"
    )  # секунды за минуты
    assert _key("12.5.7", {**ref, "H_current": c / i + i / (2 * m_h)}, variant) == "units_mixed"
    assert _key("12.5.7", {**ref, "I_star_min": math.sqrt(c * m) / 60}, variant) == "sqrt_cm_no_two"
    one = {**ref, "H_current": c / i, "H_star": c / star}
    assert _key("12.5.7", one, variant) == "overhead_one_term"
    assert _key("12.5.7", {**ref, "H_current": c / i}, variant) == "overhead_one_term"


@pytest.mark.parametrize("variant", range(9))
def test_12_5_7_reference_by_hand(variant):
    task, ref = grading.task("12.5.7", variant), grading._reference("12.5.7", variant)
    c, m, i = task["write_s"], task["mtbf_h"] * 3600, task["interval_min"] * 60
    star = math.sqrt(2 * c * m)
    assert ref["I_star_min"] == pytest.approx(star / 60, rel=1e-12)
    assert ref["H_current"] == pytest.approx(c / i + i / (2 * m), rel=1e-12)
    assert ref["H_star"] == pytest.approx(math.sqrt(2 * c / m), rel=1e-12)
    assert ref["H_star"] <= ref["H_current"]
    ratio = i / star
    assert abs(ratio - 1) <= 0.07 or abs(ratio - 1) >= 0.25  # далеко от границы «так же»
    expected = "так же" if abs(ratio - 1) <= 0.1 else "чаще" if ratio > 1 else "реже"
    assert ref["recommend"] == expected
    assert 8 * c <= star <= m / 6  # режим приближения C ≪ I* ≪ M
    for text in (f"C = {c} с", f"M = {task['mtbf_h']} ч", f"I = {task['interval_min']} мин",
                 "1 %", "в минутах"):  # fmt: skip
        assert text in task["statement"]


def test_12_5_7_recommendations_and_forms():
    refs = [grading._reference("12.5.7", v) for v in range(3)]
    assert {r["recommend"] for r in refs} == {"чаще", "реже", "так же"}
    same = next(v for v, r in enumerate(refs) if r["recommend"] == "так же")
    for spelling in ("Так же", "также", " так  же. "):
        assert grading.evaluate("12.5.7", {**refs[same], "recommend": spelling}, same)
    ref = refs[0]
    rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in ref.items()}
    assert grading.evaluate("12.5.7", rounded)
    result = grading.evaluate("12.5.7", {**ref, "H_current": 100 * ref["H_current"]})
    assert result.status == "wrong" and "проценты" in result.message
    result = grading.evaluate("12.5.7", {**ref, "recommend": "никогда"})
    assert result.status == "malformed" and "«чаще»" in result.message
    task = grading.task("12.5.7")
    result = grading.evaluate("12.5.7", {**ref, "I_star_min": 60 * ref["I_star_min"]})
    assert result.misconception == "units_mixed"  # I* в секундах, выданное за минуты
    hours_as_s = math.sqrt(2 * task["write_s"] * task["mtbf_h"]) / 60
    assert (
        grading.evaluate("12.5.7", {**ref, "I_star_min": hours_as_s}).misconception == "units_mixed"
    )
    i = task["interval_min"] * 60
    one = {**ref, "H_current": task["write_s"] / i}
    assert grading.evaluate("12.5.7", one).misconception == "overhead_one_term"
    no_two = math.sqrt(task["write_s"] * task["mtbf_h"] * 3600) / 60
    assert (
        grading.evaluate("12.5.7", {**ref, "I_star_min": no_two}).misconception == "sqrt_cm_no_two"
    )


@pytest.mark.parametrize("variant", range(8))
def test_12_5_8_tables_consistent_and_reference_by_hand(variant):
    from course_utils import tracing
    from course_utils.exercises.lesson_12_5 import trace_links

    task, ref = grading.task("12.5.8", variant), grading._reference("12.5.8", variant)
    assert tracing.check_chain(trace_links.trace_tables(task)) == []
    rollouts = task["rollouts"]
    assert ref["orphans"] == [r["rollout_id"] for r in rollouts if r["training_batch_id"] is None]
    batch = {b["training_batch_id"]: b for b in task["batches"]}
    expected = {s["optimizer_step"]: s["expected_verifier_version"] for s in task["steps"]}
    used = [r for r in rollouts if r["training_batch_id"] is not None]
    by_hand = [r["rollout_id"] for r in used
               if r["verifier_version"] != expected[batch[r["training_batch_id"]]["optimizer_step"]]]  # fmt: skip
    assert ref["verifier_mismatches"] == by_hand
    assert len(set(expected.values())) == 2  # верификатор обновили посреди прогона
    lags = [batch[r["training_batch_id"]]["trainer_policy_version"] - r["behavior_policy_version"]
            for r in used]  # fmt: skip
    assert min(lags) == 0 and 1 <= max(lags) <= task["max_lag"]
    dropped = [r for r in rollouts if r["dropped"]]
    assert dropped and all(r["training_batch_id"] is None for r in dropped)
    assert any(not r["dropped"] for r in rollouts if r["training_batch_id"] is None)
    assert all(r["enqueue_time"] is None or r["enqueue_time"] >= 0 for r in rollouts)
    if variant < 4:
        assert ref["verifier_mismatches"]


def test_12_5_8_solution_code_reproduces_answer():
    task, ref = grading.task("12.5.8"), grading._reference("12.5.8")
    text = _ex("12.5.8").solution(task)
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {"task_12_5_8": task}
    exec(code, scope)
    assert list(scope["orphans"]) == ref["orphans"]
    assert list(scope["bad"]) == ref["verifier_mismatches"]


@pytest.mark.parametrize("variant", ALL)
def test_12_5_8_forms_and_wrong_answers_built_by_hand(variant):
    task, ref = grading.task("12.5.8", variant), grading._reference("12.5.8", variant)
    flipped = {"Orphans": set(ref["orphans"]),
               "verifier_mismatches": [x.upper() for x in reversed(ref["verifier_mismatches"])]}  # fmt: skip
    assert grading.evaluate("12.5.8", flipped, variant)
    result = grading.evaluate("12.5.8", {**ref, "orphans": [283]}, variant)
    assert result.status == "malformed" and "rollout_id" in result.message
    result = grading.evaluate("12.5.8", {**ref, "orphans": ["r99999"]}, variant)
    assert result.status == "malformed" and "r99999" in result.message
    dropped = {r["rollout_id"] for r in task["rollouts"] if r["dropped"]}
    kept = [x for x in ref["orphans"] if x not in dropped]
    result = grading.evaluate("12.5.8", {**ref, "orphans": kept}, variant)
    assert result.misconception == "dropped_not_orphans"
    trainer = {b["training_batch_id"]: b["trainer_policy_version"] for b in task["batches"]}
    stale = [r["rollout_id"] for r in task["rollouts"] if r["training_batch_id"] is not None
             and r["behavior_policy_version"] != trainer[r["training_batch_id"]]]  # fmt: skip
    result = grading.evaluate("12.5.8", {**ref, "verifier_mismatches": stale}, variant)
    assert result.misconception == "mismatch_all_versions"
    last = task["steps"][-1]["expected_verifier_version"]
    latest = [r["rollout_id"] for r in task["rollouts"] if r["verifier_version"] != last]
    result = grading.evaluate("12.5.8", {**ref, "verifier_mismatches": latest}, variant)
    assert result.misconception == "latest_verifier_everywhere"
    result = grading.evaluate("12.5.8", {**ref, "orphans": ref["orphans"][1:]}, variant)
    if result.status == "wrong":  # без первого сироты — не та же ошибка, что «отброшенные»
        assert (
            "orphans" in result.message
            and "Не хватает идентификаторов rollout_id: 1" in result.message
        )
        assert ref["orphans"][0] not in result.message


@pytest.mark.parametrize("variant", range(8))
def test_12_5_9_reference_by_hand(variant):
    task, ref = grading.task("12.5.9", variant), grading._reference("12.5.9", variant)
    groups = task["groups"]
    durations = [d for g in groups for d in g["durations_s"]]
    pooled = np.percentile(durations, [50, 95, 99]).tolist()
    assert [ref["p50"], ref["p95"], ref["p99"]] == pytest.approx(pooled, rel=1e-12)
    degenerate = [len(set(g["rewards"])) == 1 for g in groups]
    share = sum(degenerate) / len(groups)
    assert ref["degenerate_share"] == pytest.approx(share, rel=1e-12)
    rate = len(groups) / task["wall_s"] * (1 - share)
    assert ref["informative_groups_per_s"] == pytest.approx(rate, rel=1e-12)
    assert any(set(g["rewards"]) == {0} for g in groups)
    assert any(set(g["rewards"]) == {1} for g in groups)  # ловушка «все верны — не вырождена»
    assert all(len(g["durations_s"]) == len(g["rewards"]) == task["group_size"] for g in groups)
    assert 3 <= len({g["collector"] for g in groups}) <= 4
    assert "numpy.percentile" in task["statement"] and "1 %" in task["statement"]
    assert "task_12_5_9['groups']" in task["statement"]


@pytest.mark.parametrize("variant", ALL)
def test_12_5_9_forms_and_wrong_answers_built_by_hand(variant):
    task, ref = grading.task("12.5.9", variant), grading._reference("12.5.9", variant)
    assert grading.evaluate("12.5.9", {k: float(f"{v:.4g}") for k, v in ref.items()}, variant)
    result = grading.evaluate("12.5.9", {**ref, "degenerate_share": 100 * ref["degenerate_share"]}, variant)  # fmt: skip
    assert result.status == "malformed" and "проценты" in result.message
    per = {}
    for g in task["groups"]:
        per.setdefault(g["collector"], []).extend(g["durations_s"])
    for q in (95, 99):
        avg = float(np.mean([np.percentile(x, q) for x in per.values()]))
        assert _key("12.5.9", {**ref, f"p{q}": avg}, variant) == "average_of_percentiles"
    rate = len(task["groups"]) / task["wall_s"]
    assert (
        _key("12.5.9", {**ref, "informative_groups_per_s": rate}, variant)
        == "groups_not_informative"
    )
    mean = float(np.mean([d for x in per.values() for d in x]))
    assert grading.evaluate("12.5.9", {**ref, "p50": mean}, variant).misconception == "mean_as_p50"
    zeros = sum(set(g["rewards"]) == {0} for g in task["groups"]) / len(task["groups"])
    result = grading.evaluate("12.5.9", {**ref, "degenerate_share": zeros}, variant)
    assert result.misconception == "all_correct_not_degenerate"
    both = {**ref, "degenerate_share": zeros, "informative_groups_per_s": rate * (1 - zeros)}
    assert _key("12.5.9", both, variant) == "all_correct_not_degenerate"
    result = grading.evaluate("12.5.9", {**ref, "p99": ref["p99"] * 1.2}, variant)
    assert result.status == "wrong" and "p99" in result.message and "p95" not in result.message
    assert "на 20 %" in result.message and "ГиБ" not in result.message  # единицы шага, не байты
