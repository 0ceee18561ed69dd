//! Validation of cluster objects: what makes an object `Ready=False` and why.
//!
//! Read → **validate** → compute → apply: this module is the pure validation step. It takes a
//! [`World`] (the watch caches of the three kinds plus the key names of the Secrets in scope)
//! and returns [`Verdicts`]: per object the problems that keep it from being `Ready`, and per
//! RoutingPolicy which of its providers are eligible.
//!
//! The checks are the standalone loader's, reused rather than rewritten:
//! 1. schema, unknown fields and CEL rules ([`switchyard_api::loader::ObjectValidator`]); the
//!    API server enforces them on admission, so in a cluster this only catches objects stored
//!    under an older, looser CRD;
//! 2. references across objects ([`switchyard_api::loader::check_references`]): a policy's
//!    providers exist and serve its model, public model names are claimed once, tenant parents
//!    exist without cycles, allowed routes exist, quota groups agree, time zones are known;
//! 3. Secrets, which only the cluster can answer: a provider's `credentials.secretRef` and a
//!    tenant's `apiKeys[].secretRef` name a Secret that exists and has the key. A policy
//!    inherits the Secret problems of the providers it lists (field case 29: the policy that was
//!    edited to use a provider with a missing Secret says so, naming the Secret).
//!
//! Reasons: `SecretNotFound` for Secrets, `DanglingReference` for a missing provider, parent or
//! route, `InvalidSpec` for everything else. The summary `Ready` condition carries the first
//! problem's reason and every problem's message. Each object is judged on its own: one broken
//! object never changes the verdict on an unrelated one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use switchyard_api::common::{SecretKeyRef, reason};
use switchyard_api::loader::{Manifests, ObjectValidator, check_references};
use switchyard_api::{LLMProvider, RoutingPolicy, TenantQuota};

/// One reason an object is not `Ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// CamelCase condition reason ([`switchyard_api::common::reason`]).
    pub reason: &'static str,
    /// Field path such as `spec.providers[0].name`, when one field is at fault.
    pub field: Option<String>,
    /// Human-readable explanation naming the missing or invalid thing.
    pub message: String,
}

impl Problem {
    /// `field: message`, or the message alone.
    pub fn describe(&self) -> String {
        match &self.field {
            Some(field) => format!("{field}: {}", self.message),
            None => self.message.clone(),
        }
    }
}

/// Key names of the Secrets in scope, by `(namespace, name)`. Values are never kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretIndex {
    keys: BTreeMap<(String, String), BTreeSet<String>>,
}

impl SecretIndex {
    /// Records (or replaces) the key names of one Secret; returns whether anything changed.
    pub fn insert(
        &mut self,
        namespace: &str,
        name: &str,
        keys: impl IntoIterator<Item = String>,
    ) -> bool {
        let keys: BTreeSet<String> = keys.into_iter().collect();
        let slot = (namespace.to_owned(), name.to_owned());
        if self.keys.get(&slot) == Some(&keys) {
            return false;
        }
        self.keys.insert(slot, keys);
        true
    }

    /// Forgets one Secret; returns whether it was known.
    pub fn remove(&mut self, namespace: &str, name: &str) -> bool {
        self.keys
            .remove(&(namespace.to_owned(), name.to_owned()))
            .is_some()
    }

    /// Number of Secrets known.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no Secret is known.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// `Ok` when `reference` resolves in `namespace`; otherwise the message naming what is
    /// missing (the Secret, or the key inside it).
    ///
    /// # Errors
    /// The message for a `SecretNotFound` condition.
    pub fn resolve(&self, namespace: &str, reference: &SecretKeyRef) -> Result<(), String> {
        match self
            .keys
            .get(&(namespace.to_owned(), reference.name.clone()))
        {
            None => Err(format!(
                "Secret {:?} not found in namespace {namespace:?}",
                reference.name
            )),
            Some(keys) if !keys.contains(&reference.key) => Err(format!(
                "Secret {:?} in namespace {namespace:?} has no key {:?}",
                reference.name, reference.key
            )),
            Some(_) => Ok(()),
        }
    }
}

/// Everything validation looks at: the watch caches and the Secret index.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// Every LLMProvider in scope.
    pub providers: Vec<Arc<LLMProvider>>,
    /// Every RoutingPolicy in scope.
    pub policies: Vec<Arc<RoutingPolicy>>,
    /// Every TenantQuota in scope.
    pub tenants: Vec<Arc<TenantQuota>>,
    /// Key names of the Secrets in scope.
    pub secrets: SecretIndex,
}

/// Whether one provider of a policy may take its traffic, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligibility {
    /// The LLMProvider name as listed in the policy.
    pub name: String,
    /// `namespace/name` of the provider (the key of its availability).
    pub key: String,
    /// Whether it may serve the policy.
    pub eligible: bool,
    /// Why not, when it may not.
    pub reason: Option<String>,
}

/// The validation result for a whole [`World`].
#[derive(Debug, Clone, Default)]
pub struct Verdicts {
    problems: BTreeMap<String, Vec<Problem>>,
    entries: BTreeMap<String, Vec<Eligibility>>,
}

impl Verdicts {
    /// The problems of one object, keyed as `Kind namespace/name`; empty when it is valid.
    pub fn problems(&self, kind: &str, namespace: &str, name: &str) -> &[Problem] {
        self.problems
            .get(&object_key(kind, namespace, name))
            .map_or(&[], Vec::as_slice)
    }

    /// The providers of one policy in priority order with their eligibility.
    pub fn entries(&self, namespace: &str, name: &str) -> &[Eligibility] {
        self.entries
            .get(&format!("{namespace}/{name}"))
            .map_or(&[], Vec::as_slice)
    }
}

fn object_key(kind: &str, namespace: &str, name: &str) -> String {
    format!("{kind} {namespace}/{name}")
}

fn ns_of<K: kube::Resource>(o: &K) -> String {
    o.namespace().unwrap_or_else(|| "default".to_owned())
}

/// Validates every object of `world` (see the module docs).
pub fn validate(world: &World, validator: &SchemaChecker) -> Verdicts {
    let mut problems: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
    let mut push = |kind: &str, ns: &str, name: &str, p: Problem| {
        problems
            .entry(object_key(kind, ns, name))
            .or_default()
            .push(p);
    };

    // 1. Schema and CEL, one object at a time (cached per generation; deleted objects dropped).
    let keys: BTreeSet<String> = world
        .providers
        .iter()
        .map(|p| object_key("LLMProvider", &ns_of(&**p), &p.name_any()))
        .chain(
            world
                .policies
                .iter()
                .map(|p| object_key("RoutingPolicy", &ns_of(&**p), &p.name_any())),
        )
        .chain(
            world
                .tenants
                .iter()
                .map(|t| object_key("TenantQuota", &ns_of(&**t), &t.name_any())),
        )
        .collect();
    validator.retain(&keys);
    for p in &world.providers {
        for problem in validator.problems("LLMProvider", &**p) {
            push("LLMProvider", &ns_of(&**p), &p.name_any(), problem);
        }
    }
    for p in &world.policies {
        for problem in validator.problems("RoutingPolicy", &**p) {
            push("RoutingPolicy", &ns_of(&**p), &p.name_any(), problem);
        }
    }
    for t in &world.tenants {
        for problem in validator.problems("TenantQuota", &**t) {
            push("TenantQuota", &ns_of(&**t), &t.name_any(), problem);
        }
    }

    // 2. References, with the loader's checks.
    let manifests = Manifests {
        providers: world.providers.iter().map(|p| (**p).clone()).collect(),
        policies: world.policies.iter().map(|p| (**p).clone()).collect(),
        tenants: world.tenants.iter().map(|t| (**t).clone()).collect(),
        ..Manifests::default()
    };
    for error in check_references(&manifests) {
        let Some(object) = error.object else { continue };
        let why = if error.reason.contains("not found") {
            reason::DANGLING_REFERENCE
        } else {
            reason::INVALID_SPEC
        };
        problems.entry(object).or_default().push(Problem {
            reason: why,
            field: error.field,
            message: error.reason,
        });
    }

    // The adapter's own settings checks, shared with the router; skipped for an object the
    // schema already refused (its settings are reported there, once).
    let unusable: Vec<(String, String, String)> = world
        .providers
        .iter()
        .filter(|p| {
            problems
                .get(&object_key("LLMProvider", &ns_of(&***p), &p.name_any()))
                .is_none_or(Vec::is_empty)
        })
        .filter_map(|p| {
            let message = switchyard_providers::adapter::check_spec(&p.spec).err()?;
            Some((ns_of(&**p), p.name_any(), message))
        })
        .collect();

    // 3. Secrets.
    let mut push = |kind: &str, ns: &str, name: &str, p: Problem| {
        problems
            .entry(object_key(kind, ns, name))
            .or_default()
            .push(p);
    };
    let mut secret_problem: BTreeMap<String, String> = BTreeMap::new();
    for p in &world.providers {
        let ns = ns_of(&**p);
        if let Some(c) = &p.spec.credentials
            && let Err(message) = world.secrets.resolve(&ns, &c.secret_ref)
        {
            secret_problem.insert(format!("{ns}/{}", p.name_any()), message.clone());
            push(
                "LLMProvider",
                &ns,
                &p.name_any(),
                Problem {
                    reason: reason::SECRET_NOT_FOUND,
                    field: Some("spec.credentials.secretRef".to_owned()),
                    message,
                },
            );
        }
    }
    for p in &world.providers {
        let ns = ns_of(&**p);
        let extra = p.spec.credentials.iter().flat_map(|c| {
            [
                ("spec.credentials.accessKeyIdRef", &c.access_key_id_ref),
                ("spec.credentials.sessionTokenRef", &c.session_token_ref),
            ]
        });
        for (field, r) in extra {
            if let Some(r) = r
                && let Err(message) = world.secrets.resolve(&ns, r)
            {
                push(
                    "LLMProvider",
                    &ns,
                    &p.name_any(),
                    Problem {
                        reason: reason::SECRET_NOT_FOUND,
                        field: Some(field.to_owned()),
                        message,
                    },
                );
            }
        }
    }
    for (ns, name, message) in unusable {
        push(
            "LLMProvider",
            &ns,
            &name,
            Problem {
                reason: reason::PROVIDER_UNUSABLE,
                field: Some("spec".to_owned()),
                message,
            },
        );
    }
    for t in &world.tenants {
        let ns = ns_of(&**t);
        for (i, key) in t.spec.api_keys.iter().enumerate() {
            if let Err(message) = world.secrets.resolve(&ns, &key.secret_ref) {
                push(
                    "TenantQuota",
                    &ns,
                    &t.name_any(),
                    Problem {
                        reason: reason::SECRET_NOT_FOUND,
                        field: Some(format!("spec.apiKeys[{i}].secretRef")),
                        message,
                    },
                );
            }
        }
    }
    for policy in &world.policies {
        let ns = ns_of(&**policy);
        for (i, entry) in policy.spec.providers.iter().enumerate() {
            if let Some(message) = secret_problem.get(&format!("{ns}/{}", entry.name)) {
                push(
                    "RoutingPolicy",
                    &ns,
                    &policy.name_any(),
                    Problem {
                        reason: reason::SECRET_NOT_FOUND,
                        field: Some(format!("spec.providers[{i}]")),
                        message: format!("LLMProvider {:?}: {message}", entry.name),
                    },
                );
            }
        }
    }

    let entries = eligibility(world, &problems);
    Verdicts { problems, entries }
}

/// The loader's schema and CEL checks, with results kept per object and `metadata.generation`
/// (only a spec change moves the generation, and only the spec is checked), so a resync of
/// every object does not re-run every CEL rule.
pub struct SchemaChecker {
    validator: ObjectValidator,
    cache: Mutex<HashMap<String, (i64, Vec<Problem>)>>,
}

impl std::fmt::Debug for SchemaChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SchemaChecker")
    }
}

impl Default for SchemaChecker {
    fn default() -> Self {
        SchemaChecker {
            validator: ObjectValidator::new(),
            cache: Mutex::new(HashMap::new()),
        }
    }
}

impl SchemaChecker {
    /// Compiles the validators; the cache starts empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the results of objects whose keys (`Kind namespace/name`) are not in `keep`.
    fn retain(&self, keep: &BTreeSet<String>) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|k, _| keep.contains(k));
    }

    /// The schema and CEL problems of `object` (a `kind`).
    pub fn problems<K: serde::Serialize + kube::Resource>(
        &self,
        kind: &str,
        object: &K,
    ) -> Vec<Problem> {
        let key = object_key(kind, &ns_of(object), &object.name_any());
        let generation = object.meta().generation;
        if let Some(generation) = generation
            && let Some((seen, problems)) = self
                .cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&key)
            && *seen == generation
        {
            return problems.clone();
        }
        let problems = schema_problems(&self.validator, object);
        if let Some(generation) = generation {
            self.cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, (generation, problems.clone()));
        }
        problems
    }
}

fn schema_problems<K: serde::Serialize>(validator: &ObjectValidator, object: &K) -> Vec<Problem> {
    let mut value = match serde_json::to_value(object) {
        Ok(v) => v,
        Err(e) => {
            return vec![Problem {
                reason: reason::INVALID_SPEC,
                field: None,
                message: format!("failed to encode the object: {e}"),
            }];
        }
    };
    // Status is ours and metadata the API server's; only the spec is the user's to get wrong.
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        map.remove("metadata");
    }
    validator
        .check(&value)
        .into_iter()
        .map(|p| Problem {
            reason: reason::INVALID_SPEC,
            field: p.field,
            message: p.reason,
        })
        .collect()
}

/// Per policy, per listed provider: may it take traffic? Mirrors the standalone router's
/// route building (exists, its own spec and Secret are fine, serves the model, within the
/// allowed regions), so both modes show the same `eligible` flags.
fn eligibility(
    world: &World,
    problems: &BTreeMap<String, Vec<Problem>>,
) -> BTreeMap<String, Vec<Eligibility>> {
    let providers: BTreeMap<(String, String), &LLMProvider> = world
        .providers
        .iter()
        .map(|p| ((ns_of(&**p), p.name_any()), &**p))
        .collect();
    let mut out = BTreeMap::new();
    for policy in &world.policies {
        let ns = ns_of(&**policy);
        let list = policy
            .spec
            .providers
            .iter()
            .map(|entry| {
                let key = format!("{ns}/{}", entry.name);
                let model = entry.model.as_deref().unwrap_or(&policy.spec.model);
                let why = match providers.get(&(ns.clone(), entry.name.clone())) {
                    None => Some(format!(
                        "LLMProvider {:?} not found in namespace {ns:?}",
                        entry.name
                    )),
                    Some(p) => {
                        let own = problems
                            .get(&object_key("LLMProvider", &ns, &entry.name))
                            .and_then(|v| v.first());
                        if let Some(problem) = own {
                            Some(problem.message.clone())
                        } else if !p.spec.models.iter().any(|m| m.name == model) {
                            Some(format!("does not serve model {model:?}"))
                        } else if !within_regions(p, &policy.spec.allowed_regions) {
                            Some(format!(
                                "execution regions {:?} are not all within the allowed regions {:?}",
                                execution_regions(p),
                                policy.spec.allowed_regions
                            ))
                        } else {
                            None
                        }
                    }
                };
                Eligibility {
                    name: entry.name.clone(),
                    key,
                    eligible: why.is_none(),
                    reason: why,
                }
            })
            .collect();
        out.insert(format!("{ns}/{}", policy.name_any()), list);
    }
    out
}

fn execution_regions(p: &LLMProvider) -> Vec<String> {
    if p.spec.execution_regions.is_empty() {
        p.spec.region.iter().cloned().collect()
    } else {
        p.spec.execution_regions.clone()
    }
}

fn within_regions(p: &LLMProvider, allowed: &[String]) -> bool {
    let regions = execution_regions(p);
    allowed.is_empty() || (!regions.is_empty() && regions.iter().all(|r| allowed.contains(r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(value: serde_json::Value) -> Arc<LLMProvider> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn validate_schema_invalid_stored_object_is_invalid_spec() {
        // Stored under an older CRD: the endpoint pattern is not met.
        let bad = provider(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": "bad", "namespace": "ns", "generation": 2, "uid": "u",
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"api": "openai", "endpoint": "not a url", "models": [{"name": "m"}]},
            "status": {"availability": 0.5},
        }));
        let good = provider(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": "good", "namespace": "ns", "uid": "v"},
            "spec": {"api": "openai", "endpoint": "https://ok.example.com", "models": [{"name": "m"}]},
            "status": {"availability": 0.5},
        }));
        let world = World {
            providers: vec![bad, good],
            ..World::default()
        };
        let verdicts = validate(&world, &SchemaChecker::new());
        let problems = verdicts.problems("LLMProvider", "ns", "bad");
        assert!(!problems.is_empty());
        assert!(problems.iter().all(|p| p.reason == reason::INVALID_SPEC));
        assert!(
            problems
                .iter()
                .any(|p| p.field.as_deref() == Some("spec.endpoint")),
            "{problems:?}"
        );
        assert!(verdicts.problems("LLMProvider", "ns", "good").is_empty());
    }

    #[test]
    fn secret_index_resolve_names_missing_secret_or_key() {
        let mut index = SecretIndex::default();
        assert!(index.insert("ns", "s", ["k".to_owned()]));
        assert!(
            !index.insert("ns", "s", ["k".to_owned()]),
            "same keys: no change"
        );
        let r = |name: &str, key: &str| SecretKeyRef {
            name: name.into(),
            key: key.into(),
        };
        assert_eq!(index.resolve("ns", &r("s", "k")), Ok(()));
        assert_eq!(
            index.resolve("ns", &r("s", "x")).unwrap_err(),
            "Secret \"s\" in namespace \"ns\" has no key \"x\""
        );
        assert_eq!(
            index.resolve("other", &r("s", "k")).unwrap_err(),
            "Secret \"s\" not found in namespace \"other\""
        );
        assert!(index.remove("ns", "s"));
        assert!(index.is_empty());
    }
}
