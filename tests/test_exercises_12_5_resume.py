"""Отдельные проверки шагов урока 12.5: 12.5.10–12.5.13; общие свойства — в test_exercises.py."""

import json
import math
import re
from pathlib import Path

import pytest

from course_utils import fmt, grading, stack_map

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


# ---------------------------------------------------------------- 12.5.10–12.5.13: resume, пакеты, стеки, итоговый диагноз (урок 12.5)


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
    assert result.status == "malformed" and "аргумента: resume(" in result.message
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
    from course_utils.exercises.lesson_12_5 import atomic_batches

    task, ref = grading.task("12.5.11", variant), grading.reference("12.5.11", variant)
    current = task["verifier_version"]
    assert list(ref) == [b["batch_id"] for b in task["batches"]]
    for b in task["batches"]:
        assert ref[b["batch_id"]] == ("accept" if _accept_by_hand(b, current) else "reject")
        assert b["batch_id"] in task["statement"]
    assert "accept" in ref.values() and "reject" in ref.values()
    kinds = {atomic_batches._kind_of(b, current) for b in task["batches"]}
    if variant < 4:
        assert {"complete", "policy_mixed", "missing_rollouts", "missing_reward",
                "duplicate"} <= kinds  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_11_forms_and_misconceptions(variant):
    from course_utils.exercises.lesson_12_5 import atomic_batches

    task, ref = grading.task("12.5.11", variant), grading.reference("12.5.11", variant)
    current = task["verifier_version"]
    kind = {b["batch_id"]: atomic_batches._kind_of(b, current) for b in task["batches"]}
    russian = {k.upper(): ("Принять" if v == "accept" else "отклонить") for k, v in ref.items()}
    assert grading.evaluate("12.5.11", russian, variant)
    result = grading.evaluate("12.5.11", {**ref, next(iter(ref)): "maybe"}, variant)
    assert result.status == "malformed" and "accept" in result.message
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
    assert result.status == "wrong" and "Неверны значения" in result.message
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
    assert result.status == "malformed" and "weight_sync" in result.message
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
    t6, t7, t8 = (grading.task(e, variant) for e in ("12.2.6", "12.2.7", "12.2.8"))
    s6, s7, s8 = (_ex(e).solution(t) for e, t in (("12.2.6", t6), ("12.2.7", t7), ("12.2.8", t8)))
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
