//! switchyard-e2e: black-box end-to-end tests of Switchyard (DESIGN.md §6).
//!
//! Everything lives under `tests/tests/`:
//! - `common/mod.rs` — the harness: in-process mock providers (`switchyard-mock`), a manifest
//!   folder wiring them as LLMProviders, RoutingPolicies and a TenantQuota (key `sk-test` in a
//!   secrets folder), and a real `switchyard standalone` child process on `127.0.0.1:0`, killed on
//!   drop;
//! - `sdk.rs` — the official OpenAI and Anthropic Python SDKs (`tests/python/`, venv from
//!   `scripts/setup-venv.sh`) against the router;
//! - `routing.rs`, `failover.rs`, `streaming.rs` — issue 4's "Must show" list and field cases 1,
//!   2, 18, 19, 21, 22, 24 and 25.
//!
//! The tests spawn the `switchyard` binary from the same target dir (`cargo build -p switchyard`
//! first; `scripts/test.sh` does) or from `SWITCHYARD_BIN`. The SDK tests use
//! `<repo>/.venv/bin/python` or `SWITCHYARD_PYTHON`; outside CI a missing venv skips them, under
//! `CI=true` it fails them.
