"""12.4.7 — ESS Киша, ESS/n, доля клиппирования со знаком преимущества, max |log w|."""

import math
import random

import numpy as np

from course_utils import offpolicy
from course_utils.exercises.answers import Fields
from course_utils.exercises.lesson_12_4.token_ratios import TOL, Approx, any_key, distinct, over
from course_utils.exercises.step import Step, Trap

_NONNEG = Approx(low=0, bound="Величина неотрицательна")


def _values(task: dict) -> dict:
    w, a = np.array(task["weights"]), np.array(task["advantages"])
    el, eh = task["eps_low"], task["eps_high"]
    stats = offpolicy.log_weight_stats(np.log(w))
    return {"ess": offpolicy.effective_sample_size(w), "ess_norm": offpolicy.normalized_ess(w),
            "clip_fraction": offpolicy.clip_fraction(w, el, advantages=a, eps_high=eh),
            "max_abs_log_w": stats["max_abs_log_ratio"], "mean_abs_log_w": stats["mean_abs_log_ratio"],
            "clip_no_sign": offpolicy.clip_fraction(w, el, eps_high=eh),
            "n": len(w), "mean_w": float(w.mean()), "sum_w": float(w.sum())}  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_4_7_000 + 7919 * variant)
    el, eh, n = 0.2, rng.choice([0.2, 0.28]), rng.choice([8, 8, 10])
    ranges = {"high": (1 + eh + 0.04, 2.8), "low": (0.25, 1 - el - 0.04), "in": (1 - el + 0.03, 1 + eh - 0.03)}  # fmt: skip
    while True:
        # (положение w, знак A): хотя бы одно срабатывание и хотя бы один выход за полосу
        # с «неправильным» знаком A — там клиппирование не срабатывает.
        kinds = [("high", 1), rng.choice([("low", 1), ("high", -1)])]
        kinds += [rng.choice([("low", -1), ("low", 1), ("high", -1), ("high", 1)])]
        kinds += [("in", rng.choice([-1, 1])) for _ in range(n - len(kinds))]
        rng.shuffle(kinds)
        weights = [round(rng.uniform(*ranges[k]), 3) for k, _ in kinds]
        adv = [round(s * rng.uniform(0.2, 1.6), 2) for _, s in kinds]
        task = {"weights": weights, "advantages": adv, "eps_low": el, "eps_high": eh}
        v = _values(task)
        ess = [v["ess"], v["n"], v["mean_w"], v["sum_w"], v["ess_norm"]]
        if v["ess_norm"] <= 0.85 and distinct(ess) and distinct([v["max_abs_log_w"], v["mean_abs_log_w"]]):  # fmt: skip
            break
    rows = "\n".join(f"| o{i + 1} | {w:.3f} | {a:+.2f} |" for i, (w, a) in enumerate(zip(weights, adv)))  # fmt: skip
    band = f"[1 − {el}, 1 + {eh}] = [{1 - el:.2f}, {1 + eh:.2f}]"
    asym = " (асимметричная полоса, как clip-higher в DAPO)" if eh != el else ""
    statement = (
        f"**ESS, клиппирование и max |log w|.** Группа из n = {n} ответов на один запрос собрана "
        "политикой поведения μ, обновление идёт по текущей политике π_θ. Для каждого ответа "
        "известны последовательностный вес $w_i = \\pi_\\theta(y_i\\mid x)/\\mu(y_i\\mid x)$ "
        "— одно отношение на ответ, полное произведение токеновых отношений (GSPO берёт его "
        "нормированным по длине, $(\\pi_\\theta/\\mu)^{1/|y_i|}$; здесь нормировки нет) — и "
        "преимущество $A_i$ (GRPO):\n\n"
        f"| ответ | $w_i$ | $A_i$ |\n|---|---|---|\n{rows}\n\n"
        f"Клиппирование PPO: $\\varepsilon_{{low}} = {el}$, $\\varepsilon_{{high}} = {eh}$, "
        f"полоса {band}{asym}. Данные — в `task_12_4_7['weights']`, `task_12_4_7['advantages']`, "
        "`task_12_4_7['eps_low']`, `task_12_4_7['eps_high']`.\n\nНайдите:\n"
        "1. `ess` — эффективный размер выборки (ESS Киша) по весам $w_i$;\n"
        "2. `ess_norm` — ESS/n;\n"
        "3. `clip_fraction` — долю ответов, на которых клиппирование **действительно "
        "срабатывает**, то есть обрезанная ветвь цели PPO заменяет необрезанную (так считают "
        "`clip_ratio` в TRL и `pg_clipfrac` в verl); доля от 0 до 1;\n"
        "4. `max_abs_log_w` — $\\max_i |\\log w_i|$, в натах.\n\n"
        f'Ответ — словарь `{{"ess": …, "ess_norm": …, "clip_fraction": …, "max_abs_log_w": …}}`; {TOL}.'
    )
    return {"statement": statement, **task}


def solve(task: dict) -> dict:
    v = _values(task)
    return {k: v[k] for k in ANSWER.fields}


def solution(task: dict, ref: dict) -> str:
    v = _values(task)
    w, a, el, eh = task["weights"], task["advantages"], task["eps_low"], task["eps_high"]
    low, high = 1 - el, 1 + eh
    rows = []
    for i, (wi, ai) in enumerate(zip(w, a)):
        where = "выше" if wi > high else "ниже" if wi < low else "внутри"
        binds = (wi > high and ai > 0) or (wi < low and ai < 0)
        why = "да" if binds else ("нет: знак A не тот" if where != "внутри" else "нет")
        rows.append(f"| o{i + 1} | {wi:.3f} | {ai:+.2f} | {math.log(wi):+.4f} | {where} | {why} |")
    s1, s2 = sum(w), sum(x * x for x in w)
    k, k_all = round(v["clip_fraction"] * v["n"]), round(v["clip_no_sign"] * v["n"])
    return (
        "**ESS Киша:** $\\mathrm{ESS} = (\\sum_i w_i)^2 / \\sum_i w_i^2$, "
        f"$\\sum w = {s1:.3f}$, $\\sum w^2 = {s2:.4f}$:\n\n"
        f"$$\\mathrm{{ESS}} = \\frac{{{s1:.3f}^2}}{{{s2:.4f}}} = {v['ess']:.4f},\\qquad "
        f"\\mathrm{{ESS}}/n = \\frac{{{v['ess']:.4f}}}{{{v['n']}}} = {v['ess_norm']:.4f}.$$\n\n"
        "**Клиппирование срабатывает**, когда обрезанная ветвь $\\min(\\rho A, "
        "\\mathrm{clip}(\\rho)A)$ меньше необрезанной: при $\\rho > 1 + \\varepsilon_{high}$ и "
        "$A > 0$ или при $\\rho < 1 - \\varepsilon_{low}$ и $A < 0$. Вне полосы с другим знаком "
        f"A минимум берёт необрезанную ветвь — градиент течёт. Полоса [{low:.2f}, {high:.2f}]:\n\n"
        "| ответ | $w_i$ | $A_i$ | $\\log w_i$ | где w | срабатывает |\n|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n\nСрабатывает на {k} из {v['n']}: доля {v['clip_fraction']:.4f} (вне полосы — "
        f"{k_all} из {v['n']}, но это не доля клиппирования).\n\n"
        f"**max |log w|** = {v['max_abs_log_w']:.4f} нат (смотрите на модуль: малый вес "
        "$w \\ll 1$ — такое же сильное рассогласование, как большой; среднее |log w| = "
        f"{v['mean_abs_log_w']:.4f} нат прячет выброс).\n\n"
        f"**Ответ:** `{ {key: round(v[key], 4) for key in ANSWER.fields} }`.\n\n"
        "ESS — диагностика концентрации весов, а не доказательство несмещённости: при "
        "ESS/n заметно меньше 1 несколько ответов тянут градиент сильнее остальных."
    )


ANSWER = Fields({"ess": _NONNEG, "ess_norm": _NONNEG,
                 "clip_fraction": Approx(low=0, high=1, bound="Нужна доля от 0 до 1 (не проценты)"),
                 "max_abs_log_w": Approx(low=0, unit="нат", bound="Величина неотрицательна")})  # fmt: skip


_MEAN = [{"ess": lambda v, x=x: v[x]} for x in ("n", "mean_w", "sum_w")] + [{"ess_norm": lambda v: v["mean_w"]}]  # fmt: skip

STEP = Step(
    id="12.4.7", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint=(
        "ESS = (Σw)²/Σw²; ESS/n делите на число весов. Клиппирование срабатывает только при "
        "(w > 1 + ε_high и A > 0) или (w < 1 − ε_low и A < 0) — выход за полосу с другим "
        "знаком A не считается. max |log w| — по модулю натурального логарифма."
    ),
    traps=(
        Trap("clip_ignores_sign",
             "Вы посчитали долю весов вне полосы [1 − ε_low, 1 + ε_high] без учёта знака "
             "преимущества. Клиппирование срабатывает только при w > 1 + ε_high и A > 0 или "
             "при w < 1 − ε_low и A < 0; в остальных случаях min(ρA, clip(ρ)A) берёт "
             "необрезанную ветвь, и градиент не обрезается (так считают TRL и verl).",
             override=over(_values, {"clip_fraction": lambda v: v["clip_no_sign"]})),
        Trap("ess_mean_weight",
             "ESS — не число примеров n и не средний (или суммарный) вес. Эффективный размер "
             "выборки Киша: ESS = (Σw)²/Σw²; он равен n только при равных весах и падает к 1, "
             "когда доминирует один пример.",
             override={"ess": lambda t: float(len(t["weights"])), "ess_norm": lambda t: 1.0},
             matches=any_key(ANSWER, _values, *_MEAN)),
        Trap("ess_not_normalized",
             "В ess_norm вы записали сам ESS. Нормированная величина — ESS/n ∈ (0, 1]: её "
             "удобно сравнивать между пакетами разного размера.",
             override=over(_values, {"ess_norm": lambda v: v["ess"]})),
        Trap("mean_abs_not_max",
             "Это среднее |log w|, а спрашивается максимум. Средний модуль сглаживает выброс: "
             "один ответ с большим |log w_i| уже тянет градиент, и мониторинг смотрит на "
             "max_i |log w_i|.",
             override=over(_values, {"max_abs_log_w": lambda v: v["mean_abs_log_w"]})),
    ),
)  # fmt: skip
