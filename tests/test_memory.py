"""Тесты course_utils.memory: каждая формула — против независимого числа.

Источники чисел: статья ZeRO (Rajbhandari et al., 2019, §5, рис. 1), лекция 12.2 (128 КиБ на
токен, 32 ГиБ), документация DeepSpeed (t5-3b, ZeRO-2: 11.28 «GB» = ГиБ), распечатки peft для
Qwen2.5, индексы safetensors (total_size), реальные тензоры torch и кэш transformers крошечной
модели, модели transformers на устройстве meta, исходный код accelerate estimate-memory.
"""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import memory
from course_utils.fmt import NBSP, num
from course_utils.memory import (
    GB,
    GIB,
    KIB,
    MIB,
    RECIPES,
    ModelShape,
    TrainingRecipe,
    colocation_peak,
    fmt_bytes,
    kv_cache_bytes,
    lora_trainable_params,
    max_concurrent_sequences,
    per_rank_breakdown,
    per_rank_state_bytes,
    recipe,
    state_bytes,
    sum_of_component_maxima,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_DIR = REPO_ROOT / "data" / "tiny_arith_lm"
CONFIG_NAMES = [
    "Llama-3.1-8B",
    "Qwen2.5-0.5B",
    "Qwen2.5-1.5B",
    "Qwen2.5-7B",
    "SmolLM2-135M",
    "SmolLM2-360M",
]
# Опубликованные итоги (см. data/model_configs/README.md: откуда и насколько проверяемы).
PUBLISHED_PARAMS = {
    "Qwen2.5-0.5B": 494_032_768,
    "Qwen2.5-1.5B": 1_543_714_304,
    "Qwen2.5-7B": 15_231_233_024 // 2,  # safetensors index total_size, bf16
    "Llama-3.1-8B": 16_060_522_496 // 2,  # safetensors index total_size, bf16
    "SmolLM2-135M": 134_515_008,
    "SmolLM2-360M": 361_821_120,
}


# ----------------------------------------------------------------------------- единицы


def test_fmt_bytes_names_the_unit():
    assert fmt_bytes(1.5 * GIB) == f"1.50{NBSP}ГиБ (2³⁰ Б)"
    assert fmt_bytes(1.5 * GIB, explain=False) == f"1.50{NBSP}ГиБ"
    assert fmt_bytes(120 * GB, "GB") == f"120.00{NBSP}ГБ (10⁹ Б)"
    assert fmt_bytes(128 * KIB, "KiB") == f"128.00{NBSP}КиБ (2¹⁰ Б)"
    # 1 ГБ ≠ 1 ГиБ: 10^9 / 2^30 ≈ 0.93
    assert memory.to_unit(GB, "GiB") == pytest.approx(0.9313225746)
    with pytest.raises(ValueError, match="unit"):
        fmt_bytes(1, "gigs")
    with pytest.raises(ValueError, match="n_bytes"):
        fmt_bytes(-1)


def test_fmt_bytes_groups_digits_the_russian_way():
    """Разряды — неразрывный пробел, не запятая (131,072 читается как «131 целая»)."""
    assert fmt_bytes(1_234_567, "B") == f"1{NBSP}234{NBSP}567{NBSP}Б"
    assert fmt_bytes(131_072, "B") == f"131{NBSP}072{NBSP}Б"
    assert fmt_bytes(2048 * GIB) == f"2{NBSP}048.00{NBSP}ГиБ (2³⁰ Б)"
    assert "," not in fmt_bytes(10**15, "B") + fmt_bytes(10**15, "KiB")
    assert memory.unit_label("GiB") == "ГиБ (2³⁰ Б)" and "^" not in memory.unit_label("GB")


def test_module_import_does_not_import_torch():
    code = "import sys, course_utils.memory; assert 'torch' not in sys.modules, 'torch'"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr


# ----------------------------------------------------------------------------- рецепты


@pytest.mark.parametrize(
    "name,parts,total",
    [
        ("fp32_adam", (4, 4, 4, 4, 0), 16),
        ("bf16_mixed_adam", (2, 2, 4, 4, 4), 16),
        ("mixed_fp32_grads", (2, 4, 4, 4, 4), 18),
        ("bf16_pure_adam", (2, 2, 2, 2, 0), 8),
        ("adam8bit_mixed", (2, 2, 1, 1, 4), 10),
        ("sgd_fp32", (4, 4, 0, 0, 0), 8),
    ],
)
def test_recipe_presets(name, parts, total):
    r = recipe(name)
    assert (r.param_bytes, r.grad_bytes, r.m1_bytes, r.m2_bytes, r.master_bytes) == parts
    assert r.total == total
    assert r.label and any("а" <= ch <= "я" for ch in r.label.lower())
    assert str(total) in r.describe()


def test_recipe_is_frozen_and_checked():
    r = RECIPES["fp32_adam"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.param_bytes = 2
    with pytest.raises(ValueError, match="grad_bytes"):
        TrainingRecipe(2, -1, 4, 4, 4)
    with pytest.raises(ValueError, match="fp32_adam"):  # перечень допустимых имён
        recipe("adam_fp64")
    # ZeRO: K = m1 + m2 + master = 12 для смешанной точности
    assert RECIPES["bf16_mixed_adam"].optimizer_bytes == 12
    # дробные байты (4-битные веса) допустимы и округляются вверх до целого байта
    assert state_bytes(3, TrainingRecipe(0.5, 0, 0, 0, 0)) == 2


def test_state_bytes_against_published_rules():
    # ZeRO §3.1: (2 + 2 + K)Ψ, Ψ = 7.5B, K = 12 → 120 GB
    assert state_bytes(7_500_000_000, "bf16_mixed_adam") == 120 * GB
    # Ultra-Scale Playbook: 1B → 16 GB, 7B → 112 GB (16N); +4N при fp32-градиентах…
    assert state_bytes(10**9, RECIPES["bf16_mixed_adam"]) == 16 * GB
    assert state_bytes(7 * 10**9, RECIPES["bf16_mixed_adam"]) == 112 * GB
    # EleutherAI cookbook: 2 + 4 + 12 = 18 Б/параметр по умолчанию
    assert state_bytes(10**9, "mixed_fp32_grads") == 18 * GB
    with pytest.raises(ValueError, match="n_params должно быть целым ≥ 1"):
        state_bytes(0, "fp32_adam")  # модель без параметров — ошибка ввода, а не «0 байт»


# ----------------------------------------------------------------------------- ZeRO / DDP

PSI = 7_500_000_000


@pytest.mark.parametrize(
    "stage,expected_bytes,printed",
    [(0, 120_000_000_000, 120.0), (1, 31_406_250_000, 31.4), (2, 16_640_625_000, 16.6)]
    + [(3, 1_875_000_000, 1.9)],
)
def test_zero_paper_figure1(stage, expected_bytes, printed):
    """Статья ZeRO, рис. 1: Ψ = 7.5B, N_d = 64, K = 12 (GB = 10^9 Б)."""
    got = per_rank_state_bytes(PSI, "bf16_mixed_adam", 64, stage)
    assert got == expected_bytes
    assert round(got / GB, 1) == printed


@pytest.mark.parametrize(
    "nd,pos,posg,posgp",
    [(1, 120, 120, 120), (4, 52.5, 41.25, 30), (16, 35.625, 21.5625, 7.5)],
)
def test_zero_sweep(nd, pos, posg, posgp):
    got = [per_rank_state_bytes(PSI, "bf16_mixed_adam", nd, s) / GB for s in (1, 2, 3)]
    assert got == [pos, posg, posgp]


def test_deepspeed_zero2_estimator_t5_3b():
    """DeepSpeed estimate_zero2: gpu = 2P + 18P/N (fp16-веса реплицированы; fp16+fp32 градиенты,
    fp32-мастер, m, v — шардированы). t5-3b, 8 GPU: 11.28 («GB», на деле ГиБ)."""
    ds = TrainingRecipe(2, 2 + 4, 4, 4, 4)
    p = 2_851_000_000  # «2851M total params» из документации — округлённое
    got = per_rank_state_bytes(p, ds, 8, 2)
    assert got == 2 * p + 18 * p // 8
    assert round(got / GIB, 2) == 11.28


def test_per_rank_breakdown_ceil_and_sum():
    b = per_rank_breakdown(10, "fp32_adam", 3, 3)
    assert b == {"params": 16, "grads": 16, "optimizer": 32, "total": 64}  # ⌈10/3⌉ = 4
    assert 3 * b["total"] >= state_bytes(10, "fp32_adam")
    ddp = per_rank_breakdown(10, "fp32_adam", 3, 0)
    assert ddp["total"] == state_bytes(10, "fp32_adam")
    z1 = per_rank_breakdown(10, "bf16_mixed_adam", 3, 1)
    assert z1 == {"params": 20, "grads": 20, "optimizer": 48, "total": 88}
    # стадии монотонно уменьшают память ранга
    totals = [per_rank_state_bytes(10**6, "bf16_mixed_adam", 8, s) for s in range(4)]
    assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize(
    "kwargs,arg",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": 2.5}, "world_size"),
        ({"zero_stage": 4}, "zero_stage"),
        ({"zero_stage": -1}, "zero_stage"),
        ({"zero_stage": True}, "zero_stage"),
        ({"n_params": -5}, "n_params"),
        ({"n_params": 1.5}, "n_params"),
        ({"recipe": "adam_fp64"}, "recipe"),
        ({"recipe": 16}, "recipe"),
    ],
)
def test_per_rank_bad_input(kwargs, arg):
    args = {"n_params": 100, "recipe": "fp32_adam", "world_size": 2, "zero_stage": 1} | kwargs
    with pytest.raises(ValueError, match=arg if arg != "recipe" else "рецепт|recipe"):
        per_rank_state_bytes(**args)


# ----------------------------------------------------------------------------- KV-кэш


def test_kv_lecture_example():
    per_token = kv_cache_bytes(32, 8, 128, 1, 2)
    assert per_token == 131_072 == 128 * KIB
    total = kv_cache_bytes(32, 8, 128, 64 * 4096, 2)
    assert 64 * 4096 == 262_144
    assert total == 32 * GIB
    assert fmt_bytes(total) == f"32.00{NBSP}ГиБ (2³⁰ Б)"
    # без множителя 2 (типичная ошибка) было бы вдвое меньше
    assert total == 2 * (32 * 8 * 128 * 262_144 * 2)


def test_kv_research_measurements():
    """Замер заметки: bf16, batch 2 × 37 токенов: SmolLM2-135M 1 704 960 Б, Qwen2.5-0.5B 909 312 Б."""
    assert ModelShape.from_name("SmolLM2-135M").kv_bytes_per_token(2) * 74 == 1_704_960
    assert ModelShape.from_name("Qwen2.5-0.5B").kv_bytes_per_token(2) * 74 == 909_312


@pytest.mark.parametrize(
    "args,arg",
    [
        ((-1, 8, 128, 1, 2), "num_layers"),
        ((32, 0.5, 128, 1, 2), "num_kv_heads"),
        ((32, 8, 128, -1, 2), "num_tokens"),
        ((32, 8, 128, 1, 0), "bytes_per_value"),
        ((32, 8, 128, 1, float("nan")), "bytes_per_value"),
    ],
)
def test_kv_bad_input(args, arg):
    with pytest.raises(ValueError, match=arg):
        kv_cache_bytes(*args)


def test_max_concurrent_sequences_hand_computed():
    per_tok = 128 * KIB  # пример лекции
    # 80 ГиБ, веса 16 ГиБ, 4096 токенов → 0.5 ГиБ на последовательность → 64 / 0.5 = 128
    assert max_concurrent_sequences(80 * GIB, 16 * GIB, per_tok, 4096) == 128
    # резерв 10 %: 72 − 16 = 56 ГиБ → 112
    assert max_concurrent_sequences(80 * GIB, 16 * GIB, per_tok, 4096, 0.1) == 112
    # ровно впритык и на байт меньше
    assert max_concurrent_sequences(16 * GIB + 512 * MIB, 16 * GIB, per_tok, 4096) == 1
    assert max_concurrent_sequences(16 * GIB + 512 * MIB - 1, 16 * GIB, per_tok, 4096) == 0
    # веса не помещаются — 0, а не отрицательное число
    assert max_concurrent_sequences(8 * GIB, 16 * GIB, per_tok, 4096) == 0
    with pytest.raises(ValueError, match="reserve_fraction"):
        max_concurrent_sequences(80 * GIB, 16 * GIB, per_tok, 4096, 1.0)
    with pytest.raises(ValueError, match="tokens_per_sequence"):
        max_concurrent_sequences(80 * GIB, 16 * GIB, per_tok, 0)
    with pytest.raises(ValueError, match="budget_bytes"):
        max_concurrent_sequences(-1, 16 * GIB, per_tok, 4096)


# ----------------------------------------------------------------------------- ModelShape


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_param_count_matches_published_total(name):
    shape = ModelShape.from_name(name)
    assert shape.num_params == PUBLISHED_PARAMS[name]
    assert shape.weights_bytes(2) == 2 * PUBLISHED_PARAMS[name]


def test_non_embedding_matches_qwen_model_cards():
    """Карточки Qwen2.5: Non-Embedding 0.36B / 1.31B / 6.53B."""
    parts = {n: ModelShape.from_name(n).param_breakdown() for n in CONFIG_NAMES if "Qwen" in n}
    got = {n: b["layers"] + b["final_norm"] for n, b in parts.items()}  # без эмбеддингов и головы
    assert {n: round(v / 1e9, 2) for n, v in got.items()} == {
        "Qwen2.5-0.5B": 0.36,
        "Qwen2.5-1.5B": 1.31,
        "Qwen2.5-7B": 6.53,
    }


def test_shape_fields_and_bias_rule():
    q = ModelShape.from_name("Qwen2.5-0.5B")
    assert (q.num_layers, q.num_kv_heads, q.head_dim, q.tie_word_embeddings) == (24, 2, 64, True)
    assert q.attention_bias and not q.o_proj_bias and q.model_type == "qwen2"
    llama = ModelShape.from_name("Llama-3.1-8B")
    assert not llama.attention_bias and not llama.o_proj_bias and not llama.tie_word_embeddings
    assert llama.param_breakdown()["lm_head"] == 525_336_576
    assert llama.kv_bytes_per_token(2) == 128 * KIB  # та же форма, что в примере лекции


def _meta_count(config_dict: dict) -> int:
    """Уникальные параметры модели transformers на устройстве meta (после tie_weights)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config_dict)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(cfg)
    model.tie_weights()  # до этого связанные веса ещё не связаны и считались бы дважды
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", [*CONFIG_NAMES, "tiny_arith_lm"])
def test_param_count_matches_meta_model(name):
    if name == "tiny_arith_lm":
        d = json.loads((TINY_DIR / "config.json").read_text())
    else:
        d = json.loads((memory.MODEL_CONFIGS_DIR / f"{name}.json").read_text())
    assert ModelShape.from_config(d).num_params == _meta_count(d)


@pytest.mark.parametrize(
    "extra",
    [
        {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
        {"model_type": "llama", "head_dim": 48, "tie_word_embeddings": True},
        {"model_type": "mistral", "head_dim": 24},
        {"model_type": "qwen3", "head_dim": 40, "attention_bias": True},
        {"model_type": "qwen2", "tie_word_embeddings": False},
    ],
)
def test_bias_and_head_dim_rules_against_meta_model(extra):
    d = {
        "vocab_size": 500,
        "hidden_size": 96,
        "intermediate_size": 200,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
    } | extra
    assert ModelShape.from_config(d).num_params == _meta_count(d)


def test_from_config_sources_agree():
    from transformers import AutoConfig

    by_dir = ModelShape.from_config(TINY_DIR)
    by_file = ModelShape.from_config(str(TINY_DIR / "config.json"))
    by_cfg = ModelShape.from_config(AutoConfig.from_pretrained(TINY_DIR))
    assert by_dir == by_file == by_cfg
    assert by_dir.num_params == 128 * 320 + 4 * by_dir.layer_params() + 128  # связанная голова


@pytest.mark.parametrize(
    "config,arg",
    [
        ({"hidden_size": 64}, "обязательных"),
        (
            {"vocab_size": 10, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1},
            "num_attention_heads",
        ),
        (
            {
                "model_type": "gpt2",
                "vocab_size": 10,
                "hidden_size": 64,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
            },
            "model_type",
        ),
        (
            {
                "vocab_size": 10,
                "hidden_size": 64,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 3,
            },
            "GQA",
        ),
        ("/nonexistent/config.json", "не найден"),
        (42, "config"),
    ],
)
def test_from_config_bad_input(config, arg):
    with pytest.raises(ValueError, match=arg):
        ModelShape.from_config(config)
    with pytest.raises(ValueError, match="конфигурация data/model_configs.*Qwen2.5-0.5B"):
        ModelShape.from_name("GPT-5")


# ----------------------------------------------------------------------------- LoRA


def test_lora_against_peft_printouts():
    """peft: Qwen2.5-0.5B, r=8, q/k/v/o → 1 081 344 из 495 114 112;
    Qwen2.5-1.5B, r=8, все 7 проекций → 9 232 384 из 1 552 946 688."""
    q05 = ModelShape.from_name("Qwen2.5-0.5B")
    t = lora_trainable_params(q05, 8)
    assert t == 1_081_344
    assert q05.num_params + t == 495_114_112
    q15 = ModelShape.from_name("Qwen2.5-1.5B")
    t = lora_trainable_params(q15, 8, memory.LORA_TARGETS)
    assert t == 9_232_384
    assert q15.num_params + t == 1_552_946_688
    # линейно по рангу
    assert lora_trainable_params(q05, 16) == 2 * lora_trainable_params(q05, 8)


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "tiny_arith_lm"])
def test_lora_shapes_match_real_linear_layers(name):
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    src = TINY_DIR / "config.json" if name == "tiny_arith_lm" else None
    d = json.loads((src or memory.MODEL_CONFIGS_DIR / f"{name}.json").read_text())
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**d))
    r = 4
    expected = sum(
        r * (mod.in_features + mod.out_features)
        for full, mod in model.named_modules()
        if full.rsplit(".", 1)[-1] in memory.LORA_TARGETS
    )
    assert lora_trainable_params(ModelShape.from_config(d), r, memory.LORA_TARGETS) == expected


def test_lora_bad_input():
    with pytest.raises(ValueError, match="rank"):
        lora_trainable_params(ModelShape.from_name("SmolLM2-135M"), 0)
    with pytest.raises(ValueError, match="target_modules"):
        lora_trainable_params(ModelShape.from_name("SmolLM2-135M"), 8, ("qkv",))
    with pytest.raises(ValueError, match="target_modules"):
        lora_trainable_params(ModelShape.from_name("SmolLM2-135M"), 8, "q_proj")


# ----------------------------------------------------------------------------- реальные тензоры


def _one_adamw_step(model, dtype):
    import torch

    torch.manual_seed(0)
    x = torch.randn(4, 32, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(x).float().pow(2).mean().backward()
    opt.step()
    return opt


@pytest.mark.parametrize(
    "dtype_name,recipe_name", [("float32", "fp32_adam"), ("bfloat16", "bf16_pure_adam")]
)
def test_state_bytes_exact_against_real_adamw(dtype_name, recipe_name):
    """Σ байт весов + градиентов + exp_avg + exp_avg_sq после шага AdamW = state_bytes точно.

    ``step`` в torch — 0-мерный float32-тензор на каждый тензор параметра (не на элемент):
    рецепт его не считает, ``optimizer_state_bytes`` по умолчанию тоже.
    """
    import torch

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.LayerNorm(48), torch.nn.Linear(48, 7)
    ).to(dtype)
    opt = _one_adamw_step(model, dtype)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    measured = (
        memory.tensor_bytes(params)
        + memory.tensor_bytes(p.grad for p in params)
        + memory.optimizer_state_bytes(opt)
    )
    assert measured == state_bytes(n, RECIPES[recipe_name])
    steps = [s["step"] for s in opt.state.values()]
    assert all(s.dim() == 0 and s.dtype == torch.float32 for s in steps)
    all_state = memory.tensor_bytes(v for s in opt.state.values() for v in s.values())
    assert all_state - memory.optimizer_state_bytes(opt) == 4 * len(params)


def test_kv_bytes_against_real_transformers_cache():
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY_DIR).eval()
    batch, tokens = 3, 11
    ids = torch.randint(3, 300, (batch, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None)
    if cache is None:  # transformers < 5.24
        cache = out.past_key_values
    measured = sum(
        layer.keys.numel() * layer.keys.element_size()
        + layer.values.numel() * layer.values.element_size()
        for layer in cache.layers
    )
    shape = ModelShape.from_config(TINY_DIR)
    elem = next(model.parameters()).element_size()
    assert measured == kv_cache_bytes(
        shape.num_layers, shape.num_kv_heads, shape.head_dim, batch * tokens, elem
    )
    assert measured == shape.kv_bytes_per_token(elem) * batch * tokens


# ----------------------------------------------------------------------------- совместное размещение

PHASES = [
    ("генерация", {"веса": 3 * GIB, "KV-кэш": 10 * GIB, "состояние тренера": 0}),
    ("обучение", {"веса": 3 * GIB, "состояние тренера": 12 * GIB, "активации": 2 * GIB}),
    ("синхронизация", {"веса": 6 * GIB, "состояние тренера": 2 * GIB}),
]


def test_colocation_peak_is_max_not_sum_of_maxima():
    peak, phase = colocation_peak(PHASES)
    assert (peak, phase) == (17 * GIB, "обучение")
    # сумма максимумов статей: 6 + 10 + 12 + 2 = 30 ГиБ — завышено
    assert sum_of_component_maxima(PHASES) == 30 * GIB
    assert sum_of_component_maxima(PHASES) > peak


def test_colocation_peak_ties_and_lora():
    tie = [("a", {"x": 5}), ("b", {"y": 2, "z": 3}), ("c", {"x": 1})]
    assert colocation_peak(tie) == (5, "a")  # при равенстве — первая фаза
    shape = ModelShape.from_name("Qwen2.5-1.5B")
    n = shape.num_params
    w = shape.weights_bytes(2)
    kv = shape.kv_bytes_per_token(2) * 64 * 2048

    def phases(train_state):
        return [
            ("генерация", {"веса": w, "KV": kv}),
            ("обучение", {"состояние": train_state}),
        ]

    full = colocation_peak(phases(state_bytes(n, "bf16_mixed_adam")))
    lora_t = lora_trainable_params(shape, 16, memory.LORA_TARGETS)
    lora = colocation_peak(phases(2 * n + state_bytes(lora_t, "bf16_mixed_adam")))  # база bf16
    assert full[1] == "обучение" and lora[1] == "генерация"
    assert lora[0] < full[0]
    assert lora[0] == w + kv  # с LoRA пик задаёт генерация, а она не обнуляется


@pytest.mark.parametrize(
    "phases,match",
    [
        ([], "непустым"),
        ({"a": {"x": 1}}, "непустым"),
        ([("a", {"x": -1})], "≥ 0"),
        ([("a", [1, 2])], "пар"),
        ([("", {"x": 1})], "имя фазы"),
        ([("a",)], "пар"),
    ],
)
def test_colocation_bad_input(phases, match):
    with pytest.raises(ValueError, match=match):
        colocation_peak(phases)


def test_plot_memory_timeline_returns_axes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = memory.plot_memory_timeline(PHASES, budget_bytes=16 * GIB)
    assert isinstance(ax, matplotlib.axes.Axes)
    assert "ГиБ" in ax.get_ylabel()
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith(f"пик: 17.00{NBSP}ГиБ") for t in texts)
    assert any(f"бюджет 16.00{NBSP}ГиБ" in t for t in texts)
    ax.figure.savefig(tmp_path / "timeline.png")
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="budget_bytes"):
        memory.plot_memory_timeline(PHASES, budget_bytes=0)


def test_plot_memory_timeline_keeps_words_whole_and_legend_inside():
    """«синхронизация» не рвётся на «синхронизаци/я»; легенда лежит внутри осей."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["генерация", "пересчёт log π", "прямой и обратный проход", "синхронизация"]
    phases = [
        (n, {"веса": GIB, "KV-кэш": (i + 1) * GIB, "градиенты": GIB}) for i, n in enumerate(names)
    ]
    ax = memory.plot_memory_timeline(phases, budget_bytes=8 * GIB)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    for name, label in zip(names, labels):
        assert label.split() == name.split(), label  # переносы только между словами
    assert "синхронизация" in labels
    fig = ax.figure
    fig.canvas.draw()
    box = ax.get_legend().get_window_extent()
    axes_box = ax.get_window_extent()
    assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1
    assert axes_box.y0 <= box.y0 and box.y1 <= axes_box.y1
    # легенда выше всех столбцов и линии бюджета: ничего не закрывает
    top_data = ax.transData.transform((0, 8))[1]
    assert box.y0 > top_data
    assert "2³⁰" in ax.get_ylabel()
    plt.close(fig)


# ----------------------------------------------------------------------------- accelerate


@pytest.mark.parametrize("name", ["Qwen2.5-0.5B", "Llama-3.1-8B", "tiny_arith_lm"])
def test_accelerate_rule_reproduces_accelerate_code(name):
    """Наш пересказ правила = функции самого accelerate на meta-модели AutoModel во float32."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoConfig, AutoModel

    src = TINY_DIR / "config.json" if name == "tiny_arith_lm" else None
    d = json.loads((src or memory.MODEL_CONFIGS_DIR / f"{name}.json").read_text())
    with init_empty_weights():
        model = AutoModel.from_config(AutoConfig.for_model(**d), dtype=torch.float32)
    total, (largest, _) = calculate_maximum_sizes(model)
    shape = ModelShape.from_config(d)
    for dtype in ("float32", "float16"):
        rule = memory.accelerate_rule(shape, dtype)
        assert rule["total_size"] == total
        assert rule["largest_layer"] == largest
        assert rule["training"] == estimate_training_usage(total, dtype)
    for dtype in ("int8", "int4"):  # accelerate: все статьи -1, печатает N/A
        assert set(estimate_training_usage(total, dtype).values()) == {-1}
        assert memory.accelerate_rule(shape, dtype)["training"] is None


def test_accelerate_dtypes_are_the_cli_choices():
    """CLI accelerate принимает --dtypes float32/float16/int8/int4 — bfloat16 среди них нет."""
    from accelerate.commands.estimate import estimate_command_parser

    (action,) = [a for a in estimate_command_parser()._actions if a.dest == "dtypes"]
    assert tuple(action.choices) == memory.ACCELERATE_DTYPES
    with pytest.raises(SystemExit):
        estimate_command_parser().parse_args(["m", "--dtypes", "bfloat16"])
    for call in (
        lambda: memory.accelerate_rule(10**9, "bfloat16"),
        lambda: memory.accelerate_estimate(10**9, "bfloat16"),
    ):
        with pytest.raises(ValueError, match="bfloat16"):
            call()
    with pytest.raises(ValueError, match="name"):  # только конфигурации data/model_configs
        memory.accelerate_printout("config.json")


def test_accelerate_printout_is_the_real_table_offline(monkeypatch):
    """Таблицу печатает код accelerate (без сети); наш пересказ даёт те же строки по всем dtype."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = memory.accelerate_printout("Qwen2.5-0.5B")
    assert "Memory Usage for loading `Qwen/Qwen2.5-0.5B`" in text
    rows = memory.parse_accelerate_printout(text)
    assert list(rows) == list(memory.ACCELERATE_DTYPES)
    shape = ModelShape.from_name("Qwen2.5-0.5B")
    for dtype, printed in rows.items():
        assert memory.accelerate_rule(shape, dtype)["printed"] == printed, dtype
    # P_acc = 494 032 768 параметров + 64 числа буферов; total = 4·P_acc Б, «GB» = деление на 1024³
    p_acc = 494_032_768 + 64
    assert rows["float32"]["Total Size"] == f"{round(4 * p_acc / 2**30, 2)} GB" == "1.84 GB"
    assert rows["float16"]["Total Size"] == f"{round(2 * p_acc / 2**20, 2)} MB"  # делит на 2
    assert rows["int4"]["Total Size"] == f"{round(4 * p_acc / 8 / 2**20, 2)} MB"
    assert rows["float32"]["Training using Adam"] == f"{round(16 * p_acc / 2**30, 2)} GB"
    assert rows["float16"]["Training using Adam"] == f"{round(8 * p_acc / 2**30, 2)} GB"
    assert rows["int8"]["Training using Adam"] == "N/A"
    with pytest.raises(ValueError, match="text"):
        memory.parse_accelerate_printout("нет таблицы")


def test_accelerate_table_says_which_rows_accelerate_prints():
    """Заметка §1.3: Llama-3.1-8B fp16 «Training using Adam» 55.92 GB; строки, которых accelerate
    не печатает, так и подписаны, и в столбце «accelerate печатает» у них прочерк."""
    llama = memory.accelerate_estimate(ModelShape.from_name("Llama-3.1-8B"), "float16")
    by_name = llama.set_index("статья")
    printed = by_name[by_name["у accelerate"].str.startswith("печатает")]
    assert list(printed["accelerate печатает"]) == ["13.98 GB", "55.92 GB"]
    assert {"«Total Size»", "«Training using Adam»"} == {
        t.split(": ")[1] for t in printed["у accelerate"]
    }
    hidden = by_name[by_name["у accelerate"].str.startswith("не печатает")]
    assert len(hidden) == 5 and set(hidden["accelerate печатает"]) == {"—"}
    last = by_name.loc["обучение с Adam: итог"]
    assert last["калькулятор курса, Б"] == num(16 * 8_030_261_248)
    assert "максимум" in last["почему различаются"]
    assert "сумму" in last["почему различаются"]
    assert num(525_336_576) in by_name.loc["параметров, шт.", "почему различаются"]
    p_acc = 8_030_261_248 - 525_336_576 + 128  # без lm_head, плюс буферы inv_freq (d_h = 128)
    assert by_name.loc["градиенты", "accelerate, Б"] == num(6 * p_acc)  # 1.5 × fp32
    assert "," not in "".join(llama["accelerate, Б"]) + "".join(llama["калькулятор курса, Б"])
    q = memory.accelerate_estimate(ModelShape.from_name("Qwen2.5-0.5B"), "float32")
    assert q.iloc[-1]["accelerate печатает"] == "7.36 GB"
    assert q.iloc[1]["accelerate печатает"] == "1.84 GB"
    assert "совпадают" in q.iloc[-1]["почему различаются"]  # fp32: max = step = 16 Б = сумма
    # целое число параметров: ни головы, ни буферов
    assert memory.accelerate_rule(10**9, "float16")["training_reported"] == 8 * 10**9
    assert (
        memory.accelerate_rule(10**9, "int4")["printed"]["Total Size"] == "476.84 MB"
    )  # 4·10⁹/8 Б
    with pytest.raises(ValueError, match="dtype"):
        memory.accelerate_estimate(10**9, "int8")  # обучение accelerate для int8 не оценивает


# ----------------------------------------------------------------------------- уровень C


def test_zero_redundancy_optimizer_state_per_rank():
    """2 процесса, ZeroRedundancyOptimizer(AdamW): сумма по рангам = полное состояние AdamW,
    посчитанное отдельно в этом процессе; каждый ранг держит меньше полного."""
    import torch

    from course_utils.multiproc import launch

    hidden, layers = 128, 3
    res = launch(
        "course_utils.multiproc.zero_state:measure_zero_state",
        nprocs=2,
        args={"hidden": hidden, "layers": layers, "seed": 0},
        timeout_s=90,
        backend="gloo",
    ).raise_for_status()
    r0, r1 = res.results

    model = memory.build_probe_model(hidden, layers, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, hidden)).pow(2).mean().backward()
    opt.step()
    full_state = memory.optimizer_state_bytes(opt)
    n = sum(p.numel() for p in model.parameters())
    assert n == layers * (8 * hidden**2 + 7 * hidden) + hidden**2 + hidden

    for r in (r0, r1):
        assert r["n_params"] == n
        assert r["param_bytes"] == r["grad_bytes"] == 4 * n  # ZeRO-1: веса и градиенты целиком
        assert r["optimizer_state_bytes"] < full_state
        assert r["optimizer_state_bytes"] == r["predicted_assigned_state_bytes"]
        assert r["params_in_sync"]
    assert r0["pid"] != r1["pid"]
    by_rank = [r0["optimizer_state_bytes"], r1["optimizer_state_bytes"]]
    assert r0["optimizer_state_bytes_by_rank"] == by_rank
    assert sum(by_rank) == full_state == r0["full_optimizer_state_bytes_predicted"]
    mean = sum(by_rank) / 2
    assert mean == pytest.approx(r0["predicted_zero1_optimizer_bytes_per_rank"], rel=1e-6)
    assert max(by_rank) / mean < 1.25  # жадное разбиение целыми тензорами — почти поровну
    assert math.isfinite(r0["loss"])


# ----------------------------------------------------------------------------- ввод: мусор, нули, 7.5e9

_SMALL_CONFIG = {
    "vocab_size": 10,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: memory.tensor_bytes(None), "tensors должно быть списком"),
        (lambda: memory.tensor_bytes([1, 2]), r"tensors\[0\] должно быть тензором"),
        (lambda: memory.tensor_bytes("abc"), "tensors должно быть списком"),
        (lambda: memory.optimizer_state_bytes(None), "optimizer должно быть оптимизатором"),
        (lambda: memory.optimizer_state_bytes("adam"), "optimizer должно быть оптимизатором"),
        (
            lambda: ModelShape.from_config(_SMALL_CONFIG | {"num_attention_heads": 0}),
            r"config\['num_attention_heads'\] должно быть целым ≥ 1, получено 0",
        ),
        (
            lambda: ModelShape.from_config(_SMALL_CONFIG | {"num_attention_heads": "2"}),
            r"config\['num_attention_heads'\] должно быть целым",
        ),
        (  # раньше 0 молча заменялся на num_attention_heads
            lambda: ModelShape.from_config(_SMALL_CONFIG | {"num_key_value_heads": 0}),
            r"config\['num_key_value_heads'\] должно быть целым ≥ 1",
        ),
        (  # раньше 0 молча заменялся на hidden_size // num_attention_heads
            lambda: ModelShape.from_config(_SMALL_CONFIG | {"head_dim": 0}),
            r"config\['head_dim'\] должно быть целым ≥ 1",
        ),
        (lambda: memory.unit_label([]), "unit должно быть одним из"),
        (lambda: memory.plot_memory_timeline([("a", {"x": 1})], unit=[]), "unit"),
    ],
)
def test_garbage_gets_russian_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: kv_cache_bytes(0, 8, 128, 10, 2), "num_layers"),
        (lambda: kv_cache_bytes(32, 0, 128, 10, 2), "num_kv_heads"),
        (lambda: kv_cache_bytes(32, 8, 0, 10, 2), "head_dim"),
        (lambda: kv_cache_bytes(32, 8, 128, 0, 2), "num_tokens"),
        (lambda: memory.accelerate_estimate(0), "n_params_or_shape"),
        (lambda: memory.accelerate_rule(0), "n_params_or_shape"),
        (lambda: per_rank_state_bytes(0, "fp32_adam", 2, 1), "n_params"),
        (lambda: per_rank_breakdown(0, "fp32_adam", 2, 3), "n_params"),
    ],
)
def test_zero_counts_are_refused_not_zero_bytes(call, name):
    with pytest.raises(ValueError, match=rf"{name} должно быть целым ≥ 1, получено 0"):
        call()


def test_integral_floats_count_like_integers():
    """7.5e9 — так пишут 7,5 млрд: те же числа, что у целых (ZeRO §3.1 и лекция 12.2)."""
    # ZeRO-1, Ψ = 7.5B, K = 12, N_d = 64: (2 + 2)Ψ + KΨ/N_d = 30 + 1.40625 ГБ
    assert per_rank_state_bytes(7.5e9, "bf16_mixed_adam", 64.0, 1) == 31_406_250_000
    assert state_bytes(7.5e9, "bf16_mixed_adam") == 120 * GB
    assert kv_cache_bytes(32.0, 8.0, 128.0, 1.0, 2) == 128 * KIB
    assert memory.accelerate_rule(1e9, "float16")["training_reported"] == 8 * 10**9
    assert memory.accelerate_estimate(1e9).iloc[0]["калькулятор курса, Б"] == num(10**9)
    assert max_concurrent_sequences(80 * GIB, 16 * GIB, 128 * KIB, 4096.0) == 128
    probe = memory.build_probe_model(8.0, 1.0)  # L(8h² + 7h) + h² + h при h = 8, L = 1
    assert sum(p.numel() for p in probe.parameters()) == 568 + 72
    shape = ModelShape.from_config(_SMALL_CONFIG | {"num_hidden_layers": 2.0})
    assert shape.num_layers == 2 and type(shape.num_layers) is int
    assert shape == ModelShape.from_config(_SMALL_CONFIG)


@pytest.mark.parametrize("bad", [7.5, True, 1e9 + 0.5, float("inf"), "7.5e9"])
def test_non_integral_counts_are_still_refused(bad):
    with pytest.raises(ValueError, match="n_params должно быть целым"):
        per_rank_state_bytes(bad, "bf16_mixed_adam", 64, 1)
    with pytest.raises(ValueError, match="num_layers должно быть целым"):
        kv_cache_bytes(bad, 8, 128, 1, 2)
    if not isinstance(bad, str):  # строка — путь к config.json, её ошибка другая
        with pytest.raises(ValueError, match="n_params_or_shape должно быть целым"):
            memory.accelerate_rule(bad)


def test_tensor_bytes_single_tensor_and_generator():
    import torch

    assert memory.tensor_bytes(torch.zeros(())) == 4  # 0-мерный тензор раньше падал TypeError
    assert memory.tensor_bytes(torch.zeros(3, 5, dtype=torch.bfloat16)) == 3 * 5 * 2
    assert memory.tensor_bytes(t for t in [torch.zeros(2), None, torch.zeros(4)]) == 24
