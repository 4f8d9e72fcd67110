"""Общее для тестов: у каждого теста свой файл прогресса проверочных шагов (не ~/.course_…)."""

import pytest


@pytest.fixture(autouse=True)
def progress_path(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("COURSE_PROGRESS_PATH", str(path))
    return path
