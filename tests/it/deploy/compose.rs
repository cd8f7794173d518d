//! The container deployment hangs together without Docker: `docker-compose.yml`,
//! `deploy/otel-collector.yaml`, `deploy/prometheus/prometheus.yml` and the
//! `Dockerfile` are parsed and cross-checked (pinned images, expected services,
//! restart policies, worker wiring, dependencies, collector pipelines, the metrics
//! path to Prometheus and Grafana, the `dev` profile's host ports).

use std::collections::BTreeSet;
use std::path::Path;

use serde_yaml::{Mapping, Value};

const EXPECTED_SERVICES: &[&str] = &[
    "kafka",
    "kafka-init",
    "redis",
    "postgres",
    "otel-collector",
    "jaeger",
    "prometheus",
    "grafana",
    "gateway-sim",
    "worker",
    "migrate",
];

/// Services that run until stopped: each must come back by itself after a crash.
const LONG_RUNNING: &[&str] = &[
    "kafka",
    "redis",
    "postgres",
    "otel-collector",
    "jaeger",
    "prometheus",
    "grafana",
    "gateway-sim",
    "worker",
];

const WORKER_ENV: &[&str] = &[
    "KAFKA_BROKERS",
    "DATABASE_URL",
    "REDIS_URL",
    "GATEWAY_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_SERVICE_NAME",
];

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml(relative: &str) -> Value {
    serde_yaml::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative} is not YAML: {e}"))
}

fn compose() -> Value {
    yaml("docker-compose.yml")
}

fn services(compose: &Value) -> &Mapping {
    compose
        .get("services")
        .and_then(Value::as_mapping)
        .expect("docker-compose.yml has a `services` mapping")
}

fn service_names(compose: &Value) -> BTreeSet<String> {
    services(compose)
        .keys()
        .map(|k| k.as_str().expect("service names are strings").to_owned())
        .collect()
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    services(compose)
        .get(name)
        .unwrap_or_else(|| panic!("no service {name:?}"))
}

/// A scalar as the string Docker would see (`KAFKA_NODE_ID: 1` is the string "1").
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `environment` as a map, whether written as a mapping or as a `KEY=VALUE` list.
fn environment(service: &Value) -> Vec<(String, String)> {
    match service.get("environment") {
        None => Vec::new(),
        Some(Value::Mapping(map)) => map
            .iter()
            .map(|(k, v)| {
                let key = k.as_str().expect("environment keys are strings").to_owned();
                (key, scalar(v).unwrap_or_default())
            })
            .collect(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|item| {
                let item = item.as_str().expect("environment entries are strings");
                let (key, value) = item.split_once('=').unwrap_or((item, ""));
                (key.to_owned(), value.to_owned())
            })
            .collect(),
        Some(other) => panic!("environment is neither a mapping nor a list: {other:?}"),
    }
}

/// `depends_on` names, whether written as a list or as a mapping with conditions.
fn depends_on(service: &Value) -> Vec<String> {
    match service.get("depends_on") {
        None => Vec::new(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .expect("depends_on entries are strings")
                    .to_owned()
            })
            .collect(),
        Some(Value::Mapping(map)) => map
            .keys()
            .map(|k| k.as_str().expect("depends_on keys are strings").to_owned())
            .collect(),
        Some(other) => panic!("depends_on is neither a list nor a mapping: {other:?}"),
    }
}

/// `name:tag` or `name@sha256:…`, with a tag other than `latest`. A registry port
/// (`host:5000/name`) is not a tag.
fn is_pinned(image: &str) -> bool {
    if let Some((_, digest)) = image.split_once('@') {
        return digest.starts_with("sha256:");
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((name, tag)) => !name.is_empty() && !tag.is_empty() && tag != "latest",
        None => false,
    }
}

#[test]
fn image_pinning_rule() {
    for pinned in [
        "apache/kafka:3.9.1",
        "redis:7.4.2",
        "registry.local:5000/team/app:1.2",
        "debian:bookworm-slim",
        "busybox@sha256:0123",
    ] {
        assert!(is_pinned(pinned), "{pinned} should count as pinned");
    }
    for floating in [
        "redis",
        "redis:latest",
        "registry.local:5000/team/app",
        "app:",
    ] {
        assert!(
            !is_pinned(floating),
            "{floating} should not count as pinned"
        );
    }
}

#[test]
fn every_service_has_a_pinned_image_or_a_build() {
    let compose = compose();
    for (name, service) in services(&compose) {
        let name = name.as_str().unwrap_or("?");
        let image = service.get("image").and_then(Value::as_str);
        let build = service.get("build");
        assert!(
            image.is_some() || build.is_some(),
            "service {name} has neither an image nor a build"
        );
        if let Some(image) = image {
            assert!(
                build.is_some() || is_pinned(image),
                "service {name}: image {image:?} is not pinned to a tag (or is `latest`)"
            );
            assert!(
                !image.ends_with(":latest"),
                "service {name}: image {image:?} uses `latest`"
            );
        }
    }
}

#[test]
fn expected_services_exist() {
    let names = service_names(&compose());
    let missing: Vec<&&str> = EXPECTED_SERVICES
        .iter()
        .filter(|s| !names.contains(**s))
        .collect();
    assert!(missing.is_empty(), "missing services: {missing:?}");
}

#[test]
fn worker_is_wired_to_the_other_services() {
    let compose = compose();
    let worker = service(&compose, "worker");
    let env = environment(worker);
    let keys: BTreeSet<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    let missing: Vec<&&str> = WORKER_ENV.iter().filter(|k| !keys.contains(**k)).collect();
    assert!(missing.is_empty(), "worker environment lacks {missing:?}");

    let value = |key: &str| {
        env.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    // Every address names a service of this file, so the worker reaches it in-network.
    let names = service_names(&compose);
    for (key, service) in [
        ("KAFKA_BROKERS", "kafka"),
        ("DATABASE_URL", "postgres"),
        ("REDIS_URL", "redis"),
        ("GATEWAY_URL", "gateway-sim"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "otel-collector"),
    ] {
        assert!(names.contains(service), "no service {service}");
        assert!(
            value(key).contains(service),
            "{key}={:?} does not point at the {service} service",
            value(key)
        );
    }
    assert!(!value("OTEL_SERVICE_NAME").is_empty());

    let command = worker
        .get("command")
        .map(|c| serde_yaml::to_string(c).unwrap())
        .unwrap_or_default();
    assert!(command.contains("run"), "worker command is {command:?}");
    let replicas = worker
        .get("deploy")
        .and_then(|d| d.get("replicas"))
        .and_then(Value::as_u64)
        .unwrap_or(1);
    assert!(replicas >= 2, "a consumer group of one is not a group");
    let healthcheck = worker
        .get("healthcheck")
        .map(|h| serde_yaml::to_string(h).unwrap())
        .unwrap_or_default();
    // The image has no shell tools: the binary's own `healthcheck` asks the worker's
    // /healthz at HEALTH_LISTEN.
    assert!(
        healthcheck.contains("payment-worker")
            && healthcheck.contains("healthcheck")
            && !healthcheck.contains("curl")
            && !value("HEALTH_LISTEN").is_empty(),
        "the worker health check is `payment-worker healthcheck` with HEALTH_LISTEN: {healthcheck}"
    );
}

#[test]
fn kafka_init_creates_the_topics() {
    let compose = compose();
    let init = service(&compose, "kafka-init");
    let script = serde_yaml::to_string(init.get("command").expect("kafka-init has a command"))
        .unwrap()
        + &serde_yaml::to_string(init.get("entrypoint").unwrap_or(&Value::Null)).unwrap();
    assert!(script.contains("/opt/kafka/bin/kafka-topics.sh"));
    for topic in ["payments.commands", "payments.results", "payments.dlq"] {
        assert!(script.contains(topic), "kafka-init does not create {topic}");
    }
    assert!(
        script.contains("--topic payments.commands --partitions 6"),
        "payments.commands should have 6 partitions"
    );
}

#[test]
fn every_dependency_names_an_existing_service() {
    let compose = compose();
    let names = service_names(&compose);
    for (name, service) in services(&compose) {
        for dependency in depends_on(service) {
            assert!(
                names.contains(&dependency),
                "service {} depends on unknown service {dependency:?}",
                name.as_str().unwrap_or("?")
            );
        }
    }
}

fn component_ids(config: &Value, section: &str) -> BTreeSet<String> {
    config
        .get(section)
        .and_then(Value::as_mapping)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_sequence)
        .map(|items| {
            items
                .iter()
                .map(|i| i.as_str().expect("component ids are strings").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn collector_pipelines_reference_defined_components() {
    let config = yaml("deploy/otel-collector.yaml");
    let settings = config
        .get("service")
        .expect("collector config has `service`");
    let pipelines = settings
        .get("pipelines")
        .and_then(Value::as_mapping)
        .expect("collector config has pipelines");
    let mut kinds = BTreeSet::new();
    for (name, pipeline) in pipelines {
        let name = name.as_str().unwrap_or("?");
        kinds.insert(name.split('/').next().unwrap_or(name).to_owned());
        for section in ["receivers", "processors", "exporters"] {
            let defined = component_ids(&config, section);
            let used = string_list(pipeline.get(section));
            if section != "processors" {
                assert!(!used.is_empty(), "pipeline {name} has no {section}");
            }
            for id in used {
                assert!(
                    defined.contains(&id),
                    "pipeline {name} uses {section} {id:?}, not defined"
                );
            }
        }
    }
    assert!(kinds.contains("traces") && kinds.contains("metrics"));
    let extensions = component_ids(&config, "extensions");
    for id in string_list(settings.get("extensions")) {
        assert!(extensions.contains(&id), "extension {id:?} is not defined");
    }

    // The compose file mounts exactly this file into the collector.
    let compose = compose();
    let collector = string_list(service(&compose, "otel-collector").get("volumes"));
    assert!(
        collector
            .iter()
            .any(|v| v.starts_with("./deploy/otel-collector.yaml:")),
        "otel-collector does not mount deploy/otel-collector.yaml: {collector:?}"
    );
}

/// `FROM [--platform=…] image [AS stage]` lines; a stage named earlier is no image.
fn dockerfile_images(dockerfile: &str) -> Vec<String> {
    let mut stages = BTreeSet::new();
    let mut images = Vec::new();
    for line in dockerfile.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("FROM")) {
            continue;
        }
        let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
        let Some(image) = rest.first() else { continue };
        if !stages.contains(*image) {
            images.push((*image).to_owned());
        }
        if rest.len() >= 3 && rest[1].eq_ignore_ascii_case("AS") {
            stages.insert(rest[2].to_owned());
        }
    }
    images
}

/// The instructions of one stage of the Dockerfile (`FROM … AS <name>` to the next `FROM`).
fn dockerfile_stage<'a>(dockerfile: &'a str, name: &str) -> Vec<&'a str> {
    let mut stage = Vec::new();
    let mut inside = false;
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with("FROM ") {
            inside = line.ends_with(&format!(" AS {name}"));
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            stage.push(line);
        }
    }
    assert!(!stage.is_empty(), "the Dockerfile has no stage {name}");
    stage
}

#[test]
fn dockerfile_base_images_are_pinned() {
    let dockerfile = read("Dockerfile");
    let images = dockerfile_images(&dockerfile);
    assert!(
        images.len() >= 2,
        "expected a builder and a runtime stage, found {images:?}"
    );
    for image in &images {
        assert!(is_pinned(image), "Dockerfile image {image:?} is not pinned");
    }
    assert!(
        images.first().is_some_and(|i| i.starts_with("rust:")),
        "the builder is a rust image: {images:?}"
    );
    assert!(
        images
            .last()
            .is_some_and(|i| i.starts_with("gcr.io/distroless/cc-debian12:")),
        "the runtime is distroless (no shell, no package manager): {images:?}"
    );
    assert!(dockerfile
        .contains("cargo build --release --locked --features kafka-oidc --bin payment-worker"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["payment-worker"]"#));
}

#[test]
fn the_runtime_image_holds_the_product_only_and_checks_itself() {
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile
            .lines()
            .rfind(|l| l.starts_with("FROM "))
            .is_some_and(|l| l.ends_with(" AS runtime")),
        "the last stage, which `docker build` builds by default, is the runtime"
    );
    let runtime = dockerfile_stage(&dockerfile, "runtime");
    let copies: Vec<&&str> = runtime.iter().filter(|l| l.starts_with("COPY ")).collect();
    assert!(
        copies
            .iter()
            .any(|l| l.ends_with("/usr/local/bin/payment-worker /usr/local/bin/payment-worker")),
        "the runtime copies the product-only binary: {copies:?}"
    );
    assert!(
        !copies.iter().any(|l| l.contains("devtools")),
        "the runtime must not carry the development tools: {copies:?}"
    );
    assert!(
        runtime.iter().any(|l| l.starts_with("HEALTHCHECK"))
            && runtime.contains(&r#"CMD ["payment-worker", "healthcheck"]"#),
        "the runtime checks itself with `payment-worker healthcheck`: {runtime:?}"
    );
    assert!(
        runtime.iter().any(|l| l.starts_with("USER 65532")),
        "the runtime runs as distroless's non-root user"
    );
    // OCI labels: what the image is, from which commit and where its source lives.
    for label in [
        "org.opencontainers.image.version=\"${VERSION}\"",
        "org.opencontainers.image.revision=\"${PAYMENT_WORKER_COMMIT}\"",
        "org.opencontainers.image.source=\"${SOURCE}\"",
    ] {
        assert!(dockerfile.contains(label), "missing label {label}");
    }
    let version_default = format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"));
    assert!(
        runtime.contains(&version_default.as_str()),
        "the image's version label defaults to Cargo.toml's ({version_default})"
    );
}

#[test]
fn the_image_builds_from_every_input_cargo_reads() {
    let dockerfile = read("Dockerfile");
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            // Every word but the last (the destination) is a source.
            words[..words.len().saturating_sub(1)].to_vec()
        })
        .collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for input in [
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "src",
        "migrations",
        // The offline cache the checked SQL statements compile against.
        ".sqlx",
        "native",
    ] {
        if root.join(input).exists() {
            assert!(
                copied.contains(&input),
                "the build stage does not copy {input}: `cargo build` in the image fails \
                 (copied: {copied:?})"
            );
        }
    }
}

fn restart_policy(service: &Value) -> Option<String> {
    service.get("restart").and_then(scalar)
}

#[test]
fn long_running_services_restart_after_a_crash() {
    let compose = compose();
    for name in LONG_RUNNING {
        let policy = restart_policy(service(&compose, name));
        assert!(
            matches!(policy.as_deref(), Some("always" | "unless-stopped" | "on-failure")),
            "service {name} has restart {policy:?}: a worker that exits on a dead part must be restarted"
        );
    }
    for one_shot in ["kafka-init", "migrate"] {
        assert_eq!(
            restart_policy(service(&compose, one_shot)).as_deref(),
            Some("no"),
            "{one_shot} runs once"
        );
    }
}

#[test]
fn workers_log_json_and_name_themselves_in_telemetry() {
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile
            .lines()
            .any(|l| l.trim() == "ENV LOG_FORMAT=json"),
        "the image logs JSON by default"
    );
    let compose = compose();
    let worker = service(&compose, "worker");
    // The replicas' service.instance.id is the container's host name, which the
    // worker reads itself (telemetry/resource.rs): no shell in the image has to put it in
    // OTEL_RESOURCE_ATTRIBUTES, and none could.
    assert!(
        worker.get("entrypoint").is_none(),
        "the runtime image has no shell to run an entrypoint script"
    );
    assert!(
        !serde_yaml::to_string(worker)
            .unwrap()
            .contains("service.instance.id"),
        "OTEL_RESOURCE_ATTRIBUTES would replace the worker's own instance id for every replica"
    );
}

#[test]
fn metrics_flow_from_the_collector_to_prometheus_and_grafana() {
    let compose = compose();
    let collector = yaml("deploy/otel-collector.yaml");
    let exporter = &collector["exporters"]["prometheus"];
    let endpoint = exporter["endpoint"]
        .as_str()
        .expect("prometheus exporter endpoint");
    let port = endpoint.rsplit(':').next().unwrap();
    assert!(
        exporter.get("namespace").is_none(),
        "a namespace doubles the payment_worker_ prefix"
    );

    let prometheus = service(&compose, "prometheus");
    let volumes = string_list(prometheus.get("volumes"));
    assert!(
        volumes
            .iter()
            .any(|v| v.starts_with("./deploy/prometheus:/etc/prometheus")),
        "{volumes:?}"
    );
    let config = yaml("deploy/prometheus/prometheus.yml");
    let scrape = &config["scrape_configs"][0];
    let targets = string_list(scrape["static_configs"][0].get("targets"));
    assert_eq!(targets, vec![format!("otel-collector:{port}")]);
    assert_eq!(
        scrape["honor_labels"].as_bool(),
        Some(true),
        "keep the workers' job and instance labels"
    );
    assert!(string_list(config.get("rule_files")).contains(&"alerts.yml".to_owned()));

    let names = service_names(&compose);
    for (name, needs) in [("prometheus", "otel-collector"), ("grafana", "prometheus")] {
        assert!(names.contains(needs));
        assert!(depends_on(service(&compose, name)).contains(&needs.to_owned()));
    }
    // Jaeger v2 receives OTLP directly on 4317, where the collector sends traces.
    let jaeger = service(&compose, "jaeger")["image"].as_str().unwrap();
    assert!(jaeger.starts_with("jaegertracing/jaeger:2."), "{jaeger}");
    assert_eq!(
        collector["exporters"]["otlp/jaeger"]["endpoint"].as_str(),
        Some("jaeger:4317")
    );
}

/// `host_ip:host_port:container_port` entries of a service.
fn published(service: &Value) -> Vec<String> {
    string_list(service.get("ports"))
}

fn profiles(service: &Value) -> Vec<String> {
    string_list(service.get("profiles"))
}

#[test]
fn the_dev_profile_publishes_postgres_redis_and_kafka_on_loopback() {
    let compose = compose();
    let mut forwarded = BTreeSet::new();
    for (name, definition) in services(&compose) {
        let name = name.as_str().unwrap();
        let ports = published(definition);
        let is_dev = profiles(definition).contains(&"dev".to_owned());
        for store_port in ["5432", "6379", "9092"] {
            let publishes = ports
                .iter()
                .any(|p| p.split(':').rev().nth(1) == Some(store_port));
            if publishes {
                assert!(
                    is_dev,
                    "{name} publishes {store_port} outside the dev profile"
                );
            }
        }
        if !is_dev {
            continue;
        }
        // Forwarders: listen on the published port, connect to the service.
        let command = serde_yaml::to_string(definition.get("command").unwrap()).unwrap();
        for port in &ports {
            assert!(
                port.starts_with("127.0.0.1:"),
                "{name} publishes {port} beyond loopback"
            );
            let host_port = port.split(':').nth(1).unwrap();
            assert!(
                command.contains(&format!("TCP-LISTEN:{host_port},")),
                "{name}: {command}"
            );
            forwarded.insert((host_port.to_owned(), command.clone()));
        }
    }
    let to = |port: &str| {
        forwarded
            .iter()
            .find(|(p, _)| p == port)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("the dev profile does not publish {port}"))
    };
    assert!(to("5432").contains("TCP:postgres:5432"));
    assert!(to("6379").contains("TCP:redis:6379"));
    // Kafka: the host port reaches a listener that advertises the host's address.
    let env = environment(service(&compose, "kafka"));
    let value = |key: &str| {
        env.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let external_port = value("KAFKA_LISTENERS")
        .split(',')
        .find_map(|l| l.strip_prefix("EXTERNAL://:").map(str::to_owned))
        .expect("an EXTERNAL listener");
    assert!(to("9092").contains(&format!("TCP:kafka:{external_port}")));
    assert!(value("KAFKA_ADVERTISED_LISTENERS").contains("EXTERNAL://127.0.0.1:9092"));
    assert!(value("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP").contains("EXTERNAL:PLAINTEXT"));
    // The host's tools use the worker's default URL, which carries no password.
    let postgres = environment(service(&compose, "postgres"));
    assert!(
        postgres
            .iter()
            .any(|(k, v)| k == "POSTGRES_HOST_AUTH_METHOD" && v == "trust"),
        "postgres://postgres@127.0.0.1:5432 must work from the host: {postgres:?}"
    );
}

fn url_user(url: &str) -> String {
    url::Url::parse(url)
        .map(|u| u.username().to_owned())
        .unwrap_or_default()
}

#[test]
fn workers_skip_migrations_and_log_in_with_another_role_than_migrate() {
    let compose = compose();
    let value = |service_name: &str, key: &str| {
        environment(service(&compose, service_name))
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .unwrap_or_default()
    };
    assert_eq!(value("worker", "MIGRATE"), "skip");
    let worker_user = url_user(&value("worker", "DATABASE_URL"));
    let owner_user = url_user(&value("migrate", "DATABASE_URL"));
    assert!(!worker_user.is_empty() && !owner_user.is_empty());
    assert_ne!(
        worker_user, owner_user,
        "workers must not log in as the owner"
    );
    assert_ne!(
        worker_user, "postgres",
        "workers must not log in as the superuser"
    );

    let volumes = string_list(service(&compose, "postgres").get("volumes"));
    assert!(
        volumes
            .iter()
            .any(|v| v.starts_with("./deploy/postgres/roles.sql:")
                && v.contains("/docker-entrypoint-initdb.d/")),
        "the roles script is not mounted for the postgres image's first start: {volumes:?}"
    );
    let roles = read("deploy/postgres/roles.sql");
    assert!(roles.contains(&format!("CREATE ROLE {worker_user} LOGIN")));
    assert!(roles.contains(&format!("CREATE ROLE {owner_user} LOGIN")));
    assert!(roles.contains(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {worker_user}"
    )));
}
