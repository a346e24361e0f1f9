//! E2B client.
