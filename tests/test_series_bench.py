"""The pure parts of the fault series benchmark (benchmarks/cluster/series.py): the seeded
schedules, the reply gaps overall and per fault, the worst gap's timeline from the logs and
its slowest step, the recoveries' phases. No cluster, nothing timed."""

from __future__ import annotations

import random
import time

import pytest

from benchmarks.cluster import series
from tests.cluster.faults import FaultLog

BASE = time.mktime((2026, 11, 29, 7, 4, 40, 0, 0, -1))  # a whole second, local time


def _stamp(offset: float) -> str:
    """A log line's timestamp ``offset`` s after ``BASE``, as the processes write it."""
    ms = round(offset * 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(BASE + ms // 1000)) + f",{ms % 1000:03d}"


@pytest.mark.parametrize("seed", range(20))
def test_the_faults_series_has_a_fault_every_5_s_and_kills_twice_as_minio_returns(seed: int) -> None:
    plan = series.faults_schedule(random.Random(seed), 60.0)
    assert plan == series.faults_schedule(random.Random(seed), 60.0)  # the seed replays it
    kinds = [what for _, what in plan]
    assert kinds.count("minio") == 1 and kinds.count("coordinator") == 1
    (down,) = [t for t, what in plan if what == "minio"]
    assert not [t for t, _ in plan if down < t < down + series.OUTAGE]  # nothing while it is down
    assert [(t, w) for t, w in plan if down + series.OUTAGE <= t <= down + series.OUTAGE + 2] == \
        [(down + 10, "worker"), (down + 12, "worker")]
    slots = sorted({t for t, _ in plan} - {down + 12})
    assert slots == [t for t in range(5, 60, 5) if not down < t < down + 10]
    assert all(t < 58 for t, _ in plan)


def test_the_seed_chooses_where_the_outage_and_the_coordinator_kill_fall() -> None:
    plans = {tuple(series.faults_schedule(random.Random(seed), 60.0)) for seed in range(20)}
    assert len(plans) > 5
    with pytest.raises(ValueError, match="--seconds"):
        series.faults_schedule(random.Random(1), 15.0)


@pytest.mark.parametrize("seed", range(20))
def test_the_pauses_series_pauses_a_worker_or_the_coordinator_every_7_s(seed: int) -> None:
    plan = series.pauses_schedule(random.Random(seed), 60.0)
    assert [t for t, _ in plan] == [7, 14, 21, 28, 35, 42, 49, 56]
    assert {what for _, what in plan} == {"pause worker", "pause coordinator"}
    assert plan == series.pauses_schedule(random.Random(seed), 60.0)


def _replies() -> list[float]:
    """A reply every 0.1 s for 20 s, but none between 5.0 and 7.5 s nor between 12 and 13 s."""
    return [i / 10 for i in range(200) if not (50 < i < 75 or 120 < i < 130)]


def test_the_longest_gaps_and_the_longest_after_each_fault() -> None:
    replies = _replies()
    random.Random(0).shuffle(replies)  # (arrival order is not assumed)
    gaps = series.longest_gaps(replies)
    assert [(round(g, 3), a) for g, a in gaps[:2]] == [(2.5, 5.0), (1.0, 12.0)]
    per = series.gaps_per_fault(replies, [4.0, 5.2, 6.5, 12.3, 30.0])
    # the gap is the fault's that hit just after its last reply (at 5.2 s, not 4.0 s), not
    # the one fired while it went on (6.5 s)
    assert per[0] is not None and per[0][0] == pytest.approx(0.1)
    assert per[1] is not None and per[1] == (pytest.approx(2.5), 5.0)
    assert per[2] is not None and per[2][0] == pytest.approx(0.1)
    assert per[3] is not None and per[3] == (pytest.approx(1.0), 12.0)
    assert per[4] is None  # no reply after it
    assert series.longest_gaps([1.0]) == []
    assert series.gap_around(replies, 6.5) == (pytest.approx(2.5), 5.0)
    assert series.gap_around(replies, 30.0) is None and series.gap_around(replies, -1.0) is None


def _logs() -> dict[str, str]:
    return {
        "coordinator": "\n".join([
            f"{_stamp(0.5)} WARNING sfaas.coordinator: lost worker 0 (worker-2, pid 27400): silent for 2.0 s",
            f"{_stamp(0.6)} INFO sfaas.coordinator.rounds: snapshot round 5 complete: epoch 9",
            f"{_stamp(0.7)} WARNING aiokafka.consumer: heartbeat failed",
            f"{_stamp(1.2)} WARNING sfaas.coordinator: worker worker-2 (pid 27574) replaces lost worker 0",
            f"{_stamp(2.9)} WARNING sfaas.coordinator.recovery: recovery 3 done in 2.40 s: rolled back "
            "to round 5, replayed 28 epochs (detect+restart 0.70 s, restore 0.26 s, replay 1.44 s)",
            "Traceback (most recent call last):",
            f"{_stamp(9.0)} WARNING sfaas.coordinator: lost worker 1 (worker-1, pid 1): later",
        ]),
        "supervisor": f"{_stamp(0.0)} INFO sfaas.supervisor: started worker 1 (pid 27573)\n"
                      f"{_stamp(0.8)} INFO sfaas.supervisor: started worker 0 (pid 27574)",
        "worker-0": f"{_stamp(-3.0)} ERROR sfaas.worker: fenced: no word from the coordinator",
    }


def test_the_timeline_holds_the_warnings_and_milestones_inside_the_gap_in_order() -> None:
    events = series.timeline(_logs(), BASE + 0.4, BASE + 3.0)
    assert [(e["t"], e["source"]) for e in events] == [  # (from 1 s before the gap)
        (-0.4, "supervisor"), (0.1, "coordinator"), (0.4, "supervisor"), (0.8, "coordinator"),
        (2.5, "coordinator")]
    assert events[1]["message"].startswith("lost worker 0") and events[1]["level"] == "WARNING"
    step = series.slowest_step(events, 2.6)
    assert step["seconds"] == pytest.approx(1.7) and step["from_s"] == pytest.approx(0.8)
    assert "replaces lost worker 0" in step["after"] and "recovery 3 done" in step["until"]
    assert series.slowest_step([], 1.5)["seconds"] == 1.5


def test_every_recovery_is_read_with_its_phases() -> None:
    (r,) = series.recoveries(_logs()["coordinator"])
    assert r["at"] == pytest.approx(BASE + 2.9)
    assert (r["attempt"], r["seconds"], r["round"], r["epochs"]) == (3, 2.4, 5, 28)
    assert r["phases"] == {"detect+restart": 0.7, "restore": 0.26, "replay": 1.44}


def test_a_series_result_says_whether_its_target_was_met_and_why_not() -> None:
    log = FaultLog()
    log.seen.append("worker pid 27400 halted: pid 27400 gone")
    log.failed.append("worker pid 9 halted: no effect seen within 5 s")
    inj = series.Injector(s=None, rnd=random.Random(0), log=log, shots=[
        series.Shot(BASE + 0.3, "worker", "worker pid 27400 halted"),
        series.Shot(BASE + 9.0, "worker", "worker pid 9 halted")])
    shots = inj.settle()
    assert [(x.took_effect, x.effect) for x in shots] == [(True, "pid 27400 gone"),
                                                          (False, "no effect seen within 5 s")]
    replies = [i / 10 for i in range(120) if not 4 < i < 30]  # a 2.6 s gap from 0.4 s
    r = series.analyse("faults", 7, [(0.3, "worker"), (9.0, "worker")], {"began": BASE},
                       shots, replies, _logs())
    assert r["longest_gap_s"] == 2.6 and r["met"] is True and r["target_s"] == 3.0
    first, second = (f["longest_gap_after"] for f in r["faults"])
    assert (first["s"], first["from"], second["s"]) == (2.6, 0.4, 0.1)
    assert "timeline" not in first  # under the target: no timeline of its own
    assert [f["fired_inside"] for f in r["faults"]] == [None, None]
    slow = [i / 10 for i in range(120) if not 4 < i < 39]  # 3.5 s from 0.4 s: over the target
    late = series.Shot(BASE + 2.0, "worker", "worker pid 5 halted", "pid 5 gone", True)
    over = series.analyse("faults", 7, [], {"began": BASE}, [shots[0], late, shots[1]], slow, _logs())
    assert over["faults"][1]["fired_inside"] == {"s": 3.5, "from": 0.4}  # (the gap of the first)
    assert over["faults"][1]["longest_gap_after"]["s"] == 0.1  # (the steady replies after the gap)
    gap = over["faults"][0]["longest_gap_after"]
    assert over["met"] is False and gap["s"] == 3.5
    assert gap["slowest_step"]["seconds"] == pytest.approx(1.7) and len(gap["timeline"]) == 5
    assert r["recoveries"][0]["at"] == 2.9 and r["recoveries"][0]["phases"]["replay"] == 1.44
    assert r["worst_gap"]["slowest_step"]["seconds"] == pytest.approx(1.7)
    missed = series.analyse("faults", 7, [], {"began": BASE}, [], [0.0, 3.5], {})
    assert missed["met"] is False and missed["worst_gap"]["timeline"] == []


def test_the_printed_report_names_the_miss_its_slowest_step_and_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    slow = [i / 10 for i in range(120) if not 4 < i < 39]
    shot = series.Shot(BASE + 0.3, "worker", "worker pid 27400 halted", "pid 27400 gone", True)
    r = series.analyse("faults", 7, [(0.3, "worker")], {"began": BASE}, [shot], slow, _logs())
    series.show({**r, "failed": "", "gave_up": [], "load_average": [1.0, 2.0]})
    out = capsys.readouterr().out
    assert "seed 7 (replay: --series faults --seed 7)" in out
    assert "longest reply gap 3.50 s (target ≤ 3 s: MISSED)" in out and "all held" in out
    assert "recovery 3 done in 2.40 s" in out and "#3 done at 2.90 s in 2.40 s" in out
    assert "slowest step: 1.70 s" in out and "over the target; slowest step 1.70 s" in out
    series.show({**r, "failed": "AssertionError: 5 requests unanswered", "load_average": [1.0, 2.0],
                 "gave_up": ["worker 0: exited 5 times within 60 s"]})
    out = capsys.readouterr().out
    assert "FAILED: AssertionError: 5 requests unanswered" in out and "all held" not in out
    assert "gave up restarting worker 0: exited 5 times" in out


def test_kills_and_pauses_spread_over_the_supervisors_children(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.cluster import ProcessInfo

    procs = [ProcessInfo("coordinator", 10, "", "coordinator.log"),
             ProcessInfo("worker", 11, "", "worker-0.log", index=1),  # (slots move between children)
             ProcessInfo("worker", 12, "", "worker-1.log", index=0),
             ProcessInfo("standby", 13, "", "worker-2.log", index=0)]
    monkeypatch.setattr(series.cluster, "ps", lambda _s: procs)
    inj = series.Injector(s=None, rnd=random.Random(3))
    picks = [inj._victim("worker") for _ in range(6)]
    assert sorted(picks) == [11, 11, 11, 12, 12, 12] and picks[0] != picks[1]
    inj.stopped.add(11)  # a paused process is not picked again while it is stopped
    assert {inj._victim("worker") for _ in range(3)} == {12}
    assert inj._victim("coordinator") == 10
    procs[0].alive = False
    assert inj._victim("coordinator") is None  # (the scenario asks again half a second later)
