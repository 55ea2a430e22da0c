"""How long the coordinator lets requests gather before it begins the next epoch.

An epoch costs about the same messages, syscalls and epoch-log records whatever it
carries (issue 47: ~2.5 ms of CPU over the processes on a 2-core host), so epochs begun at
once carry one or two transactions at low load and the CPU goes to the epochs. Waiting
longer makes them fuller, and every transaction waits that much longer for its reply.

:class:`Gathering` spends that wait where it pays. It measures two things over the last
few dozen epochs:

- ``rate``: transactions committed per second of wall time (the epochs' roots over the time
  between their commits, idle time included);
- ``epoch_time``: the time an epoch takes from its Begin to its last report — mostly the
  epoch-log write, whatever the epoch carries.

``rate × epoch_time`` is the load in epochs: the share of the time the cluster would spend
in epochs if each transaction had one of its own. The window is the budget
(``Settings.epoch_gather``) scaled by that load over :data:`FULL_AT`, at most the budget:
a nearly idle cluster begins an epoch at once (nothing would gather anyway, and the reply
comes sooner), a loaded one waits the whole budget (each epoch then carries several
transactions). The window counts from the previous Begin, so an epoch that took longer than
the window is never delayed.
"""

from __future__ import annotations

__all__ = ["Gathering", "FULL_AT", "DECAY"]

#: The load in epochs (``rate × epoch_time``) at which an epoch waits the whole budget.
FULL_AT = 0.5
#: Weight an old epoch keeps per newer epoch in the measures (memory of ~20 epochs).
DECAY = 0.95


class Gathering:
    """The gathering window (see the module docstring). ``adaptive=False``: always the
    budget, the window of earlier versions."""

    def __init__(self, budget: float, adaptive: bool = True) -> None:
        self.budget = budget
        self.adaptive = adaptive
        self._roots = 0.0  # decayed sums: transactions, seconds between commits,
        self._elapsed = 0.0  # seconds from Begin to the barrier, epochs
        self._executed = 0.0
        self._epochs = 0.0

    def observe(self, roots: int, elapsed: float, executed: float) -> None:
        """An epoch committed ``roots`` transactions, ``elapsed`` seconds after the
        previous commit, ``executed`` seconds after its Begin."""
        self._roots = self._roots * DECAY + roots
        self._elapsed = self._elapsed * DECAY + max(elapsed, 0.0)
        self._executed = self._executed * DECAY + max(executed, 0.0)
        self._epochs = self._epochs * DECAY + 1

    @property
    def rate(self) -> float:
        """Transactions per second, recently."""
        return self._roots / self._elapsed if self._elapsed > 0 else 0.0

    @property
    def epoch_time(self) -> float:
        """Seconds from an epoch's Begin to its last report, recently."""
        return self._executed / self._epochs if self._epochs > 0 else 0.0

    @property
    def window(self) -> float:
        """Seconds from the previous Begin before the next may go out."""
        if not self.adaptive:
            return self.budget
        return self.budget * min(1.0, self.rate * self.epoch_time / FULL_AT)
