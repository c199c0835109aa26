"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (cluster preemption).

The first signal asks the run to stop: the step in progress finishes (an evaluation in progress is abandoned at its
next batch), a checkpoint of the last completed step is written, and the run ends with :class:`RunInterrupted`
(the command exits 130 for SIGINT, 143 for SIGTERM: 128 + the signal, as a shell reports a process killed by it).

A signal while that stop is under way:

- **SIGINT** (a person pressing Ctrl-C again) stops at once: ``KeyboardInterrupt``, exit 130. Every write is
  atomic, so that leaves the last complete checkpoint and no partial file behind.
- **SIGTERM** is logged and changes nothing: the checkpoint goes on and the command exits with the code of the
  signal that asked for the stop (143 after a first SIGTERM). A scheduler sends SIGTERM more than once for one
  preemption (Slurm signals every process of a job step, and torchrun's agent forwards its own SIGTERM to the
  workers), so a second SIGTERM is no request to hurry; the scheduler's SIGKILL at the end of its grace period is
  the hard stop.

A completed step's metrics row is written even when a signal cuts its evaluation short, except the last step's:
its checkpoint precedes the final evaluation and carries the row, so a signal, an error or a kill during that
evaluation loses nothing: ``--resume latest`` runs the evaluation and writes the row (:meth:`rlzoo.trainer.Trainer.train`).
"""

import contextlib
import logging
import os
import signal
import threading
import types
from collections.abc import Iterator
from typing import Any

from rlzoo.trainer.distributed import RANK_LOCAL

__all__ = ["GracefulInterrupt", "RunInterrupted", "interrupts_unwrapped"]

log = logging.getLogger("rlzoo.train")


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
        run = os.path.dirname(os.path.dirname(checkpoint))  # RUN/checkpoints/step-N
        super().__init__(f"stopped by {name} after step {step}; checkpoint {checkpoint} (continue with --output-dir "
                         f"{run} --resume latest; if step {step} was the run's last, with a larger --max-steps)")


class GracefulInterrupt:
    """Context manager: while active, SIGINT and SIGTERM set :attr:`requested` instead of stopping the process.
    Once a stop is requested, a SIGINT raises ``KeyboardInterrupt`` at once and a SIGTERM is logged and ignored
    (see the module's docstring). Installs nothing outside the main thread (signals are delivered there only),
    where :attr:`requested` stays None.

    Attributes:
        requested: the first signal received, or None.
        ending: set once the run has taken its last step (checkpointed, if it took any): a signal then only says so.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None
        self.ending = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt(f"second {name}: stopping at once")
        if self.ending:  # the run has taken its last step (and checkpointed it): nothing is left to finish
            self.requested = signum
            log.warning("%s received: the run has finished its steps and is ending (nothing is left to checkpoint)",
                        name, extra=RANK_LOCAL)
            return
        if self.requested is not None:
            when = "again" if signum == self.requested else f"while stopping on {signal.Signals(self.requested).name}"
            at_once = (f"kill -INT {os.getpid()} or SIGKILL stop this rank at once" if "TORCHELASTIC_RUN_ID" in os.environ
                       else "Ctrl-C or SIGKILL stop at once")  # under torchrun a terminal's Ctrl-C reaches the agent
            log.warning("%s received %s: the stop goes on (the current step finishes, then its checkpoint is "
                        "written; %s)", name, when, at_once, extra=RANK_LOCAL)
            return
        self.requested = signum
        if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun a terminal's Ctrl-C reaches its agent, not the ranks
            hint = f"kill -INT {os.getpid()} or SIGKILL stops this rank at once; a repeated SIGTERM is ignored"
        elif signum == signal.SIGINT:
            hint = "press Ctrl-C again to stop at once"
        else:
            hint = "Ctrl-C or SIGKILL stop at once; a repeated SIGTERM is ignored"
        log.warning("%s received: finishing the current step, then writing a checkpoint (%s)", name, hint,
                    extra=RANK_LOCAL)

    def agreed(self, stop: int | None) -> int | None:
        """``stop``, the signal every rank stops on after the loop (or None); without one the run has finished its
        steps (and checkpointed the last, if it took any): :attr:`ending`, so that a signal from then on (during the
        plot) says so instead of promising a step and a checkpoint."""
        self.ending = not stop
        return stop

    def __enter__(self) -> "GracefulInterrupt":  # noqa: PYI034 (beartype, the tests' checker, rejects Self here)
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@contextlib.contextmanager
def interrupts_unwrapped() -> Iterator[None]:
    """Around ``torch.distributed.checkpoint`` saves and loads: DCP wraps what a rank raised in a
    ``CheckpointException``, a second Ctrl-C's ``KeyboardInterrupt`` too; it is raised as itself, so the command
    exits 130 at once as documented (it exited 1 with DCP's traceback when the signal came during a checkpoint)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as err:
        stop = next((exc for exc, _ in err.failures.values() if isinstance(exc, KeyboardInterrupt)), None)
        if stop is None:
            raise
        raise stop from None
