//! The router's modules import in one direction (issue 13 item 4): wire formats and request
//! facts at the bottom, then configuration and shared state, the process ([`App`]), the
//! executor and the process's views, the server, and the two ways to run it on top. Checked
//! on the sources themselves: every `crate::…` path in a module's code (imports, expressions,
//! types, and paths inside macro calls) is an edge, and an edge may only point to a strictly
//! lower layer. A module missing from [`LAYERS`] fails the test until it is placed on purpose.
//!
//! [`App`]: switchyard_router::app::App

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The router's modules, bottom layer first. `wire`, `upstream`, `health` and `clock` are
/// re-exports of `switchyard-providers` and sit below all of these.
const LAYERS: &[&[&str]] = &[
    &["protocol_errors", "estimate", "metrics", "shards"],
    &["config"],
    &["state", "history"],
    &["conditions", "request", "idempotency"],
    &["transcription", "broker", "telemetry"],
    &["app"],
    &["signals", "status", "probe", "control"],
    &["outcomes"],
    &["dispatch"],
    &["responses", "ui"],
    &["server"],
    &["standalone", "kube_source"],
];

/// Names under `crate::` that are not modules of this crate's sources.
const EXTERNAL: &[&str] = &["wire", "upstream", "health", "clock"];

/// Collects the first segment after `crate::` of every path in one file.
#[derive(Default)]
struct Edges {
    to: BTreeSet<String>,
}

impl Edges {
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, t) in tokens.iter().enumerate() {
            match t {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" => {
                    if let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (tokens.get(i + 1), tokens.get(i + 2))
                        && a.as_char() == ':'
                        && b.as_char() == ':'
                    {
                        match tokens.get(i + 3) {
                            Some(TokenTree::Ident(next)) => {
                                self.to.insert(next.to_string());
                            }
                            // `crate::{a, b::c}` inside a macro: every first segment.
                            Some(TokenTree::Group(g)) => {
                                for tt in g.stream() {
                                    if let TokenTree::Ident(next) = tt {
                                        self.to.insert(next.to_string());
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn use_tree(&mut self, tree: &syn::UseTree, under_crate: bool) {
        match tree {
            syn::UseTree::Path(p) if !under_crate => self.use_tree(&p.tree, p.ident == "crate"),
            syn::UseTree::Path(p) => {
                self.to.insert(p.ident.to_string());
            }
            syn::UseTree::Name(n) if under_crate => {
                self.to.insert(n.ident.to_string());
            }
            syn::UseTree::Rename(r) if under_crate => {
                self.to.insert(r.ident.to_string());
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, under_crate);
                }
            }
            _ => {}
        }
    }
}

impl<'ast> Visit<'ast> for Edges {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter();
        if let (Some(first), Some(second)) = (segments.next(), segments.next())
            && first.ident == "crate"
        {
            self.to.insert(second.ident.to_string());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&item.tree, false);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// Module name → the crate modules its file names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let module = path.file_stem().unwrap().to_string_lossy().into_owned();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut edges = Edges::default();
        edges.visit_file(&file);
        edges.to.remove(&module);
        for external in EXTERNAL {
            edges.to.remove(*external);
        }
        graph.insert(module, edges.to);
    }
    graph
}

/// Every edge that does not point strictly down the layers, and every module without a layer.
fn violations(graph: &BTreeMap<String, BTreeSet<String>>, layers: &[&[&str]]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let mut problems = Vec::new();
    for (module, deps) in graph {
        let Some(own) = layer_of(module) else {
            problems.push(format!("module `{module}` has no layer in LAYERS"));
            continue;
        };
        for dep in deps {
            match layer_of(dep) {
                None => problems.push(format!("`{module}` names `crate::{dep}`, which has no layer")),
                Some(l) if l >= own => problems.push(format!(
                    "`{module}` (layer {own}) imports `{dep}` (layer {l}): imports must point to a lower layer"
                )),
                Some(_) => {}
            }
        }
    }
    problems
}

#[test]
fn router_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(graph.len() >= 20, "read only {} modules", graph.len());
    // The parser sees real edges: the executor drives the process state and the broker.
    assert!(graph["dispatch"].contains("app") && graph["dispatch"].contains("broker"));
    let problems = violations(&graph, LAYERS);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_catches_an_upward_import_and_a_circle() {
    let file = syn::parse_file(
        "use crate::{server::App, state};\nfn f() { tracing::info!(x = %crate::status::time()); }",
    )
    .unwrap();
    let mut edges = Edges::default();
    edges.visit_file(&file);
    let names: Vec<&str> = edges.to.iter().map(String::as_str).collect();
    assert_eq!(names, ["server", "state", "status"]);

    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("config", BTreeSet::from(["state".to_owned()])),
        ("state", BTreeSet::from(["config".to_owned()])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let problems = violations(&graph, &[&["config"], &["state"]]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("`config` (layer 0) imports `state` (layer 1)"));
}
