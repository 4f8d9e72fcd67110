"""Стиль кода: ruff check и ruff format --check без замечаний (настройки — pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _ruff(*args):
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    return subprocess.run([exe, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_clean():
    res = _ruff("check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_clean():
    res = _ruff("format", "--check", ".")
    assert res.returncode == 0, res.stdout + res.stderr
