"""12.5.6 — каких нужных компонентов (``checkpoint.COMPONENTS``) не хватает манифесту."""

import random

from course_utils import fmt, memory
from course_utils.checkpoint import COMPONENTS
from course_utils.exercises.answers import Bool, Fields, IdSet, md_table, sig
from course_utils.exercises.common import has_state, listed
from course_utils.exercises.step import Step, Trap

_RNG_CURSOR, _BIG = ("rng", "data_cursor"), ("policy", "optimizer")
_WHY_NA = {"curriculum": "учебной программы нет", "normalizer": "нормировка только внутри группы"}
_MODELS = ("SmolLM2-360M", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")
_LOW = (20_000, 2_000, 900, 120, 2_500, 180, 400, 90, 900, 0)  # добавка к файлу, Б: от и до
_HIGH = (90_000, 9_000, 2_400, 380, 3_000, 700, 2_000, 260, 3_200, 5_000)  # по COMPONENTS
_TAIL = dict(zip(COMPONENTS, zip(_LOW, _HIGH)))
_UNITS = ((30, "ГиБ"), (20, "МиБ"), (10, "КиБ"))
_SCALE = ("преимущества нормируются внутри группы", "награды нормирует скользящая статистика")


def _binary_size(n: float) -> str:  # 1 КиБ = 2¹⁰ Б, 1 МиБ = 2²⁰ Б, 1 ГиБ = 2³⁰ Б
    return next((f"{n / 2**p:.2f} {u}" for p, u in _UNITS if n >= 2**p), f"{int(n)} Б")


def _manifest_task(variant: int) -> dict:
    rng = random.Random(12_5_6_000 + 7919 * variant)
    model = _MODELS[(variant + rng.randrange(5)) % 5]
    cur, welford = [(True, False), (False, True), (False, False)][(variant + rng.randrange(3)) % 3]
    n = memory.ModelShape.from_name(model).num_params
    run = {"model": model, "num_params": n, "world_size": rng.choice([1, 2, 4, 8])}
    run.update(step=rng.randint(200, 6000), asynchronous=True, curriculum=cur)
    run.update(running_reward_norm=welford, collectors=rng.choice([2, 4, 8]))
    run.update(max_lag=rng.choice([1, 2, 3]), queued=rng.randint(12, 64), level=rng.randint(2, 5))
    lost = rng.choice([["rng"], ["data_cursor"], list(_RNG_CURSOR)])
    rest = [c for c in COMPONENTS if has_state(c, run) and c not in (*_BIG, "queue", *_RNG_CURSOR)]
    missing = ["queue", *lost, *rng.sample(rest, rng.choice([0, 1, 1, 2]))]
    # веса bf16 — 2 Б на параметр, AdamW (m, v, fp32-копия) — 12 Б; генераторы — на каждый GPU
    base = {"policy": 2 * n, "optimizer": 12 * n, "rng": 6_000 * run["world_size"]}
    base["queue"] = 20_000 * run["queued"]
    kept = [c for c in COMPONENTS if has_state(c, run) and c not in missing]
    manifest = [
        {"component": c, "file": f"{c}.{'json' if c not in _BIG else 'safetensors'}", "bytes": b}
        for c, b in zip(kept, [base.get(c, 0) + rng.randint(*_TAIL[c]) for c in kept])
    ]
    rng.shuffle(manifest)
    rows = [[f"`{e['file']}`", f"`{e['component']}`", e["bytes"]] for e in manifest]
    total = sum(e["bytes"] for e in manifest)
    rows = [[a, b, sig(x), _binary_size(x)] for a, b, x in [*rows, ["**итого**", "", total]]]
    world = "одном GPU" if run["world_size"] == 1 else f"{run['world_size']} GPU"
    level = f"Уровень учебной программы — {run['level']} из 6 (растёт при доле верных > 0.8)"
    parts = ";\n".join(f"- `{c}` — {b}" for c, (_, b) in COMPONENTS.items())
    statement = (
        f"**Манифест контрольной точки.** GRPO-запуск {model} ({sig(n)} параметров, веса bf16), AdamW, косинусный планировщик скорости обучения с прогревом, обучение на {world}; награду ставит верификатор с версией. Запуск асинхронный: сборщиков — {run['collectors']}, задержка политики — до {fmt.count(run['max_lag'], 'версии', 'версий', 'версий')}, при записи в очереди ждали роллауты прошлых версий ({run['queued']} шт.). {level if cur else 'Учебной программы нет'}; {_SCALE[welford]}.\n\nМанифест точки `step-{run['step']:06d}` (`task_12_5_6['manifest']`; 1 КиБ = 2¹⁰ Б, 1 ГиБ = 2³⁰ Б):\n\n{md_table(['файл', 'компонент', 'байт', 'размер'], rows)}\n\n"
        f"Компоненты RL-запуска и что ломается без каждого (`task_12_5_6['components']`):\n\n{parts}.\n\nКомпонент **нужен**, если без него продолжение — уже другой эксперимент; состояние, которого у запуска нет, не сохраняют. Найдите `missing` — нужные компоненты, которых нет в манифесте, и `can_resume` — можно ли с этой точкой честно продолжить запуск."
    )
    return dict(statement=statement, run=run, manifest=manifest, components=list(COMPONENTS))


def _absent_components(task: dict) -> list[str]:  # нет в манифесте: нужные и неприменимые
    return [c for c in COMPONENTS if c not in {e["component"] for e in task["manifest"]}]


def _manifest_solve(task: dict) -> dict:
    missing = [c for c in _absent_components(task) if has_state(c, task["run"])]
    return {"missing": missing, "can_resume": not missing}


def _needed(task: dict) -> list[str]:
    return _manifest_solve(task)["missing"]


def _without(dropped: tuple[str, ...]) -> dict:
    """Ловушка «не включил dropped»: верный список без них (узнаётся и без одного из них)."""

    def matches(task: dict, given: dict) -> bool:
        need, got, drop = set(_needed(task)), listed(given, "missing"), set(dropped)
        return bool(need & drop - got) and need - drop <= got <= set(_absent_components(task))

    def keep(task: dict) -> list[str]:
        return [c for c in _needed(task) if c not in dropped]

    return {"matches": matches, "override": {"missing": keep}}


def _extra_na(task: dict, given: dict) -> bool:  # все нужные и хоть один, которого у запуска нет
    need, got = set(_needed(task)), listed(given, "missing")
    return bool(got & set(_absent_components(task)) - need) and need <= got


def _manifest_solution(task: dict, ref: dict) -> str:
    run, have = task["run"], {e["component"]: e["bytes"] for e in task["manifest"]}
    rows = [[f"`{c}`", f"есть, {_binary_size(b)}"] for c, b in have.items()]
    rows += [[f"`{c}`", f"**не хватает**: {COMPONENTS[c][1]}"] for c in ref["missing"]]
    rows += [[f"`{c}`", f"не нужен: {_WHY_NA[c]}"] for c in _WHY_NA if not has_state(c, run)]
    big = have["policy"] + have["optimizer"]
    return (
        f"Для каждого компонента: есть ли он в манифесте и есть ли у запуска такое состояние.\n\n{md_table(['компонент', 'вывод'], rows)}\n\n"
        f"**Ответ:** `{ref}`.\n\nВеса и оптимизатор — {_binary_size(big)}, остальное — {_binary_size(sum(have.values()) - big)}, но без килобайтных файлов (шаг, генераторы, курсор, версии) ветвь расходится с непрерывной сразу (шаг 12.5.3). Очередь (роллаутов прошлых версий: {run['queued']}) сохраняют с версиями поведения или отбрасывают по правилу, записанному в точку."
    )


_MESSAGES = {
    "list_right_verdict_wrong": "Список недостающих компонентов верный, а can_resume ему противоречит: без нужного компонента продолжение — уже другой эксперимент.",
    "weights_only_resume": "Веса и оптимизатор на месте, но это восстановление «только весов»: без шага, генераторов, курсора данных, версий и очереди ветвь расходится с непрерывной сразу.",
    "rng_not_needed": "Пропущены генераторы случайных чисел и/или курсор данных: они весят килобайты, но без них другие сэмплы, другой порядок мини-пакетов и повторённые запросы.",
    "queue_irrelevant": "Пропущена очередь: в асинхронном запуске в ней лежат роллауты прошлых версий — их сохраняют с версиями поведения или отбрасывают по объявленному правилу.",
    "not_applicable_listed": "В списке есть компонент, состояния которого у этого запуска нет (учебная программа или скользящая нормировка): сохраняют то состояние, которое есть.",
    "present_listed": "В списке есть компонент, который в манифесте уже есть: missing — только то, чего в манифесте нет.",
}
_NONE = {"missing": lambda t: [], "can_resume": lambda t: True}
_RULES = {  # ответ с ошибкой (override верного) и как её узнать
    "list_right_verdict_wrong": {"override": {**_NONE, "missing": _needed}},
    "weights_only_resume": {"override": _NONE, "by": tuple(_NONE)},
    "rng_not_needed": _without(_RNG_CURSOR),
    "queue_irrelevant": _without(("queue",)),
    "not_applicable_listed": {"override": {"missing": _absent_components}, "matches": _extra_na},
    "present_listed": {
        "override": {"missing": lambda t: [*_needed(t), "policy"]},
        "matches": lambda t, g: bool(listed(g, "missing") - set(_absent_components(t))),
    },
}
_ANSWER = Fields({"missing": IdSet(lambda t: COMPONENTS, "компонентов"), "can_resume": Bool()})
_HINT = "Для каждого компонента, которого нет в манифесте, спросите, есть ли у этого запуска такое состояние (учебная программа и скользящая нормировка — только если описаны). Размер файла не важен: генераторы и курсор данных весят килобайты."
_TRAPS = tuple(Trap(key, text, **_RULES[key]) for key, text in _MESSAGES.items())
STEP = Step("12.5.6", _manifest_task, _manifest_solve, _ANSWER, _HINT, _manifest_solution, _TRAPS)
