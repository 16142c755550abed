//! Cascades: the local model answers first, with each token's logprob; the answer stands
//! when its confidence clears the route's threshold, else the request goes to the route's
//! last tier. Both tiers run through the one pipeline, so each is cached, metered and
//! settled like a direct request; a cached first tier is judged on the logprobs kept with
//! its answer, and an answer with none (unknown confidence) escalates.

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use frugal_cost::{Lever, Money};

use crate::cache::exact as cache;
use crate::cascade::route::{self, RouteConfig};
use crate::http::api::Usage;
use crate::http::error::ApiError;
use crate::http::render;
use crate::http::validate::Job;
use crate::meter::{self, ShadowOf};
use crate::request::pipeline::{self, Ask, Body, Finished};
use crate::request::shadow::{self, Served};
use crate::request::state::AppState;

/// Answers `job` through `route`.
pub async fn run(
    state: &AppState,
    route: Arc<RouteConfig>,
    job: Arc<Job>,
    ask: Ask<'_>,
) -> Response {
    let Some(local) = state.local() else {
        return ApiError::Internal(format!("route {} needs the local model", route.name))
            .into_response();
    };
    let local_name = local.name().to_owned();
    let last = route
        .tiers
        .last()
        .filter(|t| **t != local_name)
        .and_then(|t| state.upstream(t));
    let ask = Ask {
        policy: Some(state.policy(&route.name)),
        shadow_rate: route.shadow_rate,
        ..ask
    };
    let m = &state.inner.metrics;
    // Requests like those the cheap tier failed go straight to the last tier.
    if let (Some(skip), Some(last)) = (&route.skip, &last)
        && let Some(text) = cache::question_text(&job.body)
        && skip.skips(&text).await
    {
        let chain = format!("skip>{}", last.name());
        m.count_route(&route.name, &chain);
        let response = render::answer(
            state,
            last.clone(),
            for_tier(&job, last.name(), job.common.stream),
            &ask,
        )
        .await;
        return with_route(response, &chain);
    }
    let first = for_tier(&job, &local_name, false);
    let finished = match pipeline::start(state, local.clone(), &first, &ask).await {
        Ok(mut started) => {
            shadow::spawn(state, started.shadow.take());
            pipeline::finish(started).await
        }
        Err(e) => Err(e),
    };
    let finished = match finished {
        Ok(f) => f,
        Err(e) => return with_route(e.into_response(), &local_name),
    };
    let confidence = finished
        .judged
        .as_deref()
        .map(|lp| route::confidence(lp, route.quantile));
    let confident = confidence.is_some_and(|c| c >= route.threshold);
    match last.clone().filter(|_| !confident) {
        None => {
            m.count_route(&route.name, &local_name);
            // The cheap answer stands: a sampled share is checked on the last tier.
            if let (Some(reference), Body::Text { text, .. }) = (last, &finished.body) {
                let rate = route.shadow_rate.unwrap_or(state.inner.shadows.rate);
                state.shadow(rate, || {
                    Some(Served {
                        of: ShadowOf {
                            lever: Lever::Routing,
                            model: route.name.clone(),
                        },
                        text: text.clone(),
                        reference,
                        job: job.clone(),
                    })
                });
            }
            record_routing_saving(
                state,
                &route,
                &finished,
                ask.tenant.as_ref().map(|t| t.name.clone()),
            );
            let response = if job.common.stream {
                let usage = job
                    .common
                    .stream_options
                    .as_ref()
                    .is_some_and(|o| o.include_usage);
                render::replay_stream(finished, job.kind, &local_name, usage)
            } else {
                render::json(finished, job.kind, &local_name)
            };
            with_route(response, &local_name)
        }
        Some(next) => {
            m.count_route(&route.name, next.name());
            let chain = format!("{local_name}>{}", next.name());
            let tier = for_tier(&job, next.name(), job.common.stream);
            let mut response = render::answer(state, next, tier, &ask).await;
            // What the request cost in all: both tiers.
            let total = header_money(&response, "x-frugal-cost-usd").map(|c| c + finished.cost);
            if let Some(v) = total.and_then(|t| HeaderValue::from_str(&t.to_string_places(9)).ok())
            {
                response.headers_mut().insert("x-frugal-cost-usd", v);
            }
            with_route(response, &chain)
        }
    }
}

/// The job as one tier runs it.
fn for_tier(job: &Job, tier: &str, stream: bool) -> Arc<Job> {
    let mut j = job.clone();
    j.common.model = Some(tier.to_owned());
    j.common.stream = stream;
    j.body["model"] = serde_json::Value::String(tier.to_owned());
    Arc::new(j)
}

/// The cheap tier answered: the saving is what the last tier (an upstream priced per token)
/// would have charged for the same tokens, less what producing the answer cost. A cached
/// answer's production cost is counted here as if paid, since the cache's own saving
/// already books it: the two together never exceed what the last tier would have cost.
fn record_routing_saving(
    state: &AppState,
    route: &RouteConfig,
    f: &Finished,
    tenant: Option<String>,
) {
    let Some(meter) = &state.inner.meter else {
        return;
    };
    let Body::Text { usage, .. } = &f.body else {
        return;
    };
    let dearest = route
        .tiers
        .last()
        .and_then(|t| state.inner.upstreams.get(t));
    let usage: Usage = *usage;
    let Some(avoided) = dearest.and_then(|up| up.token_cost(&usage)) else {
        return;
    };
    let saved = avoided - f.produced;
    if saved > Money::ZERO {
        state
            .inner
            .metrics
            .add_saving(Lever::Routing, &route.name, saved);
        meter.record_saving(meter::Saving {
            started: std::time::SystemTime::now(),
            model: route.name.clone(),
            saved,
            lever: Lever::Routing,
            tenant,
        });
    }
}

fn header_money(r: &Response, name: &str) -> Option<Money> {
    r.headers().get(name)?.to_str().ok()?.parse().ok()
}

/// `r` with `x-frugal-route` naming the tiers a cascade tried.
fn with_route(mut r: Response, chain: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(chain) {
        r.headers_mut().insert("x-frugal-route", v);
    }
    r
}
