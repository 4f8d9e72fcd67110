"""Последовательный базовый профиль RL-цикла (лекция, шаг 12.1.5): бухгалтерия времени шага.

Этапы ``STAGES`` идут строго по очереди, поэтому шаг длится T_seq = Σ T_этапа (с). Профиль
отвечает на первый вопрос: какой этап доминирует и сколько даст его ускорение (закон Амдала).
Времена этапов — словарь или ``pandas.Series`` «этап → секунды»; таблица шагов — столбцы
``<этап>_s`` (как у ``synthetic_profile`` и ``policy.sequential_loop(...).steps``).
Здесь же единая палитра этапов курса ``stage_colors`` / ``STAGE_LABELS_RU``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from course_utils.args import choice, integer, nonnegative, positive, text

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
# Этапы вне STAGES на рисунках курса: у каждого свой постоянный цвет.
_EXTRA_STAGES = ("queue_wait", "backpressure", "verifier", "checkpoint")
_TOKEN_KEYS = {"input_tokens": "prefill", "output_tokens": "decode"}


def stage_columns() -> list[str]:
    """Имена столбцов времени этапов в таблице шагов: ``<этап>_s`` для каждого из STAGES."""
    return [f"{s}_s" for s in STAGES]


def _label(stage: str) -> str:
    return STAGE_LABELS_RU.get(stage, stage)


def _stage_times(stage_times: Any, name: str = "stage_times") -> dict[str, float]:
    """Словарь «этап → секунды» из непустого dict или Series; времена — конечные ≥ 0."""
    if not isinstance(stage_times, pd.Series | Mapping) or len(stage_times) == 0:
        kind = type(stage_times).__name__
        raise ValueError(f"{name}: нужен непустой dict или Series «этап → время, с», а не {kind}")
    return {
        text(f"{name}: имя этапа", key): nonnegative(f"{name}[{key!r}], с", value)
        for key, value in stage_times.items()
    }


def _positive_total(times: dict[str, float], name: str = "stage_times") -> float:
    total = math.fsum(times.values())
    if not total > 0:
        raise ValueError(f"{name}: сумма времён этапов должна быть > 0 с, получено {total!r}")
    return total


def synthetic_profile(
    steps: int = 10, seed: int = 0, scale: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Синтетический профиль уровня A: строка на шаг, столбцы ``step`` и ``<этап>_s`` (с).

    T_этапа(шаг) = DEFAULT_MEDIANS_S · scale · exp(σ · ξ), ξ ~ N(0, 1), σ — из NOISE_SIGMA;
    на шаге 0 время ещё умножается на WARMUP_FACTOR (прогрев). ``scale`` — множители медиан
    этапов, например ``{"reward": 20}`` (медленный верификатор). Детерминирован по ``seed``.
    """
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
    """Медиана времени каждого этапа (с) по шагам после первых ``skip_warmup`` (прогрев).

    Нужны столбцы ``<этап>_s`` для всех STAGES; шаги упорядочиваются по ``step``, если он есть.
    """
    if missing := [c for c in stage_columns() if c not in frame.columns]:
        raise ValueError(f"frame: нет столбцов времени этапов: {', '.join(missing)}")
    skip_warmup = integer("skip_warmup", skip_warmup, 0, len(frame) - 1)
    if "step" in frame.columns:
        frame = frame.sort_values("step", kind="stable")
    arr = frame[stage_columns()].iloc[skip_warmup:].to_numpy(dtype=float)
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError("frame: времена этапов должны быть конечными числами ≥ 0 с")
    out = pd.Series(np.median(arr, axis=0), index=list(STAGES), name="медиана, с")
    out.index.name = "этап"
    return out


def sequential_time(stage_times: Mapping[str, float] | pd.Series) -> float:
    """Длительность последовательного шага T_seq = Σ T_этапа, в секундах."""
    return math.fsum(_stage_times(stage_times).values())


def dominant_stage(stage_times: Mapping[str, float] | pd.Series) -> str:
    """Этап с наибольшим временем (при равенстве — первый по порядку)."""
    times = _stage_times(stage_times)
    _positive_total(times)
    return max(times, key=lambda s: times[s])


def speedup_bound(stage_times: Mapping[str, float] | pd.Series, stage: str) -> float:
    """Предел Амдала, если этап ``stage`` стал бесплатным: S_max = T_seq / (T_seq − T_stage).

    Безразмерное; знаменатель 0 (других этапов нет) → inf.
    """
    times = _stage_times(stage_times)
    total = _positive_total(times)
    stage = choice("stage: этап", stage, times)
    rest = math.fsum(t for s, t in times.items() if s != stage)  # T_seq − T_stage, с
    return math.inf if rest == 0 else total / rest


def profile_table(
    stage_times: Mapping[str, float] | pd.Series, tokens: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Таблица профиля: строка на этап — «этап», «время, с», «доля, %» (= 100 · T_этапа / T_seq).

    С ``tokens = {"input_tokens": N_in, "output_tokens": N_out}`` (на шаг) — столбец «токенов/с»:
    N_in / T_prefill, N_out / T_decode, NaN у остальных этапов и при нулевом времени.
    Индекс «код этапа» — ключи этапов, русская подпись — в столбце «этап».
    """
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


def _profiles(data: Any) -> tuple[list[str], list[str], np.ndarray]:
    """(подписи строк, этапы, матрица с) из одного профиля или таблицы профилей."""
    if not isinstance(data, pd.DataFrame):
        times = _stage_times(data)
        return [""], list(times), np.array([list(times.values())])
    if data.empty:
        raise ValueError("stage_times: таблица профилей пуста")
    labels = [str(i) for i in data.index]
    if set(stage_columns()) <= set(data.columns):  # таблица шагов: столбцы <этап>_s
        if "step" in data.columns:
            labels = [f"шаг {s}" for s in data["step"]]
        data = data[stage_columns()].set_axis(list(STAGES), axis=1)
    rows = [
        _stage_times(r, f"stage_times (строка {i!r})") for i, (_, r) in zip(labels, data.iterrows())
    ]
    return labels, [str(c) for c in data.columns], np.array([list(r.values()) for r in rows])


def stage_colors(stages) -> dict[str, Any]:
    """Один этап — один цвет на всех рисунках курса (диаграммы Ганта, полосы профиля).

    STAGES и _EXTRA_STAGES получают постоянные места палитры tab20 (сначала тёмные оттенки,
    потом светлые); незнакомые этапы — следующие места в порядке первого появления.
    """
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    places = [*range(0, 20, 2), *range(1, 20, 2)]  # тёмные, затем светлые
    known = [*STAGES, *_EXTRA_STAGES]
    order = known + [s for s in dict.fromkeys(map(str, stages)) if s not in known]
    return {str(s): cmap(places[order.index(str(s)) % len(places)]) for s in stages}


def plot_stage_bar(stage_times: Any, ax=None, title: str | None = None):
    """Горизонтальная составная полоса шага: сегмент на этап, длина — время, с.

    Один профиль — одна полоса; таблица профилей (строка на профиль, столбцы — этапы) или
    таблица шагов со столбцами ``<этап>_s`` — полоса на строку. На широких сегментах — доля
    этапа в T_seq строки, справа — T_seq. Возвращает Axes; патчей — строк × этапов.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    labels, stages, matrix = _profiles(stage_times)
    totals = matrix.sum(axis=1)  # T_seq строки, с
    if not (totals > 0).all():
        raise ValueError("stage_times: у каждого профиля сумма времён этапов должна быть > 0 с")
    n_rows, x_max = len(labels), float(totals.max())
    if ax is None:
        _, ax = plt.subplots(figsize=(10, max(2.6, 1.3 + 0.55 * n_rows)))
    colors = stage_colors(stages)
    left = np.zeros(n_rows)
    for stage, widths in zip(stages, matrix.T):
        color = colors[stage]
        style = {"height": 0.6, "edgecolor": "white", "linewidth": 0.8, "zorder": 2}
        bars = ax.barh(range(n_rows), widths, left=left, color=color, label=_label(stage), **style)
        r, g, b = to_rgb(color)
        ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"  # яркость фона
        for i, patch in enumerate(bars.patches):
            share = widths[i] / totals[i]  # доля этапа в T_seq
            if widths[i] >= 0.06 * x_max and share >= 0.04:
                x = patch.get_x() + patch.get_width() / 2
                label = f"{100 * share:.0f} %"
                ax.text(x, i, label, ha="center", va="center", fontsize=9, color=ink, zorder=3)
        left = left + widths
    for i, total in enumerate(totals):
        ax.text(total + 0.01 * x_max, i, f"{total:.2f} с", va="center", fontsize=9)
    ax.set_yticks(range(n_rows), labels)
    if n_rows == 1 and not labels[0]:
        ax.set_yticks([])
    ax.set_ylim(n_rows - 0.5, -0.5)  # первая строка сверху
    ax.set_xlim(0, x_max * 1.14)
    ax.set_xlabel("время шага, с")
    ax.grid(axis="x", linestyle=":", alpha=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    if title is None:
        title = "Последовательный шаг по этапам"
        title += f": T_seq = {totals[0]:.2f} с" if n_rows == 1 else ""
    ax.set_title(title)
    legend = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
    ax.legend(title="этап", fontsize="small", frameon=False, **legend)
    with contextlib.suppress(Exception):  # вид рисунка не должен ломать ячейку
        ax.figure.tight_layout()
    return ax
