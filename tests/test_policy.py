"""Тесты уровня B: задача, крошечная модель, семплирование, пересчёт, GRPO и эталонный цикл."""

from __future__ import annotations

import hashlib
import math
import random
import time

import numpy as np
import pytest
import torch

from course_utils import arith_task, policy
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
    assert info.is_tiny and not info.fell_back and info.dtype == "float32"
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
    assert info.fell_back and info.is_tiny
    assert "крошечная модель" in capsys.readouterr().out
    assert elapsed < 20, f"откат занял {elapsed:.1f} с"


def test_pick_dtype_rules(monkeypatch):
    assert policy.pick_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    assert policy.pick_dtype(torch.device("cuda")) == torch.float16  # T4
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert policy.pick_dtype(torch.device("cuda")) == torch.bfloat16  # A100 и новее
    assert policy.pick_dtype(torch.device("cpu"), "float16") == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        policy.pick_dtype(torch.device("cpu"), "int8")


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
    # тренер пересчитывает те же величины одним проходом без KV-кэша
    recomputed = policy.recompute_logprobs(model, batch.records)
    for rec, lp in zip(batch.records, recomputed):
        assert torch.allclose(
            lp.double(), torch.tensor(rec.behavior_logprobs, dtype=torch.float64), atol=1e-4
        )
    # сырой softmax (без top-p) даёт другие, меньшие по модулю числа — это и есть TIM из-за top-p
    raw = policy.recompute_logprobs(model, batch.records, temperature=0.8, top_p=1.0)
    assert all((r <= b + 1e-6).all() for r, b in zip(raw, recomputed))


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


def test_group_advantages_match_numpy():
    groups = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]]
    recs = _fake_records(groups)
    adv = policy.group_advantages(recs)
    expected = []
    for g in groups:
        r = np.array(g) + 0.1  # формат = 1 у всех → +0.1
        s = r.std()
        expected += list(np.zeros_like(r) if s == 0 else (r - r.mean()) / (s + 1e-6))
    assert np.allclose(adv, expected)
    assert policy.informative_group_fraction(recs) == pytest.approx(2 / 3)


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
    for col in res.stage_columns():
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
    with pytest.raises(ValueError, match="cache"):
        policy.cache_bytes(None)


def test_colocated_memory_timeline_exact_accounting(tiny):
    model, tokenizer, info = tiny
    tl = policy.colocated_memory_timeline(
        model, tokenizer, policy.make_tasks(2, seed=1), group_size=2, max_new_tokens=6
    )
    names = [name for name, _ in tl.phases]
    assert names == [
        "генерация",
        "пересчёт log π",
        "прямой и обратный проход",
        "шаг оптимизатора",
        "после шага",
    ]
    weights = sum(p.numel() * 4 for p in model.parameters())
    comps = dict(tl.phases)
    assert all(c["веса"] == weights for c in comps.values())
    # AdamW: два момента float32 на параметр плюс скаляр step на каждый тензор параметров
    n_tensors = len(list(model.parameters()))
    assert comps["генерация"]["состояние оптимизатора"] == 2 * weights + 4 * n_tensors
    assert comps["прямой и обратный проход"]["градиенты"] == weights
    assert "градиенты" not in comps["после шага"] and "KV-кэш" not in comps["пересчёт log π"]
    assert comps["генерация"]["KV-кэш"] > 0
    assert tl.gpu == [] and tl.device == "cpu"
    with pytest.raises(ValueError, match="tasks"):
        policy.colocated_memory_timeline(model, tokenizer, [])


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
