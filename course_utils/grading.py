"""Проверочные шаги модуля 12: реестр упражнений, варианты, проверка, разборы, прогресс.

В ноутбуке: ``grading.task(id)`` — условие варианта, ``grading.check(id, ответ)`` — отзыв;
ещё ``hint``, ``solution`` (после попытки), ``new_variant``, ``progress()``. Темы шагов —
``data/course_steps.csv``, сами шаги (``Step``) регистрирует ``course_utils.exercises`` при первом
обращении. Прогресс — JSON в ``COURSE_PROGRESS_PATH`` (по умолчанию
``~/.course_rl_infra_progress.json``), запись атомарная и под flock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import importlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils import atomic
from course_utils.csv_tables import DATA_DIR, read_exact_csv

try:
    import fcntl as _fcntl
except ImportError:  # Windows: без межпроцессной блокировки (см. _locked)
    _fcntl = None


class _Placeholder:
    """Заглушка ответа: ячейка с ``____`` выполняется, а check отвечает «ещё не решено»."""

    _course_placeholder = True  # узнаём и копии, и заглушку из перезагруженного модуля

    def __repr__(self) -> str:
        return "____ (заполните ответ)"


____ = _Placeholder()

COURSE_STEPS: dict[str, str] = {
    row["id"]: row["title"]
    for _, row in read_exact_csv(DATA_DIR / "course_steps.csv", ("id", "title"), "шаги курса")
}


class AnswerError(Exception):
    """Ответ нельзя оценить (функция студента упала или зависла): ``status`` и ``message``."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Misconception:
    """Типичная ошибка: ``answer(task)`` — такой неверный ответ, ``message`` её называет,
    ``accepts(task, итог ответа)`` узнаёт её в ответе студента."""

    key: str
    message: str
    answer: Callable[[dict], Any]
    accepts: Callable[[dict, Any], bool]


@dataclass(frozen=True)
class Exercise:
    """Шаг для проверки (строит ``Step.exercise``): ``make_task(variant)`` → dict со ``statement``,
    ``reference(task)`` — верный ответ, ``solution(task)`` — разбор; ``answer`` — схема ответа
    с методами problem (форма), outcome (что сравнивать), same и mismatch (отзыв)."""

    id: str
    make_task: Callable[[int], dict]
    reference: Callable[[dict], Any]
    solution: Callable[[dict], str]
    hint: str
    misconceptions: list[Misconception]
    answer: Any

    @property
    def title(self) -> str:
        return COURSE_STEPS.get(self.id, self.id)

    @property
    def outcome(self) -> Callable[[Any, dict], Any]:
        return self.answer.outcome


# ---------------------------------------------------------------- реестр
_registry: dict[str, Exercise] = {}


def register(exercise: Exercise) -> None:
    """Добавляет упражнение в реестр; id и ключи его ошибок не повторяются."""
    if not isinstance(exercise, Exercise):
        raise TypeError(f"register ждёт Exercise, получено {type(exercise).__name__}")
    keys = [m.key for m in exercise.misconceptions]
    if exercise.id in _registry or len(set(keys)) != len(keys):
        raise ValueError(f"Упражнение {exercise.id!r} уже зарегистрировано или ключи повторяются")
    _registry[exercise.id] = exercise


def exercise_ids() -> list[str]:
    """Зарегистрированные упражнения в порядке COURSE_STEPS."""
    importlib.import_module("course_utils.exercises")  # при первом вызове регистрирует шаги
    order = {key: i for i, key in enumerate(COURSE_STEPS)}
    return sorted(_registry, key=lambda key: order.get(key, len(order)))


def _get(exercise_id: str) -> Exercise:
    ids = exercise_ids()
    key = exercise_id.strip() if isinstance(exercise_id, str) else None
    if key in _registry:
        return _registry[key]
    known = ", ".join(ids) or "пока ни одного"
    if key in COURSE_STEPS:
        raise ValueError(f"Упражнение {key} ещё не вошло в эту версию курса. Есть: {known}")
    raise ValueError(f"Неизвестное упражнение {exercise_id!r}. Известные: {known}")


def _entry(exercise_id: str) -> dict:
    return _load()["exercises"].get(exercise_id, _blank())


def task(exercise_id: str, variant: int | None = None) -> dict:
    """Входные данные упражнения; variant=None — текущий вариант студента (в начале 0)."""
    ex = _get(exercise_id)
    return ex.make_task(_entry(ex.id)["variant"] if variant is None else int(variant))


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
    fresh = ex.make_task(entry["variant"])
    _emit(f"🎲 {ex.id} «{ex.title}», вариант {entry['variant']}.", fresh["statement"])
    return fresh


def hint(exercise_id: str) -> None:
    """Показывает подсказку."""
    ex = _get(exercise_id)
    _emit(f"💡 Подсказка к {ex.id}.", ex.hint)


def solution(exercise_id: str) -> None:
    """Показывает разбор текущего варианта, если на нём была попытка — ответ верного вида
    (correct, wrong, misconception); ``____``, None и ответ не того вида разбор не открывают."""
    ex = _get(exercise_id)
    entry = _entry(ex.id)
    if entry["variant_attempts"]:
        return _emit(f"📖 Разбор {ex.id} «{ex.title}».", "\n\n" + ex.solution(task(ex.id)))
    which = f" варианта {entry['variant']}" if entry["variant"] else ""
    locked = f"🔒 Разбор{which} {ex.id} откроется после первой попытки на нём: впишите свой ответ вместо ____ и запустите grading.check. Засчитывается любой ответ верного вида, даже неверный."
    _emit("", locked)


# ---------------------------------------------------------------- проверка
def _plain(x: Any) -> Any:
    """numpy / torch / pandas → встроенные скаляры и списки Python."""
    if type(x).__module__.split(".")[0] in ("numpy", "torch", "pandas") and hasattr(x, "tolist"):
        return (x.detach().cpu() if hasattr(x, "detach") else x).tolist()
    return x


def _error_text(error: BaseException, width: int) -> str:
    """«Тип: сообщение» исключения не длиннее width символов (обрезка — «…»)."""
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:
        text = type(error).__name__
    return text if len(text) <= width else text[: width - 1] + "…"


_FALLBACK = "Ответ не совпал с верным: перечитайте условие, проверьте знак и единицы."
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
        icon, title = _STATUS[self.status]
        _emit(f"{icon} {self.exercise_id} — {title}", self.message)

    def _ipython_display_(self) -> None:
        just_shown = self._shown_in == ("shown", getattr(_shell(), "execution_count", None))
        self._shown_in = None
        if not just_shown:
            self._show()


def _contains_placeholder(x: Any, depth: int = 0) -> bool:
    with contextlib.suppress(Exception):
        if getattr(type(x), "_course_placeholder", False) is True:
            return True
        if isinstance(x, dict):
            x = [*x.keys(), *x.values()]
        if depth < 20 and isinstance(x, (list, tuple, set, frozenset)):
            return any(_contains_placeholder(item, depth + 1) for item in x)
    return False


def evaluate(exercise_id: str, answer: Any, variant: int = 0) -> CheckResult:
    """Проверяет ответ на варианте без записи попытки и без вывода (для тестов упражнений)."""
    ex = _get(exercise_id)
    schema = ex.answer
    if _contains_placeholder(answer):
        msg = f"Упражнение {ex.id} ещё не решено: замените ____ своим ответом и запустите ячейку."
        return CheckResult(ex.id, "not_attempted", msg)
    current = ex.make_task(variant)
    try:
        problem = schema.problem(answer, current)
    except Exception as exc:
        problem = f"Ответ не удалось разобрать ({type(exc).__name__}); сверьтесь с условием."
    if problem:
        return CheckResult(ex.id, "malformed", str(problem))
    try:
        given = schema.outcome(answer, current)
    except AnswerError as exc:
        return CheckResult(ex.id, exc.status, exc.message)
    expected = schema.outcome(ex.reference(current), current)
    try:
        if bool(schema.same(expected, given)):
            return CheckResult(ex.id, "correct", f"Упражнение {ex.id} решено.")
    except Exception as exc:
        msg = f"Ответ не удалось сравнить с верным ({_error_text(exc, 200)})."
        return CheckResult(ex.id, "malformed", f"{msg} Проверьте тип и форму ответа по условию.")
    for m in ex.misconceptions:
        with contextlib.suppress(Exception):
            if bool(m.accepts(current, given)):
                return CheckResult(ex.id, "misconception", m.message, misconception=m.key)
    try:
        detail = schema.mismatch(expected, given)
    except Exception:
        detail = _FALLBACK
    return CheckResult(ex.id, "wrong", f"{detail} Подсказка: grading.hint({ex.id!r}).")


def check(exercise_id: str, answer: Any) -> CheckResult:
    """Проверяет ответ на текущем варианте, записывает попытку и показывает отзыв. Не бросает
    исключений из-за ответа; ``____`` (и внутри списка или словаря) и ответ не того вида
    (malformed) попыткой не считаются."""
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
_warned: set[str] = set()  # пути, о которых уже предупредили, что запись не удалась
_thread_lock = threading.Lock()  # потоки одного ядра; между процессами — flock


class ProgressWarning(UserWarning):
    """Файл прогресса повреждён или недоступен."""


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


_RECORDED = {s for s in _STATUS if s != "not_attempted"}  # malformed: прежде считался попыткой
_FIELDS: dict[str, tuple[Any, Callable[[Any], bool]]] = {  # поле → (по умолчанию, допустимо ли)
    "attempts": (0, _count),
    "solved": (False, lambda v: type(v) is bool),
    "variant": (0, _count),
    "variant_attempts": (0, _count),
    "last_attempt": (None, _is_timestamp),
    "last_status": (None, lambda v: v is None or (isinstance(v, str) and v in _RECORDED)),
}


def _blank() -> dict:
    return {name: default for name, (default, _) in _FIELDS.items()}


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:39] + "…"


def _validated(raw: Any) -> tuple[dict, list[str]]:
    """Проверенный прогресс и список исправлений (неверное поле записи — к значению по умолчанию);
    ValueError — файл негоден целиком."""
    if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
        raise ValueError(f"ожидается словарь с format = {_FORMAT}")
    if not isinstance(raw.get("exercises"), dict):
        raise ValueError("поле exercises должно быть словарём")
    out, problems = {}, []
    for key, entry in raw["exercises"].items():
        if not isinstance(entry, dict):
            problems.append(f"запись упражнения {key} — не словарь: {_shown(entry)}")
            entry = {}
        bad = [k for k, (_, ok) in _FIELDS.items() if k in entry and not ok(entry[k])]
        fixed = _blank() | {k: entry[k] for k in _FIELDS if k in entry and k not in bad}
        if "attempts" in bad and (fixed["solved"] or fixed["last_status"]):
            fixed["attempts"] = 1  # попытка была: иначе решённому шагу снова закрылся бы разбор
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
    """Исключительный доступ к прогрессу: потоки — Lock, процессы — flock файла .<имя>.lock (без
    fcntl или если flock не удался, запись атомарна, но два ядра могут потерять попытку)."""
    with _thread_lock, contextlib.ExitStack() as stack:
        if _fcntl is not None:
            with contextlib.suppress(OSError):  # папка недоступна, сетевой диск без блокировок
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = stack.enter_context(open(path.with_name(f".{path.name}.lock"), "a"))
                _fcntl.flock(handle.fileno(), _fcntl.LOCK_EX)  # закрытие файла снимает flock
        yield


def _read(path: Path, repair: bool) -> dict | None:
    """Прогресс из файла; без repair — None, если файл нужно чинить. Починка: файл не JSON —
    прогресс начат заново, неверные поля записей сброшены по одному; рядом — копия исходного."""
    data = {"format": _FORMAT, "exercises": {}}
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return data
    except OSError as exc:
        _memory[str(path)] = data
        message = f"Не удалось прочитать прогресс {path} ({exc}); он хранится только в памяти."
        warnings.warn(message, ProgressWarning, stacklevel=4)
        return data
    reset = "Неверные значения сброшены, остальной прогресс сохранён"
    try:
        data, problems = _validated(json.loads(raw))
    except Exception as exc:
        problems, reset = [str(exc)], "Прогресс начат заново"
    if not problems or not repair:
        return None if problems else data
    aside = path.with_name(f"{path.name}.corrupt-{dt.datetime.now():%Y%m%d-%H%M%S-%f}")
    try:
        with open(aside, "xb") as fh:  # копия исходного файла, один раз: дальше файл исправен
            fh.write(raw)
        where = f"копия исходного файла — {aside.name}"
    except OSError:
        _memory[str(path)] = data
        where = "копию сохранить не удалось, прогресс хранится только в памяти"
    shown = "; ".join(problems[:5])
    if len(problems) > 5:
        shown += f"; и ещё записей с ошибками: {len(problems) - 5}"
    message = f"Файл прогресса {path} повреждён: {shown}. {reset}; {where}."
    warnings.warn(message, ProgressWarning, stacklevel=4)
    if str(path) not in _memory:
        _save(data)
    return data


def _load(locked: bool = False) -> dict:
    """Прогресс: из памяти, если файл не записать, иначе из файла; чинят его под блокировкой
    (``locked`` — вызывающий её уже держит)."""
    path = _progress_path()
    if str(path) in _memory:
        return _memory[str(path)]
    data = _read(path, repair=locked)
    if data is None:
        with _locked(path):  # чинит один процесс, остальные прочтут исправленный файл
            data = _read(path, repair=True)
    return data


def _update(exercise_id: str, change: Callable[[dict], None]) -> dict:
    """Чтение, изменение записи упражнения и запись — под блокировкой, целиком."""
    with _locked(_progress_path()):
        data = _load(locked=True)
        entry = data["exercises"].setdefault(exercise_id, _blank())
        change(entry)
        _save(data)
        return dict(entry)


def _save(data: dict) -> None:
    """Прогресс на диск атомарно (и без остатков прерванных записей); не вышло — в памяти и одно
    предупреждение на путь."""
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
        if str(path) not in _warned:
            _warned.add(str(path))
            message = f"Не удалось сохранить прогресс в {path} ({exc}). Он хранится только в памяти и пропадёт при перезапуске ядра; задайте другой путь в COURSE_PROGRESS_PATH."
            warnings.warn(message, ProgressWarning, stacklevel=3)
    else:
        _memory.pop(str(path), None)


def progress():
    """Таблица pandas по всем 21 проверочным шагам: статус, попытки, решено, вариант, время."""
    import pandas as pd

    exercise_ids()
    stored, rows = _load()["exercises"], []
    for key, topic in COURSE_STEPS.items():
        entry = stored.get(key, _blank())
        status = "решено" if entry["solved"] else "в работе" if entry["attempts"] else "не начато"
        status = status if key in _registry else "нет в этой версии"
        when = entry["last_attempt"]  # ISO 8601 или None: проверено при чтении
        when = dt.datetime.fromisoformat(when).strftime("%Y-%m-%d %H:%M") if when else "—"
        solved = "да" if entry["solved"] else "нет"
        rows.append((key, topic, status, entry["attempts"], solved, entry["variant"], when))
    columns = ["id", "тема", "статус", "попыток", "решено", "вариант", "последняя попытка"]
    return pd.DataFrame(rows, columns=columns)
