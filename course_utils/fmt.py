"""Числа и слова по-русски для всего, что читает студент.

``num(494032768)`` → ``"494 032 768"``: разряды разделены неразрывным пробелом (U+00A0), а не
запятой, которая по-русски читается как десятичный знак. ``count(53, "группа", "группы",
"групп")`` → ``"53 группы"``: форма слова по правилу русских числительных.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from course_utils.args import integer

NBSP = "\u00a0"  # неразрывный пробел: разделитель разрядов и пробел перед единицей


def num(x: Any, decimals: int = 0) -> str:
    """Число с разрядами через неразрывный пробел: 131072 → "131 072", 4.6449 (2) → "4.64".

    Целые (и float с целым значением при decimals=0) — без дробной части; NaN → "—".
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"x должно быть числом, получено {x!r}")
    integer("decimals", decimals, 0, strict=True)
    if isinstance(x, float) and math.isnan(x):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    text = f"{x:,.{decimals}f}" if decimals or not isinstance(x, numbers.Integral) else f"{x:,}"
    return text.replace(",", NBSP).replace("-", "−")


def plural(n: Any, one: str, few: str, many: str) -> str:
    """Форма слова для целого n: 1 группа, 2 группы, 5 групп, 11 групп, 21 группа, 104 группы."""
    n = abs(int(n))
    if n % 10 == 1 and n % 100 != 11:
        return one
    if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
        return few
    return many


def count(n: Any, one: str, few: str, many: str) -> str:
    """Число и слово в нужной форме: count(53, "группа", "группы", "групп") → "53 группы"."""
    return f"{num(int(n))}{NBSP}{plural(n, one, few, many)}"


def listing(items: Any, show=str, limit: int = 5) -> str:
    """Первые limit элементов через запятую и «… (всего N)», если их больше: "3, 7 … (всего 12)"."""
    items = list(items)
    text = ", ".join(map(show, items[:limit]))
    return text + (f" … (всего {len(items)})" if len(items) > limit else "")


def short(x: Any, width: int = 60) -> str:
    """repr(x) для сообщения об ошибке: не длиннее width символов (обрезка — «…»)."""
    try:
        text = repr(x)
    except Exception:
        text = type(x).__name__
    return text if len(text) <= width else text[: width - 1] + "…"
