"""Отдельные проверки шагов урока 12.2 (12.2.6–12.2.8); общие свойства — в test_exercises.py.

Типичные ошибки здесь собраны вручную из данных условия (не через ловушки шага) и проверяются во
всех вариантах 0–49: каждая должна быть названа своим ключом.
"""

import json
from pathlib import Path

import pytest

from course_utils import grading

REPO = Path(__file__).resolve().parents[1]
IDS = grading.exercise_ids()
VARIANTS = range(4)
ALL_VARIANTS = range(50)


# ---------------------------------------------------------------- 12.2.6–12.2.8: память (урок 12.2)
GIB = 2**30


def test_lesson_12_2_registered():
    from course_utils import exercises

    assert "lesson_12_2" in exercises.LOADED
    assert {"12.2.6", "12.2.7", "12.2.8"} <= set(IDS)


@pytest.mark.parametrize("variant", range(8))
def test_12_2_6_reference_by_hand(variant):
    task, ref = grading.task("12.2.6", variant), grading._reference("12.2.6", variant)
    n, d, b = task["n_params"], task["world_size"], task["bytes_per_param"]
    bp, bg = b["param_bytes"], b["grad_bytes"]
    k = b["m1_bytes"] + b["m2_bytes"] + b["master_bytes"]
    total = bp + bg + k
    assert total != 16 and d >= 2
    by_hand = {"B_state": n * total, "ddp": n * total, "zero1": n * (bp + bg) + n * k / d,
               "zero2": n * bp + n * (bg + k) / d, "zero3": n * total / d}  # fmt: skip
    for key, value in by_hand.items():
        assert ref[key] == pytest.approx(value / GIB, rel=1e-6), key
    assert ref["ddp"] >= ref["zero1"] > ref["zero2"] > ref["zero3"]
    assert "ГиБ" in task["statement"] and "1 %" in task["statement"]
    if task["model"]:
        assert task["model"] in task["statement"]


def test_12_2_6_unit_feedback_and_shape():
    ref = grading._reference("12.2.6")
    in_bytes = {k: v * GIB for k, v in ref.items()}
    result = grading.evaluate("12.2.6", in_bytes)
    assert (
        result.status == "wrong" and "ровно 2³⁰:" in result.message and "B_state" in result.message
    )
    in_gb = {k: v * GIB / 1e9 for k, v in ref.items()}
    result = grading.evaluate("12.2.6", in_gb)
    assert result.status == "wrong" and "ГиБ против ГБ" in result.message
    result = grading.evaluate("12.2.6", {k: v for k, v in ref.items() if k != "zero3"})
    assert result.status == "malformed" and "zero3" in result.message
    assert grading.evaluate("12.2.6", {k: v * 1.005 for k, v in ref.items()})


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_2_6_misconceptions_in_other_forms(variant):
    ref = grading._reference("12.2.6", variant)
    d = grading.task("12.2.6", variant)["world_size"]
    # ZeRO-1 «делит всё», а ZeRO-2 посчитан верно — всё равно та же ошибка
    result = grading.evaluate("12.2.6", {**ref, "zero1": ref["B_state"] / d}, variant)
    assert result.misconception == "shard_everything_at_zero1"
    sixteen = grading.task("12.2.6", variant)["n_params"] * 16 / GIB
    result = grading.evaluate("12.2.6", {**ref, "B_state": sixteen}, variant)
    assert result.misconception == "sixteen_law"


@pytest.mark.parametrize("variant", range(8))
def test_12_2_7_reference_by_hand(variant):
    task, ref = grading.task("12.2.7", variant), grading._reference("12.2.7", variant)
    config = json.loads((REPO / "data" / "model_configs" / f"{task['model']}.json").read_text())
    assert task["num_layers"] == config["num_hidden_layers"]
    assert task["num_kv_heads"] == config["num_key_value_heads"]
    assert task["num_attention_heads"] == config["num_attention_heads"] != task["num_kv_heads"]
    assert task["head_dim"] == config["hidden_size"] // config["num_attention_heads"]
    per_tok = 2 * task["num_layers"] * task["num_kv_heads"] * task["head_dim"]
    per_tok *= task["bytes_per_value"]
    per_seq = per_tok * (task["prompt_tokens"] + task["response_tokens"])
    seqs = (task["budget_gib"] * GIB - task["weights_bytes"]) // per_seq
    assert ref == {"kv_bytes_per_token": per_tok, "max_sequences": seqs,
                   "max_groups": seqs // task["group_size"]}  # fmt: skip
    assert ref["max_groups"] >= 1
    assert task["weights_bytes"] >= per_seq  # иначе «забыли веса» могло бы совпасть с верным
    assert str(task["num_kv_heads"]) in task["statement"] and "точно" in task["statement"]


def test_12_2_7_integers_and_lecture_example():
    ref = grading._reference("12.2.7")
    assert grading.evaluate("12.2.7", {k: float(v) for k, v in ref.items()})
    result = grading.evaluate("12.2.7", {**ref, "max_sequences": ref["max_sequences"] + 0.5})
    assert result.status == "malformed" and "max_sequences" in result.message
    assert "целое" in result.message and "округлите" in result.message
    result = grading.evaluate("12.2.7", {**ref, "max_groups": ref["max_groups"] + 1})
    assert result.status == "wrong" and "max_groups" in result.message
    # пример лекции: L=32, H_kv=8, d_h=128, b=2 → 128 КиБ на токен (Llama-3.1-8B)
    for v in range(40):
        task = grading.task("12.2.7", v)
        if task["model"] == "Llama-3.1-8B" and task["bytes_per_value"] == 2:
            assert grading._reference("12.2.7", v)["kv_bytes_per_token"] == 131072
            break
    else:
        pytest.fail("нет варианта с Llama-3.1-8B в bf16")


@pytest.mark.parametrize("variant", range(8))
def test_12_2_8_reference_by_hand(variant):
    task, ref = grading.task("12.2.8", variant), grading._reference("12.2.8", variant)
    sums = {ph: sum(comps.values()) for ph, comps in task["phases"]}
    assert ref["peak_phase"] == max(sums, key=sums.get)
    assert ref["peak_gib"] == pytest.approx(max(sums.values()))
    lora = {ph: comps for ph, comps in task["phases_lora"]}
    for ph, comps in task["phases"]:  # LoRA меняет только градиенты и оптимизатор
        changed = {c for c in comps if comps[c] != lora[ph][c]}
        assert changed <= {"градиенты", "оптимизатор"}
    assert ref["peak_lora_gib"] == pytest.approx(max(sum(c.values()) for c in lora.values()))
    assert ref["peak_lora_gib"] <= ref["peak_gib"]
    groups = task["run_log"]["groups"]
    degenerate = sum(len(set(r)) == 1 for r in groups.values())
    assert 2 <= degenerate < len(groups)
    rate = len(groups) / task["run_log"]["duration_s"]
    assert ref["informative_groups_per_s"] == pytest.approx(rate * (1 - degenerate / len(groups)))


def test_12_2_8_peak_phase_varies_and_feedback():
    assert len({grading._reference("12.2.8", v)["peak_phase"] for v in range(12)}) >= 2
    ref = grading._reference("12.2.8")
    assert grading.evaluate("12.2.8", {**ref, "peak_phase": ref["peak_phase"].upper()})
    result = grading.evaluate("12.2.8", {**ref, "peak_phase": "обучение"})
    assert result.status == "malformed" and "generation" in result.message
    result = grading.evaluate("12.2.8", {**ref, "peak_gib": "12 ГиБ"})
    assert result.status == "malformed" and "peak_gib" in result.message


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_2_8_misconceptions_in_other_forms(variant):
    from course_utils import memory

    task, ref = grading.task("12.2.8", variant), grading._reference("12.2.8", variant)
    som = memory.sum_of_component_maxima(task["phases"])
    result = grading.evaluate("12.2.8", {**ref, "peak_gib": som, "peak_phase": "sync"}, variant)
    assert result.misconception == "sum_of_maxima"
    n = len(task["run_log"]["groups"]) / task["run_log"]["duration_s"]
    wrong = {**ref, "peak_lora_gib": ref["peak_gib"], "informative_groups_per_s": n}
    result = grading.evaluate("12.2.8", wrong, variant)
    assert result.misconception == "groups_not_informative"


# ---------------------------------------------------------------- ошибки, собранные вручную, 0–49
def _by_hand_12_2_6(task):
    """Верный ответ и типичные ошибки 12.2.6 по таблице условия (ГиБ)."""
    n, d, b = task["n_params"], task["world_size"], task["bytes_per_param"]
    bp, bg = b["param_bytes"], b["grad_bytes"]
    k = b["m1_bytes"] + b["m2_bytes"] + b["master_bytes"]
    total = bp + bg + k
    ref = {"B_state": n * total, "ddp": n * total, "zero1": n * (bp + bg) + n * k / d,
           "zero2": n * bp + n * (bg + k) / d, "zero3": n * total / d}  # fmt: skip
    ref = {key: v / GIB for key, v in ref.items()}
    sixteen = {"B_state": 16 * n, "ddp": 16 * n, "zero1": 4 * n + 12 * n / d,
               "zero2": 2 * n + 14 * n / d, "zero3": 16 * n / d}  # fmt: skip
    split = ref["B_state"] / d
    return ref, {
        "sixteen_law": {key: v / GIB for key, v in sixteen.items()},
        "shard_everything_at_zero1": {**ref, "zero1": split, "zero2": split},
        "ddp_divides": {**ref, "ddp": split},
    }


def _by_hand_12_2_7(task):
    """Верный ответ и типичные ошибки 12.2.7: байты на токен, последовательности, группы."""
    L, hkv, h = task["num_layers"], task["num_kv_heads"], task["num_attention_heads"]
    dh, b, g = task["head_dim"], task["bytes_per_value"], task["group_size"]
    prompt, response, w = task["prompt_tokens"], task["response_tokens"], task["weights_bytes"]
    budget = task["budget_gib"] * GIB

    def answer(per_tok, free, tokens):
        seqs = free // (per_tok * tokens)
        return {"kv_bytes_per_token": per_tok, "max_sequences": seqs, "max_groups": seqs // g}

    per_tok = 2 * L * hkv * dh * b
    ref = answer(per_tok, budget - w, prompt + response)
    return ref, {
        "no_factor_two": answer(L * hkv * dh * b, budget - w, prompt + response),
        "attention_heads_not_kv": answer(2 * L * h * dh * b, budget - w, prompt + response),
        "forgot_weights": answer(per_tok, budget, prompt + response),
        "forgot_prompt": answer(per_tok, budget - w, response),
        "budget_in_gb": answer(per_tok, task["budget_gib"] * 10**9 - w, prompt + response),
    }


def _by_hand_12_2_8(task):
    """Верный ответ и типичные ошибки 12.2.8 по таблице фаз и журналу."""
    sums = {ph: sum(comps.values()) for ph, comps in task["phases"]}
    lora = [comps for _, comps in task["phases_lora"]]
    groups, duration = task["run_log"]["groups"], task["run_log"]["duration_s"]
    degenerate = sum(len(set(r)) == 1 for r in groups.values())
    ref = {"peak_gib": max(sums.values()), "peak_phase": max(sums, key=sums.get),
           "peak_lora_gib": max(sum(c.values()) for c in lora),
           "informative_groups_per_s": (len(groups) - degenerate) / duration}  # fmt: skip
    comps = task["phases"][0][1]
    maxima = sum(max(c[name] for _, c in task["phases"]) for name in comps)
    maxima_lora = sum(max(c[name] for c in lora) for name in comps)
    base = ("веса движка", "веса тренера")
    return ref, {
        "sum_of_maxima": {**ref, "peak_gib": maxima, "peak_lora_gib": maxima_lora},
        "lora_no_base": {
            **ref,
            "peak_lora_gib": max(sum(v for k, v in c.items() if k not in base) for c in lora),
        },
        "groups_not_informative": {**ref, "informative_groups_per_s": len(groups) / duration},
    }


BY_HAND = {"12.2.6": _by_hand_12_2_6, "12.2.7": _by_hand_12_2_7, "12.2.8": _by_hand_12_2_8}


@pytest.mark.parametrize("exercise_id", sorted(BY_HAND))
def test_hand_built_wrong_answers_named_in_variants_0_49(exercise_id):
    """Ответ с ошибкой, собранный вручную из условия, назван этой ошибкой во всех вариантах 0–49."""
    keys = {m.key for m in grading.misconceptions(exercise_id)}
    failures = []
    for variant in ALL_VARIANTS:
        ref, wrong = BY_HAND[exercise_id](grading.task(exercise_id, variant))
        assert set(wrong) == keys
        if not grading.evaluate(exercise_id, ref, variant):
            failures.append(f"вариант {variant}: верный ответ, посчитанный вручную, не принят")
        for key, answer in wrong.items():
            got = grading.evaluate(exercise_id, answer, variant)
            if got.misconception != key:
                failures.append(f"вариант {variant}: {key} → {got.status} {got.misconception}")
    assert not failures, "\n".join(failures[:20])


def test_12_2_8_sum_of_maxima_in_one_peak_only():
    """Сумма максимумов только в пике без LoRA (пик с LoRA верен) — та же ошибка."""
    for variant in ALL_VARIANTS:
        ref, wrong = _by_hand_12_2_8(grading.task("12.2.8", variant))
        answer = {**ref, "peak_gib": wrong["sum_of_maxima"]["peak_gib"]}
        assert grading.evaluate("12.2.8", answer, variant).misconception == "sum_of_maxima"


def test_12_2_7_slips_in_sequences_tell_apart_in_every_variant():
    """Issue 11, п. 5: «забыли запрос», «забыли веса», «ГБ вместо ГиБ» и верный ответ дают разные
    max_sequences в каждом варианте (в варианте 0 первые два раньше совпадали)."""
    for variant in ALL_VARIANTS:
        ref, wrong = _by_hand_12_2_7(grading.task("12.2.7", variant))
        seqs = [ref["max_sequences"]] + [
            wrong[k]["max_sequences"] for k in ("forgot_weights", "forgot_prompt", "budget_in_gb")
        ]
        assert len(set(seqs)) == 4, (variant, seqs)
        assert ref["max_groups"] >= 1


def test_12_2_7_budget_in_gb_named_and_gib_explained():
    task = grading.task("12.2.7", 0)
    _, wrong = _by_hand_12_2_7(task)
    result = grading.evaluate("12.2.7", wrong["budget_in_gb"], 0)
    assert result.misconception == "budget_in_gb"
    assert "ГиБ" in result.message and "10⁹" in result.message
    assert str(task["budget_gib"]) not in result.message  # отзыв не подсказывает чисел
    # «забыли запрос» с группами, посчитанными от верного числа, — всё равно эта ошибка
    ref, wrong = _by_hand_12_2_7(task)
    answer = {**wrong["forgot_prompt"], "max_groups": ref["max_groups"]}
    assert grading.evaluate("12.2.7", answer, 0).misconception == "forgot_prompt"


def test_statements_name_notebook_variables():
    for exercise_id, key in (
        ("12.2.6", "n_params"),
        ("12.2.7", "num_layers"),
        ("12.2.8", "run_log"),
    ):
        statement = grading.task(exercise_id, 0)["statement"]
        assert f"task_{exercise_id.replace('.', '_')}['{key}']" in statement
