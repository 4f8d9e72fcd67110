"""Общие помощники тестов проверочных шагов (не тесты: pytest их не собирает)."""

import math
import re

from course_utils import grading

CYRILLIC = re.compile(r"[а-яё]", re.IGNORECASE)


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
