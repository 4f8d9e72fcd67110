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
        f"**Медленные хвосты и тайм-аут.** Синхронный шаг ждёт все {len(rows)} роллаутов (4 "
        "задачи по 4 ответа), каждый на своём слоте генерации; все стартуют одновременно. "
        "Времена и сложность задач (они же в `task_12_3_7['rollouts']`):\n\n| i | задача | "
        f"сложность | время, с |\n|---|---|---|---|\n{table}\n\nЗагрузка слотов за шаг — доля "
        "занятого времени в прямоугольнике «слоты × длительность шага». Найдите:\n1. `T_group` — "
        "длительность шага без тайм-аута, с;\n2. `U` — загрузку слотов без тайм-аута (доля от 0 "
        f"до 1);\n3. `U_timeout` — загрузку с тайм-аутом τ = {timeout} с: роллаут дольше τ "
        "обрывается в момент τ (слот занят до τ), шаг заканчивается не позже τ;\n4. `truncated` "
        "— номера i обрезанных роллаутов (порядок не важен);\n5. `hard_share_truncated` и "
        "`easy_share_truncated` — доли обрезанных среди роллаутов сложных и среди роллаутов "
        f"лёгких задач.\n\nОтвет — словарь `{shape(ANSWER)}`; числа — {TOLERANCE}."
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
    answer = {k: round(v, 3) if isinstance(v, float) else v for k, v in ref.items()}
    T = s(ref["T_group"], 1)
    return (
        f"**1–2.** Слоты работают параллельно, шаг ждёт самого медленного: $T_{{group}} = \\max_i T_i "
        f"= {T}$ с (а не среднее {total / n:.2f} с). Работа $\\sum_i T_i = {s(total, 1)}$ слот·с, "
        f"прямоугольник $n \\max_i T_i = {n} \\cdot {T}$:\n\n$$U = \\frac{{\\sum_i T_i}}{{n "
        f"\\max_i T_i}} = \\frac{{{s(total, 1)}}}{{{s(n * ref['T_group'], 1)}}} \\approx "
        f"{ref['U']:.3f}.$$\n\n**3.** С тайм-аутом τ = {tau} с роллаут занимает слот "
        f"$\\min(T_i, τ)$, шаг длится τ:\n\n$$U_{{timeout}} = \\frac{{\\sum_i \\min(T_i, τ)}}"
        f"{{n\\,τ}} = \\frac{{{s(total_c, 1)}}}{{{n} \\cdot {tau}}} \\approx "
        f"{ref['U_timeout']:.3f}.$$\n\nЗагрузка выросла с {ref['U']:.3f} до {ref['U_timeout']:.3f}, "
        f"шаг сократился с {T} до {tau} с — но не бесплатно.\n\n**4.** Обрезаны роллауты с "
        f"$T_i > τ$: {listing}.\n\n**5. Смещение.** Среди {n_hard} роллаутов сложных задач обрезано "
        f"{k_hard} (доля {ref['hard_share_truncated']:.3f}), среди {n - n_hard} лёгких — "
        f"{len(picked) - k_hard} (доля {ref['easy_share_truncated']:.3f}): тайм-аут бьёт прежде всего "
        "по сложным задачам, данные смещаются к простым. Поэтому правило тайм-аута и доли "
        f"обрезанных по сложности входят в отчёт.\n\n**Ответ:** `{answer}`."
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
    "тайм-аутом замените каждое время на min(T_i, τ) — и в сумме, и в максимуме. Доли "
    "обрезанных считайте внутри каждой группы сложности.",
    traps=(
        either("mean_not_max", "Вы взяли среднее время вместо максимума. Роллауты идут параллельно, "
               "шаг ждёт самого медленного: T_group = max T_i, U = Σ T_i / (n · max T_i); со средним "
               "U всегда равна 1 и ничего не говорит о простое.", ANSWER,
               {"T_group": lambda t: sum(_durations(t)) / len(t["rollouts"]), "U": lambda t: 1.0,
                "U_timeout": lambda t: 1.0}),
        Trap("truncation_free", "Тайм-аут поднял загрузку не бесплатно: он оборвал роллауты дольше "
             "τ. Их (и доли обрезанных по сложности) нужно назвать — иначе рост U выглядит чистым "
             "выигрышем, а данные смещаются.",
             override={"truncated": lambda t: [], "hard_share_truncated": lambda t: 0.0,
                       "easy_share_truncated": lambda t: 0.0},
             matches=lambda t, g: not value(g, "truncated")
             or max(value(g, "hard_share_truncated"), value(g, "easy_share_truncated")) <= 1e-9),
        either("conditional_reversed", "Вы посчитали долю сложных среди обрезанных. Нужно обратное: "
               "какая доля роллаутов сложных задач обрезана (и отдельно — лёгких); смещение видно "
               "из сравнения этих долей.", ANSWER,
               {"hard_share_truncated": _hard_among_cut,
                "easy_share_truncated": lambda t: 1 - _hard_among_cut(t)},
               by=("hard_share_truncated",)),
        Trap("old_max_denominator", "В U_timeout остался прежний максимум в знаменателе. С тайм-аутом "
             "шаг кончается в момент τ: U_timeout = Σ min(T_i, τ) / (n · τ).",
             override={"U_timeout": _old_max}),
    ),
)  # fmt: skip
