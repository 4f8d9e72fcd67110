"""Оформление рисунков, общее для всех ``plot_*`` курса: оси, подписи, сетка, легенда."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

# Легенда справа от осей, внутри фигуры: данные занимают всю ширину осей.
LEGEND_RIGHT = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}


def get_axes(ax, figsize: tuple[float, float], **subplots_kw):
    """ax, если он дан, иначе оси новой фигуры figsize, дюймы (subplots_kw — в plt.subplots)."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=figsize, **subplots_kw)
    return ax


def finish_axes(ax, *, grid: str | None = None, legend: Mapping | None = None, **labels):
    """Оформление рисунка: ``ax.set(**labels)`` (title, xlabel, ylabel…), пунктирная сетка по оси
    grid ("x", "y", "both") под данными, ``ax.legend(**legend)``, tight_layout; возвращает ax."""
    ax.set(**labels)
    if grid is not None:
        ax.grid(axis=grid, linestyle=":", alpha=0.6)
        ax.set_axisbelow(True)
    if legend is not None:
        ax.legend(**legend)
    with contextlib.suppress(Exception):  # вид рисунка не должен ломать ячейку
        ax.figure.tight_layout()
    return ax
