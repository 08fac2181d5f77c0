"""The MLA decode laws (claim KV-12)."""
