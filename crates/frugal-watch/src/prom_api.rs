//! Targets from a Prometheus server instead of scraping each one: one instant query
//! (`/api/v1/query`) for the series a [`Reading`](crate::Reading) reads, split by a label
//! (`instance` by default) into one [`Scrape`] per server. A fleet that Prometheus already
//! discovers (Kubernetes pod annotations, a service monitor, file or cloud discovery) is
//! one config entry, and frugal adds no load to the servers themselves.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::expo::{Sample, Scrape};

/// Every series a reading reads, and no bucket: the query stays small however large the
/// histograms are.
pub const SERIES: &[&str] = &[
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "tgi_request_success",
    "tgi_request_input_length_sum",
    "tgi_request_generated_tokens_sum",
    "tgi_batch_current_size",
    "tgi_queue_size",
    "tgi_batch_forward_duration_sum",
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "frugal_requests_total",
    "frugal_prompt_tokens_total",
    "frugal_generated_tokens_total",
    "frugal_running_sequences",
    "frugal_queue_depth",
    "frugal_engine_busy_seconds_total",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
];

/// The PromQL that asks for [`SERIES`], narrowed by `selector`'s matchers
/// (`{job=~"vllm.*"}`, braces optional).
pub fn query(selector: Option<&str>) -> String {
    let names = SERIES.join("|");
    let extra = selector
        .map(|s| {
            s.trim()
                .trim_start_matches('{')
                .trim_end_matches('}')
                .trim()
        })
        .filter(|s| !s.is_empty())
        .map_or(String::new(), |s| format!(",{s}"));
    format!("{{__name__=~\"{names}\"{extra}}}")
}

/// One server's series, as the query returned them.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The value of the label the series were split by.
    pub key: String,
    /// Labels every series of the group shares (`job`, `namespace`, a node or instance
    /// type label), to name, price and join the server.
    pub labels: BTreeMap<String, String>,
    pub scrape: Scrape,
}

#[derive(Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<Series>,
}

#[derive(Deserialize)]
struct Series {
    metric: BTreeMap<String, String>,
    /// `[unix seconds, "value"]`.
    value: (f64, String),
}

/// An instant query's JSON split by `group_by` into one scrape per server, in key order.
/// Series without the label are left out (they belong to no server).
pub fn groups(json: &str, group_by: &str) -> Result<Vec<Group>, String> {
    let response: Response =
        serde_json::from_str(json).map_err(|e| format!("not a Prometheus API answer ({e})"))?;
    if response.status != "success" {
        return Err(format!(
            "Prometheus refused the query: {}",
            response.error.as_deref().unwrap_or("no reason given")
        ));
    }
    let data = response.data.ok_or("a Prometheus answer without data")?;
    if data.result_type != "vector" {
        return Err(format!("expected a vector, got a {}", data.result_type));
    }
    let mut by_key: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    for s in data.result {
        if let Some(key) = s.metric.get(group_by) {
            by_key.entry(key.clone()).or_default().push(s);
        }
    }
    by_key
        .into_iter()
        .map(|(key, series)| {
            let mut labels = series[0].metric.clone();
            labels.remove("__name__");
            for s in &series[1..] {
                labels.retain(|k, v| s.metric.get(k) == Some(v));
            }
            let samples = series
                .into_iter()
                .map(|s| sample(s).map_err(|e| format!("{group_by}=\"{key}\": {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Group {
                key,
                labels,
                scrape: Scrape {
                    samples,
                    ..Scrape::default()
                },
            })
        })
        .collect()
}

fn sample(s: Series) -> Result<Sample, String> {
    let mut metric = s.metric;
    let name = metric.remove("__name__").ok_or("a series without a name")?;
    // Prometheus writes special values as words: NaN, +Inf, -Inf (which Rust reads).
    let value: f64 = s
        .value
        .1
        .parse()
        .map_err(|_| format!("`{name}` has the value `{}`", s.value.1))?;
    Ok(Sample {
        name,
        labels: metric.into_iter().collect(),
        value,
        timestamp_ms: Some((s.value.0 * 1000.0).round() as i64),
    })
}

/// Runs the query against the server at `base` (`http://prometheus:9090`).
pub async fn fetch(
    client: &reqwest::Client,
    base: &str,
    promql: &str,
    timeout: Duration,
) -> Result<String, String> {
    let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
    let with_query = reqwest::Url::parse_with_params(&url, [("query", promql)])
        .map_err(|e| format!("{url} is not a URL: {e}"))?;
    let response = client
        .get(with_query)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| {
            format!(
                "cannot query {url}: {}",
                frugal_cost::causes::with_causes(&e)
            )
        })?;
    let status = response.status();
    let body = crate::body::bounded_text(response, &format!("{url}'s answer")).await?;
    // A refused query is a 400 with the reason in the JSON: let `groups` say it.
    if !status.is_success() && !body.trim_start().starts_with('{') {
        return Err(format!("{url} answered {status}"));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reading::{Kind, Reading};

    const ANSWER: &str = r#"{"status":"success","data":{"resultType":"vector","result":[
      {"metric":{"__name__":"vllm:prompt_tokens_total","instance":"10.0.0.5:8000","job":"vllm","model_name":"m"},"value":[1764930000.5,"1200"]},
      {"metric":{"__name__":"vllm:generation_tokens_total","instance":"10.0.0.5:8000","job":"vllm","model_name":"m"},"value":[1764930000.5,"300"]},
      {"metric":{"__name__":"vllm:request_success_total","finished_reason":"stop","instance":"10.0.0.5:8000","job":"vllm","model_name":"m"},"value":[1764930000.5,"7"]},
      {"metric":{"__name__":"vllm:num_requests_running","instance":"10.0.0.5:8000","job":"vllm","model_name":"m"},"value":[1764930000.5,"2"]},
      {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0","Hostname":"node-a","instance":"10.0.0.5:9400","job":"dcgm"},"value":[1764930000.5,"55"]},
      {"metric":{"__name__":"frugal_queue_depth","job":"orphan"},"value":[1764930000.5,"0"]}
    ]}}"#;

    #[test]
    fn an_answer_is_one_scrape_per_instance() {
        let groups = groups(ANSWER, "instance").unwrap();
        let keys: Vec<&str> = groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(
            keys,
            ["10.0.0.5:8000", "10.0.0.5:9400"],
            "the orphan has none"
        );
        let vllm = Reading::detect(&groups[0].scrape).unwrap();
        assert_eq!(vllm.kind, Kind::Vllm);
        assert_eq!(vllm.prompt_tokens_total, Some(1200.0));
        assert_eq!((vllm.requests_total, vllm.running), (Some(7.0), Some(2.0)));
        assert_eq!(vllm.model.as_deref(), Some("m"));
        // Labels all its series share; `finished_reason` is on one only.
        assert_eq!(
            groups[0].labels.get("job").map(String::as_str),
            Some("vllm")
        );
        assert!(!groups[0].labels.contains_key("finished_reason"));
        let dcgm = Reading::detect(&groups[1].scrape).unwrap();
        assert_eq!((dcgm.kind, dcgm.gpu_util), (Kind::Dcgm, Some(0.55)));
        assert_eq!(dcgm.hostname.as_deref(), Some("node-a"));
    }

    #[test]
    fn refusals_and_strange_answers_say_what_they_are() {
        let refused =
            r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        assert_eq!(
            groups(refused, "instance").unwrap_err(),
            "Prometheus refused the query: parse error at char 3"
        );
        assert!(
            groups("<html>", "instance")
                .unwrap_err()
                .contains("not a Prometheus API answer")
        );
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(
            groups(matrix, "instance").unwrap_err(),
            "expected a vector, got a matrix"
        );
        let word = r#"{"status":"success","data":{"resultType":"vector","result":[
          {"metric":{"__name__":"tgi_queue_size","instance":"a"},"value":[1,"many"]}]}}"#;
        assert_eq!(
            groups(word, "instance").unwrap_err(),
            "instance=\"a\": `tgi_queue_size` has the value `many`"
        );
    }

    #[test]
    fn the_query_names_every_series_and_the_selector() {
        let q = query(Some(r#"{job=~"vllm.*"}"#));
        assert!(
            q.starts_with(r#"{__name__=~"vllm:request_success_total|"#),
            "{q}"
        );
        assert!(q.ends_with(r#"DCGM_FI_DEV_FB_USED",job=~"vllm.*"}"#), "{q}");
        assert_eq!(query(Some(" ")), query(None));
    }
}
