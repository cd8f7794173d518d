//! What deploys the worker: compose, Kubernetes, alerts, least-privilege roles, TLS to
//! Postgres.

pub(crate) mod alerts;
mod compose;
mod k8s;
mod kustomize;
mod least_privilege;
mod postgres_tls;
mod reworded_migrations;
