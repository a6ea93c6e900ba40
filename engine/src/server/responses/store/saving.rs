//! Saving a finished response. A save that fails never throws the generation away: the
//! response is returned all the same, marked as not stored (`store: false` in the object, the
//! [`STORED_HEADER`] header on a whole response), counted on `/metrics`, logged with the
//! backend's error, and told by a `slotlight.store` span under the request's span; a later
//! `previous_response_id` to it is a 404 like any response the store does not hold.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{Span, SpanKind, Status, Tracer};
use opentelemetry::{Context, KeyValue};
use serde_json::{Value, json};
use slotlight_otel::{attr, span};

use super::{ResponseStore, StoredResponse};

/// The header of a whole (non-streamed) response saying whether it was stored: `false` when
/// the store failed to save it. Absent when the request did not ask for `store`.
pub const STORED_HEADER: &str = "x-slotlight-stored";

/// A response to store once it is whole: where, what is known before it is generated, and
/// the tracer its `slotlight.store` span goes out through.
pub struct Pending {
    /// Where it goes.
    pub store: Arc<ResponseStore>,
    /// What is known of it before it is generated.
    pub record: StoredResponse,
    /// The engine's request tracer.
    pub tracer: Arc<BoxedTracer>,
}

/// Whether a finished response was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// It is in the store: `GET` answers it and a continuation starts from its tokens.
    Stored,
    /// The store failed; the response is returned marked `store: false`.
    NotStored,
}

impl Saved {
    /// The [`STORED_HEADER`] value.
    pub fn header_value(self) -> &'static str {
        match self {
            Saved::Stored => "true",
            Saved::NotStored => "false",
        }
    }
}

impl Pending {
    /// Stores the response with its output items, its reply's token ids and its object. On
    /// failure, `object` is marked `store: false` and the failure is logged, counted and
    /// traced under `parent` (the request's span).
    pub async fn save(
        self,
        output: Vec<Value>,
        reply: Vec<u32>,
        object: &mut Value,
        parent: Option<&Context>,
    ) -> Saved {
        let started = SystemTime::now();
        let mut r = self.record;
        r.output = output;
        r.reply_tokens = reply;
        r.response = object.clone();
        let result = self.store.put(&r).await;
        let backend = self.store.describe();
        let saved = match &result {
            Ok(()) => Saved::Stored,
            Err(e) => {
                self.store.not_stored.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    response_id = %r.id,
                    backend,
                    error = %e,
                    "Responses.NotStored"
                );
                if let Value::Object(m) = object {
                    m.insert("store".into(), json!(false));
                }
                Saved::NotStored
            }
        };
        if let Some(parent) = parent {
            let mut sp = self
                .tracer
                .span_builder(span::STORE)
                .with_kind(SpanKind::Internal)
                .with_start_time(started)
                .with_attributes([
                    KeyValue::new(attr::STORE_BACKEND, backend),
                    KeyValue::new(attr::STORE_STORED, saved == Saved::Stored),
                ])
                .start_with_context(self.tracer.as_ref(), parent);
            if let Err(e) = &result {
                sp.set_attribute(KeyValue::new(attr::ERROR_TYPE, "store_failed"));
                sp.set_status(Status::error(e.to_string()));
            }
            sp.end();
        }
        saved
    }
}
