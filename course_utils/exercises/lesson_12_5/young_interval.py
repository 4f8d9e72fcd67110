"""12.5.7 — интервал Янга I* = √(2CM) и потери H(I) = C/I + I/(2M) против текущего интервала."""

import math
import random

from course_utils.checkpoint_interval import checkpoint_overhead, daly_interval, young_interval
from course_utils.exercises.answers import Choice, Fields, Number, get, sig
from course_utils.exercises.common import AMOUNT, answer_table
from course_utils.exercises.step import Step

_BAND = {"чаще": (1.6, 4.0), "реже": (0.2, 0.55), "так же": (0.95, 1.05)}  # I / I*
_C = (20, 30, 45, 60, 90, 120, 180, 240, 300, 420, 600)
_M_H = (3, 4, 6, 8, 12, 18, 24, 36, 48, 72)


def _recommend_interval(interval_s: float, optimum_s: float) -> str:  # допуск «так же» — 10 %
    ratio = interval_s / optimum_s
    return "так же" if abs(ratio - 1) <= 0.10 else "чаще" if ratio > 1 else "реже"


def _young_task(variant: int) -> dict:
    rng = random.Random(12_5_7_000 + 7919 * variant)
    target = ("чаще", "реже", "так же")[variant % 3]
    while True:
        c, m_h = rng.choice(_C), rng.choice(_M_H)
        i_star = young_interval(c, m_h * 3600)
        if not (i_star >= 8 * c and m_h * 3600 >= 6 * i_star):  # C ≪ I* ≪ M
            continue
        raw = i_star / 60 * rng.uniform(*_BAND[target])
        i_min = round(raw / 5) * 5 if raw > 40 else round(raw)
        ratio = i_min * 60 / i_star  # вдали от границы 10 %: «так же» — до 7 %, иначе — дальше 25 %
        margin = abs(ratio - 1) <= 0.07 if target == "так же" else not 0.75 < ratio < 1.3
        good = margin and _recommend_interval(i_min * 60, i_star) == target
        if i_min >= 1 and i_min * 60 >= 3 * c and good:
            break
    statement = f"**Интервал Янга.** Полная контрольная точка пишется C = {c} с (обучение в это время стоит), среднее время между отказами M = {m_h} ч, сейчас точка пишется каждые I = {i_min} мин (`task_12_5_7['write_s']`, `task_12_5_7['mtbf_h']`, `task_12_5_7['interval_min']`). Доля потерянного времени (шаг 12.5.1; все величины в одних единицах, C ≪ I ≪ M):\n\n$$H(I) \\approx \\frac{{C}}{{I}} + \\frac{{I}}{{2M}},\\qquad I^* = \\sqrt{{2CM}}.$$\n\nНайдите `I_star_min` — I* **в минутах**, `H_current` = H(I) и `H_star` = H(I*) — доли (0.05, а не 5 %), и `recommend`: `\"чаще\"` (I больше I*), `\"реже\"` (меньше) или `\"так же\"` (|I/I* − 1| ≤ 10 %). Допуск 1 %: I* не округляйте до целых минут."
    return {"statement": statement, "write_s": c, "mtbf_h": m_h, "interval_min": i_min}


def _young_answers(task: dict) -> dict:
    """Верный ответ (ключ "") и ответы типичных ошибок; в формулах всё в секундах."""
    c, m_h, i = task["write_s"], task["mtbf_h"], task["interval_min"] * 60
    m, star = m_h * 3600, young_interval(c, m_h * 3600)

    def answer(s: float, mtbf: float) -> dict:
        h_i, h_s = checkpoint_overhead(i, c, mtbf), checkpoint_overhead(s, c, mtbf)
        rec = _recommend_interval(i, s)
        return {"I_star_min": s / 60, "H_current": h_i, "H_star": h_s, "recommend": rec}

    return {
        "": answer(star, m),
        "sqrt_cm_no_two": answer(math.sqrt(c * m), m),
        "units_mixed": answer(math.sqrt(2 * c * m_h), m_h),  # M в часах как секунды
        "overhead_one_term": {**answer(star, m), "H_current": c / i, "H_star": c / star},
    }


def _units_mixed(task: dict, given: dict) -> bool:  # M в часах или I* в секундах как минуты
    answers, kind = _young_answers(task), Number(**AMOUNT)
    wrong, seconds = answers["units_mixed"], 60 * answers[""]["I_star_min"]
    hits = [kind.same(wrong[k], get(given, k)) for k in ("I_star_min", "H_current", "H_star")]
    return any(hits) or kind.same(seconds, get(given, "I_star_min"))


_VERDICT = {"чаще": "после отказа теряется много работы", "реже": "запись съедает много времени"}


def _young_solution(task: dict, ref: dict) -> str:
    c, m_h, i_min = task["write_s"], task["mtbf_h"], task["interval_min"]
    m, i, star = m_h * 3600, i_min * 60, ref["I_star_min"] * 60
    lost = (ref["H_current"] - ref["H_star"]) * 24 * 60  # мин в сутки
    saving = f"около {lost:.0f} мин" if lost >= 1 else "меньше минуты"
    answer = {k: (round(x, 4) if isinstance(x, float) else x) for k, x in ref.items()}
    return f"В секундах: C = {c} с, M = {m_h} · 3600 = {sig(m)} с, I = {i_min} · 60 = {sig(i)} с.\n\n$$I^* = \\sqrt{{2 \\cdot {c} \\cdot {m}}} = {star:.1f}\\ \\text{{с}} = {ref['I_star_min']:.2f}\\ \\text{{мин}},\\qquad H(I) = \\frac{{{c}}}{{{i}}} + \\frac{{{i}}}{{2 \\cdot {m}}} = {c / i:.4f} + {ref['H_current'] - c / i:.4f} = {ref['H_current']:.4f},$$\n\n$$H(I^*) = \\sqrt{{2C/M}} = {ref['H_star']:.4f}$$ (в оптимуме слагаемые равны).\n\n**{ref['recommend'].capitalize()}**: I/I* = {i / star:.2f} — {_VERDICT.get(ref['recommend'], 'в пределах 10 %, а H у минимума плоская')}; переход на I* сберёг бы {saving} в сутки.\n\n**Ответ:** `{answer}`.\n\nПоправка Дейли (`checkpoint_interval.daly_interval`) даёт {daly_interval(c, m) / 60:.2f} мин; время перезапуска и коррелированные отказы модель не учитывает."


_MESSAGES = {
    "units_mixed": "Смешаны единицы: M в часах, C в секундах, I в минутах. Считайте I* и H в секундах (M·3600, I·60), а в минуты переведите только I* для ответа.",
    "sqrt_cm_no_two": "Вы взяли I* = √(C·M). Минимум H(I) = C/I + I/(2M) — из −C/I² + 1/(2M) = 0, то есть I* = √(2CM): без двойки интервал занижен в √2 раза.",
    "overhead_one_term": "Учтена только запись, H = C/I. Отказ ещё в среднем отнимает половину интервала на пересчёт: H(I) = C/I + I/(2M).",
}
_RULES = {"units_mixed": _units_mixed, "sqrt_cm_no_two": ("I_star_min",)}
_RULES["overhead_one_term"] = ("H_current", "H_star")
_H = Number(unit="доля", **AMOUNT)
_ANSWER = Fields(
    {"I_star_min": Number(unit="мин", **AMOUNT), "H_current": _H, "H_star": _H}
    | {"recommend": Choice(("чаще", "реже", "так же"), aliases={"также": "так же"})}
)
_HINT = "Переведите всё в секунды: M·3600, I·60. I* = √(2·C·M), ответ — в минутах (/60). H(I) = C/I + I/(2M) — оба слагаемых, доля (не проценты). Если I больше I* более чем на 10 % — «чаще», меньше — «реже», иначе «так же»."
_SOLVE, _TRAPS = answer_table(_young_answers, _MESSAGES, _RULES)
STEP = Step("12.5.7", _young_task, _SOLVE, _ANSWER, _HINT, _young_solution, _TRAPS)
