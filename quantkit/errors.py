"""One error table: every expected failure is a QuantkitError with a message, a hint and an exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENGINE = 3


class QuantkitError(Exception):
    """A failure the user can act on: `message` says what, `hint` says how to fix it."""

    exit_code = EXIT_ENGINE

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class BadInput(QuantkitError):
    """Wrong paths, malformed files, out-of-range options (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class DegenerateCalibration(BadInput):
    """The calibration activations cannot drive the numerics (NaN/Inf, too few samples): the
    user's input, so exit 2."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message, hint or "rebuild the calibration set with more, longer and "
                                          "varied samples (quantkit calibrate --samples 256)")


class EngineError(QuantkitError):
    """A library or engine failed while doing valid work (exit 3)."""

    exit_code = EXIT_ENGINE


class GateFailed(QuantkitError):
    """Validation ran and a threshold did not hold (exit 1)."""

    exit_code = EXIT_GATE_FAILED
