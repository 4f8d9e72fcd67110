"""12.5.7 — интервал Янга I* = √(2CM) и потери H(I) = C/I + I/(2M) против текущего интервала."""

import math
import random
from dataclasses import dataclass
from typing import Any

from course_utils.checkpoint import checkpoint_overhead as overhead, daly_interval, young_interval
from course_utils.exercises.answers import Choice, Fields, Number, norm, num
from course_utils.exercises.lesson_12_5.manifest_gaps import value
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

RTOL, TOL = 1e-2, "относительный допуск 1 % (rtol = 1e-2)"
_RATIOS = {60: "спутаны секунды и минуты", 3600: "спутаны часы и секунды", 100: "нужна доля, а не проценты"}  # fmt: skip


@dataclass(frozen=True)
class Amount(Number):
    """Неотрицательное число (допуск 1 %); отзыв называет отношение 60, 3600 или 100 — единицы."""

    rtol: float = RTOL

    def problem(self, given: Any, task: dict) -> str | None:
        bad = super().problem(given, task)
        return bad or (f"Величина неотрицательна, а получено {_plain(given)}." if _plain(given) < 0 else None)  # fmt: skip

    def mismatch(self, expected: Any, given: Any) -> str:
        e, g = float(_plain(expected)), float(_plain(given))
        hit = [f for f in _RATIOS if e and g and min(abs(g / e / f - 1), abs(e / g / f - 1)) < 2e-3]
        return f"Ответ отличается от верного ровно в {num(hit[0])} раз: {_RATIOS[hit[0]]}." if hit else super().mismatch(e, g)  # fmt: skip


def near(x: float, given: dict, key: str) -> bool:
    """Значение ответа по ключу совпало с x (допуск 1 %)."""
    return Amount().same(x, value(given, key))


class _Recommend(Choice):
    """«чаще», «реже» или «так же»; «также», кавычки и точка в конце не важны."""

    @staticmethod
    def of(given: Any) -> str | None:
        text = norm(given).strip("`'\" .") if isinstance(_plain(given), str) else None
        return "так же" if text == "также" else text

    def problem(self, given: Any, task: dict) -> str | None:
        return None if self.of(given) in self.options else super().problem(given, task)

    def same(self, expected: Any, given: Any) -> bool:
        return self.of(given) == expected

    def mismatch(self, expected: Any, given: Any) -> str:
        return "Рекомендация не та: сравните текущий I с I* в одних единицах."


def _recommend(interval_s: float, optimum_s: float) -> str:
    """«так же», если |I/I* − 1| ≤ 10 %; иначе «чаще» (I > I*) или «реже»."""
    ratio = interval_s / optimum_s
    return "так же" if abs(ratio - 1) <= 0.10 else "чаще" if ratio > 1 else "реже"


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_7_000 + 7919 * variant)
    target = ("чаще", "реже", "так же")[variant % 3]
    while True:
        c, m_h = rng.choice((20, 30, 45, 60, 90, 120, 180, 240, 300, 420, 600)), rng.choice((3, 4, 6, 8, 12, 18, 24, 36, 48, 72))  # fmt: skip
        i_star = young_interval(c, m_h * 3600)
        if not (i_star >= 8 * c and m_h * 3600 >= 6 * i_star):  # C ≪ I* ≪ M
            continue
        raw = i_star / 60 * rng.uniform(*{"чаще": (1.6, 4.0), "реже": (0.2, 0.55), "так же": (0.95, 1.05)}[target])  # fmt: skip
        i_min = round(raw / 5) * 5 if raw > 40 else round(raw)
        ratio = i_min * 60 / i_star  # вдали от границы 10 %: «так же» — до 7 %, иначе — дальше 25 %
        margin_ok = abs(ratio - 1) <= 0.07 if target == "так же" else not 0.75 < ratio < 1.3
        if i_min >= 1 and i_min * 60 >= 3 * c and margin_ok and _recommend(i_min * 60, i_star) == target:  # fmt: skip
            break
    statement = (
        f"**Интервал Янга.** Запуск пишет полную контрольную точку за C = {c} с (всё это время обучение стоит). "
        f"По журналу отказов кластера среднее время между отказами запуска M = {m_h} ч. Сейчас контрольная "
        f"точка пишется каждые I = {i_min} мин.\n\nМодель потерь шага 12.5.1: доля времени на запись и на "
        "пересчёт потерянной после отказа работы\n\n$$H(I) \\approx \\frac{C}{I} + \\frac{I}{2M},\\qquad "
        "I^* = \\sqrt{2CM}$$\n\n(все величины в формулах — в одних единицах; приближение для C ≪ I ≪ M, без "
        "времени перезапуска и коррелированных отказов). Данные — `task_12_5_7['write_s']` (с), "
        "`task_12_5_7['mtbf_h']` (ч), `task_12_5_7['interval_min']` (мин).\n\nНайдите:\n"
        "1. `I_star_min` — оптимальный интервал I*, **в минутах**;\n"
        "2. `H_current` — H при текущем интервале, доля (0.05 = 5 %, не проценты);\n3. `H_star` — H(I*), доля;\n"
        '4. `recommend` — как менять интервал: `"чаще"` (сохранять чаще: I больше I*), `"реже"` (I меньше I*) '
        'или `"так же"` (I отличается от I* не более чем на 10 %).\n\nОтвет — словарь `{"I_star_min": …, '
        f'"H_current": …, "H_star": …, "recommend": …}}`; числа — {TOL}, так что I* не округляйте до целых минут.'
    )  # fmt: skip
    return {"statement": statement, "write_s": c, "mtbf_h": m_h, "interval_min": i_min}


def _values(task: dict) -> dict:
    """Верные величины (с, доли) и величины типичных ошибок."""
    c, m_h, i_s = task["write_s"], task["mtbf_h"], task["interval_min"] * 60
    m_s = m_h * 3600
    star, no_two = young_interval(c, m_s), math.sqrt(c * m_s)
    mixed = math.sqrt(2 * c * m_h)  # M в часах подставлено как секунды (young_interval: C ≥ M)
    return {"m_s": m_s, "i_s": i_s, "star_s": star, "H_current": overhead(i_s, c, m_s), "H_star": overhead(star, c, m_s),
            "no_two_s": no_two, "H_no_two": overhead(no_two, c, m_s), "mixed_s": mixed,
            "H_mixed_current": overhead(i_s, c, m_h), "H_mixed_star": overhead(mixed, c, m_h),
            "one_current": c / i_s, "one_star": c / star}  # fmt: skip


def solve(task: dict) -> dict:
    v = _values(task)
    return {"I_star_min": v["star_s"] / 60, "H_current": v["H_current"], "H_star": v["H_star"],
            "recommend": _recommend(v["i_s"], v["star_s"])}  # fmt: skip


def _units_mixed(task: dict, given: dict) -> bool:
    # √(2·C·M_ч) «в секундах» численно равно верному I* в минутах (√3600 = 60), поэтому узнаём
    # только M-в-часах с переводом в минуты и I* в секундах, выданное за минуты.
    v = _values(task)
    return (any(near(x, given, "I_star_min") for x in (v["mixed_s"] / 60, v["star_s"]))
            or near(v["H_mixed_current"], given, "H_current") or near(v["H_mixed_star"], given, "H_star"))  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    (c, m_h, i_min), v = (task[k] for k in ("write_s", "mtbf_h", "interval_min")), _values(task)
    ratio, lost = (
        v["i_s"] / v["star_s"],
        (ref["H_current"] - ref["H_star"]) * 24 * 60,
    )  # мин в сутки
    verdict = {
        "чаще": f"текущий интервал в {ratio:.2f} раза длиннее оптимального: после отказа теряется слишком много "
        "работы — сохранять **чаще**",
        "реже": f"текущий интервал составляет {ratio:.2f} от оптимального: запись съедает слишком много времени — "
        "сохранять **реже**",
        "так же": f"текущий интервал отличается от оптимального на {abs(ratio - 1) * 100:.0f} % (в пределах 10 %), "
        "а H около минимума плоская — оставить **так же**",
    }[ref["recommend"]]  # fmt: skip
    saving = f"Переход на I* сберёг бы около {lost:.0f} мин в сутки." if lost >= 1 else "Выигрыш от перехода на I* — меньше минуты в сутки."  # fmt: skip
    answer = {k: (round(x, 4) if isinstance(x, float) else x) for k, x in ref.items()}
    return (
        f"Сначала всё в секунды: C = {c} с, M = {m_h} ч · 3600 = {num(v['m_s'])} с, I = {i_min} мин · 60 = "
        f"{num(v['i_s'])} с.\n\n$$I^* = \\sqrt{{2CM}} = \\sqrt{{2 \\cdot {c} \\cdot {v['m_s']}}} = "
        f"{v['star_s']:.1f}\\ \\text{{с}} = {ref['I_star_min']:.2f}\\ \\text{{мин}}.$$\n\n$$H(I) = \\frac{{C}}{{I}} "
        f"+ \\frac{{I}}{{2M}} = \\frac{{{c}}}{{{v['i_s']}}} + \\frac{{{v['i_s']}}}{{2 \\cdot {v['m_s']}}} = "
        f"{v['one_current']:.4f} + {ref['H_current'] - v['one_current']:.4f} = {ref['H_current']:.4f}.$$\n\n"
        f"В оптимуме оба слагаемых равны, поэтому $H(I^*) = \\sqrt{{2C/M}} = \\sqrt{{2 \\cdot {c}/{v['m_s']}}} = "
        f"{ref['H_star']:.4f}$ ({ref['H_star'] * 100:.2f} % времени против {ref['H_current'] * 100:.2f} % сейчас)."
        f"\n\nВывод: {verdict}. {saving}\n\n**Ответ:** `{answer}`.\n\nТипичные ловушки: M в часах нельзя "
        "подставлять рядом с C в секундах; без двойки под корнем интервал занижен в √2 раза; одно слагаемое C/I "
        "забывает работу, потерянную при отказе. Формула Янга — ориентир: поправка Дейли "
        f"(`checkpoint.daly_interval`) даёт {daly_interval(c, v['m_s']) / 60:.2f} мин, а асинхронная запись, "
        "время перезапуска и коррелированные отказы меняют модель."
    )  # fmt: skip


STEP = Step(
    id="12.5.7", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({"I_star_min": Amount(unit="мин"), "H_current": Amount(), "H_star": Amount(),
                   "recommend": _Recommend(("чаще", "реже", "так же"))}),
    hint="Переведите всё в секунды: M·3600, I·60. I* = √(2·C·M), ответ — в минутах (/60). H(I) = C/I + I/(2M) "
    "— оба слагаемых, доля (не проценты); H(I*) = √(2C/M). Если I больше I* более чем на 10 % — «чаще», "
    "меньше — «реже», иначе «так же».",
    traps=(
        Trap("units_mixed", "Смешаны единицы: M дано в часах, C — в секундах, I — в минутах. Переведите всё в "
             "секунды (M·3600, I·60), посчитайте I* и H, и только I* для ответа переведите в минуты.",
             wrong=lambda t, ref: (v := _values(t)) and {"I_star_min": v["mixed_s"] / 60, "H_current": v["H_mixed_current"],
                                                         "H_star": v["H_mixed_star"], "recommend": _recommend(v["i_s"], v["mixed_s"])},
             matches=_units_mixed),
        Trap("sqrt_cm_no_two", "Вы взяли I* = √(C·M). Минимум H(I) = C/I + I/(2M) находится из −C/I² + 1/(2M) = 0, "
             "то есть I* = √(2CM): без двойки интервал занижен в √2 раза.",
             wrong=lambda t, ref: (v := _values(t)) and {**ref, "I_star_min": v["no_two_s"] / 60, "H_star": v["H_no_two"],
                                                         "recommend": _recommend(v["i_s"], v["no_two_s"])},
             matches=lambda t, g: near(_values(t)["no_two_s"] / 60, g, "I_star_min")),
        Trap("overhead_one_term", "Вы учли только запись, H = C/I. Отказ отнимает в среднем половину интервала "
             "работы, которую придётся пересчитать: H(I) = C/I + I/(2M). С одним слагаемым выгоднее всего никогда "
             "не сохраняться.", override={"H_current": lambda t: _values(t)["one_current"], "H_star": lambda t: _values(t)["one_star"]},
             matches=lambda t, g: near(_values(t)["one_current"], g, "H_current") or near(_values(t)["one_star"], g, "H_star")),
    ),
)  # fmt: skip
