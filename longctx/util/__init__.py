"""Small shared helpers: atomic file writes, hashing, progress display."""
