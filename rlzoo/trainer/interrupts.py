"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (cluster preemption).

The first signal asks the run to stop: the step in progress finishes (an evaluation in progress is abandoned at its
next batch), a checkpoint of the last completed step is written, and the
run ends with :class:`RunInterrupted` (the command exits 130 for SIGINT, 143 for SIGTERM, as a shell reports a
process killed by the signal). A second signal stops at once (``KeyboardInterrupt``); every write is atomic,
so that leaves the last complete checkpoint and no partial file behind. A completed step's metrics row is
written even when a signal cuts its evaluation short, and the last step's checkpoint precedes the final evaluation.
"""

import signal
import threading
import types
from typing import Any

__all__ = ["GracefulInterrupt", "RunInterrupted"]


class RunInterrupted(Exception):
    """The run stopped on a signal after checkpointing its last completed step.

    Attributes:
        signum: the signal (``signal.SIGINT`` or ``signal.SIGTERM``).
        step: the last completed optimizer step (its checkpoint is written).
        exit_code: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int, step: int, checkpoint: str) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} after step {step}; checkpoint {checkpoint} (continue with --resume latest)")


class GracefulInterrupt:
    """Context manager: while active, SIGINT and SIGTERM set :attr:`requested` instead of stopping the process;
    a second one raises ``KeyboardInterrupt`` at once. Installs nothing outside the main thread (signals are
    delivered there only), where :attr:`requested` stays None.

    Attributes:
        requested: the first signal received, or None.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")
        self.requested = signum
        import logging

        logging.getLogger("rlzoo.train").warning(
            "%s received: finishing the current step, then writing a checkpoint (send it again to stop at once)",
            signal.Signals(signum).name)

    def __enter__(self) -> "GracefulInterrupt":  # noqa: PYI034 (beartype, the tests' checker, rejects Self here)
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
