"""Тесты course_utils.checkpoint: полная контрольная точка, проверка аварией, отказы, интервал Янга.

Процессные тесты (уровень C и замена контрольной точки) запускают настоящий процесс и убивают
его SIGKILL; каждый запуск стоит ~3 с (дочерний процесс импортирует torch), их восемь.
"""

import hashlib
import json
import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
import safetensors.torch
import torch

from course_utils import checkpoint as ck, crash_test
from course_utils.checkpoint import CheckpointError
from course_utils.multiproc import checkpointed_trainer as ckt, launch
from course_utils.multiproc.transport import state_checksum
from course_utils.toy_run import ToyRLRun

matplotlib.use("Agg")

REPO = Path(__file__).resolve().parent.parent
CYRILLIC = re.compile("[а-яА-ЯёЁ]")
# Файлы контрольной точки ToyRLRun: тензоры — в .safetensors, остальное — в .json.
DATA_FILES = [
    "policy.safetensors",
    "policy.json",
    "optimizer.safetensors",
    "optimizer.json",
    "scheduler.json",
    "counters.json",
    "rng.safetensors",
    "rng.json",
    "data_cursor.json",
    "curriculum.json",
    "normalizer.json",
    "versions.json",
    "queue.json",
]


def _events(run: ToyRLRun, n: int) -> list[dict]:
    return [run.step() for _ in range(n)]


def _json(obj):
    return json.loads(json.dumps(obj))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Контрольная точка шага 12 (seed 0) и 6 событий непрерывного запуска после неё."""
    run = ToyRLRun(0)
    _events(run, 12)
    path = ck.save_checkpoint(
        run.state_dict(), tmp_path_factory.mktemp("ck") / "step-000012", run.config
    )
    return path, run.config, _events(run, 6)


def _copy(saved, tmp_path) -> Path:
    dst = tmp_path / saved[0].name
    shutil.copytree(saved[0], dst)
    return dst


# ----------------------------------------------------------------------------- учебный запуск


def test_toy_run_is_deterministic_and_json():
    a, b = _events(ToyRLRun(3), 15), _events(ToyRLRun(3), 15)
    assert a == b
    assert _json(a) == a  # JSON туда и обратно без потерь
    assert _events(ToyRLRun(4), 15) != a
    ev = a[-1]
    for key in ("step", "prompt_ids", "actions", "rewards", "loss", "lr", "policy_version"):
        assert key in ev
    assert ev["step"] == ev["policy_version"] == 15
    assert ev["verifier_version"] == "verifier-2"  # обновлён после шага 10
    assert all(math.isfinite(e["loss"]) for e in a)
    assert max(e["curriculum_level"] for e in _events(ToyRLRun(0), 20)) >= 1  # уровень растёт


def test_state_dict_roundtrip_is_exact_and_a_snapshot():
    run = ToyRLRun(1)
    _events(run, 7)
    state = run.state_dict()
    expected = _events(run, 6)  # снимок не должен меняться, пока запуск идёт дальше
    other = ToyRLRun(1)
    other.load_state_dict(state)
    assert _events(other, 6) == expected
    assert set(state) == set(ck.COMPONENTS)


@pytest.mark.parametrize("component", list(ck.COMPONENTS))
def test_every_component_matters(component):
    """Заменить один компонент свежим — продолжение перестаёт совпадать (COMPONENTS не врут)."""
    run = ToyRLRun(0)
    _events(run, 12)  # к шагу 12: уровень 1, verifier-2, пакет в очереди
    state = run.state_dict()
    expected = _events(run, 4)
    state[component] = ToyRLRun(0).state_dict()[component]
    other = ToyRLRun(0)
    other.load_state_dict(state)
    assert _events(other, 4) != expected


def test_load_state_dict_names_missing_components():
    state = ToyRLRun(0).state_dict()
    del state["rng"], state["queue"]
    with pytest.raises(ValueError, match="rng, queue"):
        ToyRLRun(0).load_state_dict(state)


def test_queue_drop_is_counted():
    run = ToyRLRun(0)
    _events(run, 5)
    other = ToyRLRun(0)
    other.load_state_dict(run.state_dict(), queue="drop")
    assert other.lost_rollouts == run.config["batch_size"] and other.queue == []
    assert other.step()["lost_rollouts"] == run.config["batch_size"]


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 0, "batch_size": 7}, "batch_size"),
        ({"seed": 0, "lr": 0}, "lr"),
        ({"seed": 0, "colour": 1}, "неизвестные"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"seed": 0, "clip_eps": 0.0}, "clip_eps"),  # (0, 1]: ноль не клиппирует
        ({"seed": 0, "verifier_noise": 0.6}, "verifier_noise"),
        ({"seed": 0, "verifier_upgrade_step": 0}, "verifier_upgrade_step"),
    ],
)
def test_toy_run_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ToyRLRun(**kwargs)


# ----------------------------------------------------------------------------- проверка аварией


@pytest.mark.parametrize(
    "seed, crash_at, every", [(0, 12, 4), (1, 10, 4), (2, 13, 5), (3, 7, 3), (5, 9, 9)]
)
def test_crash_test_semantics(seed, crash_at, every):
    res = crash_test.run_crash_test(20, crash_at, seed=seed, checkpoint_every=every)
    s0 = crash_at // every * every
    assert res.restored_step == s0
    cont = res.branches["continuous"]
    assert len(cont) == len(res.branches["full"]) == len(res.branches["weights_only"]) == 20
    assert res.branches["full"] == cont  # побитово, включая потери и награды
    assert res.first_divergence("full") is None
    assert res.branches["weights_only"][:s0] == cont[:s0]
    assert res.first_divergence("weights_only") == s0 + 1
    assert "lr" in res.diverged_fields("weights_only")  # планировщик начал прогрев заново
    assert len(res.lost_events) == crash_at - s0 and res.recomputed_identical
    assert res.passed
    text = res.summary()
    assert f"расходится на шаге {s0 + 1}" in text and "совпадает с непрерывной" in text


def test_crash_test_with_custom_resume(tmp_path):
    calls = []

    def good(run_factory, checkpoint_path):
        calls.append(Path(checkpoint_path).name)
        run = run_factory()
        run.load_state_dict(ck.load_checkpoint(checkpoint_path))
        return run

    res = crash_test.run_crash_test(
        16, 9, seed=1, checkpoint_every=4, resume=good, workdir=tmp_path
    )
    assert calls == ["step-000008"] and res.passed and res.custom_resume
    assert (tmp_path / "step-000008" / "manifest.json").is_file()  # workdir сохраняется

    def forgets_rng(run_factory, checkpoint_path):
        run = run_factory()
        state = ck.load_checkpoint(checkpoint_path)
        state["rng"] = run.state_dict()["rng"]
        run.load_state_dict(state)
        return run

    bad = crash_test.run_crash_test(16, 9, seed=1, checkpoint_every=4, resume=forgets_rng)
    assert not bad.passed and bad.first_divergence("full") == 9
    # Пакет шага 9 пришёл из восстановленной очереди: отличается только порядок мини-пакетов.
    assert bad.diverged_fields("full") == ["loss"]
    assert "actions" in bad.diverged_fields("full", 10)

    with pytest.raises(ValueError, match="ToyRLRun"):
        crash_test.run_crash_test(16, 9, resume=lambda f, p: "не запуск")


@pytest.mark.parametrize(
    "args, word",
    [((10, 10), "crash_at"), ((10, 3), "checkpoint_every"), ((10, 0), "crash_at")],
)
def test_crash_test_bad_arguments(args, word):
    with pytest.raises(ValueError, match=word):
        crash_test.run_crash_test(*args, checkpoint_every=4)


def test_plot_crash_test(tmp_path):
    res = crash_test.run_crash_test(14, 9, seed=0, checkpoint_every=4)
    ax = crash_test.plot_crash_test(res, "curriculum_level")
    assert len(ax.get_lines()) == 5  # три ветви и две вертикальные линии
    ax.figure.savefig(tmp_path / "crash.png")
    assert (tmp_path / "crash.png").stat().st_size > 0
    with pytest.raises(ValueError, match="metric"):
        crash_test.plot_crash_test(res, "accuracy")


def test_plot_crash_test_panels_are_distinct_with_units_and_integer_ticks():
    """Две панели ноутбука 12.5 различаются заголовком; у шага и уровня — целые деления."""
    import matplotlib.pyplot as plt

    res = crash_test.run_crash_test(14, 9, seed=0, checkpoint_every=4)
    _, axes = plt.subplots(1, 2)
    left = crash_test.plot_crash_test(res, "cumulative_reward", ax=axes[0])
    right = crash_test.plot_crash_test(res, "curriculum_level", ax=axes[1])
    assert left.get_title() != right.get_title()
    assert "награда" in left.get_title() and "учебной программы" in right.get_title()
    assert left.get_ylabel().endswith("у. е.") and "номер" in left.get_xlabel()
    for ticks in (right.get_yticks(), right.get_xticks(), left.get_xticks()):
        assert len(ticks) and all(float(t).is_integer() for t in ticks)
    labels = [line.get_label() for line in right.get_lines()]
    assert {"непрерывная", "полное восстановление", "только веса"} <= set(labels)
    plt.close("all")


def test_components_frame_headers_are_russian():
    frame = ck.components_frame()
    assert list(frame.columns) == ["компонент", "что в нём", "что ломается без него"]
    assert list(frame["компонент"]) == list(ck.COMPONENTS)
    assert all(CYRILLIC.search(c) for c in frame.columns)


def test_crash_summary_names_branches_in_russian():
    res = crash_test.run_crash_test(12, 7, seed=0, checkpoint_every=4)
    text = res.summary()
    assert "полное восстановление: совпадает" in text and "только веса: совпадает до шага 4" in text
    assert "full:" not in text and "weights_only:" not in text
    assert "12\u00a0шагов" in text and "каждые 4\u00a0шага" in text  # fmt.count: 12 шагов, 4 шага


@pytest.mark.parametrize(
    "n, word", [(1, "роллаут"), (3, "роллаута"), (11, "роллаутов"), (21, "роллаут")]
)
def test_batch_verdict_plural_through_fmt(n, word):
    verdict = crash_test.BatchVerdict(True, [], tuple(range(n)))
    assert str(verdict) == f"Пакет принят целиком: {n}\u00a0{word}."


# ----------------------------------------------------------------------------- запись и чтение


def test_checkpoint_layout_and_manifest(saved):
    path, config, _ = saved
    manifest = ck.verify_checkpoint(path, config)
    assert sorted(manifest["files"]) == sorted(DATA_FILES)
    assert sorted(p.name for p in path.iterdir()) == sorted([*DATA_FILES, "manifest.json"])
    assert manifest["step"] == 12 and manifest["versions"]["verifier"] == "verifier-2"
    assert manifest["versions"]["policy_version"] == 12
    canonical = json.dumps(config, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert manifest["config"] == config
    assert manifest["config_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert list(manifest["components"]) == list(ck.COMPONENTS)
    for name, meta in manifest["files"].items():
        assert (path / name).stat().st_size == meta["bytes"]
        assert len(meta["sha256"]) == 64
    assert manifest["total_bytes"] == sum(m["bytes"] for m in manifest["files"].values())
    assert not [p for p in path.iterdir() if p.suffix in (".pt", ".bin", ".pkl")]


def test_load_restores_everything_exactly(saved):
    path, config, after = saved
    run = ToyRLRun(0)
    run.load_state_dict(ck.load_checkpoint(path, config))
    assert _events(run, 6) == after


def test_write_is_atomic(tmp_path):
    """Пока файлы данных пишутся, в целевом пути ничего нет, а manifest ещё не записан."""
    run = ToyRLRun(0)
    _events(run, 3)
    target = tmp_path / "step-000003"
    seen = []

    def after_file(name):
        tmps = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-step-000003-")]
        assert len(tmps) == 1 and (tmps[0] / name).is_file()
        assert not (tmps[0] / "manifest.json").exists() and not target.exists()
        seen.append(name)

    ck.save_checkpoint(run.state_dict(), target, run.config, after_file=after_file)
    assert seen == DATA_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003"]  # временного не осталось
    with pytest.raises(FileExistsError, match="уже существует"):
        ck.save_checkpoint(run.state_dict(), target, run.config)
    run.step()
    ck.save_checkpoint(run.state_dict(), target, run.config, overwrite=True)
    assert ck.read_manifest(target)["step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003"]


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="object"):
        ck.save_checkpoint({"bad": {"x": object()}}, tmp_path / "step-000001")

    def boom(name):
        raise OSError("диск полон")

    run = ToyRLRun(0)
    with pytest.raises(OSError, match="диск полон"):
        ck.save_checkpoint(run.state_dict(), tmp_path / "step-000001", after_file=boom)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fname", DATA_FILES)
def test_altered_file_is_detected(saved, tmp_path, fname):
    path = _copy(saved, tmp_path)
    data = bytearray((path / fname).read_bytes())
    data[len(data) // 2] ^= 0x01  # один бит, размер тот же
    (path / fname).write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        ck.load_checkpoint(path)
    msg = str(info.value)
    assert fname in msg and "SHA-256" in msg and CYRILLIC.search(msg)
    assert info.value.file == fname
    assert ck.latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("fname", ["policy.safetensors", "queue.json", "rng.json"])
def test_truncated_file_is_detected(saved, tmp_path, fname):
    path = _copy(saved, tmp_path)
    data = (path / fname).read_bytes()
    (path / fname).write_bytes(data[: len(data) - 7])
    with pytest.raises(CheckpointError, match=f"{re.escape(fname)} обрезан") as info:
        ck.load_checkpoint(path)
    assert f"{len(data) - 7} Б вместо {len(data)} Б" in str(info.value)


def test_missing_manifest_and_missing_file(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match="нет файла optimizer.safetensors"):
        ck.load_checkpoint(path)
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="нет файла manifest.json") as info:
        ck.load_checkpoint(path)
    assert "запись не завершена" in str(info.value)


def test_manifest_damage_and_edits_are_detected(saved, tmp_path):
    path = _copy(saved, tmp_path)
    raw = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(raw[:-20])
    with pytest.raises(CheckpointError, match="manifest.json повреждён"):
        ck.load_checkpoint(path)
    manifest = json.loads(raw)
    manifest["step"] = 999  # правдоподобная правка руками
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="manifest.json изменён"):
        ck.verify_checkpoint(path)


def test_config_mismatch_names_the_key(saved):
    path, config, _ = saved
    with pytest.raises(CheckpointError, match=r"manifest\.json.*seed: 0 → 1"):
        ck.load_checkpoint(path, config={**config, "seed": 1})
    with pytest.raises(CheckpointError, match="lr"):
        ck.verify_checkpoint(path, config={**config, "lr": 0.1})


def test_load_never_unpickles(saved, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle/torch.load при чтении контрольной точки")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    calls = []
    real = safetensors.torch.load

    def spy(data):
        calls.append(len(data))
        return real(data)

    monkeypatch.setattr(safetensors.torch, "load", spy)
    state = ck.load_checkpoint(saved[0])
    assert len(calls) == 3  # policy, optimizer, rng
    assert isinstance(state["rng"]["python"], tuple)  # кортеж восстановлен без pickle
    assert state["rng"]["torch"].dtype == torch.uint8


def test_latest_checkpoint_skips_incomplete_and_corrupt(saved, tmp_path):
    src = saved[0]
    run = ToyRLRun(0)
    for step in (4, 8, 12, 16):  # новизна — по шагу в manifest, поэтому настоящие шаги
        _events(run, 4)
        ck.save_checkpoint(run.state_dict(), tmp_path / ck.checkpoint_name(step), run.config)
    (tmp_path / "step-000012" / "manifest.json").unlink()  # писатель без атомарности
    (tmp_path / "step-000016" / "queue.json").write_text("[]")  # повреждён
    leftover = tmp_path / ".tmp-step-000020-abc"  # процесс убит посреди записи
    leftover.mkdir()
    shutil.copy(src / "policy.safetensors", leftover)
    shutil.copy(src / "manifest.json", leftover)  # даже с manifest временный каталог не берётся
    (tmp_path / "notes").mkdir()
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step-000008"
    assert ck.remove_incomplete(tmp_path) == [leftover.name] and not leftover.exists()
    assert ck.latest_checkpoint(tmp_path / "нет") is None
    assert ck.checkpoint_name(12) == "step-000012"


def test_overwrite_failing_between_renames_restores_old_copy(tmp_path, monkeypatch):
    """Второе переименование замены падает: старая полная копия возвращается на место."""
    run = ToyRLRun(0)
    _events(run, 4)
    target = ck.save_checkpoint(run.state_dict(), tmp_path / "step-000004", run.config)
    old_created = ck.read_manifest(target)["created_unix"]
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # старая копия уже отодвинута, новая ещё не на месте
            raise OSError("диск отключён")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="диск отключён"):
        ck.save_checkpoint(run.state_dict(), target, run.config, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004"]
    assert ck.latest_checkpoint(tmp_path) == target
    assert ck.read_manifest(target)["created_unix"] == old_created


def test_checkpoint_under_any_name_is_found_by_its_step(saved, tmp_path):
    """Что сохранено, то и находится: имя каталога любое, новизна — по шагу в manifest."""
    run = ToyRLRun(0)
    _events(run, 8)
    ck.save_checkpoint(run.state_dict(), tmp_path / "step-8", run.config)
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step-8"
    shutil.copytree(saved[0], tmp_path / "лучшая")  # шаг 12: новее, хоть имя и не step-…
    shutil.copytree(tmp_path / "step-8", tmp_path / "step-000099")  # имя врёт: внутри шаг 8
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "лучшая"
    with pytest.raises(ValueError, match="имена с точки"):
        ck.save_checkpoint(run.state_dict(), tmp_path / ".tmp-вручную", run.config)


def _reseal(path: Path, spoil) -> None:
    """Портит каталог spoil(path, manifest) и пересчитывает manifest.json, как писатель с ошибкой.

    Размеры, SHA-256 файлов и собственная SHA-256 manifest (канонический JSON без этого поля)
    сходятся, так что проверка хэшей проходит; отвергнуть каталог может только разбор.
    """
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    spoil(path, manifest)
    files = {}
    for name in manifest["files"]:
        if (path / name).exists():
            data = (path / name).read_bytes()
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest["files"], manifest["total_bytes"] = files, sum(f["bytes"] for f in files.values())
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    manifest["manifest_sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False), encoding="utf-8")


def _garbage_safetensors(path, manifest):
    (path / "policy.safetensors").write_bytes("это не safetensors".encode())


def _dangling_tensor(path, manifest):
    queue = {"on_restore": "keep", "batches": {"__tensor__": "нет такого"}}
    (path / "queue.json").write_text(json.dumps(queue), encoding="utf-8")


def _component_without_json(path, manifest):
    (path / "counters.json").unlink()
    manifest["components"]["counters"] = []


_DAMAGE = {
    "garbage_safetensors": (_garbage_safetensors, "policy.safetensors не читается"),
    "dangling_tensor": (_dangling_tensor, "ссылается на тензор 'нет такого'"),
    "component_without_json": (_component_without_json, "у компонента counters нет файла"),
}


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_latest_skips_what_load_rejects(saved, tmp_path, damage):
    """Хэши сходятся, но load_checkpoint отвергает содержимое: latest_checkpoint берёт прежнюю."""
    run = ToyRLRun(0)
    _events(run, 8)
    ck.save_checkpoint(run.state_dict(), tmp_path / "step-000008", run.config)
    bad = _copy(saved, tmp_path)  # step-000012
    spoil, message = _DAMAGE[damage]
    _reseal(bad, spoil)
    with pytest.raises(CheckpointError, match=message):
        ck.load_checkpoint(bad)
    with pytest.raises(CheckpointError, match=message):
        ck.verify_checkpoint(bad)
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step-000008"


def test_partial_state_is_refused_and_trainer_falls_back(tmp_path):
    """Контрольная точка без обязательных компонентов — CheckpointError, а не неполное состояние."""
    first = ckt.checkpointed_trainer(0, 1, "gloo", str(tmp_path), total_steps=4, checkpoint_every=4)
    assert first["checkpoints_written"] == ["step-000004"]
    run = ToyRLRun(0)
    _events(run, 8)
    weights = {"policy": run.state_dict()["policy"]}
    partial = ck.save_checkpoint(weights, tmp_path / "step-000008", run.config)
    missing = "optimizer, scheduler, counters, rng, data_cursor, curriculum, normalizer, versions"
    with pytest.raises(CheckpointError, match=f"нет компонентов: {missing}, queue"):
        ck.load_checkpoint(partial, components=ck.COMPONENTS)
    with pytest.raises(CheckpointError, match="нет компонентов: optimizer"):
        ck.resume_full(lambda: ToyRLRun(0), partial)
    assert set(ck.load_checkpoint(partial)) == {"policy"}  # без требований — что записано
    assert ck.latest_checkpoint(tmp_path) == partial
    assert ck.latest_checkpoint(tmp_path, components=ck.COMPONENTS) == tmp_path / "step-000004"
    with pytest.raises(ValueError, match="components"):
        ck.latest_checkpoint(tmp_path, components="policy")
    res = ckt.checkpointed_trainer(0, 1, "gloo", str(tmp_path), total_steps=6, checkpoint_every=4)
    assert res["resumed_from"] == 4
    assert first["events"] + res["events"] == _events(ToyRLRun(0), 6)


# ----------------------------------------------------------------------------- три вида отказов


def test_collector_crash_loses_in_flight_and_continues():
    res = crash_test.simulate_collector_crash(total_steps=10, crash_at=4, seed=0)
    assert res["lost_rollouts"] == 8 and len(res["lost_rollout_ids"]) == 8
    assert res["steps_completed"] == 10 and res["versions_monotonic"] and res["losses_finite"]
    ev = res["events"]
    assert ev[3]["lost_rollouts"] == 0 and ev[4]["lost_rollouts"] == 8
    assert ev[4]["behavior_version"] == 4  # пакет создан заново текущей политикой
    cont = _events(ToyRLRun(0), 10)
    assert ev[:4] == cont[:4] and ev[4] != cont[4]


def test_trainer_crash_recomputes_identically():
    res = crash_test.simulate_trainer_crash(crash_at=7, checkpoint_every=5, seed=0)
    assert res == {
        "checkpoint_step": 5,
        "crash_at": 7,
        "recomputed_steps": [6, 7],
        "identical": True,
        "lost_work_steps": 2,
    }


def _batch(n=4, version="verifier-1"):
    return [
        {"rollout_id": f"r{i}", "prompt_id": i, "reward": 1.0, "verifier_version": version}
        for i in range(n)
    ]


def _ids(n=4):
    return [f"r{i}" for i in range(n)]


def test_accept_batch_accepts_whole_batch():
    verdict = crash_test.accept_batch(_batch(), _ids(), "verifier-1")
    assert verdict and verdict.reasons == [] and len(verdict.rollouts) == 4
    assert "принят целиком" in str(verdict)


@pytest.mark.parametrize(
    "mutate, word",
    [
        (lambda b: b.pop(), "не хватает 1 из 4"),
        (lambda b: b.append(dict(b[0])), "повторяются роллауты: r0"),
        (lambda b: b.append({**b[0], "rollout_id": "r9"}), "неизвестные роллауты"),
        (lambda b: b[1].pop("reward"), "нет награды"),
        (lambda b: b[1].update(reward=float("nan")), "нет награды"),
        (lambda b: b[1].update(reward=None), "нет награды"),
        (lambda b: b[2].pop("verifier_version"), "нет версии верификатора"),
        (lambda b: b[2].update(verifier_version="verifier-2"), "смешаны версии"),
        (lambda b: b[0].pop("rollout_id"), "нет rollout_id"),
        (lambda b: b.append("мусор"), "не словари"),
    ],
)
def test_accept_batch_rejects_whole_batch(mutate, word):
    batch = _batch()
    mutate(batch)
    verdict = crash_test.accept_batch(batch, _ids(), "verifier-1")
    assert not verdict and verdict.rollouts == ()
    assert any(word in r for r in verdict.reasons), verdict.reasons
    assert "отклонён целиком" in str(verdict)


def test_accept_batch_wrong_version_and_bad_input():
    verdict = crash_test.accept_batch(_batch(version="verifier-2"), _ids(), "verifier-1")
    assert not verdict and "вместо ожидаемой verifier-1" in verdict.reasons[0]
    assert not crash_test.accept_batch("не пакет", _ids())
    with pytest.raises(ValueError, match="expected_ids"):
        crash_test.accept_batch(_batch(), "r0")
    with pytest.raises(ValueError, match="expected_ids"):
        crash_test.accept_batch(_batch(), ["r0", "r0"])


def test_verifier_crash_partial_batch_rejected_then_accepted():
    res = crash_test.simulate_verifier_crash(scored=5, seed=0)
    assert not res["partial_verdict"] and res["partial_verdict"].rollouts == ()
    assert any("нет награды" in r for r in res["partial_verdict"].reasons)
    assert res["retry_verdict"] and len(res["retry_verdict"].rollouts) == 8


# ----------------------------------------------------------------------------- уровень C: kill -9

ENTRY = "course_utils.multiproc.checkpointed_trainer:checkpointed_trainer"


def _reference(total_steps: int, seed: int = 0) -> tuple[list[dict], str]:
    run = ToyRLRun(seed)
    events = _events(run, total_steps)
    return _json(events), state_checksum(run.policy)


def _launch(tmp_path, tag, **args):
    return launch(ENTRY, 1, args=args, timeout_s=120, run_dir=tmp_path / f"launch-{tag}")


def _run_events(run_dir) -> tuple[list[dict], dict]:
    frame = ckt.events_from_run_dir(run_dir)
    return frame.drop(columns=["pid", "computations"]).to_dict("records"), frame.attrs


# Дочерний процесс: та же контрольная точка step-000008 ещё раз с overwrite=True, и SIGKILL
# (kill -9) в точке argv[1]: до первого переименования, между ними, после второго или посреди
# удаления отодвинутой старой копии (один её файл уже удалён).
_OVERWRITE_AND_DIE = """
import os, shutil, signal, sys
from pathlib import Path
from course_utils import checkpoint as ck, crash_test, toy_run

point, root = sys.argv[1], Path(sys.argv[2])
run = toy_run.ToyRLRun(0)
for _ in range(8):
    run.step()
state = run.state_dict()
real_replace, real_rmtree, calls = os.replace, shutil.rmtree, []


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def replace(src, dst):
    calls.append(dst)
    if point == "before_first_rename":
        die()
    real_replace(src, dst)
    if point == {1: "after_first_rename", 2: "after_second_rename"}.get(len(calls)):
        die()


def rmtree(path, *args, **kwargs):
    if point == "while_removing_old":
        sorted(Path(path).rglob("*.safetensors"))[0].unlink()
        die()
    real_rmtree(path, *args, **kwargs)


os.replace, shutil.rmtree = replace, rmtree
ck.save_checkpoint(state, root / "step-000008", run.config, overwrite=True)
sys.exit(3)  # сюда процесс дойти не должен
"""
KILL_POINTS = [
    "before_first_rename",
    "after_first_rename",
    "after_second_rename",
    "while_removing_old",
]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_overwrite_killed_at_any_point_keeps_a_complete_checkpoint(tmp_path, point):
    """kill -9 посреди замены step-000008: полная копия находится в любой момент,
    remove_incomplete её не удаляет, перезапущенный тренер продолжает с шага 8."""
    run = ToyRLRun(0)
    _events(run, 8)
    target = ck.save_checkpoint(run.state_dict(), tmp_path / "step-000008", run.config)
    old_created = ck.read_manifest(target)["created_unix"]
    proc = subprocess.run(
        [sys.executable, "-c", _OVERWRITE_AND_DIE, point, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # настоящий kill -9
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2, names  # старая и новая копии, одна из них ещё не на месте
    assert ("step-000008" in names) == (point != "after_first_rename"), names
    found = ck.latest_checkpoint(tmp_path, run.config)
    assert found is not None, names
    assert ck.read_manifest(found)["step"] == 8
    ck.remove_incomplete(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000008"], names
    manifest = ck.verify_checkpoint(target, run.config)
    assert manifest["created_unix"] != old_created  # на месте новая копия: полную не удалили
    res = ckt.checkpointed_trainer(0, 1, "gloo", str(tmp_path), total_steps=9, checkpoint_every=4)
    assert res["resumed_from"] == 8 and [e["step"] for e in res["events"]] == [9]


def test_kill_during_write_never_leaves_a_loadable_newest(tmp_path):
    run_dir = tmp_path / "run"
    args = {"run_dir": str(run_dir), "total_steps": 12, "checkpoint_every": 4}
    first = _launch(tmp_path, 1, **args, kill_during_write_at_step=8)
    assert not first.ok and first.exitcodes == [-9]  # настоящий SIGKILL
    assert "SIGKILL" in first.summary()
    names = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
    assert names[0].startswith(".tmp-step-000008-") and names[1:] == ["step-000004"]
    leftover = run_dir / names[0]
    assert sorted(p.name for p in leftover.iterdir()) == ["policy.json", "policy.safetensors"]
    assert ck.latest_checkpoint(run_dir) == run_dir / "step-000004"
    assert len(_run_events(run_dir)[0]) == 8  # шаг 8 успел в журнал, его контрольная точка — нет

    second = _launch(tmp_path, 2, **args, kill_during_write_at_step=8)  # тот же вызов
    assert second.ok, second.summary()
    res = second.results[0]
    assert res["resumed_from"] == 4 and res["removed_temp_dirs"] == [leftover.name]
    assert res["checkpoints_written"] == ["step-000008", "step-000012"]
    events, attrs = _run_events(run_dir)
    reference, checksum = _reference(12)
    assert events == reference and res["policy_checksum"] == checksum
    assert attrs["recomputed_steps"] == [5, 6, 7, 8] and attrs["recomputed_identical"]
    assert attrs["processes"] == 2
    assert ck.latest_checkpoint(run_dir) == run_dir / "step-000012"


def test_kill_after_checkpoint_then_restart_matches_uninterrupted(tmp_path):
    run_dir = tmp_path / "run"
    args = {"run_dir": str(run_dir), "total_steps": 12, "checkpoint_every": 4}
    first = _launch(tmp_path, 1, **args, kill_at_step=6)
    assert first.exitcodes == [-9]
    assert ck.latest_checkpoint(run_dir) == run_dir / "step-000004"
    second = _launch(tmp_path, 2, **args)
    assert second.ok, second.summary()
    res = second.results[0]
    assert res["resumed_from"] == 4 and [e["step"] for e in res["events"]] == list(range(5, 13))
    events, attrs = _run_events(run_dir)
    reference, checksum = _reference(12)
    assert events == reference and res["policy_checksum"] == checksum
    assert attrs["recomputed"] == 2 and attrs["recomputed_steps"] == [5, 6]
    assert attrs["recomputed_identical"] and attrs["torn_lines"] == 0


def test_events_from_run_dir_handles_torn_line(tmp_path):
    ev = _events(ToyRLRun(0), 3)
    lines = [json.dumps({"pid": 1, "event": e}) for e in ev]
    lines += [json.dumps({"pid": 2, "event": ev[2]}), '{"pid": 2, "event": {"st']
    (tmp_path / "events.jsonl").write_text("\n".join(lines))
    frame = ckt.events_from_run_dir(tmp_path)
    assert frame["step"].tolist() == [1, 2, 3] and frame["computations"].tolist() == [1, 1, 2]
    assert frame.attrs["torn_lines"] == 1 and frame.attrs["recomputed"] == 1
    assert frame["pid"].tolist() == [1, 1, 2]


def test_checkpointed_trainer_validates_arguments(tmp_path):
    with pytest.raises(ValueError, match="kill_during_write_at_step"):
        ckt.checkpointed_trainer(
            0, 1, "gloo", str(tmp_path), checkpoint_every=5, kill_during_write_at_step=7
        )
    with pytest.raises(ValueError, match="один процесс"):
        ckt.checkpointed_trainer(0, 2, "gloo", str(tmp_path))


def test_checkpointed_trainer_in_process_resume_and_config_guard(tmp_path):
    first = ckt.checkpointed_trainer(0, 1, "gloo", str(tmp_path), total_steps=4, checkpoint_every=2)
    assert first["resumed_from"] is None
    assert first["checkpoints_written"] == ["step-000002", "step-000004"]
    second = ckt.checkpointed_trainer(
        0, 1, "gloo", str(tmp_path), total_steps=6, checkpoint_every=2
    )
    assert second["resumed_from"] == 4 and [e["step"] for e in second["events"]] == [5, 6]
    assert first["events"] + second["events"] == _events(ToyRLRun(0), 6)
    with pytest.raises(CheckpointError, match="seed: 0 → 1"):
        ckt.checkpointed_trainer(0, 1, "gloo", str(tmp_path), total_steps=8, seed=1)
