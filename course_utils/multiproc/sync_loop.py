"""Урок 12.1, уровень C: синхронный цикл генератор → тренер в двух процессах.

Точка входа ``sync_generator_trainer`` (ранг 0 — генератор, ранг 1 — тренер) и таблица шагов
``sync_steps_frame``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from course_utils.args import integer, positive, text
from course_utils.multiproc import transport

_EXPERIMENT = "sync_generator_trainer"
_GENERATOR, _TRAINER = 0, 1  # ранги


def _reward_mean(records) -> float:
    """Средняя скалярная награда пакета: Σ r_i / N."""
    from course_utils.arith_task import scalar_reward

    return sum(scalar_reward(r.reward) for r in records) / len(records)


def _behavior_version(records) -> int:
    versions = {r.policy_version for r in records}
    if len(versions) != 1:
        raise RuntimeError(f"в одном пакете роллаутов несколько версий политики: {versions}")
    return int(versions.pop())


def sync_generator_trainer(
    rank: int,
    world_size: int,
    backend: str,
    steps: int = 3,
    prompts_per_step: int = 4,
    group_size: int = 4,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    lr: float = 1e-5,
    seed: int = 0,
    model: str = "tiny",
) -> dict:
    """Синхронный RL-цикл в двух процессах: ранг 0 — генератор, ранг 1 — тренер (world_size = 2).

    Шаг k: генератор собирает prompts_per_step · group_size роллаутов версией v и шлёт тренеру;
    тренер проверяет записи, пересчитывает старые log-вероятности, делает ``grpo_step`` (fp32,
    AdamW) и шлёт веса версии v+1; генератор ждёт ровно v+1 и только тогда начинает шаг k+1,
    поэтому задержка L = u − v = 0 (u — версия тренера до шага). SHA-256 весов сверяется в
    начале и после каждой передачи. Времена — секунды (wait_s — ожидание другой стороны,
    train_s = logprob_s + update_s), объёмы — байты; events — для диаграммы Ганта.
    """
    integer("world_size (нужно ровно 2 процесса: генератор и тренер)", world_size, 2, 2)
    steps, seed = integer("steps", steps, 1), integer("seed", seed, 0)
    prompts_per_step = integer("prompts_per_step", prompts_per_step, 1)
    group_size = integer("group_size", group_size, 1)
    max_new_tokens = integer("max_new_tokens", max_new_tokens, 1)
    lr, temperature = positive("lr", lr), positive("temperature", temperature)
    model = text("model", model)
    integer("rank (0 — генератор, 1 — тренер)", rank, _GENERATOR, _TRAINER)
    cfg = dict(locals())  # проверенные аргументы
    r = transport.start_rank(_EXPERIMENT, cfg)
    out = (_run_generator if rank == _GENERATOR else _run_trainer)(r, cfg)
    return {**r.head, **out, "events": r.stages.events}


def _step_row(step: int, behavior: int, trained_from: int) -> dict:
    """Версии шага: v — генерации, u — тренера до обновления, задержка L = u − v, версий."""
    row = {"step": step, "behavior_version": behavior}
    return row | {"trainer_version_before_update": trained_from, "lag": trained_from - behavior}


def _run_generator(r: SimpleNamespace, cfg: dict) -> dict:
    engine, stages = r.net.eval(), r.stages
    with stages.stage("handshake"):
        hello = {**transport.model_card(r.info), "checksum": transport.state_checksum(engine)}
        transport.send_object(hello, _TRAINER, r.device)
    version, rows, staging = 0, [], None
    for step in range(cfg["steps"]):
        step_t0 = time.perf_counter()
        step_seed, run_id = cfg["seed"] * 1000 + step, f"sync{cfg['seed']}"
        with stages.stage("generate", step) as gen:
            n = cfg["prompts_per_step"]
            batch = transport.sample_rollouts(engine, r.tok, cfg, n, version, step_seed, run_id)
        behavior = _behavior_version(batch.records)
        payload = {"step": step, "records": [x.to_dict() for x in batch.records]}
        with stages.stage("send_rollouts", step) as snd:
            rollout_bytes = transport.send_object(payload, _TRAINER, r.device)
        # Блокируемся, пока тренер не пришлёт веса: это и есть ожидание синхронного цикла.
        t0 = stages.now()
        meta, staging, rs = transport.recv_tensors(_TRAINER, r.device, staging)
        stages.add("wait_weights", t0, rs.wait_s, step)
        stages.add("recv_weights", t0 + rs.wait_s, rs.transfer_s, step)
        if meta.get("version") != version + 1:
            raise RuntimeError(
                f"генератор: после пакета версии {version} ожидались веса версии {version + 1}, "
                f"получена версия {meta.get('version')!r} — синхронный протокол нарушен"
            )
        with stages.stage("verify_weights", step):
            if transport.state_checksum(staging) != meta.get("checksum"):
                raise RuntimeError(
                    f"генератор: контрольная сумма весов версии {version + 1} не совпала "
                    f"с суммой тренера — веса повреждены при передаче"
                )
        load_s = transport.load_engine_weights(engine, staging, stages, step)
        version = int(meta["version"])
        row = _step_row(step, behavior, int(meta["trained_from_version"]))
        row |= {"received_version": version, "generate_s": gen.duration_s}
        row |= {"send_s": snd.duration_s, "wait_s": rs.wait_s, "weight_recv_s": rs.transfer_s}
        row |= {"load_s": load_s, "step_s": time.perf_counter() - step_t0}
        row |= {"rollout_bytes": rollout_bytes, "weight_bytes": rs.nbytes}
        row |= {"n_records": len(batch.records), "reward_mean": _reward_mean(batch.records)}
        rows.append(row)
    return {
        "role": transport.ROLE_GENERATOR,
        "steps": rows,
        "final_version": version,
        "weights_checksum": transport.state_checksum(engine),
    }


def _run_trainer(r: SimpleNamespace, cfg: dict) -> dict:
    from course_utils.policy import fp32_trainer

    stages = r.stages
    learner = fp32_trainer(r.net, r.device, cfg["lr"])
    with stages.stage("handshake"):
        hello, _ = transport.recv_object(_GENERATOR, r.device)
        transport.check_same_model(hello, r.info, "генератора")
        if hello["checksum"] != learner.checksum():
            raise RuntimeError("тренер: начальные веса генератора и тренера (версия 0) различаются")
    version, rows = 0, []
    for step in range(cfg["steps"]):
        step_t0, t0 = time.perf_counter(), stages.now()
        payload, rs = transport.recv_object(_GENERATOR, r.device)
        stages.add("wait_rollouts", t0, rs.wait_s, step)
        stages.add("recv_rollouts", t0 + rs.wait_s, rs.transfer_s, step)
        with stages.stage("validate", step):
            records = transport.records_from(payload["records"], "пакет роллаутов")
        behavior = _behavior_version(records)
        if version - behavior != 0:
            raise RuntimeError(
                f"тренер: пакет версии {behavior}, а тренер на версии {version}: в синхронном "
                f"цикле задержка должна быть 0"
            )
        with stages.stage("logprob_recompute", step) as lp:
            old = learner.logprobs(records)
        with stages.stage("grpo_update", step) as upd:
            stats = learner.update(records, old)
        trained_from, version = version, version + 1
        with stages.stage("checksum", step):
            checksum = learner.checksum()
        meta = {"version": version, "trained_from_version": trained_from, "checksum": checksum}
        with stages.stage("send_weights", step) as snd:
            weight_bytes = transport.send_tensors(
                learner.net, _GENERATOR, r.device, meta, learner.wire
            )
        row = _step_row(step, behavior, trained_from)
        row |= {"new_version": version, "wait_s": rs.wait_s, "recv_s": rs.transfer_s}
        row |= {"logprob_s": lp.duration_s, "update_s": upd.duration_s}
        row |= {"train_s": lp.duration_s + upd.duration_s, "weight_send_s": snd.duration_s}
        row |= {"step_s": time.perf_counter() - step_t0, "rollout_bytes": rs.nbytes}
        row |= {"weight_bytes": weight_bytes, "n_records": len(records)}
        row["reward_mean"] = _reward_mean(records)
        rows.append(
            row | {k: stats[k] for k in ("loss", "clip_fraction", "grad_norm", "policy_tokens")}
        )
    return {
        "role": transport.ROLE_TRAINER,
        "steps": rows,
        "final_version": version,
        "weights_checksum": learner.checksum(),
    }


# ----------------------------------------------------------------------------- таблица для ноутбука

_GENERATOR_COLUMNS = ["generate_s", "send_s", "wait_s", "weight_recv_s", "load_s"]
_TRAINER_COLUMNS = ["wait_s", "recv_s", "train_s", "weight_send_s"]


def sync_steps_frame(launch_result: Any):
    """Шаги обоих процессов (pandas.DataFrame, строка на шаг): behavior_version v,
    trainer_version_before_update u, lag = u − v, времена generator_*_s и trainer_*_s — с,
    *_bytes — байты, награда и итоги grpo_step. launch_result — итог ``multiproc.launch``."""
    import pandas as pd

    ranks = transport.rank_results(launch_result, _EXPERIMENT)
    by_role = {r["role"]: pd.DataFrame(r["steps"]) for r in ranks}
    gen, tr = by_role[transport.ROLE_GENERATOR], by_role[transport.ROLE_TRAINER]
    front = ["step", "behavior_version", "trainer_version_before_update", "lag", "new_version"]
    tail = ["rollout_bytes", "weight_bytes", "n_records", "reward_mean", "loss"]
    tail += ["clip_fraction", "grad_norm"]
    g_part = gen[_GENERATOR_COLUMNS].add_prefix("generator_").assign(step=gen["step"])
    t_part = tr[_TRAINER_COLUMNS].add_prefix("trainer_")
    merged = pd.concat([tr[front], t_part, tr[tail]], axis=1).merge(
        g_part, on="step", validate="1:1"
    )
    order = [*front, *g_part.columns[:-1], *t_part.columns, *tail]
    return merged[order].sort_values("step").reset_index(drop=True)
