"""Files of labelled sequences, as a user would write them for ``aaren train --task class --data FILE``.

``write_ts`` writes a UEA / sktime ``.ts`` file, ``write_table`` the CSV (or Parquet) of
``session_id, time, <channels...>, label`` that ``aaren replay`` reads for a class model. Values
are written as the shortest text of their float32 value (``repr`` of the float), so reading them
back gives the same float32 bits.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _text(v: float, missing: str = "?") -> str:
    return missing if np.isnan(v) else repr(float(v))


def write_ts(
    path: Path,
    series: Sequence[np.ndarray],
    labels: Sequence[str],
    class_names: Sequence[str] | None = None,
    name: str = "Generated",
) -> Path:
    """``series[i] [n_i, C]`` with label names ``labels[i]``; ``class_names`` for ``@classLabel``
    (default: the labels in order of first appearance)."""
    declared = list(class_names) if class_names is not None else list(dict.fromkeys(labels))
    width = series[0].shape[1] if len(series) else 1
    lines = [
        f"@problemName {name}",
        "@timeStamps false",
        f"@univariate {'true' if width == 1 else 'false'}",
        f"@dimensions {width}",
        "@equalLength false",
        "@classLabel true " + " ".join(declared),
        "@data",
    ]
    for s, y in zip(series, labels, strict=True):
        dims = [",".join(_text(v) for v in s[:, c]) for c in range(s.shape[1])]
        lines.append(":".join(dims) + f":{y}")
    path.write_text("\n".join(lines) + "\n")
    return path


def table_rows(
    series: Sequence[np.ndarray], labels: Sequence[str], channels: Sequence[str], prefix: str = "s"
) -> list[list[object]]:
    """Rows ``[session_id, time, *channels, label]``: sequence ``i`` is session ``<prefix>-<i>``,
    its steps at times ``0, 1, ...``, a NaN value an empty cell."""
    rows: list[list[object]] = []
    for i, (s, y) in enumerate(zip(series, labels, strict=True)):
        rows += [[f"{prefix}-{i}", t, *(_text(v, "") for v in step), y] for t, step in enumerate(s)]
    return rows


def write_table(
    path: Path,
    series: Sequence[np.ndarray],
    labels: Sequence[str],
    channels: Sequence[str],
    prefix: str = "s",
) -> Path:
    """The CSV (``.csv``) or Parquet (``.parquet``) of ``table_rows``, header ``session_id, time,
    <channels>, label``."""
    header = ["session_id", "time", *channels, "label"]
    rows = table_rows(series, labels, channels, prefix)
    if path.suffix == ".parquet":
        import pandas as pd

        frame = pd.DataFrame(rows, columns=header)
        frame[list(channels)] = frame[list(channels)].astype(float)
        frame.to_parquet(path, index=False)
        return path
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path
