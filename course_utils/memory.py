"""Урок 12.2: смета памяти — байты на параметр, DDP и ZeRO/FSDP по рангам, KV-кэш, пик по фазам.

Всё в целых байтах (дробные байты на параметр — точно, через Fraction); 1 ГиБ = 2³⁰ Б, 1 ГБ =
10⁹ Б. ``ModelShape`` — число параметров по config.json; ``accelerate_*`` — сверка с
``accelerate estimate-memory``. torch, transformers и matplotlib загружаются лениво.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from dataclasses import astuple, dataclass, field, fields
from fractions import Fraction
from numbers import Rational, Real
from pathlib import Path
from typing import Any

from course_utils.args import choice, integer, nonnegative, positive, real, text
from course_utils.csv_tables import DATA_DIR, read_exact_csv
from course_utils.fmt import NBSP, count, num
from course_utils.plots import get_axes

MODEL_CONFIGS_DIR = DATA_DIR / "model_configs"

KIB = 2**10
MIB = 2**20
GIB = 2**30
GB = 10**9

# unit → (делитель, короткое русское имя, пояснение степени)
_UNITS: dict[str, tuple[int, str, str]] = {
    "B": (1, "Б", ""),
    "KiB": (KIB, "КиБ", "2¹⁰ Б"),
    "MiB": (MIB, "МиБ", "2²⁰ Б"),
    "GiB": (GIB, "ГиБ", "2³⁰ Б"),
    "GB": (GB, "ГБ", "10⁹ Б"),
}


def _exact(x: Real) -> Fraction:
    """Число как точная дробь в десятичном смысле: 0.5 → 1/2, 0.1 → 1/10 (не 0.1000…0555)."""
    return Fraction(x) if isinstance(x, Rational) else Fraction(repr(float(x)))


def _bytes(n: Real, b: Real = 1) -> int:
    """Целые байты ⌈n·b⌉: n элементов по b байт (b дробное — 0.5 Б у 4-битных весов)."""
    return math.ceil(_exact(n) * _exact(b))


def to_unit(n_bytes: Real, unit: str = "GiB") -> float:
    """Байты в выбранной единице: n / 2³⁰ для "GiB", n / 10⁹ для "GB" и т. п. (float)."""
    nonnegative("n_bytes", n_bytes)
    return float(n_bytes) / _UNITS[choice("unit", unit, _UNITS)][0]


def unit_label(unit: str = "GiB", explain: bool = True) -> str:
    """Подпись единицы по-русски: "ГиБ (2³⁰ Б)" для "GiB", "ГБ (10⁹ Б)" для "GB"."""
    _, short, power = _UNITS[choice("unit", unit, _UNITS)]
    return f"{short} ({power})" if explain and power else short


def fmt_bytes(n_bytes: Real, unit: str = "GiB", digits: int = 2, explain: bool = True) -> str:
    """Байты строкой: 1.5·2³⁰ → "1.50 ГиБ (2³⁰ Б)" (digits знаков; explain=False — без скобок),
    unit="B" → "1 234 567 Б"; пробелы — неразрывные."""
    nonnegative("n_bytes", n_bytes)
    if choice("unit", unit, _UNITS) == "B":
        return f"{num(_bytes(n_bytes))}{NBSP}Б"
    return f"{num(to_unit(n_bytes, unit), digits)}{NBSP}{unit_label(unit, explain)}"


# ---------------------------------------------------------------- рецепты, состояние, KV-кэш
@dataclass(frozen=True)
class TrainingRecipe:
    """Байты на параметр (≥ 0, дробные допустимы): веса, градиенты, Adam m1 и m2, fp32-мастер."""

    param_bytes: Real
    grad_bytes: Real
    m1_bytes: Real
    m2_bytes: Real
    master_bytes: Real
    label: str = field(default="", compare=False)

    def __post_init__(self):
        for f in fields(self)[:5]:
            nonnegative(f.name, getattr(self, f.name))

    @property
    def total(self) -> Real:
        """Σ байт на параметр: b_param + b_grad + b_m1 + b_m2 + b_master."""
        return sum(astuple(self)[:5])  # b_param + b_grad + b_m1 + b_m2 + b_master

    @property
    def optimizer_bytes(self) -> Real:
        """Байт на параметр в состояниях оптимизатора (ZeRO: K) = b_m1 + b_m2 + b_master."""
        return self.m1_bytes + self.m2_bytes + self.master_bytes

    def describe(self) -> str:
        """Одна строка по-русски: "2 + 2 + 4 + 4 + 4 = 16 Б/параметр — <подпись>"."""
        line = " + ".join(f"{p:g}" for p in astuple(self)[:5]) + f" = {self.total:g} Б/параметр"
        return f"{line} — {self.label}" if self.label else line


def _read_recipes() -> dict[str, TrainingRecipe]:
    """Рецепты из data/training_recipes.csv: имя, b_param, b_grad, b_m1, b_m2, b_master, подпись."""
    columns = ("name", *(f.name for f in fields(TrainingRecipe)))  # как в заголовке файла
    rows = read_exact_csv(DATA_DIR / "training_recipes.csv", columns, "рецепты обучения")
    return {
        r["name"]: TrainingRecipe(*(int(r[c]) for c in columns[1:-1]), r["label"]) for _, r in rows
    }


RECIPES = _read_recipes()


def recipe(name: str) -> TrainingRecipe:
    """Готовый рецепт по имени из ``RECIPES`` (ключи на английском, подпись — ``.label``)."""
    return RECIPES[choice("recipe", name, RECIPES)]


def _as_recipe(value: Any) -> TrainingRecipe:
    return value if isinstance(value, TrainingRecipe) else recipe(value)


def state_bytes(n_params: int, recipe: TrainingRecipe | str) -> int:
    """Модельное состояние B_state = N·(b_param + b_grad + b_m1 + b_m2 + b_master), байт, вверх
    до целого (без активаций, KV-кэша и буферов)."""
    n = integer("n_params", n_params, 1)
    return _bytes(n, _as_recipe(recipe).total)  # N·Σb


def per_rank_breakdown(
    n_params: int, recipe: TrainingRecipe | str, world_size: int, zero_stage: int
) -> dict[str, int]:
    """Байты на ранг {"params", "grads", "optimizer", "total"}: stage 0 = DDP, с 1 шардируется
    оптимизатор (K = b_m1 + b_m2 + b_master), с 2 — градиенты, с 3 — веса; шард = ⌈N/D⌉·b Б."""
    n = integer("n_params", n_params, 1)
    r = _as_recipe(recipe)
    d = integer("world_size", world_size, 1)
    stage = choice("zero_stage", zero_stage, (0, 1, 2, 3))
    shard = -(-n // d)  # ⌈N/D⌉ элементов
    out = {
        "params": _bytes(shard if stage >= 3 else n, r.param_bytes),
        "grads": _bytes(shard if stage >= 2 else n, r.grad_bytes),
        "optimizer": _bytes(shard if stage >= 1 else n, r.optimizer_bytes),
    }
    return out | {"total": sum(out.values())}


def per_rank_state_bytes(
    n_params: int, recipe: TrainingRecipe | str, world_size: int, zero_stage: int
) -> int:
    """Модельное состояние на ранг, байт: DDP N·Σb; ZeRO-1 N(b_p+b_g) + ⌈N/D⌉·K; ZeRO-2
    N·b_p + ⌈N/D⌉(b_g+K); ZeRO-3 ⌈N/D⌉·Σb. K = b_m1 + b_m2 + b_master, D = world_size."""
    return per_rank_breakdown(n_params, recipe, world_size, zero_stage)["total"]


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, bytes_per_value: Real
) -> int:
    """KV-кэш B_KV = 2·L·H_kv·d_h·N_tok·b байт (ключи и значения; N_tok — токены всех
    последовательностей; b — байт на число, bf16: 2)."""
    layers = integer("num_layers", num_layers, 1)
    heads = integer("num_kv_heads", num_kv_heads, 1)
    dim = integer("head_dim", head_dim, 1)
    tokens = integer("num_tokens", num_tokens, 1)
    positive("bytes_per_value", bytes_per_value)
    return _bytes(2 * layers * heads * dim * tokens, bytes_per_value)  # 2·L·H_kv·d_h·N_tok·b


def max_concurrent_sequences(
    budget_bytes: Real,
    weights_bytes: Real,
    kv_bytes_per_token: Real,
    tokens_per_sequence: int,
    reserve_fraction: Real = 0.0,
) -> int:
    """Последовательностей в бюджете: ⌊(B·(1−r) − W) / (kv_tok·T)⌋ ≥ 0; B, W, kv_tok — байт
    (бюджет, веса, KV на токен), T — токенов на последовательность, r ∈ [0, 1) — резерв."""
    nonnegative("budget_bytes", budget_bytes)
    nonnegative("weights_bytes", weights_bytes)
    positive("kv_bytes_per_token", kv_bytes_per_token)
    tokens = integer("tokens_per_sequence", tokens_per_sequence, 1)
    real("reserve_fraction", reserve_fraction, 0.0, 1.0, high_open=True)
    free = _exact(budget_bytes) * (1 - _exact(reserve_fraction)) - _exact(weights_bytes)
    return max(0, math.floor(free / (_exact(kv_bytes_per_token) * tokens)))  # ⌊free/(kv_tok·T)⌋


# ---------------------------------------------------------------- форма модели и LoRA
_CONFIG_FIELDS = {  # обязательные ключи config.json → поля ModelShape
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_attention_heads",
}
# линейные слои блока — они же допустимые цели LoRA
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _config_dict(config: Any) -> dict:
    """Словарь config.json из словаря, пути к файлу или папке модели, PretrainedConfig."""
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, str | os.PathLike):
        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
        if not path.is_file():
            raise ValueError(f"config: файл {str(path)!r} не найден")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"config: {str(path)!r} — не JSON ({exc})") from exc
    if hasattr(config, "to_dict"):  # transformers.PretrainedConfig
        keys = ("model_type", "head_dim", "tie_word_embeddings")
        return config.to_dict() | {k: getattr(config, k) for k in keys if hasattr(config, k)}
    raise ValueError(
        "config должно быть словарём, путём к config.json (или к папке модели) или "
        f"transformers.PretrainedConfig, получено {type(config).__name__}"
    )


@dataclass(frozen=True)
class ModelShape:
    """Форма плотного декодера с RMSNorm и SwiGLU (правила смещений — в ``from_config``)."""

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

    def __post_init__(self):
        for f in fields(self)[:7]:  # размеры — целые ≥ 1; frozen: 7.0 из JSON храним как int 7
            object.__setattr__(self, f.name, integer(f.name, getattr(self, f.name), 1))
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) должно делиться на "
                f"num_kv_heads ({self.num_kv_heads}) — так устроено GQA"
            )

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Форма из config.json (словарь, путь, PretrainedConfig) qwen2, llama, mistral, qwen3;
        смещения и q/k-norm — по правилам семейства, head_dim по умолчанию hidden_size // heads."""
        d = _config_dict(config)
        if missing := [k for k in _CONFIG_FIELDS if d.get(k) is None]:
            raise ValueError(f"config: нет обязательных ключей {missing}")
        model_type = d.get("model_type") or "llama"
        attn_bias = bool(d.get("attention_bias", False))
        biases = {  # (q/k/v, o, MLP)
            "qwen2": (True, False, False),
            "llama": (attn_bias, attn_bias, bool(d.get("mlp_bias", False))),
            "mistral": (False, False, False),
            "qwen3": (attn_bias, attn_bias, False),
        }
        choice("config['model_type']", model_type, biases)
        for k in (*_CONFIG_FIELDS, "num_key_value_heads", "head_dim"):
            if k in _CONFIG_FIELDS or d.get(k) is not None:  # 0 — ошибка, а не «нет ключа»
                d[k] = integer(f"config[{k!r}]", d[k], 1)
        heads = d["num_attention_heads"]
        qkv_bias, o_bias, mlp_bias = biases[model_type]
        return cls(
            **{name: d[k] for k, name in _CONFIG_FIELDS.items()},
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or (d["hidden_size"] // heads),
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
        choice("name (конфигурация data/model_configs)", name, available_model_configs())
        return cls.from_config(MODEL_CONFIGS_DIR / f"{name}.json")

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) слоёв блока: q (h, H·d), k, v (h, H_kv·d), o (H·d, h), gate, up (h, I), down (I, h)."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return dict(zip(LORA_TARGETS, [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]))

    def layer_params(self) -> int:
        """Параметров в блоке: Σ d_in·d_out + Σ d_out смещений + 2h RMSNorm (+ 2d_h q/k-norm)."""
        shapes = self.projection_shapes().values()
        weights = sum(d_in * d_out for d_in, d_out in shapes)
        # смещения есть у q, k, v (attention_bias), o (o_proj_bias), gate, up, down (mlp_bias)
        on = (self.attention_bias,) * 3 + (self.o_proj_bias,) + (self.mlp_bias,) * 3
        biases = sum(d_out for (_, d_out), has_bias in zip(shapes, on) if has_bias)
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return weights + biases + norms

    def param_breakdown(self) -> dict[str, int]:
        """Параметры по статьям: embeddings V·h, layers L·блок, final_norm h, lm_head V·h или 0."""
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

    def weights_bytes(self, bytes_per_param: Real) -> int:
        """Байт весов: N·b (bf16: b = 2), с округлением вверх для дробных b."""
        positive("bytes_per_param", bytes_per_param)
        return _bytes(self.num_params, bytes_per_param)

    def kv_bytes_per_token(self, bytes_per_value: Real) -> int:
        """Байт KV-кэша на один токен: 2·L·H_kv·d_h·b (все слои с полным вниманием)."""
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, bytes_per_value)


def available_model_configs() -> list[str]:
    """Имена конфигураций в ``data/model_configs/`` (без .json), по алфавиту."""
    return sorted(p.stem for p in MODEL_CONFIGS_DIR.glob("*.json"))


def lora_trainable_params(
    shape: ModelShape, rank: int, target_modules: tuple[str, ...] | list[str] = LORA_TARGETS[:4]
) -> int:
    """Обучаемые параметры LoRA: L·Σ_целей r·(d_in + d_out) по настоящим формам (по умолчанию
    цели q, k, v, o; bias="none")."""
    r = integer("rank", rank, 1)
    targets = set(target_modules)  # строка "q_proj" даст буквы и не пройдёт проверку
    if not targets or not targets <= set(LORA_TARGETS):
        raise ValueError(
            f"target_modules: допустимы непустые подмножества {LORA_TARGETS}, "
            f"получено {target_modules!r}"
        )
    shapes = shape.projection_shapes()
    return shape.num_layers * sum(r * sum(shapes[t]) for t in targets)  # L·Σ r(i+o)


# ---------------------------------------------------------------- совместное размещение
_Phases = list[tuple[str, dict[str, Real]]]  # [(имя фазы, {статья: байты}), …]


def _check_phases(phases: Any) -> _Phases:
    """Непустой список пар (имя фазы, {статья: байты ≥ 0})."""
    items = phases if isinstance(phases, list | tuple) else []
    pairs = [isinstance(p, tuple | list) and len(p) == 2 and isinstance(p[1], dict) for p in items]
    if not items or not all(pairs):
        raise ValueError(
            f"phases должно быть непустым списком пар (имя, {{статья: байты}}): {phases!r}"
        )
    for i, (name, comps) in enumerate(phases):
        text(f"phases[{i}]: имя фазы", name)
        for key, value in comps.items():
            nonnegative(f"phases[{i}] ({name!r})[{key!r}]", value)
    return [(name, comps) for name, comps in phases]


def colocation_peak(phases: _Phases) -> tuple[Real, str]:
    """Пик совместного размещения B_peak = max_t Σ_статей B(t) (в единицах статей) и имя первой
    фазы с пиком."""
    totals = [(sum(comps.values()), name) for name, comps in _check_phases(phases)]
    return max(totals, key=lambda t: t[0])  # max отдаёт первый из равных


def sum_of_component_maxima(phases: _Phases) -> Real:
    """Завышенная оценка Σ_статей max_t B_статья(t) (в единицах статей) — «сумма пиков ролей»."""
    checked = _check_phases(phases)
    keys = dict.fromkeys(k for _, comps in checked for k in comps)  # в порядке появления
    return sum(max(comps.get(k, 0) for _, comps in checked) for k in keys)


def plot_memory_timeline(
    phases: _Phases,
    ax=None,
    budget_bytes: Real | None = None,
    unit: str = "GiB",
    title: str | None = None,
):
    """Столбцы по фазам (статьи — цвета), пик max_t Σ B(t) в рамке, бюджет — пунктир; ось Y — в
    unit (ГиБ = 2³⁰ Б). Возвращает Axes."""
    checked = _check_phases(phases)
    choice("unit", unit, _UNITS)
    if budget_bytes is not None:
        positive("budget_bytes", budget_bytes)
    import matplotlib.pyplot as plt

    ax = get_axes(ax, (8.5, 4.2))
    # ненулевые статьи в порядке первого появления
    components = list(dict.fromkeys(k for _, c in checked for k, v in c.items() if v > 0))
    cmap = plt.colormaps["tab10" if len(components) <= 10 else "tab20"]
    xs = list(range(len(checked)))
    bottoms = [0.0] * len(checked)
    bar = {"width": 0.62, "edgecolor": "white", "linewidth": 0.8}
    for ci, comp in enumerate(components):
        heights = [to_unit(comps.get(comp, 0), unit) for _, comps in checked]
        ax.bar(xs, heights, bottom=bottoms, color=cmap(ci % cmap.N), label=comp, **bar)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    peak, peak_name = colocation_peak(checked)
    peak_i = [name for name, _ in checked].index(peak_name)
    short = unit_label(unit, explain=False)
    peak_style = {"fontsize": 9.5, "fontweight": "bold", "color": "black"}
    plain_style = {"fontsize": 8.5, "fontweight": "normal", "color": "0.3"}
    for x, top in zip(xs, bottoms):
        label = f"пик: {num(top, 2)}{NBSP}{short}" if x == peak_i else num(top, 2)
        style = peak_style if x == peak_i else plain_style
        ax.text(x, top, label, ha="center", va="bottom", **style)
    frame = {"fill": False, "edgecolor": "black", "linewidth": 2.0, "zorder": 3}
    ax.bar([peak_i], [to_unit(peak, unit)], width=0.62, **frame)
    ymax = max(bottoms)
    if budget_bytes is not None:
        budget = to_unit(budget_bytes, unit)
        ax.axhline(budget, color="crimson", linestyle="--", linewidth=1.4, zorder=4)
        box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0}
        label = f"бюджет {num(budget, 2)}{NBSP}{short}"
        ax.text(-0.55, budget, label, color="crimson", va="bottom", fontsize=9, zorder=5, bbox=box)
        ymax = max(ymax, budget)
    ncol = min(3, len(components)) or 1
    legend_rows = -(-len(components) // ncol)
    # запас сверху под легенду внутри осей: ~0.14 высоты данных на строку легенды
    ax.set_ylim(0, ymax * (1.12 + 0.14 * legend_rows) if ymax > 0 else 1)
    # длинные имена фаз переносим только между словами: слово целиком на одной строке
    wrap = textwrap.TextWrapper(15, break_long_words=False, break_on_hyphens=False)
    ax.set_xticks(xs, [wrap.fill(name) for name, _ in checked], fontsize=9)
    ax.set(xlim=(-0.6, len(checked) - 0.4), xlabel="фаза", ylabel=f"память, {unit_label(unit)}")
    ax.set_title(title or "Память по фазам: пик = max по времени, а не сумма пиков", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if components:
        ax.legend(loc="upper right", ncol=ncol, fontsize=8.5, framealpha=0.9)
    return ax


# ---------------------------------------------------------------- accelerate estimate-memory
ACCELERATE_DTYPES = ("float32", "float16", "int8", "int4")  # выбор --dtypes у CLI (bfloat16 нет)
_ACCELERATE_DIVISOR = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}
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
    """Правило ``accelerate estimate-memory`` (1.15), байт: P_acc = параметры ``AutoModel`` (без
    несвязанной lm_head) + d_h чисел inv_freq (число на входе — само P_acc); total = 4·P_acc;
    «Total Size» = total/k, k = 1, 2, 4, 8 для float32 … int4; «Training using Adam» = max (не
    сумма) статей model, gradients, optimizer, step: float32 — 4P, 4P, 8P, 16P; float16 — 4P,
    6P, 8P, 8P; int8, int4 — N/A."""
    dtype = choice("dtype", dtype, ACCELERATE_DTYPES)
    if isinstance(n_params_or_shape, ModelShape):
        shape = n_params_or_shape
        b = shape.param_breakdown()
        counted = b["embeddings"] + b["layers"] + b["final_norm"]  # AutoModel: без lm_head
        lm_head = b["lm_head"]  # 0, если голова связана с эмбеддингами
        buffers = shape.head_dim  # inv_freq + original_inv_freq, по d_h/2 float32
        largest = 4 * max(b["embeddings"], shape.layer_params(), shape.hidden_size, buffers)
    else:  # число параметров: 7.5e9 можно, 7.5 нельзя
        counted = integer("n_params_or_shape", n_params_or_shape, 1)
        buffers, largest, lm_head = 0, None, 0
    total = 4 * (counted + buffers)  # 4·P_acc байт
    usage = None  # статьи estimate_training_usage(total); для int8 и int4 их нет
    if dtype == "float32":
        usage = {"model": total, "optimizer": 2 * total, "gradients": total, "step": 4 * total}
    elif dtype == "float16":  # «1.5 from weight gradient + computation (GEMM)»
        usage = {"model": total, "optimizer": 2 * total, "gradients": total + total // 2}
        usage["step"] = usage["optimizer"]
    k = _ACCELERATE_DIVISOR[dtype]
    reported = max(usage.values()) if usage else None
    printed = {
        "Largest Layer": "—" if largest is None else _accelerate_convert_bytes(largest / k),
        "Total Size": _accelerate_convert_bytes(total / k),
        "Training using Adam": "N/A" if reported is None else _accelerate_convert_bytes(reported),
    }
    return {
        "params_counted": counted,
        "lm_head_params": lm_head,
        "buffer_values": buffers,
        "total_size": total,
        "largest_layer": largest,
        "divisor": k,
        "training": usage,
        "training_reported": reported,
        "printed": printed,
    }


def accelerate_printout(name: str) -> str:
    """Таблица настоящего ``accelerate estimate-memory`` его же кодом, без сети: модель на meta
    по конфигурации name из data/model_configs (ключ ``HUB_REPOS``), все типы ACCELERATE_DTYPES."""
    d = _config_dict(MODEL_CONFIGS_DIR / f"{choice('name', name, HUB_REPOS)}.json")
    import contextlib
    import io
    from unittest import mock

    import accelerate.commands.estimate as est
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel

    def on_meta(*_args, **_kwargs):  # вместо create_empty_model: без скачивания с Hub
        with init_empty_weights():
            return AutoModel.from_config(AutoConfig.for_model(**d), dtype=torch.float32)

    args = est.estimate_command_parser().parse_args(
        [HUB_REPOS[name], "--dtypes", *ACCELERATE_DTYPES]
    )
    out = io.StringIO()
    with mock.patch.object(est, "create_empty_model", on_meta), contextlib.redirect_stdout(out):
        est.estimate_command(args)
    return out.getvalue().rstrip("\n")


def parse_accelerate_printout(text: str) -> dict[str, dict[str, str]]:
    """Строки таблицы ``accelerate estimate-memory``: {dtype: {"Largest Layer": "1.96 GB", …}}."""
    if not isinstance(text, str) or "Training using Adam" not in text:
        raise ValueError(
            "text должно быть таблицей accelerate estimate-memory (accelerate_printout)"
        )
    rows = ([c.strip() for c in line.strip("│").split("│")] for line in text.splitlines())
    table = [cells for cells in rows if len(cells) == 4 and cells[0] in ACCELERATE_DTYPES]
    return {cells[0]: dict(zip(_ACCELERATE_HEADERS, cells[1:])) for cells in table}


_HIDDEN = "не печатает: статья estimate_training_usage"
_ESTIMATE_ROWS = (  # (статья, что о ней у accelerate)
    ("параметров, шт.", "не печатает: считает модель на meta"),
    ("загрузка весов", "печатает: «Total Size»"),
    ("веса (+ мастер-копия)", f"{_HIDDEN} model"),
    ("градиенты", f"{_HIDDEN} gradients"),
    ("состояния Adam (m, v)", f"{_HIDDEN} optimizer"),
    ("шаг оптимизатора", f"{_HIDDEN} step"),
    ("обучение с Adam: итог", "печатает: «Training using Adam»"),
)


def accelerate_estimate(n_params_or_shape: Any, dtype: str = "float16"):
    """Таблица pandas: правило accelerate и калькулятор курса (fp32_adam или bf16_mixed_adam) по
    статьям, с объяснением разниц."""
    import pandas as pd

    dtype = choice("dtype", dtype, ("float32", "float16"))
    acc = accelerate_rule(n_params_or_shape, dtype)
    r = RECIPES["fp32_adam" if dtype == "float32" else "bf16_mixed_adam"]
    lm_head = acc["lm_head_params"]
    n = acc["params_counted"] + lm_head  # N модели: AutoModel + голова
    p_acc = acc["params_counted"] + acc["buffer_values"]
    fp16, usage, pr = dtype == "float16", acc["training"], acc["printed"]
    why_n = []
    if lm_head:
        head = count(lm_head, "параметра", "параметров", "параметров")
        why_n.append(f"нет {head} несвязанной lm_head (AutoModel без головы)")
    if acc["buffer_values"]:
        buf = count(acc["buffer_values"], "число", "числа", "чисел")
        why_n.append(f"{buf} буферов inv_freq accelerate считает весами")
    per_p = acc["training_reported"] // p_acc  # Б/параметр в «Training using Adam»
    same = " (здесь они совпадают)" if per_p == r.total else ""
    fp16_weights = ", хотя комментарий в его коде говорит «веса в FP16 и FP32» (это 2 + 4 = 6)"
    fp16_grads = "6 Б/параметр (1.5 × fp32: «градиент весов + вычисления GEMM»)"
    why = [
        "; ".join(why_n) or "число параметров совпадает",
        f"обе оценки: {4 // acc['divisor']} Б/параметр (у нас b_param = {r.param_bytes:g}); "
        "разница только в N",
        f"accelerate: 4 Б/параметр{fp16_weights if fp16 else ''}; у нас b_param + b_master = "
        f"{r.param_bytes:g} + {r.master_bytes:g}",
        f"accelerate: {fp16_grads if fp16 else '4 Б/параметр'}; у нас b_grad = {r.grad_bytes:g} "
        "— хранимый градиент",
        f"обе оценки: 8 Б/параметр (у нас b_m1 + b_m2 = {r.m1_bytes:g} + {r.m2_bytes:g})",
        f"accelerate: step = {'optimizer = 8' if fp16 else '4 × fp32 = 16'} Б/параметр; "
        "у калькулятора такой статьи нет",
        f"accelerate печатает максимум статей ({per_p} Б/параметр), а не сумму; калькулятор "
        f"курса — сумму: {r.total:g} Б/параметр{same}",
    ]
    stages = ("model", "gradients", "optimizer", "step")
    acc_bytes = [p_acc, acc["total_size"] // acc["divisor"], *(usage[s] for s in stages)]
    b_ours = (r.param_bytes, r.param_bytes + r.master_bytes, r.grad_bytes, r.m1_bytes + r.m2_bytes)
    ours = [*(_bytes(n, b) for b in b_ours), None, state_bytes(n, r)]  # N·b по статьям
    gib = ["—" if b is None else fmt_bytes(b, explain=False) for b in ours]
    frame = pd.DataFrame(
        {
            "статья": [row[0] for row in _ESTIMATE_ROWS],
            "у accelerate": [row[1] for row in _ESTIMATE_ROWS],
            "accelerate, Б": [num(b) for b in (*acc_bytes, acc["training_reported"])],
            "accelerate печатает": ["—", pr["Total Size"], *["—"] * 4, pr["Training using Adam"]],
            "калькулятор курса, Б": [num(n), *("—" if b is None else num(b) for b in ours)],
            f"калькулятор курса, {unit_label('GiB')}": ["—", *gib],
            "почему различаются": why,
        }
    )
    frame.attrs["note"] = (
        "accelerate делит на 1024, но подписывает «MB/GB» (на деле МиБ/ГиБ); активации, KV-кэш, "
        "буферы связи и фрагментацию не учитывает ни он, ни наш B_state."
    )
    return frame


# ---------------------------------------------------------------- реальные тензоры
def tensor_bytes(tensors) -> int:
    """Σ numel·element_size по тензорам (None пропускаются), байт; один тензор — как [тензор]."""
    import torch

    tensors = [tensors] if isinstance(tensors, torch.Tensor) else tensors
    if isinstance(tensors, str | bytes | dict) or not hasattr(tensors, "__iter__"):
        raise ValueError(
            "tensors должно быть списком или генератором тензоров torch (для state_dict — "
            f".values()), получено {type(tensors).__name__}"
        )
    total = 0
    for i, t in enumerate(tensors):
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"tensors[{i}] должно быть тензором torch или None, получено {t!r}")
        total += 0 if t is None else t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer) -> int:
    """Байт в тензорах ``optimizer.state[p]``: Σ numel·element_size, без 0-мерного ``step`` AdamW
    (4 Б на тензор, не на элемент): рецепт считает байты на элемент."""
    import torch

    if not isinstance(getattr(optimizer, "state", None), dict):
        raise ValueError(
            "optimizer должно быть оптимизатором torch (torch.optim.Optimizer со словарём state), "
            f"получено {optimizer!r}"
        )
    states = [(k, v) for s in optimizer.state.values() for k, v in s.items() if torch.is_tensor(v)]
    return tensor_bytes(v for k, v in states if k != "step")


def build_probe_model(hidden: int = 256, layers: int = 4, seed: int = 0):
    """MLP «как трансформер» (зерно seed): L блоков LayerNorm → Linear(h, 4h) → GELU →
    Linear(4h, h) и Linear(h, h). Параметров: L·(8h² + 7h) + h² + h."""
    h = integer("hidden", hidden, 1)
    n_layers = integer("layers", layers, 1)
    s = integer("seed", seed, 0)
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):  # глобальный генератор CPU после — как был
        torch.manual_seed(s)
        blocks: list[nn.Module] = []
        for _ in range(n_layers):
            blocks += [nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h)]
        return nn.Sequential(*blocks, nn.Linear(h, h))
