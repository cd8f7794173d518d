//! The resource every span and metric carries: service name and version, and the
//! replica's `service.instance.id` (its host name) unless the environment names it.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::otlp_target::env_set;
use super::SERVICE_NAME;

pub(super) fn resource() -> Resource {
    // The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself; what they
    // leave out is filled in here, never overridden.
    let mut builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !env_set("OTEL_SERVICE_NAME") {
        builder = builder.with_service_name(SERVICE_NAME);
    }
    let given = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    if let Some(instance) = instance_id(&given, host_name()) {
        builder = builder.with_attribute(KeyValue::new("service.instance.id", instance));
    }
    builder.build()
}

/// Each replica names itself (`service.instance.id`), so a collector keeps the
/// replicas' series apart and a restarted container continues its own: the host
/// name, which is the container's or the pod's, unless OTEL_RESOURCE_ATTRIBUTES
/// already says it. No shell in the image has to put it there.
fn instance_id(resource_attributes: &str, host: Option<String>) -> Option<String> {
    let given = resource_attributes
        .split(',')
        .any(|pair| pair.split('=').next().map(str::trim) == Some("service.instance.id"));
    if given {
        None
    } else {
        host.filter(|h| !h.is_empty())
    }
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::instance_id;

    #[test]
    fn a_replica_is_named_after_its_host_unless_the_attributes_name_it() {
        let host = || Some("worker-7f9c".to_owned());
        assert_eq!(instance_id("", host()).as_deref(), Some("worker-7f9c"));
        assert_eq!(
            instance_id("deployment.environment=prod", host()).as_deref(),
            Some("worker-7f9c")
        );
        assert_eq!(instance_id("a=b, service.instance.id=w1", host()), None);
        assert_eq!(instance_id("", None), None);
        assert_eq!(instance_id("", Some(String::new())), None);
    }
}
