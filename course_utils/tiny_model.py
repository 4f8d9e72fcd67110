"""Крошечная модель курса ``data/tiny_arith_lm/`` (уровень B без GPU и без сети).

Причинная LM Qwen2 из ``transformers`` с маленьким BPE-токенизатором и шаблоном чата Qwen,
кратко обученная на арифметике курса: лёгкие примеры решает почти всегда, трудные — редко.
Пересборка (детерминирована на одной машине): ``python -m course_utils.policy build-tiny-model``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

from course_utils.args import integer, path
from course_utils.arith_task import ArithTask, make_tasks, target_response
from course_utils.checkpoint import publish_dir
from course_utils.csv_tables import DATA_DIR

TINY_MODEL_DIR = DATA_DIR / "tiny_arith_lm"

_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Шаблон чата в стиле Qwen2.5 (без системного сообщения по умолчанию).
_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _chat_text(task: ArithTask, response: str | None = None) -> str:
    """Текст диалога в формате шаблона: запрос пользователя (+ ответ ассистента, если задан)."""
    text = f"<|im_start|>user\n{task.prompt}<|im_end|>\n<|im_start|>assistant\n"
    return text if response is None else text + response + "<|im_end|>"


def _build_tokenizer(vocab_size: int = 320):
    """Байтовый BPE-токенизатор на текстах задачи; цифры — отдельные токены, как у Qwen2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [_chat_text(t, target_response(t)) for t in make_tasks(2000, seed=7)]
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=_CHAT_TEMPLATE,
        padding_side="left",
    )


def _training_batch(tokenizer, tasks: list[ArithTask]):
    """Входы, маска и метки: потери только на токенах ответа (метка -100 на запросе и паддинге)."""
    from course_utils.policy import _padded

    rows, labels = [], []
    for t in tasks:
        n_prompt = len(tokenizer(_chat_text(t), add_special_tokens=False)["input_ids"])
        full = tokenizer(_chat_text(t, target_response(t)), add_special_tokens=False)["input_ids"]
        rows.append(full)
        labels.append([-100] * n_prompt + full[n_prompt:])
    mask = _padded([[1] * len(r) for r in rows], 0)
    return _padded(rows, tokenizer.pad_token_id), mask, _padded(labels, -100)


def build_tiny_model(
    out_dir: str | os.PathLike = TINY_MODEL_DIR,
    steps: int = 1500,
    seed: int = 1234,
    batch_size: int = 64,
    lr: float = 1e-3,
    verbose: bool = True,
) -> Path:
    """Собирает и обучает крошечную модель (AdamW, steps шагов по batch_size задач, потери —
    кросс-энтропия ответа, нат/токен); каталог out_dir подменяется атомарно переименованием."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    steps = integer("steps", steps, 0)
    batch_size = integer("batch_size", batch_size, 1)
    out_dir = path("out_dir", out_dir)
    torch.manual_seed(seed)
    random.seed(seed)
    tokenizer = _build_tokenizer()
    config = Qwen2Config(  # 4 слоя, d = 128, 4 головы запроса и 2 головы K/V (GQA)
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, min(50, steps // 10))

    def lr_factor(s: int) -> float:  # линейный разогрев, затем косинус до 10 % от lr
        if s < warmup:
            return (s + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    for step in range(steps):
        tasks = make_tasks(batch_size, seed=seed * 100_000 + step)
        ids, mask, lab = _training_batch(tokenizer, tasks)
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if verbose and (step % 100 == 0 or step == steps - 1):
            print(f"шаг {step:4d}: потери {loss.item():.3f} нат/токен")
    model.eval()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny_build_", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        info = {"steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr}
        (tmp / "BUILD_INFO.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        publish_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
