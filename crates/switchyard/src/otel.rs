//! OpenTelemetry trace export, configured by the standard `OTEL_*` environment variables.
//!
//! Off unless an endpoint is set (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) and neither `OTEL_SDK_DISABLED=true` nor
//! `OTEL_TRACES_EXPORTER=none` says otherwise. When on, the spans of
//! `switchyard_router::telemetry` go through a batch span processor to an OTLP/HTTP collector
//! as protobuf; `OTEL_EXPORTER_OTLP_*_HEADERS`, `*_TIMEOUT`, `OTEL_BSP_*`,
//! `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_SERVICE_NAME` (default `switchyard`) and
//! `OTEL_RESOURCE_ATTRIBUTES` are read by the SDK as the specification says.
//!
//! What this build cannot honour is refused at start, never dropped: another exporter than
//! `otlp`, another protocol than `http/protobuf` (no gRPC or JSON transport is built in), and an
//! `https://` endpoint (the exporter has no TLS here: export to a collector on the pod's own
//! network, e.g. an agent or sidecar on `http://localhost:4318`).

use std::env;

use anyhow::{Context as _, bail};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// Where and how spans are exported, read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtelConfig {
    /// The collector endpoint as configured (the SDK adds `/v1/traces` to a base endpoint).
    pub endpoint: String,
}

/// Reads the `OTEL_*` variables through `var` (the process environment in [`init`]).
///
/// Returns `Ok(None)` when export is off.
///
/// Errors: an exporter, protocol or endpoint scheme this build cannot honour (module docs).
pub(crate) fn config_from(
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<OtelConfig>> {
    let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => bail!(
            "OTEL_TRACES_EXPORTER={other:?} is not supported: this build exports traces with \"otlp\" (or \"none\")"
        ),
    }
    let Some(endpoint) =
        var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(None);
    };
    let protocol =
        var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(p) = protocol.as_deref().map(str::trim)
        && p != "http/protobuf"
    {
        bail!(
            "OTLP protocol {p:?} is not supported: this build exports over \"http/protobuf\" (port 4318 on a collector)"
        );
    }
    let endpoint = endpoint.trim().to_owned();
    if endpoint.starts_with("https://") {
        bail!(
            "OTLP endpoint {endpoint:?}: https is not supported by this build's exporter; send to a collector on the local network over http:// (e.g. http://localhost:4318)"
        );
    }
    if !endpoint.starts_with("http://") {
        bail!("OTLP endpoint {endpoint:?} must be an http:// URL");
    }
    Ok(Some(OtelConfig { endpoint }))
}

/// The exporting tracer provider; dropping it flushes what is queued and stops the export
/// thread.
#[derive(Debug)]
pub(crate) struct Otel {
    provider: SdkTracerProvider,
}

impl Otel {
    /// The tracer the `tracing` layer writes to.
    pub(crate) fn tracer(&self) -> opentelemetry_sdk::trace::Tracer {
        self.provider.tracer("switchyard")
    }
}

impl Drop for Otel {
    fn drop(&mut self) {
        // Shutdown flushes the batch; an unreachable collector only loses spans.
        let _ = self.provider.shutdown();
    }
}

/// Starts the exporter when the environment asks for one (see [`config_from`]).
///
/// Errors: as [`config_from`], or when the exporter cannot be built.
pub(crate) fn init() -> anyhow::Result<Option<Otel>> {
    let Some(config) = config_from(|name| env::var(name).ok())? else {
        return Ok(None);
    };
    // The SDK reads the endpoint variables itself; the protocol is fixed to what is built.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .with_context(|| format!("failed to build the OTLP exporter for {}", config.endpoint))?;
    let mut resource = Resource::builder();
    if env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("switchyard");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    Ok(Some(Otel { provider }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> anyhow::Result<Option<OtelConfig>> {
        config_from(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn export_is_off_without_an_endpoint_or_when_disabled() {
        assert_eq!(config(&[]).ok().flatten(), None);
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
        assert_eq!(
            config(&on).ok().flatten().map(|c| c.endpoint).as_deref(),
            Some("http://127.0.0.1:4318")
        );
        for off in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert_eq!(config(&[on[0], off]).ok().flatten(), None, "{off:?}");
        }
    }

    #[test]
    fn what_this_build_cannot_honour_is_refused() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        for bad in [
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
        ] {
            assert!(config(&[endpoint, bad]).is_err(), "{bad:?}");
        }
        let https = [(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://collector:4318",
        )];
        let e = config(&https)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("https"), "{e}");
        let ok = [endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")];
        assert!(matches!(config(&ok), Ok(Some(_))));
    }
}
