"""The reproducibility record of an evaluation: where its statistics ran, the versions of everything that can move
a number, and what the panel held."""

from __future__ import annotations

import os
import platform

import numpy as np
import pandas as pd

from pitlab.data.types import Panel
from pitlab.evaluator.linalg import Backend

TARGET = "close[t+2] / close[t+1] - 1 (JPX definition)"


def device_record(backend: Backend) -> dict:
    """Where the statistics ran (library, device, dtype, BLAS threads on the CPU), the host, and the
    accelerator torch sees, if any."""
    import torch
    from threadpoolctl import threadpool_info

    d = {"statistics": backend.describe(), "host": f"{platform.machine()} ({platform.processor() or 'cpu'}), "
                                                  f"{os.cpu_count()} cores",
         "blas": [{"library": i.get("internal_api"), "threads": i.get("num_threads"),
                   "version": i.get("version")} for i in threadpool_info() if i.get("user_api") == "blas"],
         "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if d["cuda"]:
        d["gpu"] = torch.cuda.get_device_name(0)
    return d


def versions() -> dict[str, str]:
    """Versions of everything that can move a number: interpreter, array and model libraries, calendars."""
    from importlib.metadata import PackageNotFoundError, version

    import matplotlib
    import sklearn
    import torch
    import transformers

    out = {"python": platform.python_version(), "numpy": np.__version__, "pandas": pd.__version__,
           "scikit-learn": sklearn.__version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "matplotlib": matplotlib.__version__}
    for dist in ("exchange_calendars", "tokenizers", "safetensors", "pitlab"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def panel_summary(panel: Panel, calendar: pd.DatetimeIndex) -> dict:
    """The panel as evaluated: rows, securities, dates, the trading calendar against the price file's days, what
    was dropped and the target's definition."""
    rows = panel.rows
    dates = pd.DatetimeIndex(rows["date"])
    pcal = pd.DatetimeIndex(panel.calendar)
    first, last = pcal[0], pcal[-1]
    sessions = calendar[(calendar >= first) & (calendar <= last)]
    return {"source": panel.source, "n_rows": len(rows), "n_securities": int(rows["security"].nunique()),
            "n_dates": int(dates.nunique()), "first_date": dates.min().date().isoformat(),
            "last_date": dates.max().date().isoformat(),
            "calendar": [first.date().isoformat(), last.date().isoformat()],
            "trading_calendar": {
                "name": calendar.name, "sessions": int(len(sessions)),
                "price_file_days_not_sessions": [d.date().isoformat() for d in pcal.difference(sessions)][:20],
                "sessions_missing_from_price_file": int(len(sessions.difference(pcal)))},
            "dropped": dict(panel.dropped), "dropped_rows": list(panel.dropped_rows), "target": TARGET}
