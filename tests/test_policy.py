"""Тесты уровня B: задача, крошечная модель, семплирование, пересчёт, GRPO и эталонный цикл."""

from __future__ import annotations

import hashlib
import math
import random
import time

import numpy as np
import pytest
import torch

from course_utils import arith_task, policy, profile
from course_utils.contract import validate_rollout
from course_utils.tiny_model import TINY_MODEL_DIR, build_tiny_model


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, info = policy.load_policy("tiny", device="cpu")
    return model, tokenizer, info


# --------------------------------------------------------------------------- задача


def test_tasks_deterministic_and_mixed():
    a = arith_task.make_tasks(200, seed=5)
    b = arith_task.make_tasks(200, seed=5)
    assert a == b
    assert a != arith_task.make_tasks(200, seed=6)
    levels = {t.difficulty for t in a}
    assert levels == {1, 2, 3}
    for t in a:
        assert str(eval(t.expression)) == str(t.answer)  # независимая проверка ответа
        assert t.expression in t.prompt


def test_tasks_bad_input():
    with pytest.raises(ValueError, match="n"):
        arith_task.make_tasks(0)
    with pytest.raises(ValueError, match="mix"):
        arith_task.make_tasks(3, mix={4: 1.0})
    with pytest.raises(ValueError, match="mix"):
        arith_task.make_tasks(3, mix={1: 0.0})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>12</answer>", {"correctness": 1.0, "format": 1.0}),
        ("Думаю... <answer> 12 </answer>", {"correctness": 1.0, "format": 1.0}),
        ("<answer>13</answer>", {"correctness": 0.0, "format": 1.0}),
        ("12", {"correctness": 0.0, "format": 0.0}),
        ("<answer>12</answer><answer>12</answer>", {"correctness": 0.0, "format": 0.0}),
        ("<answer>двенадцать</answer>", {"correctness": 0.0, "format": 0.0}),
    ],
)
def test_verify(text, expected):
    task = arith_task.ArithTask("t", 1, "5+7", 12, "Вычисли: 5+7.")
    assert arith_task.verify(text, task) == expected


def test_verify_bad_input():
    with pytest.raises(ValueError, match="response_text"):
        arith_task.verify(None, arith_task.make_tasks(1)[0])


# --------------------------------------------------------------------------- крошечная модель


def test_tiny_model_files_small_and_qwen2(tiny):
    model, tokenizer, info = tiny
    total = sum(p.stat().st_size for p in TINY_MODEL_DIR.iterdir() if p.is_file())
    assert total < 5 * 2**20, f"модель занимает {total / 2**20:.2f} МиБ"
    assert model.config.model_type == "qwen2"
    assert info.is_tiny and not info.reason and info.dtype == "float32"
    assert info.num_params == sum(p.numel() for p in model.parameters())
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Вычисли: 2+2."}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_tiny_model_gives_informative_groups(tiny):
    """Критерий приёмки: при T=1 и группе 8 не менее 30 % групп со смешанными наградами."""
    model, tokenizer, _ = tiny
    batch = policy.generate_rollouts(
        model, tokenizer, policy.make_tasks(40, seed=2024), group_size=8, seed=11
    )
    frac = policy.informative_group_fraction(batch.records)
    print(f"информативных групп: {frac:.0%}")
    assert frac >= 0.30


def test_build_tiny_model_deterministic(tmp_path):
    a = build_tiny_model(tmp_path / "a", steps=2, batch_size=4, verbose=False)
    b = build_tiny_model(tmp_path / "b", steps=2, batch_size=4, verbose=False)

    def digest(p):
        return hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()

    assert digest(a) == digest(b)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    # пересборка поверх существующего каталога подменяет его целиком
    build_tiny_model(tmp_path / "a", steps=1, batch_size=4, verbose=False)
    assert digest(tmp_path / "a") != digest(b)
    assert not list(tmp_path.glob(".tiny_build_*"))


def test_build_tiny_model_bad_input(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        build_tiny_model(tmp_path / "x", steps=-1)


# --------------------------------------------------------------------------- загрузка


def test_resolve_model_name(monkeypatch):
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    assert policy.resolve_model_name() == "tiny"  # без Colab и GPU
    monkeypatch.setenv("COURSE_MODEL", "org/some-model")
    assert policy.resolve_model_name() == "org/some-model"
    assert policy.resolve_model_name("other/model") == "other/model"
    with pytest.raises(ValueError, match="name"):
        policy.resolve_model_name("  ")


def test_hub_model_offline_falls_back_fast(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    model, tokenizer, info = policy.load_policy("Qwen/Qwen2.5-0.5B-Instruct", device="cpu")
    elapsed = time.perf_counter() - t0
    assert info.reason and info.is_tiny
    assert "крошечная модель" in capsys.readouterr().out
    assert elapsed < 20, f"откат занял {elapsed:.1f} с"


def test_pick_dtype_rules(monkeypatch):
    assert policy._pick_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    assert policy._pick_dtype(torch.device("cuda")) == torch.float16  # T4
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert policy._pick_dtype(torch.device("cuda")) == torch.bfloat16  # A100 и новее
    assert policy._pick_dtype(torch.device("cpu"), "float16") == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        policy._pick_dtype(torch.device("cpu"), "int8")


def test_pick_device_errors():
    with pytest.raises(ValueError, match="device"):
        policy.pick_device("marsianin")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GPU"):
            policy.pick_device("cuda")


# --------------------------------------------------------------------------- семплирование


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.5])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95, 1.0])
def test_sampling_logprobs_match_transformers_warpers(temperature, top_p):
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(int(temperature * 100 + top_p * 10))
    logits = torch.randn(6, 300, generator=gen) * 3
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    expected = torch.log_softmax(scores, dim=-1)
    ours = policy.sampling_logprobs(logits, temperature, top_p)
    kept = torch.isfinite(expected)
    assert torch.equal(kept, torch.isfinite(ours)), "разные множества оставленных токенов"
    assert torch.allclose(ours[kept], expected[kept], atol=1e-5, rtol=0)


def test_sampling_logprobs_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        policy.sampling_logprobs(torch.zeros(3), 0.0, 1.0)
    with pytest.raises(ValueError, match="top_p"):
        policy.sampling_logprobs(torch.zeros(3), 1.0, 1.5)
    with pytest.raises(ValueError, match="logits"):
        policy.sampling_logprobs([1.0, 2.0])


def test_generate_records_valid_and_logprobs_match_recompute(tiny):
    model, tokenizer, _ = tiny
    tasks = policy.make_tasks(3, seed=1)
    batch = policy.generate_rollouts(
        model, tokenizer, tasks, group_size=4, temperature=0.8, top_p=0.9, seed=7
    )
    assert len(batch.records) == 12
    for rec in batch.records:
        assert validate_rollout(rec) == []
        assert rec.decoding == {"temperature": 0.8, "top_p": 0.9}
        assert rec.stop_reason in ("eos", "length")
    assert batch.input_tokens == sum(len(r.prompt_tokens) for r in batch.records)
    assert batch.output_tokens == sum(len(r.response_tokens) for r in batch.records)
    assert set(batch.timings) == {"prepare", "prefill", "decode", "reward"}
    # с тем же top-p тренер воспроизводит μ движка одним проходом без KV-кэша
    truncated = policy.recompute_logprobs(model, batch.records, top_p=0.9)
    for rec, lp in zip(batch.records, truncated):
        assert torch.allclose(
            lp.double(), torch.tensor(rec.behavior_logprobs, dtype=torch.float64), atol=1e-4
        )
    # по умолчанию тренер top-p не применяет: log π ≤ log μ — разрыв из-за top-p
    raw = policy.recompute_logprobs(model, batch.records)
    assert all((r <= b + 1e-6).all() for r, b in zip(raw, truncated))


def _hand_logprobs(model, rec, temperature):
    """log_softmax(logits / T) выбранных токенов политики, отдельный проход на запись, float64."""
    ids = torch.tensor([list(rec.prompt_tokens) + list(rec.response_tokens)])
    with torch.no_grad():
        z = model(input_ids=ids).logits[0, :-1].double() / temperature
    logp = z - torch.logsumexp(z, dim=-1, keepdim=True)
    target = ids[0, 1:]
    keep = torch.tensor(rec.policy_mask[1:], dtype=torch.bool)
    return logp[torch.arange(len(target)), target][keep]


def test_recompute_applies_temperature_not_top_p(tiny):
    """Как TRL и verl: тренер делит логиты на T записи, но ядро top-p не отсекает."""
    model, tokenizer, _ = tiny
    hard = policy.make_tasks(4, seed=5, mix={2: 0.5, 3: 0.5})
    batch = policy.generate_rollouts(
        model, tokenizer, hard, group_size=4, temperature=0.7, top_p=0.8, seed=3
    )
    recomputed = policy.recompute_logprobs(model, batch.records)
    gaps = []
    for rec, lp in zip(batch.records, recomputed):
        expected = _hand_logprobs(model, rec, temperature=0.7)
        assert torch.allclose(lp.double(), expected, atol=1e-5, rtol=0)
        gaps.append(torch.tensor(rec.behavior_logprobs, dtype=torch.float64) - expected)
    gap = torch.cat(gaps)
    assert (gap >= -1e-5).all(), "log μ − log π = −log(масса ядра) ≥ 0"
    assert gap.max() > 1e-2, "разрыв движка и тренера из-за top-p должен быть виден"


def test_generate_deterministic_by_seed(tiny):
    model, tokenizer, _ = tiny
    tasks = policy.make_tasks(2, seed=3)
    a = policy.generate_rollouts(model, tokenizer, tasks, group_size=3, seed=5)
    b = policy.generate_rollouts(model, tokenizer, tasks, group_size=3, seed=5)
    assert [r.response_tokens for r in a.records] == [r.response_tokens for r in b.records]


def test_generate_bad_input(tiny):
    model, tokenizer, _ = tiny
    tasks = policy.make_tasks(1)
    with pytest.raises(ValueError, match="tasks"):
        policy.generate_rollouts(model, tokenizer, [])
    with pytest.raises(ValueError, match="group_size"):
        policy.generate_rollouts(model, tokenizer, tasks, group_size=0)
    with pytest.raises(ValueError, match="top_p"):
        policy.generate_rollouts(model, tokenizer, tasks, top_p=0)
    with pytest.raises(ValueError, match="policy_version"):
        policy.generate_rollouts(model, tokenizer, tasks, policy_version=-1)


# --------------------------------------------------------------------------- GRPO


def _fake_records(rewards_by_group):
    from course_utils.contract import RolloutRecord

    recs = []
    rng = random.Random(0)
    for g, rewards in enumerate(rewards_by_group):
        for j, r in enumerate(rewards):
            n = rng.randint(1, 4)
            recs.append(
                RolloutRecord(
                    sample_id=f"g{g}-{j}",
                    policy_version=0,
                    prompt_tokens=[5, 6, 7],
                    response_tokens=[8 + k for k in range(n)],
                    policy_mask=[0, 0, 0] + [1] * n,
                    behavior_logprobs=[-1.0] * n,
                    decoding={"temperature": 1.0, "top_p": 1.0},
                    reward={"correctness": r, "format": 1.0},
                    stop_reason="eos",
                    verifier_version="test",
                    group_id=f"g{g}",
                )
            )
    return recs


def test_group_advantages_unbiased_std_like_trl_and_verl():
    """A = (r − mean)/(std + 1e-6), std — torch.std по умолчанию (несмещённая, N − 1)."""
    groups = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0]]
    recs = _fake_records(groups)
    adv = policy.group_advantages(recs)
    expected = []
    for g in groups:
        r = torch.tensor(g, dtype=torch.float64) + 0.1  # формат = 1 у всех → +0.1
        if len(g) == 1 or bool((r == r[0]).all()):
            expected += [0.0] * len(g)  # группа из одного или вырожденная: A = 0
        else:
            expected += ((r - r.mean()) / (r.std() + 1e-6)).tolist()
    assert np.allclose(adv, expected, atol=1e-12, rtol=0)
    assert np.allclose(adv[:4], [np.sqrt(3) / 2, -np.sqrt(3) / 2, -np.sqrt(3) / 2, np.sqrt(3) / 2])
    assert policy.informative_group_fraction(recs) == pytest.approx(2 / 4)


def test_informative_group_is_defined_by_the_scalar_reward():
    """Одна и та же правильность, разный формат: награды разные — группа информативна."""
    recs = _fake_records([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0]])
    recs[1].reward = {"correctness": 0.0, "format": 0.0}  # группа g0: формат 1, 0, 1, 1
    for r in recs[8:]:
        r.reward = {"correctness": 1.0}  # g2: формат не проверен (0) у обоих — вырождена
    adv = policy.group_advantages(recs)
    r0 = torch.tensor([0.1, 0.0, 0.1, 0.1], dtype=torch.float64)
    assert np.allclose(adv[:4], ((r0 - r0.mean()) / (r0.std() + 1e-6)).tolist())
    assert adv[4:] == [0.0] * 6
    assert policy.informative_group_fraction(recs) == pytest.approx(1 / 3)
    # веса награды те же, что у преимуществ: без формата g0 вырождена
    only = {"correctness": 1.0}
    assert policy.group_advantages(recs, only) == [0.0] * 10
    assert policy.informative_group_fraction(recs, only) == 0.0
    assert policy.is_informative_group([0.1, 0.0]) and not policy.is_informative_group([0.1])
    assert not policy.is_informative_group([1.1, 1.1, 1.1])


def test_grpo_step_loss_and_clip_fraction(tiny):
    model, tokenizer, _ = tiny
    import copy

    trainer = copy.deepcopy(model)
    batch = policy.generate_rollouts(
        model, tokenizer, policy.make_tasks(3, seed=9), group_size=4, seed=1
    )
    recs = batch.records
    old = policy.recompute_logprobs(trainer, recs)
    adv = policy.group_advantages(recs)
    n_tok = sum(len(o) for o in old)
    # при π_θ = π_old отношение равно 1: L = −Σ_i A_i·n_i / N
    expected_loss = -sum(a * len(o) for a, o in zip(adv, old)) / n_tok
    opt = torch.optim.SGD(trainer.parameters(), lr=0.0)
    stats = policy.grpo_step(trainer, opt, recs, old_logprobs=old)
    assert stats["loss"] == pytest.approx(expected_loss, abs=1e-5)
    assert stats["clip_fraction"] == 0.0
    assert stats["policy_tokens"] == n_tok
    assert math.isfinite(stats["grad_norm"])
    # π_old ниже на 1 нат: ρ = e > 1.2 — клиппированы ровно токены с A > 0
    shifted = [o - 1.0 for o in old]
    stats = policy.grpo_step(trainer, opt, recs, old_logprobs=shifted)
    pos = sum(len(o) for a, o in zip(adv, old) if a > 0)
    assert stats["clip_fraction"] == pytest.approx(pos / n_tok, abs=1e-6)


def test_grpo_step_changes_weights_and_bad_input(tiny):
    model, tokenizer, _ = tiny
    import copy

    trainer = copy.deepcopy(model)
    before = [p.detach().clone() for p in trainer.parameters()]
    hard = policy.make_tasks(4, seed=2, mix={2: 0.5, 3: 0.5})
    batch = policy.generate_rollouts(model, tokenizer, hard, group_size=8, seed=2)
    assert policy.informative_group_fraction(batch.records) > 0
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-3, weight_decay=0.0)
    stats = policy.grpo_step(trainer, opt, batch.records)
    assert stats["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.parameters()))
    # вырожденные группы (все награды равны) не дают градиента
    for r in batch.records:
        r.reward = {"correctness": 1.0, "format": 1.0}
    assert policy.grpo_step(trainer, opt, batch.records)["grad_norm"] == 0.0
    with pytest.raises(ValueError, match="clip_eps"):
        policy.grpo_step(trainer, opt, batch.records, clip_eps=1.5)
    with pytest.raises(ValueError, match="records"):
        policy.grpo_step(trainer, opt, [])
    with pytest.raises(ValueError, match="old_logprobs"):
        policy.grpo_step(trainer, opt, batch.records, old_logprobs=[torch.zeros(1)])


def _hand_advantages(recs):
    """A = (r − mean)/(torch.std + 1e-6) по группам, r = correctness + 0.1·format; вырожденные — 0."""
    rewards = [r.reward.get("correctness", 0.0) + 0.1 * r.reward.get("format", 0.0) for r in recs]
    out = [0.0] * len(recs)
    for g in {r.group_id for r in recs}:
        idx = [i for i, r in enumerate(recs) if r.group_id == g]
        t = torch.tensor([rewards[i] for i in idx], dtype=torch.float64)
        if len(idx) > 1 and t.max() > t.min():
            for i, a in zip(idx, ((t - t.mean()) / (t.std() + 1e-6)).tolist()):
                out[i] = a
    return out


def test_grpo_epochs_clip_fraction_matches_hand_computation(tiny):
    """Эпоха 2 идёт по сдвинутой π_θ: доля клиппирования PPO (с учётом знака A) > 0."""
    model, tokenizer, _ = tiny
    import copy

    hard = policy.make_tasks(3, seed=2, mix={2: 0.5, 3: 0.5})
    recs = policy.generate_rollouts(model, tokenizer, hard, group_size=4, seed=4).records
    old = [_hand_logprobs(model, r, 1.0).float() for r in recs]
    eps, lr = 0.2, 1.0
    two = copy.deepcopy(model)
    stats = policy.grpo_step(
        two, torch.optim.SGD(two.parameters(), lr=lr), recs, old, clip_eps=eps, epochs=2
    )
    # та же первая эпоха отдельно (SGD без состояния): веса, по которым шла эпоха 2
    one = copy.deepcopy(model)
    policy.grpo_step(one, torch.optim.SGD(one.parameters(), lr=lr), recs, old, clip_eps=eps)
    adv = _hand_advantages(recs)
    a = torch.cat([torch.full((len(o),), x, dtype=torch.float64) for o, x in zip(old, adv)])
    rho = torch.exp(torch.cat([_hand_logprobs(one, r, 1.0) for r in recs]) - torch.cat(old))
    assert ((rho - (1 + eps)).abs() > 1e-4).all() and ((rho - (1 - eps)).abs() > 1e-4).all()
    # клиппированный член активен (min выбрал его): ρ > 1+ε при A > 0 или ρ < 1−ε при A < 0
    clipped = ((rho > 1 + eps) & (a > 0)) | ((rho < 1 - eps) & (a < 0))
    expected = clipped.double().mean().item()
    assert expected > 0
    assert stats["epochs"] == 2
    assert stats["clip_fraction_by_epoch"][0] == 0.0  # ρ = 1: π_old — та же модель
    assert stats["clip_fraction_by_epoch"][1] == pytest.approx(expected, abs=1e-9)
    assert stats["clip_fraction"] == pytest.approx(expected / 2, abs=1e-9)
    # loss — среднее по эпохам: L1 = −Σ A/N при ρ = 1, L2 — клиппированная цель по новым ρ
    loss_1 = -a.mean().item()
    loss_2 = -torch.minimum(rho * a, rho.clamp(1 - eps, 1 + eps) * a).mean().item()
    assert stats["loss"] == pytest.approx((loss_1 + loss_2) / 2, abs=1e-5)
    with pytest.raises(ValueError, match="epochs"):
        policy.grpo_step(one, torch.optim.SGD(one.parameters(), lr=lr), recs, old, epochs=0)


def test_sequential_loop_clip_fraction_zero_by_construction(tiny):
    model, tokenizer, info = tiny
    import copy

    kwargs = {"tokenizer": tokenizer, "info": info, "lr": 1e-3, "max_new_tokens": 16}
    single = policy.sequential_loop(2, model=copy.deepcopy(model), **kwargs).steps
    assert list(single["epochs"]) == [1, 1]
    assert (single["clip_fraction"] == 0.0).all()  # одно обновление, π_old пересчитан: ρ = 1


def test_grpo_step_counts_tokens_with_near_zero_pi(tiny):
    """Токены, которым π_θ почти не даёт массы (log π < log 1e-8), считаются, а не прячутся."""
    model, tokenizer, _ = tiny
    import copy

    batch = policy.generate_rollouts(
        model, tokenizer, policy.make_tasks(2, seed=6), group_size=2, seed=2
    )
    recs = copy.deepcopy(batch.records)
    for rec in recs[:2]:  # последний токен ответа — самый маловероятный, T = 0.1 делает его ≈ 0
        ids = torch.tensor([list(rec.prompt_tokens) + list(rec.response_tokens)])
        with torch.no_grad():
            z = model(input_ids=ids).logits[0, -2]
        rec.response_tokens = list(rec.response_tokens[:-1]) + [int(z.argmin())]
        rec.decoding = {"temperature": 0.1, "top_p": 1.0}
    floor = math.log(1e-8)
    expected = sum(
        int((_hand_logprobs(model, r, r.decoding["temperature"]) < floor).sum()) for r in recs
    )
    assert expected >= 2
    net = copy.deepcopy(model)
    stats = policy.grpo_step(net, torch.optim.SGD(net.parameters(), lr=0.0), recs)
    assert stats["near_zero_pi_tokens"] == expected
    plain = policy.grpo_step(net, torch.optim.SGD(net.parameters(), lr=0.0), batch.records)
    assert plain["near_zero_pi_tokens"] == sum(
        int((_hand_logprobs(model, r, 1.0) < floor).sum()) for r in batch.records
    )


def test_grad_scaler_only_for_float16_autocast_on_cuda():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # без GPU GradScaler("cuda") предупреждает и выключается
        assert isinstance(policy.grad_scaler_for("cuda", torch.float16), torch.amp.GradScaler)
    assert policy.grad_scaler_for("cuda", torch.bfloat16) is None
    assert policy.grad_scaler_for("cuda", None) is None
    assert policy.grad_scaler_for(torch.device("cpu"), torch.float16) is None
    assert policy.grad_scaler_for("cpu", None) is None


def test_grpo_step_with_grad_scaler_on_cpu_gives_the_same_update(tiny):
    model, tokenizer, _ = tiny
    import copy

    hard = policy.make_tasks(3, seed=2, mix={2: 0.5, 3: 0.5})
    recs = policy.generate_rollouts(model, tokenizer, hard, group_size=4, seed=4).records
    scalers = {
        "нет": None,
        "выключен": torch.amp.GradScaler("cpu", enabled=False),
        "включён": torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1),
    }
    out = {}
    for name, scaler in scalers.items():
        net = copy.deepcopy(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        stats = policy.grpo_step(net, opt, recs, epochs=2, scaler=scaler)
        out[name] = (stats, net.state_dict())
    base, base_w = out["нет"]
    for name in ("выключен", "включён"):
        stats, weights = out[name]
        for key in ("loss", "grad_norm", "clip_fraction", "near_zero_pi_tokens"):
            assert stats[key] == pytest.approx(base[key], rel=1e-6, abs=1e-9), (name, key)
        assert stats["skipped_steps"] == 0
        assert all(torch.allclose(weights[k], base_w[k], atol=1e-7) for k in base_w), name
    assert all(torch.equal(out["выключен"][1][k], base_w[k]) for k in base_w)
    # масштаб S = 2^10 вырос дважды (по шагу на эпоху): потери действительно масштабировались
    assert scalers["включён"].get_scale() == 2.0**12


def test_sequential_loop_takes_its_scaler_from_grad_scaler_for(tiny, monkeypatch):
    model, tokenizer, info = tiny
    import copy

    calls = []
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)

    def spy(device, autocast_dtype):
        calls.append((torch.device(device).type, autocast_dtype))
        return scaler

    monkeypatch.setattr(policy, "grad_scaler_for", spy)
    policy.sequential_loop(
        2,
        model=copy.deepcopy(model),
        tokenizer=tokenizer,
        info=info,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=8,
    )
    assert calls == [("cpu", None)]  # на CPU в float32 autocast нет: настоящий выбор — None
    assert scaler.get_scale() == 16.0  # по одному шагу с масштабом на каждый шаг цикла


def test_sync_weights_copies(tiny):
    model, _, _ = tiny
    import copy

    trainer = copy.deepcopy(model)
    engine = copy.deepcopy(model)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01)
    moved = policy.sync_weights(trainer, engine)
    for a, b in zip(trainer.state_dict().values(), engine.state_dict().values()):
        assert torch.equal(a, b)
    assert moved == sum(t.numel() * t.element_size() for t in engine.state_dict().values())


# --------------------------------------------------------------------------- эталонный цикл


def test_sequential_loop_three_steps(tiny):
    model, tokenizer, info = tiny
    import copy

    t0 = time.perf_counter()
    res = policy.sequential_loop(3, model=copy.deepcopy(model), tokenizer=tokenizer, info=info)
    elapsed = time.perf_counter() - t0
    print(f"sequential_loop(3): {elapsed:.1f} с")
    assert elapsed < 30
    df = res.steps
    assert list(df["step"]) == [0, 1, 2]
    assert list(df["behavior_version"]) == [0, 1, 2]
    for col in profile.stage_columns():
        assert (df[col] > 0).all(), col
    # этапы покрывают шаг: сумма этапов = время стены в пределах 5 %
    rel = (df["wall_s"] - df["stages_sum_s"]).abs() / df["wall_s"]
    assert (rel < 0.05).all(), rel.tolist()
    assert (df["input_tokens"] > 0).all() and (df["output_tokens"] > 0).all()
    assert (df["peak_memory_bytes"] > 0).all()
    assert res.memory_kind == "пиковый RSS процесса (CPU)"
    assert len(res.records) == 3 * 4 * 4
    assert all(validate_rollout(r) == [] for r in res.records)
    assert set(res.events["stage"]) == set(policy.LOOP_STAGES)
    assert set(res.events["step"]) == {0, 1, 2}


def test_sequential_loop_bad_input():
    with pytest.raises(ValueError, match="steps"):
        policy.sequential_loop(0)
    with pytest.raises(ValueError, match="tokenizer"):
        policy.sequential_loop(1, model=torch.nn.Linear(2, 2))


def test_weight_swap_mid_response_gives_per_token_versions(tiny):
    model, tokenizer, _ = tiny
    import copy

    engine = copy.deepcopy(model)
    new_weights = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    batch = policy.generate_rollouts(
        engine,
        tokenizer,
        policy.make_tasks(2, seed=4),
        group_size=4,
        seed=3,
        policy_version=7,
        swap_at=3,
        swap_weights=new_weights,
    )
    mixed = [r for r in batch.records if r.token_policy_versions is not None]
    assert mixed, "ни один ответ не пережил подмену весов"
    for rec in mixed:
        assert rec.policy_version is None
        assert rec.token_policy_versions[:3] == [7, 7, 7]
        assert set(rec.token_policy_versions[3:]) == {8}
        assert validate_rollout(rec) == []
        rec.policy_version = 7  # одна метка на смешанный ответ — нарушение шага 12.1.4
        assert any(m.startswith("[mixed_versions]") for m in validate_rollout(rec))
    assert torch.equal(engine.state_dict()["lm_head.weight"], new_weights["lm_head.weight"])
    with pytest.raises(ValueError, match="swap_at"):
        policy.generate_rollouts(engine, tokenizer, policy.make_tasks(1), swap_at=2)


def test_kv_cache_bytes_match_formula(tiny):
    """Байты настоящего кэша transformers = 2·L·H_kv·d·T·b для T сохранённых токенов пакета."""
    model, tokenizer, _ = tiny
    cfg = model.config
    batch = policy.generate_rollouts(
        model, tokenizer, policy.make_tasks(2, seed=1), group_size=2, max_new_tokens=5, seed=0
    )
    width = max(len(r.prompt_tokens) for r in batch.records)
    steps = max(len(r.response_tokens) for r in batch.records)
    stored = len(batch.records) * (width + steps - 1)  # последний токен в кэш не пишется
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    expected = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * stored * 4
    assert batch.kv_cache_bytes == expected
    assert batch.kv_cache_tokens == stored


def test_share_prefill_same_distribution_fewer_prefill_tokens(tiny):
    model, tokenizer, _ = tiny
    tasks = policy.make_tasks(3, seed=8)
    a = policy.generate_rollouts(model, tokenizer, tasks, group_size=4, seed=5)
    b = policy.generate_rollouts(model, tokenizer, tasks, group_size=4, seed=5, share_prefill=True)
    assert b.prefill_tokens * 4 == a.prefill_tokens == a.input_tokens
    assert b.input_tokens == a.input_tokens
    for ra, rb in zip(a.records, b.records):
        assert rb.prompt_tokens == ra.prompt_tokens
        assert validate_rollout(rb) == []
    # логарифмы поведения при общем prefill совпадают с пересчётом тренера
    for rb, lp in zip(b.records, policy.recompute_logprobs(model, b.records)):
        assert torch.allclose(lp.double(), torch.tensor(rb.behavior_logprobs).double(), atol=1e-4)
    same = sum(ra.response_tokens == rb.response_tokens for ra, rb in zip(a.records, b.records))
    assert same >= len(a.records) - 1  # тот же генератор случайных чисел: ответы те же


def test_grpo_micro_batches_accumulate_the_same_gradient(tiny):
    model, tokenizer, _ = tiny
    import copy

    hard = policy.make_tasks(3, seed=2, mix={2: 0.5, 3: 0.5})
    batch = policy.generate_rollouts(model, tokenizer, hard, group_size=4, seed=4)
    results, weights = [], []
    for mb in (1, 5, 64):
        net = copy.deepcopy(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        results.append(policy.grpo_step(net, opt, batch.records, micro_batch=mb))
        weights.append(net.state_dict()["lm_head.weight"])
    for r in results[1:]:
        assert r["loss"] == pytest.approx(results[0]["loss"], abs=1e-6)
        assert r["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-4)
        assert r["policy_tokens"] == results[0]["policy_tokens"]
    assert all(torch.allclose(w, weights[0], atol=1e-6) for w in weights[1:])
    with pytest.raises(ValueError, match="micro_batch"):
        policy.recompute_logprobs(model, batch.records, micro_batch=0)
