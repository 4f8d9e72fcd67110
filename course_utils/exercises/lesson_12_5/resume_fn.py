"""12.5.10 — функция resume: ветвь после аварии совпадает с непрерывной (checkpoint.run_crash_test).

Функцию студента прогоняет проверка аварией под ограничением времени; состояние запуска сразу
после resume сравнивается по компонентам (checkpoint.COMPONENTS) с полным восстановлением. Итог —
данные, по ним узнаются ошибки: каждый забытый компонент, «только веса», «контрольная точка не
прочитана». Варианты строятся так, что контрольная точка пишется уже после смены верификатора и
повышения уровня учебной программы. torch загружается при первой проверке.
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

from course_utils import checkpoint
from course_utils.exercises.answers import AnswerType, Function
from course_utils.exercises.step import Step, Trap
from course_utils.grading import AnswerError

_SIG = "resume(run_factory, checkpoint_path)"


def _except(component: str) -> Callable:
    """resume, которая загружает всё, кроме ``component``: он остаётся как у нового запуска."""

    def resume(run_factory: Callable, checkpoint_path: Any) -> Any:
        run = run_factory()
        state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)
        run.load_state_dict({**state, component: run.state_dict()[component]})
        return run

    resume.__qualname__ = f"resume_without_{component}"
    return resume


def _weights_only(run_factory: Callable, checkpoint_path: Any) -> Any:
    run = run_factory()
    run.load_weights_only(checkpoint.load_checkpoint(checkpoint_path, config=run.config))
    return run


def _ignores(run_factory: Callable, checkpoint_path: Any) -> Any:
    return run_factory()


_KEY = {c: f"forgot_{'cursor' if c == 'data_cursor' else c}" for c in checkpoint.COMPONENTS}
WRONG = {_KEY[c]: (_except(c), f"всё, кроме `{c}`") for c in checkpoint.COMPONENTS} | {
    "weights_only": (_weights_only, "только веса: `run.load_weights_only(state)`"),
    "ignores_checkpoint": (_ignores, "новый запуск: `return run_factory()`"),
}  # ключ ошибки → (неверная resume, подпись для разбора)


def _same(a: Any, b: Any) -> bool:
    """Побитовое равенство состояний: тензоры — torch.equal, словари и списки — рекурсивно."""
    if hasattr(a, "dtype") or hasattr(b, "dtype"):
        import torch

        return all(isinstance(x, torch.Tensor) for x in (a, b)) and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))  # fmt: skip
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)  # fmt: skip
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return all(isinstance(x, (list, tuple)) for x in (a, b)) and len(a) == len(b) and all(map(_same, a, b))  # fmt: skip
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _crash(fn: Callable, params: dict) -> dict:
    """Проверка аварией со своей resume; итог — данные: где расходится full, что не восстановлено.

    error — текст исключения; stage — где: "resume" или "steps" (шаги после неё); diff —
    компоненты состояния сразу после resume, не совпавшие с полным восстановлением. Ctrl+C и
    остановка по времени проходят наружу: их разбирает call_with_deadline.
    """
    rec: dict[str, Any] = {"error": None, "stage": None, "returned": None, "diff": None}

    def wrapped(run_factory: Callable, checkpoint_path: Any) -> Any:
        rec["stage"] = "resume"
        run = fn(run_factory, checkpoint_path)
        rec["returned"] = type(run).__name__
        if not isinstance(run, checkpoint.ToyRLRun):
            raise _NotARun
        good = checkpoint.resume_full(run_factory, checkpoint_path).state_dict()
        try:
            rec["diff"] = [c for c, v in run.state_dict().items() if not _same(v, good.get(c))]
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
            "weights_only": res.first_divergence("weights_only"), "recomputed": res.recomputed_identical}  # fmt: skip


class _NotARun(Exception):
    """resume вернула не ToyRLRun."""


@functools.lru_cache(maxsize=512)
def _crash_cached(fn: Callable, params_json: str) -> dict:
    return _crash(fn, json.loads(params_json))


def _run(fn: Callable, task: dict) -> dict:
    """Итог проверки аварией; эталон и наши неверные resume детерминированы — их итог из кэша."""
    if fn is checkpoint.resume_full or any(fn is f for f, _ in WRONG.values()):
        return copy.deepcopy(_crash_cached(fn, json.dumps(task["crash_test"], sort_keys=True)))
    return _crash(fn, task["crash_test"])


def _passed(rec: dict) -> bool:
    return rec["diverges"] is None and rec["complete"] and rec["diff"] == []


@functools.lru_cache(maxsize=256)
def _state_at(params_json: str) -> tuple[int, str]:
    """Уровень учебной программы и верификатор запуска после шага s₀ (то, что будет в контрольной точке)."""
    p = json.loads(params_json)
    run = checkpoint.ToyRLRun(p["seed"], verifier_upgrade_step=p["verifier_upgrade_step"],
                              promote_at=p["promote_at"], ema_alpha=p["ema_alpha"])  # fmt: skip
    for _ in range(p["crash_at"] // p["checkpoint_every"] * p["checkpoint_every"]):
        run.step()
    return run.curriculum["level"], run.verifier_version


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_10_000 + 7919 * variant)
    while True:  # в контрольной точке уже новый верификатор и уровень программы выше первого
        every = rng.choice([2, 3, 4])
        s0 = every * rng.randint(-(-6 // every), 12 // every)
        crash = s0 + rng.randint(1, every - 1)
        p = {"total_steps": crash + rng.randint(2, 4), "crash_at": crash, "checkpoint_every": every,
             "seed": rng.randint(0, 99), "verifier_upgrade_step": rng.randint(2, s0 - 1),
             "promote_at": rng.choice([0.25, 0.3]), "ema_alpha": 0.5}  # fmt: skip
        if _state_at(json.dumps(p, sort_keys=True))[0] >= 1:
            break
    total, u = p["total_steps"], p["verifier_upgrade_step"]
    lost = (
        f"шаг {crash} будет пересчитан"
        if crash == s0 + 1
        else f"шаги {s0 + 1}…{crash} будут пересчитаны"
    )
    args = ", ".join(f"{k}={v}" for k, v in p.items())
    statement = (
        f"**Напишите `resume`.** Проверка аварией шага 12.5.3 на учебном запуске `checkpoint.ToyRLRun` "
        f"(seed = {p['seed']}): всего {total} шагов, контрольная точка пишется после каждого шага, "
        f"кратного {every}, авария — сразу после шага {crash}. После шага {u} верификатор заменён на "
        f"`verifier-2`, учебная программа повышает уровень при скользящей доле успехов ≥ "
        f"{p['promote_at']}. Восстанавливаться придётся с последней полной контрольной точки "
        f"`step-{s0:06d}` (s₀ = ⌊{crash}/{every}⌋·{every} = {s0}); {lost}.\n\n"
        "Напишите функцию\n\n```python\ndef resume(run_factory, checkpoint_path):\n    ...\n"
        "    return run\n```\n\n"
        "Контракт `checkpoint.run_crash_test`: `run_factory()` без аргументов создаёт **новый** "
        "`ToyRLRun` той же конфигурации; `checkpoint_path` — `pathlib.Path` каталога контрольной "
        f"точки; вернуть нужно запуск, чей следующий `step()` — шаг {s0 + 1} **того же** эксперимента."
        "\n\nПод рукой: `checkpoint.load_checkpoint(path, config=run.config)` — проверенная загрузка "
        "(размеры и SHA-256 файлов, хэш конфигурации), словарь «компонент → состояние»; компоненты и "
        "что ломается без каждого — `checkpoint.COMPONENTS` (таблицей — "
        "`checkpoint.components_frame()`). У запуска: `run.state_dict()`, "
        "`run.load_state_dict(state, queue=None)` (все компоненты сразу; `queue=None` — политика "
        "очереди, объявленная в контрольной точке) и `run.load_weights_only(state)`.\n\n"
        f"Проверка: `checkpoint.run_crash_test({args}, resume=resume)` (параметры — "
        "`task_12_5_10['crash_test']`). Ответ верен, если ветвь **full** с вашей `resume` совпадает "
        f"с непрерывной на всех {total} шагах побитово и сразу после `resume` **каждый** компонент "
        "состояния совпадает с контрольной точкой (так строго — потому что учебный запуск "
        "однопроцессный и детерминированный; от распределённого запуска требуют сохранить семантику "
        "эксперимента, см. шаг 12.5.3). Запустить самому: "
        "`print(checkpoint.run_crash_test(**task_12_5_10['crash_test'], resume=resume))`.\n\n"
        "Ответ — сама функция: `answer_12_5_10 = resume` (без скобок); проверка остановит её через "
        "10 с. Готовая `checkpoint.resume_full` — для сверки после решения."
    )
    return {"statement": statement, "crash_test": p, "restored_step": s0}


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


def _row(label: str, rec: dict) -> str:
    diff = ", ".join(f"`{c}`" for c in rec["diff"] or []) or "—"
    if rec["diverges"] is None:
        return f"| {label} | совпадает на всех шагах | {diff} |"
    return (
        f"| {label} | расходится на шаге {rec['diverges']} ({', '.join(rec['fields'])}) | {diff} |"
    )


def solution(task: dict, ref: Callable) -> str:
    p, s0 = task["crash_test"], task["restored_step"]
    level, verifier = _state_at(json.dumps(p, sort_keys=True))
    good = _run(ref, task)
    rows = [_row("`resume_full` (эталон)", good)] + [
        _row(label, _run(fn, task)) for fn, label in WRONG.values()
    ]
    return (
        "Восстановление — это продолжение **того же** эксперимента, а не перезапуск с тёплыми весами. "
        "Запуску после аварии нужно всё, что влияет на следующий шаг: веса, моменты AdamW, положение "
        "планировщика, счётчики и версии, генераторы случайных чисел, курсор данных, учебную "
        "программу, нормировщик наград, версии компонентов и очередь роллаутов «в полёте». Всё это "
        "лежит в контрольной точке, и `load_state_dict` загружает всё сразу, предварительно проверив, "
        f"что все компоненты на месте:\n\n{_CODE}\n\n"
        f"Проверка варианта: total_steps = {p['total_steps']}, crash_at = {p['crash_at']}, "
        f"checkpoint_every = {p['checkpoint_every']}, seed = {p['seed']}. Контрольная точка — после "
        f"шага s₀ = {s0}: в ней уже верификатор `{verifier}` (заменён после шага "
        f"{p['verifier_upgrade_step']}) и уровень учебной программы {level}, поэтому забытые "
        "`versions` или `curriculum` меняют продолжение. Ветвь `weights_only` той же проверки "
        f"расходится на шаге {good['weights_only']}: сразу после восстановления.\n\n"
        "Что дают эта функция и типичные ошибки (ветвь full против непрерывной; последний столбец — "
        "компоненты, которые сразу после resume не совпали с контрольной точкой):\n\n"
        "| resume | ветвь full | не восстановлено |\n|---|---|---|\n" + "\n".join(rows) + "\n\n"
        'Очередь: контрольная точка объявляет `on_restore = "keep"`, поэтому пакет, созданный до '
        'аварии старой версией политики, возвращается в очередь. Отбросить его (`queue="drop"`) — '
        "законная, но *другая* политика: она должна быть объявлена, а продолжение тогда уже не "
        "совпадает с непрерывной ветвью. В распределённом запуске побитового совпадения не требуют, "
        "но семантику эксперимента сохраняют так же."
    )


@dataclass(frozen=True)
class _Crash(AnswerType):
    """Итог проверки аварией: верен, если full совпала с непрерывной и состояние — с контрольной точкой."""

    def same(self, expected: Any, given: Any) -> bool:
        return _passed(given)

    def mismatch(self, expected: Any, rec: Any) -> str:
        step, diff = rec["diverges"], rec["diff"]
        text = "Ветвь full совпадает с непрерывной на всех шагах"
        if step is not None:
            when = " — сразу после восстановления" if step == rec["restored"] + 1 else ""
            text = (f"Ветвь full совпадает с непрерывной до шага {step - 1} и расходится на шаге "
                    f"{step}{when} (различаются поля события: {', '.join(rec['fields'])})")  # fmt: skip
        if diff:
            notes = "; ".join(f"{c} — {checkpoint.COMPONENTS[c][1]}" for c in diff)
            return f"{text}. Сразу после вашей resume не совпадает с контрольной точкой: {notes}."
        return f"{text}. Состояние сразу после resume совпадает с контрольной точкой, а шаги расходятся: не подменяет ли resume методы или генераторы запуска?"  # fmt: skip


@dataclass(frozen=True)
class _Resume(Function):
    """Function, у которой упавшая проверка аварией — отзыв (AnswerError), а не итог для сравнения."""

    def outcome(self, fn: Callable, task: dict) -> Any:
        rec = super().outcome(fn, task)
        if rec["error"] == "not_a_run":
            raise AnswerError("malformed", f"resume должна вернуть восстановленный запуск ToyRLRun, а вернула {rec['returned']}: не забыт ли `return run`?")  # fmt: skip
        if rec["error"] is not None:
            where = {"resume": "внутри вашей resume", "steps": "на шагах после восстановления (запуск, который вернула resume, не работает)"}  # fmt: skip
            raise AnswerError("wrong", f"Проверка аварией упала {where.get(rec['stage'], 'до вызова resume')}: {rec['error']}.")  # fmt: skip
        return rec


def solve(task: dict) -> Callable:
    return checkpoint.resume_full


def _trap(key: str, message: str, *diffs: set) -> Trap:
    """Ошибка узнаётся по тому, какие компоненты не совпали сразу после resume (``diffs``)."""
    return Trap(
        key,
        message,
        wrong=lambda t, ref: WRONG[key][0],
        matches=lambda t, rec: set(rec["diff"] or ()) in diffs,
    )


_ALL = set(checkpoint.COMPONENTS)
_QUEUE = ' Отбросить очередь (queue="drop") вопреки объявленной политике keep — та же ошибка.'
STEP = Step(
    id="12.5.10", make_task=make_task, solve=solve, solution=solution,
    answer=_Resume(_run, _Crash(), arity=2, signature=_SIG, deadline_s=10.0),
    hint=(
        "run = run_factory(); state = checkpoint.load_checkpoint(checkpoint_path, config=run.config); "
        "загрузите ВСЁ состояние, а не только веса: run.load_state_dict(state) (очередь — по политике, "
        "объявленной в контрольной точке); return run. Проверить себя: "
        "print(checkpoint.run_crash_test(**task_12_5_10['crash_test'], resume=resume))."
    ),
    traps=(
        _trap("ignores_checkpoint", "resume не прочитала контрольную точку: вернулся новый запуск, всё состояние — с нуля, и ветвь сразу расходится с непрерывной. Загрузите checkpoint.load_checkpoint(checkpoint_path, …) в run.load_state_dict.", _ALL),
        _trap("weights_only", "Это восстановление «только весов», выданное за продолжение: оптимизатор, планировщик, счётчики, генераторы случайных чисел, курсор данных, учебная программа, нормировщик, версии и очередь — как у нового запуска. Загрузите всё состояние: run.load_state_dict(state).", _ALL - {"policy"}),
        *(_trap(_KEY[c], f"Не восстановлен компонент `{c}` — {what}; он остался как у нового запуска: {breaks}. Загрузите всё состояние сразу: run.load_state_dict(state).{_QUEUE if c == 'queue' else ''}",
                {c}, *([{c, "counters"}] if c == "queue" else []))
          for c, (what, breaks) in checkpoint.COMPONENTS.items()),
    ),
)  # fmt: skip
