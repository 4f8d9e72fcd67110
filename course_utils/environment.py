"""Строка окружения для второй ячейки каждого ноутбука."""

from __future__ import annotations

import platform
import sys


def setup_notebook() -> dict:
    """Печатает одну строку окружения и возвращает её поля словарём: версии course_utils, Python,
    torch, transformers, устройство (GPU) и модель уровня B."""
    import torch
    import transformers

    import course_utils
    from course_utils.policy import DEFAULT_HUB_MODEL, TINY_MODEL_NAME, resolve_model_name

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        cap = torch.cuda.get_device_capability(0)
        device = f"cuda ({props.name}, {props.total_memory / 2**30:.1f} ГиБ, sm_{cap[0]}{cap[1]})"
    else:
        device = "cpu"
    model = resolve_model_name()
    if model == TINY_MODEL_NAME:
        model_text = "крошечная модель курса (data/tiny_arith_lm)"
    elif model == DEFAULT_HUB_MODEL:
        model_text = f"{model} (если хаб недоступен — крошечная модель курса)"
    else:
        model_text = f"{model} (из COURSE_MODEL)"
    s = {
        "course_utils": course_utils.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "colab": "google.colab" in sys.modules,
        "level_b_model": model_text,
    }
    where = "Colab" if s["colab"] else "локально"
    print(
        f"course_utils {s['course_utils']} | Python {s['python']} | torch {s['torch']} | "
        f"transformers {s['transformers']} | {where}, устройство: {s['device']} | "
        f"модель уровня B: {s['level_b_model']}"
    )
    return s
