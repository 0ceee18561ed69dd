//! `api: anthropic`: the Anthropic Messages API.
//!
//! Path `{base}/v1/messages`, `x-api-key` and `anthropic-version` ([`API_VERSION`]). Bodies
//! and responses are the Anthropic dialect itself; usage (`input_tokens`,
//! `cache_read_input_tokens`, `cache_creation_input_tokens`, `output_tokens`) is read by the
//! dispatcher.

use http::HeaderName;
use http::header::HeaderValue;
use switchyard_api::provider::ProviderApi;

use crate::adapter::{Adapter, BoxFuture, Call, Prepared};
use crate::openai::{json_headers, secret_header, v1_url};
use crate::upstream::{Operation, ProviderKind, TransportError};
use crate::wire::anthropic::API_VERSION;

/// The Anthropic adapter.
pub struct Anthropic {
    url: reqwest::Url,
    key: HeaderValue,
}

impl std::fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anthropic")
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Anthropic {
    /// An adapter for the server at `base` with API key `key`.
    ///
    /// Errors: an invalid base URL or a key that is not a valid header value.
    pub fn new(base: &str, key: String) -> Result<Self, String> {
        let url = reqwest::Url::parse(&v1_url(base, "/messages"))
            .map_err(|e| format!("invalid endpoint {base:?}: {e}"))?;
        let key = secret_header(&key, "api key").map_err(|e| e.to_string())?;
        Ok(Anthropic { url, key })
    }
}

impl Adapter for Anthropic {
    fn api(&self) -> ProviderApi {
        ProviderApi::Anthropic
    }

    fn kind(&self, _model: &str) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn serves(&self, op: Operation, _model: &str) -> bool {
        op == Operation::Messages
    }

    fn prepare<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Prepared, TransportError>> {
        let prepared = if call.op == Operation::Messages {
            let mut headers = json_headers(call.stream);
            headers.insert(HeaderName::from_static("x-api-key"), self.key.clone());
            headers.insert(
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(API_VERSION),
            );
            Ok(Prepared {
                url: self.url.clone(),
                headers,
                body: call.body,
            })
        } else {
            Err(TransportError::Config(format!(
                "{:?} is not served by an anthropic provider",
                call.op
            )))
        };
        Box::pin(async move { prepared })
    }
}
