"""Общие помощники модулей упражнений: семейства типичных ошибок и нормализация ответов.

Семейство (``Family``/``CodeFamily``) — канонический неверный ответ вместе с правилом
``accepts(given)``, которое узнаёт ту же ошибку в ином виде (другой порядок, другие
незатронутые ключи). Нормализация строк совпадает с ``grading.answers_match``: без лишних
пробелов, без регистра, «ё» → «е».
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from course_utils.grading import _plain, answers_match

__all__ = [
    "CodeFamily",
    "Family",
    "family_compare",
    "get_key",
    "is_num",
    "norm",
    "norm_dict",
    "plain",
]


def plain(x: Any) -> Any:
    """numpy / torch / pandas → встроенные числа и списки Python (то же, что в grading)."""
    return _plain(x)


class Family(dict):
    """Канонический неверный ответ (словарь) + ``accepts(given)``: узнаёт ту же ошибку в ином виде."""

    def __init__(self, canonical: Mapping, accepts: Callable[[Any], bool]):
        super().__init__(canonical)
        self.accepts = accepts


class CodeFamily(list):
    """То же для ответа-списка (например, кодов нарушений)."""

    def __init__(self, canonical: list, accepts: Callable[[Any], bool]):
        super().__init__(canonical)
        self.accepts = accepts


def family_compare(expected: Any, given: Any, rtol: float) -> bool:
    """Сравнение для Exercise.compare: как answers_match; для семейства ошибок ещё и его правило."""
    if answers_match(dict(expected) if isinstance(expected, Family) else expected, given, rtol):
        return True
    return isinstance(expected, Family) and bool(expected.accepts(given))


def norm(x: Any) -> Any:
    """Строка без лишних пробелов, без регистра, «ё» → «е»; не строка — как есть."""
    return " ".join(x.split()).casefold().replace("ё", "е") if isinstance(x, str) else x


def norm_dict(given: Any) -> dict | None:
    """Словарь с нормализованными строковыми ключами или None, если ответ не такой."""
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        return None
    return {norm(k): v for k, v in given.items()}


def get_key(given: Any, key: str) -> Any:
    """Значение ответа по ключу (без учёта регистра); None, если ключа нет."""
    g = norm_dict(given)
    return None if g is None else g.get(norm(key))


def is_num(x: Any) -> bool:
    """Конечное число (не bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
