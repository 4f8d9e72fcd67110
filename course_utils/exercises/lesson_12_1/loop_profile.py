"""12.1.7 — профиль цикла (T_seq, узкое место, предел Амдала), карта «размещение × синхронность»."""

import random

from course_utils import profile, stack_map
from course_utils.exercises.answers import Choice, Fields, Keyed, Number, md_table, norm
from course_utils.exercises.step import Step, Trap

SETUP_CLASSES = tuple(f"{p}/{s}" for p in stack_map.PLACEMENTS for s in stack_map.SYNCHRONY)
CELL_WORDS = {c: ", ".join(stack_map.VALUE_LABELS[x] for x in c.split("/")) for c in SETUP_CLASSES}
SETUPS: dict[str, str] = {  # схема → клетка; однозначно в терминах шага 12.1.3
    "Один GPU: модель генерирует пакет ответов, затем на нём же обучается; следующая генерация "
     "начинается только после шага оптимизатора.": "colocated/sync",
    "Движок генерации и тренер делят одни и те же 8 GPU: на время генерации состояние оптимизатора "
     "выгружается в память CPU, потом движок освобождает KV-кэш и идёт обновление; каждый пакет "
     "порождён текущей версией весов.": "colocated/sync",
    "Одни и те же 4 GPU попеременно генерируют и обучают, но тренер не ждёт свежих "
     "ответов: он берёт пакет из буфера, где лежат ответы двух-трёх предыдущих версий "
     "политики.": "colocated/async",
    "Генератор — отдельный vLLM-сервер на своих GPU. Тренер отправляет запросы, ждёт весь "
     "пакет, делает шаг и только потом рассылает новые веса; всё это время сервер "
     "простаивает.": "disaggregated/sync",
    "Два пула на разных узлах: 16 GPU генерации и 16 GPU обучения. Пулы работают строго по "
     "очереди, каждый пакет порождён текущей версией весов.": "disaggregated/sync",
    "Сборщики на отдельных машинах готовят пакет и блокируются на барьере, пока тренер не закончит "
     "шаг оптимизатора и они не получат новые веса.": "disaggregated/sync",
    "Отдельные пулы генерации и обучения связаны очередью; сборщики не останавливаются во время "
     "обновления, данные отстают от тренера не более чем на 2 версии.": "disaggregated/async",
    "Движки SGLang на отдельных узлах генерируют непрерывно и подтягивают веса раз в "
     "несколько шагов; тренер забирает из буфера всё, что пришло, с версией каждого "
     "роллаута.": "disaggregated/async",
    "Генератор на своих GPU собирает пакет k + 1, пока тренер на других GPU обучается на пакете k "
     "(отставание данных — одна версия).": "disaggregated/async",
}  # fmt: skip
SCENARIOS = (  # (множители медиан synthetic_profile, запуск); вариант v — сценарий v mod 4
    ({}, "длинные рассуждения, малые группы"),
    ({"reward": 25.0}, "верификатор запускает тесты в песочнице"),
    ({"decode": 0.25, "forward_backward": 2.0}, "короткие ответы, несколько эпох PPO на пакет"),
    ({"decode": 0.3, "weight_sync": 12.0}, "веса передаются по медленной сети"),
)


def make_task(variant: int) -> dict:
    rng = random.Random(12_1_7_000 + 7919 * variant)
    scale, scenario = SCENARIOS[variant % len(SCENARIOS)]
    frame = profile.synthetic_profile(steps=8, seed=(12_170 + 7919 * variant) % 2**32, scale=scale)
    times = {stage: round(float(t), 2) for stage, t in profile.stage_medians(frame).items()}
    total = profile.sequential_time(times)
    # T_seq/T и T_seq/(T_seq − T) совпадают при T = T_seq/2: такой этап не годится
    candidates = [s for s, t in times.items() if t >= 0.1 * total and abs(1 - 2 * t / total) > 0.05]
    accelerate = rng.choice(candidates or [profile.dominant_stage(times)])
    pool = {c: [text for text, cell in SETUPS.items() if cell == c] for c in SETUP_CLASSES}
    chosen = [rng.choice(pool["disaggregated/sync"]), rng.choice(pool["disaggregated/async"])]
    chosen.append(rng.choice(pool["colocated/sync"] + pool["colocated/async"]))
    chosen.append(rng.choice([s for s in SETUPS if s not in chosen]))  # совместная: ловушка
    rng.shuffle(chosen)  # separate_server_async держится: есть и disaggregated/sync, и /async
    setups = dict(zip("ABCD", chosen))
    rows = [(f"`{s}`", profile.STAGE_LABELS_RU.get(s, s), f"{t:.2f}") for s, t in times.items()]
    statement = (
        f"**Профиль цикла и две оси.** Запуск: {scenario}. Медианы этапов шага последовательного "
        "цикла после прогрева, секунды (они же в `task_12_1_7['stage_times']`):\n\n"
        f"{md_table(('этап', 'что это', 'время, с'), rows)}\n\nНайдите:\n"
        "1. `T_seq` — длительность последовательного шага, с;\n"
        "2. `dominant` — ключ самого долгого этапа (например `'decode'`);\n"
        "3. `speedup_bound` — во сколько раз самое большее ускорится шаг, если этап "
        f"`{accelerate}` ({profile.STAGE_LABELS_RU[accelerate]}) станет бесплатным;\n"
        "4. `setups` — словарь «схема → клетка карты» для схем `task_12_1_7['setups']`; клетки: "
        f"{', '.join(f'`{c}` ({w})' for c, w in CELL_WORDS.items())}; «на шаг позади» — частный "
        "случай асинхронного режима.\n\n" + "\n".join(f"- **{k}.** {v}" for k, v in setups.items())
        + "\n\nЧисла сравниваются с относительным допуском 1 %."
    )  # fmt: skip
    return {"statement": statement, "scenario": scenario, "stage_times": times,
            "accelerate": accelerate, "setups": setups,
            "setup_classes": list(SETUP_CLASSES)}  # fmt: skip


def solve(task: dict) -> dict:
    """T_seq = Σ T_этапа, с; самый долгий этап; S_max = T_seq / (T_seq − T_этапа); клетки схем."""
    times = task["stage_times"]
    return {"T_seq": profile.sequential_time(times), "dominant": profile.dominant_stage(times),
            "speedup_bound": profile.speedup_bound(times, task["accelerate"]),
            "setups": {sid: SETUPS[text] for sid, text in task["setups"].items()}}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    times, accel = task["stage_times"], task["accelerate"]
    total, dom = ref["T_seq"], ref["dominant"]
    rest, terms = total - times[accel], " + ".join(f"{t:.2f}" for t in times.values())
    rows = [(f"**{s}**", f"`{c}`", CELL_WORDS[c]) for s, c in ref["setups"].items()]
    answer = {**ref, "T_seq": round(total, 2), "speedup_bound": round(ref["speedup_bound"], 3)}
    return (
        f"**1.** Этапы идут по очереди: $T_{{seq}} = {terms} = {total:.2f}$ с — сумма, а не "
        f"среднее.\n\n**2.** Узкое место — самый долгий этап `{dom}` "
        f"({profile.STAGE_LABELS_RU[dom]}): {times[dom]:.2f} с, {100 * times[dom] / total:.0f} % "
        f"шага.\n\n**3. Амдал.** Если `{accel}` ({times[accel]:.2f} с) станет бесплатным, "
        f"останется {rest:.2f} с: $S_{{max}} = T_{{seq}} / (T_{{seq}} - T_{{\\text{{этапа}}}}) = "
        f"{total:.2f} / {rest:.2f} \\approx {ref['speedup_bound']:.3f}$; а T_seq / T_этапа = "
        f"{total / times[accel]:.3f} — обратная доля этапа, не предел.\n\n**4. Карта.** Оси "
        "независимы: размещение — на одних ли GPU роли, синхронность — ждёт ли тренер пакет "
        "текущей версии; отдельный сервер не делает алгоритм асинхронным.\n\n"
        f"{md_table(('схема', 'клетка', 'то есть'), rows)}\n\n**Ответ:** `{answer}`."
    )  # fmt: skip


class _Cell(Choice):  # клетка карты; на «шаг позади» как третий режим — своё объяснение
    def problem(self, given: object, task: dict) -> str | None:
        if isinstance(given, str) and ("one" in norm(given) or "шаг позади" in norm(given)):
            return ("«на шаг позади» (one-step-off) — не третья клетка, а асинхронный режим с "
                    "задержкой 1 (шаг 12.1.3): например, `disaggregated/async`.")  # fmt: skip
        return super().problem(given, task)


STEP = Step(
    id="12.1.7", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({"T_seq": Number(0.01, unit="с"),  # допуск 1 %, как в условии
                   "dominant": Choice(lambda t: t["stage_times"]), "speedup_bound": Number(0.01),
                   "setups": Keyed(lambda t: t["setups"], _Cell(SETUP_CLASSES), noun="схем")}),
    hint="Этапы шага идут по очереди: T_seq — сумма; без этапа шаг длится T_seq − T_этапа (Амдал). "
         "Для схем два вопроса: на одних ли GPU роли; ждёт ли тренер пакет текущих весов.",
    traps=(
        Trap("amdahl_ratio",
             "Предел ускорения посчитан как T_seq / T_этапа — это обратная доля этапа. Без этапа "
             "шаг длится T_seq − T_этапа, поэтому S_max = T_seq / (T_seq − T_этапа).",
             override={"speedup_bound": lambda t: profile.sequential_time(t["stage_times"])
                                                  / t["stage_times"][t["accelerate"]]}),
        Trap("separate_server_async",
             "Все раздельные схемы отнесены к асинхронным. Отдельный сервер не делает алгоритм "
             "асинхронным (шаг 12.1.3): если тренер ждёт каждый пакет текущей версии — sync.",
             wrong=lambda t, ref: {**ref, "setups": {s: "disaggregated/async" if "disagg" in c
                                                      else c for s, c in ref["setups"].items()}},
             matches=lambda t, g: {norm(s) for s, c in solve(t)["setups"].items() if "disagg" in c}
             <= {norm(s) for s, c in next(v for k, v in g.items() if norm(k) == "setups").items()
                 if norm(c) == "disaggregated/async"}),  # раздельные — async, совместные — любые
        Trap("mean_not_sum",
             "T_seq — среднее время этапа, а нужна сумма: этапы последовательного шага идут друг "
             "за другом, их времена складываются.",
             override={"T_seq": lambda t: profile.sequential_time(s := t["stage_times"]) / len(s)}),
    ),
)  # fmt: skip
