"""12.3.7 — загрузка слотов U при медленных хвостах; тайм-аут: U, обрезанные роллауты, смещение."""

import random

from course_utils import pipeline
from course_utils.exercises.answers import Fields, IdSet, Share
from course_utils.exercises.step import Step, Trap

from .pipeline_split import SECONDS, TOLERANCE, either, s, shape, value

_SHARE = Share(rtol=1e-2)
ANSWER = Fields({"T_group": SECONDS, "U": _SHARE, "U_timeout": _SHARE,
                 "truncated": IdSet(lambda t: range(len(t["rollouts"])), "номеров роллаутов i"),
                 "hard_share_truncated": _SHARE, "easy_share_truncated": _SHARE})  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_3_7_000 + 7919 * variant)
    timeout = rng.choice([14, 15, 16, 18, 20])
    kinds = ["hard"] * rng.choice([2, 3])
    kinds += ["easy"] * (4 - len(kinds))
    rng.shuffle(kinds)
    rows = [{"i": 4 * t + j, "task": f"q{t + 1}", "difficulty": kind,
             "duration_s": round(rng.uniform(*((6.0, 13.0) if kind == "hard" else (2.5, 7.5))), 1)}
            for t, kind in enumerate(kinds) for j in range(4)]  # fmt: skip
    # тяжёлый хвост: длинные рассуждения и повторы вызовов инструмента у сложных задач,
    # иногда — тайм-аут среды у лёгкой (обрезанных сложных в доле всё равно больше)
    for r in rng.sample([r for r in rows if r["difficulty"] == "hard"], rng.randint(2, 4)):
        r["duration_s"] = round(rng.uniform(timeout + 3, 2.6 * timeout), 1)
    if len(easy := [r for r in rows if r["difficulty"] == "easy"]) == 8 and rng.random() < 0.5:
        rng.choice(easy)["duration_s"] = round(rng.uniform(timeout + 1, timeout + 8), 1)
    ru = {"easy": "лёгкая", "hard": "сложная"}
    table = "\n".join(f"| {r['i']} | {r['task']} | {ru[r['difficulty']]} | {r['duration_s']:.1f} |"
                      for r in rows)  # fmt: skip
    statement = (
        f"**Медленные хвосты и тайм-аут.** Синхронный шаг ждёт все {len(rows)} роллаутов: 4 задачи "
        "по 4 ответа, каждый роллаут на своём слоте генерации, все стартуют одновременно. Времена "
        "роллаутов и сложность задач (они же в `task_12_3_7['rollouts']`):\n\n"
        f"| i | задача | сложность | время, с |\n|---|---|---|---|\n{table}\n\n"
        "Загрузка слотов за шаг — доля занятого времени в прямоугольнике «слоты × длительность "
        "шага».\n\nНайдите:\n1. `T_group` — длительность шага без тайм-аута, с;\n"
        "2. `U` — загрузку слотов без тайм-аута (доля от 0 до 1);\n"
        f"3. `U_timeout` — загрузку, если ввести тайм-аут τ = {timeout} с: роллаут дольше τ "
        "обрывается в момент τ (слот был занят до τ), шаг заканчивается не позже τ;\n"
        "4. `truncated` — номера i обрезанных роллаутов (список, порядок не важен);\n"
        "5. `hard_share_truncated` и `easy_share_truncated` — долю обрезанных среди роллаутов "
        "сложных задач и среди роллаутов лёгких задач.\n\n"
        f"Ответ — словарь `{shape(ANSWER)}`; числа — {TOLERANCE}."
    )
    return {"statement": statement, "timeout_s": timeout, "rollouts": rows}


def _durations(task: dict) -> list[float]:
    return [r["duration_s"] for r in task["rollouts"]]


def solve(task: dict) -> dict:
    d = _durations(task)
    capped, mask = pipeline.truncate_durations(d, task["timeout_s"])
    cut = {k: [bool(m) for m, r in zip(mask, task["rollouts"]) if r["difficulty"] == k]
           for k in ("hard", "easy")}  # fmt: skip
    return {"T_group": max(d), "U": pipeline.group_utilization(d),  # шаг ждёт самого медленного
            "U_timeout": pipeline.group_utilization(capped),
            "truncated": [i for i, m in enumerate(mask) if m],
            **{f"{k}_share_truncated": sum(f) / len(f) for k, f in cut.items()}}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    d, tau = _durations(task), task["timeout_s"]
    n, total, total_c = len(d), sum(d), float(sum(pipeline.truncate_durations(d, tau)[0]))
    n_hard = sum(r["difficulty"] == "hard" for r in task["rollouts"])
    picked = [task["rollouts"][i] for i in ref["truncated"]]
    k_hard = sum(r["difficulty"] == "hard" for r in picked)
    listing = ", ".join(f"{r['i']} ({r['task']}, {r['duration_s']:.1f} с)" for r in picked)
    answer = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ref.items()}
    return (
        "**1–2. Без тайм-аута.** Слоты работают параллельно, шаг ждёт самого медленного: "
        f"$T_{{group}} = \\max_i T_i = {s(ref['T_group'], 1)}$ с (а не среднее "
        f"{total / n:.2f} с). Работа — $\\sum_i T_i = {s(total, 1)}$ слот·с, прямоугольник — "
        f"$n \\cdot \\max_i T_i = {n} \\cdot {s(ref['T_group'], 1)}$:\n\n"
        f"$$U = \\frac{{\\sum_i T_i}}{{n \\max_i T_i}} = \\frac{{{s(total, 1)}}}"
        f"{{{s(n * ref['T_group'], 1)}}} \\approx {ref['U']:.3f}.$$\n\n"
        f"**3. С тайм-аутом τ = {tau} с** каждый роллаут занимает слот $\\min(T_i, τ)$, шаг "
        f"длится τ:\n\n$$U_{{timeout}} = \\frac{{\\sum_i \\min(T_i, τ)}}{{n\\,τ}} = "
        f"\\frac{{{s(total_c, 1)}}}{{{n} \\cdot {tau}}} \\approx {ref['U_timeout']:.3f}.$$\n\n"
        f"Загрузка выросла с {ref['U']:.3f} до {ref['U_timeout']:.3f}, а шаг сократился с "
        f"{s(ref['T_group'], 1)} до {tau} с — но не бесплатно.\n\n"
        f"**4. Обрезаны** роллауты с $T_i > τ$: {listing}.\n\n"
        f"**5. Смещение.** Среди {n_hard} роллаутов сложных задач обрезано {k_hard}: доля "
        f"{ref['hard_share_truncated']:.3f}; среди {n - n_hard} роллаутов лёгких — "
        f"{len(picked) - k_hard}: доля {ref['easy_share_truncated']:.3f}. Тайм-аут бьёт прежде "
        "всего по сложным задачам, и данные смещаются к простым примерам. Поэтому правило "
        "тайм-аута и доля обрезанных (по группам сложности) входят в отчёт.\n\n"
        f"**Ответ:** `{answer}`."
    )


def _hard_among_cut(task: dict) -> float:
    """P(сложная | обрезан) — доля сложных среди обрезанных (перевёрнутое условие)."""
    cut = [r for r in task["rollouts"] if r["duration_s"] > task["timeout_s"]]
    return sum(r["difficulty"] == "hard" for r in cut) / len(cut)


def _old_max(task: dict) -> float:
    """U_timeout со знаменателем n · max T_i (прежний максимум) вместо n · τ."""
    d = _durations(task)
    return float(sum(pipeline.truncate_durations(d, task["timeout_s"])[0]) / (len(d) * max(d)))


STEP = Step(
    id="12.3.7", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint="Шаг длится столько, сколько самый медленный роллаут: U = Σ T_i / (n · max T_i). С "
    "тайм-аутом замените каждое время на min(T_i, τ) — и в сумме, и в максимуме. Доли обрезанных "
    "считайте внутри каждой группы сложности: обрезанные сложные / все сложные, обрезанные "
    "лёгкие / все лёгкие.",
    traps=(
        either("mean_not_max", "Вы взяли среднее время вместо максимума. Роллауты идут параллельно, "
               "и шаг ждёт самого медленного: T_group = max T_i, а U = Σ T_i / (n · max T_i). Со "
               "средним в знаменателе U всегда равна 1 и ничего не говорит о простое слотов.", ANSWER,
               {"T_group": lambda t: sum(_durations(t)) / len(t["rollouts"]), "U": lambda t: 1.0,
                "U_timeout": lambda t: 1.0}),
        Trap("truncation_free", "Тайм-аут поднял загрузку не бесплатно: он оборвал роллауты, "
             "которые длились дольше τ. Эти роллауты (и доли обрезанных по сложности) нужно "
             "назвать — без них рост U выглядит как чистый выигрыш, а данные тем временем "
             "смещаются.",
             override={"truncated": lambda t: [], "hard_share_truncated": lambda t: 0.0,
                       "easy_share_truncated": lambda t: 0.0},
             matches=lambda t, g: not value(g, "truncated")
             or max(value(g, "hard_share_truncated"), value(g, "easy_share_truncated")) <= 1e-9),
        either("conditional_reversed", "Вы посчитали, какую долю среди обрезанных составляют "
               "сложные задачи. Нужно обратное: какая доля роллаутов сложных задач обрезана (и "
               "отдельно — лёгких). Именно сравнение этих двух долей показывает смещение.", ANSWER,
               {"hard_share_truncated": _hard_among_cut,
                "easy_share_truncated": lambda t: 1 - _hard_among_cut(t)},
               by=("hard_share_truncated",)),
        Trap("old_max_denominator", "В U_timeout вы оставили прежний максимум в знаменателе. С "
             "тайм-аутом шаг заканчивается в момент τ, поэтому U_timeout = Σ min(T_i, τ) / (n · τ).",
             override={"U_timeout": _old_max}),
    ),
)  # fmt: skip
