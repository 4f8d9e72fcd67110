"""12.4.8 — задержка политики или TIM (по журналам); log μ(y) при температуре и top-p."""

import json
import math
import random

import numpy as np

from course_utils import fmt, offpolicy
from course_utils.exercises.answers import Choice, Fields, Keyed, md_table
from course_utils.exercises.lesson_12_4.token_ratios import TOL, Approx, any_key, distinct, over
from course_utils.exercises.step import Step, Trap

_KINDS = (("lag", "lag", "tim"), ("lag", "tim", "lag"), ("tim", "lag", "lag"),
          ("tim", "tim", "lag"), ("tim", "lag", "tim"), ("lag", "tim", "tim"))  # fmt: skip  # оба диагноза
_VOCAB = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "<eos>", "+", "=", "-"]
_COLS = ("kind", "sample_id", "behavior_version", "trainer_version", "response_tokens",
         "mean_abs_log_w", "max_abs_log_w", "seq_log_w")  # fmt: skip


def _row(kind: str, sid: str, v: int, u: int, length: int, sigmas: tuple, seed: int) -> dict:
    """Строка журнала: статистика log w при задержке u − v (offpolicy.simulate_log_ratios)."""
    lw = offpolicy.simulate_log_ratios(u - v, length, 1, *sigmas, seed=seed)
    stats = offpolicy.log_weight_stats(lw)
    return {"kind": kind, "sample_id": sid, "behavior_version": v, "trainer_version": u,
            "response_tokens": length, "mean_abs_log_w": round(stats["mean_abs_log_ratio"], 4),
            "max_abs_log_w": round(stats["max_abs_log_ratio"], 3),
            "seq_log_w": round(float(lw[0].sum()), 3)}  # fmt: skip  # log w_seq = Σ_t log w_t


def share_at_zero_lag(rows: list[dict]) -> float:
    """Доля расхождения, которая остаётся без задержки: |log w| пробы / средний |log w| обучения."""
    train = [r["mean_abs_log_w"] for r in rows if r["kind"] == "train"]
    return next(r["mean_abs_log_w"] for r in rows if r["kind"] == "probe_lag0") / np.mean(train)


def _log(rng: random.Random, kind: str, name: str, seed: int) -> list[dict]:
    """Три строки обучения с задержкой L ≥ 1 и проба на нулевой задержке по токенам одной из них."""
    while True:
        if kind == "lag":  # (σ на версию задержки, σ TIM): TIM мал
            sigmas = (rng.choice([0.006, 0.01, 0.02]), rng.choice([0.0005, 0.001, 0.002]))
        else:  # TIM велик, каждая версия сдвигает политику мало
            sigmas = (rng.choice([0.0005, 0.001]), rng.choice([0.01, 0.02, 0.04]))
        u, lag, rows = rng.randint(120, 480), rng.randint(1, 3), []
        for i in range(3):
            sid, length = f"{name}-{rng.randint(1000, 9999)}", rng.choice([96, 160, 256, 384, 512])
            rows.append(_row("train", sid, u - lag, u, length, sigmas, seed + i))
            u += rng.randint(0, 1)
        probe = rng.choice(rows)
        rows.append(_row("probe_lag0", probe["sample_id"], u, u, probe["response_tokens"], sigmas, seed + 9))  # fmt: skip
        seed += 100
        if share_at_zero_lag(rows) <= 0.2 if kind == "lag" else share_at_zero_lag(rows) >= 0.75:
            return rows


def _nucleus(logits: list[float], temperature: float, top_p: float):
    """(softmax(z/T), маска ядра top-p, наименьший зазор до порога 1 − p) — через offpolicy."""
    z, ids = np.tile(logits, (len(logits), 1)), np.arange(len(logits))
    probs = np.exp(offpolicy.raw_logprob(z, ids, temperature).astype(float))
    keep = np.isfinite(offpolicy.behavior_logprob(z, ids, temperature, top_p))
    return probs, keep, float(np.abs(np.cumsum(np.sort(probs))[:-1] - (1 - top_p)).min())


def _logprobs(task: dict) -> dict:
    """log μ (верно), log softmax(z/T) без top-p и log μ без температуры — через offpolicy."""
    z, y, T, p = np.array(task["logits"]), task["token_index"], task["temperature"], task["top_p"]
    mu, raw = offpolicy.behavior_logprob, offpolicy.raw_logprob
    return {"behavior": float(mu(z, y, T, p)), "raw": float(raw(z, y, T)),
            "no_temp": float(mu(z, y, 1.0, p)), "no_temp_raw": float(raw(z, y, 1.0))}  # fmt: skip


def _diagnosis(task: dict) -> dict:
    return {name: "tim" if share_at_zero_lag(rows) >= 0.5 else "lag" for name, rows in task["logs"].items()}  # fmt: skip


def make_task(variant: int) -> dict:
    rng = random.Random(12_4_8_000 + 7919 * variant)
    logs = {name: _log(rng, kind, name, 1000 * variant + 10 * i)
            for i, (name, kind) in enumerate(zip("ABC", _KINDS[variant % len(_KINDS)]))}  # fmt: skip
    temperature, top_p = rng.choice([0.6, 0.7, 0.8, 1.2, 1.4]), rng.choice([0.7, 0.8, 0.9])
    vocab = rng.sample(_VOCAB, 6)
    while True:
        logits = [round(rng.uniform(-1.5, 3.0), 2) for _ in vocab]
        (_, keep_t, gap_t), (_, keep_1, gap_1) = (
            _nucleus(logits, t, top_p) for t in (temperature, 1.0)
        )
        both = [i for i in range(len(vocab)) if keep_t[i] and keep_1[i]]
        if (
            len(set(logits)) < len(logits)
            or min(gap_t, gap_1) < 0.01
            or keep_t.all()
            or len(both) < 2
        ):
            continue
        token = rng.choice(both)
        lp = _logprobs({"logits": logits, "token_index": token, "temperature": temperature, "top_p": top_p})  # fmt: skip
        if distinct([lp["behavior"], lp["raw"], lp["no_temp"], lp["no_temp_raw"]]):
            break
    tables = [f"Журнал **{name}**:\n\n" + md_table(_COLS, [[r[c] for c in _COLS] for r in rows])
              for name, rows in logs.items()]  # fmt: skip
    statement = (
        "**Задержка политики или TIM; log-вероятность поведения при температуре и top-p.**\n\n"
        "**Часть 1.** Три фрагмента журналов асинхронного обучения. Строка `train` — роллаут, "
        "которым обновлялась политика: `behavior_version` — версия весов движка, которая его "
        "породила (v), `trainer_version` — версия тренера в момент обновления (u), и статистика "
        "$\\log w = \\log\\pi - \\log\\mu$ по токенам ответа: средний и максимальный |log w| "
        "(наты на токен) и сумма по последовательности `seq_log_w` (наты). Во всех строках "
        "`train` v < u. Последняя строка журнала, `probe_lag0`, — проба на нулевой задержке: "
        "движок, загруженный той же версией u, что и тренер, прогнал токены одного из роллаутов, "
        "и тренер их пересчитал (v = u).\n\n"
        + "\n\n".join(tables)
        + "\n\nДля каждого журнала поставьте диагноз — что даёт основную часть расхождения log w "
        'в строках `train`: `"lag"` — задержка политики (роллауты собраны более старой версией) '
        'или `"tim"` — рассогласование обучения и генерации (оно есть и при одной версии '
        "весов).\n\n"
        f"**Часть 2.** Движок семплирует с температурой T = {temperature} и top-p p = {top_p} "
        "(ядро — наименьшее множество самых вероятных токенов с суммарной вероятностью ≥ p; "
        "вероятности внутри ядра перенормируются). Логиты крошечного словаря на одном шаге:\n\n"
        + md_table(
            ["токен", *(f"`{v}`" for v in vocab)], [["логит z", *(f"{z:.2f}" for z in logits)]]
        )
        + "\n\n"
        f"Выбран токен `{vocab[token]}` (номер {token}, с нуля). Найдите `behavior_logprob` — "
        "$\\log\\mu(y)$, логарифм вероятности этого токена под распределением, из которого "
        "движок действительно семплировал, в натах.\n\n"
        "Данные — в `task_12_4_8['logs']`, `task_12_4_8['vocab']`, `task_12_4_8['logits']`, "
        "`task_12_4_8['token_index']`, `task_12_4_8['temperature']`, `task_12_4_8['top_p']`.\n\n"
        'Ответ — словарь `{"diagnosis": {"A": "lag" или "tim", "B": …, "C": …}, '
        f'"behavior_logprob": …}}`; для log-вероятности {TOL}.'
    )
    return {"statement": statement, "logs": logs, "vocab": vocab, "logits": logits,
            "token_index": token, "temperature": temperature, "top_p": top_p}  # fmt: skip


def solve(task: dict) -> dict:
    return {"diagnosis": _diagnosis(task), "behavior_logprob": _logprobs(task)["behavior"]}


def solution(task: dict, ref: dict) -> str:
    lp, parts = _logprobs(task), []
    for name, rows in task["logs"].items():
        train, share, label = rows[:-1], share_at_zero_lag(rows), ref["diagnosis"][name]
        lag = fmt.count(
            train[0]["trainer_version"] - train[0]["behavior_version"], "версия", "версии", "версий"
        )
        why = "без задержки расхождение почти то же — его даёт TIM" if label == "tim" else "без задержки расхождение почти исчезает — его даёт задержка"  # fmt: skip
        parts.append(f"- Журнал **{name}**: в строках train задержка {lag}, средний |log w| = "
                     f"{np.mean([r['mean_abs_log_w'] for r in train]):.4f} нат на токен; на пробе v = u — "
                     f"{rows[-1]['mean_abs_log_w']:.4f} нат ({fmt.num(round(share * 100))}{fmt.NBSP}% от строк "
                     f"train): {why}. **Диагноз: `{label}`.**")  # fmt: skip
    T, p, tok = task["temperature"], task["top_p"], task["token_index"]
    probs, keep, _ = _nucleus(task["logits"], T, p)
    mass = float(probs[keep].sum())
    rows = md_table(["токен", "z", "z/T", "softmax(z/T)", "в ядре", "μ после перенормировки"],
                    [[f"`{v}`", f"{z:.2f}", f"{z / T:.4f}", f"{q:.4f}", "да" if k else "нет", f"{(q / mass if k else 0.0):.4f}"]
                     for v, z, q, k in zip(task["vocab"], task["logits"], probs, keep)])  # fmt: skip
    return (
        "**Часть 1.** Версии диагноза не ставят: v < u во всех строках обучения, а расхождение "
        "складывается из задержки и TIM. Разделяет их проба на нулевой задержке: та же версия "
        "у движка и тренера убирает задержку, и то, что осталось, — TIM. Сравниваем средний "
        "|log w| на токен (сумма `seq_log_w` зависит от длины).\n\n" + "\n".join(parts) + "\n\n"
        f"**Часть 2.** $z/T$ при T = {T}, softmax, затем ядро top-p (p = {p}): отбрасываем "
        "наименее вероятные токены, пока их суммарная вероятность ≤ 1 − p, и перенормируем "
        f"оставшиеся.\n\n{rows}\n\n"
        f"Масса ядра — {mass:.4f}; для выбранного токена y = `{task['vocab'][tok]}`:\n\n"
        f"$$\\log\\mu(y) = \\log\\mathrm{{softmax}}(z/T)_y - \\log(\\text{{масса ядра}}) = "
        f"{lp['raw']:.4f} - ({math.log(mass):.4f}) = {lp['behavior']:.4f}\\ \\text{{нат}}.$$\n\n"
        f'**Ответ:** `{{"diagnosis": {json.dumps(ref["diagnosis"])}, "behavior_logprob": '
        f"{lp['behavior']:.4f}}}`.\n\n"
        f"Логарифм исходного softmax(z/T) ({lp['raw']:.4f}) — не политика поведения: движок "
        "семплировал из усечённого и перенормированного распределения. Без температуры "
        f"(ядро по softmax(z)) получилось бы {lp['no_temp']:.4f} — тоже не то распределение."
    )


ANSWER = Fields({"diagnosis": Keyed(keys=lambda t: t["logs"], value=Choice(("lag", "tim")), noun="журналов"),
                 "behavior_logprob": Approx(high=0, unit="нат", bound="Логарифм вероятности ≤ 0")})  # fmt: skip
_NO_TEMP = {"behavior_logprob": lambda v: v["no_temp"]}
_NO_TEMP_RAW = {"behavior_logprob": lambda v: v["no_temp_raw"]}

STEP = Step(
    id="12.4.8", make_task=make_task, solve=solve, solution=solution, answer=ANSWER,
    hint=(
        "Часть 1: версии диагноз не ставят (v < u везде). Сравните средний |log w| строк train "
        "с пробой probe_lag0: если на нулевой задержке расхождение почти то же — это TIM, если "
        "почти исчезло — задержка. Часть 2: поделите логиты на T, возьмите softmax, отбросьте наименее "
        "вероятные токены, пока их суммарная вероятность ≤ 1 − p, перенормируйте остальные: "
        "log μ(y) = z_y/T − logsumexp(z/T по ядру)."
    ),
    traps=(
        Trap("raw_softmax_under_top_p",
             "Это log softmax(z/T) без усечения. Движок семплировал из ядра top-p, "
             "перенормированного до суммы 1: log μ(y) = log softmax(z/T)_y − log(масса ядра). "
             "Логарифм исходного softmax — не политика поведения.",
             override=over(_logprobs, {"behavior_logprob": lambda v: v["raw"]})),
        Trap("no_temperature",
             "Вы забыли температуру: движок делит логиты на T до softmax и до отбора ядра "
             "top-p (от T зависит и само ядро). Считайте softmax(z/T), затем ядро и "
             "перенормировку.",
             override=over(_logprobs, _NO_TEMP), matches=any_key(ANSWER, _logprobs, _NO_TEMP, _NO_TEMP_RAW)),
        Trap("staleness_everywhere",
             "Вы поставили диагноз по версиям: v < u во всех строках обучения, но это не говорит, "
             "откуда расхождение. Посмотрите на пробу на нулевой задержке (v = u): если |log w| "
             "там почти тот же, расхождение даёт TIM — одинаковые веса не гарантируют одинаковых "
             "вероятностей (ядра, точность, порядок редукций, декодирование).",
             override={"diagnosis": lambda t: {name: "lag" for name in t["logs"]}}),
        Trap("probe_nonzero_is_tim",
             "Проба на нулевой задержке почти никогда не даёт ровно 0: немного TIM есть всегда. "
             "Диагноз — по доле: сравните средний |log w| пробы со строками обучения; если без "
             "задержки остаётся малая часть расхождения, основную часть даёт задержка политики.",
             override={"diagnosis": lambda t: {name: "tim" for name in t["logs"]}}),
    ),
)  # fmt: skip
