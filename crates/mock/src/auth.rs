//! Vendor authentication, checked the way the real services check it.
//!
//! - **AWS SigV4** ([`AwsAuthConfig`], Bedrock paths and the STS mock): the mock parses
//!   `Authorization: AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/SERVICE/aws4_request,
//!   SignedHeaders=..., Signature=...`, looks the key up, and recomputes the signature over the
//!   request as received (method, encoded path, query, the signed headers, a SHA-256 of the body)
//!   with `aws-sigv4` at the request's own `x-amz-date`. Errors are Bedrock's 403s:
//!   `MissingAuthenticationTokenException`, `UnrecognizedClientException` (unknown key),
//!   `InvalidSignatureException` (wrong secret, wrong region or service scope, clock skew over
//!   5 minutes), `ExpiredTokenException` (expired temporary credentials).
//! - **STS** `POST /` `Action=AssumeRoleWithWebIdentity` (unsigned, like the real call): answers
//!   STS's XML with temporary credentials (`ASIA...` key, secret, session token, expiration).
//!   They are stateless: the session token carries the key id and expiry under an HMAC keyed by
//!   `sts_secret`, and the secret is derived from the key id with the same key, so any mock with
//!   the same `sts_secret` accepts them.
//! - **Google OAuth2** ([`GoogleAuthConfig`]): `POST /token` takes the JWT-bearer grant
//!   (RFC 7523; `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`, `assertion` = an RS256
//!   JWT signed with a service account's private key), verifies the signature against the
//!   account's configured public key, `iss`, `aud`, `scope` and a lifetime of at most an hour,
//!   and issues `{"access_token", "expires_in", "token_type": "Bearer"}`. `GET
//!   /computeMetadata/v1/instance/service-accounts/default/token` (header `Metadata-Flavor:
//!   Google` required) issues the same kind of token, as the GCE/GKE metadata server does.
//!   Vertex paths then require `Authorization: Bearer <a live token issued with the same
//!   token_secret>`; otherwise 401 `UNAUTHENTICATED` in Google's error shape.
//!
//! Test material: [`TEST_AWS_ACCESS_KEY_ID`] and friends, and the service-account key in
//! `crates/mock/testdata/vertex-test-sa.json` ([`TEST_SA_KEY_JSON`]).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::config::humantime_serde_compat;

/// Test access key id the default [`AwsAuthConfig`] accepts (no session token).
pub const TEST_AWS_ACCESS_KEY_ID: &str = "AKIASWITCHYARDTEST01";
/// Secret of [`TEST_AWS_ACCESS_KEY_ID`].
pub const TEST_AWS_SECRET_ACCESS_KEY: &str = "switchyardMockTestSecretKey/DoNotUse0001";
/// Test access key id that must come with [`TEST_AWS_SESSION_TOKEN`].
pub const TEST_AWS_SESSION_ACCESS_KEY_ID: &str = "ASIASWITCHYARDTEST02";
/// Secret of [`TEST_AWS_SESSION_ACCESS_KEY_ID`].
pub const TEST_AWS_SESSION_SECRET_ACCESS_KEY: &str = "switchyardMockTestSecretKey/DoNotUse0002";
/// Session token of [`TEST_AWS_SESSION_ACCESS_KEY_ID`].
pub const TEST_AWS_SESSION_TOKEN: &str = "switchyard-mock-test-session-token-0002";
/// The test Google service-account key (JSON, with its RSA private key); test material only.
pub const TEST_SA_KEY_JSON: &str = include_str!("../testdata/vertex-test-sa.json");
/// Public half of [`TEST_SA_KEY_JSON`]'s key (PEM, SubjectPublicKeyInfo).
pub const TEST_SA_PUBLIC_KEY_PEM: &str = include_str!("../testdata/vertex-test-sa.pub.pem");
/// `client_email` of [`TEST_SA_KEY_JSON`].
pub const TEST_SA_EMAIL: &str = "switchyard-mock-test@switchyard-test.iam.gserviceaccount.com";

const DEFAULT_STS_SECRET: &str = "switchyard-mock-sts";
const DEFAULT_TOKEN_SECRET: &str = "switchyard-mock-oauth";
const MAX_SKEW: Duration = Duration::from_secs(300);

type HmacSha256 = Hmac<Sha256>;

/// One long-term (or fixed session) AWS credential the SigV4 check accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsTestCredential {
    /// Access key id (`AKIA...`).
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// When set, requests must carry it as `x-amz-security-token`.
    #[serde(default)]
    pub session_token: Option<String>,
}

/// SigV4 checking on the Bedrock paths, and the STS mock at `POST /`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsAuthConfig {
    /// Region the credential scope must name (the mock's "region").
    pub region: String,
    /// Signing name the scope must name (`bedrock`).
    pub service: String,
    /// Accepted credentials; default the two test credentials ([`TEST_AWS_ACCESS_KEY_ID`],
    /// [`TEST_AWS_SESSION_ACCESS_KEY_ID`]).
    pub credentials: Vec<AwsTestCredential>,
    /// Key of the temporary credentials the STS mock issues and the SigV4 check accepts.
    pub sts_secret: String,
    /// Lifetime of STS credentials when the call gives no `DurationSeconds`.
    #[serde(with = "humantime_serde_compat")]
    pub sts_duration: Duration,
    /// Role ARNs AssumeRoleWithWebIdentity accepts; empty accepts any.
    pub role_arns: Vec<String>,
}

impl Default for AwsAuthConfig {
    fn default() -> Self {
        Self {
            region: "us-east-1".to_owned(),
            service: "bedrock".to_owned(),
            credentials: vec![
                AwsTestCredential {
                    access_key_id: TEST_AWS_ACCESS_KEY_ID.to_owned(),
                    secret_access_key: TEST_AWS_SECRET_ACCESS_KEY.to_owned(),
                    session_token: None,
                },
                AwsTestCredential {
                    access_key_id: TEST_AWS_SESSION_ACCESS_KEY_ID.to_owned(),
                    secret_access_key: TEST_AWS_SESSION_SECRET_ACCESS_KEY.to_owned(),
                    session_token: Some(TEST_AWS_SESSION_TOKEN.to_owned()),
                },
            ],
            sts_secret: DEFAULT_STS_SECRET.to_owned(),
            sts_duration: Duration::from_secs(3600),
            role_arns: Vec::new(),
        }
    }
}

/// A service account whose JWT assertions `POST /token` accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoogleServiceAccount {
    /// `client_email` = the assertion's `iss`.
    pub client_email: String,
    /// Public key, PEM (`-----BEGIN PUBLIC KEY-----`).
    #[serde(default)]
    pub public_key_pem: Option<String>,
    /// Public key file, PEM (read at start). Without this and `public_key_pem`, the account
    /// must be [`TEST_SA_EMAIL`] and the built-in test key is used.
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
}

/// Google OAuth2 on the Vertex paths, the mock token endpoint and the metadata server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GoogleAuthConfig {
    /// Accounts `POST /token` trusts; default the test account.
    pub service_accounts: Vec<GoogleServiceAccount>,
    /// Key of the issued access tokens (mocks sharing it accept each other's tokens).
    pub token_secret: String,
    /// `expires_in` of issued tokens.
    #[serde(with = "humantime_serde_compat")]
    pub token_ttl: Duration,
    /// Required assertion `aud`; `None` accepts any URL ending in `/token`.
    pub audience: Option<String>,
    /// Serve the GCE metadata token endpoint.
    pub metadata_server: bool,
    /// Account the metadata server speaks for.
    pub metadata_email: String,
    /// Project id `GET /computeMetadata/v1/project/project-id` answers.
    pub project_id: String,
}

impl Default for GoogleAuthConfig {
    fn default() -> Self {
        Self {
            service_accounts: vec![GoogleServiceAccount {
                client_email: TEST_SA_EMAIL.to_owned(),
                public_key_pem: None,
                public_key_file: None,
            }],
            token_secret: DEFAULT_TOKEN_SECRET.to_owned(),
            token_ttl: Duration::from_secs(3600),
            audience: None,
            metadata_server: true,
            metadata_email: TEST_SA_EMAIL.to_owned(),
            project_id: "switchyard-test".to_owned(),
        }
    }
}

/// A vendor auth refusal: status, vendor error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AuthError {
    pub(crate) status: u16,
    /// AWS exception name or OAuth `error` code.
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl AuthError {
    fn aws(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: 403,
            code,
            message: message.into(),
        }
    }
}

fn mac(key: &str, data: &[u8]) -> Vec<u8> {
    match HmacSha256::new_from_slice(key.as_bytes()) {
        Ok(mut m) => {
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        // HMAC takes keys of any length; this arm is unreachable in practice.
        Err(_) => Vec::new(),
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unix_now() -> u64 {
    crate::clock::unix_secs()
}

/// A signed, self-describing token `<prefix><b64url(json)>.<b64url(hmac)>`.
fn seal(prefix: &str, secret: &str, claims: &Value) -> String {
    let body = b64url(claims.to_string().as_bytes());
    let tag = b64url(&mac(secret, body.as_bytes()));
    format!("{prefix}{body}.{tag}")
}

/// Opens a [`seal`]ed token: the claims when the MAC matches (expiry not checked here).
fn unseal(prefix: &str, secret: &str, token: &str) -> Option<Value> {
    let rest = token.strip_prefix(prefix)?;
    let (body, tag) = rest.split_once('.')?;
    if b64url(&mac(secret, body.as_bytes())) != tag {
        return None;
    }
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .ok()?;
    serde_json::from_slice(&raw).ok()
}

// ---------------------------------------------------------------------------------------------
// SigV4

/// The parts of a SigV4 `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SigV4Header {
    pub(crate) access_key_id: String,
    pub(crate) date: String,
    pub(crate) region: String,
    pub(crate) service: String,
    pub(crate) signed_headers: Vec<String>,
    pub(crate) signature: String,
}

pub(crate) fn parse_sigv4(value: &str) -> Option<SigV4Header> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256")?.trim_start();
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => signature = Some(v),
            _ => {}
        }
    }
    let mut scope = credential?.split('/');
    let header = SigV4Header {
        access_key_id: scope.next()?.to_owned(),
        date: scope.next()?.to_owned(),
        region: scope.next()?.to_owned(),
        service: scope.next()?.to_owned(),
        signed_headers: signed?.split(';').map(str::to_owned).collect(),
        signature: signature?.to_owned(),
    };
    (scope.next() == Some("aws4_request")).then_some(header)
}

fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let t = chrono::NaiveDateTime::parse_from_str(text, "%Y%m%dT%H%M%SZ").ok()?;
    let secs = u64::try_from(t.and_utc().timestamp()).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Recomputes the SigV4 signature of a request with `aws-sigv4`.
///
/// `url` is the request as received: scheme, `Host`, the encoded path and query. Only the
/// headers named in `signed_headers` are fed to the signer, with nothing excluded, so the
/// canonical request is built from exactly what the client signed.
///
/// # Errors
/// The signer's message when the request cannot be canonicalised.
#[allow(clippy::too_many_arguments)]
pub(crate) fn compute_signature(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
    access_key_id: &str,
    secret: &str,
    session_token: Option<&str>,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Result<String, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;
    let identity = aws_credential_types::Credentials::new(
        access_key_id,
        secret,
        session_token.map(str::to_owned),
        None,
        "switchyard-mock",
    )
    .into();
    let mut settings = SigningSettings::default();
    settings.excluded_headers = Some(Vec::new());
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let request = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    let (_, signature) = sign(request, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    Ok(signature)
}

/// The signed headers' values as received (repeated headers joined with `,`).
fn signed_header_values(headers: &HeaderMap, names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .filter_map(|name| {
            let values: Vec<&str> = headers
                .get_all(name.as_str())
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            (!values.is_empty()).then(|| (name.clone(), values.join(",")))
        })
        .collect()
}

const SIGNATURE_MISMATCH: &str = "The request signature we calculated does not match the \
    signature you provided. Check your AWS Secret Access Key and signing method. Consult the \
    service documentation for details.";

impl AwsAuthConfig {
    /// The secret and session token for a key id: configured, or issued by an STS mock with
    /// the same `sts_secret` (checked against the request's token and its expiry).
    fn lookup(
        &self,
        access_key_id: &str,
        token: Option<&str>,
    ) -> Result<(String, Option<String>), AuthError> {
        if let Some(c) = self
            .credentials
            .iter()
            .find(|c| c.access_key_id == access_key_id)
        {
            if c.session_token.is_some() && c.session_token.as_deref() != token {
                return Err(AuthError::aws(
                    "UnrecognizedClientException",
                    "The security token included in the request is invalid.",
                ));
            }
            return Ok((c.secret_access_key.clone(), c.session_token.clone()));
        }
        let claims = token
            .and_then(|t| unseal("IQoJmock", &self.sts_secret, t))
            .filter(|c| c["akid"] == access_key_id);
        let Some(claims) = claims else {
            return Err(AuthError::aws(
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ));
        };
        if claims["exp"].as_u64().unwrap_or(0) <= unix_now() {
            return Err(AuthError::aws(
                "ExpiredTokenException",
                "The security token included in the request is expired",
            ));
        }
        Ok((
            sts_secret_for(&self.sts_secret, access_key_id),
            token.map(str::to_owned),
        ))
    }

    /// Checks a request's SigV4 signature.
    ///
    /// # Errors
    /// The 403 Bedrock answers (see the module docs).
    pub(crate) fn verify(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<String, AuthError> {
        let Some(auth) = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return Err(AuthError::aws(
                "MissingAuthenticationTokenException",
                "Missing Authentication Token",
            ));
        };
        let Some(sig) = parse_sigv4(auth) else {
            return Err(AuthError::aws(
                "IncompleteSignatureException",
                format!(
                    "Authorization header requires 'Credential', 'Signature' and \
                     'SignedHeaders' parameters. Authorization={auth}"
                ),
            ));
        };
        let token = headers
            .get("x-amz-security-token")
            .and_then(|v| v.to_str().ok());
        let (secret, token) = self.lookup(&sig.access_key_id, token)?;
        if sig.region != self.region {
            return Err(AuthError::aws(
                "InvalidSignatureException",
                format!(
                    "Credential should be scoped to a valid region. '{}' is not '{}'.",
                    sig.region, self.region
                ),
            ));
        }
        if sig.service != self.service {
            return Err(AuthError::aws(
                "InvalidSignatureException",
                format!(
                    "Credential should be scoped to correct service: '{}'. ",
                    self.service
                ),
            ));
        }
        let date = headers
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let Some(time) = parse_amz_date(date) else {
            return Err(AuthError::aws(
                "IncompleteSignatureException",
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' \
                 header.",
            ));
        };
        let now = crate::clock::wall_now();
        let skew = now
            .duration_since(time)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .unwrap_or_default();
        if skew > MAX_SKEW {
            return Err(AuthError::aws(
                "InvalidSignatureException",
                format!(
                    "Signature expired: {date} is now earlier or later than 5 minutes from the current time."
                ),
            ));
        }
        if !sig.date.is_empty() && !date.starts_with(&sig.date) {
            return Err(AuthError::aws(
                "InvalidSignatureException",
                SIGNATURE_MISMATCH,
            ));
        }
        let host = headers
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("localhost");
        let url = format!("http://{host}{path_and_query}");
        let signed = signed_header_values(headers, &sig.signed_headers);
        let expected = compute_signature(
            method,
            &url,
            &signed,
            body,
            &sig.access_key_id,
            &secret,
            token.as_deref(),
            &sig.region,
            &sig.service,
            time,
        )
        .map_err(|e| AuthError::aws("InvalidSignatureException", e))?;
        if expected != sig.signature {
            return Err(AuthError::aws(
                "InvalidSignatureException",
                SIGNATURE_MISMATCH,
            ));
        }
        Ok(sig.access_key_id)
    }
}

fn sts_secret_for(sts_secret: &str, access_key_id: &str) -> String {
    let raw = mac(sts_secret, format!("secret|{access_key_id}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(raw)[..40].to_owned()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An STS answer: status and XML body.
pub(crate) type StsAnswer = (u16, String);

fn sts_error(status: u16, code: &str, message: &str, request_id: &str) -> StsAnswer {
    let kind = if status >= 500 { "Receiver" } else { "Sender" };
    (
        status,
        format!(
            "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\n  <Error>\n    \
             <Type>{kind}</Type>\n    <Code>{code}</Code>\n    <Message>{}</Message>\n  \
             </Error>\n  <RequestId>{request_id}</RequestId>\n</ErrorResponse>\n",
            xml_escape(message)
        ),
    )
}

fn jwt_claims_unverified(token: &str) -> Option<Value> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&raw).ok()
}

impl AwsAuthConfig {
    /// `POST /` with a form body: `Action=AssumeRoleWithWebIdentity` (the only action served).
    ///
    /// The web-identity token must be a JWT whose `exp` (if any) is in the future; the mock does
    /// not check its signature (that is the OIDC provider's business, not SigV4's).
    pub(crate) fn sts(&self, form: &[(String, String)], serial: u64) -> StsAnswer {
        let get = |k: &str| {
            form.iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        let request_id = format!("00000000-0000-4000-8000-{serial:012x}");
        match get("Action") {
            Some("AssumeRoleWithWebIdentity") => {}
            Some(other) => {
                return sts_error(
                    400,
                    "InvalidAction",
                    &format!("Could not find operation {other} for version 2011-06-15"),
                    &request_id,
                );
            }
            None => return sts_error(400, "MissingAction", "Missing Action", &request_id),
        }
        let (Some(role), Some(session), Some(token)) = (
            get("RoleArn"),
            get("RoleSessionName"),
            get("WebIdentityToken"),
        ) else {
            return sts_error(
                400,
                "ValidationError",
                "1 validation error detected: RoleArn, RoleSessionName and WebIdentityToken are \
                 required",
                &request_id,
            );
        };
        if !self.role_arns.is_empty() && !self.role_arns.iter().any(|r| r == role) {
            return sts_error(
                403,
                "AccessDenied",
                "Not authorized to perform sts:AssumeRoleWithWebIdentity",
                &request_id,
            );
        }
        let Some(claims) = jwt_claims_unverified(token) else {
            return sts_error(
                400,
                "InvalidIdentityToken",
                "The web identity token that was passed could not be validated by AWS. Get a \
                 new identity token from the identity provider and then retry the request.",
                &request_id,
            );
        };
        let now = unix_now();
        if let Some(exp) = claims["exp"].as_u64()
            && exp <= now
        {
            return sts_error(
                400,
                "ExpiredTokenException",
                "Token expired: current date/time must be before the expiration date/time.",
                &request_id,
            );
        }
        let duration = get("DurationSeconds")
            .and_then(|d| d.parse::<u64>().ok())
            .unwrap_or(self.sts_duration.as_secs());
        let exp = now + duration;
        let hex = b64url(&mac(
            &self.sts_secret,
            format!("{serial}|{now}|{role}").as_bytes(),
        ));
        let suffix: String = hex
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_uppercase())
            .take(16)
            .collect();
        let akid = format!("ASIA{suffix:0<16}");
        let secret = sts_secret_for(&self.sts_secret, &akid);
        let session_token = seal(
            "IQoJmock",
            &self.sts_secret,
            &json!({"akid": akid, "exp": exp, "role": role}),
        );
        let expiration = chrono::DateTime::from_timestamp(i64::try_from(exp).unwrap_or(0), 0)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        let role_name = role.rsplit('/').next().unwrap_or(role);
        let account = role.split(':').nth(4).unwrap_or("000000000000");
        let subject = claims["sub"].as_str().unwrap_or("system:serviceaccount");
        let audience = claims["aud"]
            .as_str()
            .or_else(|| claims["aud"][0].as_str())
            .unwrap_or("sts.amazonaws.com");
        let provider = claims["iss"].as_str().unwrap_or("oidc.example.invalid");
        let body = format!(
            "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\n\
             \x20 <AssumeRoleWithWebIdentityResult>\n\
             \x20   <SubjectFromWebIdentityToken>{}</SubjectFromWebIdentityToken>\n\
             \x20   <Audience>{}</Audience>\n\
             \x20   <AssumedRoleUser>\n\
             \x20     <Arn>arn:aws:sts::{account}:assumed-role/{}/{}</Arn>\n\
             \x20     <AssumedRoleId>AROAMOCKSWITCHYARD:{}</AssumedRoleId>\n\
             \x20   </AssumedRoleUser>\n\
             \x20   <Credentials>\n\
             \x20     <SessionToken>{session_token}</SessionToken>\n\
             \x20     <SecretAccessKey>{secret}</SecretAccessKey>\n\
             \x20     <Expiration>{expiration}</Expiration>\n\
             \x20     <AccessKeyId>{akid}</AccessKeyId>\n\
             \x20   </Credentials>\n\
             \x20   <Provider>{}</Provider>\n\
             \x20 </AssumeRoleWithWebIdentityResult>\n\
             \x20 <ResponseMetadata>\n\
             \x20   <RequestId>{request_id}</RequestId>\n\
             \x20 </ResponseMetadata>\n\
             </AssumeRoleWithWebIdentityResponse>\n",
            xml_escape(subject),
            xml_escape(audience),
            xml_escape(role_name),
            xml_escape(session),
            xml_escape(session),
            xml_escape(provider),
        );
        (200, body)
    }
}

// ---------------------------------------------------------------------------------------------
// Google OAuth2

/// Service accounts with their decoding keys, loaded once at start.
#[derive(Clone)]
pub(crate) struct GoogleKeys {
    accounts: Vec<(String, jsonwebtoken::DecodingKey)>,
}

impl std::fmt::Debug for GoogleKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleKeys")
            .field(
                "accounts",
                &self.accounts.iter().map(|(e, _)| e).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl GoogleAuthConfig {
    /// Loads every account's public key.
    ///
    /// # Errors
    /// A message naming the account whose key is missing, unreadable or not an RSA PEM.
    pub(crate) fn load_keys(&self) -> Result<GoogleKeys, String> {
        let mut accounts = Vec::new();
        for sa in &self.service_accounts {
            let pem = match (&sa.public_key_pem, &sa.public_key_file) {
                (Some(pem), _) => pem.clone(),
                (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "google_auth: cannot read public_key_file {} of {}: {e}",
                        path.display(),
                        sa.client_email
                    )
                })?,
                (None, None) if sa.client_email == TEST_SA_EMAIL => {
                    TEST_SA_PUBLIC_KEY_PEM.to_owned()
                }
                (None, None) => {
                    return Err(format!(
                        "google_auth: service account {} has neither public_key_pem nor \
                         public_key_file",
                        sa.client_email
                    ));
                }
            };
            let key = jsonwebtoken::DecodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| {
                format!(
                    "google_auth: public key of {} is not an RSA PEM: {e}",
                    sa.client_email
                )
            })?;
            accounts.push((sa.client_email.clone(), key));
        }
        Ok(GoogleKeys { accounts })
    }

    fn issue(&self, subject: &str, scope: &str) -> Value {
        let ttl = self.token_ttl.as_secs().max(1);
        let token = seal(
            "ya29.mock.",
            &self.token_secret,
            &json!({"sub": subject, "scope": scope, "exp": unix_now() + ttl}),
        );
        json!({"access_token": token, "expires_in": ttl, "token_type": "Bearer"})
    }

    /// `POST /token`: the JWT-bearer grant. Returns status and the OAuth JSON body.
    pub(crate) fn token_endpoint(
        &self,
        keys: &GoogleKeys,
        form: &[(String, String)],
    ) -> (u16, Value) {
        let get = |k: &str| {
            form.iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        let oauth_err =
            |code: &str, desc: &str| (400, json!({"error": code, "error_description": desc}));
        match get("grant_type") {
            Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => {}
            Some(other) => {
                return oauth_err(
                    "unsupported_grant_type",
                    &format!("Invalid grant_type: {other}"),
                );
            }
            None => return oauth_err("invalid_request", "Missing required parameter: grant_type"),
        }
        let Some(assertion) = get("assertion") else {
            return oauth_err("invalid_request", "Missing required parameter: assertion");
        };
        let Some(unverified) = jwt_claims_unverified(assertion) else {
            return oauth_err("invalid_grant", "Invalid JWT: the assertion is not a JWT.");
        };
        let iss = unverified["iss"].as_str().unwrap_or_default();
        let Some((_, key)) = keys.accounts.iter().find(|(email, _)| email == iss) else {
            return oauth_err("invalid_grant", "Invalid grant: account not found");
        };
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = 0;
        match &self.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        let claims = match jsonwebtoken::decode::<Value>(assertion, key, &validation) {
            Ok(data) => data.claims,
            Err(e) => {
                use jsonwebtoken::errors::ErrorKind;
                let desc = match e.kind() {
                    ErrorKind::InvalidSignature => "Invalid JWT Signature.",
                    ErrorKind::ExpiredSignature => {
                        "Invalid JWT: Token must be a short-lived token (60 minutes) and in a \
                         reasonable timeframe. Check your iat and exp values in the JWT claim."
                    }
                    ErrorKind::InvalidAudience => {
                        "Invalid JWT: audience is not the token endpoint."
                    }
                    _ => "Invalid JWT.",
                };
                return oauth_err("invalid_grant", desc);
            }
        };
        let aud = claims["aud"].as_str().unwrap_or_default();
        if self.audience.is_none() && !aud.ends_with("/token") {
            return oauth_err(
                "invalid_grant",
                "Invalid JWT: audience is not the token endpoint.",
            );
        }
        let iat = claims["iat"].as_u64().unwrap_or(0);
        let exp = claims["exp"].as_u64().unwrap_or(0);
        if exp.saturating_sub(iat) > 3600 || iat > unix_now() + 60 {
            return oauth_err(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable \
                 timeframe. Check your iat and exp values in the JWT claim.",
            );
        }
        let scope = claims["scope"].as_str().unwrap_or_default();
        if scope.is_empty() {
            return oauth_err(
                "invalid_scope",
                "Invalid OAuth scope or ID token audience provided.",
            );
        }
        (200, self.issue(iss, scope))
    }

    /// `GET /computeMetadata/v1/instance/service-accounts/default/token`.
    pub(crate) fn metadata_token(&self) -> Value {
        self.issue(
            &self.metadata_email,
            "https://www.googleapis.com/auth/cloud-platform",
        )
    }

    /// Checks `Authorization: Bearer <token>` on a Vertex path.
    ///
    /// # Errors
    /// 401 `UNAUTHENTICATED` with Google's message (missing, forged or expired token).
    pub(crate) fn verify_bearer(&self, headers: &HeaderMap) -> Result<String, AuthError> {
        let unauth = |message: &str| AuthError {
            status: 401,
            code: "UNAUTHENTICATED",
            message: message.to_owned(),
        };
        let Some(token) = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        else {
            return Err(unauth(
                "Request is missing required authentication credential. Expected OAuth 2 access \
                 token, login cookie or other valid authentication credential. See \
                 https://developers.google.com/identity/sign-in/web/devconsole-project.",
            ));
        };
        let invalid = "Request had invalid authentication credentials. Expected OAuth 2 access \
             token, login cookie or other valid authentication credential. See \
             https://developers.google.com/identity/sign-in/web/devconsole-project.";
        let claims =
            unseal("ya29.mock.", &self.token_secret, token).ok_or_else(|| unauth(invalid))?;
        if claims["exp"].as_u64().unwrap_or(0) <= unix_now() {
            return Err(unauth(invalid));
        }
        Ok(claims["sub"].as_str().unwrap_or_default().to_owned())
    }
}

/// Parses an `application/x-www-form-urlencoded` body.
pub(crate) fn form(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body).into_owned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const BODY: &[u8] = br#"{"messages":[{"role":"user","content":[{"text":"hi"}]}]}"#;
    // An inference-profile ARN, percent-encoded once as clients send it.
    const PATH: &str = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-sonnet-4-20250514-v1%3A0/converse";
    // Every model-id form: base id, cross-region inference profile, ARN.
    const PATHS: [&str; 3] = [
        "/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse",
        "/model/global.anthropic.claude-sonnet-4-20250514-v1%3A0/converse-stream",
        PATH,
    ];

    /// Signs like a client would: aws-sigv4 with default settings, applied to an http request.
    fn signed(
        akid: &str,
        secret: &str,
        token: Option<&str>,
        region: &str,
        path: &str,
    ) -> HeaderMap {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        use aws_sigv4::sign::v4;
        let identity = aws_credential_types::Credentials::new(
            akid,
            secret,
            token.map(str::to_owned),
            None,
            "test",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name("bedrock")
            .time(crate::clock::wall_now())
            .settings(SigningSettings::default())
            .build()
            .unwrap()
            .into();
        let url = format!("http://127.0.0.1:9001{path}");
        let headers = [
            ("content-type", "application/json"),
            ("host", "127.0.0.1:9001"),
        ];
        let req = SignableRequest::new(
            "POST",
            url.as_str(),
            headers.into_iter(),
            SignableBody::Bytes(BODY),
        )
        .unwrap();
        let (instructions, _) = sign(req, &params).unwrap().into_parts();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(k, HeaderValue::from_static(v));
        }
        for (k, v) in instructions.headers() {
            map.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn client_signed(secret: &str, region: &str, token: Option<&str>) -> HeaderMap {
        signed(TEST_AWS_ACCESS_KEY_ID, secret, token, region, PATH)
    }

    #[test]
    fn sigv4_verify_accepts_every_model_id_form_and_refuses_another_path() {
        let cfg = AwsAuthConfig::default();
        for path in PATHS {
            let h = signed(
                TEST_AWS_ACCESS_KEY_ID,
                TEST_AWS_SECRET_ACCESS_KEY,
                None,
                "us-east-1",
                path,
            );
            assert_eq!(
                cfg.verify("POST", path, &h, BODY).unwrap(),
                TEST_AWS_ACCESS_KEY_ID,
                "{path}"
            );
            // The same signature sent to another path (here: the path decoded) is refused.
            let decoded = percent_encoding::percent_decode_str(path)
                .decode_utf8_lossy()
                .into_owned();
            let e = cfg.verify("POST", &decoded, &h, BODY).unwrap_err();
            assert_eq!(e.code, "InvalidSignatureException", "{decoded}");
        }
    }

    #[test]
    fn sigv4_session_credential_needs_its_token() {
        let cfg = AwsAuthConfig::default();
        let good = signed(
            TEST_AWS_SESSION_ACCESS_KEY_ID,
            TEST_AWS_SESSION_SECRET_ACCESS_KEY,
            Some(TEST_AWS_SESSION_TOKEN),
            "us-east-1",
            PATH,
        );
        assert!(cfg.verify("POST", PATH, &good, BODY).is_ok());
        let no_token = signed(
            TEST_AWS_SESSION_ACCESS_KEY_ID,
            TEST_AWS_SESSION_SECRET_ACCESS_KEY,
            None,
            "us-east-1",
            PATH,
        );
        let e = cfg.verify("POST", PATH, &no_token, BODY).unwrap_err();
        assert_eq!(e.code, "UnrecognizedClientException");
    }

    #[test]
    fn sigv4_verify_accepts_client_signature_refuses_wrong_secret_region_body() {
        let cfg = AwsAuthConfig::default();
        let good = client_signed(TEST_AWS_SECRET_ACCESS_KEY, "us-east-1", None);
        assert_eq!(
            cfg.verify("POST", PATH, &good, BODY).unwrap(),
            TEST_AWS_ACCESS_KEY_ID
        );
        let e = cfg.verify("POST", PATH, &good, b"{}").unwrap_err();
        assert_eq!((e.status, e.code), (403, "InvalidSignatureException"));
        assert!(e.message.starts_with("The request signature we calculated"));
        let wrong = client_signed("not-the-secret", "us-east-1", None);
        let e = cfg.verify("POST", PATH, &wrong, BODY).unwrap_err();
        assert_eq!(e.code, "InvalidSignatureException");
        let other_region = client_signed(TEST_AWS_SECRET_ACCESS_KEY, "eu-west-1", None);
        let e = cfg.verify("POST", PATH, &other_region, BODY).unwrap_err();
        assert_eq!(e.code, "InvalidSignatureException");
        assert!(e.message.contains("valid region"), "{}", e.message);
        let e = cfg
            .verify("POST", PATH, &HeaderMap::new(), BODY)
            .unwrap_err();
        assert_eq!(e.code, "MissingAuthenticationTokenException");
    }

    #[test]
    fn sigv4_unknown_key_is_unrecognized_client() {
        let cfg = AwsAuthConfig {
            credentials: Vec::new(),
            ..AwsAuthConfig::default()
        };
        let good = client_signed(TEST_AWS_SECRET_ACCESS_KEY, "us-east-1", None);
        let e = cfg.verify("POST", PATH, &good, BODY).unwrap_err();
        assert_eq!((e.status, e.code), (403, "UnrecognizedClientException"));
    }

    #[test]
    fn sts_credentials_are_accepted_by_sigv4_until_they_expire() {
        let cfg = AwsAuthConfig::default();
        let jwt = format!(
            "{}.{}.sig",
            b64url(br#"{"alg":"RS256"}"#),
            b64url(
                json!({"sub": "system:serviceaccount:ns:sa", "exp": unix_now() + 600})
                    .to_string()
                    .as_bytes()
            )
        );
        let form: Vec<(String, String)> = [
            ("Action", "AssumeRoleWithWebIdentity"),
            ("RoleArn", "arn:aws:iam::123456789012:role/switchyard"),
            ("RoleSessionName", "s1"),
            ("WebIdentityToken", jwt.as_str()),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let (status, xml) = cfg.sts(&form, 1);
        assert_eq!(status, 200, "{xml}");
        let field = |name: &str| {
            let open = format!("<{name}>");
            let start = xml.find(&open).unwrap() + open.len();
            let end = xml[start..].find('<').unwrap() + start;
            xml[start..end].to_owned()
        };
        let (akid, secret, token) = (
            field("AccessKeyId"),
            field("SecretAccessKey"),
            field("SessionToken"),
        );
        assert!(akid.starts_with("ASIA") && akid.len() == 20, "{akid}");
        let (got_secret, got_token) = cfg.lookup(&akid, Some(&token)).unwrap();
        assert_eq!(
            (got_secret, got_token.as_deref()),
            (secret, Some(token.as_str()))
        );
        // A token naming another key, or a forged one, is refused.
        assert!(cfg.lookup("ASIAOTHERKEY00000000", Some(&token)).is_err());
        assert!(cfg.lookup(&akid, Some("IQoJmockAAAA.BBBB")).is_err());
        let expired = seal(
            "IQoJmock",
            &cfg.sts_secret,
            &json!({"akid": akid, "exp": 1}),
        );
        assert_eq!(
            cfg.lookup(&akid, Some(&expired)).unwrap_err().code,
            "ExpiredTokenException"
        );
    }

    #[test]
    fn google_token_endpoint_verifies_assertion_signature() {
        let cfg = GoogleAuthConfig::default();
        let keys = cfg.load_keys().unwrap();
        let sa: Value = serde_json::from_str(TEST_SA_KEY_JSON).unwrap();
        let now = unix_now();
        let claims = json!({"iss": TEST_SA_EMAIL, "aud": "http://127.0.0.1:1/token",
            "scope": "https://www.googleapis.com/auth/cloud-platform", "iat": now, "exp": now + 3600});
        let key =
            jsonwebtoken::EncodingKey::from_rsa_pem(sa["private_key"].as_str().unwrap().as_bytes())
                .unwrap();
        let jwt = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            &key,
        )
        .unwrap();
        let grant = |assertion: &str| {
            vec![
                (
                    "grant_type".to_owned(),
                    "urn:ietf:params:oauth:grant-type:jwt-bearer".to_owned(),
                ),
                ("assertion".to_owned(), assertion.to_owned()),
            ]
        };
        let (status, body) = cfg.token_endpoint(&keys, &grant(&jwt));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["expires_in"], 3600);
        let mut headers = HeaderMap::new();
        let bearer = format!("Bearer {}", body["access_token"].as_str().unwrap());
        headers.insert("authorization", HeaderValue::from_str(&bearer).unwrap());
        assert_eq!(cfg.verify_bearer(&headers).unwrap(), TEST_SA_EMAIL);
        // Signed by another key: refused with Google's message.
        let untrusted: Value =
            serde_json::from_str(include_str!("../testdata/vertex-test-sa-untrusted.json"))
                .unwrap();
        let other = jsonwebtoken::EncodingKey::from_rsa_pem(
            untrusted["private_key"].as_str().unwrap().as_bytes(),
        )
        .unwrap();
        let forged = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            &other,
        )
        .unwrap();
        let (status, body) = cfg.token_endpoint(&keys, &grant(&forged));
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_grant"))
        );
        assert_eq!(body["error_description"], "Invalid JWT Signature.");
        // A made-up bearer token is a 401.
        headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer ya29.nope"),
        );
        assert_eq!(cfg.verify_bearer(&headers).unwrap_err().status, 401);
    }

    #[test]
    fn auth_config_yaml_keys_parse_and_defaults_hold() {
        let yaml = r#"
name: bedrock-a
aws_auth:
  region: eu-west-1
  credentials:
    - { access_key_id: AKIAEXAMPLE000000001, secret_access_key: s3cr3t }
  sts_duration: 15m
google_auth:
  service_accounts:
    - client_email: switchyard-mock-test@switchyard-test.iam.gserviceaccount.com
  token_ttl: 10m
gemini_thoughts_tokens: 7
"#;
        let cfg: crate::MockConfig = serde_yaml::from_str(yaml).unwrap();
        let aws = cfg.aws_auth.unwrap();
        assert_eq!(aws.region, "eu-west-1");
        assert_eq!(aws.service, "bedrock");
        assert_eq!(aws.credentials.len(), 1);
        assert_eq!(aws.sts_duration, Duration::from_secs(900));
        let google = cfg.google_auth.unwrap();
        assert_eq!(google.token_ttl, Duration::from_secs(600));
        assert!(
            google.load_keys().is_ok(),
            "the test account needs no key file"
        );
        assert_eq!(cfg.gemini_thoughts_tokens, 7);
        let typo = "aws_auth: { regoin: us-east-1 }\n";
        assert!(serde_yaml::from_str::<crate::MockConfig>(typo).is_err());
        let keyless = GoogleAuthConfig {
            service_accounts: vec![GoogleServiceAccount {
                client_email: "other@example.iam.gserviceaccount.com".to_owned(),
                public_key_pem: None,
                public_key_file: None,
            }],
            ..GoogleAuthConfig::default()
        };
        let e = keyless.load_keys().unwrap_err();
        assert!(e.contains("other@example"), "{e}");
    }

    #[test]
    fn example_vendor_mock_file_parses() {
        let file = crate::ConfigFile::from_yaml(include_str!("../testdata/vendor-mocks.yaml"))
            .unwrap()
            .into_mocks();
        assert_eq!(file.len(), 2);
        assert!(file[0].google_auth.is_some() && file[1].aws_auth.is_some());
        assert_eq!(file[1].faults.rules.len(), 2);
    }
}
