"""Проверочный шаг как данные: ``STEP = Step(...)`` — условие, решатель, схема ответа, ошибки.

Форма, сравнение и отзыв берутся из схемы ответа (``answers``). Типичная ошибка ``Trap`` — ключ,
сообщение и неверный ответ: целиком (``wrong(task, ref)``) или заменой части верного словаря
(``override``), тогда она узнаётся по совпадению заменённых значений; ``by`` — ключи, по любому из
которых она узнаётся; ``matches(task, given)`` — своё правило."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from course_utils.exercises.answers import AnswerType, Fields, Function, get
from course_utils.grading import COURSE_STEPS, Exercise, Misconception

__all__ = ["Step", "Trap"]


@dataclass(frozen=True)
class Trap:
    """Типичная ошибка: ключ, сообщение и ровно одно из ``wrong`` и ``override``."""

    key: str
    message: str
    wrong: Callable[[dict, Any], Any] | None = None
    override: Mapping[str, Callable[[dict], Any]] | None = None
    matches: Callable[[dict, Any], bool] | None = None
    by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.wrong is None) == (self.override is None):
            raise ValueError(f"Trap {self.key}: нужен ровно один из wrong и override")

    def answer(self, task: dict, ref: Any) -> Any:
        """Канонический ответ с этой ошибкой."""
        if self.wrong is not None:
            return self.wrong(task, ref)
        return {**ref, **{k: make(task) for k, make in self.override.items()}}


@dataclass(frozen=True)
class Step:
    """``make_task(variant)`` → dict со ``statement``; ``solve(task)`` → верный ответ; ``solution(task,
    ref)`` → разбор в Markdown; ``answer`` — схема; ``traps`` — ошибки в порядке проверки."""

    id: str
    make_task: Callable[[int], dict]
    solve: Callable[[dict], Any]
    answer: AnswerType
    hint: str
    solution: Callable[[dict, Any], str]
    traps: tuple[Trap, ...] = ()

    def _accepts(self, trap: Trap) -> Callable[[dict, Any], bool] | None:
        """Правило, узнающее ошибку в ином виде; None — сравнить итоги с каноническим ответом."""
        if trap.matches is not None:
            return trap.matches
        if not isinstance(self.answer, Fields) or (trap.override is None and not trap.by):
            return None
        fields, keys = self.answer.fields, trap.by or tuple(trap.override)

        def accepts(task: dict, given: Any) -> bool:
            wrong = trap.answer(task, self.solve(task))
            hits = (fields[k].same(get(wrong, k), get(given, k)) for k in keys)
            return any(hits) if trap.by else all(hits)

        return accepts

    def _canonical(self, trap: Trap) -> Callable[[dict], Any]:
        return lambda task: trap.answer(task, self.solve(task))

    def exercise(self) -> Exercise:
        """Exercise для grading.register: форма, сравнение и отзыв — из схемы ответа."""
        schema = self.answer
        return Exercise(
            id=self.id,
            title=COURSE_STEPS.get(self.id, self.id),
            make_task=self.make_task,
            reference=self.solve,
            solution=lambda task: self.solution(task, self.solve(task)),
            hint=self.hint,
            misconceptions=[
                Misconception(t.key, t.message, self._canonical(t), self._accepts(t))
                for t in self.traps
            ],
            compare=lambda expected, given, rtol: schema.same(expected, given),
            validate_answer=lambda answer, task: schema.problem(answer, task),
            describe_mismatch=lambda expected, given, task: schema.mismatch(expected, given),
            outcome=schema.outcome if isinstance(schema, Function) else None,
        )
