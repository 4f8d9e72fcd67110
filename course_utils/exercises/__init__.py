"""Проверочные шаги курса: по модулю на урок, каждый вызывает ``grading.register(...)`` при импорте.

Реестр ``course_utils.grading`` импортирует этот пакет при первом обращении. Модули уроков, которых
ещё нет, пропускаются; ошибка импорта модуля урока не ломает остальные уроки: она выводится как
предупреждение и остаётся в ``LOAD_ERRORS`` (тесты упражнений проверяют, что он пуст).
"""

import importlib
import importlib.util
import warnings

LESSON_MODULES = ("lesson_12_1", "lesson_12_2", "lesson_12_3", "lesson_12_4", "lesson_12_5")

LOADED: list[str] = []
LOAD_ERRORS: dict[str, str] = {}

for _name in LESSON_MODULES:
    _full = f"{__name__}.{_name}"
    if importlib.util.find_spec(_full) is None:
        continue
    try:
        importlib.import_module(_full)
    except Exception as _exc:  # noqa: BLE001 — один сломанный урок не должен ломать остальные
        LOAD_ERRORS[_name] = f"{type(_exc).__name__}: {_exc}"
        warnings.warn(
            f"Упражнения {_full} не загрузились ({LOAD_ERRORS[_name]}); их шаги недоступны.",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        LOADED.append(_name)
