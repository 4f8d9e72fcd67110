"""Самопроверка всех зарегистрированных проверочных шагов (всех уроков, нынешних и будущих).

Для каждого упражнения и вариантов 0..3: верный ответ проходит, каждая типичная ошибка узнаётся
своим ключом, заглушка — «ещё не решено», мусор даёт отзыв без исключения, new_variant меняет
числа, условие детерминировано и сериализуется в JSON, разбор — русский Markdown с числами задачи.
Отдельные проверки шагов — в test_exercises_<урок>.py.
"""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from exercise_helpers import CYRILLIC, _data, _ex, _leaves, _renderings

from course_utils import exercises, grading
from course_utils.exercises.answers import Fields
from course_utils.grading import ____

REPO = Path(__file__).resolve().parents[1]
IDS = grading.exercise_ids()
VARIANTS = range(4)
# Упражнения, чьи условия по делу содержат не-JSON объекты (таблицы pandas и т. п.); пока нет.
NOT_JSON = {"12.5.10", "12.5.11"}  # ответы — функции resume и accept: через JSON не переписать


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
    ref = grading._reference(exercise_id, variant)
    result = grading.evaluate(exercise_id, ref, variant)
    assert result.status == "correct" and result, result
    assert grading.evaluate(exercise_id, copy.deepcopy(ref), variant)
    if exercise_id not in NOT_JSON:  # ответ, переписанный руками (через JSON), тоже верен
        assert grading.evaluate(exercise_id, json.loads(json.dumps(ref)), variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("exercise_id", IDS)
def test_each_misconception_recognised(exercise_id, variant):
    task = grading.task(exercise_id, variant)
    messages = set()
    for m in grading.misconceptions(exercise_id):
        result = grading.evaluate(exercise_id, m.answer(task), variant)
        assert result.status == "misconception" and not result, (m.key, result)  # и не «верно»
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
    assert grading.check(exercise_id, grading._reference(exercise_id, 1))
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


# ---------------------------------------------------------------- ловушки держатся во всех вариантах
TRAP_VARIANTS = range(50)


@pytest.mark.parametrize("exercise_id", IDS)
def test_traps_hold_in_variants_0_49(exercise_id):
    """В каждом варианте 0–49 верный ответ верен, а ответ каждой типичной ошибки узнаётся ею."""
    failures = []
    for variant in TRAP_VARIANTS:
        task = grading.task(exercise_id, variant)
        ref = _ex(exercise_id).reference(task)
        got = grading.evaluate(exercise_id, ref, variant)
        if got.status != "correct":
            failures.append(f"вариант {variant}: верный ответ → {got.status}: {got.message}")
        for m in grading.misconceptions(exercise_id):
            got = grading.evaluate(exercise_id, m.answer(copy.deepcopy(task)), variant)
            if (got.status, got.misconception) != ("misconception", m.key):
                failures.append(f"вариант {variant}: {m.key} → {got.status} {got.misconception}")
    assert not failures, f"{exercise_id}: {len(failures)} сбоев:\n" + "\n".join(failures[:20])


# ---------------------------------------------------------------- условия и ячейки ноутбуков
NOTEBOOKS = sorted((REPO / "notebooks").glob("12_*.ipynb"))


def _code_cells(lesson):
    path = next(p for p in NOTEBOOKS if p.name.startswith(lesson.replace(".", "_") + "_"))
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _var(exercise_id):
    return "task_" + exercise_id.replace(".", "_")


@pytest.mark.parametrize("exercise_id", IDS)
def test_statement_names_notebook_variable(exercise_id):
    """Условие называет переменную ноутбука task_12_x_y, а не task[...] (в 12.3 task — другое)."""
    for variant in range(8):
        statement = grading.task(exercise_id, variant)["statement"]
        assert not re.search(r"\btask\s*\[", statement), (exercise_id, variant)
        if "[" in statement and re.search(r"\b\w+\[['\"]", statement):
            assert _var(exercise_id) + "[" in statement, (exercise_id, variant)


@pytest.mark.parametrize("exercise_id", IDS)
def test_notebook_binds_task_and_answer_skeleton(exercise_id):
    """Ноутбук связывает task_12_x_y и проверяет answer_12_x_y; у словаря — заготовка с ____."""
    lesson = ".".join(exercise_id.split(".")[:2])
    cells, name = _code_cells(lesson), exercise_id.replace(".", "_")
    assert any(f'{_var(exercise_id)} = grading.task("{exercise_id}")' in c for c in cells)
    answer = [c for c in cells if f'grading.check("{exercise_id}", answer_{name})' in c]
    assert len(answer) == 1, f"{exercise_id}: нет одной ячейки ответа answer_{name}"
    schema = exercises.STEPS[exercise_id].answer
    if isinstance(schema, Fields):
        for key in schema.fields:
            assert re.search(rf'"{re.escape(key)}":\s*\{{?\s*_*', answer[0]), (exercise_id, key)
        assert "____" in answer[0]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:4])
def test_lesson_ends_with_progress(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]).strip() for c in cells if c["cell_type"] == "code"]
    assert code[-1] == "grading.progress()"


def test_first_lesson_shows_hint_and_new_variant_once():
    cells = "\n".join(_code_cells("12.1"))
    assert cells.count("grading.hint(") == 1 and cells.count("grading.new_variant(") == 1
