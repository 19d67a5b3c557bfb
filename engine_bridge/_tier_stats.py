"""What the KV tiers hold and have moved: the numbers ``VLLMBridge.tier_stats()`` returns.

Part of the engine contract (``EngineBridge.tier_stats``), kept apart from
``vllm._tier`` (which imports vLLM at module level) so the front end can name the
type without loading vLLM's offloading code.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class TierStats:
    """The host (RAM) KV tier below vLLM's device cache and the file tier below it.

    Attributes:
        enabled: whether the bridge runs the tier (``host_tier_bytes > 0``).
        budget_bytes: the RAM budget the bridge was given.
        capacity_bytes: what the host store allocates: whole blocks within the budget.
        block_bytes: bytes of one entry (every layer's K and V of one block, or of
            ``blocks_per_chunk`` blocks when vLLM's extra config groups them).
        capacity_blocks: how many entries the store holds.
        entries: blocks held now.
        peak_entries: most blocks ever held at once (never above ``capacity_blocks``).
        stored_blocks / stored_bytes: copied device -> host, in total.
        loaded_blocks / loaded_bytes: copied host -> device, in total.
        evicted_blocks: entries dropped to make room.
        load_seconds: time spent copying host -> device, in total.
        policy: which entries go first: ``"sessions"`` (cold blocks, least recently
            used first, then those of the waiting session due back last) or ``"lru"``.
        held_sessions / held_blocks: sessions whose blocks the policy keeps for them
            now (retained on the device, or demoted from it), and their distinct blocks.
        cold_evicted_blocks / held_evicted_blocks: evictions of blocks no session
            held, and of blocks a session held (only once no cold block was left).
        disk_budget_bytes: the file tier's disk budget (0: no file tier).
        disk_directory: the folder its files live in (under ``$MICROAGENT_HOME/kv``).
        disk_entries / disk_bytes: block files held now, and their bytes on disk.
        disk_peak_bytes: most bytes ever held (never above ``disk_budget_bytes``).
        disk_written_blocks: block files written (write-through from the host tier).
        disk_read_blocks: block files read and found whole (their digest matched).
        disk_evicted_blocks: files deleted (least recently used first) to stay in budget.
        disk_rejected_blocks: files found missing, truncated or altered: a miss, deleted.
    """

    enabled: bool = False
    budget_bytes: int = 0
    capacity_bytes: int = 0
    block_bytes: int = 0
    capacity_blocks: int = 0
    entries: int = 0
    peak_entries: int = 0
    stored_blocks: int = 0
    stored_bytes: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    evicted_blocks: int = 0
    load_seconds: float = 0.0
    policy: str = ""
    held_sessions: int = 0
    held_blocks: int = 0
    cold_evicted_blocks: int = 0
    held_evicted_blocks: int = 0
    disk_budget_bytes: int = 0
    disk_directory: str = ""
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_peak_bytes: int = 0
    disk_written_blocks: int = 0
    disk_read_blocks: int = 0
    disk_evicted_blocks: int = 0
    disk_rejected_blocks: int = 0

    @classmethod
    def from_wire(cls, data: Mapping[str, object]) -> TierStats:
        """From the EngineCore utility's dict (unknown keys ignored)."""
        names = {f.name for f in attrs.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        return attrs.asdict(self)
