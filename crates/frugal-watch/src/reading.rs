//! What kind of server a scrape came from, and its counters read into one normalized shape.
//!
//! Each engine names the same few facts differently (requests, prompt and generated tokens,
//! work running and waiting); a [`Reading`] is those facts, summed over the label sets an
//! engine splits them into (per model, per finish reason), so intervals and bills never
//! care which engine answered.

use crate::expo::{Sample, Scrape};

/// The servers `frugal watch` knows by their metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// vLLM's OpenAI-compatible server (`vllm:*`).
    Vllm,
    /// Hugging Face text-generation-inference (`tgi_*`).
    Tgi,
    /// llama.cpp's `llama-server --metrics` (`llamacpp:*`).
    Llamacpp,
    /// frugal's own gateway (`frugal_*`).
    Frugal,
    /// NVIDIA's DCGM exporter (`DCGM_FI_*`): GPUs, not requests.
    Dcgm,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Vllm => "vllm",
            Kind::Tgi => "tgi",
            Kind::Llamacpp => "llamacpp",
            Kind::Frugal => "frugal",
            Kind::Dcgm => "dcgm",
        }
    }
}

/// The metric names that identify each kind, in the order they are tried: a serving
/// engine before DCGM, so a body that merges both is read as the engine (its GPU fields
/// are read all the same).
const SIGNATURES: &[(Kind, &[&str])] = &[
    (
        Kind::Frugal,
        &[
            "frugal_requests_total",
            "frugal_prompt_tokens_total",
            "frugal_generated_tokens_total",
            "frugal_running_sequences",
            "frugal_queue_depth",
        ],
    ),
    (
        Kind::Vllm,
        &[
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:request_success_total",
            "vllm:gpu_cache_usage_perc",
            "vllm:kv_cache_usage_perc",
        ],
    ),
    (
        Kind::Tgi,
        &[
            "tgi_request_count",
            "tgi_request_success",
            "tgi_request_input_length",
            "tgi_request_generated_tokens",
            "tgi_batch_current_size",
            "tgi_queue_size",
        ],
    ),
    (
        Kind::Llamacpp,
        &[
            "llamacpp:prompt_tokens_total",
            "llamacpp:tokens_predicted_total",
            "llamacpp:requests_processing",
            "llamacpp:requests_deferred",
            "llamacpp:n_decode_total",
        ],
    ),
    (
        Kind::Dcgm,
        &[
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_POWER_USAGE",
        ],
    ),
];

/// The kind of server a scrape came from, by the metric names it carries (a histogram's
/// `_sum`/`_count`/`_bucket` series count as their family).
pub fn detect(scrape: &Scrape) -> Option<Kind> {
    SIGNATURES.iter().find_map(|(kind, names)| {
        scrape
            .names()
            .any(|n| names.contains(&family(n)))
            .then_some(*kind)
    })
}

fn family(series: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| series.strip_suffix(s))
        .unwrap_or(series)
}

const MIB: f64 = 1024.0 * 1024.0;

/// One scrape's facts. Counters are totals since the server started; `None` where the
/// server does not say.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reading {
    pub kind: Kind,
    /// Requests finished (successes, where the server counts outcomes apart).
    pub requests_total: Option<f64>,
    pub prompt_tokens_total: Option<f64>,
    pub generation_tokens_total: Option<f64>,
    /// Requests (or sequences) being worked on now.
    pub running: Option<f64>,
    /// Requests queued and not yet started.
    pub waiting: Option<f64>,
    /// Seconds the engine spent computing, where it counts them: a busy share that needs
    /// no sampling.
    #[serde(default)]
    pub busy_seconds_total: Option<f64>,
    /// Mean GPU utilization over the GPUs in the scrape, in [0, 1].
    pub gpu_util: Option<f64>,
    /// Framebuffer memory used, summed over the GPUs.
    pub gpu_mem_used_bytes: Option<f64>,
    /// The model served, where the server labels its series with it.
    pub model: Option<String>,
    /// The node a DCGM exporter runs on (its `Hostname` label), to join its GPUs to the
    /// servers there.
    #[serde(default)]
    pub hostname: Option<String>,
}

impl Reading {
    /// Reads a scrape as `kind`. GPU fields come from any DCGM series in the body.
    pub fn new(kind: Kind, s: &Scrape) -> Reading {
        let mut r = Reading {
            kind,
            requests_total: None,
            prompt_tokens_total: None,
            generation_tokens_total: None,
            running: None,
            waiting: None,
            busy_seconds_total: None,
            gpu_util: mean(s.series("DCGM_FI_DEV_GPU_UTIL")).map(|pct| pct / 100.0),
            gpu_mem_used_bytes: s.sum("DCGM_FI_DEV_FB_USED").map(|mib| mib * MIB),
            model: None,
            hostname: s
                .series("DCGM_FI_DEV_GPU_UTIL")
                .find_map(|x| x.label("Hostname"))
                .map(str::to_owned),
        };
        match kind {
            Kind::Vllm => {
                // Success is split by `finished_reason` (stop, length, abort): every
                // finished request was served, so they are summed.
                r.requests_total = s.sum("vllm:request_success_total");
                r.prompt_tokens_total = s.sum("vllm:prompt_tokens_total");
                r.generation_tokens_total = s.sum("vllm:generation_tokens_total");
                r.running = s.sum("vllm:num_requests_running");
                r.waiting = s.sum("vllm:num_requests_waiting");
                r.model = model_label(s, "vllm:", "model_name");
            }
            Kind::Tgi => {
                r.requests_total = s.sum("tgi_request_success");
                // Histograms of tokens per request: their sums are the token counters.
                r.prompt_tokens_total = s.sum("tgi_request_input_length_sum");
                r.generation_tokens_total = s.sum("tgi_request_generated_tokens_sum");
                r.running = s.sum("tgi_batch_current_size");
                r.waiting = s.sum("tgi_queue_size");
                // One forward pass at a time per batch (prefill and decode labelled apart).
                r.busy_seconds_total = s.sum("tgi_batch_forward_duration_sum");
            }
            Kind::Llamacpp => {
                // llama-server counts no requests, only tokens and decode calls. Its prompt
                // tokens leave out those its prompt cache held, which the requests' usage
                // (and so the unit cost) counts: the two are added back together.
                r.prompt_tokens_total = match (
                    s.sum("llamacpp:prompt_tokens_total"),
                    s.sum("llamacpp:prompt_tokens_cached_total"),
                ) {
                    (Some(computed), cached) => Some(computed + cached.unwrap_or(0.0)),
                    (None, cached) => cached,
                };
                r.generation_tokens_total = s.sum("llamacpp:tokens_predicted_total");
                r.running = s.sum("llamacpp:requests_processing");
                r.waiting = s.sum("llamacpp:requests_deferred");
            }
            Kind::Frugal => {
                // Rejected requests never reached a model; failed and cancelled ones
                // used it until they ended, and the gateway bills them too.
                r.requests_total = s.sum_where("frugal_requests_total", |x| {
                    x.label("status") != Some("rejected")
                });
                r.prompt_tokens_total = s.sum("frugal_prompt_tokens_total");
                r.generation_tokens_total = s.sum("frugal_generated_tokens_total");
                r.running = s.sum("frugal_running_sequences");
                r.waiting = s.sum("frugal_queue_depth");
                r.busy_seconds_total = s.sum("frugal_engine_busy_seconds_total");
                // The model its spend is counted under, once it has spent: one, or none.
                r.model = model_label(s, "frugal_spend_usd_total", "model");
            }
            Kind::Dcgm => {}
        }
        r
    }

    /// Reads a scrape as the kind it is detected to be; `None` when it is none we know.
    pub fn detect(s: &Scrape) -> Option<Reading> {
        detect(s).map(|kind| Reading::new(kind, s))
    }

    /// This reading with a separate DCGM target's GPU fields, for an engine whose GPUs
    /// are exported apart.
    pub fn with_gpu(mut self, gpu: &Reading) -> Reading {
        self.gpu_util = gpu.gpu_util.or(self.gpu_util);
        self.gpu_mem_used_bytes = gpu.gpu_mem_used_bytes.or(self.gpu_mem_used_bytes);
        self
    }
}

fn mean<'a>(samples: impl Iterator<Item = &'a Sample>) -> Option<f64> {
    let (sum, n) = samples.fold((0.0, 0u32), |(sum, n), s| (sum + s.value, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

/// The one model a server's series name, or `None` when they name none or several.
fn model_label(s: &Scrape, prefix: &str, label: &str) -> Option<String> {
    let mut models = s
        .samples
        .iter()
        .filter(|x| x.name.starts_with(prefix))
        .filter_map(|x| x.label(label));
    let first = models.next()?;
    models.all(|m| m == first).then(|| first.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expo::parse;

    #[test]
    fn each_kind_is_detected_by_its_names() {
        let cases = [
            (
                "vllm:num_requests_running{model_name=\"m\"} 1\n",
                Kind::Vllm,
            ),
            ("vllm:kv_cache_usage_perc 0.1\n", Kind::Vllm),
            (
                "# TYPE tgi_request_input_length histogram\ntgi_request_input_length_sum 5\n",
                Kind::Tgi,
            ),
            ("tgi_queue_size 0\n", Kind::Tgi),
            ("llamacpp:n_decode_total 7\n", Kind::Llamacpp),
            ("frugal_requests_total{status=\"ok\"} 3\n", Kind::Frugal),
            ("DCGM_FI_DEV_POWER_USAGE{gpu=\"0\"} 70\n", Kind::Dcgm),
            (
                "frugal_queue_depth 0\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 5\n",
                Kind::Frugal,
            ),
        ];
        for (body, kind) in cases {
            assert_eq!(detect(&parse(body).unwrap()), Some(kind), "{body}");
        }
        assert_eq!(
            detect(&parse("process_cpu_seconds_total 1\n").unwrap()),
            None
        );
        assert_eq!(detect(&parse("").unwrap()), None);
    }

    #[test]
    fn vllm_sums_over_finish_reasons_and_models() {
        let body = concat!(
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"a\"} 10\n",
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"a\"} 2\n",
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"b\"} 5\n",
            "vllm:prompt_tokens_total{model_name=\"a\"} 100\n",
            "vllm:prompt_tokens_total{model_name=\"b\"} 50\n",
            "vllm:num_requests_running{model_name=\"a\"} 1\n",
        );
        let r = Reading::detect(&parse(body).unwrap()).unwrap();
        assert_eq!(r.requests_total, Some(17.0));
        assert_eq!(r.prompt_tokens_total, Some(150.0));
        assert_eq!(r.generation_tokens_total, None);
        assert_eq!(r.running, Some(1.0));
        // Two models: none is named rather than one picked.
        assert_eq!(r.model, None);
    }

    #[test]
    fn frugal_leaves_out_rejected_requests() {
        let body = concat!(
            "frugal_requests_total{status=\"ok\"} 7\n",
            "frugal_requests_total{status=\"failed\"} 1\n",
            "frugal_requests_total{status=\"cancelled\"} 2\n",
            "frugal_requests_total{status=\"rejected\"} 40\n",
            "frugal_prompt_tokens_total 900\n",
            "frugal_generated_tokens_total 300\n",
            "frugal_running_sequences 2\n",
            "frugal_queue_depth 1\n",
            "frugal_spend_usd_total{model=\"SmolLM2-135M-Instruct.Q4_1\"} 0.0042\n",
        );
        let r = Reading::detect(&parse(body).unwrap()).unwrap();
        assert_eq!(r.kind, Kind::Frugal);
        assert_eq!(r.model.as_deref(), Some("SmolLM2-135M-Instruct.Q4_1"));
        assert_eq!(r.requests_total, Some(10.0));
        assert_eq!(
            (r.prompt_tokens_total, r.generation_tokens_total),
            (Some(900.0), Some(300.0))
        );
        assert_eq!((r.running, r.waiting), (Some(2.0), Some(1.0)));
    }

    #[test]
    fn llamacpp_prompt_tokens_add_back_the_cached_ones() {
        let body = concat!(
            "llamacpp:prompt_tokens_total 900\n",
            "llamacpp:prompt_tokens_cached_total 300\n",
            "llamacpp:tokens_predicted_total 50\n",
            "llamacpp:requests_processing 1\n",
        );
        let r = Reading::detect(&parse(body).unwrap()).unwrap();
        assert_eq!(r.kind, Kind::Llamacpp);
        assert_eq!(r.prompt_tokens_total, Some(1200.0));
        assert_eq!(r.requests_total, None, "llama-server counts no requests");
        let older = Reading::detect(&parse("llamacpp:prompt_tokens_total 900\n").unwrap()).unwrap();
        assert_eq!(older.prompt_tokens_total, Some(900.0));
    }

    #[test]
    fn gpu_fields_average_utilization_and_sum_memory() {
        let body = concat!(
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 90\n",
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"1\"} 30\n",
            "DCGM_FI_DEV_FB_USED{gpu=\"0\"} 1024\n",
            "DCGM_FI_DEV_FB_USED{gpu=\"1\"} 1024\n",
        );
        let gpu = Reading::detect(&parse(body).unwrap()).unwrap();
        assert_eq!(gpu.kind, Kind::Dcgm);
        assert_eq!(gpu.gpu_util, Some(0.6));
        assert_eq!(gpu.gpu_mem_used_bytes, Some(2048.0 * MIB));
        let engine = Reading::detect(&parse("tgi_queue_size 3\n").unwrap()).unwrap();
        assert_eq!(engine.gpu_util, None);
        let both = engine.with_gpu(&gpu);
        assert_eq!((both.kind, both.gpu_util), (Kind::Tgi, Some(0.6)));
        assert_eq!(both.waiting, Some(3.0));
    }
}
