"""12.5.8 — связки трасс: осиротевшие роллауты и несовпадения версии верификатора."""

import copy
import functools
import json
import random
from collections.abc import Iterable
from typing import Any

from course_utils import tracing
from course_utils.exercises.answers import Fields, md_table, norm
from course_utils.exercises.lesson_12_5.manifest_gaps import Names, names
from course_utils.exercises.step import Step, Trap

ROLLOUT_COLS = ("rollout_id", "prompt_id", "behavior_policy_version", "verifier_version",
                "reward", "tokens", "enqueue_time", "dequeue_time", "dropped", "training_batch_id")  # fmt: skip
BATCH_COLS = ("training_batch_id", "optimizer_step", "trainer_policy_version", "n_rollouts",
              "tokens", "rollout_ids", "complete")  # fmt: skip
STEP_COLS = ("optimizer_step", "resulting_policy_version", "expected_verifier_version")


def _build(rng: random.Random, variant: int) -> dict:
    """Таблицы трассы асинхронного запуска; верификатор обновлён с шага ``upgrade``.

    Шаг k собирает пакет при версии тренера k. Роллаут, оценённый старой версией и долежавший в
    очереди до шага ≥ upgrade, — несовпадение; несвежий (задержка ≥ 1) — не ошибка; отброшенные,
    не извлечённые и ещё генерировавшиеся — осиротевшие.
    """
    k0, n_steps = rng.randint(10, 60), rng.choice([3, 4])
    steps = list(range(k0, k0 + n_steps))
    upgrade, base = rng.choice(steps[1:]), rng.randint(2, 6)
    old, new = f"verifier-{base}", f"verifier-{base + 1}"
    expected = {k: new if k >= upgrade else old for k in steps}
    max_lag, size, period = rng.choice([1, 2]), rng.choice([4, 5]), rng.uniform(25, 45)
    t0 = period * rng.uniform(5.0, 6.0)  # в таблицах — последние шаги прогона, не первые
    dequeue, last, rows = {k: round(t0 + (k - k0) * period, 1) for k in steps}, steps[-1], []

    def add(version, verifier, enq, deq, dropped=False, step=None) -> None:
        rows.append({"behavior_policy_version": version, "verifier_version": verifier,
                     "reward": None if verifier is None else float(rng.random() < 0.5), "tokens": rng.randint(40, 900),
                     "enqueue_time": enq, "dequeue_time": deq, "dropped": dropped, "_step": step})  # fmt: skip

    for k in steps:
        for _ in range(size):
            lag = min(rng.choice([0, 0, 1] + [2] * (max_lag == 2)), max_lag)
            add(k - lag, expected[k], round(dequeue[k] - rng.uniform(0.5, period * (lag + 0.9)), 1), dequeue[k], step=k)  # fmt: skip
    n_mm = rng.choice([1, 2, 2, 3]) if variant < 4 or rng.random() < 0.85 else 0
    for r in rng.sample(late := [r for r in rows if r["_step"] >= upgrade], min(n_mm, len(late))):
        r["behavior_policy_version"], r["verifier_version"] = (
            min(r["behavior_policy_version"], r["_step"] - 1),
            old,
        )
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
    batches = [{"training_batch_id": f"b{k:04d}", "optimizer_step": k, "trainer_policy_version": k,
                "n_rollouts": len(m := [r for r in rows if r["_step"] == k]), "tokens": sum(r["tokens"] for r in m),
                "rollout_ids": [r["rollout_id"] for r in m], "complete": True} for k in steps]  # fmt: skip
    return {"rollouts": [{c: r[c] for c in ROLLOUT_COLS} for r in rows], "batches": batches,
            "steps": [{"optimizer_step": k, "resulting_policy_version": k + 1, "expected_verifier_version": expected[k]}
                      for k in steps], "max_lag": max_lag, "horizon_s": round(dequeue[last] + period, 1)}  # fmt: skip


def trace_tables(task: dict) -> tracing.TraceTables:
    """TraceTables (pandas) из списков словарей условия; prompts — по запросам роллаутов."""
    import pandas as pd

    rollouts = pd.DataFrame(task["rollouts"], columns=list(ROLLOUT_COLS))
    rollouts["training_batch_id"] = rollouts["training_batch_id"].astype(object)
    counts = rollouts.groupby("prompt_id", sort=False).size()
    prompts = pd.DataFrame({"prompt_id": counts.index.astype(object), "n_rollouts": counts.values})
    return tracing.TraceTables(prompts, rollouts, pd.DataFrame(task["batches"], columns=list(BATCH_COLS)),
                               pd.DataFrame(task["steps"], columns=list(STEP_COLS)),
                               source="12.5.8", horizon_s=task["horizon_s"])  # fmt: skip


def values(task: dict) -> dict:
    """Верные списки (через tracing) и списки типичных ошибок в порядке rollouts (кэш по данным)."""
    key = json.dumps({k: task[k] for k in ("rollouts", "batches", "steps", "horizon_s")})
    return copy.deepcopy(_values(key))


@functools.lru_cache(maxsize=64)
def _values(key: str) -> dict:
    task = json.loads(key)
    tables = trace_tables(task)
    orphans, mism = tracing.find_orphans(tables), tracing.verifier_mismatches(tables)
    trainer = {b["training_batch_id"]: b["trainer_policy_version"] for b in task["batches"]}
    last, bad = task["steps"][-1]["expected_verifier_version"], set(mism["rollout_id"])
    reasons = dict(zip(orphans["rollout_id"], orphans["reason"]))

    def ids(keep) -> list[str]:  # в порядке таблицы rollouts
        return [r["rollout_id"] for r in task["rollouts"] if keep(r)]

    stale = set(ids(lambda r: r["training_batch_id"] and r["behavior_policy_version"] != trainer[r["training_batch_id"]]))  # fmt: skip
    return {"orphans": ids(lambda r: r["rollout_id"] in reasons), "reasons": reasons, "last_expected": last,
            "dropped": ids(lambda r: reasons.get(r["rollout_id"]) == "dropped"),
            "verifier_mismatches": ids(lambda r: r["rollout_id"] in bad),
            "mismatch_rows": mism[["rollout_id", "optimizer_step", "verifier_version", "expected_verifier_version"]].to_dict("records"),
            "stale": ids(lambda r: r["rollout_id"] in stale), "stale_or_verifier": ids(lambda r: r["rollout_id"] in stale | bad),
            "latest_variants": [ids(lambda r: r["training_batch_id"] and r["verifier_version"] != last),  # только из пакетов,
                                ids(lambda r: r["verifier_version"] != last),  # все роллауты,
                                ids(lambda r: r["verifier_version"] not in (None, last))]}  # все оценённые  # fmt: skip


def _cell(x: Any) -> str:
    """Ячейка таблицы: None → «—», число с плавающей точкой — через :g, список — через запятую."""
    if isinstance(x, (list, tuple)):
        return ", ".join(map(str, x)) or "—"
    return "—" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def _table(rows: list[dict], cols: Iterable[str]) -> str:
    return md_table([f"`{c}`" for c in cols], [[_cell(r[c]) for c in cols] for r in rows])


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_8_000 + 7919 * variant)
    while True:
        data = _build(rng, variant)
        v = values(data)
        ref_vm, latest = set(v["verifier_mismatches"]), [set(x) for x in v["latest_variants"]]
        if (v["dropped"] and set(v["orphans"]) - set(v["dropped"]) and v["stale"] and (ref_vm or variant >= 4)
                and all(w != ref_vm for w in [set(v["stale"]), set(v["stale_or_verifier"]), *latest])
                and set(v["stale_or_verifier"]) not in latest and set(v["stale"]) not in latest):  # fmt: skip
            break
    statement = (
        "**Связки трасс.** Последние шаги асинхронного запуска: сборщики пишут роллауты в очередь, тренер "
        f"собирает из неё пакеты (допустимая задержка политики — до {data['max_lag']} версий; более старые "
        "роллауты при извлечении отбрасываются как несвежие). Посреди прогона проверяющую систему обновили. Три "
        "таблицы трассы с идентификаторами цепочки шага 12.5.2 (они же — `task_12_5_8['rollouts']`, "
        "`task_12_5_8['batches']`, `task_12_5_8['steps']`; удобно `pd.DataFrame(task_12_5_8['rollouts'])`; "
        f"время — секунды от старта, «—» — нет значения):\n\n**rollouts**\n\n{_table(data['rollouts'], ROLLOUT_COLS)}"
        "\n\n**batches** (журнал тренера; пакет шага k собран при версии тренера k)\n\n"
        f"{_table(data['batches'], BATCH_COLS)}\n\n**steps**\n\n{_table(data['steps'], STEP_COLS)}\n\n"
        "Соедините таблицы (роллаут → пакет → шаг оптимизатора) и найдите:\n1. `orphans` — осиротевшие "
        "роллауты: сгенерированы (или ещё генерировались), но не попали ни в один обучающий пакет, так что их "
        "работа не дошла ни до одного шага оптимизатора;\n2. `verifier_mismatches` — роллауты, попавшие в "
        "пакет, чья версия верификатора не та, которую ждал шаг оптимизатора этого пакета "
        '(`expected_verifier_version`).\n\nОтвет — словарь `{"orphans": [...], "verifier_mismatches": [...]}` '
        "со списками `rollout_id` (строки, порядок не важен; `[]`, если таких нет). Сверить себя после "
        "проверки можно с `tracing.find_orphans` и `tracing.verifier_mismatches`."
    )  # fmt: skip
    return {"statement": statement, **data}


def solve(task: dict) -> dict:
    v = values(task)
    return {"orphans": v["orphans"], "verifier_mismatches": v["verifier_mismatches"]}


def _one_of(given: dict, options: list) -> bool:
    return names(given, "verifier_mismatches") in [{norm(x) for x in o} for o in options]


def solution(task: dict, ref: dict) -> str:
    v, by_id = values(task), {r["rollout_id"]: r for r in task["rollouts"]}
    orphan_rows = [[f"`{rid}`", _cell(by_id[rid]["enqueue_time"]), _cell(by_id[rid]["dequeue_time"]),
                    _cell(by_id[rid]["dropped"]), tracing.ORPHAN_REASONS[v["reasons"][rid]]]
                   for rid in v["orphans"]]  # fmt: skip
    mm_rows = [[f"`{m['rollout_id']}`", m["optimizer_step"], f"`{m['verifier_version']}`",
                f"`{m['expected_verifier_version']}`"] for m in v["mismatch_rows"]]  # fmt: skip
    mm_table = (md_table(["`rollout_id`", "шаг", "`verifier_version`", "ждал шаг"], mm_rows) if mm_rows
                else "Таких роллаутов нет: каждый пакет оценён той версией, которую ждал его шаг.")  # fmt: skip
    code = (
        "```python\nimport pandas as pd\n"
        "r, b, s = (pd.DataFrame(task_12_5_8[k]) for k in ('rollouts', 'batches', 'steps'))\n"
        "chain = (r.merge(b.drop(columns=['rollout_ids', 'tokens']), on='training_batch_id', "
        "how='left')\n         .merge(s, on='optimizer_step', how='left'))\n"
        "orphans = chain.loc[chain.training_batch_id.isna(), 'rollout_id']\n"
        "used = chain[chain.optimizer_step.notna()]\n"
        "bad = used.loc[used.verifier_version != used.expected_verifier_version, 'rollout_id']\n"
        "```"
    )
    stale_only = [x for x in v["stale"] if x not in set(v["verifier_mismatches"])]
    up, old = next((s["optimizer_step"], p["expected_verifier_version"]) for p, s in zip(task["steps"], task["steps"][1:])
                   if s["expected_verifier_version"] != p["expected_verifier_version"])  # шаг обновления верификатора  # fmt: skip
    return (
        "Цепочка шага 12.5.2: роллаут → `training_batch_id` → пакет → `optimizer_step` → шаг (и его "
        f"`expected_verifier_version`). Левое соединение сохраняет роллауты без пакета:\n\n{code}\n\n"
        "**Осиротевшие** — `training_batch_id` пуст, по любой причине (так считает `tracing.find_orphans`):\n\n"
        + md_table(["`rollout_id`", "`enqueue_time`", "`dequeue_time`", "`dropped`", "причина"], orphan_rows)
        + "\n\nОтброшенные как несвежие — тоже сироты: генерация и проверка потрачены, а ни до одного "
        "обновления работа не дошла. Отбрасывание — законное правило очереди, но его нужно считать (лекция: "
        "«число потерянных роллаутов»).\n\n**Несовпадения версии верификатора** — сверяем с версией, которую "
        f"ждал *шаг этого пакета* (шаги до {up} ждут `{old}`, с шага {up} — `{v['last_expected']}`):\n\n{mm_table}"
        f"\n\n**Ответ:** `{ref}`.\n\nНе ошибки верификатора: несвежие по политике роллауты ({len(stale_only)} "
        f"шт., например {', '.join(f'`{x}`' for x in stale_only[:3]) or '—'}) — задержка политики в пределах "
        "допуска, это другая ось версий; роллауты без пакета в обновление не попали, их версии верификатора ни "
        "на что не повлияли."
    )  # fmt: skip


_IDS = Names(lambda t: [r["rollout_id"] for r in t["rollouts"]], "идентификаторов rollout_id")
STEP = Step(
    id="12.5.8", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({"orphans": _IDS, "verifier_mismatches": _IDS}),
    hint="Соедините rollouts с batches по training_batch_id и затем со steps по optimizer_step (левые "
    "соединения). Сироты — роллауты без пакета, по любой причине. Несовпадение — у роллаута из пакета "
    "verifier_version ≠ expected_verifier_version шага этого пакета (не последнего шага); версия политики "
    "здесь ни при чём.",
    traps=(
        Trap("dropped_not_orphans", "Вы не посчитали роллауты, отброшенные как несвежие. Отбрасывание — законное "
             "правило очереди, но работа генерации и проверки потеряна и ни до одного шага оптимизатора не дошла: "
             "это тоже осиротевшие роллауты, их число — метрика надёжности.",
             override={"orphans": lambda t: [x for x in values(t)["orphans"] if x not in values(t)["dropped"]]}),
        Trap("mismatch_all_versions", "Вы отметили роллауты, чья версия политики поведения отличается от версии "
             "тренера. Это задержка политики (другая ось версий, она в пределах допуска), а не ошибка проверяющей "
             "системы: сравнивайте verifier_version с expected_verifier_version шага.",
             override={"verifier_mismatches": lambda t: values(t)["stale_or_verifier"]},
             matches=lambda t, g: _one_of(g, [values(t)["stale_or_verifier"], values(t)["stale"]])),
        Trap("latest_verifier_everywhere", "Вы сравнили все роллауты с последней версией верификатора. Каждый "
             "роллаут сверяется с версией, которую ждал шаг его пакета: пройдите цепочку роллаут → пакет → шаг, а не "
             "берите одну версию на весь прогон.", override={"verifier_mismatches": lambda t: values(t)["latest_variants"][0]},
             matches=lambda t, g: _one_of(g, values(t)["latest_variants"])),
    ),
)  # fmt: skip
