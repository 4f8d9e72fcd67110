"""12.5.10 — resume после аварии: ветвь full = непрерывной, состояние — как в точке (crash_test)."""

import functools
import json
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course_utils import checkpoint, crash_test, toy_run
from course_utils.exercises.answers import AnswerType, Function, md_table
from course_utils.exercises.common import json_cached
from course_utils.exercises.step import Step, Trap
from course_utils.grading import AnswerError

_SIG = "resume(run_factory, checkpoint_path)"
_ALL = set(checkpoint.COMPONENTS)
_KEY = {c: f"forgot_{'cursor' if c == 'data_cursor' else c}" for c in checkpoint.COMPONENTS}
_FRESH = {"ignores_checkpoint": _ALL, "weights_only": _ALL - {"policy"}}  # ошибка → как у нового
_FRESH |= {_KEY[c]: {c} for c in checkpoint.COMPONENTS}
_LABEL = {"ignores_checkpoint": "новый запуск", "weights_only": "только веса (`load_weights_only`)"}
_RESUME_TEXT = {
    "ignores_checkpoint": "resume не прочитала контрольную точку: вернулся новый запуск, всё состояние — с нуля.",
    "weights_only": "Это восстановление «только весов»: оптимизатор, планировщик, счётчики, генераторы, курсор данных, программа, нормировщик, версии и очередь — как у нового запуска.",
}
_RESUME_TEXT |= {
    _KEY[c]: f"Компонент `{c}` остался как у нового запуска — {b}."
    for c, (_, b) in checkpoint.COMPONENTS.items()
}


def _resume_with_fresh(fresh: set) -> Callable:
    """resume, у которой компоненты ``fresh`` — как у нового запуска, остальное — из точки."""

    def resume(run_factory: Callable, checkpoint_path: Any) -> Any:
        run = run_factory()
        new = run.state_dict()
        state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)
        run.load_state_dict({**state, **{c: new[c] for c in fresh}})
        return run

    return resume


_WRONG = {key: _resume_with_fresh(fresh) for key, fresh in _FRESH.items()}


def _state_same(a: Any, b: Any) -> bool:
    """Побитовое равенство состояний: тензоры — Tensor.equal, словари и списки — по элементам."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_state_same, a, b))
    if hasattr(a, "equal") and hasattr(a, "dtype"):
        return a.dtype == b.dtype and a.shape == b.shape and bool(a.equal(b))
    return bool(a == b) or (a != a and b != b)  # NaN равен NaN


def _resume_crash(fn: Callable, params: dict) -> dict:
    """Авария со своей resume: где расходится full, что не восстановлено (diff); сбой — AnswerError."""
    rec: dict[str, Any] = {"stage": "внутри вашей resume"}

    def wrapped(run_factory: Callable, checkpoint_path: Any) -> Any:
        run = fn(run_factory, checkpoint_path)
        if not isinstance(run, toy_run.ToyRLRun):
            msg = f"resume должна вернуть запуск ToyRLRun, а вернула {type(run).__name__}: не забыт ли `return run`?"
            raise AnswerError("malformed", msg)
        rec["stage"] = "после восстановления: запуск, который вернула resume, не работает"
        good = checkpoint.resume_full(run_factory, checkpoint_path).state_dict()
        rec["diff"] = [c for c, v in run.state_dict().items() if not _state_same(v, good.get(c))]
        return run

    try:
        res = _crash_run(params).branches(wrapped)
    except AnswerError:
        raise
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"[:300]
        raise AnswerError("wrong", f"Проверка аварией упала {rec['stage']}: {why}.") from None
    rec["diverges"], rec["fields"] = res.first_divergence("full"), res.diverged_fields("full")
    rec["complete"] = len(res.branches["full"]) == res.total_steps
    rec["restored"], rec["weights_only"] = res.restored_step, res.first_divergence("weights_only")
    return rec


_WORKDIR = tempfile.TemporaryDirectory(prefix="course_12_5_10_")  # удалится при выходе


@json_cached
def _crash_run(params: dict) -> crash_test.CrashRun:
    """Аварийный запуск варианта — один на процесс: каждая resume стартует с копии его точки."""
    return crash_test.prepare_crash_run(**params, workdir=tempfile.mkdtemp(dir=_WORKDIR.name))


@functools.lru_cache(maxsize=512)
def _resume_cached(fn: Callable, params_json: str) -> dict:
    return _resume_crash(fn, json.loads(params_json))


def _resume_outcome(fn: Callable, task: dict) -> dict:
    """Итог проверки аварией; у эталона и наших неверных resume он детерминирован — из кэша."""
    if fn is checkpoint.resume_full or any(fn is f for f in _WRONG.values()):
        return _resume_cached(fn, json.dumps(task["crash_test"], sort_keys=True))
    return _resume_crash(fn, task["crash_test"])


@json_cached
def _state_at(p: dict) -> tuple[int, str]:
    """Уровень учебной программы и верификатор после шага s₀ — то, что попадёт в точку."""
    kw = {k: p[k] for k in ("verifier_upgrade_step", "promote_at", "ema_alpha")}
    run = toy_run.ToyRLRun(p["seed"], **kw)
    for _ in range(p["crash_at"] // p["checkpoint_every"] * p["checkpoint_every"]):
        run.step()
    return run.curriculum["level"], run.verifier_version


def _resume_task(variant: int) -> dict:
    rng = random.Random(12_5_10_000 + 7919 * variant)
    while True:  # в контрольной точке уже новый верификатор и уровень программы выше первого
        every = rng.choice([2, 3, 4])
        s0 = every * rng.randint(-(-6 // every), 12 // every)
        crash = s0 + rng.randint(1, every - 1)
        p = {"total_steps": crash + rng.randint(2, 4), "crash_at": crash, "checkpoint_every": every}
        p |= {"seed": rng.randint(0, 99), "verifier_upgrade_step": rng.randint(2, s0 - 1)}
        p |= {"promote_at": rng.choice([0.25, 0.3]), "ema_alpha": 0.5}
        if _state_at(p)[0] >= 1:
            break
    lost = f"шаг {crash}" if crash == s0 + 1 else f"шаги {s0 + 1}…{crash}"
    args = ", ".join(f"{k}={v}" for k, v in p.items())
    statement = f"**Напишите `{_SIG}`** для проверки аварией (шаг 12.5.3) учебного запуска `toy_run.ToyRLRun`: seed = {p['seed']}, {p['total_steps']} шагов, контрольная точка — после каждого шага, кратного {every}, авария — после шага {crash}; после шага {p['verifier_upgrade_step']} верификатор заменён на `verifier-2`, уровень учебной программы растёт при скользящей доле успехов ≥ {p['promote_at']}. Восстановление — с `step-{s0:06d}` (s₀ = ⌊{crash}/{every}⌋·{every} = {s0}), {lost} пересчитают заново.\n\n`run_factory()` создаёт **новый** `ToyRLRun` той же конфигурации, `checkpoint_path` — каталог точки; верните запуск, чей следующий `step()` — шаг {s0 + 1} **того же** эксперимента. Под рукой: `checkpoint.load_checkpoint(path, config=run.config)`, `checkpoint.COMPONENTS`, `run.state_dict()`, `run.load_state_dict(state, queue=None)`, `run.load_weights_only(state)`.\n\nПроверка — `crash_test.run_crash_test({args}, resume=resume)` (параметры — `task_12_5_10['crash_test']`): ветвь **full** совпадает с непрерывной побитово (учебный запуск однопроцессный и детерминированный; от распределённого требуют той же семантики эксперимента), а **каждый** компонент состояния сразу после `resume` — с контрольной точкой. Функцию остановят через 60 с."
    return {"statement": statement, "crash_test": p, "restored_step": s0}


_CODE = """```python
from course_utils import checkpoint, crash_test


def resume(run_factory, checkpoint_path):
    run = run_factory()  # новый запуск той же конфигурации
    state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)  # SHA-256, конфигурация
    run.load_state_dict(state)  # всё состояние; очередь — по политике контрольной точки
    return run
```"""


def _resume_solution(task: dict, ref: Callable) -> str:
    p, s0 = task["crash_test"], task["restored_step"]
    level, verifier = _state_at(p)
    good, rows = _resume_outcome(ref, task), []
    labels = {f: _LABEL.get(k) or f"всё, кроме `{min(_FRESH[k])}`" for k, f in _WRONG.items()}
    for fn, label in {ref: "`resume_full` (эталон)", **labels}.items():
        rec = _resume_outcome(fn, task)
        step, fields = rec["diverges"], ", ".join(rec["fields"])
        full = f"расходится на шаге {step} ({fields})" if step else "совпадает на всех"
        rows.append([label, full, ", ".join(f"`{c}`" for c in rec["diff"]) or "—"])
    return f'Восстановление — продолжение **того же** эксперимента, а не перезапуск с тёплыми весами: загрузить нужно всё состояние.\n\n{_CODE}\n\nВариант: {p["total_steps"]} шагов, seed = {p["seed"]}, авария после шага {p["crash_at"]}, s₀ = ⌊{p["crash_at"]}/{p["checkpoint_every"]}⌋·{p["checkpoint_every"]} = {s0}. В точке уже верификатор `{verifier}` (заменён после шага {p["verifier_upgrade_step"]}) и уровень программы {level}, поэтому забытые `versions` и `curriculum` тоже меняют продолжение; ветвь weights_only расходится на шаге {good["weights_only"]}. Ветвь full и компоненты, не совпавшие с точкой сразу после resume:\n\n{md_table(["resume", "ветвь full", "не восстановлено"], rows)}\n\nОчередь: точка объявляет `on_restore = "keep"`; `queue="drop"` — другая политика, её объявляют заранее, и продолжение тогда не совпадает с непрерывным.'


@dataclass(frozen=True)
class _CrashOutcome(AnswerType):
    """Итог проверки аварией: верен, если full совпала с непрерывной, а состояние — с точкой."""

    def same(self, expected: Any, given: Any) -> bool:
        return given["diverges"] is None and given["complete"] and given["diff"] == []

    def mismatch(self, expected: Any, rec: Any) -> str:
        step, diff = rec["diverges"], rec["diff"]
        text = "Ветвь full совпадает с непрерывной на всех шагах"
        if step is not None:
            when = " — сразу после восстановления" if step == rec["restored"] + 1 else ""
            fields = ", ".join(rec["fields"])
            text = f"Ветвь full совпадает с непрерывной до шага {step - 1} и расходится на шаге {step}{when} (поля события: {fields})"
        if not diff:
            return f"{text}, хотя состояние сразу после resume совпадает с контрольной точкой: не подменяет ли resume методы или генераторы запуска?"
        notes = "; ".join(f"{c} — {checkpoint.COMPONENTS[c][1]}" for c in diff)
        return f"{text}. Сразу после resume не совпадает с контрольной точкой: {notes}."


_LOAD_ALL = " Загрузите всё состояние сразу: run.load_state_dict(state)."
_DROP = ' Отбросить очередь (queue="drop") вопреки объявленной политике keep — та же ошибка.'


def _resume_trap(key: str) -> Trap:
    """Узнаётся по компонентам, не совпавшим сразу после resume (drop очереди задевает counters)."""
    queue = key == "forgot_queue"
    diffs = [_FRESH[key], {"queue", "counters"}] if queue else [_FRESH[key]]
    wrong, text = _WRONG[key], _RESUME_TEXT[key] + _LOAD_ALL + (_DROP if queue else "")
    return Trap(key, text, lambda t, ref: wrong, matches=lambda t, rec: set(rec["diff"]) in diffs)


def _resume_solve(task: dict):  # верный ответ — функция курса
    return checkpoint.resume_full


_ANSWER = Function(_resume_outcome, _CrashOutcome(), arity=2, signature=_SIG, deadline_s=60.0)
_HINT = "run = run_factory(); state = checkpoint.load_checkpoint(checkpoint_path, config=run.config); восстановите ВСЁ состояние через run.load_state_dict(state), а не только веса, и верните run. Проверить себя: print(crash_test.run_crash_test(**task_12_5_10['crash_test'], resume=resume))."
_TRAPS = tuple(_resume_trap(key) for key in _FRESH)
STEP = Step("12.5.10", _resume_task, _resume_solve, _ANSWER, _HINT, _resume_solution, _TRAPS)
