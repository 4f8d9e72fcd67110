"""Поведение проверочных шагов совпадает со снимком tests/golden/ байт в байт.

Снимок пишет ``python tests/exercises_golden.py [урок ...]``; осознанное изменение поведения
обновляет его в том же коммите (см. docstring модуля снимка).
"""

import difflib

import pytest
from exercises_golden import golden_path, lesson_text, lessons


@pytest.fixture(autouse=True)
def progress_path(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(tmp_path / "progress.json"))


@pytest.mark.parametrize("lesson", lessons())
def test_lesson_matches_golden(lesson):
    path = golden_path(lesson)
    assert path.exists(), f"нет снимка {path.name}: python tests/exercises_golden.py {lesson}"
    expected, actual = path.read_text(encoding="utf-8"), lesson_text(lesson)
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), "снимок", "сейчас", lineterm="", n=1
        )
        pytest.fail(f"{lesson}: поведение шагов изменилось:\n" + "\n".join(list(diff)[:60]))
