"""Общее для проверочных шагов: допуски ответов и сборка типичных ошибок из словаря ответов."""

import functools
import json
from collections.abc import Callable
from types import SimpleNamespace

from course_utils import throughput
from course_utils.exercises.answers import Number, Share, get, md_table, norm
from course_utils.exercises.step import Trap

RTOL = 1e-2  # допуск 1 %
SECONDS = Number(rtol=RTOL, unit="с")
GIB = Number(rtol=RTOL, unit="ГиБ")
SHARE = Share(rtol=RTOL)
AMOUNT = {"rtol": RTOL, "low": 0.0, "bound": "Величина неотрицательна"}
TOLERANCE = {"rtol": RTOL, "atol": 2e-3}
TOL = "допуск — 1 % от верного значения или 0.002 по модулю (что больше)"


def json_cached(fn: Callable) -> Callable:
    """lru_cache для функции от данных JSON (условие шага): ключ — json.dumps аргументов, fn
    получает их копию из json.loads; результат общий — его только читают."""

    @functools.lru_cache(maxsize=256)
    def by_key(key: str):
        return fn(*json.loads(key))

    return functools.wraps(fn)(lambda *args: by_key(json.dumps(args)))


def traps(slips, messages: dict, rules: dict, default=()) -> tuple[Trap, ...]:
    """Ловушки в порядке ``messages``: ответ ошибки k — ``slips(task, ref)[k]``; узнаётся по любому
    из полей ``rules[k]`` (нет ключа — ``default``) или правилом ``rules[k](task, given)``."""
    out = []
    for k, text in messages.items():
        rule = rules.get(k, default)
        kw = {"matches": rule} if callable(rule) else {"by": rule}
        out.append(Trap(k, text, lambda t, r, k=k: slips(t, r)[k], **kw))
    return tuple(out)


def answer_table(answers, messages: dict, rules: dict, default=()) -> tuple:
    """(solve, ловушки) шага, чей ``answers(task)`` — {"": верный ответ, ключ ошибки: ответ с ней}."""
    return (lambda t: answers(t)[""]), traps(lambda t, ref: answers(t), messages, rules, default)


def hits_any(answer, values, *pairs: tuple[str, str]):
    """Trap.matches: поле ответа совпало хоть с одной величиной values(task) — пары (поле, имя)."""
    return lambda t, g: any(answer.fields[f].same(values(t)[n], get(g, f)) for f, n in pairs)


def listed(given: dict, key: str) -> set:
    """Нормализованные имена списка ответа по ключу."""
    return {norm(x) for x in get(given, key)}


_FEATURE = {
    "queue": "asynchronous",
    "curriculum": "curriculum",
    "normalizer": "running_reward_norm",
}


def has_state(component: str, run: dict) -> bool:
    """Есть ли у запуска состояние компонента: условные — по признаку запуска, прочие — всегда."""
    return component not in _FEATURE or bool(run[_FEATURE[component]])


def group_share(groups) -> tuple[int, float]:
    """(число групп, доля вырожденных: все награды группы равны) по парам (группа, награды 0/1) —
    через throughput.degenerate_group_share."""
    rewards = [(q, float(r)) for q, rs in groups for r in rs]
    records = [SimpleNamespace(group_id=q, reward={"correctness": r}) for q, r in rewards]
    return throughput.degenerate_group_share(records)


def trace_table(trace: list[dict]) -> str:
    """Интервалы трассы (row, worker, stage, start_s, end_s, depends_on) таблицей Markdown."""
    cells = ("row", "worker", "stage", "start_s", "end_s")
    rows = [[*(r[k] for k in cells), ", ".join(map(str, r["depends_on"])) or "—"] for r in trace]
    return md_table(
        ("строка", "исполнитель", "этап", "начало, с", "конец, с", "зависит от строк"), rows
    )
