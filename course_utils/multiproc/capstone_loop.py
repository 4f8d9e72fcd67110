"""Урок 12.5, уровень C: итоговый прогон — тренер с очередью в токенах, генераторы, синхронизация
весов с барьером и проверкой, полные контрольные точки, kill -9 и продолжение.

Точка входа ``capstone_trainer`` (ранг 0 — тренер, ранги 1… — генераторы). Пишет только ранг 0,
в run_dir: events.jsonl (строка на шаг: сравниваемое событие, записи пакета, замеры),
sync_log.jsonl (события схемы ``weight_sync.EVENT_FIELDS``), checkpoints/step-NNNNNN,
checkpoint_log.jsonl (шаг и время записи точки, с).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from course_utils.checkpoint import (
    EVENTS_FILE,
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
    remove_incomplete,
    save_checkpoint,
)
from course_utils.multiproc import sync_loop, transport
from course_utils.multiproc.checkpointed_trainer import _append_event, _kill_self_once

CAPSTONE_EXPERIMENT = "capstone"
SYNC_LOG = "sync_log.jsonl"
CHECKPOINT_LOG = "checkpoint_log.jsonl"
CHECKPOINTS = "checkpoints"
# Полная контрольная точка итогового прогона; «только веса» — первые два компонента.
FULL_COMPONENTS = ("policy", "counters", "optimizer", "rng", "data_cursor", "versions", "queue")


def batch_id(b: int) -> str:
    """Идентификатор пакета b (он же запрос генератору): "b0003"."""
    return f"b{b:04d}"


def _peak_rss() -> int:
    """Пиковый RSS этого процесса, байт (``policy.peak_memory`` на CPU)."""
    import torch

    from course_utils.policy import peak_memory

    return int(peak_memory(torch.device("cpu"))[0])


def capstone_trainer(rank: int, world_size: int, backend: str, run_dir: str, spec: dict) -> dict:
    """Асинхронный RL-цикл спецификации spec (словарь ``capstone.Spec``) в world_size процессах.

    Пакет b — задачи ``make_tasks(prompts_per_step, seed·10⁵ + b)`` по group_size ответов,
    генерирует ранг 1 + b mod G. Запрос b допускается, когда Σ бюджетов токенов заказанных и не
    обученных пакетов + бюджет b ≤ queue_tokens (бюджет = роллауты · max_new_tokens) и — при
    stale_strategy "wait" — версия тренера u ≥ b − 1 − max_policy_lag (тогда задержка
    L = (b − 1) − v ≤ max_policy_lag). Всё решается в точках цикла тренера, а не по времени,
    поэтому состав пакетов, версии и веса детерминированы: продолжение после kill -9 обязано
    повторить ту же последовательность событий.
    """
    from course_utils.capstone import Spec

    s = Spec(**spec)
    cfg = {"rank": rank, "world_size": world_size, "backend": backend}
    cfg.update(seed=s.seed, model=s.model, group_size=s.group_size, temperature=s.temperature)
    cfg.update(max_new_tokens=s.max_new_tokens)
    r = sync_loop._start(CAPSTONE_EXPERIMENT, cfg)
    if rank == 0:
        out = _Trainer(r, s, Path(run_dir), world_size - 1).run()
    else:
        out = _generator(r, cfg)
    return {**r.head, "role": "тренер" if rank == 0 else "генератор", **out}


# ----------------------------------------------------------------------------- генератор


def _generator(r, cfg: dict) -> dict:
    """Сервер запросов тренера: weights (запись во второй буфер и проверка суммы), commit,
    generate (ответ копится до collect), collect, stop. События журнала уходят с ответом."""
    engine, replica = r.net.eval(), f"gen{cfg['rank']}-pid{os.getpid()}"
    log, staging, active, done = [], None, 0, {}

    def ev(kind: str, version: int, **fields) -> None:
        log.append({"t": time.time(), "replica": replica, "event": kind, "version": version})
        log[-1].update(fields)

    def reply(obj: dict) -> None:
        transport.send_object({**obj, "events": log[:], "peak_rss_bytes": _peak_rss()}, 0)
        log.clear()

    ev("init", 0, checksum=transport.state_checksum(engine))
    while True:
        msg, _ = transport.recv_object(0)
        kind = msg["type"]
        if kind == "weights":
            ev("stage_start", msg["version"], buffer="staging")
            meta, staging, _ = transport.recv_tensors(0, r.device, staging)
            got = transport.state_checksum(staging)
            ev("stage_done", meta["version"], checksum=got, buffer="staging")
            ok = got == meta["checksum"]
            verdict = "verify_ok" if ok else "verify_fail"
            ev(verdict, meta["version"], checksum=got, expected_checksum=meta["checksum"])
            if ok:
                ev("ready", meta["version"])
            reply({"ok": ok})
        elif kind == "commit":
            sync_loop._load_weights(engine, staging, r.stages, msg["version"])
            active = msg["version"]
            ev("commit", active, checksum=transport.state_checksum(engine), buffer="staging")
            reply({})
        elif kind == "generate":
            if msg["version"] != active:
                raise RuntimeError(f"{replica}: запрос версии {msg['version']}, активна {active}")
            ev("serve", active, request_id=batch_id(msg["batch"]))
            seed, bid = cfg["seed"] * 100_000 + msg["batch"], batch_id(msg["batch"])
            t0 = time.perf_counter()
            batch = sync_loop._generate(engine, r.tok, cfg, msg["prompts"], active, seed, bid)
            done[msg["batch"]] = ([x.to_dict() for x in batch.records], time.perf_counter() - t0)
        elif kind == "collect":
            records, gen_s = done.pop(msg["batch"])
            reply({"records": records, "replica": replica, "generate_s": gen_s})
        else:  # stop
            reply({})
            return {"replica": replica, "peak_rss_bytes": _peak_rss()}


# ----------------------------------------------------------------------------- тренер


class _Trainer:
    def __init__(self, r, s, run_dir: Path, n_gen: int) -> None:
        self.r, self.s, self.dir, self.n_gen = r, s, run_dir, n_gen
        self.ckpt = run_dir / CHECKPOINTS
        self.ckpt.mkdir(parents=True, exist_ok=True)
        self.config = {"spec": s.to_dict()}  # точка чужой спецификации — CheckpointError
        self.net, self.wire, self.amp, self.scaler, self.opt = sync_loop._fp32_trainer(
            r.net, r.device, s.lr
        )
        self.version, self.next_batch = 0, 1
        self.queue: dict[int, dict] = {}  # пакет → {"version", "records" (None — в полёте)}
        self.gen_version, self.gen_rss = 0, {}
        self.budget = s.prompts_per_step * s.group_size * s.max_new_tokens  # токенов на пакет

    # -- журналы
    def _sync(self, events: list[dict]) -> None:
        with open(self.dir / SYNC_LOG, "a", encoding="utf-8") as f:
            for e in events:
                f.write(json.dumps({**e, "writer_pid": os.getpid()}, ensure_ascii=False) + "\n")
            f.flush()

    def _ask(self, g: int, msg: dict | None) -> dict:
        """Запрос генератору g (None — только ответ): его события — в журнал, RSS — в замер."""
        if msg is not None:
            transport.send_object(msg, g)
        out, _ = transport.recv_object(g)
        self._sync(out.pop("events"))
        self.gen_rss[g] = out.pop("peak_rss_bytes")
        return out

    # -- публикация весов: запись и проверка на всех репликах, барьер, переключение
    def _publish(self) -> None:
        v, gens = self.version, range(1, self.n_gen + 1)
        snap = {n: p.detach().to(self.wire).clone() for n, p in self.net.named_parameters()}
        meta = {"version": v, "checksum": transport.state_checksum(snap)}
        for g in gens:
            transport.send_object({"type": "weights", "version": v}, g)
            transport.send_tensors(snap, g, self.r.device, meta, self.wire)
            if not self._ask(g, None)["ok"]:
                raise RuntimeError(f"генератор {g}: сумма весов версии {v} не совпала")
            if not self.s.readiness_barrier:  # сломанный протокол: переключаем сразу
                self._ask(g, {"type": "commit", "version": v})
        if self.s.readiness_barrier:
            t = time.time()
            self._sync([{"t": t, "replica": "publisher", "event": "barrier", "version": v}])
            for g in gens:
                self._ask(g, {"type": "commit", "version": v})
        self.gen_version = v

    def _reserved(self) -> int:
        return self.budget * len(self.queue)

    def _admit(self) -> None:
        s = self.s
        while self.next_batch <= s.total_steps:
            b = self.next_batch
            if s.stale_strategy == "wait" and self.version < b - 1 - s.max_policy_lag:
                return
            if self._reserved() + self.budget > s.queue_tokens:
                return
            if self.gen_version != self.version:
                self._publish()
            msg = {"type": "generate", "batch": b, "version": self.version}
            transport.send_object(msg | {"prompts": s.prompts_per_step}, 1 + b % self.n_gen)
            self.queue[b] = {"version": self.version, "records": None}
            self.next_batch += 1

    def _collect(self, b: int) -> None:
        if self.queue[b]["records"] is None:
            out = self._ask(1 + b % self.n_gen, {"type": "collect", "batch": b})
            self.queue[b].update(records=out["records"], replica=out["replica"])
            self.queue[b]["generate_s"] = out["generate_s"]

    # -- состояние для контрольной точки
    def _state(self) -> dict:
        import torch

        from course_utils.arith_task import VERIFIER_VERSION

        state = {
            "policy": self.net.state_dict(),
            "counters": {"global_step": self.version, "policy_version": self.version},
        }
        if self.s.checkpoint == "weights":
            return state
        return state | {
            "optimizer": self.opt.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
            "data_cursor": {"next_batch": self.next_batch},
            "versions": {"verifier_version": VERIFIER_VERSION, "decoding": self.s.decoding()},
            "queue": {"batches": [[b, q] for b, q in sorted(self.queue.items())]},
        }

    def _restore(self) -> int | None:
        import torch

        remove_incomplete(self.ckpt)
        need = FULL_COMPONENTS if self.s.checkpoint == "full" else FULL_COMPONENTS[:2]
        ckpt = latest_checkpoint(self.ckpt, self.config, components=need)
        if ckpt is None:
            return None
        state = load_checkpoint(ckpt, self.config, components=need)
        self.net.load_state_dict(state["policy"])
        self.version = int(state["counters"]["policy_version"])
        self.next_batch = self.version + 1  # без курсора и очереди — заказать заново
        if self.s.checkpoint == "full":
            self.opt.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"]["torch"])
            if self.s.queue_on_restart == "checkpoint":
                self.queue = {int(b): q for b, q in state["queue"]["batches"]}
                self.next_batch = int(state["data_cursor"]["next_batch"])
        return self.version

    # -- шаг
    def _step(self, t: int) -> dict:
        import torch

        from course_utils.offpolicy import normalized_ess
        from course_utils.policy import grpo_step, recompute_logprobs

        self._collect(t)
        q = self.queue[t]
        records = sync_loop._records_from(q["records"], f"пакет {batch_id(t)}")
        t0 = time.perf_counter()
        new = recompute_logprobs(self.net, records, autocast_dtype=self.amp)
        log_w = [float((n - torch.tensor(x.behavior_logprobs)).sum()) for n, x in zip(new, records)]
        stats = grpo_step(self.net, self.opt, records, autocast_dtype=self.amp, scaler=self.scaler)
        if self.s.train_delay_s:
            time.sleep(self.s.train_delay_s)  # медленный тренер
        train_s = time.perf_counter() - t0
        reserved = self._reserved()
        del self.queue[t]
        self.version = t
        event = {  # сравниваемое событие: без времени и pid
            "step": t,
            "training_batch_id": batch_id(t),
            "rollout_ids": [x.sample_id for x in records],
            "behavior_versions": [x.policy_version for x in records],
            "trainer_policy_version": t - 1,
            "resulting_policy_version": t,
            "weights_sha256": transport.state_checksum(self.net),
        }
        return {
            "pid": os.getpid(),
            "event": event,
            "records": q["records"],
            "replica": q["replica"],
            "ess_norm": normalized_ess(log_w, log=True),  # ESS/n по последовательностям
            "clip_fraction": stats["clip_fraction"],
            "loss": stats["loss"],
            "reward_mean": stats["mean_reward"],
            "reserved_tokens": reserved,
            "train_s": train_s,
            "generate_s": q["generate_s"],
            "peak_rss_bytes": {"0": _peak_rss(), **{str(g): v for g, v in self.gen_rss.items()}},
            "end_unix": time.time(),  # конец шага, с (для периода шага)
        }

    def run(self) -> dict:
        resumed = self._restore()
        s, log = self.s, self.dir / EVENTS_FILE
        while True:
            self._admit()
            if self.version >= s.total_steps:
                break
            line = self._step(self.version + 1)
            t = self.version
            _append_event(log, line)
            if t % s.checkpoint_every == 0:
                for b in sorted(self.queue):
                    self._collect(b)  # очередь в точке — полученные записи, а не запросы
                target, t0 = self.ckpt / checkpoint_name(t), time.perf_counter()
                save_checkpoint(self._state(), target, self.config, overwrite=True)
                write_s = time.perf_counter() - t0  # C этой точки, с (с fsync)
                _append_event(self.dir / CHECKPOINT_LOG, {"step": t, "write_s": write_s})
            if t == s.kill_trainer_at:
                _kill_self_once(self.dir, f"step-{t}")
        for g in range(1, self.n_gen + 1):
            self._ask(g, {"type": "stop"})
        return {
            "resumed_from": resumed,
            "final_version": self.version,
        }
