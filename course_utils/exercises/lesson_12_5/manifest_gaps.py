"""12.5.6 — манифест контрольной точки: чего не хватает для честного возобновления."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from course_utils import guarantees, memory
from course_utils.exercises.answers import Bool, Fields, IdSet, md_table, norm, num
from course_utils.exercises.step import Step, Trap
from course_utils.grading import _plain

# Компонент → (что в нём, что ломается без него); ключи и порядок — guarantees.CHECKPOINT_COMPONENTS.
_COMPONENTS: dict[str, tuple[str, str]] = {
    "model": ("веса модели и адаптеров", "продолжать нечего: политика начинает с нуля"),
    "optimizer": ("состояние оптимизатора: моменты Adam, счётчик шагов", "«холодный» оптимизатор: поправка смещения Adam начинается заново, первые шаги другой величины"),
    "lr_scheduler": ("положение планировщика скорости обучения", "прогрев начинается заново: скорость обучения скачет, траектория другая"),
    "step_and_version": ("глобальный шаг и версия политики", "роллауты получают неверные версии, задержка политики считается неверно, журнал перезаписывает старые шаги"),
    "rng_states": ("состояния генераторов случайных чисел (Python, NumPy, torch на каждом ранге)", "другие сэмплы и другой порядок мини-пакетов: ветвь расходится сразу после перезапуска"),
    "data_cursor": ("положение в потоке запросов: эпоха, индекс, порядок перемешивания", "одни запросы повторяются, другие пропускаются"),
    "curriculum": ("состояние учебной программы или планировщика задач (если она есть)", "сложность откатывается к первому уровню"),
    "reward_normalizer": ("скользящая статистика нормировки наград и преимуществ (если она есть)", "преимущества нормируются по «пустой» статистике: масштаб обновления скачет"),
    "component_versions": ("версии токенизатора, шаблона, верификатора, среды, схемы роллаута, настройки декодирования, раскладка процессов", "новые роллауты оценит не та проверяющая система, награды разных версий смешаются незаметно"),
    "queue_policy": ("очередь роллаутов «в полёте» с версиями поведения или объявленное правило их отбрасывания (у асинхронного запуска)", "пакет в полёте теряется или пересоздаётся другой политикой: данные обновления меняются незаметно"),
}  # fmt: skip
COMPONENTS = guarantees.CHECKPOINT_COMPONENTS
FEATURE = {"queue_policy": "asynchronous", "curriculum": "curriculum",
           "reward_normalizer": "running_reward_norm"}  # fmt: skip
RNG_CURSOR = ("rng_states", "data_cursor")
_FILES = {"model": "model.safetensors", "optimizer": "optimizer.safetensors",
          "lr_scheduler": "scheduler.json", "step_and_version": "counters.json",
          "rng_states": "rng_states.json", "data_cursor": "data_cursor.json",
          "curriculum": "curriculum.json", "reward_normalizer": "reward_normalizer.json",
          "component_versions": "versions.json", "queue_policy": "queue.jsonl"}  # fmt: skip
_MODELS = ("SmolLM2-360M", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")
_WHY_NA = {"queue_policy": "синхронный запуск, очереди нет", "curriculum": "учебной программы нет",
           "reward_normalizer": "нормировка только внутри группы"}  # fmt: skip


def size(n_bytes: float) -> str:
    """Размер в двоичных единицах: 1 КиБ = 2¹⁰ Б, 1 МиБ = 2²⁰ Б, 1 ГиБ = 2³⁰ Б."""
    for power, unit in ((30, "ГиБ"), (20, "МиБ"), (10, "КиБ")):
        if n_bytes >= 2**power:
            return f"{n_bytes / 2**power:.2f} {unit}"
    return f"{int(n_bytes)} Б"


def applies(component: str, run: dict) -> bool:
    """Есть ли у запуска состояние компонента (безусловные есть всегда)."""
    return component not in FEATURE or bool(run[FEATURE[component]])


def _bytes(rng: random.Random, component: str, run: dict) -> int:
    n = run["num_params"]  # веса bf16 (2 Б), Adam во fp32 с мастер-копией (12 Б)
    return int(
        {
            "model": 2 * n + rng.randint(20_000, 90_000),
            "optimizer": 12 * n + rng.randint(2_000, 9_000),
            "lr_scheduler": rng.randint(900, 2_400),
            "step_and_version": rng.randint(120, 380),
            "rng_states": run["world_size"] * rng.randint(5_600, 6_400) + rng.randint(2_500, 3_000),
            "data_cursor": rng.randint(180, 700),
            "curriculum": rng.randint(400, 2_000),
            "reward_normalizer": rng.randint(90, 260),
            "component_versions": rng.randint(900, 3_200),
            "queue_policy": run["queued"] * rng.randint(9_000, 30_000),
        }[component]
    )  # fmt: skip  (все размеры тянутся из rng: порядок случайных чисел — как был)


def _describe(run: dict) -> str:
    world = "одном GPU" if run["world_size"] == 1 else f"{run['world_size']} GPU"
    return " ".join([
        f"Запуск GRPO: {run['model']} (параметров: {num(run['num_params'])}, веса bf16), AdamW, "
        f"косинусный планировщик скорости обучения с прогревом, обучение на {world}. Сэмплирование "
        "ответов и перемешивание мини-пакетов используют генераторы случайных чисел; запросы "
        "читаются по порядку из перемешанного набора задач; награду выставляет верификатор с версией.",
        f"Асинхронный: сборщики роллаутов (их {run['collectors']}) пишут в очередь, тренер берёт из "
        f"неё пакеты с задержкой политики до {run['max_lag']} версий; в момент записи в очереди "
        f"лежали готовые роллауты прошлых версий (штук: {run['queued']})." if run["asynchronous"]
        else "Синхронный: на каждом шаге сначала генерация, затем обучение; на границе шага "
        "роллаутов «в полёте» нет.",
        "Учебная программа: уровень сложности задач растёт, когда скользящая доля верных ответов "
        f"выше 0.8 (сейчас уровень {run['level']} из 6)." if run["curriculum"]
        else "Учебной программы нет: сложность задач не меняется.",
        "Награды нормируются скользящими средним и дисперсией по всему запуску (алгоритм Уэлфорда), "
        "затем считаются преимущества." if run["running_reward_norm"]
        else "Преимущества нормируются только внутри группы (среднее и СКО наград одной группы); "
        "скользящей статистики нет.",
    ])  # fmt: skip


def make_task(variant: int) -> dict:
    """Варианты 0..3: асинхронный запуск без очереди и генераторов/курсора, одного условного
    компонента у запуска нет; дальше — любые свойства, изредка не хватает только ненужного."""
    rng = random.Random(12_5_6_000 + 7919 * variant)
    model = _MODELS[(variant + rng.randrange(5)) % 5]
    run = {"model": model, "num_params": memory.ModelShape.from_name(model).num_params,
           "world_size": rng.choice([1, 2, 4, 8]), "step": rng.randint(200, 6000),
           "asynchronous": True, "curriculum": False, "running_reward_norm": False}  # fmt: skip
    if variant < 4:
        run["curriculum"], run["running_reward_norm"] = [(True, False), (False, True),
                                                         (False, False), (True, False)][variant]  # fmt: skip
    else:
        run["asynchronous"] = rng.random() < 0.7
        run["curriculum"] = rng.random() < 0.5
        run["running_reward_norm"] = rng.random() < 0.5
    run["collectors"], run["max_lag"] = rng.choice([2, 4, 8]), rng.choice([1, 2, 3])
    run["queued"] = rng.randint(12, 64) if run["asynchronous"] else 0
    run["level"] = rng.randint(2, 5)
    applicable = [c for c in COMPONENTS if applies(c, run)]
    optional = [c for c in applicable if c not in ("model", "optimizer")]
    if variant < 4:
        first = ["queue_policy", rng.choice(RNG_CURSOR)]
        rest = [c for c in optional if c not in first]
        missing = first + rng.sample(rest, rng.choice([0, 1, 2]))
    elif len(COMPONENTS) - len(applicable) >= 2 and rng.random() < 0.2:
        missing = []
    else:
        missing = rng.sample(optional, rng.choice([2, 3, 4]))
    manifest = [{"component": c, "file": _FILES[c], "bytes": _bytes(rng, c, run)}
                for c in applicable if c not in missing]  # fmt: skip
    rng.shuffle(manifest)
    rows = "\n".join(f"| `{e['file']}` | `{e['component']}` | {num(e['bytes'])} | {size(e['bytes'])} |"
                     for e in manifest)  # fmt: skip
    total = sum(e["bytes"] for e in manifest)
    components = ";\n".join(f"- `{c}` — {what}" for c, (what, _) in _COMPONENTS.items())
    statement = (
        f"**Манифест контрольной точки.** {_describe(run)}\n\n"
        f"Последняя контрольная точка `step-{run['step']:06d}` записана атомарно, её "
        "`manifest.json` перечисляет файлы (они же — `task['manifest']`; размеры в байтах и в "
        "двоичных единицах, 1 КиБ = 2¹⁰ Б, 1 ГиБ = 2³⁰ Б):\n\n"
        "| файл | компонент | байт | размер |\n|---|---|---|---|\n"
        f"{rows}\n| **итого** | | {num(total)} | {size(total)} |\n\n"
        "Полный список компонентов контрольной точки RL-запуска (шаг 12.5.1, "
        f"`guarantees.CHECKPOINT_COMPONENTS`, он же `task['components']`):\n\n{components}.\n\n"
        "Компонент **нужен**, если без него продолжение — уже не тот же эксперимент. Компонент, "
        "состояния которого у этого запуска просто нет, сохранять не нужно.\n\nНайдите:\n"
        "1. `missing` — список компонентов, которых нет в манифесте и без которых честное "
        "возобновление невозможно (имена из списка выше, порядок не важен; `[]`, если таких нет);\n"
        "2. `can_resume` — `True`, если с этой контрольной точкой запуск можно честно продолжить, "
        "иначе `False`.\n\n"
        'Ответ — словарь `{"missing": [...], "can_resume": …}`, например '
        '`{"missing": ["lr_scheduler"], "can_resume": False}`.'
    )
    return {"statement": statement, "run": run, "manifest": manifest,
            "components": {c: what for c, (what, _) in _COMPONENTS.items()}}  # fmt: skip


def absent(task: dict) -> list[str]:
    """Все компоненты, которых нет в манифесте (и нужные, и те, которых у запуска нет)."""
    have = {e["component"] for e in task["manifest"]}
    return [c for c in COMPONENTS if c not in have]


class _Ref(dict):
    """Верный ответ; ``present`` — что есть в манифесте (для отзыва, в сравнении не участвует)."""

    present: tuple[str, ...] = ()


def solve(task: dict) -> dict:
    ref = _Ref(missing=[c for c in absent(task) if applies(c, task["run"])])
    ref["can_resume"] = not ref["missing"]
    ref.present = tuple(e["component"] for e in task["manifest"])
    return ref


@dataclass(frozen=True)
class Names(IdSet):
    """Набор имён; имя можно взять в кавычки или обратные кавычки; ``listed`` — показать допустимые."""

    listed: bool = False

    @staticmethod
    def clean(given: Any) -> Any:
        g = _plain(given)
        if not isinstance(g, (list, tuple, set, frozenset)):
            return g
        return [x.strip().strip("`'\" ") if isinstance(x, str) else x for x in g]

    def problem(self, given: Any, task: dict) -> str | None:
        bad = super().problem(self.clean(given), task)
        if bad and self.listed and bad.startswith("Таких"):
            bad += f" Допустимы: {', '.join(self.universe(task))}."
        return bad

    def same(self, expected: Any, given: Any) -> bool:
        return super().same(expected, self.clean(given))

    def mismatch(self, expected: Any, given: Any) -> str:
        return super().mismatch(expected, self.clean(given))


def value(given: dict, key: str) -> Any:
    """Значение ответа-словаря по ключу (регистр ключа не важен)."""
    return {norm(k): v for k, v in given.items()}[norm(key)]


def names(given: dict, key: str = "missing") -> set:
    """Нормализованное множество имён ответа по ключу."""
    return {norm(x) for x in Names.clean(value(given, key))}


def _can(given: dict) -> bool:
    return bool(_plain(value(given, "can_resume")))


class _Answer(Fields):
    def mismatch(self, expected: Any, given: Any) -> str:
        missing, need = names(given), set(expected["missing"])
        present = sorted(missing & set(getattr(expected, "present", ())))
        notes = [f"в манифесте есть {', '.join(present)}: это не отсутствующие компоненты"] * bool(
            present
        )
        extra = missing - need - set(present)
        if extra or need - missing:
            notes.append(f"нужных отсутствующих компонентов: {len(need)}; вы верно назвали "
                         f"{len(need & missing)}, лишних (не нужных этому запуску) в ответе: {len(extra)}")  # fmt: skip
        if _can(given) is not expected["can_resume"]:
            notes.append("значение can_resume не согласуется с тем, чего не хватает")
        text = "; ".join(notes) or "ответ не совпал с верным"
        return text[:1].upper() + text[1:] + "."


def _without(dropped: tuple[str, ...]):
    def wrong(task: dict, ref: dict) -> dict:
        return {**ref, "missing": [c for c in ref["missing"] if c not in dropped]}

    def matches(task: dict, given: dict) -> bool:
        need, got = set(solve(task)["missing"]), names(given)
        return (
            bool(need & set(dropped))
            and not got & set(dropped)
            and need - set(dropped) <= got <= set(absent(task))
        )

    return {"wrong": wrong, "matches": matches}


def _not_applicable(task: dict, given: dict) -> bool:
    na = {c for c in absent(task) if not applies(c, task["run"])}
    got = names(given)
    return bool(got & na) and set(solve(task)["missing"]) <= got


def solution(task: dict, ref: dict) -> str:
    run, have = task["run"], {e["component"]: e["bytes"] for e in task["manifest"]}
    rows = []
    for c, (_, breaks) in _COMPONENTS.items():
        if c in have:
            rows.append([f"`{c}`", f"да, {size(have[c])}", "да", "есть"])
        elif applies(c, run):
            rows.append([f"`{c}`", "нет", "да", f"**не хватает**: {breaks}"])
        else:
            rows.append([f"`{c}`", "нет", f"нет: {_WHY_NA[c]}", "не нужен"])
    total, big = sum(have.values()), have.get("model", 0) + have.get("optimizer", 0)
    listed = ", ".join(f'"{c}"' for c in ref["missing"])
    text = (
        "Идём по полному списку `guarantees.CHECKPOINT_COMPONENTS` и для каждого компонента "
        "спрашиваем: есть ли он в манифесте и есть ли у этого запуска такое состояние.\n\n"
        + md_table(["компонент", "в манифесте", "у этого запуска", "вывод"], rows)
        + f'\n\n**Ответ:** `{{"missing": [{listed}], "can_resume": {ref["can_resume"]}}}`.\n\n'
        f"Веса и оптимизатор — {size(big)} из {size(total)} манифеста, почти весь объём. "
        "Но восстановить только их — значит перезапустить обучение с тёплыми весами, а не "
        "продолжить тот же эксперимент: маленькие файлы (шаг, генераторы случайных чисел, курсор "
        "данных, версии) весят килобайты, а без них ветвь после перезапуска расходится с "
        "непрерывной сразу (шаг 12.5.3)."
    )
    if run["asynchronous"]:
        text += (f" Очередь асинхронного запуска (роллаутов прошлых версий: {run['queued']}) нужно "
                 "либо сохранить вместе с версиями поведения, либо явно отбросить — и записать это "
                 "правило в контрольную точку: иначе после перезапуска данные обновления другие.")  # fmt: skip
    na = [c for c in absent(task) if not applies(c, run)]
    if na:
        text += (f" А {', '.join(f'`{c}`' for c in na)} в манифесте нет по делу: такого состояния у "
                 "запуска нет, сохранять нечего.")  # fmt: skip
    return text


STEP = Step(
    id="12.5.6", make_task=make_task, solve=solve, solution=solution,
    answer=_Answer({"missing": Names(lambda t: COMPONENTS, "компонентов", listed=True),
                    "can_resume": Bool()}),
    hint="Сравните манифест с полным списком task['components']. Для каждого отсутствующего "
    "компонента спросите: есть ли у этого запуска такое состояние (очередь — только у "
    "асинхронного, учебная программа и скользящая нормировка — только если они описаны)? "
    "Размер файла не важен: генераторы случайных чисел и курсор данных весят килобайты.",
    traps=(
        Trap("weights_only_resume",
             "Вы считаете, что раз веса модели и оптимизатор на месте, запуск можно продолжить. "
             "Это восстановление «только весов», выданное за продолжение: без шага и версии, "
             "генераторов случайных чисел, курсора данных, версий компонентов (и очереди у "
             "асинхронного запуска) ветвь после перезапуска расходится с непрерывной сразу.",
             override={"missing": lambda t: [], "can_resume": lambda t: True},
             matches=lambda t, g: bool(solve(t)["missing"]) and (not names(g) or _can(g))),
        Trap("rng_not_needed",
             "Вы не включили состояния генераторов случайных чисел и/или курсор данных. Они "
             "весят килобайты, но без них после перезапуска другие сэмплы, другой порядок "
             "мини-пакетов и повторённые или пропущенные запросы: это уже другой эксперимент.",
             **_without(RNG_CURSOR)),
        Trap("queue_irrelevant",
             "Вы пропустили политику очереди. У асинхронного запуска в момент записи в "
             "очереди лежат роллауты прошлых версий: их нужно сохранить вместе с версиями "
             "поведения или явно отбросить по объявленному правилу — иначе пакеты после "
             "перезапуска молча другие.",
             **_without(("queue_policy",))),
        Trap("not_applicable_listed",
             "Вы перечислили всё, чего нет в манифесте, включая компоненты, состояния которых "
             "у этого запуска нет (учебная программа, скользящая нормировка наград или очередь "
             "синхронного запуска). Сохранять нужно состояние, которое есть, а не весь список.",
             wrong=lambda t, ref: {"missing": absent(t), "can_resume": False},
             matches=_not_applicable),
    ),
)  # fmt: skip
