"""Проверочный шаг как данные: ``STEP = Step(...)`` — условие, решатель, схема ответа, ошибки.

Форма, сравнение и отзыв берутся из схемы ответа (``answers``). Типичная ошибка ``Trap`` — ключ,
сообщение и неверный ответ: целиком (``wrong(task, ref)``) или заменой части верного словаря
(``override``), тогда она узнаётся по совпадению заменённых значений; ``by`` — ключи, по любому из
которых она узнаётся; ``matches(task, given)`` — своё правило."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from course_utils.exercises.answers import AnswerType, Fields, get
from course_utils.grading import Exercise, Misconception


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

    def exercise(self) -> Exercise:
        """Запись для grading.register: форма, сравнение и отзыв — из схемы ответа."""
        return Exercise(
            id=self.id,
            make_task=self.make_task,
            reference=self.solve,
            solution=lambda task: self.solution(task, self.solve(task)),
            hint=self.hint,
            misconceptions=[
                Misconception(t.key, t.message, partial(self._wrong, t), partial(self._accepts, t))
                for t in self.traps
            ],
            answer=self.answer,
        )

    def _wrong(self, trap: Trap, task: dict) -> Any:
        return trap.answer(task, self.solve(task))

    def _accepts(self, trap: Trap, task: dict, given: Any) -> bool:
        """Узнаёт ошибку по итогу ответа: правило ``matches``; у словаря с ``by`` или ``override`` —
        совпадение любого из ключей by (всех ключей override); иначе — итог её ответа целиком."""
        if trap.matches is not None:
            return trap.matches(task, given)
        if isinstance(self.answer, Fields) and (trap.override is not None or trap.by):
            wrong, fields = self._wrong(trap, task), self.answer.fields
            hits = (fields[k].same(get(wrong, k), get(given, k)) for k in trap.by or trap.override)
            return any(hits) if trap.by else all(hits)
        return self.answer.same(self.answer.outcome(self._wrong(trap, task), task), given)
