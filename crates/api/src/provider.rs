//! `LLMProvider`: one backend — a vendor API at a region under one account, serving some models.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use switchyard_core::availability::FlapState;

use crate::common::{DECIMAL_PATTERN, DURATION_PATTERN, Limit, SecretKeyRef};

/// Desired state of an LLMProvider.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "LLMProvider",
    doc = "An LLM provider backend: one vendor API at one region under one account, serving some models, with its rate limits.",
    plural = "llmproviders",
    singular = "llmprovider",
    namespaced,
    status = "LLMProviderStatus",
    shortname = "llmp",
    shortname = "llmprov",
    category = "switchyard",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"API","type":"string","jsonPath":".spec.api"}"#,
    printcolumn = r#"{"name":"Region","type":"string","jsonPath":".spec.region"}"#,
    printcolumn = r#"{"name":"Availability","type":"number","jsonPath":".status.availability"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("self.models.all(m, self.models.exists_one(n, n.name == m.name))").message("model names must be unique within a provider"),
    validation = kube::core::Rule::new("!has(self.healthCheck) || !has(self.healthCheck.probes) || self.healthCheck.probes.all(p, !has(p.model) || self.models.exists(m, m.name == p.model))").message("healthCheck.probes[].model must name one of models[]"),
    validation = kube::core::Rule::new("has(self.endpoint) || self.api == 'vertex' || self.api == 'bedrock'").message("endpoint is required unless api is vertex or bedrock (their hosts follow from region)"),
    validation = kube::core::Rule::new("(self.api != 'vertex' && self.api != 'bedrock') || has(self.region)").message("region is required for api vertex (the location) and bedrock (the AWS region)"),
    validation = kube::core::Rule::new("self.api != 'vertex' || (has(self.vertex) && has(self.vertex.projectId))").message("api vertex needs vertex.projectId"),
    validation = kube::core::Rule::new("!has(self.vertex) || self.api == 'vertex'").message("vertex settings are only for api vertex"),
    validation = kube::core::Rule::new("!has(self.bedrock) || self.api == 'bedrock'").message("bedrock settings are only for api bedrock"),
    validation = kube::core::Rule::new("!has(self.credentials) || ((!has(self.credentials.accessKeyIdRef) && !has(self.credentials.sessionTokenRef)) || self.api == 'bedrock')").message("credentials.accessKeyIdRef and sessionTokenRef are only for api bedrock"),
    validation = kube::core::Rule::new("self.api == 'bedrock' || self.models.all(m, !has(m.bedrockApi))").message("models[].bedrockApi is only for api bedrock"),
)]
pub struct LLMProviderSpec {
    /// Wire protocol spoken by the endpoint.
    pub api: ProviderApi,
    /// Base URL of the API, such as `https://api.anthropic.com` (paths like `/v1/messages` are
    /// appended by the adapter). Required for `openai` and `anthropic`; for `vertex` and
    /// `bedrock` the host follows from `region` and this only overrides it (private endpoints,
    /// tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    )]
    pub endpoint: Option<String>,
    /// Region where requests execute, such as `us-east-1` or `europe-west4`; compared with the
    /// allowed regions of routing policies and tenants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub region: Option<String>,
    /// For cross-region inference profiles: every region the provider may execute a request in.
    /// A policy with allowed regions only uses the provider when all of these are allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub execution_regions: Vec<String>,
    /// Credentials presented to the provider. Optional for `vertex` (absent: tokens from the
    /// GKE metadata server, workload identity) and `bedrock` (absent: IRSA web identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<ProviderCredentials>,
    /// Vertex AI settings (`api: vertex`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex: Option<VertexSpec>,
    /// Bedrock settings (`api: bedrock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bedrock: Option<BedrockSpec>,
    /// Models served, by their public names.
    #[schemars(length(min = 1, max = 64))]
    pub models: Vec<ProviderModel>,
    /// Provider-side buckets (RPM, ITPM, OTPM, concurrency, spend), as published by the vendor for
    /// this account.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub limits: Vec<Limit>,
    /// Timeouts for calls to this provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<ProviderTimeouts>,
    /// Circuit-breaker settings (per router replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
    /// Active health probes run by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckSpec>,
}

/// Wire protocol of a provider endpoint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ProviderApi {
    /// OpenAI or any OpenAI-compatible endpoint (`/v1/chat/completions`, `/v1/embeddings`).
    Openai,
    /// Anthropic Messages API (`/v1/messages`).
    Anthropic,
    /// Google Vertex AI.
    Vertex,
    /// AWS Bedrock.
    Bedrock,
}

/// Credentials presented to a provider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("(!has(self.accessKeyIdRef) || self.accessKeyIdRef.name == self.secretRef.name) && (!has(self.sessionTokenRef) || self.sessionTokenRef.name == self.secretRef.name)").message("accessKeyIdRef and sessionTokenRef must name the same Secret as secretRef"),
)]
pub struct ProviderCredentials {
    /// Secret key holding the credential: the API key (`openai`, `anthropic`), the
    /// service-account JSON key (`vertex`), or for `bedrock` the secret access key (with
    /// `accessKeyIdRef`) or, alone, a Bedrock API key (sent as a bearer token, no SigV4).
    pub secret_ref: SecretKeyRef,
    /// `bedrock` only: key of the same Secret holding the access key id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id_ref: Option<SecretKeyRef>,
    /// `bedrock` only: key of the same Secret holding a session token (temporary keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_ref: Option<SecretKeyRef>,
}

/// Vertex AI settings of an `api: vertex` provider; `region` is the location (`global`, the
/// `us` / `eu` multi-regions, or a region such as `us-east5`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VertexSpec {
    /// Google Cloud project id the models are called in.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z][-a-z0-9]*[a-z0-9]$")
    )]
    pub project_id: String,
    /// OAuth2 token endpoint for the service-account JWT grant; default: the key file's
    /// `token_uri`, else `https://oauth2.googleapis.com/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    )]
    pub token_url: Option<String>,
    /// Metadata server base URL used when no key is given (GKE workload identity); default
    /// `http://metadata.google.internal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    )]
    pub metadata_url: Option<String>,
}

/// Bedrock settings of an `api: bedrock` provider; `region` is the AWS region.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct BedrockSpec {
    /// Role assumed with the web-identity token when no credentials are given (IRSA); default
    /// the `AWS_ROLE_ARN` environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 20, max = 2048),
        regex(pattern = r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$")
    )]
    pub role_arn: Option<String>,
    /// Web-identity token file (IRSA); default the `AWS_WEB_IDENTITY_TOKEN_FILE` environment
    /// variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub web_identity_token_file: Option<String>,
    /// STS endpoint for `AssumeRoleWithWebIdentity`; default `https://sts.REGION.amazonaws.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 2048),
        regex(pattern = r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    )]
    pub sts_endpoint: Option<String>,
}

/// Which Bedrock runtime API serves a model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BedrockModelApi {
    /// `Converse` / `ConverseStream`: one request shape for every model.
    Converse,
    /// `InvokeModel` / `InvokeModelWithResponseStream` with the Anthropic Messages body
    /// (Anthropic models only): keeps prompt-cache breakpoints and betas exactly.
    Invoke,
}

/// What kind of input or output a model handles; probes and candidate filtering are per modality.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub enum Modality {
    /// Text in, text out.
    Text,
    /// Images in the input.
    Image,
    /// Audio in or out.
    Audio,
    /// Embedding vectors.
    Embedding,
    /// Relevance scores for documents.
    Rerank,
    /// Speech to text through the transcription endpoint (`/v1/audio/transcriptions`,
    /// multipart audio in, text out). `audio` is audio inside chat messages.
    Transcription,
    /// Text to speech through the speech endpoint (`/v1/audio/speech`, text and a voice in,
    /// audio out).
    Speech,
}

/// One model served by a provider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderModel {
    /// Public model name clients ask for (a RoutingPolicy's `model` or one of its aliases).
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Name the provider expects upstream, when it differs (for example a Bedrock model id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub upstream_name: Option<String>,
    /// Modalities this model handles; `text` when absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub modalities: Vec<Modality>,
    /// Context window in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context_window: Option<u32>,
    /// `bedrock` only: the runtime API used for this model; default `invoke` for Anthropic
    /// model ids (base ids, inference profiles and ARNs naming `anthropic.`), `converse` for
    /// the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bedrock_api: Option<BedrockModelApi>,
    /// List prices, used for spend buckets and cost accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
}

/// List prices in USD per million tokens, as decimal strings (`"3"`, `"0.30"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pricing {
    /// USD per million uncached input tokens.
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub input_per_million: String,
    /// USD per million output tokens.
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub output_per_million: String,
    /// USD per million input tokens read from the prompt cache; the input price when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub cached_input_per_million: Option<String>,
    /// USD per million input tokens written to the prompt cache; the input price when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub cache_write_per_million: Option<String>,
}

/// Timeouts for calls to one provider, as duration strings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProviderTimeouts {
    /// TCP and TLS connection establishment (default `5s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub connect: Option<String>,
    /// From sending the request to the first real content (default `30s`); keep-alives and
    /// role-only stream frames do not count as content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub first_token: Option<String>,
    /// Whole call, including streaming the response (default `600s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub total: Option<String>,
}

/// Circuit-breaker settings (DESIGN §4.5).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreakerSpec {
    /// Consecutive provider-side failures that open the circuit (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_failures: Option<u32>,
    /// First open period (default `5s`); doubled on each failed trial up to `maxCooldown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub cooldown: Option<String>,
    /// Longest open period (default `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub max_cooldown: Option<String>,
    /// Trial requests let through while half-open (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub half_open_trials: Option<u32>,
}

/// Active health probes (DESIGN §4.8): per modality, a tiny real request in the provider's own
/// wire format (a 1-token chat, a 1-item embedding, a short silent WAV for transcription, a
/// short phrase in the configured voice for speech) on every interval.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("!has(self.probes) || self.probes.all(p, self.probes.exists_one(q, q.modality == p.modality))").message("at most one healthCheck.probes[] entry per modality"),
)]
pub struct HealthCheckSpec {
    /// Whether probes run.
    #[serde(default)]
    pub enabled: bool,
    /// Time between probes (default `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub interval: Option<String>,
    /// Modalities to probe; every modality of the provider's models when absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modalities: Vec<Modality>,
    /// Consecutive failed probes that mark a modality Unhealthy (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: Option<u32>,
    /// Successful probes slower than this mark the modality Degraded (default `5s`); a
    /// per-modality `probes[].latencyThreshold` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub latency_threshold: Option<String>,
    /// A probe not answered within this counts as failed (default `10s`); a per-modality
    /// `probes[].timeout` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub timeout: Option<String>,
    /// Per-modality probe settings, at most one entry per modality; modalities without an
    /// entry use the defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["modality".into()]))]
    pub probes: Vec<ModalityProbe>,
}

/// Probe settings of one modality.
///
/// A probe the provider refuses for its shape (a 4xx other than 401, 403, 408 and 429: an
/// unknown model or voice, a parameter it does not take) is reported as a probe
/// configuration problem in `status.health[].reason` (`ProbeRejected`) and never marks the
/// modality Unhealthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModalityProbe {
    /// The modality these settings apply to.
    pub modality: Modality,
    /// Public name (in `models[]`) of the model probed; default: the first model that lists
    /// this modality (or, for `text`, the first that lists none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,
    /// Voice asked for by `speech` probes. Speech APIs differ in their voices and some have no
    /// default, so a `speech` probe without a voice is not sent and is reported as a probe
    /// configuration problem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub voice: Option<String>,
    /// Successful probes slower than this mark the modality Degraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub latency_threshold: Option<String>,
    /// A probe not answered within this counts as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub timeout: Option<String>,
}

/// Observed state of an LLMProvider, written by the operator (or the standalone control loop).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LLMProviderStatus {
    /// Availability in [0, 1] computed by the PID controller from the last windows' outcomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability: Option<f64>,
    /// Outcome counts and score of the last completed window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_window: Option<WindowStatus>,
    /// Flap damping (RoutingPolicy `availability.flapHalfLife`): the decaying count of relapses,
    /// windows that failed outright after the provider had served again; absent = 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flap_penalty: Option<f64>,
    /// Flap damping holds this provider's recovery ramp at its first step (the penalty reached
    /// `flapSuppress` and has not yet decayed below `flapReuse`); absent = false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flap_suppressed: Option<bool>,
    /// Health per modality from active probes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["modality".into()]))]
    pub health: Vec<ModalityHealth>,
    /// When availability was last computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Standard conditions (`Ready`, `Degraded`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How far the operator's leader has counted each router replica's cumulative outcome
    /// counters for this provider (`crate::outcomes`), written with the window they fed. A
    /// leader that sees a replica for the first time (after its own start, a restart or a
    /// leader change) counts from here instead of taking a baseline, so no outcome is lost;
    /// a replica absent from the list was never counted and is counted from its start.
    /// Entries are keyed by replica name and start time (routers outside a cluster on one host
    /// share a name); replicas no longer listed by the router Service are dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["replica".into(), "startedAt".into()]))]
    #[schemars(length(max = 1024))]
    pub counted: Vec<ReplicaCounted>,
}

impl LLMProviderStatus {
    /// Sets `flapPenalty` (rounded to 4 decimals, absent at 0) and `flapSuppressed` (absent
    /// when false) from a controller's flap-damping state; the operator and the standalone
    /// router write them the same way.
    pub fn set_flap(&mut self, flap: FlapState) {
        let penalty = (flap.penalty * 10_000.0).round() / 10_000.0;
        self.flap_penalty = Some(penalty).filter(|p| p.is_finite() && *p > 0.0);
        self.flap_suppressed = Some(true).filter(|_| flap.suppressed);
    }

    /// The flap-damping state written by [`Self::set_flap`] (absent fields: 0 and false).
    pub fn flap(&self) -> FlapState {
        FlapState {
            penalty: self.flap_penalty.unwrap_or(0.0),
            suppressed: self.flap_suppressed.unwrap_or(false),
        }
    }
}

/// One router replica's counters for one provider as far as the leader has counted them
/// (the figures of that replica's `GET /outcomes`, `crate::outcomes::ProviderOutcomes`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaCounted {
    /// Replica identity as the router reports it (pod name, or host name outside a cluster).
    #[schemars(length(min = 1, max = 253))]
    pub replica: String,
    /// The replica process's start time (RFC 3339, as the router reports it); another start
    /// time means it restarted.
    #[schemars(length(min = 1, max = 64))]
    pub started_at: String,
    /// Successful attempts counted.
    #[serde(default)]
    pub successes: u64,
    /// Failed attempts counted, by error class name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Cancelled attempts counted.
    #[serde(default)]
    pub cancelled: u64,
    /// Successes counted as slow against the provider's latency baseline.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slow: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Outcome counts and score of one controller window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowStatus {
    /// Successful calls in the window.
    pub successes: u64,
    /// Provider-side errors in the window (capacity, overload, timeout, connect, server, auth).
    pub errors: u64,
    /// `successes − K·errors + 1`, with `K = 1 / targetErrorRate`.
    pub score: f64,
}

/// Health of one modality, from active probes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModalityHealth {
    /// The probed modality.
    pub modality: Modality,
    /// Probe verdict.
    pub state: HealthState,
    /// When the last probe finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// Human-readable detail of the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// CamelCase reason of the state (`ProbeSucceeded`, `ProbeSlow`, `ProbeFailed`,
    /// `ProbeRejected` for a probe the provider refused for its shape — a probe configuration
    /// problem, not unavailability — `Stale`, `NotProbed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Verdict of active health probes for one modality.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HealthState {
    /// Probes succeed within the latency threshold.
    Healthy,
    /// Probes succeed slowly or fail intermittently.
    Degraded,
    /// Consecutive probes failed.
    Unhealthy,
    /// No recent probe result; traffic is not filtered (fail-open).
    Unknown,
}

/// Reasons of `status.health[]` entries and of the `HealthProbesValid` condition.
pub mod health_reason {
    /// Provider condition: every probe sent was accepted in its shape (`True`), or some
    /// modality's probe was refused with a 4xx that points at the probe itself (`False`,
    /// reason [`PROBE_REJECTED`]). Unavailability never sets it to `False`.
    pub const CONDITION_PROBES_VALID: &str = "HealthProbesValid";
    /// The last conclusive probe succeeded within the latency threshold.
    pub const PROBE_SUCCEEDED: &str = "ProbeSucceeded";
    /// The last conclusive probe succeeded above the latency threshold.
    pub const PROBE_SLOW: &str = "ProbeSlow";
    /// The last conclusive probe failed (transport, timeout, 5xx, 401/403/408).
    pub const PROBE_FAILED: &str = "ProbeFailed";
    /// The provider refused the probe's own shape (a 4xx such as an unknown parameter, model
    /// or voice): a probe configuration problem; the state is left as the last conclusive
    /// probe made it (`Unknown` when there was none).
    pub const PROBE_REJECTED: &str = "ProbeRejected";
    /// The last conclusive probe is older than three intervals; the state reads `Unknown`.
    pub const STALE: &str = "Stale";
    /// No probe has finished yet.
    pub const NOT_PROBED: &str = "NotProbed";
}
