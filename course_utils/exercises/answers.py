"""Типы ответов проверочных шагов: форма (``problem``), что сравнивать (``outcome``), сравнение
(``same``) и отзыв без верного значения (``mismatch``). Строки сравниваются после ``norm``; numpy,
torch и pandas сводятся к числам Python. Здесь же — запуск функции студента с ограничением времени
и числа и таблицы для разборов."""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import math
import numbers
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from course_utils import fmt
from course_utils.args import is_number
from course_utils.grading import _FALLBACK, AnswerError, _error_text, _plain

_BYTE_UNITS = ("", "Б", "КиБ", "МиБ", "ГиБ", "ТиБ", "КБ", "МБ", "ГБ", "ТБ", "байт")
_UNITS = "проверьте множители и единицы (байты и биты, ГБ = 10⁹ Б и ГиБ = 2³⁰ Б, мс и с)."
_FACTORS = {2: "2", 4: "4", 8: "8", 1000: "1000", 1024: "1024", 10**6: "10⁶", 2**20: "2²⁰"}
_FACTORS |= {10**9: "10⁹", 2**30: "2³⁰", 2**30 / 10**9: "2³⁰/10⁹ (ГиБ против ГБ)"}
_OTHER_FACTORS = {60: "60 (секунды и минуты?)", 3600: "3600 (секунды и часы?)"}
_OTHER_FACTORS |= {100: "100 (доля и проценты?)", 2: "2"}
_KINDS = [(bool, "True/False"), (numbers.Real, "число"), (str, "строка"), (dict, "словарь")]
_KINDS += [((list, tuple), "список"), ((set, frozenset), "множество"), (type(None), "None")]


def _kind(x: Any) -> str:
    if callable(x) and not isinstance(x, type):
        return "функция (вызовите её и передайте результат)"
    return next((name for t, name in _KINDS if isinstance(x, t)), f"объект {type(x).__name__}")


def _given_text(x: Any) -> str:
    """Ответ студента в отзыве: repr не длиннее 60 символов (fmt.short)."""
    return fmt.short(_plain(x))


def norm(x: Any) -> Any:
    """Строка без лишних пробелов и регистра, «ё» → «е», без кавычек, скобок и точки по краям."""
    x = _plain(x)
    if not isinstance(x, str):
        return x
    return " ".join(x.split()).casefold().replace("ё", "е").strip("`'\"«»[]. ")


def _by_norm(given: Mapping) -> dict:
    return {norm(k): v for k, v in given.items()}


def get(given: Mapping, key: str) -> Any:
    """Значение ответа-словаря по ключу без учёта регистра; None, если ключа нет."""
    return _by_norm(given).get(norm(key))


class AnswerType:
    """Форма ответа. Подклассы переопределяют problem, same и mismatch (Function — и outcome)."""

    def problem(self, given: Any, task: dict) -> str | None:
        return None

    def outcome(self, given: Any, task: dict) -> Any:
        return given

    def same(self, expected: Any, given: Any) -> bool:
        return expected == given

    def mismatch(self, expected: Any, given: Any) -> str:
        return _FALLBACK


@dataclass(frozen=True)
class Number(AnswerType):
    """Число: |given − expected| ≤ max(rtol·|expected|, atol); границы low/high — с сообщением bound."""

    rtol: float = 1e-3
    unit: str = ""
    integer: bool = False
    atol: float = 1e-9
    low: float | None = None
    high: float | None = None
    bound: str = ""

    def problem(self, given: Any, task: dict) -> str | None:
        g, what = _plain(given), f"число{f' ({self.unit})' if self.unit else ''}"
        if not is_number(g):
            return f"Ожидается {what}, а получено: {_kind(g)}."
        if not math.isfinite(g):
            return "Ответ — NaN или бесконечность: проверьте деление на ноль и log(0)."
        if self.integer and g != int(g):
            return f"Ожидается целое {what}: {g} — не целое (округлите по условию)."
        if (self.low is not None and g < self.low) or (self.high is not None and g > self.high):
            limits = f"от {self.low}" if self.high is None else f"от {self.low} до {self.high}"
            return f"{self.bound or f'Допустимо {limits}'}, а получено {g}."
        return None

    def same(self, expected: Any, given: Any) -> bool:
        e, g = float(_plain(expected)), float(_plain(given))
        return e == g or abs(g - e) <= max(self.rtol * abs(e), self.atol)  # в единицах ответа

    def mismatch(self, expected: Any, given: Any) -> str:
        """Отзыв по r = given / expected (given конечно: это проверил problem): −1 (знак), ровно
        множитель единиц или |r − 1| в %."""
        e, g = float(_plain(expected)), float(_plain(given))
        if e == 0:
            return _FALLBACK
        ratio, units = g / e, self.unit in _BYTE_UNITS
        if ratio < 0 and abs(ratio + 1) <= self.rtol:
            return "Модуль верный, а знак — нет."
        hint = _UNITS if units else "проверьте формулу и единицы."
        for factor, label in (_FACTORS if units else _OTHER_FACTORS).items():
            for r, side in ((factor, "больше"), (1 / factor, "меньше")):
                if abs(ratio / r - 1) <= 1e-3:
                    return f"Ваш ответ {side} верного, отношение ровно {label}: {hint}"
        pct = abs(ratio - 1) * 100
        if pct < 1:
            return f"Ответ отличается от верного на {pct:.2g} %: не округляйте промежуточные шаги."
        return f"Ваш ответ отличается от верного на {pct:.0f} %: {hint}"


@dataclass(frozen=True)
class Share(Number):
    """Доля от 0 до 1 (не проценты)."""

    low: float | None = 0.0
    high: float | None = 1.0

    def problem(self, given: Any, task: dict) -> str | None:
        bad, g = super().problem(given, task), _plain(given)
        if bad and is_number(g) and 1 < g <= 100:
            return f"Доля — число от 0 до 1, а получено {g}: похоже на проценты, а нужна доля."
        return bad


@dataclass(frozen=True)
class Numbers(AnswerType):
    """Непустой список чисел той же длины, что верный; элементы сравнивает ``item``."""

    item: Number = field(default_factory=Number)
    noun: str = "элементу"

    def problem(self, given: Any, task: dict) -> str | None:
        g = _plain(given)
        if not isinstance(g, (list, tuple)) or not g:
            return f"Нужен непустой список чисел, а получено: {_kind(g)}."
        bad = next((x for x in g if self.item.problem(x, task)), None)
        return None if bad is None else f"Все элементы — конечные числа, а есть {_given_text(bad)}."

    def same(self, expected: Any, given: Any) -> bool:
        e, g = _plain(expected), _plain(given)
        return len(e) == len(g) and all(self.item.same(a, b) for a, b in zip(e, g))

    def mismatch(self, expected: Any, given: Any) -> str:
        n, m = len(_plain(expected)), len(_plain(given))
        if n != m:
            return f"Нужно {fmt.count(n, 'число', 'числа', 'чисел')}, по одному {self.noun}, а получено {m}."
        wrong = [
            str(i)
            for i, (a, b) in enumerate(zip(_plain(expected), _plain(given)))
            if not self.item.same(a, b)
        ]
        return f"Неверны элементы с номерами (с нуля): {', '.join(wrong[:8])}."


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


@dataclass(frozen=True)
class Choice(AnswerType):
    """Одна строка из ``options`` (кортеж или функция task → варианты); ``aliases`` — синонимы."""

    options: Any
    aliases: Mapping[str, str] = field(default_factory=dict)

    def _canon(self, x: Any) -> Any:
        return norm(self.aliases.get(norm(x), x)) if isinstance(_plain(x), str) else x

    def problem(self, given: Any, task: dict) -> str | None:
        allowed = list(self.options(task) if callable(self.options) else self.options)
        if isinstance(_plain(given), str) and self._canon(given) in {norm(o) for o in allowed}:
            return None
        shown = ", ".join(f"«{o}»" for o in allowed)
        return f"Ожидается одна строка из: {shown}; получено: {_given_text(given)}."

    def same(self, expected: Any, given: Any) -> bool:
        return self._canon(expected) == self._canon(given)

    def mismatch(self, expected: Any, given: Any) -> str:
        return "Выбран не тот вариант: перечитайте условие и сверьте расчёт."


@dataclass(frozen=True)
class IdSet(AnswerType):
    """Набор id из ``universe(task)``, порядок не важен; ``repeats=True`` — повтор не ошибка формы."""

    universe: Callable[[dict], Iterable]
    noun: str = "идентификаторов"
    repeats: bool = False

    def problem(self, given: Any, task: dict) -> str | None:
        g = _plain(given)
        if not isinstance(g, (list, tuple, set, frozenset)):
            return f"Ожидается список {self.noun}, а получено: {_kind(g)}."
        known = list(self.universe(task))
        unknown = [x for x in g if isinstance(x, bool) or norm(x) not in {norm(u) for u in known}]
        if unknown:
            allowed = f" Допустимы: {', '.join(map(str, known))}." if len(known) <= 12 else ""
            return f"Таких {self.noun} нет в условии: {', '.join(map(_given_text, unknown[:5]))}.{allowed}"
        if not self.repeats and len({norm(x) for x in g}) != len(g):
            return f"В списке есть повторы: каждый из {self.noun} — один раз."
        return None

    def same(self, expected: Any, given: Any) -> bool:
        return {norm(x) for x in _plain(expected)} == {norm(x) for x in _plain(given)}

    def mismatch(self, expected: Any, given: Any) -> str:
        e, g = {norm(x) for x in _plain(expected)}, {norm(x) for x in _plain(given)}
        return f"Не хватает {self.noun}: {len(e - g)}, лишних: {len(g - e)}."


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
            parts = [
                f"не хватает — {', '.join(missing)}" if missing else "",
                f"лишние — {', '.join(extra)}" if extra else "",
            ]
            return f"Ключи не те ({'; '.join(p for p in parts if p)}). Нужны ровно: {keys}."
        bad = ((key, kind.problem(g[norm(key)], task)) for key, kind in self.fields.items())
        return next((f"{key}: {why}" for key, why in bad if why), None)

    def same(self, expected: Any, given: Any) -> bool:
        return not self._wrong_keys(expected, given)

    def _wrong_keys(self, expected: Mapping, given: Mapping) -> list[str]:
        e, g = _by_norm(expected), _by_norm(given)
        return [k for k, kind in self.fields.items() if not kind.same(e[norm(k)], g[norm(k)])]

    def mismatch(self, expected: Any, given: Any) -> str:
        """Называет неверные ключи и объясняет первый из них."""
        wrong = self._wrong_keys(expected, given)
        first = wrong[0]
        why = self.fields[first].mismatch(get(expected, first), get(given, first))
        if len(wrong) == 1:
            return f"Неверно значение {first}. {why}"
        return f"Неверны значения: {', '.join(wrong)}. {first}: {why[0].lower()}{why[1:]}"


@dataclass(frozen=True)
class Keyed(AnswerType):
    """Словарь «id из ``keys(task)`` → значение типа ``value``»; ``complete=False`` — ответ называет
    часть id (лишний id — ошибка по существу). ``form`` — вид ответа, ``noun`` — род. п. мн. ч. id."""

    keys: Callable[[dict], Iterable]
    value: AnswerType
    complete: bool = True
    noun: str = "ключей"
    form: str = "{ключ: значение}"

    def problem(self, given: Any, task: dict) -> str | None:
        allowed = list(self.keys(task))
        if not isinstance(given, Mapping):
            return f"Ожидается словарь {self.form}; получено: {_kind(given)}."
        known = {norm(k) for k in allowed}
        unknown = [k for k in given if not isinstance(k, str) or norm(k) not in known]
        if unknown:
            return f"Таких {self.noun} нет в условии: {', '.join(map(_given_text, unknown[:5]))}."
        if self.complete and len(_by_norm(given)) != len(known):
            missing = [str(k) for k in allowed if norm(k) not in _by_norm(given)]
            return f"Нужны значения для всех {self.noun}; не хватает: {', '.join(missing)}."
        bad = ((key, self.value.problem(value, task)) for key, value in given.items())
        return next((f"{key}: {why}" for key, why in bad if why), None)

    def same(self, expected: Any, given: Any) -> bool:
        e, g = _by_norm(expected), _by_norm(given)
        return e.keys() == g.keys() and all(self.value.same(e[k], g[k]) for k in e)

    def mismatch(self, expected: Any, given: Any) -> str:
        e, g = _by_norm(expected), _by_norm(given)
        both = e.keys() & g.keys()
        wrong = sum(not self.value.same(e[k], g[k]) for k in both)
        if self.complete:
            return f"Неверны значения у {wrong} из {len(e)} {self.noun}."
        return f"В верном ответе {self.noun}: {len(e)}; из них вы назвали {len(both)}, у {wrong} значение неверно; лишних в ответе: {len(g.keys() - e.keys())}."


class _Deadline(BaseException):
    """Время функции студента вышло (BaseException: её `except Exception` его не поймает)."""


def call_with_deadline(fn: Callable, args: tuple, seconds: float, name: str = "f(x)") -> Any:
    """fn(*args) не дольше ``seconds`` с, иначе AnswerError. В главном потоке POSIX таймер SIGALRM
    прерывает и бесконечный цикл; в других fn идёт в потоке, куда по истечении времени бросают
    останов (цикл на Python прервётся, ожидание в C-вызове вроде sleep — нет). Исключение,
    SystemExit и Ctrl+C внутри fn — тоже AnswerError (AnswerError самой проверки — как есть)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 — любое исключение — отзыв студенту
            box["error"] = exc

    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

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
        if worker.is_alive():  # исключение в поток: цикл на Python остановится, а не займёт GIL
            tid, exc = ctypes.c_ulong(worker.ident), ctypes.py_object(_Deadline)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(tid, exc)
            worker.join(1.0)
            box["error"] = _Deadline()
    error = box.get("error")
    if error is None:
        return box.get("value")
    if isinstance(error, AnswerError):  # run сам объяснил, почему ответ не оценить
        raise error
    if isinstance(error, _Deadline):
        msg = f"Проверка остановлена: `{name}` не завершилась за {seconds:g} с. Нет ли в ней бесконечного цикла или ожидания?"
        raise AnswerError("wrong", msg)
    if isinstance(error, KeyboardInterrupt):
        msg = (
            f"Проверка прервана (Ctrl+C или «Стоп») во время вызова `{name}`; попытка не записана."
        )
        raise AnswerError("not_attempted", msg)
    raise AnswerError("wrong", f"`{name}` упала: {_error_text(error, 300)}.")


@dataclass(frozen=True)
class Function(AnswerType):
    """Ответ — функция; ``run(fn, task)`` вызывает её на скрытых случаях не дольше ``deadline_s`` с,
    итоги верного ответа, ответа студента и типичных ошибок сравнивает тип ``result``."""

    run: Callable[[Callable, dict], Any]
    result: AnswerType
    arity: int = 1
    signature: str = "f(x)"
    deadline_s: float = 20.0

    def problem(self, given: Any, task: dict) -> str | None:
        if isinstance(given, type) or not callable(given):
            what = "None" if given is None else _kind(given).split(" (")[0]
            return f"Ответ — сама функция {self.signature} (без скобок); получено: {what}."
        with contextlib.suppress(ValueError):  # сигнатуру встроенной функции не узнать
            try:
                inspect.signature(given).bind(*([None] * self.arity))
            except TypeError:
                n = fmt.count(self.arity, "аргумент", "аргумента", "аргументов")
                return f"Функция должна принимать {n}: {self.signature}."
        return None

    def outcome(self, fn: Callable, task: dict) -> Any:
        """Итог функции на скрытых случаях задачи (под ограничением времени)."""
        return call_with_deadline(self.run, (fn, task), self.deadline_s, self.signature)

    def same(self, expected: Any, given: Any) -> bool:
        return self.result.same(expected, given)

    def mismatch(self, expected: Any, given: Any) -> str:
        return self.result.mismatch(expected, given)


def sig(x: float, digits: int = 4) -> str:
    """Число для разбора: целое — с неразрывными пробелами между разрядами, иначе ``digits`` значащих."""
    x = _plain(x)
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        return fmt.num(int(x))
    return f"{x:.{digits}g}".replace("-", "−")


def tex_num(n: float) -> str:
    """Целое для формулы LaTeX: разряды через тонкий пробел ``\\,`` (131\\,072)."""
    return fmt.num(int(n)).replace(fmt.NBSP, "\\,").replace("−", "-")


def md_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """Таблица Markdown: заголовок и строки (ячейки — через str)."""
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def far_apart(values: Iterable[float], rtol: float = 0.05, atol: float = 0.01) -> bool:
    """Для генератора: значения попарно различаются больше чем на rtol·max(|a|, |b|) + atol."""
    v = [float(x) for x in values]
    return all(
        abs(a - b) > rtol * max(abs(a), abs(b)) + atol for i, a in enumerate(v) for b in v[i + 1 :]
    )
