"""Где опубликован курс: организация, репозиторий и ветка заданы здесь и только здесь.

Из этих трёх значений строятся значки Colab в README и адрес клонирования в ячейке
установки каждого ноутбука. Чтобы опубликовать форк, поменяйте ``ORG``/``REPO``/``BRANCH``
и выполните ``python -m course_utils.links`` — README и ноутбуки обновятся; тест
``tests/test_links.py`` проверяет, что они согласованы.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from course_utils import atomic
from course_utils.csv_tables import REPO_ROOT

ORG = "rl-llm-course"
REPO = "module12-rl-infra"
BRANCH = "main"

REPO_URL = f"https://github.com/{ORG}/{REPO}"
_BADGE_IMG = "https://colab.research.google.com/assets/colab-badge.svg"

LESSONS = (
    ("12.1", "12_1_rl_loop_dataflow.ipynb", "RL-контур как поток данных"),
    ("12.2", "12_2_memory_throughput.ipynb", "Память и пропускная способность"),
    ("12.3", "12_3_pipelines_queues_tails.ipynb", "Конвейеры, очереди и медленные роллауты"),
    (
        "12.4",
        "12_4_staleness_mismatch_sync.ipynb",
        "Несвежесть, рассогласование и синхронизация весов",
    ),
    (
        "12.5",
        "12_5_recovery_observability_stacks.ipynb",
        "Восстановление, наблюдаемость и выбор стека",
    ),
)
_START, _END = "<!-- lessons:start -->", "<!-- lessons:end -->"


def colab_url(notebook: str) -> str:
    """Адрес ноутбука в Colab: colab.research.google.com/github/ORG/REPO/blob/BRANCH/notebooks/…"""
    return (
        f"https://colab.research.google.com/github/{ORG}/{REPO}/blob/{BRANCH}/notebooks/{notebook}"
    )


def _badge(notebook: str) -> str:
    """Значок «Open in Colab» в Markdown."""
    return f"[![Open In Colab]({_BADGE_IMG})]({colab_url(notebook)})"


def lessons_table(root: Path = REPO_ROOT) -> str:
    """Таблица уроков для README: значок Colab только у ноутбуков, которые уже есть."""
    rows = ["| урок | тема | ноутбук | Colab |", "|---|---|---|---|"]
    for num, nb, title in LESSONS:
        if (root / "notebooks" / nb).exists():
            rows.append(f"| {num} | {title} | [`{nb}`](notebooks/{nb}) | {_badge(nb)} |")
        else:
            rows.append(f"| {num} | {title} | `{nb}` | в разработке |")
    return "\n".join(rows)


def render_readme(text: str, root: Path = REPO_ROOT) -> str:
    """README с обновлённым блоком между метками ``lessons:start`` и ``lessons:end``."""
    if _START not in text or _END not in text:
        raise ValueError(f"в README нет меток {_START} и {_END}")
    head, rest = text.split(_START, 1)
    _, tail = rest.split(_END, 1)
    return f"{head}{_START}\n{lessons_table(root)}\n{_END}{tail}"


def _render_notebook_source(source: str, notebook: str) -> str:
    """Подставляет REPO_URL, BRANCH и значок Colab в текст ячейки ноутбука."""
    source = re.sub(r'REPO_URL = "[^"]*"', f'REPO_URL = "{REPO_URL}"', source)
    source = re.sub(r'BRANCH = "[^"]*"', f'BRANCH = "{BRANCH}"', source)
    return re.sub(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)", _badge(notebook), source)


def sync(root: Path = REPO_ROOT) -> list[Path]:
    """Обновляет README и первые две ячейки ноутбуков; возвращает изменённые файлы."""
    changed = []
    readme = root / "README.md"
    new = render_readme(readme.read_text(encoding="utf-8"), root)
    if new != readme.read_text(encoding="utf-8"):
        atomic.write_text(readme, new)
        changed.append(readme)
    for _, nb_name, _ in LESSONS:
        path = root / "notebooks" / nb_name
        if not path.exists():
            continue
        nb = json.loads(path.read_text(encoding="utf-8"))
        dirty = False
        for cell in nb["cells"][:2]:
            src = "".join(cell["source"])
            upd = _render_notebook_source(src, nb_name)
            if upd != src:
                cell["source"] = upd.splitlines(keepends=True)
                dirty = True
        if dirty:
            atomic.write_text(path, json.dumps(nb, ensure_ascii=False, indent=1) + "\n")
            changed.append(path)
    return changed


if __name__ == "__main__":
    for p in sync():
        print(f"обновлён {p.relative_to(REPO_ROOT)}")
    print(f"Репозиторий: {REPO_URL}, ветка {BRANCH}")
