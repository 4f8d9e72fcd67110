"""12.5.12 — выбор стеков по датированной карте под требования (stack_map.choose_stacks)."""

import datetime as dt
import functools
import json
import random
from dataclasses import dataclass
from typing import Any

from course_utils import stack_map
from course_utils.exercises.answers import IdSet, norm
from course_utils.exercises.step import Step, Trap

# требование → столбцы карты, которые нужны, чтобы его проверить
_REQ_COLUMNS = {"nodes": ("training_backends",), "lora": ("lora",), "multi_turn": ("multi_turn",),
                "asynchronous": ("synchrony", "placement_synchrony"),
                "lag_bound": ("staleness_control_key", "staleness_default"),
                "training_backend": ("training_backends",), "generation_engine": ("generation_engines",)}  # fmt: skip
_ONLY_LOOSE = "(засчитывается только с include_unconfirmed=True)"  # пометка choose_stacks


@functools.lru_cache(maxsize=1)
def _stack_frame():
    """Карта стеков из data/stack_map.csv (читается один раз; choose_stacks её не меняет)."""
    return stack_map.load_stack_map()


def _today() -> str:
    """Дата, на которую выбираем: самый свежий снимок карты (choose_stacks не берёт даты раньше)."""
    return max(_stack_frame()["snapshot_date"]).isoformat()


@functools.lru_cache(maxsize=256)
def _choice(req_json: str, today: str, loose: bool):
    return stack_map.choose_stacks(_stack_frame(), **json.loads(req_json), include_unconfirmed=loose,
                                   today=dt.date.fromisoformat(today))  # fmt: skip


def _stack_choice(task: dict, include_unconfirmed: bool = False):
    """Таблица choose_stacks для требований задачи (копия: кэш не портится)."""
    return _choice(
        json.dumps(task["requirements"], sort_keys=True), task["today"], include_unconfirmed
    ).copy()


def _matching(task: dict, include_unconfirmed: bool = False) -> list[str]:
    choice = _stack_choice(task, include_unconfirmed)
    return [s for s, ok in zip(choice["stack"], choice["matches"]) if ok]


def _fastest_stacks() -> list[str]:
    """Стеки с самым большим опубликованным ускорением: по верхней и по нижней границе."""
    speed = stack_map.load_speedups()
    return list(dict.fromkeys(str(speed.loc[speed[c].idxmax(), "stack"]) for c in ("speedup_high", "speedup_low")))  # fmt: skip


def _key(name: Any) -> Any:
    """Имя стека без регистра, пробелов, дефисов и кавычек: «NeMo-RL» = «nemo rl»."""
    return "".join(ch for ch in norm(name) if ch not in " -_`'\".") if isinstance(name, str) else name  # fmt: skip


@dataclass(frozen=True)
class _Stacks(IdSet):
    """Список имён стеков карты; написание имени (регистр, пробел или дефис) не важно."""

    def problem(self, given: Any, task: dict) -> str | None:
        known = {_key(s): s for s in self.universe(task)}
        if isinstance(given, (list, tuple, set, frozenset)):
            given = [known.get(_key(x), x) if isinstance(x, str) else x for x in given]
        return super().problem(given, task)

    def same(self, expected: Any, given: Any) -> bool:
        return {_key(x) for x in expected} == {_key(x) for x in given}


def _draw_requirements(rng: random.Random) -> dict:
    req = {"nodes": rng.choice([None, None, "one", "many"]), "lora": rng.choice([None, True, True]),
           "multi_turn": rng.choice([None, True]), "asynchronous": rng.choice([None, True, True, False]),
           "lag_bound": None, "training_backend": rng.choice([None, None, "FSDP2", "Megatron", "DeepSpeed"]),
           "generation_engine": rng.choice([None, None, "vLLM", "SGLang"])}  # fmt: skip
    if req["asynchronous"] and rng.random() < 0.6:
        req["lag_bound"] = True
    return {k: v for k, v in req.items() if v is not None}


def _describe_requirements(req: dict) -> list[str]:
    out = []
    if req.get("nodes") == "one":
        out.append('один узел (8 GPU): `nodes="one"`')
    if req.get("nodes") == "many":
        out.append('несколько узлов (4 узла по 8 GPU): `nodes="many"`')
    if req.get("lora"):
        out.append("обучаются только LoRA-адаптеры: `lora=True`")
    if req.get("multi_turn"):
        out.append("многоходовые роллауты с инструментами: `multi_turn=True`")
    if req.get("asynchronous") is True:
        out.append("асинхронное обучение (режим `async`; «на шаг позади» — его вариант с "
                   "задержкой ровно 1, тоже подходит): `asynchronous=True`")  # fmt: skip
    if req.get("asynchronous") is False:
        out.append("строго синхронное обучение (`sync`): `asynchronous=False`")
    if req.get("lag_bound"):
        out.append("явное ограничение задержки политики ключом конфигурации: `lag_bound=True`")
    if req.get("training_backend"):
        out.append(f"бэкенд обучения {req['training_backend']}: "
                   f"`training_backend=\"{req['training_backend']}\"`")  # fmt: skip
    if req.get("generation_engine"):
        out.append(f"движок генерации {req['generation_engine']}: "
                   f"`generation_engine=\"{req['generation_engine']}\"`")  # fmt: skip
    return out


def _map_cell(x: Any) -> str:
    text = (", ".join(map(str, x)) or "—") if isinstance(x, list) else x.isoformat() if isinstance(x, dt.date) else str(x)  # fmt: skip
    return text.replace("|", "\\|")


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_12_000 + 7919 * variant)
    today, fastest = _today(), _fastest_stacks()
    while True:
        req = _draw_requirements(rng)
        if len(req) < 3:
            continue
        task = {"requirements": req, "today": today}
        ref, unc = _matching(task), _matching(task, True)
        if not ref:
            continue
        if set(ref) != set(unc) and set(ref) != {fastest[0]}:  # обе ошибки меняют ответ
            break
    frame = _stack_frame()
    cols = ["stack"] + list(
        dict.fromkeys(c for k in req for c in _REQ_COLUMNS[k])
    ) + ["unconfirmed", "snapshot_date"]  # fmt: skip
    head = f"| {' | '.join(f'`{c}`' for c in cols)} |\n|{'---|' * len(cols)}\n"
    table = head + "\n".join(
        "| " + " | ".join(_map_cell(row[c]) for c in cols) + " |" for _, row in frame.iterrows()
    )
    rules = [
        "требование выполнено, только если это **подтверждённый** факт карты: элемент списка с "
        "«?» на конце, столбец, названный в `unconfirmed`, и ячейка `unconfirmed` не "
        "подтверждены;",
        "LoRA и многоходовые роллауты — ячейка `lora` / `multi_turn` начинается с "
        f"«{stack_map.SUPPORTED_PREFIX}»;",
        "асинхронность — `async` в столбце `synchrony`; синхронность — `sync`; сочетания с "
        "размещением — в `placement_synchrony`;",
        "ограничение задержки — у стека есть ключ `staleness_control_key` (не `n/a`); если не "
        "подтверждено только его значение по умолчанию, это пометка, а не отказ;",
        "бэкенд и движок — подстрока (без учёта регистра) в элементе `training_backends` / "
        "`generation_engines` без «?»;",
    ]
    if req.get("nodes") == "many":
        evidence = "; ".join(
            f"{s} — {'подтверждён' if ok else 'не подтверждён'} ({note})"
            for s, (ok, note) in stack_map.MULTI_NODE_EVIDENCE.items()
        )
        rules.append(
            "несколько узлов — подтверждением считается только опубликованный авторами запуск "
            f"на нескольких узлах: {evidence}. У остальных стеков шардирующий бэкенд обучения "
            f"({', '.join(stack_map.SHARDED_BACKENDS)}) — лишь вывод курса, не факт;"
        )
    elif req.get("nodes") == "one":
        rules.append("один узел — ни один стек карты не требует нескольких узлов;")
    limits = [lim for lim in stack_map.STACK_LIMITS if set(lim.requirements) <= set(req)]
    if limits:
        rules.append(
            "известные ограничения **сочетаний** (`stack_map.STACK_LIMITS`; `fails` — не "
            "работает, `unconfirmed` — не подтверждено):\n"
            + "\n".join(f"    - {lim.stack} [`{lim.kind}`]: {lim.message};" for lim in limits)
        )
    needs = "\n".join(f"- {x};" for x in _describe_requirements(req))
    statement = (
        "**Выбор стека по требованиям.** Команда выбирает стек для нового RL-запуска. "
        f"Требования:\n\n{needs}\n\nДатированная карта стеков шага 12.5.4 "
        "(`stack_map.load_stack_map()`, файл `data/stack_map.csv`; нужные столбцы; дата "
        f"выбора — {today}):\n\n{table}\n\n"
        "Правила:\n\n" + "\n".join(f"- {r}" for r in rules) + "\n\n"
        "Найдите все стеки, которые удовлетворяют **всем** требованиям **подтверждёнными** "
        "фактами карты. Ответ — список имён стеков (порядок не важен), например "
        "`[\"TRL\", \"AReaL\"]`. Требования — `task_12_5_12['requirements']`, дата — `task_12_5_12['today']`; "
        "сверить себя после проверки можно с `stack_map.choose_stacks(frame, "
        "**task_12_5_12['requirements'], today=datetime.date.fromisoformat(task_12_5_12['today']))`."
    )
    return {"statement": statement, "requirements": req, "today": today}


def solution(task: dict, ref: list) -> str:
    strict, loose = _stack_choice(task), _stack_choice(task, True)
    loose_ok = dict(zip(loose["stack"], loose["matches"]))
    rows = []
    for _, r in strict.iterrows():
        verdict = "**да**" if r["matches"] else (
            "нет (только с неподтверждёнными фактами)" if loose_ok[r["stack"]] else "нет"
        )  # fmt: skip
        failed = "; ".join(x for x in r["failed"] if not x.endswith(_ONLY_LOOSE)) or "—"
        notes = "; ".join(r["unconfirmed"]) or "—"
        rows.append(
            f"| {r['stack']} | {verdict} | {_map_cell(failed)} | {_map_cell(notes)} | "
            f"{r['snapshot_date'].isoformat()} ({r['age_days']} дн.) |"
        )
    speed = stack_map.load_speedups()
    top = speed.loc[speed["speedup_high"].idxmax()]
    req = ", ".join(
        f"{k}={v}" if isinstance(v, bool) else f'{k}="{v}"' for k, v in task["requirements"].items()
    )
    day = dt.date.fromisoformat(task["today"])
    extra = sorted(set(_matching(task, True)) - set(ref))
    unconf = (
        f"С неподтверждёнными фактами подошли бы ещё: {', '.join(extra)} — но неподтверждённая "
        "ячейка — повод проверить документацию и код своей версии стека, а не основание для "
        "выбора."
        if extra
        else "Неподтверждённые ячейки в этом варианте ничего не добавляют."
    )
    return (
        "Идём по требованиям, а не по таблице «кто быстрее»: для каждого стека проверяем каждое "
        "требование по подтверждённым ячейкам карты и затем известные ограничения сочетаний "
        f"(`stack_map.choose_stacks(frame, {req}, today=date({day.year}, {day.month}, "
        f"{day.day}))`):\n\n"
        "| стек | подходит | что не выполнено | неподтверждённое | снимок (возраст) |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"**Ответ:** `{json.dumps(ref, ensure_ascii=False)}`.\n\n"
        f"{unconf}\n\n"
        f"Самое большое опубликованное ускорение в `data/stack_speedups.csv` — "
        f"{top['speedup_high']:g}× у {top['stack']} ({top['claim']}; база — {top['baseline']}). "
        "Это заявление авторов для их протокола, модели и кластера, а не свойство стека и не "
        "гарантия для вашей задачи: выбор начинается с требований, а сравнивать кандидатов "
        "нужно на своей задаче и в одних единицах стоимости. Карта датирована: перед запуском "
        "перепроверьте документацию конкретной версии."
    )


def solve(task: dict) -> list[str]:
    return _matching(task)


def _fastest_matches(task: dict, given: Any) -> bool:
    g = {_key(x) for x in given}
    return g != {_key(s) for s in solve(task)} and g in [{_key(s)} for s in _fastest_stacks()]


def _unconfirmed_matches(task: dict, given: Any) -> bool:
    g = {_key(x) for x in given}
    return {_key(s) for s in solve(task)} < g <= {_key(s) for s in _matching(task, True)}


STEP = Step(
    id="12.5.12", make_task=make_task, solve=solve, solution=solution,
    answer=_Stacks(lambda t: list(_stack_frame()["stack"]), "имён стеков", repeats=True),
    hint=(
        "Пройдите по стекам и по каждому требованию: ячейка или элемент списка должны "
        "подтверждать его без «?» и без пометки в столбце unconfirmed. Затем проверьте "
        "ограничения сочетаний (STACK_LIMITS). Опубликованные ускорения в выборе не "
        "участвуют."
    ),
    traps=(
        Trap("fastest_number", "Вы выбрали стек по самому большому опубликованному ускорению. Это заявление "
             "авторов для их конфигурации, модели и кластера, а не свойство стека: выбор "
             "начинается с требований (узлы, LoRA, многоходовость, синхронность и задержка, "
             "бэкенд, движок), а скорость сравнивают на своей задаче.",
             wrong=lambda t, ref: _fastest_stacks()[:1], matches=_fastest_matches),
        Trap("unconfirmed_as_fact", "Вы засчитали требования, выполненные только неподтверждёнными фактами карты "
             "(значения с «?», столбцы из unconfirmed). Неподтверждённое — повод проверить "
             "документацию и код своей версии, а не основание для выбора.",
             wrong=lambda t, ref: _matching(t, True), matches=_unconfirmed_matches),
    ),
)  # fmt: skip
