"""The prefix index: which backend holds which prompt prefix (prefill-state handles)."""
