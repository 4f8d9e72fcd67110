"""Проверочные шаги курса: пакет на урок, модуль на шаг; модуль шага объявляет ``STEP = Step(...)``.

Реестр ``course_utils.grading`` импортирует этот пакет при первом обращении; загрузчик регистрирует
``STEP.exercise()`` каждого модуля из ``STEP_MODULES`` пакета урока. Ошибка импорта урока не ломает
остальные: она выводится как предупреждение и остаётся в ``LOAD_ERRORS`` (тесты упражнений
проверяют, что он пуст). Переходный период: шаги, ещё не перенесённые в пакеты, регистрирует
``legacy_12_*``; шаг, который уже есть в пакете, из него не регистрируется.
"""

import contextlib
import importlib
import importlib.util
import warnings

from course_utils import grading

LESSON_MODULES = ("lesson_12_1", "lesson_12_2", "lesson_12_3", "lesson_12_4", "lesson_12_5")

LOADED: list[str] = []
LOAD_ERRORS: dict[str, str] = {}
STEPS: dict = {}  # id шага → Step (схема ответа — для тестов ноутбуков)


def _register_steps(lesson: str) -> None:
    package = importlib.import_module(f"{__name__}.{lesson}")
    for name in package.STEP_MODULES:
        full = f"{package.__name__}.{name}"
        if importlib.util.find_spec(full) is not None:
            step = importlib.import_module(full).STEP
            grading.register(step.exercise())
            STEPS[step.id] = step


@contextlib.contextmanager
def _legacy_register():
    """На время импорта legacy-модуля register пропускает шаги, уже перенесённые в пакеты."""
    real = grading.register

    def register(exercise):
        return exercise if exercise.id in grading._registry else real(exercise)

    grading.register = register
    try:
        yield
    finally:
        grading.register = real


for _name in LESSON_MODULES:
    try:
        _register_steps(_name)
        _legacy = f"{__name__}.{_name.replace('lesson', 'legacy')}"
        if importlib.util.find_spec(_legacy) is not None:
            with _legacy_register():
                importlib.import_module(_legacy)
    except Exception as _exc:  # noqa: BLE001 — один сломанный урок не должен ломать остальные
        LOAD_ERRORS[_name] = f"{type(_exc).__name__}: {_exc}"
        warnings.warn(
            f"Упражнения {__name__}.{_name} не загрузились ({LOAD_ERRORS[_name]}); их шаги "
            "недоступны.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        LOADED.append(_name)
