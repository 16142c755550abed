//! Why the accelerator idles.
//!
//! The watchdog samples the accelerators' utilization through NVML (loaded at run time: a
//! machine without the driver runs in CPU-only mode, where the trainer's process group's CPU
//! time over the machine's cores stands in for it) and the CPU and I/O of the trainer's
//! process group from /proc, and reads the step timings the trainer appends to its metrics
//! file. From a window of both it names the cause of idle time and the fix to try.
//!
//! Idle time has two kinds of cause. The run idles by itself (it waits for data, syncs with
//! the host, or runs batches too small to fill the device), or the host is contended: other
//! processes, or the hypervisor (steal time), take the cores the run would use. The machine's
//! CPU counters (/proc/stat, all CPUs) against the run's own CPU time tell them apart: when
//! the host has no idle core left and a good part of it went to others or to steal, the
//! run's idling is the host's doing, and the fix is the host's, not the batch size.
//!
//! Busy is not the same as useful. Where the trainer reports its model FLOPs (or its
//! parameters and tokens, for the 6N rule) and the machine's peak is known (the catalog's
//! accelerators at the reported precision, or `--peak-tflops`), the watchdog computes the
//! model FLOPs utilization (MFU), and it names a run that computes in FP32 or TF32 on an
//! accelerator with a faster precision.

use std::collections::VecDeque;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use frugal_cloud::price::Pricing;
use frugal_cost::catalog::{AcceleratorPeaks, Faster};
use frugal_cost::present::pct1;
use frugal_cost::{Catalog, Precision};
use nvml_wrapper::Nvml;
use serde::{Deserialize, Deserializer};

/// Below this busy share the accelerator is idling enough to say why.
const BUSY: f64 = 0.75;
/// Share of step time spent waiting on data (or syncs) that explains idle time.
const STALL_SHARE: f64 = 0.2;
/// Host CPU use, as a share of all cores, above which the host is the bottleneck.
const HOST_SATURATED: f64 = 0.9;
/// Share of the cores other processes and steal must take, on a host with no idle core
/// left, for the run's idle time to be the host's contention rather than its own.
const CONTENDED: f64 = 0.25;
/// How much history a diagnosis looks at.
const WINDOW: Duration = Duration::from_secs(30);
/// What a diagnosis needs before it speaks.
const MIN_STEPS: usize = 10;
const MIN_SPAN: Duration = Duration::from_secs(2);

/// One line of the trainer's metrics file (docs/training.md).
#[derive(Debug, Clone, Deserialize)]
pub struct StepMetrics {
    pub step: u64,
    pub step_s: f64,
    #[serde(default)]
    pub data_s: f64,
    #[serde(default)]
    pub sync_s: f64,
    pub batch: Option<u64>,
    pub loss: Option<f64>,
    /// Tokens (or samples) the step processed.
    pub tokens: Option<f64>,
    /// Model FLOPs of the step, forward and backward.
    pub flops: Option<f64>,
    /// Parameters: without `flops`, 6 · params · tokens stands in for them.
    pub params: Option<f64>,
    /// What the step's matmuls compute in; absent or unrecognised: unknown.
    #[serde(default, deserialize_with = "lenient_precision")]
    pub precision: Option<Precision>,
    /// The whole line, for fields the watchdog does not know (a tuner's metric).
    #[serde(skip)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl StepMetrics {
    /// A numeric field of the line by name (`step` and the named fields included).
    pub fn number(&self, name: &str) -> Option<f64> {
        self.fields.get(name).and_then(serde_json::Value::as_f64)
    }

    /// The step's model FLOPs: as reported, else 6 · params · tokens (forward and backward
    /// of a dense model, attention left out).
    pub fn model_flops(&self) -> Option<f64> {
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        self.flops
            .filter(|f| valid(*f))
            .or_else(|| Some(6.0 * self.params? * self.tokens?).filter(|f| valid(*f)))
    }
}

/// A precision the contract does not name ("amp", "mixed") is unknown, not a bad line.
fn lenient_precision<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Precision>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| v.as_str()?.parse().ok()))
}

/// What a run's FLOP/s are measured against for MFU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peak {
    /// The catalog's accelerator and how many the machine has.
    pub accelerators: Option<(AcceleratorPeaks, f64)>,
    /// The whole machine's peak TFLOPS as the user gave it (`--peak-tflops`), for the
    /// precision the run computes in; it wins over the catalog's.
    pub given_tflops: Option<f64>,
}

impl Peak {
    /// What a run's model FLOPs are measured against: `given_tflops` (the whole machine's,
    /// `--peak-tflops`) when given, and the catalog's accelerators of the machine's instance
    /// type, whose faster precisions the watchdog points out.
    pub fn of(catalog: &Catalog, machine: &Pricing, given_tflops: Option<f64>) -> Peak {
        let accelerators = machine
            .instance_type
            .as_deref()
            .and_then(|i| catalog.instance(i, machine.region.as_deref()).ok())
            .and_then(|offer| {
                let peaks = catalog.peaks(offer.accelerator.as_deref()?)?;
                Some((peaks.clone(), offer.accelerator_count))
            })
            .filter(|(_, count)| *count > 0.0);
        Peak {
            accelerators,
            given_tflops,
        }
    }

    /// [`Peak::of`], refusing a given peak that is not a positive number, and saying when no
    /// peak is known (runs then go without their MFU).
    pub fn checked(
        catalog: &Catalog,
        machine: &Pricing,
        given_tflops: Option<f64>,
    ) -> Result<Peak, String> {
        if let Some(t) = given_tflops.filter(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(format!(
                "--peak-tflops: `{t}` is not a positive number of TFLOPS"
            ));
        }
        let peak = Peak::of(catalog, machine, given_tflops);
        if peak == Peak::default() {
            tracing::info!(
                "no peak FLOPS known for this machine: give --peak-tflops (or --instance with a catalog GPU) for its MFU"
            );
        }
        Ok(peak)
    }

    /// The machine's peak FLOP/s at `precision`; `None` when unknown.
    pub fn flops_per_s(&self, precision: Option<Precision>) -> Option<f64> {
        if let Some(t) = self.given_tflops {
            return Some(t * 1e12);
        }
        let (peaks, count) = self.accelerators.as_ref()?;
        Some(peaks.tflops(precision?)? * count * 1e12)
    }

    /// A faster precision than `precision` on the catalog's accelerator.
    pub fn faster(&self, precision: Option<Precision>) -> Option<Faster> {
        self.accelerators.as_ref()?.0.faster_than(precision?)
    }

    /// "8 x A100".
    fn describe(&self) -> String {
        match &self.accelerators {
            Some((p, count)) if *count == 1.0 => p.accelerator.clone(),
            Some((p, count)) => format!("{count} x {}", p.accelerator),
            None => "this machine".into(),
        }
    }
}

/// Step timings and model FLOPs summed over some steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub steps: u64,
    pub step_s: f64,
    pub data_s: f64,
    pub sync_s: f64,
    /// Whether any step reported `data_s` (`sync_s`): a share of 0 is then measured.
    pub data_seen: bool,
    pub sync_seen: bool,
    /// Model FLOPs of the steps that report them, and those steps' time.
    pub flops: f64,
    pub flops_step_s: f64,
    /// The newest precision reported.
    pub precision: Option<Precision>,
}

impl Totals {
    pub fn add(&mut self, m: &StepMetrics) {
        let step_s = m.step_s.max(0.0);
        self.steps += 1;
        self.step_s += step_s;
        self.data_s += m.data_s.max(0.0);
        self.sync_s += m.sync_s.max(0.0);
        self.data_seen |= m.fields.contains_key("data_s");
        self.sync_seen |= m.fields.contains_key("sync_s");
        if let Some(f) = m.model_flops() {
            self.flops += f;
            self.flops_step_s += step_s;
        }
        self.precision = m.precision.or(self.precision);
    }

    /// Achieved model FLOP/s over the steps that report FLOPs.
    pub fn flops_per_s(&self) -> Option<f64> {
        (self.flops_step_s > 0.0).then(|| self.flops / self.flops_step_s)
    }

    /// Model FLOPs utilization against `peak`: achieved FLOP/s over the peak FLOP/s.
    pub fn mfu(&self, peak: &Peak) -> Option<f64> {
        let peak = peak.flops_per_s(self.precision).filter(|p| *p > 0.0)?;
        Some(self.flops_per_s()? / peak)
    }

    fn share(&self, part: f64, seen: bool) -> Option<f64> {
        (seen && self.step_s > 0.0).then(|| (part / self.step_s).clamp(0.0, 1.0))
    }

    /// Share of step time spent waiting on data.
    pub fn data_stall(&self) -> Option<f64> {
        self.share(self.data_s, self.data_seen)
    }

    /// Share of step time spent blocked on host syncs.
    pub fn sync_stall(&self) -> Option<f64> {
        self.share(self.sync_s, self.sync_seen)
    }
}

/// Follows the metrics file as the trainer appends to it; a torn last line waits for its end.
#[derive(Debug)]
pub struct MetricsTail {
    path: PathBuf,
    offset: u64,
    bad_lines: u64,
}

impl MetricsTail {
    /// Starts at the file's current end: earlier segments' lines are not this segment's.
    pub fn new(path: &Path) -> MetricsTail {
        let offset = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        MetricsTail {
            path: path.to_owned(),
            offset,
            bad_lines: 0,
        }
    }

    /// The complete lines appended since the last call.
    pub fn read_new(&mut self) -> Vec<StepMetrics> {
        let Ok(mut file) = fs::File::open(&self.path) else {
            return Vec::new();
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut reader = BufReader::new(file);
        let mut line = String::new();
        while let Ok(n) = reader.read_line(&mut line) {
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            self.offset += n as u64;
            let parsed =
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line.trim())
                    .and_then(|fields| {
                        let mut m =
                            StepMetrics::deserialize(serde_json::Value::Object(fields.clone()))?;
                        m.fields = fields;
                        Ok(m)
                    });
            match parsed {
                Ok(m) => out.push(m),
                Err(e) if !line.trim().is_empty() => {
                    self.bad_lines += 1;
                    if self.bad_lines == 1 {
                        tracing::warn!(
                            "{}: a metrics line is not the documented JSON ({e}); such lines are skipped",
                            self.path.display()
                        );
                    }
                }
                Err(_) => {}
            }
            line.clear();
        }
        out
    }
}

/// NVML and the number of GPUs it sees.
struct Gpus {
    nvml: Nvml,
    count: u32,
}

/// Cumulative counters of the trainer's process group, and the host's, at one instant.
#[derive(Debug, Clone, Copy)]
struct Counters {
    at: Instant,
    cpu_s: f64,
    read_bytes: u64,
    /// `None` where /proc/stat cannot be read.
    host: Option<HostTicks>,
}

/// The `cpu` line of /proc/stat (all CPUs together), in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostTicks {
    /// user, nice, system, irq, softirq: some process (or the kernel for it) ran.
    pub busy: u64,
    /// idle and iowait: nothing to run.
    pub idle: u64,
    /// Time the hypervisor gave this VM's CPUs to someone else.
    pub steal: u64,
    /// The number of CPUs (`cpuN` lines).
    pub cpus: u32,
}

impl HostTicks {
    /// Parses /proc/stat; `None` without a well-formed `cpu` line.
    pub fn parse(stat: &str) -> Option<HostTicks> {
        let mut lines = stat.lines();
        let fields: Vec<u64> = lines
            .find_map(|l| l.strip_prefix("cpu "))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        // already in user and nice.
        let f = |i: usize| fields.get(i).copied().unwrap_or(0);
        if fields.len() < 4 {
            return None;
        }
        let cpus = stat
            .lines()
            .filter(|l| {
                l.strip_prefix("cpu")
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            })
            .count();
        Some(HostTicks {
            busy: f(0) + f(1) + f(2) + f(5) + f(6),
            idle: f(3) + f(4),
            steal: f(7),
            cpus: u32::try_from(cpus).unwrap_or(u32::MAX).max(1),
        })
    }

    fn read() -> Option<HostTicks> {
        HostTicks::parse(&fs::read_to_string("/proc/stat").ok()?)
    }
}

/// The host's CPUs over an interval, in cores (a core's worth of time per second).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLoad {
    pub cpus: f64,
    /// What processes other than the run's used.
    pub others: f64,
    /// What the hypervisor took.
    pub steal: f64,
    /// What nobody used.
    pub idle: f64,
}

impl HostLoad {
    /// The load between two readings, given the run's own CPU seconds over them; `None` when
    /// no tick passed.
    pub fn between(a: HostTicks, b: HostTicks, own_cpu_s: f64, ticks_per_s: f64) -> Option<Self> {
        let busy = b.busy.saturating_sub(a.busy) as f64;
        let idle = b.idle.saturating_sub(a.idle) as f64;
        let steal = b.steal.saturating_sub(a.steal) as f64;
        let total = busy + idle + steal;
        if total <= 0.0 || ticks_per_s <= 0.0 {
            return None;
        }
        let cpus = f64::from(b.cpus);
        // Ticks of all CPUs together: the interval's wall time is total / cpus.
        let wall_s = total / cpus / ticks_per_s;
        let cores = |ticks: f64| ticks / total * cpus;
        Some(HostLoad {
            cpus,
            others: (cores(busy) - own_cpu_s / wall_s).max(0.0),
            steal: cores(steal),
            idle: cores(idle),
        })
    }
}

/// What one interval between two samples measured.
#[derive(Debug, Clone, Copy)]
struct Interval {
    end: Instant,
    seconds: f64,
    /// Accelerator busy share in [0, 1].
    device: f64,
    /// The process group's CPU use as a share of all cores.
    host_cpu: f64,
    read_bytes: u64,
    host: Option<HostLoad>,
}

/// Why the accelerator idles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    DataStarved,
    SyncStalls,
    HostCpuBound,
    /// Other processes or the hypervisor take the cores the run would use.
    HostContention,
    SmallBatch,
    /// It computes in FP32 or TF32 where the accelerator has a faster precision.
    SlowPrecision,
}

impl Cause {
    pub fn fix(self) -> &'static str {
        match self {
            Cause::DataStarved => {
                "load data ahead of the step: more loader workers (DataLoader num_workers), \
                 pin_memory and prefetching, or a faster or cached copy of the data"
            }
            Cause::SyncStalls => {
                "stop syncing with the host every step: no .item()/.cpu() on the hot path, \
                 overlap gradient all-reduce with backward, log every N steps"
            }
            Cause::HostCpuBound => {
                "move preprocessing out of the training process (more loader workers, \
                 pre-tokenized data) or use an instance with more vCPUs"
            }
            Cause::HostContention => {
                "give the run the machine: stop, move or renice the other work on it (or pin \
                 it to other cores); with steal time, the hypervisor's other tenants take the \
                 CPU: move to a dedicated or larger instance"
            }
            Cause::SmallBatch => {
                "raise the batch size (scale the learning rate with it) so each step fills \
                 the accelerator, or fuse kernels (torch.compile, CUDA graphs)"
            }
            Cause::SlowPrecision => {
                "autocast the forward pass and loss (torch.autocast; FP16 needs a GradScaler, \
                 BF16 does not), or at least allow TF32 matmuls; docs/training.md shows the lines"
            }
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::DataStarved => "data loading starves it",
            Cause::SyncStalls => "host-device syncs stall it",
            Cause::HostCpuBound => "the host CPU is saturated",
            Cause::HostContention => "host contention",
            Cause::SmallBatch => "the batch is too small",
            Cause::SlowPrecision => "it computes in a slower precision than the accelerator has",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    pub cause: Cause,
    /// The accelerator's busy share over the window.
    pub busy: f64,
    /// The figures behind the cause, for the log line.
    pub evidence: String,
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cause == Cause::SlowPrecision {
            // Busy or not, the accelerator does a fraction of the work it could.
            return write!(f, "the run {}; try: {}", self.evidence, self.cause.fix());
        }
        write!(
            f,
            "the accelerator is busy {:.0}% of the time: {} ({}); try: {}",
            self.busy * 100.0,
            self.cause,
            self.evidence,
            self.cause.fix()
        )
    }
}

pub struct Watchdog {
    /// `None` in CPU-only mode, where the CPU is the accelerator.
    gpus: Option<Gpus>,
    /// Whether a saturated host CPU is a cause (not when the CPU is the accelerator).
    host_is_apart: bool,
    cores: f64,
    ticks_per_s: f64,
    pgid: i32,
    last: Option<Counters>,
    intervals: VecDeque<Interval>,
    steps: VecDeque<(Instant, StepMetrics)>,
    /// Busy time and wall time over the whole segment, for the ledger's utilization.
    busy_s: f64,
    wall_s: f64,
    /// The segment's step metrics summed, for its MFU and stall shares.
    segment: Totals,
    peak: Peak,
    said: Vec<Cause>,
}

impl Watchdog {
    /// Loads NVML once; without it (no driver, no GPU) says so once and watches the CPU.
    pub fn new(gpu: bool) -> Watchdog {
        Watchdog::with_gpus(if gpu { gpus() } else { None })
    }

    fn with_gpus(gpus: Option<Gpus>) -> Watchdog {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        Watchdog {
            host_is_apart: gpus.is_some(),
            gpus,
            cores,
            ticks_per_s: clock_ticks(),
            pgid: 0,
            last: None,
            intervals: VecDeque::new(),
            steps: VecDeque::new(),
            busy_s: 0.0,
            wall_s: 0.0,
            segment: Totals::default(),
            peak: Peak::default(),
            said: Vec::new(),
        }
    }

    /// Measures model FLOPs against `peak`.
    pub fn with_peak(mut self, peak: Peak) -> Watchdog {
        self.peak = peak;
        self
    }

    pub fn mode(&self) -> &'static str {
        if self.gpus.is_some() {
            "gpu"
        } else {
            "cpu-only"
        }
    }

    /// Watches a new segment: a fresh process group, fresh windows, nothing said yet.
    pub fn start_segment(&mut self, pgid: i32) {
        self.pgid = pgid;
        self.last = None;
        self.intervals.clear();
        self.steps.clear();
        self.busy_s = 0.0;
        self.wall_s = 0.0;
        self.segment = Totals::default();
        self.said.clear();
    }

    /// Takes one sample of the counters and the new step metrics.
    pub fn sample(&mut self, new_steps: Vec<StepMetrics>) {
        let now = Instant::now();
        for m in &new_steps {
            self.segment.add(m);
        }
        self.steps.extend(new_steps.into_iter().map(|m| (now, m)));
        let (cpu_s, read_bytes) = group_usage(self.pgid);
        let counters = Counters {
            at: now,
            cpu_s,
            read_bytes,
            host: HostTicks::read(),
        };
        if let Some(prev) = self.last.replace(counters) {
            let seconds = counters.at.duration_since(prev.at).as_secs_f64();
            if seconds > 0.0 {
                let host_cpu = ((counters.cpu_s - prev.cpu_s) / seconds / self.cores).max(0.0);
                let device = match &self.gpus {
                    Some(g) => g.busy().unwrap_or(0.0),
                    None => host_cpu.min(1.0),
                };
                self.busy_s += device * seconds;
                self.wall_s += seconds;
                self.intervals.push_back(Interval {
                    end: now,
                    seconds,
                    device,
                    host_cpu,
                    read_bytes: counters.read_bytes.saturating_sub(prev.read_bytes),
                    host: prev.host.zip(counters.host).and_then(|(a, b)| {
                        HostLoad::between(a, b, counters.cpu_s - prev.cpu_s, self.ticks_per_s)
                    }),
                });
            }
        }
        let horizon = now.checked_sub(WINDOW);
        let old = |t: Instant| horizon.is_some_and(|h| t < h);
        while self.intervals.front().is_some_and(|i| old(i.end)) {
            self.intervals.pop_front();
        }
        while self.steps.front().is_some_and(|(t, _)| old(*t)) {
            self.steps.pop_front();
        }
    }

    /// The busy share over the segment so far; `None` before two samples.
    pub fn utilization(&self) -> Option<f64> {
        (self.wall_s > 0.0).then(|| (self.busy_s / self.wall_s).clamp(0.0, 1.0))
    }

    /// The segment's step metrics so far, summed.
    pub fn segment(&self) -> &Totals {
        &self.segment
    }

    /// The segment's model FLOPs utilization so far; `None` without FLOPs or a peak.
    pub fn mfu(&self) -> Option<f64> {
        self.segment.mfu(&self.peak)
    }

    /// A diagnosis not said before in this segment, to log.
    pub fn news(&mut self) -> Option<Diagnosis> {
        let d = [self.diagnose(), self.advise_precision()]
            .into_iter()
            .flatten()
            .find(|d| !self.said.contains(&d.cause))?;
        self.said.push(d.cause);
        Some(d)
    }

    /// The steps of the window, summed; `None` while too little to go on.
    fn window(&self) -> Option<(Totals, f64)> {
        let span: f64 = self.intervals.iter().map(|i| i.seconds).sum();
        if self.steps.len() < MIN_STEPS || span < MIN_SPAN.as_secs_f64() {
            return None;
        }
        let mut totals = Totals::default();
        for (_, m) in &self.steps {
            totals.add(m);
        }
        Some((totals, span))
    }

    /// A run in FP32 or TF32 on an accelerator with a faster precision, busy or not.
    pub fn advise_precision(&self) -> Option<Diagnosis> {
        let (window, span) = self.window()?;
        let faster = self.peak.faster(window.precision)?;
        let mut evidence = format!(
            "computes in {} on {}: {} autocast raises the peak {:.0}x ({} -> {} TFLOPS)",
            faster.from.label(),
            self.peak.describe(),
            faster.to.label(),
            faster.ratio(),
            faster.from_tflops,
            faster.to_tflops
        );
        if let Some(mfu) = window.mfu(&self.peak) {
            evidence.push_str(&format!("; MFU {}", pct1(mfu)));
        }
        let busy = self
            .intervals
            .iter()
            .map(|i| i.device * i.seconds)
            .sum::<f64>()
            / span;
        Some(Diagnosis {
            cause: Cause::SlowPrecision,
            busy,
            evidence,
        })
    }

    /// The cause of idle time over the window, or `None` when busy (or too little to go on).
    pub fn diagnose(&self) -> Option<Diagnosis> {
        let (window, span) = self.window()?;
        let mean = |f: fn(&Interval) -> f64| {
            self.intervals.iter().map(|i| f(i) * i.seconds).sum::<f64>() / span
        };
        let busy = mean(|i| i.device);
        if busy >= BUSY {
            return None;
        }
        let host = mean(|i| i.host_cpu);
        let read_mb_s =
            self.intervals.iter().map(|i| i.read_bytes).sum::<u64>() as f64 / span / 1e6;
        let Totals {
            step_s,
            data_s,
            sync_s,
            ..
        } = window;
        let n = self.steps.len() as f64;
        let share = |part: f64| if step_s > 0.0 { part / step_s } else { 0.0 };
        let batch = self.steps.back().and_then(|(_, m)| m.batch);
        let per_step = format!(
            "{:.1} ms a step{}{}",
            step_s / n * 1e3,
            batch.map_or(String::new(), |b| format!(" at batch {b}")),
            window
                .mfu(&self.peak)
                .map_or(String::new(), |m| format!(", MFU {}", pct1(m)))
        );
        let (cause, evidence) = if share(data_s) >= STALL_SHARE {
            (
                Cause::DataStarved,
                format!(
                    "{:.0}% of each step waits for data, {per_step}, reading {read_mb_s:.1} MB/s",
                    share(data_s) * 100.0
                ),
            )
        } else if share(sync_s) >= STALL_SHARE {
            (
                Cause::SyncStalls,
                format!(
                    "{:.0}% of each step blocks on syncs, {per_step}",
                    share(sync_s) * 100.0
                ),
            )
        } else if self.host_is_apart && host >= HOST_SATURATED {
            (
                Cause::HostCpuBound,
                format!(
                    "the trainer uses {:.0}% of {} cores, {per_step}",
                    host * 100.0,
                    self.cores
                ),
            )
        } else if let Some(load) = self.contention() {
            (
                Cause::HostContention,
                format!(
                    "other processes used {:.1} of {} cores, steal {:.0}%, the run {:.1}, \
                     {:.1} idle, {per_step}",
                    load.others,
                    load.cpus,
                    load.steal / load.cpus * 100.0,
                    host * self.cores,
                    load.idle
                ),
            )
        } else {
            (
                Cause::SmallBatch,
                format!("no data or sync wait to explain it, {per_step}"),
            )
        };
        Some(Diagnosis {
            cause,
            busy,
            evidence,
        })
    }
}

impl Watchdog {
    /// The host's load over the window when it is contended: no idle core left, and other
    /// processes and steal took at least [`CONTENDED`] of the run's cores. `None` when the
    /// host had room the run left unused (its idling is its own), or /proc/stat is unread.
    fn contention(&self) -> Option<HostLoad> {
        let measured: Vec<(f64, HostLoad)> = self
            .intervals
            .iter()
            .filter_map(|i| Some((i.seconds, i.host?)))
            .collect();
        let span: f64 = measured.iter().map(|(s, _)| s).sum();
        if span <= 0.0 {
            return None;
        }
        let mean =
            |f: fn(&HostLoad) -> f64| measured.iter().map(|(s, l)| f(l) * s).sum::<f64>() / span;
        let load = HostLoad {
            cpus: mean(|l| l.cpus),
            others: mean(|l| l.others),
            steal: mean(|l| l.steal),
            idle: mean(|l| l.idle),
        };
        let cores = self.cores.min(load.cpus);
        let full = load.idle <= (1.0 - HOST_SATURATED) * cores;
        (full && load.others + load.steal >= CONTENDED * cores).then_some(load)
    }
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64
}

fn gpus() -> Option<Gpus> {
    match Nvml::init().and_then(|nvml| Ok((nvml.device_count()?, nvml))) {
        Ok((count, nvml)) if count > 0 => {
            tracing::info!("watching {count} GPU(s) through NVML");
            Some(Gpus { nvml, count })
        }
        Ok(_) => {
            tracing::info!(
                "NVML sees no GPU: CPU-only mode, the CPU stands in for the accelerator"
            );
            None
        }
        Err(e) => {
            // Once a process: a tuner starts many supervised segments.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "no NVML ({e}): CPU-only mode, the CPU stands in for the accelerator"
                );
            });
            None
        }
    }
}

impl Gpus {
    /// Mean busy share of all GPUs over NVML's last sample period.
    fn busy(&self) -> Option<f64> {
        let mut total = 0.0;
        for i in 0..self.count {
            let rates = self
                .nvml
                .device_by_index(i)
                .ok()?
                .utilization_rates()
                .ok()?;
            total += f64::from(rates.gpu) / 100.0;
        }
        Some(total / f64::from(self.count))
    }
}

/// The /proc/PID/stat of every process in the group (the trainer and its workers).
fn group_stats(pgid: i32) -> Vec<(i32, Vec<String>)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name is in parentheses and may hold spaces: fields follow the last ')'.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            // fields[0] is the state (field 3 of stat); the group id is field 5.
            (fields.get(2)?.parse::<i32>().ok()? == pgid).then_some((pid, fields))
        })
        .collect()
}

/// CPU seconds and bytes read from storage by the group's processes, in one pass over /proc.
fn group_usage(pgid: i32) -> (f64, u64) {
    let ticks = clock_ticks();
    let (mut cpu_ticks, mut read) = (0.0, 0);
    for (pid, f) in group_stats(pgid) {
        // utime and stime (fields 14 and 15), with the waited-for children's (16, 17).
        cpu_ticks += (11..15)
            .filter_map(|i| f.get(i)?.parse::<f64>().ok())
            .sum::<f64>();
        read += fs::read_to_string(format!("/proc/{pid}/io"))
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|l| l.strip_prefix("read_bytes: "))?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0);
    }
    (cpu_ticks / ticks, read)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn step(step: u64, step_s: f64, data_s: f64, sync_s: f64) -> StepMetrics {
        StepMetrics {
            step,
            step_s,
            data_s,
            sync_s,
            batch: Some(8),
            loss: None,
            tokens: None,
            flops: None,
            params: None,
            precision: None,
            fields: serde_json::Map::new(),
        }
    }

    /// A watchdog fed synthetic intervals: `device` busy share, `host` CPU share.
    fn fed(device: f64, host: f64, gpu: bool, steps: &[StepMetrics]) -> Watchdog {
        fed_on(None, device, host, gpu, steps)
    }

    /// The same on a 2-core machine whose CPUs did `load`.
    fn fed_on(
        load: Option<HostLoad>,
        device: f64,
        host: f64,
        gpu: bool,
        steps: &[StepMetrics],
    ) -> Watchdog {
        let mut w = Watchdog::with_gpus(None);
        w.cores = 2.0;
        w.host_is_apart = gpu;
        let now = Instant::now();
        for _ in 0..5 {
            w.intervals.push_back(Interval {
                end: now,
                seconds: 1.0,
                device,
                host_cpu: host,
                read_bytes: 0,
                host: load,
            });
        }
        w.steps.extend(steps.iter().cloned().map(|m| (now, m)));
        w
    }

    fn steps(data: f64, sync: f64) -> Vec<StepMetrics> {
        (1..=20).map(|s| step(s, 0.1, data, sync)).collect()
    }

    #[test]
    fn busy_runs_are_left_alone() {
        assert_eq!(fed(0.95, 0.95, false, &steps(0.05, 0.0)).diagnose(), None);
    }

    #[test]
    fn names_the_cause_of_idle_time() {
        let cause = |w: Watchdog| w.diagnose().map(|d| d.cause);
        assert_eq!(
            cause(fed(0.3, 0.3, false, &steps(0.06, 0.0))),
            Some(Cause::DataStarved)
        );
        assert_eq!(
            cause(fed(0.3, 0.3, false, &steps(0.0, 0.05))),
            Some(Cause::SyncStalls)
        );
        assert_eq!(
            cause(fed(0.5, 0.5, false, &steps(0.0, 0.0))),
            Some(Cause::SmallBatch)
        );
        assert_eq!(
            cause(fed(0.5, 0.95, true, &steps(0.0, 0.0))),
            Some(Cause::HostCpuBound)
        );
        // A saturated host on a CPU-only machine is the device being busy, not a cause.
        assert_eq!(
            cause(fed(0.5, 0.95, false, &steps(0.0, 0.0))),
            Some(Cause::SmallBatch)
        );
    }

    /// Two cores: `others` and `steal` in cores, the rest the run's (`run` cores) or idle.
    fn two_cores(run: f64, others: f64, steal: f64) -> Option<HostLoad> {
        Some(HostLoad {
            cpus: 2.0,
            others,
            steal,
            idle: (2.0 - run - others - steal).max(0.0),
        })
    }

    #[test]
    fn tells_host_contention_from_the_runs_own_idling() {
        let diagnose = |load, run: f64, gpu, steps: &[StepMetrics]| {
            fed_on(load, run / 2.0, run / 2.0, gpu, steps)
                .diagnose()
                .unwrap()
        };
        let quiet = steps(0.0, 0.0);
        // Another build takes 1.4 of the 2 cores: the healthy run gets 0.6 (busy 30%).
        let d = diagnose(two_cores(0.6, 1.4, 0.0), 0.6, false, &quiet);
        assert_eq!(d.cause, Cause::HostContention);
        let text = d.to_string();
        assert!(
            text.contains("host contention (other processes used 1.4 of 2 cores, steal 0%"),
            "{text}"
        );
        assert!(!text.contains("batch is too small"), "{text}");
        // The hypervisor takes 0.8 of the cores.
        let d = diagnose(two_cores(1.2, 0.0, 0.8), 1.2, false, &quiet);
        assert_eq!(d.cause, Cause::HostContention);
        assert!(d.evidence.contains("steal 40%"), "{}", d.evidence);
        // With a GPU the host feeds it: others on its cores idle it too.
        let d = diagnose(two_cores(0.6, 1.4, 0.0), 0.6, true, &quiet);
        assert_eq!(d.cause, Cause::HostContention);

        // A core lies idle: the run idles by itself, whatever else runs.
        let d = diagnose(two_cores(0.6, 0.9, 0.0), 0.6, false, &quiet);
        assert_eq!(d.cause, Cause::SmallBatch, "{d}");
        // The host is full, but nearly all of it is the run's.
        let d = diagnose(two_cores(1.4, 0.4, 0.0), 1.4, false, &quiet);
        assert_eq!(d.cause, Cause::SmallBatch, "{d}");
        // Waits in the step timings are the run's own, contended host or not.
        let d = diagnose(two_cores(0.6, 1.4, 0.0), 0.6, false, &steps(0.06, 0.0));
        assert_eq!(d.cause, Cause::DataStarved);
        // No host counters (no /proc/stat): no contention is claimed.
        let d = diagnose(None, 0.6, false, &quiet);
        assert_eq!(d.cause, Cause::SmallBatch);
    }

    #[test]
    fn reads_the_hosts_cpu_counters() {
        let stat = "cpu  100 10 50 800 20 5 5 10 7 0\n\
                    cpu0 50 5 25 400 10 3 2 5 0 0\n\
                    cpu1 50 5 25 400 10 2 3 5 0 0\n\
                    intr 1 2 3\nctxt 99\n";
        let a = HostTicks::parse(stat).unwrap();
        assert_eq!(
            a,
            HostTicks {
                busy: 170,
                idle: 820,
                steal: 10,
                cpus: 2
            }
        );
        assert_eq!(HostTicks::parse("intr 1\n"), None);
        assert_eq!(HostTicks::parse("cpu  1 2 x\n"), None);

        // One second on 2 CPUs at 100 ticks/s: 200 ticks. 150 busy, 20 stolen, 30 idle; the
        // run used 0.5 CPU-seconds of the 1.5 busy.
        let b = HostTicks {
            busy: a.busy + 150,
            idle: a.idle + 30,
            steal: a.steal + 20,
            cpus: 2,
        };
        let load = HostLoad::between(a, b, 0.5, 100.0).unwrap();
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(close(load.others, 1.0), "{load:?}");
        assert!(close(load.steal, 0.2), "{load:?}");
        assert!(close(load.idle, 0.3), "{load:?}");
        assert_eq!(HostLoad::between(a, a, 0.0, 100.0), None);
        assert!(HostTicks::read().is_some(), "this Linux has /proc/stat");
    }

    #[test]
    fn needs_enough_steps_and_time() {
        assert_eq!(fed(0.1, 0.1, false, &steps(0.0, 0.0)[..5]).diagnose(), None);
        let mut w = fed(0.1, 0.1, false, &steps(0.0, 0.0));
        w.intervals.truncate(1);
        assert_eq!(w.diagnose(), None);
    }

    #[test]
    fn says_each_cause_once() {
        let mut w = fed(0.3, 0.3, false, &steps(0.06, 0.0));
        let d = w.news().unwrap();
        assert!(d.to_string().contains("waits for data"), "{d}");
        assert_eq!(w.news(), None);
    }

    /// Lines as a trainer appends them, read back through the tail.
    fn read_lines(lines: &[String]) -> Vec<StepMetrics> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut tail = MetricsTail::new(&path);
        fs::write(&path, lines.join("\n") + "\n").unwrap();
        tail.read_new()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs()
    }

    #[test]
    fn mfu_of_the_example_trainer_by_hand() {
        // The example trainer's defaults: context 8, embed 16, hidden 128, vocab 65, batch
        // 64. Its matmuls per sample are 8·16·128 + 128·65 = 24,704 multiply-adds forward;
        // forward and backward make 6 FLOPs per multiply-add: 148,224 FLOPs a sample and
        // 9,486,336 a step of 64.
        let flops = 6.0 * 64.0 * (8.0 * 16.0 * 128.0 + 128.0 * 65.0);
        assert_eq!(flops, 9_486_336.0);
        let lines: Vec<String> = [0.004, 0.005, 0.003]
            .iter()
            .enumerate()
            .map(|(i, s)| {
                format!(
                    r#"{{"step":{},"step_s":{s},"data_s":0.001,"batch":64,"loss":4.1,"tokens":64,"flops":{flops},"precision":"fp32"}}"#,
                    i + 1
                )
            })
            .collect();
        let mut totals = Totals::default();
        for m in read_lines(&lines) {
            totals.add(&m);
        }
        // By hand: 3 steps of 9,486,336 FLOPs in 12 ms are 2.371584 GFLOP/s; against a CPU
        // given as 0.05 TFLOPS (`--peak-tflops 0.05`) that is 4.743168%.
        let given = Peak {
            accelerators: None,
            given_tflops: Some(0.05),
        };
        assert!(close(totals.flops_per_s().unwrap(), 2.371_584e9));
        assert!(close(totals.mfu(&given).unwrap(), 0.047_431_68));
        assert!(close(totals.data_stall().unwrap(), 0.25));
        assert_eq!(totals.sync_stall(), None, "the trainer reports no syncs");
        assert_eq!(totals.precision, Some(Precision::Fp32));
        // No peak, no MFU.
        assert_eq!(totals.mfu(&Peak::default()), None);
    }

    #[test]
    fn without_flops_the_6n_rule_and_unknown_fields_are_no_bad_lines() {
        let lines = [
            r#"{"step":1,"step_s":0.5,"tokens":2048,"params":1e6,"precision":"BFloat16"}"#,
            r#"{"step":2,"step_s":0.5,"flops":-1,"tokens":2048,"params":1e6,"precision":"amp"}"#,
            r#"{"step":3,"step_s":1.0}"#,
        ]
        .map(String::from);
        let got = read_lines(&lines);
        assert_eq!(
            got.len(),
            3,
            "an unknown precision is unknown, not a bad line"
        );
        assert_eq!(got[0].model_flops(), Some(6.0 * 1e6 * 2048.0));
        assert_eq!(got[0].precision, Some(Precision::Bf16));
        assert_eq!(got[1].precision, None);
        assert_eq!(
            got[1].model_flops(),
            Some(6.0 * 1e6 * 2048.0),
            "bad flops: 6N"
        );
        assert_eq!(got[2].model_flops(), None);
        let mut totals = Totals::default();
        got.iter().for_each(|m| totals.add(m));
        // Only the steps that report FLOPs count toward the FLOP/s.
        assert!(close(totals.flops_per_s().unwrap(), 2.0 * 6.0 * 2048e6));
        assert_eq!(totals.precision, Some(Precision::Bf16), "the newest known");
        assert_eq!(totals.data_stall(), None);
    }

    /// `count` A100s from the catalog.
    fn a100s(count: f64) -> Peak {
        let c = frugal_cost::Catalog::builtin().unwrap();
        Peak {
            accelerators: Some((c.peaks("A100").unwrap().clone(), count)),
            given_tflops: None,
        }
    }

    #[test]
    fn mfu_against_the_catalogs_accelerators_at_their_precision() {
        let mut m = step(1, 0.1, 0.0, 0.0);
        // 4.8 TFLOP/s achieved on 8 A100s: 156 TFLOPS at FP32, 2,496 at BF16.
        m.flops = Some(0.48e12);
        let totals = |p| {
            let mut t = Totals::default();
            let mut m = m.clone();
            m.precision = p;
            t.add(&m);
            t
        };
        let peak = a100s(8.0);
        assert!(close(
            totals(Some(Precision::Fp32)).mfu(&peak).unwrap(),
            4.8 / 156.0
        ));
        assert!(close(
            totals(Some(Precision::Bf16)).mfu(&peak).unwrap(),
            4.8 / 2496.0
        ));
        assert_eq!(
            totals(None).mfu(&peak),
            None,
            "unknown precision, unknown peak"
        );
        assert_eq!(
            totals(Some(Precision::Fp8)).mfu(&peak),
            None,
            "no FP8 on A100"
        );
        // A peak given by hand wins, whatever the precision.
        let given = Peak {
            given_tflops: Some(48.0),
            ..peak
        };
        assert!(close(totals(None).mfu(&given).unwrap(), 0.1));
    }

    #[test]
    fn names_fp32_on_an_accelerator_with_bf16_and_its_mfu() {
        let fp32: Vec<StepMetrics> = (1..=20)
            .map(|i| {
                let mut m = step(i, 0.1, 0.0, 0.0);
                (m.flops, m.precision) = (Some(0.48e12), Some(Precision::Fp32));
                m
            })
            .collect();
        let mut w = fed(0.95, 0.3, true, &fp32).with_peak(a100s(8.0));
        assert_eq!(w.diagnose(), None, "busy: nothing idles");
        let d = w.news().unwrap();
        assert_eq!(d.cause, Cause::SlowPrecision);
        assert_eq!(
            d.to_string(),
            format!(
                "the run computes in FP32 on 8 x A100: BF16 autocast raises the peak 16x \
                 (19.5 -> 312 TFLOPS); MFU 3.1%; try: {}",
                Cause::SlowPrecision.fix()
            )
        );
        assert_eq!(w.news(), None, "said once");
        // Idle too: the idle cause names the MFU, then the precision follows.
        let mut w = fed(0.3, 0.3, true, &fp32).with_peak(a100s(8.0));
        let first = w.news().unwrap();
        assert!(first.evidence.ends_with("at batch 8, MFU 3.1%"), "{first}");
        assert_eq!(w.news().unwrap().cause, Cause::SlowPrecision);
        // BF16 already, or no catalog accelerator: nothing to say about precision.
        let bf16: Vec<StepMetrics> = fp32
            .iter()
            .cloned()
            .map(|mut m| {
                m.precision = Some(Precision::Bf16);
                m
            })
            .collect();
        assert_eq!(
            fed(0.95, 0.3, true, &bf16).with_peak(a100s(8.0)).news(),
            None
        );
        let given = Peak {
            accelerators: None,
            given_tflops: Some(1.0),
        };
        assert_eq!(fed(0.95, 0.3, true, &fp32).with_peak(given).news(), None);
    }

    #[test]
    fn the_segment_sums_its_steps_and_starts_afresh() {
        let mut w = Watchdog::with_gpus(None);
        w.start_segment(nix::unistd::getpgrp().as_raw());
        let mut m = step(1, 0.2, 0.05, 0.0);
        m.fields.insert("data_s".into(), 0.05.into());
        w.sample(vec![m.clone(), m]);
        assert_eq!(w.segment().steps, 2);
        assert!(close(w.segment().data_stall().unwrap(), 0.25));
        w.start_segment(nix::unistd::getpgrp().as_raw());
        assert_eq!(
            *w.segment(),
            Totals::default(),
            "a new segment starts afresh"
        );
    }

    #[test]
    fn metrics_tail_reads_whole_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        fs::write(&path, "{\"step\":1,\"step_s\":0.5}\n").unwrap();
        let mut tail = MetricsTail::new(&path);
        assert!(
            tail.read_new().is_empty(),
            "earlier lines are not this segment's"
        );
        use std::io::Write;
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        write!(
            f,
            "{{\"step\":2,\"step_s\":0.5,\"data_s\":0.1}}\nnot json\n{{\"step\":3,"
        )
        .unwrap();
        let got = tail.read_new();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].step, 2);
        writeln!(f, "\"step_s\":0.25}}").unwrap();
        assert_eq!(tail.read_new()[0].step, 3);
    }

    #[test]
    fn counts_this_process_groups_cpu() {
        let me = nix::unistd::getpgrp().as_raw();
        let before = group_usage(me).0;
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(200) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(group_usage(me).0 - before >= 0.1);
    }

    #[test]
    fn the_peak_is_the_instances_accelerators_or_the_given_one() {
        use frugal_cloud::price::Request;
        use frugal_cost::Capacity;
        let c = Catalog::builtin().unwrap();
        let req = |price, instance| Request {
            capacity: Capacity::OnDemand,
            price_per_hour: price,
            price_field: "--price-per-hour",
            instance,
            region: None,
        };
        let p = Pricing::given(&c, &req(None, Some("p4d.24xlarge")))
            .unwrap()
            .unwrap();
        let peak = Peak::of(&c, &p, None);
        let (a100, count) = peak.accelerators.clone().unwrap();
        assert_eq!((a100.accelerator.as_str(), count), ("A100", 8.0));
        assert_eq!(
            peak.flops_per_s(Some(frugal_cost::Precision::Bf16)),
            Some(8.0 * 312e12)
        );
        let given = Peak::of(&c, &p, Some(100.0));
        assert_eq!(given.flops_per_s(None), Some(100e12));
        // A CPU-only price: no accelerator, only what is given.
        let cpu = Pricing::given(&c, &req(Some("0.5"), None))
            .unwrap()
            .unwrap();
        assert_eq!(Peak::of(&c, &cpu, None), Peak::default());
    }
}
