//! AWS credentials for SigV4: fixed keys from the provider's Secret, or IRSA.
//!
//! IRSA (IAM roles for service accounts): the pod has a projected web-identity token file
//! (`AWS_WEB_IDENTITY_TOKEN_FILE`) and a role (`AWS_ROLE_ARN`); STS
//! `AssumeRoleWithWebIdentity` exchanges the token for temporary keys (an unsigned call,
//! the token is the proof). Keys are cached and refreshed [`REFRESH_MARGIN`] before their
//! `Expiration`; the token file is re-read on every exchange because the kubelet rotates it.
//! One exchange runs at a time. The role, the token file and the STS endpoint are
//! overridable in `spec.bedrock` (tests, other partitions).
//!
//! Source: AWS STS API reference, `AssumeRoleWithWebIdentity`; EKS IRSA documentation.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use switchyard_api::provider::BedrockSpec;
use tokio::sync::Mutex;

use crate::clock::Clock;

/// Temporary keys are replaced once they have less than this left.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// Bound on one STS call.
const STS_TIMEOUT: Duration = Duration::from_secs(10);

/// One set of keys.
#[derive(Clone)]
pub struct Keys {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary keys.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Where a Bedrock provider's keys come from.
pub enum CredentialSource {
    /// Keys from the Secret.
    Fixed(Keys),
    /// A Bedrock API key from the Secret: a bearer token instead of a signature.
    ApiKey(String),
    /// IRSA.
    WebIdentity(WebIdentity),
}

/// The IRSA exchange and its cached keys.
pub struct WebIdentity {
    role_arn: String,
    token_file: PathBuf,
    sts_url: String,
    http: reqwest::Client,
    cached: Mutex<Option<(Keys, DateTime<Utc>)>>,
}

impl std::fmt::Debug for WebIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebIdentity")
            .field("role_arn", &self.role_arn)
            .field("token_file", &self.token_file)
            .field("sts_url", &self.sts_url)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Fixed(k) => f.debug_tuple("Fixed").field(k).finish(),
            CredentialSource::ApiKey(_) => f.write_str("ApiKey(<redacted>)"),
            CredentialSource::WebIdentity(w) => f.debug_tuple("WebIdentity").field(w).finish(),
        }
    }
}

impl CredentialSource {
    /// Fixed keys.
    pub fn fixed(
        access_key_id: String,
        secret_access_key: String,
        session_token: Option<String>,
    ) -> Self {
        CredentialSource::Fixed(Keys {
            access_key_id,
            secret_access_key,
            session_token,
        })
    }

    /// IRSA from `spec` (else `AWS_ROLE_ARN` / `AWS_WEB_IDENTITY_TOKEN_FILE`), with STS at
    /// `spec.stsEndpoint` or `https://sts.{region}.amazonaws.com`.
    ///
    /// Errors: no role, no token file, or a token file that does not exist (named).
    pub fn web_identity(
        spec: BedrockSpec,
        region: &str,
        http: reqwest::Client,
    ) -> Result<Self, String> {
        let role_arn = spec
            .role_arn
            .or_else(|| std::env::var("AWS_ROLE_ARN").ok())
            .ok_or("no bedrock credentials: set credentials, or bedrock.roleArn / AWS_ROLE_ARN for IRSA")?;
        let token_file = spec
            .web_identity_token_file
            .or_else(|| std::env::var("AWS_WEB_IDENTITY_TOKEN_FILE").ok())
            .map(PathBuf::from)
            .ok_or("no bedrock credentials: IRSA needs bedrock.webIdentityTokenFile or AWS_WEB_IDENTITY_TOKEN_FILE")?;
        if !token_file.is_file() {
            return Err(format!(
                "the IRSA web-identity token file {} does not exist",
                token_file.display()
            ));
        }
        let sts_url = spec
            .sts_endpoint
            .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
        Ok(CredentialSource::WebIdentity(WebIdentity {
            role_arn,
            token_file,
            sts_url,
            http,
            cached: Mutex::new(None),
        }))
    }

    /// Keys valid for at least [`REFRESH_MARGIN`].
    ///
    /// Errors: why none could be had (token file unreadable, STS unreachable or refusing,
    /// with STS's own error code and message).
    pub async fn keys(&self) -> Result<Keys, String> {
        match self {
            CredentialSource::Fixed(k) => Ok(k.clone()),
            CredentialSource::ApiKey(_) => {
                Err("a Bedrock API key signs nothing: it is sent as a bearer token".to_owned())
            }
            CredentialSource::WebIdentity(w) => w.keys().await,
        }
    }
}

impl WebIdentity {
    async fn keys(&self) -> Result<Keys, String> {
        let mut cached = self.cached.lock().await;
        let now = Clock::new().wall();
        if let Some((keys, expires)) = cached.as_ref()
            && now + REFRESH_MARGIN < *expires
        {
            return Ok(keys.clone());
        }
        let token = tokio::fs::read_to_string(&self.token_file)
            .await
            .map_err(|e| {
                format!(
                    "cannot read the IRSA web-identity token file {}: {e}",
                    self.token_file.display()
                )
            })?;
        let response = self
            .http
            .post(&self.sts_url)
            .form(&[
                ("Action", "AssumeRoleWithWebIdentity"),
                ("Version", "2011-06-15"),
                ("RoleArn", self.role_arn.as_str()),
                ("RoleSessionName", "switchyard"),
                ("WebIdentityToken", token.trim()),
            ])
            .timeout(STS_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("STS {} unreachable: {e}", self.sts_url))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| format!("STS response unreadable: {e}"))?;
        let (keys, expires) = parse_assume_role(&body).map_err(|e| {
            if status.is_success() {
                e
            } else {
                format!("STS refused AssumeRoleWithWebIdentity ({status}): {e}")
            }
        })?;
        *cached = Some((keys.clone(), expires));
        Ok(keys)
    }
}

/// Reads the keys and their expiry out of an `AssumeRoleWithWebIdentityResponse`, or the
/// code and message of an `ErrorResponse`.
///
/// Errors: the STS error, or what is missing.
pub fn parse_assume_role(xml: &str) -> Result<(Keys, DateTime<Utc>), String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("STS answer is not XML: {e}"))?;
    let text = |name: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .map(str::trim)
            .map(str::to_owned)
    };
    if let Some(code) = text("Code") {
        return Err(format!("{code}: {}", text("Message").unwrap_or_default()));
    }
    let key = |name: &str| text(name).ok_or_else(|| format!("STS answer has no {name}"));
    let keys = Keys {
        access_key_id: key("AccessKeyId")?,
        secret_access_key: key("SecretAccessKey")?,
        session_token: Some(key("SessionToken")?),
    };
    let expires = DateTime::parse_from_rfc3339(&key("Expiration")?)
        .map_err(|e| format!("STS Expiration is not a timestamp: {e}"))?
        .with_timezone(&Utc);
    Ok((keys, expires))
}
