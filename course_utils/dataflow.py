"""Поток данных одного онлайн-обновления (шаг 12.1.1): восемь этапов и шесть ролей.

Описание — обычные данные (именованные кортежи), картинка рисуется из них matplotlib.
Поле ``loop_stages`` связывает этап лекции с этапами эталонного цикла
``course_utils.policy.sequential_loop``, чтобы в ноутбуке показать настоящий вывод каждого этапа.
"""

from __future__ import annotations

from typing import NamedTuple

from course_utils.plots import get_axes

ROLES = (
    ("scheduler", "планировщик запросов"),
    ("engine", "движок генерации"),
    ("verifier", "среда / проверяющая система"),
    ("trainer", "тренер"),
    ("sync", "служба синхронизации весов"),
    ("storage", "хранилище и телеметрия"),
)


class _Stage(NamedTuple):
    """Этап обновления: номер, роль-исполнитель, что делает, что передаёт дальше."""

    number: int
    role: str
    action: str
    output: str
    loop_stages: tuple[str, ...]


STAGES = (
    _Stage(1, "scheduler", "выбрать\nзапросы", "id запросов,\nтокены", ("prepare",)),
    _Stage(
        2, "engine", "сгенерировать\nроллауты", "токены, log μᵥ,\nверсия v", ("prefill", "decode")
    ),
    _Stage(3, "verifier", "вычислить\nнаграды", "награды,\nверсия проверки", ("reward",)),
    _Stage(
        4, "trainer", "восстановить\nмаски и log π", "маска,\nlog π_old", ("logprob_recompute",)
    ),
    _Stage(5, "trainer", "собрать\nмини-пакет", "пакет,\nпреимущества A", ()),
    _Stage(6, "trainer", "потери и\nградиенты", "градиенты", ("forward_backward",)),
    _Stage(7, "trainer", "обновить\nпараметры", "веса версии v+1", ("optimizer_step",)),
    _Stage(8, "sync", "опубликовать\nверсию v+1", "веса v+1\nу движка", ("weight_sync",)),
)


def plot_dataflow(ax=None):
    """Схема: роли — горизонтальные дорожки, этапы 1–8 — блоки слева направо, стрелки — данные.

    Хранилище и телеметрия получают копию роллаутов и метрик (пунктир). Возвращает Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    ax = get_axes(ax, (14, 6.2))
    lane = {key: i for i, (key, _) in enumerate(ROLES)}
    stages, n = STAGES, len(STAGES)
    colors = plt.get_cmap("tab10")
    w, h = 0.9, 0.84
    mid = {"ha": "center", "va": "center", "zorder": 3}
    for i in lane.values():
        ax.axhspan(i - 0.5, i + 0.5, color="0.96" if i % 2 else "white", zorder=0)
    arrow = {"arrowstyle": "-|>", "mutation_scale": 12, "lw": 1.3, "zorder": 1}
    box = {"boxstyle": "round,pad=0.02,rounding_size=0.08", "alpha": 0.25, "lw": 1.5, "zorder": 2}
    centers = [(k, lane[st.role]) for k, st in enumerate(stages)]
    for st, (x, y) in zip(stages, centers):
        color = colors(lane[st.role])
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, fc=color, ec=color, **box))
        ax.text(x, y - 0.1, f"{st.number}. {st.action}", fontsize=8, fontweight="bold", **mid)
        ax.text(x, y + 0.24, st.output, fontsize=7.5, color="0.3", **mid)
    for (x0, y0), (x1, y1) in zip(centers, centers[1:]):
        ax.add_patch(FancyArrowPatch((x0 + w / 2, y0), (x1 - w / 2, y1), color="0.2", **arrow))
    # Новая версия весов возвращается к движку: цикл замыкается (ломаная по свободной дорожке).
    (xe, ye), (xg, yg) = centers[-1], centers[1]
    right, top = xe + w / 2 + 0.12, -0.02
    ax.plot([xe + w / 2, right, right, xg], [ye, ye, top, top], color="tab:red", lw=1.3, zorder=1)
    ax.add_patch(FancyArrowPatch((xg, top), (xg, yg - h / 2), color="tab:red", **arrow))
    loop_text = "веса v+1 → следующий шаг движка (цикл замыкается)"
    red = {"ha": "center", "va": "bottom", "fontsize": 8, "color": "tab:red"}
    ax.text((xg + right) / 2, top - 0.12, loop_text, **red)
    ys = lane["storage"]
    for x, y in (centers[k] for k in (1, 2, 6)):
        copy = {**arrow, "mutation_scale": 9, "lw": 1.0}
        ax.add_patch(FancyArrowPatch((x, y + h / 2), (x, ys - 0.15), ls="--", color="0.5", **copy))
    storage_text = "журнал роллаутов, метрики, контрольные точки"
    ax.text(n / 2 - 0.5, ys, storage_text, fontsize=8.5, color="0.3", **mid)
    ax.set_yticks(range(len(ROLES)), [name for _, name in ROLES], fontsize=9)
    ax.set(xticks=[], xlim=(-0.6, n - 0.2), ylim=(len(ROLES) - 0.5, -0.5))
    ax.spines[["top", "right", "bottom"]].set_visible(False)
    ax.set_title("Одно обновление онлайн-RL: этапы (блоки), роли (дорожки) и данные (стрелки)")
    return ax
