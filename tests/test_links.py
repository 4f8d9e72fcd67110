"""README и ноутбуки согласованы с единственным местом, где записан адрес курса."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_utils import links

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
COLAB_RE = re.compile(
    r"https://colab\.research\.google\.com/github/([^/]+)/([^/]+)/blob/([^/]+)/(\S+?)\)"
)


def test_readme_lessons_block_is_up_to_date():
    assert links.render_readme(README) == README, "выполните python -m course_utils.links"


def test_every_badge_names_existing_notebook_on_configured_branch():
    badges = COLAB_RE.findall(README)
    existing = [nb for _, nb, _ in links.LESSONS if (REPO / "notebooks" / nb).exists()]
    assert len(badges) == len(existing)
    for org, repo, branch, path in badges:
        assert (org, repo, branch) == (links.ORG, links.REPO, links.BRANCH)
        assert (REPO / path).is_file(), f"значок ведёт на несуществующий файл {path}"


@pytest.mark.parametrize("notebook", [nb for _, nb, _ in links.LESSONS])
def test_notebook_setup_cell_uses_configured_repo(notebook):
    path = REPO / "notebooks" / notebook
    if not path.exists():
        assert f"`{notebook}` | в разработке" in README
        return
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first, setup = "".join(cells[0]["source"]), "".join(cells[1]["source"])
    assert links.colab_url(notebook) in first
    assert f'REPO_URL = "{links.REPO_URL}"' in setup
    assert f'BRANCH = "{links.BRANCH}"' in setup


def test_badge_detects_wrong_branch_and_missing_notebook(tmp_path):
    (tmp_path / "notebooks").mkdir()
    table = links.lessons_table(tmp_path)
    assert "colab.research" not in table  # нет ноутбуков — нет значков
    (tmp_path / "notebooks" / links.LESSONS[0][1]).write_text("{}")
    assert links.colab_url(links.LESSONS[0][1]) in links.lessons_table(tmp_path)


def test_bad_input():
    with pytest.raises(ValueError, match="README"):
        links.render_readme("нет меток")
