"""A file tier under the host KV tier: one checksummed file per KV block, within a disk budget.

Decision: write-through. A block is written to its file when it is stored in
the host tier (the same worker step that copies it to RAM), not when the host
tier evicts it. A write on eviction would lose exactly the blocks that matter
after a restart: those still in RAM when the EngineCore died. It also keeps the
host worker stateless about evictions (vLLM's index reuses an evicted row in the
very store that evicts it). The cost is one file write per stored block, paid
whether or not the block is ever read back.

Files live in ``<root>/<directory key>/<block key hex>.kv``. The block key is
vLLM's ``OffloadKey`` (block hash + KV group), so the LoRA adapter and the
tenant's ``cache_salt`` are in it; the directory key adds what the block hash
leaves out (model, revision, KV dtype, block size, vLLM version, prefix hash
algorithm, bytes per block), so another model or layout never finds the files.
Each file carries a blake2b digest of its key and content; a file that is
missing, truncated, renamed or altered is a miss and is deleted, never loaded.

This module is the file format and the index (which files exist, in LRU order,
within the budget); ``_tier`` decides when to write and read. It imports no vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections import OrderedDict
from collections.abc import Collection, Iterable
from pathlib import Path

import attrs

MAGIC = b"MAKV1\n"
#: magic, key length, payload length, blake2b-256 of key + payload
HEADER = struct.Struct(">6sHQ32s")
SUFFIX = ".kv"
_TMP = ".tmp-"


def directory_key(
    *,
    model: str,
    revision: str | None,
    dtype: str,
    block_size: int,
    vllm_version: str,
    hash_algo: str,
    block_bytes: int,
) -> str:
    """The folder name for one model/layout: any field differing is another folder (a miss)."""
    fields = {
        "model": model,
        "revision": revision,
        "dtype": dtype,
        "block_size": block_size,
        "vllm": vllm_version,
        "hash": hash_algo,
        "block_bytes": block_bytes,
    }
    text = json.dumps(fields, sort_keys=True).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def file_bytes(key: bytes, payload_bytes: int) -> int:
    """Bytes a block's file takes on disk."""
    return HEADER.size + len(key) + payload_bytes


def write_block(path: Path, key: bytes, parts: Iterable[bytes | memoryview]) -> int:
    """Write a block atomically (a temporary file, then a rename); returns its size."""
    chunks = [memoryview(p).cast("B") for p in parts]
    digest = hashlib.blake2b(key, digest_size=32)
    for chunk in chunks:
        digest.update(chunk)
    payload = sum(len(c) for c in chunks)
    tmp = path.with_name(f"{path.name}{_TMP}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, len(key), payload, digest.digest()))
            f.write(key)
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return file_bytes(key, payload)


def read_block(path: Path, key: bytes, payload_bytes: int) -> bytearray | None:
    """The block's content if the file is whole and its digest matches; else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
            if len(head) != HEADER.size:
                return None
            magic, key_len, size, digest = HEADER.unpack(head)
            if magic != MAGIC or size != payload_bytes or f.read(key_len) != key:
                return None
            data = bytearray(size)
            if f.readinto(data) != size or f.read(1):
                return None
    except OSError:
        return None
    check = hashlib.blake2b(key, digest_size=32)
    check.update(data)
    return data if check.digest() == digest else None


@attrs.define
class FileIndex:
    """Which block files exist (LRU first) and their bytes, never above ``budget_bytes``.

    Runs in the scheduler: it reserves room before the worker writes (evicting
    the least recently used files), so the budget holds while writes are in
    flight too. Files already in the folder when it starts (a previous engine's)
    are indexed by name, oldest first; their content is checked when read.
    """

    directory: Path
    budget_bytes: int
    payload_bytes: int
    _files: OrderedDict[bytes, int] = attrs.field(factory=OrderedDict, init=False)
    _pending: set[bytes] = attrs.field(factory=set, init=False)
    used_bytes: int = attrs.field(default=0, init=False)
    peak_bytes: int = attrs.field(default=0, init=False)
    written_blocks: int = attrs.field(default=0, init=False)
    loaded_blocks: int = attrs.field(default=0, init=False)
    evicted_blocks: int = attrs.field(default=0, init=False)
    rejected_blocks: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        found: list[tuple[float, bytes, int]] = []
        for entry in os.scandir(self.directory):
            name = entry.name
            if _TMP in name:  # a write cut short (the engine died mid-write)
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            if not name.endswith(SUFFIX):
                continue
            try:
                key = bytes.fromhex(name[: -len(SUFFIX)])
                stat = entry.stat()
            except (ValueError, OSError):
                continue
            found.append((stat.st_mtime, key, stat.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size
            self.used_bytes += size
        self._evict(0)
        self.peak_bytes = self.used_bytes

    @property
    def entries(self) -> int:
        return len(self._files)

    def path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"

    def has(self, key: bytes) -> bool:
        """A written file for ``key`` is indexed (its content is checked on read)."""
        return key in self._files and key not in self._pending

    def read(self, key: bytes) -> bytearray | None:
        """The block's checked content, or None (a bad file is deleted and counted)."""
        if not self.has(key):
            return None
        data = read_block(self.path(key), key, self.payload_bytes)
        if data is None:
            self.rejected_blocks += 1
            self._drop(key)
            return None
        self._files.move_to_end(key)
        self.loaded_blocks += 1
        return data

    def reserve(self, key: bytes) -> Path | None:
        """Room for ``key``'s file (evicting LRU files), or None: indexed already, or no room."""
        if key in self._files:
            self._files.move_to_end(key)
            return None
        size = file_bytes(key, self.payload_bytes)
        if not self._evict(size):
            return None
        self._files[key] = size
        self._pending.add(key)
        self.used_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return self.path(key)

    def complete(self, keys: Collection[bytes], success: bool) -> None:
        """The worker's writes for ``keys`` are done (or failed: their room is given back)."""
        for key in keys:
            if key not in self._pending:
                continue
            self._pending.discard(key)
            if success:
                self.written_blocks += 1
            else:
                self._drop(key)

    def clear(self) -> None:
        """Delete every file this index holds (vLLM's connector reset)."""
        for key in list(self._files):
            if key not in self._pending:
                self._drop(key)

    def _evict(self, size: int) -> bool:
        """Drop LRU files until ``size`` more bytes fit; False if they cannot."""
        if size > self.budget_bytes:
            return False
        for key in list(self._files):
            if self.used_bytes + size <= self.budget_bytes:
                break
            if key in self._pending:
                continue
            self._drop(key)
            self.evicted_blocks += 1
        return self.used_bytes + size <= self.budget_bytes

    def _drop(self, key: bytes) -> None:
        size = self._files.pop(key, None)
        self._pending.discard(key)
        if size is not None:
            self.used_bytes -= size
        with contextlib.suppress(OSError):
            os.unlink(self.path(key))
