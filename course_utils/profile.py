"""Последовательный базовый профиль RL-цикла (шаг 12.1.5): бухгалтерия времени шага.

Этапы ``STAGES`` идут по очереди, поэтому шаг длится T_seq = Σ T_этапа (с): какой этап
доминирует и сколько даст его ускорение (закон Амдала). Времена этапов — dict или
``pandas.Series`` «этап → секунды»; таблица шагов — столбцы ``<этап>_s``. Здесь же палитра
этапов курса ``stage_colors`` и подписи ``STAGE_LABELS_RU``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from course_utils.args import choice, integer, nonnegative, positive, text
from course_utils.plots import LEGEND_RIGHT, finish_axes, get_axes

# Этапы эталонного цикла по порядку и их подписи; policy.LOOP_STAGES ссылается сюда.
STAGE_LABELS_RU: dict[str, str] = {
    "prepare": "подготовка запросов",
    "prefill": "предзаполнение (prefill)",
    "decode": "декодирование",
    "reward": "награда",
    "logprob_recompute": "пересчёт log-вероятностей",
    "forward_backward": "прямой и обратный проход",
    "optimizer_step": "шаг оптимизатора",
    "weight_sync": "синхронизация весов",
}
STAGES: tuple[str, ...] = tuple(STAGE_LABELS_RU)

# Значения по этапам в порядке STAGES (prepare … weight_sync).
# Медианы небольшого синхронного запуска с длинными ответами, с: доминирует декодирование.
DEFAULT_MEDIANS_S = dict(zip(STAGES, (0.05, 0.3, 6.0, 0.4, 0.8, 2.2, 0.3, 0.6)))
# σ логнормального шума: время шага = медиана · exp(σ·ξ), ξ ~ N(0, 1).
NOISE_SIGMA = dict(zip(STAGES, (0.2, 0.1, 0.15, 0.25, 0.08, 0.05, 0.05, 0.1)))
# Во сколько раз первый шаг медленнее (прогрев: выделение памяти, состояние Adam, ядра, кэши).
WARMUP_FACTOR = dict(zip(STAGES, (3.0, 2.0, 1.3, 1.5, 2.0, 2.0, 4.0, 1.5)))
# Этапы вне STAGES на рисунках курса: у каждого свой постоянный цвет и подпись.
EXTRA_STAGE_LABELS_RU = {
    "queue_wait": "ожидание пакета",
    "backpressure": "обратное давление",
    "verifier": "проверка ответа",
    "checkpoint": "контрольная точка",
}
_TOKEN_KEYS = {"input_tokens": "prefill", "output_tokens": "decode"}


def stage_columns() -> list[str]:
    """Имена столбцов времени этапов в таблице шагов: ``<этап>_s`` для каждого из STAGES."""
    return [f"{s}_s" for s in STAGES]


def _label(stage: str) -> str:
    return STAGE_LABELS_RU.get(stage, stage)


def _stage_times(stage_times: Any) -> dict[str, float]:
    """Словарь «этап → секунды» из непустого dict или Series; времена — конечные ≥ 0."""
    if not isinstance(stage_times, pd.Series | Mapping) or len(stage_times) == 0:
        kind = type(stage_times).__name__
        raise ValueError(
            f"stage_times: нужен непустой dict или Series «этап → время, с», а не {kind}"
        )
    return {
        text("stage_times: имя этапа", key): nonnegative(f"stage_times[{key!r}], с", value)
        for key, value in stage_times.items()
    }


def _positive_total(times: dict[str, float]) -> float:
    return positive("stage_times: сумма времён этапов, с", math.fsum(times.values()))


def synthetic_profile(
    steps: int = 10, seed: int = 0, scale: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Синтетический профиль уровня A: строка на шаг, столбцы ``step`` и ``<этап>_s`` (с):
    T_этапа = DEFAULT_MEDIANS_S · scale · exp(σ · ξ), ξ ~ N(0, 1), на шаге 0 ещё · WARMUP_FACTOR."""
    steps = integer("steps", steps, 1)
    seed = integer("seed", seed, 0)
    factors = dict.fromkeys(STAGES, 1.0)
    for stage, factor in (scale or {}).items():
        factors[choice("scale: этап", stage, STAGES)] = positive(f"scale[{stage!r}]", factor)
    noise = np.random.default_rng(seed).standard_normal((steps, len(STAGES)))
    medians = np.array([DEFAULT_MEDIANS_S[s] * factors[s] for s in STAGES])
    times = medians * np.exp(np.array([NOISE_SIGMA[s] for s in STAGES]) * noise)  # с
    times[0] *= [WARMUP_FACTOR[s] for s in STAGES]
    return pd.DataFrame({"step": np.arange(steps), **dict(zip(stage_columns(), times.T))})


def stage_medians(frame: pd.DataFrame, skip_warmup: int = 1) -> pd.Series:
    """Медиана времени каждого этапа (с) по шагам (по ``step``) после первых ``skip_warmup``."""
    if missing := [c for c in stage_columns() if c not in frame.columns]:
        raise ValueError(f"frame: нет столбцов времени этапов: {', '.join(missing)}")
    skip_warmup = integer("skip_warmup", skip_warmup, 0, len(frame) - 1)
    if "step" in frame.columns:
        frame = frame.sort_values("step", kind="stable")
    arr = frame[stage_columns()].iloc[skip_warmup:].to_numpy(dtype=float)
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError("frame: времена этапов должны быть конечными числами ≥ 0 с")
    return pd.Series(np.median(arr, axis=0), index=pd.Index(STAGES, name="этап"), name="медиана, с")


def sequential_time(stage_times: Mapping[str, float] | pd.Series) -> float:
    """Длительность последовательного шага T_seq = Σ T_этапа, в секундах."""
    return math.fsum(_stage_times(stage_times).values())


def dominant_stage(stage_times: Mapping[str, float] | pd.Series) -> str:
    """Этап с наибольшим временем (при равенстве — первый по порядку)."""
    times = _stage_times(stage_times)
    _positive_total(times)
    return max(times, key=lambda s: times[s])


def speedup_bound(stage_times: Mapping[str, float] | pd.Series, stage: str) -> float:
    """Предел Амдала, если этап stage стал бесплатным: S_max = T_seq / (T_seq − T_stage) (0 → inf)."""
    times = _stage_times(stage_times)
    total = _positive_total(times)
    stage = choice("stage: этап", stage, times)
    rest = math.fsum(t for s, t in times.items() if s != stage)  # T_seq − T_stage, с
    return math.inf if rest == 0 else total / rest


def profile_table(
    stage_times: Mapping[str, float] | pd.Series, tokens: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Строка на этап (индекс «код этапа»): «этап», «время, с», «доля, %» = 100 · T_этапа / T_seq;
    с tokens = {"input_tokens": N_in, "output_tokens": N_out} — «токенов/с» = N_in / T_prefill,
    N_out / T_decode (NaN у остальных этапов и при нулевом времени)."""
    times = _stage_times(stage_times)
    total = _positive_total(times)
    seconds = pd.Series(times, dtype=float).rename_axis("код этапа")
    table = pd.DataFrame(
        {"этап": seconds.index.map(_label), "время, с": seconds, "доля, %": 100.0 * seconds / total}
    )
    if tokens is None:
        return table
    table["токенов/с"] = math.nan
    for key, value in tokens.items():
        stage = _TOKEN_KEYS[choice("tokens: ключ", key, _TOKEN_KEYS)]
        count = nonnegative(f"tokens[{key!r}]", value)
        if times.get(stage, 0) > 0:
            table.loc[stage, "токенов/с"] = count / times[stage]  # токенов/с
    return table


def stage_colors(stages) -> dict[str, Any]:
    """Один этап — один цвет на всех рисунках курса: STAGES и EXTRA_STAGE_LABELS_RU — постоянные
    места палитры tab20 (сначала тёмные оттенки), незнакомые этапы — следующие по первому появлению."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    places = [*range(0, 20, 2), *range(1, 20, 2)]  # тёмные, затем светлые
    known = [*STAGES, *EXTRA_STAGE_LABELS_RU]
    order = known + [s for s in dict.fromkeys(map(str, stages)) if s not in known]
    return {str(s): cmap(places[order.index(str(s)) % len(places)]) for s in stages}


def plot_stage_bar(stage_times: Any, ax=None, title: str | None = None):
    """Горизонтальная составная полоса шага: сегмент на этап, длина — время, с; на широких
    сегментах — доля этапа в T_seq, справа — T_seq. Возвращает Axes."""
    from matplotlib.colors import to_rgb

    times = _stage_times(stage_times)
    total = _positive_total(times)  # T_seq, с
    ax = get_axes(ax, (10, 2.6))
    colors = stage_colors(times)
    left = 0.0
    for stage, width in times.items():
        style = {"height": 0.6, "edgecolor": "white", "linewidth": 0.8, "zorder": 2}
        ax.barh(0, width, left=left, color=colors[stage], label=_label(stage), **style)
        r, g, b = to_rgb(colors[stage])
        ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"  # яркость фона
        if width >= 0.06 * total:  # доля этапа в T_seq — только на широких сегментах
            label = f"{100 * width / total:.0f} %"
            ax.text(left + width / 2, 0, label, ha="center", va="center", fontsize=9, color=ink)
        left += width
    ax.text(total * 1.01, 0, f"{total:.2f} с", va="center", fontsize=9)
    ax.set_yticks([])
    ax.spines[["top", "right"]].set_visible(False)
    return finish_axes(
        ax,
        ylim=(0.5, -0.5),
        xlim=(0, total * 1.14),
        xlabel="время шага, с",
        title=f"Последовательный шаг по этапам: T_seq = {total:.2f} с" if title is None else title,
        grid="x",
        legend={
            "title": "этап",
            "fontsize": "small",
            "frameon": False,
            **LEGEND_RIGHT,
            "borderaxespad": 0.0,
        },
    )
