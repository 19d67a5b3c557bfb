"""The pure parts of bench/engine_rss.py: its allocator variants and its table."""

from __future__ import annotations

import engine_rss as R
from microagent.engine_bridge.vllm import _compat as compat


def test_variants_follow_the_engine_s_allocator_choice() -> None:
    got = R.variants()
    assert got["glibc"] == {} and got["glibc-fixed-threshold"] == {
        "MALLOC_TRIM_THRESHOLD_": "131072"
    }
    lib = compat.engine_allocator()
    assert ("tcmalloc" in got) == (lib is not None)
    if lib is not None:
        assert got["tcmalloc"] == {"LD_PRELOAD": lib}
        # the environment the engine's processes really get: tcmalloc and oneDNN's cache cap
        capped = got[f"tcmalloc, oneDNN cache {compat.ENGINE_ONEDNN_CACHE}"]
        assert capped == {"LD_PRELOAD": lib, **compat.cpu_engine_environment()}


def test_table_has_a_row_per_allocator_and_a_column_per_sample() -> None:
    data = {
        "settings": {"calls": 80, "every": 40, "seed": 1, "cpus": 2, "load_before": 0.1},
        "runs": [
            {
                "allocator": "glibc",
                "base_mb": 850.0,
                "points": [[40, 244.0, 20.0], [80, 407.0, 40.0]],
            },
            {
                "allocator": "tcmalloc",
                "base_mb": 840.0,
                "points": [[40, 81.0, 18.0], [80, 141.0, 36.0]],
            },
        ],
    }
    md = R.tables(data)
    assert "| allocator | RSS at start (MiB) | +MiB after 40 | +MiB after 80 | ms per pass |" in md
    assert "| glibc | 850 | 244 | 407 | 500 |" in md
    assert "| tcmalloc | 840 | 81 | 141 | 450 |" in md
