//! Capturing llama.cpp's own error lines while it loads a model.
//!
//! Once the host has installed `llama-cpp-2`'s log hook (`llama_cpp_2::send_logs_to_tracing`,
//! see [`crate::LlamaCppBackend::new`]), llama.cpp's log callback goes to the calling thread's
//! `tracing` dispatcher, and llama.cpp logs synchronously on the thread that called it.
//! Loading on the worker thread under a capturing subscriber therefore collects exactly this
//! load's reasons ("llama_model_load: error loading model: …"), which a bare `NullResult`
//! lacks. Without the hook llama.cpp writes to stderr and nothing is captured.

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Lines logged at WARN or ERROR.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<(Level, String)>>>);

impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let level = *event.metadata().level();
        if level > Level::WARN {
            return;
        }
        let mut visitor = Message(String::new());
        event.record(&mut visitor);
        let line = visitor.0.trim().to_owned();
        if !line.is_empty() {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((level, line));
        }
    }
}

struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" || field.name() == "text" {
            self.0.push_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" || field.name() == "text" {
            self.0.push_str(&format!("{value:?}"));
        }
    }
}

/// Runs `f`, returning its result and the error lines (ERROR first, then WARN) logged on
/// this thread meanwhile. Captured lines are re-emitted to the outer dispatcher.
pub(crate) fn errors_during<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::registry().with(lines.clone());
    let result = tracing::subscriber::with_default(subscriber, f);
    let captured =
        std::mem::take(&mut *lines.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    for (level, line) in &captured {
        if *level == Level::ERROR {
            tracing::error!(target: "llama_cpp", "{line}");
        } else {
            tracing::warn!(target: "llama_cpp", "{line}");
        }
    }
    let mut errors: Vec<String> =
        captured.iter().filter(|(l, _)| *l == Level::ERROR).map(|(_, s)| s.clone()).collect();
    if errors.is_empty() {
        errors = captured.into_iter().map(|(_, s)| s).collect();
    }
    (result, errors)
}
