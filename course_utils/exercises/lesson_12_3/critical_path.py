"""12.3.9 — трасса этапов: сумма работы против критического пути, загрузка пулов, что ускорять."""

import copy
import functools
import json
import math
import random

from course_utils import pipeline
from course_utils.exercises.answers import Choice, Fields, Share, md_table
from course_utils.exercises.step import Step, Trap

from .pipeline_split import SECONDS, TOLERANCE, s, shape, value

_POOL_NAMES = {"generation": "генерация", "verifier": "проверка", "training": "обучение"}
_TRAIN_STAGES = ("logprob_recompute", "forward_backward", "optimizer_step", "weight_sync")
_SCENARIOS = (  # описание; диапазоны logprob_recompute, forward_backward, optimizer_step,
    # weight_sync, checkpoint и decode — в десятых долях секунды
    ("обучение упирается в forward/backward большой модели",
     (15, 25), (70, 100), (5, 10), (10, 20), (20, 40), (50, 80)),
    ("новые веса идут в движок генерации по медленной сети",
     (10, 20), (30, 45), (5, 10), (50, 80), (20, 40), (40, 70)),
    ("пересчёт log-prob тренером на длинных последовательностях",
     (50, 80), (30, 45), (5, 10), (10, 20), (20, 40), (40, 70)),
    ("синхронная запись контрольной точки на медленный диск",
     (10, 20), (25, 35), (5, 10), (10, 20), (120, 180), (35, 55)),
)  # fmt: skip


def _build_trace(rng: random.Random, n_gen: int, train: dict, decode: tuple) -> list[dict]:
    """Окно перекрытого конвейера: шаги тренера 0–2, пакеты 0–3; время — в десятых долях секунды.

    Пакет 0 к началу окна сгенерирован; пакет b ≥ 2 генерируется весами weight_sync шага b − 2.
    """
    ev: list[tuple] = []  # (исполнитель, этап, начало, конец, зависимости)
    free = dict.fromkeys([f"gen-{i}" for i in range(n_gen)] + ["verifier-0", "trainer-0"], 0)
    ver, ws = {}, {}

    def add(worker: str, stage: str, length: int, ready: int = 0, deps=(), wait: str = "") -> int:
        start = max(free[worker], ready)
        if wait and start > free[worker]:  # ожидание — отдельный интервал
            ev.append((worker, wait, free[worker], start, []))
        ev.append((worker, stage, start, start + length, list(deps)))
        free[worker] = start + length
        return len(ev) - 1

    def verify(b: int, decodes: list[int]) -> None:
        ready = max([0] + [ev[j][3] for j in decodes])
        ver[b] = add("verifier-0", "verifier", rng.randint(8, 20), ready, decodes)

    verify(0, [])
    for step in range(3):  # пакет step + 1 генерируется, пока тренер учится на пакете step
        decodes, dep = [], [ws[step - 1]] if step else []
        for w in [w for w in free if w.startswith("gen")]:  # ждёт версию весов: backpressure
            ready = ev[dep[0]][3] if dep else 0
            add(w, "prefill", rng.randint(3, 8), ready, dep, "backpressure")
            decodes.append(add(w, "decode", rng.randint(*decode)))
        verify(step + 1, decodes)
        for i, stage in enumerate(_TRAIN_STAGES):  # первый этап ждёт проверенный пакет
            deps = [ver[step]] if i == 0 else []
            ws[step] = add(
                "trainer-0", stage, rng.randint(*train[stage]), ev[ver[step]][3], deps, "queue_wait"
            )
        if step == 1:
            add("trainer-0", "checkpoint", rng.randint(*train["checkpoint"]))
    order = sorted(range(len(ev)), key=lambda j: (ev[j][2], ev[j][0]))
    row = {j: r for r, j in enumerate(order)}
    return [{"row": row[j], "worker": ev[j][0], "stage": ev[j][1], "start_s": ev[j][2] / 10,
             "end_s": ev[j][3] / 10, "depends_on": sorted(row[d] for d in ev[j][4])}
            for j in order]  # fmt: skip


@functools.lru_cache(maxsize=64)
def _analyse(trace_json: str, pools_json: str) -> dict:
    """Всё, что нужно ответу и разбору, — через pipeline (кэш: трасса варианта не меняется)."""
    trace, pools = json.loads(trace_json), json.loads(pools_json)
    iv = [{k: r[k] for k in ("worker", "stage", "start_s", "end_s")} for r in trace]
    deps = {r["row"]: r["depends_on"] for r in trace if r["depends_on"]}
    length, chain = pipeline.critical_path(iv, deps)
    stages = dict.fromkeys(r["stage"] for r in iv if r["stage"] not in pipeline.WAIT_STAGES)
    work = {st: pipeline.sum_of_work([r for r in iv if r["stage"] == st]) for st in stages}
    # все интервалы этапа вдвое короче: на сколько сократится путь
    halved = {st: [{**r, "end_s": (r["start_s"] + r["end_s"]) / 2} if r["stage"] == st else r
                   for r in iv] for st in stages}  # fmt: skip
    util = pipeline.pool_utilization(iv, {w: p for p, ws in pools.items() for w in ws})
    a = {"sum_of_work": pipeline.sum_of_work(iv), "critical_path": length,
         "sum_with_waits": pipeline.sum_of_work(iv, exclude_stages=()),
         "chain": [(int(i), st) for i, st in zip(chain.index, chain["stage"])],
         "utilization": {p: float(util[p]) for p in pools}, "horizon": max(r["end_s"] for r in iv),
         "gains": {st: length - pipeline.critical_path(h, deps)[0] for st, h in halved.items()},
         "work": work, "biggest": max(work, key=work.get)}  # fmt: skip
    n_workers = sum(map(len, pools.values()))  # одна загрузка на всех и среднее по пулам
    u = a["utilization"].values()
    a["flat"] = [a["sum_of_work"] / (n_workers * a["horizon"]), sum(u) / len(pools)]
    return a


def _analysis(task: dict) -> dict:
    return copy.deepcopy(_analyse(json.dumps(task["trace"]), json.dumps(task["pools"])))


_UTIL = Share(rtol=1e-2)
ANSWER = Fields({"sum_of_work": SECONDS, "critical_path": SECONDS,
                 "utilization": Fields(dict.fromkeys(_POOL_NAMES, _UTIL)),
                 "speed_up": Choice(lambda t: list(_analysis(t)["work"]))})  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_3_9_000 + 7919 * variant)
    scenario, *ranges, decode = _SCENARIOS[variant % len(_SCENARIOS)]
    train = dict(zip((*_TRAIN_STAGES, "checkpoint"), ranges))
    n_gen = rng.choice([2, 3])
    pools = {"generation": [f"gen-{i}" for i in range(n_gen)], "verifier": ["verifier-0"],
             "training": ["trainer-0"]}  # fmt: skip
    while True:  # генерация — самая большая работа, но перекрыта обучением и не лежит на пути
        trace = _build_trace(rng, n_gen, train, decode)
        task = {"scenario": scenario, "trace": trace, "pools": pools}
        a = _analysis(task)
        best, second = sorted(a["gains"].values(), reverse=True)[:2]
        if a["biggest"] == "decode" and any(r["stage"] == "backpressure" for r in task["trace"]):
            if "decode" not in {st for _, st in a["chain"]} and best >= 1.15 * second + 0.1:
                break
    rows = "\n".join(f"| {r['row']} | {r['worker']} | {r['stage']} | {r['start_s']:.1f} | "
                     f"{r['end_s']:.1f} | {', '.join(map(str, r['depends_on'])) or '—'} |"
                     for r in task["trace"])  # fmt: skip
    pool_lines = "; ".join(f"`{p}` ({_POOL_NAMES[p]}) — {', '.join(ws)}" for p, ws in pools.items())
    task["statement"] = (
        "**Трасса этапов и критический путь.** Окно из трёх шагов перекрытого конвейера "
        f"(генерация отстаёт на одну версию весов); запуск: {scenario}. Пакет 0 к началу окна "
        "уже сгенерирован; пакет b ≥ 2 генерируется весами, которые опубликовал `weight_sync` "
        "шага b − 2. Интервалы этапов (они же в `task_12_3_9['trace']`):\n\n| строка | "
        "исполнитель | этап | начало, с | конец, с | зависит от строк "
        f"|\n|---|---|---|---|---|---|\n{rows}\n\n`queue_wait` и `backpressure` — ожидание, а "
        "не работа. Интервал работы зависит от предыдущего интервала работы своего "
        "исполнителя и от строк в последнем столбце. Пулы (`task_12_3_9['pools']`): "
        f"{pool_lines}.\n\nНайдите:\n1. `sum_of_work` — сумму работы (всех интервалов, кроме "
        "ожиданий), с;\n2. `critical_path` — длину критического пути: самой длинной по сумме "
        "длительностей цепочки зависимых интервалов работы, с;\n3. `utilization` — загрузку "
        "каждого пула, `{пул: доля}`: работа исполнителей пула / (их число × H), H — конец "
        "последнего интервала (окно начинается в 0 с);\n4. `speed_up` — этап, ускорение "
        "которого вдвое (всех его интервалов) сильнее всего сокращает критический "
        f"путь.\n\nОтвет — словарь `{shape(ANSWER)}`; числа — {TOLERANCE}. "
        "`pipeline.critical_path` и `pipeline.pool_utilization` пригодятся для проверки, но "
        "сначала найдите путь по таблице сами."
    )
    return task


def solve(task: dict) -> dict:
    a = _analysis(task)
    keys = ("sum_of_work", "critical_path", "utilization")
    return {**{k: a[k] for k in keys}, "speed_up": max(a["gains"], key=a["gains"].get)}


def solution(task: dict, ref: dict) -> str:
    a = _analysis(task)
    work, gains, biggest = a["work"], a["gains"], a["biggest"]
    on_path = {st for _, st in a["chain"]}
    W, L, H = (s(a[k], 2) for k in ("sum_of_work", "critical_path", "horizon"))
    stage_rows = md_table(("этап", "работа, с", "на пути", "путь короче на, с"),
                          [(st, s(w, 1), "да" if st in on_path else "нет", s(gains[st], 2))
                           for st, w in sorted(work.items(), key=lambda kv: -kv[1])])  # fmt: skip
    util_rows = md_table(("пул", "исполнителей", "работа, с", "загрузка"),
                         [(f"`{p}`", len(ws), s(ref["utilization"][p] * len(ws) * a["horizon"], 1),
                           f"{ref['utilization'][p]:.3f}") for p, ws in task["pools"].items()])  # fmt: skip
    window = (f"После первого ожидания тренер не простаивает, поэтому путь равен окну H = {H} с."
              if math.isclose(a["critical_path"], a["horizon"], abs_tol=1e-6) else
              f"Путь короче окна H = {H} с: в окне есть простой, не вызванный зависимостями.")  # fmt: skip
    answer = {**ref, **{k: round(ref[k], 2) for k in ("sum_of_work", "critical_path")},
              "utilization": {p: round(u, 3) for p, u in ref["utilization"].items()}}  # fmt: skip
    return (
        "**1. Сумма работы** — все интервалы, кроме ожиданий (`queue_wait`, `backpressure`: "
        f"вместе {s(a['sum_with_waits'] - a['sum_of_work'], 1)} с простоя): $W = \\sum (end - "
        f"start) = {W}$ с. Это GPU·секунды: исполнители работают параллельно, и W больше "
        "окна.\n\n**2. Критический путь** — самая длинная по сумме длительностей цепочка, где "
        "каждый интервал ждёт предыдущий (свой исполнитель или строка из «зависит "
        f"от»):\n\n{' → '.join(f'{i} ({st})' for i, st in a['chain'])}\n\n$$L_{{crit}} = {L}\\ "
        f"\\text{{с}} < W = {W}\\ \\text{{с}}.$$\n\nПуть идёт через тренер: обучение — узкое "
        f"место, генерация перекрыта им. {window}\n\n**3. Загрузка пулов** на окне H = {H} с: "
        f"работа исполнителей пула / (их число · H).\n\n{util_rows}\n\nОдна средняя загрузка "
        "смешала бы почти непрерывно занятый тренер с простаивающими пулами и спрятала бы узкое "
        "место.\n\n**4. Что ускорять.** На сколько сократится путь, если все интервалы этапа "
        f"станут вдвое короче:\n\n{stage_rows}\n\nУскорять стоит `{ref['speed_up']}`. Самая "
        f"большая работа — `{biggest}` ({s(work[biggest], 1)} с), но она перекрыта обучением: её "
        f"ускорение не меняет период, пока узкое место — тренер.\n\n**Ответ:** `{answer}`."
    )


STEP = Step(
    id="12.3.9", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint="Сумма работы — сумма длительностей без ожиданий. Для критического пути идите по "
    "строкам в порядке окончания: лучшая цепочка до конца строки = её длительность + максимум "
    "по предшественникам (предыдущий интервал исполнителя и строки из «зависит от»). Загрузку "
    "считайте по пулам; ускорять стоит этап на критическом пути.",
    traps=(
        Trap("off_critical_path", "Вы выбрали этап с наибольшей суммой работы, но он перекрыт "
             "обучением и не лежит на критическом пути: его ускорение почти не сокращает период.",
             override={"speed_up": lambda t: _analysis(t)["biggest"]}),
        Trap("sum_as_critical", "Критический путь — не сумма всей работы: исполнители работают "
             "параллельно, путь — самая длинная цепочка интервалов, где каждый ждёт предыдущий.",
             override={"critical_path": lambda t: _analysis(t)["sum_of_work"]}),
        Trap("average_utilization", "Вы дали одну среднюю загрузку всем пулам. Её считают по пулам: "
             "средняя смешивает занятый тренер с простаивающими пулами и прячет узкое место.",
             override={"utilization": lambda t: dict.fromkeys(t["pools"], _analysis(t)["flat"][0])},
             matches=lambda t, g: any(all(_UTIL.same(x, u) for u in value(g, "utilization").values())
                                      for x in _analysis(t)["flat"])),
        Trap("wait_as_work", "В сумму работы попали ожидания (queue_wait, backpressure): это простой "
             "исполнителя, а не работа.",
             override={"sum_of_work": lambda t: _analysis(t)["sum_with_waits"]}),
    ),
)  # fmt: skip
