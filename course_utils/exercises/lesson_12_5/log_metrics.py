"""12.5.9 — p50/p95/p99 по журналу запуска, доля вырожденных групп, информативные группы в секунду."""

import math
import random
from types import SimpleNamespace

from course_utils import throughput, tracing
from course_utils.exercises.answers import Fields, Share
from course_utils.exercises.lesson_12_5.young_interval import RTOL, TOL, Amount, near
from course_utils.exercises.step import Step, Trap

_Q = ("p50", "p95", "p99")


def _group_share(groups: list[dict]) -> tuple[int, float]:
    """(число групп, доля вырожденных) — через throughput.degenerate_group_share."""
    records = [SimpleNamespace(group_id=g["group_id"], prompt_id=g["group_id"],
                               sample_id=f"{g['group_id']}-{i}", reward={"correctness": float(r)})
               for g in groups for i, r in enumerate(g["rewards"])]  # fmt: skip
    return throughput.degenerate_group_share(records)


def values(task: dict) -> dict:
    """Верные величины и величины типичных ошибок (перцентили — tracing.percentiles)."""
    groups, wall = task["groups"], task["wall_s"]
    durations, per = [d for g in groups for d in g["durations_s"]], {}
    for g in groups:
        per.setdefault(g["collector"], []).extend(g["durations_s"])
    per_p = {c: tracing.percentiles(d) for c, d in per.items()}
    (n, share), zeros = _group_share(groups), sum(all(r == 0 for r in g["rewards"]) for g in groups)
    return {**tracing.percentiles(durations), "degenerate_share": share,
            "informative_groups_per_s": n / wall * (1 - share),  # группы/с × (1 − доля вырожденных)
            "n_groups": n, "n_rollouts": len(durations), "durations": durations, "per_collector": per_p,
            "avg": {q: sum(p[q] for p in per_p.values()) / len(per_p) for q in _Q}, "mean": sum(durations) / len(durations),
            "groups_per_s": n / wall, "zero_share": zeros / n, "zero_rate": n / wall * (1 - zeros / n)}  # fmt: skip


def _distinct(vals: list[float], rel: float) -> bool:
    """Значения попарно различимы с запасом rel."""
    return all(
        abs(a - b) > rel * max(abs(a), abs(b)) for i, a in enumerate(vals) for b in vals[i + 1 :]
    )


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_9_000 + 7919 * variant)
    while True:
        k, size = rng.choice([3, 4]), rng.choice([4, 6, 8])
        n = sum(counts := [rng.randint(2, 4) for _ in range(k)])
        slow, base = rng.randrange(k), rng.uniform(6, 20)
        n0, n1 = rng.randint(1, 2), rng.randint(1, max(1, n // 4))  # групп «все 0» и «все 1»
        kinds = ["zero"] * n0 + ["one"] * n1 + ["mixed"] * (n - n0 - n1)
        rng.shuffle(kinds)
        raw, busy = [], {}
        for c, count in enumerate(counts):
            scale = base * (rng.uniform(2.5, 4.0) if c == slow else rng.uniform(0.7, 1.3))
            for _ in range(count):
                durations = [round(scale * math.exp(rng.gauss(0, 0.45)), 1) for _ in range(size)]
                if (kind := kinds[len(raw)]) == "mixed":
                    rewards = [1] + [0] + [int(rng.random() < 0.5) for _ in range(size - 2)]
                    rng.shuffle(rewards)
                else:
                    rewards = [int(kind == "one")] * size
                raw.append({"collector": f"collector-{c}", "durations_s": durations, "rewards": rewards})  # fmt: skip
                busy[c] = busy.get(c, 0.0) + max(durations)  # ответы группы генерируются вместе
        rng.shuffle(raw)
        groups = [{"group_id": f"g{i + 1:02d}", **g} for i, g in enumerate(raw)]
        task = {"groups": groups, "wall_s": round(max(busy.values()) * rng.uniform(1.05, 1.25)), "group_size": size}  # fmt: skip
        v = values(task)  # ловушки различимы: среднее ≠ p50, среднее перцентилей ≠ перцентиль
        if (n - n0 - n1 >= 2 and _distinct([v["p50"], v["mean"], v["avg"]["p50"]], 0.03)
                and _distinct([v["p95"], v["avg"]["p95"]], 0.05) and _distinct([v["p99"], v["avg"]["p99"]], 0.05)):  # fmt: skip
            break
    table = "\n".join(f"| {g['group_id']} | `{g['collector']}` | {', '.join(f'{d:g}' for d in g['durations_s'])} "
                      f"| {' '.join(map(str, g['rewards']))} |" for g in groups)  # fmt: skip
    statement = (
        f"**Статистика по журналу запуска.** {k} сборщика роллаутов за время прогона W = {task['wall_s']} с "
        f"(настенное время от старта до конца) завершили {n} групп по G = {size} ответов на один запрос. Для "
        "каждой группы — сборщик, длительности роллаутов (с, от начала генерации до готовности с наградой) и "
        "награды correctness (1 — верно, 0 — нет); то же — в `task_12_5_9['groups']` и `task_12_5_9['wall_s']`:"
        f"\n\n| группа | сборщик | длительности, с | награды |\n|---|---|---|---|\n{table}\n\nНайдите:\n"
        "1. `p50`, `p95`, `p99` — перцентили длительности роллаута по всему запуску, в секундах. Перцентиль — с "
        "линейной интерполяцией, как `numpy.percentile` по умолчанию и `tracing.percentiles`: для "
        "отсортированных $x_0 \\le \\dots \\le x_{n-1}$ $h = (n-1)\\,q/100$, $p_q = x_{\\lfloor h\\rfloor} + "
        "(h - \\lfloor h\\rfloor)(x_{\\lfloor h\\rfloor+1} - x_{\\lfloor h\\rfloor})$;\n2. `degenerate_share` — "
        "долю вырожденных групп (все награды группы равны, преимущество нулевое), от 0 до 1;\n"
        "3. `informative_groups_per_s` — информативные группы в секунду.\n\nОтвет — словарь `{\"p50\": …, "
        f'"p95": …, "p99": …, "degenerate_share": …, "informative_groups_per_s": …}}`; {TOL}.'
    )  # fmt: skip
    return {"statement": statement, **task}


def solve(task: dict) -> dict:
    v = values(task)
    return {k: v[k] for k in (*_Q, "degenerate_share", "informative_groups_per_s")}


def solution(task: dict, ref: dict) -> str:
    v = values(task)
    xs, n, rows = sorted(v["durations"]), v["n_rollouts"], []
    for q in (50, 95, 99):
        h = (n - 1) * q / 100
        lo, hi = math.floor(h), min(math.floor(h) + 1, n - 1)
        rows.append(f"| p{q} | ({n} − 1)·{q}/100 = {h:.2f} | $x_{{{lo}}}$ = {xs[lo]:g}, $x_{{{hi}}}$ = {xs[hi]:g} | "
                    f"{xs[lo]:g} + {h - lo:.2f}·({xs[hi]:g} − {xs[lo]:g}) = {ref[f'p{q}']:.3f} |")  # fmt: skip
    per = "\n".join(f"| `{c}` | {p['p50']:.2f} | {p['p95']:.2f} | {p['p99']:.2f} |" for c, p in sorted(v["per_collector"].items()))  # fmt: skip
    degenerate = [g["group_id"] for g in task["groups"] if len(set(g["rewards"])) == 1]
    ones = [g["group_id"] for g in task["groups"] if set(g["rewards"]) == {1}]
    return (
        f"**Перцентили** — по объединённой выборке всех {n} роллаутов (старшие значения: … "
        f"{', '.join(f'{x:g}' for x in xs[-6:])} с):\n\n| q | h = (n − 1)·q/100 | соседи | $p_q$, с |\n"
        "|---|---|---|---|\n" + "\n".join(rows) + "\n\nПерцентили отдельных сборщиков, с — для сравнения:\n\n"
        f"| сборщик | p50 | p95 | p99 |\n|---|---|---|---|\n{per}\n| среднее по сборщикам | {v['avg']['p50']:.2f} | "
        f"{v['avg']['p95']:.2f} | {v['avg']['p99']:.2f} |\n\nСреднее перцентилей — не перцентиль: перцентиль "
        "нелинеен, и хвост медленного сборщика «размывается» быстрыми. Медиана тоже не среднее: при длинном "
        f"правом хвосте среднее ({v['mean']:.3f} с) больше p50.\n\n**Вырожденные группы** (все награды равны): "
        f"{', '.join(degenerate)} — {len(degenerate)} из {v['n_groups']}, доля {ref['degenerate_share']:.4f}. "
        f"Группы, где все ответы верны ({', '.join(ones)}), тоже вырождены: преимущество нулевое.\n\n"
        f"**Информативные группы в секунду:**\n\n$$\\frac{{{v['n_groups']}}}{{{task['wall_s']}}} \\cdot (1 - "
        f"{ref['degenerate_share']:.4f}) = {ref['informative_groups_per_s']:.5f}\\ \\text{{групп/с}}.$$\n\n"
        f"**Ответ:** `{ {k: round(x, 4) for k, x in ref.items()} }`."
    )  # fmt: skip


STEP = Step(
    id="12.5.9", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({"p50": Amount(unit="с"), "p95": Amount(unit="с"), "p99": Amount(unit="с"),
                   "degenerate_share": Share(rtol=RTOL), "informative_groups_per_s": Amount(unit="групп/с")}),
    hint="Соберите длительности всех роллаутов всех сборщиков в один список и возьмите "
    "numpy.percentile(x, [50, 95, 99]) (линейная интерполяция); не усредняйте перцентили сборщиков. "
    "Вырождена группа, где все награды равны — и все 0, и все 1. Информативные группы/с = (групп / W) × "
    "(1 − доля вырожденных).",
    traps=(
        Trap("average_of_percentiles", "Вы усреднили перцентили отдельных сборщиков. Перцентиль нелинеен: среднее "
             "p95 сборщиков — не p95 запуска, хвост медленного сборщика размывается. Считайте перцентили по "
             "объединённой выборке всех роллаутов.", override={q: (lambda t, q=q: values(t)["avg"][q]) for q in _Q},
             matches=lambda t, g: any(near(values(t)["avg"][q], g, q) for q in ("p95", "p99"))),
        Trap("mean_as_p50", "Вы взяли среднее вместо медианы. p50 — середина отсортированной выборки; при длинном "
             "правом хвосте длительностей среднее заметно больше медианы.", override={"p50": lambda t: values(t)["mean"]}),
        Trap("groups_not_informative", "Это все группы в секунду. Вырожденная группа (все награды равны) даёт "
             "нулевое преимущество и не учит политику: информативные группы/с = группы/с × (1 − доля вырожденных "
             "групп).", override={"informative_groups_per_s": lambda t: values(t)["groups_per_s"]}),
        Trap("all_correct_not_degenerate", "Вы посчитали вырожденными только группы, где все ответы неверны. "
             "Группа, где все ответы верны, тоже вырождена: награды равны, преимущество нулевое, градиента нет.",
             override={"degenerate_share": lambda t: values(t)["zero_share"],
                       "informative_groups_per_s": lambda t: values(t)["zero_rate"]},
             matches=lambda t, g: near(values(t)["zero_share"], g, "degenerate_share")
             or near(values(t)["zero_rate"], g, "informative_groups_per_s")),
    ),
)  # fmt: skip
