"""12.4.7 — ESS Киша, ESS/n, доля клиппирования со знаком преимущества, max |log w|."""

import math
import random

import numpy as np

from course_utils import offpolicy
from course_utils.exercises.answers import Fields, Number, Share, far_apart, md_table
from course_utils.exercises.common import TOL, TOLERANCE, answer_table, hits_any
from course_utils.exercises.step import Step

_NN = Number(**TOLERANCE, low=0, bound="Величина неотрицательна")
_NAT = Number(**TOLERANCE, low=0, bound="Величина неотрицательна", unit="нат")
_ANSWER = Fields(
    {"ess": _NN, "ess_norm": _NN, "clip_fraction": Share(**TOLERANCE), "max_abs_log_w": _NAT}
)


def _ess_values(task: dict) -> dict:
    """Верные величины и величины типичных ошибок — через offpolicy."""
    w, a = np.array(task["weights"]), np.array(task["advantages"])
    el, eh = task["eps_low"], task["eps_high"]
    stats = offpolicy.log_weight_stats(np.log(w))
    return {
        "ess": offpolicy.effective_sample_size(w),
        "ess_norm": offpolicy.normalized_ess(w),
        "clip_fraction": offpolicy.clip_fraction(w, el, advantages=a, eps_high=eh),
        "max_abs_log_w": stats["max_abs_log_ratio"],
        "mean_abs_log_w": stats["mean_abs_log_ratio"],
        "clip_no_sign": offpolicy.clip_fraction(w, el, eps_high=eh),
        "n": float(len(w)),
        "mean_w": float(w.mean()),
        "sum_w": float(w.sum()),
    }


def _ess_task(variant: int) -> dict:
    rng = random.Random(12_4_7_000 + 7919 * variant)
    el, eh, n = 0.2, rng.choice([0.2, 0.28]), rng.choice([8, 8, 10])
    lo, hi = 1 - el, 1 + eh
    ranges = {"high": (hi + 0.04, 2.8), "low": (0.25, lo - 0.04), "in": (lo + 0.03, hi - 0.03)}
    while True:  # (где w, знак A): хоть одно срабатывание и хоть один выход с другим знаком A
        kinds = [("high", 1), rng.choice([("low", 1), ("high", -1)])]
        kinds += [rng.choice([("low", -1), ("low", 1), ("high", -1), ("high", 1)])]
        kinds += [("in", rng.choice([-1, 1])) for _ in range(n - len(kinds))]
        rng.shuffle(kinds)
        weights = [round(rng.uniform(*ranges[k]), 3) for k, _ in kinds]
        adv = [round(s * rng.uniform(0.2, 1.6), 2) for _, s in kinds]
        task = {"weights": weights, "advantages": adv, "eps_low": el, "eps_high": eh}
        v = _ess_values(task)
        ess = [v[k] for k in ("ess", "n", "mean_w", "sum_w", "ess_norm")]
        logs = [v["max_abs_log_w"], v["mean_abs_log_w"]]
        if v["ess_norm"] <= 0.85 and far_apart(ess) and far_apart(logs):
            break
    rows = [[f"o{i + 1}", f"{w:.3f}", f"{a:+.2f}"] for i, (w, a) in enumerate(zip(weights, adv))]
    statement = (
        f"**ESS, клиппирование и max |log w|.** Группа из n = {n} ответов на один запрос собрана политикой поведения μ, обновление идёт по π_θ. Для каждого ответа даны вес $w_i = \\pi_\\theta(y_i\\mid x)/\\mu(y_i\\mid x)$ (полное произведение токеновых отношений, без нормировки по длине) и преимущество $A_i$ (GRPO):\n\n{md_table(['ответ', '$w_i$', '$A_i$'], rows)}\n\n"
        f"Клиппирование PPO: $\\varepsilon_{{low}} = {el}$, $\\varepsilon_{{high}} = {eh}$, полоса [{lo:.2f}, {hi:.2f}]{' (асимметричная, как clip-higher в DAPO)' if eh != el else ''}. Данные — `task_12_4_7['weights']`, `task_12_4_7['advantages']`, `task_12_4_7['eps_low']`, `task_12_4_7['eps_high']`.\n\n"
        f"Найдите `ess` — ESS Киша по $w_i$, `ess_norm` — ESS/n, `clip_fraction` — долю ответов, на которых клиппирование **срабатывает** (обрезанная ветвь цели PPO заменяет необрезанную, как `clip_ratio` в TRL и `pg_clipfrac` в verl), и `max_abs_log_w` — $\\max_i |\\log w_i|$ в натах; {TOL}."
    )
    return {"statement": statement, **task}


def _ess_answers(task: dict) -> dict:
    """Верный ответ (ключ "") и ответы типичных ошибок — через offpolicy."""
    v = _ess_values(task)
    ref = {k: v[k] for k in _ANSWER.fields}
    return {
        "": ref,
        "clip_ignores_sign": {**ref, "clip_fraction": v["clip_no_sign"]},
        "ess_mean_weight": {**ref, "ess": v["n"], "ess_norm": 1.0},
        "ess_not_normalized": {**ref, "ess_norm": v["ess"]},
        "mean_abs_not_max": {**ref, "max_abs_log_w": v["mean_abs_log_w"]},
    }


def _ess_solution(task: dict, ref: dict) -> str:
    v, w, a = _ess_values(task), task["weights"], task["advantages"]
    low, high = 1 - task["eps_low"], 1 + task["eps_high"]
    rows = []
    for i, (wi, ai) in enumerate(zip(w, a)):
        where = "выше" if wi > high else "ниже" if wi < low else "внутри"
        binds = (wi > high and ai > 0) or (wi < low and ai < 0)
        why = "да" if binds else "нет" if where == "внутри" else "нет: знак A не тот"
        rows.append([f"o{i + 1}", f"{wi:.3f}", f"{ai:+.2f}", f"{math.log(wi):+.4f}", where, why])
    s1, s2, n = sum(w), sum(x * x for x in w), len(w)
    return (
        f"$$\\mathrm{{ESS}} = \\frac{{(\\sum w)^2}}{{\\sum w^2}} = \\frac{{{s1:.3f}^2}}{{{s2:.4f}}} = {v['ess']:.4f},\\qquad \\mathrm{{ESS}}/n = \\frac{{{v['ess']:.4f}}}{{{n}}} = {v['ess_norm']:.4f}.$$\n\nКлиппирование срабатывает при $\\rho > 1 + \\varepsilon_{{high}}$ и $A > 0$ или при $\\rho < 1 - \\varepsilon_{{low}}$ и $A < 0$; вне полосы с другим знаком A минимум берёт необрезанную ветвь. Полоса [{low:.2f}, {high:.2f}]:\n\n"
        + md_table(["ответ", "$w_i$", "$A_i$", "$\\log w_i$", "где w", "срабатывает"], rows)
        + f"\n\nСрабатывает на {round(v['clip_fraction'] * n)} из {n}: доля {v['clip_fraction']:.4f} (вне полосы — {round(v['clip_no_sign'] * n)} из {n}). max |log w| = {v['max_abs_log_w']:.4f} нат (среднее {v['mean_abs_log_w']:.4f} нат прячет выброс; малый вес $w \\ll 1$ — такое же рассогласование, как большой).\n\n**Ответ:** `{ {k: round(x, 4) for k, x in ref.items()} }`."
    )


_MEAN_WEIGHT = (("ess", "n"), ("ess", "mean_w"), ("ess", "sum_w"), ("ess_norm", "mean_w"))
_MESSAGES = {
    "clip_ignores_sign": "Вы посчитали долю весов вне полосы без учёта знака преимущества: клиппирование срабатывает только при w > 1 + ε_high и A > 0 или w < 1 − ε_low и A < 0, иначе min(ρA, clip(ρ)A) берёт необрезанную ветвь.",
    "ess_mean_weight": "ESS — не число примеров и не средний (или суммарный) вес: ESS Киша = (Σw)²/Σw², он равен n только при равных весах.",
    "ess_not_normalized": "В ess_norm записан сам ESS, а нужна нормированная величина ESS/n ∈ (0, 1] — её сравнивают между пакетами разного размера.",
    "mean_abs_not_max": "Это среднее |log w|, а спрашивается максимум: среднее сглаживает выброс, а градиент тянет уже один ответ с большим |log w_i|.",
}
_BY = dict(zip(_MESSAGES, [("clip_fraction",), hits_any(_ANSWER, _ess_values, *_MEAN_WEIGHT)]))
_BY |= {"ess_not_normalized": ("ess_norm",), "mean_abs_not_max": ("max_abs_log_w",)}
_HINT = "ESS = (Σw)²/Σw², ESS/n — делите на число весов. Клиппирование срабатывает только при (w > 1 + ε_high и A > 0) или (w < 1 − ε_low и A < 0). max |log w| — по модулю натурального логарифма."
_SOLVE, _TRAPS = answer_table(_ess_answers, _MESSAGES, _BY)
STEP = Step("12.4.7", _ess_task, _SOLVE, _ANSWER, _HINT, _ess_solution, _TRAPS)
