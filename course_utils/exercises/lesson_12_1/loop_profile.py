"""12.1.7 — профиль цикла (T_seq, узкое место, предел Амдала), карта «размещение × синхронность»."""

import random

from course_utils import profile, stack_map
from course_utils.exercises.answers import Choice, Fields, Keyed, Number, get, md_table, norm
from course_utils.exercises.common import SECONDS, traps
from course_utils.exercises.step import Step

SETUP_CLASSES = tuple(f"{p}/{s}" for p in stack_map.PLACEMENTS for s in stack_map.SYNCHRONY)
_CELL_WORDS = {c: ", ".join(stack_map.VALUE_LABELS[x] for x in c.split("/")) for c in SETUP_CLASSES}
_CS, _CA, _DS, _DA = SETUP_CLASSES
_KEYS = ("T_seq", "dominant", "speedup_bound", "setups")
SETUPS: dict[str, str] = {  # схема → клетка; однозначно в терминах шага 12.1.3
    "Один GPU: генерация пакета, обучение на нём, и только после шага — следующая генерация.": _CS,
    "Движок и тренер делят 8 GPU (оптимизатор при генерации — в CPU); пакет — текущих весов.": _CS,
    "Те же 4 GPU по очереди генерируют и учат, но пакет берётся из буфера прошлых версий.": _CA,
    "Отдельный vLLM-сервер; тренер ждёт весь пакет, делает шаг и только потом шлёт веса.": _DS,
    "Пулы 16 GPU генерации и 16 GPU обучения на разных узлах работают строго по очереди.": _DS,
    "Сборщики на своих машинах ждут на барьере, пока тренер не сделает шаг и не пришлёт веса.": _DS,
    "Пулы генерации и обучения связаны очередью, данные отстают не более чем на 2 версии.": _DA,
    "Движки SGLang на отдельных узлах генерируют без пауз, веса берут раз в несколько шагов.": _DA,
    "Генератор на своих GPU собирает пакет k + 1, пока тренер на других учится на пакете k.": _DA,
}
_SCENARIOS = (  # (множители медиан synthetic_profile, запуск); вариант v — сценарий v mod 4
    ({}, "длинные рассуждения, малые группы"),
    ({"reward": 25.0}, "верификатор запускает тесты в песочнице"),
    ({"decode": 0.25, "forward_backward": 2.0}, "короткие ответы, несколько эпох PPO на пакет"),
    ({"decode": 0.3, "weight_sync": 12.0}, "веса передаются по медленной сети"),
)


def _loop_task(variant: int) -> dict:
    rng = random.Random(12_1_7_000 + 7919 * variant)
    scale, scenario = _SCENARIOS[variant % len(_SCENARIOS)]
    frame = profile.synthetic_profile(steps=8, seed=(12_170 + 7919 * variant) % 2**32, scale=scale)
    times = {stage: round(float(t), 2) for stage, t in profile.stage_medians(frame).items()}
    total = profile.sequential_time(times)
    candidates = [s for s, t in times.items() if t >= 0.1 * total and abs(1 - 2 * t / total) > 0.05]
    accel = rng.choice(candidates or [profile.dominant_stage(times)])  # T_seq/T ≠ S_max
    pool = {c: [text for text, cell in SETUPS.items() if cell == c] for c in SETUP_CLASSES}
    chosen = [rng.choice(pool[_DS]), rng.choice(pool[_DA]), rng.choice(pool[_CS] + pool[_CA])]
    chosen.append(rng.choice([s for s in SETUPS if s not in chosen]))  # совместная: ловушка
    rng.shuffle(chosen)  # separate_server_async держится: есть и disaggregated/sync, и /async
    setups = dict(zip("ABCD", chosen))
    rows = [(f"`{s}`", profile.STAGE_LABELS_RU.get(s, s), f"{t:.2f}") for s, t in times.items()]
    cells = ", ".join(f"`{c}` ({w})" for c, w in _CELL_WORDS.items())
    statement = (
        f"**Профиль цикла и две оси.** Запуск: {scenario}. Медианы этапов последовательного шага "
        f"(`task_12_1_7['stage_times']`):\n\n{md_table(('этап', 'что это', 'время, с'), rows)}\n\n"
        "Найдите `T_seq` — длительность шага, с; `dominant` — самый долгий этап; `speedup_bound` — "
        f"предел ускорения, если `{accel}` станет бесплатным; `setups` — клетки схем ниже "
        f"(`task_12_1_7['setups']`): {cells}; «на шаг позади» — async. Допуск чисел 1 %.\n\n"
        + "\n".join(f"- **{k}.** {v}" for k, v in setups.items())
    )
    task = {"scenario": scenario, "stage_times": times, "accelerate": accel, "setups": setups}
    return {"statement": statement, **task, "setup_classes": list(SETUP_CLASSES)}


def _loop_solve(task: dict) -> dict:
    """T_seq = Σ T_этапа, с; самый долгий этап; S_max = T_seq / (T_seq − T_этапа); клетки схем."""
    t, cells = task["stage_times"], {s: SETUPS[text] for s, text in task["setups"].items()}
    bound = profile.speedup_bound(t, task["accelerate"])
    return dict(zip(_KEYS, (profile.sequential_time(t), profile.dominant_stage(t), bound, cells)))


def _loop_solution(task: dict, ref: dict) -> str:
    times, accel, (total, dom, bound, cells) = task["stage_times"], task["accelerate"], ref.values()
    rest, terms = total - times[accel], " + ".join(f"{t:.2f}" for t in times.values())
    rows = [(f"**{s}**", f"`{c}`", _CELL_WORDS[c]) for s, c in cells.items()]
    answer = {**ref, "T_seq": round(total, 2), "speedup_bound": round(bound, 3)}
    return (
        f"**1.** Этапы идут по очереди: $T_{{seq}} = {terms} = {total:.2f}$ с.\n\n**2.** Дольше "
        f"всех `{dom}`: {times[dom]:.2f} с, {100 * times[dom] / total:.0f} % шага.\n\n**3. Амдал.**"
        f" Без `{accel}` ({times[accel]:.2f} с) шаг длится {rest:.2f} с: $S_{{max}} = T_{{seq}} / "
        f"(T_{{seq}} - T_{{\\text{{этапа}}}}) = {total:.2f} / {rest:.2f} \\approx {bound:.3f}$."
        "\n\n**4.** Размещение: на одних ли GPU роли; синхронность: ждёт ли тренер пакет текущих "
        f"весов.\n\n{md_table(('схема', 'клетка', 'то есть'), rows)}\n\n**Ответ:** `{answer}`."
    )


class _Cell(Choice):  # клетка карты; на «шаг позади» как третий режим — своё объяснение
    def problem(self, given: object, task: dict) -> str | None:
        if isinstance(given, str) and ("one" in norm(given) or "шаг позади" in norm(given)):
            return "«на шаг позади» — не третья клетка, а async с задержкой 1 (шаг 12.1.3)."
        return super().problem(given, task)


def _all_split_async(task: dict, given: dict) -> bool:  # раздельные — async, совместные — любые
    split = {norm(s) for s, c in _loop_solve(task)["setups"].items() if c in (_DS, _DA)}
    return split <= {norm(s) for s, c in get(given, "setups").items() if norm(c) == _DA}


def _loop_slips(task: dict, ref: dict) -> dict[str, dict]:
    t, total = task["stage_times"], ref["T_seq"]
    return {
        "amdahl_ratio": ref | {"speedup_bound": total / t[task["accelerate"]]},  # T_seq / T_этапа
        "separate_server_async": ref | {"setups": dict.fromkeys(ref["setups"], _DA)},
        "mean_not_sum": ref | {"T_seq": total / len(t)},
    }


_STAGE = Choice(lambda t: t["stage_times"])
_SCHEMES = Keyed(lambda t: t["setups"], _Cell(SETUP_CLASSES), noun="схем")
_MESSAGES = {
    "amdahl_ratio": "T_seq / T_этапа — обратная доля этапа; без этапа шаг длится T_seq − T_этапа.",
    "separate_server_async": "Отдельный сервер не делает цикл асинхронным: тренер, ждущий пакет текущей версии, — sync (шаг 12.1.3).",
    "mean_not_sum": "T_seq — не среднее, а сумма: этапы последовательного шага идут друг за другом.",
}
_BY = {"amdahl_ratio": ("speedup_bound",), "separate_server_async": _all_split_async}
_ANSWER = Fields(dict(zip(_KEYS, (SECONDS, _STAGE, Number(0.01), _SCHEMES))))
_HINT = "T_seq — сумма этапов; без этапа шаг длится T_seq − T_этапа (Амдал). Для схемы: на одних ли GPU роли и ждёт ли тренер пакет текущих весов."
_TRAPS = traps(_loop_slips, _MESSAGES, _BY, default=("T_seq",))
STEP = Step("12.1.7", _loop_task, _loop_solve, _ANSWER, _HINT, _loop_solution, _TRAPS)
