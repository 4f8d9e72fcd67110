"""Проверочные шаги модуля 12: реестр упражнений, варианты, проверка, разборы, прогресс.

В ноутбуке: ``grading.task(id)`` — условие варианта, ``grading.check(id, ответ)`` — отзыв;
ещё ``hint``, ``solution`` (после попытки), ``new_variant``, ``progress()``. Темы шагов —
``data/course_steps.csv``.
Прогресс — JSON в ``COURSE_PROGRESS_PATH`` (по умолчанию ``~/.course_rl_infra_progress.json``),
запись атомарная и под flock. Шаги регистрирует ``course_utils.exercises`` при первом обращении.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import datetime as dt
import glob
import importlib
import json
import math
import numbers
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils import atomic
from course_utils.args import is_number

try:
    import fcntl as _fcntl
except ImportError:  # Windows: без межпроцессной блокировки (см. _locked)
    _fcntl = None


class _Placeholder:
    """Заглушка ответа: ячейка с ``____`` выполняется, а check отвечает «ещё не решено»."""

    _course_placeholder = True  # узнаём и копии, и заглушку из перезагруженного модуля

    def __repr__(self) -> str:
        return "____ (заполните ответ)"


____ = PLACEHOLDER = _Placeholder()

with open(
    Path(__file__).resolve().parent.parent / "data" / "course_steps.csv", encoding="utf-8"
) as f:
    COURSE_STEPS: dict[str, str] = {row["id"]: row["title"] for row in csv.DictReader(f)}


class AnswerError(Exception):
    """Ответ нельзя оценить (функция студента упала или зависла): ``status`` и ``message``."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Misconception:
    """Типичная ошибка: ``answer(task)`` — такой неверный ответ, ``message`` её называет;
    ``accepts(task, given)`` узнаёт её в ином виде (по умолчанию — совпадение с answer(task))."""

    key: str
    message: str
    answer: Callable[[dict], Any]
    accepts: Callable[[dict, Any], bool] | None = None


@dataclass(frozen=True)
class Exercise:
    """Проверочный шаг: ``make_task(variant)`` → dict со ``statement``, ``reference(task)`` — ответ,
    ``solution(task)`` — разбор; ещё ``compare``, ``validate_answer`` (сообщение о форме),
    ``describe_mismatch`` (отзыв) и ``outcome`` (что сравнивать вместо самого ответа)."""

    id: str
    title: str
    make_task: Callable[[int], dict]
    reference: Callable[[dict], Any]
    solution: Callable[[dict], str]
    hint: str
    misconceptions: list[Misconception]
    rtol: float = 1e-3
    compare: Callable[[Any, Any, float], bool] | None = None
    validate_answer: Callable[[Any, dict], str | None] | None = None
    describe_mismatch: Callable[[Any, Any, dict], str] | None = None
    outcome: Callable[[Any, dict], Any] | None = None

    def __post_init__(self) -> None:
        keys = [m.key for m in self.misconceptions if isinstance(m, Misconception)]
        if not isinstance(self.id, str) or not self.id or len(keys) != len(self.misconceptions):
            raise TypeError(f"Exercise {self.id!r}: id — строка, misconceptions — [Misconception]")
        if len(set(keys)) != len(keys) or not self.rtol > 0:
            raise ValueError(f"{self.id}: ключи ошибок повторяются ({keys}) или rtol ≤ 0")


# ---------------------------------------------------------------- реестр
_registry: dict[str, Exercise] = {}
_override_depth = 0
_loaded = False


def _ensure_loaded() -> None:
    """Один раз импортирует course_utils.exercises: модули уроков регистрируют упражнения."""
    global _loaded
    if not _loaded and not _override_depth:
        _loaded = True
        importlib.import_module("course_utils.exercises")


def register(exercise: Exercise) -> Exercise:
    """Добавляет упражнение в реестр; вне registry_override() — только id из COURSE_STEPS."""
    if not isinstance(exercise, Exercise):
        raise TypeError(f"register ждёт Exercise, получено {type(exercise).__name__}")
    if not _override_depth and exercise.id not in COURSE_STEPS:
        raise ValueError(f"Шага {exercise.id!r} нет в COURSE_STEPS: {', '.join(COURSE_STEPS)}")
    if exercise.id in _registry:
        raise ValueError(f"Упражнение {exercise.id!r} уже зарегистрировано")
    _registry[exercise.id] = exercise
    return exercise


@contextlib.contextmanager
def registry_override() -> Iterator[dict[str, Exercise]]:
    """Временно подменяет реестр пустым (для тестов); настоящий возвращается на выходе."""
    global _registry, _override_depth
    _ensure_loaded()  # модули уроков успевают записаться в настоящий реестр
    saved, _registry = _registry, {}
    _override_depth += 1
    try:
        yield _registry
    finally:
        _registry, _override_depth = saved, _override_depth - 1


def exercise_ids() -> list[str]:
    """Зарегистрированные упражнения в порядке COURSE_STEPS."""
    _ensure_loaded()
    order = {key: i for i, key in enumerate(COURSE_STEPS)}
    return sorted(_registry, key=lambda key: order.get(key, len(order)))


def _get(exercise_id: str) -> Exercise:
    _ensure_loaded()
    key = exercise_id.strip() if isinstance(exercise_id, str) else None
    if key in _registry:
        return _registry[key]
    known = ", ".join(exercise_ids()) or "пока ни одного"
    if key in COURSE_STEPS:
        raise ValueError(f"Упражнение {key} ещё не вошло в эту версию курса. Есть: {known}")
    raise ValueError(f"Неизвестное упражнение {exercise_id!r}. Известные: {known}")


def _make_task(ex: Exercise, variant: int) -> dict:
    made = ex.make_task(variant)
    if not isinstance(made, dict) or not isinstance(made.get("statement"), str):
        raise TypeError(f"{ex.id}: make_task должен вернуть dict со строкой 'statement'")
    return made


def _entry(exercise_id: str) -> dict:
    return _load()["exercises"].get(exercise_id, _blank())


def task(exercise_id: str, variant: int | None = None) -> dict:
    """Входные данные упражнения; variant=None — текущий вариант студента (в начале 0)."""
    ex = _get(exercise_id)
    return _make_task(ex, _entry(ex.id)["variant"] if variant is None else int(variant))


def _reference(exercise_id: str, variant: int | None = None) -> Any:
    """Верный ответ варианта (None — текущий) — для тестов; студенту его открывает solution()."""
    return _get(exercise_id).reference(task(exercise_id, variant))


def misconceptions(exercise_id: str) -> list[Misconception]:
    """Типичные ошибки упражнения."""
    return list(_get(exercise_id).misconceptions)


def new_variant(exercise_id: str) -> dict:
    """Переходит к следующему варианту (новые числа), запоминает его и показывает условие."""
    ex = _get(exercise_id)
    entry = _update(ex.id, lambda e: e.update(variant=e["variant"] + 1, variant_attempts=0))
    fresh = _make_task(ex, entry["variant"])
    _emit(f"🎲 {ex.id} «{ex.title}», вариант {entry['variant']}.", fresh["statement"])
    return fresh


def hint(exercise_id: str) -> None:
    """Показывает подсказку."""
    ex = _get(exercise_id)
    _emit(
        f"💡 Подсказка к {ex.id}.",
        ex.hint or "Для этого шага подсказки нет — перечитайте конспект.",
    )


def solution(exercise_id: str) -> None:
    """Показывает разбор текущего варианта, если на нём была попытка — ответ верного вида
    (correct, wrong, misconception); ``____``, None и ответ не того вида разбор не открывают."""
    ex = _get(exercise_id)
    entry = _entry(ex.id)
    if entry["variant_attempts"]:
        return _emit(f"📖 Разбор {ex.id} «{ex.title}».", "\n\n" + ex.solution(task(ex.id)))
    which = f" варианта {entry['variant']}" if entry["variant"] else ""
    _emit(
        "",
        f"🔒 Разбор{which} {ex.id} откроется после первой попытки на нём: впишите свой ответ "
        "вместо ____ и запустите grading.check. Засчитывается любой ответ верного вида, даже "
        "неверный.",
    )


# ---------------------------------------------------------------- сравнение ответов
def _plain(x: Any) -> Any:
    """numpy / torch / pandas → встроенные скаляры и списки Python."""
    if type(x).__module__.split(".")[0] in ("numpy", "torch", "pandas") and hasattr(x, "tolist"):
        return (x.detach().cpu() if hasattr(x, "detach") else x).tolist()
    return x


def _norm_key(x: Any) -> Any:
    x = _plain(x)
    return " ".join(x.split()).casefold().replace("ё", "е") if isinstance(x, str) else x


def _close(e: Any, g: Any, rtol: float) -> bool:
    """|g − e| ≤ rtol·|e| + 1e-9 (абсолютный допуск важен, только когда верный ответ равен 0)."""
    if e == g:
        return True
    e, g = float(e), float(g)
    if not (math.isfinite(e) and math.isfinite(g)):
        return math.isnan(e) and math.isnan(g)
    return abs(g - e) <= rtol * abs(e) + 1e-9


def _match(e: Any, g: Any, rtol: float) -> bool:
    e, g = _plain(e), _plain(g)
    if isinstance(e, bool) or isinstance(g, bool):
        return isinstance(e, bool) and isinstance(g, bool) and e == g
    if is_number(e):
        return is_number(g) and _close(e, g, rtol)
    if isinstance(e, str):
        return isinstance(g, str) and _norm_key(e) == _norm_key(g)
    if isinstance(e, dict):
        if not isinstance(g, dict):
            return False
        ne, ng = ({_norm_key(k): v for k, v in d.items()} for d in (e, g))
        return ne.keys() == ng.keys() and all(_match(ne[k], ng[k], rtol) for k in ne)
    if isinstance(e, (list, tuple)):
        ok = isinstance(g, (list, tuple)) and len(e) == len(g)
        return ok and all(_match(a, b, rtol) for a, b in zip(e, g))
    if isinstance(e, (set, frozenset)):
        ok = isinstance(g, (set, frozenset, list, tuple))
        return ok and {_norm_key(x) for x in e} == {_norm_key(x) for x in g}
    return g is None if e is None else bool(e == g)


def answers_match(expected: Any, given: Any, rtol: float = 1e-3) -> bool:
    """Совпадает ли ответ с верным; для чисел |given − expected| ≤ rtol·|expected| + 1e-9.

    bool — точно; строки — без учёта регистра, лишних пробелов и «ё/е»; dict, list, tuple —
    рекурсивно; set — после нормализации (можно ответить списком); numpy, torch и pandas сводятся
    к числам и спискам. Не бросает исключений: непонятный ответ — False.
    """
    try:
        return _match(expected, given, rtol)
    except Exception:
        return False


_KINDS = [(bool, "True/False"), (numbers.Real, "число"), (str, "строка"), (dict, "словарь")]
_KINDS += [((list, tuple), "список"), ((set, frozenset), "множество"), (type(None), "None")]


def _kind(x: Any) -> str:
    if callable(x) and not isinstance(x, type):
        return "функция (вызовите её и передайте результат)"
    return next((name for t, name in _KINDS if isinstance(x, t)), f"объект {type(x).__name__}")


_FALLBACK = "Ответ не совпал с верным: перечитайте условие, проверьте знак и единицы."
_UNITS = "проверьте множители и единицы (байты и биты, ГБ = 10⁹ Б и ГиБ = 2³⁰ Б, мс и с)."
_FACTORS = {2: "2", 4: "4", 8: "8", 1000: "1000", 1024: "1024", 10**6: "10⁶", 2**20: "2²⁰"}
_FACTORS |= {10**9: "10⁹", 2**30: "2³⁰", 2**30 / 10**9: "2³⁰/10⁹ (ГиБ против ГБ)"}
_OTHER_FACTORS = {60: "60 (секунды и минуты?)", 3600: "3600 (секунды и часы?)"}
_OTHER_FACTORS |= {100: "100 (доля и проценты?)", 2: "2"}


def _describe_mismatch(e: Any, g: Any, rtol: float, hint: str | None = None) -> str:
    """Что не так с ответом, не раскрывая верного значения; ``hint`` — совет вместо байтового.

    Для чисел — отношение r = given / expected: −1 (знак), ровно множитель единиц или |r − 1| в %.
    """
    e, g = _plain(e), _plain(g)
    if _kind(e) != _kind(g) and not (isinstance(e, (set, frozenset)) and _kind(g) == "список"):
        return f"Ожидается {_kind(e)}, а получено: {_kind(g)}."
    if is_number(e) and not math.isfinite(g):
        return "Ответ — NaN или бесконечность: проверьте деление на ноль и log(0)."
    if is_number(e) and e != 0:
        ratio = g / e
        if ratio < 0 and abs(ratio + 1) <= rtol:
            return "Модуль верный, а знак — нет."
        for factor, label in (_FACTORS if hint is None else _OTHER_FACTORS).items():
            for r, side in ((factor, "больше"), (1 / factor, "меньше")):
                if abs(ratio / r - 1) <= 1e-3:
                    return f"Ваш ответ {side} верного, отношение ровно {label}: {hint or _UNITS}"
        pct = abs(ratio - 1) * 100
        if pct < 1:
            return f"Ответ отличается от верного на {pct:.2g} %: не округляйте промежуточные шаги."
        return f"Ваш ответ отличается от верного на {pct:.0f} %: {hint or _UNITS}"
    if isinstance(e, dict):
        ne, ng = ({_norm_key(k): k for k in d} for d in (e, g))
        if ne.keys() != ng.keys():
            missing = ", ".join(str(ne[k]) for k in ne if k not in ng) or "нет"
            extra = ", ".join(str(ng[k]) for k in ng if k not in ne) or "нет"
            return f"Ключи не те: не хватает — {missing}; лишние — {extra}."
        wrong = [str(ne[k]) for k in ne if not answers_match(e[ne[k]], g[ng[k]], rtol)]
        return f"Неверны значения по ключам: {', '.join(wrong)}."
    if isinstance(e, (list, tuple)):
        if len(e) != len(g):
            return f"Ожидается элементов: {len(e)}, получено: {len(g)}."
        wrong = [str(i) for i, (a, b) in enumerate(zip(e, g)) if not answers_match(a, b, rtol)]
        return f"Неверны элементы с номерами (с нуля): {', '.join(wrong[:8])}."
    if isinstance(e, (set, frozenset)):
        ne, ng = {_norm_key(x) for x in e}, {_norm_key(x) for x in g}
        return f"Не хватает элементов: {len(ne - ng)}, лишних: {len(ng - ne)}."
    return _FALLBACK


# ---------------------------------------------------------------- проверка
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

    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer"):

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
        raise AnswerError(
            "wrong",
            f"Проверка остановлена: `{name}` не завершилась за "
            f"{seconds:g} с. Нет ли в ней бесконечного цикла или ожидания?",
        )
    if isinstance(error, KeyboardInterrupt):
        raise AnswerError(
            "not_attempted",
            f"Проверка прервана (Ctrl+C или «Стоп») во время вызова `{name}`; попытка не записана.",
        )
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:
        text = type(error).__name__
    raise AnswerError("wrong", f"`{name}` упала: {text if len(text) <= 300 else text[:297] + '…'}.")


_STATUS = {
    "correct": ("✅", "верно!"),
    "wrong": ("❌", "пока неверно."),
    "misconception": ("❌", "типичная ошибка."),
    "malformed": ("⚠️", "ответ не в том виде."),
    "not_attempted": ("✏️", "пока без ответа."),
}
_ATTEMPT = ("correct", "wrong", "misconception")  # ответ верного вида — попытка


@dataclass
class CheckResult:
    """Итог проверки; status ∈ _STATUS, истинен только для correct. Отзыв, который check уже
    показал в этой ячейке, объект как последнее выражение ячейки второй раз не выводит."""

    exercise_id: str
    status: str
    message: str
    misconception: str | None = None
    _shown_in: Any = field(default=None, init=False, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.status == "correct"

    def __repr__(self) -> str:
        extra = f", misconception={self.misconception!r}" if self.misconception else ""
        return f"CheckResult({self.exercise_id}: {self.status}{extra} — {self.message})"

    def _show(self) -> None:
        icon, title = _STATUS.get(self.status, ("", self.status))
        _emit(f"{icon} {self.exercise_id} — {title}", self.message)

    def _ipython_display_(self) -> None:
        just_shown = self._shown_in == ("shown", getattr(_shell(), "execution_count", None))
        self._shown_in = None
        if not just_shown:
            self._show()


def _contains_placeholder(x: Any, depth: int = 0) -> bool:
    try:
        if x is PLACEHOLDER or getattr(type(x), "_course_placeholder", False) is True:
            return True
        if isinstance(x, dict):
            x = [*x.keys(), *x.values()]
        if depth < 20 and isinstance(x, (list, tuple, set, frozenset)):
            return any(_contains_placeholder(item, depth + 1) for item in x)
    except Exception:
        pass
    return False


def evaluate(exercise_id: str, answer: Any, variant: int = 0) -> CheckResult:
    """Проверяет ответ на варианте без записи попытки и без вывода (для тестов упражнений)."""
    ex = _get(exercise_id)
    if _contains_placeholder(answer):
        msg = f"Упражнение {ex.id} ещё не решено: замените ____ своим ответом и запустите ячейку."
        return CheckResult(ex.id, "not_attempted", msg)
    current = _make_task(ex, variant)
    try:
        problem = ex.validate_answer(answer, current) if ex.validate_answer else None
    except Exception as exc:
        problem = f"Ответ не удалось разобрать ({type(exc).__name__}); сверьтесь с условием."
    if problem:
        return CheckResult(ex.id, "malformed", str(problem))
    same, judged = ex.compare or answers_match, ex.outcome or (lambda answer, task: answer)
    try:
        given = judged(answer, current)
    except AnswerError as exc:
        return CheckResult(ex.id, exc.status, exc.message)
    expected = judged(ex.reference(current), current)
    try:
        if bool(same(expected, given, ex.rtol)):
            return CheckResult(ex.id, "correct", f"Упражнение {ex.id} решено.")
    except Exception as exc:
        try:
            why = f"{type(exc).__name__}: {exc}"[:200]
        except Exception:
            why = type(exc).__name__
        msg = (
            f"Ответ не удалось сравнить с верным ({why}). Проверьте тип и форму ответа по условию."
        )
        return CheckResult(ex.id, "malformed", msg)
    for m in ex.misconceptions:
        with contextlib.suppress(Exception):
            if m.accepts is not None:
                hit = m.accepts(current, given)
            else:
                hit = same(judged(m.answer(current), current), given, ex.rtol)
            if bool(hit):
                return CheckResult(ex.id, "misconception", m.message, misconception=m.key)
    try:
        if ex.describe_mismatch is not None:
            detail = ex.describe_mismatch(expected, given, current)
        else:
            detail = _describe_mismatch(expected, given, ex.rtol)
    except Exception:
        detail = _FALLBACK
    return CheckResult(ex.id, "wrong", f"{detail} Подсказка: grading.hint({ex.id!r}).")


def check(exercise_id: str, answer: Any) -> CheckResult:
    """Проверяет ответ на текущем варианте, записывает попытку и показывает отзыв.

    Не бросает исключений из-за ответа; ``____`` (и внутри списка или словаря) и ответ не того
    вида (malformed) попыткой не считаются и не записываются.
    """
    ex = _get(exercise_id)
    result = evaluate(ex.id, answer, _entry(ex.id)["variant"])
    if result.status in _ATTEMPT:
        when = dt.datetime.now().astimezone().isoformat(timespec="seconds")

        def record(entry: dict) -> None:
            entry["attempts"] += 1
            entry["variant_attempts"] += 1
            entry["solved"] = entry["solved"] or result.status == "correct"
            entry["last_attempt"], entry["last_status"] = when, result.status

        _update(ex.id, record)
    result._show()
    result._shown_in = ("shown", getattr(_shell(), "execution_count", None))
    return result


# ---------------------------------------------------------------- вывод
def _shell() -> Any:
    with contextlib.suppress(Exception):
        return sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None


def _emit(head: str, body: str) -> None:
    """Markdown (заголовок жирным) в ядре Jupyter/Colab, обычный текст в консоли и в тестах."""
    markdown, plain = (f"**{head}** {body}" if head else body), f"{head} {body}".strip()
    shell = _shell()
    if shell is not None and hasattr(shell, "kernel"):
        from IPython.display import display

        display({"text/markdown": markdown, "text/plain": plain}, raw=True)
    else:
        print(plain)


# ---------------------------------------------------------------- прогресс
_FORMAT = 1
_STALE_TMP_S = 5.0  # временный файл старше — остаток прерванной записи (живая длится мс)
_memory: dict[str, dict] = {}  # путь → прогресс, когда файл не удаётся записать
_warned: set[str] = set()
_thread_lock = threading.RLock()  # потоки одного ядра; между процессами — flock
_lock_depth = 0


class ProgressWarning(UserWarning):
    """Файл прогресса повреждён или недоступен."""


def _warn(message: str, once_key: str | None = None) -> None:
    if once_key is None or once_key not in _warned:
        _warned.add(once_key or message)
        warnings.warn(message, ProgressWarning, stacklevel=3)


def _progress_path() -> Path:
    env = os.environ.get("COURSE_PROGRESS_PATH", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".course_rl_infra_progress.json"


def _count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _is_timestamp(v: Any) -> bool:
    try:
        return v is None or (isinstance(v, str) and bool(dt.datetime.fromisoformat(v)))
    except ValueError:
        return False


_FIELDS: dict[str, tuple[Any, Callable[[Any], bool]]] = {  # поле → (по умолчанию, допустимо ли)
    "attempts": (0, _count),
    "solved": (False, lambda v: type(v) is bool),
    "variant": (0, _count),
    "variant_attempts": (0, _count),
    "last_attempt": (None, _is_timestamp),
    # malformed — из старых файлов: тогда и такой ответ считался попыткой
    "last_status": (None, lambda v: v is None or (isinstance(v, str) and v in _RECORDED)),
}
_RECORDED = {status for status in _STATUS if status != "not_attempted"}


def _blank() -> dict:
    return {name: default for name, (default, _) in _FIELDS.items()}


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:39] + "…"


def _validated(raw: Any) -> tuple[dict, list[str]]:
    """Проверенный прогресс и список исправлений; ValueError — файл негоден целиком.

    Неверное поле записи сбрасывается к значению по умолчанию, остальное сохраняется; сброшенное
    attempts становится 1, если запись говорит о попытке (solved или last_status), — иначе
    решённому шагу снова закрылся бы разбор.
    """
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
        raise ValueError(f"ожидается словарь с format = {_FORMAT}")
    if not isinstance(raw.get("exercises"), dict):
        raise ValueError("поле exercises должно быть словарём")
    out, problems = {}, []
    for key, entry in raw["exercises"].items():
        if not isinstance(entry, dict):
            problems.append(f"запись упражнения {key} — не словарь: {_shown(entry)}")
            entry = {}
        fixed, bad = _blank(), []
        for name, (_, ok) in _FIELDS.items():
            if name in entry and ok(entry[name]):
                fixed[name] = entry[name]
            elif name in entry:
                bad.append(name)
        if "attempts" in bad and (fixed["solved"] or fixed["last_status"]):
            fixed["attempts"] = 1
        if "variant_attempts" not in entry:  # файл прежней версии: попытки считались без варианта
            fixed["variant_attempts"] = fixed["attempts"]
        if bad:
            what = "неверное поле" if len(bad) == 1 else "неверные поля"
            values = ", ".join(f"{name} = {_shown(entry[name])}" for name in bad)
            problems.append(f"в записи упражнения {key} {what} {values}")
        out[key] = fixed
    return {"format": _FORMAT, "exercises": out}, problems


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Исключительный доступ к прогрессу: потоки — RLock, процессы — flock файла .<имя>.lock.

    Повторный вход из того же потока не блокирует. Без fcntl (Windows) или если блокировка не
    удалась, процессы не блокируются: запись остаётся атомарной, но два ядра могут потерять попытку.
    """
    global _lock_depth
    with _thread_lock, contextlib.ExitStack() as stack:
        if _lock_depth == 0 and _fcntl is not None:
            with contextlib.suppress(OSError):  # папка недоступна, сетевой диск без блокировок
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = stack.enter_context(open(path.with_name(f".{path.name}.lock"), "a"))
                _fcntl.flock(handle.fileno(), _fcntl.LOCK_EX)  # закрытие файла снимает flock
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1


def _aside(path: Path) -> Path:
    return path.with_name(f"{path.name}.corrupt-{dt.datetime.now():%Y%m%d-%H%M%S-%f}")


def _read(path: Path, repair: bool) -> dict | None:
    """Прогресс из файла. Не JSON — файл откладывается целиком; неверные записи сбрасываются
    по одной (рядом остаётся копия исходного файла). Без repair — None, если нужна починка."""
    fresh = {"format": _FORMAT, "exercises": {}}
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return fresh
    except OSError as exc:
        _memory[str(path)] = fresh
        _warn(f"Не удалось прочитать прогресс {path} ({exc}); он хранится только в памяти.")
        return fresh
    try:
        data, problems = _validated(json.loads(raw))
    except Exception as exc:
        if not repair:
            return None
        aside = _aside(path)
        try:
            os.replace(path, aside)
            where = f"он сохранён как {aside.name}"
        except OSError:
            _memory[str(path)] = fresh
            where = "отложить его не удалось, прогресс хранится только в памяти"
        _warn(f"Файл прогресса {path} повреждён ({exc}); {where}. Прогресс начат заново.")
        return fresh
    if not problems or not repair:
        return None if problems else data
    aside = _aside(path)
    try:
        with open(aside, "xb") as fh:  # копия исходного файла, один раз: дальше файл исправен
            fh.write(raw)
        where = f"копия исходного файла — {aside.name}"
    except OSError:
        _memory[str(path)] = data
        where = "копию сохранить не удалось, исправленный прогресс хранится только в памяти"
    shown = "; ".join(problems[:5])
    if len(problems) > 5:
        shown += f"; и ещё записей с ошибками: {len(problems) - 5}"
    _warn(
        f"В файле прогресса {path}: {shown}. Неверные значения сброшены, остальной прогресс "
        f"сохранён; {where}."
    )
    if str(path) not in _memory:
        _save(data)
    return data


def _load() -> dict:
    """Прогресс: из памяти, если файл не записать, иначе из файла (чинит его один процесс)."""
    path = _progress_path()
    if str(path) in _memory:
        return _memory[str(path)]
    data = _read(path, repair=False)
    if data is None:
        with _locked(path):  # чинит один процесс, остальные прочтут исправленный файл
            data = _read(path, repair=True)
    return data


def _update(exercise_id: str, change: Callable[[dict], None]) -> dict:
    """Чтение, изменение записи упражнения и запись — под блокировкой, целиком."""
    with _locked(_progress_path()):
        data = _load()
        entry = data["exercises"].setdefault(exercise_id, _blank())
        change(entry)
        _save(data)
        return dict(entry)


def _save(data: dict) -> None:
    """Прогресс на диск атомарно; не вышло — в памяти и одно предупреждение на путь.

    Перед записью удаляет временные файлы прерванных записей старше _STALE_TMP_S секунд.
    """
    path = _progress_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            with contextlib.suppress(OSError):
                if time.time() - tmp.stat().st_mtime > _STALE_TMP_S:
                    tmp.unlink()
        atomic.write_text(path, json.dumps(data, ensure_ascii=False, indent=1))
    except OSError as exc:
        _memory[str(path)] = data
        _warn(
            f"Не удалось сохранить прогресс в {path} ({exc}). Он хранится только в памяти и "
            "пропадёт при перезапуске ядра; задайте другой путь в COURSE_PROGRESS_PATH.",
            once_key=str(path),
        )
    else:
        _memory.pop(str(path), None)


def _when(entry: dict) -> str:
    try:
        return dt.datetime.fromisoformat(entry["last_attempt"]).strftime("%Y-%m-%d %H:%M")
    except (TypeError, ValueError):
        return entry["last_attempt"] or "—"


def progress():
    """Таблица pandas по всем 21 проверочным шагам: статус, попытки, решено, вариант, время."""
    import pandas as pd

    _ensure_loaded()
    stored, rows = _load()["exercises"], []
    for key, topic in COURSE_STEPS.items():
        entry = stored.get(key, _blank())
        status = "решено" if entry["solved"] else "в работе" if entry["attempts"] else "не начато"
        row = {
            "id": key,
            "тема": topic,
            "статус": status if key in _registry else "нет в этой версии",
        }
        row |= {"попыток": entry["attempts"], "решено": "да" if entry["solved"] else "нет"}
        rows.append(row | {"вариант": entry["variant"], "последняя попытка": _when(entry)})
    return pd.DataFrame(rows)
