"""Арифметическая задача курса и её верификатор: награда — точная функция текста, не мнение судьи.

Уровни: 1 — сложение однозначных (``7+5``), 2 — сложение или вычитание двузначных (``48-19``),
3 — однозначное × двузначное (``7*38``). Ответ засчитывается, если в нём ровно один тег
``<answer>целое</answer>``; награда — ``{"correctness": 0/1, "format": 0/1}``, версия
верификатора (``VERIFIER_VERSION``) пишется в каждый роллаут.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass

from course_utils.args import choice, integer

VERIFIER_VERSION = "arith-v1"
_DIFFICULTIES = (1, 2, 3)
_DEFAULT_MIX = {1: 0.3, 2: 0.4, 3: 0.3}
REWARD_WEIGHTS = {"correctness": 1.0, "format": 0.1}  # веса scalar_reward по умолчанию
_PROMPT_TEMPLATE = "Вычисли: {expression}. Ответ дай в виде <answer>число</answer>."

# Диапазоны операндов a и b по уровням (границы включены).
_OPERANDS = {1: ((0, 9), (0, 9)), 2: ((10, 99), (10, 99)), 3: ((2, 9), (10, 99))}
_ANSWER_RE = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")
_ANY_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class ArithTask:
    """Одна задача: идентификатор, уровень, выражение, верный ответ и текст запроса."""

    task_id: str
    difficulty: int
    expression: str
    answer: int
    prompt: str


def _make_task(rng: random.Random, difficulty: int, task_id: str) -> ArithTask:
    """Случайная задача уровня ``difficulty`` из генератора ``rng``."""
    (a_lo, a_hi), (b_lo, b_hi) = _OPERANDS[choice("difficulty", difficulty, _DIFFICULTIES)]
    a, b = rng.randint(a_lo, a_hi), rng.randint(b_lo, b_hi)
    op = rng.choice("+-") if difficulty == 2 else "+" if difficulty == 1 else "*"
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    expression = f"{a}{op}{b}"
    return ArithTask(
        task_id, difficulty, expression, value, _PROMPT_TEMPLATE.format(expression=expression)
    )


def make_tasks(n: int, seed: int = 0, mix: dict[int, float] | None = None) -> list[ArithTask]:
    """``n`` задач, детерминированно по ``seed``; уровень — с вероятностями ``mix``
    (по умолчанию 30 % / 40 % / 30 % для уровней 1 / 2 / 3)."""
    n = integer("n", n, 1, strict=True)
    mix = dict(_DEFAULT_MIX if mix is None else mix)
    bad = any(k not in _DIFFICULTIES for k in mix) or any(w < 0 for w in mix.values())
    if bad or sum(mix.values()) <= 0:
        raise ValueError(f"mix: ключи из {_DIFFICULTIES}, веса ≥ 0, сумма > 0; получено {mix!r}")
    rng = random.Random(seed)
    levels, weights = zip(*sorted(mix.items()))
    return [_make_task(rng, rng.choices(levels, weights)[0], f"s{seed}-t{i:04d}") for i in range(n)]


def target_response(task: ArithTask) -> str:
    """Эталонный ответ в нужном формате: ``<answer>значение</answer>``."""
    return f"<answer>{task.answer}</answer>"


def verify(response_text: str, task: ArithTask) -> dict[str, float]:
    """Награда ``{"correctness": 0/1, "format": 0/1}``: формат верен, если в ответе ровно один тег
    ``<answer>…</answer>`` с целым числом; правильность — только при верном формате."""
    if not isinstance(response_text, str):
        raise ValueError(
            f"response_text должен быть строкой, получено {type(response_text).__name__}"
        )
    if not isinstance(task, ArithTask):
        raise ValueError(f"task должен быть ArithTask, получено {type(task).__name__}")
    tags = _ANY_TAG_RE.findall(response_text)
    match = _ANSWER_RE.fullmatch(f"<answer>{tags[0]}</answer>") if len(tags) == 1 else None
    if match is None:
        return {"correctness": 0.0, "format": 0.0}
    return {"correctness": float(int(match.group(1)) == task.answer), "format": 1.0}


def scalar_reward(reward: dict, weights: dict[str, float] | None = None) -> float:
    """Скалярная награда r = Σ_k w_k · reward[k]; веса по умолчанию — REWARD_WEIGHTS (1 и 0.1)."""
    weights = weights or REWARD_WEIGHTS
    return float(sum(w * float(reward.get(k, 0.0)) for k, w in weights.items()))


def is_informative_group(rewards) -> bool:
    """Информативна ли группа GRPO: ответов ≥ 2 и скалярные награды (``scalar_reward``, как в
    ``group_advantages``) не все равны (std > 0); иначе A = 0 у всех ответов и градиента нет."""
    vals = [float(v) for v in rewards]
    return len(vals) > 1 and max(vals) > min(vals)


def grouped_rewards(records, weights: dict[str, float] | None = None) -> list[dict[int, float]]:
    """Группы GRPO (по group_id, иначе prompt_id, sample_id) в порядке появления: {номер записи:
    скалярная награда r_i = ``scalar_reward(reward_i, weights)``}."""
    groups: dict[str, dict[int, float]] = defaultdict(dict)
    for i, r in enumerate(records):
        groups[r.group_id or r.prompt_id or r.sample_id][i] = scalar_reward(r.reward, weights)
    return list(groups.values())
