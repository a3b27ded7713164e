import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("PITLAB_DATA_ROOT", REPO.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not DATA_ROOT.is_dir():
        pytest.fail(f"shared data not found at {DATA_ROOT}; set PITLAB_DATA_ROOT")
    return DATA_ROOT
