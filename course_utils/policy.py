"""Уровень B: настоящая причинная языковая модель в RL-контуре (уроки 12.1–12.5).

``load_policy``, ``generate_rollouts`` (log μ токенов), ``recompute_logprobs`` (log π тренера),
``grpo_step``, ``sync_weights``, ``sequential_loop`` — однопроцессный эталонный цикл с таймерами.
Крошечная модель курса: ``python -m course_utils.policy build-tiny-model``.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from course_utils import arith_task
from course_utils.args import choice, integer, positive, real, text
from course_utils.arith_task import (
    ArithTask,
    grouped_rewards,
    is_informative_group,
    make_tasks,
    scalar_reward,
)
from course_utils.contract import RolloutRecord
from course_utils.memory import MODEL_CONFIGS_DIR, available_model_configs, tensor_bytes
from course_utils.offpolicy import clipped, grpo_loss
from course_utils.profile import STAGES, stage_columns
from course_utils.tiny_model import TINY_MODEL_DIR, build_tiny_model
from course_utils.tracing import StageTimer, cuda_sync_or_none

DEFAULT_HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TINY_MODEL_NAME = "tiny"
_RANDOM_PREFIX = "random:"  # random:<имя> — форма data/model_configs/<имя>.json, случайные веса
LOOP_STAGES = STAGES  # этапы эталонного цикла — одно определение на курс (profile.STAGES)
ADV_EPS = 1e-6  # ε в A = (r − mean)/(std + ε), как в verl (в TRL — 1e-4)
_NEAR_ZERO_LOGPROB = math.log(1e-8)  # log π_θ ниже этого: π_θ почти не даёт токену массы, нат
# Столбцы таблицы sequential_loop из итогов grpo_step (после informative_groups).
_LOOP_STATS = "loss epochs clip_fraction grad_norm near_zero_pi_tokens skipped_steps".split()


@dataclass
class PolicyInfo:
    """Что именно загружено: модель, число параметров, устройство, тип, был ли откат."""

    model_id: str
    num_params: int
    device: str
    dtype: str
    is_tiny: bool
    reason: str = ""  # почему взята крошечная модель вместо запрошенной ("" — не подменяли)
    is_random: bool = False  # случайные веса настоящей формы (COURSE_MODEL=random:<имя>)

    @property
    def label(self) -> str:
        """Короткое имя модели для заголовков графиков и строк вывода уровня B."""
        suffix = " (случайные веса, настоящая форма)" if self.is_random else ""
        return self.model_id + suffix

    def describe(self) -> str:
        """Одна строка для подписей к измерениям уровня B."""
        name = "крошечная модель курса (data/tiny_arith_lm)" if self.is_tiny else self.model_id
        if self.is_random:
            name = f"{self.model_id} — случайные веса, настоящая форма"
        return (
            f"модель: {name}, {self.num_params / 1e6:.2f} млн параметров, "
            f"устройство: {self.device}, тип: {self.dtype}"
        )


def _info(model, model_id: str, device, dtype: torch.dtype, **flags) -> PolicyInfo:
    """PolicyInfo модели: num_params = Σ numel по параметрам, штук."""
    n = sum(p.numel() for p in model.parameters())
    return PolicyInfo(model_id, n, str(device), str(dtype).replace("torch.", ""), **flags)


def resolve_model_name(name: str | None = None) -> str:
    """Модель уровня B: name, иначе $COURSE_MODEL, на Colab с GPU — Qwen2.5-0.5B, иначе «tiny»."""
    if name is not None:
        return text("name", name).strip()
    colab_gpu = "google.colab" in sys.modules and torch.cuda.is_available()
    default = DEFAULT_HUB_MODEL if colab_gpu else TINY_MODEL_NAME
    return os.environ.get("COURSE_MODEL", "").strip() or default


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


def _pick_dtype(device: torch.device, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """Тип весов: на CPU float32; на GPU bfloat16 при compute capability ≥ 8.0, иначе float16."""
    if dtype is not None:
        dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        return choice("dtype", dtype, (torch.float32, torch.float16, torch.bfloat16))
    if device.type != "cuda":
        return torch.float32
    # решает capability: is_bf16_supported() на T4 (7.5) отвечает «да» через эмуляцию
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def _hub_reachable(host: str = "huggingface.co", timeout_s: float = 1.5) -> bool:
    """Быстрая проверка сети: TCP-соединение с хабом за ``timeout_s`` секунд."""
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
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


def _random_shape_model(shape: str, device="cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer): форма data/model_configs/<shape>.json, случайные веса (зерно 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    choice("random:<имя> (data/model_configs)", shape, available_model_configs())
    config = AutoConfig.for_model(**json.loads((MODEL_CONFIGS_DIR / f"{shape}.json").read_text()))
    tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR), local_files_only=True)
    tokenizer.padding_side = "left"
    config.eos_token_id = config.pad_token_id = tokenizer.eos_token_id
    config.bos_token_id = None
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(0)  # зерно случайных весов
        with dev:  # веса создаются сразу на устройстве, без копии на CPU
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def _decode_ids(tokenizer, ids) -> str:
    """Текст ответа; id вне словаря токенизатора показываются как ``⟨id⟩``, а не теряются молча."""
    size, parts = len(tokenizer), []
    for known, seg in groupby((int(t) for t in ids), key=lambda i: 0 <= i < size):
        seg = list(seg)
        parts += (
            [tokenizer.decode(seg, skip_special_tokens=True)] if known else [f"⟨{i}⟩" for i in seg]
        )
    return "".join(parts)


def load_policy(
    name: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
):
    """Модель уровня B: ``(model, tokenizer, info: PolicyInfo)``; недоступная модель с хаба
    заменяется крошечной моделью курса с сообщением."""
    requested = resolve_model_name(name)
    dev = pick_device(device)
    dt = _pick_dtype(dev, dtype)
    if requested.startswith(_RANDOM_PREFIX):
        model, tokenizer = _random_shape_model(requested[len(_RANDOM_PREFIX) :], dev, dt)
        return model, tokenizer, _info(model, requested, dev, dt, is_tiny=False, is_random=True)
    is_tiny = requested == TINY_MODEL_NAME or Path(requested).resolve() == TINY_MODEL_DIR
    if is_tiny and not (TINY_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(
            f"Крошечная модель не найдена в {TINY_MODEL_DIR}; пересоберите её: "
            "python -m course_utils.policy build-tiny-model"
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    local_only = is_tiny or offline or Path(requested).is_dir() or not _hub_reachable()
    reason = ""
    try:
        source = str(TINY_MODEL_DIR) if is_tiny else requested
        model, tokenizer = _load_pretrained(source, dev, dt, local_only=local_only)
    except (OSError, ValueError) as exc:
        if is_tiny:
            raise
        why = "нет сети или HF_HUB_OFFLINE=1" if local_only else type(exc).__name__
        reason = f"модель {requested!r} недоступна ({why}); взята крошечная модель курса"
        print(f"[уровень B] {reason}.")
        model, tokenizer = _load_pretrained(str(TINY_MODEL_DIR), dev, dt, local_only=True)
    tiny = is_tiny or bool(reason)
    model_id = "tiny_arith_lm" if tiny else requested
    return model, tokenizer, _info(model, model_id, dev, dt, is_tiny=tiny, reason=reason)


def sampling_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0):
    """log μ распределения семплирования, нат, float32: ``z = logits / T``, токены вне ядра top-p
    (наименьшего множества самых вероятных с суммой вероятностей ≥ p) получают ``-inf``, затем
    ``log μ(y) = z_y − logsumexp(z ядра)``; форма ``[..., vocab]``."""
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1:
        raise ValueError("logits должен быть тензором формы [..., vocab]")
    positive("temperature", temperature)
    real("top_p", top_p, 0.0, 1.0, low_open=True)
    z = logits.float() / float(temperature)
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=False)
        drop_sorted = sorted_z.softmax(dim=-1).cumsum(dim=-1) <= (1.0 - top_p)
        drop_sorted[..., -1] = False  # самый вероятный токен остаётся всегда
        z = z.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return torch.log_softmax(z, dim=-1)


def _cache_kwarg(model) -> str:
    """Имя аргумента KV-кэша: ``cache`` в transformers ≥ 5.24, раньше ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward(model, input_ids, attention_mask, cache=None):
    """Логиты последней позиции ``[B, V]`` и KV-кэш; позиция токена — число единиц маски до него."""
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
    kwargs = {_cache_kwarg(model): cache} if cache is not None else {}
    kwargs.update(attention_mask=attention_mask, position_ids=positions, use_cache=True)
    kwargs["logits_to_keep"] = 1  # логиты только последней позиции: prefill не держит [B, T, V]
    out = model(input_ids=input_ids, **kwargs)
    cache = getattr(out, "cache", None)
    return out.logits[:, -1, :], (out.past_key_values if cache is None else cache)


def _decode_step(model, token, attention_mask, cache):
    """Шаг декодирования: токены ``[B, 1]`` в конец, маска + столбец единиц; (логиты, кэш, маска)."""
    mask = torch.nn.functional.pad(attention_mask, (0, 1), value=1)
    return *_forward(model, token, mask, cache), mask


def _stop_ids(model, tokenizer) -> set[int]:
    """id конца ответа: eos из generation_config модели (число или список) и из токенизатора."""
    eos = [getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id]
    lists = [e if isinstance(e, list | tuple) else [e] for e in eos if e is not None]
    return {int(i) for ids in lists for i in ids}


def _prompt_ids(tokenizer, task: ArithTask) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": task.prompt}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _padded(rows, fill: int, left: bool = False) -> torch.Tensor:
    """Тензор long ``[len(rows), max len]``: строки, дополненные ``fill`` слева или справа."""
    width = max(map(len, rows))
    pads = [[fill] * (width - len(r)) for r in rows]
    return torch.tensor([p + list(r) if left else list(r) + p for p, r in zip(pads, rows)])


@dataclass
class _RolloutBatch:
    """Результат генерации: записи, тексты, времена этапов (с), токены; KV-кэш в конце
    декодирования — байты и токены (последовательности × длина); prefill — без паддинга."""

    records: list[RolloutRecord]
    texts: list[str]
    timings: dict[str, float]
    input_tokens: int
    output_tokens: int
    kv_cache_bytes: int = 0
    kv_cache_tokens: int = 0
    prefill_tokens: int = 0


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
) -> _RolloutBatch:
    """Группы по ``group_size`` ответов с KV-кэшем; log μ(y_t | x, y_<t) из ``sampling_logprobs``,
    нат; этапы — в ``timer``, с. ``swap_at = k``: с токена k веса ``swap_weights`` (12.1.4);
    ``share_prefill``: один prefill на группу (12.3.3)."""
    ok = isinstance(tasks, list | tuple) and tasks and all(isinstance(t, ArithTask) for t in tasks)
    if not ok:
        raise ValueError("tasks должен быть непустым списком ArithTask (см. make_tasks)")
    group_size = integer("group_size", group_size, 1)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    policy_version = integer("policy_version", policy_version, 0)
    positive("temperature", temperature)
    real("top_p", top_p, 0.0, 1.0, low_open=True)
    if (swap_at is None) != (swap_weights is None):
        raise ValueError("swap_at и swap_weights задаются только вместе")
    if swap_at is not None:
        swap_at = integer("swap_at", swap_at, 1, max_new_tokens - 1)
    device = next(model.parameters()).device
    timer = StageTimer(sync=cuda_sync_or_none(device)) if timer is None else timer
    gen = torch.Generator(device=device).manual_seed(int(seed))
    stop = _stop_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop)
    with timer.stage("prepare"):
        unique = [_prompt_ids(tokenizer, t) for t in tasks]
        prompts = [p for p in unique for _ in range(group_size)]
        rows = unique if share_prefill else prompts
        n = len(prompts)
        ids = _padded(rows, pad_id, left=True).to(device)
        mask = _padded([[1] * len(p) for p in rows], 0, left=True).to(device)
    with timer.stage("prefill"):
        logits, cache = _forward(model, ids, mask)
        if share_prefill:  # один prefill на группу: кэш и логиты запроса копируются G раз
            cache.batch_repeat_interleave(group_size)
            logits = logits.repeat_interleave(group_size, dim=0)
            mask = mask.repeat_interleave(group_size, dim=0)
    with timer.stage("decode"):
        out_tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        stop_t = torch.tensor(sorted(stop), device=device)
        for step in range(max_new_tokens):
            logp = sampling_logprobs(logits, temperature, top_p)
            token = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            token = token.masked_fill(done, pad_id)
            out_tokens[:, step] = token
            out_logp[:, step] = logp.gather(-1, token[:, None]).squeeze(-1)
            finished_now = ~done & torch.isin(token, stop_t)
            lengths[finished_now] = step + 1
            done |= finished_now
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            if swap_at is not None and step + 1 == swap_at:
                model.load_state_dict(swap_weights)  # новая версия весов посреди ответа
            logits, cache, mask = _decode_step(model, token[:, None], mask, cache)
        out_tokens, out_logp, lengths = out_tokens.cpu(), out_logp.cpu(), lengths.cpu()
        ended = done.cpu()
        kv_bytes = tensor_bytes(t for la in cache.layers for t in (la.keys, la.values))  # K и V
        kv_tokens = n * mask.shape[1]  # позиций в кэше: запрос с паддингом + декодированные
        del cache
    with timer.stage("reward"):
        records, texts = [], []
        decoding = {"temperature": float(temperature), "top_p": float(top_p)}
        for i, prompt in enumerate(prompts):
            task, k = tasks[i // group_size], int(lengths[i])
            response = out_tokens[i, :k].tolist()
            texts.append(_decode_ids(tokenizer, response))
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
                    reward=arith_task.verify(texts[-1], task),
                    stop_reason="eos" if bool(ended[i]) else "length",
                    verifier_version=arith_task.VERIFIER_VERSION,
                    trace_id=f"tr-{group}-g{i % group_size:02d}",
                    prompt_id=task.task_id,
                    group_id=group,
                )
            )
    timings = {ev["stage"]: ev["end_s"] - ev["start_s"] for ev in timer.events[-4:]}
    tokens = (sum(map(len, prompts)), int(lengths.sum()), kv_bytes, kv_tokens, sum(map(len, rows)))
    return _RolloutBatch(records, texts, timings, *tokens)


def _checked_records(records) -> list[RolloutRecord]:
    if not isinstance(records, (list, tuple)) or not records:
        raise ValueError("records должен быть непустым списком записей роллаутов")
    out = [r if isinstance(r, RolloutRecord) else RolloutRecord.from_dict(r) for r in records]
    for r in out:
        if len(r.policy_mask) != r.num_tokens:
            raise ValueError(f"records: у {r.sample_id} длина маски ≠ длине последовательности")
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
    """Teacher forcing: ``log π(y_t | x, y_<t) = log_softmax(logits / T)[y_t]``, нат, float32, один
    тензор на запись; ``T`` — из ``decoding`` записи, top-p тренер не применяет (как TRL и verl),
    поэтому ``log μ − log π = −log(масса ядра) ≥ 0`` виден."""
    recs = _checked_records(records)
    micro_batch = integer("micro_batch", micro_batch, 1)
    device = next(model.parameters()).device
    ctx = torch.enable_grad() if with_grad else torch.no_grad()
    use_amp = autocast_dtype is not None and device.type == "cuda"
    out = []
    for start in range(0, len(recs), micro_batch):
        chunk = recs[start : start + micro_batch]
        seqs = [list(r.prompt_tokens) + list(r.response_tokens) for r in chunk]
        ids = _padded(seqs, 0).to(device)
        attn = _padded([[1] * len(s) for s in seqs], 0).to(device)
        pol = _padded([r.policy_mask for r in chunk], 0).bool().to(device)
        with ctx, torch.autocast(device.type, dtype=autocast_dtype, enabled=use_amp):
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
            for i, r in enumerate(chunk):
                temp = r.decoding.get("temperature", 1.0) if temperature is None else temperature
                where = pol[i, 1:]  # логиты позиции t−1 предсказывают токен t
                logp = sampling_logprobs(logits[i][where], temp, top_p)
                out.append(logp.gather(-1, ids[i, 1:][where][:, None]).squeeze(-1))
    return out


def group_advantages(records, reward_weights: dict[str, float] | None = None) -> list[float]:
    """Преимущества GRPO: ``A_i = (r_i − mean_g) / (std_g + ε)``, ε = 1e-6, безразмерные;
    ``r_i = scalar_reward(reward_i, reward_weights)``; неинформативная группа даёт A = 0."""
    recs = _checked_records(records)
    adv = [0.0] * len(recs)
    for group in grouped_rewards(recs, reward_weights):
        vals = list(group.values())
        if not is_informative_group(vals):
            continue
        n, mean = len(vals), sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))  # несмещённая, N − 1
        for i, r in group.items():
            adv[i] = (r - mean) / (std + ADV_EPS)
    return adv


def informative_group_fraction(records, reward_weights: dict[str, float] | None = None) -> float:
    """Доля информативных групп (``is_informative_group``) по награде ``group_advantages``, 0…1."""
    groups = grouped_rewards(_checked_records(records), reward_weights)
    return sum(is_informative_group(g.values()) for g in groups) / len(groups)


def trainer_autocast_dtype(device, engine_dtype: torch.dtype) -> torch.dtype | None:
    """Тип autocast тренера (веса float32): тип движка на CUDA, если он не float32, иначе None."""
    dev = torch.device(device)
    return engine_dtype if dev.type == "cuda" and engine_dtype != torch.float32 else None


def grad_scaler_for(device, autocast_dtype: torch.dtype | None):
    """``GradScaler("cuda")`` для autocast float16 на CUDA, иначе None: потеря × S, градиенты ÷ S
    (в float16 градиенты < ~6·10⁻⁸ обращаются в 0, > 65 504 — в inf; шаг с inf/NaN пропускается)."""
    on_cuda = torch.device(device).type == "cuda"
    return torch.amp.GradScaler("cuda") if on_cuda and autocast_dtype == torch.float16 else None


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
    """Шаг GRPO, ``epochs`` PPO-эпох по пакету: ``ρ_t = exp(log π_θ − log π_old)``,
    ``L = −(1/N) Σ_t min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A)`` по N токенам политики; ``π_old`` —
    ``old_logprobs`` (иначе ``behavior_logprobs``); клиппирование — ``offpolicy.clipped``."""
    recs = _checked_records(records)
    real("clip_eps", clip_eps, 0.0, 1.0, low_open=True, high_open=True)
    positive("max_grad_norm", max_grad_norm)
    epochs = integer("epochs", epochs, 1)
    micro_batch = integer("micro_batch", micro_batch, 1)
    device = next(model.parameters()).device
    timer = StageTimer(sync=cuda_sync_or_none(device)) if timer is None else timer
    if old_logprobs is None:
        old_logprobs = [torch.tensor(r.behavior_logprobs, dtype=torch.float32) for r in recs]
    lengths = [len(o) for o in old_logprobs]
    if lengths != [r.num_policy_tokens for r in recs]:
        raise ValueError(
            f"old_logprobs: по тензору на запись длиной в её токены политики: {lengths}"
        )
    old = [o.to(device).float() for o in old_logprobs]
    n_tok = max(sum(lengths), 1)
    if scaler is None:  # выключенный GradScaler: scale, unscale_ и step — без масштаба
        scaler = torch.amp.GradScaler("cuda", enabled=False)
    forward = {"with_grad": True, "autocast_dtype": autocast_dtype, "micro_batch": micro_batch}
    after = after_stage or (lambda stage: None)  # после forward_backward и optimizer_step
    losses, norms, clip_by_epoch, skipped, low, adv = [], [], [], 0, None, None
    for _ in range(epochs):
        with timer.stage("forward_backward"):  # вся работа шага — внутри этапов (Σ этапов = шаг)
            if adv is None:  # преимущества — часть потерь: A_i по группам, один раз на пакет
                adv_i = group_advantages(recs, reward_weights)
                adv = [torch.full((n,), a, device=device) for n, a in zip(lengths, adv_i)]
                model.train()
            optimizer.zero_grad(set_to_none=True)
            loss, news = 0.0, []
            # Σ_чанков (−Σ surr / N) — тот же градиент, что у одного прохода, но логиты в памяти
            # только для одного микропакета.
            for start in range(0, len(recs), micro_batch):
                part = slice(start, start + micro_batch)
                new_c = torch.cat(recompute_logprobs(model, recs[part], **forward))
                old_c, adv_c = torch.cat(old[part]), torch.cat(adv[part])
                surr = grpo_loss(new_c, old_c, adv_c, clip_eps=clip_eps, num_tokens=n_tok)
                scaler.scale(surr).backward()
                loss += float(surr.detach())
                news.append(new_c.detach())
            scaler.unscale_(optimizer)  # отсечение нормы — по настоящим градиентам
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)))
            new_all = torch.cat(news)
            ratio = torch.exp(new_all - torch.cat(old))  # ρ_t для доли клиппирования
            hit = clipped(ratio, torch.cat(adv), clip_eps)
            clip_by_epoch.append(float(hit.float().mean()) if ratio.numel() else 0.0)
            under = new_all < _NEAR_ZERO_LOGPROB  # ≈ нулевая масса под π_θ (и −inf)
            low = under if low is None else low | under
        after("forward_backward")
        with timer.stage("optimizer_step"):
            scale = scaler.get_scale()
            scaler.step(optimizer)  # при inf/NaN в градиентах шаг пропускается
            scaler.update()
            skipped += int(scaler.get_scale() < scale)
        after("optimizer_step")
        losses.append(loss)
    with timer.stage("optimizer_step"):  # уборка после шага тоже время шага: Σ этапов = шаг
        optimizer.zero_grad(set_to_none=True)
        model.eval()
        out = {"loss": sum(losses) / epochs, "clip_fraction": sum(clip_by_epoch) / epochs}
        out |= {"clip_fraction_by_epoch": clip_by_epoch, "grad_norm": sum(norms) / epochs}
        out |= {"epochs": epochs, "near_zero_pi_tokens": int(low.sum()), "skipped_steps": skipped}
        out["policy_tokens"] = int(ratio.numel())
        out["mean_reward"] = sum(scalar_reward(r.reward, reward_weights) for r in recs) / len(recs)
        return out


@torch.no_grad()
def sync_weights(trainer_model, engine_model) -> int:
    """Копирует веса тренера в копию движка (``weight_sync.transfer_weights``, с приведением
    типа); возвращает байты весов движка: Σ numel · element_size."""
    from course_utils.weight_sync import transfer_weights

    dst = engine_model.state_dict()
    for _ in transfer_weights(trainer_model.state_dict(), dst):
        pass
    return tensor_bytes(dst.values())


@dataclass
class LoopResult:
    """Итог ``sequential_loop``: таблица шагов, события таймера, записи, модель и тип памяти."""

    steps: pd.DataFrame  # строка на шаг
    events: pd.DataFrame  # события этапов
    records: list[RolloutRecord]
    info: PolicyInfo
    memory_kind: str


@dataclass
class Learner:
    """fp32-копия политики для обучения (``fp32_trainer``); движку веса уходят в типе wire."""

    net: Any
    wire: Any  # тип весов движка, torch.dtype
    amp: Any  # тип autocast (None — без него)
    scaler: Any  # GradScaler для float16 на CUDA, иначе None
    opt: Any  # AdamW

    def logprobs(self, records, **kw) -> list:
        """log π_θ токенов политики каждой записи, нат (``recompute_logprobs``)."""
        return recompute_logprobs(self.net, records, autocast_dtype=self.amp, **kw)

    def update(self, records, old=None, **kw) -> dict:
        """Шаг ``grpo_step`` (old — log π_old, None — behavior_logprobs) → его статистика."""
        opts = {"autocast_dtype": self.amp, "scaler": self.scaler}
        return grpo_step(self.net, self.opt, records, old, **opts, **kw)

    def wire_copy(self) -> dict:
        """Копия весов в типе движка — её получают генераторы, пока тренер учит дальше."""
        return {n: p.detach().to(self.wire).clone() for n, p in self.net.named_parameters()}

    def checksum(self) -> str:
        """SHA-256 весов в типе движка (``state_checksum``)."""
        from course_utils.multiproc.transport import state_checksum

        return state_checksum(self.net, dtype=self.wire)


def fp32_trainer(net, device, lr: float) -> Learner:
    """fp32-копия net (net становится ею) для обучения с AdamW(lr); autocast и GradScaler — по
    типу весов движка."""
    wire = next(net.parameters()).dtype  # веса уходят движку в его типе
    trainer = net.float()
    amp = trainer_autocast_dtype(device, wire)
    scaler = grad_scaler_for(device, amp)  # только fp16 на CUDA (T4): масштаб потерь
    return Learner(trainer, wire, amp, scaler, torch.optim.AdamW(trainer.parameters(), lr=lr))


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Пик памяти, байт, и что измерено: max_memory_allocated на GPU, пиковый RSS на CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: байты на macOS, КиБ на Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "пиковый RSS процесса (CPU)"


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
    micro_batch: int = 8,
) -> LoopResult:
    """Однопроцессный эталонный RL-цикл по этапам ``LOOP_STAGES``: ``T_step = Σ этапов``, с.
    Тренер — fp32-копия модели, движок — сама модель; π_old пересчитывает тренер, эпоха одна —
    поэтому clip_fraction = 0 по построению."""
    steps = integer("steps", steps, 1)
    prompts_per_step = integer("prompts_per_step", prompts_per_step, 1)
    positive("lr", lr)
    if model is None:
        model, tokenizer, info = load_policy(name)
    elif tokenizer is None:
        raise ValueError("tokenizer обязателен, если передана model")
    device = next(model.parameters()).device
    engine = model.eval()
    engine_dtype = next(engine.parameters()).dtype
    learner = fp32_trainer(copy.deepcopy(engine), device, lr)
    timer = StageTimer(worker="main", sync=cuda_sync_or_none(device))
    sampling = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
    sampling |= {"group_size": group_size, "timer": timer}
    version, rows, records, step_of_event = 0, [], [], []
    for step in tqdm(range(steps), desc="шаги цикла", disable=not progress):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        n_events = len(timer.events)
        wall0 = time.perf_counter()
        step_seed = seed * 1000 + step
        tasks = make_tasks(prompts_per_step, seed=step_seed)
        batch = generate_rollouts(
            engine, tokenizer, tasks, policy_version=version, seed=step_seed, **sampling
        )
        recs = batch.records
        with timer.stage("logprob_recompute"):
            old = learner.logprobs(recs, micro_batch=micro_batch)
        stats = learner.update(recs, old, timer=timer, micro_batch=micro_batch)
        with timer.stage("weight_sync"):
            sync_weights(learner.net, engine)
            version += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - wall0
        peak, kind = peak_memory(device)
        stage_s = dict.fromkeys(stage_columns(), 0.0)
        for ev in timer.events[n_events:]:
            stage_s[f"{ev['stage']}_s"] += ev["end_s"] - ev["start_s"]
        step_of_event.extend([step] * (len(timer.events) - n_events))
        records.extend(recs)
        row = {"step": step, "behavior_version": version - 1, **stage_s}
        row |= {"stages_sum_s": sum(stage_s.values()), "wall_s": wall}
        row |= {"input_tokens": batch.input_tokens, "output_tokens": batch.output_tokens}
        row |= {k: stats[k] for k in ("policy_tokens", "mean_reward")}
        row["informative_groups"] = informative_group_fraction(recs)
        row |= {k: stats[k] for k in _LOOP_STATS}
        rows.append({**row, "peak_memory_bytes": peak})
    if info is None:
        model_id = getattr(engine.config, "_name_or_path", "model")
        info = _info(engine, model_id, device, engine_dtype, is_tiny=False)
    events = timer.to_frame().assign(step=step_of_event)
    return LoopResult(pd.DataFrame(rows), events, records, info, kind)


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rehearse"]:  # репетиция уровня B на модели настоящей формы
        from course_utils import rehearsal

        return rehearsal.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m course_utils.policy")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-tiny-model", help="пересобрать data/tiny_arith_lm")
    sub.add_parser("rehearse", help="репетиция уровня B: --model random:Qwen2.5-0.5B --json")
    b.add_argument("--out", dest="out_dir", metavar="OUT", default=str(TINY_MODEL_DIR))
    for flag in ("--steps", "--seed"):  # не заданы — значения build_tiny_model по умолчанию
        b.add_argument(flag, type=int, default=argparse.SUPPRESS)
    kwargs = vars(parser.parse_args(argv))
    del kwargs["command"]
    print(f"Крошечная модель сохранена в {build_tiny_model(**kwargs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
