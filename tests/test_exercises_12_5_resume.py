"""Отдельные проверки шагов урока 12.5: 12.5.10–12.5.13; общие свойства — в test_exercises.py."""

import json
import re

import pytest
from exercise_helpers import CYRILLIC, _ex

from course_utils import crash_test, fmt, grading, stack_map, toy_run

IDS = grading.exercise_ids()
VARIANTS = range(4)


# ---------------------------------------------------------------- 12.5.10–12.5.13: resume, пакеты, стеки, итоговый диагноз (урок 12.5)


def test_lesson_12_5_final_steps_registered():
    assert {"12.5.10", "12.5.11", "12.5.12", "12.5.13"} <= set(IDS)


ALL = range(50)


@pytest.mark.parametrize("variant", range(8))
def test_12_5_10_task_is_json_and_small(variant):
    task = grading.task("12.5.10", variant)
    assert json.loads(json.dumps(task, ensure_ascii=False)) == task
    p = task["crash_test"]
    every, crash, total = p["checkpoint_every"], p["crash_at"], p["total_steps"]
    assert every <= crash < total <= 20
    assert task["restored_step"] == crash // every * every < crash  # часть работы потеряна
    for text in (f"crash_at={crash}", f"total_steps={total}", f"step-{task['restored_step']:06d}"):
        assert text in task["statement"]


def test_12_5_10_checkpoint_after_verifier_upgrade_and_promotion():
    """Контрольная точка каждого варианта — уже с verifier-2 и уровнем программы ≥ 1 (иначе забытые
    versions или curriculum совпали бы с новым запуском). Считаем прямо по ToyRLRun."""
    from course_utils import checkpoint

    for variant in ALL:
        p = grading.task("12.5.10", variant)["crash_test"]
        kw = {
            k: v
            for k, v in p.items()
            if k not in ("total_steps", "crash_at", "checkpoint_every", "seed")
        }
        run, fresh = toy_run.ToyRLRun(p["seed"], **kw), toy_run.ToyRLRun(p["seed"], **kw)
        for _ in range(p["crash_at"] // p["checkpoint_every"] * p["checkpoint_every"]):
            run.step()
        assert run.verifier_version == "verifier-2" and run.curriculum["level"] >= 1, variant
        state, new = run.state_dict(), fresh.state_dict()
        assert all(repr(state[c]) != repr(new[c]) for c in checkpoint.COMPONENTS), variant


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
    assert time.perf_counter() - start < 3.0  # одна проверка аварией (torch уже загружен)


def _without(component):
    """resume «как у студента»: всё, кроме одного компонента (он — из свежего запуска)."""
    from course_utils import checkpoint

    def resume(run_factory, checkpoint_path):
        run = run_factory()
        state = checkpoint.load_checkpoint(checkpoint_path)
        state[component] = run_factory().state_dict()[component]
        run.load_state_dict(state)
        return run

    return resume


COMPONENT_KEYS = {"policy": "forgot_policy", "optimizer": "forgot_optimizer",
                  "scheduler": "forgot_scheduler", "counters": "forgot_counters", "rng": "forgot_rng",
                  "data_cursor": "forgot_cursor", "curriculum": "forgot_curriculum",
                  "normalizer": "forgot_normalizer", "versions": "forgot_versions",
                  "queue": "forgot_queue"}  # fmt: skip


def test_12_5_10_one_trap_per_component():
    from course_utils import checkpoint

    assert set(COMPONENT_KEYS) == set(checkpoint.COMPONENTS)
    keys = {m.key for m in grading.misconceptions("12.5.10")}
    assert set(COMPONENT_KEYS.values()) | {"weights_only", "ignores_checkpoint"} == keys


@pytest.mark.parametrize("component", list(COMPONENT_KEYS))
def test_12_5_10_incomplete_resume_named_in_every_variant(component):
    fn, key = _without(component), COMPONENT_KEYS[component]
    for variant in ALL:
        result = grading.evaluate("12.5.10", fn, variant)
        assert (result.status, result.misconception) == ("misconception", key), (variant, result)
        assert f"`{component}`" in result.message


def test_12_5_10_ignoring_checkpoint_and_weights_only_named_in_every_variant():
    from course_utils import checkpoint

    def ignores(run_factory, checkpoint_path):
        checkpoint.load_checkpoint(checkpoint_path)  # прочитала — и не загрузила
        return run_factory()

    def weights(run_factory, checkpoint_path):
        run = run_factory()
        run.load_weights_only(checkpoint.load_checkpoint(checkpoint_path))
        return run

    def drop(run_factory, checkpoint_path):
        run = run_factory()
        run.load_state_dict(checkpoint.load_checkpoint(checkpoint_path), queue="drop")
        return run

    cases = [(ignores, "ignores_checkpoint"), (weights, "weights_only"),
             (checkpoint.resume_weights_only, "weights_only"), (drop, "forgot_queue")]  # fmt: skip
    for variant in ALL:
        for fn, key in cases:
            result = grading.evaluate("12.5.10", fn, variant)
            assert result.misconception == key, (variant, key, result)


def test_12_5_10_endless_loop_stopped_and_ctrl_c_reported(monkeypatch):
    import dataclasses
    import time

    def endless(run_factory, checkpoint_path):
        while True:
            pass

    def ctrl_c(run_factory, checkpoint_path):
        raise KeyboardInterrupt

    ex, deadline = _ex("12.5.10"), 5.0  # срок шага (60 с) укорочен: механизм останова тот же
    short = dataclasses.replace(ex, answer=dataclasses.replace(ex.answer, deadline_s=deadline))
    monkeypatch.setitem(grading._registry, "12.5.10", short)
    start = time.perf_counter()
    result = grading.evaluate("12.5.10", endless)
    assert time.perf_counter() - start < deadline + 10  # + подготовка аварийного запуска (~3 с)
    assert (
        result.status == "wrong"
        and "не завершилась" in result.message
        and CYRILLIC.search(result.message)
    )
    result = grading.check("12.5.10", ctrl_c)  # не пробрасывается в ячейку
    assert result.status == "not_attempted" and "прервана" in result.message


def test_12_5_10_broken_functions_get_feedback():
    from course_utils import checkpoint

    def boom(run_factory, checkpoint_path):
        raise RuntimeError("диск недоступен")

    def nothing(run_factory, checkpoint_path):
        run = run_factory()
        run.load_state_dict(checkpoint.load_checkpoint(checkpoint_path))

    def two_missing(run_factory, checkpoint_path):
        run = run_factory()
        state = checkpoint.load_checkpoint(checkpoint_path)
        fresh = run.state_dict()
        run.load_state_dict({**state, "optimizer": fresh["optimizer"], "rng": fresh["rng"]})
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
    result = grading.evaluate("12.5.10", toy_run.ToyRLRun(0))
    assert result.status == "malformed" and "без скобок" in result.message
    assert grading.evaluate("12.5.10", toy_run.ToyRLRun).status == "malformed"
    result = grading.evaluate("12.5.10", two_missing)
    assert result.status == "wrong" and "расходится на шаге" in result.message
    assert "optimizer —" in result.message and "rng —" in result.message
    result = grading.evaluate("12.5.10", broken_run)
    assert result.status == "wrong" and "после восстановления" in result.message


def test_12_5_10_solution_shows_every_mistake():
    task = grading.task("12.5.10", 2)
    text = _ex("12.5.10").solution(task)
    assert "совпадает на всех" in text and text.count("| расходится на шаге") == 12
    for label in (
        "`rng`",
        "`data_cursor`",
        "`versions`",
        "`curriculum`",
        'queue="drop"',
        "load_weights_only",
    ):
        assert label in text


def _accept_by_hand(batch, expected, current):
    ids = [r["rollout_id"] for r in batch]
    return (sorted(ids) == sorted(expected) and len(set(ids)) == len(ids)
            and all(isinstance(r["reward"], float) for r in batch)
            and {r["verifier_version"] for r in batch} == {current})  # fmt: skip


def _no_dup_check(batch, expected, current):
    return (set(r["rollout_id"] for r in batch) == set(expected)
            and all(isinstance(r["reward"], float) for r in batch)
            and {r["verifier_version"] for r in batch} == {current})  # fmt: skip


def _scored_part(batch, expected, current):
    """Берёт «оценённую часть»: пропавшие роллауты и роллауты без награды не мешают."""
    ids = [r["rollout_id"] for r in batch]
    scored = [r for r in batch if r["reward"] is not None]
    return (set(ids) <= set(expected) and len(set(ids)) == len(ids)
            and all(r["verifier_version"] == current for r in scored))  # fmt: skip


def _one_version(batch, expected, current):
    """Проверяет, что версия верификатора одна на пакет, но не что она текущая."""
    ids = [r["rollout_id"] for r in batch]
    return (sorted(ids) == sorted(expected) and len(set(ids)) == len(ids)
            and all(isinstance(r["reward"], float) for r in batch)
            and len({r["verifier_version"] for r in batch}) == 1)  # fmt: skip


def _no_version_check(batch, expected, current):
    ids = [r["rollout_id"] for r in batch]
    return sorted(ids) == sorted(expected) and all(isinstance(r["reward"], float) for r in batch)


def _one_policy(batch, expected, current):
    return (
        _accept_by_hand(batch, expected, current) and len({r["policy_version"] for r in batch}) == 1
    )


def _kind_by_hand(batch, current):
    """Вид пакета по его данным, независимо от генератора (порядок — как у причин отказа)."""
    rows, expected = batch["rollouts"], batch["expected_ids"]
    ids = [r["rollout_id"] for r in rows]
    verifiers = {r["verifier_version"] for r in rows}
    if set(ids) - set(expected):
        return "foreign"
    if len(set(ids)) != len(ids):
        return "duplicate"
    if set(expected) - set(ids):
        return "missing_rollouts"
    if not all(isinstance(r["reward"], float) for r in rows):
        return "missing_reward"
    if current not in verifiers:
        return "old_verifier"
    if verifiers != {current}:
        return "mixed_verifier"
    return "policy_mixed" if len({r["policy_version"] for r in rows}) > 1 else "complete"


def test_12_5_11_hidden_batches_cover_every_kind():
    from course_utils.exercises.lesson_12_5 import atomic_batches as ab

    for variant in ALL:
        task = grading.task("12.5.11", variant)
        hidden = ab._hidden_batches(task)
        kinds = [_kind_by_hand(b, task["verifier_version"]) for b in hidden]
        assert kinds == [b["kind"] for b in hidden], variant  # метка генератора = данные пакета
        assert set(kinds) == set(ab.BATCH_KINDS)
        assert not any(b["batch_id"] in task["statement"] for b in hidden)  # скрытые


def test_12_5_11_hand_written_functions_in_every_variant():
    cases = [(_accept_by_hand, None), (_no_dup_check, "accept_duplicates"),
             (_scored_part, "accept_partial"), (_one_version, "accept_old_verifier"),
             (_no_version_check, "accept_old_verifier"), (_one_policy, "reject_all_on_version_change")]  # fmt: skip
    code = (
        _ex("12.5.11")
        .solution(grading.task("12.5.11", 0))
        .split("```python\n", 1)[1]
        .split("```")[0]
    )
    scope = {}
    exec(code, scope)
    cases.append((scope["accept"], None))
    for variant in ALL:
        for fn, key in cases:
            result = grading.evaluate("12.5.11", fn, variant)
            expected = ("correct", None) if key is None else ("misconception", key)
            assert (result.status, result.misconception) == expected, (variant, fn.__name__, result)


def test_12_5_11_forms_and_feedback():

    task = grading.task("12.5.11", 1)
    assert grading.evaluate("12.5.11", crash_test.accept_batch, 1)
    ex = task["example"]
    assert bool(
        crash_test.accept_batch(ex["rollouts"], ex["expected_ids"], task["verifier_version"])
    )
    assert grading.evaluate("12.5.11", {"b0001": "accept"}, 1).status == "malformed"
    result = grading.evaluate("12.5.11", lambda batch: True, 1)
    assert result.status == "malformed" and "3" in result.message
    result = grading.evaluate("12.5.11", lambda b, e, v: 1 / 0, 1)
    assert result.status == "wrong" and "ZeroDivisionError" in result.message
    result = grading.evaluate("12.5.11", lambda b, e, v: True, 1)
    assert result.status == "wrong" and "Верно решено скрытых пакетов" in result.message


@pytest.mark.parametrize("variant", range(8))
def test_12_5_12_reference_matches_choose_stacks(variant):
    import datetime as dt

    from course_utils import stack_map

    task, ref = grading.task("12.5.12", variant), grading._reference("12.5.12", variant)
    frame = stack_map.load_stack_map()
    today = dt.date.fromisoformat(task["today"])
    assert today == max(frame["snapshot_date"])
    strict = stack_map.choose_stacks(frame, **task["requirements"], today=today)
    assert ref == list(strict.loc[strict["matches"], "stack"]) and ref
    loose = stack_map.choose_stacks(frame, **task["requirements"], today=today,
                                    include_unconfirmed=True)  # fmt: skip
    speed = stack_map.load_speedups()
    top = speed.loc[speed["speedup_high"].idxmax(), "stack"]
    assert set(ref) < set(loose.loc[loose["matches"], "stack"])  # в каждом варианте
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

    task, ref = grading.task("12.5.12", variant), grading._reference("12.5.12", variant)
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

    task, ref = grading.task("12.5.13", variant), grading._reference("12.5.13", variant)
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
                                 ("normalizer", ck["running_reward_norm"])) if not on]  # fmt: skip
    table = guarantees.preflight({"checkpoint_components": declared,
                                  "crash_tested": ck["crash_tested"]})  # fmt: skip
    row = table[table["гарантия"].str.startswith("6.")].iloc[0]
    assert bool(row["выполнена"]) == (ref["recovery_gaps"] == [])
    for comp in ref["recovery_gaps"]:
        if comp != "crash_test":
            assert f"не хранит {comp}" in row["чего не хватает"]
    assert ("crash_test" in ref["recovery_gaps"]) is (not ck["crash_tested"])
    assert ref["staleness_risk"] == "высокий" and "crash_test" in ref["recovery_gaps"]
    assert len(ref["recovery_gaps"]) >= 2


def test_12_5_13_variety():
    refs = [grading._reference("12.5.13", v) for v in range(16)]
    # генерация не бывает узким местом: тогда у неё же больше всего работы и off_critical_path
    # совпал бы с верным; риск всегда высокий, crash_test всегда нужен — иначе ловушки не держатся
    assert {r["bottleneck"] for r in refs} == {"reward", "ref_logprob", "training", "weight_sync"}
    assert {r["memory_fits"] for r in refs} == {True, False}
    assert {len(r["recovery_gaps"]) for r in refs} >= {2, 3, 4}


@pytest.mark.parametrize("variant", VARIANTS)
def test_12_5_13_forms_and_misconceptions(variant):
    task, ref = grading.task("12.5.13", variant), grading._reference("12.5.13", variant)
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


def test_12_5_12_hand_built_mistakes_in_every_variant():
    import datetime as dt

    frame, speed = stack_map.load_stack_map(), stack_map.load_speedups()
    top = speed.loc[speed["speedup_high"].idxmax(), "stack"]
    for variant in ALL:
        task = grading.task("12.5.12", variant)
        loose = stack_map.choose_stacks(frame, **task["requirements"], include_unconfirmed=True,
                                        today=dt.date.fromisoformat(task["today"]))  # fmt: skip
        result = grading.evaluate("12.5.12", list(loose.loc[loose["matches"], "stack"]), variant)
        assert result.misconception == "unconfirmed_as_fact", (variant, result)
        assert grading.evaluate("12.5.12", [top], variant).misconception == "fastest_number", (
            variant
        )


def test_12_5_13_hand_built_mistakes_in_every_variant():
    from course_utils import memory

    for variant in ALL:
        task, ref = grading.task("12.5.13", variant), grading._reference("12.5.13", variant)
        work = {}
        for r in task["stages"]:
            work[r["stage"]] = work.get(r["stage"], 0.0) + r["end_s"] - r["start_s"]
        mem = task["memory"]
        shape = memory.ModelShape.from_name(mem["model"])
        n, d, z = shape.num_params, mem["world_size"], mem["zero_stage"]
        state16 = (
            2 * n / (d if z >= 3 else 1)
            + 2 * n / (d if z >= 2 else 1)
            + 12 * n / (d if z >= 1 else 1)
        )
        kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * mem["sequences"] * mem["tokens_per_sequence"] * 2  # fmt: skip
        fits16 = state16 + kv + mem["reserve_gib"] * 2**30 <= mem["gpu_gb"] * 10**9
        q = task["queue"]
        mean_lag = sum(x["lag"] * x["rollouts"] for x in q["lag_counts"]) / sum(x["rollouts"] for x in q["lag_counts"])  # fmt: skip
        mean_ess = sum(b["ess"] / b["n"] for b in q["batches"]) / len(q["batches"])
        by_mean = "высокий" if mean_lag > q["max_lag"] or mean_ess < 0.5 else "низкий"
        cases = {"off_critical_path": {"bottleneck": max(work, key=work.get)},
                 "sixteen_bytes": {"memory_fits": fits16}, "staleness_by_mean": {"staleness_risk": by_mean},
                 "weights_only_ok": {"recovery_gaps": []},
                 "no_crash_test": {"recovery_gaps": [c for c in ref["recovery_gaps"] if c != "crash_test"]}}  # fmt: skip
        for key, change in cases.items():
            result = grading.evaluate("12.5.13", {**ref, **change}, variant)
            assert result.misconception == key, (variant, key, result)


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
    assert f"{fmt.num(n)} параметров" in statement and f"{n:,}" not in statement
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
