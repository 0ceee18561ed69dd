//! Weighted priority tiers in the router (issue 18 item 4): a policy's `priority` and `weight`
//! reach the route and its weights, and a standalone reload with invalid tiers is refused with
//! the CEL rule's message while the last good configuration keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use switchyard_api::loader::{Manifests, load_dir};
use switchyard_router::app::App;
use switchyard_router::config::{RoutingTable, SecretSource};
use switchyard_router::standalone;
use switchyard_router::state::Runtime;

const PROVIDERS: &str = r#"
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata:
  name: p-a
spec:
  api: openai
  endpoint: http://127.0.0.1:9
  models:
    - name: m1
---
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata:
  name: p-b
spec:
  api: openai
  endpoint: http://127.0.0.1:9
  models:
    - name: m1
---
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata:
  name: p-c
spec:
  api: openai
  endpoint: http://127.0.0.1:9
  models:
    - name: m1
"#;

/// Two equal providers 30/70 in tier 0 (listed minority first), a fallback tier.
const TIERED: &str = r#"
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata:
  name: route
spec:
  model: m1
  providers:
    - name: p-c
      priority: 1
    - name: p-b
      priority: 0
      weight: 30
    - name: p-a
      priority: 0
      weight: 70
"#;

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-tiers-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, policy: &str) {
    std::fs::write(dir.join("providers.yaml"), PROVIDERS).unwrap();
    std::fs::write(dir.join("policy.yaml"), policy).unwrap();
}

fn table(dir: &Path) -> RoutingTable {
    RoutingTable::build(&load_dir(dir).unwrap(), &SecretSource::default())
}

#[tokio::test]
async fn tiers_reach_route_weights_and_invalid_reload_is_refused_with_message() {
    let dir = scratch("reload");
    write(&dir, TIERED);
    let runtime = Runtime::new(table(&dir));
    let app = App::new(runtime.clone(), 1 << 20);
    {
        let live = runtime.live();
        let route = &live.table.routes[0];
        let tiers = route.tiers.as_ref().expect("tiers built");
        assert_eq!(tiers.priority(), &[1, 0, 0]);
        assert_eq!(tiers.weight(), &[1, 30, 70]);
        // Availability 1 everywhere: tier 0 takes everything, split 30/70; p-c nothing.
        let w = live.compute_weights(0);
        assert_eq!(w.len(), 3);
        for (got, want) in w.iter().zip([0.0, 0.3, 0.7]) {
            assert!((got - want).abs() < 1e-12, "{w:?}");
        }
    }

    let cases = [
        (
            "priority on some providers only",
            TIERED.replace("      priority: 1\n", ""),
            "priority must be set on every provider of the policy or on none",
        ),
        (
            "every weight 0",
            r#"
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata:
  name: route
spec:
  model: m1
  providers:
    - name: p-a
      weight: 0
    - name: p-b
      weight: 0
"#
            .to_owned(),
            "at least one provider must have a weight above 0",
        ),
        (
            "weights on a p2c policy",
            TIERED.replace(
                "  model: m1\n",
                "  model: m1\n  strategy: powerOfTwoChoices\n",
            ),
            "priority and weight apply only to the stickyChain strategy",
        ),
    ];
    for (what, policy, message) in cases {
        write(&dir, &policy);
        let errors = standalone::reload(&app, &dir, &SecretSource::default())
            .expect_err(what)
            .to_string();
        assert!(errors.contains(message), "{what}: {errors}");
        assert!(
            errors.contains("policy.yaml"),
            "{what}: names the file: {errors}"
        );
        let messages = app.config_messages.lock().unwrap().join("\n");
        assert!(
            messages.contains(message),
            "{what}: /status says {messages}"
        );
        // The last good configuration keeps serving, tiers and all.
        let live = runtime.live();
        assert_eq!(
            live.table.routes[0]
                .tiers
                .as_ref()
                .map(|t| t.weight().to_vec()),
            Some(vec![1, 30, 70]),
            "{what}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Objects that reach the router without the loader (Kubernetes mode, a CRD stored before the
/// rules existed) with invalid tiers are a configuration error of their route, not a route
/// served as a plain list.
#[test]
fn tiers_invalid_without_loader_is_route_problem() {
    let dir = scratch("hand");
    write(&dir, TIERED);
    let mut m: Manifests = load_dir(&dir).unwrap();
    m.policies[0].spec.providers[0].priority = None;
    let t = RoutingTable::build(&m, &SecretSource::default());
    let r = &t.routes[0];
    assert!(r.tiers.is_none());
    assert_eq!(r.limit_problems.len(), 1, "{:?}", r.limit_problems);
    assert!(
        r.limit_problems[0].starts_with(
            "spec.providers: priority must be set on every provider of the policy or on none"
        ),
        "{:?}",
        r.limit_problems
    );
    assert!(r.limit_problems[0].contains(r#"missing on ["p-c"]"#));
    let _ = std::fs::remove_dir_all(&dir);
}
