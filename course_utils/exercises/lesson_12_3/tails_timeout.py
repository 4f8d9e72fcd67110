"""12.3.7 — загрузка слотов U при медленных хвостах; тайм-аут: U, обрезанные роллауты, смещение."""

import random

from course_utils import pipeline
from course_utils.exercises.answers import Fields, IdSet, get, md_table, sig
from course_utils.exercises.common import SECONDS, SHARE, traps
from course_utils.exercises.step import Step

_CUT = IdSet(lambda t: range(len(t["rollouts"])), "номеров роллаутов i")
_SHARES = ("hard_share_truncated", "easy_share_truncated")
_FIELDS = {"T_group": SECONDS, "U": SHARE, "U_timeout": SHARE, "truncated": _CUT}
_ANSWER = Fields({**_FIELDS, **dict.fromkeys(_SHARES, SHARE)})
_RU = {"easy": "лёгкая", "hard": "сложная"}
_SPANS = {"hard": (6.0, 13.0), "easy": (2.5, 7.5)}  # обычные времена, с


def _tails_task(variant: int) -> dict:
    rng = random.Random(12_3_7_000 + 7919 * variant)
    timeout = rng.choice([14, 15, 16, 18, 20])
    kinds = ["hard"] * rng.choice([2, 3])
    kinds += ["easy"] * (4 - len(kinds))
    rng.shuffle(kinds)
    rows = []
    for t, kind in enumerate(kinds):
        for j in range(4):
            d = round(rng.uniform(*_SPANS[kind]), 1)
            rows.append({"i": 4 * t + j, "task": f"q{t + 1}", "difficulty": kind, "duration_s": d})
    # хвост у сложных задач, иногда — тайм-аут среды у лёгкой (сложных в доле обрезано больше)
    for r in rng.sample([r for r in rows if r["difficulty"] == "hard"], rng.randint(2, 4)):
        r["duration_s"] = round(rng.uniform(timeout + 3, 2.6 * timeout), 1)
    if len(easy := [r for r in rows if r["difficulty"] == "easy"]) == 8 and rng.random() < 0.5:
        rng.choice(easy)["duration_s"] = round(rng.uniform(timeout + 1, timeout + 8), 1)
    table = md_table(
        ("i", "задача", "сложность", "время, с"),
        [(r["i"], r["task"], _RU[r["difficulty"]], f"{r['duration_s']:.1f}") for r in rows],
    )
    statement = (
        f"**Медленные хвосты и тайм-аут.** Синхронный шаг ждёт все {len(rows)} роллаутов (4 задачи "
        "по 4 ответа); у каждого свой слот генерации, старт общий (таблица — "
        f"`task_12_3_7['rollouts']`):\n\n{table}\n\nЗагрузка слотов — занятая доля прямоугольника "
        "«слоты × длительность шага». Найдите (допуск 1 %) `T_group` — длительность шага, с; `U` — "
        f"загрузку слотов; `U_timeout` — её же с тайм-аутом τ = {timeout} с (роллаут дольше τ "
        "обрывается в момент τ); `truncated` — номера i обрезанных роллаутов; "
        "`hard_share_truncated`, `easy_share_truncated` — доли обрезанных среди роллаутов сложных "
        "и лёгких задач."
    )
    return {"statement": statement, "timeout_s": timeout, "rollouts": rows}


def _tails_solve(task: dict) -> dict:
    rows, d = task["rollouts"], [r["duration_s"] for r in task["rollouts"]]
    capped, mask = pipeline.truncate_durations(d, task["timeout_s"])
    cut = [[bool(m) for m, r in zip(mask, rows) if r["difficulty"] == k] for k in ("hard", "easy")]
    U, U_timeout = pipeline.group_utilization(d), pipeline.group_utilization(capped)
    truncated, shares = [i for i, m in enumerate(mask) if m], [sum(c) / len(c) for c in cut]
    return dict(zip(_ANSWER.fields, (max(d), U, U_timeout, truncated, *shares)))  # шаг ждёт max


def _tails_solution(task: dict, ref: dict) -> str:
    tau, rows = task["timeout_s"], task["rollouts"]
    d = [r["duration_s"] for r in rows]
    n, T, total = len(d), sig(ref["T_group"]), sig(sum(d))
    n_hard = sum(r["difficulty"] == "hard" for r in rows)
    picked = [rows[i] for i in ref["truncated"]]
    k_hard = sum(r["difficulty"] == "hard" for r in picked)
    listing = ", ".join(f"{r['i']} ({r['task']}, {r['duration_s']:.1f} с)" for r in picked)
    answer = {k: round(v, 3) if isinstance(v, float) else v for k, v in ref.items()}
    return (
        f"Шаг ждёт самый медленный роллаут: $T_{{group}} = \\max_i T_i = {T}$ с (не среднее "
        f"{sum(d) / n:.2f} с). С тайм-аутом роллаут занимает слот $\\min(T_i, τ)$, а шаг длится "
        f"τ:\n\n$$U = \\frac{{\\sum_i T_i}}{{n \\max_i T_i}} = \\frac{{{total}}}{{{n} \\cdot {T}}} "
        f"\\approx {ref['U']:.3f}, \\qquad U_{{timeout}} = \\frac{{\\sum_i \\min(T_i, "
        f"τ)}}{{n\\,τ}} = \\frac{{{sig(sum(min(x, tau) for x in d))}}}{{{n} \\cdot {tau}}} "
        f"\\approx {ref['U_timeout']:.3f}.$$\n\nОбрезаны роллауты с $T_i > τ$: {listing}. Из "
        f"{n_hard} роллаутов сложных задач — {k_hard} (доля {ref['hard_share_truncated']:.3f}), из "
        f"{n - n_hard} лёгких — {len(picked) - k_hard} (доля {ref['easy_share_truncated']:.3f}): "
        "тайм-аут смещает данные к простым задачам, поэтому доли обрезанных входят в "
        f"отчёт.\n\n**Ответ:** `{answer}`."
    )


def _tails_slips(task: dict, ref: dict) -> dict[str, dict]:
    tau, cut = task["timeout_s"], [task["rollouts"][i]["difficulty"] for i in ref["truncated"]]
    p = cut.count("hard") / len(cut)  # P(сложная | обрезан) — перевёрнутое условие
    return {
        "mean_not_max": ref | {"T_group": ref["U"] * ref["T_group"], "U": 1.0, "U_timeout": 1.0},
        "truncation_free": ref | {"truncated": [], **dict.fromkeys(_SHARES, 0.0)},
        "conditional_reversed": ref | {"hard_share_truncated": p, "easy_share_truncated": 1 - p},
        "old_max_denominator": ref | {"U_timeout": ref["U_timeout"] * tau / ref["T_group"]},
    }


_TRAP_TEXT = {  # отзыв на типичную ошибку; ответ с ней — _tails_slips
    "mean_not_max": "Взято среднее время вместо максимума. Роллауты идут параллельно, и шаг ждёт самого медленного; со средним U всегда равна 1 и ничего не говорит о простое.",
    "truncation_free": "Тайм-аут поднял загрузку не бесплатно: он оборвал роллауты дольше τ, и без них (и без долей обрезанных по сложности) смещение данных не видно.",
    "conditional_reversed": "Посчитана доля сложных среди обрезанных. Нужно обратное: какая доля роллаутов сложных задач обрезана (и отдельно — лёгких).",
    "old_max_denominator": "В знаменателе U_timeout остался прежний максимум, а с тайм-аутом шаг кончается в момент τ.",
}
_TRAP_BY = {  # без обрезки — своё правило
    "mean_not_max": ("T_group", "U", "U_timeout"),
    "truncation_free": lambda t, g: (
        not get(g, "truncated") or max(get(g, k) for k in _SHARES) <= 1e-9
    ),
    "conditional_reversed": ("hard_share_truncated",),
    "old_max_denominator": ("U_timeout",),
}

_HINT = "Шаг длится столько, сколько самый медленный роллаут: U = Σ T_i / (n · max T_i). С тайм-аутом замените каждое время на min(T_i, τ) — и в сумме, и в максимуме. Доли обрезанных считайте внутри каждой группы сложности."
_TRAPS = traps(_tails_slips, _TRAP_TEXT, _TRAP_BY)
STEP = Step("12.3.7", _tails_task, _tails_solve, _ANSWER, _HINT, _tails_solution, _TRAPS)
