"""12.2.7 — бюджет KV-кэша: байты на токен, одновременные последовательности и группы GRPO."""

import random

from course_utils import fmt, memory
from course_utils.exercises.answers import Fields, Number, tex_num
from course_utils.exercises.step import Step, Trap

_SETUPS = (  # (модель, GPU, бюджет под веса и KV, ГиБ); у всех моделей GQA: H ≠ H_kv
    ("SmolLM2-135M", "T4 (16 ГБ)", (10, 12)),
    ("SmolLM2-360M", "T4 (16 ГБ)", (10, 12)),
    ("Qwen2.5-0.5B", "L4 (24 ГБ)", (16, 20)),
    ("Qwen2.5-1.5B", "A100 40 ГБ", (30, 34)),
    ("Qwen2.5-7B", "A100 80 ГБ", (64, 70)),
    ("Llama-3.1-8B", "H100 80 ГБ", (64, 70)),
)
_SHAPE = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size")
_KEYS = ("kv_bytes_per_token", "max_sequences", "max_groups")


def _kv_task(variant: int) -> dict:
    rng = random.Random(12_2_7_000 + 7919 * variant)
    while True:  # заново, пока ошибки в max_sequences не разойдутся с верным и между собой
        model, gpu, budgets = _SETUPS[(variant + rng.randrange(6)) % 6]
        s = memory.ModelShape.from_name(model)
        kv_dtype, b = rng.choice([("bfloat16", 2), ("bfloat16", 2), ("fp8", 1)])
        prompt, group = rng.choice([256, 384, 512]), rng.choice([4, 8, 16])
        response = rng.choice([1024, 2048, 3072, 4096] if s.num_params < 10**9 else [4096, 8192])
        task = {"model": model, "gpu": gpu, **{k: getattr(s, k) for k in _SHAPE}}
        task |= {"kv_dtype": kv_dtype, "bytes_per_value": b, "budget_gib": rng.choice(budgets)}
        task |= {"weights_bytes": s.weights_bytes(2), "group_size": group, "prompt_tokens": prompt}
        task["response_tokens"] = response
        slips = [_misread(task, *m) for key, *m in _MISREAD.values() if key == _KEYS[1]]
        seqs = [x["max_sequences"] for x in [_kv_solve(task), *slips]]
        if len(set(seqs)) == len(seqs) and seqs[0] >= group:
            break
    statement = (
        f"**Бюджет KV-кэша.** Генерация: {model} на {gpu}. Из `data/model_configs/{model}.json` "
        f"(и `task_12_2_7['num_layers']` и т. д.): слоёв L = {s.num_layers}, голов внимания H = "
        f"{s.num_attention_heads}, KV-голов $H_{{kv}}$ = {s.num_kv_heads}, $d_h$ = hidden_size / H "
        f"= {s.hidden_size} / {s.num_attention_heads} = {s.head_dim}. KV-кэш в {kv_dtype}: b = {b} "
        f"Б на число. Бюджет на веса и кэш — {task['budget_gib']} ГиБ (2³⁰ Б), веса bf16 W = "
        f"{fmt.num(task['weights_bytes'])} Б. GRPO: G = {group} ответов на запрос; в кэше "
        f"последовательности — запрос и ответ, {prompt} + до {fmt.num(response)} токенов (без "
        "общих префиксов).\n\nНайдите, округляя вниз (сравниваются точно): `kv_bytes_per_token` — "
        "байт KV-кэша на токен (все слои); `max_sequences` — сколько последовательностей "
        "поместится рядом с весами; `max_groups` — сколько это целых групп."
    )
    return {"statement": statement, **task}


def _kv_solve(task: dict) -> dict:
    """Байт KV на токен, последовательностей в бюджете после весов, целых групп (memory)."""
    shape = (task[k] for k in ("num_layers", "num_kv_heads", "head_dim"))
    per_tok = memory.kv_cache_bytes(*shape, 1, task["bytes_per_value"])
    tokens = task["prompt_tokens"] + task["response_tokens"]
    budget, weights = task["budget_gib"] * memory.GIB, task["weights_bytes"]
    seqs = memory.max_concurrent_sequences(budget, weights, per_tok, tokens)
    return dict(zip(_KEYS, (per_tok, seqs, seqs // task["group_size"])))


def _kv_solution(task: dict, ref: dict) -> str:
    L, hkv, dh, b = (task[k] for k in ("num_layers", "num_kv_heads", "head_dim", "bytes_per_value"))
    (per_tok, seqs, groups), g, w = ref.values(), task["group_size"], task["weights_bytes"]
    h = task["num_attention_heads"]
    prompt, response = task["prompt_tokens"], task["response_tokens"]
    tokens = fmt.count(prompt + response, "токен", "токена", "токенов")
    per_seq, free = per_tok * (prompt + response), task["budget_gib"] * memory.GIB - w
    return (
        f"**1.** $B_{{KV}} = 2 L H_{{kv}} d_h b$ на токен (2 — ключи и значения; GQA: $H_{{kv}} = "
        f"{hkv}$, а не H = {h}):\n\n$$2 \\cdot {L} \\cdot {hkv} \\cdot {dh} \\cdot {b} = "
        f"{tex_num(per_tok)}\\ \\text{{Б}}.$$\n\n**2.** Запрос и ответ: {prompt} + {response} = "
        f"{tokens}, {fmt.num(per_seq)} Б. После весов: {task['budget_gib']} · 2³⁰ − {fmt.num(w)} = "
        f"{fmt.num(free)} Б;\n\n$$\\left\\lfloor \\frac{{{tex_num(free)}}}{{{tex_num(per_seq)}}} "
        f"\\right\\rfloor = {seqs}.$$\n\n**3.** ⌊{seqs} / {g}⌋ = "
        f"{fmt.count(groups, 'группа', 'группы', 'групп')}.\n\n**Ответ:** `{ref}`."
    )


_MISREAD = {  # ошибка: (ключ ответа, где она видна; величина условия; как её прочли)
    "no_factor_two": (_KEYS[0], "bytes_per_value", lambda t: t["bytes_per_value"] / 2),
    "attention_heads_not_kv": (_KEYS[0], "num_kv_heads", lambda t: t["num_attention_heads"]),
    "forgot_weights": (_KEYS[1], "weights_bytes", lambda t: 0),
    "forgot_prompt": (_KEYS[1], "prompt_tokens", lambda t: 0),
    "budget_in_gb": (_KEYS[1], "budget_gib", lambda t: t["budget_gib"] * memory.GB / memory.GIB),
}
_MESSAGES = {
    "no_factor_two": "Нет множителя 2: KV-кэш хранит и ключи, и значения.",
    "attention_heads_not_kv": "Взято число голов внимания H, а не KV-голов H_kv: при GQA несколько голов запросов делят одну пару K/V (`num_key_value_heads`).",
    "forgot_weights": "Под KV-кэш отдан весь бюджет, а в той же памяти сначала лежат веса W.",
    "forgot_prompt": "Посчитан только ответ, а запрос лежит в KV-кэше всё время генерации.",
    "budget_in_gb": "Бюджет переведён в байты как ГБ (× 10⁹), а он в ГиБ: 1 ГиБ = 2³⁰ Б.",
}


def _misread(task: dict, field: str, value) -> dict:  # ответ, если величину условия прочли не так
    return _kv_solve({**task, field: value(task)})


_ANSWER = Fields(dict.fromkeys(_KEYS, Number(1e-9, integer=True)))
_HINT = "Байт на токен: 2·L·H_kv·d_h·b. Бюджет (ГиБ × 2³⁰) минус веса разделите на байт одной последовательности (запрос + ответ) и округлите вниз; группы — ещё раз вниз после ÷ G."
_TRAPS = tuple(
    Trap(k, _MESSAGES[k], wrong=lambda t, ref, m=m: _misread(t, *m), by=(key,))
    for k, (key, *m) in _MISREAD.items()
)
STEP = Step("12.2.7", _kv_task, _kv_solve, _ANSWER, _HINT, _kv_solution, _TRAPS)
