"""What tracing costs: total CPU per transaction, tracing off against on (issue 50).

    python benchmarks/runtime/tracing_ab.py                    # 3 pairs, 15 s points, 1,000 TPS
    python benchmarks/runtime/tracing_ab.py --pairs 5 --seconds 20 --out /tmp/tracing.jsonl

Three sides of this checkout, run in interleaved rounds (each round every side once, the
order rotating) by ``cpu_ab.py``'s A/B machinery, which measures each point — a fresh
2-worker cluster, open-loop YCSB-T transfers — as user + system CPU seconds of every
process (coordinator, workers, supervisor, Kafka broker, the client and load generator)
per committed transaction, with psutil:

- ``off``: ``SFAAS_TRACING=0`` (the baseline);
- ``on1``: ``SFAAS_TRACING=1`` with 1 % head sampling (``parentbased_traceidratio``,
  0.01) and tail sampling of slow and aborted requests (``SFAAS_TRACE_SLOW``, 0.1 s);
- ``on100``: ``SFAAS_TRACING=1``, every trace kept (``parentbased_always_on``).

The spans go over OTLP to a local Jaeger (started here if none runs, stopped afterwards;
its CPU, like MinIO's, is the backend's and not counted). The target of issue 50 is a
ratio ``on1/off`` of CPU per transaction ≤ 1.05. Kafka and MinIO must be running
(``./run sfaas services up``); the numbers go into docs/operations/tracing.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.runtime import cpu_ab  # noqa: E402

#: Each side's environment, on top of the benchmark's (the OTLP endpoint is added).
SIDES: dict[str, dict[str, str]] = {
    "off": {"SFAAS_TRACING": "0"},
    "on1": {"SFAAS_TRACING": "1", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "on100": {"SFAAS_TRACING": "1", "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


def cpu_ab_args(args: argparse.Namespace, otlp: str) -> list[str]:
    """``cpu_ab.py``'s arguments for the three sides (pure: tested)."""
    argv = ["--rates", str(args.rate), "--dist", args.dist, "--pairs", str(args.pairs),
            "--seconds", str(args.seconds), "--requests-seconds", "0",
            "--workers", "2"]
    for name, env in SIDES.items():
        argv += ["--ref", f"{name}=worktree"]
        for key, value in {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
                           "OTEL_SERVICE_NAME": ""}.items():
            argv += ["--env", f"{name}:{key}={value}"]
    if args.out:
        argv += ["--out", args.out]
    return argv


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="rounds of the three sides")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per point")
    ap.add_argument("--rate", type=int, default=1000, help="offered transactions per second")
    ap.add_argument("--dist", default="uniform", help="key distribution (cpu_ab.py --dist)")
    ap.add_argument("--out", default="", help="JSON lines of every point (cpu_ab.py --out)")
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from launcher import services

    with services.using(tracing=True) as endpoints:
        cpu_ab.main(cpu_ab_args(args, endpoints.otlp_endpoint))


if __name__ == "__main__":
    main()
