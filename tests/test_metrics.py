"""``/metrics`` text for the KV tiers: one series per engine that runs a tier, none otherwise."""

from __future__ import annotations

from microagent.engine_bridge import ScriptedEngine, TierStats
from microagent.server._metrics import TIER_SERIES, ServerMetrics


def test_tier_series_name_each_engine_with_a_tier_and_skip_the_others() -> None:
    engines = {"m1": ScriptedEngine(), "m2": ScriptedEngine()}
    tiered = TierStats(
        enabled=True,
        capacity_bytes=94_371_840,
        entries=7,
        held_sessions=2,
        stored_bytes=8_847_360,
        loaded_blocks=3,
        loaded_bytes=8_847_360,
        load_seconds=0.25,
        evicted_blocks=4,
        held_evicted_blocks=1,
    )
    text = ServerMetrics().render(engines, {}, {"m1": tiered, "m2": TierStats()})
    lines = text.splitlines()
    for family, (kind, _, field) in TIER_SERIES.items():
        assert f"# TYPE {family} {kind}" in lines
        value = getattr(tiered, field)
        shown = str(int(value)) if float(value).is_integer() else repr(float(value))
        assert f'{family}{{model="m1"}} {shown}' in lines
        assert not any(line.startswith(f'{family}{{model="m2"}}') for line in lines)
    assert 'microagent_tier_loaded_blocks_total{model="m1"} 3' in lines
    assert 'microagent_tier_loaded_bytes_total{model="m1"} 8847360' in lines
    assert 'microagent_tier_held_sessions{model="m1"} 2' in lines
    assert 'microagent_tier_load_seconds_total{model="m1"} 0.25' in lines
