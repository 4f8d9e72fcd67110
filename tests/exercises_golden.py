"""Снимок поведения проверочных шагов: условие, подсказка, разбор, верный ответ и вердикты.

Для шага и вариантов 0–7: текст условия, разбор, верный ответ и то, что ``grading.evaluate``
отвечает на верный ответ, на ответ каждой типичной ошибки и на полтора десятка ответов не того
вида. ``tests/test_exercises_golden.py`` сверяет снимок с ``tests/golden/exercises_<урок>.json``
байт в байт. Осознанное изменение поведения обновляет файл в том же коммите:

    python tests/exercises_golden.py            # все уроки
    python tests/exercises_golden.py 12.4 12.5  # только эти
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


def lesson_of(exercise_id):
    return ".".join(exercise_id.split(".")[:2])


def lessons():
    return sorted({lesson_of(i) for i in grading.exercise_ids()})


def lesson_text(lesson):
    """Снимок урока как текст файла: JSON с отступами, UTF-8, перевод строки в конце."""
    steps = [step_snapshot(i) for i in grading.exercise_ids() if lesson_of(i) == lesson]
    return json.dumps(steps, ensure_ascii=False, indent=1) + "\n"


def golden_path(lesson):
    return GOLDEN / f"exercises_{lesson.replace('.', '_')}.json"


if __name__ == "__main__":
    import os
    import tempfile

    os.environ["COURSE_PROGRESS_PATH"] = str(Path(tempfile.mkdtemp()) / "progress.json")
    GOLDEN.mkdir(exist_ok=True)
    for lesson in sys.argv[1:] or lessons():
        golden_path(lesson).write_text(lesson_text(lesson), encoding="utf-8")
        print(f"записан {golden_path(lesson).relative_to(ROOT)}")
