//! Placeholder module: filled in by its issue.
