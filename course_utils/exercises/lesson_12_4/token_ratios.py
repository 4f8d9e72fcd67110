"""12.4.6 — отношения токенов π_θ/μ и log w_seq = Σ m_t (log π_θ − log μ), нат."""

import math
import random

import numpy as np

from course_utils import offpolicy
from course_utils.exercises.answers import Fields, Number, Numbers, far_apart, md_table
from course_utils.exercises.common import TOL, TOLERANCE, answer_table
from course_utils.exercises.step import Step

_SEQ = Number(**TOLERANCE, unit="нат")
_RATIOS = Numbers(Number(**TOLERANCE), noun="токену политики")
_ANSWER = Fields({"ratios": _RATIOS, "seq_log_ratio": _SEQ})


def _ratios_task(variant: int) -> dict:
    rng = random.Random(12_4_6_000 + 7919 * variant)
    while True:  # многоходовой ответ модели с вызовами калькулятора
        x, y, rows = rng.randint(12, 89), rng.randint(3, 29), []
        if rng.random() < 0.5:
            turns = [
                (1, ["Посчитаю", ":", " calc", f"({x}*{y})"]),
                (0, ["<tool>", f"{x * y}", "</tool>"]),
                (1, [" Ответ", ":", f" {x * y}", "<eos>"]),
            ]
        else:
            z = rng.randint(2, 9)
            turns = [
                (1, [" calc", f"({x}+{y})"]),
                (0, ["<tool>", f"{x + y}", "</tool>"]),
                (1, [" calc", f"({x + y}*{z})"]),
                (0, ["<tool>", f"{(x + y) * z}", "</tool>"]),
                (1, [" Ответ", f" {(x + y) * z}", "<eos>"]),
            ]
        for k, words in turns:  # 1 — реплика политики, 0 — ответ инструмента (среды)
            for word in words:
                if k:  # движок выбрал токен; тренер пересчитал чуть иначе
                    b = -rng.uniform(0.02, 2.0)
                    a = min(b + rng.choice([-1, 1]) * rng.uniform(0.01, 0.3), -0.005)
                else:  # токены инструмента: политика их не выбирала, числа посчитаны зря
                    a = -rng.uniform(1.0, 6.0)
                    b = min(a + rng.choice([-1, 1]) * rng.uniform(0.3, 1.5), -0.01)
                rows.append((word, k, round(a, 3), round(b, 3)))
        task = dict(zip(("tokens", "mask", "logp_target", "logp_behavior"), map(list, zip(*rows))))
        seqs = [a["seq_log_ratio"] for a in _ratios_answers(task).values()]
        gap = max(abs(a - b) for _, k, a, b in rows if k)
        if abs(seqs[0]) >= 0.15 and gap >= 0.05 and far_apart([*seqs, -seqs[1]]):  # и −(со средой)
            break
    rows = [
        [t, f"`{w}`", "политика" if k else "среда", k, f"{a:.3f}", f"{b:.3f}"]
        for t, (w, k, a, b) in enumerate(rows)
    ]
    head = ["t", "токен", "чей", "$m_t$", "$\\log\\pi_\\theta$", "$\\log\\mu$"]
    statement = (
        f"**Отношения токенов и log w_seq.** Многоходовой ответ модели: она вызывает калькулятор, ответ инструмента вставлен в последовательность. Маска $m_t$: 1 — токен выбрала политика, 0 — токен среды. Для каждого токена записаны $\\log\\pi_\\theta$ (тренер) и $\\log\\mu$ (движок генерации), в натах; небрежный конвейер записал их и для токенов среды.\n\n{md_table(head, rows)}\n\n"
        f"Данные — `task_12_4_6['tokens']`, `task_12_4_6['mask']`, `task_12_4_6['logp_target']`, `task_12_4_6['logp_behavior']`. Найдите `ratios` — $\\rho_t = \\pi_\\theta/\\mu$ для каждого токена с $m_t = 1$ по порядку — и `seq_log_ratio` — $\\log w_{{seq}}$ всей последовательности, в натах; {TOL}."
    )
    return {"statement": statement, **task}


def _ratios_answers(task: dict) -> dict:
    """Верный ответ (ключ "") и ответы типичных ошибок — через offpolicy."""
    lt, lb = np.array(task["logp_target"]), np.array(task["logp_behavior"])
    m = np.array(task["mask"], dtype=bool)
    seq, ratios = float(offpolicy.sequence_log_ratio(lt, lb, m)), offpolicy.importance_ratios
    ref = {"ratios": ratios(lt[m], lb[m]).tolist(), "seq_log_ratio": seq}
    env_seq = float(offpolicy.sequence_log_ratio(lt, lb))
    return {
        "": ref,
        "env_tokens_included": {"ratios": ratios(lt, lb).tolist(), "seq_log_ratio": env_seq},
        "ratio_inverted": {"ratios": ratios(lb[m], lt[m]).tolist(), "seq_log_ratio": -seq},
        "mean_not_sum": {**ref, "seq_log_ratio": seq / int(m.sum())},
        "w_seq_not_log": {**ref, "seq_log_ratio": math.exp(seq)},
    }


def _ratios_solution(task: dict, ref: dict) -> str:
    seq = ref["seq_log_ratio"]
    cols = list(zip(*(task[c] for c in ("tokens", "mask", "logp_target", "logp_behavior"))))
    rows = [
        [t, f"`{tok}`", f"{a:.3f} − ({b:.3f}) = {a - b:+.3f}", f"{math.exp(a - b):.4f}"]
        if k
        else [t, f"`{tok}`", "среда, $m_t = 0$: не входит", "—"]
        for t, (tok, k, a, b) in enumerate(cols)
    ]
    return (
        "$\\rho_t = \\exp(\\log\\pi_\\theta - \\log\\mu)$; $\\log w_{seq} = \\sum_t m_t\\,(\\log\\pi_\\theta(y_t) - \\log\\mu(y_t))$ — только токены политики.\n\n"
        + md_table(["t", "токен", "$\\log\\pi_\\theta - \\log\\mu$", "$\\rho_t$"], rows)
        + f"\n\n$$\\log w_{{seq}} = {' + '.join(f'({a - b:+.3f})' for _, k, a, b in cols if k)} = {seq:.4f}\\ \\text{{нат}}.$$\n\n"
        f'**Ответ:** `{{"ratios": [{", ".join(f"{r:.4f}" for r in ref["ratios"])}], "seq_log_ratio": {seq:.4f}}}`. Токены среды выбирала не политика; отношение — $\\pi/\\mu$, а не $\\mu/\\pi$; ответ — сумма, а не среднее, и сам логарифм, а не $w_{{seq}}$.'
    )


_MESSAGES = {
    "env_tokens_included": "Вы учли токены среды (m_t = 0): их выбирала не политика, поэтому в отношения и в сумму входят только токены с маской 1.",
    "ratio_inverted": "Отношение перевёрнуто (μ/π): вес выборки по важности — ρ_t = π_θ/μ, целевая политика в числителе, политика поведения в знаменателе.",
    "mean_not_sum": "Это среднее разностей, а не сумма: отношение последовательности — произведение токеновых, его логарифм — сумма log π_θ − log μ по токенам политики.",
    "w_seq_not_log": "Это само отношение w_seq, а спрашивается его логарифм log w_seq — сумма разностей в натах, без экспоненты.",
}
_BY = dict.fromkeys(("env_tokens_included", "ratio_inverted"), ("ratios", "seq_log_ratio"))
_HINT = "Берите только строки с m_t = 1: ρ_t = exp(log π_θ − log μ), log w_seq = сумма (не среднее) разностей log π_θ − log μ, в натах, без экспоненты."
_SOLVE, _TRAPS = answer_table(_ratios_answers, _MESSAGES, _BY, default=("seq_log_ratio",))
STEP = Step("12.4.6", _ratios_task, _SOLVE, _ANSWER, _HINT, _ratios_solution, _TRAPS)
