"""Общие типы ответов и шаг как данные: форма, сравнение, отзыв, ограничение времени функции."""

import threading
import time

import numpy as np
import pytest

from course_utils import grading
from course_utils.exercises.answers import (
    Bool,
    Choice,
    Fields,
    Function,
    IdSet,
    Keyed,
    Number,
    Numbers,
    Share,
    call_with_deadline,
    md_table,
    sig,
)  # fmt: skip
from course_utils.exercises.step import Step, Trap
from course_utils.grading import AnswerError


@pytest.fixture
def registry(monkeypatch):
    """Пустой временный реестр вместо шагов курса."""
    grading.exercise_ids()  # шаги курса уже зарегистрированы и во временный реестр не попадут
    monkeypatch.setattr(grading, "_registry", {})


def _endless(x):
    while True:
        pass


def _stubborn(x):
    """Ловит Exception в цикле: останов по времени всё равно срабатывает (он не Exception)."""
    while True:
        try:
            while True:
                pass
        except Exception:
            pass


@pytest.mark.parametrize("fn", [_endless, _stubborn, lambda x: time.sleep(60)])
def test_deadline_stops_endless_function(fn):
    start = time.monotonic()
    with pytest.raises(AnswerError) as caught:
        call_with_deadline(fn, (1,), 0.3, "resume(run_factory, checkpoint_path)")
    assert time.monotonic() - start < 5
    assert caught.value.status == "wrong" and "не завершилась за 0.3 с" in caught.value.message


def test_deadline_outside_main_thread_frees_the_caller():
    out = {}

    def worker():
        start = time.monotonic()
        try:
            call_with_deadline(_endless, (1,), 0.3)
        except AnswerError as exc:
            out["status"], out["s"] = exc.status, time.monotonic() - start

    before = threading.active_count()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert out["status"] == "wrong" and out["s"] < 5
    # поток с бесконечным циклом остановлен, а не брошен крутиться (он отнимал бы GIL у всего)
    assert threading.active_count() == before


def test_keyboard_interrupt_and_errors_become_feedback():
    def interrupted(x):
        raise KeyboardInterrupt

    with pytest.raises(AnswerError) as caught:
        call_with_deadline(interrupted, (1,), 5, "f(x)")
    assert caught.value.status == "not_attempted" and "прервана" in caught.value.message
    with pytest.raises(AnswerError) as caught:
        call_with_deadline(lambda x: 1 / x, (0,), 5, "f(x)")
    assert "ZeroDivisionError" in caught.value.message
    assert call_with_deadline(lambda x: x + 1, (1,), 5) == 2


def test_number_share_bool_choice():
    n = Number(rtol=1e-3, unit="ГиБ", integer=False)
    assert n.problem("3", {}).startswith("Ожидается число (ГиБ)")
    assert "NaN" in n.problem(float("nan"), {}) and n.problem(True, {})
    assert n.same(100.0, np.float64(100.05)) and not n.same(100.0, 100.2)
    assert "2³⁰/10⁹" in n.mismatch(1.0, 2**30 / 10**9)
    assert "целое" in Number(integer=True).problem(2.5, {}) and not Number(integer=True).problem(
        3.0, {}
    )
    assert "похоже на проценты" in Share().problem(35, {}) and Share().problem(0.35, {}) is None
    assert Bool().problem(1, {}) and Bool().same(True, np.bool_(True))
    c = Choice(("высокий", "низкий"))
    assert (
        c.problem("  Высокии ", {})
        and c.problem("ВЫСОКИЙ", {}) is None
        and c.same("высокий", "Высокий")
    )


def test_fields_idset_keyed_forms_and_feedback():
    f = Fields({"a": Number(), "ok": Bool()})
    assert "ожидается словарь" in f.problem([1], {}).lower()
    assert "не хватает — ok" in f.problem({"a": 1}, {}) and "лишние — b" in f.problem(
        {"a": 1, "ok": True, "b": 2}, {}
    )
    assert f.problem({"A": 1, "ok": "да"}, {}).startswith("ok: Ожидается True или False")
    assert f.mismatch({"a": 1, "ok": True}, {"A": 2, "ok": True}).startswith("Неверно значение a.")
    ids = IdSet(lambda t: ["r1", "r2", "r3"], noun="роллаутов")
    assert "r9" in ids.problem(["r1", "r9"], {}) and "повтор" in ids.problem(["r1", "R1"], {})
    assert ids.same({"r1", "r2"}, ["R2", "r1"]) and ids.mismatch(["r1", "r2"], ["r1", "r3"]) == (
        "Не хватает роллаутов: 1, лишних: 1.")  # fmt: skip
    k = Keyed(lambda t: ["A", "B"], Bool())
    assert "не хватает: B" in k.problem({"A": True}, {}) and k.problem({"A": True, "B": 1}, {})
    assert not k.same({"A": True, "B": False}, {"A": True, "B": True})


def test_numpy_and_torch_answers_become_python_values():
    assert Number().same(2.0, np.float32(2.0)) and Number().same(1.5, np.array(1.5))
    assert Number(integer=True).problem(np.int64(7), {}) is None
    assert Numbers().problem(np.array([1.0, 2.0]), {}) is None
    assert not Numbers().same([1.0, 2.0], np.array([1.0, 2.5]))
    assert Bool().problem(np.bool_(True), {}) is None and Bool().same(True, np.bool_(True))
    assert IdSet(lambda t: [1, 2]).same({1, 2}, np.array([2, 1]))
    torch = pytest.importorskip("torch")
    assert Number().same(0.25, torch.tensor(0.25))
    assert Numbers().same([1, 2], torch.tensor([1, 2]))


def test_formatting():
    assert sig(131072) == "131\u00a0072" and sig(0.123456) == "0.1235" and sig(-2.5) == "−2.5"
    assert md_table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def _toy_step(answer=None, traps=()):
    return Step(
        id="t.step", make_task=lambda v: {"statement": "s", "x": 2 + v},
        solve=lambda t: {"double": 2 * t["x"], "square": t["x"] ** 2},
        answer=answer or Fields({"double": Number(integer=True), "square": Number(integer=True)}),
        hint="h", solution=lambda t, ref: f"ответ {ref}", traps=traps,
    )  # fmt: skip


def test_override_trap_is_recognised_in_other_forms(registry):
    trap = Trap("plus", "Сложили вместо умножения.", override={"double": lambda t: t["x"] + 2})
    grading.register(_toy_step(traps=(trap,)).exercise())
    # вариант 1: x = 3 → верно {6, 9}; ошибка «plus» даёт double = 5, и square тут неважен
    assert grading.evaluate("t.step", {"double": 6, "square": 9}, 1).status == "correct"
    for other_square in (9, 10):
        got = grading.evaluate("t.step", {"double": 5, "square": other_square}, 1)
        assert (got.status, got.misconception) == ("misconception", "plus")
    got = grading.evaluate("t.step", {"double": 7, "square": 9}, 1)
    assert (
        got.status == "wrong"
        and got.message.startswith("Неверно значение double.")
        and "17 %" in got.message
    )
    assert grading.evaluate("t.step", {"double": 6}, 1).status == "malformed"


def test_function_answer_runs_under_deadline_and_compares_outcomes(registry):
    schema = Function(run=lambda fn, t: {str(x): fn(x) for x in t["cases"]},
                      result=Keyed(lambda t: [str(x) for x in t["cases"]], Number()),
                      signature="f(x)", deadline_s=0.5)  # fmt: skip
    step = Step(id="t.fn", make_task=lambda v: {"statement": "s", "cases": [1, 2, 3 + v]},
                solve=lambda t: (lambda x: x * x), answer=schema, hint="", solution=lambda t, r: "",
                traps=(Trap("double", "Удвоили вместо квадрата.", wrong=lambda t, r: (lambda x: 2 * x)),))  # fmt: skip
    grading.register(step.exercise())
    assert grading.evaluate("t.fn", lambda x: x**2, 0).status == "correct"
    got = grading.evaluate("t.fn", lambda y: y + y, 0)
    assert (got.status, got.misconception) == ("misconception", "double")
    assert grading.evaluate("t.fn", lambda a, b: a, 0).status == "malformed"
    start = time.monotonic()
    got = grading.evaluate("t.fn", _endless, 0)
    assert got.status == "wrong" and "не завершилась" in got.message
    assert time.monotonic() - start < 5


def test_answer_error_from_run_passes_through():
    def explained(x):
        raise AnswerError("malformed", "resume вернула не ToyRLRun")

    with pytest.raises(AnswerError) as caught:
        call_with_deadline(explained, (1,), 5)
    assert (caught.value.status, caught.value.message) == (
        "malformed",
        "resume вернула не ToyRLRun",
    )
