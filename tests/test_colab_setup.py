"""colab_setup.sh: ставит только недостающее, не трогает тяжёлые пакеты, идемпотентен.

Сеть не нужна: установку подменяет фальшивый pip (переменная COURSE_PIP), который пишет
вызовы в журнал и «ставит» пакет, создавая его dist-info в site-packages временного venv.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "numpy", "pandas", "matplotlib", "ipywidgets")

FAKE_PIP = r"""
import re, sys
from pathlib import Path
site, log = Path(sys.argv[1]), Path(sys.argv[2])
reqs = [a for a in sys.argv[3:] if not a.startswith("-")]
with log.open("a", encoding="utf-8") as f:
    f.write(" ".join(reqs) + "\n")
for req in reqs:
    name = re.split(r"[<>=!]", req)[0]
    d = site / f"{name}-9.9.9.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 9.9.9\n")
"""


@pytest.fixture()
def scratch(tmp_path):
    """Пустой venv без pip (как «голая» среда) и фальшивый pip для него."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    fake = tmp_path / "fake_pip.py"
    fake.write_text(FAKE_PIP)
    log = tmp_path / "pip.log"
    return py, site, log, f"{sys.executable} {fake} {site} {log}"


def run_setup(py, pip_cmd):
    env = {"PATH": "/usr/bin:/bin", "COURSE_PY": str(py), "COURSE_PIP": pip_cmd}
    return subprocess.run(
        ["bash", str(REPO / "colab_setup.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_complete_environment_installs_nothing(tmp_path):
    log = tmp_path / "pip.log"
    res = run_setup(sys.executable, f'{sys.executable} -c \'open("{log}", "w")\'')
    assert res.returncode == 0, res.stdout + res.stderr
    assert not log.exists(), "pip вызван, хотя всё установлено"
    assert "[FAIL]" not in res.stdout
    import torch

    assert f"[OK]   torch {torch.__version__}" in res.stdout
    assert "Окружение готово" in res.stdout


def test_missing_light_packages_installed_heavy_never(scratch):
    py, site, log, pip_cmd = scratch
    first = run_setup(py, pip_cmd)
    assert first.returncode != 0
    assert "Не хватает обязательных пакетов" in first.stderr
    for pkg in HEAVY:
        assert f"[FAIL] {pkg} не найден" in first.stdout
    calls = log.read_text().split()
    assert calls, "недостающие пакеты не установлены"
    assert "simpy>=4.1" in calls  # граница взята из requirements.txt
    assert not any(c.split(">")[0].split("=")[0] in HEAVY for c in calls)
    assert "[OK]   simpy 9.9.9 (установлен)" in first.stdout

    # повторный запуск: ставить больше нечего, результат тот же
    second = run_setup(py, pip_cmd)
    assert log.read_text().count("\n") == 1, "повторный запуск снова вызвал pip"
    assert second.returncode != 0
    assert "[OK]   simpy 9.9.9" in second.stdout


def test_succeeds_once_heavy_packages_present(scratch):
    py, site, log, pip_cmd = scratch
    for pkg in HEAVY:
        d = site / f"{pkg}-1.0.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 1.0\n")
    res = run_setup(py, pip_cmd)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[OK]   torch 1.0" in res.stdout


def test_failed_install_reported(scratch):
    py, site, log, _ = scratch
    res = run_setup(py, "false")
    assert res.returncode != 0
    assert "[FAIL] simpy так и не установлен" in res.stdout
