//! switchyard-mock: a mock LLM provider that speaks the vendors' wire formats and injects
//! faults, for Switchyard's end-to-end tests and demos (DESIGN.md §6).
//!
//! Endpoints (all JSON over HTTP/1.1):
//! - `POST /v1/chat/completions` — OpenAI chat completions, JSON or SSE `chat.completion.chunk`s,
//!   tool calls, `stream_options.include_usage`, `usage_style: gemini` variant.
//! - `POST /v1/messages` — Anthropic messages, JSON or SSE, `cache_control` breakpoints.
//! - `POST /v1/responses` — OpenAI Responses, JSON or SSE (`response.*` events).
//! - `POST /v1/embeddings` — float or base64 vectors, deterministic per (model, input).
//! - `POST /v1/rerank` (also `/v2/rerank`, `/rerank`) — Cohere/Jina `results[{index, relevance_score}]`.
//! - `GET /v1/models`, `GET /healthz`.
//! - Admin: `POST /admin/faults` (body = [`FaultSet`] JSON, replaces the set), `GET /admin/faults`,
//!   `GET /admin/stats` ([`Stats`]), `GET /admin/calls` ([`CallRecord`]s), `POST /admin/reset`.
//!
//! Each response is deterministic: the answer is `token0 token1 ...` (config `output_tokens`,
//! capped by `max_tokens`), token counts follow [`count_tokens`], the prompt cache follows
//! [`cache`](crate::cache) rules, and faults follow a seeded RNG. Timing is real (tokio time):
//! `latency_ms`, `ttft_ms`, `tokens_per_sec`.
//!
//! Rejected alternatives: wiremock-style canned responses (cannot stream at a pace, count
//! tokens or simulate a prompt cache) and recording real vendor traffic (not reproducible, needs
//! credentials).

mod cache;
mod cli;
mod clock;
mod config;
mod errors;
mod fault;
mod record;
mod server;
mod tokens;
mod wire;

pub use cli::{MockArgs, run};
pub use clock::go_duration;
pub use config::{ConfigFile, MockConfig, RateLimitConfig, UsageStyle};
pub use fault::{ErrorRate, Fault, FaultRule, FaultSet, StreamError, Trigger, WindowOrigin};
pub use record::{CallRecord, UsageRecord};
pub use server::{MockError, MockHandle, MockProvider, Stats};
pub use tokens::count_tokens;
