//! CustomResourceDefinitions generated from the Rust types, as written to `crds/`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{LLMProvider, RoutingPolicy, TenantQuota};

/// Every CRD with the file name it is written to under `crds/` (and the Helm chart's copy),
/// finished for the API server ([`finish`]).
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        (
            "llmproviders.switchyard.dev.yaml",
            finish(LLMProvider::crd()),
        ),
        (
            "routingpolicies.switchyard.dev.yaml",
            finish(RoutingPolicy::crd()),
        ),
        (
            "tenantquotas.switchyard.dev.yaml",
            finish(TenantQuota::crd()),
        ),
    ]
}

/// Integer formats that schemars derives from Rust types but the API server does not know:
/// it warns about each on every apply (`unrecognized format "uint64"`). The range they meant
/// is kept by `minimum` (schemars sets 0 for unsigned types), by a `maximum` for types
/// narrower than int64, and by the loader's int64 check.
const UNKNOWN_FORMATS: [&str; 8] = [
    "uint8", "uint16", "uint32", "uint64", "uint", "int8", "int16", "int",
];

/// The generated CRD made ready for the API server (issue 12 item 10):
/// - integer `format`s the server does not recognise are dropped ([`UNKNOWN_FORMATS`]);
/// - descriptions are one line per paragraph: rustdoc's wrapped lines are joined (otherwise
///   `kubectl explain` breaks sentences where the source wrapped), blank-line paragraph
///   breaks and list items stay.
pub fn finish(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.take())
        else {
            continue;
        };
        let finished = serde_json::to_value(&schema).ok().and_then(|mut value| {
            tidy(&mut value);
            serde_json::from_value(value).ok()
        });
        if let Some(s) = version.schema.as_mut() {
            s.open_api_v3_schema = Some(finished.unwrap_or(schema));
        }
    }
    crd
}

fn tidy(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let format = map
                .get("format")
                .and_then(|f| f.as_str())
                .filter(|f| UNKNOWN_FORMATS.contains(f))
                .map(str::to_owned);
            if let Some(format) = format {
                map.remove("format");
                // The Rust type's upper bound, where it is below int64's, becomes a `maximum`
                // the server enforces (the format only ever drew a warning).
                let max = match format.as_str() {
                    "uint8" => Some(u64::from(u8::MAX)),
                    "uint16" => Some(u64::from(u16::MAX)),
                    "uint32" => Some(u64::from(u32::MAX)),
                    _ => None,
                };
                if let Some(max) = max {
                    map.entry("maximum").or_insert_with(|| max.into());
                }
            }
            if let Some(serde_json::Value::String(d)) = map.get_mut("description") {
                *d = one_line_paragraphs(d);
            }
            for (key, child) in map.iter_mut() {
                // `default` and `enum` hold data, not schemas.
                if key != "default" && key != "enum" && key != "example" {
                    tidy(child);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// Joins the wrapped lines of each paragraph with a space; keeps blank lines between
/// paragraphs and a line break before list items (`- `, `* `, `1. `).
pub fn one_line_paragraphs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, paragraph) in text.split("\n\n").enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        for (j, line) in paragraph.lines().map(str::trim).enumerate() {
            if j > 0 {
                out.push(if is_list_item(line) { '\n' } else { ' ' });
            }
            out.push_str(line);
        }
    }
    out
}

fn is_list_item(line: &str) -> bool {
    line.starts_with("- ")
        || line.starts_with("* ")
        || line
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Renders one CRD as the YAML document committed under `crds/`.
///
/// # Errors
/// Fails only if serialisation fails, which the generated types do not cause.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    // k8s-openapi keeps `minimum`/`maximum` as f64 (`1.0`), the API server stores integers
    // (`1`): written as floats, a server-side apply of the same CRD conflicts with a client-side
    // one and GitOps tools show a diff that never goes away.
    let body = serde_yaml::to_string(&to_json(crd))?;
    Ok(format!(
        "# Generated by `cargo run -p switchyard -- crdgen`; do not edit.\n{body}"
    ))
}

/// The CRD as JSON with integral `minimum`/`maximum` as integers, as the API server stores
/// it (what [`to_yaml`] writes).
pub fn to_json(crd: &CustomResourceDefinition) -> serde_json::Value {
    let mut value = serde_json::to_value(crd).unwrap_or_default();
    integral_bounds(&mut value);
    value
}

/// Rewrites integral `minimum`/`maximum` values as JSON integers, everywhere in `value`.
fn integral_bounds(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "minimum" || key == "maximum" {
                    if let Some(f) = child
                        .as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    {
                        *child = serde_json::Value::from(f as i64);
                    }
                } else {
                    integral_bounds(child);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(integral_bounds),
        _ => {}
    }
}

/// The OpenAPI v3 schema of a CRD's first version as JSON (for client-side validation).
pub fn schema_json(crd: &CustomResourceDefinition) -> serde_json::Value {
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(serde_json::Value::Null)
}
