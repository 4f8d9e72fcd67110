"""12.1.7 — профиль цикла (T_seq, узкое место, предел Амдала) и карта «размещение × синхронность».

Времена — медианы ``profile.synthetic_profile``; клетки карты — из словаря осей ``stack_map``.
"""

from __future__ import annotations

import random
from typing import Any

from course_utils import profile, stack_map
from course_utils.exercises.answers import Choice, Fields, Keyed, Number, norm
from course_utils.exercises.step import Step, Trap

SETUP_CLASSES = tuple(f"{p}/{s}" for p in stack_map.PLACEMENTS for s in stack_map.SYNCHRONY)
ONE_STEP_WORDS = ("one_step", "one-step", "one step", "шаг позади", "1-step")

# (описание схемы, клетка, почему) — классификация однозначна в терминах шага 12.1.3.
SETUPS: tuple[tuple[str, str, str], ...] = (
    ("Один GPU: модель генерирует пакет ответов, затем на нём же обучается; следующая генерация "
     "начинается только после шага оптимизатора.", "colocated/sync",
     "роли по очереди занимают один GPU, каждый пакет собран текущими весами"),
    ("Движок генерации и тренер делят одни и те же 8 GPU: на время генерации состояние "
     "оптимизатора выгружается в память CPU, потом движок освобождает KV-кэш и идёт обновление; "
     "каждый пакет порождён текущей версией весов.", "colocated/sync",
     "одни и те же GPU по очереди; данные одной, текущей версии"),
    ("Одни и те же 4 GPU попеременно генерируют и обучают, но тренер не ждёт свежих ответов: он "
     "берёт пакет из буфера, где лежат ответы двух-трёх предыдущих версий политики.",
     "colocated/async",
     "размещение совместное, но данные приходят с разными (старыми) версиями — оси независимы"),
    ("Генератор — отдельный vLLM-сервер на своих GPU. Тренер отправляет запросы, ждёт весь "
     "пакет, делает шаг и только потом рассылает новые веса; всё это время сервер простаивает.",
     "disaggregated/sync", "отдельный сервер, но тренер ждёт каждый пакет текущей версии — "
     "отдельный сервер не делает алгоритм асинхронным"),
    ("Два пула на разных узлах: 16 GPU генерации и 16 GPU обучения. Пулы работают строго по "
     "очереди, каждый пакет порождён текущей версией весов.", "disaggregated/sync",
     "раздельные пулы, но строгая очередность и одна версия на пакет"),
    ("Сборщики на отдельных машинах готовят пакет и блокируются на барьере, пока тренер не "
     "закончит шаг оптимизатора и они не получат новые веса.", "disaggregated/sync",
     "раздельные машины, барьер: следующий пакет только после обновления"),
    ("Отдельные пулы генерации и обучения связаны очередью; сборщики не останавливаются во "
     "время обновления, данные отстают от тренера не более чем на 2 версии.",
     "disaggregated/async", "раздельные пулы, генерация идёт во время обновления, данные разных версий"),
    ("Движки SGLang на отдельных узлах генерируют непрерывно и подтягивают веса раз в несколько "
     "шагов; тренер забирает из буфера всё, что пришло, с версией каждого роллаута.",
     "disaggregated/async", "раздельные узлы, непрерывная генерация, версии в буфере разные"),
    ("Генератор на своих GPU собирает пакет k + 1, пока тренер на других GPU обучается на пакете "
     "k (отставание данных — одна версия).", "disaggregated/async",
     "раздельные GPU; генерация перекрыта с обучением, данные отстают на версию — это «на шаг "
     "позади» (one-step-off), частный случай асинхронного режима"),
)  # fmt: skip
# (множители медиан synthetic_profile, описание запуска); вариант v берёт сценарий v mod 4
SCENARIOS = (({}, "длинные рассуждения, малые группы"),
             ({"reward": 25.0}, "верификатор запускает тесты в песочнице"),
             ({"decode": 0.25, "forward_backward": 2.0}, "короткие ответы, несколько эпох PPO на пакет"),
             ({"decode": 0.3, "weight_sync": 12.0}, "веса передаются по медленной сети"))  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_1_7_000 + 7919 * variant)
    scale, scenario = SCENARIOS[variant % len(SCENARIOS)]
    frame = profile.synthetic_profile(steps=8, seed=(12_170 + 7919 * variant) % 2**32, scale=scale)
    times = {stage: round(float(t), 2) for stage, t in profile.stage_medians(frame).items()}
    total = profile.sequential_time(times)
    # T_seq/T и T_seq/(T_seq − T) совпадают при T = T_seq/2: такой этап не годится
    candidates = [s for s, t in times.items() if t >= 0.1 * total and abs(1 - 2 * t / total) > 0.05]
    accelerate = rng.choice(candidates or [profile.dominant_stage(times)])
    by_class = {c: [s for s in SETUPS if s[1] == c] for c in SETUP_CLASSES}
    sync, async_ = by_class["disaggregated/sync"], by_class["disaggregated/async"]
    chosen = [rng.choice(sync), rng.choice(async_)]
    chosen.append(rng.choice(by_class["colocated/sync"] + by_class["colocated/async"]))
    chosen.append(rng.choice([s for s in SETUPS if s not in chosen]))
    rng.shuffle(chosen)
    setups = {sid: text for sid, (text, _, _) in zip("ABCD", chosen)}
    table = "\n".join(f"| `{s}` | {profile.STAGE_LABELS_RU.get(s, s)} | {t:.2f} |" for s, t in times.items())  # fmt: skip
    legend = ", ".join(f"`{c}` — {stack_map.VALUE_LABELS[c]}" for c in (*stack_map.PLACEMENTS, *stack_map.SYNCHRONY))  # fmt: skip
    statement = (
        f"**Профиль цикла и две оси.** Запуск: {scenario}. Медианы времён этапов одного шага "
        "последовательного цикла после прогрева (они же в `task['stage_times']`), секунды:\n\n"
        f"| этап | что это | время, с |\n|---|---|---|\n{table}\n\n"
        "Найдите:\n"
        "1. `T_seq` — длительность последовательного шага, с;\n"
        "2. `dominant` — ключ этапа, который доминирует (например `'decode'`);\n"
        f"3. `speedup_bound` — во сколько раз максимум ускорится шаг, если этап `{accelerate}` "
        f"({profile.STAGE_LABELS_RU[accelerate]}) станет бесплатным (безразмерное число);\n"
        "4. `setups` — клетку карты «размещение × синхронность» для каждой схемы ниже "
        f"(`task['setups']`): одна из строк {', '.join(f'`{c}`' for c in SETUP_CLASSES)} "
        f"({legend}; «на шаг позади» — частный случай асинхронного режима).\n\n"
        + "\n".join(f"- **{sid}.** {text}" for sid, text in setups.items())
        + '\n\nОтвет — словарь `{"T_seq": …, "dominant": …, "speedup_bound": …, '
        '"setups": {"A": …, "B": …, "C": …, "D": …}}`. Числа сравниваются с относительным '
        "допуском 1 %."
    )
    return {"statement": statement, "scenario": scenario, "stage_times": times,
            "accelerate": accelerate, "setups": setups, "setup_classes": list(SETUP_CLASSES)}  # fmt: skip


def _setup(text: str) -> tuple[str, str]:
    """(клетка, почему) для текста схемы."""
    return next((cls, why) for t, cls, why in SETUPS if t == text)


def solve(task: dict) -> dict:
    times = task["stage_times"]
    return {
        "T_seq": profile.sequential_time(times),
        "dominant": profile.dominant_stage(times),
        "speedup_bound": profile.speedup_bound(times, task["accelerate"]),
        "setups": {sid: _setup(text)[0] for sid, text in task["setups"].items()},
    }


def solution(task: dict, ref: dict) -> str:
    times, accel = task["stage_times"], task["accelerate"]
    total, dom = ref["T_seq"], ref["dominant"]
    rest = total - times[accel]
    terms = " + ".join(f"{t:.2f}" for t in times.values())
    rows = "\n".join(f"| **{sid}** | `{cls}` | {_setup(task['setups'][sid])[1]} |" for sid, cls in ref["setups"].items())  # fmt: skip
    answer = {**ref, "T_seq": round(total, 2), "speedup_bound": round(ref["speedup_bound"], 3)}
    return (
        "**1. T_seq.** Этапы идут строго по очереди, поэтому время шага — сумма, а не среднее:\n\n"
        f"$$T_{{seq}} = {terms} = {total:.2f}\\ \\text{{с}}.$$\n\n"
        f"**2. Узкое место** — самый долгий этап: `{dom}` ({profile.STAGE_LABELS_RU[dom]}), "
        f"{times[dom]:.2f} с, то есть {100 * times[dom] / total:.0f} % шага.\n\n"
        f"**3. Предел ускорения (Амдал).** Если `{accel}` ({times[accel]:.2f} с) станет "
        "бесплатным, останутся остальные этапы:\n\n"
        "$$S_{max} = \\frac{T_{seq}}{T_{seq} - T_{\\text{этапа}}} = "
        f"\\frac{{{total:.2f}}}{{{total:.2f} - {times[accel]:.2f}}} = "
        f"\\frac{{{total:.2f}}}{{{rest:.2f}}} \\approx {ref['speedup_bound']:.3f}.$$\n\n"
        f"Отношение T_seq / T_этапа = {total / times[accel]:.3f} — не предел ускорения, а "
        "величина, обратная доле этапа в шаге: ускоряется только эта доля, остальные "
        f"{rest:.2f} с остаются.\n\n"
        "**4. Карта.** Размещение — где работают роли (одни и те же GPU или разные); "
        "синхронность — ждёт ли тренер пакет текущей версии или данные приходят с разными "
        "версиями. Оси независимы: отдельный сервер сам по себе не делает алгоритм асинхронным. "
        "Режимов синхронности два; «на шаг позади» (генерация пакета k + 1 во время обучения "
        "на пакете k) — асинхронный режим с задержкой ровно 1.\n\n"
        f"| схема | клетка | почему |\n|---|---|---|\n{rows}\n\n**Ответ:** `{answer}`."
    )


class _Cell(Choice):
    """Клетка карты; «на шаг позади» как третий режим получает своё объяснение."""

    def problem(self, given: Any, task: dict) -> str | None:
        if isinstance(given, str) and any(w in norm(given) for w in ONE_STEP_WORDS):
            return ("«на шаг позади» (one-step-off) — не третья клетка, а асинхронный режим с "
                    "задержкой ровно в одну версию (шаг 12.1.3): запишите размещение и `async`, "
                    "например `disaggregated/async`.")  # fmt: skip
        return super().problem(given, task)


class _Lax(Number):
    """ПЕРЕНОС: как в старом модуле, форма числа не проверяется (не число — просто неверно)."""

    def problem(self, given: Any, task: dict) -> str | None:
        return None

    def same(self, expected: Any, given: Any) -> bool:
        try:
            return super().same(expected, given)
        except (TypeError, ValueError):
            return False


def _all_disaggregated_async(task: dict, given: dict) -> bool:
    """Все раздельные схемы названы асинхронными (совместные — как угодно)."""
    g = {norm(k): v for k, v in given.items()}
    setups = {norm(k): norm(v) for k, v in g["setups"].items()}
    disagg = [norm(s) for s, c in solve(task)["setups"].items() if c.startswith("disaggregated/")]
    return all(setups[s] == "disaggregated/async" for s in disagg)


def _server_async(task: dict, ref: dict) -> dict:
    wrong = {s: "disaggregated/async" if c.startswith("disaggregated/") else c for s, c in ref["setups"].items()}  # fmt: skip
    return {**ref, "setups": wrong}


STEP = Step(
    id="12.1.7", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({
        "T_seq": _Lax(rtol=1e-2, unit="с"),
        "dominant": Choice(lambda t: tuple(t["stage_times"])),
        "speedup_bound": _Lax(rtol=1e-2),
        "setups": Keyed(lambda t: tuple(t["setups"]), _Cell(SETUP_CLASSES), noun="схем"),
    }),
    hint=(
        "Этапы последовательного шага не перекрываются: T_seq — их сумма. Если этап стал "
        "бесплатным, шаг длится T_seq − T_этапа (закон Амдала). Для схем задайте два "
        "отдельных вопроса: на одних ли GPU работают генерация и обучение; ждёт ли тренер "
        "пакет, собранный текущими весами."
    ),
    traps=(
        Trap("amdahl_ratio",
             "Предел ускорения посчитан как T_seq / T_этапа. Это обратная доля этапа, а не "
             "ускорение: если этап станет бесплатным, шаг будет длиться T_seq − T_этапа, "
             "поэтому S_max = T_seq / (T_seq − T_этапа).",
             override={"speedup_bound": lambda t: profile.sequential_time(t["stage_times"]) / t["stage_times"][t["accelerate"]]}),
        Trap("separate_server_async",
             "Все схемы с раздельным размещением отнесены к асинхронным. Отдельный сервер "
             "генерации не делает алгоритм асинхронным (шаг 12.1.3): если тренер ждёт каждый "
             "пакет текущей версии и только потом рассылает веса, схема синхронная.",
             wrong=_server_async, matches=_all_disaggregated_async),
        Trap("mean_not_sum",
             "T_seq — среднее время этапа, а нужна сумма: в последовательном шаге этапы идут "
             "друг за другом, и их времена складываются.",
             override={"T_seq": lambda t: profile.sequential_time(t["stage_times"]) / len(t["stage_times"])}),
    ),
)  # fmt: skip
