"""Урок 12.5: как часто писать контрольную точку — интервал Янга I* = √(2CM), поправка Дейли,
доля потерянного времени H(I) ≈ C/I + I/(2M) и её график. C — время записи, M — среднее время
между отказами, оба в секундах.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from course_utils.args import positive
from course_utils.plots import LEGEND_RIGHT, finish_axes, get_axes

_YOUNG_RATIO_WARN = 0.1  # young_interval предупреждает при C/M выше этого


def _write_below_mtbf(fn: str, write_s: float, mtbf_s: float) -> tuple[float, float]:
    """C и M (> 0, в секундах); ValueError при C ≥ M: запись не укладывается между отказами."""
    write_s, mtbf_s = positive("write_s", write_s), positive("mtbf_s", mtbf_s)
    if write_s >= mtbf_s:
        raise ValueError(
            f"{fn}: время записи C = {write_s:g} с не меньше среднего времени между отказами "
            f"M = {mtbf_s:g} с (C/M = {write_s / mtbf_s:.3g}), а формула требует C ≪ M: запись "
            f"почти никогда не успевает завершиться. Проверьте единицы (оба — в секундах) или "
            f"сократите запись (асинхронная, по частям)"
        )
    return write_s, mtbf_s


def young_interval(write_s: float, mtbf_s: float) -> float:
    """Оптимальный интервал контрольных точек по Янгу: I* = √(2·C·M), в секундах (C ≪ M, C ≥ M —
    ValueError). При C/M > 0.1 — предупреждение: I* завышен против точного оптимума (на 17 % при
    C/M = 0.1, на 43 % при 0.5), точнее ``daly_interval``."""
    write_s, mtbf_s = _write_below_mtbf("young_interval", write_s, mtbf_s)
    if write_s / mtbf_s > _YOUNG_RATIO_WARN:
        warnings.warn(
            f"young_interval: C/M = {write_s / mtbf_s:.2g} > {_YOUNG_RATIO_WARN:g} (C = "
            f"{write_s:g} с, M = {mtbf_s:g} с) — приближение Янга требует C ≪ M и здесь "
            f"завышает интервал; точнее daly_interval(C, M)",
            UserWarning,
            stacklevel=2,
        )
    return math.sqrt(2 * write_s * mtbf_s)  # I* = √(2CM), с: минимум C/I + I/(2M)


def daly_interval(write_s: float, mtbf_s: float) -> float:
    """Интервал по Дейли (2006), в секундах: √(2CM)·[1 + ⅓·√(C/2M) + (C/2M)/9] − C; до C/M = 0.99
    отличается от точного оптимума его модели меньше чем на 2 %. C ≥ M — ValueError."""
    write_s, mtbf_s = _write_below_mtbf("daly_interval", write_s, mtbf_s)
    x = write_s / (2 * mtbf_s)  # C/(2M) < 1/2
    return math.sqrt(2 * write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - write_s  # с


def checkpoint_overhead(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Доля времени, потерянная на контрольные точки: H(I) ≈ C/I + I/(2M), безразмерная (0.1 = 10 %).
    C/I — запись, I/(2M) — пересчёт половины интервала после отказа; I, C, M в секундах; верно при
    C ≪ I ≪ M, минимум H = √(2C/M) при I* = √(2CM)."""
    interval_s = positive("interval_s", interval_s)
    write_s = positive("write_s", write_s)
    mtbf_s = positive("mtbf_s", mtbf_s)
    return write_s / interval_s + interval_s / (2 * mtbf_s)  # H = C/I + I/(2M)


def daly_overhead(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Потери в модели Дейли (2006): H = M·(e^((I+C)/M) − 1)/I − 1, доля полезного времени; отказы
    пуассоновские, отрезок I + C повторяется до прохода без отказа (перезапуск R = 0); I, C, M в
    секундах; при C ≪ I ≪ M ≈ C/I + I/(2M)."""
    interval_s = positive("interval_s", interval_s)
    write_s = positive("write_s", write_s)
    mtbf_s = positive("mtbf_s", mtbf_s)
    return mtbf_s * math.expm1((interval_s + write_s) / mtbf_s) / interval_s - 1  # H Дейли


def _time_unit(seconds: float) -> tuple[float, str]:
    if seconds < 120:
        return 1.0, "с"
    if seconds < 2 * 3600:
        return 60.0, "мин"
    return 3600.0, "ч"


def plot_overhead(write_s: float, mtbf_s: float, ax=None, current_interval_s: float | None = None):
    """График H(I) = C/I + I/(2M) в % от интервала I (ось x логарифмическая, единица по I*):
    пунктиром — слагаемые C/I и I/(2M), оранжевым — daly_overhead и daly_interval; отмечены I*
    Янга и current_interval_s (ваш интервал, с). Возвращает matplotlib Axes."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    i_star = young_interval(write_s, mtbf_s)
    scale, unit = _time_unit(i_star)
    lo, hi = i_star / 10, i_star * 10
    if current_interval_s is not None:
        current_interval_s = positive("current_interval_s", current_interval_s)
        lo, hi = min(lo, current_interval_s / 2), max(hi, current_interval_s * 2)
    grid = np.geomspace(lo, hi, 400)
    write, redo = write_s / grid, grid / (2 * mtbf_s)  # доли: C/I и I/(2M)
    exact = np.array([daly_overhead(i, write_s, mtbf_s) for i in grid])
    ax = get_axes(ax, (11, 4))
    for y, style in (
        (write + redo, dict(color="tab:blue", lw=2, label="H(I) = C/I + I/(2M)")),
        (write, dict(color="tab:gray", ls="--", lw=1, label="запись: C/I")),
        (redo, dict(color="tab:gray", ls=":", lw=1.2, label="пересчёт после отказа: I/(2M)")),
        (exact, dict(color="tab:orange", lw=1.5, label=r"модель Дейли: $M\,(e^{(I+C)/M}-1)/I-1$")),
    ):
        ax.plot(grid / scale, 100 * y, **style)
    h_star = checkpoint_overhead(i_star, write_s, mtbf_s)
    ax.vlines(i_star / scale, 0, 100 * h_star, color="tab:green", ls="-.", lw=1)
    i_daly = daly_interval(write_s, mtbf_s)
    h_daly = daly_overhead(i_daly, write_s, mtbf_s)
    points = [  # (I, с; H, доля; маркер; стиль; подпись)
        (i_star, h_star, "o", {"color": "tab:green"}, "Янг: I* = √(2CM) = {i} {u}, H = {h} %"),
        (i_daly, h_daly, "D", {"color": "tab:orange", "ms": 5}, "Дейли: I = {i} {u}, H = {h} %"),
    ]
    if (cur := current_interval_s) is not None:
        h_cur = checkpoint_overhead(cur, write_s, mtbf_s)
        points.append((cur, h_cur, "s", {"color": "tab:red"}, "ваш интервал {i} {u}: H = {h} %"))
    for i, h, marker, style, label in points:
        label = label.format(i=f"{i / scale:.3g}", u=unit, h=f"{100 * h:.2f}")
        ax.plot([i / scale], [100 * h], marker, label=label, **style)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    (c_scale, c_unit), (m_scale, m_unit) = _time_unit(write_s), _time_unit(mtbf_s)
    ax.grid(linestyle=":", alpha=0.6, which="both")
    return finish_axes(
        ax,
        ylim=(0, min(100.0, 100 * float((write + redo).max())) * 1.05),
        xlabel=f"интервал между контрольными точками I, {unit} (логарифмическая шкала)",
        ylabel="потери H(I), % полезного времени",
        title=f"Цена контрольных точек: запись C = {write_s / c_scale:.3g} {c_unit},\n"
        f"среднее время между отказами M = {mtbf_s / m_scale:.3g} {m_unit}",
        legend={"fontsize": "small", "frameon": False, **LEGEND_RIGHT},
    )
