"""12.4.6 — отношения токенов политики и маскированный log w_seq.

Здесь же общие для шагов 12.4.6–12.4.8 помощники: число с допуском «1 % или 0.002, что больше»
(``Approx``), список таких чисел (``Approxes``), ошибка как замена величин (``over``), правило
«ошибка видна по любому из ключей» (``any_key``) и различимость величин (``distinct``).
"""

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from course_utils import fmt, offpolicy
from course_utils.exercises.answers import AnswerType, Fields, Number, norm
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

TOL = "допуск — 1 % от верного значения или 0.002 по абсолютной величине (что больше)"


@dataclass(frozen=True)
class Approx(Number):
    """Число: |given − expected| ≤ max(rtol·|expected|, atol); ``low``/``high`` — границы (``bound``)."""

    rtol: float = 1e-2
    atol: float = 2e-3
    low: float | None = None
    high: float | None = None
    bound: str = ""

    def problem(self, given: Any, task: dict) -> str | None:
        bad, g, (low, high) = super().problem(given, task), _plain(given), (self.low, self.high)
        inside = bad or ((low is None or g >= low) and (high is None or g <= high))
        return bad if inside else f"{self.bound}, получено {g!r}."

    def same(self, expected: Any, given: Any) -> bool:
        e, g = float(_plain(expected)), float(_plain(given))
        return abs(g - e) <= max(self.rtol * abs(e), self.atol)


@dataclass(frozen=True)
class Approxes(AnswerType):
    """Непустой список чисел (Approx поэлементно); ``noun`` — чему соответствует элемент."""

    noun: str = "числу"

    def problem(self, given: Any, task: dict) -> str | None:
        g = _plain(given)
        if not isinstance(g, (list, tuple)) or not g:
            return f"Нужен непустой список чисел, получено {g!r}."
        bad = next((x for x in g if Approx().problem(x, task)), None)
        return None if bad is None else f"Все элементы — конечные числа, а есть {bad!r}."

    def same(self, expected: Any, given: Any) -> bool:
        e, g = _plain(expected), _plain(given)
        return len(e) == len(g) and all(Approx().same(a, b) for a, b in zip(e, g))

    def mismatch(self, expected: Any, given: Any) -> str:
        n, m = len(_plain(expected)), len(_plain(given))
        if n != m:
            return f"Нужно {fmt.count(n, 'число', 'числа', 'чисел')} — по одному {self.noun}, а получено {m}."
        return "Числа не совпали с верными: проверьте формулу и знак."


def distinct(values: list[float]) -> bool:
    """Все значения попарно различимы с запасом 5 % + 0.01 (иначе ошибка совпала бы с верной)."""
    return all(abs(a - b) > 0.05 * max(abs(a), abs(b)) + 0.01 for i, a in enumerate(values) for b in values[i + 1 :])  # fmt: skip


def over(values, make: dict) -> dict:
    """Trap.override: {ключ: task → make[ключ](values(task))}."""
    return {k: (lambda t, f=f: f(values(t))) for k, f in make.items()}


def any_key(answer: Fields, values, *makes: dict):
    """Правило Trap.matches: ошибка видна хотя бы по одному ключу одного из ``makes``."""
    return lambda task, given: any(answer.fields[k].same(f(values(task)), {norm(x): y for x, y in given.items()}[norm(k)])
                                   for make in makes for k, f in make.items())  # fmt: skip


def _dialogue(rng: random.Random) -> list[tuple[str, list[str]]]:
    """Многоходовой ответ: реплики политики и ответы инструмента (среды)."""
    a, b = rng.randint(12, 89), rng.randint(3, 29)
    if rng.random() < 0.5:
        return [("policy", ["Посчитаю", ":", " calc", f"({a}*{b})"]),
                ("env", ["<tool>", f"{a * b}", "</tool>"]),
                ("policy", [" Ответ", ":", f" {a * b}", "<eos>"])]  # fmt: skip
    c = rng.randint(2, 9)
    return [("policy", [" calc", f"({a}+{b})"]), ("env", ["<tool>", f"{a + b}", "</tool>"]),
            ("policy", [" calc", f"({a + b}*{c})"]), ("env", ["<tool>", f"{(a + b) * c}", "</tool>"]),
            ("policy", [" Ответ", f" {(a + b) * c}", "<eos>"])]  # fmt: skip


def _values(task: dict) -> dict:
    """Верный ответ и величины типичных ошибок (через offpolicy)."""
    lt, lb = np.array(task["logp_target"]), np.array(task["logp_behavior"])
    m = np.array(task["mask"], dtype=bool)
    seq = float(offpolicy.sequence_log_ratio(lt, lb, m))
    return {"ratios": offpolicy.importance_ratios(lt[m], lb[m]).tolist(), "seq": seq,
            "all_ratios": offpolicy.importance_ratios(lt, lb).tolist(),
            "seq_all": float(offpolicy.sequence_log_ratio(lt, lb)),
            "inverted": offpolicy.importance_ratios(lb[m], lt[m]).tolist(),
            "mean": seq / int(m.sum())}  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_4_6_000 + 7919 * variant)
    while True:
        tokens, mask, lt, lb = [], [], [], []
        for who, words in _dialogue(rng):
            for word in words:
                tokens.append(word)
                mask.append(1 if who == "policy" else 0)
                if who == "policy":  # движок выбрал токен; тренер пересчитал чуть иначе
                    behavior = -rng.uniform(0.02, 2.0)
                    target = min(behavior + rng.choice([-1, 1]) * rng.uniform(0.01, 0.3), -0.005)
                else:  # токены инструмента: политика их не выбирала, числа посчитаны зря
                    target = -rng.uniform(1.0, 6.0)
                    behavior = min(target + rng.choice([-1, 1]) * rng.uniform(0.3, 1.5), -0.01)
                lt.append(round(target, 3))
                lb.append(round(behavior, 3))
        task = {"tokens": tokens, "mask": mask, "logp_target": lt, "logp_behavior": lb}
        v = _values(task)
        d = [abs(a - b) for a, b, k in zip(lt, lb, mask) if k]
        seqs = [v["seq"], -v["seq"], v["seq_all"], v["mean"], -v["seq_all"], math.exp(v["seq"])]
        if abs(v["seq"]) >= 0.15 and max(d) >= 0.05 and distinct(seqs):
            break
    rows = "\n".join(f"| {t} | `{tok}` | {'политика' if k else 'среда'} | {k} | {a:.3f} | {b:.3f} |"
                     for t, (tok, k, a, b) in enumerate(zip(tokens, mask, lt, lb)))  # fmt: skip
    statement = (
        "**Отношения токенов и лог-отношение последовательности.** Многоходовой ответ модели "
        "(запрос не показан): модель вызывает калькулятор, ответ инструмента вставлен в "
        "последовательность, затем модель продолжает. Маска $m_t$: 1 — токен выбрала политика, "
        "0 — токен среды (ответ инструмента). Для каждого токена записаны $\\log\\pi_\\theta$ "
        "(тренер пересчитал последовательность) и $\\log\\mu$ (движок генерации, политика "
        "поведения), в натах. Небрежный конвейер записал числа и для токенов среды.\n\n"
        "| t | токен | чей | $m_t$ | $\\log\\pi_\\theta$ | $\\log\\mu$ |\n|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        "Те же данные — в `task_12_4_6['tokens']`, `task_12_4_6['mask']`, "
        "`task_12_4_6['logp_target']` ($\\log\\pi_\\theta$) и `task_12_4_6['logp_behavior']` "
        "($\\log\\mu$).\n\n"
        "Найдите:\n"
        "1. `ratios` — отношения важности $\\rho_t = \\pi_\\theta/\\mu$ для каждого токена "
        "политики, по порядку (список, по числу токенов с $m_t = 1$; можно округлить до 3 знаков);\n"
        "2. `seq_log_ratio` — логарифм отношения всей последовательности $\\log w_{seq}$, в натах.\n\n"
        f'Ответ — словарь `{{"ratios": [...], "seq_log_ratio": …}}`; {TOL}.'
    )
    return {"statement": statement, **task}


def solve(task: dict) -> dict:
    v = _values(task)
    return {"ratios": v["ratios"], "seq_log_ratio": v["seq"]}


def solution(task: dict, ref: dict) -> str:
    v = _values(task)
    rows, terms = [], []
    for t, (tok, k, a, b) in enumerate(zip(*(task[c] for c in ("tokens", "mask", "logp_target", "logp_behavior")))):  # fmt: skip
        if k:
            rows.append(f"| {t} | `{tok}` | {a:.3f} − ({b:.3f}) = {a - b:+.3f} | {math.exp(a - b):.4f} |")  # fmt: skip
            terms.append(f"({a - b:+.3f})")
        else:
            rows.append(f"| {t} | `{tok}` | токен среды: $m_t = 0$, не входит | — |")
    ratios = ", ".join(f"{r:.4f}" for r in v["ratios"])
    return (
        "Отношение важности токена — $\\rho_t = \\exp(\\log\\pi_\\theta - \\log\\mu)$; "
        "лог-отношение последовательности — сумма по токенам **политики**:\n\n"
        "$$\\log w_{seq} = \\sum_t m_t\\,(\\log\\pi_\\theta(y_t) - \\log\\mu(y_t)).$$\n\n"
        "| t | токен | $\\log\\pi_\\theta - \\log\\mu$ | $\\rho_t$ |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n\n$$\\log w_{{seq}} = {' + '.join(terms)} = {v['seq']:.4f}\\ \\text{{нат}},"
        f"\\quad w_{{seq}} = e^{{{v['seq']:.4f}}} = {math.exp(v['seq']):.4f}.$$\n\n"
        f'**Ответ:** `{{"ratios": [{ratios}], "seq_log_ratio": {v["seq"]:.4f}}}`.\n\n'
        "Токены инструмента выбирала среда, а не политика: их вероятности под $\\pi$ и $\\mu$ "
        "не описывают ни одного решения политики, поэтому маска их исключает. С ними сумма "
        f"была бы {v['seq_all']:.4f} нат — чужой вклад {v['seq_all'] - v['seq']:+.4f} нат. "
        "Отношение — $\\pi/\\mu$ (целевая над поведенческой), а не наоборот; и это сумма, а не "
        f"среднее: среднее ({v['mean']:.4f}) — уже другая величина (геометрическое среднее "
        "в режиме `geometric`). И ответ — сам логарифм $\\log w_{seq}$ в натах, а не "
        f"$w_{{seq}}$ = {math.exp(v['seq']):.4f}."
    )


_ENV = {"ratios": lambda v: v["all_ratios"], "seq_log_ratio": lambda v: v["seq_all"]}
_INVERTED = {"ratios": lambda v: v["inverted"], "seq_log_ratio": lambda v: -v["seq"]}
ANSWER = Fields({"ratios": Approxes(noun="на токен политики ($m_t = 1$)"),
                 "seq_log_ratio": Approx(unit="нат")})  # fmt: skip

STEP = Step(
    id="12.4.6", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint=(
        "Берите только строки с m_t = 1. Для каждой: ρ_t = exp(log π_θ − log μ). "
        "log w_seq = Σ_t m_t·(log π_θ − log μ) — сумма (не среднее) разностей по токенам "
        "политики; в натах, без экспоненты."
    ),
    traps=(
        Trap("env_tokens_included",
             "Вы учли токены среды (m_t = 0). Ответ инструмента выбирала не политика, и его "
             "log-вероятности не относятся к её решениям: в отношения и в сумму входят только "
             "токены с маской 1.",
             override=over(_values, _ENV), matches=any_key(ANSWER, _values, _ENV)),
        Trap("ratio_inverted",
             "Отношение перевёрнуто: вы посчитали μ/π. Вес выборки по важности — "
             "ρ_t = π_θ/μ = exp(log π_θ − log μ): целевая политика в числителе, политика "
             "поведения (та, что породила токены) в знаменателе.",
             override=over(_values, _INVERTED), matches=any_key(ANSWER, _values, _INVERTED)),
        Trap("mean_not_sum",
             "Это среднее разностей, а не сумма. Отношение последовательности — произведение "
             "токеновых отношений, значит log w_seq = Σ_t m_t·(log π_θ − log μ); среднее "
             "даёт геометрическое среднее, другую величину.",
             override=over(_values, {"seq_log_ratio": lambda v: v["mean"]})),
        Trap("w_seq_not_log",
             "Это само отношение w_seq = exp(Σ_t m_t·(log π_θ − log μ)), а спрашивается его "
             "логарифм log w_seq — сумма разностей в натах, без экспоненты.",
             override=over(_values, {"seq_log_ratio": lambda v: math.exp(v["seq"])})),
    ),
)  # fmt: skip
