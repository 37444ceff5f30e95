"""The device ledger: a device has one holder, and a moved job waits for its new devices.

Plain threads, no Ray and no service.
"""

from __future__ import annotations

import threading

from api.execution.ledger import DeviceLedger, Handover, LiveJob

JOIN_S = 10.0
"""Only a bound for a test that would otherwise hang; no claim is timed."""


class Releases:
    """Counts the ledger's wake-ups of the executor; ``first`` is set at the first."""

    def __init__(self) -> None:
        self.count = 0
        self.first = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.first.set()


def _park(ledger: DeviceLedger, live: LiveJob) -> tuple[threading.Thread, list[Handover | None]]:
    """Park ``live`` in a thread of its own, as its runner thread does; what park returned."""
    moves: list[Handover | None] = []
    thread = threading.Thread(target=lambda: moves.append(ledger.park(live)))
    thread.start()
    return thread, moves


def test_a_device_is_held_by_one_job_and_goes_back_when_released() -> None:
    releases = Releases()
    ledger = DeviceLedger(on_release=releases)
    a = ledger.admit("a", ["x/0", "x/1"], pinned=False)
    assert a is not None
    assert ledger.admit("b", ["x/1", "y/0"], pinned=False) is None  # x/1 is a's
    assert ledger.holders() == {"x/0": "a", "x/1": "a"}
    ledger.release(a, ["x/0"])  # its plan left x/1 out
    assert releases.count == 1 and ledger.holders() == {"x/0": "a"}
    b = ledger.admit("b", ["x/1", "y/0"], pinned=True)
    assert b is not None and b.pinned and b.granted == ["x/1", "y/0"]
    # a recovery of a takes back only what b does not hold
    assert ledger.claim(a, ["x/0", "x/1", "y/1"]) == ["x/0", "y/1"]
    ledger.remove("b")
    assert releases.count == 2 and ledger.holders() == {"x/0": "a", "y/1": "a"}
    assert [j.job_id for j in ledger.jobs()] == ["a"]


def test_steer_asks_for_a_move_once_and_takes_it_back_when_the_policy_does() -> None:
    ledger = DeviceLedger(on_release=lambda: None)
    live = ledger.admit("a", ["x/0", "x/1"], pinned=False)
    assert live is not None
    assert not ledger.steer(live, ["x/1", "x/0"], "same devices")  # no move
    assert not live.move.is_set() and live.granted == ["x/1", "x/0"]
    assert ledger.steer(live, ["y/0"], "faster there")
    assert live.move.is_set() and (live.move_to, live.move_reason) == (["y/0"], "faster there")
    assert not ledger.steer(live, ["y/0"], "faster there")  # asked already: not logged twice
    assert not ledger.steer(live, ["x/0", "x/1"], "back")  # changed its mind before the move
    assert not live.move.is_set() and live.move_to is None and live.devices == ["x/0", "x/1"]


def test_a_parked_job_waits_for_its_new_devices_and_takes_the_latest_decision() -> None:
    releases = Releases()
    ledger = DeviceLedger(on_release=releases)
    holder = ledger.admit("holder", ["y/0", "y/1"], pinned=False)
    mover = ledger.admit("mover", ["x/0"], pinned=False)
    assert holder is not None and mover is not None
    assert ledger.steer(mover, ["y/0"], "first reason")
    parked, moves = _park(ledger, mover)
    assert releases.first.wait(JOIN_S)  # it handed x/0 over ...
    assert ledger.holders() == {"y/0": "holder", "y/1": "holder"}  # ... and y/0 is not free
    assert ledger.admit("other", ["x/0"], pinned=False) is not None
    ledger.remove("other")
    assert not ledger.steer(mover, ["y/1"], "second reason")  # parked: takes it silently
    ledger.release(holder, ["y/0"])  # y/1 is free now
    parked.join(JOIN_S)
    assert not parked.is_alive()
    assert moves == [Handover(old=("x/0",), new=("y/1",), reason="second reason")]
    assert ledger.holders() == {"y/0": "holder", "y/1": "mover"}
    assert not mover.move.is_set() and mover.move_to is None and mover.granted == ["y/1"]


def test_a_parked_job_stopped_or_shut_down_holds_nothing() -> None:
    ledger = DeviceLedger(on_release=lambda: None)
    holder = ledger.admit("holder", ["y/0"], pinned=False)
    for stop in ("request", "shutdown"):
        mover = ledger.admit(f"mover-{stop}", ["x/0"], pinned=False)
        assert holder is not None and mover is not None
        assert ledger.steer(mover, ["y/0"], "wants y/0")
        parked, moves = _park(ledger, mover)
        if stop == "request":
            ledger.stop(mover.job_id)
        else:
            assert {j.job_id for j in ledger.close()} == {"holder", mover.job_id}
        parked.join(JOIN_S)
        assert not parked.is_alive() and moves == [None] and mover.devices == []
        assert mover.stop.is_set()
        ledger.remove(mover.job_id)
    assert holder is not None and holder.stop.is_set()  # close stopped every job
