"""Проверочные шаги курса: пакет на урок, модуль на шаг; модуль шага объявляет ``STEP = Step(...)``.

``course_utils.grading`` импортирует этот пакет при первом обращении к реестру, и шаги уроков
регистрируются. Ошибка импорта урока не ломает остальные: она выводится как предупреждение
и остаётся в ``LOAD_ERRORS`` (тесты упражнений проверяют, что он пуст)."""

import importlib
import pkgutil
import warnings

from course_utils import grading

LESSON_MODULES = ("lesson_12_1", "lesson_12_2", "lesson_12_3", "lesson_12_4", "lesson_12_5")
LOADED: list[str] = []
LOAD_ERRORS: dict[str, str] = {}
STEPS: dict = {}  # id шага → Step (схема ответа — для тестов ноутбуков)

for _name in LESSON_MODULES:
    try:
        _package = importlib.import_module(f"{__name__}.{_name}")
        _names = sorted(m.name for m in pkgutil.iter_modules(_package.__path__))
        _modules = [importlib.import_module(f"{_package.__name__}.{m}") for m in _names]
    except Exception as _exc:  # noqa: BLE001 — один сломанный урок не должен ломать остальные
        LOAD_ERRORS[_name] = f"{type(_exc).__name__}: {_exc}"
        _text = f"Упражнения {__name__}.{_name} не загрузились ({LOAD_ERRORS[_name]}); их шаги недоступны."
        warnings.warn(_text, RuntimeWarning, stacklevel=2)
        continue
    for _step in (m.STEP for m in _modules if hasattr(m, "STEP")):  # без STEP — помощники урока
        grading.register(_step.exercise())
        STEPS[_step.id] = _step
    LOADED.append(_name)
