"""Уровень B: настоящая причинная языковая модель в RL-контуре.

Что здесь есть:

* ``load_policy`` — модель и токенизатор: ``COURSE_MODEL``, иначе на Colab с GPU
  ``Qwen/Qwen2.5-0.5B-Instruct``, иначе крошечная модель курса ``data/tiny_arith_lm``;
  без сети — быстрый откат на крошечную модель с сообщением;
* арифметическая задача и её проверяющая система (из ``course_utils.arith_task``);
* ``generate_rollouts`` — семплирование с температурой и top-p, которое записывает
  логарифм вероятности каждого выбранного токена под тем распределением, из которого он
  действительно выбран (после температуры и отсечения top-p с перенормировкой);
* ``recompute_logprobs`` — пересчёт log π тренером (teacher forcing): температура применяется,
  top-p — нет, как в TRL и verl; разрыв μ − π из-за top-p остаётся виден;
* ``grpo_step`` — групповые преимущества и клиппированная функция потерь по токенам политики
  (одна или несколько PPO-эпох по пакету; ``GradScaler`` для fp16 на T4);
* ``sequential_loop`` — однопроцессный эталонный цикл с таймерами всех этапов.

Таймеры на GPU синхронизируют устройство, память на GPU — ``torch.cuda.max_memory_allocated``,
на CPU — пиковый RSS процесса (так и подписано в результатах).
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import socket
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from course_utils.args import integer
from course_utils.arith_task import (
    DEFAULT_MIX,
    VERIFIER_VERSION,
    ArithTask,
    is_informative_group,
    make_tasks,
    scalar_reward,
    target_response,
    verify,
)
from course_utils.contract import RolloutRecord
from course_utils.offpolicy import clipped, grpo_loss
from course_utils.profile import STAGES
from course_utils.tiny_model import TINY_MODEL_DIR, build_tiny_model
from course_utils.tracing import StageTimer

__all__ = [
    "DEFAULT_HUB_MODEL",
    "TINY_MODEL_DIR",
    "VERIFIER_VERSION",
    "ArithTask",
    "DEFAULT_MIX",
    "PolicyInfo",
    "RolloutBatch",
    "LoopResult",
    "make_tasks",
    "target_response",
    "verify",
    "resolve_model_name",
    "pick_device",
    "pick_dtype",
    "load_policy",
    "random_shape_model",
    "decode_ids",
    "RANDOM_PREFIX",
    "sampling_logprobs",
    "generate_rollouts",
    "recompute_logprobs",
    "group_advantages",
    "is_informative_group",
    "grad_scaler_for",
    "trainer_autocast_dtype",
    "peak_memory",
    "grpo_step",
    "sync_weights",
    "cache_bytes",
    "colocated_memory_timeline",
    "MemoryTimeline",
    "informative_group_fraction",
    "sequential_loop",
    "LOOP_STAGES",
]

DEFAULT_HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TINY_MODEL_NAME = "tiny"
# "random:<имя>" — настоящая архитектура из data/model_configs/<имя>.json со случайными весами.
RANDOM_PREFIX = "random:"
RANDOM_SEED = 0
MODEL_CONFIGS_DIR = Path(__file__).resolve().parent.parent / "data" / "model_configs"
# Этапы эталонного цикла — одно определение на курс (profile.STAGES, без импорта torch).
LOOP_STAGES = STAGES
ADV_EPS = 1e-6  # ε в A = (r − mean)/(std + ε), как в verl (в TRL — 1e-4)
NEAR_ZERO_LOGPROB = math.log(1e-8)  # log π_θ ниже этого: π_θ почти не даёт токену массы, нат


# --------------------------------------------------------------------------- загрузка модели


@dataclass
class PolicyInfo:
    """Что именно загружено: модель, число параметров, устройство, тип, был ли откат."""

    model_id: str
    num_params: int
    device: str
    dtype: str
    is_tiny: bool
    fell_back: bool = False
    reason: str = ""
    is_random: bool = False  # случайные веса настоящей формы (COURSE_MODEL=random:<имя>)

    @property
    def label(self) -> str:
        """Короткое имя модели для заголовков графиков и строк вывода уровня B."""
        if self.is_random:
            return f"{self.model_id} (случайные веса, настоящая форма)"
        return self.model_id

    def describe(self) -> str:
        """Одна строка для подписей к измерениям уровня B."""
        name = "крошечная модель курса (data/tiny_arith_lm)" if self.is_tiny else self.model_id
        if self.is_random:
            name = f"{self.model_id} — случайные веса, настоящая форма"
        return (
            f"модель: {name}, {self.num_params / 1e6:.2f} млн параметров, "
            f"устройство: {self.device}, тип: {self.dtype}"
        )


def _on_colab() -> bool:
    return "google.colab" in sys.modules


def resolve_model_name(name: str | None = None) -> str:
    """Какую модель берёт уровень B: ``name``, иначе ``COURSE_MODEL``, иначе по окружению.

    На Colab с GPU — ``Qwen/Qwen2.5-0.5B-Instruct``, в остальных случаях — ``"tiny"``
    (крошечная модель из ``data/tiny_arith_lm``).
    """
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"name должно быть непустой строкой или None, получено {name!r}")
    if name:
        return name.strip()
    env = os.environ.get("COURSE_MODEL", "").strip()
    if env:
        return env
    if _on_colab() and torch.cuda.is_available():
        return DEFAULT_HUB_MODEL
    return TINY_MODEL_NAME


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """Устройство: заданное, иначе ``cuda``, если есть GPU, иначе ``cpu``."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: не понимаю устройство {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda', но GPU недоступен; используйте device='cpu'")
    return dev


def pick_dtype(device: torch.device, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """Тип весов: на CPU float32; на GPU bfloat16, если вычислительная способность ≥ 8.0, иначе float16.

    ``torch.cuda.is_bf16_supported()`` на T4 (7.5) отвечает «да» через эмуляцию, поэтому
    решение принимается по ``torch.cuda.get_device_capability``.
    """
    if dtype is not None:
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype: допустимы float32, float16, bfloat16; получено {dtype!r}")
        return dtype
    if device.type != "cuda":
        return torch.float32
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def _hub_reachable(host: str = "huggingface.co", timeout_s: float = 1.5) -> bool:
    """Быстрая проверка сети: TCP-соединение с хабом за ``timeout_s`` секунд."""
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _load_pretrained(source: str, device: torch.device, dtype: torch.dtype, local_only: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local_only)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def random_shape_model(
    shape: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
):
    """Модель настоящей формы со случайными весами и токенизатор курса: ``(model, tokenizer)``.

    Архитектура — ``data/model_configs/<shape>.json`` (например ``"Qwen2.5-0.5B"``: 24 слоя,
    GQA с 2 головами KV, словарь 151 936, 494 032 768 параметров), веса — инициализация
    transformers при зерне ``RANDOM_SEED``; сеть не нужна. Токенизатор — крошечный токенизатор
    курса (320 токенов): id из словаря модели за его пределами ``decode_ids`` показывает как
    ``⟨id⟩``. Такая модель меряет время и память настоящей формы, а не качество ответов.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    names = sorted(p.stem for p in MODEL_CONFIGS_DIR.glob("*.json"))
    if not isinstance(shape, str) or shape not in names:
        raise ValueError(
            f"random:<имя>: имя должно быть одним из {names} (data/model_configs), "
            f"получено {shape!r}"
        )
    config = AutoConfig.for_model(**json.loads((MODEL_CONFIGS_DIR / f"{shape}.json").read_text()))
    tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR), local_files_only=True)
    tokenizer.padding_side = "left"
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    config.bos_token_id = None
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(RANDOM_SEED)
        with dev:  # веса создаются сразу на устройстве, без копии на CPU
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def decode_ids(tokenizer, ids) -> str:
    """Текст ответа; id, которых нет в словаре токенизатора (случайные веса настоящей формы
    выбирают их из словаря модели), показываются как ``⟨id⟩``, а не теряются молча."""
    size, parts, run = len(tokenizer), [], []
    for i in (int(t) for t in ids):
        if 0 <= i < size:
            run.append(i)
            continue
        if run:
            parts.append(tokenizer.decode(run, skip_special_tokens=True))
            run = []
        parts.append(f"⟨{i}⟩")
    if run:
        parts.append(tokenizer.decode(run, skip_special_tokens=True))
    return "".join(parts)


def load_policy(
    name: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
):
    """Загружает модель уровня B. Возвращает ``(model, tokenizer, info: PolicyInfo)``.

    Модель с хаба, которую нельзя загрузить (нет сети, ``HF_HUB_OFFLINE=1`` без кэша),
    заменяется крошечной моделью курса с сообщением на русском — без долгого ожидания сети.
    """
    requested = resolve_model_name(name)
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    if requested.startswith(RANDOM_PREFIX):
        shape = requested[len(RANDOM_PREFIX) :]
        model, tokenizer = random_shape_model(shape, dev, dt)
        info = PolicyInfo(
            model_id=requested,
            num_params=sum(p.numel() for p in model.parameters()),
            device=str(dev),
            dtype=str(dt).replace("torch.", ""),
            is_tiny=False,
            is_random=True,
        )
        return model, tokenizer, info
    fell_back, reason = False, ""
    is_tiny = requested == TINY_MODEL_NAME or Path(requested).resolve() == TINY_MODEL_DIR
    if is_tiny:
        source = str(TINY_MODEL_DIR)
        if not (TINY_MODEL_DIR / "config.json").exists():
            raise FileNotFoundError(
                f"Крошечная модель не найдена в {TINY_MODEL_DIR}; пересоберите её: "
                "python -m course_utils.policy build-tiny-model"
            )
        model, tokenizer = _load_pretrained(source, dev, dt, local_only=True)
    else:
        source = requested
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        is_local_dir = Path(requested).is_dir()
        local_only = offline or is_local_dir or not _hub_reachable()
        try:
            model, tokenizer = _load_pretrained(source, dev, dt, local_only=local_only)
        except (OSError, ValueError) as exc:
            why = "нет сети или HF_HUB_OFFLINE=1" if local_only else type(exc).__name__
            reason = f"модель {requested!r} недоступна ({why}); взята крошечная модель курса"
            print(f"[уровень B] {reason}.")
            fell_back, is_tiny, source = True, True, str(TINY_MODEL_DIR)
            model, tokenizer = _load_pretrained(source, dev, dt, local_only=True)
    info = PolicyInfo(
        model_id="tiny_arith_lm" if is_tiny else requested,
        num_params=sum(p.numel() for p in model.parameters()),
        device=str(dev),
        dtype=str(dt).replace("torch.", ""),
        is_tiny=is_tiny,
        fell_back=fell_back,
        reason=reason,
    )
    return model, tokenizer, info


# --------------------------------------------------------------------------- семплирование


def _check_decoding(temperature: float, top_p: float) -> None:
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature должна быть > 0, получено {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p должно лежать в (0, 1], получено {top_p!r}")


def sampling_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0):
    """Логарифмы вероятностей распределения, из которого реально семплируют.

    ``z = logits / T``; токены вне ядра top-p (наименьшее множество самых вероятных
    токенов с суммарной вероятностью ≥ p) получают ``-inf``; затем
    ``log μ(y) = z_y − logsumexp(z по оставшимся токенам)`` — вероятности перенормированы.
    Считается в float32; форма ``[..., vocab]`` сохраняется.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1:
        raise ValueError("logits должен быть тензором формы [..., vocab]")
    _check_decoding(temperature, top_p)
    z = logits.float() / float(temperature)
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=False)
        cum = sorted_z.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1.0 - top_p)
        drop_sorted[..., -1] = False  # самый вероятный токен остаётся всегда
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def _cache_kwarg(model) -> str:
    """Имя аргумента KV-кэша: ``cache`` в transformers ≥ 5.24, раньше ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _returned_cache(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def _forward(model, input_ids, attention_mask, position_ids, cache=None):
    kwargs = {_cache_kwarg(model): cache} if cache is not None else {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1  # логиты только последней позиции: prefill не держит [B, T, V]
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        **kwargs,
    )
    return out.logits[:, -1, :], _returned_cache(out)


def cache_bytes(cache) -> int:
    """Байты тензоров K и V в кэше transformers: Σ по слоям (keys + values) numel · element_size.

    Читает ``cache.layers[i].keys/.values`` (transformers 5.x); для старого формата — кортежи
    ``(k, v)`` по слоям.
    """
    if cache is None:
        raise ValueError("cache: кэш не передан (None)")
    layers = getattr(cache, "layers", None)
    pairs = [(layer.keys, layer.values) for layer in layers] if layers is not None else list(cache)
    total = 0
    for k, v in pairs:
        for t in (k, v):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def _sync_fn(device: torch.device):
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


def _stop_ids(model, tokenizer) -> set[int]:
    ids = set()
    for src in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return ids


def _prompt_ids(tokenizer, task: ArithTask) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": task.prompt}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass
class RolloutBatch:
    """Результат генерации: записи контракта, тексты ответов, задачи и времена этапов (с)."""

    records: list[RolloutRecord]
    texts: list[str]
    tasks: list[ArithTask]
    timings: dict[str, float]
    input_tokens: int
    output_tokens: int
    kv_cache_bytes: int = 0  # байты KV-кэша в конце декодирования (все последовательности пакета)
    kv_cache_tokens: int = 0  # сохранённых в кэше токенов: последовательности × длина кэша
    prefill_tokens: int = 0  # токенов, прошедших prefill (без паддинга; меньше при share_prefill)

    @property
    def tokens_per_s(self) -> float:
        """Скорость декодирования: выходные токены / время decode, токен/с."""
        return self.output_tokens / max(self.timings.get("decode", 0.0), 1e-12)


@torch.no_grad()
def generate_rollouts(
    model,
    tokenizer,
    tasks: list[ArithTask],
    group_size: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 24,
    policy_version: int = 0,
    seed: int = 0,
    run_id: str = "run",
    timer: StageTimer | None = None,
    swap_at: int | None = None,
    swap_weights: dict | None = None,
    share_prefill: bool = False,
) -> RolloutBatch:
    """Группы из ``group_size`` ответов на каждую задачу; пакетное декодирование с KV-кэшем.

    Для каждого выбранного токена пишется ``log μ_v(y_t | x, y_<t)`` под распределением
    ``sampling_logprobs(logits, T, p)`` — тем, из которого он выбран. Этапы (prepare,
    prefill, decode, reward) записываются в ``timer``; время в секундах.

    Опыт шага 12.1.4: если заданы ``swap_at = k`` и ``swap_weights`` (state_dict версии
    ``policy_version + 1``), движок подменяет веса **на месте** посреди ответа — токены с номера k
    выбирает уже новая версия (KV-кэш начала ответа остаётся от старой). Такие записи получают
    ``token_policy_versions`` и ``policy_version=None``.

    ``share_prefill=True`` (шаг 12.3.3): запрос группы проходит prefill один раз, затем его
    KV-кэш и логиты размножаются на G ответов (``cache.batch_repeat_interleave``); число токенов
    prefill падает в G раз, распределение ответов то же.
    """
    if not isinstance(tasks, (list, tuple)) or not tasks:
        raise ValueError("tasks должен быть непустым списком ArithTask")
    if not all(isinstance(t, ArithTask) for t in tasks):
        raise ValueError("tasks: каждый элемент должен быть ArithTask (см. make_tasks)")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size должно быть целым ≥ 1, получено {group_size!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens должно быть целым ≥ 1, получено {max_new_tokens!r}")
    if not isinstance(policy_version, int) or policy_version < 0:
        raise ValueError(f"policy_version должно быть целым ≥ 0, получено {policy_version!r}")
    _check_decoding(temperature, top_p)
    if (swap_at is None) != (swap_weights is None):
        raise ValueError("swap_at и swap_weights задаются только вместе")
    if swap_at is not None and (not isinstance(swap_at, int) or not 1 <= swap_at < max_new_tokens):
        raise ValueError(f"swap_at должно быть целым в [1, max_new_tokens), получено {swap_at!r}")
    device = next(model.parameters()).device
    timer = StageTimer(sync=_sync_fn(device)) if timer is None else timer
    gen = torch.Generator(device=device).manual_seed(int(seed))
    stop = _stop_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)

    with timer.stage("prepare"):
        unique = [_prompt_ids(tokenizer, t) for t in tasks]
        prompts = [p for p in unique for _ in range(group_size)]
        rows = unique if share_prefill else prompts
        width = max(map(len, rows))
        n = len(prompts)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, p in enumerate(rows):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)

    with timer.stage("prefill"):
        logits, cache = _forward(model, ids, mask, positions)
        if share_prefill:  # один prefill на группу: кэш и логиты запроса копируются G раз
            cache.batch_repeat_interleave(group_size)
            logits = logits.repeat_interleave(group_size, dim=0)
            mask = mask.repeat_interleave(group_size, dim=0)
            positions = positions.repeat_interleave(group_size, dim=0)

    with timer.stage("decode"):
        out_tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        stop_t = torch.tensor(sorted(stop), device=device)
        last_pos = positions[:, -1]
        for step in range(max_new_tokens):
            logp = sampling_logprobs(logits, temperature, top_p)
            token = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            token = torch.where(done, torch.full_like(token, pad_id), token)
            out_tokens[:, step] = token
            out_logp[:, step] = logp.gather(-1, token[:, None]).squeeze(-1)
            finished_now = ~done & torch.isin(token, stop_t)
            lengths = torch.where(finished_now, torch.full_like(lengths, step + 1), lengths)
            done |= finished_now
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            if swap_at is not None and step + 1 == swap_at:
                model.load_state_dict(swap_weights)  # новая версия весов посреди ответа
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
            last_pos = last_pos + 1
            logits, cache = _forward(model, token[:, None], mask, last_pos[:, None], cache)
        out_tokens, out_logp, lengths = out_tokens.cpu(), out_logp.cpu(), lengths.cpu()
        ended = done.cpu()
        kv_bytes = cache_bytes(cache)
        kv_tokens = n * (mask.shape[1])  # позиций в кэше: запрос с паддингом + декодированные
        del cache

    with timer.stage("reward"):
        records, texts = [], []
        decoding = {"temperature": float(temperature), "top_p": float(top_p)}
        for i, prompt in enumerate(prompts):
            task = tasks[i // group_size]
            k = int(lengths[i])
            response = out_tokens[i, :k].tolist()
            text = decode_ids(tokenizer, response)
            texts.append(text)
            group = f"{run_id}-v{policy_version}-{task.task_id}"
            mixed = swap_at is not None and k > swap_at
            versions = (
                [policy_version] * swap_at + [policy_version + 1] * (k - swap_at) if mixed else None
            )
            records.append(
                RolloutRecord(
                    sample_id=f"{group}-g{i % group_size:02d}",
                    policy_version=None if mixed else policy_version,
                    token_policy_versions=versions,
                    prompt_tokens=list(prompt),
                    response_tokens=response,
                    policy_mask=[0] * len(prompt) + [1] * k,
                    behavior_logprobs=[float(x) for x in out_logp[i, :k].double().tolist()],
                    decoding=dict(decoding),
                    reward=verify(text, task),
                    stop_reason="eos" if bool(ended[i]) else "length",
                    verifier_version=VERIFIER_VERSION,
                    trace_id=f"tr-{group}-g{i % group_size:02d}",
                    prompt_id=task.task_id,
                    group_id=group,
                )
            )
    timings = {s: 0.0 for s in ("prepare", "prefill", "decode", "reward")}
    for ev in timer.events[-4:]:
        timings[ev["stage"]] = ev["end_s"] - ev["start_s"]
    return RolloutBatch(
        records=records,
        texts=texts,
        tasks=[tasks[i // group_size] for i in range(n)],
        timings=timings,
        input_tokens=sum(map(len, prompts)),
        prefill_tokens=sum(map(len, rows)),
        output_tokens=int(lengths.sum()),
        kv_cache_bytes=kv_bytes,
        kv_cache_tokens=kv_tokens,
    )


# --------------------------------------------------------------------------- сторона тренера


def _records_to_batch(records, device):
    seqs = [list(r.prompt_tokens) + list(r.response_tokens) for r in records]
    width = max(map(len, seqs))
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    pol = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, r) in enumerate(zip(seqs, records)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        pol[i, : len(s)] = torch.tensor(r.policy_mask, dtype=torch.bool)
    return ids.to(device), attn.to(device), pol.to(device)


def _checked_records(records) -> list[RolloutRecord]:
    if not isinstance(records, (list, tuple)) or not records:
        raise ValueError("records должен быть непустым списком записей роллаутов")
    out = [r if isinstance(r, RolloutRecord) else RolloutRecord.from_dict(r) for r in records]
    for r in out:
        if len(r.policy_mask) != len(r.prompt_tokens) + len(r.response_tokens):
            raise ValueError(
                f"records: у {r.sample_id} длина маски не равна длине последовательности"
            )
    return out


def recompute_logprobs(
    model,
    records,
    temperature: float | None = None,
    top_p: float = 1.0,
    with_grad: bool = False,
    autocast_dtype: torch.dtype | None = None,
    micro_batch: int = 8,
) -> list[torch.Tensor]:
    """Teacher forcing: ``log π(y_t | x, y_<t) = log_softmax(logits / T)[y_t]`` (нат) для
    каждого токена политики (маска = 1).

    Как в TRL (GRPOTrainer) и verl (актор делит логиты на температуру): ``T`` по умолчанию
    берётся из ``decoding`` каждой записи, а top-p тренер **не** применяет, даже если движок
    семплировал с top-p < 1. Поэтому там ``log μ − log π = −log(масса ядра) ≥ 0`` — разрыв
    движка и тренера из-за top-p виден, а не спрятан. Явное ``top_p < 1`` — только для опыта
    «а если бы тренер тоже отсекал ядро» (урок 12.1); явное ``temperature`` — для всех записей.
    Прямой проход по «запрос + ответ» пакетами по ``micro_batch`` записей (логиты словаря
    в 150 тысяч токенов иначе не помещаются в память T4); логиты позиции t−1 предсказывают
    токен t. Возвращает список тензоров float32, по одному на запись, длиной = числу токенов
    политики.
    """
    recs = _checked_records(records)
    if not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch должно быть целым ≥ 1, получено {micro_batch!r}")
    device = next(model.parameters()).device
    ctx = torch.enable_grad() if with_grad else torch.no_grad()
    use_amp = autocast_dtype is not None and device.type == "cuda"
    out = []
    for start in range(0, len(recs), micro_batch):
        chunk = recs[start : start + micro_batch]
        ids, attn, pol = _records_to_batch(chunk, device)
        with ctx, torch.autocast(device.type, dtype=autocast_dtype, enabled=use_amp):
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
            for i, r in enumerate(chunk):
                temp = (
                    temperature if temperature is not None else r.decoding.get("temperature", 1.0)
                )
                where = pol[i, 1:]
                logp = sampling_logprobs(logits[i][where], temp, top_p)
                out.append(logp.gather(-1, ids[i, 1:][where][:, None]).squeeze(-1))
    return out


def _group_indices(recs: list[RolloutRecord]) -> dict[str, list[int]]:
    """Номера записей по группам: ключ — ``group_id``, иначе ``prompt_id``, иначе ``sample_id``."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(recs):
        groups[r.group_id or r.prompt_id or r.sample_id].append(i)
    return groups


def group_advantages(records, reward_weights: dict[str, float] | None = None) -> list[float]:
    """Групповые преимущества GRPO: ``A_i = (r_i − mean_g) / (std_g + ε)``, ε = 1e-6, безразмерные.

    ``r_i = scalar_reward(reward_i, reward_weights)``; группа — записи с одним ``group_id``
    (или ``prompt_id``). ``std_g`` — несмещённая оценка, делитель N − 1 (``torch.std`` по
    умолчанию), как в TRL (``GRPOTrainer``, ε = 1e-4) и verl
    (``compute_grpo_outcome_advantage``, ε = 1e-6). Неинформативная группа
    (``is_informative_group``: все награды равны, или ответ один и std не определено) даёт
    A = 0 (verl для группы из одного ответа берёт mean = 0, std = 1, то есть A = r).
    """
    recs = _checked_records(records)
    rewards = [scalar_reward(r.reward, reward_weights) for r in recs]
    adv = [0.0] * len(recs)
    for idx in _group_indices(recs).values():
        vals = [rewards[i] for i in idx]
        if not is_informative_group(vals):
            continue
        n, mean = len(vals), sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))  # несмещённая, N − 1
        for i in idx:
            adv[i] = (rewards[i] - mean) / (std + ADV_EPS)
    return adv


def informative_group_fraction(records, reward_weights: dict[str, float] | None = None) -> float:
    """Доля информативных групп (``is_informative_group``) по скалярной награде, от 0 до 1.

    Награда та же, что у ``group_advantages``: ``scalar_reward(reward, reward_weights)``,
    с формат-наградой. Группа с одинаковой правильностью, но разным форматом — информативна.
    """
    recs = _checked_records(records)
    rewards = [scalar_reward(r.reward, reward_weights) for r in recs]
    groups = _group_indices(recs).values()
    return sum(is_informative_group([rewards[i] for i in idx]) for idx in groups) / len(groups)


def trainer_autocast_dtype(device, engine_dtype: torch.dtype) -> torch.dtype | None:
    """Тип autocast тренера: тип весов движка на CUDA, если он не float32, иначе None (float32).

    Тренер хранит float32-копию; на T4 считает в float16, на A100/H100 — в bfloat16."""
    dev = torch.device(device)
    return engine_dtype if dev.type == "cuda" and engine_dtype != torch.float32 else None


def grad_scaler_for(device, autocast_dtype: torch.dtype | None):
    """``torch.amp.GradScaler("cuda")``, если тренер считает в autocast float16 на CUDA, иначе None.

    В float16 (T4: bfloat16 нет) градиенты меньше ~6·10⁻⁸ обращаются в 0, а больше 65 504 — в
    inf. Поэтому потерю умножают на масштаб S, градиенты перед отсечением и шагом делят на S,
    а шаг с inf/NaN пропускают и уменьшают S. У bfloat16 диапазон как у float32 — масштаб не
    нужен; на CPU и в float32 ничего не меняется.
    """
    dev = torch.device(device)
    return (
        torch.amp.GradScaler("cuda")
        if dev.type == "cuda" and autocast_dtype == torch.float16
        else None
    )


def grpo_step(
    model,
    optimizer,
    records,
    old_logprobs: list[torch.Tensor] | None = None,
    clip_eps: float = 0.2,
    max_grad_norm: float = 1.0,
    reward_weights: dict[str, float] | None = None,
    autocast_dtype: torch.dtype | None = None,
    timer: StageTimer | None = None,
    after_stage=None,
    micro_batch: int = 8,
    epochs: int = 1,
    scaler: torch.amp.GradScaler | None = None,
) -> dict:
    """Шаг GRPO по записям роллаутов: ``epochs`` обновлений (PPO-эпох) по одному пакету.

    ``ρ_t = exp(log π_θ − log π_old)``, ``L = −(1/N) Σ_t min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A)``,
    сумма только по токенам политики (маска = 1), N — их число. ``π_old`` — ``old_logprobs``
    (по умолчанию ``behavior_logprobs`` из записей) и в эпохах не меняется. Доля клиппирования —
    как в PPO, TRL и verl: доля токенов, где активен клиппированный член (его градиент 0), то есть
    ``ρ > 1+ε`` при ``A > 0`` или ``ρ < 1−ε`` при ``A < 0``. Если ``π_old`` пересчитан этой же
    моделью, в первой эпохе ρ = 1 и доля равна 0 по построению; клиппирование видно со второй.
    Возвращает loss, clip_fraction, grad_norm (до отсечения) — средние по эпохам,
    clip_fraction_by_epoch, near_zero_pi_tokens (токены, которые μ выбрал, а π_θ хоть в одной
    эпохе почти не даёт им массы: ``log π_θ < log 1e-8``, ρ ≈ 0 и градиента от них нет;
    обратный случай μ = 0 < π — ``offpolicy.support_violations``),
    skipped_steps (шаги, пропущенные ``scaler`` из-за inf/NaN), policy_tokens, total_tokens.
    Градиент накапливается по микропакетам из ``micro_batch`` записей (результат тот же).
    ``scaler`` — ``grad_scaler_for(...)`` при fp16 на CUDA. ``after_stage(name)`` (если задан)
    вызывается после «forward_backward» (градиенты ещё живы) и после «optimizer_step».
    """
    recs = _checked_records(records)
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps должно лежать в (0, 1), получено {clip_eps!r}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm должно быть > 0, получено {max_grad_norm!r}")
    epochs = integer("epochs", epochs, 1)
    device = next(model.parameters()).device
    timer = StageTimer(sync=_sync_fn(device)) if timer is None else timer
    if old_logprobs is None:
        old_logprobs = [torch.tensor(r.behavior_logprobs, dtype=torch.float32) for r in recs]
    if len(old_logprobs) != len(recs):
        raise ValueError("old_logprobs: нужен ровно один тензор на запись")
    for i, (o, r) in enumerate(zip(old_logprobs, recs)):
        if len(o) != r.num_policy_tokens:
            raise ValueError(
                f"old_logprobs[{i}]: {len(o)} значений, а токенов политики {r.num_policy_tokens}"
            )
    n_tok = max(sum(r.num_policy_tokens for r in recs), 1)
    losses, norms, clip_by_epoch, skipped, low, adv = [], [], [], 0, None, None
    for _ in range(epochs):
        with timer.stage("forward_backward"):  # вся работа шага — внутри этапов (Σ этапов = шаг)
            if adv is None:  # преимущества — часть потерь: A_i по группам, один раз на пакет
                adv = group_advantages(recs, reward_weights)
                model.train()
            optimizer.zero_grad(set_to_none=True)
            loss, ratios, advs, news = 0.0, [], [], []
            # Накопление градиента по микропакетам: Σ_чанков (−Σ surr / N) — тот же градиент,
            # что у одного прохода, но логиты в памяти только для одного микропакета.
            for start in range(0, len(recs), micro_batch):
                chunk = recs[start : start + micro_batch]
                new = recompute_logprobs(
                    model,
                    chunk,
                    with_grad=True,
                    autocast_dtype=autocast_dtype,
                    micro_batch=len(chunk),
                )
                new_c = torch.cat(new)
                old_c = torch.cat(
                    [o.to(device).float() for o in old_logprobs[start : start + micro_batch]]
                )
                a_c = torch.cat(
                    [torch.full((len(t),), a, device=device) for t, a in zip(new, adv[start:])]
                ).float()
                part = grpo_loss(new_c, old_c, a_c, clip_eps=clip_eps, num_tokens=n_tok)
                (part if scaler is None else scaler.scale(part)).backward()
                loss += float(part.detach())
                ratios.append(torch.exp(new_c.detach() - old_c))  # ρ_t для доли клиппирования
                advs.append(a_c)
                news.append(new_c.detach())
            if scaler is not None:
                scaler.unscale_(optimizer)  # отсечение нормы — по настоящим градиентам
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            ratio, a_all = torch.cat(ratios), torch.cat(advs)
            hit = clipped(ratio, a_all, clip_eps)  # знак A: offpolicy.clipped
            clip_by_epoch.append(float(hit.float().mean()) if ratio.numel() else 0.0)
            under = torch.cat(news) < NEAR_ZERO_LOGPROB  # ≈ нулевая масса под π_θ (и −inf)
            low = under if low is None else low | under
            norms.append(float(grad_norm))
        if after_stage is not None:
            after_stage("forward_backward")
        with timer.stage("optimizer_step"):
            if scaler is None:
                optimizer.step()
            else:
                scale = scaler.get_scale()
                scaler.step(optimizer)  # при inf/NaN в градиентах шаг пропускается
                scaler.update()
                skipped += int(scaler.get_scale() < scale)
        if after_stage is not None:
            after_stage("optimizer_step")
        losses.append(loss)
    with timer.stage("optimizer_step"):  # уборка после шага тоже время шага: Σ этапов = шаг
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        stats = {
            "loss": sum(losses) / epochs,
            "clip_fraction": sum(clip_by_epoch) / epochs,
            "clip_fraction_by_epoch": clip_by_epoch,
            "grad_norm": sum(norms) / epochs,
            "epochs": epochs,
            "near_zero_pi_tokens": int(low.sum()),
            "skipped_steps": skipped,
            "policy_tokens": int(ratio.numel()),
            "total_tokens": sum(len(r.prompt_tokens) + len(r.response_tokens) for r in recs),
            "mean_reward": sum(scalar_reward(r.reward, reward_weights) for r in recs) / len(recs),
        }
        del ratios, advs, news, ratio, a_all, hit, under, low
    return stats


@torch.no_grad()
def sync_weights(trainer_model, engine_model) -> int:
    """Копирует веса тренера в отдельную копию движка (с приведением типа). Возвращает байты движка."""
    src = dict(trainer_model.state_dict())
    moved = 0
    for name, dst in engine_model.state_dict().items():
        if name not in src:
            raise ValueError(f"engine_model: параметр {name} отсутствует у тренера")
        dst.copy_(src[name])
        moved += dst.numel() * dst.element_size()
    return moved


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


@dataclass
class MemoryTimeline:
    """Память по фазам одного совмещённого шага.

    ``phases`` — точный учёт тензоров ``[(фаза, {компонент: байты})]`` (веса, градиенты,
    состояние оптимизатора, KV-кэш; активации и временные буферы сюда не входят).
    ``gpu`` — на GPU: ``[(фаза, torch.cuda.memory_allocated после фазы, пик за фазу)]``
    в байтах; на CPU пусто. ``kv_tokens`` — позиций в KV-кэше фазы генерации (последовательности ×
    длина кэша). ``device`` и ``info`` — чем измерено.
    """

    phases: list
    gpu: list
    device: str
    kv_tokens: int
    info: PolicyInfo | None = None


def colocated_memory_timeline(
    model,
    tokenizer,
    tasks: list[ArithTask],
    group_size: int = 4,
    max_new_tokens: int = 24,
    lr: float = 1e-5,
    seed: int = 0,
    info: PolicyInfo | None = None,
) -> MemoryTimeline:
    """Совмещённое размещение: одна float32-копия модели по очереди генерирует и обучается.

    Сначала шаг прогрева (создаёт состояние AdamW), затем измеряемый шаг с фазами
    «генерация» → «пересчёт log π» → «прямой и обратный проход» → «шаг оптимизатора» →
    «после шага». Для каждой фазы — точный учёт тензоров, а на GPU ещё и
    ``torch.cuda.memory_allocated``/``max_memory_allocated`` на её границе.
    """
    if not isinstance(tasks, (list, tuple)) or not tasks:
        raise ValueError("tasks должен быть непустым списком ArithTask")
    if not lr > 0:
        raise ValueError(f"lr должно быть > 0, получено {lr!r}")
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    net = copy.deepcopy(model).float()
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    kwargs = {"group_size": group_size, "max_new_tokens": max_new_tokens}
    warm = generate_rollouts(net, tokenizer, list(tasks), seed=seed, **kwargs)
    grpo_step(net, opt, warm.records)
    phases, gpu = [], []

    def resident() -> dict:
        state = [t for st in opt.state.values() for t in st.values()]
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        out = {
            "веса": _tensor_bytes(net.parameters()),
            "состояние оптимизатора": _tensor_bytes(state),
        }
        if grads:
            out["градиенты"] = _tensor_bytes(grads)
        return out

    def mark(name: str, extra: dict | None = None) -> None:
        phases.append((name, {**resident(), **(extra or {})}))
        if cuda:
            torch.cuda.synchronize(device)
            gpu.append(
                (name, torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device))
            )
            torch.cuda.reset_peak_memory_stats(device)

    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    batch = generate_rollouts(net, tokenizer, list(tasks), seed=seed + 1, **kwargs)
    mark("генерация", {"KV-кэш": batch.kv_cache_bytes})
    old = recompute_logprobs(net, batch.records)
    mark("пересчёт log π")
    names = {"forward_backward": "прямой и обратный проход", "optimizer_step": "шаг оптимизатора"}
    grpo_step(net, opt, batch.records, old_logprobs=old, after_stage=lambda s: mark(names[s]))
    mark("после шага")
    kv_tokens = batch.kv_cache_tokens
    return MemoryTimeline(phases, gpu, str(device), kv_tokens, info)


# --------------------------------------------------------------------------- эталонный цикл


@dataclass
class LoopResult:
    """Итог ``sequential_loop``: таблица шагов, события таймера, записи, модель и тип памяти."""

    steps: object  # pandas.DataFrame: одна строка на шаг
    events: object  # pandas.DataFrame: события этапов (trace_id, worker, stage, start_s, end_s)
    records: list[RolloutRecord] = field(default_factory=list)
    info: PolicyInfo | None = None
    memory_kind: str = ""
    texts: list[str] = field(default_factory=list)

    def stage_columns(self) -> list[str]:
        return [f"{s}_s" for s in LOOP_STAGES]


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Пик памяти, байт, и что измерено: max_memory_allocated на GPU, пиковый RSS на CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return int(kib * scale), "пиковый RSS процесса (CPU)"


def sequential_loop(
    steps: int = 3,
    model=None,
    tokenizer=None,
    info: PolicyInfo | None = None,
    name: str | None = None,
    prompts_per_step: int = 4,
    group_size: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 24,
    lr: float = 1e-5,
    seed: int = 0,
    progress: bool = False,
    epochs: int = 1,
    micro_batch: int = 8,
) -> LoopResult:
    """Однопроцессный эталонный RL-цикл: prepare → prefill → decode → reward →
    logprob_recompute → forward_backward → optimizer_step → weight_sync.

    Тренер — fp32-копия модели (на GPU с autocast; при float16 — с ``GradScaler``), движок —
    отдельная копия в типе модели; после ``epochs`` шагов оптимизатора по пакету веса
    копируются в движок и версия растёт на 1. ``π_old`` пересчитывает сам тренер перед
    обновлением, поэтому при ``epochs = 1`` ρ = 1 и ``clip_fraction`` равна 0 по построению
    (это не «клиппирование не понадобилось»); при ``epochs ≥ 2`` вторая и следующие эпохи
    идут по уже сдвинутой π_θ, и клиппирование становится видно.
    ``T_step = Σ этапов`` (время стены шага тоже записано, ``wall_s``); память — пик за шаг
    на GPU или пиковый RSS процесса на CPU.
    """
    import pandas as pd

    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps должно быть целым ≥ 1, получено {steps!r}")
    if not isinstance(prompts_per_step, int) or prompts_per_step < 1:
        raise ValueError(f"prompts_per_step должно быть целым ≥ 1, получено {prompts_per_step!r}")
    if not lr > 0:
        raise ValueError(f"lr должно быть > 0, получено {lr!r}")
    epochs = integer("epochs", epochs, 1)
    if model is None:
        model, tokenizer, info = load_policy(name)
    elif tokenizer is None:
        raise ValueError("tokenizer обязателен, если передана model")
    device = next(model.parameters()).device
    engine = model.eval()
    engine_dtype = next(engine.parameters()).dtype
    trainer = copy.deepcopy(engine).float()
    amp = trainer_autocast_dtype(device, engine_dtype)
    scaler = grad_scaler_for(device, amp)  # только fp16 на CUDA (T4), иначе None
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=lr)
    timer = StageTimer(worker="main", sync=_sync_fn(device))
    version, rows, records, texts, step_of_event = 0, [], [], [], []
    iterator = range(steps)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="шаги цикла")
    for step in iterator:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        n_events = len(timer.events)
        wall0 = time.perf_counter()
        tasks = make_tasks(prompts_per_step, seed=seed * 1000 + step)
        batch = generate_rollouts(
            engine,
            tokenizer,
            tasks,
            group_size=group_size,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            policy_version=version,
            seed=seed * 1000 + step,
            timer=timer,
        )
        with timer.stage("logprob_recompute"):
            old = recompute_logprobs(
                trainer, batch.records, autocast_dtype=amp, micro_batch=micro_batch
            )
        stats = grpo_step(
            trainer,
            optimizer,
            batch.records,
            old,
            autocast_dtype=amp,
            timer=timer,
            epochs=epochs,
            scaler=scaler,
            micro_batch=micro_batch,
        )
        with timer.stage("weight_sync"):
            sync_weights(trainer, engine)
            version += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - wall0
        peak, kind = peak_memory(device)
        stage_s = {f"{s}_s": 0.0 for s in LOOP_STAGES}
        for ev in timer.events[n_events:]:
            stage_s[f"{ev['stage']}_s"] += ev["end_s"] - ev["start_s"]
        step_of_event.extend([step] * (len(timer.events) - n_events))
        records.extend(batch.records)
        texts.extend(batch.texts)
        rows.append(
            {
                "step": step,
                "behavior_version": version - 1,
                **stage_s,
                "stages_sum_s": sum(stage_s.values()),
                "wall_s": wall,
                "input_tokens": batch.input_tokens,
                "output_tokens": batch.output_tokens,
                "policy_tokens": stats["policy_tokens"],
                "mean_reward": stats["mean_reward"],
                "informative_groups": informative_group_fraction(batch.records),
                "loss": stats["loss"],
                "epochs": epochs,
                "clip_fraction": stats["clip_fraction"],  # при epochs = 1 — 0 по построению
                "grad_norm": stats["grad_norm"],
                "near_zero_pi_tokens": stats["near_zero_pi_tokens"],
                "skipped_steps": stats["skipped_steps"],
                "peak_memory_bytes": peak,
            }
        )
    if info is None:
        info = PolicyInfo(
            model_id=getattr(engine.config, "_name_or_path", "model"),
            num_params=sum(p.numel() for p in engine.parameters()),
            device=str(device),
            dtype=str(engine_dtype).replace("torch.", ""),
            is_tiny=False,
        )
    events = timer.to_frame()
    events["step"] = step_of_event
    return LoopResult(
        steps=pd.DataFrame(rows),
        events=events,
        records=records,
        info=info,
        memory_kind=kind,
        texts=texts,
    )


def _main(argv: list[str] | None = None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rehearse"]:  # репетиция уровня B на модели настоящей формы
        from course_utils import rehearsal

        return rehearsal.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m course_utils.policy")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-tiny-model", help="пересобрать data/tiny_arith_lm")
    sub.add_parser("rehearse", help="репетиция уровня B: --model random:Qwen2.5-0.5B --json")
    b.add_argument("--out", default=str(TINY_MODEL_DIR))
    b.add_argument("--steps", type=int, default=None)
    b.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    kwargs = {k: v for k, v in (("steps", args.steps), ("seed", args.seed)) if v is not None}
    out = build_tiny_model(args.out, **kwargs)
    print(f"Крошечная модель сохранена в {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
