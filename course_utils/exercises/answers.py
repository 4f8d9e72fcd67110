"""Типы ответов проверочных шагов: форма ответа, сравнение с верным и отзыв — из одной схемы.

Тип ответа знает три вещи: ``problem(given, task)`` — русское сообщение о неверной форме (или
None), ``same(expected, given)`` — совпал ли ответ с верным, ``mismatch(expected, given)`` — чем
ответ отличается, не раскрывая верного значения. ``skeleton()`` — заготовка ячейки ответа с ``____``.
Строки сравниваются без регистра и лишних пробелов, «ё» = «е»; numpy, torch и pandas сводятся к
числам и спискам Python. Здесь же — форматирование чисел и таблиц для разборов и запуск функции
студента с ограничением времени.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from course_utils import fmt
from course_utils.grading import AnswerError, _describe_mismatch, _plain

__all__ = [
    "AnswerType", "Bool", "Choice", "Fields", "Function", "IdSet", "Keyed", "Number", "Share",
    "call_with_deadline", "md_table", "norm", "num",
]  # fmt: skip


def norm(x: Any) -> Any:
    """Строка без лишних пробелов, без регистра, «ё» → «е»; не строка — как есть (после _plain)."""
    x = _plain(x)
    return " ".join(x.split()).casefold().replace("ё", "е") if isinstance(x, str) else x


def _kind(x: Any) -> str:
    x = _plain(x)
    kinds = [(bool, "True/False"), ((int, float), "число"), (str, "строка"), (Mapping, "словарь"),
             ((list, tuple), "список"), ((set, frozenset), "множество"), (type(None), "None")]  # fmt: skip
    if callable(x) and not isinstance(x, type):
        return "функция"
    return next((name for t, name in kinds if isinstance(x, t)), f"объект {type(x).__name__}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class AnswerType:
    """Форма ответа. Подклассы переопределяют problem, same и mismatch."""

    def problem(self, given: Any, task: dict) -> str | None:
        return None

    def same(self, expected: Any, given: Any) -> bool:
        return expected == given

    def mismatch(self, expected: Any, given: Any) -> str:
        return "Ответ не совпал с верным: перечитайте условие, проверьте знак и единицы."

    def skeleton(self) -> str:
        return "____"


@dataclass(frozen=True)
class Number(AnswerType):
    """Число: |given − expected| ≤ rtol·|expected| + atol; ``unit`` — в сообщениях о форме."""

    rtol: float = 1e-3
    unit: str = ""
    integer: bool = False
    atol: float = 1e-9

    def problem(self, given: Any, task: dict) -> str | None:
        g, what = _plain(given), f"число{f' ({self.unit})' if self.unit else ''}"
        if not _is_number(g):
            return f"Ожидается {what}, а получено: {_kind(g)}."
        if not math.isfinite(g):
            return "Ответ — NaN или бесконечность: проверьте деление на ноль и log(0)."
        if self.integer and g != int(g):
            return f"Ожидается целое {what}: {g} — не целое (округлите по условию)."
        return None

    def same(self, expected: Any, given: Any) -> bool:
        e, g = float(_plain(expected)), float(_plain(given))
        return e == g or abs(g - e) <= self.rtol * abs(e) + self.atol

    def mismatch(self, expected: Any, given: Any) -> str:
        return _describe_mismatch(float(_plain(expected)), float(_plain(given)), self.rtol)


@dataclass(frozen=True)
class Share(Number):
    """Доля от 0 до 1 (не проценты)."""

    def problem(self, given: Any, task: dict) -> str | None:
        bad = super().problem(given, task)
        g = _plain(given)
        if bad is None and not 0 <= g <= 1:
            pct = " — похоже на проценты, а нужна доля" if 1 < g <= 100 else ""
            return f"Доля — число от 0 до 1, а получено {g}{pct}."
        return bad


@dataclass(frozen=True)
class Bool(AnswerType):
    """True или False (не 0/1 и не строка)."""

    def problem(self, given: Any, task: dict) -> str | None:
        g = _plain(given)
        return None if isinstance(g, bool) else f"Ожидается True или False, а получено: {_kind(g)}."

    def same(self, expected: Any, given: Any) -> bool:
        return bool(_plain(expected)) is bool(_plain(given))

    def mismatch(self, expected: Any, given: Any) -> str:
        return "Значение True/False не то: перечитайте условие."


def _options(options: Iterable | Callable[[dict], Iterable], task: dict) -> list:
    return list(options(task) if callable(options) else options)


@dataclass(frozen=True)
class Choice(AnswerType):
    """Одна строка из ``options`` (кортеж или функция task → варианты)."""

    options: Any

    def problem(self, given: Any, task: dict) -> str | None:
        allowed = _options(self.options, task)
        if norm(given) in {norm(o) for o in allowed} and isinstance(_plain(given), str):
            return None
        shown = ", ".join(f"«{o}»" for o in allowed)
        return f"Ожидается одна строка из: {shown}; получено: {_short(given)}."

    def same(self, expected: Any, given: Any) -> bool:
        return norm(expected) == norm(given)

    def mismatch(self, expected: Any, given: Any) -> str:
        return "Выбран не тот вариант: перечитайте условие и сверьте расчёт."


def _short(x: Any) -> str:
    try:
        text = repr(_plain(x))
    except Exception:
        text = type(x).__name__
    return text if len(text) <= 60 else text[:59] + "…"


@dataclass(frozen=True)
class IdSet(AnswerType):
    """Набор идентификаторов из ``universe(task)``: список, кортеж или множество; порядок не важен."""

    universe: Callable[[dict], Iterable]
    noun: str = "идентификаторов"

    def problem(self, given: Any, task: dict) -> str | None:
        g = _plain(given)
        if not isinstance(g, (list, tuple, set, frozenset)):
            return f"Ожидается список {self.noun}, а получено: {_kind(g)}."
        known = {norm(u) for u in self.universe(task)}
        unknown = [x for x in g if isinstance(x, bool) or norm(x) not in known]
        if unknown:
            return f"Таких {self.noun} нет в условии: {', '.join(_short(x) for x in unknown[:5])}."
        if len({norm(x) for x in g}) != len(g):
            return f"В списке есть повторы: каждый из {self.noun} — один раз."
        return None

    def same(self, expected: Any, given: Any) -> bool:
        return {norm(x) for x in _plain(expected)} == {norm(x) for x in _plain(given)}

    def mismatch(self, expected: Any, given: Any) -> str:
        e, g = {norm(x) for x in _plain(expected)}, {norm(x) for x in _plain(given)}
        return f"Не хватает {self.noun}: {len(e - g)}, лишних: {len(g - e)}."

    def skeleton(self) -> str:
        return "[____]"


def _by_norm(given: Mapping) -> dict:
    return {norm(k): v for k, v in given.items()}


@dataclass(frozen=True)
class Fields(AnswerType):
    """Словарь с ровно такими ключами; значение каждого ключа — своего типа."""

    fields: Mapping[str, AnswerType]

    def problem(self, given: Any, task: dict) -> str | None:
        keys = ", ".join(self.fields)
        if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
            return f"Ожидается словарь с ключами {keys}; получено: {_kind(given)}."
        g = _by_norm(given)
        missing = [k for k in self.fields if norm(k) not in g]
        extra = [str(k) for k in given if norm(k) not in {norm(f) for f in self.fields}]
        if missing or extra:
            parts = [f"не хватает — {', '.join(missing)}" if missing else "",
                     f"лишние — {', '.join(extra)}" if extra else ""]  # fmt: skip
            return f"Ключи не те ({'; '.join(p for p in parts if p)}). Нужны ровно: {keys}."
        for key, kind in self.fields.items():
            bad = kind.problem(g[norm(key)], task)
            if bad:
                return f"{key}: {bad}"
        return None

    def same(self, expected: Any, given: Any) -> bool:
        e, g = _by_norm(expected), _by_norm(given)
        return all(kind.same(e[norm(k)], g[norm(k)]) for k, kind in self.fields.items())

    def wrong_keys(self, expected: Mapping, given: Mapping) -> list[str]:
        e, g = _by_norm(expected), _by_norm(given)
        return [k for k, kind in self.fields.items() if not kind.same(e[norm(k)], g[norm(k)])]

    def mismatch(self, expected: Any, given: Any) -> str:
        wrong = self.wrong_keys(expected, given)
        if len(wrong) == 1:
            key = wrong[0]
            detail = self.fields[key].mismatch(
                _by_norm(expected)[norm(key)], _by_norm(given)[norm(key)]
            )
            return f"Неверно значение {key}. {detail}"
        return f"Неверны значения по ключам: {', '.join(wrong)}."

    def skeleton(self) -> str:
        return (
            "{\n" + "".join(f'    "{k}": {t.skeleton()},\n' for k, t in self.fields.items()) + "}"
        )


@dataclass(frozen=True)
class Keyed(AnswerType):
    """Словарь «идентификатор из ``keys(task)`` → значение типа ``value``».

    ``complete=True`` — нужны все ключи условия; иначе ответ называет только часть из них (например,
    только непригодные записи), и лишний или пропущенный ключ — ошибка по существу, а не по форме.
    """

    keys: Callable[[dict], Iterable]
    value: AnswerType
    complete: bool = True
    noun: str = "ключей"

    def problem(self, given: Any, task: dict) -> str | None:
        allowed = list(self.keys(task))
        if not isinstance(given, Mapping):
            return f"Ожидается словарь {{ключ: значение}}; получено: {_kind(given)}."
        known = {norm(k) for k in allowed}
        unknown = [k for k in given if not isinstance(k, str) or norm(k) not in known]
        if unknown:
            return f"Таких {self.noun} нет в условии: {', '.join(_short(k) for k in unknown[:5])}."
        if self.complete and len(_by_norm(given)) != len(known):
            missing = [k for k in allowed if norm(k) not in _by_norm(given)]
            return (
                f"Нужны значения для всех {self.noun}; не хватает: {', '.join(map(str, missing))}."
            )
        for key, value in given.items():
            bad = self.value.problem(value, task)
            if bad:
                return f"{key}: {bad}"
        return None

    def same(self, expected: Any, given: Any) -> bool:
        e, g = _by_norm(expected), _by_norm(given)
        return e.keys() == g.keys() and all(self.value.same(e[k], g[k]) for k in e)

    def mismatch(self, expected: Any, given: Any) -> str:
        e, g = _by_norm(expected), _by_norm(given)
        both = e.keys() & g.keys()
        wrong = sum(not self.value.same(e[k], g[k]) for k in both)
        if self.complete:
            return (
                f"Неверны значения у {fmt.count(wrong, 'ключа', 'ключей', 'ключей')} из {len(e)}."
            )
        return (
            f"В верном ответе {fmt.count(len(e), 'ключ', 'ключа', 'ключей')}; из них вы назвали "
            f"{len(both)}, у {wrong} значение неверно; лишних в ответе: {len(g.keys() - e.keys())}."
        )


# ---------------------------------------------------------------- функция студента
@dataclass(frozen=True)
class Function(AnswerType):
    """Ответ — функция; ``run(fn, task)`` вызывает её на скрытых случаях и возвращает итог.

    Итоги верного ответа, ответа студента и типичных ошибок сравниваются как ``result`` (тип итога).
    Функция студента выполняется с ограничением ``deadline_s`` секунд (call_with_deadline);
    исключение, зависание и Ctrl+C становятся русским отзывом, а не падением ячейки.
    """

    run: Callable[[Callable, dict], Any]
    result: AnswerType
    arity: int = 1
    signature: str = "f(x)"
    deadline_s: float = 20.0

    def problem(self, given: Any, task: dict) -> str | None:
        import inspect

        if isinstance(given, type) or not callable(given):
            return f"Ответ — сама функция {self.signature} (без скобок); получено: {_kind(given)}."
        with contextlib.suppress(ValueError):  # сигнатуру встроенной функции не узнать
            try:
                inspect.signature(given).bind(*([None] * self.arity))
            except TypeError:
                return f"Функция должна принимать {fmt.count(self.arity, 'аргумент', 'аргумента', 'аргументов')}: {self.signature}."
        return None

    def outcome(self, fn: Callable, task: dict) -> Any:
        """Итог функции на скрытых случаях задачи (под ограничением времени)."""
        return call_with_deadline(self.run, (fn, task), self.deadline_s, self.signature)

    def same(self, expected: Any, given: Any) -> bool:
        return self.result.same(expected, given)

    def mismatch(self, expected: Any, given: Any) -> str:
        return self.result.mismatch(expected, given)


class _Deadline(BaseException):
    """Время функции студента вышло (BaseException: её `except Exception` его не поймает)."""


def call_with_deadline(fn: Callable, args: tuple, seconds: float, name: str = "f(x)") -> Any:
    """fn(*args), но не дольше ``seconds`` с; иначе AnswerError с русским сообщением.

    В главном потоке POSIX — таймер SIGALRM прерывает и бесконечный цикл на Python; в других потоках
    — ожидание в отдельном потоке (зависший поток остаётся жить, но ячейка освобождается).
    Исключение функции, SystemExit и KeyboardInterrupt внутри неё тоже становятся AnswerError.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 — любое исключение — отзыв студенту
            box["error"] = exc

    use_alarm = (
        hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if use_alarm:

        def on_alarm(signum: int, frame: Any) -> None:
            raise _Deadline

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            target()
        except _Deadline:
            box["error"] = _Deadline()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    else:
        worker = threading.Thread(target=target, daemon=True)
        worker.start()
        worker.join(seconds)
        if worker.is_alive():
            box["error"] = _Deadline()
    error = box.get("error")
    if error is None:
        return box.get("value")
    if isinstance(error, _Deadline):
        raise AnswerError("wrong", f"Проверка остановлена: `{name}` не завершилась за {num(seconds)} с. "
                          "Нет ли в ней бесконечного цикла или ожидания?")  # fmt: skip
    if isinstance(error, KeyboardInterrupt):
        raise AnswerError("not_attempted", f"Проверка прервана (Ctrl+C или «Стоп») во время вызова "
                          f"`{name}`; попытка не записана.")  # fmt: skip
    raise AnswerError("wrong", f"`{name}` упала: {_exc_text(error)}.")


def _exc_text(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "…"


# ---------------------------------------------------------------- форматирование разборов
def num(x: float, digits: int = 4) -> str:
    """Число для разбора: целое — с неразрывными пробелами между разрядами, иначе ``digits`` значащих."""
    x = _plain(x)
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        return fmt.num(int(x))
    return f"{x:.{digits}g}".replace("-", "−")


def md_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """Таблица Markdown: заголовок и строки (ячейки — через str)."""
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
