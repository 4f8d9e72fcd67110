"""Урок 12.5: учебный RL-запуск ``ToyRLRun`` — на нём проверяются контрольная точка и авария;
всё его состояние — компоненты ``checkpoint.COMPONENTS``."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from course_utils.args import choice, integer, optional_integer, positive, real
from course_utils.checkpoint import COMPONENTS
from course_utils.offpolicy import grpo_loss

# Версии среды, схемы роллаута и формата запроса: чужая версия в состоянии — другой эксперимент.
_FIXED_VERSIONS = {
    "environment": "toy-bandit-env/1",
    "rollout_schema": "toy-rollout/1",
    "prompt_format": "toy-features/1",
}
_VERIFIER_VERSIONS = ("verifier-1", "verifier-2")
_COUNTERS = ("global_step", "policy_version", "rollouts_generated", "lost_rollouts")


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
    for a, b, broken, rule in (
        ("batch_size", "minibatches", cfg["batch_size"] % cfg["minibatches"], "делиться на"),
        ("num_levels", "num_prompts", cfg["num_levels"] > cfg["num_prompts"], "быть не больше"),
        ("decay_steps", "warmup_steps", cfg["decay_steps"] <= cfg["warmup_steps"], "быть больше"),
    ):
        if broken:
            raise ValueError(f"{a} должно {rule} {b}: {a} = {cfg[a]}, {b} = {cfg[b]}")
    return cfg


class ToyRLRun:
    """Учебный RL-запуск в одном процессе: детерминирован при данном seed, шаг — доли миллисекунды.

    Среда: num_prompts «запросов» (векторы признаков), правильное действие — argmax случайного
    «учителя», уровень сложности — по отрыву лучшего действия от второго. Политика — MLP.
    Верификатор "verifier-1": награда 1 за правильное действие, иначе 0, с вероятностью
    verifier_noise — 1 − r; после шага verifier_upgrade_step "verifier-2" даёт ещё 0,25 за второе.
    Шаг ``step()``: обучение (PPO-клип, AdamW) на пакете, созданном на прошлом шаге, пока новый
    пакет «в полёте». Генераторы случайных чисел — свои у запуска (в настоящем тренере —
    глобальные): три ветви проверки аварией живут в одном процессе.
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
        self.verifier_version = _VERIFIER_VERSIONS[0]
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
        self._correct = order[:, 0].tolist()
        self._second = order[:, 1].tolist()
        margin = scores[np.arange(len(x)), order[:, 0]] - scores[np.arange(len(x)), order[:, 1]]
        rank = np.argsort(np.argsort(-margin, kind="stable"), kind="stable")  # 0 — самый лёгкий
        self._difficulty = (rank * c["num_levels"] // len(x)).tolist()
        self._features = torch.tensor(x, dtype=torch.float32)
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            rng = np.random.default_rng([self.config["seed"], 20, epoch])
            self._perms = {epoch: rng.permutation(self.config["num_prompts"]).tolist()}
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
        """Один шаг: снять пакет прошлого шага из очереди, создать и поставить в очередь новый,
        обучить на снятом, версия политики + 1, учебная программа (при скользящей доле успехов
        ≥ promote_at — уровень + 1). Событие — JSON-словарь, воспроизводимый при том же seed."""
        if not self.queue:  # первый шаг или очередь потеряна: пакет создаётся сейчас
            self.queue.append(self.generate_batch())
        batch = self.queue.pop(0)
        self.queue.append(self.generate_batch())
        loss, lr = self._train(batch)
        self.global_step += 1
        rewards = [ro["reward"] for ro in batch]
        cur, c = self.curriculum, self.config
        success = sum(r >= 1.0 for r in rewards) / len(rewards)  # доля наград ≥ 1
        cur["success_ema"] = (1 - c["ema_alpha"]) * cur["success_ema"] + c["ema_alpha"] * success
        cur["steps_at_level"] += 1
        if cur["success_ema"] >= c["promote_at"] and cur["level"] < c["num_levels"] - 1:
            cur.update(level=cur["level"] + 1, success_ema=0.0, steps_at_level=0)
        if self.global_step == c["verifier_upgrade_step"]:
            self.verifier_version = _VERIFIER_VERSIONS[1]
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
        """Полное состояние: компонент из ``checkpoint.COMPONENTS`` → копия (не живые тензоры)."""
        return {
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "counters": {k: getattr(self, k) for k in _COUNTERS},
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
                **_FIXED_VERSIONS,
                "decoding": {"temperature": 1.0, "top_p": 1.0},
                "layout": {"world_size": 1, "data_parallel": 1},
            },
            "queue": {"on_restore": "keep", "batches": copy.deepcopy(self.queue)},
        }

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
        unknown = [str(c) for c in state if c not in COMPONENTS]
        if missing or unknown:
            parts = [f"нет компонентов: {', '.join(missing)}"] if missing else []
            parts += [f"неизвестные компоненты: {', '.join(unknown)}"] if unknown else []
            raise ValueError(
                f"load_state_dict: {'; '.join(parts)} — честное продолжение невозможно"
            )
        versions = _take(state, "versions", "verifier", *_FIXED_VERSIONS)
        for key, expected in _FIXED_VERSIONS.items():
            if versions[key] != expected:
                raise ValueError(
                    f"load_state_dict: версия {key} в состоянии {versions[key]!r}, а код "
                    f"ожидает {expected!r}: это уже другой эксперимент"
                )
        choice("versions['verifier']", versions["verifier"], _VERIFIER_VERSIONS)
        counters = _take(state, "counters", *_COUNTERS)
        rng = _take(state, "rng", "python", "numpy", "torch")
        cursor = _take(state, "data_cursor", "epoch", "index", "consumed")
        curriculum = _take(state, "curriculum", "level", "success_ema", "steps_at_level")
        normalizer = _take(state, "normalizer", "count", "mean", "m2")
        batches = list(_take(state, "queue", "batches")["batches"])
        on_restore = state["queue"].get("on_restore", "keep") if queue is None else queue
        choice("queue", on_restore, ("keep", "drop"))

        self.policy.load_state_dict(dict(state["policy"]))
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.scheduler.load_state_dict(copy.deepcopy(state["scheduler"]))
        for name in _COUNTERS:
            setattr(self, name, counters[name])
        self.py_rng.setstate(rng["python"])
        self.np_rng.bit_generator.state = rng["numpy"]
        self.torch_rng.set_state(rng["torch"].clone())
        self.cursor = cursor
        self.curriculum = curriculum
        self.normalizer = normalizer
        self.verifier_version = versions["verifier"]
        if on_restore == "drop":
            self.lost_rollouts += sum(len(b) for b in batches)
            batches = []
        self.queue = batches


def _take(state: Mapping, name: str, *keys: str) -> dict:
    """Копия полей keys компонента state[name]; ValueError, если их нет."""
    obj = state[name]
    if not isinstance(obj, Mapping):
        raise ValueError(f"load_state_dict: компонент {name} должен быть словарём")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"load_state_dict: в компоненте {name} нет полей {missing}")
    return {k: copy.deepcopy(obj[k]) for k in keys}
