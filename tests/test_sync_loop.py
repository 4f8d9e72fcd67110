"""Тесты course_utils.multiproc.sync_loop и transport: генератор и тренер как два процесса ОС (gloo на CPU).

Один настоящий запуск на 3 шага (~7 с на 2 ядрах) общий для большинства проверок; ещё один —
с тремя процессами, который обязан завершиться понятной ошибкой.
"""

from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils import multiproc, policy, tracing  # noqa: E402
from course_utils.multiproc import sync_loop, transport  # noqa: E402
from course_utils.multiproc.transport import ROLE_GENERATOR, ROLE_TRAINER  # noqa: E402

ENTRY = "course_utils.multiproc.sync_loop:sync_generator_trainer"
ARGS = {"steps": 3, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16, "seed": 0}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    res = multiproc.launch(
        ENTRY, nprocs=2, args=ARGS, timeout_s=120, run_dir=tmp_path_factory.mktemp("sync")
    )
    assert res.ok, res.summary()
    return res


def _by_role(res):
    return {r["role"]: r for r in res.results}


# ----------------------------------------------------------------------------- настоящие процессы


def test_sync_run_versions_and_lag(run):
    gen, tr = _by_role(run)[ROLE_GENERATOR], _by_role(run)[ROLE_TRAINER]
    assert (gen["rank"], tr["rank"]) == (0, 1)
    assert gen["pid"] != tr["pid"] and os.getpid() not in (gen["pid"], tr["pid"])
    assert gen["device"] == tr["device"] == "cpu"
    assert "крошечная модель" in gen["model"] and gen["model"] == tr["model"]
    for side in (gen, tr):
        steps = side["steps"]
        assert [s["step"] for s in steps] == [0, 1, 2]
        assert [s["behavior_version"] for s in steps] == [0, 1, 2]
        assert [s["trainer_version_before_update"] for s in steps] == [0, 1, 2]
        assert [s["lag"] for s in steps] == [0, 0, 0]
        assert side["final_version"] == 3
    assert [s["received_version"] for s in gen["steps"]] == [1, 2, 3]
    assert [s["new_version"] for s in tr["steps"]] == [1, 2, 3]


def test_engine_weights_equal_trainer_weights(run):
    gen, tr = _by_role(run)[ROLE_GENERATOR], _by_role(run)[ROLE_TRAINER]
    assert gen["weights_checksum"] == tr["weights_checksum"]
    model, _, _ = policy.load_policy("tiny", device="cpu")
    assert transport.state_checksum(model) != gen["weights_checksum"]  # веса обновились


def test_bytes_and_records(run):
    gen, tr = _by_role(run)[ROLE_GENERATOR], _by_role(run)[ROLE_TRAINER]
    n = ARGS["prompts_per_step"] * ARGS["group_size"]
    for g, t in zip(gen["steps"], tr["steps"]):
        assert g["n_records"] == t["n_records"] == n
        assert g["rollout_bytes"] == t["rollout_bytes"] > 0
        # fp32 на CPU: 4 байта на параметр, все параметры каждый шаг
        assert g["weight_bytes"] == t["weight_bytes"] == 4 * gen["num_params"]
        assert g["reward_mean"] == t["reward_mean"]
        for key in ("loss", "clip_fraction", "grad_norm"):
            assert math.isfinite(t[key])


def test_waits_nonnegative_and_generator_waits_for_training(run):
    gen, tr = _by_role(run)[ROLE_GENERATOR], _by_role(run)[ROLE_TRAINER]
    for side in (gen, tr):
        for row in side["steps"]:
            for key, value in row.items():
                if key.endswith("_s"):
                    assert value >= 0, (side["role"], key, value)
    gen_wait = sum(s["wait_s"] for s in gen["steps"])
    train = sum(s["train_s"] for s in tr["steps"])
    # Генератор стоит, пока тренер обучает: причинная связь, запас на шум — вдвое.
    assert train > 0 and gen_wait >= 0.5 * train
    assert sum(s["wait_s"] for s in tr["steps"]) > 0  # а тренер ждёт генерацию


def test_same_numbers_as_single_process_loop(run):
    # Раздельное размещение не меняет алгоритм: те же сиды — те же награды, loss и нормы.
    model, tok, info = policy.load_policy("tiny", device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # как в дочерних процессах; на 2 загруженных ядрах так в разы быстрее
    try:
        ref = policy.sequential_loop(
            steps=ARGS["steps"],
            model=model,
            tokenizer=tok,
            info=info,
            prompts_per_step=ARGS["prompts_per_step"],
            group_size=ARGS["group_size"],
            max_new_tokens=ARGS["max_new_tokens"],
            seed=ARGS["seed"],
        ).steps
    finally:
        torch.set_num_threads(threads)
    tr = _by_role(run)[ROLE_TRAINER]["steps"]
    assert [t["reward_mean"] for t in tr] == pytest.approx(ref["mean_reward"].tolist())
    assert [t["policy_tokens"] for t in tr] == ref["policy_tokens"].tolist()
    assert [t["grad_norm"] for t in tr] == pytest.approx(
        ref["grad_norm"].tolist(), rel=1e-4, abs=1e-6
    )
    assert [t["loss"] for t in tr] == pytest.approx(ref["loss"].tolist(), rel=1e-4, abs=1e-6)


def test_steps_frame(run):
    df = sync_loop.sync_steps_frame(run)
    assert df["step"].tolist() == [0, 1, 2]
    assert df["behavior_version"].tolist() == [0, 1, 2]
    assert df["new_version"].tolist() == [1, 2, 3]
    assert (df["lag"] == 0).all()
    for col in ("generator_wait_s", "trainer_wait_s", "trainer_train_s", "generator_generate_s"):
        assert (df[col] >= 0).all()
    assert sync_loop.sync_steps_frame(run.results).equals(df)  # и из списка словарей рангов


def test_events_frame_is_synchronous_gantt(run):
    ev = transport.events_frame(run)
    assert set(ev["worker"]) == {ROLE_GENERATOR, ROLE_TRAINER}
    assert (ev["end_s"] >= ev["start_s"]).all()

    def first(worker, stage, step):
        rows = ev[(ev["worker"] == worker) & (ev["stage"] == stage) & (ev["step"] == step)]
        assert len(rows) == 1, (worker, stage, step)
        return rows.iloc[0]

    for k in range(ARGS["steps"]):
        # Одна машина, общие часы. Проверяем только причинные следствия протокола (допуск
        # 20 мс на чтение часов): веса не приходят раньше конца обновления, следующий пакет
        # не начинается раньше них, а тренер не получает пакет раньше конца генерации.
        upd = first(ROLE_TRAINER, "grpo_update", k)
        assert first(ROLE_GENERATOR, "wait_weights", k)["end_s"] >= upd["end_s"] - 0.02
        assert first(ROLE_TRAINER, "wait_rollouts", k)["end_s"] >= (
            first(ROLE_GENERATOR, "generate", k)["end_s"] - 0.02
        )
        if k + 1 < ARGS["steps"]:
            assert first(ROLE_GENERATOR, "generate", k + 1)["start_s"] >= upd["end_s"] - 0.02
    ax = tracing.gantt(ev)
    # строки — в порядке первого события; кто из процессов стартовал раньше, зависит от ОС
    assert sorted(t.get_text() for t in ax.get_yticklabels()) == sorted(
        [ROLE_GENERATOR, ROLE_TRAINER]
    )
    plt.close(ax.figure)


def test_events_frame_by_kind(run):
    ev = transport.events_frame(run)
    kinds = transport.events_frame(run, by_kind=True)
    assert set(ev["stage"]) <= set(transport.STAGE_KINDS_RU)  # у каждой стадии есть вид
    assert kinds["detail"].tolist() == ev["stage"].tolist()
    assert kinds["stage"].tolist() == [transport.STAGE_KINDS_RU[s] for s in ev["stage"]]
    assert {"генерация", "обучение", "ожидание", "передача"} <= set(kinds["stage"])


def test_three_processes_fail_with_russian_error(tmp_path):
    res = multiproc.launch(ENTRY, nprocs=3, args={"steps": 1}, timeout_s=60, run_dir=tmp_path)
    assert not res.ok and res.status == "failed"
    assert "нужно ровно 2 процесса" in res.summary()
    assert "получено 3" in res.summary()


# ----------------------------------------------------------------------------- без процессов


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"world_size": 1}, "world_size"),
        ({"steps": 0}, "steps"),
        ({"prompts_per_step": 1.5}, "prompts_per_step"),
        ({"group_size": 0}, "group_size"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"lr": -1e-5}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"seed": -1}, "seed"),
        ({"temperature": 0.0}, "temperature"),
        ({"model": ""}, "model"),
        ({"rank": 2}, "rank"),
    ],
)
def test_sync_bad_arguments(kwargs, name):
    call = {"rank": 0, "world_size": 2, "backend": "gloo", **kwargs}
    with pytest.raises(ValueError, match=name):
        sync_loop.sync_generator_trainer(**call)


def test_state_checksum():
    a = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
    same = {"b": torch.ones(3), "w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    assert transport.state_checksum(a) == transport.state_checksum(same)  # порядок имён не важен
    changed = {"w": a["w"].clone(), "b": a["b"].clone()}
    changed["w"][1, 2] += 1e-6
    assert transport.state_checksum(changed) != transport.state_checksum(a)
    half = {k: v.to(torch.bfloat16) for k, v in a.items()}
    assert transport.state_checksum(a, dtype="bfloat16") == transport.state_checksum(half)
    assert transport.state_checksum(half) != transport.state_checksum(a)
    net = torch.nn.Linear(3, 2)
    assert transport.state_checksum(net) == transport.state_checksum(dict(net.named_parameters()))
    with pytest.raises(ValueError, match="tensors"):
        transport.state_checksum({})
    with pytest.raises(ValueError, match="tensors"):
        transport.state_checksum({"w": [1.0]})
    with pytest.raises(ValueError, match="dtype"):
        transport.state_checksum(a, dtype="float99")


def test_send_recv_need_process_group_and_valid_peer():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="не инициализирован"):
        transport.send_object({"a": 1}, dst=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="dst.*собственным рангом"):
            transport.send_object({"a": 1}, dst=0)
        with pytest.raises(ValueError, match="src"):
            transport.recv_object(src=3)
        with pytest.raises(ValueError, match="dst"):
            transport.send_tensors({"w": torch.ones(2)}, dst=True)
    finally:
        dist.destroy_process_group()


def test_frames_reject_bad_input(run):
    failed = multiproc.LaunchResult(
        ok=False, status="failed", nprocs=2, backend="gloo", wall_s=1.0, results=[None, None]
    )
    with pytest.raises(ValueError, match="неуспешно"):
        sync_loop.sync_steps_frame(failed)
    with pytest.raises(ValueError, match="ролей"):
        transport.events_frame([{"role": ROLE_GENERATOR}])
    with pytest.raises(ValueError, match="launch_result"):
        sync_loop.sync_steps_frame(42)
