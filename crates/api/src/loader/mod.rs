//! Manifest loader for the embedded default (standalone mode).
//!
//! Reads a folder of multi-document YAML — the same files a user would `kubectl apply` — keeps
//! the Switchyard kinds (other kinds are skipped with a warning) and validates each object the
//! way the API server would before accepting it:
//!
//! 1. object metadata (name and namespace as RFC 1123 names);
//! 2. the CRD's OpenAPI schema: types, bounds, enums, patterns ([`schema`]);
//! 3. unknown fields, as with `kubectl apply --validate=strict` ([`schema`]);
//! 4. the same CEL `x-kubernetes-validations` rules the API server runs, evaluated client-side
//!    with `kube-cel` ([`schema`]);
//! 5. what a cluster checks only at reconcile time: references between objects, parent cycles,
//!    quota groups that disagree, time zones ([`refs`]).
//!
//! Every problem is collected, not only the first, and each names the file, the document index,
//! the object, the field path and the reason.

mod refs;
mod schema;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::common::GROUP;
use crate::{LLMProvider, RoutingPolicy, TenantQuota};

/// Where an object came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// File the document was read from.
    pub file: PathBuf,
    /// Zero-based index of the document within the file.
    pub document: usize,
}

/// One problem found in the manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// Where the offending document is.
    pub source: Source,
    /// The object, as `Kind namespace/name`, when it could be identified.
    pub object: Option<String>,
    /// Field path such as `spec.limits[0].period`, when the problem is in one field.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (document {})",
            self.source.file.display(),
            self.source.document
        )?;
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Every problem found in one load, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadErrors(pub Vec<ManifestError>);

impl fmt::Display for LoadErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} problem(s) in the manifests:", self.0.len())?;
        for error in &self.0 {
            writeln!(f, "  {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadErrors {}

/// A validated set of Switchyard objects.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// LLMProviders, in file order.
    pub providers: Vec<LLMProvider>,
    /// RoutingPolicies, in file order.
    pub policies: Vec<RoutingPolicy>,
    /// TenantQuotas, in file order.
    pub tenants: Vec<TenantQuota>,
    /// Where each object came from, keyed by `Kind namespace/name`.
    pub sources: BTreeMap<String, Source>,
    /// Non-fatal notes, such as skipped documents of other kinds.
    pub warnings: Vec<String>,
}

/// The Switchyard kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Provider,
    Policy,
    Tenant,
}

impl Kind {
    fn from_name(kind: &str) -> Option<Kind> {
        match kind {
            "LLMProvider" => Some(Kind::Provider),
            "RoutingPolicy" => Some(Kind::Policy),
            "TenantQuota" => Some(Kind::Tenant),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Provider => "LLMProvider",
            Kind::Policy => "RoutingPolicy",
            Kind::Tenant => "TenantQuota",
        }
    }
}

/// Loads and validates every `*.yaml`/`*.yml` file directly inside `dir`, in name order.
///
/// # Errors
/// Returns every problem found (unreadable files, YAML syntax, schema, unknown fields, CEL rules,
/// references); nothing is returned partially.
pub fn load_dir(dir: &Path) -> Result<Manifests, LoadErrors> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        LoadErrors(vec![ManifestError {
            source: Source {
                file: dir.to_path_buf(),
                document: 0,
            },
            object: None,
            field: None,
            reason: format!("failed to read the manifest folder: {e}"),
        }])
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    let mut texts = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => texts.push((file, text)),
            Err(e) => errors.push(ManifestError {
                source: Source { file, document: 0 },
                object: None,
                field: None,
                reason: format!("failed to read file: {e}"),
            }),
        }
    }
    let loaded = load_texts(texts.iter().map(|(f, t)| (f.as_path(), t.as_str())));
    match loaded {
        Ok(m) if errors.is_empty() => Ok(m),
        Ok(_) => Err(LoadErrors(errors)),
        Err(LoadErrors(more)) => {
            errors.extend(more);
            Err(LoadErrors(errors))
        }
    }
}

/// Loads and validates manifests given as `(file label, YAML text)` pairs.
///
/// # Errors
/// As [`load_dir`].
pub fn load_texts<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a str)>,
) -> Result<Manifests, LoadErrors> {
    let mut out = Manifests::default();
    let mut errors = Vec::new();
    let validators = schema::Validators::new();
    for (file, text) in files {
        for (document, parsed) in split_documents(text).into_iter().enumerate() {
            let source = Source {
                file: file.to_path_buf(),
                document,
            };
            let value = match parsed {
                Ok(Some(value)) => value,
                Ok(None) => continue,
                Err(reason) => {
                    errors.push(ManifestError {
                        source,
                        object: None,
                        field: None,
                        reason,
                    });
                    continue;
                }
            };
            load_document(&validators, source, value, &mut out, &mut errors);
        }
    }
    refs::check(&out, &mut errors);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(LoadErrors(errors))
    }
}

/// The checks across objects that only a reconciler can make (the API server sees one object at
/// a time): a policy's providers exist and serve its model, each public model name is claimed
/// once per namespace, tenant parents exist without cycles, allowed routes exist, providers of a
/// quota group declare the same bucket, time zones are known.
///
/// For callers that already hold decoded objects, such as the operator's watch caches: put them
/// in a [`Manifests`] (sources may stay empty) and group the returned problems by
/// [`ManifestError::object`] (`Kind namespace/name`). Secrets are not checked here; the loader
/// has none and the operator checks them against the cluster.
pub fn check_references(m: &Manifests) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    refs::check(m, &mut errors);
    errors
}

/// One schema or CEL problem of one object, from [`ObjectValidator::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    /// Field path such as `spec.limits[0].period`, when the problem is in one field.
    pub field: Option<String>,
    /// What is wrong (the CEL rule's message for CEL rules).
    pub reason: String,
}

/// The loader's per-object validation (OpenAPI schema, unknown fields, CEL rules of the
/// generated CRDs), compiled once and usable on objects one at a time.
///
/// The API server enforces the same rules on admission; a reconciler re-checks objects that
/// were stored under an older CRD version, before the rules tightened.
pub struct ObjectValidator(schema::Validators);

impl fmt::Debug for ObjectValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ObjectValidator")
    }
}

impl Default for ObjectValidator {
    fn default() -> Self {
        ObjectValidator(schema::Validators::new())
    }
}

impl ObjectValidator {
    /// Compiles the schemas and CEL rules of the three kinds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every schema, unknown-field and CEL problem of `value`, an object as JSON with `kind`
    /// set to one of the three Switchyard kinds. An unknown kind is one problem; `metadata` is
    /// not checked (the API server owns it).
    pub fn check(&self, value: &serde_json::Value) -> Vec<FieldProblem> {
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let Some(kind) = Kind::from_name(kind) else {
            return vec![FieldProblem {
                field: Some("kind".to_owned()),
                reason: format!("unknown kind {kind:?} in group {GROUP}"),
            }];
        };
        self.0
            .check(kind, value)
            .into_iter()
            .map(|p| FieldProblem {
                field: p.field,
                reason: p.reason,
            })
            .collect()
    }
}

/// Parses a multi-document YAML text into JSON values; `Ok(None)` for empty documents.
fn split_documents(text: &str) -> Vec<Result<Option<serde_json::Value>, String>> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        match serde_yaml::Value::deserialize(document) {
            Ok(serde_yaml::Value::Null) => out.push(Ok(None)),
            Ok(value) => out.push(
                serde_json::to_value(&value)
                    .map(Some)
                    .map_err(|e| format!("document is not representable as JSON: {e}")),
            ),
            Err(e) => {
                // A syntax error ends the stream: the parser cannot find the next document.
                out.push(Err(format!("invalid YAML: {e}")));
                break;
            }
        }
    }
    out
}

fn load_document(
    validators: &schema::Validators,
    source: Source,
    mut value: serde_json::Value,
    out: &mut Manifests,
    errors: &mut Vec<ManifestError>,
) {
    schema::normalize_numbers(&mut value);
    let api_version = value
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let kind_name = value
        .get("kind")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let here = |reason: String, field: Option<&str>| ManifestError {
        source: source.clone(),
        object: None,
        field: field.map(str::to_owned),
        reason,
    };
    if api_version.is_empty() || kind_name.is_empty() {
        errors.push(here("apiVersion and kind are required".to_owned(), None));
        return;
    }
    if group != GROUP {
        out.warnings.push(format!(
            "{} (document {}): skipped {kind_name} of {api_version}: not a Switchyard resource",
            source.file.display(),
            source.document
        ));
        return;
    }
    let Some(kind) = Kind::from_name(kind_name) else {
        errors.push(here(
            format!("unknown kind {kind_name:?} in group {GROUP}"),
            Some("kind"),
        ));
        return;
    };
    if version != crate::common::VERSION {
        errors.push(here(
            format!(
                "unsupported version {version:?} of {kind_name}; this build serves {}",
                crate::common::VERSION
            ),
            Some("apiVersion"),
        ));
        return;
    }
    let name = value
        .pointer("/metadata/name")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("default")
        .to_owned();
    let object = format!("{} {namespace}/{name}", kind.name());
    let mut problems = schema::check_metadata(&value);
    problems.extend(validators.check(kind, &value));
    if problems.is_empty()
        && let Some(previous) = out.sources.get(&object)
    {
        // The first definition stays the one checked and attributed: later problems of the
        // object (its references) name the file that defined it first.
        problems.push(schema::Problem {
            field: Some("metadata.name".to_owned()),
            reason: format!(
                "duplicate object: already defined in {} (document {}){}",
                previous.file.display(),
                previous.document,
                refs::CLIENT_SIDE
            ),
        });
    } else if problems.is_empty() {
        let key = object.clone();
        let result = match kind {
            Kind::Provider => {
                decode::<LLMProvider>(value, &namespace).map(|o| out.providers.push(o))
            }
            Kind::Policy => {
                decode::<RoutingPolicy>(value, &namespace).map(|o| out.policies.push(o))
            }
            Kind::Tenant => decode::<TenantQuota>(value, &namespace).map(|o| out.tenants.push(o)),
        };
        match result {
            Ok(()) => {
                out.sources.insert(key, source.clone());
            }
            Err(reason) => problems.push(schema::Problem {
                field: None,
                reason,
            }),
        }
    }
    errors.extend(problems.into_iter().map(|p| ManifestError {
        source: source.clone(),
        object: Some(object.clone()),
        field: p.field,
        reason: p.reason,
    }));
}

fn decode<T: DeserializeOwned + kube::Resource>(
    mut value: serde_json::Value,
    namespace: &str,
) -> Result<T, String> {
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.entry("namespace").or_insert_with(|| namespace.into());
    }
    serde_json::from_value(value).map_err(|e| format!("failed to decode: {e}"))
}
