"""Атомарная запись: старый файл целиком или новый целиком, временных файлов не остаётся."""

import os
import stat

import pytest

from course_utils import atomic


def test_write_text_replaces_whole_file_and_leaves_no_temps(tmp_path):
    target = tmp_path / "rank_0.json"
    atomic.write_text(target, '{"a": 1}')
    atomic.write_text(target, '{"a": 2}')
    assert target.read_text(encoding="utf-8") == '{"a": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["rank_0.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # не 0600 от mkstemp


@pytest.mark.parametrize("broken", ["write", "fsync", "replace"])
def test_failure_keeps_old_file_and_removes_temp(tmp_path, monkeypatch, broken):
    target = tmp_path / "progress.json"
    target.write_text("старое", encoding="utf-8")

    def boom(*args, **kwargs):
        raise OSError("сбой диска (имитация)")

    def interrupted(f):  # Ctrl+C посреди записи временного файла
        f.write("новое, но недописанное".encode())
        raise KeyboardInterrupt

    if broken == "write":
        with pytest.raises(KeyboardInterrupt):
            atomic.temp_file(tmp_path, target.name, interrupted)
    else:
        monkeypatch.setattr(os, broken, boom)
        with pytest.raises(OSError):
            atomic.write_text(target, "новое")
    monkeypatch.undo()
    assert target.read_text(encoding="utf-8") == "старое"
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]
