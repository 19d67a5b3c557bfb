"""Mailboxes: bounded FIFO queues of envelopes, overflow policies and dead letters.

This layer knows nothing about actors or engines; ``microagent.actors`` builds
``tell``/``ask`` on top of it.
"""

from .._public import publish as _publish
from ._dead_letters import DeadLetter as DeadLetter
from ._dead_letters import DeadLetterReason as DeadLetterReason
from ._dead_letters import DeadLetters as DeadLetters
from ._dead_letters import DeadLetterSubscription as DeadLetterSubscription
from ._envelope import Addressable as Addressable
from ._envelope import Envelope as Envelope
from ._envelope import next_correlation_id as next_correlation_id
from ._errors import MailboxClosed as MailboxClosed
from ._errors import MailboxError as MailboxError
from ._errors import MailboxFull as MailboxFull
from ._errors import Undeliverable as Undeliverable
from ._mailbox import Mailbox as Mailbox
from ._mailbox import MailboxStats as MailboxStats
from ._mailbox import OverflowPolicy as OverflowPolicy
from ._reply import ReplySlot as ReplySlot

__all__ = [
    "Addressable",
    "DeadLetter",
    "DeadLetterReason",
    "DeadLetterSubscription",
    "DeadLetters",
    "Envelope",
    "Mailbox",
    "MailboxClosed",
    "MailboxError",
    "MailboxFull",
    "MailboxStats",
    "OverflowPolicy",
    "ReplySlot",
    "Undeliverable",
    "next_correlation_id",
]

_publish(globals(), __name__)
