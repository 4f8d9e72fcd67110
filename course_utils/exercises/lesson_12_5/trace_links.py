"""12.5.8 — связки трасс: осиротевшие роллауты и несовпадения версии верификатора."""

import copy
import random

from course_utils import fmt, tracing
from course_utils.exercises.answers import Fields, IdSet, md_table
from course_utils.exercises.common import json_cached, listed
from course_utils.exercises.step import Step, Trap

_ROLLOUT_COLS = ("rollout_id", "prompt_id", "behavior_policy_version", "verifier_version", "reward")
_ROLLOUT_COLS += ("tokens", "enqueue_time", "dequeue_time", "dropped", "training_batch_id")
_BATCH_COLS = ("training_batch_id", "optimizer_step", "trainer_policy_version", "n_rollouts")
_BATCH_COLS += ("tokens", "rollout_ids", "complete")
_STEP_COLS = ("optimizer_step", "resulting_policy_version", "expected_verifier_version")
_TABLES = {"rollouts": _ROLLOUT_COLS, "batches": _BATCH_COLS, "steps": _STEP_COLS}


def _trace_build(rng: random.Random, variant: int) -> dict:
    # пакет шага k — при версии тренера k; верификатор обновлён с шага upgrade
    k0, n_steps = rng.randint(10, 60), rng.choice([3, 4])
    steps = list(range(k0, k0 + n_steps))
    upgrade, base = rng.choice(steps[1:]), rng.randint(2, 6)
    old, new = f"verifier-{base}", f"verifier-{base + 1}"
    expected = {k: new if k >= upgrade else old for k in steps}
    max_lag, size, period = rng.choice([1, 2]), rng.choice([4, 5]), rng.uniform(25, 45)
    t0 = period * rng.uniform(5.0, 6.0)  # в таблицах — последние шаги прогона, не первые
    dequeue, last, rows = {k: round(t0 + (k - k0) * period, 1) for k in steps}, steps[-1], []

    def add(version, verifier, enq, deq, dropped=False, step=None) -> None:
        reward = None if verifier is None else float(rng.random() < 0.5)
        values = (version, verifier, reward, rng.randint(40, 900), enq, deq, dropped)
        rows.append({**dict(zip(_ROLLOUT_COLS[2:9], values)), "_step": step})

    for k in steps:
        for _ in range(size):
            lag = min(rng.choice([0, 0, 1] + [2] * (max_lag == 2)), max_lag)
            enq = round(dequeue[k] - rng.uniform(0.5, period * (lag + 0.9)), 1)
            add(k - lag, expected[k], enq, dequeue[k], step=k)
    n_mm = rng.choice([1, 2, 2, 3]) if variant < 4 or rng.random() < 0.85 else 0
    late = [r for r in rows if r["_step"] >= upgrade]
    for r in rng.sample(late, min(n_mm, len(late))):  # оценены старой версией
        r["behavior_policy_version"] = min(r["behavior_policy_version"], r["_step"] - 1)
        r["verifier_version"] = old
    if rng.random() < 0.3:  # одна реплика верификатора обновилась раньше тренера
        rng.choice([r for r in rows if r["_step"] == upgrade - 1])["verifier_version"] = new
    for _ in range(rng.choice([1, 2])):  # отброшены как несвежие при извлечении
        k, lag = rng.choice(steps), max_lag + rng.choice([1, 2])
        enq = round(dequeue[k] - rng.uniform(period * lag, period * (lag + 0.8)), 1)
        add(k - lag, old if k <= upgrade else rng.choice([old, new]), enq, dequeue[k], True)
    for _ in range(rng.choice([1, 2])):  # готовы, но к концу прогона не извлечены
        add(last + rng.choice([0, 1]), new, round(dequeue[last] + rng.uniform(1, period), 1), None)
    if rng.random() < 0.5:  # ещё генерировался к концу прогона
        add(last + 1, None, None, None)
    rows.sort(key=lambda r: (r["enqueue_time"] is None, r["enqueue_time"] or 0.0))
    first_id = rng.randint(100, 700)
    prompts = [f"q{rng.randint(1000, 9999)}" for _ in range(len(rows) // 2 + 1)]
    for i, r in enumerate(rows):
        r["rollout_id"], r["prompt_id"] = f"r{first_id + i}", rng.choice(prompts)
        r["training_batch_id"] = None if r["_step"] is None else f"b{r['_step']:04d}"
    batches = []
    for k in steps:
        m = [r for r in rows if r["_step"] == k]
        row = (f"b{k:04d}", k, k, len(m), sum(r["tokens"] for r in m), [r["rollout_id"] for r in m])
        batches.append(dict(zip(_BATCH_COLS, (*row, True))))
    rollouts = [{c: r[c] for c in _ROLLOUT_COLS} for r in rows]
    steps = [dict(zip(_STEP_COLS, (k, k + 1, expected[k]))) for k in steps]
    horizon = round(dequeue[last] + period, 1)
    return dict(rollouts=rollouts, batches=batches, steps=steps, max_lag=max_lag, horizon_s=horizon)


def trace_tables(task: dict) -> tracing.TraceTables:  # prompts — по запросам роллаутов
    import pandas as pd

    rollouts = pd.DataFrame(task["rollouts"], columns=list(_ROLLOUT_COLS))
    rollouts["training_batch_id"] = rollouts["training_batch_id"].astype(object)
    counts = rollouts.groupby("prompt_id", sort=False).size()
    prompts = pd.DataFrame({"prompt_id": counts.index.astype(object), "n_rollouts": counts.values})
    batches = pd.DataFrame(task["batches"], columns=list(_BATCH_COLS))
    steps = pd.DataFrame(task["steps"], columns=list(_STEP_COLS))
    return tracing.TraceTables(prompts, rollouts, batches, steps, "12.5.8", task["horizon_s"])


def _trace_values(task: dict) -> dict:  # верные списки и списки ошибок в порядке rollouts
    return copy.deepcopy(_trace_values_cached(task))


@json_cached
def _trace_values_cached(task: dict) -> dict:
    tables = trace_tables(task)
    orphans, mism = tracing.find_orphans(tables), tracing.verifier_mismatches(tables)
    tv = {b["training_batch_id"]: b["trainer_policy_version"] for b in task["batches"]}
    last, bad = task["steps"][-1]["expected_verifier_version"], set(mism["rollout_id"])
    why, rows = dict(zip(orphans["rollout_id"], orphans["reason"])), task["rollouts"]
    tb, vv = "training_batch_id", "verifier_version"
    stale = {r["rollout_id"] for r in rows if r[tb] and r["behavior_policy_version"] != tv[r[tb]]}
    latest = [lambda r: r[tb], lambda r: True, lambda r: r[vv]]  # из пакетов, все, оценённые
    latest = [{r["rollout_id"] for r in rows if r[vv] != last and ok(r)} for ok in latest]

    def ids(keep: set) -> list[str]:  # в порядке таблицы rollouts
        return [r["rollout_id"] for r in rows if r["rollout_id"] in keep]

    mism = mism[["rollout_id", "optimizer_step", vv, "expected_verifier_version"]]
    return {
        "orphans": ids(why),
        "dropped_not_orphans": [ids({x for x, w in why.items() if w != "dropped"})],
        "why": {x: tracing.ORPHAN_REASONS[w] for x, w in why.items()},
        "verifier_mismatches": ids(bad),
        "mismatch_rows": mism.values.tolist(),
        "mismatch_all_versions": [ids(stale | bad), ids(stale)],
        "latest_verifier_everywhere": [ids(x) for x in latest],
    }


def _links_table(rows: list[dict], cols: tuple) -> str:
    def cell(x) -> str:  # None → «—», список — через запятую
        x = (", ".join(map(str, x)) or None) if isinstance(x, list) else x
        return "—" if x is None else f"{x:g}" if isinstance(x, float) else str(x)

    return md_table([f"`{c}`" for c in cols], [[cell(r[c]) for c in cols] for r in rows])


def _links_task(variant: int) -> dict:
    rng = random.Random(12_5_8_000 + 7919 * variant)
    while True:
        data = _trace_build(rng, variant)
        v = _trace_values(data)
        kept, stale, latest = (v[k] for k in _FIELD)
        ref, wrong = set(v["verifier_mismatches"]), [set(x) for x in stale + latest]
        found = kept[0] and kept[0] != v["orphans"] and wrong[1] and (ref or variant >= 4)
        if found and ref not in wrong and all(w not in wrong[2:] for w in wrong[:2]):
            break
    tables = "\n\n".join(f"**{k}**\n\n{_links_table(data[k], c)}" for k, c in _TABLES.items())
    statement = f"**Связки трасс.** Последние шаги асинхронного запуска: сборщики пишут роллауты в очередь, тренер собирает из неё пакеты (допустимая задержка политики — до {fmt.count(data['max_lag'], 'версии', 'версий', 'версий')}, более старые роллауты отбрасываются как несвежие); посреди прогона верификатор обновили. Таблицы трассы — `task_12_5_8['rollouts']`, `task_12_5_8['batches']` (пакет шага k собран при версии тренера k) и `task_12_5_8['steps']`; время — секунды от старта, «—» — нет значения:\n\n{tables}\n\nНайдите `orphans` — роллауты, не попавшие ни в один пакет (их работа не дошла до шага оптимизатора), и `verifier_mismatches` — роллауты из пакетов, чья версия верификатора не та, что ждал шаг их пакета (`expected_verifier_version`)."
    return {"statement": statement, **data}


def _links_solve(task: dict) -> dict:
    v = _trace_values(task)
    return {"orphans": v["orphans"], "verifier_mismatches": v["verifier_mismatches"]}


_CODE = "```python\nimport pandas as pd\nr, b, s = (pd.DataFrame(task_12_5_8[k]) for k in ('rollouts', 'batches', 'steps'))\nchain = r.merge(b[['training_batch_id', 'optimizer_step']], how='left').merge(s, how='left')\norphans = chain.loc[chain.training_batch_id.isna(), 'rollout_id']\nused = chain[chain.optimizer_step.notna()]\nbad = used.loc[used.verifier_version != used.expected_verifier_version, 'rollout_id']\n```"


def _links_solution(task: dict, ref: dict) -> str:
    v = _trace_values(task)
    mism = [[f"`{x}`", k, f"`{got}`", f"`{want}`"] for x, k, got, want in v["mismatch_rows"]]
    head = ["`rollout_id`", "шаг", "`verifier_version`", "ждал шаг"]
    stale = len(set(v["mismatch_all_versions"][1]) - set(ref["verifier_mismatches"]))
    why = "; ".join(f"`{x}` — {v['why'][x]}" for x in ref["orphans"])
    table = md_table(head, mism) if mism else "их нет."
    return f"Цепочка шага 12.5.2: роллаут → `training_batch_id` → пакет → `optimizer_step` → шаг; левое соединение сохраняет роллауты без пакета:\n\n{_CODE}\n\n**Осиротевшие** — без пакета по любой причине (как в `tracing.find_orphans`); отброшенные как несвежие — тоже: их генерация и проверка потрачены впустую. {why}.\n\n**Несовпадения** — с версией, которую ждал *шаг пакета* роллаута, а не последний шаг:\n\n{table}\n\n**Ответ:** `{ref}`.\n\nНесвежие по политике роллауты ({stale} шт.) — не ошибка верификатора: задержка в пределах допуска, это другая ось версий."


_MESSAGES = {
    "dropped_not_orphans": "Не учтены роллауты, отброшенные как несвежие. Отбросить их — законное правило очереди, но их генерация и проверка не дошли ни до одного шага оптимизатора: это тоже осиротевшие роллауты.",
    "mismatch_all_versions": "Вы отметили роллауты, чья версия политики поведения отличается от версии тренера. Это задержка политики (другая ось версий), а не ошибка верификатора: сравнивайте verifier_version с expected_verifier_version шага.",
    "latest_verifier_everywhere": "Вы сравнили все роллауты с последней версией верификатора. Каждый роллаут сверяется с версией, которую ждал шаг его пакета: пройдите цепочку роллаут → пакет → шаг.",
}
_FIELD = dict.fromkeys(_MESSAGES, "verifier_mismatches") | {"dropped_not_orphans": "orphans"}
_IDS = IdSet(lambda t: [r["rollout_id"] for r in t["rollouts"]], "идентификаторов rollout_id")
_ANSWER = Fields({"orphans": _IDS, "verifier_mismatches": _IDS})
_HINT = "Соедините rollouts с batches по training_batch_id и затем со steps по optimizer_step (левые соединения). Сироты — роллауты без пакета, по любой причине. Несовпадение — у роллаута из пакета verifier_version ≠ expected_verifier_version шага этого пакета (не последнего шага); версия политики здесь ни при чём."
_TRAPS = tuple(
    Trap(
        key,
        text,
        override={_FIELD[key]: lambda t, key=key: _trace_values(t)[key][0]},
        matches=lambda t, g, key=key: listed(g, _FIELD[key]) in map(set, _trace_values(t)[key]),
    )
    for key, text in _MESSAGES.items()
)
STEP = Step("12.5.8", _links_task, _links_solve, _ANSWER, _HINT, _links_solution, _TRAPS)
