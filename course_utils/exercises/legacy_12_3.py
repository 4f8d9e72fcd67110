"""Проверочные шаги урока 12.3: конвейер и разбиение устройств (12.3.6), хвосты и тайм-аут
(12.3.7), устойчивость очереди и порог обратного давления (12.3.8), критический путь по трассе
стадий (12.3.9).

Модуль регистрирует упражнения при импорте. Верные ответы считают функции
``course_utils.pipeline`` (замкнутые формулы и помощники временной шкалы), поэтому упражнения и
симулятор не могут разойтись. torch здесь не импортируется.

Типичная ошибка узнаётся семейством (``_Family``): канонический неверный ответ + правило, которое
узнаёт ту же ошибку, даже если остальные ключи ответа другие.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from course_utils import pipeline
from course_utils.exercises.common import (
    Family as _Family,
    get_key as _get,
    is_num as _is_num,
    norm as _norm,
    norm_dict as _norm_dict,
)
from course_utils.fmt import NBSP, num
from course_utils.grading import Exercise, Misconception, answers_match, register

RTOL = 1e-2
_TOLERANCE = "относительный допуск 1 % (rtol = 1e-2)"


# ---------------------------------------------------------------- общее
def _is_bool(x: Any) -> bool:
    return isinstance(x, bool) or (
        type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool")
    )


def _close(value: float, given: Any) -> bool:
    return answers_match(value, given, RTOL)


def _make_compare(canon: Callable[[Any], Any] = lambda g: g):
    """Сравнение: answers_match после приведения ответа ``canon``; для семейства — его правило."""

    def compare(expected: Any, given: Any, rtol: float) -> bool:
        given = canon(given)
        plain = dict(expected) if isinstance(expected, _Family) else expected
        if answers_match(plain, given, rtol):
            return True
        return isinstance(expected, _Family) and bool(expected.accepts(given))

    return compare


def _family(ref: dict, wrong: dict, accepts: Callable[[Any], bool]) -> _Family:
    return _Family({**ref, **wrong}, accepts)


def _shape(keys: tuple[str, ...]) -> str:
    return "{" + ", ".join(f'"{k}": …' for k in keys) + "}"


def _validate_keys(answer: Any, keys: tuple[str, ...]) -> str | None:
    """Словарь ровно с ключами ``keys`` (регистр не важен)."""
    g = _norm_dict(answer)
    if g is None:
        return f"Ожидается словарь {_shape(keys)}; получено: {type(answer).__name__}."
    missing = [k for k in keys if _norm(k) not in g]
    extra = [str(k) for k in answer if _norm(k) not in {_norm(x) for x in keys}]
    if missing or extra:
        return (
            f"Ожидается словарь {_shape(keys)}; не хватает: {', '.join(missing) or '—'}, "
            f"лишние: {', '.join(extra) or '—'}."
        )
    return None


def _check_number(key: str, value: Any, share: bool = False, signed: bool = False) -> str | None:
    if not _is_num(value):
        return f"{key}: нужно конечное число, получено {value!r}."
    if value < 0 and not signed:
        return f"{key}: нужно неотрицательное число, получено {value!r}."
    if share and value > 1 + 1e-9:
        return f"{key} = {value!r}: нужна доля от 0 до 1, а не проценты."
    return None


def _mismatch(expected: dict, answer: Any, rtol: float = RTOL, prefix: str = "") -> list[str]:
    """Ключи (и вложенные ключи) с неверными значениями — без самих верных значений."""
    g = _norm_dict(answer) or {}
    wrong = []
    for key, e in expected.items():
        v = g.get(_norm(key))
        if isinstance(e, dict) and _norm_dict(v) is not None:
            wrong += _mismatch(e, v, rtol, f"{prefix}{key}.")
        elif not answers_match(e, v, rtol):
            wrong.append(f"{prefix}{key}")
    return wrong


def _describe(canon: Callable[[Any], Any] = lambda g: g):
    def describe(expected: dict, answer: Any, task: dict) -> str:
        wrong = _mismatch(expected, canon(answer))
        return f"Неверны значения: {', '.join(wrong) or 'нет'}."

    return describe


def _s(x: float, digits: int = 2) -> str:
    """Число для текста: без лишних нулей (12.0 → 12, 0.25 → 0.25)."""
    return f"{round(float(x), digits):g}"


def _fmt(n: float) -> str:
    """Целое для текста: разряды через неразрывный пробел (32768 → "32 768")."""
    return num(int(n))


def _fmt_tex(n: float) -> str:
    """Целое для формулы LaTeX: разряды через тонкий пробел ``\\,`` (32768 → "32\\,768")."""
    return num(int(n)).replace(NBSP, "\\,")


# ================================================================ 12.3.6 — конвейер и разбиение
_KEYS_12_3_6 = ("C_seq", "C_pipe", "T_n", "speedup", "k_gen", "k_train")
# (описание запуска, диапазон G, диапазон T, диапазон r_g, диапазон r_t); r — токенов/с на устройство
_SCENARIOS_12_3_6 = (
    ("длинные рассуждения: генерация много дольше обучения", (60, 150), (8, 30),
     (800, 2000), (4000, 9000)),
    ("короткие ответы и несколько эпох PPO на пакет: обучение дольше генерации", (15, 40),
     (45, 110), (3000, 6000), (1200, 2800)),
    ("этапы почти сбалансированы", (40, 80), (30, 70), (1500, 3000), (2000, 5000)),
)  # fmt: skip


def _split_rates(K: int, r_g: float, r_t: float) -> dict[int, float]:
    """Скорость конвейера (токенов/с) при k_gen = 1…K−1 устройствах генерации."""
    return {k: min(k * r_g, (K - k) * r_t) for k in range(1, K)}


def _faster_gets_more(K: int, r_g: float, r_t: float) -> int:
    """Ошибочное разбиение «пропорционально скорости»: больше устройств более быстрому этапу."""
    return min(max(round(K * r_g / (r_g + r_t)), 1), K - 1)


def _task_12_3_6(variant: int) -> dict:
    rng = random.Random(12_3_6_000 + 7919 * variant)
    scenario, g_range, t_range, rg_range, rt_range = _SCENARIOS_12_3_6[variant % 3]
    while True:
        G, T = rng.randint(*g_range), rng.randint(*t_range)
        n = rng.choice([3, 4, 5, 6, 8])
        # «первый пакет бесплатно» должен заметно отличаться от верного T_n
        if G != T and min(G, T) / pipeline.pipeline_total_time(G, T, n) >= 0.03:
            break
    while True:
        K = rng.choice([8, 12, 16, 24, 32])
        r_g = rng.randrange(rg_range[0], rg_range[1] + 1, 50)
        r_t = rng.randrange(rt_range[0], rt_range[1] + 1, 50)
        rates = _split_rates(K, r_g, r_t)
        best = max(rates.values())
        winners = [k for k, v in rates.items() if v >= best * (1 - 1e-9)]
        runner_up = max(v for k, v in rates.items() if k not in winners)
        wrong = {K // 2, _faster_gets_more(K, r_g, r_t)}  # обе ошибки различимы и неверны
        unique = len(winners) == 1 and runner_up < best * 0.995
        if unique and len(wrong) == 2 and winners[0] not in wrong:
            break
    statement = (
        f"**Конвейер из двух этапов.** Запуск: {scenario}. Один логический пакет проходит два "
        f"этапа: сбор роллаутов с наградой — G = {G} с, обучение с синхронизацией весов — "
        f"T = {T} с. Этапы стоят на разных устройствах и могут работать одновременно (идеальный "
        f"двухступенчатый конвейер, все пакеты одинаковы). Нужно обработать n = {n} пакетов.\n\n"
        "Найдите:\n"
        "1. `C_seq` — длительность цикла одного пакета в последовательном режиме, с;\n"
        "2. `C_pipe` — период выпуска пакетов заполненным конвейером, с;\n"
        "3. `T_n` — полное время n пакетов в конвейере (от начала сбора первого до конца "
        "обучения последнего), с;\n"
        "4. `speedup` — ускорение конвейера на этих n пакетах: время n пакетов в "
        "последовательном режиме, делённое на T_n, раз.\n\n"
        f"**Разбиение устройств.** Другой кластер из K = {K} одинаковых ускорителей нужно "
        "поделить между генерацией и обучением. Измерено на одном устройстве: генерация — "
        f"r_g = {r_g} токенов/с, обучение — r_t = {r_t} токенов/с. Скорость этапа растёт линейно "
        "с числом его устройств, каждому этапу нужно хотя бы одно устройство.\n\n"
        "5–6. `k_gen` и `k_train` — целые числа устройств генерации и обучения "
        "(k_gen + k_train = K), при которых конвейер пропускает больше всего токенов в секунду.\n\n"
        f"Ответ — словарь `{_shape(_KEYS_12_3_6)}`; секунды и разы — {_TOLERANCE}, "
        "число устройств — точно."
    )
    return {"statement": statement, "scenario": scenario, "G_s": G, "T_s": T, "n_batches": n,
            "K": K, "gen_tokens_per_s_per_device": r_g,
            "train_tokens_per_s_per_device": r_t}  # fmt: skip


def _reference_12_3_6(task: dict) -> dict:
    G, T, n = task["G_s"], task["T_s"], task["n_batches"]
    r_g, r_t = task["gen_tokens_per_s_per_device"], task["train_tokens_per_s_per_device"]
    k_gen, k_train, _ = pipeline.best_device_split(task["K"], r_g, r_t)
    return {
        "C_seq": pipeline.sequential_cycle(G, T),
        "C_pipe": pipeline.pipelined_period(G, T),
        "T_n": pipeline.pipeline_total_time(G, T, n),
        "speedup": pipeline.speedup(G, T, n),
        "k_gen": k_gen,
        "k_train": k_train,
    }


def _mc_sum_not_max(task: dict) -> _Family:
    G, T, n = task["G_s"], task["T_s"], task["n_batches"]
    wrong = {"C_pipe": G + T, "T_n": n * (G + T), "speedup": 1.0}

    def accepts(given: Any) -> bool:
        return _close(G + T, _get(given, "C_pipe")) or _close(n * (G + T), _get(given, "T_n"))

    return _family(_reference_12_3_6(task), wrong, accepts)


def _mc_first_batch_free(task: dict) -> _Family:
    G, T, n = task["G_s"], task["T_s"], task["n_batches"]
    period = pipeline.pipelined_period(G, T)
    limit = pipeline.speedup(G, T)  # предел при n → ∞: заполнение конвейера забыто
    wrong = {"T_n": n * period, "speedup": limit}

    def accepts(given: Any) -> bool:
        return _close(n * period, _get(given, "T_n")) or _close(limit, _get(given, "speedup"))

    return _family(_reference_12_3_6(task), wrong, accepts)


def _split_family(task: dict, k_gen: int) -> _Family:
    K = task["K"]

    def accepts(given: Any) -> bool:
        return _get(given, "k_gen") == k_gen and _get(given, "k_train") == K - k_gen

    return _family(_reference_12_3_6(task), {"k_gen": k_gen, "k_train": K - k_gen}, accepts)


def _mc_equal_split(task: dict) -> _Family:
    return _split_family(task, task["K"] // 2)


def _mc_faster_gets_more(task: dict) -> _Family:
    r_g, r_t = task["gen_tokens_per_s_per_device"], task["train_tokens_per_s_per_device"]
    return _split_family(task, _faster_gets_more(task["K"], r_g, r_t))


def _validate_12_3_6(answer: Any, task: dict) -> str | None:
    problem = _validate_keys(answer, _KEYS_12_3_6)
    if problem:
        return problem
    g = _norm_dict(answer)
    for key in _KEYS_12_3_6:
        problem = _check_number(key, g[_norm(key)])
        if problem:
            return problem
    k_gen, k_train = g["k_gen"], g["k_train"]
    if k_gen != int(k_gen) or k_train != int(k_train):
        return "k_gen и k_train — целые числа устройств."
    if k_gen + k_train != task["K"] or min(k_gen, k_train) < 1:
        return f"k_gen + k_train должно равняться K = {task['K']}, и каждому этапу нужно ≥ 1 устройства."
    return None


def _solution_12_3_6(task: dict) -> str:
    G, T, n, K = task["G_s"], task["T_s"], task["n_batches"], task["K"]
    r_g, r_t = task["gen_tokens_per_s_per_device"], task["train_tokens_per_s_per_device"]
    ref = _reference_12_3_6(task)
    period, k = ref["C_pipe"], ref["k_gen"]
    rates = _split_rates(K, r_g, r_t)
    show = sorted({*range(max(1, k - 2), min(K - 1, k + 2) + 1), K // 2})
    rows = "\n".join(
        f"| {kg} | {K - kg} | {_fmt(kg * r_g)} | {_fmt((K - kg) * r_t)} | "
        f"{'**' + _fmt(rates[kg]) + '**' if kg == k else _fmt(rates[kg])} |"
        for kg in show
    )
    k_star = K * r_t / (r_g + r_t)
    answer = {**ref, "speedup": round(ref["speedup"], 3)}
    slow = "генерация" if G > T else "обучение"
    return (
        "**1–2. Цикл и период.** Последовательно этапы идут друг за другом, в заполненном "
        "конвейере — одновременно, и период задаёт более медленный этап:\n\n"
        f"$$C_{{seq}} = G + T = {G} + {T} = {_s(ref['C_seq'])}\\ \\text{{с}}, \\qquad "
        f"C_{{pipe}} = \\max(G, T) = \\max({G}, {T}) = {_s(period)}\\ \\text{{с}}.$$\n\n"
        "**3. n пакетов.** Первый пакет всё равно проходит оба этапа подряд (заполнение "
        "конвейера), каждый следующий выходит через период:\n\n"
        f"$$T_n = G + T + (n - 1)\\max(G, T) = {_s(ref['C_seq'])} + {n - 1} \\cdot {_s(period)} "
        f"= {_s(ref['T_n'])}\\ \\text{{с}}.$$\n\n"
        "**4. Ускорение на n пакетах:**\n\n"
        f"$$S_n = \\frac{{n\\,C_{{seq}}}}{{T_n}} = \\frac{{{n} \\cdot {_s(ref['C_seq'])}}}"
        f"{{{_s(ref['T_n'])}}} \\approx {ref['speedup']:.3f}.$$\n\n"
        f"Предел при n → ∞ — $C_{{seq}}/C_{{pipe}} \\approx {pipeline.speedup(G, T):.3f}$: "
        f"он меньше 2, пока этапы не равны. Здесь узкое место — {slow}: быстрый этап часть "
        "времени ждёт.\n\n"
        "**5–6. Разбиение.** Конвейер пропускает столько, сколько самый медленный этап: "
        "$\\min(k_{gen} r_g,\\ k_{train} r_t)$. Минимум максимален, когда этапы уравновешены: "
        f"$k_{{gen}} r_g \\approx (K - k_{{gen}}) r_t$, то есть $k_{{gen}} \\approx K r_t / (r_g + "
        f"r_t) = {K} \\cdot {r_t} / ({r_g} + {r_t}) \\approx {k_star:.2f}$. Среди целых "
        "соседей (и для сравнения поровну):\n\n"
        "| k_gen | k_train | генерация, токенов/с | обучение, токенов/с | конвейер, токенов/с |\n"
        f"|---|---|---|---|---|\n{rows}\n\n"
        f"Лучше всего k_gen = {k}, k_train = {ref['k_train']}: {_fmt(rates[k])} токенов/с против "
        f"{_fmt(rates[K // 2])} при делении поровну. Устройства делят по измеренным скоростям, а "
        "не поровну; линейный рост — приближение: сеть, проверяющая система или память могут "
        "стать новым узким местом.\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.3.6",
        title="C_seq, C_pipe, T_n; лучшее разбиение K устройств между генерацией и обучением",
        make_task=_task_12_3_6,
        reference=_reference_12_3_6,
        solution=_solution_12_3_6,
        hint=(
            "Последовательно этапы складываются, в заполненном конвейере период — максимум "
            "этапов. Первый пакет проходит оба этапа подряд, остальные n − 1 выходят через "
            "период. Для разбиения переберите k_gen = 1…K−1: конвейер идёт со скоростью "
            "самого медленного этапа, min(k_gen·r_g, k_train·r_t)."
        ),
        misconceptions=[
            Misconception(
                "sum_not_max",
                "В заполненном конвейере этапы работают одновременно, поэтому период — "
                "C_pipe = max(G, T), а не G + T. Сумма — это цикл последовательного режима; "
                "с ней конвейер не дал бы никакого выигрыша.",
                _mc_sum_not_max,
            ),
            Misconception(
                "first_batch_free",
                "Вы забыли заполнение конвейера: первый пакет проходит оба этапа подряд, "
                "поэтому T_n = G + T + (n − 1)·max(G, T), а не n·max(G, T). Отношение "
                "C_seq / C_pipe — лишь предел ускорения при n → ∞, на n пакетах ускорение "
                "меньше: S_n = n·C_seq / T_n.",
                _mc_first_batch_free,
            ),
            Misconception(
                "equal_split",
                "Устройства поделены поровну, без учёта скоростей. Конвейер пропускает "
                "min(k_gen·r_g, k_train·r_t): дополнительные устройства нужны этапу, который "
                "ограничивает скорость, пока этапы не уравновесятся.",
                _mc_equal_split,
            ),
            Misconception(
                "faster_gets_more",
                "Вы дали больше устройств более быстрому этапу (пропорционально скорости). Нужно "
                "наоборот: медленному этапу — больше устройств, чтобы k_gen·r_g ≈ k_train·r_t, "
                "то есть k_gen ≈ K·r_t / (r_g + r_t).",
                _mc_faster_gets_more,
            ),
        ],
        rtol=RTOL,
        compare=_make_compare(),
        validate_answer=_validate_12_3_6,
        describe_mismatch=_describe(),
    )
)


# ================================================================ 12.3.7 — хвосты и тайм-аут
_KEYS_12_3_7 = ("T_group", "U", "U_timeout", "truncated", "hard_share_truncated",
                "easy_share_truncated")  # fmt: skip
_DIFFICULTY_RU = {"easy": "лёгкая", "hard": "сложная"}
_ANSWERS_PER_TASK = 4


def _task_12_3_7(variant: int) -> dict:
    rng = random.Random(12_3_7_000 + 7919 * variant)
    timeout = rng.choice([14, 15, 16, 18, 20])
    n_hard_tasks = rng.choice([2, 3])
    kinds = ["hard"] * n_hard_tasks + ["easy"] * (4 - n_hard_tasks)
    rng.shuffle(kinds)
    rows = []
    for t, kind in enumerate(kinds):
        for _ in range(_ANSWERS_PER_TASK):
            low, high = (6.0, 13.0) if kind == "hard" else (2.5, 7.5)
            rows.append({"i": len(rows), "task": f"q{t + 1}", "difficulty": kind,
                         "duration_s": round(rng.uniform(low, high), 1)})  # fmt: skip
    hard = [r for r in rows if r["difficulty"] == "hard"]
    easy = [r for r in rows if r["difficulty"] == "easy"]
    # тяжёлый хвост: длинные рассуждения и повторы вызовов инструмента у сложных задач,
    # иногда — тайм-аут среды у лёгкой (обрезанных сложных в доле всё равно больше)
    for r in rng.sample(hard, rng.randint(2, 4)):
        r["duration_s"] = round(rng.uniform(timeout + 3, 2.6 * timeout), 1)
    if len(easy) == 8 and rng.random() < 0.5:
        rng.choice(easy)["duration_s"] = round(rng.uniform(timeout + 1, timeout + 8), 1)
    n = len(rows)
    table = "\n".join(
        f"| {r['i']} | {r['task']} | {_DIFFICULTY_RU[r['difficulty']]} | {r['duration_s']:.1f} |"
        for r in rows
    )
    statement = (
        f"**Медленные хвосты и тайм-аут.** Синхронный шаг ждёт все {n} роллаутов: 4 задачи по "
        f"{_ANSWERS_PER_TASK} ответа, каждый роллаут на своём слоте генерации, все стартуют "
        "одновременно. Времена роллаутов и сложность задач (они же в `task['rollouts']`):\n\n"
        f"| i | задача | сложность | время, с |\n|---|---|---|---|\n{table}\n\n"
        "Загрузка слотов за шаг — доля занятого времени в прямоугольнике «слоты × длительность "
        "шага».\n\n"
        "Найдите:\n"
        "1. `T_group` — длительность шага без тайм-аута, с;\n"
        "2. `U` — загрузку слотов без тайм-аута (доля от 0 до 1);\n"
        f"3. `U_timeout` — загрузку, если ввести тайм-аут τ = {timeout} с: роллаут дольше τ "
        "обрывается в момент τ (слот был занят до τ), шаг заканчивается не позже τ;\n"
        "4. `truncated` — номера i обрезанных роллаутов (список, порядок не важен);\n"
        "5. `hard_share_truncated` и `easy_share_truncated` — долю обрезанных среди роллаутов "
        "сложных задач и среди роллаутов лёгких задач.\n\n"
        f"Ответ — словарь `{_shape(_KEYS_12_3_7)}`; числа — {_TOLERANCE}."
    )
    return {"statement": statement, "timeout_s": timeout, "rollouts": rows}


def _durations(task: dict) -> list[float]:
    return [r["duration_s"] for r in task["rollouts"]]


def _shares(task: dict, mask: list[bool]) -> dict[str, float]:
    out = {}
    for kind in ("hard", "easy"):
        flags = [m for m, r in zip(mask, task["rollouts"]) if r["difficulty"] == kind]
        out[f"{kind}_share_truncated"] = sum(flags) / len(flags)
    return out


def _reference_12_3_7(task: dict) -> dict:
    d = _durations(task)
    capped, mask = pipeline.truncate_durations(d, task["timeout_s"])
    mask = [bool(m) for m in mask]
    return {
        "T_group": max(d),  # группа ждёт самого медленного роллаута
        "U": pipeline.group_utilization(d),
        "U_timeout": pipeline.group_utilization(capped),
        "truncated": [i for i, m in enumerate(mask) if m],
        **_shares(task, mask),
    }


def _canon_12_3_7(given: Any) -> Any:
    """Номера обрезанных — отсортированным списком целых (порядок в ответе не важен)."""
    if not isinstance(given, Mapping):
        return given
    out = dict(given)
    for key, value in given.items():
        if _norm(key) != "truncated":
            continue
        value = value.tolist() if hasattr(value, "tolist") else value
        if isinstance(value, (list, tuple, set, frozenset)) and all(
            _is_num(x) and float(x).is_integer() for x in value
        ):
            out[key] = sorted(int(x) for x in value)
    return out


def _mc_mean_not_max(task: dict) -> _Family:
    d = _durations(task)
    mean = sum(d) / len(d)

    def accepts(given: Any) -> bool:
        return (
            _close(mean, _get(given, "T_group"))
            or _close(1.0, _get(given, "U"))
            or _close(1.0, _get(given, "U_timeout"))
        )

    return _family(_reference_12_3_7(task), {"T_group": mean, "U": 1.0, "U_timeout": 1.0}, accepts)


def _mc_truncation_free(task: dict) -> _Family:
    wrong = {"truncated": [], "hard_share_truncated": 0.0, "easy_share_truncated": 0.0}

    def accepts(given: Any) -> bool:
        trunc = _get(given, "truncated")
        if isinstance(trunc, (list, tuple, set, frozenset)) and len(trunc) == 0:
            return True
        return _close(0.0, _get(given, "hard_share_truncated")) and _close(
            0.0, _get(given, "easy_share_truncated")
        )

    return _family(_reference_12_3_7(task), wrong, accepts)


def _mc_conditional_reversed(task: dict) -> _Family:
    ref = _reference_12_3_7(task)
    picked = [task["rollouts"][i]["difficulty"] for i in ref["truncated"]]
    hard = picked.count("hard") / len(picked)  # доля сложных среди обрезанных, P(сложная | обрезан)
    wrong = {"hard_share_truncated": hard, "easy_share_truncated": 1 - hard}

    def accepts(given: Any) -> bool:
        return _close(hard, _get(given, "hard_share_truncated"))

    return _family(ref, wrong, accepts)


def _mc_old_max(task: dict) -> _Family:
    d = _durations(task)
    capped, _ = pipeline.truncate_durations(d, task["timeout_s"])
    wrong = float(sum(capped) / (len(d) * max(d)))  # знаменатель — прежний max, а не τ

    def accepts(given: Any) -> bool:
        return _close(wrong, _get(given, "U_timeout"))

    return _family(_reference_12_3_7(task), {"U_timeout": wrong}, accepts)


def _validate_12_3_7(answer: Any, task: dict) -> str | None:
    problem = _validate_keys(answer, _KEYS_12_3_7)
    if problem:
        return problem
    g = _norm_dict(_canon_12_3_7(answer))
    for key in _KEYS_12_3_7:
        if key == "truncated":
            continue
        problem = _check_number(key, g[_norm(key)], share=key != "T_group")
        if problem:
            return problem
    trunc, n = g["truncated"], len(task["rollouts"])
    if not isinstance(trunc, list) or any(not isinstance(i, int) or not 0 <= i < n for i in trunc):
        return f"truncated: нужен список номеров роллаутов i от 0 до {n - 1} (столбец i таблицы)."
    if len(set(trunc)) != len(trunc):
        return "truncated: номера роллаутов повторяются."
    return None


def _solution_12_3_7(task: dict) -> str:
    d, tau = _durations(task), task["timeout_s"]
    ref = _reference_12_3_7(task)
    capped, _ = pipeline.truncate_durations(d, tau)
    n, total, total_c = len(d), sum(d), float(sum(capped))
    n_hard = sum(r["difficulty"] == "hard" for r in task["rollouts"])
    picked = [task["rollouts"][i] for i in ref["truncated"]]
    k_hard = sum(r["difficulty"] == "hard" for r in picked)
    listing = ", ".join(f"{r['i']} ({r['task']}, {r['duration_s']:.1f} с)" for r in picked)
    answer = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ref.items()}
    return (
        "**1–2. Без тайм-аута.** Слоты работают параллельно, шаг ждёт самого медленного: "
        f"$T_{{group}} = \\max_i T_i = {_s(ref['T_group'], 1)}$ с (а не среднее "
        f"{total / n:.2f} с). Работа — $\\sum_i T_i = {_s(total, 1)}$ слот·с, прямоугольник — "
        f"$n \\cdot \\max_i T_i = {n} \\cdot {_s(ref['T_group'], 1)}$:\n\n"
        f"$$U = \\frac{{\\sum_i T_i}}{{n \\max_i T_i}} = \\frac{{{_s(total, 1)}}}"
        f"{{{_s(n * ref['T_group'], 1)}}} \\approx {ref['U']:.3f}.$$\n\n"
        f"**3. С тайм-аутом τ = {tau} с** каждый роллаут занимает слот $\\min(T_i, τ)$, шаг "
        f"длится τ:\n\n$$U_{{timeout}} = \\frac{{\\sum_i \\min(T_i, τ)}}{{n\\,τ}} = "
        f"\\frac{{{_s(total_c, 1)}}}{{{n} \\cdot {tau}}} \\approx {ref['U_timeout']:.3f}.$$\n\n"
        f"Загрузка выросла с {ref['U']:.3f} до {ref['U_timeout']:.3f}, а шаг сократился с "
        f"{_s(ref['T_group'], 1)} до {tau} с — но не бесплатно.\n\n"
        f"**4. Обрезаны** роллауты с $T_i > τ$: {listing}.\n\n"
        f"**5. Смещение.** Среди {n_hard} роллаутов сложных задач обрезано {k_hard}: доля "
        f"{ref['hard_share_truncated']:.3f}; среди {n - n_hard} роллаутов лёгких — "
        f"{len(picked) - k_hard}: доля {ref['easy_share_truncated']:.3f}. Тайм-аут бьёт прежде "
        "всего по сложным задачам, и данные смещаются к простым примерам. Поэтому правило "
        "тайм-аута и доля обрезанных (по группам сложности) входят в отчёт.\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.3.7",
        title="Загрузка U при хвостах; влияние тайм-аута на U и на обрезанные задачи",
        make_task=_task_12_3_7,
        reference=_reference_12_3_7,
        solution=_solution_12_3_7,
        hint=(
            "Шаг длится столько, сколько самый медленный роллаут: U = Σ T_i / (n · max T_i). "
            "С тайм-аутом замените каждое время на min(T_i, τ) — и в сумме, и в максимуме. "
            "Доли обрезанных считайте внутри каждой группы сложности: обрезанные сложные / все "
            "сложные, обрезанные лёгкие / все лёгкие."
        ),
        misconceptions=[
            Misconception(
                "mean_not_max",
                "Вы взяли среднее время вместо максимума. Роллауты идут параллельно, и шаг ждёт "
                "самого медленного: T_group = max T_i, а U = Σ T_i / (n · max T_i). Со средним в "
                "знаменателе U всегда равна 1 и ничего не говорит о простое слотов.",
                _mc_mean_not_max,
            ),
            Misconception(
                "truncation_free",
                "Тайм-аут поднял загрузку не бесплатно: он оборвал роллауты, которые длились "
                "дольше τ. Эти роллауты (и доли обрезанных по сложности) нужно назвать — без них "
                "рост U выглядит как чистый выигрыш, а данные тем временем смещаются.",
                _mc_truncation_free,
            ),
            Misconception(
                "conditional_reversed",
                "Вы посчитали, какую долю среди обрезанных составляют сложные задачи. Нужно "
                "обратное: какая доля роллаутов сложных задач обрезана (и отдельно — лёгких). "
                "Именно сравнение этих двух долей показывает смещение.",
                _mc_conditional_reversed,
            ),
            Misconception(
                "old_max_denominator",
                "В U_timeout вы оставили прежний максимум в знаменателе. С тайм-аутом шаг "
                "заканчивается в момент τ, поэтому U_timeout = Σ min(T_i, τ) / (n · τ).",
                _mc_old_max,
            ),
        ],
        rtol=RTOL,
        compare=_make_compare(_canon_12_3_7),
        validate_answer=_validate_12_3_7,
        describe_mismatch=_describe(_canon_12_3_7),
    )
)


# ================================================================ 12.3.8 — очередь и порог
_KEYS_12_3_8 = ("stable", "growth_tokens_per_s", "threshold_tokens")
_CONFIGS = ("A", "B", "C")


def _task_12_3_8(variant: int) -> dict:
    rng = random.Random(12_3_8_000 + 7919 * variant)
    while True:
        c_eq = rng.choice([4, 5, 6, 8, 10])
        mean_len = rng.choice([256, 384, 512, 640, 768, 1024])
        rho = rng.choice([0.125, 0.2, 0.25, 0.4, 0.5])  # роллаутов/с на сборщика
        batch = rng.choice([8192, 16384, 32768])
        mu = c_eq * Fraction(str(rho)) * mean_len  # токенов/с, ровно при c_eq сборщиках
        step = batch / mu
        if step.denominator in (1, 2, 4, 5, 10, 20, 25, 50, 100) and 1 <= step <= 30:
            break
    counts = [c_eq - rng.randint(1, min(3, c_eq - 2)), c_eq, c_eq + rng.randint(2, 4)]
    rng.shuffle(counts)
    collectors = dict(zip(_CONFIGS, counts))
    big = max(collectors, key=collectors.get)
    while True:
        lag = rng.choice([1, 2, 3, 4])
        max_tokens = rng.choice([m for m in (1024, 2048, 4096, 8192) if m >= 2 * mean_len])
        if lag * batch - collectors[big] * max_tokens >= batch // 4:
            break
    lines = "\n".join(f"| {c} | {n} |" for c, n in collectors.items())
    statement = (
        "**Очередь роллаутов и обратное давление.** Сборщики кладут роллауты в очередь FIFO; "
        f"тренер забирает из неё пакеты по B = {_fmt(batch)} токенов, шаг на пакете занимает "
        f"t = {float(step):g} с, после шага публикуется новая версия весов. Каждый сборщик "
        f"выдаёт в среднем ρ = {rho} роллаута/с; средняя длина роллаута в токенах "
        f"ℓ̄ = {mean_len}, но длины сильно разнятся: от десятков токенов до предела "
        f"max_tokens = {max_tokens}. "
        "Рассматриваются три конфигурации пула генерации (они же в `task['collectors']`):\n\n"
        f"| конфигурация | сборщиков |\n|---|---|\n{lines}\n\n"
        "Найдите:\n"
        '1. `stable` — словарь `{"A": …, "B": …, "C": …}` из True/False: устойчива ли '
        "очередь без обратного давления (глубина остаётся ограниченной, а не растёт со "
        "временем);\n"
        "2. `growth_tokens_per_s` — словарь по конфигурациям: средняя скорость роста очереди, "
        "токенов/с (0, если в среднем очередь не растёт);\n"
        f"3. `threshold_tokens` — порог обратного давления для конфигурации {big}. Сборщик "
        "начинает новый роллаут, только если в очереди не больше θ токенов; начатый роллаут "
        "не отменяется и приходит в очередь целиком. Требование: глубина очереди никогда не "
        f"превышает L·B токенов при L = {lag} (тогда роллаут ждёт в очереди не больше L шагов "
        "тренера и задержка политики ограничена). Считайте худший случай: в очереди ровно θ "
        "токенов, все сборщики в этот момент начинают роллауты предельной длины, а тренер "
        "ничего не забирает, пока они не придут. Нужен наибольший такой θ — целое число "
        "токенов.\n\n"
        f"Ответ — словарь `{_shape(_KEYS_12_3_8)}`; числа — {_TOLERANCE}."
    )
    return {"statement": statement, "collectors": collectors, "rollouts_per_s_per_collector": rho,
            "mean_tokens": mean_len, "max_tokens": max_tokens, "batch_tokens": batch,
            "step_s": float(step), "max_lag_steps": lag, "backpressure_config": big}  # fmt: skip


def _rates(task: dict) -> tuple[dict[str, Fraction], Fraction]:
    """λ по конфигурациям и μ, токенов/с — точными дробями (равенство λ = μ без округлений)."""
    per_collector = Fraction(str(task["rollouts_per_s_per_collector"])) * task["mean_tokens"]
    lam = {c: n * per_collector for c, n in task["collectors"].items()}
    return lam, task["batch_tokens"] / Fraction(str(task["step_s"]))


def _reference_12_3_8(task: dict) -> dict:
    lam, mu = _rates(task)
    big = task["backpressure_config"]
    in_flight = task["collectors"][big] * task["max_tokens"]  # худший случай начатых работ
    return {
        "stable": {c: lam[c] < mu for c in lam},
        "growth_tokens_per_s": {c: float(max(lam[c] - mu, 0)) for c in lam},
        "threshold_tokens": task["max_lag_steps"] * task["batch_tokens"] - in_flight,
    }


def _config_where(task: dict, relation: Callable[[Fraction, Fraction], bool]) -> str:
    lam, mu = _rates(task)
    return next(c for c in lam if relation(lam[c], mu))


def _mc_stable_if_equal(task: dict) -> _Family:
    ref = _reference_12_3_8(task)
    eq = _config_where(task, lambda a, b: a == b)

    def accepts(given: Any) -> bool:
        value = _get(_get(given, "stable"), eq)
        return _is_bool(value) and bool(value)

    return _family(ref, {"stable": {**ref["stable"], eq: True}}, accepts)


def _mc_negative_growth(task: dict) -> _Family:
    ref = _reference_12_3_8(task)
    lam, mu = _rates(task)
    low = _config_where(task, lambda a, b: a < b)
    value = float(lam[low] - mu)

    def accepts(given: Any) -> bool:
        return _close(value, _get(_get(given, "growth_tokens_per_s"), low))

    growth = {**ref["growth_tokens_per_s"], low: value}
    return _family(ref, {"growth_tokens_per_s": growth}, accepts)


def _threshold_family(task: dict, value: int) -> _Family:
    def accepts(given: Any) -> bool:
        return _close(value, _get(given, "threshold_tokens"))

    return _family(_reference_12_3_8(task), {"threshold_tokens": value}, accepts)


def _mc_ignore_inflight(task: dict) -> _Family:
    return _threshold_family(task, task["max_lag_steps"] * task["batch_tokens"])


def _mc_count_not_tokens(task: dict) -> _Family:
    n = task["collectors"][task["backpressure_config"]]
    value = task["max_lag_steps"] * task["batch_tokens"] - n * task["mean_tokens"]
    return _threshold_family(task, value)


def _validate_12_3_8(answer: Any, task: dict) -> str | None:
    problem = _validate_keys(answer, _KEYS_12_3_8)
    if problem:
        return problem
    g = _norm_dict(answer)
    configs = ", ".join(_CONFIGS)
    stable = _norm_dict(g["stable"])
    if stable is None or set(stable) != {_norm(c) for c in _CONFIGS}:
        return f"stable: нужен словарь с ключами {configs} и значениями True/False."
    if not all(_is_bool(v) for v in stable.values()):
        return "stable: значения — True или False (устойчива ли очередь)."
    growth = _norm_dict(g["growth_tokens_per_s"])
    if growth is None or set(growth) != {_norm(c) for c in _CONFIGS}:
        return f"growth_tokens_per_s: нужен словарь с ключами {configs} и числами токенов/с."
    for c, v in growth.items():
        problem = _check_number(f"growth_tokens_per_s[{c.upper()!r}]", v, signed=True)
        if problem:
            return problem
    thr = g["threshold_tokens"]
    problem = _check_number("threshold_tokens", thr, signed=True)
    if problem:
        return problem
    if thr != int(thr):
        return f"threshold_tokens = {thr!r}: нужно целое число токенов."
    return None


def _solution_12_3_8(task: dict) -> str:
    lam, mu = _rates(task)
    ref = _reference_12_3_8(task)
    rho, ell = task["rollouts_per_s_per_collector"], task["mean_tokens"]
    B, L, m = task["batch_tokens"], task["max_lag_steps"], task["max_tokens"]
    big = task["backpressure_config"]
    n_big = task["collectors"][big]
    rows = "\n".join(
        f"| {c} | {n} | {n} · {rho} · {ell} = {_fmt(lam[c])} | "
        f"{'<' if lam[c] < mu else '=' if lam[c] == mu else '>'} | "
        f"{'да' if ref['stable'][c] else 'нет'} | {_s(ref['growth_tokens_per_s'][c])} |"
        for c, n in task["collectors"].items()
    )
    eq = _config_where(task, lambda a, b: a == b)
    return (
        "**Скорости в одних единицах — токенах в секунду.** Тренер потребляет "
        f"$\\mu = B / t = {_fmt_tex(B)} / {task['step_s']:g} = {_fmt_tex(mu)}$ токенов/с. Сборщики "
        "поставляют $\\lambda = C \\cdot ρ \\cdot \\bar\\ell$:\n\n"
        "| конфигурация | C | λ, токенов/с | λ ? μ | устойчива | рост, токенов/с |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n"
        "Очередь устойчива только при строгом $\\lambda < \\mu$; при $\\lambda > \\mu$ она "
        f"растёт в среднем на $\\lambda - \\mu$ токенов/с. Конфигурация {eq} с $\\lambda = \\mu$ "
        "не растёт в среднем, но и не устойчива: случайные колебания длин ничем не "
        "возвращаются к нулю, и глубина блуждает неограниченно. Отрицательной скорости роста "
        "не бывает: пустая очередь не уходит ниже нуля, тренер просто голодает.\n\n"
        f"**Порог для {big}.** Порог останавливает запуск новых работ, но не начатые "
        f"роллауты: в худшем случае каждый из {n_big} сборщиков уже начал роллаут длиной до "
        f"max_tokens = {m}, и все они придут в очередь после закрытия порога (перелёт). Считать "
        "начатые роллауты по средней длине нельзя: длины сильно разнятся, гарантию даёт только "
        "предельная длина. Поэтому\n\n"
        f"$$\\theta + C \\cdot \\text{{max\\_tokens}} \\le L \\cdot B \\;\\Rightarrow\\; "
        f"\\theta = {L} \\cdot {_fmt_tex(B)} - {n_big} \\cdot {m} = "
        f"{_fmt_tex(ref['threshold_tokens'])}"
        "\\ \\text{токенов}.$$\n\n"
        "Наблюдаемая глубина очереди может превышать θ на объём работы «в полёте», и не "
        "обязательно ненадолго: при медленном тренере очередь держится выше θ большую часть "
        "времени (урок 12.3.4). Это следствие правила запуска, а не ошибка счётчика; его стоит "
        "записать в контракт очереди.\n\n"
        f"**Ответ:** `{ref}`."
    )


register(
    Exercise(
        id="12.3.8",
        title="Устойчивость очереди λ<μ, скорость роста, порог обратного давления в токенах",
        make_task=_task_12_3_8,
        reference=_reference_12_3_8,
        solution=_solution_12_3_8,
        hint=(
            "Переведите обе скорости в токены/с: λ = сборщики × роллаутов/с × средняя длина, "
            "μ = B / t. Устойчивость — строгое λ < μ. Порог закрывает только запуск новых "
            "роллаутов: к θ в худшем случае добавится по роллауту предельной длины от каждого "
            "сборщика, и сумма не должна превысить L·B."
        ),
        misconceptions=[
            Misconception(
                "stable_if_equal",
                "При λ = μ очередь не устойчива: средний рост нулевой, но случайные колебания "
                "длин ничем не гасятся, и глубина блуждает неограниченно. Условие "
                "устойчивости — строгое λ < μ.",
                _mc_stable_if_equal,
            ),
            Misconception(
                "negative_growth",
                "Скорость роста получилась отрицательной. При λ < μ очередь не уходит ниже нуля: "
                "она остаётся ограниченной, а тренер часть времени голодает. Рост — "
                "max(λ − μ, 0).",
                _mc_negative_growth,
            ),
            Misconception(
                "ignore_inflight",
                "Порог равен L·B — вы забыли работы в полёте. Порог останавливает только запуск "
                "новых роллаутов; уже начатые (по одному на сборщика, до max_tokens каждый) "
                "всё равно придут в очередь, поэтому θ = L·B − C·max_tokens.",
                _mc_ignore_inflight,
            ),
            Misconception(
                "count_not_tokens",
                "Начатые роллауты вы посчитали по средней длине — по сути, ограничили очередь "
                "числом роллаутов. Длины сильно разнятся: один роллаут может быть в разы длиннее "
                "среднего, и гарантию даёт только предельная длина: θ = L·B − C·max_tokens.",
                _mc_count_not_tokens,
            ),
        ],
        rtol=RTOL,
        compare=_make_compare(),
        validate_answer=_validate_12_3_8,
        describe_mismatch=_describe(),
    )
)


# ================================================================ 12.3.9 — критический путь
_KEYS_12_3_9 = ("sum_of_work", "critical_path", "utilization", "speed_up")
_POOL_NAMES = {"generation": "генерация", "verifier": "проверка", "training": "обучение"}
_TRAIN_STAGES = ("logprob_recompute", "forward_backward", "optimizer_step", "weight_sync")
# (описание, диапазоны стадий тренера, диапазон decode) — в десятых долях секунды
_SCENARIOS_12_3_9 = (
    ("обучение упирается в forward/backward большой модели",
     {"logprob_recompute": (15, 25), "forward_backward": (70, 100), "optimizer_step": (5, 10),
      "weight_sync": (10, 20), "checkpoint": (20, 40)}, (50, 80)),
    ("новые веса идут в движок генерации по медленной сети",
     {"logprob_recompute": (10, 20), "forward_backward": (30, 45), "optimizer_step": (5, 10),
      "weight_sync": (50, 80), "checkpoint": (20, 40)}, (40, 70)),
    ("пересчёт log-prob тренером на длинных последовательностях",
     {"logprob_recompute": (50, 80), "forward_backward": (30, 45), "optimizer_step": (5, 10),
      "weight_sync": (10, 20), "checkpoint": (20, 40)}, (40, 70)),
    ("синхронная запись контрольной точки на медленный диск",
     {"logprob_recompute": (10, 20), "forward_backward": (25, 35), "optimizer_step": (5, 10),
      "weight_sync": (10, 20), "checkpoint": (120, 180)}, (35, 55)),
)  # fmt: skip


def _build_trace(rng: random.Random, n_gen: int, train: dict, decode: tuple) -> list[dict]:
    """Окно перекрытого конвейера (задержка на одну версию): 3 шага тренера, пакеты 0…3.

    Пакет 0 к началу окна сгенерирован и проверяется; пакет b ≥ 2 генерируется весами,
    которые опубликовал weight_sync шага b − 2. Время — в десятых долях секунды.
    """
    events: list[dict] = []

    def add(worker: str, stage: str, start: int, length: int, deps: list[int] = ()) -> int:
        events.append({"worker": worker, "stage": stage, "start": start, "end": start + length,
                       "deps": list(deps)})  # fmt: skip
        return len(events) - 1

    gens = [f"gen-{i}" for i in range(n_gen)]
    free = dict.fromkeys(gens, 0)
    verifier_free, ver, ws = 0, {}, {}

    def verify(b: int, decodes: list[int]) -> None:
        nonlocal verifier_free
        start = max([verifier_free] + [events[j]["end"] for j in decodes])
        ver[b] = add("verifier-0", "verifier", start, rng.randint(8, 20), decodes)
        verifier_free = events[ver[b]]["end"]

    def generate(b: int) -> None:
        decodes = []
        for w in gens:
            ready = events[ws[b - 2]]["end"] if b >= 2 else 0
            start = max(free[w], ready)
            if start > free[w]:  # ждёт версию весов: ограничение задержки политики
                add(w, "backpressure", free[w], start - free[w])
            pre = add(w, "prefill", start, rng.randint(3, 8), [ws[b - 2]] if b >= 2 else [])
            decodes.append(add(w, "decode", events[pre]["end"], rng.randint(*decode)))
            free[w] = events[decodes[-1]]["end"]
        verify(b, decodes)

    trainer_free = 0
    verify(0, [])

    def train_step(s: int) -> None:
        nonlocal trainer_free
        start = max(trainer_free, events[ver[s]]["end"])
        if start > trainer_free:
            add("trainer-0", "queue_wait", trainer_free, start - trainer_free)
        t, deps = start, [ver[s]]
        for stage in _TRAIN_STAGES:
            row = add("trainer-0", stage, t, rng.randint(*train[stage]), deps)
            t, deps = events[row]["end"], []
        ws[s] = row
        if s == 1:
            t = events[add("trainer-0", "checkpoint", t, rng.randint(*train["checkpoint"]))]["end"]
        trainer_free = t

    generate(1)
    train_step(0)
    generate(2)
    train_step(1)
    generate(3)
    train_step(2)
    order = sorted(range(len(events)), key=lambda j: (events[j]["start"], events[j]["worker"]))
    row_of = {j: r for r, j in enumerate(order)}
    return [
        {"row": row_of[j], "worker": events[j]["worker"], "stage": events[j]["stage"],
         "start_s": events[j]["start"] / 10, "end_s": events[j]["end"] / 10,
         "depends_on": sorted(row_of[d] for d in events[j]["deps"])}
        for j in order
    ]  # fmt: skip


def _intervals(task: dict) -> tuple[list[dict], dict[int, list[int]]]:
    """Интервалы и зависимости в форме pipeline.critical_path (номер строки → предшественники)."""
    iv = [{k: r[k] for k in ("worker", "stage", "start_s", "end_s")} for r in task["trace"]]
    deps = {r["row"]: r["depends_on"] for r in task["trace"] if r["depends_on"]}
    return iv, deps


@functools.lru_cache(maxsize=64)
def _analyse(trace_json: str, pools_json: str) -> dict:
    """Всё, что нужно ответу и разбору 12.3.9, — через pipeline (кэш: трасса не меняется)."""
    task = {"trace": json.loads(trace_json), "pools": json.loads(pools_json)}
    iv, deps = _intervals(task)
    length, chain = pipeline.critical_path(iv, deps)
    stages = dict.fromkeys(r["stage"] for r in iv if r["stage"] not in pipeline.WAIT_STAGES)
    work = {st: pipeline.sum_of_work([r for r in iv if r["stage"] == st]) for st in stages}
    gains = {}  # на сколько секунд сократится путь, если все интервалы стадии вдвое короче
    for stage in stages:
        halved = [
            {**r, "end_s": (r["start_s"] + r["end_s"]) / 2} if r["stage"] == stage else r
            for r in iv
        ]
        gains[stage] = length - pipeline.critical_path(halved, deps)[0]
    util = pipeline.pool_utilization(iv, _pools(task))
    return {
        "sum_of_work": pipeline.sum_of_work(iv),
        "sum_with_waits": pipeline.sum_of_work(iv, exclude_stages=()),
        "critical_path": length,
        "chain": [(int(i), st) for i, st in zip(chain.index, chain["stage"])],
        "utilization": {p: float(util[p]) for p in task["pools"]},
        "horizon": max(r["end_s"] for r in iv),
        "work": work,
        "gains": gains,
    }


def _analysis(task: dict) -> dict:
    trace, pools = (json.dumps(task[k]) for k in ("trace", "pools"))
    return copy.deepcopy(_analyse(trace, pools))


def _pools(task: dict) -> dict[str, str]:
    return {w: pool for pool, workers in task["pools"].items() for w in workers}


def _task_12_3_9(variant: int) -> dict:
    rng = random.Random(12_3_9_000 + 7919 * variant)
    scenario, train, decode = _SCENARIOS_12_3_9[variant % len(_SCENARIOS_12_3_9)]
    n_gen = rng.choice([2, 3])
    pools = {"generation": [f"gen-{i}" for i in range(n_gen)], "verifier": ["verifier-0"],
             "training": ["trainer-0"]}  # fmt: skip
    while True:
        task = {"scenario": scenario, "trace": _build_trace(rng, n_gen, train, decode),
                "pools": pools}  # fmt: skip
        a = _analysis(task)
        biggest = max(a["work"], key=a["work"].get)
        best, second = sorted(a["gains"].values(), reverse=True)[:2]
        has_wait = any(r["stage"] == "backpressure" for r in task["trace"])
        on_path = {st for _, st in a["chain"]}
        # генерация — самая большая работа, но перекрыта обучением и не лежит на пути
        if biggest == "decode" and "decode" not in on_path and has_wait:
            if best >= 1.15 * second + 0.1:
                break
    rows = "\n".join(
        f"| {r['row']} | {r['worker']} | {r['stage']} | {r['start_s']:.1f} | {r['end_s']:.1f} | "
        f"{', '.join(map(str, r['depends_on'])) or '—'} |"
        for r in task["trace"]
    )
    pool_lines = "; ".join(f"`{p}` ({_POOL_NAMES[p]}) — {', '.join(ws)}" for p, ws in pools.items())
    task["statement"] = (
        f"**Трасса этапов и критический путь.** Окно из трёх шагов перекрытого конвейера "
        f"(генерация отстаёт на одну версию весов); запуск: {scenario}. Пакет 0 к началу окна "
        "уже сгенерирован; пакет b ≥ 2 генерируется весами, которые опубликовал `weight_sync` "
        "шага b − 2. Интервалы этапов (они же в `task['trace']`):\n\n"
        "| строка | исполнитель | этап | начало, с | конец, с | зависит от строк |\n"
        f"|---|---|---|---|---|---|\n{rows}\n\n"
        "Правила: `queue_wait` и `backpressure` — ожидание, а не работа. Интервал работы "
        "зависит от предыдущего интервала работы своего исполнителя и от строк в последнем "
        f"столбце. Пулы (`task['pools']`): {pool_lines}.\n\n"
        "Найдите:\n"
        "1. `sum_of_work` — сумму работы (всех интервалов, кроме ожиданий), с;\n"
        "2. `critical_path` — длину критического пути: самой длинной по сумме длительностей "
        "цепочки зависимых интервалов работы, с;\n"
        "3. `utilization` — загрузку каждого пула: словарь `{пул: доля}`, доля = занятое "
        "работой время исполнителей пула / (число исполнителей × H), H — конец последнего "
        "интервала (окно начинается в 0 с);\n"
        "4. `speed_up` — имя этапа, ускорение которого вдвое (все его интервалы) сильнее всего "
        "сокращает критический путь.\n\n"
        f"Ответ — словарь `{_shape(_KEYS_12_3_9)}`; числа — {_TOLERANCE}. "
        "Помощники `pipeline.critical_path` и `pipeline.pool_utilization` пригодятся для "
        "проверки, но сначала найдите путь по таблице сами."
    )
    return task


def _reference_12_3_9(task: dict) -> dict:
    a = _analysis(task)
    return {
        "sum_of_work": a["sum_of_work"],
        "critical_path": a["critical_path"],
        "utilization": a["utilization"],
        "speed_up": max(a["gains"], key=a["gains"].get),
    }


def _mc_off_critical_path(task: dict) -> _Family:
    work = _analysis(task)["work"]
    biggest = max(work, key=work.get)

    def accepts(given: Any) -> bool:
        return _norm(_get(given, "speed_up")) == _norm(biggest)

    return _family(_reference_12_3_9(task), {"speed_up": biggest}, accepts)


def _mc_sum_as_critical(task: dict) -> _Family:
    ref = _reference_12_3_9(task)

    def accepts(given: Any) -> bool:
        return _close(ref["sum_of_work"], _get(given, "critical_path"))

    return _family(ref, {"critical_path": ref["sum_of_work"]}, accepts)


def _mc_average_utilization(task: dict) -> _Family:
    ref, a = _reference_12_3_9(task), _analysis(task)
    overall = a["sum_of_work"] / (len(_pools(task)) * a["horizon"])  # все исполнители вместе
    mean = sum(ref["utilization"].values()) / len(ref["utilization"])

    def accepts(given: Any) -> bool:
        util = _norm_dict(_get(given, "utilization"))
        if not util:
            return False
        return any(all(_close(avg, v) for v in util.values()) for avg in (overall, mean))

    return _family(ref, {"utilization": dict.fromkeys(ref["utilization"], overall)}, accepts)


def _mc_wait_as_work(task: dict) -> _Family:
    with_waits = _analysis(task)["sum_with_waits"]

    def accepts(given: Any) -> bool:
        return _close(with_waits, _get(given, "sum_of_work"))

    return _family(_reference_12_3_9(task), {"sum_of_work": with_waits}, accepts)


def _validate_12_3_9(answer: Any, task: dict) -> str | None:
    problem = _validate_keys(answer, _KEYS_12_3_9)
    if problem:
        return problem
    g = _norm_dict(answer)
    for key in ("sum_of_work", "critical_path"):
        problem = _check_number(key, g[key])
        if problem:
            return problem
    util, names = _norm_dict(g["utilization"]), ", ".join(task["pools"])
    if util is None or set(util) != {_norm(p) for p in task["pools"]}:
        return f"utilization: нужен словарь {{пул: доля}} с ключами {names}."
    for pool, value in util.items():
        problem = _check_number(f"utilization[{pool!r}]", value, share=True)
        if problem:
            return problem
    stages = list(_analysis(task)["work"])
    if not isinstance(g["speed_up"], str) or _norm(g["speed_up"]) not in stages:
        return f"speed_up: назовите этап работы из трассы ({', '.join(stages)})."
    return None


def _solution_12_3_9(task: dict) -> str:
    ref, a = _reference_12_3_9(task), _analysis(task)
    work, gains = a["work"], a["gains"]
    on_path = {st for _, st in a["chain"]}
    stage_rows = "\n".join(
        f"| {st} | {_s(w, 1)} | {'да' if st in on_path else 'нет'} | {_s(gains[st], 2)} |"
        for st, w in sorted(work.items(), key=lambda kv: -kv[1])
    )
    path = " → ".join(f"{i} ({st})" for i, st in a["chain"])
    pools = _pools(task)
    busy = dict.fromkeys(task["pools"], 0.0)
    for r in task["trace"]:
        if r["stage"] not in pipeline.WAIT_STAGES:
            busy[pools[r["worker"]]] += r["end_s"] - r["start_s"]
    util_rows = "\n".join(
        f"| `{p}` | {len(ws)} | {_s(busy[p], 1)} | {ref['utilization'][p]:.3f} |"
        for p, ws in task["pools"].items()
    )
    biggest = max(work, key=work.get)
    waits = a["sum_with_waits"] - a["sum_of_work"]
    W, L, H = (_s(a[k], 2) for k in ("sum_of_work", "critical_path", "horizon"))
    if math.isclose(a["critical_path"], a["horizon"], abs_tol=1e-6):
        same_as_window = (
            f"После первого ожидания тренер не простаивает, поэтому путь равен окну H = {H} с."
        )
    else:
        same_as_window = (
            f"Путь короче окна H = {H} с: в окне есть простой, не вызванный зависимостями."
        )
    answer = {**ref, "sum_of_work": round(ref["sum_of_work"], 2),
              "critical_path": round(ref["critical_path"], 2),
              "utilization": {p: round(u, 3) for p, u in ref["utilization"].items()}}  # fmt: skip
    return (
        "**1. Сумма работы** — все интервалы, кроме ожиданий (`queue_wait`, `backpressure`: "
        f"вместе {_s(waits, 1)} с простоя): $W = \\sum (end - start) = {W}$ с. Это GPU·секунды: "
        "исполнители работают параллельно, поэтому W больше длины окна.\n\n"
        "**2. Критический путь** — самая длинная по сумме длительностей цепочка, где каждый "
        f"интервал ждёт предыдущий (свой исполнитель или строка из «зависит от»):\n\n{path}\n\n"
        f"$$L_{{crit}} = {L}\\ \\text{{с}} < W = {W}\\ \\text{{с}}.$$\n\n"
        "Путь идёт через тренер: обучение — узкое место, а генерация перекрыта им. "
        f"{same_as_window}\n\n"
        f"**3. Загрузка пулов** на окне H = {H} с: работа исполнителей пула / (их число · H).\n\n"
        "| пул | исполнителей | работа, с | загрузка |\n|---|---|---|---|\n"
        f"{util_rows}\n\n"
        "Одна средняя загрузка по всем исполнителям смешала бы почти непрерывно занятый "
        "тренер с простаивающими пулами и спрятала бы узкое место.\n\n"
        "**4. Что ускорять.** Для каждого этапа: на сколько сократится путь, если все его "
        "интервалы станут вдвое короче:\n\n"
        "| этап | работа, с | на пути | путь короче на, с |\n|---|---|---|---|\n"
        f"{stage_rows}\n\n"
        f"Ускорять стоит `{ref['speed_up']}`. Самая большая работа — `{biggest}` "
        f"({_s(work[biggest], 1)} с), но она перекрыта обучением: её ускорение не меняет "
        "период, пока узкое место — тренер.\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.3.9",
        title="Критический путь против суммы работы; загрузка пула; что ускорять",
        make_task=_task_12_3_9,
        reference=_reference_12_3_9,
        solution=_solution_12_3_9,
        hint=(
            "Сумма работы — просто сумма длительностей без ожиданий. Для критического пути "
            "идите по строкам в порядке окончания и для каждой считайте «длина лучшей цепочки "
            "до её конца» = длительность + максимум по её предшественникам (предыдущий "
            "интервал того же исполнителя и строки из «зависит от»). Загрузку считайте для "
            "каждого пула отдельно. Ускорять стоит этап на критическом пути, а не самую "
            "большую по сумме работы."
        ),
        misconceptions=[
            Misconception(
                "off_critical_path",
                "Вы выбрали этап с наибольшей суммой работы, но он перекрыт обучением и не "
                "лежит на критическом пути: его ускорение почти не сокращает период. Ускорять "
                "нужно этап на критическом пути.",
                _mc_off_critical_path,
            ),
            Misconception(
                "sum_as_critical",
                "Критический путь — не сумма всей работы. Исполнители работают параллельно; "
                "путь — самая длинная цепочка интервалов, где каждый ждёт предыдущий, и он "
                "намного короче суммы GPU·секунд.",
                _mc_sum_as_critical,
            ),
            Misconception(
                "average_utilization",
                "Вы дали одну среднюю загрузку всем пулам. Загрузку считают для каждого пула "
                "отдельно: средняя смешивает занятый тренер с простаивающими пулами и прячет "
                "узкое место.",
                _mc_average_utilization,
            ),
            Misconception(
                "wait_as_work",
                "В сумму работы попали ожидания (queue_wait, backpressure). Ожидание — простой "
                "исполнителя, а не работа; в трассе его записывают отдельно от вычислений.",
                _mc_wait_as_work,
            ),
        ],
        rtol=RTOL,
        compare=_make_compare(),
        validate_answer=_validate_12_3_9,
        describe_mismatch=_describe(),
    )
)
