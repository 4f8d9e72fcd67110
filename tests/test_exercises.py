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

from course_utils import contract, grading, profile
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
