"""Проверочные шаги урока 12.2: состояние и ZeRO (12.2.6), бюджет KV-кэша (12.2.7), пик при
совместном размещении и информативные группы в секунду (12.2.8).

Модуль регистрирует упражнения при импорте. Все верные ответы считают функции калькулятора
``course_utils.memory`` (и ``throughput.degenerate_group_share``), поэтому упражнения и калькулятор
не могут разойтись. torch здесь не импортируется.

Типичная ошибка узнаётся семейством (``_Family``): канонический неверный ответ + правило, которое
узнаёт ту же ошибку, даже если остальные ключи ответа другие.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from course_utils import fmt, memory, throughput
from course_utils.exercises.common import (
    Family as _Family,
    family_compare as _compare,
    is_num as _is_num,
    norm as _norm,
    norm_dict as _norm_dict,
)
from course_utils.grading import Exercise, Misconception, answers_match, register

GIB = memory.GIB


# ---------------------------------------------------------------- общее
def _family(ref: dict, wrong: dict, key: str, rtol: float = 1e-2) -> _Family:
    """Семейство «ключ ``key`` равен неверному значению ``wrong[key]``» (прочие ключи — любые)."""

    def accepts(given: Any) -> bool:
        g = _norm_dict(given)
        return g is not None and answers_match(wrong[key], g.get(_norm(key)), rtol)

    return _Family({**ref, **wrong}, accepts)


def _validate_keys(answer: Any, keys: tuple[str, ...], texts: dict[str, str]) -> str | None:
    """Словарь ровно с ключами ``keys``; числа конечны и ≥ 0; строковые ключи из ``texts``."""
    shape = "{" + ", ".join(f'"{k}": …' for k in keys) + "}"
    g = _norm_dict(answer)
    if g is None:
        return f"Ожидается словарь {shape}; получено: {type(answer).__name__}."
    missing = [k for k in keys if _norm(k) not in g]
    extra = [str(k) for k in answer if _norm(k) not in {_norm(x) for x in keys}]
    if missing or extra:
        return f"Ожидается словарь {shape}; не хватает: {', '.join(missing) or '—'}, лишние: {', '.join(extra) or '—'}."
    for k in keys:
        value = g[_norm(k)]
        if k in texts:
            if not isinstance(value, str):
                return f"{k}: нужна строка — {texts[k]}; получено {value!r}."
        elif not _is_num(value) or value < 0:
            return f"{k}: нужно конечное неотрицательное число, получено {value!r}."
    return None


_UNIT_HINTS = ((GIB, "ровно в 2³⁰ раз: вы ответили в байтах, а нужны ГиБ"),
               (GIB / 10**9, "в 2³⁰/10⁹ ≈ 1.074 раза: спутаны ГиБ (2³⁰ Б) и ГБ (10⁹ Б)"),
               (1024, "ровно в 1024 раза: проверьте КиБ/МиБ/ГиБ"), (2, "ровно в 2 раза"))  # fmt: skip


def _mismatch(expected: dict, answer: dict, rtol: float) -> str:
    """Какие ключи неверны и, если отношение «круглое», на что это похоже (без верных значений)."""
    g = _norm_dict(answer) or {}
    notes = []
    for key, e in expected.items():
        v = g.get(_norm(key))
        if answers_match(e, v, rtol):
            continue
        note = key
        if _is_num(v) and _is_num(e) and e and v:
            for f, text in _UNIT_HINTS:
                if any(abs(r / f - 1) < 1e-3 for r in (v / e, e / v)):
                    note = f"{key} (отличается {text})"
                    break
        notes.append(note)
    return f"Неверны значения: {'; '.join(notes)}."


def _tex(n: int) -> str:
    """Целое для формулы LaTeX: разряды через тонкий пробел \\, (как fmt.num, но в $$…$$)."""
    return fmt.num(int(n)).replace(fmt.NBSP, "\\,")


def _params(n: int) -> str:
    return fmt.count(n, "параметр", "параметра", "параметров")


def _tokens(n: int) -> str:
    return fmt.count(n, "токен", "токена", "токенов")


def _gib(n_bytes: float) -> float:
    return memory.to_unit(n_bytes, "GiB")


# ================================================================ 12.2.6 — состояние и ZeRO
# Рецепты с Σb ≠ 16: иначе ошибка «16 байт — закон» совпала бы с верным ответом.
_RECIPES_12_2_6 = ("mixed_fp32_grads", "bf16_pure_adam", "adam8bit_mixed", "sgd_momentum_fp32")
_ROUND_N = (1_300_000_000, 3_000_000_000, 14_000_000_000, 32_000_000_000, 70_000_000_000)
_KEYS_12_2_6 = ("B_state", "ddp", "zero1", "zero2", "zero3")
_FIELDS = (("param_bytes", "веса", "b_{param}"), ("grad_bytes", "градиенты", "b_{grad}"),
           ("m1_bytes", "первый момент Adam m1", "b_{m1}"),
           ("m2_bytes", "второй момент Adam m2", "b_{m2}"),
           ("master_bytes", "fp32-мастер-копия весов", "b_{master}"))  # fmt: skip


def _task_12_2_6(variant: int) -> dict:
    rng = random.Random(12_2_6_000 + 7919 * variant)
    recipe = _RECIPES_12_2_6[variant % len(_RECIPES_12_2_6)]
    if variant % 2 == 0:
        model = rng.choice(memory.available_model_configs())
        n = memory.ModelShape.from_name(model).num_params
        source = f"{model}: точное число по `data/model_configs/{model}.json`"
    else:
        model, n = None, rng.choice(_ROUND_N)
        source = "круглое число для прикидки"
    world = rng.choice([4, 8, 16, 32, 64] if n > 10**10 else [2, 4, 8, 16])
    r = memory.RECIPES[recipe]
    rows = "\n".join(f"| {text} | ${sym}$ | {getattr(r, f):g} |" for f, text, sym in _FIELDS)
    statement = (
        f"**Состояние модели и ZeRO.** Модель: N = {_params(n)} ({source}). Рецепт "
        f"`{recipe}` — {r.label}. Байт на параметр:\n\n| статья | обозначение | Б/параметр |\n"
        f"|---|---|---|\n{rows}\n| **итого** | $\\Sigma b$ | **{r.total:g}** |\n\n"
        f"Обучение с параллелизмом данных на D = {world} GPU. Напоминание: в DDP каждый ранг "
        "хранит полную копию состояния; ZeRO-1 делит между рангами состояния оптимизатора "
        "(m1, m2 и мастер-копию), ZeRO-2 — ещё и градиенты, ZeRO-3 (= FSDP full shard) — ещё "
        "и веса.\n\nНайдите в **ГиБ** (1 ГиБ = 2³⁰ Б, не путать с ГБ = 10⁹ Б):\n"
        "1. `B_state` — полное модельное состояние;\n"
        "2. `ddp`, `zero1`, `zero2`, `zero3` — постоянную часть состояния на один ранг (без "
        "активаций, буферов связи и временной сборки слоёв).\n\n"
        'Ответ — словарь `{"B_state": …, "ddp": …, "zero1": …, "zero2": …, "zero3": …}`, '
        "числа в ГиБ; относительный допуск 1 % (rtol = 1e-2), так что долю N/D можно не "
        "округлять до целого ⌈N/D⌉."
    )
    return {"statement": statement, "model": model, "n_params": n, "recipe": recipe,
            "bytes_per_param": {f: getattr(r, f) for f, _, _ in _FIELDS}, "world_size": world}  # fmt: skip


def _answer_12_2_6(n: int, recipe: str, world: int) -> dict:
    out = {"B_state": _gib(memory.state_bytes(n, recipe))}
    for stage, key in enumerate(("ddp", "zero1", "zero2", "zero3")):
        out[key] = _gib(memory.per_rank_state_bytes(n, recipe, world, stage))
    return out


def _reference_12_2_6(task: dict) -> dict:
    return _answer_12_2_6(task["n_params"], task["recipe"], task["world_size"])


def _mc_sixteen(task: dict) -> _Family:
    ref = _reference_12_2_6(task)
    return _family(ref, _answer_12_2_6(task["n_params"], "bf16_mixed_adam", task["world_size"]),
                   "B_state")  # fmt: skip


def _mc_zero1_all(task: dict) -> _Family:
    ref = _reference_12_2_6(task)
    split = ref["B_state"] / task["world_size"]
    return _family(ref, {"zero1": split, "zero2": split, "zero3": split}, "zero1")


def _mc_ddp_divides(task: dict) -> _Family:
    ref = _reference_12_2_6(task)
    return _family(ref, {"ddp": ref["B_state"] / task["world_size"]}, "ddp")


def _solution_12_2_6(task: dict) -> str:
    n, d, b = task["n_params"], task["world_size"], task["bytes_per_param"]
    ref = _reference_12_2_6(task)
    bp, bg = b["param_bytes"], b["grad_bytes"]
    k = b["m1_bytes"] + b["m2_bytes"] + b["master_bytes"]
    total = bp + bg + k
    terms = " + ".join(f"{v:g}" for v in b.values())
    g = {key: f"{v:.3f}" for key, v in ref.items()}
    who = f"{task['model']}, " if task["model"] else ""
    return (
        f"Модель: {who}N = {_params(n)}, рецепт `{task['recipe']}`, D = {d}. "
        "Всё модельное состояние — сумма хранимых представлений:\n\n"
        "$$B_{state} = N(b_{param} + b_{grad} + b_{m1} + b_{m2} + b_{master}) = "
        f"{_tex(n)} \\cdot ({terms}) = {_tex(n * total)}\\ \\text{{Б}} = {g['B_state']}\\ "
        "\\text{ГиБ}.$$\n\n"
        f"Состояния оптимизатора (в смысле ZeRO): $K = b_{{m1}} + b_{{m2}} + b_{{master}} = {k:g}$ "
        f"Б/параметр. На один ранг из D = {d}:\n\n"
        "| режим | что делится на D | формула | ГиБ |\n|---|---|---|---|\n"
        f"| DDP | ничего | $N \\cdot {total:g}$ | {g['ddp']} |\n"
        f"| ZeRO-1 | m1, m2, мастер-копия | $N({bp:g} + {bg:g}) + N \\cdot {k:g}/{d}$ | {g['zero1']} |\n"
        f"| ZeRO-2 | + градиенты | $N \\cdot {bp:g} + N({bg:g} + {k:g})/{d}$ | {g['zero2']} |\n"
        f"| ZeRO-3 / FSDP | + веса | $N \\cdot {total:g}/{d}$ | {g['zero3']} |\n\n"
        f"**Ответ (ГиБ):** `{ {key: round(v, 3) for key, v in ref.items()} }`.\n\n"
        "DDP ничего не делит: каждый ранг держит всё. ZeRO-1 не трогает веса и градиенты, поэтому "
        "делится лишь часть K. Рецепт здесь не «16 байт»: считайте по таблице, а не по правилу "
        "большого пальца. $B_{state}/D$ — это только ZeRO-3, и то без временной сборки слоёв."
    )


register(
    Exercise(
        id="12.2.6",
        title="B_state для рецепта; байты на ранг при DDP и ZeRO-1/2/3",
        make_task=_task_12_2_6,
        reference=_reference_12_2_6,
        solution=_solution_12_2_6,
        hint=(
            "B_state = N·(сумма строк таблицы рецепта). На ранг: в DDP — всё; ZeRO-1 делит на D "
            "только m1 + m2 + мастер-копию; ZeRO-2 — ещё градиенты; ZeRO-3 — всё. Переведите "
            "байты в ГиБ делением на 2³⁰."
        ),
        misconceptions=[
            Misconception(
                "sixteen_law",
                "Вы взяли «16 байт на параметр», а у этого рецепта другая сумма. 16 Б — лишь "
                "сценарий bf16-весов с Adam во float32 и мастер-копией; считайте "
                "B_state = N·(b_param + b_grad + b_m1 + b_m2 + b_master) по таблице условия.",
                _mc_sixteen,
            ),
            Misconception(
                "shard_everything_at_zero1",
                "На ZeRO-1 вы разделили на D всё состояние. ZeRO-1 шардирует только состояния "
                "оптимизатора (m1, m2, мастер-копию); веса и градиенты на каждом ранге остаются "
                "целиком. Градиенты делятся с ZeRO-2, веса — только с ZeRO-3 (FSDP full shard).",
                _mc_zero1_all,
            ),
            Misconception(
                "ddp_divides",
                "В DDP вы разделили состояние на D. DDP делит между рангами данные (мини-пакет), "
                "а не модель: каждый ранг хранит полную копию весов, градиентов и оптимизатора, "
                "то есть все B_state.",
                _mc_ddp_divides,
            ),
        ],
        rtol=1e-2,
        compare=_compare,
        validate_answer=lambda a, t: _validate_keys(a, _KEYS_12_2_6, {}),
        describe_mismatch=lambda e, a, t: _mismatch(e, a, 1e-2),
    )
)


# ================================================================ 12.2.7 — бюджет KV-кэша
# (модель, GPU, бюджет под веса и KV в ГиБ); у всех моделей GQA: H ≠ H_kv.
_SETUPS_12_2_7 = (("SmolLM2-135M", "T4 (16 ГБ)", (10, 12)), ("SmolLM2-360M", "T4 (16 ГБ)", (10, 12)),
                  ("Qwen2.5-0.5B", "L4 (24 ГБ)", (16, 20)), ("Qwen2.5-1.5B", "A100 40 ГБ", (30, 34)),
                  ("Qwen2.5-7B", "A100 80 ГБ", (64, 70)), ("Llama-3.1-8B", "H100 80 ГБ", (64, 70)))  # fmt: skip
_KEYS_12_2_7 = ("kv_bytes_per_token", "max_sequences", "max_groups")


def _task_12_2_7(variant: int) -> dict:
    rng = random.Random(12_2_7_000 + 7919 * variant)
    model, gpu, budgets = _SETUPS_12_2_7[(variant + rng.randrange(6)) % 6]
    shape = memory.ModelShape.from_name(model)
    kv_dtype, b = rng.choice([("bfloat16", 2), ("bfloat16", 2), ("fp8", 1)])
    prompt, group = rng.choice([256, 384, 512]), rng.choice([4, 8, 16])
    response = rng.choice([1024, 2048, 3072, 4096] if shape.num_params < 10**9 else [4096, 8192])
    budget_gib = rng.choice(budgets)
    task = {"model": model, "gpu": gpu, "num_layers": shape.num_layers,
            "num_attention_heads": shape.num_attention_heads, "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim, "hidden_size": shape.hidden_size, "kv_dtype": kv_dtype,
            "bytes_per_value": b, "budget_gib": budget_gib, "weights_bytes": shape.weights_bytes(2),
            "group_size": group, "prompt_tokens": prompt, "response_tokens": response}  # fmt: skip
    statement = (
        f"**Бюджет KV-кэша.** Движок генерации обслуживает {model} на {gpu}. Из "
        f"`data/model_configs/{model}.json`:\n\n| величина | значение |\n|---|---|\n"
        f"| слоёв L (`num_hidden_layers`) | {shape.num_layers} |\n"
        f"| голов внимания H (`num_attention_heads`) | {shape.num_attention_heads} |\n"
        f"| KV-голов $H_{{kv}}$ (`num_key_value_heads`) | {shape.num_kv_heads} |\n"
        f"| размер головы $d_h$ = hidden_size / H | {shape.head_dim} |\n"
        f"| hidden_size | {shape.hidden_size} |\n\n"
        f"KV-кэш хранится в {kv_dtype}: b = {b} Б на число. Под веса и KV-кэш движку отдано "
        f"{budget_gib} ГиБ (1 ГиБ = 2³⁰ Б); веса в bf16 занимают "
        f"W = {fmt.num(task['weights_bytes'])} Б. GRPO: группа из G = {group} ответов на запрос, "
        f"запрос — {_tokens(prompt)}, ответ — до {_tokens(response)}; считайте, что каждая "
        f"последовательность держит в кэше все {prompt} + {_tokens(response)} (худший случай, "
        "без общих префиксов).\n\nНайдите:\n"
        "1. `kv_bytes_per_token` — байт KV-кэша на один токен (все слои);\n"
        "2. `max_sequences` — сколько таких последовательностей одновременно помещается в "
        "бюджет после весов (округлите вниз);\n"
        "3. `max_groups` — сколько целых групп GRPO это даёт (округлите вниз).\n\n"
        'Ответ — словарь `{"kv_bytes_per_token": …, "max_sequences": …, "max_groups": …}`; все '
        "три — целые числа, они сравниваются точно."
    )
    return {"statement": statement, **task}


def _answer_12_2_7(task: dict, kv_heads: int, weights: int) -> dict:
    per_tok = memory.kv_cache_bytes(task["num_layers"], kv_heads, task["head_dim"], 1,
                                    task["bytes_per_value"])  # fmt: skip
    return _answer_from_kv(task, per_tok, weights)


def _answer_from_kv(task: dict, per_tok: int, weights: int) -> dict:
    seqs = memory.max_concurrent_sequences(task["budget_gib"] * GIB, weights, per_tok,
                                           task["prompt_tokens"] + task["response_tokens"])  # fmt: skip
    return {"kv_bytes_per_token": per_tok, "max_sequences": seqs,
            "max_groups": seqs // task["group_size"]}  # fmt: skip


def _reference_12_2_7(task: dict) -> dict:
    return _answer_12_2_7(task, task["num_kv_heads"], task["weights_bytes"])


def _mc_no_two(task: dict) -> _Family:
    ref = _reference_12_2_7(task)
    wrong = _answer_from_kv(task, ref["kv_bytes_per_token"] // 2, task["weights_bytes"])
    return _family(ref, wrong, "kv_bytes_per_token", 1e-9)


def _mc_heads(task: dict) -> _Family:
    ref = _reference_12_2_7(task)
    wrong = _answer_12_2_7(task, task["num_attention_heads"], task["weights_bytes"])
    return _family(ref, wrong, "kv_bytes_per_token", 1e-9)


def _mc_weights(task: dict) -> _Family:
    ref = _reference_12_2_7(task)
    return _family(ref, _answer_12_2_7(task, task["num_kv_heads"], 0), "max_sequences", 1e-9)


def _validate_12_2_7(answer: Any, task: dict) -> str | None:
    problem = _validate_keys(answer, _KEYS_12_2_7, {})
    if problem:
        return problem
    for key, value in _norm_dict(answer).items():
        if value != int(value):
            return f"{key} = {value!r}: нужно целое число (последовательности и группы — округлите вниз)."
    return None


def _solution_12_2_7(task: dict) -> str:
    ref = _reference_12_2_7(task)
    L, hkv, dh, b = (task[k] for k in ("num_layers", "num_kv_heads", "head_dim", "bytes_per_value"))
    h, g, w = task["num_attention_heads"], task["group_size"], task["weights_bytes"]
    n_tok = task["prompt_tokens"] + task["response_tokens"]
    per_seq = ref["kv_bytes_per_token"] * n_tok
    free = task["budget_gib"] * GIB - w
    return (
        "**1. Байт на токен.** $B_{KV} = 2 L H_{kv} d_h N_{tok} b$; множитель 2 — ключи и "
        f"значения, а головы — KV-головы ($H_{{kv}} = {hkv}$, а не H = {h}: это GQA). При "
        "$N_{tok} = 1$:\n\n"
        f"$$2 \\cdot {L} \\cdot {hkv} \\cdot {dh} \\cdot {b} = {_tex(ref['kv_bytes_per_token'])}"
        f"\\ \\text{{Б}} = {ref['kv_bytes_per_token'] / 1024:g}\\ \\text{{КиБ}}.$$\n\n"
        f"**2. Последовательности.** Одна последовательность держит {task['prompt_tokens']} + "
        f"{task['response_tokens']} = {_tokens(n_tok)}, то есть "
        f"{fmt.num(per_seq)} Б. После весов остаётся {task['budget_gib']} · 2³⁰ − {fmt.num(w)} = "
        f"{fmt.num(free)} Б, поэтому\n\n"
        f"$$\\left\\lfloor \\frac{{{_tex(free)}}}{{{_tex(per_seq)}}} \\right\\rfloor = "
        f"{ref['max_sequences']}.$$\n\n"
        f"**3. Группы.** ⌊{ref['max_sequences']} / {g}⌋ = "
        f"{fmt.count(ref['max_groups'], 'группа', 'группы', 'групп')} по G = {g}.\n\n"
        f"**Ответ:** `{ref}`.\n\n"
        "Размер группы и длина ответа — инфраструктурные параметры: вдвое длиннее ответ — вдвое "
        "меньше одновременных групп. PagedAttention снижает потери на фрагментацию, но не "
        "отменяет линейной стоимости ключей и значений."
    )


register(
    Exercise(
        id="12.2.7",
        title="Бюджет KV-кэша: байты на токен, число одновременных последовательностей",
        make_task=_task_12_2_7,
        reference=_reference_12_2_7,
        solution=_solution_12_2_7,
        hint=(
            "Байт на токен: 2·L·H_kv·d_h·b — двойка за K и V, головы — KV-головы. Из бюджета "
            "(ГиБ × 2³⁰) сначала вычтите веса, остаток разделите на байты одной "
            "последовательности (запрос + ответ токенов) и округлите вниз; группы — ещё раз "
            "вниз после деления на G."
        ),
        misconceptions=[
            Misconception(
                "no_factor_two",
                "Байт на токен вдвое меньше нужного: кэш хранит и ключи (K), и значения (V), "
                "поэтому в формуле B_KV = 2·L·H_kv·d_h·N_tok·b есть множитель 2.",
                _mc_no_two,
            ),
            Misconception(
                "attention_heads_not_kv",
                "Вы взяли число голов внимания H вместо числа KV-голов H_kv. В модели с GQA "
                "несколько голов запросов делят одну пару K/V, и в кэше хранится только H_kv "
                "голов (`num_key_value_heads`).",
                _mc_heads,
            ),
            Misconception(
                "forgot_weights",
                "Под KV-кэш вы отдали весь бюджет. Сначала в той же памяти лежат веса модели "
                "W: на кэш остаётся бюджет − W.",
                _mc_weights,
            ),
        ],
        rtol=1e-9,
        compare=_compare,
        validate_answer=_validate_12_2_7,
        describe_mismatch=lambda e, a, t: _mismatch(e, a, 1e-9),
    )
)


# ================================================================ 12.2.8 — пик и информативные группы
_PHASES = {"generation": "генерация: веса движка и KV-кэш",
           "transition": "переход: KV-кэш освобождён, веса движка ещё на месте",
           "training": "обучение: градиенты и активации", "sync": "синхронизация весов в движок"}  # fmt: skip
_COMPONENTS = ("веса движка", "KV-кэш", "веса тренера", "градиенты", "оптимизатор", "активации",
               "буфер синхронизации")  # fmt: skip
_BASE = ("веса движка", "веса тренера")
_KEYS_12_2_8 = ("peak_gib", "peak_phase", "peak_lora_gib", "informative_groups_per_s")
_SETUPS_12_2_8 = (("SmolLM2-360M", 1), ("Qwen2.5-0.5B", 1), ("Qwen2.5-1.5B", 1),
                  ("Qwen2.5-7B", 8), ("Llama-3.1-8B", 8))  # fmt: skip


def _r3(n_bytes: int) -> float:
    return round(_gib(n_bytes), 3)


def _timeline(parts: dict, offload: bool) -> list:
    """Фазы [имя, {статья: ГиБ}] по статьям ``parts``; offload — оптимизатор на CPU в генерации."""
    gen = ("веса движка", "KV-кэш", "веса тренера") + (() if offload else ("оптимизатор",))
    rows = {"generation": gen, "transition": ("веса движка", "веса тренера", "оптимизатор"),
            "training": ("веса тренера", "градиенты", "оптимизатор", "активации"),
            "sync": ("веса движка", "веса тренера", "оптимизатор", "буфер синхронизации")}  # fmt: skip
    return [[ph, {c: (parts[c] if c in rows[ph] else 0.0) for c in _COMPONENTS}] for ph in rows]


def _task_12_2_8(variant: int) -> dict:
    rng = random.Random(12_2_8_000 + 7919 * variant)
    model, world = _SETUPS_12_2_8[(variant + rng.randrange(5)) % 5]
    shape = memory.ModelShape.from_name(model)
    recipe = rng.choice(["bf16_mixed_adam", "adam8bit_mixed", "mixed_fp32_grads"])
    stage, n, rank = (3 if world > 1 else 0), shape.num_params, rng.choice([16, 32, 64])
    full = memory.per_rank_breakdown(n, recipe, world, stage)
    lora = memory.per_rank_breakdown(
        memory.lora_trainable_params(shape, rank), recipe, world, stage
    )
    kv_tokens = rng.choice([16, 32, 64]) * rng.choice([2048, 4096])
    parts = {"веса движка": _r3(shape.weights_bytes(2)), "веса тренера": _r3(full["params"]),
             "KV-кэш": _r3(shape.kv_bytes_per_token(2) * kv_tokens),
             "градиенты": _r3(full["grads"]), "оптимизатор": _r3(full["optimizer"]),
             "активации": rng.choice([1.5, 2.5, 4.0, 6.0, 9.0]),
             "буфер синхронизации": rng.choice([0.5, 1.0, 2.0])}  # fmt: skip
    offload = rng.random() < 0.5
    lora_parts = {**parts, "градиенты": _r3(lora["grads"]), "оптимизатор": _r3(lora["optimizer"])}
    n_groups, g = rng.randint(10, 14), rng.choice([4, 6, 8])
    # доли верных ответов по группам; две группы вырождены наверняка (все 0 и все 1)
    probs = [0.0, 1.0] + [rng.choice([0.0, 0.3, 0.5, 0.5, 0.7, 1.0]) for _ in range(n_groups - 2)]
    rng.shuffle(probs)
    groups = {
        f"q{i + 1:02d}": [int(rng.random() < p) for _ in range(g)] for i, p in enumerate(probs)
    }
    log = {"duration_s": round(rng.uniform(20, 90), 1), "groups": groups}
    table = "\n".join(
        f"| `{ph}` | " + " | ".join(f"{v:g}" if v else "—" for v in comps.values()) + " |"
        for ph, comps in _timeline(parts, offload)
    )
    groups_table = "\n".join(f"| {k} | {' '.join(map(str, v))} |" for k, v in log["groups"].items())
    where = "один GPU" if world == 1 else f"один из {world} GPU (тренер — FSDP full shard)"
    statement = (
        f"**Пик совместного размещения.** {model}, рецепт `{recipe}`; генерация и обучение по "
        f"очереди делят {where}. Память устройства по фазам одного шага, ГиБ (2³⁰ Б), "
        f"«—» = статьи нет на GPU{' (оптимизатор на время генерации выгружен на CPU)' if offload else ''}:"
        f"\n\n| фаза | {' | '.join(_COMPONENTS)} |\n|---|{'---|' * len(_COMPONENTS)}\n{table}\n\n"
        f"Фазы: {'; '.join(f'`{k}` — {v}' for k, v in _PHASES.items())}. Таблица есть и в "
        "`task['phases']`.\n\n"
        f"**LoRA** (ранг {rank}, адаптеры на q, k, v, o всех слоёв): меняются "
        f"только две статьи — градиенты становятся {lora_parts['градиенты']:g} ГиБ, оптимизатор "
        f"— {lora_parts['оптимизатор']:g} ГиБ; остальные статьи (замороженные базовые веса, "
        "KV-кэш, активации, буфер) те же.\n\n"
        f"**Журнал запуска:** за {log['duration_s']} с завершено "
        f"{fmt.count(n_groups, 'группа', 'группы', 'групп')} по G = "
        f"{fmt.count(g, 'ответ', 'ответа', 'ответов')}; награды correctness (они же в `task['run_log']`):\n\n"
        f"| группа | награды |\n|---|---|\n{groups_table}\n\n"
        "Группа вырождена, если скалярные награды всех её ответов равны: тогда у всех ответов "
        "преимущество A = 0 (здесь скалярная награда — одна correctness, формат-награды в "
        "журнале нет).\n\nНайдите: "
        "`peak_gib` — пик памяти, ГиБ; `peak_phase` — фазу пика (ключ из первого столбца); "
        "`peak_lora_gib` — пик с LoRA, ГиБ; `informative_groups_per_s` — информативные группы в "
        "секунду.\n\n"
        'Ответ — словарь `{"peak_gib": …, "peak_phase": …, "peak_lora_gib": …, '
        '"informative_groups_per_s": …}`; числа с относительным допуском 1 % (rtol = 1e-2).'
    )
    return {"statement": statement, "model": model, "recipe": recipe, "world_size": world,
            "lora_rank": rank, "phases": _timeline(parts, offload),
            "phases_lora": _timeline(lora_parts, offload), "run_log": log}  # fmt: skip


def _group_stats(log: dict) -> tuple[int, float]:
    """(число групп, доля вырожденных) — через throughput.degenerate_group_share."""
    records = [SimpleNamespace(group_id=gid, prompt_id=gid, sample_id=f"{gid}-{i}",
                               reward={"correctness": float(r)})
               for gid, rewards in log["groups"].items() for i, r in enumerate(rewards)]  # fmt: skip
    return throughput.degenerate_group_share(records)


def _reference_12_2_8(task: dict) -> dict:
    peak, phase = memory.colocation_peak(task["phases"])
    peak_lora, _ = memory.colocation_peak(task["phases_lora"])
    n, share = _group_stats(task["run_log"])
    rate = n / task["run_log"]["duration_s"]
    return {"peak_gib": peak, "peak_phase": phase, "peak_lora_gib": peak_lora,
            "informative_groups_per_s": rate * (1 - share)}  # fmt: skip


def _mc_sum_of_maxima(task: dict) -> _Family:
    ref = _reference_12_2_8(task)
    wrong = {"peak_gib": memory.sum_of_component_maxima(task["phases"]),
             "peak_lora_gib": memory.sum_of_component_maxima(task["phases_lora"])}  # fmt: skip
    a, b = _family(ref, wrong, "peak_gib"), _family(ref, wrong, "peak_lora_gib")
    return _Family(a, lambda given: a.accepts(given) or b.accepts(given))


def _no_base_peak(task: dict) -> float:
    """Пик LoRA-шкалы, из которой выброшены базовые веса (ошибка lora_no_base)."""
    rows = []
    for phase, comps in task["phases_lora"]:
        rows.append([phase, {c: v for c, v in comps.items() if c not in _BASE}])
    return memory.colocation_peak(rows)[0]


def _mc_lora_no_base(task: dict) -> _Family:
    return _family(_reference_12_2_8(task), {"peak_lora_gib": _no_base_peak(task)}, "peak_lora_gib")


def _mc_not_informative(task: dict) -> _Family:
    ref = _reference_12_2_8(task)
    n, _ = _group_stats(task["run_log"])
    wrong = {"informative_groups_per_s": n / task["run_log"]["duration_s"]}
    return _family(ref, wrong, "informative_groups_per_s")


def _validate_12_2_8(answer: Any, task: dict) -> str | None:
    names = ", ".join(_PHASES)
    problem = _validate_keys(answer, _KEYS_12_2_8, {"peak_phase": f"одно из имён фаз ({names})"})
    if problem is None and _norm(_norm_dict(answer)["peak_phase"]) not in _PHASES:
        return f"peak_phase: назовите фазу ключом из таблицы ({names})."
    return problem


def _solution_12_2_8(task: dict) -> str:
    ref = _reference_12_2_8(task)
    log = task["run_log"]
    n, share = _group_stats(log)
    sums = [(ph, sum(c.values()), sum(cl.values()))
            for (ph, c), (_, cl) in zip(task["phases"], task["phases_lora"])]  # fmt: skip
    rows = "\n".join(f"| `{ph}` | {s:.3f} | {sl:.3f} |" for ph, s, sl in sums)
    som = memory.sum_of_component_maxima(task["phases"])
    answer = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ref.items()}
    return (
        "**Пик.** Складываем статьи внутри каждой фазы, затем берём максимум по времени: "
        "$B_{peak} = \\max_t B(t)$.\n\n| фаза | B(t), ГиБ | B(t) с LoRA, ГиБ |\n|---|---|---|\n"
        f"{rows}\n\nПик — {ref['peak_gib']:.3f} ГиБ в фазе `{ref['peak_phase']}`; с LoRA — "
        f"{ref['peak_lora_gib']:.3f} ГиБ. Сумма максимумов статей ({som:.3f} ГиБ) завышает "
        "смету: KV-кэш и активации никогда не лежат на GPU одновременно.\n\n"
        "LoRA уменьшает градиенты и оптимизатор до размера адаптеров, но замороженные базовые "
        "веса тренера и веса движка остаются: память генерации не исчезает.\n\n"
        f"**Информативные группы.** За {log['duration_s']} с завершено "
        f"{fmt.count(n, 'группа', 'группы', 'групп')}, из них вырожденных (скалярные награды всех "
        f"ответов равны) {round(share * n)}, доля {share:.3f}:\n\n$$\\frac{{{n}}}{{{log['duration_s']}}} \\cdot "
        f"(1 - {share:.3f}) = {ref['informative_groups_per_s']:.3f}\\ \\text{{групп/с}}.$$\n\n"
        f"**Ответ:** `{answer}`."
    )


register(
    Exercise(
        id="12.2.8",
        title="Пик памяти при совмещении фаз (и с LoRA); информативные группы в секунду",
        make_task=_task_12_2_8,
        reference=_reference_12_2_8,
        solution=_solution_12_2_8,
        hint=(
            "Сложите статьи в каждой строке таблицы и возьмите максимум строк — это пик; "
            "не складывайте максимумы столбцов. Для LoRA замените в каждой строке градиенты и "
            "оптимизатор и снова возьмите максимум. Информативные группы/с = группы/с × "
            "(1 − доля групп, где все награды равны)."
        ),
        misconceptions=[
            Misconception(
                "sum_of_maxima",
                "Вы сложили максимумы статей по всем фазам. Но KV-кэш генерации и активации "
                "обучения не лежат в памяти одновременно: пик — максимум по времени суммы "
                "статей одной фазы, B_peak = max_t B(t).",
                _mc_sum_of_maxima,
            ),
            Misconception(
                "lora_no_base",
                "С LoRA вы убрали базовые веса. Они заморожены, но нужны для прямого прохода "
                "тренеру и для генерации движку: LoRA сокращает только градиенты и состояния "
                "оптимизатора, а не память весов.",
                _mc_lora_no_base,
            ),
            Misconception(
                "groups_not_informative",
                "Это все группы в секунду. Вырожденная группа (все награды равны) даёт нулевое "
                "преимущество и не учит политику: информативные группы/с = группы/с × (1 − доля "
                "вырожденных групп).",
                _mc_not_informative,
            ),
        ],
        rtol=1e-2,
        compare=_compare,
        validate_answer=_validate_12_2_8,
        describe_mismatch=lambda e, a, t: _mismatch(e, a, 1e-2),
    )
)
