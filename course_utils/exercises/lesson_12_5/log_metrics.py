"""12.5.9 — p50/p95/p99 по журналу запуска, доля вырожденных групп, информативные группы/с."""

import math
import random

from course_utils import fmt, tracing
from course_utils.exercises.answers import Fields, Number, far_apart, md_table
from course_utils.exercises.common import AMOUNT, SHARE, group_share, traps
from course_utils.exercises.step import Step

_Q = ("p50", "p95", "p99")


def _log_values(task: dict) -> dict:  # верные величины и величины типичных ошибок
    groups, per = task["groups"], {}
    for g in groups:
        per.setdefault(g["collector"], []).extend(g["durations_s"])
    per = {c: tracing.percentiles(d) for c, d in per.items()}
    n, share = group_share((g["group_id"], g["rewards"]) for g in groups)
    durations, rate = [d for g in groups for d in g["durations_s"]], n / task["wall_s"]
    zeros = sum(set(g["rewards"]) == {0} for g in groups) / n  # вырождены только «все 0»
    out = {**tracing.percentiles(durations), "degenerate_share": share}
    out.update(informative_groups_per_s=rate * (1 - share), groups_per_s=rate, zero_share=zeros)
    out.update(zero_rate=rate * (1 - zeros), mean=sum(durations) / len(durations))
    return out | {f"avg_{q}": sum(p[q] for p in per.values()) / len(per) for q in _Q}


def _logm_task(variant: int) -> dict:
    rng = random.Random(12_5_9_000 + 7919 * variant)
    while True:
        k, size = rng.choice([3, 4]), rng.choice([4, 6, 8])
        n = sum(counts := [rng.randint(2, 4) for _ in range(k)])
        slow, base = rng.randrange(k), rng.uniform(6, 20)
        n0, n1 = rng.randint(1, 2), rng.randint(1, max(1, n // 4))  # групп «все 0» и «все 1»
        kinds = ["zero"] * n0 + ["one"] * n1 + ["mixed"] * (n - n0 - n1)
        rng.shuffle(kinds)
        raw, busy = [], [0.0] * k
        for c, count in enumerate(counts):
            scale = base * (rng.uniform(2.5, 4.0) if c == slow else rng.uniform(0.7, 1.3))
            for _ in range(count):
                d = [round(scale * math.exp(rng.gauss(0, 0.45)), 1) for _ in range(size)]
                if (kind := kinds[len(raw)]) == "mixed":
                    rewards = [1, 0] + [int(rng.random() < 0.5) for _ in range(size - 2)]
                    rng.shuffle(rewards)
                else:
                    rewards = [int(kind == "one")] * size
                raw.append({"collector": f"collector-{c}", "durations_s": d, "rewards": rewards})
                busy[c] += max(d)  # ответы группы генерируются вместе
        rng.shuffle(raw)
        groups = [{"group_id": f"g{i + 1:02d}", **g} for i, g in enumerate(raw)]
        wall = round(max(busy) * rng.uniform(1.05, 1.25))
        task = {"groups": groups, "wall_s": wall, "group_size": size}
        v = _log_values(task)  # ловушки различимы: среднее ≠ p50, среднее перцентилей ≠ перцентиль
        ok = n - n0 - n1 >= 2 and far_apart([v["p50"], v["mean"], v["avg_p50"]], 0.03, 0)
        if ok and all(far_apart([v[q], v[f"avg_{q}"]], 0.05, 0) for q in _Q[1:]):
            break
    rows = [
        [g["group_id"], f"`{g['collector']}`", ", ".join(f"{d:g}" for d in g["durations_s"])]
        + [" ".join(map(str, g["rewards"]))]
        for g in groups
    ]
    table = md_table(["группа", "сборщик", "длительности, с", "награды"], rows)
    statement = f"**Статистика по журналу запуска.** {k} сборщика роллаутов за время прогона W = {wall} с (настенное время от старта до конца) завершили {n} групп по G = {fmt.count(size, 'ответ', 'ответа', 'ответов')} на один запрос. Для каждой группы — сборщик, длительности роллаутов (с, от начала генерации до готовности с наградой) и награды correctness (1 — верно, 0 — нет); то же — в `task_12_5_9['groups']` и `task_12_5_9['wall_s']`:\n\n{table}\n\nНайдите `p50`, `p95`, `p99` — перцентили длительности роллаута по всему запуску, с; перцентиль — с линейной интерполяцией, как `numpy.percentile` по умолчанию: $h = (n-1)\\,q/100$, $p_q = x_{{\\lfloor h\\rfloor}} + (h - \\lfloor h\\rfloor)(x_{{\\lfloor h\\rfloor+1}} - x_{{\\lfloor h\\rfloor}})$ по отсортированным x. `degenerate_share` — доля вырожденных групп (все награды группы равны, преимущество нулевое), `informative_groups_per_s` — информативные группы в секунду. Допуск 1 %."
    return {"statement": statement, **task}


def _logm_solve(task: dict) -> dict:
    v = _log_values(task)
    return {k: v[k] for k in (*_Q, "degenerate_share", "informative_groups_per_s")}


def _logm_solution(task: dict, ref: dict) -> str:
    v, n = _log_values(task), len(task["groups"])
    xs, rows = sorted(d for g in task["groups"] for d in g["durations_s"]), []
    for q in (50, 95, 99):
        h = (len(xs) - 1) * q / 100
        lo, hi = math.floor(h), min(math.floor(h) + 1, len(xs) - 1)
        step = f"{xs[lo]:g} + {h - lo:.2f}·({xs[hi]:g} − {xs[lo]:g})"
        rows.append([f"p{q}", f"{h:.2f}", f"$x_{{{lo}}}, x_{{{hi}}}$", step, f"{ref[f'p{q}']:.3f}"])
    avg = " / ".join(f"{v['avg_' + q]:.2f}" for q in _Q)
    degenerate = [g["group_id"] for g in task["groups"] if len(set(g["rewards"])) == 1]
    share, rate = ref["degenerate_share"], ref["informative_groups_per_s"]
    table = md_table(["q", "h", "соседи", "интерполяция", "$p_q$, с"], rows)
    return f"**Перцентили** — по всем {len(xs)} роллаутам вместе, h = (n − 1)·q/100:\n\n{table}\n\nСреднее перцентилей сборщиков ({avg} с) — не перцентиль запуска: хвост медленного сборщика размывается. Среднее ({v['mean']:.3f} с) при длинном хвосте больше p50.\n\n**Вырожденные группы** (все 0 или все 1): {', '.join(degenerate)} — {len(degenerate)} из {n}, доля {share:.4f}:\n\n$$\\frac{{{n}}}{{{task['wall_s']}}} \\cdot (1 - {share:.4f}) = {rate:.5f}\\ \\text{{групп/с}}.$$\n\n**Ответ:** `{ {k: round(x, 4) for k, x in ref.items()} }`."


_MESSAGES = {
    "average_of_percentiles": "Вы усреднили перцентили отдельных сборщиков. Перцентиль нелинеен: среднее p95 сборщиков — не p95 запуска, хвост медленного сборщика размывается. Считайте перцентили по объединённой выборке всех роллаутов.",
    "mean_as_p50": "Вы взяли среднее вместо медианы. p50 — середина отсортированной выборки; при длинном правом хвосте длительностей среднее заметно больше медианы.",
    "groups_not_informative": "Это все группы в секунду. Вырожденная группа (все награды равны) даёт нулевое преимущество и не учит политику: информативные группы/с = группы/с × (1 − доля вырожденных).",
    "all_correct_not_degenerate": "Вы посчитали вырожденными только группы, где все ответы неверны. Группа, где все ответы верны, тоже вырождена: награды равны, преимущество нулевое, градиента нет.",
}
_WRONG = {  # ошибка → {ключ ответа: величина из _log_values}
    "average_of_percentiles": {q: f"avg_{q}" for q in _Q},
    "mean_as_p50": {"p50": "mean"},
    "groups_not_informative": {"informative_groups_per_s": "groups_per_s"},
    "all_correct_not_degenerate": {
        "degenerate_share": "zero_share",
        "informative_groups_per_s": "zero_rate",
    },
}
_BY = {"average_of_percentiles": _Q[1:]}  # узнаётся по любому из ключей (по умолчанию — _WRONG)


def _logm_slips(task: dict, ref: dict) -> dict[str, dict]:
    v = _log_values(task)
    return {k: ref | {f: v[x] for f, x in w.items()} for k, w in _WRONG.items()}


_ANSWER = Fields(
    dict.fromkeys(_Q, Number(unit="с", **AMOUNT))
    | {"degenerate_share": SHARE}
    | {"informative_groups_per_s": Number(unit="групп/с", **AMOUNT)}
)
_HINT = "Соберите длительности всех роллаутов всех сборщиков в один список и возьмите numpy.percentile(x, [50, 95, 99]); не усредняйте перцентили сборщиков. Вырождена группа, где все награды равны — и все 0, и все 1. Информативные группы/с = (групп / W) × (1 − доля вырожденных)."
_TRAPS = traps(_logm_slips, _MESSAGES, {k: tuple(w) for k, w in _WRONG.items()} | _BY)
STEP = Step("12.5.9", _logm_task, _logm_solve, _ANSWER, _HINT, _logm_solution, _TRAPS)
