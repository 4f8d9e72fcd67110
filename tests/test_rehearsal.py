"""Уровень B настоящей формы без сети: случайные веса, репетиция цикла и сверка памяти."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_utils import memory, policy, rehearsal
from course_utils.memory import ModelShape

REPO_ROOT = Path(__file__).resolve().parent.parent

# Опубликованные числа параметров (data/model_configs/README.md), независимые от кода сборки.
PUBLISHED = {
    "Qwen2.5-0.5B": 494_032_768,
    "Qwen2.5-1.5B": 1_543_714_304,
    "Qwen2.5-7B": 7_615_616_512,
    "Llama-3.1-8B": 8_030_261_248,
    "SmolLM2-135M": 134_515_008,
    "SmolLM2-360M": 361_821_120,
}


@pytest.mark.parametrize("name, n_params", sorted(PUBLISHED.items()))
def test_random_shape_has_the_published_parameter_count(name, n_params):
    model, tokenizer = policy._random_shape_model(name, device="meta")  # без выделения памяти
    assert sum(p.numel() for p in model.parameters()) == n_params
    assert model.config.vocab_size == ModelShape.from_name(name).vocab_size
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_random_weights_are_seeded_and_leave_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, _ = policy._random_shape_model("SmolLM2-135M")
    after = torch.rand(1)
    b, _ = policy._random_shape_model("SmolLM2-135M")
    assert torch.equal(after, expected_next)  # глобальное зерно не сдвинуто
    wa, wb = a.model.layers[0].self_attn.q_proj.weight, b.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(wa, wb) and float(wa.detach().std()) > 0


def test_course_model_env_selects_random_shape(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL", "random:SmolLM2-135M")
    model, tokenizer, info = policy.load_policy()
    assert info.is_random and not info.is_tiny and info.num_params == 134_515_008
    assert "случайные веса, настоящая форма" in info.describe()
    batch = policy.generate_rollouts(
        model, tokenizer, policy.make_tasks(1, seed=0), group_size=2, max_new_tokens=4
    )
    # Случайная модель выбирает id из словаря 49 152, токенизатор курса знает 320.
    assert all("⟨" in text for text in batch.texts)


def test_unknown_shape_is_refused_in_russian():
    with pytest.raises(ValueError, match="data/model_configs"):
        policy.load_policy("random:GPT-5")


def test_decode_ids_shows_unknown_ids_as_placeholders():
    _, tokenizer, _ = policy.load_policy("tiny")
    known = tokenizer("7+5=12", add_special_tokens=False)["input_ids"]
    assert policy._decode_ids(tokenizer, known) == tokenizer.decode(known)
    text = policy._decode_ids(tokenizer, [*known[:2], 100_000, *known[2:], 151_935])
    assert text == (
        tokenizer.decode(known[:2]) + "⟨100000⟩" + tokenizer.decode(known[2:]) + "⟨151935⟩"
    )


def test_predicted_peak_is_the_sum_of_its_terms():
    shape = ModelShape.from_name("Qwen2.5-0.5B")
    terms = rehearsal._predicted_peak_bytes(shape, 4, sequences=4, tokens_per_sequence=40,
                                           micro_batch=8)  # fmt: skip
    n = 494_032_768
    assert terms["engine_weights"] == 4 * n
    assert terms["trainer_fp32_adam"] == 16 * n
    assert terms["train_logits"] == 3 * 4 * 40 * 151_936 * 4
    assert terms["kv_cache"] == 2 * 24 * 2 * 64 * (4 * 40) * 4
    assert terms["total"] == sum(v for k, v in terms.items() if k != "total")


def test_rehearse_cli_at_smollm2_shape_reports_and_predicts_memory():
    # Отдельный процесс: рост RSS меряется от его собственного старта, без моделей тестов.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "course_utils.policy",
        "rehearse",
        "--model",
        "random:SmolLM2-135M",
    ]
    cmd += ["--steps", "1", "--max-new-tokens", "8", "--json"]
    out = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    report = json.loads(lines[-1])
    print(json.dumps(report, ensure_ascii=False, indent=1))  # цифры бенчмарка в журнале теста
    assert report["n_params"] == 134_515_008
    assert report["device"] == "cpu" and report["dtype"] == "float32"
    assert report["weights"] == "случайные веса, настоящая форма"
    assert set(report["stage_s"]) == set(policy.LOOP_STAGES)
    for stage in ("prefill", "decode", "logprob_recompute", "forward_backward", "optimizer_step"):
        assert report["stage_s"][stage] > 0
    assert 0 < report["output_tokens"] <= report["sequences_per_step"] * 8
    assert report["decode_tokens_per_s"] > 0
    assert report["peak_kind"] == "рост RSS процесса"
    measured, predicted = report["peak_bytes_measured"], report["peak_bytes_predicted"]
    # 16 Б/параметр тренера + веса движка — больше 2,5 ГиБ; расхождение с измерением ≤ 25 %.
    assert predicted > 2.5 * 2**30
    assert abs(predicted - measured) <= 0.25 * measured, (predicted, measured)


def test_policy_label_names_random_weights():
    info = policy.PolicyInfo("random:Qwen2.5-0.5B", 494_032_768, "cpu", "float32", False,
                             is_random=True)  # fmt: skip
    assert info.label == "random:Qwen2.5-0.5B (случайные веса, настоящая форма)"
    assert policy.PolicyInfo("tiny_arith_lm", 1, "cpu", "float32", True).label == "tiny_arith_lm"


QWEN05 = 494_032_768  # параметров Qwen2.5-0.5B (опубликовано, см. PUBLISHED)
R = rehearsal  # статьи: R.ENGINE, R.TRAINER, R.GRADS, R.ADAM, R.KV, R.TEMP


def test_predicted_timeline_is_the_calculator_by_phase():
    shape = ModelShape.from_name("Qwen2.5-0.5B")
    phases = dict(R._predicted_timeline(shape, 2, kv_tokens=1000, logits_tokens=8 * 512))
    assert list(phases) == list(R.PHASES)
    logits = 8 * 512 * 151_936 * 4  # P · V · 4 Б
    kv = 2 * 24 * 2 * 64 * 1000 * 2  # 2 · L · H_kv · d_h · N_kv · 2 Б
    always = {R.ENGINE: 2 * QWEN05, R.TRAINER: 4 * QWEN05, R.ADAM: 8 * QWEN05}
    grads = {R.GRADS: 4 * QWEN05}
    expected = [{R.KV: kv}, {R.TEMP: logits}, {**grads, R.TEMP: 3 * logits}, grads, {}]
    for (phase, comps), extra in zip(phases.items(), expected):
        assert {k: v for k, v in comps.items() if v} == always | extra, phase
    assert memory.colocation_peak(list(phases.items()))[1] == "прямой и обратный проход"
    # Верхняя оценка репетиции — все статьи сразу: ровно сумма максимумов той же шкалы.
    terms = R._predicted_peak_bytes(shape, 4, sequences=4, tokens_per_sequence=40, micro_batch=8)
    same = R._predicted_timeline(shape, 4, kv_tokens=4 * 40, logits_tokens=4 * 40)
    assert memory.sum_of_component_maxima(same) == terms["total"]
    assert memory.colocation_peak(same)[0] < terms["total"]


@pytest.mark.parametrize("kwargs, name", [({"kv_tokens": 0}, "kv_tokens"),
                                          ({"logits_tokens": 0.5}, "logits_tokens")])  # fmt: skip
def test_predicted_timeline_refuses_bad_counts_in_russian(kwargs, name):
    args = {"kv_tokens": 10, "logits_tokens": 10} | kwargs
    with pytest.raises(ValueError, match=f"{name}.*должно быть"):
        R._predicted_timeline(ModelShape.from_name("Qwen2.5-0.5B"), 2, **args)


@pytest.fixture(scope="module")
def timeline():
    model, tokenizer, _ = policy.load_policy("tiny", device="cpu")
    tasks = policy.make_tasks(2, seed=1)
    frame = R.memory_timeline(model, tokenizer, tasks, group_size=2, max_new_tokens=6)
    return model, frame


def test_memory_timeline_counts_state_tensors_exactly(timeline):
    model, frame = timeline
    assert frame.attrs["device"] == "cpu" and frame.attrs["dtype"] == "float32"
    assert list(frame["фаза"].unique()) == list(R.PHASES)
    got = {(r[0], r[1]): r[2:] for r in frame.itertuples(index=False)}  # (pred, meas, diff)
    # Независимо: Σ numel · element_size по настоящим параметрам (движок — сама model, float32).
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
    kv *= frame.attrs["kv_tokens"]
    expected = {R.ENGINE: weights, R.TRAINER: weights, R.ADAM: 2 * weights}  # m и v без step
    for phase in R.PHASES:
        exact = expected | ({R.KV: kv} if phase == "генерация" else {})
        if phase in ("прямой и обратный проход", "шаг оптимизатора"):
            exact[R.GRADS] = weights
        shown = {k for p, k in got if p == phase}
        assert shown == set(exact) | {R.TEMP}, phase  # градиентов и KV-кэша вне своих фаз нет
        for k, value in exact.items():
            assert got[phase, k] == (value, value, 0), (phase, k)
    # Калькулятор не знает активаций слоёв: обучение держит больше трёх копий логитов.
    pred, meas, diff = got["прямой и обратный проход", R.TEMP]
    assert meas > pred > 0 and diff == meas - pred
    # Синхронизация copy_ на месте, тензор за тензором: ни байта сверх состояния.
    assert got["синхронизация весов", R.TEMP][1] == 0


def test_memory_timeline_peak_is_colocation_peak_of_the_table(timeline):
    _, frame = timeline
    for column in ("предсказано, Б", "измерено, Б"):
        by_phase = frame.groupby("фаза", sort=False)
        phases = [(p, dict(zip(g["статья"], g[column]))) for p, g in by_phase]
        totals = by_phase[column].sum()
        assert memory.colocation_peak(phases) == (totals.max(), totals.idxmax())
    # Σ статей фазы — пик, измеренный в фазе; максимум — в обучении (градиенты + активации).
    assert totals.to_dict() == frame.attrs["peaks"]
    assert memory.colocation_peak(phases) == (max(totals), "прямой и обратный проход")


@pytest.mark.parametrize("kwargs, name", [({"tasks": []}, "tasks"), ({"micro_batch": 0}, "micro_batch"),
                                          ({"lr": -1.0}, "lr")])  # fmt: skip
def test_memory_timeline_refuses_bad_input_in_russian(timeline, kwargs, name):
    model, _ = timeline
    _, tokenizer, _ = policy.load_policy("tiny", device="cpu")
    args = {"tasks": policy.make_tasks(1, seed=0)} | kwargs
    with pytest.raises(ValueError, match=name):
        R.memory_timeline(model, tokenizer, **args)
