"""The wire-format examples under tests/fixtures/ (see the README there), loaded by file name."""
import json
from pathlib import Path

DIR = Path(__file__).resolve().parents[1] / "fixtures"


def load(name: str):
    """The parsed JSON of `tests/fixtures/<name>.json`."""
    return json.loads((DIR / f"{name}.json").read_text("utf-8"))
