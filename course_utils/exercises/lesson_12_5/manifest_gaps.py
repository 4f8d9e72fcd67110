"""12.5.6 — манифест контрольной точки: чего не хватает для честного возобновления.

Словарь компонентов — ``checkpoint.COMPONENTS`` (шаг 12.5.1). Каждый вариант — асинхронный запуск
без очереди и генераторов и/или курсора, где одного условного компонента нет: ловушки различимы.
"""

import random
from typing import Any

from course_utils import memory
from course_utils.checkpoint import COMPONENTS
from course_utils.exercises.answers import Bool, Fields, IdSet, md_table, norm, sig
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

FEATURE = {"queue": "asynchronous", "curriculum": "curriculum", "normalizer": "running_reward_norm"}
RNG_CURSOR, BIG = ("rng", "data_cursor"), ("policy", "optimizer")
_WHY_NA = {"curriculum": "учебной программы нет", "normalizer": "нормировка только внутри группы"}
_MODELS = ("SmolLM2-360M", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")
_TAIL = {"policy": (20_000, 90_000), "optimizer": (2_000, 9_000), "scheduler": (900, 2_400), "counters": (120, 380),
         "rng": (2_500, 3_000), "data_cursor": (180, 700), "curriculum": (400, 2_000), "normalizer": (90, 260),
         "versions": (900, 3_200), "queue": (0, 5_000)}  # fmt: skip


def size(n: float) -> str:
    """Размер в двоичных единицах: 1 КиБ = 2¹⁰ Б, 1 МиБ = 2²⁰ Б, 1 ГиБ = 2³⁰ Б."""
    p, unit = next((p, u) for p, u in ((30, "ГиБ"), (20, "МиБ"), (10, "КиБ"), (0, "Б")) if n >= 2**p)  # fmt: skip
    return f"{n / 2**p:.2f} {unit}" if p else f"{int(n)} Б"


def applies(component: str, run: dict) -> bool:
    """Есть ли у запуска состояние компонента (безусловные есть всегда)."""
    return component not in FEATURE or bool(run[FEATURE[component]])


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_6_000 + 7919 * variant)
    model = _MODELS[(variant + rng.randrange(5)) % 5]
    cur, norm_ = [(True, False), (False, True), (False, False)][(variant + rng.randrange(3)) % 3]
    run = {"model": model, "num_params": memory.ModelShape.from_name(model).num_params,
           "world_size": rng.choice([1, 2, 4, 8]), "step": rng.randint(200, 6000), "asynchronous": True,
           "curriculum": cur, "running_reward_norm": norm_, "collectors": rng.choice([2, 4, 8]),
           "max_lag": rng.choice([1, 2, 3]), "queued": rng.randint(12, 64), "level": rng.randint(2, 5)}  # fmt: skip
    lost = rng.choice([["rng"], ["data_cursor"], list(RNG_CURSOR)])  # генераторы и/или курсор
    rest = [c for c in COMPONENTS if applies(c, run) and c not in (*BIG, "queue", *RNG_CURSOR)]
    missing, n = ["queue", *lost, *rng.sample(rest, rng.choice([0, 1, 1, 2]))], run["num_params"]
    base = {"policy": 2 * n, "optimizer": 12 * n,  # веса bf16 — 2 Б на параметр, AdamW (m, v, fp32-копия) — 12 Б
            "rng": 6_000 * run["world_size"], "queue": 20_000 * run["queued"]}  # fmt: skip
    manifest = [{"component": c, "file": f"{c}.{'safetensors' if c in BIG else 'json'}",
                 "bytes": base.get(c, 0) + rng.randint(*_TAIL[c])}
                for c in COMPONENTS if applies(c, run) and c not in missing]  # fmt: skip
    rng.shuffle(manifest)
    total = sum(e["bytes"] for e in manifest)
    rows = [[f"`{e['file']}`", f"`{e['component']}`", sig(e["bytes"]), size(e["bytes"])] for e in manifest]  # fmt: skip
    world = "одном GPU" if run["world_size"] == 1 else f"{run['world_size']} GPU"
    statement = (
        f"**Манифест контрольной точки.** Запуск GRPO: {model} (параметров: {sig(n)}, веса bf16), AdamW, "
        f"косинусный планировщик скорости обучения с прогревом, обучение на {world}. Генераторы случайных чисел "
        "задают сэмплы и порядок мини-пакетов; запросы читаются по порядку из перемешанного набора задач; "
        f"награду выставляет верификатор с версией. Запуск асинхронный: сборщики роллаутов (их {run['collectors']}) "
        f"пишут в очередь, тренер берёт пакеты с задержкой политики до {run['max_lag']} версий; в момент записи "
        f"в очереди лежали готовые роллауты прошлых версий (штук: {run['queued']}). "
        + (f"Учебная программа повышает уровень сложности, когда скользящая доля верных ответов выше 0.8 (сейчас "
           f"уровень {run['level']} из 6). " if cur else "Учебной программы нет: сложность задач не меняется. ")
        + ("Награды нормируются скользящими средним и дисперсией по всему запуску (алгоритм Уэлфорда)."
           if norm_ else "Преимущества нормируются только внутри группы; скользящей статистики нет.")
        + f"\n\nПоследняя контрольная точка `step-{run['step']:06d}` записана атомарно; её `manifest.json` "
        "перечисляет файлы (они же — `task_12_5_6['manifest']`; 1 КиБ = 2¹⁰ Б, 1 ГиБ = 2³⁰ Б):\n\n"
        + md_table(["файл", "компонент", "байт", "размер"], [*rows, ["**итого**", "", sig(total), size(total)]])
        + "\n\nВсе компоненты контрольной точки RL-запуска и что ломается без каждого (шаг 12.5.1, "
        "`checkpoint.COMPONENTS`; имена — `task_12_5_6['components']`):\n\n"
        + ";\n".join(f"- `{c}` — {b}" for c, (_, b) in COMPONENTS.items())
        + ".\n\nКомпонент **нужен**, если без него продолжение — уже не тот же эксперимент; состояние, которого "
        "у запуска нет, сохранять не нужно. Найдите `missing` — список нужных компонентов, которых нет в "
        "манифесте (имена из списка, порядок не важен; `[]`, если таких нет), и `can_resume` — можно ли с этой "
        'точкой честно продолжить запуск. Ответ — словарь `{"missing": [...], "can_resume": True/False}`.'
    )  # fmt: skip
    return {
        "statement": statement,
        "run": run,
        "manifest": manifest,
        "components": list(COMPONENTS),
    }


def absent(task: dict) -> list[str]:
    """Все компоненты, которых нет в манифесте (и нужные, и те, которых у запуска нет)."""
    return [c for c in COMPONENTS if c not in {e["component"] for e in task["manifest"]}]


def solve(task: dict) -> dict:
    missing = [c for c in absent(task) if applies(c, task["run"])]
    return {"missing": missing, "can_resume": not missing}


def clean(given: Any) -> Any:
    """Список имён без кавычек и обратных кавычек вокруг: « `rng` » → «rng»."""
    g = _plain(given)
    return [x.strip().strip("`'\" ") if isinstance(x, str) else x for x in g] if isinstance(g, (list, tuple, set, frozenset)) else g  # fmt: skip


class Names(IdSet):
    """IdSet, где имя можно взять в кавычки; отзыв о чужом имени называет допустимые (если их ≤ 12)."""

    def problem(self, given: Any, task: dict) -> str | None:
        bad, known = super().problem(clean(given), task), list(self.universe(task))
        return f"{bad} Допустимы: {', '.join(known)}." if bad and bad.startswith("Таких") and len(known) <= 12 else bad  # fmt: skip

    def same(self, expected: Any, given: Any) -> bool:
        return super().same(expected, clean(given))

    def mismatch(self, expected: Any, given: Any) -> str:
        return super().mismatch(expected, clean(given))


def value(given: dict, key: str) -> Any:
    """Значение ответа-словаря по ключу (регистр ключа не важен)."""
    return {norm(k): v for k, v in given.items()}[norm(key)]


def names(given: dict, key: str = "missing") -> set:
    """Нормализованное множество имён ответа по ключу."""
    return {norm(x) for x in clean(value(given, key))}


def _without(dropped: tuple[str, ...]) -> dict:
    """Ловушка «не включил dropped»: верный список без них (узнаётся и без одного из них)."""

    def matches(task: dict, given: dict) -> bool:
        need, got = set(solve(task)["missing"]), names(given)
        return bool(need & set(dropped) - got) and need - set(dropped) <= got <= set(absent(task))

    return {"matches": matches, "override": {"missing": lambda t: [c for c in solve(t)["missing"] if c not in dropped]}}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    run, have = task["run"], {e["component"]: e["bytes"] for e in task["manifest"]}
    rows = [[f"`{c}`", f"да, {size(have[c])}", "да", "есть"] if c in have
            else [f"`{c}`", "нет", "да", f"**не хватает**: {breaks}"] if applies(c, run)
            else [f"`{c}`", "нет", f"нет: {_WHY_NA[c]}", "не нужен"] for c, (_, breaks) in COMPONENTS.items()]  # fmt: skip
    na = ", ".join(f"`{c}`" for c in absent(task) if not applies(c, run))
    return (
        "Для каждого компонента `checkpoint.COMPONENTS` два вопроса: есть ли он в манифесте и есть ли у запуска "
        "такое состояние.\n\n" + md_table(["компонент", "в манифесте", "у этого запуска", "вывод"], rows)
        + f"\n\n**Ответ:** `{ref}`.\n\nВеса и оптимизатор — почти весь объём ({size(have['policy'] + have['optimizer'])}; "
        f"остальные файлы вместе — {size(sum(have.values()) - have['policy'] - have['optimizer'])}), но восстановить только их — перезапуск с тёплыми весами, а "
        "не тот же эксперимент: без файлов в килобайты (шаг, генераторы, курсор, версии) ветвь расходится с "
        f"непрерывной сразу (шаг 12.5.3). Очередь ({run['queued']} роллаутов прошлых версий) сохраняют с версиями "
        "поведения или явно отбрасывают по правилу, записанному в контрольную точку. А "
        f"{na} в манифесте нет по делу: такого состояния у запуска нет."
    )  # fmt: skip


def _can(given: dict) -> bool:
    return _plain(value(given, "can_resume")) is True


STEP = Step(
    id="12.5.6", make_task=make_task, solve=solve, solution=solution,
    answer=Fields({"missing": Names(lambda t: COMPONENTS, "компонентов"), "can_resume": Bool()}),
    hint="Сравните манифест с task_12_5_6['components']. Для каждого отсутствующего компонента спросите, есть ли "
    "у этого запуска такое состояние (учебная программа и скользящая нормировка — только если описаны). Размер "
    "файла не важен: генераторы случайных чисел и курсор данных весят килобайты.",
    traps=(
        Trap("list_right_verdict_wrong", "Список недостающих компонентов верный, а вывод ему противоречит: раз "
             "для честного возобновления чего-то не хватает, продолжить тот же эксперимент с этой контрольной "
             "точкой нельзя. Исправьте can_resume.", override={"can_resume": lambda t: True},
             matches=lambda t, g: names(g) == set(solve(t)["missing"]) and _can(g)),
        Trap("weights_only_resume", "Вы считаете, что раз веса и оптимизатор на месте, запуск можно продолжить. "
             "Это восстановление «только весов», выданное за продолжение: без шага и версии, генераторов, курсора "
             "данных, версий компонентов и очереди ветвь после перезапуска расходится с непрерывной сразу.",
             override={"missing": lambda t: [], "can_resume": lambda t: True}, matches=lambda t, g: not names(g) or _can(g)),  # fmt: skip
        Trap("rng_not_needed", "Вы не включили состояния генераторов случайных чисел и/или курсор данных. Они "
             "весят килобайты, но без них после перезапуска другие сэмплы, другой порядок мини-пакетов и "
             "повторённые или пропущенные запросы: это уже другой эксперимент.", **_without(RNG_CURSOR)),
        Trap("queue_irrelevant", "Вы пропустили очередь. У асинхронного запуска в момент записи в ней лежат "
             "роллауты прошлых версий: их сохраняют вместе с версиями поведения или явно отбрасывают по "
             "объявленному правилу — иначе пакеты после перезапуска молча другие.", **_without(("queue",))),
        Trap("not_applicable_listed", "Вы перечислили всё, чего нет в манифесте, включая компоненты, состояния "
             "которых у этого запуска нет (учебная программа или скользящая нормировка наград). Сохранять нужно "
             "состояние, которое есть, а не весь список.", wrong=lambda t, ref: {"missing": absent(t), "can_resume": False},
             matches=lambda t, g: bool(names(g) & set(absent(t)) - set(solve(t)["missing"])) and set(solve(t)["missing"]) <= names(g)),  # fmt: skip
        Trap("present_listed", "В вашем списке есть компонент, который в манифесте уже есть. missing — только "
             "то, чего в манифесте нет и без чего продолжение — не тот же эксперимент.",
             wrong=lambda t, ref: {**ref, "missing": [*ref["missing"], "policy"]},
             matches=lambda t, g: bool(names(g) - set(absent(t)))),
    ),
)  # fmt: skip
