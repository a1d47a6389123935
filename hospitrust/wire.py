"""The model's arrays on the wire: one packed Array per ArrayRecord instead of one Flower object per tensor.

Flower 1.42 sends every Array of a message as objects of their own (an Array and its chunk), each pushed and pulled in
a request of its own that the SuperLink authenticates and records in its database: the tiny CNN's 12 tensors make a
train message 27 objects, so a round of three hospitals costs the SuperLink a few hundred requests. Packed, each
ArrayRecord of two or more arrays is one Array whose bytes are a manifest (every array's name, dtype, shape, stype and
length) and the arrays' own bytes one after another: 5 objects a message. Nothing is converted: each array's bytes,
dtype, shape and stype come back as they were sent, so a packed run's model is the unpacked run's bit for bit.

Who packs: the ServerApp's transport packs what it sends over a wire (:class:`hospitrust.server_app.transport.Sent`;
not the in-process grid) and unpacks every reply before any check sees it; the ClientApp's :func:`packed_arrays_mod`
unpacks before any handler sees the message and packs its reply only when the message came packed, so a message that
did not come through the transport (SecAgg+'s workflow sends its own) is answered as Flower makes it. A packed record
that cannot be read is a :class:`PackingError` naming what is wrong; the ServerApp turns a hospital's into an error
reply (rejected and recorded as any bad reply), a hospital's ClientApp into its error reply.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

#: The one key of a packed ArrayRecord, and its Array's stype (the format's version is in it).
PACKED_KEY = "hospitrust.packed"
PACKED_STYPE = "hospitrust.packed-arrays/1"
_HEADER = struct.Struct("<I")  # the manifest's length in bytes, then the manifest (JSON), then the arrays' bytes


class PackingError(ValueError):
    """A packed ArrayRecord that cannot be read; the message says what is wrong with it."""


def is_packed(record: ArrayRecord) -> bool:
    """Whether ``record`` is a packed record (its one entry the packed Array)."""
    if list(record.keys()) != [PACKED_KEY]:
        return False
    return record[PACKED_KEY].stype == PACKED_STYPE


def pack_record(record: ArrayRecord) -> ArrayRecord:
    """``record``'s arrays as one packed Array (a record of fewer than two arrays is returned as it is).

    Parameters
    ----------
    record : ArrayRecord
        The arrays to send.

    Returns
    -------
    ArrayRecord
        A record with the one entry ``PACKED_KEY``, or ``record`` itself.
    """
    if len(record) < 2 or is_packed(record):
        return record
    arrays = list(record.items())
    manifest = [[key, a.dtype, list(a.shape), a.stype, len(a.data)] for key, a in arrays]
    header = json.dumps(manifest, separators=(",", ":")).encode()
    blob = b"".join([_HEADER.pack(len(header)), header, *(a.data for _, a in arrays)])
    return ArrayRecord({PACKED_KEY: Array(dtype="uint8", shape=(len(blob),), stype=PACKED_STYPE, data=blob)})


def manifest(record: ArrayRecord) -> list[tuple[str, str, tuple[int, ...], str, int]]:
    """A packed record's manifest: (name, dtype, shape, stype, bytes) per array, checked against its bytes.

    Raises
    ------
    PackingError
        The record is not a readable packed record.
    """
    if not is_packed(record):
        raise PackingError(f"not a packed record: its entries are {sorted(record.keys())[:5]}, expected only "
                           f"{PACKED_KEY!r} with stype {PACKED_STYPE!r}")
    blob = record[PACKED_KEY].data
    if len(blob) < _HEADER.size:
        raise PackingError(f"packed arrays of {len(blob)} bytes: shorter than their {_HEADER.size}-byte header")
    (length,) = _HEADER.unpack_from(blob)
    if length > len(blob) - _HEADER.size:
        raise PackingError(f"the manifest's length ({length} bytes) exceeds the packed bytes ({len(blob)})")
    try:
        entries = json.loads(blob[_HEADER.size:_HEADER.size + length])
    except (UnicodeDecodeError, ValueError) as exc:
        raise PackingError(f"the manifest is not JSON: {exc}") from None
    if not isinstance(entries, list):
        raise PackingError(f"the manifest is a {type(entries).__name__}, expected a list of arrays")
    out, names = [], set()
    for i, entry in enumerate(entries):
        if not (isinstance(entry, list) and len(entry) == 5):
            raise PackingError(f"manifest entry {i}: expected [name, dtype, shape, stype, bytes], got {str(entry)[:80]}")
        name, dtype, shape, stype, size = entry
        if not (isinstance(name, str) and isinstance(dtype, str) and isinstance(stype, str)):
            raise PackingError(f"manifest entry {i}: name, dtype and stype must be strings")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise PackingError(f"manifest entry {i} ({name!r}): shape must be a list of non-negative integers, "
                               f"got {str(shape)[:80]}")
        if type(size) is not int or size < 0:
            raise PackingError(f"manifest entry {i} ({name!r}): bytes must be a non-negative integer, got {size!r}")
        if name in names:
            raise PackingError(f"manifest entry {i}: the name {name!r} appears twice")
        names.add(name)
        out.append((name, dtype, tuple(shape), stype, size))
    carried = len(blob) - _HEADER.size - length
    if sum(e[4] for e in out) != carried:
        raise PackingError(f"the manifest's arrays sum to {sum(e[4] for e in out)} bytes, the record carries {carried}")
    return out


def unpack_record(record: ArrayRecord) -> ArrayRecord:
    """The arrays a packed record carries, in their order, each as it was sent.

    Raises
    ------
    PackingError
        The record is not a readable packed record.
    """
    entries = manifest(record)
    blob = record[PACKED_KEY].data
    offset = _HEADER.size + _HEADER.unpack_from(blob)[0]
    arrays = {}
    for name, dtype, shape, stype, size in entries:
        arrays[name] = Array(dtype=dtype, shape=shape, stype=stype, data=bytes(blob[offset:offset + size]))
        offset += size
    return ArrayRecord(arrays)


def pack_content(content: RecordDict) -> RecordDict | None:
    """``content`` with each ArrayRecord of two or more arrays packed; None where there is nothing to pack."""
    records = dict(content.items())
    packed = {key: pack_record(r) if isinstance(r, ArrayRecord) else r for key, r in records.items()}
    if all(packed[key] is records[key] for key in records):
        return None
    return RecordDict(packed)


def unpack_content(content: RecordDict) -> RecordDict | None:
    """``content`` with each packed ArrayRecord unpacked; None where nothing is packed.

    Raises
    ------
    PackingError
        A packed record cannot be read.
    """
    records = dict(content.items())
    if not any(isinstance(r, ArrayRecord) and is_packed(r) for r in records.values()):
        return None
    return RecordDict({key: unpack_record(r) if isinstance(r, ArrayRecord) and is_packed(r) else r
                       for key, r in records.items()})


def packed_arrays_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """The ClientApp's side: a packed message is unpacked before any handler sees it, and its reply packed.

    A message that came unpacked is passed on and answered as it is (SecAgg+'s stages, a server that does not pack).
    A packed record that cannot be read raises :class:`PackingError` (the ClientApp's error reply says why).
    """
    unpacked = unpack_content(msg.content) if msg.has_content() else None
    if unpacked is None:
        return call_next(msg, context)
    msg.content = unpacked
    reply = call_next(msg, context)
    if reply.has_content():
        packed = pack_content(reply.content)
        if packed is not None:
            reply.content = packed
    return reply
