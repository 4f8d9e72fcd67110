"""Общие настройки тестов: без сети и GPU, прогресс упражнений во временном файле.

Переменные окружения ставятся при импорте conftest, то есть до запуска ядер nbval:
ядра ноутбуков их наследуют.
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("COURSE_MODEL", None)
os.environ["COURSE_PROGRESS_PATH"] = str(
    Path(tempfile.mkdtemp(prefix="course_progress_")) / "progress.json"
)

REPO_ROOT = Path(__file__).resolve().parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def pytest_collectstart(collector):
    # В ноутбуках не сравниваем stderr и HTML: предупреждения библиотек меняются от версии к версии.
    if getattr(collector, "fspath", None) and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("text/html", "application/javascript", "stderr")
