"""12.3.6 — конвейер двух этапов (C_seq, C_pipe, T_n, ускорение) и лучшее разбиение K устройств."""

import random

from course_utils import pipeline
from course_utils.exercises.answers import Fields, Number, get, md_table, sig, tex_num
from course_utils.exercises.common import SECONDS, traps
from course_utils.exercises.step import Step

_SCENARIOS = (  # (запуск; диапазоны G и T, с; r_g и r_t, токенов/с на устройство)
    ("долгая генерация (длинные рассуждения)", (60, 150), (8, 30), (800, 2000), (4000, 9000)),
    ("долгое обучение (несколько эпох PPO)", (15, 40), (45, 110), (3000, 6000), (1200, 2800)),
    ("этапы почти равны", (40, 80), (30, 70), (1500, 3000), (2000, 5000)),
)


class _DeviceSplitFields(Fields):
    def problem(self, given, task):  # и k_gen + k_train = K, у каждого этапа ≥ 1 устройства
        bad = super().problem(given, task)
        k = None if bad else (get(given, "k_gen"), get(given, "k_train"))
        if k and (sum(k) != task["K"] or min(k) < 1):
            bad = f"Нужно k_gen + k_train = K = {task['K']}, у каждого этапа ≥ 1 устройства."
        return bad


_RATES = ("gen_tokens_per_s_per_device", "train_tokens_per_s_per_device")  # токенов/с на устройство
_TIMES = dict.fromkeys(("C_seq", "C_pipe", "T_n"), SECONDS)
_DEVICES = dict.fromkeys(("k_gen", "k_train"), Number(integer=True))
_ANSWER = _DeviceSplitFields({**_TIMES, "speedup": Number(rtol=1e-2, unit="раз"), **_DEVICES})


def _proportional(K: int, r_g: float, r_t: float) -> int:  # ошибка: больше устройств быстрому
    return min(max(round(K * r_g / (r_g + r_t)), 1), K - 1)


def _split_task(variant: int) -> dict:
    rng = random.Random(12_3_6_000 + 7919 * variant)
    scenario, g_range, t_range, rg_range, rt_range = _SCENARIOS[variant % 3]
    while True:  # «первый пакет бесплатно» должен заметно отличаться от верного T_n
        G, T, n = rng.randint(*g_range), rng.randint(*t_range), rng.choice([3, 4, 5, 6, 8])
        if G != T and min(G, T) / pipeline.pipeline_total_time(G, T, n) >= 0.03:
            break
    while True:  # лучшее разбиение единственно; «поровну» и «пропорционально» различимы и неверны
        K = rng.choice([8, 12, 16, 24, 32])
        r_g, r_t = (rng.randrange(lo, hi + 1, 50) for lo, hi in (rg_range, rt_range))
        rates = {k: min(k * r_g, (K - k) * r_t) for k in range(1, K)}
        wrong, top = {K // 2, _proportional(K, r_g, r_t)}, sorted(rates.values())
        if top[-2] < top[-1] * 0.995 and len(wrong) == 2 and max(rates, key=rates.get) not in wrong:
            break
    statement = (
        f"**Конвейер из двух этапов.** Запуск: {scenario}. n = {n} одинаковых пакетов проходят "
        f"сбор роллаутов (G = {G} с) и обучение (T = {T} с); этапы — на разных устройствах и могут "
        "идти одновременно. Найдите, с: `C_seq` — цикл пакета без перекрытия, `C_pipe` — период "
        "заполненного конвейера, `T_n` — время n пакетов в конвейере; и `speedup` — время n "
        f"пакетов без перекрытия / T_n.\n\n**Разбиение K = {K} устройств:** r_g = {r_g} и r_t = "
        f"{r_t} токенов/с на устройство генерации и обучения, скорость этапа линейна по их числу "
        "(≥ 1). `k_gen`, `k_train` — самое быстрое разбиение. Допуск 1 %, устройства — точно."
    )
    task = {"scenario": scenario, "G_s": G, "T_s": T, "n_batches": n, "K": K}
    return {**task, **dict(zip(_RATES, (r_g, r_t))), "statement": statement}


def _split_solve(task: dict) -> dict:
    G, T, n = task["G_s"], task["T_s"], task["n_batches"]
    k_gen, k_train, _ = pipeline.best_device_split(task["K"], *(task[k] for k in _RATES))
    seq, pipe = pipeline.sequential_cycle(G, T), pipeline.pipelined_period(G, T)
    total, speedup = pipeline.pipeline_total_time(G, T, n), pipeline.speedup(G, T, n)
    return dict(zip(_ANSWER.fields, (seq, pipe, total, speedup, k_gen, k_train)))


def _split_solution(task: dict, ref: dict) -> str:
    G, T, n, K, r_g, r_t = (task[k] for k in ("G_s", "T_s", "n_batches", "K", *_RATES))
    C, P, Tn, k = tex_num(ref["C_seq"]), tex_num(ref["C_pipe"]), tex_num(ref["T_n"]), ref["k_gen"]
    rows = [
        (kg, K - kg, sig(kg * r_g), sig((K - kg) * r_t), sig(min(kg * r_g, (K - kg) * r_t)))
        for kg in sorted({*range(max(1, k - 2), min(K - 1, k + 2) + 1), K // 2})
    ]
    rows = [[f"**{c}**" for c in r] if r[0] == k else r for r in rows]
    table = md_table(("k_gen", "k_train", "генерация", "обучение", "конвейер, токенов/с"), rows)
    return (
        f"$C_{{seq}} = G + T = {G} + {T} = {C}$ с (этапы по очереди), $C_{{pipe}} = \\max(G, T) = "
        f"{P}$ с (одновременно). Первый пакет проходит оба этапа, прочие — по одному за "
        f"период:\n\n$$T_n = C_{{seq}} + (n - 1)\\,C_{{pipe}} = {C} + {n - 1} \\cdot {P} = {Tn}\\ "
        f"\\text{{с}}, \\qquad S_n = \\frac{{n\\,C_{{seq}}}}{{T_n}} = \\frac{{{n} \\cdot "
        f"{C}}}{{{Tn}}} \\approx {ref['speedup']:.3f}.$$\n\nПредел при n → ∞ — "
        f"$C_{{seq}}/C_{{pipe}} \\approx {pipeline.speedup(G, T):.3f}$.\n\n**Разбиение.** Конвейер "
        "пропускает $\\min(k_{gen} r_g,\\ k_{train} r_t)$, равновесие при $k_{gen} \\approx K r_t "
        f"/ (r_g + r_t) = {K} \\cdot {r_t} / ({r_g} + {r_t}) \\approx "
        f"{K * r_t / (r_g + r_t):.2f}$; соседние целые и поровну, "
        f"токенов/с:\n\n{table}\n\n**Ответ:** `{ {**ref, 'speedup': round(ref['speedup'], 3)} }`."
    )


def _split_slips(task: dict, ref: dict) -> dict[str, dict]:
    n, K, C, P = task["n_batches"], task["K"], ref["C_seq"], ref["C_pipe"]
    k_prop = _proportional(K, *(task[k] for k in _RATES))
    return {
        "sum_not_max": ref | {"C_pipe": C, "T_n": n * C, "speedup": 1.0},
        "first_batch_free": ref | {"T_n": n * P, "speedup": C / P},
        "equal_split": ref | {"k_gen": K // 2, "k_train": K - K // 2},
        "faster_gets_more": ref | {"k_gen": k_prop, "k_train": K - k_prop},
    }


_TRAP_TEXT = {  # отзыв на типичную ошибку; ответ с ней — _split_slips
    "sum_not_max": "Период конвейера взят как G + T — это цикл без перекрытия; в конвейере этапы идут одновременно, и период задаёт медленный из них.",
    "first_batch_free": "Забыто заполнение конвейера: первый пакет проходит оба этапа подряд, а C_seq / C_pipe — лишь предел ускорения при n → ∞.",
    "equal_split": "Устройства поделены поровну, без учёта скоростей, а конвейер пропускает столько, сколько медленный этап.",
    "faster_gets_more": "Больше устройств получил более быстрый этап, а нужно медленному — пока k_gen·r_g и k_train·r_t не уравняются.",
}
_TRAP_BY = {"sum_not_max": ("C_pipe", "T_n"), "first_batch_free": ("T_n", "speedup")}
_HINT = "Без перекрытия этапы складываются, в заполненном конвейере период — максимум этапов; первый пакет проходит оба этапа. Для разбиения переберите k_gen = 1…K−1: конвейер пропускает min(k_gen·r_g, k_train·r_t)."
_TRAPS = traps(_split_slips, _TRAP_TEXT, _TRAP_BY, default=("k_gen",))
STEP = Step("12.3.6", _split_task, _split_solve, _ANSWER, _HINT, _split_solution, _TRAPS)
