"""Отдельные проверки шагов урока 12.5: 12.5.6–12.5.9; общие свойства — в test_exercises.py."""

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


# ---------------------------------------------------------------- 12.5.6–12.5.9: восстановление и наблюдаемость (урок 12.5)
def test_lesson_12_5_registered():
    from course_utils import exercises

    assert "lesson_12_5" in exercises.LOADED
    assert {"12.5.6", "12.5.7", "12.5.8", "12.5.9"} <= set(IDS)


def _conditional_12_5_6(run):
    return {"queue_policy": run["asynchronous"], "curriculum": run["curriculum"],
            "reward_normalizer": run["running_reward_norm"]}  # fmt: skip


@pytest.mark.parametrize("variant", range(12))
def test_12_5_6_manifest_and_reference_by_hand(variant):
    from course_utils import guarantees

    task, ref = grading.task("12.5.6", variant), grading.reference("12.5.6", variant)
    comps = guarantees.CHECKPOINT_COMPONENTS
    have = [e["component"] for e in task["manifest"]]
    assert len(set(have)) == len(have) and set(have) <= set(comps)
    assert {"model", "optimizer"} <= set(have)
    assert all(e["file"] in task["statement"] and e["bytes"] > 0 for e in task["manifest"])
    cond = _conditional_12_5_6(task["run"])
    absent = [c for c in comps if c not in have]
    needed = [c for c in absent if cond.get(c, True)]
    assert ref == {"missing": needed, "can_resume": not needed}
    assert len(needed) in (2, 3, 4) or (not needed and len(absent) >= 2)
    # независимая сверка: предполётная проверка гарантий с тем, что у запуска есть
    declared = have + [c for c in comps if not cond.get(c, True)]
    table = guarantees.preflight({"checkpoint_components": declared, "crash_tested": True})
    row = table[table["гарантия"].str.startswith("6.")].iloc[0]
    assert bool(row["выполнена"]) == ref["can_resume"]
    if variant < 4:  # на первых вариантах узнаются все типичные ошибки
        assert task["run"]["asynchronous"] and "queue_policy" in needed
        assert set(needed) & {"rng_states", "data_cursor"}
        assert set(absent) - set(needed), "нужен компонент, которого у запуска нет"


def test_12_5_6_can_resume_variant_and_answer_forms():
    refs = [grading.reference("12.5.6", v) for v in range(40)]
    clean = next(v for v, r in enumerate(refs) if r["can_resume"])
    assert grading.evaluate("12.5.6", {"missing": [], "can_resume": True}, clean)
    assert grading.evaluate("12.5.6", {"missing": ["queue_policy"], "can_resume": False}, clean).status == "wrong"  # fmt: skip
    ref = grading.reference("12.5.6")
    loose = {"Missing": [f" `{c.upper()}` " for c in reversed(ref["missing"])], "can_resume": False}
    assert grading.evaluate("12.5.6", loose)
    assert grading.evaluate("12.5.6", {"missing": set(ref["missing"]), "can_resume": False})
    result = grading.evaluate("12.5.6", {"missing": ["веса"], "can_resume": False})
    assert result.status == "malformed" and "rng_states" in result.message
    assert grading.evaluate("12.5.6", ref["missing"]).status == "malformed"
    result = grading.evaluate("12.5.6", {"missing": ref["missing"], "can_resume": "нет"})
    assert result.status == "malformed" and "can_resume" in result.message
    result = grading.evaluate("12.5.6", {**ref, "missing": [*ref["missing"], "model"]})
    assert result.status == "wrong" and "В манифесте есть model" in result.message
    result = grading.evaluate("12.5.6", {**ref, "missing": ref["missing"][:1]})
    assert result.status == "wrong"
    assert f"Нужных отсутствующих компонентов: {len(ref['missing'])}" in result.message
    assert not any(c in result.message for c in ref["missing"][1:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_6_misconceptions_in_other_forms(variant):
    task, ref = grading.task("12.5.6", variant), grading.reference("12.5.6", variant)
    have = {e["component"] for e in task["manifest"]}
    cond = _conditional_12_5_6(task["run"])
    na = [c for c in cond if not cond[c] and c not in have]

    def verdict(missing, can=False):
        return grading.evaluate("12.5.6", {"missing": missing, "can_resume": can}, variant)

    assert verdict([]).misconception == "weights_only_resume"
    assert verdict(ref["missing"], True).misconception == "weights_only_resume"
    no_rng = [c for c in ref["missing"] if c not in ("rng_states", "data_cursor")]
    assert verdict(no_rng + na).misconception == "rng_not_needed"
    no_queue = [c for c in ref["missing"] if c != "queue_policy"]
    assert verdict(list(reversed(no_queue))).misconception == "queue_irrelevant"
    assert verdict([*ref["missing"], na[0]]).misconception == "not_applicable_listed"


@pytest.mark.parametrize("variant", range(9))
def test_12_5_7_reference_by_hand(variant):
    task, ref = grading.task("12.5.7", variant), grading.reference("12.5.7", variant)
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
    refs = [grading.reference("12.5.7", v) for v in range(3)]
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

    task, ref = grading.task("12.5.8", variant), grading.reference("12.5.8", variant)
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
    task, ref = grading.task("12.5.8"), grading.reference("12.5.8")
    text = _ex("12.5.8").solution(task)
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {"task": task}
    exec(code, scope)
    assert list(scope["orphans"]) == ref["orphans"]
    assert list(scope["bad"]) == ref["verifier_mismatches"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_8_forms_and_misconceptions(variant):
    task, ref = grading.task("12.5.8", variant), grading.reference("12.5.8", variant)
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
        assert "orphans" in result.message and "Не хватает идентификаторов rollout_id: 1" in result.message
        assert ref["orphans"][0] not in result.message


@pytest.mark.parametrize("variant", range(8))
def test_12_5_9_reference_by_hand(variant):
    import numpy as np

    task, ref = grading.task("12.5.9", variant), grading.reference("12.5.9", variant)
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


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_9_forms_and_misconceptions(variant):
    import numpy as np

    task, ref = grading.task("12.5.9", variant), grading.reference("12.5.9", variant)
    assert grading.evaluate("12.5.9", {k: float(f"{v:.4g}") for k, v in ref.items()}, variant)
    result = grading.evaluate("12.5.9", {**ref, "degenerate_share": 100 * ref["degenerate_share"]}, variant)  # fmt: skip
    assert result.status == "malformed" and "проценты" in result.message
    per = {}
    for g in task["groups"]:
        per.setdefault(g["collector"], []).extend(g["durations_s"])
    avg95 = float(np.mean([np.percentile(x, 95) for x in per.values()]))
    result = grading.evaluate("12.5.9", {**ref, "p95": avg95}, variant)
    assert result.misconception == "average_of_percentiles"
    mean = float(np.mean([d for x in per.values() for d in x]))
    assert grading.evaluate("12.5.9", {**ref, "p50": mean}, variant).misconception == "mean_as_p50"
    zeros = sum(set(g["rewards"]) == {0} for g in task["groups"]) / len(task["groups"])
    result = grading.evaluate("12.5.9", {**ref, "degenerate_share": zeros}, variant)
    assert result.misconception == "all_correct_not_degenerate"
    result = grading.evaluate("12.5.9", {**ref, "p99": ref["p99"] * 1.2}, variant)
    assert result.status == "wrong" and "p99" in result.message and "p95" not in result.message
