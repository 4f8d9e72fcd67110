"""12.5.12 — выбор стеков по датированной карте под требования (stack_map.choose_stacks)."""

import datetime as dt
import functools
import json
import random
from dataclasses import dataclass
from typing import Any

from course_utils import stack_map
from course_utils.exercises.answers import IdSet, md_table, norm
from course_utils.exercises.common import json_cached
from course_utils.exercises.step import Step, Trap

_REQS = {  # требование → (варианты в генераторе; столбцы карты, по которым оно проверяется)
    "nodes": ([None, None, "one", "many"], ("training_backends",)),
    "lora": ([None, True, True], ("lora",)),
    "multi_turn": ([None, True], ("multi_turn",)),
    "asynchronous": ([None, True, True, False], ("synchrony", "placement_synchrony")),
    "lag_bound": ([], ("staleness_control_key", "staleness_default")),
    "training_backend": ([None, None, "FSDP2", "Megatron", "DeepSpeed"], ("training_backends",)),
    "generation_engine": ([None, None, "vLLM", "SGLang"], ("generation_engines",)),
}
_REQ_TEXT = {
    "nodes": {"one": "один узел (8 GPU)", "many": "несколько узлов (4 узла по 8 GPU)"},
    "lora": "обучаются только LoRA-адаптеры",
    "multi_turn": "многоходовые роллауты с инструментами",
    "asynchronous": {
        True: "асинхронное обучение (`async`; «на шаг позади» — его вариант с задержкой 1 — тоже подходит)",
        False: "строго синхронное обучение (`sync`)",
    },
    "lag_bound": "явное ограничение задержки политики ключом конфигурации",
    "training_backend": "бэкенд обучения {}",
    "generation_engine": "движок генерации {}",
}
_ONLY_LOOSE = "(засчитывается только с include_unconfirmed=True)"  # пометка choose_stacks


@functools.lru_cache(maxsize=1)
def _stack_frame():
    """Карта стеков data/stack_map.csv (читается один раз; choose_stacks её не меняет)."""
    return stack_map.load_stack_map()


@json_cached
def _stack_table(task: dict, loose: bool = False):
    """Таблица choose_stacks (из кэша: её только читают)."""
    day, req = dt.date.fromisoformat(task["today"]), task["requirements"]
    return stack_map.choose_stacks(_stack_frame(), **req, include_unconfirmed=loose, today=day)


def _matching(task: dict, loose: bool = False) -> list[str]:
    table = _stack_table(task, loose)
    return list(table.loc[table["matches"], "stack"])


def _fastest_stacks() -> list[str]:
    """Стеки с самым большим опубликованным ускорением: по верхней и по нижней границе."""
    speed = stack_map.load_speedups()
    top = (str(speed.loc[speed[c].idxmax(), "stack"]) for c in ("speedup_high", "speedup_low"))
    return list(dict.fromkeys(top))


def _stack_key(name: Any) -> Any:
    """Имя стека без регистра, пробелов, дефисов и кавычек: «NeMo-RL» = «nemo rl»."""
    return "".join(c for c in norm(name) if c not in " -_`'\".") if isinstance(name, str) else name


@dataclass(frozen=True)
class _Stacks(IdSet):
    """Список имён стеков карты; написание (регистр, пробел или дефис) не важно."""

    def problem(self, given: Any, task: dict) -> str | None:
        known = {_stack_key(s): s for s in self.universe(task)}
        if isinstance(given, (list, tuple, set, frozenset)):
            given = [known.get(_stack_key(x), x) if isinstance(x, str) else x for x in given]
        return super().problem(given, task)

    def same(self, expected: Any, given: Any) -> bool:
        return {_stack_key(x) for x in expected} == {_stack_key(x) for x in given}


def _req_arg(key: str, value: Any) -> str:
    return f"{key}={value}" if isinstance(value, bool) else f'{key}="{value}"'


def _map_cell(x: Any) -> str:
    text = ", ".join(map(str, x)) or "—" if isinstance(x, list) else str(x)
    return text.replace("|", "\\|")


def _stack_rules(req: dict) -> list[str]:
    """Правила проверки требований (для условия): общие, узлы, известные ограничения сочетаний."""
    rules = [
        "требование выполняют только **подтверждённые** факты: элемент списка с «?» на конце, столбец, названный в `unconfirmed`, и сама ячейка `unconfirmed` не подтверждены;",
        f"LoRA и многоходовость — ячейка `lora` / `multi_turn` начинается с «{stack_map.SUPPORTED_PREFIX}»; асинхронность — `async` в `synchrony`, синхронность — `sync`, сочетания с размещением — в `placement_synchrony`;",
        "ограничение задержки — есть ключ `staleness_control_key` (не `n/a`); неподтверждённое значение по умолчанию — пометка, а не отказ; бэкенд и движок — подстрока без учёта регистра в элементе `training_backends` / `generation_engines` без «?»;",
    ]
    if req.get("nodes") == "many":
        evidence = "; ".join(
            f"{s} — {'подтверждён' if ok else 'не подтверждён'} ({note})"
            for s, (ok, note) in stack_map.MULTI_NODE_EVIDENCE.items()
        )
        sharded = ", ".join(stack_map.SHARDED_BACKENDS)
        rule = f"несколько узлов подтверждает только опубликованный авторами запуск: {evidence}; шардирующий бэкенд ({sharded}) — лишь вывод курса, не факт;"
        rules.append(rule)
    elif req.get("nodes") == "one":
        rules.append("один узел — ни один стек карты не требует нескольких узлов;")
    limits = [lim for lim in stack_map.STACK_LIMITS if set(lim.requirements) <= set(req)]
    if limits:
        items = "".join(f"\n    - {lim.stack} [`{lim.kind}`]: {lim.message};" for lim in limits)
        rule = "ограничения **сочетаний** (`stack_map.STACK_LIMITS`; `fails` — не работает, `unconfirmed` — не подтверждено):"
        rules.append(rule + items)
    return rules


def _stack_task(variant: int) -> dict:
    rng = random.Random(12_5_12_000 + 7919 * variant)
    today, fastest = max(_stack_frame()["snapshot_date"]).isoformat(), _fastest_stacks()
    # обе ошибки меняют ответ: есть неподтверждённые кандидаты, а ответ — не «самый быстрый»
    while True:
        req = {k: rng.choice(options) if options else None for k, (options, _) in _REQS.items()}
        if req["asynchronous"] and rng.random() < 0.6:
            req["lag_bound"] = True
        task = {"requirements": {k: v for k, v in req.items() if v is not None}, "today": today}
        if len(task["requirements"]) < 3 or not (ref := _matching(task)):
            continue
        if set(ref) != set(_matching(task, True)) and set(ref) != {fastest[0]}:
            break
    req = task["requirements"]
    used = dict.fromkeys(c for k in req for c in _REQS[k][1])
    cols = ["stack", *used, "unconfirmed", "snapshot_date"]
    rows = [[_map_cell(row[c]) for c in cols] for _, row in _stack_frame().iterrows()]
    needs = []
    for k, v in req.items():
        text = _REQ_TEXT[k][v] if isinstance(_REQ_TEXT[k], dict) else _REQ_TEXT[k].format(v)
        needs.append(f"- {text}: `{_req_arg(k, v)}`;")
    task["statement"] = (
        "**Выбор стека по требованиям.** Требования к новому RL-запуску (`task_12_5_12['requirements']`):\n\n"
        + "\n".join(needs)
        + f"\n\nДатированная карта стеков шага 12.5.4 (`stack_map.load_stack_map()`, нужные столбцы; дата выбора `task_12_5_12['today']` = {today}):\n\n{md_table([f'`{c}`' for c in cols], rows)}\n\nПравила:\n\n"
        + "\n".join(f"- {r}" for r in _stack_rules(req))
        + '\n\nНазовите все стеки, которые удовлетворяют **всем** требованиям **подтверждёнными** фактами карты — список имён, например `["TRL", "AReaL"]`. Сверка после проверки — `stack_map.choose_stacks` с этими требованиями и датой.'
    )
    return task


def _stack_solution(task: dict, ref: list) -> str:
    loose = dict(zip(*(_stack_table(task, True)[c] for c in ("stack", "matches"))))
    rows = []
    for _, r in _stack_table(task).iterrows():
        no = "нет (только с неподтверждённым)" if loose[r["stack"]] else "нет"
        failed = "; ".join(x for x in r["failed"] if not x.endswith(_ONLY_LOOSE)) or "—"
        notes = _map_cell("; ".join(r["unconfirmed"]) or "—")
        age = f"{r['snapshot_date']} ({r['age_days']} дн.)"
        rows.append([r["stack"], "**да**" if r["matches"] else no, _map_cell(failed), notes, age])
    top = (speed := stack_map.load_speedups()).loc[speed["speedup_high"].idxmax()]
    args = ", ".join(_req_arg(k, v) for k, v in task["requirements"].items())
    extra = ", ".join(sorted(set(_matching(task, True)) - set(ref)))
    head = ["стек", "подходит", "что не выполнено", "неподтверждённое", "снимок (возраст)"]
    return f'Идём по требованиям, а не по ускорениям: каждое требование каждого стека — по подтверждённым ячейкам, затем ограничения сочетаний (`stack_map.choose_stacks(frame, {args}, today=date.fromisoformat("{task["today"]}"))`):\n\n{md_table(head, rows)}\n\n**Ответ:** `{json.dumps(ref, ensure_ascii=False)}`. С неподтверждёнными фактами подошли бы ещё {extra} — повод проверить документацию своей версии, а не основание для выбора.\n\nСамое большое опубликованное ускорение — {top["speedup_high"]:g}× у {top["stack"]} ({top["claim"]}; база — {top["baseline"]}): заявление авторов для их модели и кластера, а не свойство стека; кандидатов сравнивают на своей задаче.'


def _fastest_matches(task: dict, given: Any) -> bool:
    g, fastest = {_stack_key(x) for x in given}, [{_stack_key(s)} for s in _fastest_stacks()]
    return g != {_stack_key(s) for s in _matching(task)} and g in fastest


def _unconfirmed_matches(task: dict, given: Any) -> bool:
    g, strict = {_stack_key(x) for x in given}, {_stack_key(s) for s in _matching(task)}
    return strict < g <= {_stack_key(s) for s in _matching(task, True)}


_STACK_TEXT = {
    "fastest_number": "Стек выбран по самому большому опубликованному ускорению: это заявление авторов для их модели и кластера, а не свойство стека. Выбор начинается с требований, скорость сравнивают на своей задаче.",
    "unconfirmed_as_fact": "Засчитаны требования, выполненные только неподтверждёнными фактами карты (значения с «?», столбцы из unconfirmed): это повод проверить документацию своей версии, а не основание для выбора.",
}
_STACK_SLIPS = {  # ошибка → (ответ с ней, правило, узнающее её в ином виде)
    "fastest_number": (lambda t, ref: _fastest_stacks()[:1], _fastest_matches),
    "unconfirmed_as_fact": (lambda t, ref: _matching(t, True), _unconfirmed_matches),
}
_ANSWER = _Stacks(lambda t: list(_stack_frame()["stack"]), "имён стеков", repeats=True)
_HINT = "Пройдите по стекам и по каждому требованию: ячейка или элемент списка должны подтверждать его без «?» и без пометки в unconfirmed; затем проверьте ограничения сочетаний (STACK_LIMITS). Опубликованные ускорения в выборе не участвуют."
_TRAPS = tuple(Trap(k, _STACK_TEXT[k], wrong=w, matches=m) for k, (w, m) in _STACK_SLIPS.items())
STEP = Step("12.5.12", _stack_task, _matching, _ANSWER, _HINT, _stack_solution, _TRAPS)
