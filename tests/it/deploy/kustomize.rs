//! A reader of the part of kustomize `deploy/k8s/` uses, so the overlays render in
//! the tests without kustomize installed (`k8s.rs` compares it with `kubectl
//! kustomize` where that exists). What it reads, and nothing else (anything else in
//! a kustomization fails the test):
//! - `resources`: files (every YAML document) and directories (their kustomization);
//! - `labels[].pairs`: added to each document's `metadata.labels`;
//! - `images[]` with `name` and `newTag`: the tag of every container of that image;
//! - `patches[]`: a JSON 6902 list (`op` add/replace/remove, `path`, `value`) with a
//!   `target` of `kind` and `name`, or `$patch: delete` of a document by kind and name.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::{Mapping, Value};

const KNOWN: &[&str] = &[
    "apiVersion",
    "kind",
    "resources",
    "labels",
    "images",
    "patches",
];

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn same_object(document: &Value, kind: &Value, name: &Value) -> bool {
    &document["kind"] == kind && &document["metadata"]["name"] == name
}

/// Every document `dir`'s kustomization renders, each with the directory of the
/// kustomization that listed it.
pub(crate) fn render(dir: &Path) -> Vec<(PathBuf, Value)> {
    let kustomization = documents(&dir.join("kustomization.yaml")).remove(0);
    for key in kustomization.as_mapping().expect("a mapping").keys() {
        let key = key.as_str().unwrap_or_default();
        assert!(
            KNOWN.contains(&key),
            "{}: the reader does not know `{key}`",
            dir.display()
        );
    }
    let mut out: Vec<(PathBuf, Value)> = Vec::new();
    for resource in kustomization["resources"]
        .as_sequence()
        .into_iter()
        .flatten()
    {
        let path = dir.join(resource.as_str().expect("a resource path"));
        if path.is_dir() {
            out.extend(render(&path));
        } else {
            out.extend(documents(&path).into_iter().map(|d| (dir.to_owned(), d)));
        }
    }
    for entry in kustomization["patches"].as_sequence().into_iter().flatten() {
        let patch: Value = serde_yaml::from_str(entry["patch"].as_str().expect("an inline patch"))
            .expect("patch YAML");
        if patch["$patch"].as_str() == Some("delete") {
            let before = out.len();
            out.retain(|(_, d)| !same_object(d, &patch["kind"], &patch["metadata"]["name"]));
            assert_eq!(
                out.len() + 1,
                before,
                "{}: nothing to delete",
                dir.display()
            );
            continue;
        }
        let target = &entry["target"];
        let mut applied = 0;
        for (_, document) in out
            .iter_mut()
            .filter(|(_, d)| same_object(d, &target["kind"], &target["name"]))
        {
            for op in patch.as_sequence().expect("a JSON 6902 list") {
                apply(document, op);
            }
            applied += 1;
        }
        assert_eq!(applied, 1, "{}: patch target {target:?}", dir.display());
    }
    for image in kustomization["images"].as_sequence().into_iter().flatten() {
        let name = image["name"].as_str().expect("image name");
        let tag = image["newTag"].as_str().expect("newTag");
        for (_, document) in &mut out {
            let containers = document
                .get_mut("spec")
                .and_then(|s| s.get_mut("template"))
                .and_then(|t| t.get_mut("spec"))
                .and_then(|s| s.get_mut("containers"))
                .and_then(Value::as_sequence_mut);
            for container in containers.into_iter().flatten() {
                let current = container["image"].as_str().unwrap_or_default();
                if current.split(':').next() == Some(name) {
                    container["image"] = Value::from(format!("{name}:{tag}"));
                }
            }
        }
    }
    for label in kustomization["labels"].as_sequence().into_iter().flatten() {
        for (_, document) in &mut out {
            let metadata = document["metadata"].as_mapping_mut().expect("metadata");
            let labels = metadata
                .entry(Value::from("labels"))
                .or_insert_with(|| Value::Mapping(Mapping::new()));
            for (key, value) in label["pairs"].as_mapping().expect("pairs") {
                labels[key.clone()] = value.clone();
            }
        }
    }
    out
}

/// One JSON 6902 operation on `document` (paths without escapes, as ours are).
fn apply(document: &mut Value, op: &Value) {
    let path = op["path"].as_str().expect("path");
    let mut parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let last = parts.pop().expect("a path");
    let mut at = document;
    for part in parts {
        at = match at {
            Value::Sequence(items) => &mut items[part.parse::<usize>().expect("an index")],
            other => &mut other[part],
        };
    }
    match (op["op"].as_str(), at) {
        (Some("add" | "replace"), Value::Sequence(items)) if last == "-" => {
            items.push(op["value"].clone())
        }
        (Some("add" | "replace"), Value::Sequence(items)) => {
            items[last.parse::<usize>().expect("an index")] = op["value"].clone()
        }
        (Some("add" | "replace"), Value::Mapping(map)) => {
            map.insert(Value::from(last), op["value"].clone());
        }
        (Some("remove"), Value::Mapping(map)) => {
            map.remove(last);
        }
        (other, _) => panic!("the reader does not apply {other:?} at {path}"),
    }
}
