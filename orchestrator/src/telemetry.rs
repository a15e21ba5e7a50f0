//! Traces of sagas, exported over OpenTelemetry's OTLP/HTTP (`serve --otlp-endpoint URL`).
//!
//! **One trace per saga**, however many processes, restarts and days it takes. Nothing of it
//! lives in memory between calls: a saga's trace context is derived from its log. Its trace is
//! the one its start joined (the `traceparent` of the start `POST`, kept in its row; a child
//! saga's is its parent's saga span) or else its own, whose trace id is the saga id. Its
//! **saga span** has an id derived from the saga id too, so every process finds the same one;
//! the span itself is exported when the saga ends, spanning its whole life.
//!
//! Every attempt of every action and compensation is a span, child of the saga span, with the
//! attributes `saga.id`, `saga.name`, `saga.step`, `saga.phase`, `saga.attempt` and
//! `saga.outcome`; a failed attempt has the error status and message. The call runs inside
//! its span's OpenTelemetry context, and the step is given that context
//! ([`saga_dsl::StepContext::trace`]) to send on as a `traceparent`. Webhook deliveries and
//! broker messages carry the saga span's `traceparent`.
//!
//! Spans go to a bounded queue that a thread of the SDK exports in batches
//! (`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, …): the engine never waits for the
//! collector, and a collector that is away costs dropped spans, never a slower saga. Without
//! an endpoint, [`Telemetry::disabled`], no span is built at all.
//!
//! The OpenTelemetry API and SDK are compiled only with the `otel` feature. Without it a
//! [`Telemetry`] is always disabled and the span code is absent; a saga still joins the trace of
//! its start's `traceparent` and passes it on to its steps, webhooks and broker messages.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use saga_dsl::{Phase, TraceContext};
use uuid::Uuid;
#[cfg(feature = "otel")]
use {
    crate::model::SagaStatus,
    opentelemetry::trace::{
        Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
        TraceState, Tracer as _, TracerProvider as _,
    },
    opentelemetry::KeyValue,
    opentelemetry_otlp::{Protocol, WithExportConfig},
    opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer},
    opentelemetry_sdk::Resource,
    std::time::{Duration, SystemTime},
};

use crate::model::{Millis, Saga};

/// The OpenTelemetry context of an attempt's span, which its call runs in.
#[cfg(feature = "otel")]
pub(crate) type Context = opentelemetry::Context;

/// Without the exporter there are no spans: no value of this type can exist, so every
/// `Option<Context>` is `None` and the code that handles spans is compiled out.
#[cfg(not(feature = "otel"))]
#[derive(Debug, Clone)]
pub(crate) enum Context {}

/// The service name spans carry unless `OTEL_SERVICE_NAME` says otherwise.
pub const DEFAULT_SERVICE_NAME: &str = "saga-orchestrator";

/// Why traces cannot be exported as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The endpoint is not an `http` or `https` URL.
    #[error("invalid OTLP endpoint {0:?}: give the collector's http(s)://HOST:PORT")]
    Endpoint(String),
    /// The exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
    /// Traces were asked for from a build without the exporter.
    #[error(
        "--otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) needs the \"otel\" feature: build \
         with --features otel, or unset it"
    )]
    NotBuilt,
}

/// Which sagas' traces are recorded: none, all, or a share of them chosen by saga id, so
/// that every process makes the same choice for a saga and a trace is whole or absent. A saga
/// that joins a caller's trace follows the caller's choice; a child saga, its parent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sampling {
    /// Whether traces are exported at all.
    exporting: bool,
    /// The share recorded, in millionths.
    per_million: u32,
}

impl Sampling {
    /// Nothing exports traces: a saga has a trace only if it joined a caller's.
    pub const NONE: Self = Self {
        exporting: false,
        per_million: 0,
    };
    /// Every trace is recorded.
    pub const ALL: Self = Self {
        exporting: true,
        per_million: 1_000_000,
    };

    /// `ratio` of the traces (0 to 1; outside, the nearest bound) are recorded; the others
    /// are traces all the same, marked not sampled.
    pub fn ratio(ratio: f64) -> Self {
        let clamped = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        Self {
            exporting: true,
            per_million: (clamped * 1_000_000.0).round() as u32,
        }
    }

    /// Whether the saga `id`, whose trace is its own, is recorded: decided by a hash of the
    /// id (whose bits are not all random: a UUIDv7 counts within its millisecond), the same in
    /// every process.
    pub fn records(self, id: Uuid) -> bool {
        if !self.exporting {
            return false;
        }
        match self.per_million {
            0 => false,
            1_000_000.. => true,
            share => {
                let (hi, lo) = id.as_u64_pair();
                // SplitMix64's finaliser: every bit of the id moves every bit of the result.
                let mut x = hi ^ lo.rotate_left(32);
                x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                x ^= x >> 31;
                u128::from(x) * 1_000_000 < u128::from(share) << 64
            }
        }
    }
}

/// Where the spans of sagas go: nowhere ([`Telemetry::disabled`], the default) or to an
/// OTLP/HTTP collector ([`Telemetry::otlp`]). Cheap to clone; the clones share one exporter.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Exporting>>,
    sampling: Sampling,
}

/// The exporter of an enabled `Telemetry`, built by [`Telemetry::otlp`].
#[cfg(feature = "otel")]
struct Exporting {
    provider: SdkTracerProvider,
    tracer: Tracer,
    endpoint: String,
}

/// Without the `otel` feature nothing exports: a `Telemetry` is always disabled.
#[cfg(not(feature = "otel"))]
enum Exporting {}

impl Exporting {
    fn endpoint(&self) -> &str {
        #[cfg(feature = "otel")]
        return &self.endpoint;
        #[cfg(not(feature = "otel"))]
        match *self {}
    }
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(e) => write!(f, "Telemetry(otlp {}, {:?})", e.endpoint(), self.sampling),
            None => f.write_str("Telemetry(disabled)"),
        }
    }
}

/// `url` if it is an `http` or `https` URL with a host.
#[cfg(feature = "otel")]
fn checked(url: &str) -> Result<&str, TelemetryError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(url),
        _ => Err(TelemetryError::Endpoint(url.to_owned())),
    }
}

/// The URL spans are posted to for the collector at `endpoint`: its `/v1/traces`, as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is read (a base URL, path included), unless it names that
/// path already.
#[cfg(feature = "otel")]
fn traces_url(endpoint: &str) -> Result<String, TelemetryError> {
    let base = checked(endpoint)?.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        Ok(base.to_owned())
    } else {
        Ok(format!("{base}/v1/traces"))
    }
}

impl Telemetry {
    /// No spans: nothing is built or exported.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Exports spans to the OTLP/HTTP collector at `endpoint` (`http://HOST:4318`, to which
    /// `/v1/traces` is added, or the full URL of its traces path), as protobuf, in batches.
    /// The service name is `OTEL_SERVICE_NAME`, else [`DEFAULT_SERVICE_NAME`]. Without the
    /// `otel` feature, [`TelemetryError::NotBuilt`].
    pub fn otlp(endpoint: &str) -> Result<Self, TelemetryError> {
        #[cfg(feature = "otel")]
        return Self::exporting_to(traces_url(endpoint)?);
        #[cfg(not(feature = "otel"))]
        {
            let _ = endpoint;
            Err(TelemetryError::NotBuilt)
        }
    }

    /// Exports spans to exactly `url`, as `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is read.
    /// Without the `otel` feature, [`TelemetryError::NotBuilt`].
    pub fn otlp_traces_url(url: &str) -> Result<Self, TelemetryError> {
        #[cfg(feature = "otel")]
        return Self::exporting_to(checked(url)?.to_owned());
        #[cfg(not(feature = "otel"))]
        {
            let _ = url;
            Err(TelemetryError::NotBuilt)
        }
    }

    #[cfg(feature = "otel")]
    fn exporting_to(url: String) -> Result<Self, TelemetryError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
        }
        // The saga's trace context decides (`Sampling`); the SDK only follows it.
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("orchestrator");
        Ok(Self {
            inner: Some(Arc::new(Exporting {
                provider,
                tracer,
                endpoint: url,
            })),
            sampling: Sampling::ALL,
        })
    }

    /// Records only `ratio` of the sagas' traces (chosen by saga id; see [`Sampling`]).
    pub fn with_sample_ratio(mut self, ratio: f64) -> Self {
        if self.is_enabled() {
            self.sampling = Sampling::ratio(ratio);
        }
        self
    }

    /// Which traces are recorded: [`Sampling::NONE`] when disabled.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// Whether spans are exported.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// A `tracing` layer that exports the spans an application's steps open (through
    /// `tracing`, at `INFO` or above) to the same collector, each a child of the attempt that
    /// runs it; `None` when disabled. The orchestrator's own and its dependencies' spans stay
    /// out (its traces are the sagas'), as do the exporter's logs, which would feed themselves.
    #[cfg(feature = "otel")]
    pub fn tracing_layer<S>(&self) -> Option<impl tracing_subscriber::Layer<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        const INTERNAL: &[&str] = &[
            "orchestrator",
            "opentelemetry",
            "tower",
            "tower_http",
            "axum",
            "hyper",
            "h2",
            "reqwest",
            "sqlx",
            "async_nats",
            "tokio",
            "rustls",
        ];
        let tracer = self.inner.as_ref()?.tracer.clone();
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                    let target = meta.target();
                    if *meta.level() > tracing::Level::INFO {
                        return false;
                    }
                    !INTERNAL.iter().any(|t| {
                        target
                            .strip_prefix(t)
                            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
                    })
                })),
        )
    }

    /// Exports the spans still queued and stops the exporter (blocking: call it from a
    /// blocking thread). Spans ended after this are dropped.
    pub fn shutdown(&self) {
        #[cfg(feature = "otel")]
        if let Some(e) = &self.inner {
            if let Err(err) = e.provider.shutdown() {
                tracing::warn!(error = %err, "exporting the last spans failed");
            }
        }
    }

    /// The trace context of saga `id` whose row holds `traceparent`, if it has one.
    pub(crate) fn saga_trace(&self, id: Uuid, traceparent: Option<&str>) -> Option<SagaTrace> {
        SagaTrace::of(id, traceparent, self.sampling)
    }
}

// Without the exporter the spans of sagas and attempts are never built.
#[cfg(not(feature = "otel"))]
impl Telemetry {
    pub(crate) fn saga_attrs(&self, _id: Uuid, _name: &str) -> SagaAttrs {
        SagaAttrs::default()
    }

    pub(crate) fn start_attempt(
        &self,
        _trace: &SagaTrace,
        _call: AttemptSpan<'_>,
    ) -> (Option<Context>, Option<Context>) {
        (None, None)
    }

    pub(crate) fn interrupted_attempt(
        &self,
        _trace: &SagaTrace,
        _call: AttemptSpan<'_>,
        _started_at: Millis,
    ) {
    }

    pub(crate) fn end_saga(&self, _saga: &Saga, _trace: &SagaTrace, _ended_at: Millis) {}
}

#[cfg(feature = "otel")]
impl Telemetry {
    /// The attributes every attempt span of saga `id` named `name` carries, made once for all
    /// its attempts (shared, not copied, by each span); none when disabled.
    pub(crate) fn saga_attrs(&self, id: Uuid, name: &str) -> SagaAttrs {
        if !self.is_enabled() {
            return SagaAttrs::default();
        }
        let text = |s: String| opentelemetry::StringValue::from(Arc::<str>::from(s));
        SagaAttrs(vec![
            KeyValue::new("saga.id", text(id.to_string())),
            KeyValue::new("saga.name", text(name.to_owned())),
        ])
    }

    /// Starts the span of an attempt (none when disabled or not sampled), and the context the
    /// call runs in: its span's, or, for an attempt not sampled, its saga's unsampled one, so
    /// that the spans its step opens are not recorded either.
    pub(crate) fn start_attempt(
        &self,
        trace: &SagaTrace,
        call: AttemptSpan<'_>,
    ) -> (Option<Context>, Option<Context>) {
        if !self.is_enabled() {
            return (None, None);
        }
        let span = self.attempt_span(trace, call, None);
        let run_in = span.clone().unwrap_or_else(|| trace.as_parent());
        (span, Some(run_in))
    }

    /// Emits the span of an attempt that a stopped process began and never recorded: from
    /// `started_at` to now, its outcome unknown. Called once the recovery that closed it as
    /// interrupted is committed, so a recovery that fails and is made again emits it once.
    pub(crate) fn interrupted_attempt(
        &self,
        trace: &SagaTrace,
        call: AttemptSpan<'_>,
        started_at: Millis,
    ) {
        if let Some(mut cx) = self.attempt_span(trace, call, Some(started_at)) {
            end_attempt(
                &mut cx,
                "interrupted",
                Some("interrupted: the process making this attempt stopped before recording its outcome"),
            );
        }
    }

    fn attempt_span(
        &self,
        trace: &SagaTrace,
        call: AttemptSpan<'_>,
        started_at: Option<Millis>,
    ) -> Option<Context> {
        let e = self.inner.as_ref()?;
        if !trace.context.sampled {
            // Not recorded: no span at all, rather than one the SDK would build and drop.
            return None;
        }
        let stage = call
            .step
            .split_once('/')
            .map_or(call.step, |(group, _)| group);
        let mut builder = e
            .tracer
            .span_builder(format!("{} {stage}", call.phase))
            .with_kind(SpanKind::Internal)
            .with_attributes(call.saga.0.iter().cloned().chain([
                KeyValue::new("saga.step", call.step.to_owned()),
                KeyValue::new("saga.phase", call.phase.as_str()),
                KeyValue::new("saga.attempt", i64::from(call.attempt)),
            ]));
        if let Some(at) = started_at {
            builder = builder.with_start_time(system_time(at));
        }
        let span = builder.start_with_context(&e.tracer, &trace.as_parent());
        Some(Context::new().with_span(span))
    }

    /// Emits the saga span of `saga`, which ended at `ended_at`: from its creation to then,
    /// with its status (an error unless it completed). Not for a `FAILED` saga, which waits
    /// for a person and may run again: its span is emitted once, when it has really ended.
    pub(crate) fn end_saga(&self, saga: &Saga, trace: &SagaTrace, ended_at: Millis) {
        let Some(e) = &self.inner else {
            return;
        };
        if saga.status == SagaStatus::Failed || !trace.context.sampled {
            return;
        }
        let mut builder = e
            .tracer
            .span_builder(format!("saga {}", saga.name))
            .with_kind(SpanKind::Internal)
            .with_span_id(SpanId::from_bytes(trace.context.span_id))
            .with_start_time(system_time(saga.created_at))
            .with_attributes([
                KeyValue::new("saga.id", saga.id.to_string()),
                KeyValue::new("saga.name", saga.name.clone()),
                KeyValue::new("saga.version", i64::from(saga.version)),
                KeyValue::new("saga.status", saga.status.as_str()),
            ]);
        let parent = match trace.parent {
            Some(span) => remote(trace.context.trace_id, span, trace.context.sampled),
            None => {
                builder = builder.with_trace_id(TraceId::from_bytes(trace.context.trace_id));
                Context::new()
            }
        };
        let mut span = builder.start_with_context(&e.tracer, &parent);
        if saga.status == SagaStatus::Completed {
            span.set_status(Status::Ok);
        } else {
            let why = saga.error.clone().unwrap_or_default();
            span.set_status(Status::error(format!("{}: {why}", saga.status.as_str())));
        }
        span.end_with_timestamp(system_time(ended_at));
    }
}

/// The saga's own attributes on its attempt spans ([`Telemetry::saga_attrs`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct SagaAttrs(#[cfg(feature = "otel")] Vec<KeyValue>);

/// What an attempt's span names.
#[derive(Debug, Clone, Copy)]
// Read only when spans are built (the `otel` feature).
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct AttemptSpan<'a> {
    /// The saga's attributes.
    pub(crate) saga: &'a SagaAttrs,
    /// The row's name: a stage, or `group/branch`.
    pub(crate) step: &'a str,
    /// Action or compensation.
    pub(crate) phase: Phase,
    /// Its number, from 1.
    pub(crate) attempt: u32,
}

/// Ends the attempt span of `cx` with its outcome; an error marks it failed.
pub(crate) fn end_attempt(cx: &mut Context, outcome: &'static str, error: Option<&str>) {
    #[cfg(feature = "otel")]
    {
        let span = cx.span();
        span.set_attribute(KeyValue::new("saga.outcome", outcome));
        match error {
            Some(message) => span.set_status(Status::error(message.to_owned())),
            None => span.set_status(Status::Ok),
        }
        span.end();
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (outcome, error);
        match *cx {}
    }
}

/// The W3C context of the span `cx` holds.
pub(crate) fn context_of(cx: &Context) -> TraceContext {
    #[cfg(feature = "otel")]
    {
        let span = cx.span();
        let sc = span.span_context();
        TraceContext {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            sampled: sc.is_sampled(),
        }
    }
    #[cfg(not(feature = "otel"))]
    match *cx {}
}

/// `run`, seeing `cx` as its current OpenTelemetry context.
pub(crate) fn within<F: Future>(run: F, cx: Context) -> impl Future<Output = F::Output> {
    #[cfg(feature = "otel")]
    return opentelemetry::trace::FutureExt::with_context(run, cx);
    #[cfg(not(feature = "otel"))]
    {
        // No value of `Context` exists: this is never called.
        let _ = cx;
        run
    }
}

/// A saga's place in a trace: its saga span, and the span that span is a child of (the start
/// request's caller, a parent saga), if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SagaTrace {
    /// The saga span's context, as sent with its webhook deliveries and broker messages.
    pub context: TraceContext,
    /// The id of the span the saga span is a child of.
    pub parent: Option<[u8; 8]>,
}

impl SagaTrace {
    /// The trace of saga `id` whose row holds `traceparent` (as [`parse_traceparent`] wrote
    /// it); a trace of its own is recorded as `sampling` decides for it. `None` when the saga
    /// joined no trace and nothing exports traces: a context nobody records would only tell
    /// the services it reaches not to record theirs.
    pub fn of(id: Uuid, traceparent: Option<&str>, sampling: Sampling) -> Option<Self> {
        let bytes = id.as_bytes();
        let mut span_id = [0u8; 8];
        span_id.copy_from_slice(&bytes[8..]);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        match traceparent.and_then(parse_traceparent) {
            Some(parent) => Some(Self {
                context: TraceContext {
                    trace_id: parent.trace_id,
                    span_id,
                    sampled: parent.sampled,
                },
                parent: Some(parent.span_id),
            }),
            None if sampling == Sampling::NONE => None,
            None => Some(Self {
                context: TraceContext {
                    trace_id: *bytes,
                    span_id,
                    sampled: sampling.records(id),
                },
                parent: None,
            }),
        }
    }

    /// The saga span as the remote parent of its attempts' spans (and, when the saga is not
    /// sampled, the context its calls run in, so that what they open is not recorded either).
    #[cfg(feature = "otel")]
    pub(crate) fn as_parent(&self) -> Context {
        remote(
            self.context.trace_id,
            self.context.span_id,
            self.context.sampled,
        )
    }
}

#[cfg(feature = "otel")]
fn remote(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Context {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(trace_id),
        SpanId::from_bytes(span_id),
        flags,
        true,
        TraceState::NONE,
    ))
}

/// A `traceparent` header's context, if it is a valid one (W3C Trace Context: an unknown
/// version's extra fields are ignored, an invalid header is no parent at all).
///
/// Read by the rules of the OpenTelemetry SDK's `TraceContextPropagator`, which this was
/// (a test compares the two), so that builds with and without the `otel` feature read a
/// header alike.
pub fn parse_traceparent(header: &str) -> Option<TraceContext> {
    /// The highest version a header may have (`ff` is invalid).
    const MAX_VERSION: u8 = 254;
    let parts: Vec<&str> = header.trim().split_terminator('-').collect();
    let [version, trace_id, span_id, flags, ..] = parts[..] else {
        return None;
    };
    let version = u8::from_str_radix(version, 16).ok()?;
    // Version 00 has exactly four fields; a later version may add some, ignored here.
    if version > MAX_VERSION || version == 0 && parts.len() != 4 {
        return None;
    }
    let lowercase = |s: &str| !s.chars().any(|c| c.is_ascii_uppercase());
    if !lowercase(trace_id) || !lowercase(span_id) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace_id, 16).ok()?;
    let span_id = u64::from_str_radix(span_id, 16).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    if version == 0 && flags > 2 {
        return None;
    }
    (trace_id != 0 && span_id != 0).then(|| TraceContext {
        trace_id: trace_id.to_be_bytes(),
        span_id: span_id.to_be_bytes(),
        sampled: flags & 1 == 1,
    })
}

#[cfg(feature = "otel")]
fn system_time(ms: Millis) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_read_and_a_bad_one_is_no_parent() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = parse_traceparent(tp).unwrap();
        assert_eq!(parsed.traceparent(), tp);
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_saga_joins_the_trace_it_was_started_in_with_a_span_of_its_own() {
        let id = Uuid::now_v7();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let joined = SagaTrace::of(id, Some(tp), Sampling::NONE).unwrap();
        assert_eq!(
            joined.context.trace_id_hex(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(joined.parent, Some(parse_traceparent(tp).unwrap().span_id));
        assert!(joined.context.sampled, "the caller's decision");
        // The same in every process, and the saga span's id is not the caller's.
        assert_eq!(SagaTrace::of(id, Some(tp), Sampling::ALL), Some(joined));
        assert_ne!(joined.context.span_id, joined.parent.unwrap());

        let own = SagaTrace::of(id, None, Sampling::ALL).unwrap();
        assert_eq!(own.context.trace_id, *id.as_bytes());
        assert_eq!(own.parent, None);
        assert!(own.context.sampled);
        assert!(
            !SagaTrace::of(id, None, Sampling::ratio(0.0))
                .unwrap()
                .context
                .sampled
        );
        assert_eq!(
            SagaTrace::of(id, None, Sampling::NONE),
            None,
            "nobody's trace"
        );
        assert_ne!(
            SagaTrace::of(Uuid::now_v7(), None, Sampling::ALL)
                .unwrap()
                .context
                .span_id,
            own.context.span_id
        );
    }

    #[test]
    fn a_share_of_the_sagas_is_recorded_the_same_way_everywhere() {
        let ids: Vec<Uuid> = (0..20_000).map(|_| Uuid::now_v7()).collect();
        for ratio in [0.0, 0.1, 0.5, 1.0] {
            let sampling = Sampling::ratio(ratio);
            let recorded = ids.iter().filter(|id| sampling.records(**id)).count();
            let share = recorded as f64 / ids.len() as f64;
            assert!((share - ratio).abs() < 0.02, "{ratio}: {share}");
            for id in &ids[..100] {
                assert_eq!(sampling.records(*id), sampling.records(*id));
            }
        }
        assert_eq!(Sampling::ratio(2.0), Sampling::ALL);
        assert!(!Sampling::ratio(f64::NAN).records(ids[0]));
        assert_ne!(
            Sampling::ratio(0.0),
            Sampling::NONE,
            "exported, none sampled"
        );
    }

    /// The header as the OpenTelemetry SDK's propagator reads it.
    #[cfg(feature = "otel")]
    fn by_the_sdk(header: &str) -> Option<TraceContext> {
        use opentelemetry::propagation::TextMapPropagator as _;
        let carrier =
            std::collections::HashMap::from([("traceparent".to_owned(), header.trim().to_owned())]);
        let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid().then(|| TraceContext {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            sampled: sc.is_sampled(),
        })
    }

    #[cfg(feature = "otel")]
    #[test]
    fn a_traceparent_is_read_as_the_opentelemetry_sdk_reads_it() {
        let cases = [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "fe-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "FE-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736f-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7f-01",
            "00-abc-def-01",
            "00-+abc-def-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "  00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01  ",
            "00--4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "",
            "-",
            "garbage",
        ];
        for header in cases {
            assert_eq!(parse_traceparent(header), by_the_sdk(header), "{header:?}");
        }
    }

    #[cfg(feature = "otel")]
    #[test]
    fn an_endpoint_gets_the_traces_path_unless_it_names_one() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://gateway/otlp").unwrap(),
            "https://gateway/otlp/v1/traces",
            "a base URL's path is kept"
        );
        assert_eq!(
            traces_url("https://collector/otlp/v1/traces").unwrap(),
            "https://collector/otlp/v1/traces"
        );
        assert!(traces_url("collector:4318").is_err());
        assert!(traces_url("grpc://collector:4317").is_err());
    }
}
