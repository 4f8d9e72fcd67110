"""12.2.7 — бюджет KV-кэша: байты на токен, одновременные последовательности и группы GRPO."""

import random

from course_utils import fmt, memory
from course_utils.exercises.answers import Number
from course_utils.exercises.lesson_12_2.optimizer_state import UnitFields, by_key, tex
from course_utils.exercises.step import Step, Trap

# (модель, GPU, бюджет под веса и KV в ГиБ); у всех моделей GQA: H ≠ H_kv.
_SETUPS = (("SmolLM2-135M", "T4 (16 ГБ)", (10, 12)), ("SmolLM2-360M", "T4 (16 ГБ)", (10, 12)),
           ("Qwen2.5-0.5B", "L4 (24 ГБ)", (16, 20)), ("Qwen2.5-1.5B", "A100 40 ГБ", (30, 34)),
           ("Qwen2.5-7B", "A100 80 ГБ", (64, 70)), ("Llama-3.1-8B", "H100 80 ГБ", (64, 70)))  # fmt: skip
_EXACT = Number(rtol=1e-9, integer=True)


# Ошибка: (ключ, по которому видна, подмена в solve, сообщение); make_task разводит max_sequences.
_SLIPS = {
    "no_factor_two": ("kv_bytes_per_token", {"halve": True}, "Байт на токен вдвое меньше нужного: кэш "
        "хранит и ключи (K), и значения (V), поэтому в формуле B_KV = 2·L·H_kv·d_h·N_tok·b есть множитель 2."),
    "attention_heads_not_kv": ("kv_bytes_per_token", {"heads": "num_attention_heads"}, "Вы взяли число "
        "голов внимания H вместо числа KV-голов H_kv. В модели с GQA несколько голов запросов "
        "делят одну "
        "пару K/V, и в кэше хранится только H_kv голов (`num_key_value_heads`)."),
    "forgot_weights": ("max_sequences", {"weights": False}, "Под KV-кэш вы отдали весь бюджет. Сначала в той "
        "же памяти лежат веса модели W: на кэш остаётся бюджет − W."),
    "forgot_prompt": ("max_sequences", {"prompt": False}, "Вы посчитали последовательность только по "
        "токенам ответа. Запрос лежит в KV-кэше всё время генерации: одна последовательность "
        "держит "
        "запрос + ответ токенов."),
    "budget_in_gb": ("max_sequences", {"unit": memory.GB}, "Бюджет вы перевели в байты как ГБ (× 10⁹), "
        f"а он дан в ГиБ: 1 ГиБ = 2³⁰ Б = {fmt.num(memory.GIB)} Б, примерно на 7 % больше 10⁹ Б."),
}  # fmt: skip


def _tokens(n: int) -> str:
    return fmt.count(n, "токен", "токена", "токенов")


def make_task(variant: int) -> dict:
    rng = random.Random(12_2_7_000 + 7919 * variant)
    while True:  # тянем заново, пока ошибки числа последовательностей не разойдутся с верным
        model, gpu, budgets = _SETUPS[(variant + rng.randrange(6)) % 6]
        s = memory.ModelShape.from_name(model)
        kv_dtype, b = rng.choice([("bfloat16", 2), ("bfloat16", 2), ("fp8", 1)])
        prompt, group = rng.choice([256, 384, 512]), rng.choice([4, 8, 16])
        response = rng.choice([1024, 2048, 3072, 4096] if s.num_params < 10**9 else [4096, 8192])
        task = {"model": model, "gpu": gpu, "num_layers": s.num_layers,
                "num_attention_heads": s.num_attention_heads, "num_kv_heads": s.num_kv_heads,
                "head_dim": s.head_dim, "hidden_size": s.hidden_size, "kv_dtype": kv_dtype,
                "bytes_per_value": b, "budget_gib": rng.choice(budgets), "weights_bytes": s.weights_bytes(2),
                "group_size": group, "prompt_tokens": prompt, "response_tokens": response}  # fmt: skip
        slips = [{}] + [kw for key, kw, _ in _SLIPS.values() if key == "max_sequences"]
        seqs = [solve(task, **kw)["max_sequences"] for kw in slips]
        if len(set(seqs)) == len(seqs) and seqs[0] >= group:
            break
    statement = (
        f"**Бюджет KV-кэша.** Движок генерации обслуживает {model} на {gpu}. Из "
        f"`data/model_configs/{model}.json` (те же числа — в `task_12_2_7['num_layers']` и т. д.):"
        f"\n\n| величина | значение |\n|---|---|\n| слоёв L (`num_hidden_layers`) | {s.num_layers} "
        f"|\n| голов внимания H (`num_attention_heads`) | {s.num_attention_heads} |\n| KV-голов "
        f"$H_{{kv}}$ (`num_key_value_heads`) | {s.num_kv_heads} |\n| размер головы $d_h$ = "
        f"hidden_size / H | {s.head_dim} |\n| hidden_size | {s.hidden_size} |\n\nKV-кэш хранится в "
        f"{kv_dtype}: b = {b} Б на число. Под веса и KV-кэш движку отдано {task['budget_gib']} ГиБ "
        f"(1 ГиБ = 2³⁰ Б); веса в bf16 занимают W = {fmt.num(task['weights_bytes'])} Б. GRPO: "
        f"группа из G = {group} ответов на запрос, запрос — {_tokens(prompt)}, ответ — до "
        f"{_tokens(response)}; считайте, что каждая последовательность держит в кэше все {prompt} "
        f"+ {_tokens(response)} (худший случай, без общих префиксов).\n\nНайдите:\n1. "
        f"`kv_bytes_per_token` — байт KV-кэша на один токен (все слои);\n2. `max_sequences` — "
        "сколько таких последовательностей одновременно помещается в бюджет после весов (округлите "
        "вниз);\n3. `max_groups` — сколько целых групп GRPO это даёт (округлите вниз).\n\n"
        'Ответ — словарь `{"kv_bytes_per_token": …, "max_sequences": …, "max_groups": …}`; все '
        "три — целые числа, они сравниваются точно."
    )
    return {"statement": statement, **task}


def solve(task: dict, heads: str = "num_kv_heads", halve: bool = False, weights: bool = True,
          prompt: bool = True, unit: int = memory.GIB) -> dict:  # fmt: skip
    """Ответ по memory; аргументы — подмены ради типичных ошибок (False — слагаемое забыто)."""
    per_tok = memory.kv_cache_bytes(task["num_layers"], task[heads], task["head_dim"], 1,
                                    task["bytes_per_value"]) // (2 if halve else 1)  # fmt: skip
    seqs = memory.max_concurrent_sequences(task["budget_gib"] * unit, task["weights_bytes"] * weights,
                                           per_tok, task["prompt_tokens"] * prompt + task["response_tokens"])  # fmt: skip
    return {"kv_bytes_per_token": per_tok, "max_sequences": seqs,
            "max_groups": seqs // task["group_size"]}  # fmt: skip


def solution(task: dict, ref: dict) -> str:
    L, hkv, dh, b = (task[k] for k in ("num_layers", "num_kv_heads", "head_dim", "bytes_per_value"))
    h, g, w = task["num_attention_heads"], task["group_size"], task["weights_bytes"]
    n_tok = task["prompt_tokens"] + task["response_tokens"]
    per_seq, free = ref["kv_bytes_per_token"] * n_tok, task["budget_gib"] * memory.GIB - w
    return (
        "**1. Байт на токен.** $B_{KV} = 2 L H_{kv} d_h N_{tok} b$; множитель 2 — ключи и "
        f"значения, а головы — KV-головы ($H_{{kv}} = {hkv}$, а не H = {h}: это GQA). При "
        f"$N_{{tok}} = 1$:\n\n$$2 \\cdot {L} \\cdot {hkv} \\cdot {dh} \\cdot {b} = "
        f"{tex(ref['kv_bytes_per_token'])}\\ \\text{{Б}} = {ref['kv_bytes_per_token'] / 1024:g}\\ "
        f"\\text{{КиБ}}.$$\n\n**2. Последовательности.** Одна последовательность держит "
        f"{task['prompt_tokens']} + {task['response_tokens']} = {_tokens(n_tok)}, то есть "
        f"{fmt.num(per_seq)} Б. После весов остаётся {task['budget_gib']} · 2³⁰ − {fmt.num(w)} = "
        f"{fmt.num(free)} Б, поэтому\n\n$$\\left\\lfloor \\frac{{{tex(free)}}}{{{tex(per_seq)}}} "
        f"\\right\\rfloor = {ref['max_sequences']}.$$\n\n**3. Группы.** ⌊{ref['max_sequences']} / "
        f"{g}⌋ = {fmt.count(ref['max_groups'], 'группа', 'группы', 'групп')} по G = "
        f"{g}.\n\n**Ответ:** `{ref}`.\n\nРазмер группы и длина ответа — инфраструктурные "
        f"параметры: вдвое длиннее ответ — вдвое меньше одновременных групп. PagedAttention "
        "снижает потери на фрагментацию, но не отменяет линейной стоимости ключей и значений."
    )


STEP = Step(
    id="12.2.7", make_task=make_task, solve=solve, solution=solution,
    answer=UnitFields({k: _EXACT for k in ("kv_bytes_per_token", "max_sequences", "max_groups")}),
    hint="Байт на токен: 2·L·H_kv·d_h·b — двойка за K и V, головы — KV-головы. Из бюджета "
    "(ГиБ × 2³⁰) сначала вычтите веса, остаток разделите на байты одной последовательности "
    "(запрос + ответ токенов) и округлите вниз; группы — ещё раз вниз после деления на G.",
    traps=tuple(Trap(name, message, **by_key(key, lambda t, kw=kw: solve(t, **kw), _EXACT))
                for name, (key, kw, message) in _SLIPS.items()),
)  # fmt: skip
