"""Урок 12.5: как часто писать контрольную точку — интервал Янга I* = √(2CM), поправка Дейли,
доля потерянного времени H(I) ≈ C/I + I/(2M) и её график. C — время записи, M — среднее время
между отказами, оба в секундах.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from course_utils.args import is_real, positive

YOUNG_RATIO_WARN = 0.1  # young_interval предупреждает при C/M выше этого (см. его docstring)


def _check_write_below_mtbf(fn: str, write_s: float, mtbf_s: float) -> None:
    """ValueError при C ≥ M: запись не укладывается между отказами, интервал бессмыслен."""
    if write_s >= mtbf_s:
        raise ValueError(
            f"{fn}: время записи C = {write_s:g} с не меньше среднего времени между отказами "
            f"M = {mtbf_s:g} с (C/M = {write_s / mtbf_s:.3g}), а формула требует C ≪ M: запись "
            f"почти никогда не успевает завершиться. Проверьте единицы (оба — в секундах) или "
            f"сократите запись (асинхронная, по частям)"
        )


def young_interval(write_s: float, mtbf_s: float) -> float:
    """Оптимальный интервал контрольных точек по Янгу: I* = sqrt(2·C·M), в секундах.

    C — время записи контрольной точки, M — среднее время между отказами (оба в секундах, C ≪ M).
    Приближение: не учитывает время перезапуска и коррелированные отказы. C ≥ M — ValueError.
    При C/M > YOUNG_RATIO_WARN = 0.1 — предупреждение: против точного оптимума модели Дейли
    (без перезапуска) I* завышен на 17 % при C/M = 0.1 и на 43 % при C/M = 0.5 — там точнее
    ``daly_interval``.
    """
    write_s = positive("write_s", write_s)
    mtbf_s = positive("mtbf_s", mtbf_s)
    _check_write_below_mtbf("young_interval", write_s, mtbf_s)
    if write_s / mtbf_s > YOUNG_RATIO_WARN:
        warnings.warn(
            f"young_interval: C/M = {write_s / mtbf_s:.2g} > {YOUNG_RATIO_WARN:g} (C = "
            f"{write_s:g} с, M = {mtbf_s:g} с) — приближение Янга требует C ≪ M и здесь "
            f"завышает интервал; точнее daly_interval(C, M)",
            UserWarning,
            stacklevel=2,
        )
    return math.sqrt(2 * write_s * mtbf_s)  # минимум C/I + I/(2M)


def daly_interval(write_s: float, mtbf_s: float) -> float:
    """Интервал по Дейли (2006), в секундах: √(2CM)·[1 + ⅓·√(C/2M) + (C/2M)/9] − C.

    C — время записи, M — среднее время между отказами (оба в секундах). Поправка высшего
    порядка к Янгу: при C ≪ M почти совпадает с ним (чуть меньше), а до C/M = 0.99 отличается
    от точного оптимума модели Дейли (без перезапуска) меньше чем на 2 % — предупреждения нет.
    C ≥ M — ValueError, как у young_interval: Дейли для C ≥ 2M берёт I = M, но при C ≥ M
    запуск почти не делает полезной работы, и ответ — сокращать запись, а не подбирать интервал.
    """
    write_s = positive("write_s", write_s)
    mtbf_s = positive("mtbf_s", mtbf_s)
    _check_write_below_mtbf("daly_interval", write_s, mtbf_s)
    x = write_s / (2 * mtbf_s)  # C/(2M) < 1/2
    return math.sqrt(2 * write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - write_s


def checkpoint_overhead(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Доля времени, потерянная на контрольные точки: H(I) ≈ C/I + I/(2M), безразмерная (0.1 = 10 %).

    I — интервал между сохранениями, C — время записи, M — среднее время между отказами
    (все в секундах). C/I — запись, I/(2M) — в среднем половина интервала пересчитывается после
    отказа. Минимум при I* = sqrt(2CM), там H = sqrt(2C/M). Приближение верно при C ≪ I ≪ M.
    """
    interval_s = positive("interval_s", interval_s)
    write_s = positive("write_s", write_s)
    mtbf_s = positive("mtbf_s", mtbf_s)
    return write_s / interval_s + interval_s / (2 * mtbf_s)


def daly_overhead(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Потери в модели Дейли (2006): H = M·(e^((I+C)/M) − 1)/I − 1, доля полезного времени.

    Отказы — пуассоновский поток со средним интервалом M; каждый отрезок I полезной работы и
    запись C повторяются заново, пока не пройдут без отказа (время перезапуска R = 0), так что
    среднее настенное время отрезка M·(e^((I+C)/M) − 1). Все величины в секундах. При
    C ≪ I ≪ M совпадает с checkpoint_overhead = C/I + I/(2M); минимум — около daly_interval.
    """
    interval_s = positive("interval_s", interval_s)
    write_s = positive("write_s", write_s)
    mtbf_s = positive("mtbf_s", mtbf_s)
    return mtbf_s * math.expm1((interval_s + write_s) / mtbf_s) / interval_s - 1


def _time_unit(seconds: float) -> tuple[float, str]:
    if seconds < 120:
        return 1.0, "с"
    if seconds < 2 * 3600:
        return 60.0, "мин"
    return 3600.0, "ч"


def plot_overhead(write_s: float, mtbf_s: float, ax=None, current_interval_s: float | None = None):
    """График H(I) = C/I + I/(2M) в процентах от интервала I (ось x логарифмическая), I* отмечен.

    Пунктиром — слагаемые: запись C/I и пересчёт I/(2M). Оранжевым — потери daly_overhead
    модели Дейли с экспоненциальными отказами и её интервал daly_interval (поправка к Янгу).
    current_interval_s — ваш интервал (с), отмечается точкой с его долей потерь. Единица оси x
    (с, мин, ч) выбирается по I*. Возвращает matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    i_star = young_interval(write_s, mtbf_s)
    if current_interval_s is not None and (
        not is_real(current_interval_s) or current_interval_s <= 0
    ):
        raise ValueError(
            f"current_interval_s должно быть положительным или None, получено {current_interval_s!r}"
        )
    scale, unit = _time_unit(i_star)
    lo, hi = i_star / 10, i_star * 10
    if current_interval_s is not None:
        lo, hi = min(lo, current_interval_s / 2), max(hi, current_interval_s * 2)
    grid = np.geomspace(lo, hi, 400)
    total = write_s / grid + grid / (2 * mtbf_s)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 4))
    x = grid / scale
    ax.plot(x, 100 * total, color="tab:blue", lw=2, label="H(I) = C/I + I/(2M)")
    ax.plot(x, 100 * write_s / grid, color="tab:gray", ls="--", lw=1, label="запись: C/I")
    ax.plot(
        x,
        100 * grid / (2 * mtbf_s),
        color="tab:gray",
        ls=":",
        lw=1.2,
        label="пересчёт после отказа: I/(2M)",
    )
    exact = np.array([daly_overhead(i, write_s, mtbf_s) for i in grid])
    ax.plot(
        x, 100 * exact, color="tab:orange", lw=1.5, label=r"модель Дейли: $M\,(e^{(I+C)/M}-1)/I-1$"
    )
    h_star = checkpoint_overhead(i_star, write_s, mtbf_s)
    ax.vlines(i_star / scale, 0, 100 * h_star, color="tab:green", ls="-.", lw=1)
    ax.plot(
        [i_star / scale],
        [100 * h_star],
        "o",
        color="tab:green",
        label=f"Янг: I* = √(2CM) = {i_star / scale:.3g} {unit}, H = {100 * h_star:.2f} %",
    )
    i_daly = daly_interval(write_s, mtbf_s)
    h_daly = daly_overhead(i_daly, write_s, mtbf_s)
    ax.plot(
        [i_daly / scale],
        [100 * h_daly],
        "D",
        color="tab:orange",
        ms=5,
        label=f"Дейли: I = {i_daly / scale:.3g} {unit}, H = {100 * h_daly:.2f} %",
    )
    if current_interval_s is not None:
        h_cur = checkpoint_overhead(current_interval_s, write_s, mtbf_s)
        ax.plot(
            [current_interval_s / scale],
            [100 * h_cur],
            "s",
            color="tab:red",
            label=f"ваш интервал {current_interval_s / scale:.3g} {unit}: H = {100 * h_cur:.2f} %",
        )
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0, min(100.0, 100 * float(total.max())) * 1.05)
    ax.set_xlabel(f"интервал между контрольными точками I, {unit} (логарифмическая шкала)")
    ax.set_ylabel("потери H(I), % полезного времени")
    c_scale, c_unit = _time_unit(write_s)
    m_scale, m_unit = _time_unit(mtbf_s)
    ax.set_title(
        f"Цена контрольных точек: запись C = {write_s / c_scale:.3g} {c_unit},\n"
        f"среднее время между отказами M = {mtbf_s / m_scale:.3g} {m_unit}"
    )
    ax.grid(linestyle=":", alpha=0.6, which="both")
    # справа от осей, внутри фигуры: кривые занимают всю ширину осей и легенду не перекрывают
    ax.legend(fontsize="small", frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if ax.figure is not None:
        ax.figure.tight_layout()
    return ax
