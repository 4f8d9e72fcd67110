"""12.3.9 — трасса этапов: сумма работы против критического пути, загрузка пулов, что ускорять."""

import random

from course_utils import pipeline
from course_utils.exercises.answers import Choice, Fields, get, md_table, sig
from course_utils.exercises.common import SECONDS, SHARE, json_cached, trace_table, traps
from course_utils.exercises.step import Step

_POOL_NAMES = {"generation": "генерация", "verifier": "проверка", "training": "обучение"}
_TRAIN_STAGES = ("logprob_recompute", "forward_backward", "optimizer_step", "weight_sync")
_SCENARIOS = (  # запуск; logprob_recompute, forward_backward, weight_sync, checkpoint, decode
    ("упор в forward/backward большой модели", (15, 25), (70, 100), (10, 20), (20, 40), (50, 80)),
    ("медленная сеть до движка генерации", (10, 20), (30, 45), (50, 80), (20, 40), (40, 70)),
    ("пересчёт log-prob на длинных ответах", (50, 80), (30, 45), (10, 20), (20, 40), (40, 70)),
    ("долгая синхронная контрольная точка", (10, 20), (25, 35), (10, 20), (120, 180), (35, 55)),
)  # длительности — в десятых долях секунды; optimizer_step всегда 5–10


def _build_trace(rng: random.Random, n_gen: int, train: dict, decode: tuple) -> list[dict]:
    """Окно перекрытого конвейера: шаги тренера 0–2, пакеты 0–3; время — в десятых долях с."""
    ev: list[dict] = []
    free = dict.fromkeys([f"gen-{i}" for i in range(n_gen)] + ["verifier-0", "trainer-0"], 0)

    def add(worker: str, stage: str, length: int, ready: int = 0, deps=(), wait: str = "") -> dict:
        start = max(free[worker], ready)
        if wait and start > free[worker]:  # ожидание — отдельный интервал
            ev.append({"worker": worker, "stage": wait, "start_s": free[worker], "end_s": start})
        ev.append({"worker": worker, "stage": stage, "start_s": start, "end_s": start + length})
        ev[-1]["depends_on"], free[worker] = list(deps), start + length
        return ev[-1]

    verified, synced = [add("verifier-0", "verifier", rng.randint(8, 20))], []
    for step in range(3):  # пакет step + 1 генерируется, пока тренер учится на пакете step
        decodes = []
        for w in [w for w in free if w.startswith("gen")]:  # ждёт версию весов: backpressure
            ready = synced[-1]["end_s"] if synced else 0
            add(w, "prefill", rng.randint(3, 8), ready, synced[-1:], "backpressure")
            decodes.append(add(w, "decode", rng.randint(*decode)))
        ready = max(d["end_s"] for d in decodes)
        verified.append(add("verifier-0", "verifier", rng.randint(8, 20), ready, decodes))
        for i, stage in enumerate(_TRAIN_STAGES):  # первый этап ждёт проверенный пакет
            deps, ready = [verified[step]] if i == 0 else [], verified[step]["end_s"]
            last = add("trainer-0", stage, rng.randint(*train[stage]), ready, deps, "queue_wait")
        synced.append(last)
        if step == 1:
            add("trainer-0", "checkpoint", rng.randint(*train["checkpoint"]))
    ev.sort(key=lambda e: (e["start_s"], e["worker"]))
    row = {id(e): r for r, e in enumerate(ev)}
    for e in ev:  # номера строк вместо ссылок, секунды вместо десятых
        deps = sorted(row[id(d)] for d in e.get("depends_on", ()))  # у ожидания зависимостей нет
        e.update(start_s=e["start_s"] / 10, end_s=e["end_s"] / 10, depends_on=deps)
    return [{"row": r, **e} for r, e in enumerate(ev)]


@json_cached
def _trace_analysis(task: dict) -> dict:
    """Всё для ответа и разбора — через pipeline (кэш: трасса варианта не меняется)."""
    trace, pools = task["trace"], task["pools"]
    deps = {r["row"]: r["depends_on"] for r in trace if r["depends_on"]}
    (length, chain), H = pipeline.critical_path(trace, deps), max(r["end_s"] for r in trace)
    stages = dict.fromkeys(r["stage"] for r in trace if r["stage"] not in pipeline.WAIT_STAGES)
    work = {st: pipeline.sum_of_work([r for r in trace if r["stage"] == st]) for st in stages}
    halved, gains = [r | {"end_s": (r["start_s"] + r["end_s"]) / 2} for r in trace], {}
    for st in stages:  # все интервалы этапа вдвое короче
        h = [m if r["stage"] == st else r for r, m in zip(trace, halved)]
        gains[st] = length - pipeline.critical_path(h, deps)[0]
    util = pipeline.pool_utilization(trace, {w: p for p, ws in pools.items() for w in ws})
    W, n_workers = pipeline.sum_of_work(trace), sum(map(len, pools.values()))
    return {
        "sum_of_work": W,
        "critical_path": length,
        "utilization": {p: float(util[p]) for p in pools},
        "sum_with_waits": pipeline.sum_of_work(trace, exclude_stages=()),
        "chain": [(int(i), st) for i, st in zip(chain.index, chain["stage"])],
        "horizon": H,
        "gains": gains,
        "work": work,
        "biggest": max(work, key=work.get),
        "flat": [W / (n_workers * H), float(util.mean())],  # ошибочные «одна загрузка на всех»
    }


_POOLS = Fields(dict.fromkeys(_POOL_NAMES, SHARE))
_STAGE = Choice(lambda t: list(_trace_analysis(t)["work"]))
_TIMES = dict.fromkeys(("sum_of_work", "critical_path"), SECONDS)
_ANSWER = Fields({**_TIMES, "utilization": _POOLS, "speed_up": _STAGE})


def _crit_task(variant: int) -> dict:
    rng = random.Random(12_3_9_000 + 7919 * variant)
    scenario, *ranges, decode = _SCENARIOS[variant % len(_SCENARIOS)]
    keys = ("logprob_recompute", "forward_backward", "weight_sync", "checkpoint")
    train, n_gen = {**dict(zip(keys, ranges)), "optimizer_step": (5, 10)}, rng.choice([2, 3])
    pools = {"generation": [f"gen-{i}" for i in range(n_gen)], "verifier": ["verifier-0"]}
    pools["training"] = ["trainer-0"]
    while True:  # генерация — самая большая работа, но перекрыта обучением и не лежит на пути
        trace = _build_trace(rng, n_gen, train, decode)
        task = {"scenario": scenario, "trace": trace, "pools": pools}
        a = _trace_analysis(task)
        best, second = sorted(a["gains"].values(), reverse=True)[:2]
        waits = any(r["stage"] == "backpressure" for r in trace)
        off_path = a["biggest"] == "decode" and "decode" not in {st for _, st in a["chain"]}
        if off_path and waits and best >= 1.15 * second + 0.1:
            break
    pool_lines = "; ".join(f"`{p}` ({_POOL_NAMES[p]}) — {', '.join(ws)}" for p, ws in pools.items())
    task["statement"] = (
        f"**Трасса этапов и критический путь.** Три шага перекрытого конвейера (генерация отстаёт на версию весов; запуск: {scenario}); пакет 0 к началу окна сгенерирован, пакет b ≥ 2 — весами `weight_sync` шага b − 2. Интервалы (`task_12_3_9['trace']`; `queue_wait` и `backpressure` — ожидание, а не работа):\n\n{trace_table(trace)}\n\n"
        f"Интервал работы ждёт предыдущий интервал работы своего исполнителя и строки из последнего столбца. Пулы (`task_12_3_9['pools']`): {pool_lines}.\n\n"
        "Найдите `sum_of_work` — сумму работы, с; `critical_path` — длину самой длинной цепочки зависимых интервалов работы, с; `utilization` — загрузку каждого пула: работа его исполнителей / (их число × H), H — конец последнего интервала; `speed_up` — этап, ускорение которого вдвое сильнее всего сокращает критический путь. Допуск 1 %."
    )
    return task


def _crit_solve(task: dict) -> dict:
    a = _trace_analysis(task)
    best, util = max(a["gains"], key=a["gains"].get), dict(a["utilization"])
    return dict(zip(_ANSWER.fields, (a["sum_of_work"], a["critical_path"], util, best)))


def _crit_solution(task: dict, ref: dict) -> str:
    a, util = _trace_analysis(task), ref["utilization"]
    work, gains, biggest = a["work"], a["gains"], a["biggest"]
    on_path = {st for _, st in a["chain"]}
    W, L, H = (sig(a[k]) for k in ("sum_of_work", "critical_path", "horizon"))
    stage_rows = [
        (st, sig(w), "да" if st in on_path else "нет", sig(gains[st]))
        for st, w in sorted(work.items(), key=lambda kv: -kv[1])
    ]
    util_rows = [
        (f"`{p}`", len(ws), sig(util[p] * len(ws) * a["horizon"]), f"{util[p]:.3f}")
        for p, ws in task["pools"].items()
    ]
    answer = ref | {k: round(ref[k], 2) for k in ("sum_of_work", "critical_path")}
    answer["utilization"] = {p: round(u, 3) for p, u in util.items()}
    path = " → ".join(f"{i} ({st})" for i, st in a["chain"])
    return (
        f"**1.** Без ожиданий ({sig(a['sum_with_waits'] - a['sum_of_work'])} с простоя): $W = \\sum (end - start) = {W}$ с — это GPU·секунды, поэтому W больше окна H = {H} с.\n\n"
        f"**2.** Критический путь — самая длинная цепочка, где каждый интервал ждёт предыдущий (своего исполнителя или строку из «зависит от»): {path}; $L_{{crit}} = {L}$ с < W. Путь идёт через тренер: обучение — узкое место.\n\n"
        f"**3.** Загрузка пула — работа его исполнителей / (их число · H):\n\n{md_table(('пул', 'исполнителей', 'работа, с', 'загрузка'), util_rows)}\n\n"
        f"**4.** На сколько сократится путь, если все интервалы этапа станут вдвое короче:\n\n{md_table(('этап', 'работа, с', 'на пути', 'путь короче на, с'), stage_rows)}\n\n"
        f"Ускорять стоит `{ref['speed_up']}`. Самая большая работа — `{biggest}` ({sig(work[biggest])} с), но она перекрыта обучением и не лежит на пути.\n\n**Ответ:** `{answer}`."
    )


def _trace_slips(task: dict, ref: dict) -> dict[str, dict]:
    a = _trace_analysis(task)
    return {
        "off_critical_path": ref | {"speed_up": a["biggest"]},
        "sum_as_critical": ref | {"critical_path": a["sum_of_work"]},
        "average_utilization": ref | {"utilization": dict.fromkeys(task["pools"], a["flat"][0])},
        "wait_as_work": ref | {"sum_of_work": a["sum_with_waits"]},
    }


_TRAP_TEXT = {  # отзыв на типичную ошибку; ответ с ней — _trace_slips
    "off_critical_path": "Выбран этап с наибольшей суммой работы, но он перекрыт обучением и не лежит на критическом пути: его ускорение почти не сокращает период.",
    "sum_as_critical": "Критический путь — не сумма всей работы: исполнители работают параллельно, а путь — самая длинная цепочка интервалов, где каждый ждёт предыдущий.",
    "average_utilization": "Одна средняя загрузка на все пулы смешивает занятый тренер с простаивающими пулами и прячет узкое место; её считают по пулам.",
    "wait_as_work": "В сумму работы попали ожидания (queue_wait, backpressure): это простой исполнителя, а не работа.",
}


def _gives_flat_utilization(task: dict, given: dict) -> bool:  # работа / (все · H) или среднее
    shown = get(given, "utilization").values()
    return any(all(SHARE.same(x, u) for u in shown) for x in _trace_analysis(task)["flat"])


_TRAP_BY = {"off_critical_path": ("speed_up",), "sum_as_critical": ("critical_path",)}
_TRAP_BY |= {"average_utilization": _gives_flat_utilization, "wait_as_work": ("sum_of_work",)}
_HINT = "Для критического пути идите по строкам в порядке окончания: лучшая цепочка до конца строки = её длительность + максимум по предшественникам (предыдущий интервал исполнителя и строки из «зависит от»). Ускорять стоит этап на пути."
_TRAPS = traps(_trace_slips, _TRAP_TEXT, _TRAP_BY)
STEP = Step("12.3.9", _crit_task, _crit_solve, _ANSWER, _HINT, _crit_solution, _TRAPS)
