"""12.4.8 — задержка политики или TIM (по пробе на нулевой задержке); log μ(y) при T и top-p."""

import json
import math
import random

import numpy as np

from course_utils import fmt, offpolicy
from course_utils.exercises.answers import Choice, Fields, Keyed, Number, far_apart, md_table
from course_utils.exercises.common import TOL, TOLERANCE, answer_table, hits_any
from course_utils.exercises.step import Step

_KINDS = ("llt", "ltl", "tll", "ttl", "tlt", "ltt")  # диагнозы A, B, C (l — lag, t — tim): есть оба
_VOCAB = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "<eos>", "+", "=", "-"]
_COLS = ("kind", "sample_id", "behavior_version", "trainer_version", "response_tokens")
_COLS += ("mean_abs_log_w", "max_abs_log_w", "seq_log_w")
_SD = {"lag": ((6e-3, 1e-2, 2e-2), (5e-4, 1e-3, 2e-3)), "tim": ((5e-4, 1e-3), (1e-2, 2e-2, 4e-2))}
_DIAGNOSIS = Keyed(lambda t: t["logs"], Choice(("lag", "tim")), noun="журналов")
_LOGP = Number(**TOLERANCE, high=0, unit="нат", bound="Логарифм вероятности ≤ 0")
_ANSWER = Fields({"diagnosis": _DIAGNOSIS, "behavior_logprob": _LOGP})


def share_at_zero_lag(rows: list[dict]) -> float:
    """Доля расхождения без задержки: |log w| пробы / средний |log w| строк обучения."""
    train = [r["mean_abs_log_w"] for r in rows if r["kind"] == "train"]
    return next(r["mean_abs_log_w"] for r in rows if r["kind"] == "probe_lag0") / np.mean(train)


def _lag_log(rng: random.Random, kind: str, name: str, seed: int) -> list[dict]:
    def row(label: str, sid: str, v: int, u: int, length: int, seed: int) -> dict:
        lw = offpolicy.simulate_log_ratios(u - v, length, 1, *sigmas, seed=seed)
        stats = offpolicy.log_weight_stats(lw)
        logs = round(stats["mean_abs_log_ratio"], 4), round(stats["max_abs_log_ratio"], 3)
        return dict(zip(_COLS, (label, sid, v, u, length, *logs, round(float(lw[0].sum()), 3))))

    while True:  # три строки обучения с задержкой L ≥ 1 и проба v = u по токенам одной из них
        sigmas = tuple(rng.choice(options) for options in _SD[kind])  # (σ за версию, σ TIM)
        u, lag, rows = rng.randint(120, 480), rng.randint(1, 3), []
        for i in range(3):
            sid, length = f"{name}-{rng.randint(1000, 9999)}", rng.choice([96, 160, 256, 384, 512])
            rows.append(row("train", sid, u - lag, u, length, seed + i))
            u += rng.randint(0, 1)
        p = rng.choice(rows)
        rows.append(row("probe_lag0", p["sample_id"], u, u, p["response_tokens"], seed + 9))
        seed += 100
        if share_at_zero_lag(rows) <= 0.2 if kind == "lag" else share_at_zero_lag(rows) >= 0.75:
            return rows


def _top_p_nucleus(logits: list[float], temperature: float, top_p: float):
    """(softmax(z/T), маска ядра top-p, наименьший зазор до порога 1 − p) — через offpolicy."""
    z, ids = np.tile(logits, (len(logits), 1)), np.arange(len(logits))
    probs = np.exp(offpolicy.raw_logprob(z, ids, temperature).astype(float))
    keep = np.isfinite(offpolicy.behavior_logprob(z, ids, temperature, top_p))
    return probs, keep, float(np.abs(np.cumsum(np.sort(probs))[:-1] - (1 - top_p)).min())


def _lag_logprobs(task: dict) -> dict:
    """log μ (верно), log softmax(z/T) без top-p и оба без температуры — через offpolicy."""
    z, y, T, p = np.array(task["logits"]), task["token_index"], task["temperature"], task["top_p"]
    mu, raw = offpolicy.behavior_logprob, offpolicy.raw_logprob
    values = mu(z, y, T, p), raw(z, y, T), mu(z, y, 1.0, p), raw(z, y, 1.0)
    return dict(zip(("behavior", "raw", "no_temp", "no_temp_raw"), map(float, values)))


def _lag_task(variant: int) -> dict:
    rng = random.Random(12_4_8_000 + 7919 * variant)
    kinds = zip("ABC", ["lag" if c == "l" else "tim" for c in _KINDS[variant % len(_KINDS)]])
    logs = {k: _lag_log(rng, kind, k, 1000 * variant + 10 * i) for i, (k, kind) in enumerate(kinds)}
    temperature, top_p = rng.choice([0.6, 0.7, 0.8, 1.2, 1.4]), rng.choice([0.7, 0.8, 0.9])
    vocab = rng.sample(_VOCAB, 6)
    while True:
        logits = [round(rng.uniform(-1.5, 3.0), 2) for _ in vocab]
        (_, kt, gt), (_, k1, g1) = (_top_p_nucleus(logits, t, top_p) for t in (temperature, 1.0))
        both = [i for i in range(len(vocab)) if kt[i] and k1[i]]  # в ядре и при T, и при T = 1
        if len(set(logits)) < len(logits) or min(gt, g1) < 0.01 or kt.all() or len(both) < 2:
            continue
        token = rng.choice(both)
        task = {"logits": logits, "token_index": token, "temperature": temperature, "top_p": top_p}
        if far_apart(_lag_logprobs(task).values()):
            break
    tables = "\n\n".join(
        f"Журнал **{k}**:\n\n" + md_table(_COLS, [r.values() for r in t]) for k, t in logs.items()
    )
    z_row = md_table(["токен", *(f"`{v}`" for v in vocab)], [["z", *(f"{z:.2f}" for z in logits)]])
    statement = (
        f"**Задержка политики или TIM; log μ(y) при температуре и top-p.**\n\n**Часть 1.** Фрагменты трёх журналов асинхронного обучения. Строка `train` — роллаут, которым обновлялась политика: v = `behavior_version` (версия движка, породившая его), u = `trainer_version` (версия тренера при обновлении), средний и максимальный |log w| на токен и сумма `seq_log_w` (наты), $\\log w = \\log\\pi - \\log\\mu$. Во всех строках `train` v < u. Последняя строка `probe_lag0` — проба на нулевой задержке: движок той же версии u, что у тренера, прогнал токены одного из роллаутов (v = u).\n\n{tables}\n\n"
        'Диагноз журнала — что даёт основную часть расхождения в строках `train`: `"lag"` — задержка политики, `"tim"` — рассогласование обучения и генерации (есть и при одной версии весов).\n\n'
        f"**Часть 2.** Движок семплирует с температурой T = {temperature} и top-p p = {top_p} (ядро — наименьшее множество самых вероятных токенов с суммарной вероятностью ≥ p, внутри ядра вероятности перенормируются). Логиты на одном шаге:\n\n{z_row}\n\n"
        f"Выбран токен `{vocab[token]}` (номер {token} с нуля). `behavior_logprob` — $\\log\\mu(y)$ под распределением, из которого движок действительно семплировал, в натах; {TOL}. Данные — `task_12_4_8['logs']`, `task_12_4_8['vocab']`, `task_12_4_8['logits']`, `task_12_4_8['token_index']`, `task_12_4_8['temperature']`, `task_12_4_8['top_p']`."
    )
    return {"statement": statement, "logs": logs, "vocab": vocab, **task}


def _lag_answers(task: dict) -> dict:
    """Верный ответ (ключ "") и ответы типичных ошибок — через offpolicy."""
    lp, logs = _lag_logprobs(task), task["logs"]
    diagnosis = {k: "tim" if share_at_zero_lag(rows) >= 0.5 else "lag" for k, rows in logs.items()}
    ref = {"diagnosis": diagnosis, "behavior_logprob": lp["behavior"]}
    return {
        "": ref,
        "raw_softmax_under_top_p": {**ref, "behavior_logprob": lp["raw"]},
        "no_temperature": {**ref, "behavior_logprob": lp["no_temp"]},
        "staleness_everywhere": {**ref, "diagnosis": dict.fromkeys(logs, "lag")},
        "probe_nonzero_is_tim": {**ref, "diagnosis": dict.fromkeys(logs, "tim")},
    }


def _lag_solution(task: dict, ref: dict) -> str:
    lp, rows = _lag_logprobs(task), []
    for k, log in task["logs"].items():
        lag = log[0]["trainer_version"] - log[0]["behavior_version"]
        train, probe = np.mean([r["mean_abs_log_w"] for r in log[:-1]]), log[-1]["mean_abs_log_w"]
        share = f"{fmt.num(round(share_at_zero_lag(log) * 100))}{fmt.NBSP}%"
        lag = fmt.count(lag, "версия", "версии", "версий")
        rows.append([k, lag, f"{train:.4f}", f"{probe:.4f}", share, f"`{ref['diagnosis'][k]}`"])
    T, p = task["temperature"], task["top_p"]
    probs, keep, _ = _top_p_nucleus(task["logits"], T, p)
    mass = float(probs[keep].sum())
    tokens = [
        [f"`{v}`", f"{z:.2f}", f"{z / T:.4f}", f"{q:.4f}", f"{q / mass:.4f}" if k else "вне ядра"]
        for v, z, q, k in zip(task["vocab"], task["logits"], probs, keep)
    ]
    return (
        f"**Часть 1.** Версии диагноза не ставят (v < u везде). Проба v = u убирает задержку: что осталось — TIM. Сравниваем средний |log w| на токен, нат (`seq_log_w` зависит от длины): доля пробы ≥ 50 % — `tim`, иначе `lag`.\n\n{md_table(['журнал', 'задержка', 'train', 'проба v = u', 'доля', 'диагноз'], rows)}\n\n"
        f"**Часть 2.** softmax(z/T) при T = {T}, затем ядро top-p (p = {p}): отбрасываем наименее вероятные токены, пока их сумма ≤ 1 − p, остальные перенормируем.\n\n{md_table(['токен', 'z', 'z/T', 'softmax(z/T)', 'μ (ядро, перенормировано)'], tokens)}\n\n"
        f"$$\\log\\mu(y) = \\log\\mathrm{{softmax}}(z/T)_y - \\log(\\text{{масса ядра}}) = {lp['raw']:.4f} - ({math.log(mass):.4f}) = {lp['behavior']:.4f}\\ \\text{{нат}}.$$\n\n"
        f'**Ответ:** `{{"diagnosis": {json.dumps(ref["diagnosis"])}, "behavior_logprob": {lp["behavior"]:.4f}}}`. Не то: log softmax(z/T) без ядра ({lp["raw"]:.4f}) и ядро без температуры ({lp["no_temp"]:.4f}) — не те распределения, из которых семплировал движок.'
    )


_NO_TEMPERATURE = (("behavior_logprob", "no_temp"), ("behavior_logprob", "no_temp_raw"))
_BY = {"raw_softmax_under_top_p": ("behavior_logprob",)}
_BY["no_temperature"] = hits_any(_ANSWER, _lag_logprobs, *_NO_TEMPERATURE)
_MESSAGES = {
    "raw_softmax_under_top_p": "Это log softmax(z/T) без усечения, а движок семплировал из ядра top-p, перенормированного до суммы 1: вычтите log массы ядра.",
    "no_temperature": "Вы забыли температуру: движок делит логиты на T до softmax и до отбора ядра top-p (от T зависит и само ядро).",
    "staleness_everywhere": "Диагноз по версиям не ставится: v < u во всех строках. Сравните с пробой на нулевой задержке — если расхождение там почти то же, его даёт TIM.",
    "probe_nonzero_is_tim": "Немного TIM есть всегда, проба почти никогда не даёт ровно 0. Диагноз — по доле: если без задержки остаётся малая часть расхождения, основную часть даёт задержка.",
}
_HINT = "Часть 1: сравните средний |log w| строк train с пробой probe_lag0 — если без задержки расхождение почти то же, это TIM, если почти исчезло — задержка. Часть 2: softmax(z/T), ядро top-p, перенормировка: log μ(y) = z_y/T − logsumexp(z/T по ядру)."
_SOLVE, _TRAPS = answer_table(_lag_answers, _MESSAGES, _BY, default=("diagnosis",))
STEP = Step("12.4.8", _lag_task, _SOLVE, _ANSWER, _HINT, _lag_solution, _TRAPS)
