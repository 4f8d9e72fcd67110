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


def test_package_has_no_format_exemptions():
    """Форматтер не отключён в course_utils: строки не склеены в обход ruff format."""
    marks = ("# fmt: skip", "# fmt: off")
    hits = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "course_utils").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(mark in line for mark in marks)
    ]
    assert not hits, f"отключение форматтера в course_utils: {hits}"
