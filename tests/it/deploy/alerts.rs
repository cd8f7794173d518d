//! Alerts and dashboard hold together: the rules pass `promtool` with a unit test
//! that fires and one that silences every alert, each alert links to its runbook
//! section, and the Grafana dashboard is provisioned against the Prometheus of the
//! compose file. (Which metric names the queries use is checked against a real
//! worker in `telemetry/metric_export.rs`; the Kubernetes manifests in `k8s.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_yaml::Value;

pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub(crate) fn yaml(relative: &str) -> Value {
    serde_yaml::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative} is not YAML: {e}"))
}

/// Runs a checker and fails with its output; a missing tool is a failure too, with
/// the line of `.ci/run` that installs it.
pub(crate) fn run(program: &str, args: &[&str], installed_by: &str) -> String {
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
    // Every runbook_url is absolute, under the one base the rules share.
    let bases: BTreeSet<String> = rules
        .values()
        .filter_map(|r| r["annotations"]["runbook_url"].as_str())
        .filter_map(|u| u.split_once('#').map(|(base, _)| base.to_owned()))
        .collect();
    assert_eq!(bases.len(), 1, "runbook bases: {bases:?}");
    let base = bases.first().unwrap();
    assert!(
        base.starts_with("https://") && base.ends_with("/OPERATIONS.md"),
        "{base}"
    );
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
        assert_eq!(file, base, "{name}");
        assert!(
            anchors.contains(fragment),
            "{name}: no section #{fragment} in docs/OPERATIONS.md"
        );
    }
    // `scripts/runbook-base` sets that base once for every rule and its unit test,
    // on a copy here; promtool's tests still pass under the new base.
    let copy = std::env::temp_dir().join(format!("rules-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&copy).unwrap();
    for file in ["alerts.yml", "alerts.test.yml"] {
        std::fs::copy(root().join("deploy/prometheus").join(file), copy.join(file)).unwrap();
    }
    let runbook_base = |args: &[&str]| {
        let output = Command::new(root().join("scripts/runbook-base"))
            .args(args)
            .env("RULES_DIR", &copy)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        )
    };
    assert_eq!(
        runbook_base(&[]),
        (Some(0), base.trim_end_matches("/OPERATIONS.md").to_owned())
    );
    assert_eq!(
        runbook_base(&["https://wiki.example.org/ops/pw/"]).0,
        Some(0)
    );
    assert_eq!(
        runbook_base(&["https://wiki.example.org/ops?pw"]).0,
        Some(2)
    );
    let old_base = base.trim_end_matches("/OPERATIONS.md");
    for file in ["alerts.yml", "alerts.test.yml"] {
        let text = std::fs::read_to_string(copy.join(file)).unwrap();
        let urls: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
            .map(str::trim)
            .collect();
        assert!(urls.len() >= rules.len(), "{file}: {urls:?}");
        for url in urls {
            assert!(
                url.starts_with("https://wiki.example.org/ops/pw/OPERATIONS.md#"),
                "{file}: {url}"
            );
        }
        assert!(!text.contains(old_base), "{file} still names {old_base}");
    }
    let promtool = Command::new("promtool")
        .args(["test", "rules", "alerts.test.yml"])
        .current_dir(&copy)
        .output()
        .unwrap_or_else(|e| panic!("promtool ({PROMTOOL}): {e}"));
    assert!(
        promtool.status.success(),
        "{}",
        String::from_utf8_lossy(&promtool.stdout)
    );
    std::fs::remove_dir_all(&copy).ok();

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
    // letters by kind, retries, token store failures, inconsistencies, panics,
    // gateway failures.
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
        (
            "gateway failures by operation, class and status",
            "sum by (operation, class, http_response_status_code) (rate(payment_worker_gateway_failures_total",
        ),
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
