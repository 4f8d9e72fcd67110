"""Проверки аргументов на границе публичных функций: одна строка на аргумент.

Каждая функция возвращает приведённое значение или бросает ``ValueError`` с русским текстом,
в котором названы аргумент, допустимый диапазон и полученное значение. Счётчики принимают
и целые float (``7.5e9`` — так пишут 7,5 млрд), но не ``True``/``False`` и не 2.5.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any


def is_int(x: Any) -> bool:
    """Целое число (int, numpy-целое), но не bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """Вещественное число, в том числе inf и nan (int, float, numpy-скаляр), но не bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_real(x: Any) -> bool:
    """Конечное вещественное число (int, float, numpy-скаляр), но не bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x: Any) -> bool:
    """Целое число или float с целым значением (7.5e9), но не bool."""
    return is_int(x) or (is_real(x) and float(x).is_integer())


def _range_text(low: Any, high: Any, low_open: bool = False, high_open: bool = False) -> str:
    """« в [low, high]», « ≥ low», « < high» и т. п. (открытая граница — скобка или строгий знак)."""
    if low is not None and high is not None:
        return f" в {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '≥'} {low}"
    if high is not None:
        return f" {'<' if high_open else '≤'} {high}"
    return ""


def integer(
    name: str, value: Any, low: int | None = None, high: int | None = None, *, strict: bool = False
) -> int:
    """Целое low ≤ value ≤ high (границы включены; None — без границы); 7.5e9 → 7 500 000 000.

    strict=True — только значение целого типа (2.0 не принимается: это счётчик, а не измерение)."""
    if (
        not (is_int(value) if strict else _is_count(value))
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        bound = _range_text(low, high)
        raise ValueError(f"{name} должно быть целым{bound}, получено {value!r}")
    return int(value)


def optional_integer(name: str, value: Any, low: int | None = None, high: int | None = None):
    """Как ``integer``, но None разрешён и возвращается как есть."""
    if value is None:
        return None
    try:
        return integer(name, value, low, high)
    except ValueError:
        bound = _range_text(low, high)
        raise ValueError(f"{name} должно быть целым{bound} или None, получено {value!r}") from None


def real(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Конечное число в [low, high] (или в открытых границах при low_open / high_open)."""
    ok = is_real(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo, hi = (None if x is None else f"{x:g}" for x in (low, high))
        bound = _range_text(lo, hi, low_open, high_open)
        raise ValueError(f"{name} должно быть конечным числом{bound}, получено {value!r}")
    return float(value)


def positive(name: str, value: Any) -> float:
    """Конечное число > 0."""
    return real(name, value, 0.0, low_open=True)


def nonnegative(name: str, value: Any) -> float:
    """Конечное число ≥ 0."""
    return real(name, value, 0.0)


def fraction(name: str, value: Any) -> float:
    """Доля в [0, 1]."""
    return real(name, value, 0.0, 1.0)


def flag(name: str, value: Any) -> bool:
    """True или False (не 0/1 и не строка)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} должно быть True или False, получено {value!r}")
    return value


def text(name: str, value: Any) -> str:
    """Непустая строка (не из одних пробелов)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} должно быть непустой строкой, получено {value!r}")
    return value


def choice(name: str, value: Any, allowed) -> Any:
    """Одно из допустимых значений allowed (сравнение ==)."""
    allowed = tuple(allowed)
    if isinstance(value, bool) or value not in allowed:
        raise ValueError(f"{name} должно быть одним из {allowed}, получено {value!r}")
    return value


def path(name: str, value: Any) -> Path:
    """Непустой путь (str или os.PathLike) → Path."""
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ValueError(f"{name} должно быть путём (str или Path), получено {value!r}")
    return Path(value)
