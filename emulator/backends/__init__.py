"""Execution backends: where shards live. All run the same engine and give identical results."""
