//! The W3C trace context of a call, so that a participant's request can carry it.
//!
//! The orchestrator gives every call the context of its attempt's span (of its saga's when that
//! saga is not sampled, or joined a caller's trace while nothing exports traces), and a step
//! hands it on as a `traceparent` header:
//!
//! ```
//! use saga_dsl::{StepContext, StepError};
//!
//! async fn charge(ctx: StepContext) -> Result<(), StepError> {
//!     let mut headers = vec![("idempotency-key", ctx.idempotency_key().to_string())];
//!     if let Some(trace) = ctx.trace() {
//!         headers.push(("traceparent", trace.traceparent()));
//!     }
//!     // … send the request with `headers`
//!     Ok(())
//! }
//! ```

use std::fmt;

/// A W3C trace context (<https://www.w3.org/TR/trace-context/>): a trace, a span in it, and
/// whether that span is recorded. Its text form is the `traceparent` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace's 16-byte id, never all zeros.
    pub trace_id: [u8; 16],
    /// The span's 8-byte id, never all zeros.
    pub span_id: [u8; 8],
    /// Whether the span is recorded (the `sampled` flag): a callee may record its own spans
    /// as children of it.
    pub sampled: bool,
}

impl TraceContext {
    /// The `traceparent` header: `00-<trace id>-<span id>-<flags>`, in lowercase hex.
    pub fn traceparent(&self) -> String {
        self.to_string()
    }

    /// The trace id in lowercase hex, as tracing back ends show it.
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            u8::from(self.sampled)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_the_w3c_form() {
        let trace = TraceContext {
            trace_id: [0x4b; 16],
            span_id: [0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd],
            sampled: true,
        };
        assert_eq!(
            trace.traceparent(),
            "00-4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b-0af7651916cd43dd-01"
        );
        let unsampled = TraceContext {
            sampled: false,
            ..trace
        };
        assert!(unsampled.traceparent().ends_with("-00"));
    }
}
