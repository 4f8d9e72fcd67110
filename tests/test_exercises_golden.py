"""Поведение проверочных шагов совпадает со снимком tests/golden/ байт в байт.

Снимок пишет ``python tests/exercises_golden.py [урок ...]``; осознанное изменение поведения
обновляет его в том же коммите (см. docstring модуля снимка).
"""

import difflib

import pytest
from exercises_golden import chosen, golden_path, step_text


@pytest.mark.parametrize("exercise_id", chosen([]))
def test_step_matches_golden(exercise_id):
    path = golden_path(exercise_id)
    assert path.exists(), f"нет снимка {path.name}: python tests/exercises_golden.py {exercise_id}"
    expected, actual = path.read_text(encoding="utf-8"), step_text(exercise_id)
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), "снимок", "сейчас", lineterm="", n=1
        )
        pytest.fail(f"{exercise_id}: поведение шага изменилось:\n" + "\n".join(list(diff)[:60]))
