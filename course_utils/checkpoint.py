"""Урок 12.5: полная контрольная точка RL-запуска.

``ToyRLRun`` — детерминированный учебный RL-запуск, всё его состояние — ``COMPONENTS``;
``save_checkpoint`` пишет атомарно (временный каталог, fsync, ``manifest.json`` с SHA-256 последним,
переименование); ``load_checkpoint`` / ``verify_checkpoint`` / ``latest_checkpoint`` /
``scan_checkpoints`` читают с проверкой (``CheckpointError``); ``resume_full`` и
``resume_weights_only`` — честное и нечестное восстановление; уровень C — ``checkpointed_trainer``
(процесс пишет точки и может убить себя SIGKILL). Проверка аварией — ``crash_test``, интервал
контрольных точек — ``checkpoint_interval``. torch, safetensors и pandas загружаются лениво.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import math
import numbers
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from course_utils import atomic
from course_utils.args import (
    integer,
    is_int,
    is_real,
    optional_integer,
    path as _path,
    positive,
    real,
)
from course_utils.fmt import count
from course_utils.offpolicy import grpo_loss

FORMAT = "course_utils.checkpoint/1"
MANIFEST = "manifest.json"
EVENTS_FILE = "events.jsonl"
ENVIRONMENT_VERSION = "toy-bandit-env/1"
ROLLOUT_SCHEMA = "toy-rollout/1"
PROMPT_FORMAT = "toy-features/1"
VERIFIER_VERSIONS = ("verifier-1", "verifier-2")

_NAME_RE = re.compile(r"^step-(\d{6,})$")
_TMP_PREFIX = ".tmp-"  # запись идёт (или прервана): файлы данных, manifest последним
_OLD_PREFIX = ".old-"  # прежняя копия, отодвинутая при overwrite=True до переименования новой
KIND_MAIN, KIND_TMP, KIND_OLD = "основной", "временный", "старая копия"
_COMPONENT_RE = re.compile(r"^[a-z][a-z0-9_]*$")

# Компонент состояния ToyRLRun → (что в нём, что ломается без него). Порядок — порядок записи.
COMPONENTS: dict[str, tuple[str, str]] = {
    "policy": (
        "параметры политики (веса MLP), safetensors",
        "без них продолжать нечего: политика начинает с нуля",
    ),
    "optimizer": (
        "состояние AdamW: моменты m и v, счётчик шагов, гиперпараметры",
        "«холодный» оптимизатор: поправка смещения Adam начинается заново, первые шаги после "
        "перезапуска другой величины",
    ),
    "scheduler": (
        "положение планировщика скорости обучения (прогрев, затем косинус)",
        "прогрев начинается заново: скорость обучения скачет вниз, траектория другая",
    ),
    "counters": (
        "глобальный шаг, версия политики, число созданных и потерянных роллаутов",
        "роллауты получают неверные версии, журнал перезаписывает старые шаги, задержка "
        "политики считается неверно",
    ),
    "rng": (
        "состояния генераторов: Python random (перемешивание мини-пакетов), NumPy (шум "
        "верификатора), torch (выбор действий)",
        "другие действия и другой порядок обновлений: запуск перестаёт быть воспроизводимым",
    ),
    "data_cursor": (
        "положение в потоке запросов: эпоха, индекс, сколько запросов прочитано",
        "запуск снова видит первые запросы: одни примеры повторяются, другие пропускаются",
    ),
    "curriculum": (
        "учебная программа: уровень сложности, скользящая доля успехов, шагов на уровне",
        "запуск откатывается к самому лёгкому уровню",
    ),
    "normalizer": (
        "нормировщик наград: число, среднее и M2 (Уэлфорд) для преимуществ",
        "преимущества нормируются по «пустой» статистике: масштаб обновления скачет",
    ),
    "versions": (
        "версии верификатора, среды, схемы роллаута, формата запросов, настройки "
        "декодирования и раскладка процессов",
        "новые роллауты оценивает старая проверяющая система, а награды разных версий "
        "смешиваются незаметно",
    ),
    "queue": (
        "очередь роллаутов «в полёте» (созданы, но ещё не обучены) с версиями поведения",
        "пакет в полёте теряется или создаётся заново другой политикой: данные обновления меняются",
    ),
}


def components_frame():
    """Таблица pandas компонентов полной контрольной точки, столбцы по-русски.

    «компонент» — ключ ``COMPONENTS`` (имя в ``state_dict``), «что в нём», «что ломается без него».
    """
    import pandas as pd

    rows = [
        {"компонент": k, "что в нём": w, "что ломается без него": m}
        for k, (w, m) in COMPONENTS.items()
    ]
    return pd.DataFrame(rows)


class CheckpointError(ValueError):
    """Контрольная точка не проходит проверку: нет файла, файл обрезан или изменён и т. п."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, file: str = ""):
        super().__init__(message)
        self.path = str(path) if path is not None else ""
        self.file = file


# ----------------------------------------------------------------------------- проверки входа


def count_steps(n: int) -> str:
    """«1 шаг», «3 шага», «12 шагов»."""
    return count(n, "шаг", "шага", "шагов")


def checkpoint_name(step: int) -> str:
    """Имя каталога контрольной точки шага step: "step-000012" (шесть и более цифр)."""
    step = integer("step", step, 0)
    return f"step-{step:06d}"


# ----------------------------------------------------------------------------- учебный запуск


def _toy_config(seed: Any, **kw: Any) -> dict:
    cfg = {
        "seed": integer("seed", seed, 0),
        "num_prompts": integer("num_prompts", kw.pop("num_prompts", 48), 3),
        "num_actions": integer("num_actions", kw.pop("num_actions", 4), 2),
        "feature_dim": integer("feature_dim", kw.pop("feature_dim", 8), 1),
        "hidden": integer("hidden", kw.pop("hidden", 16), 1),
        "batch_size": integer("batch_size", kw.pop("batch_size", 8), 1),
        "minibatches": integer("minibatches", kw.pop("minibatches", 2), 1),
        "lr": positive("lr", kw.pop("lr", 0.05)),
        "weight_decay": real("weight_decay", kw.pop("weight_decay", 0.01), 0.0, 1.0),
        "warmup_steps": integer("warmup_steps", kw.pop("warmup_steps", 3), 1),
        "decay_steps": integer("decay_steps", kw.pop("decay_steps", 60), 1),
        "clip_eps": real("clip_eps", kw.pop("clip_eps", 0.2), 0.0, 1.0, low_open=True),
        "verifier_noise": real("verifier_noise", kw.pop("verifier_noise", 0.05), 0.0, 0.5),
        "verifier_upgrade_step": optional_integer(
            "verifier_upgrade_step", kw.pop("verifier_upgrade_step", 10), 1
        ),
        "num_levels": integer("num_levels", kw.pop("num_levels", 3), 1),
        "promote_at": real("promote_at", kw.pop("promote_at", 0.6), 0.0, 1.0, low_open=True),
        "ema_alpha": real("ema_alpha", kw.pop("ema_alpha", 0.3), 0.0, 1.0, low_open=True),
    }
    if kw:
        raise ValueError(f"ToyRLRun: неизвестные параметры {sorted(kw)}")
    if cfg["batch_size"] % cfg["minibatches"]:
        raise ValueError(
            f"batch_size должно делиться на minibatches: {cfg['batch_size']=}, "
            f"{cfg['minibatches']=}"
        )
    if cfg["num_levels"] > cfg["num_prompts"]:
        raise ValueError(
            f"num_levels не может превышать num_prompts: {cfg['num_levels']=}, "
            f"{cfg['num_prompts']=}"
        )
    if cfg["decay_steps"] <= cfg["warmup_steps"]:
        raise ValueError(
            f"decay_steps должно быть больше warmup_steps: {cfg['decay_steps']=}, "
            f"{cfg['warmup_steps']=}"
        )
    return cfg


class ToyRLRun:
    """Учебный RL-запуск в одном процессе: детерминирован при данном seed, шаг — доли миллисекунды.

    Среда: пул из num_prompts «запросов» (векторы признаков) и правильное действие для каждого
    (argmax случайного «учителя»); сложность запроса — чем меньше отрыв лучшего действия от
    второго, тем труднее (num_levels уровней). Политика — MLP признаки → tanh → логиты действий.
    Верификатор "verifier-1" даёт награду 1 за правильное действие и 0 иначе; с вероятностью
    verifier_noise ошибается (награда 1 − r). После шага verifier_upgrade_step его заменяют на
    "verifier-2", который даёт ещё 0,25 за второе по качеству действие.

    Один шаг ``step()``: снять из очереди пакет, созданный на прошлом шаге (версией политики на 1
    меньше текущей), создать следующий пакет текущей политикой и положить в очередь (он «в полёте»),
    обучить на снятом пакете (PPO-клип с отношением вероятностей к политике поведения,
    преимущества нормированы текущим средним и σ наград, minibatches шагов AdamW в порядке,
    перемешанном Python random), шаг планировщика, версия политики + 1, обновить учебную
    программу (скользящая доля наград ≥ 1; при ≥ promote_at — уровень + 1).

    Генераторы случайных чисел — свои у каждого запуска (в настоящем тренере это глобальные
    random.getstate(), np.random.get_state(), torch.get_rng_state() и CUDA): так три ветви
    проверки аварией живут в одном процессе и не мешают друг другу.
    """

    def __init__(self, seed: int = 0, **kwargs: Any):
        import torch

        self.config = _toy_config(seed, **kwargs)
        c = self.config
        self._build_pool()
        self.policy = torch.nn.Sequential(
            torch.nn.Linear(c["feature_dim"], c["hidden"]),
            torch.nn.Tanh(),
            torch.nn.Linear(c["hidden"], c["num_actions"]),
        )
        init = torch.Generator().manual_seed(c["seed"] * 1000 + 1)
        with torch.no_grad():
            for layer, scale in ((self.policy[0], 1.0), (self.policy[2], 0.3)):
                fan_in = layer.weight.shape[1]
                w = torch.randn(layer.weight.shape, generator=init) * (scale / math.sqrt(fan_in))
                layer.weight.copy_(w)
                layer.bias.zero_()
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=c["lr"], weight_decay=c["weight_decay"]
        )
        warmup, decay = c["warmup_steps"], c["decay_steps"]

        def lr_factor(s: int) -> float:
            if s < warmup:
                return (s + 1) / warmup
            frac = min(1.0, (s - warmup) / (decay - warmup))
            return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor)
        self.py_rng = random.Random(c["seed"] * 1000 + 2)
        self.np_rng = np.random.default_rng([c["seed"], 3])
        self.torch_rng = torch.Generator().manual_seed(c["seed"] * 1000 + 4)
        self.global_step = 0
        self.policy_version = 0
        self.rollouts_generated = 0
        self.lost_rollouts = 0
        self.cursor = {"epoch": 0, "index": 0, "consumed": 0}
        self.curriculum = {"level": 0, "success_ema": 0.0, "steps_at_level": 0}
        self.normalizer = {"count": 0, "mean": 0.0, "m2": 0.0}
        self.verifier_version = VERIFIER_VERSIONS[0]
        self.queue: list[list[dict]] = []

    # --- среда (не состояние: восстанавливается из seed) ---

    def _build_pool(self) -> None:
        import torch

        c = self.config
        rng = np.random.default_rng([c["seed"], 10])
        x = rng.standard_normal((c["num_prompts"], c["feature_dim"]))
        teacher = rng.standard_normal((c["num_actions"], c["feature_dim"]))
        scores = x @ teacher.T
        order = np.argsort(-scores, axis=1, kind="stable")
        self._correct = [int(a) for a in order[:, 0]]
        self._second = [int(a) for a in order[:, 1]]
        margin = scores[np.arange(len(x)), order[:, 0]] - scores[np.arange(len(x)), order[:, 1]]
        difficulty = [0] * len(x)
        for rank, p in enumerate(np.argsort(-margin, kind="stable")):
            difficulty[int(p)] = rank * c["num_levels"] // len(x)
        self._difficulty = difficulty
        self._features = torch.tensor(x, dtype=torch.float32)
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            rng = np.random.default_rng([self.config["seed"], 20, epoch])
            self._perms = {epoch: [int(p) for p in rng.permutation(self.config["num_prompts"])]}
        return self._perms[epoch]

    def _next_prompts(self, n: int) -> list[int]:
        """n следующих запросов потока с учётом уровня: более трудные пропускаются."""
        out: list[int] = []
        cur = self.cursor
        while len(out) < n:
            p = self._perm(cur["epoch"])[cur["index"]]
            cur["index"] += 1
            cur["consumed"] += 1
            if cur["index"] == self.config["num_prompts"]:
                cur["epoch"] += 1
                cur["index"] = 0
            if self._difficulty[p] <= self.curriculum["level"]:
                out.append(p)
        return out

    def _score(self, prompt: int, action: int) -> float:
        if action == self._correct[prompt]:
            return 1.0
        if self.verifier_version == "verifier-2" and action == self._second[prompt]:
            return 0.25
        return 0.0

    # --- сборщик, верификатор, тренер ---

    def generate_batch(self) -> list[dict]:
        """Новый пакет роллаутов текущей политики, оценённый верификатором (сдвигает курсор и ГСЧ)."""
        import torch

        c = self.config
        prompts = self._next_prompts(c["batch_size"])
        with torch.no_grad():
            logp_all = torch.log_softmax(self.policy(self._features[prompts]), dim=-1)
            actions = torch.multinomial(logp_all.exp(), 1, generator=self.torch_rng).squeeze(1)
            logp = logp_all.gather(1, actions[:, None]).squeeze(1)
        noise = self.np_rng.random(len(prompts)) < c["verifier_noise"]
        batch = []
        for i, p in enumerate(prompts):
            a = int(actions[i])
            r = self._score(p, a)
            batch.append(
                {
                    "rollout_id": f"g{self.rollouts_generated + i:06d}",
                    "prompt_id": p,
                    "action": a,
                    "behavior_logprob": float(logp[i]),
                    "policy_version": self.policy_version,
                    "reward": 1.0 - r if noise[i] else r,
                    "verifier_version": self.verifier_version,
                }
            )
        self.rollouts_generated += len(batch)
        return batch

    def _train(self, batch: list[dict]) -> tuple[float, float]:
        import torch

        c = self.config
        norm = self.normalizer
        for ro in batch:  # Уэлфорд: среднее и M2 по всем наградам запуска
            norm["count"] += 1
            delta = ro["reward"] - norm["mean"]
            norm["mean"] += delta / norm["count"]
            norm["m2"] += delta * (ro["reward"] - norm["mean"])
        std = math.sqrt(norm["m2"] / norm["count"])
        adv = [(ro["reward"] - norm["mean"]) / std if std > 0 else 0.0 for ro in batch]
        order = list(range(len(batch)))
        self.py_rng.shuffle(order)
        size = len(batch) // c["minibatches"]
        lr = float(self.optimizer.param_groups[0]["lr"])
        losses = []
        for k in range(c["minibatches"]):
            idx = order[k * size : (k + 1) * size]
            x = self._features[[batch[i]["prompt_id"] for i in idx]]
            actions = torch.tensor([batch[i]["action"] for i in idx])
            old = torch.tensor([batch[i]["behavior_logprob"] for i in idx])
            a = torch.tensor([adv[i] for i in idx])
            logp = torch.log_softmax(self.policy(x), dim=-1).gather(1, actions[:, None])
            loss = grpo_loss(logp.squeeze(1), old, a, clip_eps=c["clip_eps"])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
        self.scheduler.step()
        self.policy_version += 1
        return sum(losses) / len(losses), lr

    def step(self) -> dict:
        """Один шаг запуска; возвращает событие (JSON-словарь), точно воспроизводимое при том же seed.

        Поля: step, prompt_ids / actions / rewards обученного пакета, behavior_version (версия
        политики, создавшей его), sampled_prompt_ids (пакет, ушедший «в полёт»), loss, lr
        (скорость обучения этого шага), policy_version (после обновления), verifier_version
        (оценивший пакет), curriculum_level (после шага), mean_reward, lost_rollouts.
        """
        if not self.queue:  # первый шаг или очередь потеряна: пакет создаётся сейчас
            self.queue.append(self.generate_batch())
        batch = self.queue.pop(0)
        self.queue.append(self.generate_batch())
        loss, lr = self._train(batch)
        self.global_step += 1
        rewards = [ro["reward"] for ro in batch]
        cur = self.curriculum
        success = sum(r >= 1.0 for r in rewards) / len(rewards)
        cur["success_ema"] = (1 - self.config["ema_alpha"]) * cur["success_ema"] + self.config[
            "ema_alpha"
        ] * success
        cur["steps_at_level"] += 1
        if cur["success_ema"] >= self.config["promote_at"] and (
            cur["level"] < self.config["num_levels"] - 1
        ):
            cur.update(level=cur["level"] + 1, success_ema=0.0, steps_at_level=0)
        if self.global_step == self.config["verifier_upgrade_step"]:
            self.verifier_version = VERIFIER_VERSIONS[1]
        return {
            "step": self.global_step,
            "prompt_ids": [ro["prompt_id"] for ro in batch],
            "actions": [ro["action"] for ro in batch],
            "rewards": rewards,
            "behavior_version": batch[0]["policy_version"],
            "sampled_prompt_ids": [ro["prompt_id"] for ro in self.queue[-1]],
            "loss": loss,
            "lr": lr,
            "policy_version": self.policy_version,
            "verifier_version": batch[0]["verifier_version"],
            "curriculum_level": cur["level"],
            "mean_reward": sum(rewards) / len(rewards),
            "lost_rollouts": self.lost_rollouts,
        }

    def drop_in_flight(self) -> list[str]:
        """Отказ сборщика: роллауты «в полёте» потеряны и учтены в lost_rollouts; их id.

        Запуск продолжается: следующий шаг создаст пакет заново текущей политикой. Курсор
        данных назад не откатывается: запросы потерянных роллаутов объявлены потерянными.
        """
        lost = [ro["rollout_id"] for b in self.queue for ro in b]
        self.lost_rollouts += len(lost)
        self.queue = []
        return lost

    # --- состояние ---

    def state_dict(self) -> dict:
        """Полное состояние запуска: словарь компонент → состояние; копия, не ссылки на живые тензоры.

        Компоненты: policy, optimizer, scheduler, counters, rng, data_cursor, curriculum,
        normalizer, versions, queue. Что в каждом и что ломается без него — ``COMPONENTS``
        (таблицей — ``components_frame()``).
        """
        return {
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "counters": {
                "global_step": self.global_step,
                "policy_version": self.policy_version,
                "rollouts_generated": self.rollouts_generated,
                "lost_rollouts": self.lost_rollouts,
            },
            "rng": {
                "python": self.py_rng.getstate(),
                "numpy": copy.deepcopy(self.np_rng.bit_generator.state),
                "torch": self.torch_rng.get_state(),
            },
            "data_cursor": dict(self.cursor),
            "curriculum": dict(self.curriculum),
            "normalizer": dict(self.normalizer),
            "versions": {
                "verifier": self.verifier_version,
                "environment": ENVIRONMENT_VERSION,
                "rollout_schema": ROLLOUT_SCHEMA,
                "prompt_format": PROMPT_FORMAT,
                "decoding": {"temperature": 1.0, "top_p": 1.0},
                "layout": {"world_size": 1, "data_parallel": 1},
            },
            "queue": {"on_restore": "keep", "batches": copy.deepcopy(self.queue)},
        }

    def weights_only_state(self) -> dict:
        """Только параметры политики {"policy": {имя: тензор}} — всё, что есть у восстановления «только веса»."""
        return {"policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()}}

    def load_weights_only(self, state: Mapping) -> None:
        """Загружает только веса политики (state = {"policy": ...} или сам словарь весов)."""
        if not isinstance(state, Mapping):
            raise ValueError(f"state должно быть словарём, получено {type(state).__name__}")
        weights = state["policy"] if "policy" in state else state
        self.policy.load_state_dict(dict(weights))

    def load_state_dict(self, state: Mapping, queue: str | None = None) -> None:
        """Восстанавливает всё из state_dict(): сначала проверяет все компоненты, потом загружает.

        queue — что делать с пакетами «в полёте»: "keep" — вернуть в очередь (продолжение
        побитово совпадает), "drop" — явно отбросить и учесть в lost_rollouts (продолжение уже
        другое); None — политика, объявленная в самой контрольной точке (queue.on_restore).
        ValueError называет отсутствующие компоненты и поля, чужие версии среды и схемы.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"state должно быть словарём, получено {type(state).__name__}")
        missing = [c for c in COMPONENTS if c not in state]
        unknown = [c for c in state if c not in COMPONENTS]
        if missing or unknown:
            parts = []
            if missing:
                parts.append("нет компонентов: " + ", ".join(missing))
            if unknown:
                parts.append("неизвестные компоненты: " + ", ".join(map(str, unknown)))
            raise ValueError(
                "load_state_dict: " + "; ".join(parts) + " — честное продолжение невозможно"
            )
        versions = _take(
            state["versions"],
            "versions",
            ("verifier", "environment", "rollout_schema", "prompt_format"),
        )
        for key, expected in (
            ("environment", ENVIRONMENT_VERSION),
            ("rollout_schema", ROLLOUT_SCHEMA),
            ("prompt_format", PROMPT_FORMAT),
        ):
            if versions[key] != expected:
                raise ValueError(
                    f"load_state_dict: версия {key} в состоянии {versions[key]!r}, а код "
                    f"ожидает {expected!r}: это уже другой эксперимент"
                )
        if versions["verifier"] not in VERIFIER_VERSIONS:
            raise ValueError(f"load_state_dict: неизвестный верификатор {versions['verifier']!r}")
        counters = _take(
            state["counters"],
            "counters",
            ("global_step", "policy_version", "rollouts_generated", "lost_rollouts"),
        )
        rng = _take(state["rng"], "rng", ("python", "numpy", "torch"))
        cursor = _take(state["data_cursor"], "data_cursor", ("epoch", "index", "consumed"))
        curriculum = _take(
            state["curriculum"], "curriculum", ("level", "success_ema", "steps_at_level")
        )
        normalizer = _take(state["normalizer"], "normalizer", ("count", "mean", "m2"))
        saved_queue = _take(state["queue"], "queue", ("batches",))
        policy = state["queue"].get("on_restore", "keep") if queue is None else queue
        if policy not in ("keep", "drop"):
            raise ValueError(f"queue должно быть 'keep', 'drop' или None, получено {policy!r}")
        batches = list(saved_queue["batches"])

        self.policy.load_state_dict(dict(state["policy"]))
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.scheduler.load_state_dict(copy.deepcopy(state["scheduler"]))
        self.global_step = counters["global_step"]
        self.policy_version = counters["policy_version"]
        self.rollouts_generated = counters["rollouts_generated"]
        self.lost_rollouts = counters["lost_rollouts"]
        self.py_rng.setstate(rng["python"])
        self.np_rng.bit_generator.state = rng["numpy"]
        self.torch_rng.set_state(rng["torch"].clone())
        self.cursor = cursor
        self.curriculum = curriculum
        self.normalizer = normalizer
        self.verifier_version = versions["verifier"]
        if policy == "drop":
            self.lost_rollouts += sum(len(b) for b in batches)
            batches = []
        self.queue = batches


def _take(obj: Any, name: str, keys: Sequence[str]) -> dict:
    if not isinstance(obj, Mapping):
        raise ValueError(f"load_state_dict: компонент {name} должен быть словарём")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"load_state_dict: в компоненте {name} нет полей {missing}")
    return {k: copy.deepcopy(obj[k]) for k in keys}


# ----------------------------------------------------------------------------- кодирование состояния

_TENSOR, _TUPLE, _ITEMS, _FLOAT = "__tensor__", "__tuple__", "__items__", "__float__"


def _encode(obj: Any, where: str, tensors: dict) -> Any:
    """Состояние → JSON-скелет; тензоры уходят в tensors под именем-путём ("state/0/exp_avg")."""
    import torch

    if isinstance(obj, torch.Tensor):
        name = where or "tensor"
        if name in tensors:
            raise ValueError(f"save_checkpoint: два тензора с одним именем {name!r}")
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {_TENSOR: name}
    if obj is None or isinstance(obj, bool | str):
        return obj
    if is_int(obj):
        return int(obj)
    if isinstance(obj, numbers.Real):
        value = float(obj)
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, f"{where}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{where}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, f"{where}/{k}" if where else k, tensors) for k, v in obj.items()}
        items = []
        for k, v in obj.items():
            key = _encode(k, "", {})
            if isinstance(key, dict) and _TENSOR in key:
                raise ValueError("save_checkpoint: тензор не может быть ключом словаря")
            items.append([key, _encode(v, f"{where}/{k}" if where else str(k), tensors)])
        return {_ITEMS: items}
    raise ValueError(
        f"save_checkpoint: значение типа {type(obj).__name__} в {where or 'состоянии'} не "
        f"сохраняется: допустимы тензоры, числа, строки, None, списки, кортежи и словари"
    )


def _decode(obj: Any, tensors: Mapping, path: Path, fname: str) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, path, fname) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if key == _TENSOR:
            if value not in tensors:
                raise CheckpointError(
                    f"Контрольная точка {path}: файл {fname} ссылается на тензор {value!r}, "
                    f"которого нет в .safetensors",
                    path,
                    fname,
                )
            return tensors[value]
        if key == _TUPLE:
            return tuple(_decode(v, tensors, path, fname) for v in value)
        if key == _FLOAT:
            if value not in ("nan", "inf", "-inf"):
                raise CheckpointError(
                    f"Контрольная точка {path}: файл {fname}: неверная запись числа {value!r}",
                    path,
                    fname,
                )
            return float(value)
        if key == _ITEMS:
            out = {}
            for k, v in value:
                k = _decode(k, {}, path, fname)
                out[k] = _decode(v, tensors, path, fname)
            return out
    return {k: _decode(v, tensors, path, fname) for k, v in obj.items()}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def config_hash(config: Any) -> str | None:
    """SHA-256 (hex) канонического JSON конфигурации (ключи по алфавиту); None для None."""
    if config is None:
        return None
    try:
        return hashlib.sha256(_canonical(config)).hexdigest()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config должно быть JSON-сериализуемым словарём: {exc}") from exc


# ----------------------------------------------------------------------------- запись


def _software() -> dict:
    import safetensors
    import torch

    from course_utils import __version__

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "course_utils": __version__,
    }


def _manifest_self_hash(manifest: Mapping) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical(body)).hexdigest()


def _dir_kind(name: str) -> str:
    """Вид каталога в root по имени: KIND_TMP (".tmp-…"), KIND_OLD (".old-…") или KIND_MAIN."""
    if name.startswith(_TMP_PREFIX):
        return KIND_TMP
    if name.startswith(_OLD_PREFIX):
        return KIND_OLD
    return KIND_MAIN


def _publishable(name: Any) -> bool:
    """Имя, под которым контрольная точка лежит в root: не пустое, без "/" и не с точки."""
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
    )


def _publish(src: Path, target: Path) -> None:
    """Ставит полную копию src на место target; в любой момент на диске есть полная копия.

    Если target уже есть: 1) target → ".old-<имя>-…" (полная, её находит latest_checkpoint),
    2) src → target, 3) удаление ".old-…". Убийство между шагами оставляет две полные копии
    или одну, не ноль; исключение на шаге 2 возвращает старую копию на место.
    """
    aside = None
    if target.exists():
        aside = target.with_name(f"{_OLD_PREFIX}{target.name}-{secrets.token_hex(4)}")
        while aside.exists():
            aside = target.with_name(f"{_OLD_PREFIX}{target.name}-{secrets.token_hex(4)}")
        os.replace(target, aside)
        atomic.fsync_dir(target.parent)
    try:
        os.replace(src, target)
    except BaseException:
        if aside is not None and not target.exists():
            os.replace(aside, target)
            atomic.fsync_dir(target.parent)
        raise
    atomic.fsync_dir(target.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)  # недоудалённую добьёт remove_incomplete


def save_checkpoint(
    state: Mapping,
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    overwrite: bool = False,
    after_file: Callable[[str], None] | None = None,
) -> Path:
    """Атомарно пишет контрольную точку state (компонент → состояние) в каталог path; его Path.

    Порядок: временный каталог рядом с path (".tmp-<имя>-…"), по компоненту файлы
    <компонент>.safetensors (тензоры) и <компонент>.json (остальное), fsync каждого файла,
    затем manifest.json (компоненты, размеры в байтах, SHA-256 файлов, хэш config, версии,
    шаг, время создания) последним, fsync каталога, переименование в path и fsync родителя.
    Сбой до manifest оставляет только недописанный временный каталог, который пропускают
    ``latest_checkpoint`` и удаляет ``remove_incomplete``. overwrite=True заменяет прежнюю
    копию так, что полная копия есть на диске в любой момент: прежняя отодвигается в
    ".old-<имя>-…" и удаляется только после того, как новая встала на место.
    Имя каталога — любое, кроме начинающихся с точки (они заняты временными каталогами);
    новизну ``latest_checkpoint`` определяет по шагу в manifest, а не по имени.
    Шаг и версии берутся из компонентов "counters" и "versions", если они есть.
    after_file(имя) вызывается после каждого записанного файла данных (для опытов с аварией).
    """
    import safetensors.torch

    target = _path("path", path)
    if not _publishable(target.name):
        raise ValueError(
            f"path: имя каталога {target.name!r} не годится — нужно непустое имя; имена с точки "
            f"в начале заняты временными каталогами ({_TMP_PREFIX}…, {_OLD_PREFIX}…). Например: "
            f"{checkpoint_name(0)!r}"
        )
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"state должно быть непустым словарём компонентов, получено {type(state)}")
    bad = [c for c in state if not isinstance(c, str) or not _COMPONENT_RE.match(c)]
    if bad or "manifest" in state:
        raise ValueError(
            f"state: имена компонентов — строчные латинские буквы, цифры и _, не 'manifest'; "
            f"получено {bad or ['manifest']}"
        )
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"config должно быть словарём или None, получено {type(config)}")
    if after_file is not None and not callable(after_file):
        raise ValueError("after_file должно быть функцией или None")
    chash = config_hash(dict(config) if config is not None else None)
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"Контрольная точка {target} уже существует; overwrite=True заменит её"
        )
    target.parent.mkdir(parents=True, exist_ok=True)

    # Кодируем всё до создания каталога: ошибка типа не оставит мусора.
    encoded: dict[str, tuple[bytes, bytes | None]] = {}
    for comp, value in state.items():
        tensors: dict = {}
        skeleton = _encode(value, "", tensors)
        js = json.dumps(skeleton, ensure_ascii=False, indent=1, allow_nan=False).encode()
        st = safetensors.torch.save(tensors) if tensors else None
        encoded[comp] = (js, st)

    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{target.name}-", dir=target.parent))
    try:
        files: dict[str, dict] = {}
        components: dict[str, list[str]] = {}
        for comp, (js, st) in encoded.items():
            names = []
            for fname, data in ((f"{comp}.safetensors", st), (f"{comp}.json", js)):
                if data is None:
                    continue
                atomic.write_synced(tmp / fname, data)
                files[fname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                names.append(fname)
                if after_file is not None:
                    after_file(fname)
            components[comp] = names
        counters = state.get("counters")
        step = counters.get("global_step") if isinstance(counters, Mapping) else None
        versions = state.get("versions") if isinstance(state.get("versions"), Mapping) else {}
        if isinstance(counters, Mapping) and "policy_version" in counters:
            versions = {"policy_version": counters["policy_version"], **versions}
        now = time.time()
        manifest = {
            "format": FORMAT,
            "name": target.name,
            "step": step,
            "created_unix": now,
            "created_utc": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(),
            "config": dict(config) if config is not None else None,
            "config_sha256": chash,
            "versions": json.loads(json.dumps(_encode(versions, "", {}))),
            "software": _software(),
            "components": components,
            "files": files,
            "total_bytes": sum(f["bytes"] for f in files.values()),
        }
        manifest["manifest_sha256"] = _manifest_self_hash(manifest)
        atomic.write_synced(
            tmp / MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode()
        )
        atomic.fsync_dir(tmp)
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# ----------------------------------------------------------------------------- чтение


def _fail(path: Path, text: str, file: str = "") -> CheckpointError:
    return CheckpointError(f"Контрольная точка {path}: {text}", path, file)


def _required(components: Any) -> tuple[str, ...] | None:
    """Аргумент components: None (любой набор) или имена обязательных компонентов."""
    if components is None:
        return None
    names = (
        tuple(components)
        if isinstance(components, Iterable) and not isinstance(components, str | bytes)
        else None
    )
    if names is None or not all(isinstance(c, str) for c in names):
        raise ValueError(
            f"components должно быть набором имён компонентов (строк) или None, "
            f"получено {components!r}"
        )
    return names


def _read_manifest(path: Path) -> dict:
    if not path.is_dir():
        raise _fail(path, "каталога нет или это не каталог")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise _fail(
            path,
            f"нет файла {MANIFEST}: запись не завершена (manifest пишется последним) или это не "
            f"контрольная точка",
            MANIFEST,
        )
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except OSError as exc:  # каталог удалили между проверкой и чтением
        raise _fail(path, f"файл {MANIFEST} не читается: {exc}", MANIFEST) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, f"файл {MANIFEST} повреждён: это не JSON ({exc})", MANIFEST) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise _fail(
            path, f"файл {MANIFEST}: неизвестный формат {got!r}, ожидался {FORMAT!r}", MANIFEST
        )
    if manifest.get("manifest_sha256") != _manifest_self_hash(manifest):
        raise _fail(path, f"файл {MANIFEST} изменён: его собственная SHA-256 не сходится", MANIFEST)
    files, comps = manifest.get("files"), manifest.get("components")
    if not isinstance(files, dict) or not isinstance(comps, dict):
        raise _fail(path, f"файл {MANIFEST}: нет списков files и components", MANIFEST)
    for fname, meta in files.items():
        if (
            not isinstance(meta, dict)
            or not is_int(meta.get("bytes"))
            or not isinstance(meta.get("sha256"), str)
        ):
            raise _fail(path, f"файл {MANIFEST}: для {fname} нет размера и SHA-256", MANIFEST)
    for comp, names in comps.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _fail(path, f"файл {MANIFEST}: у компонента {comp} нет списка файлов", MANIFEST)
        for fname in names:
            if fname not in files:
                raise _fail(
                    path,
                    f"файл {MANIFEST}: компонент {comp} ссылается на {fname}, которого нет в files",
                    MANIFEST,
                )
    for fname in files:
        if "/" in fname or "\\" in fname or fname.startswith(".") or fname == MANIFEST:
            raise _fail(path, f"файл {MANIFEST}: недопустимое имя файла {fname!r}", MANIFEST)
    return manifest


def _check_config(path: Path, manifest: Mapping, config: Mapping | None) -> None:
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise ValueError(f"config должно быть словарём или None, получено {type(config)}")
    if config_hash(dict(config)) == manifest.get("config_sha256"):
        return
    saved = manifest.get("config") or {}
    diffs = [
        f"{k}: {saved.get(k, '—')!r} → {config.get(k, '—')!r}"
        for k in sorted(set(saved) | set(config), key=str)
        if saved.get(k, "—") != config.get(k, "—")
    ]
    detail = "; ".join(diffs) if diffs else "хэш не совпадает"
    raise _fail(
        path,
        f"конфигурация запуска не совпадает с записанной в {MANIFEST} (было → сейчас): {detail}",
        MANIFEST,
    )


def _check_components(path: Path, manifest: Mapping, components: tuple[str, ...] | None) -> None:
    missing = [c for c in components or () if c not in manifest["components"]]
    if missing:
        raise _fail(
            path,
            f"в {MANIFEST} нет компонентов: {', '.join(missing)} — состояние неполное, честное "
            f"продолжение невозможно",
            MANIFEST,
        )


def _read_verified(
    path: Path, config: Mapping | None, components: tuple[str, ...] | None = None
) -> tuple[dict, dict[str, bytes]]:
    manifest = _read_manifest(path)
    _check_config(path, manifest, config)
    _check_components(path, manifest, components)
    blobs: dict[str, bytes] = {}
    for fname, meta in manifest["files"].items():
        fpath = path / fname
        if not fpath.is_file():
            raise _fail(path, f"нет файла {fname}, указанного в {MANIFEST}", fname)
        try:
            data = fpath.read_bytes()
        except OSError as exc:
            raise _fail(path, f"файл {fname} не читается: {exc}", fname) from None
        if len(data) != meta.get("bytes"):
            what = "обрезан" if len(data) < meta.get("bytes", 0) else "длиннее записанного"
            raise _fail(
                path,
                f"файл {fname} {what}: {len(data)} Б вместо {meta.get('bytes')} Б по {MANIFEST}",
                fname,
            )
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise _fail(
                path,
                f"файл {fname}: SHA-256 не совпадает с {MANIFEST} — файл изменён или повреждён",
                fname,
            )
        blobs[fname] = data
    return manifest, blobs


def _load_state(
    path: Path, config: Mapping | None, components: tuple[str, ...] | None
) -> tuple[dict, dict[str, Any]]:
    """Всё, что проверяет load_checkpoint, и разобранное состояние: (manifest, state)."""
    import safetensors.torch

    manifest, blobs = _read_verified(path, config, components)
    state: dict[str, Any] = {}
    for comp, names in manifest["components"].items():
        tensors: dict = {}
        skeleton: Any = None
        for fname in names:
            try:
                if fname.endswith(".safetensors"):
                    tensors = safetensors.torch.load(blobs[fname])
                elif fname.endswith(".json"):
                    skeleton = json.loads(blobs[fname].decode("utf-8"))
            except Exception as exc:
                raise _fail(
                    path, f"файл {fname} не читается: {type(exc).__name__}: {exc}", fname
                ) from None
        if skeleton is None:
            raise _fail(path, f"у компонента {comp} нет файла {comp}.json", MANIFEST)
        try:
            state[comp] = _decode(skeleton, tensors, path, f"{comp}.json")
        except CheckpointError:
            raise
        except (TypeError, ValueError) as exc:
            raise _fail(
                path, f"файл {comp}.json: неверная структура ({exc})", f"{comp}.json"
            ) from None
    return manifest, state


def verify_checkpoint(
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> dict:
    """Проверяет каталог контрольной точки и возвращает её manifest; иначе CheckpointError.

    Проверяет ровно то же, что ``load_checkpoint`` (проходит одна — пройдёт и другая):
    manifest.json есть, это JSON нашего формата и его собственная SHA-256 сходится; каждый
    файл из manifest есть, его размер (байты) и SHA-256 совпадают, JSON и safetensors
    разбираются, ссылки на тензоры целы; если задан config — его хэш совпадает с записанным
    (в сообщении — какие ключи различаются); если заданы components — все они есть.
    """
    manifest, _ = _load_state(_path("path", path), config, _required(components))
    return manifest


def read_manifest(path: str | os.PathLike) -> dict:
    """manifest.json контрольной точки (без проверки файлов данных); CheckpointError, если его нет."""
    return _read_manifest(_path("path", path))


def load_checkpoint(
    path: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> dict:
    """Читает проверенную контрольную точку: словарь компонент → состояние (как в save_checkpoint).

    Проверки — как у ``verify_checkpoint`` (размеры, SHA-256, config), разбор — из уже
    проверенных байтов. components — обязательные компоненты (например ``COMPONENTS`` для
    полного восстановления ToyRLRun): если какого-то нет в manifest — CheckpointError, а не
    неполное состояние. pickle и torch.load не используются: произвольные объекты из файла не
    создаются. Весь каталог читается в память — для учебных размеров.
    """
    _, state = _load_state(_path("path", path), config, _required(components))
    return state


def _created(manifest: Mapping) -> float:
    created = manifest.get("created_unix")
    return float(created) if is_real(created) else 0.0


def _order_key(entry: Path, manifest: Mapping | None) -> tuple[int, bool, float, str]:
    """Ключ новизны: (шаг, основной ли каталог, время создания, имя); больше — новее.

    Шаг — из manifest; если там его нет — из имени "step-NNNNNN" (каталога или записанного в
    manifest), иначе −1. При равном шаге основной каталог идёт раньше копий ".tmp-…"/".old-…".
    """
    manifest = manifest or {}
    step = manifest.get("step")
    if not is_int(step):
        m = _NAME_RE.match(entry.name) or _NAME_RE.match(str(manifest.get("name", "")))
        step = int(m.group(1)) if m else -1
    return int(step), _dir_kind(entry.name) == KIND_MAIN, _created(manifest), entry.name


def _candidates(root: Path) -> list[Path]:
    """Подкаталоги root с читаемым manifest.json, от новых к старым (ключ ``_order_key``)."""
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            if not entry.is_dir():
                continue
            try:
                manifest = _read_manifest(entry)
            except CheckpointError:
                continue
            found.append((_order_key(entry, manifest), entry))
    return [entry for _, entry in sorted(found, key=lambda x: x[0], reverse=True)]


_UNFINISHED = {
    KIND_TMP: "временный каталог: запись не завершена",
    KIND_OLD: "старая копия, отодвинутая при замене: удалена не до конца",
}


def scan_checkpoints(
    root: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
):
    """Таблица pandas каталогов контрольных точек в root, новые сверху (порядок latest_checkpoint).

    В таблице — каталоги с manifest.json, каталоги "step-NNNNNN" и временные ".tmp-…"/".old-…".
    Столбцы: name, step (из manifest, иначе из имени), ok (примет ли load_checkpoint с этими
    config и components), problem (сообщение по-русски), total_bytes (байты по manifest),
    kind ("основной", "временный" — запись идёт или прервана, "старая копия" — отодвинута
    при overwrite), created_utc. Первая строка с ok — то, что вернёт ``latest_checkpoint``.
    У непроверенных временных каталогов step пуст: это незавершённые записи.
    """
    import pandas as pd

    root = _path("root", root)
    components = _required(components)
    rows = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        kind = _dir_kind(entry.name)
        if not entry.is_dir() or (
            kind == KIND_MAIN and not _NAME_RE.match(entry.name) and not (entry / MANIFEST).exists()
        ):
            continue
        manifest, ok, problem = None, True, ""
        try:
            manifest, _ = _load_state(entry, config, components)
        except CheckpointError as exc:
            ok, problem = False, str(exc)
            with contextlib.suppress(CheckpointError):
                manifest = _read_manifest(entry) if kind == KIND_MAIN else None
        if not ok and kind != KIND_MAIN:
            problem = f"{_UNFINISHED[kind]} — {problem}"
        key = _order_key(entry, manifest)
        rows.append(
            {
                "name": entry.name,
                "step": key[0] if key[0] >= 0 and (ok or kind == KIND_MAIN) else None,
                "ok": ok,
                "problem": problem,
                "total_bytes": manifest.get("total_bytes") if ok else None,
                "kind": kind,
                "created_utc": manifest.get("created_utc") if manifest else None,
                "_key": key if ok or kind == KIND_MAIN else (-1, False, 0.0, entry.name),
            }
        )
    rows.sort(key=lambda r: r["_key"], reverse=True)
    columns = ["name", "step", "ok", "problem", "total_bytes", "kind", "created_utc"]
    frame = pd.DataFrame([{k: r[k] for k in columns} for r in rows], columns=columns)
    return frame.astype({"step": "Int64", "total_bytes": "Int64"})


def latest_checkpoint(
    root: str | os.PathLike,
    config: Mapping | None = None,
    *,
    components: Iterable[str] | None = None,
) -> Path | None:
    """Самая новая контрольная точка в root, которую примет ``load_checkpoint``; иначе None.

    Проверка — та же, что у ``load_checkpoint(путь, config, components=components)``.
    Кандидаты — все подкаталоги root с manifest.json под любым именем, в том числе полные копии
    ".tmp-…" и ".old-…", оставшиеся от записи, убитой посреди замены. Новизна — по шагу в
    manifest (без шага — по имени "step-NNNNNN"), при равном шаге основной каталог раньше
    копий, затем более новая. Недописанные, повреждённые, неразбираемые, с чужим config или без
    обязательного компонента — пропускаются: перезапуск откатывается к предыдущей годной.
    """
    root = _path("root", root)
    components = _required(components)
    for entry in _candidates(root):
        try:
            _load_state(entry, config, components)
        except CheckpointError:
            continue
        return entry
    return None


def _remove(entry: Path, removed: list[str]) -> None:
    shutil.rmtree(entry, ignore_errors=True)
    removed.append(entry.name)


def remove_incomplete(root: str | os.PathLike) -> list[str]:
    """Доводит до конца прерванные записи в root и возвращает имена удалённых каталогов.

    Временный ".tmp-…" или старый ".old-…" каталог, который не проходит ``verify_checkpoint``, —
    недописанная запись или недоудалённая копия: удаляется. Полная копия не удаляется, пока она
    самая новая под своим именем (manifest["name"]): её ставят на место (root/имя) той же
    безопасной заменой, что в save_checkpoint. Удаляются лишь полные копии старше полной копии
    под тем же именем — ровно то, что сделала бы завершённая запись с overwrite=True.
    Вызывать, только когда в root не пишет ни один другой процесс.
    """
    root = _path("root", root)
    removed: list[str] = []
    copies: dict[str, list[tuple[float, Path]]] = {}
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if not entry.is_dir() or _dir_kind(entry.name) == KIND_MAIN:
            continue
        try:
            manifest = verify_checkpoint(entry)
        except CheckpointError:
            _remove(entry, removed)
            continue
        if _publishable(manifest.get("name")):  # иначе не трогаем: её найдёт latest_checkpoint
            copies.setdefault(manifest["name"], []).append((_created(manifest), entry))
    for name, found in sorted(copies.items()):
        found.sort()
        (created, newest), older = found[-1], found[:-1]
        target = root / name
        try:
            current = _created(verify_checkpoint(target))
        except CheckpointError:
            current = None  # под именем ничего нет или копия там не полная
        if current is None or current < created:
            _publish(newest, target)
        else:
            older.append((created, newest))
        for _, entry in older:
            _remove(entry, removed)
    return removed


# ----------------------------------------------------------------------------- восстановление


def resume_full(
    run_factory: Callable[[], ToyRLRun], checkpoint_path: str | os.PathLike
) -> ToyRLRun:
    """Честное восстановление: свежий запуск из run_factory() и всё его состояние из контрольной точки."""
    run = run_factory()
    run.load_state_dict(load_checkpoint(checkpoint_path, config=run.config, components=COMPONENTS))
    return run


def resume_weights_only(
    run_factory: Callable[[], ToyRLRun], checkpoint_path: str | os.PathLike
) -> ToyRLRun:
    """Нечестное восстановление: только веса политики; остальное — как у нового запуска.

    Номер шага и версия политики берутся из manifest (как скрипт, читающий шаг из имени
    каталога), поэтому журнал сравним по шагам; оптимизатор, планировщик, ГСЧ, курсор данных,
    учебная программа, нормировщик, верификатор и очередь — свежие.
    """
    run = run_factory()
    state = load_checkpoint(checkpoint_path, config=run.config, components=("policy",))
    run.load_weights_only(state)
    step = read_manifest(checkpoint_path).get("step") or 0
    run.global_step = run.policy_version = int(step)
    return run


def remove_checkpoints(root: str | os.PathLike) -> None:
    """Удаляет из root все контрольные точки: полные (каталоги с manifest.json или step-…),
    недописанные ".tmp-…" и отодвинутые ".old-…"; прочие каталоги и файлы не трогает."""
    for old in _path("root", root).iterdir():
        if old.is_dir() and (
            _NAME_RE.match(old.name)
            or _dir_kind(old.name) != KIND_MAIN
            or (old / MANIFEST).exists()
        ):
            shutil.rmtree(old)
