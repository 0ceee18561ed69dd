//! switchyard-providers: everything vendor-specific, shared by the router and the operator.
//!
//! - [`wire`]: the client dialects' types (OpenAI chat, Anthropic messages), SSE framing,
//!   translation between the dialects, usage normalisation and stream classification.
//! - [`upstream`]: the pooled HTTP client of one provider and its streaming body.
//! - [`adapter`]: the one boundary every vendor API sits behind.
//! - [`probe`] and [`health`]: active health probes (DESIGN §4.8) and their verdicts.
//! - [`secrets`]: where `secretRef`s resolve.
//!
//! Layering (STYLE.md): this crate depends on `switchyard-core` and `switchyard-api` only;
//! the router and the operator both depend on it and never on each other.

pub mod adapter;
pub mod anthropic;
pub mod bedrock;
pub mod clock;
pub mod health;
pub mod openai;
pub mod probe;
pub mod secrets;
pub mod upstream;
pub mod vertex;
pub mod wire;
