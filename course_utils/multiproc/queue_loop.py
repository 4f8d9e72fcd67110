"""Урок 12.3, уровень C: тренер с очередью роллаутов (порог в токенах) и два генератора."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from course_utils.args import (
    integer,
    is_int,
    nonnegative,
    positive,
    text,
)
from course_utils.multiproc.sync_loop import _reward_mean
from course_utils.multiproc.transport import (
    CLOCK_NOTE,
    ROLE_GENERATOR,
    ROLE_TRAINER,
    RecvStats,
    _device,
    _Stages,
    rank_results,
    recv_object,
    recv_tensors,
    send_object,
    send_tensors,
    shared_time_ref,
    state_checksum,
)

# ----------------------------------------------------------------------------- урок 12.3

QUEUE_EXPERIMENT = "queue_generators_trainer"
QUEUE_TRAINER_RANK = 0
QUEUE_GENERATOR_RANKS = (1, 2)
WORKER_QUEUE_RU = "очередь (ранг 0)"
# Пауза генератора после отказа, прежде чем снова спросить разрешение, с.
QUEUE_RETRY_S = 0.02


def _generator_worker(rank: int) -> str:
    return f"{ROLE_GENERATOR} {rank}"


def rollout_tokens(records) -> int:
    """Стоимость группы роллаутов в очереди: Σ (токены запроса + токены ответа) по записям.

    Так очередь считает «вес» работы в токенах, а не в записях: длинный многоходовой эпизод
    весит больше короткого ответа (шаг 12.3.4). records — RolloutRecord или словари записей.
    """
    total = 0
    for r in records:
        get = r.get if isinstance(r, Mapping) else lambda k, r=r: getattr(r, k)
        total += len(get("prompt_tokens")) + len(get("response_tokens"))
    return int(total)


def _recv_object_any(device, group) -> tuple[int, Any, RecvStats]:
    """Принимает объект ``send_object`` от любого ранга (recv с src=None; умеет gloo, не NCCL).

    Возвращает (глобальный ранг отправителя, объект, RecvStats).
    """
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    size = torch.zeros(1, dtype=torch.int64, device=device)
    src = int(dist.recv(size, src=None, group=group))
    n = int(size.item())
    t1 = time.perf_counter()
    payload = torch.empty(n, dtype=torch.uint8, device=device)
    dist.recv(payload, src=src, group=group)
    obj = json.loads(payload.cpu().numpy().tobytes().decode("utf-8"))
    return src, obj, RecvStats(nbytes=n, wait_s=t1 - t0, transfer_s=time.perf_counter() - t1)


def queue_generators_trainer(
    rank: int,
    world_size: int,
    backend: str,
    duration_s: float = 6.0,
    max_queue_tokens: int = 1024,
    batch_tokens: int = 512,
    prompts_per_request: int = 1,
    group_size: int = 4,
    max_new_tokens: int = 16,
    train_delay_s: float = 0.0,
    seed: int = 0,
    model: str = "tiny",
    temperature: float = 1.0,
    lr: float = 1e-5,
    retry_s: float = QUEUE_RETRY_S,
) -> dict:
    """Асинхронный RL-цикл с очередью в токенах: ранг 0 — тренер и очередь, ранги 1, 2 — генераторы.

    Генератор перед каждым запросом спрашивает у тренера разрешение. Тренер разрешает,
    только пока в очереди меньше ``max_queue_tokens`` токенов: порог ограничивает **начало**
    работы, а уже начатые запросы («в полёте») доходят до очереди, поэтому глубина может
    превысить порог — не больше чем на токены работы, бывшей в полёте, когда очередь пересекла
    порог (overshoot < Σ по генераторам токенов одного запроса). После отказа генератор ждёт
    ``retry_s`` секунд и спрашивает снова (обратное давление). С разрешением генератор
    собирает ``prompts_per_request · group_size`` роллаутов настоящим ``generate_rollouts``
    той версией весов, что у него есть, и отправляет группу (записи, токены, версию) тренеру.
    В ответе на каждый запрос тренер сообщает номер последней версии весов; если у генератора
    старее, тренер тут же присылает новые веса (``send_tensors``), и генератор их загружает.

    Тренер: отдельный поток обучения ждёт, пока в очереди наберётся ≥ ``batch_tokens``
    токенов, забирает группы в порядке прихода (FIFO), пока пакет не наберёт ``batch_tokens``,
    делает ``grpo_step`` на fp32-копии и (по желанию) спит ``train_delay_s`` секунд — имитация
    медленного тренера, чтобы сделать μ < λ; после шага версия u → u+1 и готовится снимок
    весов для генераторов. Главный поток всё это время обслуживает сообщения генераторов.
    Задержка политики группы L = u − v ≥ 0 (u — версия тренера перед шагом, v — версия
    генерации). Через ``duration_s`` секунд тренер отвечает генераторам «стоп», принимает
    уже начатые запросы (слив) и новых шагов не начинает; остаток очереди — в отчёте.

    Токены группы — ``rollout_tokens`` (запрос + ответ всех записей). Скорости, токен/с:
    λ — наблюдаемый приток в очередь, λ_предл — предложенная нагрузка Σ_g токены_g / время
    генерации_g (сколько генераторы дали бы без отказов), μ — токены пакетов / время, когда
    тренер занят (шаг + train_delay_s); ρ = λ_предл / μ. Время — секунды от общей точки
    отсчёта (см. ``CLOCK_NOTE``). Обмен: JSON-сообщения с полем type (request/rollouts от
    генератора, grant/deny/stop от тренера); тренер принимает от того генератора, который
    прислал раньше (``dist.recv(src=None)``, на NCCL — через отдельную группу gloo).
    """
    if world_size != 3:
        raise ValueError(
            f"queue_generators_trainer: нужно ровно 3 процесса (ранг {QUEUE_TRAINER_RANK} — "
            f"тренер с очередью, ранги {QUEUE_GENERATOR_RANKS[0]} и {QUEUE_GENERATOR_RANKS[1]} — "
            f"генераторы), а world_size={world_size}; запустите nprocs=3"
        )
    if not is_int(rank) or not 0 <= rank < 3:
        raise ValueError(f"rank должно быть 0 (тренер) или 1, 2 (генераторы), получено {rank!r}")
    duration_s, retry_s = positive("duration_s", duration_s), positive("retry_s", retry_s)
    max_queue_tokens = integer("max_queue_tokens", max_queue_tokens, 1)
    batch_tokens = integer("batch_tokens", batch_tokens, 1, max_queue_tokens)  # иначе ждать вечно
    prompts_per_request = integer("prompts_per_request", prompts_per_request, 1)
    group_size = integer("group_size", group_size, 1)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    train_delay_s, seed = nonnegative("train_delay_s", train_delay_s), integer("seed", seed, 0)
    model = text("model", model)
    temperature, lr = positive("temperature", temperature), positive("lr", lr)
    import torch
    import torch.distributed as dist

    from course_utils.multiproc import local_device
    from course_utils.policy import load_policy

    device = local_device(backend)
    # Управляющие сообщения — на CPU: на gloo через основную группу, на NCCL — через
    # отдельную группу gloo (NCCL не умеет «принять от любого»). Веса идут основной группой.
    control = None if backend == "gloo" else dist.new_group(backend="gloo")
    t_ref = shared_time_ref(device)
    stages = _Stages(t_ref, device)
    torch.manual_seed(seed)
    with stages.stage("load_model"):
        net, tokenizer, info = load_policy(model, device=device)
    is_trainer = rank == QUEUE_TRAINER_RANK
    common = {
        "experiment": QUEUE_EXPERIMENT,
        "rank": rank,
        "world_size": world_size,
        "backend": backend,
        "role": ROLE_TRAINER if is_trainer else ROLE_GENERATOR,
        "worker": ROLE_TRAINER if is_trainer else _generator_worker(rank),
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "model": info.describe(),
        "model_id": info.model_id,
        "num_params": info.num_params,
        "engine_dtype": info.dtype,
        "t_ref_unix": t_ref,
        "clock_note": CLOCK_NOTE,
        "config": {
            "duration_s": float(duration_s),
            "max_queue_tokens": max_queue_tokens,
            "batch_tokens": batch_tokens,
            "prompts_per_request": prompts_per_request,
            "group_size": group_size,
            "max_new_tokens": max_new_tokens,
            "train_delay_s": float(train_delay_s),
            "seed": seed,
            "temperature": float(temperature),
            "lr": float(lr),
            "retry_s": float(retry_s),
            "n_generators": len(QUEUE_GENERATOR_RANKS),
        },
    }
    cfg = dict(common["config"])
    if is_trainer:
        out = _QueueTrainer(net, info, device, control, stages, cfg).run()
    else:
        out = _run_queue_generator(rank, net, tokenizer, info, device, control, stages, cfg)
    return {**common, **out, "events": stages.events}


def _run_queue_generator(rank, net, tokenizer, info, device, control, stages, cfg) -> dict:
    import torch

    from course_utils.policy import generate_rollouts, make_tasks

    cdev = _device("cpu")
    trainer = QUEUE_TRAINER_RANK
    engine = net.eval()

    def now() -> float:
        return time.time() - stages.t_ref

    with stages.stage("handshake"):
        hello = {"model_id": info.model_id, "num_params": info.num_params, "dtype": info.dtype}
        send_object({"type": "hello", **hello}, trainer, cdev, control)
    version, k, staging = 0, 0, None
    requests, fetches = [], []
    denials_total, backoff_s, denials_k, first_ask = 0, 0.0, 0, None
    while True:
        if first_ask is None:
            first_ask = now()
        with stages.stage("permission", k):
            send_object(
                {"type": "request", "request_id": k, "version": version}, trainer, cdev, control
            )
            reply, _ = recv_object(trainer, cdev, control)
        if reply.get("weights_follow"):
            wall0 = time.time()
            meta, staging, rs = recv_tensors(trainer, device, staging)
            stages.add("recv_weights", k, wall0, rs.wait_s + rs.transfer_s)
            with stages.stage("load_weights", k) as load, torch.no_grad():
                params = dict(engine.named_parameters())
                for name, buf in staging.items():
                    params[name].copy_(buf)
            if int(meta["version"]) <= version:
                raise RuntimeError(
                    f"генератор {rank}: пришли веса версии {meta['version']}, а у него уже "
                    f"{version} — версии должны только расти"
                )
            fetches.append(
                {
                    "time_s": wall0 - stages.t_ref,
                    "request_id": k,
                    "from_version": version,
                    "version": int(meta["version"]),
                    "bytes": rs.nbytes,
                    "recv_s": rs.wait_s + rs.transfer_s,
                    "load_s": load.duration_s,
                }
            )
            version = int(meta["version"])
        kind = reply.get("type")
        if kind == "stop":
            break
        if kind == "deny":
            denials_total += 1
            denials_k += 1
            with stages.stage("backpressure_wait", k) as wait:
                time.sleep(cfg["retry_s"])
            backoff_s += wait.duration_s
            continue
        if kind != "grant":
            raise RuntimeError(f"генератор {rank}: неизвестный ответ тренера {reply!r}")
        granted = now()
        req_seed = cfg["seed"] * 1_000_000 + rank * 100_000 + k
        tasks = make_tasks(cfg["prompts_per_request"], seed=req_seed)
        with stages.stage("generate", k) as gen:
            batch = generate_rollouts(
                engine,
                tokenizer,
                tasks,
                group_size=cfg["group_size"],
                temperature=cfg["temperature"],
                max_new_tokens=cfg["max_new_tokens"],
                policy_version=version,
                seed=req_seed,
                run_id=f"q{cfg['seed']}r{rank}",
            )
        gen_end = now()
        tokens = rollout_tokens(batch.records)
        payload = {
            "type": "rollouts",
            "request_id": k,
            "version": version,
            "tokens": tokens,
            "generate_s": gen.duration_s,
            "records": [r.to_dict() for r in batch.records],
        }
        with stages.stage("send_rollouts", k) as snd:
            nbytes = send_object(payload, trainer, cdev, control)
        requests.append(
            {
                "request_id": k,
                "first_ask_s": first_ask,
                "granted_s": granted,
                "denials": denials_k,
                "gen_start_s": gen_end - gen.duration_s,
                "gen_end_s": gen_end,
                "sent_s": gen_end + snd.duration_s,
                "version": version,
                "tokens": tokens,
                "output_tokens": batch.output_tokens,
                "n_records": len(batch.records),
                "generate_s": gen.duration_s,
                "send_s": snd.duration_s,
                "rollout_bytes": nbytes,
                "reward_mean": _reward_mean(batch.records),
            }
        )
        k, denials_k, first_ask = k + 1, 0, None
    gen_s = sum(r["generate_s"] for r in requests)
    tokens = sum(r["tokens"] for r in requests)
    return {
        "requests": requests,
        "weight_fetches": fetches,
        "n_requests": len(requests),
        "denials": denials_total,
        "backpressure_wait_s": backoff_s,
        "tokens_generated": tokens,
        "generate_s": gen_s,
        "capacity_tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0,
        "final_version": version,
    }


class _QueueTrainer:
    """Тренер урока 12.3 в ранге 0: очередь (главный поток) и обучение (второй поток).

    Главный поток принимает сообщения генераторов и меняет очередь под замком; поток обучения
    ждёт пакет на условной переменной. Операции torch.distributed делает только главный поток.
    Каждое событие очереди (разрешение, отказ, приход, снятие пакета) получает номер seq —
    порядок событий под замком, по нему проверяется граница превышения порога.
    """

    def __init__(self, net, info, device, control, stages, cfg) -> None:
        import torch

        from course_utils.policy import grad_scaler_for, trainer_autocast_dtype

        self.info, self.device, self.control, self.stages, self.cfg = (
            info,
            device,
            control,
            stages,
            cfg,
        )
        self.wire_dtype = next(net.parameters()).dtype  # веса уходят движкам в их типе
        self.trainer = net.float()
        self.amp = trainer_autocast_dtype(device, self.wire_dtype)
        self.scaler = grad_scaler_for(device, self.amp)  # float16 на T4: GradScaler
        self.optimizer = torch.optim.AdamW(self.trainer.parameters(), lr=cfg["lr"])
        self.cond = threading.Condition()
        self.seq = 0
        self.queue: deque = deque()
        self.q_tokens = 0
        self.q_rollouts = 0
        self.version = 0
        self.snapshot = self._snapshot()
        self.stopping = False
        self.error: BaseException | None = None
        self.timeline: list[dict] = []
        self.permissions: list[dict] = []
        self.arrivals: list[dict] = []
        self.batches: list[dict] = []
        self.weight_sends: list[dict] = []
        self.in_flight: dict[tuple[int, int], dict] = {}

    def now(self) -> float:
        return time.time() - self.stages.t_ref

    def _snapshot(self) -> dict:
        import torch

        with torch.no_grad():
            return {
                n: p.detach().to(self.wire_dtype).clone()
                for n, p in self.trainer.named_parameters()
            }

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _mark(self, event: str) -> None:
        """Строка временной шкалы очереди (вызывается под замком)."""
        self.timeline.append(
            {
                "seq": self._next_seq(),
                "time_s": self.now(),
                "event": event,
                "depth_tokens": self.q_tokens,
                "depth_rollouts": self.q_rollouts,
                "depth_groups": len(self.queue),
            }
        )

    # ------------------------------------------------------------------ поток обучения

    def _train_loop(self) -> None:
        from course_utils.contract import RolloutRecord
        from course_utils.policy import grpo_step

        try:
            b = 0
            while True:
                wall0 = time.time()
                with self.cond:
                    while not self.stopping and self.q_tokens < self.cfg["batch_tokens"]:
                        self.cond.wait(timeout=0.1)
                    waited = time.time() - wall0
                    if self.stopping:
                        self.stages.add("wait_rollouts", b, wall0, waited)
                        return
                    groups, tokens = [], 0
                    while self.queue and tokens < self.cfg["batch_tokens"]:
                        g = self.queue.popleft()
                        groups.append(g)
                        tokens += g["tokens"]
                        self.q_tokens -= g["tokens"]
                        self.q_rollouts -= len(g["records"])
                    self._mark("batch")
                    pop_seq, pop_s = self.timeline[-1]["seq"], self.timeline[-1]["time_s"]
                    u = self.version
                self.stages.add("wait_rollouts", b, wall0, waited)
                records = [RolloutRecord.from_dict(d) for g in groups for d in g["records"]]
                with self.stages.stage("grpo_update", b) as upd:
                    stats = grpo_step(
                        self.trainer,
                        self.optimizer,
                        records,
                        autocast_dtype=self.amp,
                        scaler=self.scaler,
                    )
                delay = 0.0
                if self.cfg["train_delay_s"] > 0:
                    with self.stages.stage("train_delay", b) as slow:
                        time.sleep(self.cfg["train_delay_s"])
                    delay = slow.duration_s
                with self.stages.stage("snapshot_weights", b):
                    snap = self._snapshot()
                lags = [u - g["version"] for g in groups]
                with self.cond:
                    self.version, self.snapshot = u + 1, snap
                    end_s = self.now()
                    self.batches.append(
                        {
                            "batch": b,
                            "pop_seq": pop_seq,
                            "pop_s": pop_s,
                            "end_s": end_s,
                            "train_s": upd.duration_s,
                            "delay_s": delay,
                            "busy_s": upd.duration_s + delay,
                            "tokens": tokens,
                            "n_groups": len(groups),
                            "n_records": len(records),
                            "generators": [g["generator"] for g in groups],
                            "behavior_versions": [g["version"] for g in groups],
                            "trainer_version": u,
                            "lags": lags,
                            "mean_lag": sum(lags) / len(lags),
                            "max_lag": max(lags),
                            "new_version": u + 1,
                            "queue_wait_s": [pop_s - g["arrival_s"] for g in groups],
                            "loss": stats["loss"],
                            "clip_fraction": stats["clip_fraction"],
                            "grad_norm": stats["grad_norm"],
                            "policy_tokens": stats["policy_tokens"],
                            "reward_mean": stats["mean_reward"],
                        }
                    )
                b += 1
        except BaseException as exc:  # главный поток перебросит ошибку
            with self.cond:
                self.error = exc
                self.stopping = True
                self.cond.notify_all()

    # ------------------------------------------------------------------ главный поток

    def _handshake(self) -> None:
        mine = {"model_id": self.info.model_id, "num_params": self.info.num_params}
        mine["dtype"] = self.info.dtype
        for g in QUEUE_GENERATOR_RANKS:
            hello, _ = recv_object(g, "cpu", self.control)
            theirs = {k: hello.get(k) for k in mine}
            if hello.get("type") != "hello" or theirs != mine:
                raise RuntimeError(
                    f"тренер: у генератора {g} другая модель: {theirs}, у тренера {mine}"
                )

    def _on_request(self, src: int, msg: Mapping) -> None:
        key = (src, int(msg["request_id"]))
        with self.cond:
            depth = self.q_tokens
            if self.stopping:
                decision = "stop"
            elif depth < self.cfg["max_queue_tokens"]:
                decision = "grant"
            else:
                decision = "deny"
            latest, snap = self.version, self.snapshot
            follow = decision != "stop" and int(msg["version"]) < latest
            seq = self._next_seq()
            if decision == "grant":
                if key in self.in_flight:
                    raise RuntimeError(f"тренер: запрос {key} уже разрешён и ещё в полёте")
                self.in_flight[key] = {"grant_seq": seq, "granted_s": self.now()}
            self.permissions.append(
                {
                    "seq": seq,
                    "time_s": self.now(),
                    "generator": src,
                    "request_id": key[1],
                    "decision": decision,
                    "granted": decision == "grant",
                    "depth_tokens": depth,
                    "generator_version": int(msg["version"]),
                    "latest_version": latest,
                    "weights_sent": follow,
                }
            )
        reply = {"type": decision, "latest_version": latest, "weights_follow": follow}
        send_object(reply, src, "cpu", self.control)
        if follow:
            with self.stages.stage("send_weights", key[1], WORKER_QUEUE_RU) as snd:
                nbytes = send_tensors(snap, src, self.device, {"version": latest}, self.wire_dtype)
            self.weight_sends.append(
                {
                    "time_s": self.now() - snd.duration_s,
                    "generator": src,
                    "version": latest,
                    "bytes": nbytes,
                    "send_s": snd.duration_s,
                }
            )

    def _on_rollouts(self, src: int, msg: Mapping) -> None:
        from course_utils.contract import validate_rollout

        key = (src, int(msg["request_id"]))
        problems = []
        for i, d in enumerate(msg["records"]):
            problems += [f"запись {i}: {p}" for p in validate_rollout(d)]
        if problems:
            raise ValueError(
                f"тренер: группа генератора {src} нарушает контракт:\n" + "\n".join(problems[:10])
            )
        tokens = rollout_tokens(msg["records"])
        if tokens != msg.get("tokens"):
            raise RuntimeError(
                f"тренер: генератор {src} заявил {msg.get('tokens')} токенов, в записях {tokens}"
            )
        versions = {d.get("policy_version") for d in msg["records"]}
        if versions != {msg["version"]}:
            raise RuntimeError(
                f"тренер: версии записей {sorted(versions, key=str)} не совпадают с версией "
                f"группы {msg['version']}"
            )
        with self.cond:
            grant = self.in_flight.pop(key, None)
            if grant is None:
                raise RuntimeError(f"тренер: пришла группа {key}, на которую не было разрешения")
            arrival_s = self.now()
            self.q_tokens += tokens
            self.q_rollouts += len(msg["records"])
            self.queue.append(
                {
                    "generator": src,
                    "request_id": key[1],
                    "version": int(msg["version"]),
                    "tokens": tokens,
                    "records": msg["records"],
                    "arrival_s": arrival_s,
                }
            )
            self._mark("arrival")
            self.arrivals.append(
                {
                    "seq": self.timeline[-1]["seq"],
                    "time_s": arrival_s,
                    "generator": src,
                    "request_id": key[1],
                    "tokens": tokens,
                    "n_records": len(msg["records"]),
                    "behavior_version": int(msg["version"]),
                    "grant_seq": grant["grant_seq"],
                    "granted_s": grant["granted_s"],
                    "in_flight_s": arrival_s - grant["granted_s"],
                    "generate_s": float(msg["generate_s"]),
                    "depth_tokens": self.q_tokens,
                }
            )
            self.cond.notify_all()

    def run(self) -> dict:
        with self.stages.stage("handshake"):
            self._handshake()
        with self.cond:
            self._mark("start")
        start_s = self.timeline[0]["time_s"]
        stop_at = start_s + self.cfg["duration_s"]
        worker = threading.Thread(target=self._train_loop, name="trainer", daemon=True)
        worker.start()
        stopped: set[int] = set()
        stop_s = None
        while len(stopped) < len(QUEUE_GENERATOR_RANKS):
            src, msg, _ = _recv_object_any(_device("cpu"), self.control)
            if self.error is not None:
                raise RuntimeError("тренер: ошибка в потоке обучения") from self.error
            if stop_s is None and self.now() >= stop_at:
                with self.cond:
                    self.stopping = True
                    self.cond.notify_all()
                stop_s = self.now()
            kind = msg.get("type") if isinstance(msg, Mapping) else None
            if src not in QUEUE_GENERATOR_RANKS or src in stopped:
                raise RuntimeError(f"тренер: неожиданное сообщение от ранга {src}: {kind!r}")
            if kind == "request":
                self._on_request(src, msg)
                if self.permissions[-1]["decision"] == "stop":
                    stopped.add(src)
            elif kind == "rollouts":
                self._on_rollouts(src, msg)
            else:
                raise RuntimeError(f"тренер: неизвестный тип сообщения {kind!r} от ранга {src}")
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        worker.join()
        if self.error is not None:
            raise RuntimeError("тренер: ошибка в потоке обучения") from self.error
        if self.in_flight:
            raise RuntimeError(f"тренер: после слива в полёте остались {sorted(self.in_flight)}")
        with self.cond:
            self._mark("end")
        return self._report(start_s, stop_s if stop_s is not None else self.now())

    # ------------------------------------------------------------------ отчёт

    def _report(self, start_s: float, stop_s: float) -> dict:
        threshold = self.cfg["max_queue_tokens"]
        timeline = _with_in_flight(self.timeline, self.permissions, self.arrivals, threshold)
        peak = max(timeline, key=lambda r: (r["depth_tokens"], -r["seq"]))
        end_s = timeline[-1]["time_s"]
        arrived = sum(a["tokens"] for a in self.arrivals)
        consumed = sum(b["tokens"] for b in self.batches)
        busy = sum(b["busy_s"] for b in self.batches)
        offered = 0.0
        for g in QUEUE_GENERATOR_RANKS:
            mine = [a for a in self.arrivals if a["generator"] == g]
            gen_s = sum(a["generate_s"] for a in mine)
            if gen_s > 0:
                offered += sum(a["tokens"] for a in mine) / gen_s
        lam = arrived / (end_s - start_s) if end_s > start_s else 0.0  # то же окно, что у занятости
        mu = consumed / busy if busy > 0 else 0.0
        lags = [lag for b in self.batches for lag in b["lags"]]
        grants = sum(p["decision"] == "grant" for p in self.permissions)
        denials = sum(p["decision"] == "deny" for p in self.permissions)
        return {
            "timeline": timeline,
            "arrivals": self.arrivals,
            "permissions": self.permissions,
            "batches": self.batches,
            "weight_sends": self.weight_sends,
            "threshold_tokens": threshold,
            "batch_tokens": self.cfg["batch_tokens"],
            "start_s": start_s,
            "stop_s": stop_s,
            "end_s": end_s,
            "tokens_arrived": arrived,
            "tokens_consumed": consumed,
            "left_in_queue_tokens": self.q_tokens,
            "left_in_queue_groups": len(self.queue),
            "busy_s": busy,
            "busy_fraction": busy / (end_s - start_s) if end_s > start_s else 0.0,
            "lambda_tokens_per_s": lam,
            "offered_lambda_tokens_per_s": offered,
            "mu_tokens_per_s": mu,
            "rho": offered / mu if mu > 0 else None,
            "peak_depth_tokens": peak["depth_tokens"],
            "peak_time_s": peak["time_s"],
            "overshoot_tokens": max(0, peak["depth_tokens"] - threshold),
            "peak_in_flight_tokens": peak["crossing_in_flight_tokens"]
            if peak["crossing_in_flight_tokens"] is not None
            else peak["in_flight_tokens"],
            "bound_holds": all(
                r["bound_tokens"] is None or r["depth_tokens"] <= r["bound_tokens"]
                for r in timeline
            ),
            "grants": grants,
            "denials": denials,
            "n_batches": len(self.batches),
            "final_version": self.version,
            "mean_lag": sum(lags) / len(lags) if lags else None,
            "max_lag": max(lags) if lags else None,
            "trainer_dtype": "float32",
            "weights_checksum": state_checksum(self.trainer, dtype=self.wire_dtype),
        }


def _with_in_flight(timeline, permissions, arrivals, threshold) -> list[dict]:
    """Дополняет строки шкалы очереди работой «в полёте» и границей превышения порога.

    in_flight_tokens строки с номером s — токены запросов, разрешённых до s (grant_seq < s) и
    пришедших не раньше s (включая группу, пришедшую этим событием). Когда очередь пересекает
    порог T событием k (глубина до него D_{k−1} < T), новых разрешений нет, пока глубина ≥ T,
    поэтому до возвращения ниже порога глубина ≤ bound = D_{k−1} + in_flight_tokens(k) < T +
    in_flight_tokens(k). crossing_in_flight_tokens — это in_flight_tokens(k); ниже порога оба
    поля None.
    """
    arrived_at = {(a["generator"], a["request_id"]): (a["seq"], a["tokens"]) for a in arrivals}
    grants = [
        (p["seq"], *arrived_at.get((p["generator"], p["request_id"]), (math.inf, 0)))
        for p in permissions
        if p["decision"] == "grant"
    ]
    rows, prev_depth, crossing, bound = [], 0, None, None
    for row in timeline:
        s = row["seq"]
        flying = [(a_seq, tok) for g_seq, a_seq, tok in grants if g_seq < s <= a_seq]
        in_flight = sum(tok for _, tok in flying)
        depth = row["depth_tokens"]
        if depth >= threshold:
            if prev_depth < threshold:
                crossing, bound = in_flight, prev_depth + in_flight
        else:
            crossing, bound = None, None
        rows.append(
            {
                **row,
                "in_flight_tokens": in_flight,
                "in_flight_requests": len(flying),
                "crossing_in_flight_tokens": crossing,
                "bound_tokens": bound,
            }
        )
        prev_depth = depth
    return rows


# ----------------------------------------------------------------------------- таблицы урока 12.3


def _queue_results(launch_result: Any) -> tuple[dict, list[dict]]:
    """(результат тренера, [результаты генераторов по рангам]) запуска queue_generators_trainer."""
    ranks = rank_results(launch_result, QUEUE_EXPERIMENT)
    (trainer,) = [r for r in ranks if r["role"] == ROLE_TRAINER]
    return trainer, [r for r in ranks if r["role"] == ROLE_GENERATOR]


def queue_timeline_frame(launch_result: Any):
    """Глубина очереди во времени (pandas.DataFrame), строка на изменение очереди.

    Столбцы: seq (порядок событий у тренера), time_s (с от общей точки отсчёта), event
    ("start", "arrival" — пришла группа, "batch" — тренер забрал пакет, "end"), depth_tokens,
    depth_rollouts, depth_groups (глубина после события), in_flight_tokens / in_flight_requests
    (работа, разрешённая до события и ещё не дошедшая до очереди, включая приходящую этим
    событием), crossing_in_flight_tokens и bound_tokens (выше порога: работа в полёте в момент
    пересечения порога и граница глубины, см. ``queue_generators_trainer``), threshold_tokens.
    Глубина — ступенчатая функция: рисуйте ``drawstyle="steps-post"``.
    """
    import pandas as pd

    trainer, _ = _queue_results(launch_result)
    frame = pd.DataFrame(trainer["timeline"])
    frame["threshold_tokens"] = trainer["threshold_tokens"]
    for col in ("crossing_in_flight_tokens", "bound_tokens"):
        frame[col] = frame[col].astype("Float64")
    return frame


def queue_batches_frame(launch_result: Any):
    """Пакеты, съеденные тренером (pandas.DataFrame), строка на пакет.

    Столбцы: batch, pop_s (с — когда пакет снят с очереди), end_s (конец шага), train_s и
    delay_s (шаг GRPO и искусственная задержка, с), tokens, n_groups, n_records,
    trainer_version (u — версия перед шагом), new_version (u+1), behavior_versions и lags (по
    группам: v и L = u − v), mean_lag, max_lag, mean_queue_wait_s (среднее время группы в
    очереди, с), loss, clip_fraction, grad_norm, reward_mean.
    """
    import pandas as pd

    trainer, _ = _queue_results(launch_result)
    columns = [
        "batch",
        "pop_s",
        "end_s",
        "train_s",
        "delay_s",
        "tokens",
        "n_groups",
        "n_records",
        "trainer_version",
        "new_version",
        "behavior_versions",
        "lags",
        "mean_lag",
        "max_lag",
        "mean_queue_wait_s",
        "loss",
        "clip_fraction",
        "grad_norm",
        "reward_mean",
    ]
    rows = []
    for b in trainer["batches"]:
        waits = b["queue_wait_s"]
        rows.append({**b, "mean_queue_wait_s": sum(waits) / len(waits) if waits else 0.0})
    return pd.DataFrame(rows, columns=columns)


def queue_requests_frame(launch_result: Any):
    """Запросы генераторов (pandas.DataFrame), строка на разрешённый запрос.

    Столбцы: worker ("генератор 1"…), rank, request_id, first_ask_s (первая просьба о
    разрешении), granted_s, denials (отказов до разрешения), gen_start_s, gen_end_s, sent_s,
    version (версия весов генерации), tokens, output_tokens, n_records, generate_s, send_s,
    reward_mean; времена — секунды от общей точки отсчёта.
    """
    import pandas as pd

    _, generators = _queue_results(launch_result)
    rows = []
    for g in generators:
        for r in g["requests"]:
            rows.append({"worker": g.get("worker"), "rank": g.get("rank"), **r})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["granted_s", "rank"], kind="stable").reset_index(drop=True)


# Ключ сводки → (подпись, единица); порядок — порядок строк queue_summary_text.
QUEUE_SUMMARY_RU = {
    "offered_lambda_tokens_per_s": ("λ_предл, предложенная нагрузка генераторов", "токенов/с"),
    "mu_tokens_per_s": ("μ, скорость тренера, пока он занят", "токенов/с"),
    "rho": ("ρ = λ_предл / μ", "раз"),
    "lambda_tokens_per_s": ("λ, принятый приток в очередь (после допуска)", "токенов/с"),
    "consumed_tokens_per_s": ("из него съел тренер: μ × доля занятости", "токенов/с"),
    "accumulated_tokens_per_s": ("из него накопилось в очереди к концу", "токенов/с"),
    "window_s": ("окно W: от старта до конца последнего шага", "с"),
    "duration_s": ("длительность приёма запросов", "с"),
    "grants": ("разрешений", "шт."),
    "denials": ("отказов (обратное давление)", "шт."),
    "generator_blocked_s": ("генераторы простояли после отказов (сумма)", "с"),
    "generator_blocked_share": ("доля времени приёма, простоянная генераторами", "доля"),
    "threshold_tokens": ("порог очереди T", "токенов"),
    "batch_tokens": ("размер пакета", "токенов"),
    "peak_depth_tokens": ("пиковая глубина очереди", "токенов"),
    "overshoot_tokens": ("превышение порога max(0, пик − T)", "токенов"),
    "peak_in_flight_tokens": ("работа в полёте при пересечении порога", "токенов"),
    "overshoot_bound_holds": ("граница пик < T + работа в полёте выполнена", ""),
    "n_batches": ("шагов обучения", "шт."),
    "final_version": ("итоговая версия весов", ""),
    "mean_lag": ("средняя задержка политики L = u − v", "версий"),
    "max_lag": ("максимальная задержка политики", "версий"),
    "busy_fraction": ("доля окна W, когда тренер занят", "доля"),
    "left_in_queue_tokens": ("осталось в очереди после остановки", "токенов"),
}
_TWO_DECIMALS = {"rho", "busy_fraction", "mean_lag", "generator_blocked_share"}
_ONE_DECIMAL = {"duration_s", "window_s", "generator_blocked_s"}


def queue_summary(launch_result: Any) -> dict:
    """Сводка запуска ``queue_generators_trainer``: словарь с английскими ключами.

    Скорости (токенов/с) на одном окне W = конец последнего шага − старт (window_s, с):
    lambda_tokens_per_s — принятый приток λ = пришедшие токены / W; consumed_tokens_per_s —
    съеденные тренером / W = μ · busy_fraction; accumulated_tokens_per_s — оставшиеся в
    очереди / W; λ = съедено + накоплено (токены сохраняются). offered_lambda_tokens_per_s —
    λ_предл = Σ_g токены_g / время генерации_g (сколько генераторы дали бы без отказов);
    mu_tokens_per_s — μ = токены пакетов / время занятости тренера; rho = λ_предл / μ (> 1 —
    без обратного давления очередь росла бы без предела). generator_blocked_s — сумма по
    генераторам времени ожидания после отказов (с), generator_blocked_share — она же / (число
    генераторов × duration_s), duration_s — длительность приёма запросов (с). Остальное:
    порог T, пик и превышение (токенов), разрешения и отказы, шаги, версии, задержки (версий).
    Подписи и единицы — ``QUEUE_SUMMARY_RU``; текст — ``queue_summary_text``.
    """
    trainer, generators = _queue_results(launch_result)
    window = float(trainer["end_s"] - trainer["start_s"])
    accepting = float(trainer["stop_s"] - trainer["start_s"])
    blocked = float(sum(g.get("backpressure_wait_s", 0.0) for g in generators))
    out = {k: trainer[k] for k in QUEUE_SUMMARY_RU if k in trainer}
    out.update(
        {
            "consumed_tokens_per_s": trainer["tokens_consumed"] / window if window > 0 else 0.0,
            "accumulated_tokens_per_s": trainer["left_in_queue_tokens"] / window
            if window > 0
            else 0.0,
            "window_s": window,
            "duration_s": accepting,
            "generator_blocked_s": blocked,
            "generator_blocked_share": blocked / (len(generators) * accepting)
            if accepting > 0
            else 0.0,
            "overshoot_bound_holds": bool(trainer["bound_holds"]),
        }
    )
    return {k: out[k] for k in QUEUE_SUMMARY_RU}


def queue_summary_text(launch_result_or_summary: Any) -> str:
    """Сводка очереди по-русски: строка «подпись, единица: значение» на величину."""
    from course_utils.fmt import num

    if isinstance(launch_result_or_summary, Mapping) and "rho" in launch_result_or_summary:
        summary = dict(launch_result_or_summary)
    else:
        summary = queue_summary(launch_result_or_summary)
    lines = []
    for key, (label, unit) in QUEUE_SUMMARY_RU.items():
        value = summary.get(key)
        if value is None:
            text = "—"
        elif isinstance(value, bool):
            text = "да" if value else "нет"
        elif key in _TWO_DECIMALS:
            text = num(float(value), 2)
        elif key in _ONE_DECIMAL:
            text = num(float(value), 1)
        else:
            text = num(round(value))
        lines.append(f"{label}{', ' + unit if unit else ''}: {text}")
    return "\n".join(lines)
