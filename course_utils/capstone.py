"""Итоговый прогон модуля: RL-цикл уровня C по спецификации и аудит семи гарантий по его файлам.

``python -m course_utils.capstone run --spec SPEC.json --out DIR [--kill-trainer-at STEP]`` —
прогон (ранги — ``capstone_trainer``) и его артефакты в DIR; ``python -m course_utils.capstone
audit DIR [--json]`` — семь гарантий шага 12.5.5, измеренные только по файлам DIR (код 0 —
все выполнены). Эталон и сломанные спецификации — data/capstone/*.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import pandas as pd

from course_utils import atomic, multiproc
from course_utils.args import choice, flag, integer, optional_integer, path, positive, real, text
from course_utils.checkpoint import (
    EVENTS_FILE,
    MANIFEST,
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
    remove_incomplete,
    save_checkpoint,
)
from course_utils.csv_tables import DATA_DIR
from course_utils.fmt import count, num
from course_utils.guarantees import GUARANTEES
from course_utils.memory import MIB
from course_utils.multiproc import transport
from course_utils.multiproc.checkpointed_trainer import (
    append_event,
    events_from_run_dir,
    kill_self_once,
    step_lines,
)
from course_utils.tracing import batch_id

SPECS_DIR = DATA_DIR / "capstone"
_ENTRY = "course_utils.capstone:capstone_trainer"
SYNC_LOG, CHECKPOINT_LOG, CHECKPOINTS = "sync_log.jsonl", "checkpoint_log.jsonl", "checkpoints"
# Полная контрольная точка итогового прогона; «только веса» — первые два компонента.
FULL_COMPONENTS = ("policy", "counters", "optimizer", "rng", "data_cursor", "versions", "queue")
ROLLOUTS, TRACE_ROLLOUTS, TRACE_STEPS = "rollouts.parquet", "trace_rollouts.csv", "trace_steps.csv"
METRICS, _SPEC_FILE = "metrics.json", "spec.json"
_MEMORY_KIND = "пиковый RSS процесса ОС (ru_maxrss), максимум по тренеру и генераторам"


@dataclasses.dataclass
class Spec:
    """Спецификация прогона: ручки, которые обсуждает лекция (проверка — один раз здесь)."""

    description: str = "эталон курса"  # что это за прогон, по-русски
    model: str = "tiny"  # модель уровня B: tiny, имя с хаба или random:<config>
    seed: int = 0  # зерно: задачи и генерация пакета b — из seed·10⁵ + b
    n_generators: int = 2  # процессов-генераторов (реплик движка)
    total_steps: int = 6  # шагов оптимизатора
    prompts_per_step: int = 2  # задач в пакете
    group_size: int = 4  # ответов на задачу (группа GRPO)
    max_new_tokens: int = 12  # предел длины ответа, токенов
    temperature: float = 1.0  # температура декодирования (top-p = 1)
    lr: float = 1e-4  # скорость обучения AdamW
    queue_tokens: int = 192  # порог очереди: Σ бюджетов заказанных и не обученных пакетов, токенов
    max_policy_lag: int = 1  # граница задержки L = u − v, версий
    stale_strategy: str = "wait"  # "wait" — генератор ждёт свежие веса; "none" — не ждёт
    min_ess_norm: float = 0.5  # нижняя граница ESS/n пакета
    max_clip_fraction: float = 0.2  # верхняя граница доли клиппирования пакета
    checkpoint_every: int = 2  # контрольная точка каждые k шагов
    checkpoint: str = "full"  # "full" — все компоненты, "weights" — только веса и шаг
    queue_on_restart: str = "checkpoint"  # очередь при перезапуске: из точки или заказать заново
    readiness_barrier: bool = True  # переключать версию только когда готовы все реплики
    train_delay_s: float = 0.0  # добавочное время шага тренера (медленный тренер), с
    memory_budget_mib: float = 2048.0  # бюджет пикового RSS процесса, МиБ
    kill_trainer_at: int | None = None  # SIGKILL тренера после этого шага (None — без аварии)

    def __post_init__(self) -> None:
        text("description", self.description)
        text("model", self.model)
        integer("seed", self.seed, 0)
        integer("n_generators", self.n_generators, 1, 8)
        integer("total_steps", self.total_steps, 1)
        integer("prompts_per_step", self.prompts_per_step, 1)
        integer("group_size", self.group_size, 2)
        integer("max_new_tokens", self.max_new_tokens, 1)
        positive("temperature", self.temperature)
        positive("lr", self.lr)
        budget = self.prompts_per_step * self.group_size * self.max_new_tokens
        integer("queue_tokens (не меньше бюджета одного пакета)", self.queue_tokens, budget)
        integer("max_policy_lag", self.max_policy_lag, 0)
        choice("stale_strategy", self.stale_strategy, ("wait", "none"))
        real("min_ess_norm", self.min_ess_norm, 0.0, 1.0)
        real("max_clip_fraction", self.max_clip_fraction, 0.0, 1.0)
        integer("checkpoint_every", self.checkpoint_every, 1)
        choice("checkpoint", self.checkpoint, ("full", "weights"))
        choice("queue_on_restart", self.queue_on_restart, ("checkpoint", "regenerate"))
        flag("readiness_barrier", self.readiness_barrier)
        real("train_delay_s", self.train_delay_s, 0.0, 10.0)
        positive("memory_budget_mib", self.memory_budget_mib)
        kill = optional_integer("kill_trainer_at", self.kill_trainer_at, 1, self.total_steps - 1)
        if kill is not None and kill % self.checkpoint_every == 0:
            raise ValueError(
                f"kill_trainer_at={kill} кратно checkpoint_every={self.checkpoint_every}: после "
                f"перезапуска ни один шаг не будет посчитан дважды, сравнивать продолжение не с чем"
            )

    def to_dict(self) -> dict:
        """Поля спецификации словарём (JSON)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, file: str | Path, **override) -> Spec:
        """Спецификация из JSON-файла; неизвестный ключ — ValueError по-русски."""
        file = path("spec", file)
        data = json.loads(file.read_text(encoding="utf-8"))
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or (unknown := sorted(set(data) - known)):
            raise ValueError(
                f"спецификация {file}: неизвестные ключи {unknown if isinstance(data, dict) else data!r}; "
                f"допустимы {sorted(known)}"
            )
        return cls(**(data | {k: v for k, v in override.items() if v is not None}))


# ----------------------------------------------------------------------------- ранги прогона


def _peak_rss() -> int:
    """Пиковый RSS этого процесса, байт (``policy.peak_memory`` на CPU)."""
    import torch

    from course_utils.policy import peak_memory

    return int(peak_memory(torch.device("cpu"))[0])


def capstone_trainer(rank: int, world_size: int, backend: str, run_dir: str, spec: dict) -> dict:
    """Точка входа ``launch``: асинхронный RL-цикл spec (словарь ``Spec``), ранг 0 — тренер.

    Пакет b — задачи ``make_tasks(prompts_per_step, seed·10⁵ + b)`` по group_size ответов,
    генерирует ранг 1 + b mod G. Запрос b допускается, когда Σ бюджетов токенов заказанных и не
    обученных пакетов + бюджет b ≤ queue_tokens (бюджет = роллауты · max_new_tokens) и — при
    stale_strategy "wait" — версия тренера u ≥ b − 1 − max_policy_lag (тогда задержка
    L = (b − 1) − v ≤ max_policy_lag). Всё решается в точках цикла тренера, а не по времени,
    поэтому прогон детерминирован: продолжение после kill -9 повторяет те же события.
    Пишет только ранг 0, в run_dir: events.jsonl, sync_log.jsonl, checkpoints/, checkpoint_log.jsonl.
    """
    s = Spec(**spec)
    cfg = {**s.to_dict(), "rank": rank, "world_size": world_size, "backend": backend}
    r = transport.start_rank("capstone", cfg)
    if rank == 0:
        trainer = _Trainer(r, s, Path(run_dir), n_gen=world_size - 1)
        return {**r.head, "role": transport.ROLE_TRAINER, **trainer.run()}
    return {**r.head, "role": transport.ROLE_GENERATOR, **_generator(r, cfg)}


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
            transport.load_engine_weights(engine, staging, r.stages, msg["version"])
            active = msg["version"]
            ev("commit", active, checksum=transport.state_checksum(engine), buffer="staging")
            reply({})
        elif kind == "generate":
            if msg["version"] != active:
                raise RuntimeError(f"{replica}: запрос версии {msg['version']}, активна {active}")
            seed, bid = cfg["seed"] * 100_000 + msg["batch"], batch_id(msg["batch"])
            ev("serve", active, request_id=bid)
            t0 = time.perf_counter()
            n = msg["prompts"]
            batch = transport.sample_rollouts(engine, r.tok, cfg, n, active, seed, bid)
            done[msg["batch"]] = ([x.to_dict() for x in batch.records], time.perf_counter() - t0)
        elif kind == "collect":
            records, gen_s = done.pop(msg["batch"])
            reply({"records": records, "replica": replica, "generate_s": gen_s})
        else:  # stop
            reply({})
            return {"replica": replica, "peak_rss_bytes": _peak_rss()}


class _Trainer:
    def __init__(self, r, s: Spec, run_dir: Path, n_gen: int) -> None:
        from course_utils.policy import fp32_trainer

        self.r, self.s, self.dir, self.n_gen = r, s, run_dir, n_gen
        self.ckpt = run_dir / CHECKPOINTS
        self.ckpt.mkdir(parents=True, exist_ok=True)
        self.config = {"spec": s.to_dict()}  # точка чужой спецификации — CheckpointError
        self.learner = fp32_trainer(r.net, r.device, s.lr)
        self.version, self.next_batch = 0, 1
        self.queue: dict[int, dict] = {}  # пакет → {"version", "records" (None — в полёте)}
        self.gen_version, self.gen_rss = 0, {}
        self.budget = s.prompts_per_step * s.group_size * s.max_new_tokens  # токенов на пакет

    def _sync(self, events: list[dict]) -> None:
        append_event(self.dir / SYNC_LOG, *({**e, "writer_pid": os.getpid()} for e in events))

    def _ask(self, g: int, msg: dict | None) -> dict:
        """Запрос генератору g (None — только ответ): его события — в журнал, RSS — в замер."""
        if msg is not None:
            transport.send_object(msg, g)
        out, _ = transport.recv_object(g)
        self._sync(out.pop("events"))
        self.gen_rss[g] = out.pop("peak_rss_bytes")
        return out

    def _publish(self) -> None:
        """Веса версии v на все реплики с проверкой суммы; с барьером — commit после всех."""
        v, gens = self.version, range(1, self.n_gen + 1)
        snap = self.learner.wire_copy()
        meta = {"version": v, "checksum": transport.state_checksum(snap)}
        for g in gens:
            transport.send_object({"type": "weights", "version": v}, g)
            transport.send_tensors(snap, g, self.r.device, meta, self.learner.wire)
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

    def _admit(self) -> None:
        s = self.s
        while self.next_batch <= s.total_steps:
            b = self.next_batch
            if s.stale_strategy == "wait" and self.version < b - 1 - s.max_policy_lag:
                return
            if self.budget * (len(self.queue) + 1) > s.queue_tokens:
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
            self.queue[b] |= {k: out[k] for k in ("records", "replica", "generate_s")}

    def _state(self) -> dict:
        import torch

        from course_utils.arith_task import VERIFIER_VERSION

        state = {
            "policy": self.learner.net.state_dict(),
            "counters": {"global_step": self.version, "policy_version": self.version},
        }
        if self.s.checkpoint == "weights":
            return state
        decoding = {"temperature": self.s.temperature, "top_p": 1.0}  # настройки роллаутов
        return state | {
            "optimizer": self.learner.opt.state_dict(),
            "rng": {"torch": torch.get_rng_state()},
            "data_cursor": {"next_batch": self.next_batch},
            "versions": {"verifier_version": VERIFIER_VERSION, "decoding": decoding},
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
        self.learner.net.load_state_dict(state["policy"])
        self.version = int(state["counters"]["policy_version"])
        self.next_batch = self.version + 1  # без курсора и очереди — заказать заново
        if self.s.checkpoint == "full":
            self.learner.opt.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"]["torch"])
            if self.s.queue_on_restart == "checkpoint":
                self.queue = {int(b): q for b, q in state["queue"]["batches"]}
                self.next_batch = int(state["data_cursor"]["next_batch"])
        return self.version

    def _step(self, t: int) -> dict:
        """Шаг t на пакете t: строка events.jsonl (сравниваемое событие, записи, замеры)."""
        import torch

        from course_utils.offpolicy import normalized_ess

        self._collect(t)
        q = self.queue[t]
        records = transport.records_from(q["records"], f"пакет {batch_id(t)}")
        t0 = time.perf_counter()
        new = self.learner.logprobs(records)
        log_w = [float((n - torch.tensor(x.behavior_logprobs)).sum()) for n, x in zip(new, records)]
        stats = self.learner.update(records)
        if self.s.train_delay_s:
            time.sleep(self.s.train_delay_s)  # медленный тренер
        train_s = time.perf_counter() - t0
        reserved = self.budget * len(self.queue)
        del self.queue[t]
        self.version = t
        event = {"step": t, "training_batch_id": batch_id(t)}  # без времени и pid
        event |= {"rollout_ids": [x.sample_id for x in records]}
        event |= {"behavior_versions": [x.policy_version for x in records]}
        event |= {"trainer_policy_version": t - 1, "resulting_policy_version": t}
        event["weights_sha256"] = transport.state_checksum(self.learner.net)
        line = {"pid": os.getpid(), "event": event, "records": q["records"]}
        line |= {"replica": q["replica"], "ess_norm": normalized_ess(log_w, log=True)}  # ESS/n
        line |= {"clip_fraction": stats["clip_fraction"], "loss": stats["loss"]}
        line |= {"reward_mean": stats["mean_reward"], "reserved_tokens": reserved}
        line |= {"train_s": train_s, "generate_s": q["generate_s"]}
        rss = {"0": _peak_rss(), **{str(g): v for g, v in self.gen_rss.items()}}
        return line | {"peak_rss_bytes": rss, "end_unix": time.time()}  # конец шага, с

    def run(self) -> dict:
        resumed, s = self._restore(), self.s
        while True:
            self._admit()
            if self.version >= s.total_steps:
                break
            line = self._step(self.version + 1)
            t = self.version
            append_event(self.dir / EVENTS_FILE, line)
            if t % s.checkpoint_every == 0:
                for b in sorted(self.queue):
                    self._collect(b)  # очередь в точке — полученные записи, а не запросы
                target, t0 = self.ckpt / checkpoint_name(t), time.perf_counter()
                save_checkpoint(self._state(), target, self.config, overwrite=True)
                write_s = time.perf_counter() - t0  # C этой точки, с (с fsync)
                append_event(self.dir / CHECKPOINT_LOG, {"step": t, "write_s": write_s})
            if t == s.kill_trainer_at:
                kill_self_once(self.dir, f"step-{t}")
        for g in range(1, self.n_gen + 1):
            self._ask(g, {"type": "stop"})
        return {"resumed_from": resumed, "final_version": self.version}


# ----------------------------------------------------------------------------- прогон


def _step_lines(out: Path) -> list[dict]:
    """Строки events.jsonl, последняя запись каждого шага (по шагам); недописанные пропущены."""
    return [runs[-1] for runs in step_lines(out)[0].values()]


def run(spec: Spec, out: str | Path, timeout_s: float = 600) -> dict:
    """Прогон spec в настоящих процессах ОС; артефакты — в out (пустой или новый каталог).

    С kill_trainer_at первый запуск обязан закончиться SIGKILL тренера, второй продолжает с
    новейшей контрольной точки. Возвращает metrics.json: время, с; запуски (pid, коды выхода);
    пиковый RSS процессов, байт; медиана периода шага и время записи каждой точки (C), с.
    """
    from course_utils.contract import RolloutRecord, write_parquet

    out = path("out", out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"out: каталог {out} не пуст — прогон пишет в пустой каталог")
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / _SPEC_FILE, json.dumps(spec.to_dict(), ensure_ascii=False, indent=1))
    t0, launches = time.perf_counter(), []
    for _ in range(2 if spec.kill_trainer_at else 1):
        args = {"run_dir": str(out.resolve()), "spec": spec.to_dict()}
        n = 1 + spec.n_generators
        res = multiproc.launch(_ENTRY, n, args, timeout_s, "gloo", run_dir=out / "processes")
        launches.append({k: getattr(res, k) for k in ("status", "pids", "exitcodes", "wall_s")})
        if not (res.ok or (len(launches) == 1 and spec.kill_trainer_at and res.exitcodes[0] == -9)):
            raise RuntimeError(f"прогон {spec.description!r} не удался:\n{res.summary()}")
    lines = _step_lines(out)
    records = [RolloutRecord.from_dict(d) for line in lines for d in line["records"]]
    write_parquet(records, out / ROLLOUTS)
    rows, steps = [], []
    for line in lines:
        ev = line["event"]
        toks = [len(d["prompt_tokens"]) + len(d["response_tokens"]) for d in line["records"]]
        step = {"optimizer_step": ev["step"], "training_batch_id": ev["training_batch_id"]}
        rows += [{"rollout_id": rid, **step} for rid in ev["rollout_ids"]]
        step |= {k: ev[k] for k in ("trainer_policy_version", "resulting_policy_version")}
        step |= {"n_rollouts": len(toks), "tokens": sum(toks)}
        step["rollout_ids"] = json.dumps(ev["rollout_ids"])
        step |= {k: line[k] for k in ("ess_norm", "clip_fraction", "loss", "reward_mean")}
        step |= {k: line[k] for k in ("reserved_tokens", "train_s", "generate_s", "pid")}
        steps.append(step | {"end_unix": line["end_unix"], "weights_sha256": ev["weights_sha256"]})
    for name, frame in ((TRACE_ROLLOUTS, rows), (TRACE_STEPS, steps)):
        atomic.write_text(out / name, pd.DataFrame(frame).to_csv(index=False))
    rss = [v for line in lines for v in line["peak_rss_bytes"].values()]
    ends = pd.DataFrame(steps).groupby("pid")["end_unix"].diff().dropna()  # в одном процессе, с
    ckpt = out / CHECKPOINT_LOG
    metrics = {
        "duration_s": time.perf_counter() - t0,
        "steps": len(lines),
        "launches": launches,
        "peak_rss_bytes": max(rss),
        "memory_kind": _MEMORY_KIND,
        "processes": 1 + spec.n_generators,
        "step_period_s": float(ends.median()) if len(ends) else None,  # медиана между шагами
        "checkpoint_write_s": [x["write_s"] for x in _jsonl(ckpt)] if ckpt.is_file() else [],
    }
    atomic.write_text(out / METRICS, json.dumps(metrics, ensure_ascii=False, indent=1))
    return metrics


# ----------------------------------------------------------------------------- аудит


def _jsonl(file: Path) -> list[dict]:
    return [json.loads(x) for x in file.read_text(encoding="utf-8").splitlines() if x.strip()]


def _hist(values) -> dict[str, int]:
    return {str(k): int(n) for k, n in sorted(pd.Series(values).value_counts().items())}


def _violations(*checks) -> list[str]:
    """«что: x > граница» (или <) для проверок (что, x, граница, верхняя ли), где x за границей."""
    return [
        f"{what}: {x:g} {'>' if upper else '<'} {bound:g}"
        for what, x, bound, upper in checks
        if (x > bound if upper else x < bound)
    ]


class _Audit:
    """Гарантии по файлам каталога прогона; каждая — (число, граница, нарушения): выполнена,
    если нарушений нет."""

    def __init__(self, run_dir: Path) -> None:
        from course_utils.contract import read_parquet

        files = (_SPEC_FILE, METRICS, EVENTS_FILE, SYNC_LOG, TRACE_ROLLOUTS, TRACE_STEPS, ROLLOUTS)
        if missing := [f for f in files if not (run_dir / f).is_file()]:
            raise ValueError(
                f"run_dir: в {run_dir} нет {', '.join(missing)} — это не каталог прогона"
            )
        self.dir = run_dir
        self.spec = Spec.from_json(run_dir / _SPEC_FILE)
        self.metrics = json.loads((run_dir / METRICS).read_text(encoding="utf-8"))
        self.lines = _step_lines(run_dir)
        self.trace = pd.read_csv(run_dir / TRACE_ROLLOUTS)
        self.steps = pd.read_csv(run_dir / TRACE_STEPS)
        self.sync = _jsonl(run_dir / SYNC_LOG)
        self.read_errors, self.records = [], []
        try:
            self.records = read_parquet(run_dir / ROLLOUTS)
        except ValueError as exc:
            self.read_errors = [str(exc)]

    def behavior_policy(self):
        """Версия каждой записи = версия, закреплённая за её запросом в журнале синхронизации."""
        served = {
            (e["replica"], e["request_id"]): e["version"]
            for e in self.sync
            if e["event"] == "serve"
        }
        origin = {
            rid: (ln["replica"], ln["event"]["training_batch_id"])
            for ln in self.lines
            for rid in ln["event"]["rollout_ids"]
        }
        bad = [
            f"{r.sample_id}: в записи версия {r.policy_version}, запрос обслужен версией "
            f"{served.get(origin.get(r.sample_id))}"
            for r in self.records
            if served.get(origin.get(r.sample_id), -1) != r.policy_version
        ]
        bad += self.read_errors
        fig = {"records": len(self.records), "mismatched_records": len(bad)}
        return fig, {"mismatched_records": 0}, bad

    def rollout_contract(self):
        """Каждая запись проходит validate_rollout, Parquet сверен с суммой SHA-256."""
        from course_utils.contract import validate_rollout

        bad = [f"{r.sample_id}: {p}" for r in self.records for p in validate_rollout(r)]
        bad += self.read_errors
        fig = {"records": len(self.records), "invalid_records": len(bad)}
        return fig, {"invalid_records": 0}, bad

    def lags(self) -> pd.DataFrame:
        """Задержка L = u − v каждой записи, версий: u — версия тренера на её шаге (optimizer_step)."""
        versions = [(r.sample_id, r.policy_version) for r in self.records]  # v записи
        links = self.trace[["rollout_id", "training_batch_id"]]
        m = pd.DataFrame(versions, columns=["rollout_id", "v"]).merge(links, on="rollout_id")
        m = m.merge(self.steps, on="training_batch_id")  # u — trainer_policy_version шага
        return m.assign(lag=m["trainer_policy_version"] - m["v"])[["optimizer_step", "lag"]]

    def bounded_queue(self):
        """Задержка L = u − v по записям ≤ границы, пик очереди ≤ порога, пик RSS ≤ бюджета."""
        lags = self.lags()["lag"].tolist()
        s, rss = self.spec, round(self.metrics["peak_rss_bytes"] / MIB, 1)
        fig = {"max_lag_versions": max(lags, default=0), "lag_histogram": _hist(lags)}
        fig |= {"peak_queue_tokens": int(self.steps["reserved_tokens"].max()), "peak_rss_mib": rss}
        bound = {"max_policy_lag_versions": s.max_policy_lag, "queue_tokens": s.queue_tokens}
        bound["memory_budget_mib"] = s.memory_budget_mib
        bad = _violations(
            ("задержка политики, версий", fig["max_lag_versions"], s.max_policy_lag, True),
            ("пик очереди, токенов", fig["peak_queue_tokens"], s.queue_tokens, True),
            (f"пик памяти, МиБ ({_MEMORY_KIND})", rss, s.memory_budget_mib, True),
        )
        return fig, bound, bad

    def declared_update(self):
        """ESS/n каждого пакета ≥ нижней границы, доля клиппирования ≤ верхней."""
        s, st = self.spec, self.steps
        fig = {"min_ess_norm": round(float(st["ess_norm"].min()), 4)}
        fig["max_clip_fraction"] = round(float(st["clip_fraction"].max()), 4)
        rows = list(zip(st.optimizer_step, st.ess_norm, st.clip_fraction))
        checks = [(f"шаг {k}: ESS/n", e, s.min_ess_norm, False) for k, e, _ in rows]
        checks += [
            (f"шаг {k}: доля клиппирования", c, s.max_clip_fraction, True) for k, _, c in rows
        ]
        bound = {"min_ess_norm": s.min_ess_norm, "max_clip_fraction": s.max_clip_fraction}
        bad = _violations(*checks)
        return fig, bound, bad

    def atomic_sync(self):
        """audit_log журнала чист, и каждому commit предшествует barrier версии — отдельно для
        каждого процесса тренера: после kill -9 реплики новые, старые умерли вместе с ним."""
        from course_utils.weight_audit import audit_log

        bad = []
        for _, part in pd.DataFrame(self.sync).groupby("writer_pid", sort=False):
            events = part.drop(columns="writer_pid").to_dict("records")
            bad += audit_log(events)
            barrier = part[part["event"] == "barrier"].groupby("version")["t"].min()
            for e in events:
                if e["event"] == "commit" and not barrier.get(e["version"], math.inf) <= e["t"]:
                    bad.append(
                        f"[commit_without_barrier] реплика {e['replica']} переключилась на версию "
                        f"{e['version']} без события barrier"
                    )
        versions = {e["version"] for e in self.sync if e["event"] == "commit"}
        fig = {"published_versions": len(versions), "violations": len(bad)}
        return fig, {"violations": 0}, bad

    def full_checkpoint(self):
        """Точки полные и журнал шагов без пропусков; после kill -9 шаги, посчитанные обоими
        процессами тренера, совпали (событие шага: пакет, роллауты, версии, SHA-256 весов).
        Без аварии (trainer_killed_at_step = null) проверяется только полнота точек."""
        manifests = sorted((self.dir / CHECKPOINTS).glob(f"*/{MANIFEST}"))
        stored = [set(json.loads(m.read_text())["components"]) for m in manifests]
        missing = sorted({c for have in stored for c in FULL_COMPONENTS if c not in have})
        frame = events_from_run_dir(self.dir)
        a, steps = frame.attrs, frame["step"].tolist()
        fig = {"checkpoints": len(manifests), "missing_components": missing}
        fig |= {"trainer_processes": a["processes"]}
        fig |= {"trainer_killed_at_step": self.spec.kill_trainer_at}
        fig |= {k: a[k] for k in ("recomputed_steps", "recomputed_identical")}
        bad = [f"контрольная точка не хранит {c}" for c in missing]
        if steps != list(range(1, self.spec.total_steps + 1)):
            bad.append(f"журнал шагов неполон: {steps}")
        if self.spec.kill_trainer_at is not None:
            codes = self.metrics["launches"][0]["exitcodes"]
            if codes[0] != -9 or a["processes"] < 2 or not a["recomputed_steps"]:
                bad.append(f"аварии тренера (SIGKILL) с продолжением не видно: коды выхода {codes}")
            if not a["recomputed_identical"]:
                bad.append(
                    f"шаги {a['recomputed_steps']} после перезапуска не совпали с первым вычислением"
                )
        return fig, {"missing_components": [], "recomputed_identical": True}, bad

    def trace_chain(self):
        """check_chain таблиц трассы из файлов прогона пуст и сирот нет."""
        from course_utils.arith_task import VERIFIER_VERSION, scalar_reward
        from course_utils.tracing import TraceTables, check_chain, find_orphans

        cols = ["rollout_id", "prompt_id", "reward", "behavior_policy_version"]
        cols += ["verifier_version", "tokens"]
        recs = pd.DataFrame(
            [
                (r.sample_id, r.prompt_id, scalar_reward(r.reward), r.policy_version)
                + (r.verifier_version, r.num_tokens)
                for r in self.records
            ],
            columns=cols,
        )  # связь роллаута с пакетом — только из trace_rollouts.csv
        links = self.trace[["rollout_id", "training_batch_id", "optimizer_step"]]
        rollouts = recs.merge(links, on="rollout_id", how="left")
        batches = self.steps.assign(
            rollout_ids=self.steps["rollout_ids"].map(lambda x: tuple(json.loads(x))), complete=True
        )
        steps = self.steps.assign(expected_verifier_version=VERIFIER_VERSION)
        tables = TraceTables(recs[["prompt_id"]].drop_duplicates(), rollouts, batches, steps)
        bad = check_chain(tables)
        orphans = find_orphans(tables)["rollout_id"].tolist()
        bad += [f"роллаут {x} не связан с шагом оптимизатора" for x in orphans]
        fig = {"rollouts": len(rollouts), "steps": len(steps)}
        fig |= {"orphans": len(orphans), "breaks": len(bad)}
        return fig, {"orphans": 0, "breaks": 0}, bad


def audit(run_dir: str | Path) -> list[dict]:
    """Семь гарантий 12.5.5 по файлам каталога прогона: [{name, label, holds, figure, bound,
    evidence}] — name — ключ ``guarantees.GUARANTEES``, label — по-русски, figure и bound —
    измерение и граница (единица — в имени ключа), evidence — первые нарушения или пояснение."""
    a = _Audit(path("run_dir", run_dir))
    out = []
    for key, label in GUARANTEES:
        figure, bound, bad = getattr(a, key)()
        evidence = bad[:5] if bad else [" ".join(getattr(a, key).__doc__.split())]
        out.append(dict(name=key, label=label, holds=not bad, figure=figure, bound=bound))
        out[-1]["evidence"] = evidence
    return out


def _kv(d: dict) -> str:
    return "; ".join(f"{k} = {v}" for k, v in d.items())


def report_card(run_dir: str | Path) -> pd.DataFrame:
    """Табель прогона: строка на гарантию — выполнена ли, измерено, граница, первое доказательство."""
    return pd.DataFrame(
        [
            {"гарантия": g["label"], "выполнена": "да" if g["holds"] else "НЕТ"}
            | {"измерено": _kv(g["figure"]), "граница": _kv(g["bound"])}
            | {"доказательство": g["evidence"][0]}
            for g in audit(run_dir)
        ]
    )


def plot_run(run_dir: str | Path):
    """Очередь (Σ бюджетов заказанных и не обученных пакетов перед шагом, токенов) и наибольшая
    задержка L = u − v записей шага, версий, по шагам оптимизатора — с порогом и границей спецификации.
    Возвращает (fig, (ax_queue, ax_lag))."""
    import matplotlib.pyplot as plt

    a = _Audit(path("run_dir", run_dir))
    lag = a.lags().groupby("optimizer_step")["lag"].max()  # версий
    fig, (aq, al) = plt.subplots(1, 2, figsize=(12, 3.6))
    x, q = a.steps["optimizer_step"], a.steps["reserved_tokens"]
    aq.plot(x, q, "o-", drawstyle="steps-mid", label="очередь (заказано и не обучено)")
    aq.axhline(a.spec.queue_tokens, color="red", ls="--", label="порог queue_tokens")
    top = 1.25 * max(a.spec.queue_tokens, q.max())
    aq.set(xlabel="шаг оптимизатора", ylabel="очередь перед шагом, токенов", ylim=(0, top))
    al.plot(lag.index, lag.values, "o-", label="наибольшая задержка записей шага")
    al.axhline(a.spec.max_policy_lag, color="red", ls="--", label="граница max_policy_lag")
    al.set(xlabel="шаг оптимизатора", ylabel="задержка L = u − v, версий")
    al.set_yticks(range(0, max(int(lag.max()), a.spec.max_policy_lag) + 2))
    if a.spec.kill_trainer_at:
        for ax in (aq, al):
            ax.axvline(a.spec.kill_trainer_at + 0.5, color="gray", ls=":", label="kill -9 тренера")
    for ax in (aq, al):
        ax.legend(fontsize=8)
    fig.suptitle(a.spec.description, fontsize=10)
    return fig, (aq, al)


def main(argv: list[str] | None = None) -> int:
    """CLI: run и audit (см. docstring модуля); код 0 — прогон записан или все гарантии выполнены."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.capstone")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="прогон по спецификации")
    p_run.add_argument("--spec", required=True)
    p_run.add_argument("--out", required=True)
    p_run.add_argument("--kill-trainer-at", type=int, default=None)
    p_audit = sub.add_parser("audit", help="аудит гарантий по каталогу прогона")
    p_audit.add_argument("run_dir")
    p_audit.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    if ns.command == "run":
        spec = Spec.from_json(ns.spec, kill_trainer_at=ns.kill_trainer_at)
        metrics = run(spec, ns.out)
        steps = count(metrics["steps"], "шаг", "шага", "шагов")
        print(
            f"Прогон «{spec.description}»: {steps} за {num(metrics['duration_s'], 1)} с, файлы в {ns.out}"
        )
        return 0
    rows = audit(ns.run_dir)
    if ns.json:
        metrics = json.loads((Path(ns.run_dir) / METRICS).read_text(encoding="utf-8"))
        print(json.dumps({"guarantees": rows, "metrics": metrics}, ensure_ascii=False, indent=1))
    else:
        for row in rows:
            mark = "выполнена" if row["holds"] else "НАРУШЕНА"
            print(f"{row['label']}: {mark}; {json.dumps(row['figure'], ensure_ascii=False)}")
            print("    " + row["evidence"][0])
    return 0 if all(row["holds"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
