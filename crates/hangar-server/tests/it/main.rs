//! The integration tests of `hangar-server`, one binary for the crate (one link in CI): the
//! service in process through `HangarService::handle` over the stub engine, route family by
//! route family, and the listeners on loopback ports where connections are the subject.
//! `support` builds the services and sends the requests.

mod admin;
mod aliases;
mod anthropic;
mod auth;
mod bodies;
mod connections;
mod control;
mod edge;
mod events;
mod grpc;
mod leases;
mod limits;
mod local_agent;
mod node_metrics;
mod openai;
mod openapi;
mod quarantine;
mod readiness;
mod repository;
mod shedding;
mod streams;
mod support;
mod ui;
