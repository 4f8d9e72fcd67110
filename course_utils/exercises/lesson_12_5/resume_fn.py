"""12.5.10 — функция resume: ветвь после аварии совпадает с непрерывной (checkpoint.run_crash_test).

Ответ — функция; её прогоняет проверка аварией под ограничением времени, а состояние запуска сразу
после resume сравнивается по компонентам с полным восстановлением. Итог — данные (``_Crash``), по
ним узнаются типичные ошибки. torch загружается при первой проверке.
"""

import copy
import functools
import json
import math
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course_utils.exercises.answers import AnswerType, Function
from course_utils.exercises.step import Step, Trap
from course_utils.grading import AnswerError


def _except(component: str) -> Callable:
    """resume, которая загружает всё, кроме ``component``: он остаётся как у нового запуска."""

    def resume(run_factory: Callable, checkpoint_path: Any) -> Any:
        from course_utils import checkpoint

        run = run_factory()
        state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)
        state[component] = run.state_dict()[component]
        run.load_state_dict(state)
        return run

    resume.__qualname__ = f"resume_without_{component}"
    return resume


def _weights_only(run_factory: Callable, checkpoint_path: Any) -> Any:
    from course_utils import checkpoint

    run = run_factory()
    run.load_weights_only(checkpoint.load_checkpoint(checkpoint_path, config=run.config))
    return run


def _dropped_queue(run_factory: Callable, checkpoint_path: Any) -> Any:
    from course_utils import checkpoint

    run = run_factory()
    run.load_state_dict(checkpoint.load_checkpoint(checkpoint_path, config=run.config), "drop")
    return run


# ключ ошибки → (неверная resume, подпись для разбора)
WRONG = {
    "weights_only": (_weights_only, "только веса: `run.load_weights_only(state)`"),
    "forgot_rng": (_except("rng"), "всё, кроме генераторов случайных чисел (`rng`)"),
    "forgot_cursor": (_except("data_cursor"), "всё, кроме курсора данных (`data_cursor`)"),
    "forgot_queue": (
        _dropped_queue,
        'всё, но очередь отброшена: `run.load_state_dict(state, queue="drop")`',
    ),
}


def _same(a: Any, b: Any) -> bool:
    """Побитовое равенство состояний: тензоры — torch.equal, словари и списки — рекурсивно."""
    if "torch" in (type(a).__module__.split(".")[0], type(b).__module__.split(".")[0]):
        import torch

        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))  # fmt: skip
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_same(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))  # fmt: skip
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _crash(fn: Callable, params: dict) -> dict:
    """Проверка аварией со своей resume; итог — данные: где расходится full, что не восстановлено.

    error — текст исключения (None — нет), stage — где: "resume" или "steps" (шаги после неё);
    diff — компоненты состояния сразу после resume, не совпавшие с полным восстановлением.
    KeyboardInterrupt и остановка по времени проходят наружу (их разбирает call_with_deadline).
    """
    from course_utils import checkpoint

    rec: dict[str, Any] = {"error": None, "stage": None, "returned": None, "diff": None}

    def wrapped(run_factory: Callable, checkpoint_path: Any) -> Any:
        rec["stage"] = "resume"
        run = fn(run_factory, checkpoint_path)
        rec["returned"] = type(run).__name__
        if not isinstance(run, checkpoint.ToyRLRun):
            raise _NotARun
        good = checkpoint.resume_full(run_factory, checkpoint_path).state_dict()
        try:
            state = run.state_dict()
            rec["diff"] = [c for c in checkpoint.COMPONENTS if not _same(state.get(c), good.get(c))]
        except Exception:
            rec["diff"] = None
        rec["stage"] = "steps"
        return run

    try:
        with tempfile.TemporaryDirectory(prefix="course_12_5_10_") as tmp:
            res = checkpoint.run_crash_test(**params, resume=wrapped, workdir=tmp)
    except _NotARun:
        return {**rec, "error": "not_a_run"}
    except Exception as exc:
        return {**rec, "error": f"{type(exc).__name__}: {exc}"[:300]}
    step = res.first_divergence("full")
    return {**rec, "diverges": step, "fields": res.diverged_fields("full", step) if step else [],
            "complete": len(res.branches["full"]) == res.total_steps, "restored": res.restored_step,
            "weights_only": res.first_divergence("weights_only"),
            "recomputed": res.recomputed_identical}  # fmt: skip


class _NotARun(Exception):
    """resume вернула не ToyRLRun."""


@functools.lru_cache(maxsize=512)
def _crash_cached(fn: Callable, params_json: str) -> dict:
    return _crash(fn, json.loads(params_json))


def _run(fn: Callable, task: dict) -> dict:
    """Итог проверки аварией; наши функции (эталон и ошибки) — из кэша: они детерминированы."""
    from course_utils import checkpoint

    ours = fn is checkpoint.resume_full or any(fn is f for f, _ in WRONG.values())
    params = task["crash_test"]
    return copy.deepcopy(
        _crash_cached(fn, json.dumps(params, sort_keys=True)) if ours else _crash(fn, params)
    )


def _passed(rec: dict) -> bool:
    return rec["diverges"] is None and rec["complete"]


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_10_000 + 7919 * variant)
    every = rng.choice([2, 3, 4])
    s0 = every * rng.choice([1, 2] if every > 2 else [2, 3])
    crash = s0 + (rng.randint(1, every - 1) if every > 1 else 0)
    total = crash + rng.randint(2, 4)
    seed = rng.randint(0, 99)
    params = {"total_steps": total, "crash_at": crash, "checkpoint_every": every, "seed": seed}
    statement = (
        "**Напишите `resume`.** Проверка аварией шага 12.5.3 на учебном запуске "
        f"`checkpoint.ToyRLRun` (seed = {seed}): всего {total} шагов, контрольная точка "
        f"пишется после каждого шага, кратного {every}, авария — сразу после шага {crash}. "
        f"Восстанавливаться придётся с последней полной контрольной точки `step-{s0:06d}` "
        f"(шаг s₀ = ⌊{crash}/{every}⌋·{every} = {s0}); "
        + (
            f"шаг {crash} будет пересчитан"
            if crash == s0 + 1
            else f"шаги {s0 + 1}…{crash} будут пересчитаны"
        )
        + ".\n\n"
        "Напишите функцию\n\n```python\ndef resume(run_factory, checkpoint_path):\n    ...\n"
        "    return run\n```\n\n"
        "Контракт `checkpoint.run_crash_test`: `run_factory()` без аргументов создаёт **новый** "
        "`ToyRLRun` той же конфигурации (seed, гиперпараметры, среда); `checkpoint_path` — "
        "`pathlib.Path` каталога контрольной точки; вернуть нужно запуск, чей следующий "
        f"`step()` — шаг {s0 + 1} **того же** эксперимента.\n\n"
        "Под рукой: `checkpoint.load_checkpoint(path, config=run.config)` — проверенная "
        "загрузка (размеры и SHA-256 файлов, хэш конфигурации), словарь «компонент → "
        "состояние»; компоненты и что ломается без каждого — `checkpoint.COMPONENTS` "
        "(таблицей — `checkpoint.components_frame()`). У запуска: `run.state_dict()`, "
        "`run.load_state_dict(state, queue=None)` (все компоненты сразу; `queue` — что делать "
        "с пакетами «в полёте»: `None` — политика, объявленная в самой контрольной точке) и "
        "`run.load_weights_only(state)`.\n\n"
        f"Проверка: `checkpoint.run_crash_test(total_steps={total}, crash_at={crash}, "
        f"seed={seed}, checkpoint_every={every}, resume=resume)` (параметры — "
        "`task['crash_test']`) строит три ветви. Ответ верен, если ветвь **full** — с вашей "
        f"`resume` — совпадает с непрерывной на всех {total} шагах побитово (так строго — "
        "потому что учебный запуск однопроцессный и детерминированный; от распределённого "
        "запуска требуют сохранить семантику эксперимента, см. шаг 12.5.3). Запустить проверку "
        "можно и самому: `print(checkpoint.run_crash_test(**task['crash_test'], "
        "resume=resume))`.\n\n"
        "Ответ — сама функция: `answer_12_5_10 = resume` (без скобок). Готовая "
        "`checkpoint.resume_full` — для сверки после решения."
    )
    return {"statement": statement, "crash_test": params, "restored_step": s0}


_CODE = """```python
from course_utils import checkpoint


def resume(run_factory, checkpoint_path):
    run = run_factory()  # новый запуск той же конфигурации: seed, гиперпараметры, среда
    # проверенная загрузка: размеры, SHA-256 файлов и хэш конфигурации сверяются с manifest.json
    state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)
    # всё состояние сразу; очередь «в полёте» — по политике, объявленной в контрольной точке
    run.load_state_dict(state)
    return run


answer_12_5_10 = resume
```"""


def _row(label: str, rec: dict, total: int) -> str:
    if rec["error"] is not None:
        return f"| {label} | упала: {rec['error']} | — |"
    if rec["diverges"] is None:
        return f"| {label} | совпадает на всех {total} шагах | — |"
    diff = ", ".join(f"`{c}`" for c in rec["diff"] or []) or "—"
    return (
        f"| {label} | расходится на шаге {rec['diverges']} ({', '.join(rec['fields'])}) | {diff} |"
    )


def solution(task: dict, ref: Callable) -> str:
    from course_utils import checkpoint

    p, s0 = task["crash_test"], task["restored_step"]
    total, crash = p["total_steps"], p["crash_at"]
    good = _run(checkpoint.resume_full, task)
    rows = [_row("`resume_full` (эталон)", good, total)]
    rows += [_row(label, _run(fn, task), total) for fn, label in WRONG.values()]
    wo = good.get("weights_only")
    wo_text = (
        f"Встроенная ветвь `weights_only` той же проверки совпадает до шага {s0} (эти события — "
        f"общие, до аварии) и расходится на шаге {wo}: сразу после восстановления."
        if wo is not None
        else ""
    )
    return (
        "Восстановление — это продолжение **того же** эксперимента, а не перезапуск с тёплыми "
        "весами. Запуску после аварии нужно всё, что влияет на следующий шаг: веса, моменты "
        "AdamW, положение планировщика, счётчики и версии, генераторы случайных чисел, курсор "
        "данных, учебную программу, нормировщик наград, версии компонентов и очередь роллаутов "
        "«в полёте». Всё это лежит в контрольной точке, и `load_state_dict` загружает всё "
        "сразу, предварительно проверив, что все компоненты на месте:\n\n"
        f"{_CODE}\n\n"
        f"Проверка варианта: total_steps = {total}, crash_at = {crash}, checkpoint_every = "
        f"{p['checkpoint_every']}, seed = {p['seed']}. Последняя полная контрольная точка — "
        f"после шага s₀ = {s0}; "
        + (
            f"шаг {crash} потерян при аварии и пересчитан заново"
            if crash == s0 + 1
            else f"шаги {s0 + 1}…{crash} потеряны при аварии и пересчитаны заново"
        )
        + " (совпадение пересчёта с потерянными: "
        f"{'да' if good.get('recomputed') else 'нет'}). {wo_text}\n\n"
        "Что дают эта функция и типичные ошибки (ветвь full против непрерывной; последний "
        "столбец — компоненты, которые сразу после resume не совпали с контрольной точкой):\n\n"
        "| resume | ветвь full | не восстановлено |\n|---|---|---|\n"
        + "\n".join(rows)
        + '\n\nОчередь: контрольная точка объявляет `on_restore = "keep"`, поэтому пакет, '
        "созданный до аварии старой версией политики, возвращается в очередь. Отбросить его "
        '(`queue="drop"`) — законная, но *другая* политика: она должна быть объявлена, а '
        "продолжение тогда уже не совпадает с непрерывной ветвью. В распределённом запуске "
        "побитового совпадения не требуют, но семантику эксперимента сохраняют так же."
    )


@dataclass(frozen=True)
class _Crash(AnswerType):
    """Итог проверки аварией (словарь из _crash): верен, если ветвь full совпала с непрерывной."""

    def same(self, expected: Any, given: Any) -> bool:
        return _passed(given)

    def mismatch(self, expected: Any, rec: Any) -> str:
        from course_utils import checkpoint

        step = rec["diverges"]
        when = " — сразу после восстановления" if step == rec["restored"] + 1 else ""
        text = (f"Ветвь full совпадает с непрерывной до шага {step - 1} и расходится на шаге "
                f"{step}{when} (различаются поля события: {', '.join(rec['fields'])})")  # fmt: skip
        if rec["diff"]:
            notes = "; ".join(f"{c} — {checkpoint.COMPONENTS[c][1]}" for c in rec["diff"])
            text += f". Сразу после вашей resume не совпадает с контрольной точкой: {notes}"
        elif rec["diff"] == []:
            text += (". Состояние запуска сразу после resume совпадает с контрольной точкой, а шаги "
                     "расходятся: не подменяет ли resume методы или генераторы запуска?")  # fmt: skip
        return text + "."


@dataclass(frozen=True)
class _Resume(Function):
    """Function, у которой упавшая проверка аварией — отзыв (AnswerError), а не итог для сравнения."""

    def outcome(self, fn: Callable, task: dict) -> Any:
        rec = super().outcome(fn, task)
        if rec["error"] == "not_a_run":
            raise AnswerError("malformed", f"resume должна вернуть восстановленный запуск ToyRLRun, а вернула "
                              f"{rec['returned']}: не забыт ли `return run`?")  # fmt: skip
        if rec["error"] is not None:
            where = {"resume": "внутри вашей resume",
                     "steps": "на шагах после восстановления (запуск, который вернула resume, не работает)",
                     }.get(rec["stage"], "до вызова resume")  # fmt: skip
            raise AnswerError("wrong", f"Проверка аварией упала {where}: {rec['error']}.")
        return rec


def _core(rec: dict) -> set | None:
    """Что не восстановлено из «ядра» состояния; None — не сравнить или не восстановлены веса."""
    diff = rec["diff"]
    if diff is None or "policy" in diff:
        return None
    return set(diff) & {"optimizer", "scheduler", "rng", "data_cursor", "queue"}


def solve(task: dict) -> Callable:
    from course_utils import checkpoint

    return checkpoint.resume_full


def _trap(key: str, message: str, test: Callable[[set], bool]) -> Trap:
    def matches(task: dict, rec: dict) -> bool:
        core = _core(rec)
        return not _passed(rec) and core is not None and test(core, set(rec["diff"]))

    return Trap(key, message, wrong=lambda t, ref: WRONG[key][0], matches=matches)


STEP = Step(
    id="12.5.10", make_task=make_task, solve=solve, solution=solution,
    answer=_Resume(_run, _Crash(), arity=2, signature="resume(run_factory, checkpoint_path)", deadline_s=10.0),
    hint=(
        "run = run_factory(); state = checkpoint.load_checkpoint(checkpoint_path, "
        "config=run.config); загрузите ВСЁ состояние, а не только веса: "
        "run.load_state_dict(state) (очередь — по политике, объявленной в контрольной "
        "точке); return run. Проверить себя: "
        "print(checkpoint.run_crash_test(**task['crash_test'], resume=resume))."
    ),
    traps=(
        _trap("weights_only", "Это восстановление «только весов», выданное за продолжение: оптимизатор, "
              "планировщик, генераторы случайных чисел, курсор данных, учебная программа, "
              "нормировщик и очередь — как у нового запуска. Ветвь расходится с непрерывной "
              "сразу после восстановления. Загрузите всё состояние: run.load_state_dict(state).",
              lambda core, diff: {"optimizer", "scheduler"} <= diff),
        _trap("forgot_rng", "Не восстановлены состояния генераторов случайных чисел: после перезапуска другие "
              "сэмплированные действия и другой порядок мини-пакетов, и ветвь расходится с "
              "непрерывной на первом же шаге. Генераторы (Python, NumPy, torch) — часть "
              "контрольной точки, компонент rng.", lambda core, diff: core == {"rng"}),
        _trap("forgot_cursor", "Не восстановлен курсор данных: поток запросов после перезапуска начинается "
              "заново, одни запросы повторяются, другие пропускаются. Компонент data_cursor "
              "(эпоха, индекс, сколько прочитано) нужно загрузить вместе с остальным.",
              lambda core, diff: core == {"data_cursor"}),
        _trap("forgot_queue", "Очередь роллаутов «в полёте» не восстановлена (или отброшена вопреки политике "
              "keep, объявленной в контрольной точке): пакет, созданный до аварии старой "
              "версией политики, пересоздаётся заново текущей, и данные обновления молча "
              "другие. Загрузите queue вместе с остальным (queue=None — объявленная политика).",
              lambda core, diff: core == {"queue"}),
    ),
)  # fmt: skip
