"""12.5.11 — пакет целиком или никак: accept(...) на скрытых пакетах; эталон — accept_batch."""

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from course_utils import crash_test, fmt
from course_utils.exercises.answers import AnswerType, Function, md_table
from course_utils.exercises.step import Step, Trap

BATCH_KINDS: dict[str, str] = {  # вид пакета → что с ним случилось (для разбора)
    "complete": "полный, награды текущей версии",
    "policy_mixed": "полный, роллауты разных версий политики в пределах задержки",
    "missing_rollouts": "запись оборвалась: части роллаутов нет",
    "missing_reward": "верификатор упал: у хвоста нет награды",
    "duplicate": "роллаут записан дважды",
    "mixed_verifier": "часть оценена прошлой версией верификатора",
    "old_verifier": "весь оценён прошлой версией верификатора",
    "foreign": "вместо своего роллаута — чужой",
}
_COLS = ("rollout_id", "prompt_id", "policy_version", "reward", "verifier_version")
_SIG = "accept(batch, expected_ids, verifier_version)"


def _build_batches(rng: random.Random, kinds: list, versions_of: dict) -> list:
    """Пакеты подряд идущих шагов тренера; виды — из kinds; версии — из ``versions_of``."""
    current, old, lag = (versions_of[k] for k in ("verifier_version", "old_version", "max_lag"))
    step0, next_id, batches = rng.randint(120, 900), rng.randint(1000, 8000), []
    for i, kind in enumerate(kinds):
        step, size = step0 + i, rng.choice([4, 5, 6])
        ids = [f"r{next_id + j}" for j in range(size)]
        next_id += size + rng.randint(0, 3)
        if kind == "policy_mixed":
            versions = [step - rng.randint(0, lag) for _ in ids]
            versions[rng.randrange(size)], versions[rng.randrange(size)] = step, step - lag
        else:
            versions = [step - (rng.random() < 0.25) * rng.randint(1, lag) for _ in ids]
            versions = [step] * size if kind == "complete" else versions
        rollouts = [
            {"rollout_id": rid, "prompt_id": f"q{rng.randint(100, 999)}", "policy_version": v}
            | {"reward": float(rng.random() < 0.5), "verifier_version": current}
            for rid, v in zip(ids, versions)
        ]
        if kind == "missing_rollouts":
            for j in sorted(rng.sample(range(size), rng.choice([1, 2])), reverse=True):
                del rollouts[j]
        elif kind == "missing_reward":
            for r in rollouts[rng.randint(2, size - 1) :]:
                r.update(reward=None, verifier_version=None)
        elif kind == "duplicate":
            twin = dict(rng.choice(rollouts))
            rollouts.insert(rng.randint(0, size), twin)
        elif kind in ("mixed_verifier", "old_verifier"):
            some = kind == "mixed_verifier"
            for j in rng.sample(range(size), rng.choice([1, 2])) if some else range(size):
                rollouts[j]["verifier_version"] = old
        elif kind == "foreign":  # id из следующего пакета
            j = rng.randrange(size)
            rollouts[j]["rollout_id"] = f"r{next_id + rng.randint(0, 2)}"
        batches.append({"batch_id": f"b{step:04d}", "kind": kind, "expected_ids": ids})
        batches[-1]["rollouts"] = rollouts
    return batches


def _hidden_batches(task: dict) -> list[dict]:
    """Скрытые пакеты варианта: каждого вида хотя бы один, плюс 2–4 случайных, вперемешку."""
    rng = random.Random(task["hidden_seed"])
    kinds = [*BATCH_KINDS, *rng.sample(list(BATCH_KINDS), rng.randint(2, 4))]
    rng.shuffle(kinds)
    return _build_batches(rng, kinds, task)


def _atomic_task(variant: int) -> dict:
    rng = random.Random(12_5_11_000 + 7919 * variant)
    base = rng.randint(2, 6)
    current, old, lag = f"verifier-{base + 1}", f"verifier-{base}", rng.choice([1, 2])
    task = {"verifier_version": current, "old_version": old, "max_lag": lag}
    example = _build_batches(rng, ["policy_mixed"], task)[0]
    cells = [[f"{r[c]:g}" if c == "reward" else r[c] for c in _COLS] for r in example["rollouts"]]
    table = md_table([f"`{c}`" for c in _COLS], cells)
    expected = ", ".join(f"`{x}`" for x in example["expected_ids"])
    task["statement"] = (
        f"**Пакет целиком или никак.** Асинхронный запуск: тренер собирает пакет шага из заранее назначенных роллаутов (`expected_ids`), награды ставит верификатор; задержка политики допустима до {fmt.count(lag, 'версии', 'версий', 'версий')}. Верификатор обновлён: текущая версия — `{current}`, прошлая — `{old}`. После сбоев сборщика, записи и верификатора пакеты в хранилище разной сохранности. Пример (`task_12_5_11['example']`, ожидаются {expected}):\n\n{table}\n\nПакет принимают **целиком** или **целиком** отклоняют (шаг 12.5.3). Напишите `{_SIG}` → `True` (отдать тренеру как есть) или `False` (пересобрать или переоценить); `batch` — список роллаутов, как в примере. Её вызовут на скрытых пакетах всех видов с `verifier_version = '{current}'`; сверка — `crash_test.accept_batch` с теми же аргументами."
    )
    task["example"] = {k: example[k] for k in ("expected_ids", "rollouts")}
    return task | {"hidden_seed": rng.randrange(10**9)}


def _accept_outcome(fn: Callable, task: dict) -> dict:
    """Вердикт функции по каждому скрытому пакету {batch_id: bool}; пакеты — копии."""
    current = task["verifier_version"]
    return {
        b["batch_id"]: bool(fn(copy.deepcopy(b["rollouts"]), list(b["expected_ids"]), current))
        for b in _hidden_batches(task)
    }


@dataclass(frozen=True)
class _Verdicts(AnswerType):
    """Вердикты по скрытым пакетам; отзыв — сколько решено неверно и в какую сторону."""

    def mismatch(self, expected: dict, given: dict) -> str:
        extra = sum(given[k] and not v for k, v in expected.items())
        lost, n = sum(v and not given[k] for k, v in expected.items()), len(expected)
        return f"Верно решено скрытых пакетов: {n - extra - lost} из {n}. Принято пакетов, которые нужно отклонить: {extra}; отклонено пакетов, которые можно принять: {lost}."


_CODE = """```python
import math


def accept(batch, expected_ids, verifier_version):
    ids = [r["rollout_id"] for r in batch]
    return (sorted(ids) == sorted(expected_ids)  # ровно ожидаемые: без пропусков, повторов, чужих
            and all(r["reward"] is not None and math.isfinite(r["reward"]) for r in batch)
            and all(r["verifier_version"] == verifier_version for r in batch))  # текущая версия
```"""


def _atomic_solution(task: dict, ref: Callable) -> str:
    current, rows = task["verifier_version"], []
    for b in _hidden_batches(task):
        verdict = ref(b["rollouts"], b["expected_ids"], current)
        policy = ", ".join(map(str, sorted({r["policy_version"] for r in b["rollouts"]})))
        why, kind = "; ".join(verdict.reasons) or "—", BATCH_KINDS[b["kind"]]
        sizes = f"{len(b['expected_ids'])} / {len(b['rollouts'])}"
        rows.append([f"`{b['batch_id']}`", sizes, policy, kind, why, f"**{verdict.accepted}**"])
    head = "пакет|ожидалось / записано|версии политики|что случилось|причины отказа|вердикт"
    lags = fmt.count(task["max_lag"], "версии", "версий", "версий")
    return f"Пакет принимают целиком, поэтому проверяют весь: ровно ожидаемые `rollout_id`, каждый один раз, у каждого конечная награда, и вся она от текущего `{current}`.\n\n{_CODE}\n\nСкрытые пакеты и вердикты `crash_test.accept_batch`:\n\n{md_table(head.split('|'), rows)}\n\nРазные версии **политики** (задержка до {lags}) законны: их учитывает отношение вероятностей (урок 12.4). Несравнимы награды разных версий **верификатора**; «оценённая часть» пакета смещает выборку к быстрым роллаутам, дубликат удваивает вес ответа."


_FLIPS = {  # ошибка → (виды пакетов, которые она решает иначе, её вердикт для них)
    "accept_partial": (("missing_rollouts", "missing_reward"), True),
    "accept_duplicates": (("duplicate",), True),
    "accept_old_verifier": (("old_verifier", "mixed_verifier"), True),
    "reject_all_on_version_change": (("policy_mixed",), False),
}
_FLIP_TEXT = {
    "accept_partial": "Принят частично записанный пакет (нет части роллаутов или наград): «оценённая часть» смещает выборку к роллаутам, которые успели записаться. Пакет принимают целиком или отклоняют.",
    "accept_duplicates": "Принят пакет, где роллаут записан дважды: дубликат удвоил бы вес одного ответа в обновлении. Такой пакет пересобирают.",
    "accept_old_verifier": "Принят пакет, оценённый прошлой версией верификатора: награды разных версий несравнимы. Версия у всех роллаутов должна совпадать с текущей (verifier_version).",
    "reject_all_on_version_change": "Отклонён полный пакет из-за разных версий политики: в асинхронном запуске это норма в пределах задержки; несовместимы версии верификатора, а не политики.",
}


def _flip(key: str) -> Trap:
    """Пакеты своих видов решены как ``to``; узнаётся, если все иначе решённые — этих видов."""
    kinds, to = _FLIPS[key]

    def wrong(task: dict, ref: Callable) -> Callable:
        kind_of = {tuple(b["expected_ids"]): b["kind"] for b in _hidden_batches(task)}

        def accept(batch: list, expected_ids: list, verifier_version: str) -> bool:
            if kind_of.get(tuple(expected_ids)) in kinds:
                return to
            return bool(ref(batch, expected_ids, verifier_version))

        return accept

    def matches(task: dict, given: dict) -> bool:
        ref = _accept_outcome(crash_test.accept_batch, task)
        diff = [b for b in _hidden_batches(task) if given[b["batch_id"]] != ref[b["batch_id"]]]
        return bool(diff) and all(b["kind"] in kinds and given[b["batch_id"]] is to for b in diff)

    return Trap(key, _FLIP_TEXT[key], wrong=wrong, matches=matches)


def _atomic_solve(task: dict):  # верный ответ — функция курса
    return crash_test.accept_batch


_ANSWER = Function(_accept_outcome, _Verdicts(), arity=3, signature=_SIG, deadline_s=60.0)
_HINT = "Сравните rollout_id с expected_ids (ни лишних, ни недостающих, ни повторов), проверьте конечную награду у каждого роллаута и что все оценены именно verifier_version. Версия политики — не критерий: задержка в пределах допуска — норма."
_TRAPS = tuple(_flip(key) for key in _FLIPS)
STEP = Step("12.5.11", _atomic_task, _atomic_solve, _ANSWER, _HINT, _atomic_solution, _TRAPS)
