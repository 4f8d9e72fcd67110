"""12.5.7 — интервал Янга I* = √(2CM) и потери H(I) = C/I + I/(2M) против текущего интервала."""

import math
import random
from dataclasses import dataclass
from typing import Any

from course_utils.checkpoint import checkpoint_overhead as overhead, daly_interval, young_interval
from course_utils.exercises.answers import Choice, Fields, Number, norm, sig
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
        if hit:
            return f"Ответ отличается от верного ровно в {sig(hit[0])} раз: {_RATIOS[hit[0]]}."
        pct = abs(g / e - 1) * 100 if e else math.inf
        return super().mismatch(e, g) if pct < 1 or g * e < 0 else f"Ответ отличается от верного на {pct:.0f} %: проверьте формулу и единицы."  # fmt: skip


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


def _answers(task: dict) -> dict:
    """Верный ответ (ref) и ответы типичных ошибок (ключ — ошибка); в формулах всё в секундах."""
    c, m_h, i = task["write_s"], task["mtbf_h"], task["interval_min"] * 60
    m, star = m_h * 3600, young_interval(c, m_h * 3600)

    def answer(s: float, mtbf: float) -> dict:
        return {"I_star_min": s / 60, "H_current": overhead(i, c, mtbf), "H_star": overhead(s, c, mtbf), "recommend": _recommend(i, s)}  # fmt: skip

    return {"ref": answer(star, m), "sqrt_cm_no_two": answer(math.sqrt(c * m), m),
            "units_mixed": answer(math.sqrt(2 * c * m_h), m_h),  # M в часах как секунды (young_interval: C ≥ M)
            "overhead_one_term": {**answer(star, m), "H_current": c / i, "H_star": c / star}}  # fmt: skip


def solve(task: dict) -> dict:
    return _answers(task)["ref"]


def _hit(trap: str, *keys: str):
    """Правило ловушки: хотя бы одно из значений ``keys`` совпало с ответом этой ошибки."""
    return lambda t, g: any(near(_answers(t)[trap][k], g, k) for k in keys)


def solution(task: dict, ref: dict) -> str:
    c, m_h, i_min = task["write_s"], task["mtbf_h"], task["interval_min"]
    m, i, star = m_h * 3600, i_min * 60, ref["I_star_min"] * 60
    ratio, lost = i / star, (ref["H_current"] - ref["H_star"]) * 24 * 60  # мин в сутки
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
        f"Сначала всё в секунды: C = {c} с, M = {m_h} ч · 3600 = {sig(m)} с, I = {i_min} мин · 60 = {sig(i)} с."
        f"\n\n$$I^* = \\sqrt{{2CM}} = \\sqrt{{2 \\cdot {c} \\cdot {m}}} = {star:.1f}\\ \\text{{с}} = "
        f"{ref['I_star_min']:.2f}\\ \\text{{мин}}.$$\n\n$$H(I) = \\frac{{C}}{{I}} + \\frac{{I}}{{2M}} = "
        f"\\frac{{{c}}}{{{i}}} + \\frac{{{i}}}{{2 \\cdot {m}}} = {c / i:.4f} + {ref['H_current'] - c / i:.4f} = "
        f"{ref['H_current']:.4f}.$$\n\nВ оптимуме оба слагаемых равны, поэтому $H(I^*) = \\sqrt{{2C/M}} = "
        f"\\sqrt{{2 \\cdot {c}/{m}}} = {ref['H_star']:.4f}$ ({ref['H_star'] * 100:.2f} % времени против "
        f"{ref['H_current'] * 100:.2f} % сейчас).\n\nВывод: {verdict}. {saving}\n\n**Ответ:** `{answer}`.\n\n"
        "Типичные ловушки: M в часах нельзя подставлять рядом с C в секундах; без двойки под корнем интервал "
        "занижен в √2 раза; одно слагаемое C/I забывает работу, потерянную при отказе. Формула Янга — ориентир: "
        f"поправка Дейли (`checkpoint.daly_interval`) даёт {daly_interval(c, m) / 60:.2f} мин, а асинхронная "
        "запись, время перезапуска и коррелированные отказы меняют модель."
    )  # fmt: skip


STEP = Step(
    id="12.5.7", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({"I_star_min": Amount(unit="мин"), "H_current": Amount(), "H_star": Amount(),
                   "recommend": _Recommend(("чаще", "реже", "так же"))}),
    hint="Переведите всё в секунды: M·3600, I·60. I* = √(2·C·M), ответ — в минутах (/60). H(I) = C/I + I/(2M) "
    "— оба слагаемых, доля (не проценты); H(I*) = √(2C/M). Если I больше I* более чем на 10 % — «чаще», "
    "меньше — «реже», иначе «так же».",
    traps=(
        # √(2·C·M_ч) «в секундах» численно равно верному I* в минутах (√3600 = 60), поэтому узнаём M в часах
        # с переводом в минуты, H с M в часах и I* в секундах, выданное за минуты.
        Trap("units_mixed", "Смешаны единицы: M дано в часах, C — в секундах, I — в минутах. Переведите всё в "
             "секунды (M·3600, I·60), посчитайте I* и H, и только I* для ответа переведите в минуты.",
             wrong=lambda t, ref: _answers(t)["units_mixed"],
             matches=lambda t, g: _hit("units_mixed", "I_star_min", "H_current", "H_star")(t, g)
             or near(60 * solve(t)["I_star_min"], g, "I_star_min")),
        Trap("sqrt_cm_no_two", "Вы взяли I* = √(C·M). Минимум H(I) = C/I + I/(2M) находится из −C/I² + 1/(2M) = 0, "
             "то есть I* = √(2CM): без двойки интервал занижен в √2 раза.",
             wrong=lambda t, ref: _answers(t)["sqrt_cm_no_two"], matches=_hit("sqrt_cm_no_two", "I_star_min")),
        Trap("overhead_one_term", "Вы учли только запись, H = C/I. Отказ отнимает в среднем половину интервала "
             "работы, которую придётся пересчитать: H(I) = C/I + I/(2M). С одним слагаемым выгоднее всего никогда "
             "не сохраняться.", wrong=lambda t, ref: _answers(t)["overhead_one_term"],
             matches=_hit("overhead_one_term", "H_current", "H_star")),
    ),
)  # fmt: skip
