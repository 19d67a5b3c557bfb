"""``vllm._compat`` pieces that run outside the engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from microagent.engine_bridge import resolve_model


def test_bridges_opening_together_load_their_tokenizers_without_an_import_race() -> None:
    """Bridges open their tokenizers in worker threads. transformers' lazy modules fail when
    two threads load them at once in a fresh interpreter ("cannot import name
    'AutoTokenizer'"): ``HFTokenizer`` loads them one thread at a time."""
    script = textwrap.dedent(
        f"""
        import threading
        from microagent.engine_bridge.vllm._compat import HFTokenizer

        errors = []

        def load():
            try:
                HFTokenizer({str(resolve_model("default", progress=False))!r})
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(errors)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
