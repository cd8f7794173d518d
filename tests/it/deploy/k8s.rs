//! The Kubernetes manifests (`deploy/k8s/`) validate offline against the Kubernetes
//! schemas shipped by `kubernetes-validate`, and agree with each other, with the
//! compose file's partition count and with the worker's own limits (drain deadline,
//! health endpoints, memory).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;

use crate::deploy::alerts::{read, root, run, yaml};

const KUBERNETES_VALIDATE: &str = "python3 -m pip install kubernetes-validate";

/// Every YAML document of a manifest file.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn manifests() -> Vec<(PathBuf, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|f| documents(&f).into_iter().map(move |d| (f.clone(), d)))
        .collect()
}

fn by_kind<'a>(manifests: &'a [(PathBuf, Value)], kind: &str) -> Vec<&'a Value> {
    manifests
        .iter()
        .filter(|(_, m)| m["kind"].as_str() == Some(kind))
        .map(|(_, m)| m)
        .collect()
}

/// Kinds the Kubernetes schemas do not cover: checked field by field below.
const NOT_IN_THE_KUBERNETES_SCHEMAS: &[&str] = &["Kustomization", "ScaledObject"];

#[test]
fn kubernetes_manifests_validate_against_the_schemas_offline() {
    let manifests = manifests();
    let files: BTreeSet<String> = manifests
        .iter()
        .filter(|(_, m)| !NOT_IN_THE_KUBERNETES_SCHEMAS.contains(&m["kind"].as_str().unwrap_or("")))
        .map(|(f, _)| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(files.len() >= 5, "{files:?}");
    let mut args = vec!["-m", "kubernetes_validate", "--strict", "--quiet"];
    args.extend(files.iter().map(String::as_str));
    run("python3", &args, KUBERNETES_VALIDATE);

    // The validator rejects what Kubernetes would: a misspelt probe field.
    let broken =
        std::env::temp_dir().join(format!("deployment-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &broken,
        read("deploy/k8s/deployment.yaml").replace("failureThreshold:", "failureTreshold:"),
    )
    .unwrap();
    let output = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .arg(&broken)
        .output()
        .unwrap();
    std::fs::remove_file(&broken).ok();
    assert!(
        !output.status.success(),
        "a misspelt field must not validate"
    );
}

fn seconds(text: &str) -> u64 {
    humantime::parse_duration(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .as_secs()
}

fn commands_topic_partitions() -> u64 {
    let compose = read("docker-compose.yml");
    let line = compose
        .lines()
        .find(|l| l.contains("--topic payments.commands --partitions"))
        .expect("kafka-init creates payments.commands");
    let after = line.split("--partitions").nth(1).unwrap();
    after.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn kubernetes_manifests_agree_with_each_other() {
    let manifests = manifests();
    let one = |kind: &str| -> &Value {
        let found = by_kind(&manifests, kind);
        assert_eq!(found.len(), 1, "exactly one {kind}");
        found[0]
    };
    let deployment = one("Deployment");
    let config = &one("ConfigMap")["data"];
    let secrets = by_kind(&manifests, "Secret");
    let name = deployment["metadata"]["name"].as_str().unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["args"][0].as_str(), Some("run"));

    // Probes on the health listener's port: /healthz for liveness, /readyz for readiness.
    let health_port: u64 = config["HEALTH_LISTEN"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        container["ports"][0]["containerPort"].as_u64(),
        Some(health_port)
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        container["startupProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );

    // Grace: the drain deadline plus a flush of spans and of metrics (10 s OTLP
    // timeout each), and the drain below the session timeout.
    let drain = seconds(config["DRAIN_DEADLINE"].as_str().unwrap());
    assert!(drain < seconds(config["KAFKA_SESSION_TIMEOUT"].as_str().unwrap()));
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace >= drain + 20,
        "terminationGracePeriodSeconds {grace} < drain {drain} s + 20 s flush"
    );

    // Memory: room above the benchmark's peak RSS target of 150 MiB.
    let limit = container["resources"]["limits"]["memory"].as_str().unwrap();
    let mib: u64 = limit.strip_suffix("Mi").unwrap().parse().unwrap();
    assert!(mib >= 150, "memory limit {limit}");
    assert!(container["resources"]["requests"]["cpu"].is_string());

    // Configuration from the ConfigMap, credentials only from Secrets.
    let env_from = container["envFrom"].as_sequence().unwrap();
    let secret_names: BTreeSet<&str> = secrets
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(env_from
        .iter()
        .any(|e| e["configMapRef"]["name"] == config_name(&manifests)));
    assert!(env_from.iter().any(|e| e["secretRef"]["name"]
        .as_str()
        .is_some_and(|n| secret_names.contains(n))));
    for (key, value) in config.as_mapping().unwrap() {
        let value = value.as_str().unwrap_or_default();
        assert!(
            !(value.contains("://") && value.contains('@')),
            "credentials in the ConfigMap: {key:?}"
        );
    }
    let worker_secret = secrets
        .iter()
        .find(|s| {
            env_from
                .iter()
                .any(|e| e["secretRef"]["name"] == s["metadata"]["name"])
        })
        .unwrap();
    for key in ["DATABASE_URL", "REDIS_URL"] {
        assert!(
            worker_secret["stringData"][key].is_string(),
            "worker Secret lacks {key}"
        );
    }
    // Each pod names itself in telemetry, so the workers' series stay apart.
    let env = container["env"].as_sequence().unwrap();
    assert!(env.iter().any(|e| e["name"] == "OTEL_RESOURCE_ATTRIBUTES"
        && e["value"]
            .as_str()
            .is_some_and(|v| v.contains("service.instance.id=$(POD_NAME)"))));

    // The migration Job: `migrate`, with a database URL from a Secret that exists.
    let job = one("Job");
    let migrate = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(migrate["args"][0].as_str(), Some("migrate"));
    assert_eq!(
        migrate["image"], container["image"],
        "the Job migrates with the workers' release"
    );
    let secret_ref = &migrate["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "DATABASE_URL")
        .unwrap()["valueFrom"]["secretKeyRef"];
    let secret = secrets
        .iter()
        .find(|s| s["metadata"]["name"] == secret_ref["name"])
        .expect("the Job's Secret");
    assert!(secret["stringData"][secret_ref["key"].as_str().unwrap()].is_string());

    // The budget selects the workers.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let budget = one("PodDisruptionBudget");
    for (key, value) in budget["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
    {
        assert_eq!(
            &labels[key.as_str().unwrap()],
            value,
            "the budget selects the worker pods"
        );
    }
    assert!(budget["spec"]["maxUnavailable"]
        .as_u64()
        .is_some_and(|n| n >= 1));

    // KEDA scales this Deployment on this group's lag, up to one member per partition.
    let scaled = one("ScaledObject");
    assert_eq!(scaled["apiVersion"].as_str(), Some("keda.sh/v1alpha1"));
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"].as_str(),
        Some(name)
    );
    assert_eq!(
        scaled["spec"]["maxReplicaCount"].as_u64(),
        Some(commands_topic_partitions())
    );
    assert!(scaled["spec"]["minReplicaCount"]
        .as_u64()
        .is_some_and(|n| n >= 1));
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["type"].as_str(), Some("kafka"));
    let metadata = &trigger["metadata"];
    assert_eq!(metadata["consumerGroup"], config["KAFKA_GROUP_ID"]);
    assert_eq!(metadata["topic"], config["COMMANDS_TOPIC"]);
    assert_eq!(metadata["bootstrapServers"], config["KAFKA_BROKERS"]);
    assert!(metadata["lagThreshold"]
        .as_str()
        .is_some_and(|t| t.parse::<u64>().is_ok_and(|n| n > 0)));
    assert_eq!(metadata["allowIdleConsumers"].as_str(), Some("false"));
    assert!(
        deployment["spec"]["replicas"].is_null(),
        "KEDA owns the replica count"
    );

    // kustomization.yaml lists every manifest.
    let kustomization = yaml("deploy/k8s/kustomization.yaml");
    let listed: BTreeSet<&str> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let present: BTreeSet<String> = manifests
        .iter()
        .filter(|(_, m)| m["kind"] != "Kustomization")
        .map(|(f, _)| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed,
        present.iter().map(String::as_str).collect(),
        "kustomization resources"
    );
}

fn config_name(manifests: &[(PathBuf, Value)]) -> Value {
    by_kind(manifests, "ConfigMap")[0]["metadata"]["name"].clone()
}
