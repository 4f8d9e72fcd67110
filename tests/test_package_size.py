"""Размер и устройство course_utils (#13): файл ≤ 800 строк, весь пакет не растёт выше потолка,
не больше 5 имён функций определены в нескольких модулях, нет публичных имён, которыми никто не
пользуется (ни ноутбук, ни тест, ни другой модуль)."""

import ast
import json
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = sorted((REPO / "course_utils").rglob("*.py"))
MAX_FILE_LINES = 800
MAX_PACKAGE_LINES = 16_147  # храповик: опускать вместе с сокращением, цель #13 — 12 000
MAX_SHARED_FUNCTION_NAMES = 5
_API_MARKS = ((":", '"'), ("-> ", ""), ("[", "]"))  # "модуль:функция", -> Тип, list[Тип]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _top_level_defs(path: Path) -> list[ast.AST]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def _notebook_code() -> str:
    cells = []
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        doc = json.loads(nb.read_text(encoding="utf-8"))
        cells += ["".join(c["source"]) for c in doc["cells"] if c["cell_type"] == "code"]
    return "\n".join(cells)


def test_no_file_over_800_lines():
    long = {
        p.relative_to(REPO).as_posix(): _lines(p) for p in PACKAGE if _lines(p) > MAX_FILE_LINES
    }
    assert not long, f"файлы длиннее {MAX_FILE_LINES} строк: {long}"


def test_package_does_not_grow():
    total = sum(_lines(p) for p in PACKAGE)
    print(f"course_utils: {total} строк в {len(PACKAGE)} файлах")
    assert total <= MAX_PACKAGE_LINES, f"course_utils вырос: {total} > {MAX_PACKAGE_LINES} строк"


def test_few_function_names_defined_in_several_modules():
    """Функции уровня модуля; методы одного протокола (same, problem у типов ответа) не считаются."""
    where = defaultdict(set)
    for p in PACKAGE:
        for node in _top_level_defs(p):
            if isinstance(node, ast.FunctionDef):
                where[node.name].add(p.relative_to(REPO).as_posix())
    shared = {name: sorted(mods) for name, mods in where.items() if len(mods) > 1}
    assert len(shared) <= MAX_SHARED_FUNCTION_NAMES, f"имена в нескольких модулях: {shared}"


def test_every_public_name_is_used_outside_its_module():
    texts = {p: p.read_text(encoding="utf-8") for p in PACKAGE}
    outside = [_notebook_code(), (REPO / "README.md").read_text(encoding="utf-8")]
    outside += [t.read_text(encoding="utf-8") for t in sorted((REPO / "tests").glob("*.py"))]
    unused = []
    for path in texts:
        for node in _top_level_defs(path):
            if node.name.startswith("_") or node.name == "main":
                continue
            if any(f"{a}{node.name}{b}" in texts[path] for a, b in _API_MARKS):
                continue  # точка входа рангов, тип результата или поля публичного отчёта
            used = re.compile(rf"\b{re.escape(node.name)}\b")
            others = [t for p, t in texts.items() if p != path] + outside
            if not any(used.search(t) for t in others):
                unused.append(f"{path.relative_to(REPO).as_posix()}:{node.name}")
    assert not unused, f"публичные имена, которыми никто не пользуется: {unused}"
