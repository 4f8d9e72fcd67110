"""Урок 12.2: смета памяти — байты на параметр, DDP и ZeRO/FSDP по рангам, KV-кэш, совместное размещение.

Всё считается в **байтах, целыми числами**. Единицы при показе называем явно:
1 ГиБ (GiB) = 2³⁰ Б, 1 ГБ (GB) = 10⁹ Б — см. ``fmt_bytes`` и ``to_unit``.

Что здесь есть:

* ``TrainingRecipe`` и словарь ``RECIPES`` — сценарии «сколько байт на параметр» хранят веса,
  градиенты, моменты Adam m1/m2 и fp32-мастер-копия; ``state_bytes`` — B_state = N·Σb;
* ``per_rank_state_bytes`` / ``per_rank_breakdown`` — DDP (стадия 0) и ZeRO-1/2/3 (= FSDP full
  shard) на один ранг; ``lora_trainable_params`` / ``lora_state_bytes`` — LoRA;
* ``kv_cache_bytes`` (B_KV = 2·L·H_kv·d·T·b) и ``max_concurrent_sequences`` — бюджет генерации;
* ``ModelShape.from_config`` — форма модели из config.json (Qwen2, Llama, Mistral, Qwen3) с точным
  числом параметров (связанные эмбеддинги, смещения q/k/v, GQA);
* ``colocation_peak`` и ``plot_memory_timeline`` — пик совместного размещения как максимум по фазам;
* ``accelerate_printout`` — таблица настоящего ``accelerate estimate-memory`` (его код, без сети);
  ``accelerate_rule`` — его правило по шагам; ``accelerate_estimate`` — сравнение с калькулятором;
* уровень C: ``measure_zero_state`` — точка входа для ``multiproc.launch``: настоящий
  ``ZeroRedundancyOptimizer``, байты состояний оптимизатора на каждом ранге.

Модуль не импортирует torch при импорте: torch, transformers и matplotlib загружаются внутри
функций, которым они нужны.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import textwrap
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from course_utils.args import choice, flag, integer, is_real, nonnegative, positive, real
from course_utils.fmt import NBSP, count, num

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_CONFIGS_DIR = REPO_ROOT / "data" / "model_configs"

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

# unit → (делитель, короткое русское имя, пояснение степени)
_UNITS: dict[str, tuple[int, str, str]] = {
    "B": (1, "Б", ""),
    "KiB": (KIB, "КиБ", "2¹⁰ Б"),
    "MiB": (MIB, "МиБ", "2²⁰ Б"),
    "GiB": (GIB, "ГиБ", "2³⁰ Б"),
    "TiB": (TIB, "ТиБ", "2⁴⁰ Б"),
    "KB": (KB, "КБ", "10³ Б"),
    "MB": (MB, "МБ", "10⁶ Б"),
    "GB": (GB, "ГБ", "10⁹ Б"),
    "TB": (TB, "ТБ", "10¹² Б"),
}


# ----------------------------------------------------------------------------- проверки


def _check_nonneg(name: str, value: Any, strict: bool = False) -> numbers.Real:
    """Проверка ``nonnegative``/``positive`` из args, но значение возвращается как есть:
    Fraction и большие целые не превращаются во float и остаются точными."""
    (positive if strict else nonnegative)(name, value)
    return value


def _exact(x: numbers.Real) -> Fraction:
    """Точная дробь в десятичном смысле: 0.5 → 1/2, 0.1 → 1/10 (а не двоичное 0.1000…0555)."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, numbers.Integral):
        return Fraction(int(x))
    return Fraction(repr(float(x)))


def _ceil_bytes(x: Fraction | int) -> int:
    return int(math.ceil(x)) if isinstance(x, Fraction) else int(x)


def _check_unit(unit: Any) -> str:
    return choice("unit", unit, _UNITS)


# ----------------------------------------------------------------------------- единицы


def to_unit(n_bytes: numbers.Real, unit: str = "GiB") -> float:
    """Байты в выбранной единице: n / 2³⁰ для "GiB", n / 10⁹ для "GB" и т. п. (float)."""
    _check_nonneg("n_bytes", n_bytes)
    return float(n_bytes) / _UNITS[_check_unit(unit)][0]


def unit_label(unit: str = "GiB", explain: bool = True) -> str:
    """Подпись единицы по-русски: "ГиБ (2³⁰ Б)" для "GiB", "ГБ (10⁹ Б)" для "GB"."""
    _, short, power = _UNITS[_check_unit(unit)]
    return f"{short} ({power})" if explain and power else short


def fmt_bytes(
    n_bytes: numbers.Real, unit: str = "GiB", digits: int = 2, explain: bool = True
) -> str:
    """Строка для ноутбука: fmt_bytes(1.5·2³⁰) → "1.50 ГиБ (2³⁰ Б)"; explain=False → "1.50 ГиБ".

    unit — одна из "B", "KiB", "MiB", "GiB", "TiB" (степени 2) или "KB", "MB", "GB", "TB"
    (степени 10). Разряды — через неразрывный пробел (``fmt.num``), перед единицей — тоже он;
    для unit="B" печатается целое: "1 234 567 Б".
    """
    _check_nonneg("n_bytes", n_bytes)
    digits = integer("digits", digits, 0)
    if _check_unit(unit) == "B":
        return f"{num(_ceil_bytes(_exact(n_bytes)))}{NBSP}Б"
    return f"{num(to_unit(n_bytes, unit), digits)}{NBSP}{unit_label(unit, explain)}"


# ----------------------------------------------------------------------------- рецепты


@dataclass(frozen=True)
class TrainingRecipe:
    """Байты на один параметр: веса, градиенты, моменты Adam m1 и m2, fp32-мастер-копия.

    B_state / N = param_bytes + grad_bytes + m1_bytes + m2_bytes + master_bytes = ``total``.
    Состояния оптимизатора в смысле ZeRO (его K) = m1 + m2 + master = ``optimizer_bytes``.
    Допустимы дробные значения (например 0.5 Б для 4-битных весов), все ≥ 0.
    """

    param_bytes: numbers.Real
    grad_bytes: numbers.Real
    m1_bytes: numbers.Real
    m2_bytes: numbers.Real
    master_bytes: numbers.Real
    label: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("param_bytes", "grad_bytes", "m1_bytes", "m2_bytes", "master_bytes"):
            _check_nonneg(name, getattr(self, name))
        if not isinstance(self.label, str):
            raise ValueError(f"label должно быть строкой, получено {self.label!r}")

    @property
    def total(self) -> numbers.Real:
        """Σ байт на параметр: b_param + b_grad + b_m1 + b_m2 + b_master."""
        return (
            self.param_bytes + self.grad_bytes + self.m1_bytes + self.m2_bytes + self.master_bytes
        )

    @property
    def optimizer_bytes(self) -> numbers.Real:
        """Байт на параметр в состояниях оптимизатора (ZeRO: K) = b_m1 + b_m2 + b_master."""
        return self.m1_bytes + self.m2_bytes + self.master_bytes

    def describe(self) -> str:
        """Одна строка по-русски: "2 + 2 + 4 + 4 + 4 = 16 Б/параметр — <подпись>"."""
        parts = (self.param_bytes, self.grad_bytes, self.m1_bytes, self.m2_bytes, self.master_bytes)
        text = " + ".join(f"{p:g}" for p in parts) + f" = {self.total:g} Б/параметр"
        return f"{text} — {self.label}" if self.label else text


RECIPES: dict[str, TrainingRecipe] = {
    "fp32_adam": TrainingRecipe(
        4, 4, 4, 4, 0, "Adam целиком в float32: веса, градиенты, m и v (отдельной мастер-копии нет)"
    ),
    "bf16_mixed_adam": TrainingRecipe(
        2,
        2,
        4,
        4,
        4,
        "смешанная точность: bf16-веса и bf16-градиенты, Adam m и v во float32, "
        "fp32-мастер-копия (те самые «16 байт», ZeRO: 2 + 2 + K, K = 12)",
    ),
    "mixed_fp32_grads": TrainingRecipe(
        2,
        4,
        4,
        4,
        4,
        "bf16/fp16-веса, градиенты во float32, Adam во float32, fp32-мастер-копия "
        "(18 Б: умолчание калькулятора EleutherAI; DeepSpeed в оценке ZeRO-2 добавляет ещё "
        "2 Б fp16-градиентов)",
    ),
    "bf16_pure_adam": TrainingRecipe(
        2, 2, 2, 2, 0, "всё в bfloat16: веса, градиенты, m и v; мастер-копии нет"
    ),
    "adam8bit_mixed": TrainingRecipe(
        2,
        2,
        1,
        1,
        4,
        "bf16-веса и градиенты, 8-битный AdamW bitsandbytes (m и v по 1 Б), fp32-мастер-копия; "
        "масштабы блоков (absmax) и 32-битные состояния тензоров меньше min_8bit_size = 4096 "
        "элементов не учтены",
    ),
    "sgd_fp32": TrainingRecipe(
        4, 4, 0, 0, 0, "SGD без момента во float32: только веса и градиенты"
    ),
    "sgd_momentum_fp32": TrainingRecipe(
        4, 4, 4, 0, 0, "SGD с моментом во float32: веса, градиенты, один буфер момента"
    ),
}


def recipe(name: str) -> TrainingRecipe:
    """Готовый рецепт по имени из ``RECIPES`` (ключи на английском, подпись — ``.label``)."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"неизвестный рецепт {name!r}; допустимые имена: {', '.join(RECIPES)}")
    return RECIPES[name]


def _as_recipe(value: Any, name: str = "recipe") -> TrainingRecipe:
    if isinstance(value, TrainingRecipe):
        return value
    if isinstance(value, str):
        return recipe(value)
    raise ValueError(
        f"{name} должно быть TrainingRecipe или именем из RECIPES ({', '.join(RECIPES)}), "
        f"получено {value!r}"
    )


# ----------------------------------------------------------------------------- состояние


def state_bytes(n_params: int, recipe: TrainingRecipe | str) -> int:
    """Память модельного состояния: B_state = N·(b_param + b_grad + b_m1 + b_m2 + b_master), байт.

    Это нижний слой сметы: без активаций, KV-кэша, буферов коллективных операций и фрагментации.
    Дробные байты на параметр округляются вверх до целого байта. n_params ≥ 1 (7.5e9 — можно).
    """
    n = integer("n_params", n_params, 1)
    r = _as_recipe(recipe)
    return _ceil_bytes(n * _exact(r.total))


def _shard(n: int, world_size: int) -> int:
    return -(-n // world_size)


def per_rank_breakdown(
    n_params: int, recipe: TrainingRecipe | str, world_size: int, zero_stage: int
) -> dict[str, int]:
    """Байты на один ранг по статьям: {"params", "grads", "optimizer", "total"}.

    zero_stage: 0 = DDP (всё реплицировано); 1 = шардируются состояния оптимизатора (m1, m2,
    master); 2 = ещё и градиенты; 3 = ещё и веса (= FSDP full shard). Шардированная статья на
    ранге = ⌈N/D⌉·b: реальные реализации дополняют плоский буфер до кратного D (и выравнивают),
    поэтому берём целое ⌈N/D⌉ элементов; формула статьи ZeRO пишет N/D.
    """
    n = integer("n_params", n_params, 1)
    r = _as_recipe(recipe)
    d = integer("world_size", world_size, 1)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise ValueError(
            f"zero_stage должно быть 0 (DDP), 1, 2 или 3 (ZeRO-3 = FSDP full shard), "
            f"получено {zero_stage!r}"
        )
    shard = _shard(n, d)

    def part(b: numbers.Real, sharded: bool) -> int:
        return _ceil_bytes((shard if sharded else n) * _exact(b))

    out = {
        "params": part(r.param_bytes, zero_stage >= 3),
        "grads": part(r.grad_bytes, zero_stage >= 2),
        "optimizer": part(r.optimizer_bytes, zero_stage >= 1),
    }
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def per_rank_state_bytes(
    n_params: int, recipe: TrainingRecipe | str, world_size: int, zero_stage: int
) -> int:
    """Модельное состояние на ранг, байт: DDP N·Σb; ZeRO-1 N(b_p+b_g) + ⌈N/D⌉·K; ZeRO-2
    N·b_p + ⌈N/D⌉(b_g+K); ZeRO-3 ⌈N/D⌉·Σb. K = b_m1 + b_m2 + b_master, D = world_size.

    Без временной сборки слоёв, коммуникационных буферов и активаций (см. per_rank_breakdown).
    """
    return per_rank_breakdown(n_params, recipe, world_size, zero_stage)["total"]


# ----------------------------------------------------------------------------- KV-кэш


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_tokens: int,
    bytes_per_value: numbers.Real,
) -> int:
    """KV-кэш: B_KV = 2·L·H_kv·d_h·N_tok·b байт (2 — ключи и значения).

    N_tok — все сохранённые токены всех последовательностей; b — байт на число (bf16: 2).
    Пример лекции: L=32, H_kv=8, d_h=128, b=2 → 131072 Б = 128 КиБ на токен.
    """
    layers = integer("num_layers", num_layers, 1)
    heads = integer("num_kv_heads", num_kv_heads, 1)
    dim = integer("head_dim", head_dim, 1)
    tokens = integer("num_tokens", num_tokens, 1)
    b = _check_nonneg("bytes_per_value", bytes_per_value, strict=True)
    return _ceil_bytes(2 * layers * heads * dim * tokens * _exact(b))


def max_concurrent_sequences(
    budget_bytes: numbers.Real,
    weights_bytes: numbers.Real,
    kv_bytes_per_token: numbers.Real,
    tokens_per_sequence: int,
    reserve_fraction: numbers.Real = 0.0,
) -> int:
    """Сколько последовательностей помещается: ⌊(B·(1−r) − W) / (kv_tok·T)⌋, не меньше 0.

    B — бюджет памяти, W — веса (байт), kv_tok — байт KV на токен, T — токенов на
    последовательность (запрос + ответ), r — доля бюджета в резерве (буферы, фрагментация), 0 ≤ r < 1.
    """
    budget = _exact(_check_nonneg("budget_bytes", budget_bytes))
    weights = _exact(_check_nonneg("weights_bytes", weights_bytes))
    per_tok = _exact(_check_nonneg("kv_bytes_per_token", kv_bytes_per_token, strict=True))
    tokens = integer("tokens_per_sequence", tokens_per_sequence, 1)
    real("reserve_fraction", reserve_fraction, 0.0, 1.0, high_open=True)
    free = budget * (1 - _exact(reserve_fraction)) - weights
    if free <= 0:
        return 0
    return int(free // (per_tok * tokens))


# ----------------------------------------------------------------------------- форма модели

_SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral", "qwen3")
_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _config_dict(config: Any) -> dict:
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, str | os.PathLike):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"config: файл {str(path)!r} не найден")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"config: {str(path)!r} — не JSON ({exc})") from exc
    if hasattr(config, "to_dict"):  # transformers.PretrainedConfig
        out = dict(config.to_dict())
        for key in ("model_type", "head_dim", "tie_word_embeddings"):
            if hasattr(config, key):
                out[key] = getattr(config, key)
        return out
    raise ValueError(
        "config должно быть словарём, путём к config.json (или к папке модели) или "
        f"transformers.PretrainedConfig, получено {type(config).__name__}"
    )


@dataclass(frozen=True)
class ModelShape:
    """Форма плотного декодера с RMSNorm и SwiGLU (Qwen2/2.5, Llama, SmolLM2, Mistral, Qwen3).

    Правило смещений (как в классах transformers): у qwen2 есть смещения q/k/v и нет смещения o
    (в конфиге ключа нет — это зашито в Qwen2Attention); у llama и qwen3 ключ attention_bias
    включает смещения сразу у q, k, v и o (по умолчанию false), у llama mlp_bias — у gate/up/down;
    у mistral смещений нет. У qwen3 ещё RMSNorm по head_dim для q и k (q_norm, k_norm).
    head_dim = config.head_dim, если он задан, иначе hidden_size // num_attention_heads.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # смещения q, k, v
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    model_type: str = "llama"
    mlp: str = "swiglu"  # gate_proj, up_proj, down_proj

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
        ):  # frozen: целое 7.0 из JSON сохраняем как int 7
            object.__setattr__(self, name, integer(name, getattr(self, name), 1))
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) должно делиться на "
                f"num_kv_heads ({self.num_kv_heads}) — так устроено GQA"
            )
        if self.mlp != "swiglu":
            raise ValueError(f"mlp: поддерживается только 'swiglu', получено {self.mlp!r}")

    # -- построение

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Форма из config.json: словарь, путь к файлу/папке модели или PretrainedConfig.

        Поддерживаемые model_type: qwen2, llama, mistral, qwen3 (нет model_type — как llama).
        """
        d = _config_dict(config)
        missing = [k for k in _REQUIRED_KEYS if d.get(k) is None]
        if missing:
            raise ValueError(f"config: нет обязательных ключей {missing}")
        model_type = d.get("model_type") or "llama"
        if model_type not in _SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config: model_type {model_type!r} не поддерживается; допустимые: "
                f"{', '.join(_SUPPORTED_MODEL_TYPES)} (плотный декодер с SwiGLU)"
            )
        for k in (*_REQUIRED_KEYS, "num_key_value_heads", "head_dim"):
            if k in _REQUIRED_KEYS or d.get(k) is not None:  # 0 — ошибка, а не «нет ключа»
                d[k] = integer(f"config[{k!r}]", d[k], 1)
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        head_dim = d.get("head_dim") or (d["hidden_size"] // heads)
        attn_bias = bool(d.get("attention_bias", False))
        if model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        elif model_type == "mistral":
            qkv_bias = o_bias = mlp_bias = False
        elif model_type == "qwen3":
            qkv_bias = o_bias = attn_bias
            mlp_bias = False
        else:  # llama
            qkv_bias = o_bias = attn_bias
            mlp_bias = bool(d.get("mlp_bias", False))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=o_bias,
            mlp_bias=mlp_bias,
            qk_norm=model_type == "qwen3",
            model_type=model_type,
        )

    @classmethod
    def from_name(cls, name: str) -> ModelShape:
        """Форма модели из ``data/model_configs/<name>.json`` (см. ``available_model_configs``)."""
        names = available_model_configs()
        if name not in names:
            raise ValueError(f"нет конфигурации {name!r}; доступны: {', '.join(names)}")
        return cls.from_config(MODEL_CONFIGS_DIR / f"{name}.json")

    # -- формы проекций

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) линейных слоёв одного блока: q (h, H·d), k и v (h, H_kv·d), o (H·d, h),
        gate и up (h, I), down (I, h)."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    # -- параметры

    def layer_params(self) -> int:
        """Параметров в одном блоке: проекции (+ смещения) + 2 RMSNorm по h (+ q/k-norm у qwen3)."""
        shapes = self.projection_shapes()
        n = sum(a * b for a, b in shapes.values())
        if self.attention_bias:
            n += shapes["q_proj"][1] + shapes["k_proj"][1] + shapes["v_proj"][1]
        if self.o_proj_bias:
            n += self.hidden_size
        if self.mlp_bias:
            n += 2 * self.intermediate_size + self.hidden_size
        n += 2 * self.hidden_size
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def param_breakdown(self) -> dict[str, int]:
        """Параметры по статьям: embeddings V·h, layers L·(блок), final_norm h, lm_head V·h или 0."""
        emb = self.vocab_size * self.hidden_size
        return {
            "embeddings": emb,
            "layers": self.num_layers * self.layer_params(),
            "final_norm": self.hidden_size,
            "lm_head": 0 if self.tie_word_embeddings else emb,
        }

    @property
    def num_params(self) -> int:
        """Точное число уникальных параметров (связанная голова lm_head считается один раз)."""
        return sum(self.param_breakdown().values())

    @property
    def non_embedding_params(self) -> int:
        """Параметры без матриц эмбеддингов и отдельной головы (как «Non-Embedding» у Qwen)."""
        b = self.param_breakdown()
        return b["layers"] + b["final_norm"]

    def weights_bytes(self, bytes_per_param: numbers.Real) -> int:
        """Байт весов: N·b (bf16: b = 2), с округлением вверх для дробных b."""
        b = _check_nonneg("bytes_per_param", bytes_per_param, strict=True)
        return _ceil_bytes(self.num_params * _exact(b))

    def kv_bytes_per_token(self, bytes_per_value: numbers.Real) -> int:
        """Байт KV-кэша на один токен: 2·L·H_kv·d_h·b (все слои с полным вниманием)."""
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, bytes_per_value)


def available_model_configs() -> list[str]:
    """Имена конфигураций в ``data/model_configs/`` (без .json), по алфавиту."""
    return sorted(p.stem for p in MODEL_CONFIGS_DIR.glob("*.json"))


def _as_shape(value: Any, name: str = "shape_or_config") -> ModelShape:
    if isinstance(value, ModelShape):
        return value
    try:
        return ModelShape.from_config(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from exc


# ----------------------------------------------------------------------------- LoRA


def lora_trainable_params(
    shape_or_config: Any,
    rank: int,
    target_modules: tuple[str, ...] | list[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
) -> int:
    """Обучаемые параметры LoRA: Σ_слоёв Σ_целей r·(d_in + d_out) (матрицы A: r×d_in, B: d_out×r).

    Формы настоящие: у k_proj и v_proj d_out = H_kv·d_h (GQA), у MLP — intermediate_size.
    Смещения адаптеров не обучаются (как bias="none" в peft).
    """
    shape = _as_shape(shape_or_config)
    r = integer("rank", rank, 1)
    if isinstance(target_modules, str) or not isinstance(target_modules, tuple | list):
        raise ValueError(
            f"target_modules должно быть списком имён из {LORA_TARGETS}, получено {target_modules!r}"
        )
    bad = [t for t in target_modules if t not in LORA_TARGETS]
    if bad or not target_modules:
        raise ValueError(
            f"target_modules: допустимы непустые подмножества {LORA_TARGETS}, "
            f"получено {list(target_modules)!r}"
        )
    shapes = shape.projection_shapes()
    per_layer = sum(r * sum(shapes[t]) for t in dict.fromkeys(target_modules))
    return shape.num_layers * per_layer


def lora_state_bytes(
    n_params: int,
    n_trainable: int,
    base_param_bytes: numbers.Real,
    recipe: TrainingRecipe | str,
) -> int:
    """Состояние при LoRA: N_base·b_base + N_lora·Σb(recipe), байт.

    Замороженные базовые веса (n_params штук) хранятся в b_base байт (bf16: 2, 4 бита: 0.5) без
    градиентов и состояний; адаптеры (n_trainable) получают полный рецепт.
    """
    n = integer("n_params", n_params, 1)
    t = integer("n_trainable", n_trainable, 1)
    b = _exact(_check_nonneg("base_param_bytes", base_param_bytes))
    return _ceil_bytes(n * b) + state_bytes(t, recipe)


# ----------------------------------------------------------------------------- совместное размещение


def _check_phases(phases: Any) -> list[tuple[str, dict[str, numbers.Real]]]:
    if isinstance(phases, dict | str) or not isinstance(phases, list | tuple) or not phases:
        raise ValueError(
            "phases должно быть непустым списком пар (имя фазы, {статья: байты}), "
            f"получено {phases!r}"
        )
    out = []
    for i, item in enumerate(phases):
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ValueError(
                f"phases[{i}] должно быть парой (имя, {{статья: байты}}), получено {item!r}"
            )
        name, comps = item
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"phases[{i}]: имя фазы должно быть непустой строкой, получено {name!r}"
            )
        if not isinstance(comps, dict):
            raise ValueError(
                f"phases[{i}] ({name!r}): статьи должны быть словарём, получено {comps!r}"
            )
        for key, value in comps.items():
            if not isinstance(key, str):
                raise ValueError(f"phases[{i}] ({name!r}): имя статьи {key!r} должно быть строкой")
            if not is_real(value) or value < 0:
                raise ValueError(
                    f"phases[{i}] ({name!r}): байты статьи {key!r} должны быть числом ≥ 0, "
                    f"получено {value!r}"
                )
        out.append((name, comps))
    return out


def colocation_peak(phases: list[tuple[str, dict[str, numbers.Real]]]) -> tuple[numbers.Real, str]:
    """Пик совместного размещения: B_peak = max_t Σ_статей B(t) и имя фазы с пиком.

    Единицы — те же, что у статей (обычно байты; можно и ГиБ-числа). Это максимум по фазам суммы статей, а не сумма максимумов статей по всем фазам. При равенстве
    возвращается первая по порядку фаза с максимумом.
    """
    checked = _check_phases(phases)
    best_name, best = checked[0][0], sum(checked[0][1].values())
    for name, comps in checked[1:]:
        total = sum(comps.values())
        if total > best:
            best_name, best = name, total
    return best, best_name


def sum_of_component_maxima(phases: list[tuple[str, dict[str, numbers.Real]]]) -> numbers.Real:
    """Завышенная оценка Σ_статей max_t B_статья(t) (в единицах статей) — ошибка «сложить пики
    ролей»: статьи разных фаз никогда не лежат в памяти одновременно."""
    checked = _check_phases(phases)
    maxima: dict[str, numbers.Real] = {}
    for _, comps in checked:
        for key, value in comps.items():
            maxima[key] = max(maxima.get(key, 0), value)
    return sum(maxima.values())


def plot_memory_timeline(
    phases: list[tuple[str, dict[str, numbers.Real]]],
    ax=None,
    budget_bytes: numbers.Real | None = None,
    unit: str = "GiB",
    title: str | None = None,
):
    """Столбцы с накоплением по фазам (статьи — цвета), пик max_t B(t) отмечен, бюджет — пунктир.

    Ось Y — в выбранной единице (по умолчанию ГиБ = 2³⁰ Б). Возвращает matplotlib Axes.
    """
    checked = _check_phases(phases)
    _check_unit(unit)
    if budget_bytes is not None:
        _check_nonneg("budget_bytes", budget_bytes, strict=True)
    import matplotlib
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 4.2))
    components: list[str] = []
    for _, comps in checked:
        for key, value in comps.items():
            if value > 0 and key not in components:
                components.append(key)
    cmap = matplotlib.colormaps["tab10" if len(components) <= 10 else "tab20"]
    xs = list(range(len(checked)))
    bottoms = [0.0] * len(checked)
    for ci, comp in enumerate(components):
        heights = [to_unit(comps.get(comp, 0), unit) for _, comps in checked]
        ax.bar(
            xs,
            heights,
            bottom=bottoms,
            width=0.62,
            color=cmap(ci % cmap.N),
            edgecolor="white",
            linewidth=0.8,
            label=comp,
        )
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    peak, peak_name = colocation_peak(checked)
    peak_i = [name for name, _ in checked].index(peak_name)
    peak_u = to_unit(peak, unit)
    short = unit_label(unit, explain=False)
    for x, top in zip(xs, bottoms):
        is_peak = x == peak_i
        ax.text(
            x,
            top,
            f"пик: {num(top, 2)}{NBSP}{short}" if is_peak else num(top, 2),
            ha="center",
            va="bottom",
            fontsize=9.5 if is_peak else 8.5,
            fontweight="bold" if is_peak else "normal",
            color="black" if is_peak else "0.3",
        )
    ax.bar([peak_i], [peak_u], width=0.62, fill=False, edgecolor="black", linewidth=2.0, zorder=3)
    ymax = max(bottoms) if bottoms else 0.0
    if budget_bytes is not None:
        budget_u = to_unit(budget_bytes, unit)
        ax.axhline(budget_u, color="crimson", linestyle="--", linewidth=1.4, zorder=4)
        ax.text(
            -0.55,
            budget_u,
            f"бюджет {num(budget_u, 2)}{NBSP}{short}",
            color="crimson",
            ha="left",
            va="bottom",
            fontsize=9,
            zorder=5,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0},
        )
        ymax = max(ymax, budget_u)
    ncol = min(3, len(components)) or 1
    rows = -(-len(components) // ncol)
    # запас сверху под легенду внутри осей: ~0.14 высоты данных на строку легенды
    ax.set_ylim(0, ymax * (1.12 + 0.14 * rows) if ymax > 0 else 1)
    ax.set_xticks(xs)
    # длинные имена фаз переносим только между словами: слово целиком на одной строке
    labels = [textwrap.fill(name, 15, break_long_words=False, break_on_hyphens=False)
              for name, _ in checked]  # fmt: skip
    ax.set_xticklabels(labels, fontsize=9)
    ax.set_xlim(-0.6, len(checked) - 0.4)
    ax.set_ylabel(f"память, {unit_label(unit)}")
    ax.set_xlabel("фаза")
    ax.set_title(title or "Память по фазам: пик = max по времени, а не сумма пиков", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if components:
        ax.legend(loc="upper right", ncol=ncol, fontsize=8.5, framealpha=0.9)
    return ax


# ----------------------------------------------------------------------------- accelerate estimate-memory

ACCELERATE_DTYPES = ("float32", "float16", "int8", "int4")  # выбор --dtypes у CLI (bfloat16 нет)
_ACCELERATE_DIVISOR = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}  # только для этих имён
_ACCELERATE_HEADERS = ("Largest Layer", "Total Size", "Training using Adam")
HUB_REPOS = {
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
    "Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B",
    "Qwen2.5-1.5B": "Qwen/Qwen2.5-1.5B",
    "Qwen2.5-7B": "Qwen/Qwen2.5-7B",
    "SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M",
    "SmolLM2-360M": "HuggingFaceTB/SmolLM2-360M",
}  # репозитории Hugging Face конфигураций data/model_configs (см. README там)


def _accelerate_convert_bytes(size: float) -> str:
    """Как ``accelerate.utils.convert_bytes``: делит на 1024, но подписывает "MB"/"GB"."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def accelerate_rule(n_params_or_shape: Any, dtype: str = "float16") -> dict[str, Any]:
    """Правило ``accelerate estimate-memory`` для одной строки dtype (accelerate 1.15), байт.

    Модель строится на meta как ``AutoModel`` во float32: P_acc = параметры без несвязанной
    lm_head + буферы inv_freq и original_inv_freq (d_h чисел); total = 4·P_acc Б.
    «Total Size» и «Largest Layer» = total/k, k = 1, 2, 4, 8 для float32, float16, int8, int4.
    «Training using Adam» = max статей ``estimate_training_usage(total)`` (не сумма): float32 —
    model 4P, gradients 4P, optimizer 8P, step 16P; float16 — 4P, 6P, 8P, 8P; int8, int4 — N/A.
    bfloat16 CLI не принимает. Для целого числа на входе P_acc = n_params (ни головы, ни буферов).
    """
    dtype = choice("dtype", dtype, ACCELERATE_DTYPES)
    if isinstance(n_params_or_shape, numbers.Real):  # число параметров: 7.5e9 можно, 7.5 нельзя
        counted = integer("n_params_or_shape", n_params_or_shape, 1)
        buffers, largest = 0, None
    else:
        shape = _as_shape(n_params_or_shape, "n_params_or_shape")
        b = shape.param_breakdown()
        counted = b["embeddings"] + b["layers"] + b["final_norm"]  # AutoModel: без lm_head
        buffers = shape.head_dim  # inv_freq + original_inv_freq, по d_h/2 float32
        largest = 4 * max(b["embeddings"], shape.layer_params(), shape.hidden_size, buffers)
    total = 4 * (counted + buffers)
    if dtype == "float32":
        usage = {"model": total, "optimizer": 2 * total, "gradients": total, "step": 4 * total}
    elif dtype == "float16":  # «1.5 from weight gradient + computation (GEMM)»
        usage = {"model": total, "optimizer": 2 * total, "gradients": total + total // 2}
        usage["step"] = usage["optimizer"]
    else:  # для int8 и int4 accelerate обучение не оценивает
        usage = None
    k = _ACCELERATE_DIVISOR[dtype]
    reported = max(usage.values()) if usage else None
    printed = {
        "Largest Layer": "—" if largest is None else _accelerate_convert_bytes(largest / k),
        "Total Size": _accelerate_convert_bytes(total / k),
        "Training using Adam": "N/A" if reported is None else _accelerate_convert_bytes(reported),
    }
    return {"dtype": dtype, "params_counted": counted, "buffer_values": buffers,
            "total_size": total, "largest_layer": largest, "divisor": k, "training": usage,
            "training_reported": reported, "printed": printed}  # fmt: skip


def accelerate_printout(
    config: Any, dtypes: tuple[str, ...] | list[str] = ACCELERATE_DTYPES, model_name: str = ""
) -> str:
    """Таблица, которую печатает настоящий ``accelerate estimate-memory``, — его же кодом, без сети.

    Разбор аргументов CLI, ``gather_data``, ``estimate_training_usage``, ``convert_bytes`` и
    рисование таблицы — из установленного accelerate; подменена одна загрузка с Hub
    (``create_empty_model``): модель строится на meta из config (имя из data/model_configs,
    путь или словарь) как ``AutoModel`` во float32 — так же, как это делает сам accelerate.
    """
    import contextlib
    import io
    from unittest import mock

    known = isinstance(config, str) and config in HUB_REPOS
    d = _config_dict(MODEL_CONFIGS_DIR / f"{config}.json" if known else config)
    dtypes = [choice("dtypes[]", x, ACCELERATE_DTYPES) for x in dtypes] or list(ACCELERATE_DTYPES)
    if not isinstance(model_name, str):
        raise ValueError(f"model_name должно быть строкой, получено {model_name!r}")
    name = model_name or (HUB_REPOS[config] if known else "config.json")
    import accelerate.commands.estimate as est
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel

    def build_on_meta(*_args, **_kwargs):
        with init_empty_weights():
            return AutoModel.from_config(AutoConfig.for_model(**d), dtype=torch.float32)

    args = est.estimate_command_parser().parse_args([name, "--dtypes", *dtypes])
    out = io.StringIO()
    with (
        mock.patch.object(est, "create_empty_model", build_on_meta),
        contextlib.redirect_stdout(out),
    ):
        est.estimate_command(args)
    return out.getvalue().rstrip("\n")


def parse_accelerate_printout(text: str) -> dict[str, dict[str, str]]:
    """Строки таблицы ``accelerate estimate-memory``: {dtype: {"Largest Layer": "1.96 GB", …}}."""
    if not isinstance(text, str) or "Training using Adam" not in text:
        raise ValueError(
            "text должно быть таблицей accelerate estimate-memory (accelerate_printout)"
        )
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")]
        if len(cells) == 4 and cells[0] in ACCELERATE_DTYPES:
            rows[cells[0]] = dict(zip(_ACCELERATE_HEADERS, cells[1:]))
    return rows


def accelerate_estimate(
    n_params_or_shape: Any, dtype: str = "float16", recipe: TrainingRecipe | str | None = None
):
    """Таблица pandas: правило accelerate и калькулятор курса по статьям, с объяснением разниц.

    Столбец «у accelerate» говорит, печатает ли accelerate строку («Total Size», «Training using
    Adam») или это его внутренняя статья ``estimate_training_usage`` (model, gradients,
    optimizer, step), которую он не показывает. dtype — "float32" или "float16" (для int8/int4
    accelerate обучение не оценивает). Рецепт курса по умолчанию: "fp32_adam" для float32,
    "bf16_mixed_adam" для float16 (байты fp16- и bf16-смешанной точности одинаковы).
    Числа байт — строки с разрядами через неразрывный пробел; точные целые — ``accelerate_rule``.
    """
    import pandas as pd

    dtype = choice("dtype", dtype, ("float32", "float16"))
    acc = accelerate_rule(n_params_or_shape, dtype)
    r = _as_recipe(recipe if recipe is not None else _DEFAULT_RECIPE[dtype])
    if isinstance(n_params_or_shape, numbers.Real):
        n, lm_head = acc["params_counted"], 0
    else:
        shape = _as_shape(n_params_or_shape, "n_params_or_shape")
        n, lm_head = shape.num_params, shape.param_breakdown()["lm_head"]
    p_acc = acc["params_counted"] + acc["buffer_values"]
    fp16, usage, pr = dtype == "float16", acc["training"], acc["printed"]

    def ours(b: numbers.Real) -> int:
        return _ceil_bytes(n * _exact(b))

    why_n = [f"нет {count(lm_head, 'параметра', 'параметров', 'параметров')} несвязанной "
             "lm_head (AutoModel без головы)"] if lm_head else []  # fmt: skip
    if acc["buffer_values"]:
        buf = count(acc["buffer_values"], "число", "числа", "чисел")
        why_n.append(f"{buf} буферов inv_freq accelerate считает весами")
    hidden = "не печатает: статья estimate_training_usage"
    per_p = acc["training_reported"] // p_acc  # Б/параметр в «Training using Adam»
    same = " (здесь они совпадают)" if per_p == r.total else ""
    rows = [
        ("параметров, шт.", "не печатает: считает модель на meta", p_acc, "—", n, None,
         "; ".join(why_n) or "число параметров совпадает"),
        ("загрузка весов", "печатает: «Total Size»", acc["total_size"] // acc["divisor"],
         pr["Total Size"], ours(r.param_bytes), ours(r.param_bytes),
         f"обе оценки: {4 // acc['divisor']} Б/параметр (у нас b_param = {r.param_bytes:g}); "
         "разница только в N"),
        ("веса (+ мастер-копия)", f"{hidden} model", usage["model"], "—",
         ours(r.param_bytes + r.master_bytes), ours(r.param_bytes + r.master_bytes),
         ("accelerate: 4 Б/параметр, хотя комментарий в его коде говорит «веса в FP16 и FP32» "
          "(это 2 + 4 = 6)" if fp16 else "accelerate: 4 Б/параметр")
         + f"; у нас b_param + b_master = {r.param_bytes:g} + {r.master_bytes:g}"),
        ("градиенты", f"{hidden} gradients", usage["gradients"], "—", ours(r.grad_bytes),
         ours(r.grad_bytes),
         ("accelerate: 6 Б/параметр (1.5 × fp32: «градиент весов + вычисления GEMM»)" if fp16
          else "accelerate: 4 Б/параметр") + f"; у нас b_grad = {r.grad_bytes:g} — хранимый градиент"),
        ("состояния Adam (m, v)", f"{hidden} optimizer", usage["optimizer"], "—",
         ours(r.m1_bytes + r.m2_bytes), ours(r.m1_bytes + r.m2_bytes),
         f"обе оценки: 8 Б/параметр (у нас b_m1 + b_m2 = {r.m1_bytes:g} + {r.m2_bytes:g})"),
        ("шаг оптимизатора", f"{hidden} step", usage["step"], "—", None, None,
         ("accelerate: step = optimizer = 8 Б/параметр" if fp16
          else "accelerate: step = 4 × fp32 = 16 Б/параметр") + "; у калькулятора такой статьи нет"),
        ("обучение с Adam: итог", "печатает: «Training using Adam»", acc["training_reported"],
         pr["Training using Adam"], state_bytes(n, r), state_bytes(n, r),
         f"accelerate печатает максимум статей ({per_p} Б/параметр), а не сумму; калькулятор "
         f"курса — сумму: {r.total:g} Б/параметр{same}"),
    ]  # fmt: skip
    frame = pd.DataFrame(
        [(a, b, num(c), d, "—" if e is None else num(e), "—" if f is None else fmt_bytes(f, explain=False), g)
         for a, b, c, d, e, f, g in rows],
        columns=["статья", "у accelerate", "accelerate, Б", "accelerate печатает",
                 "калькулятор курса, Б", f"калькулятор курса, {unit_label('GiB')}", "почему различаются"],
    )  # fmt: skip
    frame.attrs["note"] = (
        "accelerate делит на 1024, но подписывает «MB/GB» (на деле МиБ/ГиБ); активации, KV-кэш, "
        "буферы связи и фрагментацию не учитывает ни он, ни наш B_state."
    )
    return frame


_DEFAULT_RECIPE = {"float32": "fp32_adam", "float16": "bf16_mixed_adam"}


# ----------------------------------------------------------------------------- реальные тензоры


def tensor_bytes(tensors) -> int:
    """Σ numel·element_size по тензорам (None пропускаются), байт; один тензор — как [тензор]."""
    import torch

    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if isinstance(tensors, str | bytes | dict) or not hasattr(tensors, "__iter__"):
        raise ValueError(
            "tensors должно быть списком или генератором тензоров torch (для state_dict — "
            f".values()), получено {type(tensors).__name__}"
        )
    total = 0
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"tensors[{i}] должно быть тензором torch или None, получено {t!r}")
        total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer, include_step: bool = False) -> int:
    """Байт в тензорах состояния torch-оптимизатора: Σ по ``optimizer.state[p]`` всех тензоров.

    AdamW в torch хранит на каждый параметр exp_avg и exp_avg_sq (форма и dtype параметра) и
    ``step`` — 0-мерный float32-тензор (4 Б на тензор параметра, не на элемент). Рецепт считает
    байты на элемент, поэтому ``step`` по умолчанию исключаем (include_step=False).
    """
    import torch

    if not isinstance(getattr(optimizer, "state", None), dict):
        raise ValueError(
            "optimizer должно быть оптимизатором torch (torch.optim.Optimizer со словарём state), "
            f"получено {optimizer!r}"
        )
    include_step = flag("include_step", include_step)
    total = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key == "step" and not include_step:
                continue
            total += value.numel() * value.element_size()
    return total


def build_probe_model(hidden: int = 256, layers: int = 4, seed: int = 0):
    """Детерминированная MLP-сеть «как трансформер»: layers блоков LayerNorm → Linear(h, 4h) →
    GELU → Linear(4h, h) и выходной Linear(h, h). Параметров: L·(8h² + 7h) + h² + h."""
    h = integer("hidden", hidden, 1)
    n_layers = integer("layers", layers, 1)
    s = integer("seed", seed, 0)
    import torch
    from torch import nn

    gen_state = torch.random.get_rng_state()
    torch.manual_seed(s)
    try:
        blocks: list[nn.Module] = []
        for _ in range(n_layers):
            blocks += [nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h)]
        model = nn.Sequential(*blocks, nn.Linear(h, h))
    finally:
        torch.random.set_rng_state(gen_state)
    return model


def measure_zero_state(
    rank: int,
    world_size: int,
    backend: str,
    hidden: int = 256,
    layers: int = 4,
    seed: int = 0,
    batch: int = 8,
    lr: float = 1e-3,
) -> dict:
    """Уровень C: ZeRO-1 на деле. ``ZeroRedundancyOptimizer(AdamW)`` + DDP, один шаг; на ранге
    меряются байты параметров, градиентов и состояний AdamW, которые он действительно хранит.

    Прогноз калькулятора: рецепт "fp32_adam", ZeRO-1 — на ранге ⌈N/D⌉·(b_m1 + b_m2 + b_master)
    = ⌈N/D⌉·8 Б. ZeroRedundancyOptimizer делит целые тензоры параметров (жадно, от больших к
    малым, на наименее загруженный ранг), а не точные срезы 1/D, поэтому байты по рангам неравны;
    сумма по рангам равна полному состоянию 8·N Б точно. ``step`` (0-мерный) не считается.
    """
    rank = integer("rank", rank, 0)
    world_size = integer("world_size", world_size, 1)
    h = integer("hidden", hidden, 1)
    n_layers = integer("layers", layers, 1)
    b = integer("batch", batch, 1)
    lr = positive("lr", lr)
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from course_utils.multiproc import local_device

    device = local_device(backend)
    model = build_probe_model(h, n_layers, seed).to(device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr
    )
    gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
    x = torch.randn(b, h, generator=gen).to(device)
    target = torch.randn(b, h, generator=gen).to(device)
    loss = torch.nn.functional.mse_loss(ddp(x), target)
    loss.backward()
    optimizer.step()

    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    param_bytes = tensor_bytes(params)
    grad_bytes = tensor_bytes(p.grad for p in params)
    opt_bytes = optimizer_state_bytes(optimizer.optim)
    step_bytes = optimizer_state_bytes(optimizer.optim, include_step=True) - opt_bytes
    assigned = [p for group in optimizer.optim.param_groups for p in group["params"]]
    assigned_numel = sum(p.numel() for p in assigned)

    counts = torch.tensor([opt_bytes, assigned_numel], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(counts) for _ in range(world_size)]
    dist.all_gather(gathered, counts)
    by_rank = [int(t[0].item()) for t in gathered]
    numel_by_rank = [int(t[1].item()) for t in gathered]
    with torch.no_grad():
        checksum = torch.stack([p.double().sum() for p in params]).sum().reshape(1)
    sums = [torch.zeros_like(checksum) for _ in range(world_size)]
    dist.all_gather(sums, checksum)

    rec = RECIPES["fp32_adam"]
    zero1 = per_rank_breakdown(n_params, rec, world_size, zero_stage=1)
    full_optimizer = _ceil_bytes(n_params * _exact(rec.m1_bytes + rec.m2_bytes))
    return {
        "rank": rank,
        "pid": os.getpid(),
        "world_size": world_size,
        "backend": backend,
        "device": str(device),
        "recipe": "fp32_adam",
        "n_params": n_params,
        "loss": float(loss.item()),
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_state_bytes": opt_bytes,
        "step_tensor_bytes": step_bytes,
        "assigned_tensors": len(assigned),
        "assigned_numel": assigned_numel,
        "predicted_assigned_state_bytes": _ceil_bytes(
            assigned_numel * _exact(rec.m1_bytes + rec.m2_bytes)
        ),
        "optimizer_state_bytes_by_rank": by_rank,
        "assigned_numel_by_rank": numel_by_rank,
        "optimizer_state_bytes_sum": sum(by_rank),
        "full_optimizer_state_bytes_predicted": full_optimizer,
        "predicted_zero1_optimizer_bytes_per_rank": zero1["optimizer"],
        "predicted_zero1_total_bytes_per_rank": zero1["total"],
        "predicted_ddp_total_bytes_per_rank": state_bytes(n_params, rec),
        "params_in_sync": all(bool(torch.equal(s, sums[0])) for s in sums),
    }
