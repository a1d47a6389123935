"""What a hospital says when a message fails: the public text only; the detail stays in its log.

A ClientApp exception becomes Flower's error reply, whose reason is the exception's text; the
server stores it (``config.json``, ``summary.json``, ``rounds.jsonl``), prints it to the
ServerApp's log (``flwr log``) and the console serves it. So the outermost mod of every handler
replaces any exception by one whose text may leave the hospital: a :class:`HospitalError`'s
``public`` text (a problem, a count, an index: no path, file name, patient id or DICOM header
value), or, for any other exception, its type and the handler, since its message may hold
anything. The full detail, with the traceback, goes to the hospital's own log first.
"""

from __future__ import annotations

from logging import ERROR

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import log

from hospitrust.errors import HospitalError


class HospitalFailure(HospitalError):
    """A failed message, as it leaves the hospital (its text is public)."""


def public_reason(exc: BaseException, message_type: str) -> str:
    """The text of ``exc`` that may leave the hospital."""
    if isinstance(exc, HospitalError):
        return exc.public
    return (f"{type(exc).__name__} in the hospital's {message_type} handler (the detail is in the hospital's own "
            "log)")


def public_failures_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Run the handler; on an exception, log its detail here and raise its public text only."""
    try:
        return call_next(msg, context)
    except Exception as exc:
        message_type = msg.metadata.message_type
        detail = exc.detail if isinstance(exc, HospitalError) else f"{type(exc).__name__}: {exc}"
        log(ERROR, "hospitrust: the %s message failed on this hospital (the server gets only the public text "
            "below): %s", message_type, detail, exc_info=exc)
        raise HospitalFailure(public_reason(exc, message_type)) from None


__all__ = ["HospitalFailure", "public_failures_mod", "public_reason"]
