"""Проверочные шаги урока 12.5: манифест контрольной точки (12.5.6), интервал Янга (12.5.7),
связки трасс (12.5.8), статистика по журналу запуска (12.5.9).

Модуль регистрирует упражнения при импорте. Верные ответы считают модули курса:
``guarantees.CHECKPOINT_COMPONENTS`` (полный список компонентов контрольной точки),
``checkpoint.young_interval`` и ``checkpoint.checkpoint_overhead`` (I* = √(2CM), H(I) = C/I + I/(2M)),
``tracing`` (``TraceTables``, ``find_orphans``, ``verifier_mismatches``, ``percentiles``) и
``throughput.degenerate_group_share`` — поэтому упражнения и библиотека не могут разойтись.
torch при импорте модуля не загружается.

Устройство: сначала общие помощники (числа, идентификаторы, проверка формы ответа, отзыв без
раскрытия верного значения), затем по разделу на каждый шаг ``# ==== 12.5.k — …``. Типичная
ошибка узнаётся семейством (``Family`` из ``exercises.common``): канонический неверный ответ +
правило ``accepts``, которое узнаёт ту же ошибку в ином виде.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from course_utils import guarantees, memory, throughput, tracing
from course_utils.checkpoint import checkpoint_overhead, daly_interval, young_interval
from course_utils.exercises.common import (
    Family as _Family,
    get_key as _get,
    is_num as _is_num,
    norm as _norm,
    norm_dict as _norm_dict,
)
from course_utils.grading import Exercise, Misconception, answers_match, register

# ---------------------------------------------------------------- общее
RTOL = 1e-2
_TOL = "относительный допуск 1 % (rtol = 1e-2)"


def _plain(x: Any) -> Any:
    """numpy / torch / pandas → встроенные числа и списки Python."""
    if type(x).__module__.split(".")[0] in ("numpy", "torch", "pandas") and hasattr(x, "tolist"):
        return (x.detach().cpu() if hasattr(x, "detach") else x).tolist()
    return x


def _num(x: Any) -> float | None:
    """Конечное число ответа (numpy тоже) или None."""
    x = _plain(x)
    return float(x) if _is_num(x) else None


def _close(expected: float, given: Any, rtol: float = RTOL) -> bool:
    """|given − expected| ≤ rtol·|expected| (+1e-12 на случай нуля)."""
    g = _num(given)
    return g is not None and abs(g - expected) <= rtol * abs(expected) + 1e-12


def _bool(x: Any) -> bool | None:
    x = _plain(x)
    return x if isinstance(x, bool) else None


def _ids(x: Any) -> set[str] | None:
    """Список (кортеж, множество, массив, Series) строк → нормализованное множество; иначе None.

    Регистр, лишние пробелы, обратные кавычки и кавычки вокруг имени не важны.
    """
    x = _plain(x)
    if isinstance(x, str) or not isinstance(x, (list, tuple, set, frozenset)):
        return None
    out = set()
    for item in x:
        item = _plain(item)
        if not isinstance(item, str):
            return None
        out.add(_norm(item).strip("`'\" "))
    return out


def _compare_with(same: Callable[[Any, Any], bool]) -> Callable[[Any, Any, float], bool]:
    """Сравнение для Exercise.compare: семейство ошибки — своим правилом, верный ответ — ``same``."""

    def compare(expected: Any, given: Any, rtol: float) -> bool:
        if isinstance(expected, _Family):
            return answers_match(dict(expected), given, rtol) or bool(expected.accepts(given))
        return bool(same(expected, given))

    return compare


def _family(ref: dict, wrong: dict, accepts: Callable[[Any], bool]) -> _Family:
    """Семейство: канонический ответ = верный с подменой ``wrong``; узнаёт ответы с accepts."""
    return _Family({**ref, **wrong}, accepts)


def _distinct(values: Iterable[float], rel: float = 0.03) -> bool:
    """Значения попарно различимы с запасом rel (иначе ошибка совпала бы с верным ответом)."""
    vals = list(values)
    return all(
        abs(a - b) > rel * max(abs(a), abs(b)) for i, a in enumerate(vals) for b in vals[i + 1 :]
    )


# Проверки значения одного ключа ответа: вернуть текст проблемы или None.
def _number_check(share: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        v = _num(value)
        if v is None:
            return f"нужно конечное число, получено {_plain(value)!r}"
        if v < 0:
            return f"величина неотрицательна, получено {v!r}"
        if share and v > 1 + 1e-9:
            return f"нужна доля от 0 до 1 (не проценты), получено {v!r}"
        return None

    return check


def _choice_check(choices: dict[str, str]) -> Callable[[Any], str | None]:
    """Строка из словаря «нормализованное написание → каноническое значение»."""
    allowed = ", ".join(f'"{c}"' for c in dict.fromkeys(choices.values()))

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or _norm(value).strip("`'\" .") not in choices:
            return f"ожидается одна из строк {allowed}, получено {value!r}"
        return None

    return check


def _bool_check(value: Any) -> str | None:
    return None if _bool(value) is not None else f"нужно True или False, получено {value!r}"


def _ids_check(known: Iterable[str], what: str, example: str) -> Callable[[Any], str | None]:
    """Список строк-идентификаторов из ``known`` (порядок не важен, [] допустим)."""
    known_norm = {_norm(k) for k in known}

    def check(value: Any) -> str | None:
        ids = _ids(value)
        if ids is None:
            return (
                f"нужен список строк — {what}, например [{example!r}] (или []); получено {value!r}"
            )
        unknown = sorted(ids - known_norm)
        if unknown:
            return f"неизвестные {what}: {', '.join(unknown[:5])}"
        return None

    return check


def _shape(keys: Iterable[str]) -> str:
    return "{" + ", ".join(f'"{k}": …' for k in keys) + "}"


def _validate_dict(answer: Any, checks: dict[str, Callable[[Any], str | None]]) -> str | None:
    """Словарь ровно с ключами ``checks`` (регистр не важен); значение ключа проверяет его функция."""
    shape = _shape(checks)
    g = _norm_dict(answer)
    if g is None:
        return f"Ожидается словарь {shape}; получено: {type(answer).__name__}."
    missing = [k for k in checks if _norm(k) not in g]
    extra = [str(k) for k in answer if _norm(k) not in {_norm(x) for x in checks}]
    if missing or extra:
        return (
            f"Ожидается словарь {shape}; не хватает: {', '.join(missing) or '—'}, "
            f"лишние: {', '.join(extra) or '—'}."
        )
    for key, check in checks.items():
        problem = check(g[_norm(key)])
        if problem:
            return f"{key}: {problem}."
    return None


_RATIO_NOTES = ((60, "ровно в 60 раз — спутаны секунды и минуты"),
                (3600, "ровно в 3600 раз — спутаны часы и секунды"),
                (100, "ровно в 100 раз — нужна доля, а не проценты"),
                (2, "ровно в 2 раза"))  # fmt: skip


def _ratio_note(expected: float, given: Any) -> str:
    """Если ответ отличается от верного в «круглое» число раз — подсказка, какое это число."""
    g = _num(given)
    if g is None or not expected or not g:
        return ""
    for factor, text in _RATIO_NOTES:
        if any(abs(r / factor - 1) < 2e-3 for r in (g / expected, expected / g)):
            return f" (отличается {text})"
    return ""


def _sentence(parts: list[str], default: str = "Ответ не совпал с верным") -> str:
    """Части отзыва через «; », первая буква заглавная (остальное как есть), точка в конце."""
    text = "; ".join(parts) or default
    return text[:1].upper() + text[1:] + "."


def _wrong_keys(notes: list[str]) -> str:
    return f"Неверны значения: {'; '.join(notes)}." if notes else "Ответ не совпал с верным."


def _size(n_bytes: float) -> str:
    """Размер для текста в двоичных единицах (1 КиБ = 2¹⁰ Б, 1 МиБ = 2²⁰ Б, 1 ГиБ = 2³⁰ Б)."""
    for power, unit in ((30, "ГиБ"), (20, "МиБ"), (10, "КиБ")):
        if n_bytes >= 2**power:
            return f"{n_bytes / 2**power:.2f} {unit}"
    return f"{int(n_bytes)} Б"


def _fmt_int(n: int) -> str:
    return f"{int(n):,}".replace(",", " ")


def _cell(x: Any) -> str:
    """Ячейка Markdown-таблицы: None → «—»."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "True" if x else "False"
    if isinstance(x, float):
        return f"{x:g}"
    if isinstance(x, (list, tuple)):
        return ", ".join(map(str, x)) or "—"
    return str(x)


def _md_table(rows: list[dict], cols: Iterable[str]) -> str:
    cols = list(cols)
    head = f"| {' | '.join(cols)} |\n|{'---|' * len(cols)}\n"
    return head + "\n".join("| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in rows)


# ================================================================ 12.5.6 — манифест контрольной точки
# Компонент → (что в нём, что ломается без него). Порядок и ключи — guarantees.CHECKPOINT_COMPONENTS.
_COMPONENTS_12_5_6: dict[str, tuple[str, str]] = {
    "model": (
        "веса модели и адаптеров",
        "продолжать нечего: политика начинает с нуля",
    ),
    "optimizer": (
        "состояние оптимизатора: моменты Adam, счётчик шагов",
        "«холодный» оптимизатор: поправка смещения Adam начинается заново, первые шаги другой "
        "величины",
    ),
    "lr_scheduler": (
        "положение планировщика скорости обучения",
        "прогрев начинается заново: скорость обучения скачет, траектория другая",
    ),
    "step_and_version": (
        "глобальный шаг и версия политики",
        "роллауты получают неверные версии, задержка политики считается неверно, журнал "
        "перезаписывает старые шаги",
    ),
    "rng_states": (
        "состояния генераторов случайных чисел (Python, NumPy, torch на каждом ранге)",
        "другие сэмплы и другой порядок мини-пакетов: ветка расходится сразу после перезапуска",
    ),
    "data_cursor": (
        "положение в потоке запросов: эпоха, индекс, порядок перемешивания",
        "одни запросы повторяются, другие пропускаются",
    ),
    "curriculum": (
        "состояние учебной программы или планировщика задач (если она есть)",
        "сложность откатывается к первому уровню",
    ),
    "reward_normalizer": (
        "скользящая статистика нормировки наград и преимуществ (если она есть)",
        "преимущества нормируются по «пустой» статистике: масштаб обновления скачет",
    ),
    "component_versions": (
        "версии токенизатора, шаблона, верификатора, среды, схемы роллаута, настройки "
        "декодирования, раскладка процессов",
        "новые роллауты оценит не та проверяющая система, награды разных версий смешаются "
        "незаметно",
    ),
    "queue_policy": (
        "очередь роллаутов «в полёте» с версиями поведения или объявленное правило их "
        "отбрасывания (у асинхронного запуска)",
        "пакет в полёте теряется или пересоздаётся другой политикой: данные обновления меняются "
        "незаметно",
    ),
}
if tuple(_COMPONENTS_12_5_6) != tuple(guarantees.CHECKPOINT_COMPONENTS):
    raise RuntimeError("12.5.6: список компонентов разошёлся с guarantees.CHECKPOINT_COMPONENTS")

# Условные компоненты: нужны, только если у запуска есть соответствующее свойство.
_FEATURE_12_5_6 = {"queue_policy": "asynchronous", "curriculum": "curriculum",
                   "reward_normalizer": "running_reward_norm"}  # fmt: skip
_RNG_CURSOR = ("rng_states", "data_cursor")
_FILES_12_5_6 = {"model": "model.safetensors", "optimizer": "optimizer.safetensors",
                 "lr_scheduler": "scheduler.json", "step_and_version": "counters.json",
                 "rng_states": "rng_states.json", "data_cursor": "data_cursor.json",
                 "curriculum": "curriculum.json", "reward_normalizer": "reward_normalizer.json",
                 "component_versions": "versions.json", "queue_policy": "queue.jsonl"}  # fmt: skip
_MODELS_12_5_6 = ("SmolLM2-360M", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")


def _applies(component: str, run: dict) -> bool:
    """Есть ли у запуска состояние этого компонента (безусловные компоненты есть всегда)."""
    feature = _FEATURE_12_5_6.get(component)
    return feature is None or bool(run[feature])


def _component_bytes(rng: random.Random, component: str, run: dict) -> int:
    """Правдоподобный размер файла компонента, байт (веса bf16, Adam во fp32 с мастер-копией)."""
    n = run["num_params"]
    sizes = {
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
    }
    return int(sizes[component])


def _task_12_5_6(variant: int) -> dict:
    """Варианты 0..3: асинхронный запуск, не хватает очереди и генераторов/курсора данных, одного
    из условных компонентов у запуска нет (на них узнаются все типичные ошибки). Дальше — любые
    свойства; изредка не хватает только того, чего у запуска и нет (тогда продолжать можно)."""
    rng = random.Random(12_5_6_000 + 7919 * variant)
    model = _MODELS_12_5_6[(variant + rng.randrange(5)) % 5]
    run = {
        "model": model,
        "num_params": memory.ModelShape.from_name(model).num_params,
        "world_size": rng.choice([1, 2, 4, 8]),
        "step": rng.randint(200, 6000),
        "asynchronous": True,
        "curriculum": False,
        "running_reward_norm": False,
    }
    if variant < 4:
        run["curriculum"], run["running_reward_norm"] = [(True, False), (False, True),
                                                         (False, False), (True, False)][variant]  # fmt: skip
    else:
        run["asynchronous"] = rng.random() < 0.7
        run["curriculum"] = rng.random() < 0.5
        run["running_reward_norm"] = rng.random() < 0.5
    run["collectors"] = rng.choice([2, 4, 8])
    run["max_lag"] = rng.choice([1, 2, 3])
    run["queued"] = rng.randint(12, 64) if run["asynchronous"] else 0
    run["level"] = rng.randint(2, 5)
    comps = guarantees.CHECKPOINT_COMPONENTS
    applicable = [c for c in comps if _applies(c, run)]
    optional = [c for c in applicable if c not in ("model", "optimizer")]
    n_absent_na = len(comps) - len(applicable)
    if variant < 4:
        first = ["queue_policy", rng.choice(_RNG_CURSOR)]
        rest = [c for c in optional if c not in first]
        missing = first + rng.sample(rest, rng.choice([0, 1, 2]))
    elif n_absent_na >= 2 and rng.random() < 0.2:
        missing = []  # не хватает только того, чего у запуска нет: продолжать можно
    else:
        missing = rng.sample(optional, rng.choice([2, 3, 4]))
    manifest = [
        {"component": c, "file": _FILES_12_5_6[c], "bytes": _component_bytes(rng, c, run)}
        for c in applicable
        if c not in missing
    ]
    rng.shuffle(manifest)
    rows = "\n".join(
        f"| `{e['file']}` | `{e['component']}` | {_fmt_int(e['bytes'])} | {_size(e['bytes'])} |"
        for e in manifest
    )
    total = sum(e["bytes"] for e in manifest)
    components = ";\n".join(f"- `{c}` — {what}" for c, (what, _) in _COMPONENTS_12_5_6.items())
    statement = (
        f"**Манифест контрольной точки.** {_describe_run_12_5_6(run)}\n\n"
        f"Последняя контрольная точка `step-{run['step']:06d}` записана атомарно, её "
        "`manifest.json` перечисляет файлы (они же — `task['manifest']`; размеры в байтах и в "
        "двоичных единицах, 1 КиБ = 2¹⁰ Б, 1 ГиБ = 2³⁰ Б):\n\n"
        "| файл | компонент | байт | размер |\n|---|---|---|---|\n"
        f"{rows}\n| **итого** | | {_fmt_int(total)} | {_size(total)} |\n\n"
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
            "components": {c: what for c, (what, _) in _COMPONENTS_12_5_6.items()}}  # fmt: skip


def _describe_run_12_5_6(run: dict) -> str:
    world = "одном GPU" if run["world_size"] == 1 else f"{run['world_size']} GPU"
    parts = [
        f"Запуск GRPO: {run['model']} (параметров: {_fmt_int(run['num_params'])}, веса bf16), "
        f"AdamW, косинусный планировщик скорости обучения с прогревом, обучение на {world}. "
        "Сэмплирование ответов и перемешивание мини-пакетов используют генераторы случайных "
        "чисел; запросы читаются по порядку из перемешанного набора задач; награду выставляет "
        "верификатор с версией.",
        (
            f"Асинхронный: сборщики роллаутов (их {run['collectors']}) пишут в очередь, тренер берёт "
            f"из неё пакеты с задержкой политики до {run['max_lag']} версий; в момент записи в "
            f"очереди лежали готовые роллауты прошлых версий (штук: {run['queued']})."
            if run["asynchronous"]
            else "Синхронный: на каждом шаге сначала генерация, затем обучение; на границе шага "
            "роллаутов «в полёте» нет."
        ),
        (
            "Учебная программа: уровень сложности задач растёт, когда скользящая доля верных "
            f"ответов выше 0.8 (сейчас уровень {run['level']} из 6)."
            if run["curriculum"]
            else "Учебной программы нет: сложность задач не меняется."
        ),
        (
            "Награды нормируются скользящими средним и дисперсией по всему запуску (алгоритм "
            "Уэлфорда), затем считаются преимущества."
            if run["running_reward_norm"]
            else "Преимущества нормируются только внутри группы (среднее и СКО наград одной "
            "группы); скользящей статистики нет."
        ),
    ]
    return " ".join(parts)


def _absent_12_5_6(task: dict) -> list[str]:
    """Все компоненты, которых нет в манифесте (и нужные, и те, которых у запуска нет)."""
    have = {e["component"] for e in task["manifest"]}
    return [c for c in guarantees.CHECKPOINT_COMPONENTS if c not in have]


def _reference_12_5_6(task: dict) -> dict:
    needed = [c for c in _absent_12_5_6(task) if _applies(c, task["run"])]
    return {"missing": needed, "can_resume": not needed}


def _given_12_5_6(given: Any) -> tuple[set[str] | None, bool | None]:
    return _ids(_get(given, "missing")), _bool(_get(given, "can_resume"))


def _same_12_5_6(expected: dict, given: Any) -> bool:
    missing, can = _given_12_5_6(given)
    return missing == set(expected["missing"]) and can is expected["can_resume"]


def _mc_weights_only(task: dict) -> _Family:
    ref = _reference_12_5_6(task)

    def accepts(given: Any) -> bool:
        missing, can = _given_12_5_6(given)
        return bool(ref["missing"]) and (missing == set() or can is True)

    return _family(ref, {"missing": [], "can_resume": True}, accepts)


def _mc_dropped_items(task: dict, dropped: Iterable[str]) -> _Family:
    """Ответ = верный без ``dropped`` (прочие компоненты — из отсутствующих в манифесте)."""
    ref, absent, dropped = _reference_12_5_6(task), set(_absent_12_5_6(task)), set(dropped)
    needed = set(ref["missing"])
    wrong = [c for c in ref["missing"] if c not in dropped]

    def accepts(given: Any) -> bool:
        missing, _ = _given_12_5_6(given)
        return (
            missing is not None
            and bool(needed & dropped)
            and not missing & dropped
            and needed - dropped <= missing <= absent
        )

    return _family(ref, {"missing": wrong}, accepts)


def _mc_rng_not_needed(task: dict) -> _Family:
    return _mc_dropped_items(task, _RNG_CURSOR)


def _mc_queue_irrelevant(task: dict) -> _Family:
    return _mc_dropped_items(task, ["queue_policy"])


def _mc_not_applicable(task: dict) -> _Family:
    ref, absent = _reference_12_5_6(task), _absent_12_5_6(task)
    na = {c for c in absent if not _applies(c, task["run"])}

    def accepts(given: Any) -> bool:
        missing, _ = _given_12_5_6(given)
        return missing is not None and bool(missing & na) and set(ref["missing"]) <= missing

    return _family(ref, {"missing": absent, "can_resume": False}, accepts)


def _validate_12_5_6(answer: Any, task: dict) -> str | None:
    comps = guarantees.CHECKPOINT_COMPONENTS
    return _validate_dict(
        answer,
        {"missing": _ids_check(comps, f"имена компонентов (допустимы: {', '.join(comps)})",
                               "rng_states"),
         "can_resume": _bool_check},
    )  # fmt: skip


def _mismatch_12_5_6(expected: dict, answer: Any, task: dict) -> str:
    missing, can = _given_12_5_6(answer)
    missing = missing or set()
    need = set(expected["missing"])
    have = {e["component"] for e in task["manifest"]}
    notes = []
    present = sorted(missing & have)
    if present:
        notes.append(f"в манифесте есть {', '.join(present)}: это не отсутствующие компоненты")
    if missing - need - set(present) or need - missing:
        notes.append(
            f"нужных отсутствующих компонентов: {len(need)}; вы верно назвали "
            f"{len(need & missing)}, лишних (не нужных этому запуску) в ответе: "
            f"{len(missing - need - set(present))}"
        )
    if can is not expected["can_resume"]:
        notes.append("значение can_resume не согласуется с тем, чего не хватает")
    return _sentence(notes)


def _solution_12_5_6(task: dict) -> str:
    run, ref = task["run"], _reference_12_5_6(task)
    have = {e["component"]: e["bytes"] for e in task["manifest"]}
    why_na = {"queue_policy": "синхронный запуск, очереди нет",
              "curriculum": "учебной программы нет",
              "reward_normalizer": "нормировка только внутри группы"}  # fmt: skip
    rows = []
    for c, (_, breaks) in _COMPONENTS_12_5_6.items():
        if c in have:
            rows.append(f"| `{c}` | да, {_size(have[c])} | да | есть |")
        elif _applies(c, run):
            rows.append(f"| `{c}` | нет | да | **не хватает**: {breaks} |")
        else:
            rows.append(f"| `{c}` | нет | нет: {why_na[c]} | не нужен |")
    total = sum(have.values())
    big = have.get("model", 0) + have.get("optimizer", 0)
    listed = ", ".join(f'"{c}"' for c in ref["missing"])
    answer = f'{{"missing": [{listed}], "can_resume": {ref["can_resume"]}}}'
    text = (
        "Идём по полному списку `guarantees.CHECKPOINT_COMPONENTS` и для каждого компонента "
        "спрашиваем: есть ли он в манифесте и есть ли у этого запуска такое состояние.\n\n"
        "| компонент | в манифесте | у этого запуска | вывод |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n\n**Ответ:** `{answer}`.\n\n"
        f"Веса и оптимизатор — {_size(big)} из {_size(total)} манифеста, почти весь объём. "
        "Но восстановить только их — значит перезапустить обучение с тёплыми весами, а не "
        "продолжить тот же эксперимент: маленькие файлы (шаг, генераторы случайных чисел, курсор "
        "данных, версии) весят килобайты, а без них ветка после перезапуска расходится с "
        "непрерывной сразу (шаг 12.5.3)."
    )
    if run["asynchronous"]:
        text += (
            f" Очередь асинхронного запуска (роллаутов прошлых версий: {run['queued']}) нужно "
            "либо сохранить вместе с версиями поведения, либо явно отбросить — и записать это "
            "правило в контрольную точку: иначе после перезапуска данные обновления другие."
        )
    na = [c for c in _absent_12_5_6(task) if not _applies(c, run)]
    if na:
        text += (
            f" А {', '.join(f'`{c}`' for c in na)} в манифесте нет по делу: такого состояния у "
            "запуска нет, сохранять нечего."
        )
    return text


register(
    Exercise(
        id="12.5.6",
        title="Манифест контрольной точки: чего не хватает для честного возобновления",
        make_task=_task_12_5_6,
        reference=_reference_12_5_6,
        solution=_solution_12_5_6,
        hint=(
            "Сравните манифест с полным списком task['components']. Для каждого отсутствующего "
            "компонента спросите: есть ли у этого запуска такое состояние (очередь — только у "
            "асинхронного, учебная программа и скользящая нормировка — только если они описаны)? "
            "Размер файла не важен: генераторы случайных чисел и курсор данных весят килобайты."
        ),
        misconceptions=[
            Misconception(
                "weights_only_resume",
                "Вы считаете, что раз веса модели и оптимизатор на месте, запуск можно продолжить. "
                "Это восстановление «только весов», выданное за продолжение: без шага и версии, "
                "генераторов случайных чисел, курсора данных, версий компонентов (и очереди у "
                "асинхронного запуска) ветка после перезапуска расходится с непрерывной сразу.",
                _mc_weights_only,
            ),
            Misconception(
                "rng_not_needed",
                "Вы не включили состояния генераторов случайных чисел и/или курсор данных. Они "
                "весят килобайты, но без них после перезапуска другие сэмплы, другой порядок "
                "мини-пакетов и повторённые или пропущенные запросы: это уже другой эксперимент.",
                _mc_rng_not_needed,
            ),
            Misconception(
                "queue_irrelevant",
                "Вы пропустили политику очереди. У асинхронного запуска в момент записи в "
                "очереди лежат роллауты прошлых версий: их нужно сохранить вместе с версиями "
                "поведения или явно отбросить по объявленному правилу — иначе пакеты после "
                "перезапуска молча другие.",
                _mc_queue_irrelevant,
            ),
            Misconception(
                "not_applicable_listed",
                "Вы перечислили всё, чего нет в манифесте, включая компоненты, состояния которых "
                "у этого запуска нет (учебная программа, скользящая нормировка наград или очередь "
                "синхронного запуска). Сохранять нужно состояние, которое есть, а не весь список.",
                _mc_not_applicable,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_5_6),
        validate_answer=_validate_12_5_6,
        describe_mismatch=_mismatch_12_5_6,
    )
)


# ================================================================ 12.5.7 — интервал Янга
_KEYS_12_5_7 = ("I_star_min", "H_current", "H_star", "recommend")
_RECOMMEND = {"чаще": "чаще", "реже": "реже", "так же": "так же", "также": "так же"}
_SAME_BAND = 0.10  # «так же»: |I − I*| ≤ 10 % от I*
_WRITE_S = (20, 30, 45, 60, 90, 120, 180, 240, 300, 420, 600)
_MTBF_H = (3, 4, 6, 8, 12, 18, 24, 36, 48, 72)


def _recommend(interval_s: float, optimum_s: float) -> str:
    ratio = interval_s / optimum_s
    if abs(ratio - 1) <= _SAME_BAND:
        return "так же"
    return "чаще" if ratio > 1 else "реже"


def _task_12_5_7(variant: int) -> dict:
    rng = random.Random(12_5_7_000 + 7919 * variant)
    target = ("чаще", "реже", "так же")[variant % 3]
    while True:
        c, m_h = rng.choice(_WRITE_S), rng.choice(_MTBF_H)
        i_star = young_interval(c, m_h * 3600)
        if not (i_star >= 8 * c and m_h * 3600 >= 6 * i_star):  # C ≪ I* ≪ M
            continue
        lo, hi = {"чаще": (1.6, 4.0), "реже": (0.2, 0.55), "так же": (0.95, 1.05)}[target]
        raw = i_star / 60 * rng.uniform(lo, hi)
        i_min = round(raw / 5) * 5 if raw > 40 else round(raw)
        ratio = i_min * 60 / i_star
        margin_ok = abs(ratio - 1) <= 0.07 if target == "так же" else not 0.75 < ratio < 1.3
        if (
            i_min >= 1
            and i_min * 60 >= 3 * c
            and margin_ok
            and _recommend(i_min * 60, i_star) == target
        ):
            break
    statement = (
        f"**Интервал Янга.** Запуск пишет полную контрольную точку за C = {c} с (всё это время "
        f"обучение стоит). По журналу отказов кластера среднее время между отказами запуска "
        f"M = {m_h} ч. Сейчас контрольная точка пишется каждые I = {i_min} мин.\n\n"
        "Модель потерь шага 12.5.1: доля времени на запись и на пересчёт потерянной после отказа "
        "работы\n\n$$H(I) \\approx \\frac{C}{I} + \\frac{I}{2M},\\qquad "
        "I^* = \\sqrt{2CM}$$\n\n(все величины в формулах — в одних единицах; приближение для "
        "C ≪ I ≪ M, без времени перезапуска и коррелированных отказов). Данные — "
        "`task['write_s']` (с), `task['mtbf_h']` (ч), `task['interval_min']` (мин).\n\nНайдите:\n"
        "1. `I_star_min` — оптимальный интервал I*, **в минутах**;\n"
        "2. `H_current` — H при текущем интервале, доля (0.05 = 5 %, не проценты);\n"
        "3. `H_star` — H(I*), доля;\n"
        '4. `recommend` — как менять интервал: `"чаще"` (сохранять чаще: I больше I*), '
        '`"реже"` (I меньше I*) или `"так же"` (I отличается от I* не более чем на 10 %).\n\n'
        'Ответ — словарь `{"I_star_min": …, "H_current": …, "H_star": …, "recommend": …}`; '
        f"числа — {_TOL}, так что I* не округляйте до целых минут."
    )
    return {"statement": statement, "write_s": c, "mtbf_h": m_h, "interval_min": i_min}


def _values_12_5_7(task: dict) -> dict:
    """Верные величины (в секундах и долях) и величины типичных ошибок."""
    c, m_h, i_s = task["write_s"], task["mtbf_h"], task["interval_min"] * 60
    m_s = m_h * 3600
    star = young_interval(c, m_s)
    no_two = math.sqrt(c * m_s)
    mixed = young_interval(c, m_h)  # M в часах подставлено как секунды
    return {
        "m_s": m_s, "i_s": i_s, "star_s": star,
        "H_current": checkpoint_overhead(i_s, c, m_s), "H_star": checkpoint_overhead(star, c, m_s),
        "no_two_s": no_two, "H_no_two": checkpoint_overhead(no_two, c, m_s),
        "mixed_s": mixed, "H_mixed_current": checkpoint_overhead(i_s, c, m_h),
        "H_mixed_star": checkpoint_overhead(mixed, c, m_h),
        "one_current": c / i_s, "one_star": c / star,
    }  # fmt: skip


def _reference_12_5_7(task: dict) -> dict:
    v = _values_12_5_7(task)
    return {"I_star_min": v["star_s"] / 60, "H_current": v["H_current"], "H_star": v["H_star"],
            "recommend": _recommend(v["i_s"], v["star_s"])}  # fmt: skip


def _choice(given: Any, key: str) -> str | None:
    value = _get(given, key)
    return _RECOMMEND.get(_norm(value).strip("`'\" .")) if isinstance(value, str) else None


def _same_12_5_7(expected: dict, given: Any) -> bool:
    return all(_close(expected[k], _get(given, k)) for k in _KEYS_12_5_7[:3]) and (
        _choice(given, "recommend") == expected["recommend"]
    )


def _mc_units_mixed(task: dict) -> _Family:
    v = _values_12_5_7(task)
    wrong = {"I_star_min": v["mixed_s"] / 60, "H_current": v["H_mixed_current"],
             "H_star": v["H_mixed_star"], "recommend": _recommend(v["i_s"], v["mixed_s"])}  # fmt: skip

    def accepts(given: Any) -> bool:
        star = _get(given, "I_star_min")
        return (
            # √(2·C·M_ч) «в секундах» численно равно верному I* в минутах (√3600 = 60), поэтому
            # узнаём только M-в-часах с переводом в минуты и I* в секундах, выданное за минуты.
            any(_close(x, star) for x in (v["mixed_s"] / 60, v["star_s"]))
            or _close(v["H_mixed_current"], _get(given, "H_current"))
            or _close(v["H_mixed_star"], _get(given, "H_star"))
        )

    return _family(_reference_12_5_7(task), wrong, accepts)


def _mc_no_two(task: dict) -> _Family:
    v = _values_12_5_7(task)
    wrong = {"I_star_min": v["no_two_s"] / 60, "H_star": v["H_no_two"],
             "recommend": _recommend(v["i_s"], v["no_two_s"])}  # fmt: skip
    return _family(
        _reference_12_5_7(task),
        wrong,
        lambda given: _close(v["no_two_s"] / 60, _get(given, "I_star_min")),
    )


def _mc_one_term(task: dict) -> _Family:
    v = _values_12_5_7(task)

    def accepts(given: Any) -> bool:
        return _close(v["one_current"], _get(given, "H_current")) or _close(
            v["one_star"], _get(given, "H_star")
        )

    wrong = {"H_current": v["one_current"], "H_star": v["one_star"]}
    return _family(_reference_12_5_7(task), wrong, accepts)


def _validate_12_5_7(answer: Any, task: dict) -> str | None:
    checks = {k: _number_check() for k in _KEYS_12_5_7[:3]}
    return _validate_dict(answer, {**checks, "recommend": _choice_check(_RECOMMEND)})


def _mismatch_12_5_7(expected: dict, answer: Any, task: dict) -> str:
    notes = [
        f"{k}{_ratio_note(expected[k], _get(answer, k))}"
        for k in _KEYS_12_5_7[:3]
        if not _close(expected[k], _get(answer, k))
    ]
    if _choice(answer, "recommend") != expected["recommend"]:
        notes.append("recommend (сравните текущий I с I* в одних единицах)")
    return _wrong_keys(notes)


def _solution_12_5_7(task: dict) -> str:
    c, m_h, i_min = task["write_s"], task["mtbf_h"], task["interval_min"]
    v, ref = _values_12_5_7(task), _reference_12_5_7(task)
    ratio = v["i_s"] / v["star_s"]
    daly = daly_interval(c, v["m_s"]) / 60
    verdict = {
        "чаще": f"текущий интервал в {ratio:.2f} раза длиннее оптимального: после отказа "
        "теряется слишком много работы — сохранять **чаще**",
        "реже": f"текущий интервал составляет {ratio:.2f} от оптимального: запись съедает "
        "слишком много времени — сохранять **реже**",
        "так же": f"текущий интервал отличается от оптимального на {abs(ratio - 1) * 100:.0f} % "
        "(в пределах 10 %), а H около минимума плоская — оставить **так же**",
    }[ref["recommend"]]
    lost_min_day = (ref["H_current"] - ref["H_star"]) * 24 * 60
    saving = (
        f"Переход на I* сберёг бы около {lost_min_day:.0f} мин в сутки."
        if lost_min_day >= 1
        else "Выигрыш от перехода на I* — меньше минуты в сутки."
    )
    answer = {k: (round(x, 4) if isinstance(x, float) else x) for k, x in ref.items()}
    return (
        "Сначала всё в секунды: "
        f"C = {c} с, M = {m_h} ч · 3600 = {_fmt_int(v['m_s'])} с, "
        f"I = {i_min} мин · 60 = {_fmt_int(v['i_s'])} с.\n\n"
        f"$$I^* = \\sqrt{{2CM}} = \\sqrt{{2 \\cdot {c} \\cdot {v['m_s']}}} = {v['star_s']:.1f}\\ "
        f"\\text{{с}} = {ref['I_star_min']:.2f}\\ \\text{{мин}}.$$\n\n"
        f"$$H(I) = \\frac{{C}}{{I}} + \\frac{{I}}{{2M}} = \\frac{{{c}}}{{{v['i_s']}}} + "
        f"\\frac{{{v['i_s']}}}{{2 \\cdot {v['m_s']}}} = {v['one_current']:.4f} + "
        f"{ref['H_current'] - v['one_current']:.4f} = {ref['H_current']:.4f}.$$\n\n"
        "В оптимуме оба слагаемых равны, поэтому "
        f"$H(I^*) = \\sqrt{{2C/M}} = \\sqrt{{2 \\cdot {c}/{v['m_s']}}} = {ref['H_star']:.4f}$ "
        f"({ref['H_star'] * 100:.2f} % времени против {ref['H_current'] * 100:.2f} % сейчас).\n\n"
        f"Вывод: {verdict}. {saving}\n\n"
        f"**Ответ:** `{answer}`.\n\n"
        "Типичные ловушки: M в часах нельзя подставлять рядом с C в секундах; без двойки под "
        "корнем интервал занижен в √2 раза; одно слагаемое C/I забывает работу, потерянную "
        "при отказе. Формула Янга — ориентир: поправка Дейли (`checkpoint.daly_interval`) даёт "
        f"{daly:.2f} мин, а асинхронная запись, время перезапуска и коррелированные отказы "
        "меняют модель."
    )


register(
    Exercise(
        id="12.5.7",
        title="Интервал Янга I* и накладные расходы H(I) против текущего интервала",
        make_task=_task_12_5_7,
        reference=_reference_12_5_7,
        solution=_solution_12_5_7,
        hint=(
            "Переведите всё в секунды: M·3600, I·60. I* = √(2·C·M), ответ — в минутах (/60). "
            "H(I) = C/I + I/(2M) — оба слагаемых, доля (не проценты); H(I*) = √(2C/M). "
            "Если I больше I* более чем на 10 % — «чаще», меньше — «реже», иначе «так же»."
        ),
        misconceptions=[
            Misconception(
                "units_mixed",
                "Смешаны единицы: M дано в часах, C — в секундах, I — в минутах. Переведите всё "
                "в секунды (M·3600, I·60), посчитайте I* и H, и только I* для ответа переведите "
                "в минуты.",
                _mc_units_mixed,
            ),
            Misconception(
                "sqrt_cm_no_two",
                "Вы взяли I* = √(C·M). Минимум H(I) = C/I + I/(2M) находится из "
                "−C/I² + 1/(2M) = 0, то есть I* = √(2CM): без двойки интервал занижен в √2 раза.",
                _mc_no_two,
            ),
            Misconception(
                "overhead_one_term",
                "Вы учли только запись, H = C/I. Отказ отнимает в среднем половину интервала "
                "работы, которую придётся пересчитать: H(I) = C/I + I/(2M). С одним слагаемым "
                "выгоднее всего никогда не сохраняться.",
                _mc_one_term,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_5_7),
        validate_answer=_validate_12_5_7,
        describe_mismatch=_mismatch_12_5_7,
    )
)


# ================================================================ 12.5.8 — связки трасс
_KEYS_12_5_8 = ("orphans", "verifier_mismatches")
_ROLLOUT_COLS = ("rollout_id", "prompt_id", "behavior_policy_version", "verifier_version",
                 "reward", "tokens", "enqueue_time", "dequeue_time", "dropped",
                 "training_batch_id")  # fmt: skip
_BATCH_COLS = ("training_batch_id", "optimizer_step", "trainer_policy_version", "n_rollouts",
               "tokens", "rollout_ids", "complete")  # fmt: skip
_STEP_COLS = ("optimizer_step", "resulting_policy_version", "expected_verifier_version")


def _build_12_5_8(rng: random.Random, variant: int) -> dict:
    """Таблицы трассы асинхронного запуска с обновлением верификатора посреди прогона.

    Шаг k собирает пакет при версии тренера k и публикует k + 1; с шага ``upgrade`` тренер ждёт
    новую версию верификатора. Часть роллаутов пакета оценена ещё старой версией (лежали в
    очереди) — несовпадения; несвежие роллауты (задержка ≥ 1) — не ошибка; отброшенные как
    несвежие, ждавшие в очереди и ещё генерировавшиеся — осиротевшие.
    """
    k0, n_steps = rng.randint(10, 60), rng.choice([3, 4])
    steps = list(range(k0, k0 + n_steps))
    upgrade = rng.choice(steps[1:])
    base = rng.randint(2, 6)
    old, new = f"verifier-{base}", f"verifier-{base + 1}"
    expected = {k: new if k >= upgrade else old for k in steps}
    max_lag, size = rng.choice([1, 2]), rng.choice([4, 5])
    period = rng.uniform(25, 45)
    t0 = period * rng.uniform(5.0, 6.0)  # в таблицах — последние шаги прогона, не первые
    dequeue = {k: round(t0 + (k - k0) * period, 1) for k in steps}
    rows: list[dict] = []

    def add(version: int, verifier: str | None, enq: float | None, deq: float | None,
            dropped: bool = False, step: int | None = None) -> dict:  # fmt: skip
        row = {"behavior_policy_version": version, "verifier_version": verifier,
               "reward": None if verifier is None else float(rng.random() < 0.5),
               "tokens": rng.randint(40, 900), "enqueue_time": enq, "dequeue_time": deq,
               "dropped": dropped, "_step": step}  # fmt: skip
        rows.append(row)
        return row

    for k in steps:
        for _ in range(size):
            lag = rng.choice([0, 0, 1] + [2] * (max_lag == 2))
            lag = min(lag, max_lag)
            enq = round(dequeue[k] - rng.uniform(0.5, period * (lag + 0.9)), 1)
            add(k - lag, expected[k], enq, dequeue[k], step=k)
    # несовпадения: роллаут оценён старой версией и долежал в очереди до шага ≥ upgrade
    late = [r for r in rows if r["_step"] >= upgrade]
    n_mm = rng.choice([1, 2, 2, 3]) if variant < 4 or rng.random() < 0.85 else 0
    for r in rng.sample(late, min(n_mm, len(late))):
        r["behavior_policy_version"] = min(r["behavior_policy_version"], r["_step"] - 1)
        r["verifier_version"] = old
    if rng.random() < 0.3:  # одна реплика верификатора обновилась раньше тренера
        early = [r for r in rows if r["_step"] == upgrade - 1]
        rng.choice(early)["verifier_version"] = new
    # осиротевшие
    for _ in range(rng.choice([1, 2])):  # отброшены как несвежие при извлечении
        k = rng.choice(steps)
        lag = max_lag + rng.choice([1, 2])
        enq = round(dequeue[k] - rng.uniform(period * lag, period * (lag + 0.8)), 1)
        add(k - lag, old if k <= upgrade else rng.choice([old, new]), enq, dequeue[k], True)
    last = steps[-1]
    for _ in range(rng.choice([1, 2])):  # готовы, но к концу прогона не извлечены
        add(last + rng.choice([0, 1]), new, round(dequeue[last] + rng.uniform(1, period), 1), None)
    if rng.random() < 0.5:  # ещё генерировался к концу прогона
        add(last + 1, None, None, None)

    rows.sort(key=lambda r: (r["enqueue_time"] is None, r["enqueue_time"] or 0.0))
    first_id = rng.randint(100, 700)
    prompts = [f"q{rng.randint(1000, 9999)}" for _ in range(len(rows) // 2 + 1)]
    for i, r in enumerate(rows):
        r["rollout_id"] = f"r{first_id + i}"
        r["prompt_id"] = rng.choice(prompts)
        r["training_batch_id"] = None if r["_step"] is None else f"b{r['_step']:04d}"
    batches = []
    for k in steps:
        members = [r for r in rows if r["_step"] == k]
        batches.append({"training_batch_id": f"b{k:04d}", "optimizer_step": k,
                        "trainer_policy_version": k, "n_rollouts": len(members),
                        "tokens": sum(r["tokens"] for r in members),
                        "rollout_ids": [r["rollout_id"] for r in members], "complete": True})  # fmt: skip
    return {
        "rollouts": [{c: r[c] for c in _ROLLOUT_COLS} for r in rows],
        "batches": batches,
        "steps": [
            {
                "optimizer_step": k,
                "resulting_policy_version": k + 1,
                "expected_verifier_version": expected[k],
            }
            for k in steps
        ],  # fmt: skip
        "max_lag": max_lag,
        "horizon_s": round(dequeue[last] + period, 1),
    }


def _trace_tables(task: dict) -> tracing.TraceTables:
    """TraceTables (pandas) из списков словарей условия; prompts — по запросам роллаутов."""
    import pandas as pd

    rollouts = pd.DataFrame(task["rollouts"], columns=list(_ROLLOUT_COLS))
    rollouts["training_batch_id"] = rollouts["training_batch_id"].astype(object)
    counts = rollouts.groupby("prompt_id", sort=False).size()
    prompts = pd.DataFrame({"prompt_id": counts.index.astype(object), "n_rollouts": counts.values})
    batches = pd.DataFrame(task["batches"], columns=list(_BATCH_COLS))
    steps = pd.DataFrame(task["steps"], columns=list(_STEP_COLS))
    return tracing.TraceTables(prompts, rollouts, batches, steps, source="12.5.8",
                               horizon_s=task["horizon_s"])  # fmt: skip


def _values_12_5_8(task: dict) -> dict:
    """Верные списки (через tracing) и списки типичных ошибок; порядок — как в rollouts.

    Соединения pandas не бесплатны, а проверка зовёт это много раз: результат кэшируется по
    содержимому таблиц, наружу отдаётся копия.
    """
    key = json.dumps({k: task[k] for k in ("rollouts", "batches", "steps", "horizon_s")})
    return copy.deepcopy(_values_12_5_8_cached(key))


@functools.lru_cache(maxsize=64)
def _values_12_5_8_cached(key: str) -> dict:
    task = json.loads(key)
    tables = _trace_tables(task)
    orphans = tracing.find_orphans(tables)
    mism = tracing.verifier_mismatches(tables)
    order = [r["rollout_id"] for r in task["rollouts"]]
    trainer = {b["training_batch_id"]: b["trainer_policy_version"] for b in task["batches"]}
    last = max(task["steps"], key=lambda s: s["optimizer_step"])["expected_verifier_version"]
    used = [r for r in task["rollouts"] if r["training_batch_id"] is not None]
    stale = {r["rollout_id"] for r in used
             if r["behavior_policy_version"] != trainer[r["training_batch_id"]]}  # fmt: skip
    mismatches = set(mism["rollout_id"])
    latest_used = {r["rollout_id"] for r in used if r["verifier_version"] != last}
    latest_all = {r["rollout_id"] for r in task["rollouts"] if r["verifier_version"] != last}
    latest_scored = {r["rollout_id"] for r in task["rollouts"]
                     if r["verifier_version"] is not None and r["verifier_version"] != last}  # fmt: skip

    def ordered(ids: Iterable[str]) -> list[str]:
        ids = set(ids)
        return [x for x in order if x in ids]

    return {
        "orphans": ordered(orphans["rollout_id"]),
        "reasons": dict(zip(orphans["rollout_id"], orphans["reason"])),
        "dropped": ordered(orphans.loc[orphans["reason"] == "dropped", "rollout_id"]),
        "verifier_mismatches": ordered(mismatches),
        "mismatch_rows": mism[
            ["rollout_id", "optimizer_step", "verifier_version", "expected_verifier_version"]
        ].to_dict("records"),  # fmt: skip
        "stale": ordered(stale),
        "stale_or_verifier": ordered(stale | mismatches),
        "latest": ordered(latest_used),
        "latest_variants": [latest_used, latest_all, latest_scored],
        "last_expected": last,
    }


def _task_12_5_8(variant: int) -> dict:
    rng = random.Random(12_5_8_000 + 7919 * variant)
    while True:
        data = _build_12_5_8(rng, variant)
        v = _values_12_5_8(data)
        ref_vm = set(v["verifier_mismatches"])
        wrong_vm = [set(v["stale"]), set(v["stale_or_verifier"]), *v["latest_variants"]]
        not_dropped = set(v["orphans"]) - set(v["dropped"])
        if (
            v["dropped"]
            and not_dropped
            and v["stale"]
            and all(w != ref_vm for w in wrong_vm)
            and set(v["stale_or_verifier"]) not in v["latest_variants"]
            and set(v["stale"]) not in v["latest_variants"]
            and (ref_vm or variant >= 4)
        ):
            break
    statement = (
        "**Связки трасс.** Последние шаги асинхронного запуска: сборщики пишут роллауты в очередь, "
        f"тренер собирает из неё пакеты (допустимая задержка политики — до {data['max_lag']} "
        "версий; более "
        "старые роллауты при извлечении отбрасываются как несвежие). Посреди прогона "
        "проверяющую систему обновили. Три таблицы трассы с идентификаторами цепочки шага "
        "12.5.2 (они же — `task['rollouts']`, `task['batches']`, `task['steps']`; удобно "
        "`pd.DataFrame(task['rollouts'])`; время — секунды от старта, «—» — нет значения):\n\n"
        f"**rollouts**\n\n{_md_table(data['rollouts'], _ROLLOUT_COLS)}\n\n"
        f"**batches** (журнал тренера; пакет шага k собран при версии тренера k)\n\n"
        f"{_md_table(data['batches'], _BATCH_COLS)}\n\n"
        f"**steps**\n\n{_md_table(data['steps'], _STEP_COLS)}\n\n"
        "Соедините таблицы (роллаут → пакет → шаг оптимизатора) и найдите:\n"
        "1. `orphans` — осиротевшие роллауты: сгенерированы (или ещё генерировались), но не "
        "попали ни в один обучающий пакет, так что их работа не дошла ни до одного шага "
        "оптимизатора;\n"
        "2. `verifier_mismatches` — роллауты, попавшие в пакет, чья версия верификатора не та, "
        "которую ждал шаг оптимизатора этого пакета (`expected_verifier_version`).\n\n"
        'Ответ — словарь `{"orphans": [...], "verifier_mismatches": [...]}` со списками '
        "`rollout_id` (строки, порядок не важен; `[]`, если таких нет). Сверить себя после "
        "проверки можно с `tracing.find_orphans` и `tracing.verifier_mismatches`."
    )
    return {"statement": statement, **data}


def _reference_12_5_8(task: dict) -> dict:
    v = _values_12_5_8(task)
    return {"orphans": v["orphans"], "verifier_mismatches": v["verifier_mismatches"]}


def _same_12_5_8(expected: dict, given: Any) -> bool:
    return all(_ids(_get(given, k)) == {_norm(x) for x in expected[k]} for k in _KEYS_12_5_8)


def _given_ids(given: Any, key: str) -> set[str] | None:
    return _ids(_get(given, key))


def _norm_set(ids: Iterable[str]) -> set[str]:
    return {_norm(x) for x in ids}


def _mc_dropped_not_orphans(task: dict) -> _Family:
    v = _values_12_5_8(task)
    wrong = [x for x in v["orphans"] if x not in set(v["dropped"])]
    return _family(
        _reference_12_5_8(task),
        {"orphans": wrong},
        lambda given: bool(v["dropped"]) and _given_ids(given, "orphans") == _norm_set(wrong),
    )


def _mc_policy_versions(task: dict) -> _Family:
    v = _values_12_5_8(task)
    options = [_norm_set(v["stale_or_verifier"]), _norm_set(v["stale"])]
    return _family(
        _reference_12_5_8(task),
        {"verifier_mismatches": v["stale_or_verifier"]},
        lambda given: _given_ids(given, "verifier_mismatches") in options,
    )


def _mc_latest_version(task: dict) -> _Family:
    v = _values_12_5_8(task)
    options = [_norm_set(x) for x in v["latest_variants"]]
    return _family(
        _reference_12_5_8(task),
        {"verifier_mismatches": v["latest"]},
        lambda given: _given_ids(given, "verifier_mismatches") in options,
    )


def _validate_12_5_8(answer: Any, task: dict) -> str | None:
    ids = [r["rollout_id"] for r in task["rollouts"]]
    check = _ids_check(ids, "идентификаторы роллаутов (rollout_id из таблицы rollouts)", ids[0])
    return _validate_dict(answer, {k: check for k in _KEYS_12_5_8})


def _mismatch_12_5_8(expected: dict, answer: Any, task: dict) -> str:
    notes = []
    for key in _KEYS_12_5_8:
        given, ref = _given_ids(answer, key) or set(), _norm_set(expected[key])
        if given != ref:
            notes.append(
                f"в {key} верных роллаутов {len(ref)}, вы верно назвали {len(ref & given)}, "
                f"лишних в ответе {len(given - ref)}"
            )
    return _sentence(notes)


def _solution_12_5_8(task: dict) -> str:
    v, ref = _values_12_5_8(task), _reference_12_5_8(task)
    by_id = {r["rollout_id"]: r for r in task["rollouts"]}
    orphan_rows = "\n".join(
        f"| `{rid}` | {_cell(by_id[rid]['enqueue_time'])} | {_cell(by_id[rid]['dequeue_time'])} "
        f"| {_cell(by_id[rid]['dropped'])} | {tracing.ORPHAN_REASONS[v['reasons'][rid]]} |"
        for rid in v["orphans"]
    )
    mm_rows = "\n".join(
        f"| `{m['rollout_id']}` | {m['optimizer_step']} | `{m['verifier_version']}` | "
        f"`{m['expected_verifier_version']}` |"
        for m in v["mismatch_rows"]
    )
    mm_table = (
        "| rollout_id | шаг | verifier_version | ждал шаг |\n|---|---|---|---|\n" + mm_rows
        if mm_rows
        else "Таких роллаутов нет: каждый пакет оценён той версией, которую ждал его шаг."
    )
    code = (
        "```python\nimport pandas as pd\n"
        "r, b, s = (pd.DataFrame(task[k]) for k in ('rollouts', 'batches', 'steps'))\n"
        "chain = (r.merge(b.drop(columns=['rollout_ids', 'tokens']), on='training_batch_id', "
        "how='left')\n         .merge(s, on='optimizer_step', how='left'))\n"
        "orphans = chain.loc[chain.training_batch_id.isna(), 'rollout_id']\n"
        "used = chain[chain.optimizer_step.notna()]\n"
        "bad = used.loc[used.verifier_version != used.expected_verifier_version, 'rollout_id']\n"
        "```"
    )
    stale_only = [x for x in v["stale"] if x not in set(v["verifier_mismatches"])]
    return (
        "Цепочка шага 12.5.2: роллаут → `training_batch_id` → пакет → `optimizer_step` → шаг "
        "(и его `expected_verifier_version`). Левое соединение сохраняет роллауты без пакета:\n\n"
        f"{code}\n\n"
        "**Осиротевшие** — `training_batch_id` пуст, по любой причине (так считает "
        "`tracing.find_orphans`):\n\n| rollout_id | enqueue_time | dequeue_time | dropped | "
        f"причина |\n|---|---|---|---|---|\n{orphan_rows}\n\n"
        "Отброшенные как несвежие — тоже сироты: генерация и проверка потрачены, а ни до "
        "одного обновления работа не дошла. Отбрасывание — законное правило очереди, но его "
        "нужно считать (лекция: «число потерянных роллаутов»).\n\n"
        f"**Несовпадения версии верификатора** — сверяем с версией, которую ждал *шаг этого "
        f"пакета* (последний шаг ждёт `{v['last_expected']}`, ранние — другую):\n\n{mm_table}\n\n"
        f"**Ответ:** `{ref}`.\n\n"
        f"Не ошибки верификатора: несвежие по политике роллауты ({len(stale_only)} шт., "
        f"например {', '.join(f'`{x}`' for x in stale_only[:3]) or '—'}) — задержка политики "
        "в пределах допуска, это другая ось версий; роллауты без пакета в обновление не "
        "попали, их версии верификатора ни на что не повлияли."
    )


register(
    Exercise(
        id="12.5.8",
        title="Связки трасс: осиротевшие роллауты, несовпадение версий верификатора",
        make_task=_task_12_5_8,
        reference=_reference_12_5_8,
        solution=_solution_12_5_8,
        hint=(
            "Соедините rollouts с batches по training_batch_id и затем со steps по "
            "optimizer_step (левые соединения). Сироты — роллауты без пакета, по любой причине. "
            "Несовпадение — у роллаута из пакета verifier_version ≠ expected_verifier_version "
            "шага этого пакета (не последнего шага); версия политики здесь ни при чём."
        ),
        misconceptions=[
            Misconception(
                "dropped_not_orphans",
                "Вы не посчитали роллауты, отброшенные как несвежие. Отбрасывание — законное "
                "правило очереди, но работа генерации и проверки потеряна и ни до одного шага "
                "оптимизатора не дошла: это тоже осиротевшие роллауты, их число — метрика "
                "надёжности.",
                _mc_dropped_not_orphans,
            ),
            Misconception(
                "mismatch_all_versions",
                "Вы отметили роллауты, чья версия политики поведения отличается от версии "
                "тренера. Это задержка политики (другая ось версий, она в пределах допуска), а "
                "не ошибка проверяющей системы: сравнивайте verifier_version с "
                "expected_verifier_version шага.",
                _mc_policy_versions,
            ),
            Misconception(
                "latest_verifier_everywhere",
                "Вы сравнили все роллауты с последней версией верификатора. Каждый роллаут "
                "сверяется с версией, которую ждал шаг его пакета: пройдите цепочку роллаут → "
                "пакет → шаг, а не берите одну версию на весь прогон.",
                _mc_latest_version,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_5_8),
        validate_answer=_validate_12_5_8,
        describe_mismatch=_mismatch_12_5_8,
    )
)


# ================================================================ 12.5.9 — статистика по журналу
_KEYS_12_5_9 = ("p50", "p95", "p99", "degenerate_share", "informative_groups_per_s")


def _group_share(groups: list[dict]) -> tuple[int, float]:
    """(число групп, доля вырожденных) — через throughput.degenerate_group_share."""
    records = [SimpleNamespace(group_id=g["group_id"], prompt_id=g["group_id"],
                               sample_id=f"{g['group_id']}-{i}",
                               reward={"correctness": float(r)})
               for g in groups for i, r in enumerate(g["rewards"])]  # fmt: skip
    return throughput.degenerate_group_share(records)


def _values_12_5_9(task: dict) -> dict:
    groups, wall = task["groups"], task["wall_s"]
    durations = [d for g in groups for d in g["durations_s"]]
    pooled = tracing.percentiles(durations)
    per = {}
    for g in groups:
        per.setdefault(g["collector"], []).extend(g["durations_s"])
    per_p = {c: tracing.percentiles(d) for c, d in per.items()}
    n, share = _group_share(groups)
    zeros = sum(all(r == 0 for r in g["rewards"]) for g in groups)
    return {
        **pooled,
        "degenerate_share": share,
        "informative_groups_per_s": n / wall * (1 - share),
        "n_groups": n,
        "n_rollouts": len(durations),
        "durations": durations,
        "per_collector": per_p,
        "avg": {q: sum(p[q] for p in per_p.values()) / len(per_p) for q in ("p50", "p95", "p99")},
        "mean": sum(durations) / len(durations),
        "groups_per_s": n / wall,
        "zero_share": zeros / n,
        "zero_rate": n / wall * (1 - zeros / n),
    }


def _task_12_5_9(variant: int) -> dict:
    rng = random.Random(12_5_9_000 + 7919 * variant)
    while True:
        k, size = rng.choice([3, 4]), rng.choice([4, 6, 8])
        counts = [rng.randint(2, 4) for _ in range(k)]
        n = sum(counts)
        slow, base = rng.randrange(k), rng.uniform(6, 20)
        n0, n1 = rng.randint(1, 2), rng.randint(1, max(1, n // 4))
        kinds = ["zero"] * n0 + ["one"] * n1 + ["mixed"] * (n - n0 - n1)
        rng.shuffle(kinds)
        raw, busy = [], {}
        for c, count in enumerate(counts):
            scale = base * (rng.uniform(2.5, 4.0) if c == slow else rng.uniform(0.7, 1.3))
            for _ in range(count):
                durations = [round(scale * math.exp(rng.gauss(0, 0.45)), 1) for _ in range(size)]
                kind = kinds[len(raw)]
                if kind == "mixed":
                    rewards = [1] + [0] + [int(rng.random() < 0.5) for _ in range(size - 2)]
                    rng.shuffle(rewards)
                else:
                    rewards = [int(kind == "one")] * size
                raw.append({"collector": f"collector-{c}", "durations_s": durations,
                            "rewards": rewards})  # fmt: skip
                busy[c] = busy.get(c, 0.0) + max(durations)  # ответы группы генерируются вместе
        rng.shuffle(raw)
        groups = [{"group_id": f"g{i + 1:02d}", **g} for i, g in enumerate(raw)]
        wall = round(max(busy.values()) * rng.uniform(1.05, 1.25))
        task = {"groups": groups, "wall_s": wall, "group_size": size}
        v = _values_12_5_9(task)
        if (
            n - n0 - n1 >= 2
            and _distinct([v["p50"], v["mean"], v["avg"]["p50"]], 0.03)
            and _distinct([v["p95"], v["avg"]["p95"]], 0.05)
            and _distinct([v["p99"], v["avg"]["p99"]], 0.05)
        ):
            break
    table = "\n".join(
        f"| {g['group_id']} | {g['collector']} | {', '.join(f'{d:g}' for d in g['durations_s'])} "
        f"| {' '.join(map(str, g['rewards']))} |"
        for g in groups
    )
    statement = (
        f"**Статистика по журналу запуска.** {k} сборщика роллаутов за время прогона "
        f"W = {wall} с (настенное время от старта до конца) завершили {n} групп по G = {size} "
        "ответов на один запрос. Для каждой группы — сборщик, длительности роллаутов (с, от "
        "начала генерации до готовности с наградой) и награды correctness (1 — верно, 0 — нет); "
        "то же — в `task['groups']` и `task['wall_s']`:\n\n"
        f"| группа | сборщик | длительности, с | награды |\n|---|---|---|---|\n{table}\n\n"
        "Найдите:\n"
        "1. `p50`, `p95`, `p99` — перцентили длительности роллаута по всему запуску, в секундах. "
        "Перцентиль — с линейной интерполяцией, как `numpy.percentile` по умолчанию и "
        "`tracing.percentiles`: для отсортированных $x_0 \\le \\dots \\le x_{n-1}$ "
        "$h = (n-1)\\,q/100$, $p_q = x_{\\lfloor h\\rfloor} + (h - \\lfloor h\\rfloor)"
        "(x_{\\lfloor h\\rfloor+1} - x_{\\lfloor h\\rfloor})$;\n"
        "2. `degenerate_share` — долю вырожденных групп (все награды группы равны, "
        "преимущество нулевое), от 0 до 1;\n"
        "3. `informative_groups_per_s` — информативные группы в секунду.\n\n"
        'Ответ — словарь `{"p50": …, "p95": …, "p99": …, "degenerate_share": …, '
        f'"informative_groups_per_s": …}}`; {_TOL}.'
    )
    return {"statement": statement, **task}


def _reference_12_5_9(task: dict) -> dict:
    v = _values_12_5_9(task)
    return {k: v[k] for k in _KEYS_12_5_9}


def _same_12_5_9(expected: dict, given: Any) -> bool:
    return all(_close(expected[k], _get(given, k)) for k in _KEYS_12_5_9)


def _mc_average_of_percentiles(task: dict) -> _Family:
    v = _values_12_5_9(task)

    def accepts(given: Any) -> bool:
        return any(_close(v["avg"][q], _get(given, q)) for q in ("p95", "p99"))

    return _family(_reference_12_5_9(task), dict(v["avg"]), accepts)


def _mc_mean_as_p50(task: dict) -> _Family:
    v = _values_12_5_9(task)
    return _family(
        _reference_12_5_9(task),
        {"p50": v["mean"]},
        lambda given: _close(v["mean"], _get(given, "p50")),
    )


def _mc_groups_not_informative(task: dict) -> _Family:
    v = _values_12_5_9(task)
    return _family(
        _reference_12_5_9(task),
        {"informative_groups_per_s": v["groups_per_s"]},
        lambda given: _close(v["groups_per_s"], _get(given, "informative_groups_per_s")),
    )


def _mc_all_correct(task: dict) -> _Family:
    v = _values_12_5_9(task)

    def accepts(given: Any) -> bool:
        return _close(v["zero_share"], _get(given, "degenerate_share")) or _close(
            v["zero_rate"], _get(given, "informative_groups_per_s")
        )

    wrong = {"degenerate_share": v["zero_share"], "informative_groups_per_s": v["zero_rate"]}
    return _family(_reference_12_5_9(task), wrong, accepts)


def _validate_12_5_9(answer: Any, task: dict) -> str | None:
    checks = {k: _number_check(share=k == "degenerate_share") for k in _KEYS_12_5_9}
    return _validate_dict(answer, checks)


def _mismatch_12_5_9(expected: dict, answer: Any, task: dict) -> str:
    notes = [
        f"{k}{_ratio_note(expected[k], _get(answer, k))}"
        for k in _KEYS_12_5_9
        if not _close(expected[k], _get(answer, k))
    ]
    return _wrong_keys(notes)


def _solution_12_5_9(task: dict) -> str:
    v, ref = _values_12_5_9(task), _reference_12_5_9(task)
    xs, n = sorted(v["durations"]), v["n_rollouts"]
    rows = []
    for q in (50, 95, 99):
        h = (n - 1) * q / 100
        lo = math.floor(h)
        hi = min(lo + 1, n - 1)
        rows.append(
            f"| p{q} | ({n} − 1)·{q}/100 = {h:.2f} | $x_{{{lo}}}$ = {xs[lo]:g}, "
            f"$x_{{{hi}}}$ = {xs[hi]:g} | {xs[lo]:g} + {h - lo:.2f}·({xs[hi]:g} − {xs[lo]:g}) "
            f"= {ref[f'p{q}']:.3f} |"
        )
    per = "\n".join(
        f"| {c} | {p['p50']:.2f} | {p['p95']:.2f} | {p['p99']:.2f} |"
        for c, p in sorted(v["per_collector"].items())
    )
    degenerate = [g["group_id"] for g in task["groups"] if len(set(g["rewards"])) == 1]
    ones = [g["group_id"] for g in task["groups"] if set(g["rewards"]) == {1}]
    tail = ", ".join(f"{x:g}" for x in xs[-6:])
    answer = {k: round(x, 4) for k, x in ref.items()}
    return (
        f"**Перцентили** — по объединённой выборке всех {n} роллаутов (старшие значения: … "
        f"{tail} с):\n\n| q | h = (n − 1)·q/100 | соседи | $p_q$, с |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n\nПерцентили отдельных сборщиков, с — для сравнения:\n\n"
        f"| сборщик | p50 | p95 | p99 |\n|---|---|---|---|\n{per}\n"
        f"| среднее по сборщикам | {v['avg']['p50']:.2f} | {v['avg']['p95']:.2f} | "
        f"{v['avg']['p99']:.2f} |\n\nСреднее перцентилей — не перцентиль: перцентиль нелинеен, "
        "и хвост медленного сборщика «размывается» быстрыми. Медиана тоже не среднее: при "
        f"длинном правом хвосте среднее ({v['mean']:.3f} с) больше p50.\n\n"
        f"**Вырожденные группы** (все награды равны): {', '.join(degenerate)} — "
        f"{len(degenerate)} из {v['n_groups']}, доля {ref['degenerate_share']:.4f}. Группы, где "
        f"все ответы верны ({', '.join(ones)}), тоже вырождены: преимущество нулевое.\n\n"
        "**Информативные группы в секунду:**\n\n"
        f"$$\\frac{{{v['n_groups']}}}{{{task['wall_s']}}} \\cdot (1 - "
        f"{ref['degenerate_share']:.4f}) = {ref['informative_groups_per_s']:.5f}\\ "
        "\\text{групп/с}.$$\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.5.9",
        title="p50/p95/p99, доля вырожденных групп, информативные группы/с по журналу",
        make_task=_task_12_5_9,
        reference=_reference_12_5_9,
        solution=_solution_12_5_9,
        hint=(
            "Соберите длительности всех роллаутов всех сборщиков в один список и возьмите "
            "numpy.percentile(x, [50, 95, 99]) (линейная интерполяция); не усредняйте "
            "перцентили сборщиков. Вырождена группа, где все награды равны — и все 0, и все 1. "
            "Информативные группы/с = (групп / W) × (1 − доля вырожденных)."
        ),
        misconceptions=[
            Misconception(
                "average_of_percentiles",
                "Вы усреднили перцентили отдельных сборщиков. Перцентиль нелинеен: среднее p95 "
                "сборщиков — не p95 запуска, хвост медленного сборщика размывается. Считайте "
                "перцентили по объединённой выборке всех роллаутов.",
                _mc_average_of_percentiles,
            ),
            Misconception(
                "mean_as_p50",
                "Вы взяли среднее вместо медианы. p50 — середина отсортированной выборки; при "
                "длинном правом хвосте длительностей среднее заметно больше медианы.",
                _mc_mean_as_p50,
            ),
            Misconception(
                "groups_not_informative",
                "Это все группы в секунду. Вырожденная группа (все награды равны) даёт нулевое "
                "преимущество и не учит политику: информативные группы/с = группы/с × (1 − доля "
                "вырожденных групп).",
                _mc_groups_not_informative,
            ),
            Misconception(
                "all_correct_not_degenerate",
                "Вы посчитали вырожденными только группы, где все ответы неверны. Группа, где "
                "все ответы верны, тоже вырождена: награды равны, преимущество нулевое, "
                "градиента нет.",
                _mc_all_correct,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_5_9),
        validate_answer=_validate_12_5_9,
        describe_mismatch=_mismatch_12_5_9,
    )
)

# Шаги 12.5.10–12.5.13 добавляются ниже, каждый своим разделом «# ==== 12.5.k — …».
