"""12.3.6 — конвейер двух этапов (C_seq, C_pipe, T_n, ускорение) и лучшее разбиение K устройств.

Здесь же помощники шагов 12.3.6–12.3.9: допуск, вид словаря, число без лишних нулей, ``either``.
"""

import random
from typing import Any

from course_utils import pipeline
from course_utils.exercises.answers import Fields, Number, md_table, norm, sig
from course_utils.exercises.step import Step, Trap

TOLERANCE = "относительный допуск 1 % (rtol = 1e-2)"
SECONDS = Number(rtol=1e-2, unit="с")


def shape(schema: Fields) -> str:
    """Вид словаря ответа для условия: {"a": …, "b": …}."""
    return "{" + ", ".join(f'"{k}": …' for k in schema.fields) + "}"


def s(x: float, digits: int = 2) -> str:
    """Число для текста без лишних нулей: 12.0 → 12, 0.25 → 0.25."""
    return f"{round(float(x), digits):g}"


def value(given: Any, key: str) -> Any:
    """Значение ответа (уже верной формы) по ключу без учёта регистра."""
    return {norm(k): v for k, v in given.items()}[norm(key)]


def either(key: str, message: str, schema: Fields, override: dict, by: tuple = ()) -> Trap:
    """Trap, которую узнаёт любое одно из значений ``override`` (или только ключей ``by``)."""
    return Trap(key, message, override=override, matches=lambda t, g: any(
        schema.fields[k].same(override[k](t), value(g, k)) for k in by or override))  # fmt: skip


class _Split(Fields):
    """Словарь 12.3.6; ещё и k_gen + k_train = K, у каждого этапа ≥ 1 устройства."""

    def problem(self, given: Any, task: dict) -> str | None:
        bad = super().problem(given, task)
        k = None if bad else (value(given, "k_gen"), value(given, "k_train"))
        if k and (sum(k) != task["K"] or min(k) < 1):
            bad = f"Нужно k_gen + k_train = K = {task['K']}, у каждого этапа ≥ 1 устройства."
        return bad


ANSWER = _Split({"C_seq": SECONDS, "C_pipe": SECONDS, "T_n": SECONDS,
                 "speedup": Number(rtol=1e-2, unit="раз"), "k_gen": Number(integer=True),
                 "k_train": Number(integer=True)})  # fmt: skip
_SCENARIOS = (  # (описание, диапазоны G и T, с, r_g и r_t, токенов/с на устройство)
    ("длинные рассуждения: генерация много дольше обучения", (60, 150), (8, 30), (800, 2000),
     (4000, 9000)),
    ("короткие ответы и несколько эпох PPO на пакет: обучение дольше генерации", (15, 40),
     (45, 110), (3000, 6000), (1200, 2800)),
    ("этапы почти сбалансированы", (40, 80), (30, 70), (1500, 3000), (2000, 5000)),
)  # fmt: skip


def _speeds(task: dict) -> tuple[float, float]:
    return task["gen_tokens_per_s_per_device"], task["train_tokens_per_s_per_device"]


def _split_rates(K: int, r_g: float, r_t: float) -> dict[int, float]:
    """Скорость конвейера min(k·r_g, (K − k)·r_t), токенов/с, при k_gen = k = 1…K−1."""
    return {k: min(k * r_g, (K - k) * r_t) for k in range(1, K)}


def _proportional(K: int, r_g: float, r_t: float) -> int:
    """Ошибочное k_gen «пропорционально скорости»: больше устройств более быстрому этапу."""
    return min(max(round(K * r_g / (r_g + r_t)), 1), K - 1)


def make_task(variant: int) -> dict:
    rng = random.Random(12_3_6_000 + 7919 * variant)
    scenario, g_range, t_range, rg_range, rt_range = _SCENARIOS[variant % 3]
    while True:  # «первый пакет бесплатно» должен заметно отличаться от верного T_n
        G, T, n = rng.randint(*g_range), rng.randint(*t_range), rng.choice([3, 4, 5, 6, 8])
        if G != T and min(G, T) / pipeline.pipeline_total_time(G, T, n) >= 0.03:
            break
    while True:  # лучшее разбиение единственно; «поровну» и «пропорционально» различимы и неверны
        K = rng.choice([8, 12, 16, 24, 32])
        r_g, r_t = (rng.randrange(lo, hi + 1, 50) for lo, hi in (rg_range, rt_range))
        rates, wrong = _split_rates(K, r_g, r_t), {K // 2, _proportional(K, r_g, r_t)}
        top = sorted(rates.values())
        if top[-2] < top[-1] * 0.995 and len(wrong) == 2 and max(rates, key=rates.get) not in wrong:
            break
    statement = (
        f"**Конвейер из двух этапов.** Запуск: {scenario}. Пакет проходит сбор роллаутов с "
        f"наградой (G = {G} с) и обучение с синхронизацией весов (T = {T} с); этапы стоят на "
        "разных устройствах и могут работать одновременно (идеальный двухступенчатый "
        f"конвейер, пакеты одинаковы). Пакетов n = {n}. Найдите:\n1. `C_seq` — цикл одного "
        "пакета в последовательном режиме, с;\n2. `C_pipe` — период выпуска пакетов "
        "заполненным конвейером, с;\n3. `T_n` — время n пакетов в конвейере (от начала сбора "
        "первого до конца обучения последнего), с;\n4. `speedup` — время n пакетов в "
        "последовательном режиме, делённое на T_n.\n\n**Разбиение устройств.** Другой кластер "
        f"из K = {K} одинаковых ускорителей делят между генерацией и обучением. На одном "
        f"устройстве генерация даёт r_g = {r_g} токенов/с, обучение — r_t = {r_t} токенов/с; "
        "скорость этапа растёт линейно с числом его устройств, каждому этапу нужно хотя бы "
        "одно.\n\n5–6. `k_gen` и `k_train` (k_gen + k_train = K) — разбиение, при котором "
        "конвейер пропускает больше всего токенов в секунду.\n\nОтвет — словарь "
        f"`{shape(ANSWER)}`; секунды и разы — {TOLERANCE}, устройства — точно."
    )
    return {"statement": statement, "scenario": scenario, "G_s": G, "T_s": T, "n_batches": n, "K": K,
            "gen_tokens_per_s_per_device": r_g, "train_tokens_per_s_per_device": r_t}  # fmt: skip


def solve(task: dict) -> dict:
    G, T, n = task["G_s"], task["T_s"], task["n_batches"]
    k_gen, k_train, _ = pipeline.best_device_split(task["K"], *_speeds(task))
    return {"C_seq": pipeline.sequential_cycle(G, T), "C_pipe": pipeline.pipelined_period(G, T),
            "T_n": pipeline.pipeline_total_time(G, T, n), "speedup": pipeline.speedup(G, T, n),
            "k_gen": k_gen, "k_train": k_train}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    (G, T, n, K), (r_g, r_t) = (task[k] for k in ("G_s", "T_s", "n_batches", "K")), _speeds(task)
    C, P, k, rates = s(ref["C_seq"]), s(ref["C_pipe"]), ref["k_gen"], _split_rates(K, r_g, r_t)
    head = ("k_gen", "k_train", *(f"{x}, токенов/с" for x in ("генерация", "обучение", "конвейер")))
    table = md_table(head,
                     [(kg, K - kg, sig(int(kg * r_g)), sig(int((K - kg) * r_t)),
                       f"**{sig(int(rates[kg]))}**" if kg == k else sig(int(rates[kg])))
                      for kg in sorted({*range(max(1, k - 2), min(K - 1, k + 2) + 1), K // 2})])  # fmt: skip
    return (
        "**1–2.** Последовательно этапы идут друг за другом, в заполненном конвейере — "
        f"одновременно, и период задаёт медленный этап:\n\n$$C_{{seq}} = G + T = {G} + {T} = "
        f"{C}\\ \\text{{с}}, \\qquad C_{{pipe}} = \\max(G, T) = \\max({G}, {T}) = {P}\\ "
        "\\text{с}.$$\n\n**3.** Первый пакет проходит оба этапа подряд (заполнение конвейера), "
        f"следующие выходят через период:\n\n$$T_n = G + T + (n - 1)\\max(G, T) = {C} + {n - 1} "
        f"\\cdot {P} = {s(ref['T_n'])}\\ \\text{{с}}.$$\n\n**4.** Ускорение на n пакетах: $S_n = "
        f"\\frac{{n\\,C_{{seq}}}}{{T_n}} = \\frac{{{n} \\cdot {C}}}{{{s(ref['T_n'])}}} \\approx "
        f"{ref['speedup']:.3f}$.\n\nПредел при n → ∞ — $C_{{seq}}/C_{{pipe}} \\approx "
        f"{pipeline.speedup(G, T):.3f}$: меньше 2, пока этапы не равны; узкое место — "
        f"{'генерация' if G > T else 'обучение'}, быстрый этап часть времени ждёт.\n\n**5–6.** "
        "Конвейер пропускает столько, сколько медленный этап: $\\min(k_{gen} r_g,\\ "
        "k_{train} r_t)$; лучше всего, когда этапы уравновешены: $k_{gen} \\approx K r_t / "
        f"(r_g + r_t) = {K} \\cdot {r_t} / ({r_g} + {r_t}) \\approx {K * r_t / (r_g + r_t):.2f}$. "
        f"Целые соседи и деление поровну:\n\n{table}\n\nЛучше всего k_gen = {k}, k_train = "
        f"{K - k}: {sig(int(rates[k]))} токенов/с против {sig(int(rates[K // 2]))} поровну. "
        "Линейный рост — приближение: сеть, проверяющая система или память могут стать новым "
        f"узким местом.\n\n**Ответ:** `{ {**ref, 'speedup': round(ref['speedup'], 3)} }`."
    )


def _split(k_gen: Any) -> dict:
    return {"k_gen": k_gen, "k_train": lambda t: t["K"] - k_gen(t)}


STEP = Step(
    id="12.3.6", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint="Последовательно этапы складываются, в заполненном конвейере период — максимум этапов; "
    "первый пакет проходит оба этапа подряд, остальные n − 1 выходят через период. Для разбиения "
    "переберите k_gen = 1…K−1: скорость конвейера — min(k_gen·r_g, k_train·r_t).",
    traps=(
        either("sum_not_max", "В заполненном конвейере этапы идут одновременно: период C_pipe = "
               "max(G, T), а не G + T (это цикл последовательного режима, без выигрыша).", ANSWER,
               {"C_pipe": lambda t: t["G_s"] + t["T_s"], "speedup": lambda t: 1.0,
                "T_n": lambda t: t["n_batches"] * (t["G_s"] + t["T_s"])}, by=("C_pipe", "T_n")),
        either("first_batch_free", "Забыто заполнение конвейера: первый пакет проходит оба этапа "
               "подряд, T_n = G + T + (n − 1)·max(G, T), а не n·max(G, T); C_seq / C_pipe — лишь "
               "предел ускорения при n → ∞.", ANSWER,
               {"T_n": lambda t: t["n_batches"] * pipeline.pipelined_period(t["G_s"], t["T_s"]),
                "speedup": lambda t: pipeline.speedup(t["G_s"], t["T_s"])}),
        Trap("equal_split", "Устройства поделены поровну, без учёта скоростей. Конвейер пропускает "
             "min(k_gen·r_g, k_train·r_t): устройства нужны этапу-ограничителю, пока этапы не "
             "уравновесятся.", override=_split(lambda t: t["K"] // 2)),
        Trap("faster_gets_more", "Больше устройств получил более быстрый этап (пропорционально "
             "скорости). Нужно наоборот — медленному, чтобы k_gen·r_g ≈ k_train·r_t, то есть "
             "k_gen ≈ K·r_t / (r_g + r_t).",
             override=_split(lambda t: _proportional(t["K"], *_speeds(t)))),
    ),
)  # fmt: skip
