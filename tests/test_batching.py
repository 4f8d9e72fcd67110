"""Статическое и группированное по длине пакетирование на крошечной модели."""

import pytest

from course_utils import batching, policy


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = policy.load_policy("tiny", device="cpu")
    return model, tokenizer


def test_response_lengths_deterministic_and_bounded():
    a = batching.response_lengths(200, seed=3, median=10, max_len=40)
    assert a == batching.response_lengths(200, seed=3, median=10, max_len=40)
    assert min(a) >= 1 and max(a) <= 40
    assert sorted(a)[100] in range(7, 14)  # медиана около заданной
    with pytest.raises(ValueError, match="n"):
        batching.response_lengths(0)
    with pytest.raises(ValueError, match="median"):
        batching.response_lengths(5, median=50, max_len=10)


def test_decode_fixed_lengths_utilization(tiny):
    model, tok = tiny
    lengths = [2, 5, 3, 10]
    out = batching._decode_fixed_lengths(model, tok, policy.make_tasks(4, seed=1), lengths)
    assert out["steps"] == 10
    assert out["useful_tokens"] == 20 and out["slot_steps"] == 40
    assert out["utilization"] == 0.5
    assert out["decode_s"] > 0 and out["prefill_s"] > 0
    with pytest.raises(ValueError, match="lengths"):
        batching._decode_fixed_lengths(model, tok, policy.make_tasks(2, seed=1), [1, 0])


def test_bucketing_raises_slot_utilization(tiny):
    model, tok = tiny
    tasks = policy.make_tasks(12, seed=2)
    lengths = batching.response_lengths(12, seed=4, median=6, max_len=30)
    table = batching.compare_batching(model, tok, tasks, lengths, n_buckets=3).set_index(
        "стратегия"
    )
    static, bucketed = table.loc["статический пакет"], table.loc["по длине"]
    assert static["полезных токенов"] == bucketed["полезных токенов"] == sum(lengths)
    assert static["загрузка слотов U"] == pytest.approx(sum(lengths) / (12 * max(lengths)))
    assert bucketed["загрузка слотов U"] >= static["загрузка слотов U"]
    with pytest.raises(ValueError, match="n_buckets"):
        batching.compare_batching(model, tok, tasks, lengths, n_buckets=0)


def test_compare_batching_states_repeats_in_header(tiny):
    model, tok = tiny
    tasks = policy.make_tasks(6, seed=2)
    lengths = batching.response_lengths(6, seed=4, median=4, max_len=12)
    table = batching.compare_batching(model, tok, tasks, lengths, n_buckets=2, repeats=2)
    col = "декодирование, с (медиана из 2)"  # число повторов видно в заголовке
    assert col in table.columns and (table[col] > 0).all()
    rate = table["полезных токенов"] / table[col]
    assert table["полезных токенов/с"].tolist() == pytest.approx(rate.tolist())
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="repeats"):
            batching.compare_batching(model, tok, tasks, lengths, n_buckets=2, repeats=bad)


def test_stale_prefix_cache_differs_after_weight_update(tiny):
    import copy

    import torch

    model, tok = tiny
    task = policy.make_tasks(1, seed=3)[0]
    same = batching.stale_prefix_error(copy.deepcopy(model), model.state_dict(), tok, task)
    assert same["max_abs_dlogp"] == 0.0 and same["mean_kl"] == 0.0  # те же веса: кэш годен
    new = {k: v + 0.02 * torch.randn_like(v) for k, v in model.state_dict().items()}
    engine = copy.deepcopy(model)
    res = batching.stale_prefix_error(engine, new, tok, task, probe_tokens=3)
    assert res["max_abs_dlogp"] > 1e-3 and res["mean_kl"] > 0 and res["probe_tokens"] == 3
    assert torch.equal(engine.state_dict()["lm_head.weight"], new["lm_head.weight"])
    with pytest.raises(ValueError, match="probe_tokens"):
        batching.stale_prefix_error(engine, new, tok, task, probe_tokens=0)


def test_static_and_continuous_batching_against_hand_values():
    lengths = [4, 4, 5, 5, 5, 6, 6, 20]
    st = batching.static_batching(lengths, batch_size=8)
    assert st["шагов"] == 20 and st["загрузка слотов U"] == 55 / 160  # пример лекции, U ≈ 0.344
    st4 = batching.static_batching(lengths, batch_size=4)
    assert st4["шагов"] == 5 + 20 and st4["пакетов"] == 2
    assert st4["загрузка слотов U"] == 55 / (4 * 5 + 4 * 20)
    cont = batching.continuous_batching(lengths, slots=4)
    # слоты: 4,4,5,5 → затем 5 (в 4), 6 (в 4), 6 (в 5), 20 (в 5) → окончание 25
    assert cont["шагов"] == 25 and cont["загрузка слотов U"] == 55 / (4 * 25)
    many = batching.response_lengths(64, seed=2)
    assert (
        batching.continuous_batching(many, 8)["загрузка слотов U"]
        >= batching.static_batching(many, 8)["загрузка слотов U"]
    )
    with pytest.raises(ValueError, match="slots"):
        batching.continuous_batching(lengths, 0)
    with pytest.raises(ValueError, match="lengths"):
        batching.static_batching([3, 0], 2)
