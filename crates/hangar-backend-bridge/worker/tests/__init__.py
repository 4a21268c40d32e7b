"""Tests of the bridge worker. Run from the repository root:

    python3 -m unittest discover -s crates/hangar-backend-bridge/worker/tests \
        -t crates/hangar-backend-bridge/worker

The exllamav3 / vllm tests use the fakes in fakes/; the ct2 tests need ctranslate2 and
tokenizers (target/bridge-venv/bin/python) and are skipped without them.
"""
