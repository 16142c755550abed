use super::*;
use crate::NoProgress;
use crate::event::{Capacity, Kind, Outcome};
use crate::ledger::Window;

struct Fixture {
    dir: tempfile::TempDir,
    ledger: Ledger,
    catalog: Catalog,
}

/// The built-in catalog and a model `small` priced for the importer's tests.
pub(super) fn catalog() -> Catalog {
    let mut catalog = Catalog::builtin().unwrap();
    catalog
        .extend_from_toml(
            "[[model]]\nname = 'small'\ninput = 0.5\noutput = 1.5\ncached_input = 0.25\n",
            crate::catalog::PriceSource::Builtin,
        )
        .unwrap();
    catalog
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ledger = crate::ledger::testing::fresh(dir.path());
    let catalog = catalog();
    Fixture {
        dir,
        ledger,
        catalog,
    }
}

impl Fixture {
    fn import(
        &mut self,
        name: &str,
        text: &str,
        skip_invalid: bool,
    ) -> Result<ImportSummary, ImportError> {
        let options = ImportOptions {
            skip_invalid,
            ..ImportOptions::default()
        };
        self.import_with(name, text, options)
    }

    fn import_with(
        &mut self,
        name: &str,
        text: &str,
        options: ImportOptions,
    ) -> Result<ImportSummary, ImportError> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        import_file(&mut self.ledger, &self.catalog, &path, options, &NoProgress)
    }

    fn events(&self) -> Vec<crate::ledger::Row> {
        let mut rows = Vec::new();
        self.ledger
            .scan(Window::default(), |r| rows.push(*r))
            .unwrap();
        rows
    }
}

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

#[test]
fn csv_rows_are_priced_from_the_catalog() {
    let mut f = fixture();
    let csv = "\
ts,duration_s,kind,workload,model,instance_type,capacity,instances,input_tokens,output_tokens,cached_input_tokens,utilization,cost_usd
2026-11-16 18:00:00,,inference,chat,small,,,,1000,200,400,,
2026-11-16T18:00:00Z,5400,training,pretrain,,p3.2xlarge,on_demand,2,,,,0.35,
2026-11-16T19:00:00+01:00,3600,training,pretrain,,p3.2xlarge,spot,1,,,,,
1763316000000,60,idle,chat,,,,,,,,,0.25
";
    let summary = f.import("usage.csv", csv, false).unwrap();
    assert_eq!(summary.format, Format::Csv);
    assert_eq!(summary.imported, 4);
    let rows = f.events();
    // 600 * 0.5/1M + 400 * 0.25/1M = 0.0004 input; 200 * 1.5/1M = 0.0003 output.
    let chat = rows.iter().find(|r| r.kind == Kind::Inference).unwrap();
    assert_eq!(chat.cost, m("0.0007"));
    assert_eq!(chat.input_cost, Some(m("0.0004")));
    assert_eq!(
        chat.requests, 1,
        "an inference row is one request by default"
    );
    // p3.2xlarge on demand is $3.06/h: 1.5 h x 2 instances = $9.18, 65% of it idle.
    let od = rows
        .iter()
        .find(|r| r.capacity == Some(Capacity::OnDemand))
        .unwrap();
    assert_eq!(od.cost, m("9.18"));
    assert_eq!(od.list_cost, Some(m("9.18")));
    assert_eq!(od.waste(), m("5.967"));
    let spot = rows
        .iter()
        .find(|r| r.capacity == Some(Capacity::Spot))
        .unwrap();
    let offer = f.catalog.instance("p3.2xlarge", None).unwrap();
    assert_eq!(spot.cost, offer.spot.unwrap().0);
    assert_eq!(spot.list_cost, Some(m("3.06")));
    assert_eq!(spot.ts_ms, od.ts_ms, "offsets are honoured");
    let idle = rows.iter().find(|r| r.kind == Kind::Idle).unwrap();
    assert_eq!((idle.cost, idle.waste()), (m("0.25"), m("0.25")));
    assert_eq!(
        summary.cost,
        m("0.0007") + m("9.18") + spot.cost + m("0.25")
    );
}

#[test]
fn jsonl_rows_take_numbers_and_strings() {
    let mut f = fixture();
    let jsonl = r#"{"ts": "2026-11-16T18:00:00Z", "kind": "inference", "workload": "chat", "model": "small", "input_tokens": 1000, "output_tokens": 1000, "requests": 3}

{"TS": 1763316000000, "Kind": "training", "workload": "ft", "run_id": "r1", "cost_usd": "12.5", "duration_s": 3600.0, "outcome": "preempted", "lost_s": 600}
"#;
    let summary = f.import("usage.jsonl", jsonl, false).unwrap();
    assert_eq!((summary.format, summary.imported), (Format::Jsonl, 2));
    let rows = f.events();
    let chat = rows.iter().find(|r| r.kind == Kind::Inference).unwrap();
    assert_eq!((chat.cost, chat.requests), (m("0.002"), 3));
    let ft = rows.iter().find(|r| r.kind == Kind::Training).unwrap();
    assert_eq!(ft.cost, m("12.5"));
    assert_eq!(ft.outcome, Some(Outcome::Preempted));
    assert_eq!((ft.duration_ms, ft.lost_ms), (3_600_000, 600_000));
}

#[test]
fn a_bad_row_imports_nothing_and_names_every_bad_line() {
    let mut f = fixture();
    f.import(
        "ok.csv",
        "ts,kind,workload,cost_usd\n2026-01-01,inference,a,1\n",
        false,
    )
    .unwrap();
    let csv = "\
ts,duration_s,kind,workload,instance_type,cost_usd,model
2026-01-01,10,inference,a,,1,
yesterday,10,inference,a,,1,
2026-01-01,10,gpu,a,,1,
2026-01-01,10,training,a,p3.2xlarg,,
2026-01-01,-5,training,a,,1,
2026-01-01,10,inference,a,,-1,
2026-01-01,10,inference,a,,,unknown-model
2026-01-01,10,inference,a,,1
2026-01-01,10,inference,a,,,
2026-01-01,,training,a,p3.2xlarge,,
";
    let err = f.import("bad.csv", csv, false).unwrap_err();
    let text = err.to_string();
    let ImportError::BadRows { rows, total, .. } = &err else {
        panic!("{text}")
    };
    assert_eq!(*total, 9, "{text}");
    let lines: Vec<u64> = rows.iter().map(|r| r.line).collect();
    assert_eq!(lines, vec![3, 4, 5, 6, 7, 8, 9, 10, 11], "{text}");
    for want in [
        "9 bad rows, nothing imported",
        "line 3: ts: `yesterday` is not a timestamp",
        "line 4: kind: `gpu` is not a kind",
        "line 5: instance_type: unknown instance type `p3.2xlarg`; did you mean p3.2xlarge",
        "line 6: duration_s: must be >= 0, got -5",
        "line 7: cost_usd: a usage cost cannot be negative",
        "line 8: no cost_usd or instance_type, and model `unknown-model` has no per-token price",
        "line 9: 6 fields where the header has 7",
        "line 10: nothing to price it by",
        "line 11: no duration",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert_eq!(
        f.events().len(),
        1,
        "the earlier import is intact and nothing was added"
    );
}

#[test]
fn skip_invalid_imports_the_good_rows_and_reports_the_rest() {
    let mut f = fixture();
    let csv = "ts,kind,workload,cost_usd\n2026-01-01,inference,a,1\n2026-01-01,inference,a,x\n2026-01-02,inference,b,2\n";
    let summary = f.import("mixed.csv", csv, true).unwrap();
    assert_eq!(summary.imported, 2);
    assert_eq!(summary.invalid_total, 1);
    assert_eq!(summary.invalid[0].line, 3);
    assert_eq!(summary.cost, m("3"));
}

#[test]
fn bad_headers_and_files_are_clear_errors() {
    let mut f = fixture();
    let err = f
        .import("h.csv", "ts,kind,workload,price\n", false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown column `price`"), "{err}");
    let err = f
        .import("h2.csv", "ts,kind\n", false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no `workload` column"), "{err}");
    let err = f
        .import("j.jsonl", "[1,2]\n", false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 1: not a JSON object"), "{err}");
    let missing = f.dir.path().join("nope.csv");
    let err = import_file(
        &mut f.ledger,
        &f.catalog,
        &missing,
        ImportOptions::default(),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("cannot read") && err.contains("nope.csv"),
        "{err}"
    );
}

/// A FOCUS 1.x export: usage on three pricing categories, a prepaid commitment purchase
/// (EffectiveCost 0, amortized into the usage it covers), its unused part, a credit and a
/// tax row, and a correction.
pub(super) const FOCUS: &str = r#"BilledCost,EffectiveCost,ListCost,ChargeCategory,ChargeClass,ChargeDescription,ChargePeriodStart,ChargePeriodEnd,CommitmentDiscountId,CommitmentDiscountName,CommitmentDiscountStatus,ConsumedQuantity,ConsumedUnit,PricingCategory,ResourceId,ResourceName,ServiceName,Tags
24.48,24.48,24.48,Usage,,p3.2xlarge on demand,2026-11-01T00:00:00Z,2026-11-01T08:00:00Z,,,,8,Hours,Standard,i-1,trainer-1,Amazon EC2,"{""frugal-kind"": ""training"", ""frugal-workload"": ""pretrain"", ""frugal-run"": ""run-7""}"
7.34,7.34,24.48,Usage,,p3.2xlarge spot,2026-11-01T08:00:00Z,2026-11-01T16:00:00Z,,,,8,Hours,Dynamic,i-2,trainer-2,Amazon EC2,"{""frugal-kind"": ""training"", ""frugal-workload"": ""pretrain"", ""frugal-run"": ""run-7""}"
0,15.00,24.48,Usage,,g5 serving under a savings plan,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,sp-1,serving-sp,Used,24,Hours,Committed,i-3,server-1,Amazon EC2,"{""frugal-kind"": ""inference"", ""frugal-workload"": ""chat""}"
1000,0,,Purchase,,1-year savings plan upfront,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,sp-1,serving-sp,,,,Committed,,,Savings Plans,
0,5.00,,Usage,,unused commitment,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,sp-1,serving-sp,Unused,,,Committed,,,Savings Plans,
3.00,3.00,3.00,Usage,,output tokens,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,,,,200,1K Tokens,Standard,,,Bedrock,"{""frugal-kind"": ""inference"", ""frugal-workload"": ""chat"", ""frugal-model"": ""claude""}"
-2.00,-2.00,,Credit,,promotional credit,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,,,,,,,,,Amazon EC2,
1.10,1.10,,Tax,,sales tax,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,,,,,,,,,Amazon EC2,
-0.48,-0.48,,Usage,Correction,rounding correction,2026-10-31T00:00:00Z,2026-11-01T00:00:00Z,,,,,,Standard,i-1,trainer-1,Amazon EC2,"{""frugal-kind"": ""training"", ""frugal-workload"": ""pretrain"", ""frugal-run"": ""run-7""}"
"#;

#[test]
fn focus_exports_use_amortized_effective_cost() {
    let mut f = fixture();
    let summary = f.import("billing.csv", FOCUS, false).unwrap();
    assert_eq!(summary.format, Format::Focus, "chosen by its header");
    assert_eq!(
        (summary.imported, summary.skipped),
        (8, 1),
        "the purchase row is skipped"
    );
    // Sum of EffectiveCost: 24.48 + 7.34 + 15 + 0 + 5 + 3 - 2 + 1.10 - 0.48 = 53.44.
    assert_eq!(summary.cost, m("53.44"));
    let rows = f.events();
    let idle: Vec<_> = rows.iter().filter(|r| r.kind == Kind::Idle).collect();
    assert_eq!(idle.len(), 1);
    assert_eq!(idle[0].waste(), m("5"));
    let training: Money = rows
        .iter()
        .filter(|r| r.kind == Kind::Training)
        .map(|r| r.cost)
        .sum();
    assert_eq!(training, m("31.34"));
    let spot = rows
        .iter()
        .find(|r| r.capacity == Some(Capacity::Spot))
        .unwrap();
    assert_eq!(spot.list_cost, Some(m("24.48")));
    assert_eq!(spot.duration_ms, 8 * 3_600_000);
    let tokens = rows.iter().find(|r| r.output_tokens > 0).unwrap();
    assert_eq!(tokens.output_tokens, 200_000);
    let other: Money = rows
        .iter()
        .filter(|r| r.kind == Kind::Other)
        .map(|r| r.cost)
        .sum();
    assert_eq!(other, m("-0.9"), "credit and tax stay on the bill");
    let names = f.ledger.names().unwrap();
    assert_eq!(names.get(idle[0].workload), "serving-sp");
}

#[test]
fn focus_rows_with_bad_values_are_named() {
    let mut f = fixture();
    let csv = "EffectiveCost,ChargePeriodStart,ChargePeriodEnd,Tags\nabc,2026-11-01T00:00:00Z,,\n1,2026-11-01T00:00:00Z,2026-10-01T00:00:00Z,\n1,2026-11-01T00:00:00Z,,{oops\n";
    let err = f.import("focus.csv", csv, false).unwrap_err().to_string();
    for want in [
        "line 2: EffectiveCost: `abc` is not a number",
        "line 3: ChargePeriodEnd: before ChargePeriodStart",
        "line 4: Tags: not a JSON object",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn timestamps_in_the_forms_users_have() {
    assert_eq!(parse_ts("1970-01-01T00:00:01Z"), Ok(1000));
    assert_eq!(parse_ts("1970-01-01 00:00:01.5"), Ok(1500));
    // The Azure trace writes seven fractional digits.
    assert_eq!(
        parse_ts("2023-11-16 18:17:03.9799600"),
        Ok(1_700_158_623_979)
    );
    assert_eq!(parse_ts("1970-01-02"), Ok(86_400_000));
    assert_eq!(parse_ts("1700158623979"), Ok(1_700_158_623_979));
    assert!(parse_ts("16/11/2023").is_err());
}

const WEEK_1: &str = "ts,kind,workload,cost_usd\n\
2026-11-01,inference,chat,1\n\
2026-11-02,inference,chat,2\n\
2026-11-03,inference,chat,3\n";

#[test]
fn a_file_imported_twice_is_refused_naming_when_and_where() {
    let mut f = fixture();
    let first = f.import("week-1.csv", WEEK_1, false).unwrap();
    assert_eq!(first.sha256.len(), 64);
    // The same content under another name is the same file.
    let err = f.import("copy.csv", WEEK_1, false).unwrap_err();
    let text = err.to_string();
    let ImportError::AlreadyImported { prior, .. } = &err else {
        panic!("{text}")
    };
    assert!(prior.source.ends_with("week-1.csv"), "{prior:?}");
    assert_eq!(prior.sha256.as_deref(), Some(first.sha256.as_str()));
    assert!(
        text.contains("copy.csv was already imported on 20"),
        "{text}"
    );
    assert!(
        text.contains(" UTC from ") && text.contains("week-1.csv"),
        "{text}"
    );
    assert!(
        text.contains(&format!("(sha256 {})", &first.sha256[..12])),
        "{text}"
    );
    assert!(text.contains("pass --allow-duplicates"), "{text}");
    assert_eq!(f.events().len(), 3, "nothing billed twice");
    let info = f.ledger.info().unwrap();
    assert_eq!(info.imports, 1, "the refused import left no trace");
    assert_eq!(info.files[0].sha256.as_deref(), Some(first.sha256.as_str()));
    assert_eq!(info.files[0].rows, 3);
}

#[test]
fn rows_an_earlier_export_imported_are_refused() {
    let mut f = fixture();
    f.import("week-1.csv", WEEK_1, false).unwrap();
    // An overlapping export: its columns in another order, quoted, and an empty column
    // the first did not have; two of its rows were imported already.
    let overlap = "workload,kind,ts,cost_usd,model\n\
\"chat\",inference,2026-11-02,2,\n\
chat,inference,2026-11-04,4,\n\
chat,inference,2026-11-03,3,\n";
    let err = f.import("weeks-1-2.csv", overlap, false).unwrap_err();
    let text = err.to_string();
    let ImportError::DuplicateRows {
        lines,
        total,
        first,
        ..
    } = &err
    else {
        panic!("{text}")
    };
    assert_eq!((lines.as_slice(), *total), (&[2, 4][..], 2), "{text}");
    assert!(first.source.ends_with("week-1.csv"), "{first:?}");
    assert!(
        text.contains("2 rows were already imported (the first by ")
            && text.contains(
                "nothing imported (pass --allow-duplicates to import them again): lines 2, 4"
            ),
        "{text}"
    );
    assert_eq!(f.events().len(), 3, "the whole file is refused");
    // The new row alone imports.
    let new = "ts,kind,workload,cost_usd\n2026-11-04,inference,chat,4\n";
    assert_eq!(f.import("week-2.csv", new, false).unwrap().imported, 1);
}

#[test]
fn identical_rows_within_one_file_are_all_kept() {
    let mut f = fixture();
    let row = r#"{"ts": "2026-11-01T00:00:00Z", "kind": "inference", "workload": "chat", "cost_usd": "0.01"}"#;
    let twice = format!("{row}\n{row}\n");
    assert_eq!(f.import("a.jsonl", &twice, false).unwrap().imported, 2);
    // A third occurrence elsewhere is new; the first two are not.
    let reordered = r#"{"cost_usd": "0.01", "workload": "chat", "kind": "inference", "ts": "2026-11-01T00:00:00Z", "model": null}"#;
    let thrice = format!("{reordered}\n{row}\n\n{row}\n");
    let err = f.import("b.jsonl", &thrice, false).unwrap_err();
    let ImportError::DuplicateRows { lines, total, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((lines.as_slice(), *total), (&[1, 2][..], 2), "{err}");
    assert!(err.to_string().contains("lines 1, 2"), "{err}");
    assert_eq!(f.events().len(), 2);
}

#[test]
fn allow_duplicates_imports_them_anyway() {
    let mut f = fixture();
    f.import("week-1.csv", WEEK_1, false).unwrap();
    let allow = ImportOptions {
        allow_duplicates: true,
        ..ImportOptions::default()
    };
    let again = f.import_with("week-1.csv", WEEK_1, allow).unwrap();
    assert_eq!((again.imported, again.duplicates), (3, 3));
    assert_eq!(again.cost, m("6"));
    let mut overlap = WEEK_1.to_owned();
    overlap.push_str("2026-11-04,inference,chat,4\n");
    let more = f.import_with("weeks.csv", &overlap, allow).unwrap();
    assert_eq!((more.imported, more.duplicates), (4, 3));
    assert_eq!(f.events().len(), 10);
    let total: Money = f.events().iter().map(|r| r.cost).sum();
    assert_eq!(total, m("22"));
    // The row that was new is known now: importing it alone is refused.
    let err = f
        .import(
            "day-4.csv",
            "ts,kind,workload,cost_usd\n2026-11-04,inference,chat,4\n",
            false,
        )
        .unwrap_err();
    assert!(
        matches!(err, ImportError::DuplicateRows { total: 1, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("1 row was already imported"),
        "{err}"
    );
}

#[test]
fn a_focus_export_in_another_currency_is_refused() {
    let mut f = fixture();
    let focus = "BillingCurrency,EffectiveCost,ChargePeriodStart\n\
USD,1.00,2026-11-01T00:00:00Z\n\
EUR,2.00,2026-11-01T00:00:00Z\n\
usd,3.00,2026-11-02T00:00:00Z\n";
    let err = f.import("eu.csv", focus, false).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("1 bad row, nothing imported"), "{text}");
    assert!(
        text.contains("line 3: BillingCurrency: `EUR`, but the ledger is in USD only"),
        "{text}"
    );
    assert!(f.events().is_empty());
    let native = "ts,kind,workload,cost_usd,currency\n2026-11-01,other,fees,1,usd\n2026-11-01,other,fees,1,JPY\n";
    let text = f.import("n.csv", native, false).unwrap_err().to_string();
    assert!(
        text.contains("line 3: currency: `JPY`, but the ledger is in USD only"),
        "{text}"
    );
    let dollars = "ts,kind,workload,cost_usd,currency\n2026-11-01,other,fees,1,USD\n2026-11-02,other,fees,1,\n";
    assert_eq!(f.import("d.csv", dollars, false).unwrap().imported, 2);
}

crate::ledger::testing::on_postgres!(
    csv_rows_are_priced_from_the_catalog,
    jsonl_rows_take_numbers_and_strings,
    a_bad_row_imports_nothing_and_names_every_bad_line,
    skip_invalid_imports_the_good_rows_and_reports_the_rest,
    bad_headers_and_files_are_clear_errors,
    focus_exports_use_amortized_effective_cost,
    focus_rows_with_bad_values_are_named,
    timestamps_in_the_forms_users_have,
    a_file_imported_twice_is_refused_naming_when_and_where,
    rows_an_earlier_export_imported_are_refused,
    identical_rows_within_one_file_are_all_kept,
    allow_duplicates_imports_them_anyway,
    a_focus_export_in_another_currency_is_refused,
);
