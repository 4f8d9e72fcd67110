"""Проверочные шаги урока 12.5: манифест контрольной точки (12.5.6), интервал Янга (12.5.7),
связки трасс (12.5.8), статистика по журналу запуска (12.5.9), функция resume (12.5.10), приём
пакетов целиком (12.5.11), выбор стеков по карте (12.5.12), итоговый диагноз системы (12.5.13).

Модуль регистрирует упражнения при импорте. Верные ответы считают модули курса:
``guarantees.CHECKPOINT_COMPONENTS`` (полный список компонентов контрольной точки),
``checkpoint.young_interval`` и ``checkpoint.checkpoint_overhead`` (I* = √(2CM), H(I) = C/I + I/(2M)),
``tracing`` (``TraceTables``, ``find_orphans``, ``verifier_mismatches``, ``percentiles``) и
``throughput.degenerate_group_share``, ``checkpoint.run_crash_test`` и ``accept_batch``,
``stack_map.choose_stacks``, ``memory.per_rank_state_bytes`` и ``pipeline.critical_path`` —
поэтому упражнения и библиотека не могут разойтись. torch при импорте модуля не загружается
(12.5.10 загружает его при первой проверке: ответ — функция, её прогоняет проверка аварией).

Устройство: сначала общие помощники (числа, идентификаторы, проверка формы ответа, отзыв без
раскрытия верного значения), затем по разделу на каждый шаг ``# ==== 12.5.k — …``. Типичная
ошибка узнаётся семейством (``Family`` из ``exercises.common``): канонический неверный ответ +
правило ``accepts``, которое узнаёт ту же ошибку в ином виде.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import inspect
import json
import math
import random
import tempfile
import time
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from course_utils import fmt, guarantees, memory, pipeline, stack_map, throughput, tracing
from course_utils.checkpoint import checkpoint_overhead, daly_interval, young_interval
from course_utils.exercises.common import (
    CodeFamily,
    Family as _Family,
    get_key as _get,
    is_num as _is_num,
    norm as _norm,
    norm_dict as _norm_dict,
    plain as _plain,
)
from course_utils.grading import Exercise, Misconception, answers_match, register

# ---------------------------------------------------------------- общее
RTOL = 1e-2
_TOL = "относительный допуск 1 % (rtol = 1e-2)"


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
    """Целое с разрядами через неразрывный пробел (fmt.num): 7615616512 → «7 615 616 512»."""
    return fmt.num(int(n))


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
    """Markdown-таблица записей; заголовки — имена полей (ключи task[...]) как `код`."""
    cols = list(cols)
    head = f"| {' | '.join(f'`{c}`' for c in cols)} |\n|{'---|' * len(cols)}\n"
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
        "другие сэмплы и другой порядок мини-пакетов: ветвь расходится сразу после перезапуска",
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
        "данных, версии) весят килобайты, а без них ветвь после перезапуска расходится с "
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
                "асинхронного запуска) ветвь после перезапуска расходится с непрерывной сразу.",
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
    mixed = math.sqrt(2 * c * m_h)  # M в часах подставлено как секунды (young_interval: C ≥ M)
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
        "| `rollout_id` | шаг | `verifier_version` | ждал шаг |\n|---|---|---|---|\n" + mm_rows
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
        "`tracing.find_orphans`):\n\n| `rollout_id` | `enqueue_time` | `dequeue_time` | `dropped` | "
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
        f"| {g['group_id']} | `{g['collector']}` | {', '.join(f'{d:g}' for d in g['durations_s'])} "
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
        f"| `{c}` | {p['p50']:.2f} | {p['p95']:.2f} | {p['p99']:.2f} |"
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


# ================================================================ 12.5.10 — функция resume
# Ответ — функция resume(run_factory, checkpoint_path). Сравнение получает только (эталон, ответ),
# поэтому эталон и типичные ошибки — объекты ResumeUnderTest с числами проверки аварией своего
# варианта. Ответ прогоняется через checkpoint.run_crash_test один раз: итог кэшируется на
# несколько секунд (validate_answer, сравнение с эталоном и с каждой ошибкой, отзыв — одна
# проверка), а состояние запуска сразу после resume сравнивается по компонентам с полным
# восстановлением — так и узнаётся, что именно не восстановлено.
_CRASH_KEYS_12_5_10 = ("total_steps", "crash_at", "checkpoint_every", "seed")
_CRASH_TTL_S = 5.0
_CRASH_CACHE_SIZE = 16
_crash_cache: dict[tuple, tuple[Any, float, dict]] = {}


class ResumeUnderTest:
    """Функция resume вместе с параметрами проверки аварией своего варианта.

    Эталон 12.5.10 — ``ResumeUnderTest(checkpoint.resume_full, params)`` (``key=None``), типичная
    ошибка — та же обёртка над настоящей неверной resume с ``key`` ошибки. Вызов делегирует в
    ``fn``: объект сам по себе рабочая resume, его можно передать в ``run_crash_test``.
    """

    def __init__(self, fn: Callable, params: dict, key: str | None = None, label: str = ""):
        self.fn, self.params, self.key = fn, dict(params), key
        self.label = label or getattr(fn, "__name__", "resume")

    def __call__(self, run_factory: Callable, checkpoint_path: Any) -> Any:
        return self.fn(run_factory, checkpoint_path)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={self.params[k]}" for k in _CRASH_KEYS_12_5_10)
        return f"ResumeUnderTest({self.label}; {args})"


def _resume_except(run_factory: Callable, checkpoint_path: Any, component: str) -> Any:
    """Загружает всё, кроме ``component``: он остаётся как у нового запуска."""
    from course_utils import checkpoint

    run = run_factory()
    state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)
    state[component] = run.state_dict()[component]
    run.load_state_dict(state)
    return run


def _resume_weights_only_12_5_10(run_factory: Callable, checkpoint_path: Any) -> Any:
    """Типичная ошибка: «восстановление» только весов политики, остальное — как у нового запуска."""
    from course_utils import checkpoint

    run = run_factory()
    run.load_weights_only(checkpoint.load_checkpoint(checkpoint_path, config=run.config))
    return run


def _resume_forgot_rng_12_5_10(run_factory: Callable, checkpoint_path: Any) -> Any:
    """Типичная ошибка: всё, кроме состояний генераторов случайных чисел."""
    return _resume_except(run_factory, checkpoint_path, "rng")


def _resume_forgot_cursor_12_5_10(run_factory: Callable, checkpoint_path: Any) -> Any:
    """Типичная ошибка: всё, кроме курсора данных (поток запросов — с начала)."""
    return _resume_except(run_factory, checkpoint_path, "data_cursor")


def _resume_dropped_queue_12_5_10(run_factory: Callable, checkpoint_path: Any) -> Any:
    """Типичная ошибка: очередь «в полёте» отброшена вопреки объявленной политике keep."""
    from course_utils import checkpoint

    run = run_factory()
    run.load_state_dict(checkpoint.load_checkpoint(checkpoint_path, config=run.config), "drop")
    return run


# ключ ошибки → (функция, подпись для разбора)
_WRONG_RESUMES_12_5_10: dict[str, tuple[Callable, str]] = {
    "weights_only": (_resume_weights_only_12_5_10, "только веса: `run.load_weights_only(state)`"),
    "forgot_rng": (_resume_forgot_rng_12_5_10, "всё, кроме генераторов случайных чисел (`rng`)"),
    "forgot_cursor": (_resume_forgot_cursor_12_5_10, "всё, кроме курсора данных (`data_cursor`)"),
    "forgot_queue": (
        _resume_dropped_queue_12_5_10,
        'всё, но очередь отброшена: `run.load_state_dict(state, queue="drop")`',
    ),
}


def _same_state(a: Any, b: Any) -> bool:
    """Побитовое равенство состояний (тензоры torch — torch.equal, словари и списки — рекурсивно)."""
    if type(a).__module__.split(".")[0] == "torch" or type(b).__module__.split(".")[0] == "torch":
        import torch

        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same_state(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _state_diff(given: dict, good: dict) -> list[str]:
    """Компоненты состояния (порядок checkpoint.COMPONENTS), которыми запуск отличается от эталона."""
    from course_utils import checkpoint

    return [c for c in checkpoint.COMPONENTS if not _same_state(given.get(c), good.get(c))]


def _exc_text(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "…"


class _NotARun(Exception):
    """resume вернула не ToyRLRun."""


def _run_crash_12_5_10(fn: Callable, params: dict) -> dict:
    """Проверка аварией со своей resume во временном каталоге; никогда не бросает.

    Итог: result (CrashTestResult или None), error (текст исключения, "not_a_run" или None),
    stage (где упало: "resume" — в самой функции, "steps" — на шагах после восстановления),
    returned (имя типа результата resume), diff (компоненты состояния сразу после resume,
    которые не совпали с полным восстановлением; None — не удалось сравнить).
    """
    from course_utils import checkpoint

    rec: dict[str, Any] = {"result": None, "error": None, "stage": None, "returned": None,
                           "diff": None}  # fmt: skip

    def wrapped(run_factory: Callable, checkpoint_path: Any) -> Any:
        rec["stage"] = "resume"
        run = fn(run_factory, checkpoint_path)
        rec["returned"] = type(run).__name__
        if not isinstance(run, checkpoint.ToyRLRun):
            raise _NotARun(rec["returned"])
        try:
            good = checkpoint.resume_full(run_factory, checkpoint_path)
            rec["diff"] = _state_diff(run.state_dict(), good.state_dict())
        except Exception:
            rec["diff"] = None
        rec["stage"] = "steps"
        return run

    try:
        with tempfile.TemporaryDirectory(prefix="course_12_5_10_") as tmp:
            rec["result"] = checkpoint.run_crash_test(**params, resume=wrapped, workdir=tmp)
    except _NotARun:
        rec["error"] = "not_a_run"
    except (Exception, SystemExit) as exc:
        rec["error"] = _exc_text(exc)
    return rec


def _crash_record(fn: Callable, params: dict) -> dict:
    """Итог проверки аварией для функции fn: из кэша, если ту же функцию проверяли только что."""
    key = (id(fn), tuple(params[k] for k in _CRASH_KEYS_12_5_10))
    hit = _crash_cache.get(key)
    if hit is not None and hit[0] is fn and time.monotonic() - hit[1] <= _CRASH_TTL_S:
        return hit[2]
    rec = _run_crash_12_5_10(fn, {k: params[k] for k in _CRASH_KEYS_12_5_10})
    now = time.monotonic()
    for old in [k for k, (_, t, _) in _crash_cache.items() if now - t > _CRASH_TTL_S]:
        del _crash_cache[old]
    while len(_crash_cache) >= _CRASH_CACHE_SIZE:
        del _crash_cache[next(iter(_crash_cache))]
    _crash_cache[key] = (fn, now, rec)
    return rec


def _passed(rec: dict) -> bool:
    res = rec["result"]
    return (
        rec["error"] is None
        and res is not None
        and res.first_divergence("full") is None
        and len(res.branches["full"]) == res.total_steps
    )


def _classify_12_5_10(rec: dict) -> str:
    """correct, error, ключ типичной ошибки или other — по тому, что не восстановлено."""
    if rec["error"] is not None or rec["result"] is None:
        return "error"
    if _passed(rec):
        return "correct"
    diff = rec["diff"]
    if diff is None or "policy" in diff:
        return "other"
    d = set(diff)
    if {"optimizer", "scheduler"} <= d:
        return "weights_only"
    core = d & {"optimizer", "scheduler", "rng", "data_cursor", "queue"}
    return {frozenset({"rng"}): "forgot_rng", frozenset({"data_cursor"}): "forgot_cursor",
            frozenset({"queue"}): "forgot_queue"}.get(frozenset(core), "other")  # fmt: skip


def _task_12_5_10(variant: int) -> dict:
    rng = random.Random(12_5_10_000 + 7919 * variant)
    every = rng.choice([2, 3, 4])
    s0 = every * rng.choice([1, 2] if every > 2 else [2, 3])
    crash = s0 + (rng.randint(1, every - 1) if every > 1 else 0)
    total = crash + rng.randint(2, 4)
    seed = rng.randint(0, 99)
    params = {"total_steps": total, "crash_at": crash, "checkpoint_every": every, "seed": seed}
    statement = (
        "**Напишите `resume`.** Проверка аварией шага 12.5.3 на учебном запуске "
        f"`checkpoint.ToyRLRun` (seed = {seed}): всего {total} шагов, контрольная точка "
        f"пишется после каждого шага, кратного {every}, авария — сразу после шага {crash}. "
        f"Восстанавливаться придётся с последней полной контрольной точки `step-{s0:06d}` "
        f"(шаг s₀ = ⌊{crash}/{every}⌋·{every} = {s0}); "
        + (
            f"шаг {crash} будет пересчитан"
            if crash == s0 + 1
            else f"шаги {s0 + 1}…{crash} будут пересчитаны"
        )
        + ".\n\n"
        "Напишите функцию\n\n```python\ndef resume(run_factory, checkpoint_path):\n    ...\n"
        "    return run\n```\n\n"
        "Контракт `checkpoint.run_crash_test`: `run_factory()` без аргументов создаёт **новый** "
        "`ToyRLRun` той же конфигурации (seed, гиперпараметры, среда); `checkpoint_path` — "
        "`pathlib.Path` каталога контрольной точки; вернуть нужно запуск, чей следующий "
        f"`step()` — шаг {s0 + 1} **того же** эксперимента.\n\n"
        "Под рукой: `checkpoint.load_checkpoint(path, config=run.config)` — проверенная "
        "загрузка (размеры и SHA-256 файлов, хэш конфигурации), словарь «компонент → "
        "состояние»; компоненты и что ломается без каждого — `checkpoint.COMPONENTS` "
        "(таблицей — `checkpoint.components_frame()`). У запуска: `run.state_dict()`, "
        "`run.load_state_dict(state, queue=None)` (все компоненты сразу; `queue` — что делать "
        "с пакетами «в полёте»: `None` — политика, объявленная в самой контрольной точке) и "
        "`run.load_weights_only(state)`.\n\n"
        f"Проверка: `checkpoint.run_crash_test(total_steps={total}, crash_at={crash}, "
        f"seed={seed}, checkpoint_every={every}, resume=resume)` (параметры — "
        "`task['crash_test']`) строит три ветви. Ответ верен, если ветвь **full** — с вашей "
        f"`resume` — совпадает с непрерывной на всех {total} шагах побитово (так строго — "
        "потому что учебный запуск однопроцессный и детерминированный; от распределённого "
        "запуска требуют сохранить семантику эксперимента, см. шаг 12.5.3). Запустить проверку "
        "можно и самому: `print(checkpoint.run_crash_test(**task['crash_test'], "
        "resume=resume))`.\n\n"
        "Ответ — сама функция: `answer_12_5_10 = resume` (без скобок). Готовая "
        "`checkpoint.resume_full` — для сверки после решения."
    )
    return {"statement": statement, "crash_test": params, "restored_step": s0}


def _reference_12_5_10(task: dict) -> ResumeUnderTest:
    from course_utils import checkpoint

    return ResumeUnderTest(checkpoint.resume_full, task["crash_test"], None, "resume_full")


def _mc_resume(key: str) -> Callable[[dict], ResumeUnderTest]:
    fn, label = _WRONG_RESUMES_12_5_10[key]
    return lambda task: ResumeUnderTest(fn, task["crash_test"], key, label)


def _compare_12_5_10(expected: Any, given: Any, rtol: float) -> bool:
    if not isinstance(expected, ResumeUnderTest) or not callable(given):
        return False
    verdict = _classify_12_5_10(_crash_record(given, expected.params))
    return verdict == ("correct" if expected.key is None else expected.key)


def _validate_12_5_10(answer: Any, task: dict) -> str | None:
    if isinstance(answer, type) or not callable(answer):
        what = "None" if answer is None else type(answer).__name__
        extra = (
            " Похоже, это результат вызова: передайте саму функцию, без скобок."
            if what == "ToyRLRun"
            else ""
        )
        return (
            "Ответ — сама функция resume(run_factory, checkpoint_path), которая возвращает "
            f"восстановленный ToyRLRun: answer_12_5_10 = resume. Получено: {what}.{extra}"
        )
    try:
        inspect.signature(answer).bind(None, None)
    except TypeError:
        return (
            "Функция должна принимать два аргумента — resume(run_factory, checkpoint_path): "
            "так её вызывает checkpoint.run_crash_test."
        )
    except ValueError:
        pass  # сигнатуру не узнать (встроенная функция): проверит сам запуск
    rec = _crash_record(answer, task["crash_test"])
    if rec["error"] == "not_a_run":
        return (
            f"resume должна вернуть восстановленный запуск ToyRLRun, а вернула "
            f"{rec['returned']}: не забыт ли `return run`?"
        )
    return None


def _mismatch_12_5_10(expected: Any, answer: Any, task: dict) -> str:
    from course_utils import checkpoint

    rec = _crash_record(answer, task["crash_test"])
    if rec["error"] is not None:
        where = {
            "resume": "внутри вашей resume",
            "steps": "на шагах после восстановления (запуск, который вернула resume, не работает)",
        }.get(rec["stage"], "до вызова resume")
        return f"Проверка аварией упала {where}: {rec['error']}."
    res = rec["result"]
    step = res.first_divergence("full")
    fields = ", ".join(res.diverged_fields("full", step))
    when = " — сразу после восстановления" if step == res.restored_step + 1 else ""
    text = (
        f"Ветвь full совпадает с непрерывной до шага {step - 1} и расходится на шаге "
        f"{step}{when} (различаются поля события: {fields})"
    )
    diff = rec["diff"]
    if diff:
        notes = "; ".join(f"{c} — {checkpoint.COMPONENTS[c][1]}" for c in diff)
        text += f". Сразу после вашей resume не совпадает с контрольной точкой: {notes}"
    elif diff == []:
        text += (
            ". Состояние запуска сразу после resume совпадает с контрольной точкой, а шаги "
            "расходятся: не подменяет ли resume методы или генераторы запуска?"
        )
    return text + "."


_SOLUTION_CODE_12_5_10 = """```python
from course_utils import checkpoint


def resume(run_factory, checkpoint_path):
    run = run_factory()  # новый запуск той же конфигурации: seed, гиперпараметры, среда
    # проверенная загрузка: размеры, SHA-256 файлов и хэш конфигурации сверяются с manifest.json
    state = checkpoint.load_checkpoint(checkpoint_path, config=run.config)
    # всё состояние сразу; очередь «в полёте» — по политике, объявленной в контрольной точке
    run.load_state_dict(state)
    return run


answer_12_5_10 = resume
```"""


def _branch_row(label: str, rec: dict, total: int) -> str:
    if rec["error"] is not None:
        return f"| {label} | упала: {rec['error']} | — |"
    res = rec["result"]
    step = res.first_divergence("full")
    if step is None:
        return f"| {label} | совпадает на всех {total} шагах | — |"
    fields = ", ".join(res.diverged_fields("full", step))
    diff = ", ".join(f"`{c}`" for c in rec["diff"] or []) or "—"
    return f"| {label} | расходится на шаге {step} ({fields}) | {diff} |"


def _solution_12_5_10(task: dict) -> str:
    from course_utils import checkpoint

    p, s0 = task["crash_test"], task["restored_step"]
    total, crash = p["total_steps"], p["crash_at"]
    ref = _crash_record(checkpoint.resume_full, p)
    rows = [_branch_row("`resume_full` (эталон)", ref, total)]
    rows += [
        _branch_row(label, _crash_record(fn, p), total)
        for fn, label in _WRONG_RESUMES_12_5_10.values()
    ]
    res = ref["result"]
    wo = res.first_divergence("weights_only") if res is not None else None
    wo_text = (
        f"Встроенная ветвь `weights_only` той же проверки совпадает до шага {s0} (эти события — "
        f"общие, до аварии) и расходится на шаге {wo}: сразу после восстановления."
        if wo is not None
        else ""
    )
    return (
        "Восстановление — это продолжение **того же** эксперимента, а не перезапуск с тёплыми "
        "весами. Запуску после аварии нужно всё, что влияет на следующий шаг: веса, моменты "
        "AdamW, положение планировщика, счётчики и версии, генераторы случайных чисел, курсор "
        "данных, учебную программу, нормировщик наград, версии компонентов и очередь роллаутов "
        "«в полёте». Всё это лежит в контрольной точке, и `load_state_dict` загружает всё "
        "сразу, предварительно проверив, что все компоненты на месте:\n\n"
        f"{_SOLUTION_CODE_12_5_10}\n\n"
        f"Проверка варианта: total_steps = {total}, crash_at = {crash}, checkpoint_every = "
        f"{p['checkpoint_every']}, seed = {p['seed']}. Последняя полная контрольная точка — "
        f"после шага s₀ = {s0}; "
        + (
            f"шаг {crash} потерян при аварии и пересчитан заново"
            if crash == s0 + 1
            else f"шаги {s0 + 1}…{crash} потеряны при аварии и пересчитаны заново"
        )
        + " (совпадение пересчёта с потерянными: "
        f"{'да' if res is not None and res.recomputed_identical else 'нет'}). {wo_text}\n\n"
        "Что дают эта функция и типичные ошибки (ветвь full против непрерывной; последний "
        "столбец — компоненты, которые сразу после resume не совпали с контрольной точкой):\n\n"
        "| resume | ветвь full | не восстановлено |\n|---|---|---|\n"
        + "\n".join(rows)
        + '\n\nОчередь: контрольная точка объявляет `on_restore = "keep"`, поэтому пакет, '
        "созданный до аварии старой версией политики, возвращается в очередь. Отбросить его "
        '(`queue="drop"`) — законная, но *другая* политика: она должна быть объявлена, а '
        "продолжение тогда уже не совпадает с непрерывной ветвью. В распределённом запуске "
        "побитового совпадения не требуют, но семантику эксперимента сохраняют так же."
    )


register(
    Exercise(
        id="12.5.10",
        title="Функция resume: ветвь после сбоя совпадает с непрерывной",
        make_task=_task_12_5_10,
        reference=_reference_12_5_10,
        solution=_solution_12_5_10,
        hint=(
            "run = run_factory(); state = checkpoint.load_checkpoint(checkpoint_path, "
            "config=run.config); загрузите ВСЁ состояние, а не только веса: "
            "run.load_state_dict(state) (очередь — по политике, объявленной в контрольной "
            "точке); return run. Проверить себя: "
            "print(checkpoint.run_crash_test(**task['crash_test'], resume=resume))."
        ),
        misconceptions=[
            Misconception(
                "weights_only",
                "Это восстановление «только весов», выданное за продолжение: оптимизатор, "
                "планировщик, генераторы случайных чисел, курсор данных, учебная программа, "
                "нормировщик и очередь — как у нового запуска. Ветвь расходится с непрерывной "
                "сразу после восстановления. Загрузите всё состояние: run.load_state_dict(state).",
                _mc_resume("weights_only"),
            ),
            Misconception(
                "forgot_rng",
                "Не восстановлены состояния генераторов случайных чисел: после перезапуска другие "
                "сэмплированные действия и другой порядок мини-пакетов, и ветвь расходится с "
                "непрерывной на первом же шаге. Генераторы (Python, NumPy, torch) — часть "
                "контрольной точки, компонент rng.",
                _mc_resume("forgot_rng"),
            ),
            Misconception(
                "forgot_cursor",
                "Не восстановлен курсор данных: поток запросов после перезапуска начинается "
                "заново, одни запросы повторяются, другие пропускаются. Компонент data_cursor "
                "(эпоха, индекс, сколько прочитано) нужно загрузить вместе с остальным.",
                _mc_resume("forgot_cursor"),
            ),
            Misconception(
                "forgot_queue",
                "Очередь роллаутов «в полёте» не восстановлена (или отброшена вопреки политике "
                "keep, объявленной в контрольной точке): пакет, созданный до аварии старой "
                "версией политики, пересоздаётся заново текущей, и данные обновления молча "
                "другие. Загрузите queue вместе с остальным (queue=None — объявленная политика).",
                _mc_resume("forgot_queue"),
            ),
        ],
        rtol=RTOL,
        compare=_compare_12_5_10,
        validate_answer=_validate_12_5_10,
        describe_mismatch=_mismatch_12_5_10,
    )
)


# ================================================================ 12.5.11 — пакет целиком или никак
_VERDICTS_12_5_11 = {"accept": "accept", "reject": "reject", "принять": "accept",
                     "принят": "accept", "отклонить": "reject", "отклонен": "reject"}  # fmt: skip
# вид пакета → как он получился (для разбора)
_BATCH_KINDS_12_5_11: dict[str, str] = {
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
_PARTIAL_12_5_11 = ("missing_rollouts", "missing_reward")
_ROLLOUT_COLS_12_5_11 = ("rollout_id", "prompt_id", "policy_version", "reward", "verifier_version")


def _build_batches_12_5_11(rng: random.Random, kinds: list[str], current: str, old: str,
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


def _kinds_12_5_11(rng: random.Random, variant: int) -> list[str]:
    if variant < 4:  # на первых вариантах узнаются все типичные ошибки
        extra = ("mixed_verifier", "old_verifier", "foreign", "mixed_verifier")[variant]
        kinds = ["complete", "policy_mixed", *_PARTIAL_12_5_11, "duplicate", extra]
    else:
        while True:
            kinds = rng.sample(list(_BATCH_KINDS_12_5_11), rng.randint(4, 6))
            if {"complete", "policy_mixed"} & set(kinds) and set(kinds) - {
                "complete",
                "policy_mixed",
            }:
                break
    rng.shuffle(kinds)
    return kinds


def _task_12_5_11(variant: int) -> dict:
    rng = random.Random(12_5_11_000 + 7919 * variant)
    base, max_lag = rng.randint(2, 6), rng.choice([1, 2])
    current, old = f"verifier-{base + 1}", f"verifier-{base}"
    batches = _build_batches_12_5_11(rng, _kinds_12_5_11(rng, variant), current, old, max_lag)
    public = [{k: b[k] for k in ("batch_id", "optimizer_step", "expected_ids", "rollouts")}
              for b in batches]  # fmt: skip
    blocks = []
    for b in public:
        rows = _md_table(b["rollouts"], _ROLLOUT_COLS_12_5_11)
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


def _verdicts_12_5_11(task: dict) -> dict:
    from course_utils import checkpoint

    return {
        b["batch_id"]: checkpoint.accept_batch(
            b["rollouts"], b["expected_ids"], task["verifier_version"]
        )
        for b in task["batches"]
    }


def _reference_12_5_11(task: dict) -> dict:
    return {k: "accept" if v else "reject" for k, v in _verdicts_12_5_11(task).items()}


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


def _given_12_5_11(given: Any) -> dict[str, str] | None:
    g = _norm_dict(given)
    if g is None:
        return None
    out = {}
    for k, v in g.items():
        if not isinstance(v, str):
            return None
        out[k] = _VERDICTS_12_5_11.get(_norm(v).strip("`'\" ."))
    return out


def _same_12_5_11(expected: dict, given: Any) -> bool:
    g = _given_12_5_11(given)
    return g is not None and g == {_norm(k): v for k, v in expected.items()}


def _mc_batches(task: dict, kinds: Iterable[str], flip_to: str) -> _Family:
    """Ошибка: пакеты видов ``kinds`` получили вердикт ``flip_to``; остальные — как у эталона."""
    ref, current, kinds = _reference_12_5_11(task), task["verifier_version"], set(kinds)
    hit = {b["batch_id"] for b in task["batches"] if _kind_of(b, current) in kinds}
    wrong = {k: (flip_to if k in hit else v) for k, v in ref.items()}

    def accepts(given: Any) -> bool:
        g = _given_12_5_11(given)
        if g is None or set(g) != {_norm(k) for k in ref}:
            return False
        flipped = {k for k in ref if g[_norm(k)] != ref[k]}
        return bool(flipped) and flipped <= hit and all(g[_norm(k)] == flip_to for k in flipped)

    return _Family(wrong, accepts)


def _mc_accept_partial(task: dict) -> _Family:
    return _mc_batches(task, _PARTIAL_12_5_11, "accept")


def _mc_accept_duplicates(task: dict) -> _Family:
    return _mc_batches(task, ["duplicate"], "accept")


def _mc_reject_version_change(task: dict) -> _Family:
    return _mc_batches(task, ["policy_mixed"], "reject")


def _validate_12_5_11(answer: Any, task: dict) -> str | None:
    check = _choice_check(_VERDICTS_12_5_11)
    return _validate_dict(answer, {b["batch_id"]: check for b in task["batches"]})


def _mismatch_12_5_11(expected: dict, answer: Any, task: dict) -> str:
    g = _given_12_5_11(answer) or {}
    wrong = [k for k in expected if g.get(_norm(k)) != expected[k]]
    extra_accept = sum(expected[k] == "reject" for k in wrong)
    extra_reject = len(wrong) - extra_accept
    return (
        f"Верно решено пакетов: {len(expected) - len(wrong)} из {len(expected)}. Принято "
        f"пакетов, которые нужно отклонить: {extra_accept}; отклонено пакетов, которые можно "
        f"принять: {extra_reject}."
    )


def _solution_12_5_11(task: dict) -> str:
    verdicts, ref = _verdicts_12_5_11(task), _reference_12_5_11(task)
    current, rows = task["verifier_version"], []
    for b in task["batches"]:
        kind = _kind_of(b, current)
        why = "; ".join(verdicts[b["batch_id"]].reasons) or "все проверки пройдены"
        policy = sorted({r["policy_version"] for r in b["rollouts"]})
        rows.append(
            f"| `{b['batch_id']}` | {len(b['expected_ids'])} / {len(b['rollouts'])} | "
            f"{', '.join(map(str, policy))} | {_BATCH_KINDS_12_5_11[kind]} | {why} | "
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


register(
    Exercise(
        id="12.5.11",
        title="Атомарный приём или отказ частично записанных пакетов",
        make_task=_task_12_5_11,
        reference=_reference_12_5_11,
        solution=_solution_12_5_11,
        hint=(
            "Для каждого пакета сравните множество rollout_id с ожидаемым (ни одного лишнего, "
            "ни одного недостающего, без повторов), проверьте, что у каждого роллаута есть "
            "награда и что все оценены текущей версией верификатора. Версия политики поведения "
            "здесь не критерий: задержка в пределах допуска — норма асинхронного запуска."
        ),
        misconceptions=[
            Misconception(
                "accept_partial",
                "Вы приняли частично записанный пакет: в нём нет части роллаутов или у части нет "
                "награды. Принять «оценённую часть» нельзя: выборка смещается к роллаутам, которые "
                "успели записаться, а награда неизвестной версии молча попадает в обновление. "
                "Пакет принимается целиком или отклоняется.",
                _mc_accept_partial,
            ),
            Misconception(
                "accept_duplicates",
                "Вы приняли пакет, где роллаут записан дважды. Повторная запись после сбоя — "
                "признак того, что пакет собран не так, как задумано: дубликат удвоил бы вес "
                "одного ответа в обновлении. Такой пакет отклоняют и пересобирают.",
                _mc_accept_duplicates,
            ),
            Misconception(
                "reject_all_on_version_change",
                "Вы отклонили полный пакет из-за того, что в нём роллауты разных версий политики. "
                "В асинхронном запуске это норма в пределах допустимой задержки; несовместимы "
                "версии верификатора (награды), а не версии политики поведения.",
                _mc_reject_version_change,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_5_11),
        validate_answer=_validate_12_5_11,
        describe_mismatch=_mismatch_12_5_11,
    )
)


# ================================================================ 12.5.12 — выбор стеков по карте
_REQ_KEYS_12_5_12 = ("nodes", "lora", "multi_turn", "asynchronous", "lag_bound",
                     "training_backend", "generation_engine")  # fmt: skip
# требование → столбцы карты, которые нужны, чтобы его проверить
_REQ_COLUMNS_12_5_12 = {
    "nodes": ("training_backends",),
    "lora": ("lora",),
    "multi_turn": ("multi_turn",),
    "asynchronous": ("synchrony", "placement_synchrony"),
    "lag_bound": ("staleness_control_key", "staleness_default"),
    "training_backend": ("training_backends",),
    "generation_engine": ("generation_engines",),
}


@functools.lru_cache(maxsize=1)
def _stack_frame():
    """Карта стеков из data/stack_map.csv (читается один раз; choose_stacks её не меняет)."""
    return stack_map.load_stack_map()


def _today_12_5_12() -> str:
    """Дата, на которую выбираем: самый свежий снимок карты (choose_stacks не берёт даты раньше)."""
    return max(_stack_frame()["snapshot_date"]).isoformat()


@functools.lru_cache(maxsize=256)
def _stack_choice_cached(req_json: str, today: str, include_unconfirmed: bool):
    return stack_map.choose_stacks(
        _stack_frame(),
        **json.loads(req_json),
        include_unconfirmed=include_unconfirmed,
        today=dt.date.fromisoformat(today),
    )


def _stack_choice(task: dict, include_unconfirmed: bool = False):
    """Таблица choose_stacks для требований задачи (копия: кэш не портится)."""
    req = json.dumps(task["requirements"], sort_keys=True)
    return _stack_choice_cached(req, task["today"], include_unconfirmed).copy()


def _matching(task: dict, include_unconfirmed: bool = False) -> list[str]:
    choice = _stack_choice(task, include_unconfirmed)
    return [s for s, ok in zip(choice["stack"], choice["matches"]) if ok]


_ONLY_LOOSE = "(засчитывается только с include_unconfirmed=True)"  # пометка choose_stacks


def _fastest_stacks() -> list[str]:
    """Стеки с самым большим опубликованным ускорением: по верхней и по нижней границе."""
    speed = stack_map.load_speedups()
    return list(
        dict.fromkeys(
            str(speed.loc[speed[col].idxmax(), "stack"]) for col in ("speedup_high", "speedup_low")
        )
    )


def _stack_key(name: Any) -> str | None:
    """Имя стека без регистра, пробелов, дефисов и подчёркиваний: «NeMo-RL» = «nemo rl»."""
    if not isinstance(name, str):
        return None
    return "".join(ch for ch in _norm(name) if ch not in " -_`'\".")


def _stack_set(given: Any) -> set[str] | None:
    given = _plain(given)
    if isinstance(given, str) or not isinstance(given, (list, tuple, set, frozenset)):
        return None
    keys = {_stack_key(_plain(x)) for x in given}
    return None if None in keys else keys


def _draw_requirements(rng: random.Random) -> dict:
    req = {
        "nodes": rng.choice([None, None, "one", "many"]),
        "lora": rng.choice([None, True, True]),
        "multi_turn": rng.choice([None, True]),
        "asynchronous": rng.choice([None, True, True, False]),
        "lag_bound": None,
        "training_backend": rng.choice([None, None, "FSDP2", "Megatron", "DeepSpeed"]),
        "generation_engine": rng.choice([None, None, "vLLM", "SGLang"]),
    }
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
    if isinstance(x, list):
        text = ", ".join(map(str, x)) or "—"
    elif isinstance(x, dt.date):
        text = x.isoformat()
    else:
        text = str(x)
    return text.replace("|", "\\|")


def _task_12_5_12(variant: int) -> dict:
    rng = random.Random(12_5_12_000 + 7919 * variant)
    today, fastest = _today_12_5_12(), _fastest_stacks()
    while True:
        req = _draw_requirements(rng)
        if len(req) < 3:
            continue
        task = {"requirements": req, "today": today}
        ref, unc = _matching(task), _matching(task, True)
        if not ref:
            continue
        if variant >= 4 or (set(ref) != set(unc) and [set(ref)] != [{s} for s in fastest[:1]]):
            break
    frame = _stack_frame()
    cols = ["stack"] + list(
        dict.fromkeys(c for k in req for c in _REQ_COLUMNS_12_5_12[k])
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
        "`[\"TRL\", \"AReaL\"]`. Требования — `task['requirements']`, дата — `task['today']`; "
        "сверить себя после проверки можно с `stack_map.choose_stacks(frame, "
        "**task['requirements'], today=datetime.date.fromisoformat(task['today']))`."
    )
    return {"statement": statement, "requirements": req, "today": today}


def _reference_12_5_12(task: dict) -> list[str]:
    return _matching(task)


def _same_12_5_12(expected: list, given: Any) -> bool:
    return _stack_set(given) == {_stack_key(s) for s in expected}


def _mc_fastest_number(task: dict) -> CodeFamily:
    ref = {_stack_key(s) for s in _reference_12_5_12(task)}
    options = [{_stack_key(s)} for s in _fastest_stacks()]

    def accepts(given: Any) -> bool:
        g = _stack_set(given)
        return g is not None and g != ref and g in options

    return CodeFamily(_fastest_stacks()[:1], accepts)


def _mc_unconfirmed_as_fact(task: dict) -> CodeFamily:
    ref = {_stack_key(s) for s in _reference_12_5_12(task)}
    loose = _matching(task, True)
    unc = {_stack_key(s) for s in loose}

    def accepts(given: Any) -> bool:
        g = _stack_set(given)
        return g is not None and ref < g <= unc

    return CodeFamily(loose, accepts)


def _compare_12_5_12(expected: Any, given: Any, rtol: float) -> bool:
    if isinstance(expected, CodeFamily):
        return bool(expected.accepts(given))
    return _same_12_5_12(expected, given)


def _validate_12_5_12(answer: Any, task: dict) -> str | None:
    names = list(_stack_frame()["stack"])
    given = _stack_set(answer)
    if given is None:
        return (
            'Ожидается список имён стеков (строки), например ["TRL", "AReaL"] или [], '
            f"получено: {type(answer).__name__}."
        )
    known = {_stack_key(s) for s in names}
    unknown = [str(_plain(x)) for x in _plain(answer) if _stack_key(_plain(x)) not in known]
    if unknown:
        return f"Неизвестные стеки: {', '.join(unknown[:5])}; в карте есть: {', '.join(names)}."
    return None


def _mismatch_12_5_12(expected: list, answer: Any, task: dict) -> str:
    ref, given = {_stack_key(s) for s in expected}, _stack_set(answer) or set()
    return (
        f"Подходящих стеков: {len(ref)}; вы верно назвали {len(ref & given)}, лишних в ответе: "
        f"{len(given - ref)}. Проверьте каждое требование по подтверждённым ячейкам и "
        "ограничения сочетаний."
    )


def _solution_12_5_12(task: dict) -> str:
    strict, loose = _stack_choice(task), _stack_choice(task, True)
    ref = _reference_12_5_12(task)
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


register(
    Exercise(
        id="12.5.12",
        title="Выбор стеков по датированной карте под требования",
        make_task=_task_12_5_12,
        reference=_reference_12_5_12,
        solution=_solution_12_5_12,
        hint=(
            "Пройдите по стекам и по каждому требованию: ячейка или элемент списка должны "
            "подтверждать его без «?» и без пометки в столбце unconfirmed. Затем проверьте "
            "ограничения сочетаний (STACK_LIMITS). Опубликованные ускорения в выборе не "
            "участвуют."
        ),
        misconceptions=[
            Misconception(
                "fastest_number",
                "Вы выбрали стек по самому большому опубликованному ускорению. Это заявление "
                "авторов для их конфигурации, модели и кластера, а не свойство стека: выбор "
                "начинается с требований (узлы, LoRA, многоходовость, синхронность и задержка, "
                "бэкенд, движок), а скорость сравнивают на своей задаче.",
                _mc_fastest_number,
            ),
            Misconception(
                "unconfirmed_as_fact",
                "Вы засчитали требования, выполненные только неподтверждёнными фактами карты "
                "(значения с «?», столбцы из unconfirmed). Неподтверждённое — повод проверить "
                "документацию и код своей версии, а не основание для выбора.",
                _mc_unconfirmed_as_fact,
            ),
        ],
        rtol=RTOL,
        compare=_compare_12_5_12,
        validate_answer=_validate_12_5_12,
        describe_mismatch=_mismatch_12_5_12,
    )
)


# ================================================================ 12.5.13 — итоговый диагноз
_KEYS_12_5_13 = ("bottleneck", "memory_fits", "staleness_risk", "recovery_gaps")
_STAGES_12_5_13 = ("generation", "reward", "ref_logprob", "training", "weight_sync")
_STAGE_NAMES_12_5_13 = {"generation": "генерация ответов (сборщики)",
                        "reward": "проверка и награды (верификатор)",
                        "ref_logprob": "log-вероятности эталонной модели (на тренере)",
                        "training": "шаг обучения", "weight_sync": "публикация весов"}  # fmt: skip
_RISK_12_5_13 = {"низкий": "низкий", "высокий": "высокий", "low": "низкий", "high": "высокий"}
_ESS_FLOOR = 0.5
_CRASH_TEST = "crash_test"
_MEM_MODELS_12_5_13 = ("Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Llama-3.1-8B")
_GPU_GB_12_5_13 = (24, 40, 48, 80, 94, 141)


def _trace_12_5_13(gens: list[float], r: float, f: float, t: float, s: float) -> list[dict]:
    """Один шаг конвейера «на шаг позади»: сборщики генерируют пакет k + 1, пока тренер учится на
    пакете k. Награды пакета k + 1 — после всей его генерации; на тренере подряд ref_logprob,
    training, weight_sync пакета k. Шаг кончается, когда готовы обе цепочки."""
    big = max(gens)
    rows = [{"stage": "generation", "worker": f"gen-{i}", "start_s": 0.0, "end_s": g,
             "depends_on": []} for i, g in enumerate(gens)]  # fmt: skip
    rows.append({"stage": "reward", "worker": "verifier-0", "start_s": big,
                 "end_s": round(big + r, 1), "depends_on": list(range(len(gens)))})  # fmt: skip
    clock = 0.0
    for stage, length in (("ref_logprob", f), ("training", t), ("weight_sync", s)):
        rows.append({"stage": stage, "worker": "trainer-0", "start_s": clock,
                     "end_s": round(clock + length, 1), "depends_on": []})  # fmt: skip
        clock = round(clock + length, 1)
    for i, row in enumerate(rows):
        row["row"] = i
    return rows


def _path_12_5_13(trace: list[dict]) -> dict:
    """Критический путь через pipeline.critical_path: длина, вклад стадий на пути, вся работа."""
    import pandas as pd

    frame = pd.DataFrame(trace)
    deps = {r["row"]: r["depends_on"] for r in trace if r["depends_on"]}
    length, chain = pipeline.critical_path(frame, deps)
    on_path = (chain["end_s"] - chain["start_s"]).groupby(chain["stage"]).sum()
    work = (frame["end_s"] - frame["start_s"]).groupby(frame["stage"]).sum()
    return {
        "length": float(length),
        "on_path": {k: float(v) for k, v in on_path.items()},
        "work": {k: float(work.get(k, 0.0)) for k in _STAGES_12_5_13},
        "chain": [int(i) for i in chain.index],
    }


def _draw_trace_12_5_13(rng: random.Random, target: str, strict: bool) -> list[dict]:
    while True:
        n = rng.randint(4, 8)
        base = rng.uniform(15, 45)
        gens = [round(base * math.exp(rng.gauss(0, 0.25)), 1) for _ in range(n)]
        r, f = round(rng.uniform(3, 70), 1), round(rng.uniform(3, 40), 1)
        t, s = round(rng.uniform(10, 90), 1), round(rng.uniform(2, 60), 1)
        gen_chain, train_chain = max(gens) + r, f + t + s
        if max(gen_chain, train_chain) < 1.1 * min(gen_chain, train_chain):
            continue  # путь должен быть однозначным
        if gen_chain > train_chain:
            on_path = {"generation": max(gens), "reward": r}
        else:
            on_path = {"ref_logprob": f, "training": t, "weight_sync": s}
        top = max(on_path, key=on_path.get)
        rest = [v for k, v in on_path.items() if k != top]
        work = {"generation": sum(gens), "reward": r, "ref_logprob": f, "training": t,
                "weight_sync": s}  # fmt: skip
        biggest = max(work, key=work.get)
        if top != target or on_path[top] < 1.2 * max(rest):
            continue
        if strict and (biggest == target or work[biggest] < 1.2 * on_path[top]):
            continue
        return _trace_12_5_13(gens, r, f, t, s)


def _memory_12_5_13(mem: dict) -> dict:
    """Память на GPU (байт) по рецепту задачи и по «16 Б на параметр» (bf16_mixed_adam)."""
    shape = memory.ModelShape.from_name(mem["model"])
    kv = memory.kv_cache_bytes(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                               mem["sequences"] * mem["tokens_per_sequence"], 2)  # fmt: skip
    reserve = mem["reserve_gib"] * memory.GIB
    state = memory.per_rank_state_bytes(shape.num_params, mem["recipe"], mem["world_size"],
                                        mem["zero_stage"])  # fmt: skip
    state16 = memory.per_rank_state_bytes(shape.num_params, "bf16_mixed_adam",
                                          mem["world_size"], mem["zero_stage"])  # fmt: skip
    cap = mem["gpu_gb"] * memory.GB
    breakdown = memory.per_rank_breakdown(shape.num_params, mem["recipe"], mem["world_size"],
                                          mem["zero_stage"])  # fmt: skip
    return {"shape": shape, "kv": kv, "reserve": reserve, "state": state, "state16": state16,
            "cap": cap, "need": state + kv + reserve, "need16": state16 + kv + reserve,
            "breakdown": breakdown}  # fmt: skip


def _draw_memory_12_5_13(rng: random.Random, recipe_name: str | None, flip: bool) -> dict:
    stages = (1, 2) if recipe_name == "fp32_adam" else (0, 1, 2, 3)
    while True:
        mem = {
            "model": rng.choice(_MEM_MODELS_12_5_13),
            "recipe": recipe_name or rng.choice(list(memory.RECIPES)[:5]),
            "world_size": rng.choice([2, 4, 8]),
            "zero_stage": rng.choice(stages),
            "sequences": rng.choice([16, 32, 64, 128]),
            "tokens_per_sequence": rng.choice([1024, 2048, 4096]),
            "reserve_gib": rng.randint(2, 8),
            "gpu_gb": rng.choice(_GPU_GB_12_5_13),
        }
        m = _memory_12_5_13(mem)
        ratio, ratio16 = m["need"] / m["cap"], m["need16"] / m["cap"]
        if abs(ratio - 1) < 0.1 or m["kv"] > 0.6 * m["need"]:
            continue  # далеко от границы (ГБ против ГиБ не меняют вывод), KV не заслоняет рецепт
        if flip and not ((ratio < 1) != (ratio16 < 1) and abs(ratio16 - 1) >= 0.1):
            continue
        return mem


def _draw_queue_12_5_13(rng: random.Random, mode: str) -> dict:
    """mode: "lag" — хвост задержки выше предела, "ess" — один пакет с ESS/n < 0.5,
    "both" — оба, "ok" — всё в норме. Средние в режимах lag и ess в норме."""
    bound = rng.choice([1, 2, 3])
    while True:
        counts = [rng.randint(40, 160)] + [rng.randint(10, 90) for _ in range(bound)]
        if mode in ("lag", "both"):
            counts.append(rng.randint(2, 9))
        lags = [{"lag": k, "rollouts": c} for k, c in enumerate(counts)]
        total = sum(counts)
        mean_lag = sum(k * c for k, c in enumerate(counts)) / total
        n_batches, size = rng.randint(4, 6), rng.choice([64, 128, 256])
        shares = [rng.uniform(0.58, 0.95) for _ in range(n_batches)]
        if mode in ("ess", "both"):
            shares[rng.randrange(n_batches)] = rng.uniform(0.25, 0.45)
        batches = [{"batch": f"b{rng.randint(100, 999)}{i}", "n": size,
                    "ess": round(share * size, 1)} for i, share in enumerate(shares)]  # fmt: skip
        mean_share = sum(b["ess"] / b["n"] for b in batches) / n_batches
        if mean_lag <= bound - 0.2 and mean_share >= _ESS_FLOOR + 0.05:
            return {"max_lag": bound, "lag_counts": lags, "batches": batches}


def _draw_checkpoint_12_5_13(rng: random.Random, strict: bool) -> dict:
    run = {"curriculum": rng.random() < 0.5, "running_reward_norm": rng.random() < 0.5,
           "asynchronous": True}  # fmt: skip
    applicable = [c for c in guarantees.CHECKPOINT_COMPONENTS if _applies(c, run)]
    optional = [c for c in applicable if c not in ("model", "optimizer")]
    if strict:
        missing = rng.sample(optional, rng.randint(1, 3))
        crash_tested = False
    else:
        missing = rng.sample(optional, rng.choice([0, 0, 1, 2, 3]))
        crash_tested = rng.random() < 0.5
    present = [c for c in applicable if c not in missing]
    return {**run, "components": present, "crash_tested": crash_tested}


def _task_12_5_13(variant: int) -> dict:
    rng = random.Random(12_5_13_000 + 7919 * variant)
    strict = variant < 4  # на первых вариантах узнаются все типичные ошибки
    if strict:
        target = ("training", "reward", "weight_sync", "ref_logprob")[variant]
        recipe_name = ("adam8bit_mixed", "fp32_adam", "bf16_pure_adam", "fp32_adam")[variant]
        mode = ("lag", "ess", "lag", "ess")[variant]
    else:
        target = rng.choice(_STAGES_12_5_13)
        recipe_name, mode = None, rng.choice(["lag", "ess", "both", "ok", "ok"])
    trace = _draw_trace_12_5_13(rng, target, strict or target != "generation")
    mem = _draw_memory_12_5_13(rng, recipe_name, strict)
    queue = _draw_queue_12_5_13(rng, mode)
    ckpt = _draw_checkpoint_12_5_13(rng, strict)
    data = {"stages": trace, "memory": mem, "queue": queue, "checkpoint": ckpt}
    return {"statement": _statement_12_5_13(data), **data}


def _statement_12_5_13(d: dict) -> str:
    trace, mem, queue, ckpt = d["stages"], d["memory"], d["queue"], d["checkpoint"]
    m = _memory_12_5_13(mem)
    shape, recipe = m["shape"], memory.recipe(mem["recipe"])
    rows = "\n".join(
        f"| {r['row']} | `{r['worker']}` | `{r['stage']}` | {r['start_s']:.1f} | {r['end_s']:.1f} | "
        f"{', '.join(map(str, r['depends_on'])) or '—'} |"
        for r in trace
    )
    lags = " · ".join(f"задержка {x['lag']}: {x['rollouts']}" for x in queue["lag_counts"])
    ess = "\n".join(f"| {b['batch']} | {b['n']} | {b['ess']:.1f} |" for b in queue["batches"])
    stage = "DDP (ZeRO-0)" if mem["zero_stage"] == 0 else f"ZeRO-{mem['zero_stage']}"
    extras = [
        "учебная программа (уровень сложности растёт)" if ckpt["curriculum"] else None,
        "скользящая нормировка наград по всему запуску" if ckpt["running_reward_norm"] else None,
    ]
    extras_text = ", ".join(x for x in extras if x) or "нет ни учебной программы, ни скользящей "
    if not any(extras):
        extras_text += "нормировки наград (нормировка только внутри группы)"
    comps = ", ".join(f"`{c}`" for c in ckpt["components"])
    crash = (
        "проверка аварией (шаг 12.5.3) проводилась, ветвь восстановления совпала с непрерывной"
        if ckpt["crash_tested"]
        else "проверку аварией ни разу не проводили: «каталог на месте, значит, всё хорошо»"
    )
    return (
        "**Итоговый диагноз системы.** Асинхронный запуск GRPO, конвейер «на шаг позади»: пока "
        "тренер учится на пакете k, сборщики генерируют пакет k + 1 (данные — `task['stages']`, "
        "`task['memory']`, `task['queue']`, `task['checkpoint']`).\n\n"
        "**1. Стадии одного шага** (время — секунды от начала шага). Интервал зависит от "
        "предыдущего интервала своего исполнителя и от строк в последнем столбце:\n\n"
        "| строка | исполнитель | этап | начало, с | конец, с | зависит от строк |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n"
        "**2. Память одной GPU** (обучение и генерация на одних GPU). Модель "
        f"{mem['model']}: параметров N = {_fmt_int(shape.num_params)}, слоёв L = "
        f"{shape.num_layers}, KV-голов H_kv = {shape.num_kv_heads}, размер головы d_h = "
        f"{shape.head_dim}. Рецепт `{mem['recipe']}` (байт на параметр: веса + градиенты + m + "
        f"v + мастер-копия): {recipe.describe()}. Обучение на D = {mem['world_size']} GPU, "
        f"{stage}. Движок генерации держит на каждой GPU KV-кэш в bf16 (2 Б на число): "
        f"последовательностей — {mem['sequences']}, токенов в каждой — "
        f"{mem['tokens_per_sequence']}. Резерв на активации, буферы и фрагментацию — "
        f"{mem['reserve_gib']} ГиБ. Память GPU — {mem['gpu_gb']} ГБ ({mem['gpu_gb']}·10⁹ Б)."
        "\n\n"
        f"**3. Очередь и несвежесть данных.** Объявленный предел задержки политики — "
        f"{queue['max_lag']}. Измеренная задержка роллаутов последних пакетов (число роллаутов "
        f"с данной задержкой): {lags}. ESS по пакетам:\n\n| пакет | n | ESS |\n|---|---|---|\n"
        f"{ess}\n\n"
        f"**4. Восстановление.** У запуска: {extras_text}. Манифест последней контрольной точки "
        f"содержит компоненты {comps} (полный список — `guarantees.CHECKPOINT_COMPONENTS`, шаг "
        f"12.5.6); {crash}.\n\n"
        "Поставьте диагноз — словарь из четырёх ключей:\n"
        "1. `bottleneck` — этап с наибольшим вкладом в **критический путь** шага (самую "
        "длинную по сумме длительностей цепочку зависимых интервалов); вклад этапа — сумма "
        "длительностей её интервалов на этом пути. Одно из: "
        + ", ".join(f'`"{s}"`' for s in _STAGES_12_5_13)
        + ";\n"
        "2. `memory_fits` — `True`, если модельное состояние на ранг по рецепту и стадии ZeRO "
        "(`memory.per_rank_state_bytes`) + KV-кэш (2·L·H_kv·d_h·токены·2 Б, "
        "`memory.kv_cache_bytes`) + резерв помещаются в память GPU, иначе `False`;\n"
        '3. `staleness_risk` — `"высокий"`, если наибольшая измеренная задержка больше '
        f"объявленного предела **или** ESS/n хотя бы одного пакета меньше {_ESS_FLOOR}; иначе "
        '`"низкий"`;\n'
        "4. `recovery_gaps` — список того, чего не хватает для честного возобновления: имена "
        'нужных этому запуску компонентов, которых нет в манифесте, и `"crash_test"`, если '
        "восстановление не проверено аварией (`[]`, если всё есть).\n\n"
        'Ответ: `{"bottleneck": …, "memory_fits": …, "staleness_risk": …, '
        '"recovery_gaps": [...]}`.'
    )


def _values_12_5_13(task: dict) -> dict:
    path = _path_12_5_13(task["stages"])
    bottleneck = max(path["on_path"], key=path["on_path"].get)
    m = _memory_12_5_13(task["memory"])
    q = task["queue"]
    max_lag = max(x["lag"] for x in q["lag_counts"] if x["rollouts"] > 0)
    total = sum(x["rollouts"] for x in q["lag_counts"])
    mean_lag = sum(x["lag"] * x["rollouts"] for x in q["lag_counts"]) / total
    shares = [b["ess"] / b["n"] for b in q["batches"]]
    risk = max_lag > q["max_lag"] or min(shares) < _ESS_FLOOR
    mean_risk = mean_lag > q["max_lag"] or sum(shares) / len(shares) < _ESS_FLOOR
    ck = task["checkpoint"]
    missing = [c for c in guarantees.CHECKPOINT_COMPONENTS
               if c not in ck["components"] and _applies(c, ck)]  # fmt: skip
    gaps = missing + ([] if ck["crash_tested"] else [_CRASH_TEST])
    return {
        "path": path,
        "bottleneck": bottleneck,
        "most_work": max(path["work"], key=path["work"].get),
        "mem": m,
        "fits": m["need"] <= m["cap"],
        "fits16": m["need16"] <= m["cap"],
        "max_lag": max_lag,
        "mean_lag": mean_lag,
        "shares": shares,
        "risk": "высокий" if risk else "низкий",
        "mean_risk": "высокий" if mean_risk else "низкий",
        "missing": missing,
        "gaps": gaps,
    }


def _reference_12_5_13(task: dict) -> dict:
    v = _values_12_5_13(task)
    return {"bottleneck": v["bottleneck"], "memory_fits": v["fits"],
            "staleness_risk": v["risk"], "recovery_gaps": v["gaps"]}  # fmt: skip


def _given_12_5_13(given: Any) -> dict:
    stage = _get(given, "bottleneck")
    risk = _get(given, "staleness_risk")
    return {
        "bottleneck": _norm(stage).strip("`'\" .") if isinstance(stage, str) else None,
        "memory_fits": _bool(_get(given, "memory_fits")),
        "staleness_risk": _RISK_12_5_13.get(_norm(risk).strip("`'\" ."))
        if isinstance(risk, str)
        else None,
        "recovery_gaps": _ids(_get(given, "recovery_gaps")),
    }


def _same_12_5_13(expected: dict, given: Any) -> bool:
    g = _given_12_5_13(given)
    return (
        g["bottleneck"] == expected["bottleneck"]
        and g["memory_fits"] is expected["memory_fits"]
        and g["staleness_risk"] == expected["staleness_risk"]
        and g["recovery_gaps"] == set(expected["recovery_gaps"])
    )


def _mc_key_12_5_13(task: dict, key: str, wrong: Any) -> _Family:
    """Ошибка в одном ключе: ``key`` получил значение ``wrong`` (и оно не верное)."""
    ref = _reference_12_5_13(task)

    def accepts(given: Any) -> bool:
        value = _given_12_5_13(given)[key]
        target = set(wrong) if isinstance(wrong, list) else wrong
        current = set(ref[key]) if isinstance(ref[key], list) else ref[key]
        return target != current and value == target

    return _family(ref, {key: wrong}, accepts)


def _mc_off_critical_path(task: dict) -> _Family:
    return _mc_key_12_5_13(task, "bottleneck", _values_12_5_13(task)["most_work"])


def _mc_sixteen_bytes(task: dict) -> _Family:
    return _mc_key_12_5_13(task, "memory_fits", _values_12_5_13(task)["fits16"])


def _mc_staleness_by_mean(task: dict) -> _Family:
    return _mc_key_12_5_13(task, "staleness_risk", _values_12_5_13(task)["mean_risk"])


def _mc_weights_only_ok(task: dict) -> _Family:
    return _mc_key_12_5_13(task, "recovery_gaps", [])


def _mc_no_crash_test(task: dict) -> _Family:
    v = _values_12_5_13(task)
    wrong = v["missing"] if v["missing"] and _CRASH_TEST in v["gaps"] else v["gaps"]
    return _mc_key_12_5_13(task, "recovery_gaps", wrong)


def _validate_12_5_13(answer: Any, task: dict) -> str | None:
    known = [*guarantees.CHECKPOINT_COMPONENTS, _CRASH_TEST]
    return _validate_dict(
        answer,
        {"bottleneck": _choice_check({s: s for s in _STAGES_12_5_13}),
         "memory_fits": _bool_check,
         "staleness_risk": _choice_check(_RISK_12_5_13),
         "recovery_gaps": _ids_check(known, f"имена компонентов или crash_test (допустимы: "
                                            f"{', '.join(known)})", "crash_test")},
    )  # fmt: skip


def _mismatch_12_5_13(expected: dict, answer: Any, task: dict) -> str:
    g, notes = _given_12_5_13(answer), []
    if g["bottleneck"] != expected["bottleneck"]:
        notes.append("bottleneck (ищите вклад в критический путь, а не всю работу этапа)")
    if g["memory_fits"] is not expected["memory_fits"]:
        notes.append("memory_fits (сложите состояние на ранг, KV-кэш и резерв)")
    if g["staleness_risk"] != expected["staleness_risk"]:
        notes.append("staleness_risk (максимальная задержка и ESS/n каждого пакета)")
    gaps, need = g["recovery_gaps"] or set(), set(expected["recovery_gaps"])
    if gaps != need:
        notes.append(
            f"recovery_gaps (нужных пунктов: {len(need)}, вы верно назвали {len(need & gaps)}, "
            f"лишних: {len(gaps - need)})"
        )
    return _wrong_keys(notes)


def _solution_12_5_13(task: dict) -> str:
    v, ref = _values_12_5_13(task), _reference_12_5_13(task)
    path, m, q, mem = v["path"], v["mem"], task["queue"], task["memory"]
    chain = " → ".join(
        f"{task['stages'][i]['stage']} ({task['stages'][i]['worker']})" for i in path["chain"]
    )
    contrib = "\n".join(
        f"| {s} | {path['on_path'].get(s, 0.0):.1f} | {path['work'][s]:.1f} |"
        for s in _STAGES_12_5_13
    )
    b = m["breakdown"]
    gib = memory.GIB
    fits = "помещается" if v["fits"] else "**не** помещается"
    fits16 = "поместилось бы" if v["fits16"] else "не поместилось бы"
    shares = ", ".join(f"{x:.2f}" for x in v["shares"])
    lag_reason = (
        f"наибольшая задержка {v['max_lag']} > предела {q['max_lag']}"
        if v["max_lag"] > q["max_lag"]
        else f"наибольшая задержка {v['max_lag']} ≤ предела {q['max_lag']}"
    )
    ess_reason = (
        f"min ESS/n = {min(v['shares']):.2f} < {_ESS_FLOOR}"
        if min(v["shares"]) < _ESS_FLOOR
        else f"min ESS/n = {min(v['shares']):.2f} ≥ {_ESS_FLOOR}"
    )
    ck = task["checkpoint"]
    na = [c for c in guarantees.CHECKPOINT_COMPONENTS if not _applies(c, ck)]
    gaps_text = ", ".join(f"`{c}`" for c in v["missing"]) or "все нужные компоненты на месте"
    answer = repr(ref)
    return (
        "**1. Узкое место.** Цепочка генерации — самый медленный сборщик, затем награды; "
        "цепочка тренера — ref_logprob → training → weight_sync. Длиннейшая цепочка "
        f"(`pipeline.critical_path`): {chain}, длина {path['length']:.1f} с.\n\n"
        "| этап | вклад в критический путь, с | вся работа этапа, с |\n|---|---|---|\n"
        f"{contrib}\n\n"
        f"Узкое место — **{ref['bottleneck']}** ({_STAGE_NAMES_12_5_13[ref['bottleneck']]}). "
        f"Больше всего работы у `{v['most_work']}` ({path['work'][v['most_work']]:.1f} с), "
        "но она разложена по параллельным исполнителям или перекрыта другой цепочкой: ускорение "
        "этапа вне пути время шага не сокращает.\n\n"
        f"**2. Память.** Состояние на ранг (`{mem['recipe']}`, D = {mem['world_size']}, "
        f"ZeRO-{mem['zero_stage']}): веса {b['params'] / gib:.2f} + градиенты "
        f"{b['grads'] / gib:.2f} + оптимизатор {b['optimizer'] / gib:.2f} = "
        f"{m['state'] / gib:.2f} ГиБ. KV-кэш: 2·{m['shape'].num_layers}·"
        f"{m['shape'].num_kv_heads}·{m['shape'].head_dim}·({mem['sequences']}·"
        f"{mem['tokens_per_sequence']})·2 Б = {m['kv'] / gib:.2f} ГиБ. Резерв "
        f"{mem['reserve_gib']} ГиБ. Итого {m['need'] / gib:.2f} ГиБ против {mem['gpu_gb']} ГБ = "
        f"{m['cap'] / gib:.2f} ГиБ — {fits}. По «16 Б на параметр» (bf16_mixed_adam) было бы "
        f"{m['need16'] / gib:.2f} ГиБ — {fits16}: 16 байт — один рецепт, а не закон.\n\n"
        f"**3. Устаревание.** {lag_reason[:1].upper()}{lag_reason[1:]}; ESS/n по пакетам: {shares}, {ess_reason}. Риск — "
        f"**{ref['staleness_risk']}**. Средние (средняя задержка {v['mean_lag']:.2f}, среднее "
        f"ESS/n {sum(v['shares']) / len(v['shares']):.2f}) хвост прячут: один пакет с низким "
        "ESS/n или роллауты за пределом задержки уже портят обновление.\n\n"
        f"**4. Восстановление.** Не хватает: {gaps_text}"
        + (f" (не нужны этому запуску: {', '.join(f'`{c}`' for c in na)})" if na else "")
        + ". "
        + (
            "Проверка аварией проводилась."
            if ck["crash_tested"]
            else "Проверки аварией не было: наличие каталога не доказывает, что запуск можно "
            "продолжить, — нужен `crash_test`."
        )
        + " Веса и оптимизатор в манифесте — ещё не продолжение того же эксперимента.\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.5.13",
        title="Итоговый диагноз: узкое место, память, риск несвежести данных, пробелы восстановления",
        make_task=_task_12_5_13,
        reference=_reference_12_5_13,
        solution=_solution_12_5_13,
        hint=(
            "Узкое место: найдите длиннейшую цепочку зависимых интервалов (у генерации на ней "
            "только самый медленный сборщик) и этап с наибольшим вкладом в неё. Память: "
            "per_rank_state_bytes по рецепту задачи, а не 16 Б/параметр, + KV + резерв. Риск: "
            "максимум задержки и минимум ESS/n, не средние. Пробелы: нужные компоненты, которых "
            "нет в манифесте, и crash_test, если аварией не проверяли."
        ),
        misconceptions=[
            Misconception(
                "off_critical_path",
                "Вы назвали этап с наибольшей суммарной работой. Время шага задаёт критический "
                "путь: работа, разложенная по параллельным сборщикам или перекрытая другой "
                "цепочкой, на нём не лежит целиком. Ищите этап с наибольшим вкладом в самую "
                "длинную цепочку зависимых интервалов.",
                _mc_off_critical_path,
            ),
            Misconception(
                "sixteen_bytes",
                "Вывод о памяти совпадает с расчётом по «16 байт на параметр». 16 Б — это "
                "смешанная точность с Adam во float32 (2 + 2 + 12), а не закон: считайте "
                "байты по рецепту задачи и делите статьи по стадии ZeRO.",
                _mc_sixteen_bytes,
            ),
            Misconception(
                "staleness_by_mean",
                "Вывод о риске совпадает с расчётом по средним: средняя задержка и среднее ESS/n "
                "в норме, но роллауты за пределом задержки или пакет с низким ESS/n уже портят "
                "обновление. Смотрите на максимум задержки и минимум ESS/n.",
                _mc_staleness_by_mean,
            ),
            Misconception(
                "weights_only_ok",
                "Вы не нашли пробелов в восстановлении, раз веса и оптимизатор сохраняются. "
                "Продолжение того же эксперимента требует и остальных компонентов (шаг, "
                "генераторы, курсор данных, очередь, версии…) и проверки аварией.",
                _mc_weights_only_ok,
            ),
            Misconception(
                "no_crash_test",
                "Вы перечислили недостающие компоненты, но не отметили, что восстановление не "
                "проверено аварией. Наличие каталога контрольной точки не доказывает, что запуск "
                "можно продолжить: нужен crash_test.",
                _mc_no_crash_test,
            ),
        ],
        rtol=RTOL,
        compare=_compare_with(_same_12_5_13),
        validate_answer=_validate_12_5_13,
        describe_mismatch=_mismatch_12_5_13,
    )
)
