"""Самопроверка всех зарегистрированных проверочных шагов (всех уроков, нынешних и будущих).

Для каждого упражнения и вариантов 0..3: верный ответ проходит, каждая типичная ошибка узнаётся
своим ключом, заглушка — «ещё не решено», мусор даёт отзыв без исключения, new_variant меняет
числа, условие детерминировано и сериализуется в JSON, разбор — русский Markdown с числами задачи.
Ниже — отдельные проверки шагов 12.1.6 и 12.1.7.
"""

import copy
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import contract, fmt, grading, profile, stack_map
from course_utils.grading import ____, answers_match

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


# ---------------------------------------------------------------- реестр
def test_lesson_12_1_registered():
    from course_utils import exercises

    assert exercises.LOAD_ERRORS == {}, exercises.LOAD_ERRORS
    assert "lesson_12_1" in exercises.LOADED
    assert {"12.1.6", "12.1.7"} <= set(IDS)
    for exercise_id in IDS:
        ex = _ex(exercise_id)
        assert len(ex.misconceptions) >= 2, exercise_id
        assert ex.hint and CYRILLIC.search(ex.hint), exercise_id
        assert CYRILLIC.search(ex.title), exercise_id


def test_lesson_modules_do_not_import_torch():
    code = (
        "import sys; from course_utils import grading; grading.exercise_ids(); "
        "assert 'torch' not in sys.modules"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- общие свойства всех шагов
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("exercise_id", IDS)
def test_reference_passes(exercise_id, variant):
    ref = grading.reference(exercise_id, variant)
    result = grading.evaluate(exercise_id, ref, variant)
    assert result.status == "correct" and result, result
    assert grading.evaluate(exercise_id, copy.deepcopy(ref), variant)
    if exercise_id not in NOT_JSON:  # ответ, переписанный руками (через JSON), тоже верен
        assert grading.evaluate(exercise_id, json.loads(json.dumps(ref)), variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("exercise_id", IDS)
def test_each_misconception_recognised(exercise_id, variant):
    task = grading.task(exercise_id, variant)
    ref = grading.reference(exercise_id, variant)
    messages = set()
    for m in grading.misconceptions(exercise_id):
        wrong = m.answer(task)
        assert not answers_match(ref, wrong, _ex(exercise_id).rtol), (m.key, "совпал с верным")
        result = grading.evaluate(exercise_id, wrong, variant)
        assert result.status == "misconception" and not result, (m.key, result)
        assert result.misconception == m.key and result.message == m.message
        assert CYRILLIC.search(m.message)
        messages.add(m.message)
    assert len(messages) == len(grading.misconceptions(exercise_id))


@pytest.mark.parametrize("exercise_id", IDS)
def test_placeholder_not_attempted(exercise_id, progress_path):
    for answer in (____, [____], {"a": ____}):
        result = grading.evaluate(exercise_id, answer)
        assert result.status == "not_attempted" and not result
    assert grading.check(exercise_id, ____).status == "not_attempted"
    assert not progress_path.exists()


GARBAGE = [None, "", 42, object(), {"x": 1}, [____], -1.5, [], {}, "ответ", float("nan")]


@pytest.mark.parametrize("answer", GARBAGE, ids=range(len(GARBAGE)))
@pytest.mark.parametrize("exercise_id", IDS)
def test_garbage_gives_feedback_without_raising(exercise_id, answer, capsys):
    result = grading.check(exercise_id, answer)
    assert not result and result.status in {"wrong", "malformed", "not_attempted"}
    assert result.message and CYRILLIC.search(result.message)
    assert capsys.readouterr().out


@pytest.mark.parametrize("exercise_id", IDS)
def test_task_deterministic_and_serialisable(exercise_id):
    for variant in VARIANTS:
        task = grading.task(exercise_id, variant)
        assert task == grading.task(exercise_id, variant)
        assert CYRILLIC.search(task["statement"])
        if exercise_id not in NOT_JSON:
            assert json.loads(json.dumps(task, ensure_ascii=False)) == task
    datas = [json.dumps(_data(grading.task(exercise_id, v)), sort_keys=True, default=str)
             for v in VARIANTS]  # fmt: skip
    assert len(set(datas)) == len(datas), "варианты повторяются"


@pytest.mark.parametrize("exercise_id", IDS)
def test_new_variant_changes_numbers(exercise_id, progress_path, capsys):
    before = grading.task(exercise_id)
    fresh = grading.new_variant(exercise_id)
    assert "вариант 1" in capsys.readouterr().out
    assert fresh == grading.task(exercise_id) == grading.task(exercise_id, 1)
    assert _data(fresh) != _data(before)
    assert grading.check(exercise_id, grading.reference(exercise_id, 1))
    capsys.readouterr()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("exercise_id", IDS)
def test_solution_is_russian_markdown_with_task_numbers(exercise_id, variant):
    task = grading.task(exercise_id, variant)
    text = _ex(exercise_id).solution(task)
    assert isinstance(text, str) and len(text) > 80 and CYRILLIC.search(text)
    assert any(mark in text for mark in ("**", "|", "$$", "`", "- ")), "не похоже на Markdown"
    leaves = set().union(*(_renderings(x) for x in _leaves(_data(task))))
    assert any(s in text for s in leaves), "разбор не упоминает данных задачи"
    other = _ex(exercise_id).solution(grading.task(exercise_id, variant + 1))
    assert other != text, "разбор не зависит от варианта"


@pytest.mark.parametrize("exercise_id", IDS)
def test_solution_opens_after_attempt(exercise_id, capsys):
    grading.solution(exercise_id)
    assert "после первой попытки" in capsys.readouterr().out
    grading.check(exercise_id, 42)
    capsys.readouterr()
    grading.solution(exercise_id)
    assert "Разбор" in capsys.readouterr().out


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
    assert grading.reference("12.1.6", variant) == {sid: r[0] for sid, r in broken.items()}
    for key in contract.RULES:
        assert key in task["statement"] and task["rules"][key] == contract.RULES[key]


def test_12_1_6_feedback_counts_without_revealing_records():
    task, ref = grading.task("12.1.6"), grading.reference("12.1.6")
    multiturn, per_token = _traps(task)
    n = len(ref)
    dropped = next(
        sid for sid, rule in ref.items() if rule not in ("mask_prompt", "mixed_versions")
    )
    result = grading.evaluate("12.1.6", {k: v for k, v in ref.items() if k != dropped})
    assert result.status == "wrong" and dropped not in result.message
    assert f"записей в пакете: {n}. Вы верно отметили {n - 1} из них" in result.message
    extra = next(r["sample_id"] for r in task["records"]
                 if r["sample_id"] not in ref and r["sample_id"] not in multiturn + per_token)  # fmt: skip
    result = grading.evaluate("12.1.6", {**ref, extra: "decoding"})
    assert result.status == "wrong" and extra not in result.message
    assert "записей в ответе: 1" in result.message
    wrong_rule = {**ref, dropped: "reward" if ref[dropped] != "reward" else "decoding"}
    result = grading.evaluate("12.1.6", wrong_rule)
    assert result.status == "wrong" and "у 1 правило названо неверно" in result.message
    assert grading.evaluate("12.1.6", {}).status == "wrong"


def test_12_1_6_lenient_spelling_and_strict_vocabulary():
    ref = grading.reference("12.1.6")
    loose = {f" {k.upper()} ": f"{v.upper()} " for k, v in ref.items()}
    assert grading.evaluate("12.1.6", loose)
    bad_rule = {**ref, next(iter(ref)): "маска"}
    result = grading.evaluate("12.1.6", bad_rule)
    assert result.status == "malformed" and "contract.RULES" in result.message
    result = grading.evaluate("12.1.6", {**ref, "run00-p999-g00": "decoding"})
    assert result.status == "malformed" and "нет в пакете" in result.message


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_1_6_misconception_families(variant):
    task, ref = grading.task("12.1.6", variant), grading.reference("12.1.6", variant)
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
    for sid, rule in grading.reference("12.1.6").items():
        assert f"`{sid}` | `{rule}`" in text


# ---------------------------------------------------------------- 12.1.7: профиль и две оси
@pytest.mark.parametrize("variant", range(8))
def test_12_1_7_reference_by_hand(variant):
    task, ref = grading.task("12.1.7", variant), grading.reference("12.1.7", variant)
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
    dominants = {grading.reference("12.1.7", v)["dominant"] for v in range(4)}
    assert len(dominants) >= 3


def test_12_1_7_setup_pool_is_large_and_covers_all_cells():
    from course_utils.exercises import lesson_12_1

    pool = lesson_12_1._SETUPS
    assert len(pool) >= 8 and len({text for text, _, _ in pool}) == len(pool)
    assert {cls for _, cls, _ in pool} == set(lesson_12_1.SETUP_CLASSES)


def test_12_1_7_tolerance_and_malformed():
    ref = grading.reference("12.1.7")
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
    task, ref = grading.task("12.1.7", variant), grading.reference("12.1.7", variant)
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


# ---------------------------------------------------------------- 12.2.6–12.2.8: память (урок 12.2)
GIB = 2**30


def test_lesson_12_2_registered():
    from course_utils import exercises

    assert "lesson_12_2" in exercises.LOADED
    assert {"12.2.6", "12.2.7", "12.2.8"} <= set(IDS)


@pytest.mark.parametrize("variant", range(8))
def test_12_2_6_reference_by_hand(variant):
    task, ref = grading.task("12.2.6", variant), grading.reference("12.2.6", variant)
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
    ref = grading.reference("12.2.6")
    in_bytes = {k: v * GIB for k, v in ref.items()}
    result = grading.evaluate("12.2.6", in_bytes)
    assert result.status == "wrong" and "в байтах" in result.message
    in_gb = {k: v * GIB / 1e9 for k, v in ref.items()}
    result = grading.evaluate("12.2.6", in_gb)
    assert result.status == "wrong" and "ГБ" in result.message
    result = grading.evaluate("12.2.6", {k: v for k, v in ref.items() if k != "zero3"})
    assert result.status == "malformed" and "zero3" in result.message
    assert grading.evaluate("12.2.6", {k: v * 1.005 for k, v in ref.items()})


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_2_6_misconceptions_in_other_forms(variant):
    ref = grading.reference("12.2.6", variant)
    d = grading.task("12.2.6", variant)["world_size"]
    # ZeRO-1 «делит всё», а ZeRO-2 посчитан верно — всё равно та же ошибка
    result = grading.evaluate("12.2.6", {**ref, "zero1": ref["B_state"] / d}, variant)
    assert result.misconception == "shard_everything_at_zero1"
    sixteen = grading.task("12.2.6", variant)["n_params"] * 16 / GIB
    result = grading.evaluate("12.2.6", {**ref, "B_state": sixteen}, variant)
    assert result.misconception == "sixteen_law"


@pytest.mark.parametrize("variant", range(8))
def test_12_2_7_reference_by_hand(variant):
    task, ref = grading.task("12.2.7", variant), grading.reference("12.2.7", variant)
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
    ref = grading.reference("12.2.7")
    assert grading.evaluate("12.2.7", {k: float(v) for k, v in ref.items()})
    result = grading.evaluate("12.2.7", {**ref, "max_sequences": ref["max_sequences"] + 0.5})
    assert result.status == "malformed" and "округлите вниз" in result.message
    result = grading.evaluate("12.2.7", {**ref, "max_groups": ref["max_groups"] + 1})
    assert result.status == "wrong" and "max_groups" in result.message
    # пример лекции: L=32, H_kv=8, d_h=128, b=2 → 128 КиБ на токен (Llama-3.1-8B)
    for v in range(40):
        task = grading.task("12.2.7", v)
        if task["model"] == "Llama-3.1-8B" and task["bytes_per_value"] == 2:
            assert grading.reference("12.2.7", v)["kv_bytes_per_token"] == 131072
            break
    else:
        pytest.fail("нет варианта с Llama-3.1-8B в bf16")


@pytest.mark.parametrize("variant", range(8))
def test_12_2_8_reference_by_hand(variant):
    task, ref = grading.task("12.2.8", variant), grading.reference("12.2.8", variant)
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
    assert len({grading.reference("12.2.8", v)["peak_phase"] for v in range(12)}) >= 2
    ref = grading.reference("12.2.8")
    assert grading.evaluate("12.2.8", {**ref, "peak_phase": ref["peak_phase"].upper()})
    result = grading.evaluate("12.2.8", {**ref, "peak_phase": "обучение"})
    assert result.status == "malformed" and "generation" in result.message
    result = grading.evaluate("12.2.8", {**ref, "peak_gib": "12 ГиБ"})
    assert result.status == "malformed" and "peak_gib" in result.message


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_2_8_misconceptions_in_other_forms(variant):
    from course_utils import memory

    task, ref = grading.task("12.2.8", variant), grading.reference("12.2.8", variant)
    som = memory.sum_of_component_maxima(task["phases"])
    result = grading.evaluate("12.2.8", {**ref, "peak_gib": som, "peak_phase": "sync"}, variant)
    assert result.misconception == "sum_of_maxima"
    n = len(task["run_log"]["groups"]) / task["run_log"]["duration_s"]
    wrong = {**ref, "peak_lora_gib": ref["peak_gib"], "informative_groups_per_s": n}
    result = grading.evaluate("12.2.8", wrong, variant)
    assert result.misconception == "groups_not_informative"


# ---------------------------------------------------------------- 12.3.6–12.3.9: конвейер (урок 12.3)
def test_lesson_12_3_registered():
    from course_utils import exercises

    assert "lesson_12_3" in exercises.LOADED
    assert {"12.3.6", "12.3.7", "12.3.8", "12.3.9"} <= set(IDS)


@pytest.mark.parametrize("variant", range(8))
def test_12_3_6_reference_by_hand(variant):
    task, ref = grading.task("12.3.6", variant), grading.reference("12.3.6", variant)
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
    ref = grading.reference("12.3.6")
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
    task, ref = grading.task("12.3.7", variant), grading.reference("12.3.7", variant)
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
    ref = grading.reference("12.3.7")
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
    task, ref = grading.task("12.3.8", variant), grading.reference("12.3.8", variant)
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

    task, ref = grading.task("12.3.8", variant), grading.reference("12.3.8", variant)
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
    ref = grading.reference("12.3.8")
    result = grading.evaluate("12.3.8", {**ref, "threshold_tokens": ref["threshold_tokens"] + 0.5})
    assert result.status == "malformed" and "целое" in result.message
    result = grading.evaluate("12.3.8", {**ref, "stable": True})
    assert result.status == "malformed" and "stable" in result.message
    all_stable = {**ref, "stable": dict.fromkeys(ref["stable"], True)}
    assert grading.evaluate("12.3.8", all_stable).misconception == "stable_if_equal"


@pytest.mark.parametrize("variant", range(8))
def test_12_3_9_trace_and_reference(variant):
    from course_utils import pipeline

    task, ref = grading.task("12.3.9", variant), grading.reference("12.3.9", variant)
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
    assert len({grading.reference("12.3.9", v)["speed_up"] for v in range(8)}) >= 3
    ref = grading.reference("12.3.9")
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
    assert result.status == "wrong" and f"нужно {n} чисел" in result.message
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
    assert result.status == "malformed" and '"lag"' in result.message
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
    from course_utils.exercises import lesson_12_4

    plan = lesson_12_4._plan_12_4_9(variant)
    task, ref = grading.task("12.4.9", variant), grading.reference("12.4.9", variant)
    assert set(ref) == lesson_12_4._expected_codes(plan)
    assert len(ref) == len(set(ref)) and set(ref) <= set(weight_sync.AUDIT_RULES)
    assert task["rules"] == weight_sync.AUDIT_RULES
    replicas = {e["replica"] for e in task["events"]} - {"publisher"}
    assert 2 <= len(replicas) <= 3
    versions = {e["version"] for e in task["events"] if e["event"] == "barrier"}
    assert 1 <= len(versions) <= 2
    if variant < 4:  # на первых вариантах узнаются все типичные ошибки
        assert "checksum_mismatch" in ref and set(ref) & lesson_12_4._BARRIER_CODES


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
    assert result.status == "malformed" and '"чаще"' in result.message
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
    from course_utils.exercises import lesson_12_5

    task, ref = grading.task("12.5.8", variant), grading.reference("12.5.8", variant)
    assert tracing.check_chain(lesson_12_5._trace_tables(task)) == []
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
        assert f"В orphans верных роллаутов {len(ref['orphans'])}" in result.message
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
    assert result.status == "malformed" and "не проценты" in result.message
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


# ---------------------------------------------------------------- 12.5.10–12.5.13: resume, пакеты, стеки, итоговый диагноз (урок 12.5)
# Ответ 12.5.10 — функция resume: переписать его через JSON нельзя. Условие при этом сериализуется
# (проверено отдельно ниже), а общий тест делает то же для остальных шагов.
NOT_JSON.add("12.5.10")


def test_lesson_12_5_final_steps_registered():
    assert {"12.5.10", "12.5.11", "12.5.12", "12.5.13"} <= set(IDS)


@pytest.mark.parametrize("variant", range(8))
def test_12_5_10_task_is_json_and_small(variant):
    task = grading.task("12.5.10", variant)
    assert json.loads(json.dumps(task, ensure_ascii=False)) == task
    p = task["crash_test"]
    every, crash, total = p["checkpoint_every"], p["crash_at"], p["total_steps"]
    assert every <= crash < total <= 16
    assert task["restored_step"] == crash // every * every < crash  # часть работы потеряна
    for text in (f"crash_at={crash}", f"total_steps={total}", f"step-{task['restored_step']:06d}"):
        assert text in task["statement"]


def _resume_from_solution(task):
    text = _ex("12.5.10").solution(task)
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(code, scope)
    return scope["resume"]


def test_12_5_10_reference_solution_code_and_timing():
    import time

    from course_utils import checkpoint

    task = grading.task("12.5.10")
    assert grading.evaluate("12.5.10", checkpoint.resume_full)
    resume = _resume_from_solution(task)
    assert resume is not checkpoint.resume_full
    start = time.perf_counter()
    result = grading.evaluate("12.5.10", resume)
    assert result.status == "correct", result
    assert time.perf_counter() - start < 2.0  # одна проверка аварией (torch уже загружен)


def _student_resumes():
    """Неверные resume, написанные «как студент», — не те объекты, что в модуле упражнений."""
    from course_utils import checkpoint

    def weights(run_factory, checkpoint_path):
        run = run_factory()
        run.load_weights_only(checkpoint.load_checkpoint(checkpoint_path))
        return run

    def fresh(component):
        def resume(run_factory, checkpoint_path):
            run = run_factory()
            state = checkpoint.load_checkpoint(checkpoint_path)
            state[component] = run_factory().state_dict()[component]
            run.load_state_dict(state)
            return run

        return resume

    def drop(run_factory, checkpoint_path):
        run = run_factory()
        run.load_state_dict(checkpoint.load_checkpoint(checkpoint_path), queue="drop")
        return run

    return [(weights, "weights_only"), (checkpoint.resume_weights_only, "weights_only"),
            (fresh("rng"), "forgot_rng"), (fresh("data_cursor"), "forgot_cursor"),
            (fresh("queue"), "forgot_queue"), (drop, "forgot_queue")]  # fmt: skip


@pytest.mark.parametrize("variant", [0, 3, 5])
def test_12_5_10_hand_written_mistakes_recognised(variant):
    for fn, key in _student_resumes():
        result = grading.evaluate("12.5.10", fn, variant)
        assert result.status == "misconception" and result.misconception == key, (key, result)


def test_12_5_10_broken_functions_get_feedback():
    from course_utils import checkpoint

    def boom(run_factory, checkpoint_path):
        raise RuntimeError("диск недоступен")

    def nothing(run_factory, checkpoint_path):
        run = run_factory()
        run.load_state_dict(checkpoint.load_checkpoint(checkpoint_path))

    def cold_optimizer(run_factory, checkpoint_path):
        run = run_factory()
        state = checkpoint.load_checkpoint(checkpoint_path)
        state["optimizer"] = run.state_dict()["optimizer"]
        run.load_state_dict(state)
        return run

    def broken_run(run_factory, checkpoint_path):
        run = checkpoint.resume_full(run_factory, checkpoint_path)
        run.optimizer = None
        return run

    result = grading.evaluate("12.5.10", boom)
    assert result.status == "wrong" and "RuntimeError: диск недоступен" in result.message
    result = grading.evaluate("12.5.10", nothing)
    assert result.status == "malformed" and "return run" in result.message
    result = grading.evaluate("12.5.10", lambda run_factory: run_factory())
    assert result.status == "malformed" and "два аргумента" in result.message
    result = grading.evaluate("12.5.10", checkpoint.ToyRLRun(0))
    assert result.status == "malformed" and "без скобок" in result.message
    assert grading.evaluate("12.5.10", checkpoint.ToyRLRun).status == "malformed"
    result = grading.evaluate("12.5.10", cold_optimizer)
    assert result.status == "wrong" and "optimizer" in result.message
    assert "расходится на шаге" in result.message
    result = grading.evaluate("12.5.10", lambda run_factory, checkpoint_path: run_factory())
    assert result.status == "wrong" and "policy" in result.message
    result = grading.evaluate("12.5.10", broken_run)
    assert result.status == "wrong" and "после восстановления" in result.message


def test_12_5_10_solution_shows_every_mistake():
    task = grading.task("12.5.10", 2)
    text = _ex("12.5.10").solution(task)
    assert "совпадает на всех" in text and text.count("| расходится на шаге") == 4
    for label in ("`rng`", "`data_cursor`", 'queue="drop"', "load_weights_only"):
        assert label in text


def _accept_by_hand(batch, current):
    ids = [r["rollout_id"] for r in batch["rollouts"]]
    return (
        sorted(ids) == sorted(batch["expected_ids"])
        and len(set(ids)) == len(ids)
        and all(isinstance(r["reward"], float) for r in batch["rollouts"])
        and {r["verifier_version"] for r in batch["rollouts"]} == {current}
    )


@pytest.mark.parametrize("variant", range(10))
def test_12_5_11_reference_by_hand(variant):
    from course_utils.exercises import lesson_12_5

    task, ref = grading.task("12.5.11", variant), grading.reference("12.5.11", variant)
    current = task["verifier_version"]
    assert list(ref) == [b["batch_id"] for b in task["batches"]]
    for b in task["batches"]:
        assert ref[b["batch_id"]] == ("accept" if _accept_by_hand(b, current) else "reject")
        assert b["batch_id"] in task["statement"]
    assert "accept" in ref.values() and "reject" in ref.values()
    kinds = {lesson_12_5._kind_of(b, current) for b in task["batches"]}
    if variant < 4:
        assert {"complete", "policy_mixed", "missing_rollouts", "missing_reward",
                "duplicate"} <= kinds  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_11_forms_and_misconceptions(variant):
    from course_utils.exercises import lesson_12_5

    task, ref = grading.task("12.5.11", variant), grading.reference("12.5.11", variant)
    current = task["verifier_version"]
    kind = {b["batch_id"]: lesson_12_5._kind_of(b, current) for b in task["batches"]}
    russian = {k.upper(): ("Принять" if v == "accept" else "отклонить") for k, v in ref.items()}
    assert grading.evaluate("12.5.11", russian, variant)
    result = grading.evaluate("12.5.11", {**ref, next(iter(ref)): "maybe"}, variant)
    assert result.status == "malformed" and '"accept"' in result.message
    result = grading.evaluate("12.5.11", dict(list(ref.items())[1:]), variant)
    assert result.status == "malformed"
    one_partial = next(k for k, v in kind.items() if v == "missing_reward")
    result = grading.evaluate("12.5.11", {**ref, one_partial: "accept"}, variant)
    assert result.misconception == "accept_partial"
    dup = next(k for k, v in kind.items() if v == "duplicate")
    result = grading.evaluate("12.5.11", {**ref, dup: "accept"}, variant)
    assert result.misconception == "accept_duplicates"
    mixed = next(k for k, v in kind.items() if v == "policy_mixed")
    result = grading.evaluate("12.5.11", {**ref, mixed: "reject"}, variant)
    assert result.misconception == "reject_all_on_version_change"
    everything = dict.fromkeys(ref, "accept")
    result = grading.evaluate("12.5.11", everything, variant)
    assert result.status == "wrong" and "Верно решено пакетов" in result.message
    assert not any(k in result.message for k in ref)


@pytest.mark.parametrize("variant", range(8))
def test_12_5_12_reference_matches_choose_stacks(variant):
    import datetime as dt

    from course_utils import stack_map

    task, ref = grading.task("12.5.12", variant), grading.reference("12.5.12", variant)
    frame = stack_map.load_stack_map()
    today = dt.date.fromisoformat(task["today"])
    assert today == max(frame["snapshot_date"])
    strict = stack_map.choose_stacks(frame, **task["requirements"], today=today)
    assert ref == list(strict.loc[strict["matches"], "stack"]) and ref
    loose = stack_map.choose_stacks(frame, **task["requirements"], today=today,
                                    include_unconfirmed=True)  # fmt: skip
    speed = stack_map.load_speedups()
    top = speed.loc[speed["speedup_high"].idxmax(), "stack"]
    if variant < 4:
        assert set(ref) < set(loose.loc[loose["matches"], "stack"])
        assert ref != [top]
    assert len(task["requirements"]) >= 3 and task["today"] in task["statement"]
    for key, value in task["requirements"].items():
        assert (
            f"{key}={json.dumps(value)}".replace("true", "True").replace("false", "False")
            in (task["statement"])
        )


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_12_forms_and_misconceptions(variant):
    from course_utils import stack_map

    task, ref = grading.task("12.5.12", variant), grading.reference("12.5.12", variant)
    spelled = [s.upper().replace(" ", "-") for s in reversed(ref)]
    assert grading.evaluate("12.5.12", spelled, variant)
    assert grading.evaluate("12.5.12", set(ref), variant)
    result = grading.evaluate("12.5.12", [*ref, "DeepSpeed-Chat"], variant)
    assert result.status == "malformed" and "DeepSpeed-Chat" in result.message
    assert grading.evaluate("12.5.12", "verl", variant).status == "malformed"
    assert grading.evaluate("12.5.12", ["verl"], variant).misconception == "fastest_number"
    loose = stack_map.choose_stacks(
        stack_map.load_stack_map(), **task["requirements"], include_unconfirmed=True,
        today=__import__("datetime").date.fromisoformat(task["today"]),
    )  # fmt: skip
    extra = [s for s in loose.loc[loose["matches"], "stack"] if s not in ref]
    result = grading.evaluate("12.5.12", [*ref, extra[0]], variant)
    assert result.misconception == "unconfirmed_as_fact"
    result = grading.evaluate("12.5.12", ref[:-1] + ["PRIME-RL" if "PRIME-RL" not in ref else "TRL"], variant)  # fmt: skip
    assert result.status in {"wrong", "misconception"}


def _critical_by_hand(stages):
    """Две цепочки шага: самый медленный сборщик → награды; тренер ref_logprob → training → sync."""
    gens = [r for r in stages if r["stage"] == "generation"]
    reward = next(r for r in stages if r["stage"] == "reward")
    trainer = [r for r in stages if r["worker"] == "trainer-0"]
    slow = max(gens, key=lambda r: r["end_s"])
    gen_chain = [slow, reward]
    length = {id(c): sum(r["end_s"] - r["start_s"] for r in c) for c in (gen_chain, trainer)}
    chain = max((gen_chain, trainer), key=lambda c: length[id(c)])
    contrib = {r["stage"]: r["end_s"] - r["start_s"] for r in chain}
    return max(contrib, key=contrib.get)


@pytest.mark.parametrize("variant", range(10))
def test_12_5_13_reference_by_hand(variant):
    from course_utils import guarantees, memory

    task, ref = grading.task("12.5.13", variant), grading.reference("12.5.13", variant)
    assert ref["bottleneck"] == _critical_by_hand(task["stages"])
    mem = task["memory"]
    shape = memory.ModelShape.from_name(mem["model"])
    state = memory.per_rank_state_bytes(shape.num_params, mem["recipe"], mem["world_size"],
                                        mem["zero_stage"])  # fmt: skip
    kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * mem["sequences"] * mem[
        "tokens_per_sequence"
    ] * 2  # fmt: skip
    need = state + kv + mem["reserve_gib"] * 2**30
    assert ref["memory_fits"] is (need <= mem["gpu_gb"] * 10**9)
    assert abs(need / (mem["gpu_gb"] * 10**9) - 1) >= 0.1  # ГБ против ГиБ вывод не меняют
    q = task["queue"]
    max_lag = max(x["lag"] for x in q["lag_counts"])
    low_ess = min(b["ess"] / b["n"] for b in q["batches"]) < 0.5
    high = max_lag > q["max_lag"] or low_ess
    assert ref["staleness_risk"] == ("высокий" if high else "низкий")
    ck = task["checkpoint"]
    declared = list(ck["components"])
    declared += [c for c, on in (("curriculum", ck["curriculum"]),
                                 ("reward_normalizer", ck["running_reward_norm"])) if not on]  # fmt: skip
    table = guarantees.preflight({"checkpoint_components": declared,
                                  "crash_tested": ck["crash_tested"]})  # fmt: skip
    row = table[table["гарантия"].str.startswith("6.")].iloc[0]
    assert bool(row["выполнена"]) == (ref["recovery_gaps"] == [])
    for comp in ref["recovery_gaps"]:
        if comp != "crash_test":
            assert f"не хранит {comp}" in row["чего не хватает"]
    assert ("crash_test" in ref["recovery_gaps"]) is (not ck["crash_tested"])
    if variant < 4:
        assert ref["staleness_risk"] == "высокий" and "crash_test" in ref["recovery_gaps"]
        assert len(ref["recovery_gaps"]) >= 2


def test_12_5_13_variety():
    refs = [grading.reference("12.5.13", v) for v in range(16)]
    assert {r["bottleneck"] for r in refs} == {"generation", "reward", "ref_logprob", "training",
                                               "weight_sync"}  # fmt: skip
    assert {r["memory_fits"] for r in refs} == {True, False}
    assert {r["staleness_risk"] for r in refs} == {"высокий", "низкий"}
    assert [] in [r["recovery_gaps"] for r in refs]


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_13_forms_and_misconceptions(variant):
    task, ref = grading.task("12.5.13", variant), grading.reference("12.5.13", variant)
    loose = {"Bottleneck": ref["bottleneck"].upper(), "memory_fits": ref["memory_fits"],
             "staleness_risk": "High" if ref["staleness_risk"] == "высокий" else "low",
             "recovery_gaps": list(reversed(ref["recovery_gaps"]))}  # fmt: skip
    assert grading.evaluate("12.5.13", loose, variant)
    result = grading.evaluate("12.5.13", {**ref, "bottleneck": "decode"}, variant)
    assert result.status == "malformed" and '"weight_sync"' in result.message
    result = grading.evaluate("12.5.13", {**ref, "memory_fits": "да"}, variant)
    assert result.status == "malformed" and "memory_fits" in result.message
    result = grading.evaluate("12.5.13", {**ref, "recovery_gaps": ["веса"]}, variant)
    assert result.status == "malformed" and "crash_test" in result.message
    stages = task["stages"]
    work = {}
    for r in stages:
        work[r["stage"]] = work.get(r["stage"], 0.0) + r["end_s"] - r["start_s"]
    result = grading.evaluate("12.5.13", {**ref, "bottleneck": max(work, key=work.get)}, variant)
    assert result.misconception == "off_critical_path"
    flipped = {**ref, "memory_fits": not ref["memory_fits"]}
    assert grading.evaluate("12.5.13", flipped, variant).misconception == "sixteen_bytes"
    result = grading.evaluate("12.5.13", {**ref, "staleness_risk": "низкий"}, variant)
    assert result.misconception == "staleness_by_mean"
    result = grading.evaluate("12.5.13", {**ref, "recovery_gaps": []}, variant)
    assert result.misconception == "weights_only_ok"
    no_test = [c for c in ref["recovery_gaps"] if c != "crash_test"]
    result = grading.evaluate("12.5.13", {**ref, "recovery_gaps": no_test}, variant)
    assert result.misconception == "no_crash_test"
    result = grading.evaluate("12.5.13", {**ref, "recovery_gaps": ref["recovery_gaps"][1:]}, variant)  # fmt: skip
    assert result.status == "wrong" and "recovery_gaps" in result.message
    text = _ex("12.5.13").solution(task)
    assert "pipeline.critical_path" in text and ref["bottleneck"] in text


@pytest.mark.parametrize("variant", range(8))
def test_12_2_numbers_and_plurals_in_russian(variant):
    """Разряды — неразрывный пробел (в формулах — \\,), не запятая и не обычный пробел;
    формы слов — через fmt.count («14 групп», «4 352 токена»)."""
    from course_utils.exercises import lesson_12_2 as lesson

    t6, t7, t8 = (grading.task(e, variant) for e in ("12.2.6", "12.2.7", "12.2.8"))
    s6, s7, s8 = (
        lesson._solution_12_2_6(t6),
        lesson._solution_12_2_7(t7),
        lesson._solution_12_2_8(t8),
    )
    for text in (t6["statement"], s6, t7["statement"], s7, t8["statement"], s8):
        assert not re.search(r"\d,\d{3}", text)
    assert f"N = {fmt.num(t6['n_params'])}" in t6["statement"]
    assert fmt.num(t6["n_params"]).replace(fmt.NBSP, "\\,") in s6  # в $$…$$ — тонкий пробел TeX
    assert f"W = {fmt.num(t7['weights_bytes'])} Б" in t7["statement"]
    n_tok = t7["prompt_tokens"] + t7["response_tokens"]
    assert fmt.count(n_tok, "токен", "токена", "токенов") in s7
    groups = len(t8["run_log"]["groups"])
    assert fmt.count(groups, "группа", "группы", "групп") in t8["statement"]


def test_12_5_numbers_use_nbsp_digit_groups():
    statement = grading.task("12.5.6", 0)["statement"]
    n = grading.task("12.5.6", 0)["run"]["num_params"]
    assert f"параметров: {fmt.num(n)}," in statement and f"{n:,}" not in statement
    assert "\u00a0" in fmt.num(n)


def test_12_5_11_title_says_paket():
    assert grading._get("12.5.11").title.endswith("частично записанных пакетов")
    assert "батч" not in grading._get("12.5.11").title


def test_12_5_10_statement_limits_bitwise_to_single_process():
    text = grading.task("12.5.10", 0)["statement"]
    assert "побитово" in text and "однопроцессный" in text and "распределённого" in text


def test_12_5_12_rules_match_stack_map_vocabulary():
    text = grading.task("12.5.12", 0)["statement"]
    assert f"начинается с «{stack_map.SUPPORTED_PREFIX}»" in text and "«yes»" not in text
    assert "| `stack` |" in text
    for v in range(12):
        t = grading.task("12.5.12", v)
        if t["requirements"].get("asynchronous") is True:
            assert (
                "не подходит"
                not in t["statement"].split("asynchronous=True")[0].rsplit("\n", 1)[-1]
            )


def test_12_5_8_and_12_5_11_headers_are_field_names_as_code():
    assert "| `rollout_id` | `prompt_id` |" in grading.task("12.5.8", 0)["statement"]
    assert "| `rollout_id` |" in grading.task("12.5.11", 0)["statement"]
