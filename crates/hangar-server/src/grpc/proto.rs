//! The code generated from `proto/grpc_service.proto`: Triton's `inference` package as far
//! as Hangar serves it, with its server and client.
#![allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]

tonic::include_proto!("inference");
