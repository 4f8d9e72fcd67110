"""Строка окружения второй ячейки ноутбука."""

import platform

import torch
import transformers

import course_utils
from course_utils import environment


def test_setup_notebook_prints_one_line(capsys, monkeypatch):
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    summary = course_utils.setup_notebook()
    out = capsys.readouterr().out.strip()
    assert "\n" not in out
    for part in (
        course_utils.__version__,
        platform.python_version(),
        torch.__version__,
        transformers.__version__,
    ):
        assert part in out
    assert summary["level_b_model"].startswith("крошечная модель")
    assert summary["device"] == ("cpu" if not torch.cuda.is_available() else summary["device"])


def test_course_model_env_is_reported(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL", "org/custom-model")
    assert environment.setup_notebook()["level_b_model"] == "org/custom-model (из COURSE_MODEL)"
