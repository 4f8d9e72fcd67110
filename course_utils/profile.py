"""Последовательный базовый профиль RL-цикла (лекция, шаг 12.1.5): бухгалтерия времени шага.

Один шаг эталонного цикла проходит этапы ``STAGES`` строго по очереди, поэтому его длительность —
сумма времён этапов: T_seq = Σ T_этапа (с). Это не модель производительности кластера, а ответ на
первый вопрос: какой этап доминирует и сколько максимум даст его ускорение (закон Амдала).

* ``synthetic_profile`` — синтетический профиль уровня A (строка на шаг, столбцы ``<этап>_s``);
  ``policy.sequential_loop(...).steps`` имеет те же столбцы, и все функции ниже работают с обоими;
* ``stage_medians`` — медиана каждого этапа без шагов прогрева;
* ``sequential_time``, ``dominant_stage``, ``speedup_bound``, ``speedup`` — арифметика профиля;
* ``profile_table`` и ``plot_stage_bar`` — таблица и горизонтальная составная полоса.

Времена этапов передаются словарём или ``pandas.Series`` «этап → секунды».
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from course_utils.args import is_number, text

__all__ = [
    "DEFAULT_MEDIANS_S",
    "NOISE_SIGMA",
    "STAGES",
    "STAGE_LABELS_RU",
    "stage_colors",
    "WARMUP_FACTOR",
    "dominant_stage",
    "plot_stage_bar",
    "profile_table",
    "sequential_time",
    "amdahl_speedup",
    "speedup_bound",
    "stage_columns",
    "stage_medians",
    "synthetic_profile",
]

# Этапы эталонного цикла; policy.LOOP_STAGES ссылается сюда (здесь нет импорта torch).
STAGES: tuple[str, ...] = (
    "prepare",
    "prefill",
    "decode",
    "reward",
    "logprob_recompute",
    "forward_backward",
    "optimizer_step",
    "weight_sync",
)

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

# Медианы этапов небольшого синхронного запуска с длинными ответами (с): доминирует декодирование.
DEFAULT_MEDIANS_S: dict[str, float] = {
    "prepare": 0.05,
    "prefill": 0.3,
    "decode": 6.0,
    "reward": 0.4,
    "logprob_recompute": 0.8,
    "forward_backward": 2.2,
    "optimizer_step": 0.3,
    "weight_sync": 0.6,
}

# σ логнормального шума по этапам: время шага = медиана · exp(σ·ξ), ξ ~ N(0, 1).
NOISE_SIGMA: dict[str, float] = {
    "prepare": 0.2,
    "prefill": 0.1,
    "decode": 0.15,
    "reward": 0.25,
    "logprob_recompute": 0.08,
    "forward_backward": 0.05,
    "optimizer_step": 0.05,
    "weight_sync": 0.1,
}

# Во сколько раз первый шаг медленнее (прогрев: выделение памяти, состояние Adam, ядра, кэши).
WARMUP_FACTOR: dict[str, float] = {
    "prepare": 3.0,
    "prefill": 2.0,
    "decode": 1.3,
    "reward": 1.5,
    "logprob_recompute": 2.0,
    "forward_backward": 2.0,
    "optimizer_step": 4.0,
    "weight_sync": 1.5,
}


def stage_columns() -> list[str]:
    """Имена столбцов времени этапов в таблице шагов: ``<этап>_s`` для каждого из STAGES."""
    return [f"{s}_s" for s in STAGES]


# ---------------------------------------------------------------- проверка входа
def _label(stage: str) -> str:
    return STAGE_LABELS_RU.get(stage, stage)


def _stage_times(stage_times: Any, name: str = "stage_times") -> dict[str, float]:
    """Словарь «этап → секунды» из dict или Series; ValueError на пустом, отрицательном, NaN."""
    if isinstance(stage_times, pd.DataFrame):
        raise ValueError(
            f"{name}: ожидается один профиль (dict или Series «этап → с»), получена таблица; "
            "сведите её через stage_medians(...)"
        )
    if isinstance(stage_times, pd.Series):
        if not stage_times.index.is_unique:
            raise ValueError(f"{name}: этапы в индексе Series повторяются")
        items = list(stage_times.items())
    elif isinstance(stage_times, Mapping):
        items = list(stage_times.items())
    else:
        raise ValueError(
            f"{name}: ожидается dict или pandas.Series «этап → время, с», "
            f"получено {type(stage_times).__name__}"
        )
    if not items:
        raise ValueError(f"{name} пуст: нужен хотя бы один этап со временем ≥ 0 с")
    out: dict[str, float] = {}
    for key, value in items:
        key = text(f"{name}: имя этапа", key)
        if not is_number(value) or not math.isfinite(float(value)) or value < 0:
            raise ValueError(
                f"{name}[{key!r}]: время этапа должно быть конечным числом ≥ 0 с, "
                f"получено {value!r}"
            )
        out[key] = float(value)
    return out


def _positive_total(times: dict[str, float], name: str = "stage_times") -> float:
    total = math.fsum(times.values())
    if not total > 0:
        raise ValueError(f"{name}: сумма времён этапов должна быть > 0 с, получено {total!r}")
    return total


def _known_stage(times: dict[str, float], stage: Any) -> str:
    if not isinstance(stage, str) or stage not in times:
        raise ValueError(f"stage: этап должен быть одним из {list(times)}, получено {stage!r}")
    return stage


# ---------------------------------------------------------------- синтетический профиль
def synthetic_profile(
    steps: int = 10, seed: int = 0, scale: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Синтетический профиль уровня A: строка на шаг, столбцы ``step`` и ``<этап>_s`` (с).

    T_этапа(шаг) = DEFAULT_MEDIANS_S[этап] · scale[этап] · exp(σ_этапа · ξ), ξ ~ N(0, 1),
    σ — из NOISE_SIGMA; на шаге 0 время ещё умножается на WARMUP_FACTOR (прогрев).
    ``scale`` — множители медиан отдельных этапов, например ``{"reward": 20}`` (медленный
    верификатор): так доминирующим становится другой этап. Детерминирован по ``seed``.
    """
    if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps: нужно целое число шагов ≥ 1, получено {steps!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: нужно целое ≥ 0, получено {seed!r}")
    factors = dict.fromkeys(STAGES, 1.0)
    if scale is not None:
        if not isinstance(scale, Mapping):
            raise ValueError(
                f"scale: ожидается словарь «этап → множитель медианы», "
                f"получено {type(scale).__name__}"
            )
        for stage, factor in scale.items():
            if stage not in factors:
                raise ValueError(f"scale: неизвестный этап {stage!r}; этапы: {list(STAGES)}")
            if not is_number(factor) or not math.isfinite(float(factor)) or factor <= 0:
                raise ValueError(
                    f"scale[{stage!r}]: множитель должен быть конечным числом > 0, "
                    f"получено {factor!r}"
                )
            factors[stage] = float(factor)
    rng = np.random.default_rng(int(seed))
    noise = rng.standard_normal((int(steps), len(STAGES)))
    data: dict[str, Any] = {"step": np.arange(int(steps))}
    for j, stage in enumerate(STAGES):
        times = DEFAULT_MEDIANS_S[stage] * factors[stage] * np.exp(NOISE_SIGMA[stage] * noise[:, j])
        times[0] *= WARMUP_FACTOR[stage]
        data[f"{stage}_s"] = times
    return pd.DataFrame(data)


def stage_medians(frame: pd.DataFrame, skip_warmup: int = 1) -> pd.Series:
    """Медиана времени каждого этапа (с) по шагам после первых ``skip_warmup`` (прогрев).

    Нужны столбцы ``<этап>_s`` для всех STAGES (как у synthetic_profile и
    ``policy.sequential_loop(...).steps``); при наличии столбца ``step`` шаги упорядочиваются
    по нему. Возвращает Series с индексом STAGES.
    """
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(
            f"frame: ожидается pandas.DataFrame со столбцами <этап>_s, "
            f"получено {type(frame).__name__}"
        )
    missing = [c for c in stage_columns() if c not in frame.columns]
    if missing:
        raise ValueError(f"frame: нет столбцов времени этапов: {', '.join(missing)}")
    if not isinstance(skip_warmup, numbers.Integral) or isinstance(skip_warmup, bool):
        raise ValueError(f"skip_warmup: нужно целое ≥ 0, получено {skip_warmup!r}")
    if not 0 <= skip_warmup < len(frame):
        raise ValueError(
            f"skip_warmup: должно быть от 0 до {len(frame) - 1} (в таблице {len(frame)} шагов), "
            f"получено {skip_warmup}"
        )
    if "step" in frame.columns:
        frame = frame.sort_values("step", kind="stable")
    values = frame[stage_columns()].iloc[int(skip_warmup) :]
    arr = values.to_numpy(dtype=float)
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError("frame: времена этапов должны быть конечными числами ≥ 0 с")
    out = pd.Series(np.median(arr, axis=0), index=list(STAGES), name="медиана, с")
    out.index.name = "этап"
    return out


# ---------------------------------------------------------------- арифметика профиля
def sequential_time(stage_times: Mapping[str, float] | pd.Series) -> float:
    """Длительность последовательного шага T_seq = Σ T_этапа, в секундах."""
    return math.fsum(_stage_times(stage_times).values())


def dominant_stage(stage_times: Mapping[str, float] | pd.Series) -> str:
    """Этап с наибольшим временем (при равенстве — первый по порядку)."""
    times = _stage_times(stage_times)
    _positive_total(times)
    return max(times, key=lambda s: times[s])


def speedup_bound(stage_times: Mapping[str, float] | pd.Series, stage: str) -> float:
    """Предел ускорения шага по Амдалу, если этап ``stage`` стал бесплатным (безразмерный).

    S_max = T_seq / (T_seq − T_stage); знаменатель считается как сумма остальных этапов.
    Если этап — это весь T_seq (остальные равны 0), предела нет: возвращается inf.
    """
    times = _stage_times(stage_times)
    total = _positive_total(times)
    stage = _known_stage(times, stage)
    rest = math.fsum(t for s, t in times.items() if s != stage)
    return math.inf if rest == 0 else total / rest


def amdahl_speedup(
    stage_times: Mapping[str, float] | pd.Series, stage: str, factor: float
) -> float:
    """Ускорение шага по Амдалу, если этап ``stage`` стал быстрее в ``factor`` раз (безразмерное).

    S = T_seq / (T_seq − T_stage + T_stage / factor); factor = 1 → 1, factor → ∞ → S_max
    (factor = inf допустим), factor < 1 — замедление (S < 1).
    """
    times = _stage_times(stage_times)
    total = _positive_total(times)
    stage = _known_stage(times, stage)
    if not is_number(factor) or math.isnan(float(factor)) or not factor > 0:
        raise ValueError(f"factor: ускорение этапа должно быть числом > 0, получено {factor!r}")
    rest = math.fsum(t for s, t in times.items() if s != stage)
    new_total = rest + times[stage] / float(factor)
    return math.inf if new_total == 0 else total / new_total


# ---------------------------------------------------------------- таблица и рисунок
_TOKEN_KEYS = {"input_tokens": "prefill", "output_tokens": "decode"}


def profile_table(
    stage_times: Mapping[str, float] | pd.Series, tokens: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Таблица профиля: строка на этап — «этап», «время, с», «доля, %» (= 100 · T_этапа / T_seq).

    С ``tokens = {"input_tokens": N_in, "output_tokens": N_out}`` (на шаг) добавляется столбец
    «токенов/с»: N_in / T_prefill для prefill и N_out / T_decode для decode, NaN для остальных
    этапов (и при нулевом времени этапа). Индекс — ключи этапов (``STAGES``), его имя
    «код этапа»: ключи остаются как в коде, русская подпись — в столбце «этап».
    """
    times = _stage_times(stage_times)
    total = _positive_total(times)
    table = pd.DataFrame(
        {
            "этап": [_label(s) for s in times],
            "время, с": list(times.values()),
            "доля, %": [100.0 * t / total for t in times.values()],
        },
        index=pd.Index(list(times), name="код этапа"),
    )
    if tokens is not None:
        if not isinstance(tokens, Mapping) or not tokens:
            raise ValueError(
                'tokens: ожидается словарь {"input_tokens": N, "output_tokens": N}, '
                f"получено {tokens!r}"
            )
        rates = [math.nan] * len(times)
        names = list(times)
        for key, value in tokens.items():
            if key not in _TOKEN_KEYS:
                raise ValueError(f"tokens: ключ {key!r} неизвестен; допустимы {list(_TOKEN_KEYS)}")
            if not is_number(value) or not math.isfinite(float(value)) or value < 0:
                raise ValueError(f"tokens[{key!r}]: нужно число токенов ≥ 0, получено {value!r}")
            stage = _TOKEN_KEYS[key]
            if stage in times and times[stage] > 0:
                rates[names.index(stage)] = float(value) / times[stage]
        table["токенов/с"] = rates
    return table


def _profiles(data: Any) -> tuple[list[str], list[str], np.ndarray]:
    """(подписи строк, этапы, матрица с) из одного профиля или таблицы профилей."""
    if not isinstance(data, pd.DataFrame):
        times = _stage_times(data)
        return [""], list(times), np.array([list(times.values())], dtype=float)
    if data.empty:
        raise ValueError("stage_times: таблица профилей пуста")
    if all(c in data.columns for c in stage_columns()):  # таблица шагов: столбцы <этап>_s
        frame = data[stage_columns()].set_axis(list(STAGES), axis=1)
        if "step" in data.columns:
            labels = [f"шаг {s}" for s in data["step"]]
        else:
            labels = [str(i) for i in data.index]
    else:
        frame, labels = data, [str(i) for i in data.index]
    rows = [_stage_times(row, f"stage_times (строка {label!r})") for label, (_, row) in
            zip(labels, frame.iterrows())]  # fmt: skip
    return labels, [str(c) for c in frame.columns], np.array([list(r.values()) for r in rows])


# Этапы вне STAGES, которые встречаются на рисунках курса: у каждого свой постоянный цвет.
EXTRA_STAGES = ("queue_wait", "backpressure", "verifier", "checkpoint")


def stage_colors(stages) -> dict[str, Any]:
    """Один этап — один цвет на всех рисунках курса (диаграммы Ганта, полосы профиля).

    STAGES и EXTRA_STAGES получают постоянные места палитры tab20 (сначала тёмные оттенки,
    потом светлые); незнакомые этапы — следующие места в порядке первого появления.
    """
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    places = [2 * i for i in range(10)] + [2 * i + 1 for i in range(10)]  # тёмные, затем светлые
    known = [*STAGES, *EXTRA_STAGES]
    unknown = [s for s in dict.fromkeys(str(x) for x in stages) if s not in known]
    order = known + unknown
    return {str(s): cmap(places[order.index(str(s)) % len(places)]) for s in stages}


def plot_stage_bar(stage_times: Any, ax=None, title: str | None = None):
    """Горизонтальная составная полоса шага: сегмент на этап, длина — время, с.

    Один профиль (dict или Series) — одна полоса; таблица профилей (строка на профиль,
    столбцы — этапы, например уровни A и B) или таблица шагов со столбцами ``<этап>_s`` —
    полоса на строку. На широких сегментах подписана доля этапа в T_seq строки, справа от
    полосы — T_seq. Возвращает matplotlib Axes; сегментов (патчей) — строк × этапов.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    if title is not None and not isinstance(title, str):
        raise ValueError(f"title должно быть строкой или None, получено {title!r}")
    labels, stages, matrix = _profiles(stage_times)
    totals = matrix.sum(axis=1)
    if not (totals > 0).all():
        raise ValueError("stage_times: у каждого профиля сумма времён этапов должна быть > 0 с")
    n_rows = len(labels)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, max(2.6, 1.3 + 0.55 * n_rows)))
    colors = stage_colors(stages)
    x_max = float(totals.max())
    left = np.zeros(n_rows)
    for j, stage in enumerate(stages):
        widths = matrix[:, j]
        bars = ax.barh(
            range(n_rows),
            widths,
            left=left,
            height=0.6,
            color=colors[stage],
            edgecolor="white",
            linewidth=0.8,
            label=_label(stage),
            zorder=2,
        )
        for i, patch in enumerate(bars.patches):
            share = widths[i] / totals[i]
            if widths[i] >= 0.06 * x_max and share >= 0.04:
                r, g, b = to_rgb(colors[stage])
                ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.6 else "white"
                ax.text(
                    patch.get_x() + patch.get_width() / 2,
                    i,
                    f"{100 * share:.0f} %",
                    ha="center",
                    va="center",
                    fontsize=9,
                    color=ink,
                    zorder=3,
                )
        left = left + widths
    for i, total in enumerate(totals):
        ax.text(total + 0.01 * x_max, i, f"{total:.2f} с", va="center", fontsize=9)
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(labels)
    if n_rows == 1 and not labels[0]:
        ax.set_yticks([])
    ax.set_ylim(n_rows - 0.5, -0.5)  # первая строка сверху
    ax.set_xlim(0, x_max * 1.14)
    ax.set_xlabel("время шага, с")
    ax.grid(axis="x", linestyle=":", alpha=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title is None:
        title = (
            f"Последовательный шаг по этапам: T_seq = {totals[0]:.2f} с"
            if n_rows == 1
            else "Последовательный шаг по этапам"
        )
    ax.set_title(title)
    ax.legend(
        title="этап",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize="small",
        frameon=False,
    )
    if ax.figure is not None:
        with contextlib.suppress(Exception):  # вид рисунка не должен ломать ячейку
            ax.figure.tight_layout()
    return ax
