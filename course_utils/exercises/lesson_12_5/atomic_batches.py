"""12.5.11 — пакет целиком или никак: функция приёма пакета, проверка на скрытых пакетах.

Ответ — функция accept(batch, expected_ids, verifier_version) → True (принять пакет целиком) или
False (отклонить целиком). Её прогоняют на скрытых пакетах варианта, где есть пакеты всех видов;
верные вердикты даёт checkpoint.accept_batch. Ошибки узнаются по тому, какие пакеты решены иначе.
"""

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from course_utils import checkpoint, fmt
from course_utils.exercises.answers import AnswerType, Function, md_table
from course_utils.exercises.step import Step, Trap

# вид пакета → как он получился (для разбора)
KINDS: dict[str, str] = {
    "complete": "полный пакет: все ожидаемые роллауты, награды текущей версии",
    "policy_mixed": "полный пакет из роллаутов нескольких версий политики в пределах задержки — "
    "норма асинхронного запуска",
    "missing_rollouts": "запись оборвалась: части ожидаемых роллаутов нет",
    "missing_reward": "верификатор упал посреди пакета: у хвоста нет награды и версии",
    "duplicate": "повтор записи после сбоя: роллаут записан дважды",
    "mixed_verifier": "часть роллаутов оценена прошлой версией верификатора",
    "old_verifier": "весь пакет оценён прошлой версией верификатора",
    "foreign": "вместо своего роллаута в пакете чужой (из другого пакета)",
}
_COLS = ("rollout_id", "prompt_id", "policy_version", "reward", "verifier_version")
_SIG = "accept(batch, expected_ids, verifier_version)"


def _build_batches(
    rng: random.Random, kinds: list[str], current: str, old: str, max_lag: int
) -> list[dict]:
    """Пакеты подряд идущих шагов тренера; вид каждого — из kinds (в этом порядке)."""
    step0 = rng.randint(120, 900)
    next_id = rng.randint(1000, 8000)
    batches = []
    for i, kind in enumerate(kinds):
        step, size = step0 + i, rng.choice([4, 5, 6])
        ids = [f"r{next_id + j}" for j in range(size)]
        next_id += size + rng.randint(0, 3)
        if kind == "policy_mixed":
            versions = [step - rng.randint(0, max_lag) for _ in ids]
            versions[rng.randrange(size)], versions[rng.randrange(size)] = step, step - max_lag
        else:
            versions = [step - (rng.random() < 0.25) * rng.randint(1, max_lag) for _ in ids]
            if kind == "complete":
                versions = [step] * size
        rollouts = [{"rollout_id": rid, "prompt_id": f"q{rng.randint(100, 999)}",
                     "policy_version": v, "reward": float(rng.random() < 0.5),
                     "verifier_version": current} for rid, v in zip(ids, versions)]  # fmt: skip
        if kind == "missing_rollouts":
            for j in sorted(rng.sample(range(size), rng.choice([1, 2])), reverse=True):
                del rollouts[j]
        elif kind == "missing_reward":
            for r in rollouts[rng.randint(2, size - 1) :]:
                r["reward"], r["verifier_version"] = None, None
        elif kind == "duplicate":
            twin = dict(rng.choice(rollouts))
            rollouts.insert(rng.randint(0, size), twin)
        elif kind == "mixed_verifier":
            for j in rng.sample(range(size), rng.choice([1, 2])):
                rollouts[j]["verifier_version"] = old
        elif kind == "old_verifier":
            for r in rollouts:
                r["verifier_version"] = old
        elif kind == "foreign":
            j = rng.randrange(size)
            rollouts[j]["rollout_id"] = f"r{next_id + rng.randint(0, 2)}"  # id следующего пакета
        batches.append({"batch_id": f"b{step:04d}", "optimizer_step": step, "kind": kind,
                        "expected_ids": ids, "rollouts": rollouts})  # fmt: skip
    return batches


def _versions(rng: random.Random) -> tuple[str, str, int]:
    base = rng.randint(2, 6)
    return f"verifier-{base + 1}", f"verifier-{base}", rng.choice([1, 2])


def _hidden(task: dict) -> list[dict]:
    """Скрытые пакеты варианта: каждого вида хотя бы один, плюс 2–4 случайных, вперемешку."""
    rng = random.Random(task["hidden_seed"])
    kinds = [*KINDS, *rng.sample(list(KINDS), rng.randint(2, 4))]
    rng.shuffle(kinds)
    return _build_batches(
        rng, kinds, task["verifier_version"], task["old_version"], task["max_lag"]
    )


def _table(rollouts: list[dict]) -> str:
    cell = lambda x: "—" if x is None else f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
    return md_table([f"`{c}`" for c in _COLS], [[cell(r[c]) for c in _COLS] for r in rollouts])


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_11_000 + 7919 * variant)
    current, old, max_lag = _versions(rng)
    example = _build_batches(rng, ["policy_mixed"], current, old, max_lag)[0]
    args = f"ex['rollouts'], ex['expected_ids'], '{current}'"
    statement = (
        "**Пакет целиком или никак.** Асинхронный запуск: сборщики пишут роллауты в хранилище, "
        "верификатор выставляет награды, тренер собирает пакет шага из заранее назначенных роллаутов "
        "(список ожидаемых `rollout_id`). Допустимая задержка политики — до "
        f"{fmt.count(max_lag, 'версии', 'версий', 'версий')}. Проверяющую систему недавно обновили: "
        f"текущая версия — `{current}`, прошлая — `{old}`. После серии сбоев (падали сборщик, запись и "
        "верификатор) в хранилище лежат пакеты разной сохранности. Пример пакета (он же — "
        f"`task_12_5_11['example']`; «—» — значения нет; ожидаемые роллауты: "
        f"{', '.join(f'`{x}`' for x in example['expected_ids'])}):\n\n{_table(example['rollouts'])}\n\n"
        "По правилу шага 12.5.3 пакет либо принимается **целиком**, либо **целиком** отклоняется: "
        "частично записанный пакет или награда не той версии верификатора не должны молча попасть в "
        "обновление. Напишите функцию\n\n```python\ndef accept(batch, expected_ids, verifier_version):\n"
        "    ...  # batch — список словарей-роллаутов, как в примере\n    return True  # или False\n```\n\n"
        "`True` — пакет можно отдать тренеру как есть, `False` — нельзя (его пересобирают или "
        "переоценивают). Проверка вызовет её на скрытых пакетах этого варианта (всех видов) с "
        f"`verifier_version = '{current}'` и сравнит вердикты с верными. Ответ — сама функция: "
        "`answer_12_5_11 = accept` (без скобок). Сверить себя после проверки можно с "
        f"`ex = task_12_5_11['example']; bool(checkpoint.accept_batch({args}))`."
    )
    return {"statement": statement, "verifier_version": current, "old_version": old, "max_lag": max_lag,
            "example": {k: example[k] for k in ("expected_ids", "rollouts")}, "hidden_seed": rng.randrange(10**9)}  # fmt: skip


def _kind_of(batch: dict, current: str) -> str:
    """Вид пакета по данным (разбор и типичные ошибки не полагаются на скрытую разметку)."""
    rollouts, expected = batch["rollouts"], batch["expected_ids"]
    ids = [r["rollout_id"] for r in rollouts]
    if len(set(ids)) < len(ids):
        return "duplicate"
    if set(ids) - set(expected):
        return "foreign"
    if set(expected) - set(ids):
        return "missing_rollouts"
    if any(r["reward"] is None for r in rollouts):
        return "missing_reward"
    versions = {r["verifier_version"] for r in rollouts}
    if versions != {current}:
        return "old_verifier" if current not in versions else "mixed_verifier"
    return "policy_mixed" if len({r["policy_version"] for r in rollouts}) > 1 else "complete"


def _run(fn: Callable, task: dict) -> dict:
    """Вердикт функции по каждому скрытому пакету: {batch_id: True/False} (копии: пакет не портится)."""
    return {b["batch_id"]: bool(fn(copy.deepcopy(b["rollouts"]), list(b["expected_ids"]), task["verifier_version"]))
            for b in _hidden(task)}  # fmt: skip


def solve(task: dict) -> Callable:
    return checkpoint.accept_batch


@dataclass(frozen=True)
class _Verdicts(AnswerType):
    """Вердикты по скрытым пакетам; отзыв — сколько пакетов решено неверно и в какую сторону."""

    def mismatch(self, expected: dict, given: dict) -> str:
        extra = sum(given[k] and not v for k, v in expected.items())
        lost = sum(v and not given[k] for k, v in expected.items())
        return (f"Верно решено скрытых пакетов: {len(expected) - extra - lost} из {len(expected)}. Принято "
                f"пакетов, которые нужно отклонить: {extra}; отклонено пакетов, которые можно принять: {lost}.")  # fmt: skip


def solution(task: dict, ref: Callable) -> str:
    current, rows = task["verifier_version"], []
    for b in _hidden(task):
        verdict = ref(b["rollouts"], b["expected_ids"], current)
        policy = ", ".join(map(str, sorted({r["policy_version"] for r in b["rollouts"]})))
        why = "; ".join(verdict.reasons) or "все проверки пройдены"
        rows.append([f"`{b['batch_id']}`", f"{len(b['expected_ids'])} / {len(b['rollouts'])}", policy,
                     KINDS[_kind_of(b, current)], why, f"**{verdict.accepted}**"])  # fmt: skip
    table = md_table(["пакет", "ожидалось / записано", "версии политики", "что случилось", "причины отказа", "вердикт"], rows)  # fmt: skip
    return (
        "Пакет принимается только целиком, поэтому проверяем весь пакет, а не «хорошую часть»: состав "
        "— ровно ожидаемые `rollout_id`, каждый по одному разу; у каждого роллаута конечная награда; "
        f"все награды выставлены одной и той же, текущей версией проверяющей системы `{current}`.\n\n"
        "```python\nimport math\n\n\ndef accept(batch, expected_ids, verifier_version):\n"
        '    ids = [r["rollout_id"] for r in batch]\n'
        "    return (len(ids) == len(set(ids)) and set(ids) == set(expected_ids)  # ровно ожидаемые, без повторов\n"
        '            and all(isinstance(r["reward"], (int, float)) and math.isfinite(r["reward"]) for r in batch)\n'
        '            and all(r["verifier_version"] == verifier_version for r in batch))  # та же, текущая версия\n'
        "\n\nanswer_12_5_11 = accept  # готовое — bool(checkpoint.accept_batch(...))\n```\n\n"
        f"Скрытые пакеты варианта и вердикты `checkpoint.accept_batch`:\n\n{table}\n\n"
        "Разные версии **политики** внутри пакета — не повод для отказа: в асинхронном запуске "
        f"роллауты с задержкой до {fmt.count(task['max_lag'], 'версии', 'версий', 'версий')} законны, их "
        "возраст ограничивает очередь, а отношение вероятностей учитывает обновление (урок 12.4). Повод "
        "для отказа — версия **верификатора**: награды разных версий несравнимы, а пакет, целиком "
        "оценённый прошлой версией, нужно переоценить. Оценённую часть частичного пакета тоже нельзя "
        "«взять пока»: выборка смещается к роллаутам, которые успели записаться или проверяться "
        "быстрее, и в журнале нельзя восстановить, что вошло в шаг. Дубликат после повторной записи "
        "тоже не чинят молча: пакет пересобирают, а повтор учитывают в метриках надёжности."
    )


def _flip(key: str, message: str, kinds: tuple, to: bool) -> Trap:
    """Пакеты видов ``kinds`` решены как ``to``; узнаётся, если все изменённые — таких видов."""

    def wrong(task: dict, ref: Callable) -> Callable:
        def accept(batch: list, expected_ids: list, verifier_version: str) -> bool:
            kind = _kind_of({"rollouts": batch, "expected_ids": expected_ids}, verifier_version)
            return to if kind in kinds else bool(ref(batch, expected_ids, verifier_version))

        return accept

    def matches(task: dict, given: dict) -> bool:
        flipped = [b for b in _hidden(task) if given[b["batch_id"]] != bool(solve(task)(b["rollouts"], b["expected_ids"], task["verifier_version"]))]  # fmt: skip
        return bool(flipped) and all(_kind_of(b, task["verifier_version"]) in kinds and given[b["batch_id"]] is to for b in flipped)  # fmt: skip

    return Trap(key, message, wrong=wrong, matches=matches)


STEP = Step(
    id="12.5.11", make_task=make_task, solve=solve, solution=solution,
    answer=Function(_run, _Verdicts(), arity=3, signature=_SIG, deadline_s=10.0),
    hint=(
        "Сравните множество rollout_id с expected_ids (ни одного лишнего, ни одного недостающего, без "
        "повторов), проверьте, что у каждого роллаута есть конечная награда и что все оценены именно "
        "verifier_version. Версия политики поведения здесь не критерий: задержка в пределах допуска — "
        "норма асинхронного запуска."
    ),
    traps=(
        _flip("accept_partial", "Вы приняли частично записанный пакет: в нём нет части роллаутов или у части нет награды. Принять «оценённую часть» нельзя: выборка смещается к роллаутам, которые успели записаться, а награда неизвестной версии молча попадает в обновление. Пакет принимается целиком или отклоняется.", ("missing_rollouts", "missing_reward"), True),
        _flip("accept_duplicates", "Вы приняли пакет, где роллаут записан дважды. Повторная запись после сбоя — признак того, что пакет собран не так, как задумано: дубликат удвоил бы вес одного ответа в обновлении. Такой пакет отклоняют и пересобирают.", ("duplicate",), True),
        _flip("accept_old_verifier", "Вы приняли пакет, оценённый прошлой версией верификатора: награды разных версий несравнимы, и старые награды молча попадут в обновление. Версия верификатора у всех роллаутов должна совпадать с текущей (verifier_version), иначе пакет переоценивают.", ("old_verifier", "mixed_verifier"), True),
        _flip("reject_all_on_version_change", "Вы отклонили полный пакет из-за того, что в нём роллауты разных версий политики. В асинхронном запуске это норма в пределах допустимой задержки; несовместимы версии верификатора (награды), а не версии политики поведения.", ("policy_mixed",), False),
    ),
)  # fmt: skip
