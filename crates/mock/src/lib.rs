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
//! - `POST /v1/audio/transcriptions` — multipart (`file`, `model`), answers `{"text": ""}`
//!   (the mock's audio is always silent).
//! - `POST /v1/audio/speech` — JSON `{model, input, voice}`, answers a short silent WAV; a
//!   missing voice, or one outside `voices`, is a 400.
//! - `GET /v1/models`, `GET /healthz`.
//! - Vertex AI (see "Vertex AI and Bedrock" below):
//!   `POST /{v1,v1beta1}/projects/{P}/locations/{L}/publishers/anthropic/models/{M}:rawPredict`
//!   and `:streamRawPredict` (Claude: Anthropic Messages without `model`, `anthropic_version:
//!   vertex-2023-10-16`), `.../publishers/google/models/{M}:generateContent` and
//!   `:streamGenerateContent?alt=sse` (Gemini `GenerateContentRequest` / `Response`).
//! - Bedrock runtime: `POST /model/{modelId}/converse`, `/converse-stream`, `/invoke`,
//!   `/invoke-with-response-stream` (`modelId` percent-encoded: base id, `us.`/`eu.`/`global.`
//!   inference profile, or ARN); streams are AWS event-stream frames.
//! - Auth mocks: `POST /token` (Google OAuth2 JWT-bearer grant), `GET
//!   /computeMetadata/v1/instance/service-accounts/default/token` (GCE metadata server, needs
//!   `Metadata-Flavor: Google`; also `.../default/`, `.../default/email`, `project/project-id`),
//!   `POST /` with `Action=AssumeRoleWithWebIdentity` (STS, XML answer).
//! - Admin: `POST /admin/faults` (body = [`FaultSet`] JSON, replaces the set), `GET /admin/faults`,
//!   `GET /admin/stats` ([`Stats`]), `GET /admin/calls` ([`CallRecord`]s), `POST /admin/reset`.
//!
//! Each response is deterministic: the answer is `token0 token1 ...` (config `output_tokens`,
//! capped by `max_tokens`), token counts follow [`count_tokens`], and faults follow a seeded
//! RNG. Timing is real tokio time (so paused-time tests drive it too): headers at `latency_ms`,
//! first content token at `ttft_ms`, then one token per `1/tokens_per_sec` s.
//!
//! # Prompt cache
//!
//! One cache per mock, keyed by a hash chain over the prompt's segments (tools, system,
//! messages/blocks) and the model. OpenAI-style endpoints cache automatically: the longest
//! previously seen prefix within `cache_ttl` is reported as `prompt_tokens_details.cached_tokens`
//! (or `cachedContentTokenCount`), and every prefix of the request is stored. The Anthropic
//! endpoint caches only at `cache_control` breakpoints (TTL from `ttl: "5m" | "1h"` or
//! `cache_ttl`): read = longest stored prefix up to the last breakpoint
//! (`cache_read_input_tokens`), write = the rest up to that breakpoint
//! (`cache_creation_input_tokens`), `input_tokens` = the remainder. A hit refreshes the TTL.

//! # Config (YAML, also accepted as JSON by `POST /admin/faults` for the `faults` part)
//!
//! ```yaml
//! mocks:                      # or a bare list, or a single mock's fields at top level
//!   - name: p-a
//!     listen: 127.0.0.1:9001  # default 127.0.0.1:0 in-process; 127.0.0.1:9001 for a lone CLI mock
//!     output_tokens: 64       # answer length in tokens, capped by max_tokens
//!     tokens_per_sec: 50      # stream pace; 0 = all at once
//!     latency_ms: 20          # before response headers
//!     ttft_ms: 300            # request arrival -> first content token
//!     cache_ttl: 5m           # prompt cache lifetime (refreshed on hit)
//!     cache_min_tokens: 0     # automatic-cache floor (OpenAI's real one is 1024)
//!     usage_style: openai     # or gemini (usageMetadata on /v1/chat/completions)
//!     models: []              # empty = any model
//!     api_keys: []            # empty = any key
//!     project_header: x-project-id
//!     embedding_dimensions: 8
//!     modalities: []          # served kinds (text, embedding, rerank, transcription, speech); empty = all
//!     voices: []              # /v1/audio/speech voices; empty = any (a voice is always required)
//!     reject_max_tokens: false  # 400 on max_tokens outside chat (strict servers)
//!     aws_auth: null          # SigV4 + STS, see "Vertex AI and Bedrock"
//!     google_auth: null       # OAuth2 token endpoint + bearer check, same section
//!     gemini_thoughts_tokens: 0
//!     rate_limits: { requests_per_minute: 10000, tokens_per_minute: 2000000, enforce: false }
//!     faults:
//!       seed: 1
//!       origin: installed     # or first_request: where rule windows count from
//!       fail_all: null        # a Fault: every request meets it
//!       error_rate: { fraction: 0.05, fault: { kind: server_error } }
//!       rules:
//!         - { kind: rate_limited, retry_after: 5, when: { next: 1 } }
//!         - { kind: rate_limited, retry_after: 15, http_date: true, when: { next: 1 } }
//!         - { kind: rate_limited, reset_requests: 1m30s, when: { next: 1 } }
//!         - { kind: overloaded, when: { from: 0s, until: 20s, paths: [/v1/messages] } }
//!         - { kind: latency, ms: 200, when: { probability: 0.1 } }
//!         - { kind: cut_mid_stream, after_deltas: 20, when: { stream: true, skip: 5, next: 1 } }
//!         - { kind: server_error, when: { modalities: [transcription, speech] } }  # audio broken
//! ```
//!
//! Fault kinds ([`Fault`]): `rate_limited`, `insufficient_quota`, `usage_limit`,
//! `payment_required`, `service_unavailable`, `overloaded`, `server_error`, `invalid_parameter`,
//! `status` (any status/type/code/headers), `latency` and `slow_first_token` (modifiers that
//! stack), `stream_error_before_content`, `cut_mid_stream`, `reset_before_response`,
//! `hang_after_headers`, `hang_keep_alive`, `hang_no_headers`, `report_usage`, `omit_usage`.
//! Every rule may also carry `delay_ms` (extra delay before headers when it fires).
//!
//! Vendor fault kinds: `vertex_resource_exhausted` (`cause: shared_capacity | project_quota |
//! provisioned_throughput`, optional `quota_metric`): 429 `RESOURCE_EXHAUSTED` in Google's
//! shape with Google's documented message for each, and no `Retry-After` (Vertex sends none);
//! `bedrock_exception` (`exception: ThrottlingException | ServiceQuotaExceededException |
//! ModelNotReadyException | ValidationException | ModelStreamErrorException |
//! ModelErrorException | ModelTimeoutException | InternalServerException |
//! ServiceUnavailableException | AccessDeniedException | ResourceNotFoundException`, optional
//! `status` (e.g. 400 for the ThrottlingException variant) and `message`);
//! `bedrock_stream_exception` (`exception`, `after_deltas`, `message`): a 200 ConverseStream /
//! InvokeModelWithResponseStream whose content stops after `after_deltas` deltas with an
//! exception frame (`:message-type: exception`, `:exception-type: throttlingException`, ...).
//! The generic kinds work on the vendor paths too, rendered in the vendor's shape
//! (`rate_limited` on Bedrock is a `ThrottlingException`, on Vertex a `RESOURCE_EXHAUSTED`).
//! Fault triggers see the model from the path (Bedrock: the decoded id as sent, e.g. the ARN);
//! a Gemini request with inline audio is of modality `transcription`.
//!
//! # Vertex AI and Bedrock
//!
//! Errors: Vertex paths answer `{"error": {"code", "message", "status"}}` (Google canonical
//! status names); Bedrock paths `{"message"}` with `x-amzn-errortype: <Exception>:<ns>` and
//! `x-amzn-requestid` (what botocore reads). Neither sends rate-limit headers. Answers:
//! Claude on Vertex and InvokeModel are the `/v1/messages` answers (same usage and
//! `cache_control` accounting; InvokeModel adds `X-Amzn-Bedrock-*-Token-Count` headers, its
//! stream wraps each Anthropic event as base64 in a `chunk` frame and the `message_stop` one
//! carries `amazon-bedrock-invocationMetrics`). Converse reports `usage {inputTokens,
//! outputTokens, totalTokens, cacheReadInputTokens, cacheWriteInputTokens}` (`cachePoint` blocks
//! are explicit breakpoints; `inputTokens` excludes cache reads and writes, `totalTokens`
//! includes them) and `metrics.latencyMs`; ConverseStream sends `messageStart`,
//! `contentBlockStart` (tool use only), `contentBlockDelta`s, `contentBlockStop`, `messageStop`,
//! `metadata`. Gemini reports `usageMetadata {promptTokenCount (including
//! cachedContentTokenCount), cachedContentTokenCount (when > 0), candidatesTokenCount,
//! thoughtsTokenCount (config `gemini_thoughts_tokens`, when > 0), totalTokenCount = prompt +
//! candidates + thoughts}`, cumulative in every stream chunk; implicit (automatic) prefix cache;
//! function calls as `functionCall` parts; `responseMimeType: application/json` answers a JSON
//! instance of `responseSchema`. Tool calls follow the same rule as the other endpoints (tools
//! given, not disabled, last turn not a tool result). Both `anthropic_version` checks also take
//! an API date (`2026-10-21`), which the anthropic SDK's `AnthropicVertex` / `AnthropicBedrock`
//! send instead of the platform strings.
//!
//! Auth is off unless configured; when on it is checked before the body is looked at:
//!
//! ```yaml
//! aws_auth:                     # Bedrock paths check SigV4; POST / serves STS
//!   region: us-east-1           # credential scope region (wrong one: 403 InvalidSignatureException)
//!   service: bedrock            # signing name
//!   credentials:                # default: the two test credentials below
//!     - { access_key_id: AKIASWITCHYARDTEST01,
//!         secret_access_key: switchyardMockTestSecretKey/DoNotUse0001 }
//!     - { access_key_id: ASIASWITCHYARDTEST02,
//!         secret_access_key: switchyardMockTestSecretKey/DoNotUse0002,
//!         session_token: switchyard-mock-test-session-token-0002 }
//!   sts_secret: switchyard-mock-sts   # keys STS-issued credentials (shared by mocks with the same value)
//!   sts_duration: 1h            # when AssumeRoleWithWebIdentity gives no DurationSeconds
//!   role_arns: []               # accepted RoleArns; empty = any
//! google_auth:                  # Vertex paths need `Authorization: Bearer <token from /token or metadata>`
//!   service_accounts:           # default: the test account (built-in public key)
//!     - client_email: switchyard-mock-test@switchyard-test.iam.gserviceaccount.com
//!       public_key_file: crates/mock/testdata/vertex-test-sa.pub.pem   # or public_key_pem: "-----BEGIN..."
//!   token_secret: switchyard-mock-oauth  # keys issued tokens (shared by mocks with the same value)
//!   token_ttl: 1h               # expires_in
//!   audience: null              # required assertion aud; null = any URL ending in /token
//!   metadata_server: true       # serve /computeMetadata/v1/...
//!   metadata_email: switchyard-mock-test@switchyard-test.iam.gserviceaccount.com
//!   project_id: switchyard-test
//! gemini_thoughts_tokens: 0
//! ```
//!
//! SigV4 refusals (403, Bedrock's shapes): `MissingAuthenticationTokenException`,
//! `IncompleteSignatureException`, `UnrecognizedClientException` (unknown key, bad session
//! token), `InvalidSignatureException` (the recomputed signature differs: wrong secret, body or
//! path; wrong region or service scope; `x-amz-date` over 5 minutes off), `ExpiredTokenException`
//! (expired STS credentials). OAuth refusals: `/token` answers 400 `invalid_grant` ("Invalid JWT
//! Signature.", "Invalid grant: account not found", lifetime over an hour / expired),
//! `invalid_scope`, `unsupported_grant_type`; a Vertex path without a live token answers 401
//! `UNAUTHENTICATED`. Test material: [`TEST_AWS_ACCESS_KEY_ID`] & co. and
//! `crates/mock/testdata/vertex-test-sa.json` ([`TEST_SA_KEY_JSON`]; its `token_uri` must be
//! pointed at the mock's `/token`), `vertex-test-sa-untrusted.json` (a key no default config
//! trusts). Tokens and STS credentials are stateless (an HMAC over their claims), so one mock
//! can issue them and another with the same secrets accept them.
//!
//! Rejected alternatives: wiremock-style canned responses (cannot stream at a pace, count
//! tokens or simulate a prompt cache) and recording real vendor traffic (not reproducible, needs
//! credentials).

mod audio;
mod auth;
mod bedrock;
mod cache;
mod cli;
mod clock;
mod config;
mod errors;
mod eventstream;
mod fault;
mod record;
mod server;
mod tokens;
mod vertex;
mod wire;

pub use auth::{
    AwsAuthConfig, AwsTestCredential, GoogleAuthConfig, GoogleServiceAccount,
    TEST_AWS_ACCESS_KEY_ID, TEST_AWS_SECRET_ACCESS_KEY, TEST_AWS_SESSION_ACCESS_KEY_ID,
    TEST_AWS_SESSION_SECRET_ACCESS_KEY, TEST_AWS_SESSION_TOKEN, TEST_SA_EMAIL, TEST_SA_KEY_JSON,
    TEST_SA_PUBLIC_KEY_PEM,
};
pub use cli::{MockArgs, run};
pub use clock::go_duration;
pub use config::{ConfigFile, MockConfig, MockModality, RateLimitConfig, UsageStyle};
pub use fault::{
    BedrockExceptionKind, ErrorRate, Fault, FaultRule, FaultSet, StreamError, Trigger,
    VertexQuotaCause, WindowOrigin,
};
pub use record::{CallRecord, UsageRecord};
pub use server::{MockError, MockHandle, MockProvider, Stats};
pub use tokens::count_tokens;
