"""Урок 12.5: проверка аварией — три ветви одного запуска ToyRLRun (непрерывная, полное
восстановление, «только веса») и три вида отказов шага 12.5.3 (сборщик, тренер, верификатор).
Лаборатория инцидентов verl: трекер последней точки при асинхронной записи (#7952) и шаг,
увеличенный дважды при возобновлении (#7933) — их ловят проверки шага и версии.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence, Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils import atomic, checkpoint as ck
from course_utils.args import choice, integer, is_real, path, text
from course_utils.fmt import count, listing
from course_utils.plots import finish_axes, get_axes
from course_utils.toy_run import ToyRLRun

TRACKER = "latest_checkpointed_iteration.txt"  # как в verl: шаг последней полной точки, текстом
# Как аварийный запуск пишет точки (prepare_crash_run): синхронно или в фоне, с трекером или без.
SAVES = ("sync", "async", "async_no_tracker")
RESUME_VERDICTS = {  # проверки шага и версии после восстановления (CrashTestResult.resume_problems)
    "from_zero": "возобновление с шага 0 при целых контрольных точках",
    "step_twice": "шаг после возобновления увеличен дважды",
    "wrong_step": "шаг после возобновления — не следующий за контрольной точкой",
    "wrong_version": "версия политики после возобновления не та",
}


def _steps(n: int) -> str:
    return count(n, "шаг", "шага", "шагов")


@dataclass
class CrashTestResult:
    """Итог проверки аварией: ветви continuous / full / weights_only — по событию на шаг 1..N;
    restored_step — шаг точки восстановления s₀ ≤ crash_at; lost_events — события шагов
    s₀+1..crash_at, потерянные при аварии и пересчитанные ветвью full."""

    branches: dict[str, list[dict]]
    crash_at: int
    restored_step: int
    total_steps: int
    checkpoint_every: int
    seed: int
    lost_events: list[dict]
    custom_resume: bool = False

    @property
    def recomputed_identical(self) -> bool:
        """Пересчёт потерянных шагов в ветви full побитово совпал с событиями до аварии."""
        return self.branches["full"][self.restored_step : self.crash_at] == self.lost_events

    def first_divergence(self, branch: str) -> int | None:
        """Первый шаг, на котором событие ветви branch отличается от continuous; None — нигде."""
        pairs = itertools.zip_longest(self._branch(branch), self.branches["continuous"])
        return next((i for i, (a, b) in enumerate(pairs, 1) if a != b), None)

    def diverged_fields(self, branch: str, step: int | None = None) -> list[str]:
        """Поля события, которыми ветвь отличается от continuous на шаге step (по умолчанию — первом)."""
        step = self.first_divergence(branch) if step is None else step
        if step is None:
            return []
        a, b = self._branch(branch)[step - 1], self.branches["continuous"][step - 1]
        return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]

    def _branch(self, name: str) -> list[dict]:
        return self.branches[choice("branch", name, self.branches)]

    def resume_problems(self, branch: str = "full") -> dict[str, str]:
        """Проверки шага и версии: первое событие ветви после восстановления — шаг s₀ + 1 с версией
        политики непрерывной ветви. Ключ ``RESUME_VERDICTS`` → подробность; пусто — всё верно."""
        s0 = self.restored_step
        got, ref = self._branch(branch)[s0], self.branches["continuous"][s0]
        out = {}
        if got["step"] != ref["step"]:  # ref["step"] = s₀ + 1
            key = {1: "from_zero", ref["step"] + 1: "step_twice"}.get(got["step"], "wrong_step")
            where = f"{ck.checkpoint_name(s0)} (шаг {s0}) цела"
            out[key] = f"первый шаг после перезапуска — {got['step']}, а не {ref['step']}; {where}"
        if got["policy_version"] != ref["policy_version"]:
            out["wrong_version"] = f"{got['policy_version']} вместо {ref['policy_version']}"
        return {k: f"{RESUME_VERDICTS[k]}: {v}" for k, v in out.items()}

    @property
    def passed(self) -> bool:
        """full совпала с continuous на всех шагах, а weights_only разошлась сразу после восстановления."""
        return (
            self.first_divergence("full") is None
            and len(self.branches["full"]) == self.total_steps
            and self.first_divergence("weights_only") == self.restored_step + 1
        )

    def summary(self) -> str:
        """Сводка по-русски: где авария, откуда восстановление, где расходится каждая ветвь."""
        n = self.checkpoint_every
        every = "после каждого шага" if n == 1 else f"каждые {_steps(n)}"
        lines = [
            f"Проверка аварией: seed={self.seed}, {_steps(self.total_steps)}, контрольная "
            f"точка {every}, авария после шага {self.crash_at}, восстановление "
            f"с {ck.checkpoint_name(self.restored_step)} (шаг {self.restored_step})."
        ]
        for name in [b for b in self.branches if b != "continuous"]:
            label = _BRANCH_STYLE.get(name, {}).get("label", name)
            if name == "full" and self.custom_resume:
                label = "полное восстановление (ваша resume)"
            step = self.first_divergence(name)
            if step is None:
                verdict = f"совпадает с непрерывной ветвью на всех {self.total_steps} шагах"
            else:
                fields = ", ".join(self.diverged_fields(name, step))
                verdict = (
                    f"совпадает до шага {step - 1}, расходится на шаге {step} "
                    f"(различаются: {fields})"
                )
            lines.append(f"  {label}: {verdict}.")
            lines += [f"    ✗ {p}." for p in self.resume_problems(name).values()]
        same = "да" if self.recomputed_identical else "НЕТ"
        lines.append(
            "  Шагов после контрольной точки, потерянных при аварии и пересчитанных: "
            f"{len(self.lost_events)} (пересчёт совпал: {same})."
        )
        return "\n".join(lines)

    __str__ = summary


@dataclass(frozen=True)
class CrashRun:
    """Аварийный запуск до аварии: ветвь continuous, события шагов 1..crash_at и последняя
    полная контрольная точка s₀ на диске. ``branches(resume)`` доводит ветви full и
    weights_only из копии этой точки — один аварийный запуск на много resume."""

    factory: Callable[[], ToyRLRun]
    continuous: list[dict]
    before: list[dict]
    checkpoint: Path
    manifest: dict
    total_steps: int
    crash_at: int
    checkpoint_every: int
    seed: int

    def branches(
        self, resume: Callable | None = None, find: Callable | None = None
    ) -> CrashTestResult:
        """Ветви full (resume или resume_full) и weights_only из копии каталога точек; find(root) →
        точка или None — как её находит перезапуск (по умолчанию s₀; ``tracked_checkpoint`` — по
        трекеру, как resume_mode=auto в verl); None — запуск с нуля, как в verl. CrashTestResult."""
        for name, fn in (("resume", resume), ("find", find)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name} должно быть функцией или None (см. run_crash_test)")
        s0 = int(self.manifest["step"])
        after = {}
        with tempfile.TemporaryDirectory(prefix="crash_resume_") as tmp:
            root = Path(tmp) / "root"  # копия: resume не испортит точки другим
            shutil.copytree(self.checkpoint.parent, root)
            ckpt = root / self.checkpoint.name if find is None else find(root)
            resumes = {"full": resume or ck.resume_full, "weights_only": ck.resume_weights_only}
            for name, fn in resumes.items():
                run = self.factory() if ckpt is None else fn(self.factory, ckpt)
                if not isinstance(run, ToyRLRun):
                    raise ValueError(
                        f"resume должна вернуть ToyRLRun, вернула {type(run).__name__}"
                    )
                after[name] = self.before[:s0] + [run.step() for _ in range(self.total_steps - s0)]
        return CrashTestResult(
            branches={"continuous": list(self.continuous), **after},
            crash_at=self.crash_at,
            restored_step=s0,
            total_steps=self.total_steps,
            checkpoint_every=self.checkpoint_every,
            seed=self.seed,
            lost_events=self.before[s0 : self.crash_at],
            custom_resume=resume is not None,
        )


def prepare_crash_run(
    total_steps: int,
    crash_at: int,
    seed: int = 0,
    checkpoint_every: int = 4,
    *,
    workdir: str | os.PathLike,
    save: str = "sync",
    **run_kwargs: Any,
) -> CrashRun:
    """Непрерывный запуск ToyRLRun(seed, **run_kwargs) на total_steps шагов и аварийный: точка
    после каждого шага, кратного checkpoint_every, в workdir (прежние точки там удаляются),
    «авария» после шага crash_at; s₀ = ⌊crash_at / checkpoint_every⌋ · checkpoint_every.
    save (из SAVES): "sync" — запись, затем трекер TRACKER; "async" — то же в фоновом потоке,
    пока запуск идёт дальше; "async_no_tracker" — в фоне без трекера (ошибка verl #7952)."""
    total_steps = integer("total_steps", total_steps, 2)
    crash_at = integer("crash_at", crash_at, 1, total_steps - 1)
    checkpoint_every = integer("checkpoint_every", checkpoint_every, 1, crash_at)
    seed = integer("seed", seed, 0)
    save = choice("save", save, SAVES)
    factory = functools.partial(ToyRLRun, seed, **run_kwargs)
    ref = factory()
    continuous = [ref.step() for _ in range(total_steps)]
    root = path("workdir", workdir)
    root.mkdir(parents=True, exist_ok=True)
    ck.remove_checkpoints(root)  # прежние сбили бы latest_checkpoint, а трекер — tracked_checkpoint
    (root / TRACKER).unlink(missing_ok=True)
    crashing = factory()
    before: list[dict] = []
    with ThreadPoolExecutor(max_workers=1) as writer:  # фоновые записи по одной, по порядку
        jobs = []
        for t in range(1, crash_at + 1):
            before.append(crashing.step())
            if t % checkpoint_every == 0:  # снимок состояния — сейчас, запись — сейчас или в фоне
                args = (crashing.state_dict(), root, t, crashing.config, save != "async_no_tracker")
                if save == "sync":
                    _write_checkpoint(*args)  # шаг t + 1 ждёт конца записи
                else:
                    jobs.append(writer.submit(_write_checkpoint, *args))
    for job in jobs:
        job.result()  # ошибка фоновой записи не теряется; авария — после записей, точки целы
    del crashing  # авария: всё, что было только в памяти процесса, потеряно
    last = ck.latest_checkpoint(root, components=ck.COMPONENTS)  # есть: crash_at ≥ checkpoint_every
    sizes = (total_steps, crash_at, checkpoint_every, seed)
    return CrashRun(factory, continuous, before, last, ck.read_manifest(last), *sizes)


def _write_checkpoint(state: dict, root: Path, step: int, config: dict, track: bool) -> None:
    """Точка шага step; track — затем трекер, атомарно и только после полной записи точки."""
    ck.save_checkpoint(state, root / ck.checkpoint_name(step), config, overwrite=True)
    if track:
        atomic.write_text(root / TRACKER, f"{step}\n")


def tracked_checkpoint(root: str | os.PathLike) -> Path | None:
    """Точка, которую называет трекер root/TRACKER (как find_latest_ckpt_path в verl при
    resume_mode=auto); None, если трекера или каталога его шага нет — тогда запуск с нуля."""
    tracker = path("root", root) / TRACKER
    if not tracker.is_file():
        return None
    found = tracker.parent / ck.checkpoint_name(int(tracker.read_text()))
    return found if found.is_dir() else None


def resume_step_twice(run_factory: Callable[[], ToyRLRun], checkpoint_path: Path) -> ToyRLRun:
    """Ошибка verl #7933 на учебном запуске: всё состояние восстановлено, но глобальный шаг
    выставлен «следующим» (s₀ + 1), а step() прибавляет свою 1 — первый шаг после точки s₀ + 2."""
    run = ck.resume_full(run_factory, checkpoint_path)
    run.global_step += 1  # лишняя единица: её прибавит и сам step()
    return run


def run_crash_test(
    total_steps: int,
    crash_at: int,
    seed: int = 0,
    checkpoint_every: int = 4,
    resume: Callable[[Callable[[], ToyRLRun], Path], ToyRLRun] | None = None,
    workdir: str | os.PathLike | None = None,
    **run_kwargs: Any,
) -> CrashTestResult:
    """Три ветви одного запуска ToyRLRun(seed, **run_kwargs): continuous — без аварии; full —
    resume(run_factory, checkpoint_path) из последней полной точки s₀ (по умолчанию resume_full);
    weights_only — только веса. Ожидается: full == continuous побитово, weights_only расходится
    на шаге s₀ + 1. workdir — каталог точек (по умолчанию временный)."""
    with tempfile.TemporaryDirectory(prefix="crash_test_") as tmp:
        workdir = tmp if workdir is None else workdir
        crash = prepare_crash_run(
            total_steps, crash_at, seed, checkpoint_every, workdir=workdir, **run_kwargs
        )
        return crash.branches(resume)


_BRANCH_STYLE = {
    "continuous": {"color": "black", "lw": 3.0, "alpha": 0.35, "label": "непрерывная"},
    "full": {"color": "tab:green", "lw": 1.6, "ls": "--", "label": "полное восстановление"},
    "weights_only": {"color": "tab:red", "lw": 1.6, "label": "только веса"},
}
# метрика → (подпись оси с единицами, заголовок панели, целые деления оси y)
_METRIC_LABEL = {
    "cumulative_reward": ("накопленная средняя награда, у. е.", "накопленная награда", False),
    "curriculum_level": ("уровень учебной программы, номер", "уровень учебной программы", True),
}


def plot_crash_test(result: CrashTestResult, metric: str = "cumulative_reward", ax=None):
    """График метрики по шагам для трёх ветвей: cumulative_reward = Σ mean_reward с шага 1 (у. е.)
    или curriculum_level; отмечены авария и точка восстановления. Возвращает Axes."""
    from matplotlib.ticker import MaxNLocator

    ylabel, title, integer_y = _METRIC_LABEL[choice("metric", metric, _METRIC_LABEL)]
    ax = get_axes(ax, (9, 4))
    for name, events in result.branches.items():
        style = dict(_BRANCH_STYLE.get(name, {"label": name}))
        if name == "full" and result.custom_resume:
            style["label"] = "ваша resume"
        if metric == "cumulative_reward":
            y = list(itertools.accumulate(ev["mean_reward"] for ev in events))
        else:
            y = [ev[metric] for ev in events]
        ax.plot(range(1, len(events) + 1), y, marker=".", ms=4, **style)
    for x, color, lw, label in (
        (result.crash_at, "tab:orange", 1.5, f"авария после шага {result.crash_at}"),
        (result.restored_step, "tab:blue", 1.2, f"контрольная точка: шаг {result.restored_step}"),
    ):
        ax.axvline(x + 0.5, color=color, ls=":", lw=lw, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if integer_y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    legend = {"fontsize": "small", "frameon": False}
    title = f"Три ветви одного запуска: {title}"
    return finish_axes(
        ax, grid="both", legend=legend, xlabel="шаг обучения, номер", ylabel=ylabel, title=title
    )


# ----------------------------------------------------------------------------- три вида отказов


def simulate_collector_crash(total_steps: int = 12, crash_at: int = 5, seed: int = 0) -> dict:
    """Отказ сборщика после шага crash_at: его пакет «в полёте» потерян (lost_rollouts =
    batch_size), запуск продолжается; versions_monotonic — версия политики росла на 1 за шаг."""
    total_steps = integer("total_steps", total_steps, 2)
    crash_at = integer("crash_at", crash_at, 1, total_steps - 1)
    run = ToyRLRun(seed)
    events, lost = [], []
    for t in range(1, total_steps + 1):
        events.append(run.step())
        if t == crash_at:
            lost = run.drop_in_flight()
    versions = [e["policy_version"] for e in events]
    return {
        "lost_rollouts": run.lost_rollouts,
        "lost_rollout_ids": lost,
        "events": events,
        "steps_completed": len(events),
        "versions_monotonic": versions == list(range(1, total_steps + 1)),
        "losses_finite": all(math.isfinite(e["loss"]) for e in events),
    }


def simulate_trainer_crash(crash_at: int = 7, checkpoint_every: int = 5, seed: int = 0) -> dict:
    """Отказ тренера после шага crash_at: восстановление с точки s₀, шаги s₀+1..crash_at
    пересчитываются (lost_work_steps = crash_at − s₀); identical — пересчёт побитово тот же."""
    res = run_crash_test(crash_at + 1, crash_at, seed, checkpoint_every)
    return {
        "checkpoint_step": res.restored_step,
        "crash_at": crash_at,
        "recomputed_steps": [e["step"] for e in res.lost_events],
        "identical": res.recomputed_identical and res.first_divergence("full") is None,
        "lost_work_steps": crash_at - res.restored_step,
    }


@dataclass
class BatchVerdict:
    """Решение по пакету: принят целиком (rollouts — весь пакет) или отклонён целиком
    (rollouts пуст, reasons — почему, по-русски)."""

    accepted: bool
    reasons: list[str]
    rollouts: tuple = ()

    def __bool__(self) -> bool:
        return self.accepted

    def __str__(self) -> str:
        if self.accepted:
            n = len(self.rollouts)
            return f"Пакет принят целиком: {count(n, 'роллаут', 'роллаута', 'роллаутов')}."
        return "Пакет отклонён целиком:\n" + "\n".join(f"  • {r}" for r in self.reasons)


def _version(rollout: Mapping) -> str | None:
    v = rollout.get("verifier_version")
    return v if isinstance(v, str) and v else None


def accept_batch(
    batch: Any, expected_ids: Sequence, verifier_version: str | None = None
) -> BatchVerdict:
    """Принимает пакет роллаутов целиком или отклоняет целиком (шаг 12.5.3); не бросает на данных.
    Отклоняет: не список словарей, нет rollout_id, повторы, чужие id или нехватка expected_ids
    (уникальных строк или целых), награда не конечна, версии верификатора нет, не та или смешаны."""
    if isinstance(expected_ids, str | bytes) or not isinstance(
        expected_ids, Sequence | AbstractSet
    ):
        kind = type(expected_ids).__name__
        raise ValueError(f"expected_ids должно быть списком id, получено {kind}")
    expected = list(expected_ids)
    if any(not isinstance(i, str | int) or isinstance(i, bool) for i in expected):
        raise ValueError("expected_ids: id должны быть строками или целыми")
    if len(set(expected)) != len(expected):
        raise ValueError("expected_ids: id повторяются")
    if verifier_version is not None:
        text("verifier_version", verifier_version)
    if not isinstance(batch, list | tuple):
        return BatchVerdict(
            False, [f"пакет должен быть списком роллаутов, получено {type(batch).__name__}"]
        )
    items = [r for r in batch if isinstance(r, Mapping)]
    ids = [r["rollout_id"] for r in items if "rollout_id" in r]
    # повтор — второе появление id; список, а не множество: id может оказаться нехешируемым
    dup = [i for k, i in enumerate(ids) if ids[:k].count(i) == 1]
    not_dict = [i for i, r in enumerate(batch) if not isinstance(r, Mapping)]
    no_id = [i for i, r in enumerate(batch) if isinstance(r, Mapping) and "rollout_id" not in r]
    unknown = [i for i in ids if not isinstance(i, str | int) or i not in expected]
    missing = [i for i in expected if i not in ids]
    bad_reward = [r.get("rollout_id", "?") for r in items if not is_real(r.get("reward"))]
    no_version = [r.get("rollout_id", "?") for r in items if _version(r) is None]
    checks = (  # (что не так, сообщение): {ids} — первые из них, {n} — сколько
        (not_dict, "элементы пакета не словари (позиции {ids})"),
        (no_id, "у роллаутов нет rollout_id (позиции {ids})"),
        (dup, "повторяются роллауты: {ids}"),
        (unknown, "неизвестные роллауты (не из этого пакета): {ids}"),
        (missing, f"не хватает {{n}} из {len(expected)} роллаутов: {{ids}}"),
        (bad_reward, "нет награды или она не конечное число: {ids}"),
        (no_version, "нет версии верификатора: {ids}"),
    )
    reasons = [msg.format(ids=listing(bad), n=len(bad)) for bad, msg in checks if bad]
    versions = sorted({_version(r) for r in items} - {None})
    if len(versions) > 1:
        reasons.append(f"в пакете смешаны версии верификатора: {', '.join(versions)}")
    if verifier_version is not None and versions and versions != [verifier_version]:
        other = [v for v in versions if v != verifier_version]
        reasons.append(
            f"версия верификатора {', '.join(other)} вместо ожидаемой {verifier_version}"
        )
    if not batch and not expected:
        reasons.append("пакет пуст")
    if reasons:
        return BatchVerdict(False, reasons)
    return BatchVerdict(True, [], tuple(copy.deepcopy(list(batch))))


def simulate_verifier_crash(scored: int = 5, seed: int = 0) -> dict:
    """Сбой верификатора посреди пакета: оценены первые scored роллаутов, у остальных нет награды;
    partial_verdict — частичный пакет отклонён, retry_verdict — оценённый заново весь принят."""
    run = ToyRLRun(seed)
    batch = run.generate_batch()
    scored = integer("scored", scored, 0, len(batch) - 1)
    expected = [r["rollout_id"] for r in batch]
    partial = copy.deepcopy(batch)
    for ro in partial[scored:]:
        ro.pop("reward")
        ro.pop("verifier_version")
    return {
        "expected_ids": expected,
        "partial": partial,
        "partial_verdict": accept_batch(partial, expected, run.verifier_version),
        "retry_verdict": accept_batch(batch, expected, run.verifier_version),
    }
