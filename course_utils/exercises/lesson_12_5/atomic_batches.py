"""12.5.11 — пакет целиком или никак: приём и отказ частично записанных пакетов (accept_batch)."""

import random
from collections.abc import Iterable
from typing import Any

from course_utils.exercises.answers import Keyed, norm
from course_utils.exercises.lesson_12_5.final_diagnosis import Synonyms
from course_utils.exercises.step import Step, Trap

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
_PARTIAL = ("missing_rollouts", "missing_reward")
_COLS = ("rollout_id", "prompt_id", "policy_version", "reward", "verifier_version")


def _build_batches(rng: random.Random, kinds: list[str], current: str, old: str,
                           max_lag: int) -> list[dict]:  # fmt: skip
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


def _kinds(rng: random.Random, variant: int) -> list[str]:
    if variant < 4:  # на первых вариантах узнаются все типичные ошибки
        extra = ("mixed_verifier", "old_verifier", "foreign", "mixed_verifier")[variant]
        kinds = ["complete", "policy_mixed", *_PARTIAL, "duplicate", extra]
    else:
        while True:
            kinds = rng.sample(list(KINDS), rng.randint(4, 6))
            if {"complete", "policy_mixed"} & set(kinds) and set(kinds) - {
                "complete",
                "policy_mixed",
            }:
                break
    rng.shuffle(kinds)
    return kinds


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_11_000 + 7919 * variant)
    base, max_lag = rng.randint(2, 6), rng.choice([1, 2])
    current, old = f"verifier-{base + 1}", f"verifier-{base}"
    batches = _build_batches(rng, _kinds(rng, variant), current, old, max_lag)
    public = [{k: b[k] for k in ("batch_id", "optimizer_step", "expected_ids", "rollouts")}
              for b in batches]  # fmt: skip
    blocks = []
    for b in public:
        rows = _rows_table(b["rollouts"], _COLS)
        blocks.append(
            f"**Пакет `{b['batch_id']}`** (шаг {b['optimizer_step']}); ожидаемые роллауты: "
            f"{', '.join(f'`{x}`' for x in b['expected_ids'])}\n\n{rows}"
        )
    statement = (
        "**Пакет целиком или никак.** Асинхронный запуск: сборщики пишут роллауты в хранилище, "
        "верификатор выставляет награды, тренер собирает пакет шага из заранее назначенных "
        "роллаутов (список ожидаемых `rollout_id`). Допустимая задержка политики — до "
        f"{max_lag} {'версии' if max_lag == 1 else 'версий'}: более старые роллауты очередь "
        "отбросила ещё до пакета. Проверяющую систему "
        f"недавно обновили: текущая версия — `{current}`, прошлая — `{old}`. После серии сбоев "
        "(падали сборщик, запись и верификатор) в хранилище лежат пакеты (они же — "
        "`task['batches']`; «—» — значения нет):\n\n"
        + "\n\n".join(blocks)
        + "\n\nПо правилу шага 12.5.3 каждый пакет либо принимается **целиком**, либо "
        "**целиком** отклоняется: частично записанный пакет или награда неизвестной версии не "
        'должны молча попасть в обновление. Решите для каждого пакета: `"accept"` — его можно '
        'отдать тренеру как есть, `"reject"` — нельзя (пакет пересобирают или переоценивают '
        "заново).\n\n"
        'Ответ — словарь `{batch_id: "accept" или "reject"}` для всех пакетов, вида '
        '`{"bXXXX": "accept", "bYYYY": "reject", …}`. Сверить себя после проверки можно с '
        f"`checkpoint.accept_batch(batch['rollouts'], batch['expected_ids'], '{current}')`."
    )
    return {"statement": statement, "verifier_version": current, "max_lag": max_lag,
            "batches": public}  # fmt: skip


def _verdicts(task: dict) -> dict:
    from course_utils import checkpoint

    return {
        b["batch_id"]: checkpoint.accept_batch(
            b["rollouts"], b["expected_ids"], task["verifier_version"]
        )
        for b in task["batches"]
    }


def solve(task: dict) -> dict:
    return {k: "accept" if v else "reject" for k, v in _verdicts(task).items()}


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


def solution(task: dict, ref: dict) -> str:
    verdicts = _verdicts(task)
    current, rows = task["verifier_version"], []
    for b in task["batches"]:
        kind = _kind_of(b, current)
        why = "; ".join(verdicts[b["batch_id"]].reasons) or "все проверки пройдены"
        policy = sorted({r["policy_version"] for r in b["rollouts"]})
        rows.append(
            f"| `{b['batch_id']}` | {len(b['expected_ids'])} / {len(b['rollouts'])} | "
            f"{', '.join(map(str, policy))} | {KINDS[kind]} | {why} | "
            f"**{ref[b['batch_id']]}** |"
        )
    answer = ", ".join(f'"{k}": "{v}"' for k, v in ref.items())
    return (
        "Пакет принимается только целиком, поэтому проверяем весь пакет, а не «хорошую часть» "
        "(так делает `checkpoint.accept_batch`): состав — ровно ожидаемые `rollout_id`, каждый "
        "по одному разу; у каждого роллаута конечная награда; все награды выставлены одной и "
        f"той же, текущей версией проверяющей системы `{current}`.\n\n"
        "| пакет | ожидалось / записано | версии политики | что случилось | причины отказа | "
        "вердикт |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"**Ответ:** `{{{answer}}}`.\n\n"
        "Разные версии **политики** внутри пакета — не повод для отказа: в асинхронном запуске "
        f"роллауты с задержкой до {task['max_lag']} "
        f"{'версии' if task['max_lag'] == 1 else 'версий'} законны, их возраст ограничивает "
        "очередь, а отношение вероятностей учитывает обновление (урок 12.4). Повод для отказа — "
        "версия **верификатора**: награды разных версий несравнимы. Оценённую часть частичного "
        "пакета тоже нельзя «взять пока»: выборка смещается к роллаутам, которые успели "
        "записаться или проверяться быстрее, и в журнале нельзя восстановить, что вошло в шаг. "
        "Дубликат после повторной записи тоже не чинят молча: пакет пересобирают, а повтор "
        "учитывают в метриках надёжности."
    )


def _rows_table(rows: list[dict], cols: Iterable[str]) -> str:
    """Таблица Markdown записей; заголовки — имена полей как `код`, None → «—»."""
    cell = lambda x: "—" if x is None else f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
    head = f"| {' | '.join(f'`{c}`' for c in cols)} |\n|{'---|' * len(cols)}\n"
    return head + "\n".join("| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows)


def _flip(kinds: Iterable[str], to: str) -> dict:
    """Пакеты видов ``kinds`` получили вердикт ``to``; узнаётся, если все изменённые — такие."""

    def hit(task: dict) -> set:
        return {
            b["batch_id"] for b in task["batches"] if _kind_of(b, task["verifier_version"]) in kinds
        }

    def wrong(task: dict, ref: dict) -> dict:
        return {k: (to if k in hit(task) else v) for k, v in ref.items()}

    def matches(task: dict, given: Any) -> bool:
        ref, g = solve(task), {norm(k): _VERDICT._canon(v) for k, v in given.items()}
        flipped = {k for k in ref if g[norm(k)] != ref[k]}
        return bool(flipped) and flipped <= hit(task) and all(g[norm(k)] == to for k in flipped)

    return {"wrong": wrong, "matches": matches}


_VERDICT = Synonyms(("accept", "reject"), {"принять": "accept", "принят": "accept",
                                            "отклонить": "reject", "отклонен": "reject"})  # fmt: skip

STEP = Step(
    id="12.5.11", make_task=make_task, solve=solve, solution=solution,
    answer=Keyed(lambda t: [b["batch_id"] for b in t["batches"]], _VERDICT, noun="пакетов"),
    hint=(
        "Для каждого пакета сравните множество rollout_id с ожидаемым (ни одного лишнего, "
        "ни одного недостающего, без повторов), проверьте, что у каждого роллаута есть "
        "награда и что все оценены текущей версией верификатора. Версия политики поведения "
        "здесь не критерий: задержка в пределах допуска — норма асинхронного запуска."
    ),
    traps=(
        Trap("accept_partial", "Вы приняли частично записанный пакет: в нём нет части роллаутов или у части нет "
             "награды. Принять «оценённую часть» нельзя: выборка смещается к роллаутам, которые "
             "успели записаться, а награда неизвестной версии молча попадает в обновление. "
             "Пакет принимается целиком или отклоняется.", **_flip(_PARTIAL, "accept")),
        Trap("accept_duplicates", "Вы приняли пакет, где роллаут записан дважды. Повторная запись после сбоя — "
             "признак того, что пакет собран не так, как задумано: дубликат удвоил бы вес "
             "одного ответа в обновлении. Такой пакет отклоняют и пересобирают.",
             **_flip(["duplicate"], "accept")),
        Trap("reject_all_on_version_change", "Вы отклонили полный пакет из-за того, что в нём роллауты разных версий политики. "
             "В асинхронном запуске это норма в пределах допустимой задержки; несовместимы "
             "версии верификатора (награды), а не версии политики поведения.",
             **_flip(["policy_mixed"], "reject")),
    ),
)  # fmt: skip
