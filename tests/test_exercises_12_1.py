"""Отдельные проверки шагов урока 12.1 (12.1.6, 12.1.7); общие свойства — в test_exercises.py."""

from functools import partial

import pytest
from exercise_helpers import _ex

from course_utils import contract, grading, profile

VARIANTS = range(4)


# ---------------------------------------------------------------- 12.1.6: контракт роллаута
def _traps(task):
    multiturn = [r["sample_id"] for r in task["records"]
                 if 0 in r["policy_mask"][len(r["prompt_tokens"]):]
                 and not contract.violated_rules(r)]  # fmt: skip
    per_token = [r["sample_id"] for r in task["records"]
                 if r.get("policy_version") is None and r.get("token_policy_versions")
                 and not contract.violated_rules(r)]  # fmt: skip
    return multiturn, per_token


@pytest.mark.parametrize("variant", range(12))
def test_12_1_6_batch_shape(variant):
    task = grading.task("12.1.6", variant)
    records = task["records"]
    assert 8 <= len(records) <= 10
    sids = [r["sample_id"] for r in records]
    assert len(set(sids)) == len(sids)
    broken = {r["sample_id"]: contract.violated_rules(r) for r in records}
    broken = {sid: rules for sid, rules in broken.items() if rules}
    assert 3 <= len(broken) <= 4
    assert all(len(rules) == 1 for rules in broken.values()), broken
    found = {rules[0] for rules in broken.values()}
    assert {"mask_prompt", "mixed_versions"} <= found and found <= set(contract.RULES)
    multiturn, per_token = _traps(task)
    assert len(multiturn) == 1 and len(per_token) == 1
    assert grading._reference("12.1.6", variant) == {sid: r[0] for sid, r in broken.items()}
    for key in contract.RULES:
        assert key in task["statement"] and task["rules"][key] == contract.RULES[key]


def test_12_1_6_feedback_counts_without_revealing_records():
    task, ref = grading.task("12.1.6"), grading._reference("12.1.6")
    multiturn, per_token = _traps(task)
    n = len(ref)
    dropped = next(
        sid for sid, rule in ref.items() if rule not in ("mask_prompt", "mixed_versions")
    )
    result = grading.evaluate("12.1.6", {k: v for k, v in ref.items() if k != dropped})
    assert result.status == "wrong" and dropped not in result.message
    assert f"В верном ответе записей: {n}; из них вы назвали {n - 1}" in result.message
    extra = next(r["sample_id"] for r in task["records"]
                 if r["sample_id"] not in ref and r["sample_id"] not in multiturn + per_token)  # fmt: skip
    result = grading.evaluate("12.1.6", {**ref, extra: "decoding"})
    assert result.status == "wrong" and extra not in result.message
    assert "лишних в ответе: 1" in result.message
    wrong_rule = {**ref, dropped: "reward" if ref[dropped] != "reward" else "decoding"}
    result = grading.evaluate("12.1.6", wrong_rule)
    assert result.status == "wrong" and "у 1 значение неверно" in result.message
    assert grading.evaluate("12.1.6", {}).status == "wrong"


def test_12_1_6_lenient_spelling_and_strict_vocabulary():
    ref = grading._reference("12.1.6")
    loose = {f" {k.upper()} ": f"{v.upper()} " for k, v in ref.items()}
    assert grading.evaluate("12.1.6", loose)
    bad_rule = {**ref, next(iter(ref)): "маска"}
    result = grading.evaluate("12.1.6", bad_rule)
    assert (
        result.status == "malformed"
        and "mask_prompt" in result.message
        and "'маска'" in result.message
    )
    result = grading.evaluate("12.1.6", {**ref, "run00-p999-g00": "decoding"})
    assert result.status == "malformed" and "записей нет в условии" in result.message


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_1_6_misconception_families(variant):
    task, ref = grading.task("12.1.6", variant), grading._reference("12.1.6", variant)
    (multiturn,), (per_token,) = _traps(task)
    mixed = next(sid for sid, rule in ref.items() if rule == "mixed_versions")
    for rule in ("mask_length", "logprob_count", "mask_prompt"):
        result = grading.evaluate("12.1.6", {**ref, multiturn: rule}, variant)
        assert result.misconception == "env_tokens_flagged", rule
    no_mixed = {k: v for k, v in ref.items() if k != mixed}
    for answer in (no_mixed, {**ref, per_token: "policy_version"},
                   {**no_mixed, per_token: "mixed_versions"}):  # fmt: skip
        result = grading.evaluate("12.1.6", answer, variant)
        assert result.misconception == "single_version_ok", answer
    # две ошибки сразу — уже не одна типичная ошибка, а общий отзыв со списком записей
    both = {**{k: v for k, v in ref.items() if k != mixed}, multiturn: "logprob_count"}
    assert grading.evaluate("12.1.6", both, variant).status == "wrong"


def test_12_1_6_solution_explains_every_record():
    task = grading.task("12.1.6")
    text = _ex("12.1.6").solution(task)
    for rec in task["records"]:
        assert rec["sample_id"] in text
    for sid, rule in grading._reference("12.1.6").items():
        assert f"`{sid}` | `{rule}`" in text


# ---------------------------------------------------------------- 12.1.7: профиль и две оси
@pytest.mark.parametrize("variant", range(8))
def test_12_1_7_reference_by_hand(variant):
    task, ref = grading.task("12.1.7", variant), grading._reference("12.1.7", variant)
    times = task["stage_times"]
    assert list(times) == list(profile.STAGES) and all(t > 0 for t in times.values())
    total = sum(times.values())
    accel = task["accelerate"]
    assert ref["T_seq"] == pytest.approx(total, rel=1e-12)
    assert ref["dominant"] == max(times, key=times.get)
    assert ref["speedup_bound"] == pytest.approx(total / (total - times[accel]), rel=1e-12)
    assert set(ref["setups"]) == set(task["setups"]) == set("ABCD")
    classes = list(ref["setups"].values())
    assert "disaggregated/sync" in classes and "disaggregated/async" in classes
    assert any(c.startswith("colocated/") for c in classes)
    assert set(classes) <= set(task["setup_classes"])
    assert len(set(task["setups"].values())) == 4
    assert f"{times[accel]:.2f}" in task["statement"] and accel in task["statement"]
    assert "1 %" in task["statement"]


def test_12_1_7_dominant_varies_between_variants():
    dominants = {grading._reference("12.1.7", v)["dominant"] for v in range(4)}
    assert len(dominants) >= 3


def test_12_1_7_setup_pool_is_large_and_covers_all_cells():
    from course_utils.exercises.lesson_12_1 import loop_profile

    pool = loop_profile.SETUPS  # {текст схемы: клетка}
    assert len(pool) >= 8 and set(pool.values()) == set(loop_profile.SETUP_CLASSES)


def test_12_1_7_tolerance_and_malformed():
    ref = grading._reference("12.1.7")
    assert grading.evaluate("12.1.7", {**ref, "T_seq": ref["T_seq"] * 1.005})
    result = grading.evaluate("12.1.7", {**ref, "T_seq": ref["T_seq"] * 1.05})
    assert result.status == "wrong" and "T_seq" in result.message
    assert grading.evaluate("12.1.7", {**ref, "T_seq": round(ref["T_seq"], 2),
                                       "speedup_bound": round(ref["speedup_bound"], 2)})  # fmt: skip
    upper = {**ref, "dominant": ref["dominant"].upper(),
             "setups": {k.lower(): v.upper() for k, v in ref["setups"].items()}}  # fmt: skip
    assert grading.evaluate("12.1.7", upper)
    colon = {**ref, "setups": {k: v.replace("/", ":") for k, v in ref["setups"].items()}}
    result = grading.evaluate("12.1.7", colon)
    assert result.status == "malformed" and "disaggregated/async" in result.message
    result = grading.evaluate("12.1.7", {k: v for k, v in ref.items() if k != "setups"})
    assert result.status == "malformed" and "setups" in result.message
    result = grading.evaluate("12.1.7", {**ref, "dominant": "генерация"})
    assert result.status == "malformed" and "dominant" in result.message


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_1_7_misconceptions_recognised_in_other_forms(variant):
    task, ref = grading.task("12.1.7", variant), grading._reference("12.1.7", variant)
    times, accel = task["stage_times"], task["accelerate"]
    ratio = ref["T_seq"] / times[accel]
    # ошибка Амдала узнаётся и при другой ошибке в схемах
    flipped = {k: "colocated/sync" for k in ref["setups"]}
    result = grading.evaluate("12.1.7", {**ref, "speedup_bound": ratio, "setups": flipped}, variant)
    assert result.misconception == "amdahl_ratio"
    mean = sum(times.values()) / len(times)
    result = grading.evaluate("12.1.7", {**ref, "T_seq": round(mean, 3)}, variant)
    assert result.misconception == "mean_not_sum"
    all_async = {k: "disaggregated/async" for k in ref["setups"]}  # и совместные тоже
    result = grading.evaluate("12.1.7", {**ref, "setups": all_async}, variant)
    assert result.misconception == "separate_server_async"


# ---------------------------------------------------------------- ошибки, собранные вручную, 0–49
TRAP_VARIANTS = range(50)


def _hand_traps_12_1_6(task):
    """Записи-ловушки, найденные по сырым данным условия (без решателя и без ловушек шага)."""
    found = {}
    for r in task["records"]:
        n, mask, tpv = len(r["prompt_tokens"]), r["policy_mask"], r.get("token_policy_versions")
        whole = len(mask) == n + len(r["response_tokens"])
        if 1 in mask[:n]:
            found["mask_prompt"] = r["sample_id"]
        elif whole and 0 in mask[n:] and mask[n:].count(1) == len(r["behavior_logprobs"]):
            found["multiturn"] = r["sample_id"]
        elif tpv and len(set(tpv)) > 1:
            found["per_token" if r["policy_version"] is None else "mixed"] = r["sample_id"]
    assert set(found) == {"mask_prompt", "multiturn", "per_token", "mixed"}, found
    return found


def _without(ref, *sids):
    return {k: r for k, r in ref.items() if k not in sids}


def _misnamed(exercise_id, cases):
    """(вариант, ожидаемая ошибка, ответ) → список случаев, где отзыв назвал не ту ошибку."""
    bad = []
    for variant, key, answer in cases:
        got = grading.evaluate(exercise_id, answer, variant)
        if (got.status, got.misconception) != ("misconception", key):
            bad.append((variant, key, got.status, got.misconception))
    return bad


def test_12_1_6_hand_built_wrong_answers_named_in_variants_0_49():
    cases = []
    for v in TRAP_VARIANTS:
        task, ref = grading.task("12.1.6", v), grading._reference("12.1.6", v)
        hand = _hand_traps_12_1_6(task)
        without = partial(_without, ref)
        cases.append((v, "prompt_in_mask", without(hand["mask_prompt"])))
        for rule in ("logprob_count", "mask_length", "mask_values"):  # «нули маски — ошибка»
            cases.append((v, "env_tokens_flagged", {**ref, hand["multiturn"]: rule}))
        cases += [(v, "single_version_ok", without(hand["mixed"])),  # одна метка «годится»
                  (v, "single_version_ok", {**ref, hand["per_token"]: "policy_version"}),
                  (v, "single_version_ok",
                   {**without(hand["mixed"]), hand["per_token"]: "mixed_versions"})]  # fmt: skip
    bad = _misnamed("12.1.6", cases)
    assert not bad, f"{len(bad)} из {len(cases)}: {bad[:10]}"


def test_12_1_6_other_errors_are_not_named_as_traps():
    for v in TRAP_VARIANTS:
        ref = grading._reference("12.1.6", v)
        other = next(k for k, r in ref.items() if r not in ("mask_prompt", "mixed_versions"))
        got = grading.evaluate("12.1.6", {k: r for k, r in ref.items() if k != other}, v)
        assert got.status == "wrong", (v, got)
        got = grading.evaluate("12.1.6", {**ref, other: "reward"}, v)
        assert got.status == "wrong", (v, got)


def test_12_1_7_hand_built_answers_in_variants_0_49():
    cases = []
    for v in TRAP_VARIANTS:
        task, ref = grading.task("12.1.7", v), grading._reference("12.1.7", v)
        times = task["stage_times"]
        total, t_acc = sum(times.values()), times[task["accelerate"]]
        right = {"T_seq": round(total, 2), "dominant": max(times, key=times.get),
                 "speedup_bound": round(total / (total - t_acc), 3), "setups": ref["setups"]}  # fmt: skip
        assert grading.evaluate("12.1.7", right, v).status == "correct", v
        cases.append((v, "amdahl_ratio", {**right, "speedup_bound": round(total / t_acc, 2)}))
        cases.append((v, "mean_not_sum", {**right, "T_seq": round(total / len(times), 2)}))
        split = {k: "disaggregated/async" if c.startswith("disaggregated") else c
                 for k, c in ref["setups"].items()}  # fmt: skip
        cases.append((v, "separate_server_async", {**right, "setups": split}))
        everything = dict.fromkeys(ref["setups"], "disaggregated/async")
        cases.append((v, "separate_server_async", {**right, "setups": everything}))
        other = next(s for s in times if s != right["dominant"])
        got = grading.evaluate("12.1.7", {**right, "dominant": other}, v)
        assert got.status == "wrong", (v, got)  # другая ошибка — не типичная
    bad = _misnamed("12.1.7", cases)
    assert not bad, f"{len(bad)} из {len(cases)}: {bad[:10]}"
