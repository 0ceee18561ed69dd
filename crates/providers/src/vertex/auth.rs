//! OAuth2 access tokens for Vertex AI.
//!
//! Two sources, as Google's client libraries have them:
//! - **Service-account key** (the JSON key file held in the provider's Secret): a JWT signed
//!   RS256 with the key's private key (`iss` = `client_email`, `scope` = cloud-platform, `aud`
//!   = the token endpoint, one hour) exchanged at the token endpoint with the JWT bearer grant
//!   (RFC 7523, `urn:ietf:params:oauth:grant-type:jwt-bearer`). Signing uses `jsonwebtoken`.
//! - **Metadata server** (no key: GKE workload identity, GCE): `GET
//!   {metadata}/computeMetadata/v1/instance/service-accounts/default/token` with
//!   `Metadata-Flavor: Google`.
//!
//! Tokens are cached and refreshed [`REFRESH_MARGIN`] before they expire; one fetch runs at a
//! time (the others wait for it). A 401 from Vertex drops the cached token
//! ([`TokenSource::invalidate`]). The token and metadata endpoints are overridable
//! (`spec.vertex.tokenUrl`, `metadataUrl`) for tests and private networks.
//!
//! Rejected: `gcp_auth` (its metadata host is fixed, so the metadata path could not be tested
//! against a mock on loopback, and it brings a second HTTP stack beside reqwest).

use std::time::Duration;

use serde::Deserialize;
use tokio::sync::Mutex;

use crate::clock::Clock;

/// The scope Vertex AI calls need.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's token endpoint, when neither the key nor the spec names one.
pub const DEFAULT_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";
/// The metadata server as seen from a GKE or GCE workload.
pub const DEFAULT_METADATA_URL: &str = "http://metadata.google.internal";
/// A cached token is replaced once it has less than this left, so a request never goes out
/// with a token that expires in flight.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// Bound on one token fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The fields of a service-account key file that signing needs.
#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
}

enum Source {
    Key {
        email: String,
        key_id: Option<String>,
        signing_key: jsonwebtoken::EncodingKey,
        token_url: String,
    },
    Metadata {
        url: String,
    },
}

struct Cached {
    token: String,
    refresh_at: tokio::time::Instant,
}

/// Where a Vertex provider's access tokens come from, with the cached token.
pub struct TokenSource {
    source: Source,
    http: reqwest::Client,
    cached: Mutex<Option<Cached>>,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.source {
            Source::Key {
                email, token_url, ..
            } => format!("service account {email} via {token_url}"),
            Source::Metadata { url } => format!("metadata server {url}"),
        };
        f.debug_struct("TokenSource")
            .field("source", &what)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    /// Tokens for the service-account key `json`; the token endpoint is `token_url`, else
    /// the key's `token_uri`, else [`DEFAULT_TOKEN_URL`].
    ///
    /// Errors: a message naming what is wrong with the key (not JSON, not a service-account
    /// key, a private key that is not an RSA PEM key). The key's contents are never quoted.
    pub fn from_key(
        json: &str,
        token_url: Option<&str>,
        http: reqwest::Client,
    ) -> Result<Self, String> {
        let key: KeyFile = serde_json::from_str(json).map_err(|e| {
            format!(
                "the Vertex service-account key is not a JSON key file (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        if let Some(kind) = key.kind.as_deref()
            && kind != "service_account"
        {
            return Err(format!(
                "the Vertex credentials are of type {kind:?}; a service_account key is needed"
            ));
        }
        let signing_key = jsonwebtoken::EncodingKey::from_rsa_pem(key.private_key.as_bytes())
            .map_err(|_| {
                "the Vertex service-account key's private_key is not an RSA private key in PEM form"
                    .to_owned()
            })?;
        let token_url = token_url
            .map(str::to_owned)
            .or(key.token_uri)
            .unwrap_or_else(|| DEFAULT_TOKEN_URL.to_owned());
        Ok(TokenSource {
            source: Source::Key {
                email: key.client_email,
                key_id: key.private_key_id,
                signing_key,
                token_url,
            },
            http,
            cached: Mutex::new(None),
        })
    }

    /// Tokens from the metadata server at `url` (default [`DEFAULT_METADATA_URL`]).
    pub fn metadata(url: Option<&str>, http: reqwest::Client) -> Self {
        TokenSource {
            source: Source::Metadata {
                url: url.unwrap_or(DEFAULT_METADATA_URL).to_owned(),
            },
            http,
            cached: Mutex::new(None),
        }
    }

    /// A valid access token: the cached one while it has more than [`REFRESH_MARGIN`] left,
    /// else a fresh one.
    ///
    /// Errors: why no token could be had (endpoint unreachable, grant refused, with the
    /// endpoint's own error text).
    pub async fn token(&self) -> Result<String, String> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && tokio::time::Instant::now() < c.refresh_at
        {
            return Ok(c.token.clone());
        }
        let (token, lifetime) = self.fetch().await?;
        let refresh_at = tokio::time::Instant::now() + lifetime.saturating_sub(REFRESH_MARGIN);
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at,
        });
        Ok(token)
    }

    /// Drops the cached token (the provider answered 401).
    pub fn invalidate(&self) {
        if let Ok(mut cached) = self.cached.try_lock() {
            *cached = None;
        }
    }

    async fn fetch(&self) -> Result<(String, Duration), String> {
        let response = match &self.source {
            Source::Key {
                email,
                key_id,
                signing_key,
                token_url,
            } => {
                let now = Clock::new().wall().timestamp();
                let claims = serde_json::json!({
                    "iss": email,
                    "scope": CLOUD_PLATFORM_SCOPE,
                    "aud": token_url,
                    "iat": now,
                    "exp": now + 3600,
                });
                let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
                header.kid = key_id.clone();
                let assertion = jsonwebtoken::encode(&header, &claims, signing_key)
                    .map_err(|e| format!("failed to sign the service-account assertion: {e}"))?;
                self.http
                    .post(token_url)
                    .form(&[
                        ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                        ("assertion", assertion.as_str()),
                    ])
                    .timeout(FETCH_TIMEOUT)
                    .send()
                    .await
                    .map_err(|e| format!("token endpoint {token_url} unreachable: {e}"))?
            }
            Source::Metadata { url } => {
                let full = format!(
                    "{}/computeMetadata/v1/instance/service-accounts/default/token",
                    url.trim_end_matches('/')
                );
                self.http
                    .get(&full)
                    .header("Metadata-Flavor", "Google")
                    .timeout(FETCH_TIMEOUT)
                    .send()
                    .await
                    .map_err(|e| format!("metadata server {url} unreachable: {e}"))?
            }
        };
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("token response unreadable: {e}"))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.chars().take(300).collect();
            return Err(format!("token request refused with {status}: {text}"));
        }
        #[derive(Deserialize)]
        struct TokenResponse {
            access_token: String,
            #[serde(default)]
            expires_in: Option<u64>,
        }
        let t: TokenResponse = serde_json::from_slice(&body)
            .map_err(|e| format!("token response does not parse: {e}"))?;
        Ok((
            t.access_token,
            Duration::from_secs(t.expires_in.unwrap_or(3600)),
        ))
    }
}
