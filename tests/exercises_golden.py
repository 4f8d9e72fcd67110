"""Снимок поведения проверочных шагов: условие, подсказка, разбор, верный ответ и вердикты.

Для шага и вариантов 0–7: текст условия, разбор, верный ответ и то, что ``grading.evaluate``
отвечает на верный ответ, на ответ каждой типичной ошибки и на полтора десятка ответов не того
вида (числа — с 12 значащими цифрами). ``tests/test_exercises_golden.py`` сверяет снимок с ``tests/golden/<шаг>.json`` (``12_5_10.json``)
байт в байт. Осознанное изменение поведения обновляет файл в том же коммите:

    python tests/exercises_golden.py                # все шаги
    python tests/exercises_golden.py 12.4 12.5.10   # шаги урока 12.4 и шаг 12.5.10
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils import grading  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"
VARIANTS = range(8)


def _garbage_function():
    return None


def _js(x):
    """Ответ → JSON без адресов памяти и без неоднозначности: множества помечены и отсортированы."""
    x = grading._plain(x)
    if isinstance(x, dict):
        return {str(k): _js(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_js(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return {"<set>": sorted((_js(v) for v in x), key=repr)}
    if isinstance(x, float) and not math.isfinite(x):
        return f"<float {x}>"
    if isinstance(x, float):  # последний бит exp/log разнится между версиями numpy
        return float(f"{x:.12g}")  # 12 значащих цифр
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if callable(x) and type(x).__repr__ is object.__repr__ or type(x).__name__ == "function":
        return f"<{type(x).__name__} {getattr(x, '__qualname__', '?')}>"
    return f"<{type(x).__name__} {x!r}>"


def malformed_answers(ref):
    """Дюжина ответов не того вида плюс порча верного словаря (без ключа, чужой тип, лишний)."""
    out = [None, "", "ответ", 0, -1.5, float("nan"), True, [], [1, "x"], {}, {"лишний_ключ": 1},
           _garbage_function]  # fmt: skip
    if isinstance(ref, dict) and ref:
        first = next(iter(ref))
        out.append({k: v for k, v in ref.items() if k != first})
        out.append({**ref, first: "abc"})
        out.append({**ref, "лишний_ключ": 1})
    return out


def _verdict(exercise_id, answer, variant):
    result = grading.evaluate(exercise_id, answer, variant)
    return {
        "status": result.status,
        "misconception": result.misconception,
        "message": result.message,
    }


def step_snapshot(exercise_id):
    ex = grading._get(exercise_id)
    variants = []
    for variant in VARIANTS:
        task = grading.task(exercise_id, variant)
        ref = ex.reference(task)
        traps = []
        for m in ex.misconceptions:
            wrong = m.answer(copy.deepcopy(task))
            traps.append({"key": m.key, "answer": _js(wrong),
                          "verdict": _verdict(exercise_id, wrong, variant)})  # fmt: skip
        variants.append(
            {
                "variant": variant,
                "statement": task["statement"],
                "solution": ex.solution(task),
                "reference": _js(ref),
                "reference_verdict": _verdict(exercise_id, ref, variant),
                "misconceptions": traps,
                "malformed": [
                    {"answer": _js(bad), "verdict": _verdict(exercise_id, bad, variant)}
                    for bad in malformed_answers(ref)
                ],
            }
        )
    return {"id": ex.id, "title": ex.title, "hint": ex.hint, "variants": variants}


def step_text(exercise_id):
    """Снимок шага как текст файла: JSON с отступами, UTF-8, перевод строки в конце."""
    return json.dumps(step_snapshot(exercise_id), ensure_ascii=False, indent=1) + "\n"


def golden_path(exercise_id):
    return GOLDEN / f"{exercise_id.replace('.', '_')}.json"


def chosen(prefixes):
    """Шаги, чьи id начинаются с одного из префиксов (``12.5``, ``12.5.10``); без префиксов — все."""
    ids = grading.exercise_ids()
    return [
        i for i in ids if not prefixes or any(i == p or i.startswith(p + ".") for p in prefixes)
    ]


if __name__ == "__main__":
    import os
    import tempfile

    os.environ["COURSE_PROGRESS_PATH"] = str(Path(tempfile.mkdtemp()) / "progress.json")
    GOLDEN.mkdir(exist_ok=True)
    for exercise_id in chosen(sys.argv[1:]):
        golden_path(exercise_id).write_text(step_text(exercise_id), encoding="utf-8")
        print(f"записан {golden_path(exercise_id).relative_to(ROOT)}")
