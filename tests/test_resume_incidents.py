"""Лаборатория инцидентов урока 12.5: трекер при асинхронной записи (verl #7952) и шаг,
увеличенный дважды при возобновлении (verl #7933). Проверки шага и версии crash_test
срабатывают на сломанных вариантах и молчат на исправленных."""

import threading

import pytest

from course_utils import checkpoint as ck, crash_test

SIZES = {"total_steps": 16, "crash_at": 11, "checkpoint_every": 4}  # s₀ = 8


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """По аварийному запуску на каждый способ записи точек (SAVES)."""
    return {
        save: crash_test.prepare_crash_run(
            **SIZES, seed=2, workdir=tmp_path_factory.mktemp(save), save=save
        )
        for save in crash_test.SAVES
    }


def test_tracker_names_last_complete_checkpoint_only_when_written(runs):
    for save, run in runs.items():
        root = run.checkpoint.parent
        assert sorted(p.name for p in root.glob("step-*")) == ["step-000004", "step-000008"]
        assert ck.latest_checkpoint(root, components=ck.COMPONENTS) == root / "step-000008"
        tracker = root / crash_test.TRACKER
        if save == "async_no_tracker":  # точки целы, трекера нет: так в verl #7952
            assert not tracker.exists() and crash_test.tracked_checkpoint(root) is None
        else:
            assert tracker.read_text() == "8\n"
            assert crash_test.tracked_checkpoint(root) == root / "step-000008"


@pytest.mark.parametrize(
    "save, find, problems",
    [
        ("sync", crash_test.tracked_checkpoint, set()),
        ("async", crash_test.tracked_checkpoint, set()),  # исправление: трекер после записи
        ("async_no_tracker", ck.latest_checkpoint, set()),  # или поиск по manifest
        ("async_no_tracker", crash_test.tracked_checkpoint, {"from_zero", "wrong_version"}),
    ],
)
def test_auto_resume_by_tracker(runs, save, find, problems):
    res = runs[save].branches(find=find)
    assert set(res.resume_problems()) == problems
    first = res.branches["full"][res.restored_step]
    if problems:  # перезапуск с нуля: шаг 1 и версия 1 вместо 9 и 9, ветвь расходится на 9
        assert (first["step"], first["policy_version"]) == (1, 1)
        assert res.first_divergence("full") == 9 and not res.passed
        text = res.summary()
        assert "возобновление с шага 0 при целых контрольных точках" in text
        assert "step-000008 (шаг 8) цела" in text
    else:
        assert (first["step"], first["policy_version"]) == (9, 9)
        assert res.first_divergence("full") is None and res.passed
        assert "✗" not in res.summary()


def test_step_incremented_twice_is_caught_and_fixed_resume_is_quiet(runs):
    bad = runs["sync"].branches(crash_test.resume_step_twice)
    first = bad.branches["full"][8]
    assert (first["step"], first["policy_version"]) == (10, 9)  # шаг 10 вместо 9, версия верна
    assert list(bad.resume_problems()) == ["step_twice"]
    assert "шаг после возобновления увеличен дважды" in bad.summary()
    assert bad.first_divergence("full") == 9 and bad.diverged_fields("full") == ["step"]
    good = runs["sync"].branches(ck.resume_full)
    assert good.resume_problems() == {} and good.passed
    # «только веса» берёт шаг и версию из manifest: проверки шага и версии её не трогают
    assert good.resume_problems("weights_only") == {}


def test_other_step_errors_get_the_generic_verdict(runs):
    def off_by_three(run_factory, checkpoint_path):
        run = ck.resume_full(run_factory, checkpoint_path)
        run.global_step -= 3
        run.policy_version += 1
        return run

    res = runs["sync"].branches(off_by_three)
    assert set(res.resume_problems()) == {"wrong_step", "wrong_version"}


@pytest.mark.parametrize("save", crash_test.SAVES)
def test_async_saves_write_in_background_thread(tmp_path, monkeypatch, save):
    """ "sync" пишет точку в цикле обучения (главный поток), "async*" — в фоновом потоке."""
    threads = []
    real = ck.save_checkpoint

    def spy(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(ck, "save_checkpoint", spy)
    crash_test.prepare_crash_run(**SIZES, workdir=tmp_path, save=save)
    in_main = [t is threading.main_thread() for t in threads]
    assert in_main == ([True, True] if save == "sync" else [False, False])


def test_bad_save_and_find_arguments(runs, tmp_path):
    with pytest.raises(ValueError, match="save"):
        crash_test.prepare_crash_run(**SIZES, workdir=tmp_path, save="lazy")
    with pytest.raises(ValueError, match="find"):
        runs["sync"].branches(find="latest")
