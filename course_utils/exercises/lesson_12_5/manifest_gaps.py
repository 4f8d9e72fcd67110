"""12.5.6 — манифест контрольной точки: чего не хватает для честного возобновления.

Словарь компонентов — ``checkpoint.COMPONENTS`` (шаг 12.5.1). Каждый вариант — асинхронный запуск
без очереди и генераторов и/или курсора, где одного условного компонента нет: ловушки различимы.
"""

import random
from typing import Any

from course_utils import memory
from course_utils.checkpoint import COMPONENTS
from course_utils.exercises.answers import Bool, Fields, IdSet, md_table, norm, num
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

FEATURE = {"queue": "asynchronous", "curriculum": "curriculum", "normalizer": "running_reward_norm"}
RNG_CURSOR = ("rng", "data_cursor")
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


def _describe(run: dict) -> str:
    world = "одном GPU" if run["world_size"] == 1 else f"{run['world_size']} GPU"
    return (
        f"Запуск GRPO: {run['model']} (параметров: {num(run['num_params'])}, веса bf16), AdamW, косинусный "
        f"планировщик скорости обучения с прогревом, обучение на {world}. Сэмплирование ответов и перемешивание "
        "мини-пакетов используют генераторы случайных чисел; запросы читаются по порядку из перемешанного набора "
        f"задач; награду выставляет верификатор с версией. Асинхронный: сборщики роллаутов (их {run['collectors']}) "
        f"пишут в очередь, тренер берёт из неё пакеты с задержкой политики до {run['max_lag']} версий; в момент "
        f"записи в очереди лежали готовые роллауты прошлых версий (штук: {run['queued']}). "
        + (f"Учебная программа: уровень сложности задач растёт, когда скользящая доля верных ответов выше 0.8 "
           f"(сейчас уровень {run['level']} из 6). " if run["curriculum"]
           else "Учебной программы нет: сложность задач не меняется. ")
        + ("Награды нормируются скользящими средним и дисперсией по всему запуску (алгоритм Уэлфорда), затем "
           "считаются преимущества." if run["running_reward_norm"] else "Преимущества нормируются только внутри "
           "группы (среднее и СКО наград одной группы); скользящей статистики нет.")
    )  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_5_6_000 + 7919 * variant)
    model = _MODELS[(variant + rng.randrange(5)) % 5]
    cur, norm_ = [(True, False), (False, True), (False, False)][(variant + rng.randrange(3)) % 3]
    run = {"model": model, "num_params": memory.ModelShape.from_name(model).num_params,
           "world_size": rng.choice([1, 2, 4, 8]), "step": rng.randint(200, 6000), "asynchronous": True,
           "curriculum": cur, "running_reward_norm": norm_, "collectors": rng.choice([2, 4, 8]),
           "max_lag": rng.choice([1, 2, 3]), "queued": rng.randint(12, 64), "level": rng.randint(2, 5)}  # fmt: skip
    lost = rng.choice([["rng"], ["data_cursor"], list(RNG_CURSOR)])  # генераторы и/или курсор
    rest = [
        c
        for c in COMPONENTS
        if applies(c, run) and c not in ("policy", "optimizer", "queue", *RNG_CURSOR)
    ]
    missing = ["queue", *lost, *rng.sample(rest, rng.choice([0, 1, 1, 2]))]
    n = run["num_params"]  # веса bf16 — 2 Б на параметр, AdamW (m, v, мастер-копия fp32) — 12 Б
    base = {
        "policy": 2 * n,
        "optimizer": 12 * n,
        "rng": 6_000 * run["world_size"],
        "queue": 20_000 * run["queued"],
    }
    manifest = [{"component": c, "file": f"{c}.{'safetensors' if c in ('policy', 'optimizer') else 'json'}",
                 "bytes": base.get(c, 0) + rng.randint(*_TAIL[c])}
                for c in COMPONENTS if applies(c, run) and c not in missing]  # fmt: skip
    rng.shuffle(manifest)
    total = sum(e["bytes"] for e in manifest)
    rows = [
        [f"`{e['file']}`", f"`{e['component']}`", num(e["bytes"]), size(e["bytes"])]
        for e in manifest
    ]
    statement = (
        f"**Манифест контрольной точки.** {_describe(run)}\n\nПоследняя контрольная точка "
        f"`step-{run['step']:06d}` записана атомарно, её `manifest.json` перечисляет файлы (они же — "
        "`task_12_5_6['manifest']`; размеры в байтах и в двоичных единицах, 1 КиБ = 2¹⁰ Б, 1 ГиБ = 2³⁰ Б):\n\n"
        + md_table(["файл", "компонент", "байт", "размер"], [*rows, ["**итого**", "", num(total), size(total)]])
        + "\n\nПолный список компонентов контрольной точки RL-запуска и что ломается без каждого (шаг 12.5.1, "
        "`checkpoint.COMPONENTS`, таблицей — `checkpoint.components_frame()`; имена — "
        "`task_12_5_6['components']`):\n\n" + ";\n".join(f"- `{c}` — {b}" for c, (_, b) in COMPONENTS.items())
        + ".\n\nКомпонент **нужен**, если без него продолжение — уже не тот же эксперимент. Компонент, состояния "
        "которого у этого запуска просто нет, сохранять не нужно.\n\nНайдите:\n1. `missing` — список "
        "компонентов, которых нет в манифесте и без которых честное возобновление невозможно (имена из списка "
        "выше, порядок не важен; `[]`, если таких нет);\n2. `can_resume` — `True`, если с этой контрольной "
        "точкой запуск можно честно продолжить, иначе `False`.\n\nОтвет — словарь "
        '`{"missing": [...], "can_resume": …}`, например `{"missing": ["scheduler"], "can_resume": False}`.'
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


class _Ref(dict):
    """Верный ответ; ``present`` — что есть в манифесте (для отзыва; в сравнении не участвует)."""


def solve(task: dict) -> dict:
    ref = _Ref(missing=[c for c in absent(task) if applies(c, task["run"])])
    ref["can_resume"], ref.present = not ref["missing"], {e["component"] for e in task["manifest"]}
    return ref


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


class _Answer(Fields):
    def mismatch(self, expected: Any, given: Any) -> str:
        got, need, have = names(given), set(expected["missing"]), getattr(expected, "present", set())  # fmt: skip
        notes = [f"В манифесте есть {', '.join(sorted(got & have))}: это не отсутствующие компоненты."] * bool(got & have)  # fmt: skip
        if got - need - have or need - got:
            notes.append(f"Нужных отсутствующих компонентов: {len(need)}; вы верно назвали {len(need & got)}, "
                         f"лишних (не нужных этому запуску) в ответе: {len(got - need - have)}.")  # fmt: skip
        if _plain(value(given, "can_resume")) is not expected["can_resume"]:
            notes.append("Значение can_resume не согласуется с тем, чего не хватает.")
        return " ".join(notes) or "Ответ не совпал с верным."


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
        "Идём по полному списку `checkpoint.COMPONENTS` и для каждого компонента спрашиваем: есть ли он в "
        "манифесте и есть ли у этого запуска такое состояние.\n\n"
        + md_table(["компонент", "в манифесте", "у этого запуска", "вывод"], rows) + f"\n\n**Ответ:** `{dict(ref)}`."
        f"\n\nВеса и оптимизатор — {size(have['policy'] + have['optimizer'])} из {size(sum(have.values()))} "
        "манифеста, почти весь объём. Но восстановить только их — значит перезапустить обучение с тёплыми весами, "
        "а не продолжить тот же эксперимент: маленькие файлы (шаг, генераторы случайных чисел, курсор данных, "
        "версии) весят килобайты, а без них ветвь после перезапуска расходится с непрерывной сразу (шаг 12.5.3). "
        f"Очередь асинхронного запуска (роллаутов прошлых версий: {run['queued']}) нужно либо сохранить вместе с "
        "версиями поведения, либо явно отбросить — и записать это правило в контрольную точку: иначе после "
        f"перезапуска данные обновления другие. А {na} в манифесте нет по делу: такого состояния у запуска нет, "
        "сохранять нечего."
    )  # fmt: skip


STEP = Step(
    id="12.5.6", make_task=make_task, solve=solve, solution=solution,
    answer=_Answer({"missing": Names(lambda t: COMPONENTS, "компонентов"), "can_resume": Bool()}),
    hint="Сравните манифест с полным списком task_12_5_6['components']. Для каждого отсутствующего компонента "
    "спросите: есть ли у этого запуска такое состояние (очередь — только у асинхронного, учебная программа и "
    "скользящая нормировка — только если они описаны)? Размер файла не важен: генераторы случайных чисел и "
    "курсор данных весят килобайты.",
    traps=(
        Trap("list_right_verdict_wrong", "Список недостающих компонентов верный, а вывод ему противоречит: раз для "
             "честного возобновления чего-то не хватает, продолжить тот же эксперимент с этой контрольной точкой "
             "нельзя. Исправьте can_resume.", override={"can_resume": lambda t: True},
             matches=lambda t, g: names(g) == set(solve(t)["missing"]) and _plain(value(g, "can_resume")) is True),
        Trap("weights_only_resume", "Вы считаете, что раз веса модели и оптимизатор на месте, запуск можно "
             "продолжить. Это восстановление «только весов», выданное за продолжение: без шага и версии, генераторов "
             "случайных чисел, курсора данных, версий компонентов (и очереди у асинхронного запуска) ветвь после "
             "перезапуска расходится с непрерывной сразу.", override={"missing": lambda t: [], "can_resume": lambda t: True},
             matches=lambda t, g: not names(g) or _plain(value(g, "can_resume")) is True),
        Trap("rng_not_needed", "Вы не включили состояния генераторов случайных чисел и/или курсор данных. Они весят "
             "килобайты, но без них после перезапуска другие сэмплы, другой порядок мини-пакетов и повторённые или "
             "пропущенные запросы: это уже другой эксперимент.", **_without(RNG_CURSOR)),
        Trap("queue_irrelevant", "Вы пропустили политику очереди. У асинхронного запуска в момент записи в очереди "
             "лежат роллауты прошлых версий: их нужно сохранить вместе с версиями поведения или явно отбросить по "
             "объявленному правилу — иначе пакеты после перезапуска молча другие.", **_without(("queue",))),
        Trap("not_applicable_listed", "Вы перечислили всё, чего нет в манифесте, включая компоненты, состояния "
             "которых у этого запуска нет (учебная программа или скользящая нормировка наград). Сохранять нужно "
             "состояние, которое есть, а не весь список.", wrong=lambda t, ref: {"missing": absent(t), "can_resume": False},
             matches=lambda t, g: bool(names(g) & set(absent(t)) - set(solve(t)["missing"])) and set(solve(t)["missing"]) <= names(g)),
    ),
)  # fmt: skip
