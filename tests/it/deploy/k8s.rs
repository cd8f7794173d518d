//! The Kubernetes manifests (`deploy/k8s/`: `base/` and the overlays `dev` and
//! `production`) render (`kustomize.rs`, compared with `kubectl kustomize` where it
//! is installed), validate offline against the Kubernetes schemas shipped by
//! `kubernetes-validate` (KEDA's kinds against KEDA's own CustomResourceDefinitions,
//! vendored in `tests/schemas/keda/`), and agree with
//! each other, with the compose file's partition count and with the worker's own
//! limits (drain deadline, health endpoints, memory, secrets as files).

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

/// The overlays an operator applies; each is rendered and checked whole.
const OVERLAYS: &[&str] = &["deploy/k8s/overlays/dev", "deploy/k8s/overlays/production"];

/// An overlay as the reader renders it, each document with the kustomization
/// directory it came from.
fn manifests(overlay: &str) -> Vec<(PathBuf, Value)> {
    crate::deploy::kustomize::render(&root().join(overlay))
}

fn by_kind<'a>(manifests: &'a [(PathBuf, Value)], kind: &str) -> Vec<&'a Value> {
    manifests
        .iter()
        .filter(|(_, m)| m["kind"].as_str() == Some(kind))
        .map(|(_, m)| m)
        .collect()
}

/// Kinds the Kubernetes schemas do not cover (KEDA's): validated against KEDA's
/// CustomResourceDefinitions (`tests/schemas/keda/`, from kedacore/keda v2.20.1,
/// Apache-2.0) by `tests/schemas/validate-custom-resources`, strictly.
const NOT_IN_THE_KUBERNETES_SCHEMAS: &[&str] = &["ScaledObject", "TriggerAuthentication"];

/// Validates custom resources against the vendored CRDs: the validator's exit status
/// and what it wrote.
fn validate_custom_resources(files: &[String]) -> (Option<i32>, String) {
    let output = Command::new(root().join("tests/schemas/validate-custom-resources"))
        .arg(root().join("tests/schemas/keda"))
        .args(files)
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 with PyYAML and jsonschema ({KUBERNETES_VALIDATE}): {e}")
        });
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn sorted(mut documents: Vec<Value>) -> Vec<Value> {
    documents.sort_by_key(|d| {
        (
            d["kind"].as_str().unwrap_or_default().to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    });
    documents
}

#[test]
fn every_overlay_renders_and_validates_against_the_schemas_offline() {
    // The base on its own too: an overlay of one's own starts from it.
    for overlay in std::iter::once(&"deploy/k8s/base").chain(OVERLAYS) {
        let manifests = manifests(overlay);
        assert!(
            manifests.len() >= 9,
            "{overlay}: {} documents",
            manifests.len()
        );
        // kustomize itself, where it is installed (kubectl kustomize), renders the same.
        let kustomized = Command::new("kubectl")
            .args(["kustomize", overlay])
            .current_dir(root())
            .output();
        match kustomized {
            Ok(output) if output.status.success() => {
                let text = String::from_utf8(output.stdout).unwrap();
                let theirs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
                    .map(|d| Value::deserialize(d).unwrap())
                    .filter(|v| !v.is_null())
                    .collect();
                let ours: Vec<Value> = manifests.iter().map(|(_, d)| d.clone()).collect();
                assert_eq!(
                    sorted(ours),
                    sorted(theirs),
                    "{overlay}: the test's reader and kustomize render differently"
                );
            }
            Ok(output) => panic!(
                "kubectl kustomize {overlay} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(_) => {
                eprintln!("kubectl not installed: {overlay} rendered by the test's reader only")
            }
        }
        let dir = std::env::temp_dir().join(format!("k8s-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut files, mut custom) = (Vec::new(), Vec::new());
        for (n, (_, document)) in manifests.iter().enumerate() {
            let file = dir.join(format!("{n}.yaml"));
            std::fs::write(&file, serde_yaml::to_string(document).unwrap()).unwrap();
            if NOT_IN_THE_KUBERNETES_SCHEMAS.contains(&document["kind"].as_str().unwrap_or("")) {
                custom.push(file.display().to_string());
            } else {
                files.push(file.display().to_string());
            }
        }
        let mut args = vec!["-m", "kubernetes_validate", "--strict", "--quiet"];
        args.extend(files.iter().map(String::as_str));
        run("python3", &args, KUBERNETES_VALIDATE);
        assert_eq!(
            custom.len(),
            2,
            "{overlay}: a ScaledObject and a TriggerAuthentication"
        );
        let (code, errors) = validate_custom_resources(&custom);
        assert_eq!(code, Some(0), "{overlay}: {errors}");
        std::fs::remove_dir_all(&dir).ok();
    }

    // The validator rejects what Kubernetes would: a misspelt probe field.
    let broken =
        std::env::temp_dir().join(format!("deployment-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &broken,
        read("deploy/k8s/base/deployment.yaml").replace("failureThreshold:", "failureTreshold:"),
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

    // So does KEDA's: a misspelt ScaledObject field, a TriggerAuthentication
    // reference without its parameter, a kind KEDA does not define.
    for (file, from, to, expected) in [
        (
            "scaledobject.yaml",
            "minReplicaCount:",
            "minReplicasCount:",
            Some(1),
        ),
        (
            "triggerauthentication.yaml",
            "- parameter: sasl\n",
            "- \n",
            Some(1),
        ),
        (
            "scaledobject.yaml",
            "kind: ScaledObject",
            "kind: ScaledThing",
            Some(2),
        ),
    ] {
        let original = read(&format!("deploy/k8s/base/{file}"));
        assert!(original.contains(from), "{file} no longer holds {from:?}");
        let broken =
            std::env::temp_dir().join(format!("keda-{}.yaml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&broken, original.replacen(from, to, 1)).unwrap();
        let (code, errors) = validate_custom_resources(&[broken.display().to_string()]);
        std::fs::remove_file(&broken).ok();
        assert_eq!(code, expected, "{file} with {to:?}: {errors}");
    }
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
    for overlay in OVERLAYS {
        agree(overlay, &manifests(overlay));
    }
    // The production StatefulSet runs the base's pod, plus its static membership.
    let base = documents(&root().join("deploy/k8s/base/deployment.yaml")).remove(0);
    let mut statefulset =
        documents(&root().join("deploy/k8s/overlays/production/statefulset.yaml")).remove(0);
    let env = statefulset["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence_mut()
        .unwrap();
    let instance = env.remove(0);
    assert_eq!(instance["name"], "KAFKA_GROUP_INSTANCE_ID");
    assert_eq!(
        instance["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    assert_eq!(
        statefulset["spec"]["template"], base["spec"]["template"],
        "the StatefulSet's pod drifted from the Deployment's"
    );
    // The base kustomization lists every base manifest.
    let listed: BTreeSet<String> = yaml("deploy/k8s/base/kustomization.yaml")["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(root().join("deploy/k8s/base"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present, "base kustomization resources");
}

fn agree(overlay: &str, manifests: &[(PathBuf, Value)]) {
    let one = |kind: &str| -> &Value {
        let found = by_kind(manifests, kind);
        assert_eq!(found.len(), 1, "{overlay}: exactly one {kind}");
        found[0]
    };
    let workloads: Vec<&Value> = ["Deployment", "StatefulSet"]
        .iter()
        .flat_map(|k| by_kind(manifests, k))
        .collect();
    assert_eq!(workloads.len(), 1, "{overlay}: one workload");
    let workload = workloads[0];
    let config = &one("ConfigMap")["data"];
    let secrets = by_kind(manifests, "Secret");
    let secret_key = |name: &str, key: &str| {
        secrets
            .iter()
            .find(|s| s["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{overlay}: no Secret {name}"))["stringData"][key]
            .is_string()
    };
    let name = workload["metadata"]["name"].as_str().unwrap();
    let pod = &workload["spec"]["template"]["spec"];
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
        "{overlay}: grace {grace} < drain {drain} s + 20 s"
    );

    // Memory: room above the benchmark's peak RSS target of 150 MiB.
    let limit = container["resources"]["limits"]["memory"].as_str().unwrap();
    let mib: u64 = limit.strip_suffix("Mi").unwrap().parse().unwrap();
    assert!(mib >= 150, "memory limit {limit}");

    // Settings from the ConfigMap, credentials only as files from Secrets, mounted
    // readable by the worker's group only.
    assert!(container["envFrom"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|e| e["configMapRef"]["name"] == config_name(manifests)));
    for (key, value) in config.as_mapping().unwrap() {
        let value = value.as_str().unwrap_or_default();
        assert!(
            !(value.contains("://") && value.contains('@')),
            "credentials in the ConfigMap: {key:?}"
        );
    }
    let env = container["env"].as_sequence().unwrap();
    let env_value = |name: &str| -> String {
        env.iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{overlay}: no {name}"))
            .to_owned()
    };
    assert!(env
        .iter()
        .all(|e| !e["valueFrom"]["secretKeyRef"].is_mapping()));
    let volumes = pod["volumes"].as_sequence().unwrap();
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    for setting in ["DATABASE_URL_FILE", "REDIS_URL_FILE", "KAFKA_CONFIG_FILE"] {
        let path = env_value(setting);
        let mount = mounts
            .iter()
            .find(|m| path.starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{overlay}: {setting} {path} is not mounted"));
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        let secret = volume["secret"]["secretName"].as_str().unwrap();
        let file = path.rsplit('/').next().unwrap();
        assert!(
            secret_key(secret, file),
            "{overlay}: Secret {secret} lacks {file}"
        );
        assert_eq!(
            volume["secret"]["defaultMode"].as_u64(),
            Some(0o440),
            "{setting}"
        );
    }
    assert_eq!(
        pod["securityContext"]["fsGroup"],
        pod["securityContext"]["runAsGroup"]
    );
    // Each pod names itself in telemetry, so the workers' series stay apart.
    assert!(env.iter().any(|e| e["name"] == "OTEL_RESOURCE_ATTRIBUTES"
        && e["value"]
            .as_str()
            .is_some_and(|v| v.contains("service.instance.id=$(POD_NAME)"))));

    // The migration Job: `migrate` with the workers' image, named after its release,
    // its database URL a file from a Secret that exists.
    let job = one("Job");
    let migrate = &job["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(migrate["args"][0].as_str(), Some("migrate"));
    assert_eq!(
        migrate["image"], container["image"],
        "the Job migrates with the workers' release"
    );
    let tag = container["image"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap();
    assert_eq!(
        job["metadata"]["name"].as_str(),
        Some(format!("payment-worker-migrate-{tag}").as_str()),
        "{overlay}: the migration Job is named after its release"
    );
    let job_volume = &job["spec"]["template"]["spec"]["volumes"][0]["secret"];
    let job_secret = job_volume["secretName"].as_str().unwrap();
    assert!(secret_key(job_secret, "DATABASE_URL"));

    // The budget selects the workers, and never blocks a drain while they are unready.
    let labels = &workload["spec"]["template"]["metadata"]["labels"];
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
    assert_eq!(
        budget["spec"]["unhealthyPodEvictionPolicy"].as_str(),
        Some("AlwaysAllow")
    );

    // One NetworkPolicy selects the workers: ingress to the health port only, egress
    // to DNS, Kafka, Postgres, Redis (and Sentinel), the gateway and the collector
    // only. Another fences the migration Job: no ingress, egress to DNS and Postgres.
    let policies = by_kind(manifests, "NetworkPolicy");
    assert_eq!(
        policies.len(),
        2,
        "{overlay}: the workers' and the migration's"
    );
    let selects = |policy: &Value, labels: &Value| {
        policy["spec"]["podSelector"]["matchLabels"]
            .as_mapping()
            .unwrap()
            .iter()
            .all(|(key, value)| &labels[key.as_str().unwrap()] == value)
    };
    let egress_ports = |policy: &Value| -> BTreeSet<u64> {
        policy["spec"]["egress"]
            .as_sequence()
            .unwrap()
            .iter()
            .inspect(|rule| assert!(rule["to"].is_sequence(), "an egress rule open to anywhere"))
            .flat_map(|rule| rule["ports"].as_sequence().unwrap().iter())
            .filter_map(|p| p["port"].as_u64())
            .collect()
    };
    let migration = job;
    let migration_labels = &migration["spec"]["template"]["metadata"]["labels"];
    let [policy] = policies
        .iter()
        .filter(|p| selects(p, labels))
        .copied()
        .collect::<Vec<_>>()[..]
    else {
        panic!("{overlay}: exactly one NetworkPolicy selects the workers")
    };
    let [fence] = policies
        .iter()
        .filter(|p| selects(p, migration_labels))
        .copied()
        .collect::<Vec<_>>()[..]
    else {
        panic!("{overlay}: exactly one NetworkPolicy selects the migration Job")
    };
    assert!(!selects(policy, migration_labels) && !selects(fence, labels));
    assert_eq!(
        fence["spec"]["policyTypes"],
        serde_yaml::from_str::<Value>("[Ingress, Egress]").unwrap()
    );
    assert!(
        fence["spec"]["ingress"].is_null(),
        "no ingress to the migration"
    );
    assert_eq!(egress_ports(fence), BTreeSet::from([53, 5432]));
    let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
    let ingress_ports: BTreeSet<String> = ingress
        .iter()
        .flat_map(|rule| rule["ports"].as_sequence().unwrap().iter())
        .map(|p| serde_yaml::to_string(&p["port"]).unwrap().trim().to_owned())
        .collect();
    assert_eq!(ingress_ports, BTreeSet::from(["health".to_owned()]));
    assert_eq!(
        egress_ports(policy),
        BTreeSet::from([53, 9092, 9093, 5432, 6379, 26379, 8080, 443, 4317, 4318])
    );

    // KEDA scales this workload on this group's lag, up to one member per
    // partition, logged in through a TriggerAuthentication over existing Secret keys.
    let scaled = one("ScaledObject");
    assert_eq!(scaled["apiVersion"].as_str(), Some("keda.sh/v1alpha1"));
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"].as_str(),
        Some(name)
    );
    assert_eq!(scaled["spec"]["scaleTargetRef"]["kind"], workload["kind"]);
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
    assert_eq!(metadata["allowIdleConsumers"].as_str(), Some("false"));
    let authentication = one("TriggerAuthentication");
    assert_eq!(
        trigger["authenticationRef"]["name"],
        authentication["metadata"]["name"]
    );
    let parameters: BTreeSet<&str> = authentication["spec"]["secretTargetRef"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(secret_key(
                r["name"].as_str().unwrap(),
                r["key"].as_str().unwrap()
            ));
            r["parameter"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        parameters,
        BTreeSet::from(["sasl", "username", "password", "tls"])
    );
    assert!(
        workload["spec"]["replicas"].is_null(),
        "KEDA owns the replica count"
    );

    // A StatefulSet's pods are static members named after themselves.
    if workload["kind"] == "StatefulSet" {
        let instance = env
            .iter()
            .find(|e| e["name"] == "KAFKA_GROUP_INSTANCE_ID")
            .expect("static membership");
        assert_eq!(
            instance["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            Some("metadata.name")
        );
        let service = one("Service");
        assert_eq!(workload["spec"]["serviceName"], service["metadata"]["name"]);
        assert_eq!(service["spec"]["clusterIP"].as_str(), Some("None"));
    }
}

fn config_name(manifests: &[(PathBuf, Value)]) -> Value {
    by_kind(manifests, "ConfigMap")[0]["metadata"]["name"].clone()
}
