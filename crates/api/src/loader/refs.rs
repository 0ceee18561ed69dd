//! Checks across objects: what the API server cannot see, but the operator reports as
//! `Ready=False` and the standalone loader refuses.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::{Kind, ManifestError, Manifests, Source};
use crate::common::Limit;

/// Appended to the reasons of checks the API server cannot make (it sees one object at a
/// time), so a user reading a refusal knows a `kubectl apply` would have been accepted and the
/// object would have been reported `Ready=False` instead.
pub(crate) const CLIENT_SIDE: &str = " (checked by switchyard, not the API server)";

/// Appends every reference problem of `m` to `errors`.
pub(crate) fn check(m: &Manifests, errors: &mut Vec<ManifestError>) {
    let mut push = |kind: Kind, ns: &str, name: &str, field: String, reason: String| {
        let object = format!("{} {ns}/{name}", kind.name());
        let source = m.sources.get(&object).cloned().unwrap_or(Source {
            file: Default::default(),
            document: 0,
        });
        errors.push(ManifestError {
            source,
            object: Some(object),
            field: Some(field),
            reason: format!("{reason}{CLIENT_SIDE}"),
        });
    };

    let providers: BTreeMap<(String, String), &crate::LLMProvider> = m
        .providers
        .iter()
        .map(|p| ((p.namespace().unwrap_or_default(), p.name_any()), p))
        .collect();
    let policy_names: BTreeSet<(String, String)> = m
        .policies
        .iter()
        .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
        .collect();

    // Policies: providers exist and serve the model; model names and aliases are unique.
    let mut claimed: BTreeMap<(String, String), String> = BTreeMap::new();
    for policy in &m.policies {
        let ns = policy.namespace().unwrap_or_default();
        let name = policy.name_any();
        for (i, entry) in policy.spec.providers.iter().enumerate() {
            match providers.get(&(ns.clone(), entry.name.clone())) {
                None => push(
                    Kind::Policy,
                    &ns,
                    &name,
                    format!("spec.providers[{i}].name"),
                    format!("LLMProvider {:?} not found in namespace {ns:?}", entry.name),
                ),
                Some(provider) => {
                    let model = entry.model.as_deref().unwrap_or(&policy.spec.model);
                    if !provider.spec.models.iter().any(|m| m.name == model) {
                        push(
                            Kind::Policy,
                            &ns,
                            &name,
                            format!("spec.providers[{i}]"),
                            format!(
                                "LLMProvider {:?} does not serve model {model:?}",
                                entry.name
                            ),
                        );
                    }
                }
            }
        }
        for (j, public) in std::iter::once(&policy.spec.model)
            .chain(&policy.spec.aliases)
            .enumerate()
        {
            if let Some(other) = claimed.insert((ns.clone(), public.clone()), name.clone()) {
                let field = if j == 0 {
                    "spec.model".to_owned()
                } else {
                    format!("spec.aliases[{}]", j - 1)
                };
                push(
                    Kind::Policy,
                    &ns,
                    &name,
                    field,
                    format!("model name {public:?} is already served by RoutingPolicy {other:?}"),
                );
            }
        }
        check_time_zones(&policy.spec.limits, |field, reason| {
            push(Kind::Policy, &ns, &name, field, reason)
        });
    }

    // Tenants: parents exist, no cycles, routes exist.
    let parents: BTreeMap<(String, String), Option<String>> = m
        .tenants
        .iter()
        .map(|t| {
            (
                (t.namespace().unwrap_or_default(), t.name_any()),
                t.spec.parent.clone(),
            )
        })
        .collect();
    for tenant in &m.tenants {
        let ns = tenant.namespace().unwrap_or_default();
        let name = tenant.name_any();
        if let Some(parent) = &tenant.spec.parent {
            if !parents.contains_key(&(ns.clone(), parent.clone())) {
                push(
                    Kind::Tenant,
                    &ns,
                    &name,
                    "spec.parent".to_owned(),
                    format!("parent TenantQuota {parent:?} not found in namespace {ns:?}"),
                );
            } else if let Some(cycle) = parent_cycle(&parents, &ns, &name) {
                push(
                    Kind::Tenant,
                    &ns,
                    &name,
                    "spec.parent".to_owned(),
                    format!("parent cycle: {}", cycle.join(" -> ")),
                );
            }
        }
        for (i, route) in tenant.spec.allowed_routes.iter().enumerate() {
            if !policy_names.contains(&(ns.clone(), route.clone())) {
                push(
                    Kind::Tenant,
                    &ns,
                    &name,
                    format!("spec.allowedRoutes[{i}]"),
                    format!("RoutingPolicy {route:?} not found in namespace {ns:?}"),
                );
            }
        }
        check_time_zones(&tenant.spec.limits, |field, reason| {
            push(Kind::Tenant, &ns, &name, field, reason)
        });
    }

    // Quota groups: every provider naming a group declares the same bucket for it.
    let mut groups: BTreeMap<(String, String, String), (String, &Limit)> = BTreeMap::new();
    for provider in &m.providers {
        let ns = provider.namespace().unwrap_or_default();
        let name = provider.name_any();
        for (i, limit) in provider.spec.limits.iter().enumerate() {
            let Some(group) = &limit.quota_group else {
                continue;
            };
            let dimension = format!("{:?}", limit.dimension);
            let key = (ns.clone(), group.clone(), dimension.clone());
            match groups.get(&key) {
                Some((first, seen)) if !same_bucket(seen, limit) => push(
                    Kind::Provider,
                    &ns,
                    &name,
                    format!("spec.limits[{i}]"),
                    format!(
                        "quota group {group:?} declares its {} limit differently here than on \
                         LLMProvider {first:?}; providers sharing a quota must declare the same \
                         amount, rule and period",
                        crate::loader::refs::dimension_name(limit)
                    ),
                ),
                Some(_) => {}
                None => {
                    groups.insert(key, (name.clone(), limit));
                }
            }
        }
        check_time_zones(&provider.spec.limits, |field, reason| {
            push(Kind::Provider, &ns, &name, field, reason)
        });
    }
}

fn dimension_name(limit: &Limit) -> String {
    serde_json::to_value(limit.dimension)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn same_bucket(a: &Limit, b: &Limit) -> bool {
    a.amount == b.amount && a.rule == b.rule && a.period == b.period && a.reset_at == b.reset_at
}

/// Every limit must build into a bucket ([`Limit::bucket`], the verdict the router uses):
/// what the schema cannot express (a period beyond the duration range, a reset time on a
/// window that is not whole days, an unknown time zone) is refused here, not at run time.
fn check_time_zones(limits: &[Limit], mut push: impl FnMut(String, String)) {
    for (i, limit) in limits.iter().enumerate() {
        let scope = switchyard_core::quota::Scope::Route(String::new());
        if let Err(reason) = limit.bucket(String::new(), scope) {
            // The verdict's sentences start with the field they are about.
            let field = ["period", "resetAt", "timeZone"]
                .into_iter()
                .find(|f| reason.starts_with(f));
            let path = match field {
                Some(f) => format!("spec.limits[{i}].{f}"),
                None => format!("spec.limits[{i}]"),
            };
            push(path, reason);
        }
    }
}

/// The chain of names from `start` back to itself, when following parents loops.
fn parent_cycle(
    parents: &BTreeMap<(String, String), Option<String>>,
    ns: &str,
    start: &str,
) -> Option<Vec<String>> {
    let mut chain = vec![start.to_owned()];
    let mut current = start.to_owned();
    while let Some(Some(parent)) = parents.get(&(ns.to_owned(), current.clone())) {
        chain.push(parent.clone());
        if parent == start {
            return Some(chain);
        }
        if chain.len() > parents.len() + 1 {
            // A loop that does not pass through `start`; reported on its own members.
            return None;
        }
        current = parent.clone();
    }
    None
}
