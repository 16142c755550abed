//! The semantic cache's vector index: HNSW against the flat scan, on clustered unit vectors
//! of MiniLM's width, and optionally on real MiniLM embeddings of QQP questions.
//!
//! Per size: build time per insert, search p50/p99 at k = 4 (what the cache asks; from 100k
//! also with wider searches, `ef`), recall@1 and recall@10 against the flat scan, bytes per
//! entry, the flat scan's p50 and the ratio, and what evicting the oldest entry and adding
//! one costs each. Queries are fresh points from the data's distribution, not stored ones.
//!
//! `cargo bench -p frugal-semantic --bench index [-- SIZE...] [qqp]`; sizes default to 1k,
//! 10k, 100k and 300k (1M takes ~10 minutes to build on one core: pass `1000000` for it);
//! `qqp` adds a row for the ~137k distinct QQP questions (needs `models/minilm`).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use frugal_semantic::hnsw::{Hnsw, HnswParams};
use frugal_semantic::index::FlatIndex;
use frugal_semantic::synthetic::{DIM, Rng, Topics};
use frugal_semantic::{DEFAULT_EMBEDDER, Embedder};
use rayon::prelude::*;

/// Topics: a few hundred, each a patch of `AXES` directions.
const CENTRES: usize = 300;
const K: usize = 4;
/// Evictions timed, each the oldest entry out and a fresh one in (a full cache's miss).
const CHURN: usize = 500;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if sizes.is_empty() && !args.iter().any(|a| a == "qqp") {
        sizes = vec![1_000, 10_000, 100_000, 300_000];
    }
    println!(
        "| data | cos 1st / 10th | entries | ef | build µs/insert | HNSW p50 µs | HNSW p99 µs | recall@1 | recall@10 \
         | HNSW B/entry | flat B/entry | flat p50 µs | flat/HNSW \
         | HNSW evict+insert µs | flat evict+insert µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let mut rng = Rng(n as u64);
        let centres = Topics::new(&mut rng, CENTRES);
        let points: Vec<Vec<f32>> = (0..n).map(|_| centres.point(&mut rng)).collect();
        let queries: Vec<Vec<f32>> = (0..queries_for(n))
            .map(|_| centres.point(&mut rng))
            .collect();
        let fresh: Vec<Vec<f32>> = (0..CHURN).map(|_| centres.point(&mut rng)).collect();
        measure("clustered", &points, &queries, &fresh);
    }
    if args.iter().any(|a| a == "qqp") {
        let (mut points, queries) = qqp();
        let fresh = points.split_off(points.len() - CHURN);
        measure("QQP MiniLM", &points, &queries, &fresh);
    }
}

/// Fewer queries where the flat scan that grades them is slow.
fn queries_for(n: usize) -> usize {
    if n > 200_000 { 300 } else { 1000 }
}

fn measure(data: &str, points: &[Vec<f32>], queries: &[Vec<f32>], fresh: &[Vec<f32>]) {
    let n = points.len();
    let mut graph = Hnsw::new(DIM);
    let started = Instant::now();
    for (i, v) in points.iter().enumerate() {
        graph.add(i as u64, v);
    }
    let build = started.elapsed() / n as u32;
    let mut flat = FlatIndex::new(DIM);
    for (i, v) in points.iter().enumerate() {
        flat.add(i as u64, v);
    }
    // Wider searches where the default loses recall.
    let efs = if n >= 100_000 {
        vec![64, 128, 256]
    } else {
        vec![HnswParams::default().ef_search]
    };
    let mut rows = Vec::new();
    for ef in efs {
        graph.set_ef_search(ef);
        let mut graph_times = Vec::new();
        let mut flat_times = Vec::new();
        let (mut hit1, mut hit10) = (0, 0);
        let (mut cos1, mut cos10) = (0.0, 0.0);
        for q in queries {
            let t = Instant::now();
            black_box(graph.search(q, K));
            graph_times.push(t.elapsed());
            let t = Instant::now();
            black_box(flat.search(q, K));
            flat_times.push(t.elapsed());
            let want = flat.search(q, 10);
            let got = graph.search(q, 10);
            cos1 += f64::from(want[0].score);
            cos10 += f64::from(want[9].score);
            hit1 += usize::from(got.first().map(|g| g.id) == want.first().map(|w| w.id));
            hit10 += want
                .iter()
                .filter(|w| got.iter().any(|g| g.id == w.id))
                .count();
        }
        let (g50, g99) = (pct(&mut graph_times, 0.5), pct(&mut graph_times, 0.99));
        let f50 = pct(&mut flat_times, 0.5);
        let q = queries.len() as f64;
        rows.push(format!(
            "| {data} | {:.2} / {:.2} | {n} | {ef} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} | {} | {} \
             | {:.0} | {:.1}x |",
            cos1 / q,
            cos10 / q,
            us(build),
            us(g50),
            us(g99),
            hit1 as f64 / q,
            hit10 as f64 / (q * 10.0),
            graph.bytes_per_entry(),
            flat.bytes_per_entry(),
            us(f50),
            f50.as_secs_f64() / g50.as_secs_f64(),
        ));
    }
    let churn = |index: &mut dyn FnMut(u64, &[f32])| {
        let started = Instant::now();
        for (i, v) in fresh.iter().enumerate() {
            index(i as u64, v);
        }
        started.elapsed() / fresh.len() as u32
    };
    let graph_churn = churn(&mut |i, v| {
        graph.remove(i);
        graph.add((n as u64) + i, v);
    });
    let flat_churn = churn(&mut |i, v| {
        flat.remove(i);
        flat.add((n as u64) + i, v);
    });
    for row in rows {
        println!("{row} {:.0} | {:.0} |", us(graph_churn), us(flat_churn));
    }
}

fn pct(times: &mut [Duration], p: f64) -> Duration {
    times.sort_unstable();
    times[((times.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Distinct QQP questions embedded by MiniLM: all but the last 1,000 stored, those asked.
fn qqp() -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let root = frugal_testkit::repo(".");
    let embedder =
        Embedder::load(&root.join(DEFAULT_EMBEDDER)).expect("run scripts/fetch-models.sh minilm");
    let pairs = frugal_semantic::eval::read_pairs(
        &root.join("data/semantic-cache/similiar_qqp_full.json.gz"),
    )
    .expect("QQP pairs");
    let mut seen = std::collections::HashSet::new();
    let texts: Vec<&str> = pairs
        .iter()
        .flat_map(|p| [p.text_a.as_str(), p.text_b.as_str()])
        .filter(|t| seen.insert(*t))
        .collect();
    let mut all: Vec<Vec<f32>> = texts
        .par_iter()
        .map(|t| embedder.embed(t).expect("embed"))
        .collect();
    let queries = all.split_off(all.len() - 1000);
    (all, queries)
}
