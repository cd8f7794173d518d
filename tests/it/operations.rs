//! The operator kit holds together: alert rules pass `promtool` with a unit test
//! that fires and one that silences every alert, each alert links to its runbook
//! section, the Grafana dashboard is provisioned against the Prometheus of the
//! compose file, and the Kubernetes manifests validate offline against the
//! Kubernetes schemas (`kubernetes-validate`) and agree with each other.
//! (Which metric names the queries use is checked against a real worker in
//! `metric_names.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml(relative: &str) -> Value {
    serde_yaml::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative} is not YAML: {e}"))
}

/// Runs a checker and fails with its output; a missing tool is a failure too, with
/// the line of `.ci/run` that installs it.
fn run(program: &str, args: &[&str], installed_by: &str) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}); install it: {installed_by}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{text}"
    );
    text
}

const PROMTOOL: &str = "apt-get install prometheus (Debian package providing promtool)";
const KUBERNETES_VALIDATE: &str = "python3 -m pip install kubernetes-validate";

fn alert_rules() -> BTreeMap<String, Value> {
    let rules = yaml("deploy/prometheus/alerts.yml");
    rules["groups"]
        .as_sequence()
        .expect("rule groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .filter_map(|r| Some((r["alert"].as_str()?.to_owned(), r.clone())))
        .collect()
}

#[test]
fn promtool_checks_the_rules_the_config_and_the_alert_unit_tests() {
    let checked = run(
        "promtool",
        &["check", "rules", "deploy/prometheus/alerts.yml"],
        PROMTOOL,
    );
    assert!(checked.contains("SUCCESS"), "{checked}");
    run(
        "promtool",
        &["check", "config", "deploy/prometheus/prometheus.yml"],
        PROMTOOL,
    );
    let tested = run(
        "promtool",
        &["test", "rules", "deploy/prometheus/alerts.test.yml"],
        PROMTOOL,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn a_broken_alert_expectation_fails_promtool() {
    // The unit tests can fail: an alert expected to fire where nothing happened.
    let dir = std::env::temp_dir().join(format!("alerts-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        root().join("deploy/prometheus/alerts.yml"),
        dir.join("alerts.yml"),
    )
    .unwrap();
    std::fs::write(
        dir.join("broken.test.yml"),
        r#"rule_files: [alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'payment_worker_dead_letters_total{job="payment-worker",kind="invalid"}'
        values: '0+5x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: PaymentWorkerRetriesExhausted
        exp_alerts:
          - exp_labels: {job: payment-worker, severity: critical}
"#,
    )
    .unwrap();
    let output = Command::new("promtool")
        .args(["test", "rules", "broken.test.yml"])
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}); {PROMTOOL}"));
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        !output.status.success(),
        "invalid dead letters must not page"
    );
}

/// GitHub's anchor for a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_fires_and_stays_quiet_in_a_unit_test_and_links_its_runbook() {
    let rules = alert_rules();
    assert!(rules.len() >= 8, "alerts: {:?}", rules.keys());
    let tests = yaml("deploy/prometheus/alerts.test.yml");
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests["tests"].as_sequence().expect("tests") {
        for check in case["alert_rule_test"]
            .as_sequence()
            .expect("alert_rule_test")
        {
            let name = check["alertname"].as_str().expect("alertname").to_owned();
            let expected = check["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected > 0 {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let runbook = read("docs/OPERATIONS.md");
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    for (name, rule) in &rules {
        assert!(fires.contains(name), "no unit test where {name} fires");
        assert!(
            quiet.contains(name),
            "no unit test where {name} stays quiet"
        );
        let annotations = &rule["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                annotations[key]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name} has no {key}"
            );
        }
        assert!(
            ["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name} has no severity"
        );
        let url = annotations["runbook_url"].as_str().unwrap_or_default();
        let (file, fragment) = url.split_once('#').expect("runbook_url has an anchor");
        assert_eq!(file, "docs/OPERATIONS.md", "{name}");
        assert!(
            anchors.contains(fragment),
            "{name}: no section #{fragment} in docs/OPERATIONS.md"
        );
    }
    // The runbook says what to run.
    for command in [
        "audit --repair",
        "dlq redrive --kind",
        "replay",
        "--dry-run",
    ] {
        assert!(
            runbook.contains(command),
            "docs/OPERATIONS.md never mentions `{command}`"
        );
    }
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read("deploy/grafana/payment-worker.json")).expect("dashboard JSON")
}

#[test]
fn the_dashboard_has_a_panel_for_each_signal_on_its_data_source() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "payment-worker");
    let templating = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    assert!(
        templating
            .iter()
            .any(|v| v["name"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus data source variable"
    );
    let panels: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .collect();
    let mut exprs = Vec::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("?");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(expr.contains("payment_worker_"), "{title}: {expr:?}");
            assert!(
                expr.contains(r#"job=~"$job""#),
                "{title} ignores the service filter: {expr}"
            );
            exprs.push(expr.to_owned());
        }
    }
    // Throughput by outcome, latency percentiles, in flight, lag per partition, dead
    // letters by kind, retries, token store failures, inconsistencies, panics.
    for (signal, needle) in [
        (
            "throughput by outcome",
            "sum by (outcome) (rate(payment_worker_commands_total",
        ),
        ("p50", "histogram_quantile(0.5,"),
        ("p95", "histogram_quantile(0.95,"),
        ("p99", "histogram_quantile(0.99,"),
        ("in flight", "payment_worker_commands_in_flight"),
        (
            "lag per partition",
            "max by (partition) (payment_worker_consumer_lag",
        ),
        (
            "dead letters by kind",
            "sum by (kind) (rate(payment_worker_dead_letters_total",
        ),
        ("retries", "payment_worker_command_retries_total"),
        (
            "atomic operation failures",
            "payment_worker_atomic_operation_failures_total",
        ),
        (
            "token inconsistencies",
            "payment_worker_token_inconsistencies_total",
        ),
        ("panics", "payment_worker_panics_total"),
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(needle)),
            "no panel shows {signal} ({needle})"
        );
    }
    // Panels do not overlap on the 24-column grid.
    let mut cells = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let g = &panel["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "{} is wider than the grid", panel["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{} overlaps another panel",
                    panel["title"]
                );
            }
        }
    }
}

#[test]
fn grafana_is_provisioned_with_the_dashboard_and_prometheus() {
    let datasources = yaml("deploy/grafana/provisioning/datasources/prometheus.yaml");
    let source = &datasources["datasources"][0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    assert_eq!(source["url"].as_str(), Some("http://prometheus:9090"));
    let providers = yaml("deploy/grafana/provisioning/dashboards/payment-worker.yaml");
    let path = providers["providers"][0]["options"]["path"]
        .as_str()
        .expect("provider path")
        .to_owned();

    let compose = yaml("docker-compose.yml");
    let grafana = &compose["services"]["grafana"];
    let volumes: Vec<&str> = grafana["volumes"]
        .as_sequence()
        .expect("grafana volumes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        volumes.contains(&"./deploy/grafana/provisioning:/etc/grafana/provisioning:ro"),
        "{volumes:?}"
    );
    assert!(
        volumes
            .iter()
            .any(|v| v.starts_with("./deploy/grafana/payment-worker.json:")
                && v.split(':')
                    .nth(1)
                    .is_some_and(|target| Path::new(target).parent() == Some(Path::new(&path)))),
        "the dashboard is mounted where the provider looks ({path}): {volumes:?}"
    );
    assert!(
        compose["services"]["prometheus"].is_mapping(),
        "a prometheus service"
    );
}

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
